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
checked against the fusion, searching after all where a group does not fit or lands on the
reference evaluator. So a child's answer can cost time, never change a plan: the search is
deterministic, and the child is a copy of this process.

A child touches nothing but the search: no store, no CUDA (a forked CUDA process may not),
no compile; it leaves by os._exit. One that fails, or is not done within the deadline, is
killed and its region searched here. Each region is planned as soon as its child ends, so
its compiles start while the other searches run; the largest definitions are searched first.
A child sends, beside the groups, the scheduler of each segment and the trials it made (Note
[Shared trials]; pickled: only this process's fork reads them): the parent's check of the
hint then tries no group again (it built, lowered and planned each one in a trial of its own
before), and a later search in the parent finds the children's trials in its memo.

Note [One search a definition]: a model's repeated layers give regions of one definition and
one input signature (the Llama-style model's forward and backward: 5 regions each, 3 of them
the same), and each raised SearchNeeded, so each forked a child for the same search. One
child a key searches now; the regions that repeat it are planned after it, from the plan its
region kept (Note [Plans kept from ahead]), as they were when searched in this process.

Note [Work beside the searches]: while its children search, the parent only waits in a
select, the GIL free. Work the caller registers with `meanwhile` runs then, in this thread:
the backend pickles the aten graph for torch's AOTAutograd cache there (aot_cache.py,
`compile_cached`: 0.4 and 0.9 s for the full-size Llama-style model's forward and backward
on a 2-core CPU), where it ran before the graph's lowering, on the step's critical path.
Where no child runs, the caller runs the work itself afterwards. The children that end meanwhile
wait for it to be read (their regions' compiles start up to the work's time later). H100 80GB HBM3, 17:55 UTC, one
call (results/cold-first-1755-*): the Llama-style model's cold first step 6.06 s with both Notes
against 7.69 s on the tree before them (lowering 1.94 against 2.57 s), inductor's 13.75 s.

