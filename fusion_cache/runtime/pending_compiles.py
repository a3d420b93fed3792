"""The pool that compiles kernels ahead (Note [Compiles ahead] in compile_ahead.py), apart from
the planning that fills it: kernel_cache takes finished compiles from it, and compile_ahead
(which plans through the executor) defers compiles to it, so neither imports the other."""
from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager

from fusion_cache.frontend.options import env_flag

from .host_cpus import env_count, usable_cpus

_pool: ThreadPoolExecutor | None = None
_pool_lock = threading.Lock()
_pending: dict[str, Future] = {}  # kernel key -> its compile: (cubin, compiled here)
_pending_lock = threading.Lock()
_state = threading.local()  # .deferring: cubin_for submits instead of compiling
_waits = [0.0, 0]  # seconds this process waited in `take` for compiles not yet done, and how many


def enabled() -> bool:
    return env_flag("FUSION_CACHE_COMPILE_AHEAD", True)


def plans_kept() -> bool:
    """Note [Plans kept from ahead] (compile_ahead.py); FUSION_CACHE_KEEP_AHEAD_PLANS=0: off."""
    return env_flag("FUSION_CACHE_KEEP_AHEAD_PLANS", True)


def threads() -> int:
    named = env_count("FUSION_CACHE_COMPILE_THREADS")
    if named:  # 0 or unset: one thread a CPU, at most 32
        return named
    return max(1, min(32, usable_cpus()))


def _executor() -> ThreadPoolExecutor:
    global _pool
    with _pool_lock:
        if _pool is None:
            _pool = ThreadPoolExecutor(threads(), thread_name_prefix="fusion-cache-compile")
        return _pool


def deferring() -> bool:
    return getattr(_state, "deferring", False)


@contextmanager
def deferred() -> Iterator[None]:
    """Within it (this thread), kernels the store lacks are compiled by the pool."""
    before = deferring()
    _state.deferring = True
    try:
        yield
    finally:
        _state.deferring = before


def submit(key: str, compile_once: Callable[[], tuple[bytes, bool]]) -> None:
    """Compile kernel `key` in the pool (once: a key already pending is left to its compile)."""
    with _pending_lock:
        if key not in _pending:
            _pending[key] = _executor().submit(compile_once)


def take(key: str) -> tuple[bytes, bool] | None:
    """The pending compile of `key`, waited for: (cubin, compiled by the pool); None where
    none is pending or it failed (the caller compiles in place and sees the error)."""
    with _pending_lock:
        future = _pending.pop(key, None)
    if future is None:
        return None
    start = time.perf_counter() if not future.done() else None
    try:
        return future.result()
    except Exception:
        return None
    finally:
        if start is not None:
            _waits[0] += time.perf_counter() - start
            _waits[1] += 1


def waited() -> tuple[float, int]:
    """The seconds this process's kernel loads waited for compiles ahead not yet done, and how
    many waited: what a cold first step's region calls spent on compiles (benchmarks.cold_first)."""
    return _waits[0], _waits[1]


def pending() -> int:
    with _pending_lock:
        return len(_pending)


def drain() -> int:
    """Wait for every pending compile and drop it (its cubin is in the store already): for a
    process, or a test, that lowered regions it will not run. Returns how many there were."""
    with _pending_lock:
        futures = list(_pending.values())
        _pending.clear()
    for future in futures:
        future.exception()  # waits; a failed compile is compiled again, in place, when needed
    return len(futures)
