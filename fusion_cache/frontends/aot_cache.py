"""The backend's compiled graphs in torch's AOTAutograd cache, so a restart skips AOTAutograd.

Note [AOT cache]: a warm process's first step (its kernels in the store, nothing to
compile) spent most of its time in torch: dynamo's trace, then AOTAutograd's joint graph,
functionalization and partitioner for every graph, before this backend saw a region. Torch
caches AOTAutograd's result across processes (torch._functorch._aot_autograd.autograd_cache,
on disk under TORCHINDUCTOR_CACHE_DIR/aotautograd) for compilers that return an `OutputCode`
it can pickle: with `bundled_autograd_cache` the entry holds the OutputCode itself.

`FusedGraph` is that OutputCode. What it pickles is the aten graph AOTAutograd gave the
backend (torch.fx's GraphPickler: nodes, aten ops, fake-tensor metadata), taken before
`fuse_graph` rewrote it: no kernel, plan, region object or store entry. Loading it
(`post_compile`) runs `fuse_graph` again, which finds every definition, plan and cubin in
the fusion store by key, as a cold process would have written them. So the store stays
bytes and JSON only (DESIGN.md, the store), an entry is as valid as the aten graph it
holds whatever this project's version, and a store emptied meanwhile only means compiles.

The entry's key is torch's (the dynamo graph, its inputs' metadata, torch's and inductor's
configuration) plus `cache_key_tag`, to which the backend adds `TAG` so that another
backend's entry for the same graph (aot_eager's, bundled too) is never taken for one of
this backend's. Bump `TAG` when what AOTAutograd is asked for changes (decompositions, the
partitioner). FUSION_CACHE_AOT_CACHE=0 turns it off; torch's own switches
(TORCHINDUCTOR_FORCE_DISABLE_CACHES=1, torch._functorch.config.enable_autograd_cache) too.
The CUDA-graph mode (Note [CUDA-graph mode]) does not use it.
"""
from __future__ import annotations

import contextlib
import dataclasses
import os
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from torch.fx import GraphModule

ENV = "FUSION_CACHE_AOT_CACHE"
TAG = "fusion_cache-aot-2"  # 2: input mutations kept (Note [Buffer updates in place])


def aot_cache_wanted() -> bool:
    """Whether the backend puts its graphs in torch's AOTAutograd cache (default: yes)."""
    return os.environ.get(ENV, "1").strip().lower() not in ("0", "false", "no", "off")


def _output_code_base() -> type | None:
    try:
        from torch._inductor.output_code import OutputCode
    except ImportError:  # a torch without it: no AOTAutograd cache for other backends
        return None
    return OutputCode


_OutputCode = _output_code_base() or object


@dataclasses.dataclass
class FusedGraph(_OutputCode):  # type: ignore[misc, valid-type]
    """One aten graph as the backend runs it (its regions fused), and as torch's cache
    keeps it: the graph before fusion, pickled (Note [AOT cache])."""

    kind: str = "forward"
    aten_graph: bytes = b""
    # the fused graph's boxed call; None in a pickled or not yet loaded entry
    _run: Callable[[list], Any] | None = dataclasses.field(default=None, compare=False)
    unsaved: str = ""  # why the graph could not be pickled (then it is not saved)

    def __post_init__(self) -> None:
        # torch passes the inputs as one list; an attribute of the instance, as the wrappers
        # torch puts around a backward copy it with functools.wraps
        self._boxed_call = True

    def __call__(self, inputs: list) -> Any:
        return self._run(inputs)  # type: ignore[misc]

    def prepare_for_serialization(self) -> None:
        if self.unsaved:  # torch counts it a bypass and keeps running the live graph
            raise RuntimeError(f"fusion_cache: the aten graph could not be pickled: "
                               f"{self.unsaved}")  # fmt: skip
        self._run = None  # torch pickles a shallow copy: the live one keeps running

    def post_compile(self, example_inputs: Sequence[Any], constants: Any,
                     graph_kwargs: Any) -> None:  # fmt: skip
        if self._run is None:  # loaded from the cache: fuse the aten graph again
            self._run = fused_call(load_graph(self.aten_graph), self.kind)

    def set_triton_bundle(self, triton_bundle: Any) -> None:
        pass  # no Triton kernels


def fused_call(gm: GraphModule, kind: str) -> Callable[[list], Any]:
    from functorch.compile import make_boxed_func

    from .dynamo_backend import fuse_graph

    fuse_graph(gm, kind)
    return make_boxed_func(gm.forward)


def dump_graph(gm: GraphModule) -> bytes:
    from torch.fx._graph_pickler import GraphPickler, Options

    return GraphPickler.dumps(gm, Options(ops_filter=None))


