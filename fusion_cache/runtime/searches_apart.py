"""Segmentation searches of a graph's regions run side by side, in forked child processes.

Note [Searches apart]: with the compiles in a thread pool (Note [Compiles ahead]), what
remained of a cold first step's planning was the segmenter's search, one region after
another on one core while the GPU machine has 16 (H100, 3.1 s for the Llama-style model's
regions, 3.3 s for ResNet-18's). The search is pure Python on meta stand-ins, so the GIL
keeps threads from sharing it; processes can. `compile_regions` first asks each region's
plan with searches held back (`holding_searches`): a region that needs one raises
`SearchNeeded` with what the search would get (the executor's definition, inputs, shapes,
profile). The searches then run in forked children, at most one a usable CPU, each sending
back its groups (owned and computed ops of every segment) through a pipe; the parent keeps
them as hints under the fusion, input signature and arch, and plans the regions again: the
executor takes a hint as it takes a stored segmentation (Note [Stored segmentations]):
checked against the fusion and every group tried again, searching after all where one does
not fit or lands on the reference evaluator. So a child's answer can cost time, never
change a plan: the search is deterministic, and the child is a copy of this process.

A child touches nothing but the search: no store, no CUDA (a forked CUDA process may not),
no compile; it leaves by os._exit. One that fails, or is not done within the deadline, is
killed and its region searched here. Without fork (Windows), with one region to search or
one CPU, nothing is forked. FUSION_CACHE_SEARCH_PROCESSES sets the most children at once
(0 or 1: off; default: the CPUs this process may use).
"""
from __future__ import annotations

import json
import os
import selectors
import signal
import threading
import time
import warnings
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

_state = threading.local()  # .holding: a search raises SearchNeeded instead of running
_hints: dict[tuple, list] = {}  # (fusion id, input signature, arch) -> groups found apart
# the children's time before the parent searches itself: a search is seconds (H100, 3.3 s for all
# ResNet-18's regions one after another); a child stuck on a lock another thread held at the
# fork must not hold the step much longer
_DEADLINE_S = 30.0


@dataclass(eq=False)
class SearchNeeded(Exception):
    """A plan that needs a segmentation search, with what the search gets."""

    key: tuple
    fd: Any
    values: Sequence[Any]
    env: dict
    profile: Any


def holding() -> bool:
    return getattr(_state, "holding", False)


@contextmanager
def holding_searches() -> Iterator[None]:
    """Within it (this thread), a plan that must search raises SearchNeeded instead."""
    before = holding()
    _state.holding = True
    try:
        yield
    finally:
        _state.holding = before


def take_hint(key: tuple) -> list | None:
    """The groups a child found for `key`, once."""
    return _hints.pop(key, None)


def most_children() -> int:
    named = os.environ.get("FUSION_CACHE_SEARCH_PROCESSES", "").strip()
    if named.isdigit():
        return int(named)
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def search_apart(needed: Sequence[SearchNeeded]) -> int:
    """Run the searches in forked children, the groups found left as hints; how many came."""
    limit = min(most_children(), len(needed))
    if limit < 2 or not hasattr(os, "fork"):
        return 0
    waiting = list(needed)
    running: dict[int, tuple[int, SearchNeeded, bytearray]] = {}  # read fd -> (pid, ...)
    found = 0
    deadline = time.monotonic() + _DEADLINE_S
    with selectors.DefaultSelector() as sel:
        while waiting or running:
            while waiting and len(running) < limit:
                need = waiting.pop(0)
                started = _fork_search(need)
                if started is None:
                    continue
                pid, fd = started
                running[fd] = (pid, need, bytearray())
                sel.register(fd, selectors.EVENT_READ)
            left = deadline - time.monotonic()
            if left <= 0:
                break
            for key, _ in sel.select(timeout=left):
                pid, need, data = running[key.fd]
                chunk = os.read(key.fd, 1 << 16)
                if chunk:
                    data += chunk
                    continue
                sel.unregister(key.fd)
                os.close(key.fd)
                del running[key.fd]
                _, status = os.waitpid(pid, 0)
                if status == 0 and _keep(need, bytes(data)):
                    found += 1
        for fd, (pid, _, _) in running.items():  # past the deadline: searched here instead
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            os.close(fd)
    return found


def _fork_search(need: SearchNeeded) -> tuple[int, int] | None:
    read, write = os.pipe()
    with warnings.catch_warnings():  # Python 3.12 warns of fork() beside threads: see the Note
        warnings.simplefilter("ignore", DeprecationWarning)
        try:
            pid = os.fork()
        except OSError:
            os.close(read)
            os.close(write)
            return None
    if pid == 0:  # the child: search, answer, leave without running anything of the parent's
        code = 1
        try:
            os.close(read)
            warnings.simplefilter("ignore")  # nothing written to streams another thread may hold
            from schedulers.segmenter import segment

            drafts = segment(need.fd, need.values, need.env, need.profile)
            payload = json.dumps([[sorted(d.owned), sorted(d.ops)] for d in drafts]).encode()
            with os.fdopen(write, "wb") as out:
                out.write(payload)
            code = 0
        finally:
            os._exit(code)
    os.close(write)
    return pid, read


def _keep(need: SearchNeeded, data: bytes) -> bool:
    try:
        groups = [(frozenset(owned), frozenset(ops)) for owned, ops in json.loads(data)]
    except (TypeError, ValueError):
        return False
    _hints[need.key] = groups
    return True