FUSION_CACHE_SEARCH_PROCESSES=N runs up to N children at once (0 or 1: off); unset, as many
as the CPUs this process may use where a GPU is present, none elsewhere (a CPU-only process
plans for a GPU only in tests and warmups).
H100 80GB HBM3, 2026-11-27 16:02 UTC, one device call (`python -m benchmarks.cold_first`: each
run a new process on fresh caches; results/cold-first-*): ResNet-18's cold first step 6.43 s
with 16 children and the branch's other cuts (Notes [Plans kept from ahead], [Writes
together]) against main's 11.60 s in the same call (lowering 2.58 against 6.73 s, of which
planning ahead 1.83 against 5.70; first region calls 0.34 against 0.84), 30 kernels compiled
in both, no reference run; inductor's cold first step read 17.4-18.8 s in earlier runs. The
Llama-style model 10.19 s (lowering 2.82, planning ahead 1.37, first calls 1.77), no baseline
in that call: torch's own tracing ran slow in that process (joint graph 2.15 s against 0.98 at
14:02), so it says nothing either way yet.
Earlier: H100 80GB HBM3, 2026-11-27 12:40 UTC, with Note [Shared trials], 16 children, the
regions planned only after every search had ended (before `on_done`): cold first step of
ResNet-18 7.20 s (lowering 3.08 s, first region calls 0.89 s) against 9.91 s (5.83 / 0.94) in
the 11:22 UTC run without either; the Llama-style model 11.17 s (3.30 / 2.73) against 10.13 s
(4.38 / 0.83): its first calls waited for kernels whose compiles began only after the last
search, beside children taking the cores the compile threads needed (since then each
region is planned as its search ends).
"""
from __future__ import annotations

import os
import pickle
import selectors
import signal
import threading
import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from .host_cpus import env_count, usable_cpus

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


def take_hint(key: tuple) -> tuple[list, list] | None:
    """(the groups a child found for `key`, the scheduler taking each), once."""
    return _hints.pop(key, None)


class Meanwhile:
    """Work the parent may do while its children search (Note [Work beside the searches]):
    run at most once, by `search_apart` or, where no child ran, by `result`."""

    def __init__(self, work: Callable[[], Any]) -> None:
        self._work, self._done, self._value, self._error = work, False, None, None

    def run(self) -> None:
        if self._done:
            return
        self._done = True
        try:
            self._value = self._work()
        except Exception as err:  # noqa: BLE001 - raised again by result(), to its caller
            self._error = err

    def result(self) -> Any:
        self.run()
        if self._error is not None:
            raise self._error
        return self._value


@contextmanager
def meanwhile(work: Meanwhile) -> Iterator[Meanwhile]:
    """Within it (this thread), searches that run apart run `work` while they wait."""
    stack = _state.__dict__.setdefault("meanwhile", [])
    stack.append(work)
    try:
        yield work
    finally:
        stack.remove(work)


def _run_meanwhile() -> None:
    for work in list(getattr(_state, "meanwhile", ())):
        work.run()


def most_children() -> int:
    """FUSION_CACHE_SEARCH_PROCESSES, at most the CPUs this process may use; unset, every one
    of them where a GPU is present (its compiles are what the searches hold back), else 0."""
    cpus = usable_cpus()
    named = env_count("FUSION_CACHE_SEARCH_PROCESSES")
    if named is not None:
        return min(named, cpus)
    import torch

    return cpus if torch.cuda.is_available() else 0


def search_apart(needed: Sequence[SearchNeeded],
                 on_done: Callable[[SearchNeeded], None] = lambda need: None) -> int:
    """Run the searches in forked children, the groups found left as hints; `on_done(need)`
    as each child ends (its region planned then, its compiles submitted while the other
    searches run), and for every search no child ran; how many hints came."""
    # Note [One search a definition]: regions of one definition and inputs (a model's repeated
    # layers) need one search: the others wait for its child, then take the plan it left
    same: dict[tuple, list[SearchNeeded]] = {}
    for need in needed:
        same.setdefault(need.key, []).append(need)
    firsts = [group[0] for group in same.values()]

    def done(need: SearchNeeded) -> None:
        for each in same.get(need.key, [need]):
            on_done(each)

    most = most_children()
    pending_work = bool(getattr(_state, "meanwhile", None))
    if most < 2 or (len(firsts) < 2 and not pending_work) or not hasattr(os, "fork"):
        for need in needed:
            on_done(need)
        return 0
    limit = min(most, len(firsts))
    # the largest definitions first: the longest searches start before the short ones
    waiting = sorted(firsts, key=lambda need: -len(need.fd._records))
    running: dict[int, tuple[int, SearchNeeded, bytearray]] = {}  # read fd -> (pid, ...)
    found = 0
    deadline = time.monotonic() + _DEADLINE_S
    with selectors.DefaultSelector() as sel:
        while (waiting or running) and time.monotonic() < deadline:
            while waiting and len(running) < limit:
                need = waiting.pop(0)
                started = _fork_search(need)
                if started is None:
                    done(need)  # searched here
                    continue
                pid, fd = started
                running[fd] = (pid, need, bytearray())
                sel.register(fd, selectors.EVENT_READ)
            if not running:
                continue
            _run_meanwhile()  # Note [Work beside the searches]: once, the children started
            for key, _ in sel.select(timeout=max(0.0, deadline - time.monotonic())):
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
                done(need)
        for fd, (pid, need, _) in running.items():  # past the deadline: searched here instead
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            os.close(fd)
            done(need)
    for need in waiting:
        done(need)
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
            from schedulers.segmenter import segment, trials_since

            known = trials_since(None)
            drafts = segment(need.fd, need.values, need.env, need.profile)
            groups = [[sorted(d.owned), sorted(d.ops), d.scheduler] for d in drafts]
            # a fork of this process, read only by it: its trials' keys hold torch dtypes
            payload = pickle.dumps((groups, trials_since(known)))
            with os.fdopen(write, "wb") as out:
                out.write(payload)
            code = 0
        finally:
            os._exit(code)
    os.close(write)
    return pid, read


def _keep(need: SearchNeeded, data: bytes) -> bool:
    from schedulers.segmenter import add_trials

    try:
        found, trials = pickle.loads(data)
        groups = [(frozenset(owned), frozenset(ops)) for owned, ops, _ in found]
        kinds = [kind for *_, kind in found]
    except (TypeError, ValueError, pickle.UnpicklingError):
        return False
    _hints[need.key] = (groups, kinds)
    add_trials(trials)  # Note [Shared trials]: the hint's check and later searches find them
    return True