def load_graph(data: bytes) -> GraphModule:
    from torch._subclasses import FakeTensorMode
    from torch.fx._graph_pickler import GraphPickler
    from torch.fx.experimental.symbolic_shapes import ShapeEnv

    gm = GraphPickler.loads(data, FakeTensorMode(shape_env=ShapeEnv()))
    if not isinstance(gm, GraphModule):
        raise TypeError(f"a cached aten graph unpickled to {type(gm).__name__}")
    return gm


def compile_cached(gm: GraphModule, kind: str) -> FusedGraph:
    """The backend's compiler for one aten graph, as torch's AOTAutograd cache wants it.
    The graph is pickled before fuse_graph rewrites it in place (torch hands the backward
    compiler a copy of the backward graph, and keeps no use of the forward's)."""
    try:
        data: bytes | None = dump_graph(gm)
    except Exception as err:  # noqa: BLE001 - an unpicklable graph runs, uncached
        data, why = None, f"{type(err).__name__}: {err}"
    code = FusedGraph(kind, data or b"")
    if data is None:
        code.unsaved = why
    code._run = fused_call(gm, kind)
    return code


def serializable_compilers() -> dict[str, Any] | None:
    """fw/bw/inference compilers for torch's aot_autograd that return FusedGraphs, or None
    where this torch cannot cache another backend's graphs."""
    try:
        from torch._functorch._aot_autograd.schemas import SerializableAOTDispatchCompiler
    except ImportError:
        return None
    if _output_code_base() is None:
        return None

    def compiler(kind: str) -> Any:
        def compile_graph(gm: GraphModule, example_inputs: Sequence[Any]) -> FusedGraph:
            return compile_cached(gm, kind)

        return SerializableAOTDispatchCompiler(FusedGraph, compile_graph)

    return {"fw_compiler": compiler("forward"), "bw_compiler": compiler("backward"),
            "inference_compiler": compiler("inference")}  # fmt: skip


@contextlib.contextmanager
def cache_settings() -> Iterator[None]:
    """torch's settings under which AOTAutograd caches the backend's graphs: bundled
    entries (the OutputCode in the entry), this backend's tag in the key, and the backward
    compiled with the forward. torch saves an entry once both are compiled and reads these
    settings then: compiled lazily, at the first backward, the backward would be saved
    after this context ended, as an entry for inductor's cache."""
    import torch._functorch.config as functorch_config
    import torch.compiler.config as compiler_config

    tag = compiler_config.cache_key_tag
    tag = f"{tag}+{TAG}" if tag else TAG
    with functorch_config.patch(bundled_autograd_cache=True,
                                force_non_lazy_backward_lowering=True), \
            compiler_config.patch(cache_key_tag=tag), _without_inductor_backends():  # fmt: skip
        yield


# what torch's key reads of inductor's code generators (torch._inductor.codecache)
_BACKEND_NAMES = ("init_backend_registration", "custom_backend_passes",
                  "custom_backend_codegen_configs")  # fmt: skip


@contextlib.contextmanager
def _without_inductor_backends() -> Iterator[None]:
    """Note [AOT cache key without code generators]: torch's key (FxGraphHashDetails) first
    registers inductor's code generators for every device, to hash the custom passes and
    configurations of each: an import of inductor's scheduling modules that a process using
    only this backend never needed (1.5 s on this CPU, a fifth of a warm first step). Their
    passes never run on this backend's graphs, so the key leaves them out: the registration
    is skipped and both tables read empty, whatever another compile registered, so the key
    is the same in every process. Dynamo compiles one frame at a time (its compile lock),
    so no other key is computed meanwhile. Where this torch has other names, nothing is
    patched and the key is torch's own."""
    try:
        from torch._inductor import codecache
    except ImportError:
        yield
        return
    saved = {name: getattr(codecache, name, None) for name in _BACKEND_NAMES}
    if any(value is None for value in saved.values()):
        yield
        return
    codecache.init_backend_registration = _registered_none
    codecache.custom_backend_passes = {}
    codecache.custom_backend_codegen_configs = {}
    try:
        yield
    finally:
        for name, value in saved.items():
            setattr(codecache, name, value)


def _registered_none() -> None:
    return None


def cache_counters() -> dict[str, int]:
    """torch's AOTAutograd cache counters of this process: hits, misses, bypasses, saves."""
    from torch._dynamo.utils import counters

    aot = counters["aot_autograd"]
    return {k: int(aot.get(f"autograd_cache_{k}", 0)) for k in ("hit", "miss", "bypass", "saved")}
