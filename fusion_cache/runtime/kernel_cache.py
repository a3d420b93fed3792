"""Kernel source -> cubin (through the store, compiled once) -> loaded function.

The kernel key is the store's (Note [Kernel key] in store/keys.py): a bundle's keys are
checked against the same function.
"""
from __future__ import annotations

import threading
import time
import warnings
from dataclasses import dataclass, field

from codegen.nvrtc import compile_cubin, default_options, nvrtc_version
from fusion_cache.frontend.trie import FusionCache
from fusion_cache.store.keys import kernel_key

from . import pending_compiles


@dataclass(frozen=True)
class KernelRef:
    key: str
    name: str
    arch: int
    compiled_here: bool
    source: str = field(repr=False)  # kernels are long; print .source to read one

    def to_json(self) -> dict:
        return {"key": self.key, "name": self.name, "arch": self.arch}


_compiled_lock = threading.Lock()


def cubin_for(source: str, name: str, arch: int, *, fusion_id: int | None, scheduler: str,
              params_json: str) -> tuple[bytes, KernelRef]:  # fmt: skip
    """The cubin for `source`, from the store or compiled (once across processes). Note
    [Compiles ahead]: a kernel compiled ahead is taken from its pending compile; while
    deferring, the kernel goes to the pool (which finds it in the store or compiles it)
    and the cubin returned is empty (a plan made ahead loads nothing)."""
    from fusion_cache.store import KernelMeta

    options = tuple(default_options(arch))
    key = kernel_key(source, options, arch)
    cache = FusionCache.get()

    def compile_fn():
        start = time.perf_counter()
        cubin = compile_cubin(source, arch, options=options)
        ms = (time.perf_counter() - start) * 1e3
        with _compiled_lock:  # pool threads compile side by side (Note [Compiles ahead])
            cache._count("kernels_compiled")
        major, minor = nvrtc_version()
        meta = KernelMeta(name, arch, f"{major}.{minor}", options, source, scheduler,
                          params_json, ms)  # fmt: skip
        return cubin, meta

    if pending_compiles.deferring():
        if fusion_id is not None:
            cache.store.link_kernel(fusion_id, key)
        pending_compiles.submit(key, lambda: cache.store.compile_once(key, compile_fn))
        return b"", KernelRef(key, name, arch, False, source)
    ahead = pending_compiles.take(key) if pending_compiles.pending() else None
    cubin, compiled = ahead or cache.store.compile_once(key, compile_fn)
    if not compiled:
        cache._count("kernels_loaded")
    if fusion_id is not None:
        cache.store.link_kernel(fusion_id, key)
    return cubin, KernelRef(key, name, arch, compiled, source)


_loaded: dict[tuple[str, int], object] = {}
_load_lock = threading.Lock()


def load_function(cubin: bytes, ref: KernelRef, device_index: int):
    """Load a cubin on a device; a module the driver refuses is recompiled here (a miss)."""
    from codegen.launch import ModuleLoadError, load_kernel

    slot = (ref.key, device_index)
    fn = _loaded.get(slot)
    if fn is not None:
        return fn
    with _load_lock:
        try:
            fn = load_kernel(cubin, ref.name, device_index)
        except ModuleLoadError as err:
            warnings.warn(
                f"fusion_cache: stored kernel {ref.key[:12]} did not load ({err}); compiling it here",
                stacklevel=3,
            )
            FusionCache.get()._count("kernels_compiled")
            fresh = compile_cubin(ref.source, ref.arch, options=tuple(default_options(ref.arch)))
            fn = load_kernel(fresh, ref.name, device_index)
        _loaded[slot] = fn
    return fn
