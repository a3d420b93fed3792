"""`fusion-cache warmup SCRIPT.py [--target h100]`: run a script of definitions and
`precompile` calls so a store is filled ahead of time, on a machine with or without a GPU."""
from __future__ import annotations

import argparse
import os
import runpy
import sys
import time

from schedulers.device import TARGET_ENV


class _Progress:
    """One status line on stderr, redrawn after each precompile call."""

    def __init__(self) -> None:
        self.calls = 0
        self.kernels = 0
        self.start = time.perf_counter()

    def update(self, refs: list) -> None:
        from fusion_cache.frontend.trie import FusionCache

        self.calls += 1
        self.kernels += len(refs)
        stats = FusionCache.get().stats()
        line = (f"\rwarmup: {self.calls} precompile calls, {self.kernels} kernels "
                f"({stats['kernels_compiled']} compiled, {stats['kernels_loaded']} from the store) "
                f"{time.perf_counter() - self.start:.1f}s")  # fmt: skip
        sys.stderr.write(line)
        sys.stderr.flush()


def run_warmup(script: str, target: str | None) -> int:
    from fusion_cache.frontend.trie import FusionCache
    from fusion_cache.runtime import executor as gpu_runtime

    if target:
        from schedulers.device import profile_by_name

        profile_by_name(target)  # fail early, listing the known names
        os.environ[TARGET_ENV] = target
    progress = _Progress()
    original = gpu_runtime.precompile

    def counted(fd, inputs, target=None):
        refs = original(fd, inputs, target)
        progress.update(refs)
        return refs

    gpu_runtime.precompile = counted
    try:
        runpy.run_path(script, run_name="__main__")
    finally:
        gpu_runtime.precompile = original
        sys.stderr.write("\n")
    stats = FusionCache.get().stats()
    store = FusionCache.get().store
    print(f"warmup done: {progress.calls} precompile calls, {stats['num_fusions']} fusions, "
          f"{stats['kernels_compiled']} kernels compiled, {stats['kernels_loaded']} already stored; "
          f"store {store.url}")  # fmt: skip
    return 0


def _cmd(args: argparse.Namespace) -> int:
    return run_warmup(args.script, args.target)


def register_warmup(sub) -> None:
    p = sub.add_parser("warmup", help="run a script of definitions and precompile calls")
    p.add_argument("script", help="a Python script that defines fusions and calls fd.precompile")
    p.add_argument("--target", default=None, help="GPU to compile for (h100, h200, a100, ...)")
    p.set_defaults(func=_cmd)
