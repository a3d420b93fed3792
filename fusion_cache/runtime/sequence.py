"""Launch sequences: a fusion's run for inputs of one signature, flattened into steps.

Note [Launch sequence]: execute() pays on every call for what does not change between calls
of the same signature: the input key, the executor and plan lookups, and for a segmented
fusion the same again per segment plus the argument bookkeeping between them. A launch
sequence does that work once. `sequence_for(fd, values)` runs the fusion the usual way and
records what the run did as a straight line of steps over a list of slots (inputs first,
then every tensor a step makes): allocate these outputs, launch these kernels with these
argument templates (pointers filled from slots), drop the intermediates no later step
reads. A replay on inputs of the same signature (`Guard`, below) runs the steps and nothing
else: no validation, no key, no dict lookup, no segment bookkeeping.

What the sequence cannot replay as launches (the reference evaluator, CPU inputs, plan
kinds it does not know) stays a step that calls execute(), so a replay is never wrong, only
slower where execute() would be slow anyway. The torch.compile backend runs each fusion
region through one (Note [Region call] in fusion_cache/frontends/fx_region.py).
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import partial
from operator import and_, itemgetter
from threading import get_ident
from typing import TYPE_CHECKING, Any

import torch

from fusion_cache.frontend.dtypes import to_torch
from fusion_cache.frontend.options import env_flag
from fusion_cache.frontend.validate import validate_inputs
from schedulers.tuning import switched_on

from .aten_calls import reinterpret, reinterpret_tensor
from .aten_segments import AtenPlan
from .executor import executor_for
from .plans import LaunchPlan
from .segmented import SegmentedPlan, run_device

if TYPE_CHECKING:
    from fusion_cache.frontend.definition import FusionDefinition


# ---- the guard ------------------------------------------------------------------------------


class Guard:
    """What a replay needs of its inputs: each tensor's shape, strides and dtype, and that its
    address is aligned at least as the recorded one (a kernel planned for 4-byte alignment
    runs correctly on 16-byte aligned data, not the other way round); each int's value (it
    may size a tensor) and each other scalar's type.

    Shapes, strides and dtypes are checked by torch's own tensor guard (the C++ check that
    torch.compile's guards run: dtype, device, dispatch keys, sizes, strides) where this
    torch has it, about five times faster than reading them in Python; the alignment is one
    pass of C-level maps over the data pointers.

    A tensor passed at several positions (a view made once for several readers, Note [Views
    as aliases] in fusion_cache/frontends/eager_views.py) is checked once, and its other
    positions must hold the same tensor: torch's tensor guard refuses tensors that alias one
    another, so a region given one tensor twice missed its guard on every call."""

    __slots__ = ("check", "aligns", "tensor_at", "scalars", "everything_tensor", "specs", "same")

    def __init__(self, values: Sequence[Any]) -> None:
        first: dict[int, int] = {}  # id of a tensor -> the first position holding it
        same = []  # (position, the first position holding its tensor)
        for i, v in enumerate(values):
            if isinstance(v, torch.Tensor) and first.setdefault(id(v), i) != i:
                same.append((i, first[id(v)]))
        self.same = tuple(same)
        self.tensor_at = tuple(first.values())
        tensors = [values[i] for i in self.tensor_at]
        self.everything_tensor = len(tensors) == len(values)
        self.aligns = [_alignment(t.data_ptr()) - 1 for t in tensors]
        self.scalars = tuple((i, v if type(v) is int else type(v)) for i, v in enumerate(values)
                             if not isinstance(v, torch.Tensor))  # fmt: skip
        self.specs = [(t.shape, t.stride(), t.dtype) for t in tensors]
        self.check = _tensor_guard(tensors)

    def matches(self, args: Sequence[Any]) -> bool:
        """True when `args` (of the recorded arity) may replay the recorded sequence."""
        if self.everything_tensor:  # the usual region: tensors only, each once
            tensors = args
        else:
            tensors = [args[i] for i in self.tensor_at]
            for i, want in self.scalars:
                v = args[i]
                if (v if type(v) is int else type(v)) != want:
                    return False
            for i, j in self.same:
                if args[i] is not args[j]:
                    return False
        check = self.check
        if check is not None:
            if not check(*tensors):
                return False
        else:
            for t, (shape, stride, dtype) in zip(tensors, self.specs):
                if t.shape != shape or t.stride() != stride or t.dtype is not dtype:
                    return False
        return not any(map(and_, map(_data_ptr, tensors), self.aligns))


_data_ptr = torch.Tensor.data_ptr


def _tensor_guard(tensors: Sequence[torch.Tensor]) -> Callable[..., bool] | None:
    try:
        from torch._C._dynamo.guards import TensorGuards

        return TensorGuards(*tensors, dynamic_dims_sizes=None, dynamic_dims_strides=None).check
    except Exception:  # not in this torch (a private API): the Python check
        return None


def _alignment(ptr: int) -> int:
    return 16 if ptr % 16 == 0 else (ptr & -ptr if ptr else 16)


def _none() -> None:
    return None


def _fast_empty(device: torch.device) -> Callable | None:
    """torch's allocation without the dispatcher (what inductor's generated code calls): on
    the current CUDA device, or the CPU. A third of torch.empty's host time."""
    try:
        from torch._C._dynamo import guards
    except ImportError:
        return None
    return getattr(guards, f"_empty_strided_{device.type}", None)


_current_cuda_device = getattr(torch._C, "_cuda_getDevice", lambda: -1)  # C: no Python frame


# ---- steps ----------------------------------------------------------------------------------


class KernelStep:
    """One LaunchPlan: allocate its fresh outputs and scratch, launch its kernels."""

    __slots__ = ("allocs", "scratch", "launches", "plan", "barrier_slot", "count", "empty",
                 "device", "fresh", "arenas", "carves", "inlined")  # fmt: skip

    def __init__(self, allocs: tuple, scratch: tuple, launches: tuple, plan: LaunchPlan,
                 barrier_slot: int | None) -> None:  # fmt: skip
        self.allocs = allocs  # (slot, shape, contiguous strides, torch dtype)
        self.scratch = scratch  # (slot, (numel,), (1,), torch dtype)
        self.launches = launches  # LaunchSites over the slots (Note [Bound launches])
        self.plan = plan
        self.barrier_slot = barrier_slot
        self.count = len(launches)
        self.device = plan.device
        self.empty = _fast_empty(plan.device)
        # Note [Shared intermediates]: the allocs made anew; the arenas this step allocates,
        # (slot, elements, dtype); the allocs carved from one, (slot, arena slot, shape,
        # strides, offset)
        self.fresh = allocs
        self.arenas: tuple = ()
        self.carves: tuple = ()
        # Note [Inline launches]: per launch (fill, buffer, pointers, call, launch), call None
        # where the launch is called as it is
        self.inlined = tuple((*(getattr(launch, "inlined", _none)() or (None,) * 4), launch)
                             for launch in launches)  # fmt: skip

    def run(self, env: list, inline: bool = False) -> None:
        empty = self.empty
        device = self.device
        if empty is None or (device.type == "cuda" and _current_cuda_device() != device.index):
            empty = self._empty_on_device
        for slot, size, dtype in self.arenas:
            env[slot] = empty((size,), (1,), dtype)
        for slot, arena, shape, stride, offset in self.carves:
            env[slot] = reinterpret(env[arena], shape, stride, offset)
        for slot, shape, stride, dtype in self.fresh:
            env[slot] = empty(shape, stride, dtype)
        if self.scratch:  # the plan's own, kept per stream (Note [Scratch per stream])
            for (slot, *_), buffer in zip(self.scratch, self.plan.scratch()):
                env[slot] = buffer
        if self.barrier_slot is not None:
            env[self.barrier_slot] = self.plan.barrier()
        if not inline:
            for launch in self.launches:
                launch(env)
            return
        for fill, buffer, pointers, call, launch in self.inlined:
            if call is None:
                launch(env)
                continue
            if fill is not None:
                fill(buffer, 0, *map(_data_ptr, pointers(env)))
            err = call()
            if err:
                launch.kernel._recover(err, call, launch.grid, launch.block, launch.shared_mem)

    def _run_inline(self, env: list) -> None:
        self.run(env, True)

    def straight(self) -> Callable[[list], None]:
        """This step's run for a straight replay (Note [Straight runs]): one closure over its
        allocations and inline launches, for a sequence that checked the thread, stream and
        current device once."""
        if self.scratch or self.barrier_slot is not None or self.empty is None or any(
                fill is None or call is None for fill, _, _, call, _ in self.inlined):  # fmt: skip
            return self._run_inline
        inlined = tuple((fill, buffer, pointers, call, launch.kernel._recover, launch.grid,
                         launch.block, launch.shared_mem)
                        for fill, buffer, pointers, call, launch in self.inlined)  # fmt: skip
        empty, arenas, carves, fresh = self.empty, self.arenas, self.carves, self.fresh

        def allocate(env: list) -> None:
            for slot, size, dtype in arenas:
                env[slot] = empty((size,), (1,), dtype)
            for slot, arena, shape, stride, offset in carves:
                env[slot] = reinterpret(env[arena], shape, stride, offset)

        if len(inlined) != 1 or arenas or carves:
            def run(env: list) -> None:
                if arenas or carves:
                    allocate(env)
                for slot, shape, stride, dtype in fresh:
                    env[slot] = empty(shape, stride, dtype)
                for fill, buffer, pointers, call, recover, grid, block, smem in inlined:
                    fill(buffer, 0, *map(_data_ptr, pointers(env)))
                    err = call()
                    if err:
                        recover(err, call, grid, block, smem)

            return run
        ((fill, buffer, pointers, call, recover, grid, block, smem),) = inlined

        def run_one(env: list) -> None:  # the usual step: fresh outputs, one launch
            for slot, shape, stride, dtype in fresh:
                env[slot] = empty(shape, stride, dtype)
            fill(buffer, 0, *map(_data_ptr, pointers(env)))
            err = call()
            if err:
                recover(err, call, grid, block, smem)

        return run_one

    def _empty_on_device(self, shape: tuple, stride: tuple, dtype: torch.dtype) -> torch.Tensor:
        return torch.empty_strided(shape, stride, dtype=dtype, device=self.device)

    def slots(self) -> set[int]:
        out = {s for s, *_ in self.allocs} | {s for s, *_ in self.scratch}
        for launch in self.launches:
            out |= {s for _, s in launch.pointers} | {s for _, s in launch.values}
        if self.barrier_slot is not None:
            out.add(self.barrier_slot)
        return out


class TensorStep:
    """One tensor made from another by a torch call: a 0-dim CPU input copied to the GPU
    (Note [CPU scalar tensors]), an ATen segment's strided result made contiguous for a
    segment that reads it so (the segmented plan's dense inputs)."""

    __slots__ = ("src", "dst", "make", "count")

    def __init__(self, src: int, dst: int, make: Callable[[torch.Tensor], torch.Tensor]) -> None:
        self.src, self.dst, self.make, self.count = src, dst, make, 0

    def run(self, env: list) -> None:
        env[self.dst] = self.make(env[self.src])

    def slots(self) -> set[int]:
        return {self.src, self.dst}


def _to_device(device: torch.device) -> Callable[[torch.Tensor], torch.Tensor]:
    return lambda t: t.to(device, non_blocking=True)


class PlanStep:
    """A plan the executor launches itself (an ATen segment's torch call, a fusion with
    random numbers whose seeds advance each run): its launch, without execute()'s checks,
    key and plan lookup."""

    __slots__ = ("launch", "plan", "reads", "writes", "count")

    def __init__(self, ex: Any, plan: Any, reads: tuple[int, ...], writes: tuple[int, ...]) -> None:
        self.launch, self.plan, self.reads, self.writes, self.count = ex.launch, plan, reads, writes, 0

    def run(self, env: list) -> None:
        outs = self.launch(self.plan, [env[s] for s in self.reads])
        for slot, value in zip(self.writes, outs):
            env[slot] = value

    def slots(self) -> set[int]:
        return set(self.reads) | set(self.writes)


class AtenStep:
    """An ATen segment's prepared call (Note [Prepared ATen calls]) bound to the sequence's
    slots: a replay reads the operands from the slots, views them, makes the op's call and
    writes the outputs back, with no list of values or second call frame on the way. The
    operands read through views are checked for their prepared strides first (another
    segment's result, which no guard pins: an attention backend may lay its output out
    otherwise); where they differ, the prepared call's own path runs (it interprets). The
    sequence counts the runs (`aten_runs`) as the executor does."""

    __slots__ = ("call", "reads", "writes", "count", "checks", "fn", "args", "picks", "write",
                 "relaid")  # fmt: skip

    def __init__(self, call: Any, reads: tuple[int, ...], writes: tuple[int, ...]) -> None:
        self.call, self.reads, self.writes, self.count = call, reads, writes, 0
        self.checks = tuple((reads[pos], stride) for pos, stride in call.strides)
        # (slot, shape, strides) of operands a kernel step allocates in the layout this step
        # reads them in: the prepared call's own path gets them in their recorded layout
        # (Note [Operands laid out by their kernels])
        self.relaid: tuple = ()
        self.fn = None
        if call.direct is not None:
            self.fn, specs, self.picks = call.direct
            if getattr(call, "matrices", False) and not switched_on("OLD_HOST_PATH"):
                self.fn = torch.mm  # Note [GEMM entry] in aten_calls.py
            self.args = tuple((None, view) if pos is None else (reads[pos], view)
                              for pos, view in specs)  # fmt: skip
            self.write = writes[0] if self.picks is None else None

    def run(self, env: list) -> None:
        for slot, stride in self.checks:
            if env[slot].stride() != stride:
                return self._prepared(env)
        if self.fn is None:
            return self._prepared(env)
        args = []
        for slot, view in self.args:
            if slot is None:
                args.append(view)
            elif view is None:
                args.append(env[slot])
            elif len(view) == 2:  # a view method (view_recipe in aten_calls.py)
                args.append(view[0](env[slot], *view[1]))
            else:  # Note [Operand views]
                args.append(reinterpret(env[slot], *view))
        out = self.fn(*args)
        if self.picks is None:
            env[self.write] = out
        else:
            for slot, i in zip(self.writes, self.picks):
                env[slot] = out[i]

    def _prepared(self, env: list) -> None:
        values = [env[s] for s in self.reads]
        for slot, shape, stride in self.relaid:
            base = reinterpret(env[slot], shape, stride, 0)
            values = [base if s == slot else v for s, v in zip(self.reads, values)]
        for slot, value in zip(self.writes, self.call(values)):
            env[slot] = value

    def straight(self) -> Callable[[list], None]:
        """This step's run as one closure (Note [Straight runs]): the strides checked, each
        operand read by a getter made once (a slot, a view of one, a constant), the call's
        one output written; the same call as `run` makes."""
        if self.fn is None or self.write is None or len(self.args) not in (2, 3):
            return self.run  # the usual ATen step is a GEMM: two operands, or three (a bias)
        fn, checks, prepared, write = self.fn, self.checks, self._prepared, self.write
        getters = [_operand(slot, view) for slot, view in self.args]
        first, second = getters[:2]
        third = getters[2] if len(getters) == 3 else None

        def run(env: list) -> None:
            for slot, stride in checks:
                if env[slot].stride() != stride:
                    return prepared(env)
            if third is None:
                env[write] = fn(first(env), second(env))
            else:
                env[write] = fn(first(env), second(env), third(env))

        return run

    def slots(self) -> set[int]:
        return set(self.reads) | set(self.writes)


def _operand(slot: int | None, view: Any) -> Callable[[list], Any]:
    """A getter of one ATen step argument (AtenStep.args) from the slots: the slot's tensor
    (a C-level itemgetter), its view by `reinterpret` (Note [Operand views]) or by a Tensor
    method (view_recipe in aten_calls.py), or a constant."""
    if slot is None:
        return lambda env: view
    if view is None:
        return itemgetter(slot)
    if len(view) == 2:
        method, arguments = view
        return lambda env: method(env[slot], *arguments)
    size, stride, offset = view
    return lambda env: reinterpret(env[slot], size, stride, offset)


class ExecuteStep:
    """A fusion run through execute(): what the sequence does not replay as launches.
    `device`: where a fusion reading no CUDA tensor runs (a segment creating values); `why`:
    why it is not replayed as launches (describe() and benchmarks.host_steps show it: each
    costs execute()'s checks and lookups, tens of microseconds on the H100's host)."""

    __slots__ = ("fd", "reads", "writes", "count", "device", "why")

    def __init__(self, fd: FusionDefinition, reads: tuple[int, ...], writes: tuple[int, ...],
                 device: torch.device | None = None, why: str = "") -> None:  # fmt: skip
        self.fd, self.reads, self.writes, self.count, self.device = fd, reads, writes, 0, device
        self.why = why

    def run(self, env: list) -> None:
        outs = self.fd.execute([env[s] for s in self.reads], device=self.device)
        for slot, value in zip(self.writes, outs):
            env[slot] = value

    def slots(self) -> set[int]:
        return set(self.reads) | set(self.writes)


# ---- the sequence ---------------------------------------------------------------------------


class LaunchSequence:
    """Steps over slots: `run(args)` puts the inputs in slots 0..n-1, runs each step and
    returns the output slots' values; `drops[k]` are the slots step k reads last."""

    __slots__ = ("steps", "drops", "outputs", "n_inputs", "pad", "launches", "aten_runs",
                 "counters", "fusion_id", "_runs", "_inline", "_inline_runs", "_stream",
                 "_device")  # fmt: skip

    def __init__(self, fd: FusionDefinition, n_inputs: int, n_slots: int, steps: Sequence[Any],
                 outputs: Sequence[int]) -> None:  # fmt: skip
        self.steps = tuple(steps)
        self.outputs = tuple(outputs)
        self.n_inputs = n_inputs
        if not switched_on("OLD_HOST_PATH") and operands_laid_out():
            _lay_out_operands(self.steps, n_inputs, self.outputs)
        drops = _last_reads(self.steps, n_inputs, self.outputs)
        n_slots, self.drops = _share_intermediates(self.steps, drops, self.outputs, n_slots)
        if switched_on("PACKED_OUTPUTS"):  # Note [Packed small outputs]
            n_slots, self.drops = _pack_small_outputs(self.steps, self.drops, n_slots)
        self.pad = [None] * (n_slots - n_inputs)
        self.launches = sum(s.count for s in self.steps)
        self.aten_runs = sum(isinstance(s, AtenStep) for s in self.steps)
        self.counters = fd._cache.counters
        self.fusion_id = fd._fid
        devices = {step.device for step in self.steps if isinstance(step, KernelStep)}
        # Note [Straight runs]; the old path is the A/B's baseline (Note [Unmeasured switches])
        straight = len(devices) <= 1 and not switched_on("OLD_HOST_PATH")
        self._runs = tuple((step.straight() if straight and isinstance(step, AtenStep)
                            else step.run, drop) for step, drop in zip(self.steps, self.drops))  # fmt: skip
        self._inline = _inline_binding(self.steps)
        self._inline_runs = tuple((_inline_run(step, straight), drop)
                                  for step, drop in zip(self.steps, self.drops))  # fmt: skip
        self._device = _device_index(devices) if straight else None
        self._stream = None  # the stream every bound launch was last launched on

    def run(self, args: Sequence[Any]) -> list:
        env = [*args, *self.pad]
        runs, stream = self._runs, None
        inline = self._inline
        if inline is not None and get_ident() == inline[0]:  # Note [Inline launches]
            stream = inline[2](inline[1])
            device = self._device
            if stream == self._stream and (device is None or _current_cuda_device() == device):
                runs, stream = self._inline_runs, None
        for run, drop in runs:
            run(env)
            for slot in drop:
                env[slot] = None
        if stream is not None:  # each launch ran checked, and now runs on this stream
            self._stream = stream
        counters = self.counters
        counters["kernel_launches"] += self.launches
        if self.aten_runs:
            counters["aten_runs"] = counters.get("aten_runs", 0) + self.aten_runs
        return list(map(env.__getitem__, self.outputs))

    def pinned_outputs(self) -> frozenset[int]:
        """The outputs (by index) whose layout the sequence fixes: inputs (the guard, or the
        plan key, pins them) and kernel steps' allocations; an ATen step's, torch lays out
        (Note [Operands laid out by their kernels]). None with the note off."""
        if switched_on("OLD_HOST_PATH") or not operands_laid_out():
            return frozenset()
        fixed = set(range(self.n_inputs))
        for step in self.steps:
            if isinstance(step, KernelStep):
                fixed |= {slot for slot, *_ in step.allocs}
        return frozenset(i for i, slot in enumerate(self.outputs) if slot in fixed)

    def replay_runs(self) -> tuple:
        """The (run, drop) pairs `run` would take now: the inline route's where this thread,
        stream and device allow it (Note [Inline launches]), else the checked one's
        (benchmarks.host_steps times each step as a replay runs it)."""
        inline = self._inline
        if inline is not None and get_ident() == inline[0]:
            device = self._device
            if inline[2](inline[1]) == self._stream and (
                    device is None or _current_cuda_device() == device):  # fmt: skip
                return self._inline_runs
        return self._runs

    @property
    def kernel_steps(self) -> int:
        return sum(isinstance(s, KernelStep) for s in self.steps)

    def describe(self) -> str:
        kinds = [type(s).__name__.removesuffix("Step").lower() for s in self.steps]
        whys = "".join(f"; execute of fusion {s.fd._fid}: {s.why}" for s in self.steps
                       if isinstance(s, ExecuteStep))  # fmt: skip
        return (f"fusion {self.fusion_id}: {len(self.steps)} steps ({', '.join(kinds)}), "
                f"{self.launches} launches{whys}")  # fmt: skip


# Note [Inline launches]: a bound launch (Note [Bound launches] in codegen/launch.py) checks on
# every call that it runs on the thread that bound it and on the stream its config names, and
# is a Python call of its own inside its kernel step's: about 1 us of a launch's 5 to 6 on the
# H100's host, and a training step makes 100 to 200. A sequence whose bound launches share one
# binding thread and device checks both once a call instead: on that thread, with torch's
# current stream the one every launch last ran on (set after a call whose launches ran
# checked, so that each moved its config to it), its kernel steps fill and call each launch
# themselves; otherwise each launch runs checked, as before (another thread takes the unbound
# route, a new stream is written into each config).


# Note [Straight runs]: a kernel step's run (KernelStep.run) serves every route: it picks its
# allocator by the current device, walks its arenas, carves, outputs, scratch and barrier, and
# for each launch asks whether to call it as it is; on the H100's host that bookkeeping cost
# twice the step's launch (benchmarks.host_steps, ResNet-18: a kernel step 12 us against its
# launch's 4). On the inline route (Note [Inline launches]) the sequence checks the current
# device once a call as well (its kernel steps' one CUDA device), and each kernel step runs
# as a closure made once over just what it does: its allocations and its launches' fill and
# call (KernelStep.straight); an ATen step likewise reads its operands through getters made
# once (AtenStep.straight). The same calls in the same order with the same arguments: a
# replay's launches and torch calls are the checked route's. CPU, fake driver, 20 steps of one
# output and one launch: 1.02 us a step against 1.58 (the bare loop: 0.92); H100 under
# cProfile, the Llama-style step's 105 kernel steps 1483 us against 1914 (2026-11-27).


def _inline_run(step: Any, straight: bool) -> Callable[[list], None]:
    """A step's run on the inline route (Note [Inline launches])."""
    if straight and isinstance(step, (KernelStep, AtenStep)):
        return step.straight()
    return partial(step.run, inline=True) if isinstance(step, KernelStep) else step.run


def _device_index(devices: set[torch.device]) -> int | None:
    """The CUDA device index a straight run checks once a call (its kernel steps' one
    device), or None where there is nothing to check (no kernel step, CPU steps: the stub)."""
    for device in devices:
        if device.type == "cuda":
            return torch.cuda.current_device() if device.index is None else device.index
    return None


def _inline_binding(steps: Sequence[Any]) -> tuple | None:
    """(thread, device index, current-stream getter) shared by the sequence's bound launches,
    or None where it has none, or several."""
    bindings = {launch.binding() for step in steps if isinstance(step, KernelStep)
                for launch in step.launches if hasattr(launch, "binding")}  # fmt: skip
    return bindings.pop() if len(bindings) == 1 else None


def _last_reads(steps: Sequence[Any], n_inputs: int, outputs: Sequence[int]) -> tuple:
    """Per step, the intermediate slots no later step reads and no output is: dropped at once,
    so a replay holds no more memory than the segmented run it replaces."""
    keep = set(outputs) | set(range(n_inputs))
    last: dict[int, int] = {}
    for k, step in enumerate(steps):
        for slot in step.slots():
            last[slot] = k
    drops: list[list[int]] = [[] for _ in steps]
    for slot, k in last.items():
        if slot not in keep:
            drops[k].append(slot)
    return tuple(tuple(sorted(d)) for d in drops)


# Note [Operands laid out by their kernels]: an ATen step reads most of its operands through a
# view (a linear layer's activations as rows, a weight gradient's operand transposed: Note
# [Operand views]), made on each call by `_reinterpret_tensor` after a check of the operand's
# strides; the Llama-style step makes about 90 such views and checks (CPU, stub). Mostly the
# operand is a kernel step's fresh output, whose layout the sequence fixes itself, as it fixes
# a sequence input's through the guard (or the plan key): a check of either is never false, so
# an ATen step checks only operands another torch call laid out (and a region's recorded
# view of such an output, Note [Recorded views], checks it no more). And where a fresh output
# that the region does not return is read by kernels and ATen steps alone, its kernel step
# allocates it in the layout the ATen steps read most, where that layout starts at the same
# element and spans the same elements (a reshape or transpose of it): a kernel reads only its
# address, so it writes the same bytes, and those ATen steps read the slot as it is, with no
# view. An ATen step reading it otherwise views it by its recorded sizes, strides and offset,
# which name elements of the storage, not of the tensor; its prepared call's own path (taken
# where another operand's check fails) gets the recorded layout back by one view. The same
# bytes, the same calls with operands of the same layout: the same results.
# H100, 2026-11-27 17:50 UTC (benchmarks.ab_steps, 4 rounds of 8 steps, against
# FUSION_CACHE_LAID_OUT_OPERANDS=0 in the same process): Llama-style 7.55 ms median against
# 7.40 (the off path 1.025 of this by paired rounds, 1 of 4 faster), GPT-2 11.83 against 11.75
# (0.972, 2 of 4); losses those of the off path to the digit. A Llama-style step's region calls
# read 12 strides (benchmarks.host_steps --profile, 18:03 UTC), 49 before recorded views of
# pinned outputs checked none (17:50); planned for h100 on the CPU (stub) at the benchmark's
# size, its ATen steps' stride checks 103 a step -> 4, operand views 103 -> 78. The gain is
# inside the noise.
# On by default (it takes work away and changes no call); =0 turns it off.


def operands_laid_out() -> bool:
    """Note [Operands laid out by their kernels]; FUSION_CACHE_LAID_OUT_OPERANDS=0: off (the
    A/B's baseline). Not a switch of Note [Unmeasured switches]: it changes no plan, so plans
    and fused forms need not be keyed by it."""
    return env_flag("FUSION_CACHE_LAID_OUT_OPERANDS", True)


def _lay_out_operands(steps: Sequence[Any], n_inputs: int, outputs: Sequence[int]) -> None:
    """Drop the checks of pinned operands and allocate ATen operands in the layout they are
    read in (Note [Operands laid out by their kernels])."""
    allocated: dict[int, tuple[KernelStep, int]] = {}  # slot -> (kernel step, its alloc's index)
    for step in steps:
        if isinstance(step, KernelStep):
            for i, (slot, *_) in enumerate(step.allocs):
                allocated[slot] = (step, i)
    pinned = set(range(n_inputs)) | set(allocated)
    readers: dict[int, list] = {}  # slot -> the ATen steps reading it
    others: set[int] = set(outputs)  # slots read otherwise than by pointer or ATen step views
    for step in steps:
        if isinstance(step, AtenStep):
            for slot in set(step.reads):
                readers.setdefault(slot, []).append(step)
            if step.fn is None:
                others |= set(step.reads)
        elif not isinstance(step, KernelStep):
            others |= step.slots()
        else:
            others |= {s for launch in step.launches for _, s in launch.values}
    layouts: dict[int, tuple] = {}  # slot -> (shape, strides) its kernel step allocates
    if reinterpret_tensor is not None:
        for slot, aten_steps in readers.items():
            if slot not in allocated or slot in others:
                continue
            step, i = allocated[slot]
            _, shape, stride, _ = step.allocs[i]
            votes: dict[tuple, int] = {}
            for a in aten_steps:
                for s, view in a.args:
                    if s == slot:
                        key = (shape, stride, 0) if view is None else tuple(view)
                        votes[key] = votes.get(key, 0) + 1
            best = max(votes, key=votes.get)
            size, strides, offset = best
            if (best == (shape, stride, 0) or offset != 0
                    or _span(size, strides) != _span(shape, stride)):  # fmt: skip
                continue
            layouts[slot] = (tuple(size), tuple(strides))
            allocs = list(step.allocs)
            allocs[i] = (slot, tuple(size), tuple(strides), allocs[i][3])
            step.allocs = step.fresh = tuple(allocs)
            for a in aten_steps:
                a.args = tuple(_relaid(s, view, slot, best, shape, stride) for s, view in a.args)
                a.relaid += ((slot, shape, stride),)
    for step in steps:
        if isinstance(step, AtenStep):
            step.checks = tuple(c for c in step.checks if c[0] not in pinned)


def _relaid(slot: int | None, view: Any, relaid: int, layout: tuple, shape: tuple,
            stride: tuple) -> tuple:  # fmt: skip
    """An ATen step's (slot, view) argument once slot `relaid` is allocated in `layout`."""
    if slot != relaid:
        return slot, view
    view = (shape, stride, 0) if view is None else tuple(view)
    return slot, None if view == layout else view


# Note [Shared intermediates]: a fusion's segments hand each other intermediates the region
# does not return, and each cost an allocation and a free on every call (about 2.5 and 1.5
# us on the H100's host; the Llama-style step makes 61 that only our kernels read, GPT-2's
# about 40). Inductor's generated code plans such buffers into one another; here the
# intermediates of one dtype and device that a kernel step allocates and only kernel steps
# read share one arena a call: laid out once by their lifetimes (two that are alive at the
# same step never overlap), the arena is allocated by the first step that needs it and each
# intermediate is carved from it by `_reinterpret_tensor` (Note [Operand views]), where it
# was an allocation; the arena's slot is dropped after the last carve, and its memory is
# freed with the last intermediate, as the allocator freed theirs. Only kernel steps read
# them: a launch reads a pointer and makes no alias (a torch call may return a view of its
# operand), so nothing outlives the call. Reuse within the arena runs in stream order, as
# the caching allocator's reuse of a freed block does. Offsets are 256-byte aligned (the
# kernels were planned on allocator blocks, at least that aligned).
ARENA_ALIGN = 256
# Note [GEMM operands shared]: a kernel output that a GEMM reads (a linear layer's input, an
# activation's gradient) cost its allocation and free as well: the torch call was not a
# kernel step's launch, which reads a pointer and keeps nothing. But a GEMM makes its output
# anew and keeps no reference to its operands once it returns (torch.mm, torch.matmul,
# torch.bmm and linear never return a view or alias of an operand), so an operand it reads
# outlives the call no more than a launch's does: such an intermediate shares an arena as
# the others do (the GEMM reads a carve, of the same layout and address alignment of at
# least 256 bytes). Opt-in (FUSION_CACHE_GEMM_OPERANDS_SHARED=1): H100, 2026-11-27 18:03 UTC
# (benchmarks.ab_steps, 4 rounds of 8 steps, with Note [Operands laid out by their kernels],
# against both off), Llama-style 8.28 ms median against 8.46 (0.950 by paired rounds, 2 of 4),
# GPT-2 13.70 against 13.10 (0.965 the other way, 2 of 4): no gain the noise lets through, and
# larger arenas may hold more memory at a call's peak (within ARENA_BYTES an arena). Planned
# for h100 on the CPU at the benchmark's size: the Llama-style step's allocations 114 -> 94.
_FRESH_OUTPUTS = frozenset({torch.mm, torch.matmul, torch.bmm, torch.nn.functional.linear})


def _gemm_operands_shared() -> bool:
    return env_flag("FUSION_CACHE_GEMM_OPERANDS_SHARED", False)


# An arena holds all its bytes until its last carve is dropped, where the allocator would
# have freed each intermediate after its last read: a chain of four 64 MiB values peaked at
# three of them alive, not two (tests/gpu/test_segmentation_gpu.py, H100). So only
# intermediates up to ARENA_BLOCK_BYTES share (a larger one's kernel runs long enough to
# hide its allocation's few us of host), and an arena is closed at ARENA_BYTES: a call's
# peak stays within that much per arena of the allocator's.
ARENA_BLOCK_BYTES = 16 << 20
ARENA_BYTES = 64 << 20


def _share_intermediates(steps: Sequence[Any], drops: tuple, outputs: Sequence[int],
                         n_slots: int) -> tuple[int, tuple]:  # fmt: skip
    """Carve the kernel-only intermediates of `steps` from arenas (Note [Shared
    intermediates]); the slots with the arenas', and the drops with theirs."""
    others: set[int] = set()  # slots a step other than a kernel step reads or writes
    gemms = _gemm_operands_shared()
    for step in steps:
        if isinstance(step, AtenStep) and gemms and step.fn in _FRESH_OUTPUTS:
            others |= set(step.writes)  # Note [GEMM operands shared]: its reads may share
        elif not isinstance(step, KernelStep):
            others |= step.slots()
    dropped = {slot: k for k, drop in enumerate(drops) for slot in drop}
    groups: dict[tuple, list] = {}  # (dtype, device) -> (slot, first step, last, bytes, ...)
    for k, step in enumerate(steps):
        if not isinstance(step, KernelStep):
            continue
        for alloc in step.allocs:
            slot, shape, stride, dtype = alloc
            size = _span(shape, stride) * dtype.itemsize
            if (slot in others or slot in outputs or slot not in dropped or not size
                    or size > ARENA_BLOCK_BYTES):
                continue
            groups.setdefault((dtype, step.device), []).append((slot, k, dropped[slot], size,
                                                                 alloc))  # fmt: skip
    drops = [list(d) for d in drops]
    arenas = [(dtype, chunk) for (dtype, _), blocks in groups.items()
              for chunk in _arena_chunks(blocks)]  # fmt: skip
    for dtype, blocks in arenas:
        if len(blocks) < 2:  # an arena of one saves nothing
            continue
        offsets, total = _layout(blocks)
        arena = n_slots
        n_slots += 1
        carved: dict[int, list] = {}
        for (slot, k, _, _, alloc), offset in zip(blocks, offsets):
            carved.setdefault(k, []).append((slot, arena, alloc[1], alloc[2],
                                             offset // dtype.itemsize))  # fmt: skip
        first, last = min(carved), max(carved)
        steps[first].arenas += ((arena, total // dtype.itemsize, dtype),)
        for k, carves in carved.items():
            taken = {c[0] for c in carves}
            steps[k].carves += tuple(carves)
            steps[k].fresh = tuple(a for a in steps[k].fresh if a[0] not in taken)
        drops[last].append(arena)
    return n_slots, tuple(tuple(d) for d in drops)


# Note [Packed small outputs]: a kernel step allocates each output it makes, about 2 us of
# host time each on the H100 (benchmarks.host_steps, 2026-11-27: ResNet-18's kernel steps 8 us
# over their launches, 173 allocations a step for 42 launches). Most are small: a batch norm's
# forward region returns its saved mean and inverse deviation and the new running statistics
# beside its activation, four [C] tensors; its backward, the weight's and bias's gradients.
# The small fresh outputs of one dtype of a step (up to PACK_BYTES each) are carved from one
# allocation, as Note [Shared intermediates] carves intermediates, each block apart (they all
# live past the step): one allocation where there were several. They share a storage then,
# which only keeps the others' few bytes alive while one lives. Opt-in: an interleaved A/B on
# the H100 could not tell it from the default (Note [Unmeasured switches] has the figures).
PACK_BYTES = 64 << 10


def _pack_small_outputs(steps: Sequence[Any], drops: tuple,
                        n_slots: int) -> tuple[int, tuple]:  # fmt: skip
    """Carve each kernel step's small fresh allocations of one dtype from one (Note [Packed
    small outputs]); the slots with the packs', and the drops with theirs."""
    drops = [list(d) for d in drops]
    for k, step in enumerate(steps):
        if not isinstance(step, KernelStep):
            continue
        groups: dict[torch.dtype, list] = {}
        for alloc in step.fresh:
            _, shape, stride, dtype = alloc
            size = _span(shape, stride) * dtype.itemsize
            if 0 < size <= PACK_BYTES:
                groups.setdefault(dtype, []).append((alloc, size))
        for dtype, allocs in groups.items():
            if len(allocs) < 2:
                continue
            pack, offset = n_slots, 0
            n_slots += 1
            carves = []
            for (slot, shape, stride, _), size in allocs:
                carves.append((slot, pack, shape, stride, offset // dtype.itemsize))
                offset += -(-size // ARENA_ALIGN) * ARENA_ALIGN
            step.arenas += ((pack, offset // dtype.itemsize, dtype),)
            step.carves += tuple(carves)
            taken = {c[0] for c in carves}
            step.fresh = tuple(a for a in step.fresh if a[0] not in taken)
            drops[k].append(pack)  # the carved outputs hold its storage
    return n_slots, tuple(tuple(d) for d in drops)


def _span(shape: Sequence[int], stride: Sequence[int]) -> int:
    """Elements a tensor of `shape` and `stride` spans in its storage (0 when empty)."""
    if any(n == 0 for n in shape):
        return 0
    return 1 + sum((n - 1) * s for n, s in zip(shape, stride))


def _arena_chunks(blocks: list) -> list[list]:
    """`blocks` (in step order) cut into runs whose arena stays within ARENA_BYTES."""
    chunks: list[list] = [[]]
    for block in blocks:
        if chunks[-1] and _layout([*chunks[-1], block])[1] > ARENA_BYTES:
            chunks.append([])
        chunks[-1].append(block)
    return chunks


def _layout(blocks: list) -> tuple[list[int], int]:
    """Byte offsets of (slot, first step, last step, bytes, ...) blocks in one arena, two
    alive at a common step never overlapping (largest first, each at the lowest offset
    free of those it meets), and the arena's bytes."""
    placed: list[tuple[int, int, int, int]] = []  # (offset, end, first step, last step)
    offsets = [0] * len(blocks)
    for i in sorted(range(len(blocks)), key=lambda i: -blocks[i][3]):
        _, first, last, size, _ = blocks[i]
        size = -(-size // ARENA_ALIGN) * ARENA_ALIGN
        offset = 0
        for start, end, *_ in sorted(p for p in placed if p[2] <= last and first <= p[3]):
            if offset + size <= start:
                break
            offset = max(offset, end)
        offsets[i] = offset
        placed.append((offset, offset + size, first, last))
    return offsets, max(end for _, end, _, _ in placed)


# ---- recording a sequence -------------------------------------------------------------------


class _Builder:
    """Slots and steps as a run is recorded."""

    def __init__(self, n_inputs: int) -> None:
        self.n_slots = n_inputs
        self.steps: list[Any] = []

    def slot(self) -> int:
        self.n_slots += 1
        return self.n_slots - 1


def sequence_for(fd: FusionDefinition, values: Sequence[Any]) -> tuple[LaunchSequence, list]:
    """Run `fd` on `values` (checked here, as execute does) and record the run; returns the
    sequence that replays it for inputs `Guard(values)` matches, and this run's outputs."""
    values = validate_inputs(fd, values)
    b = _Builder(len(values))
    outs, out_slots = _record(fd, values, list(range(len(values))), b)
    return LaunchSequence(fd, len(values), b.n_slots, b.steps, out_slots), outs


def record_segmented(fd: FusionDefinition, plan: SegmentedPlan,
                     values: Sequence[Any]) -> tuple[LaunchSequence, list]:  # fmt: skip
    """Run segmented `plan` of `fd` on `values` (inputs its plan key matched) and record the
    run: execute() replays the sequence for later inputs of the same key (Note [Segmented
    replay] in the executor)."""
    b = _Builder(len(values))
    outs, out_slots = _record_segments(plan, values, list(range(len(values))), b, None)
    return LaunchSequence(fd, len(values), b.n_slots, b.steps, out_slots), outs


def _on_gpu(values: Sequence[Any]) -> bool:
    return any(isinstance(v, torch.Tensor) and v.is_cuda for v in values)


def _record(fd: FusionDefinition, values: Sequence[Any], slots: list[int], b: _Builder,
            device: torch.device | None = None) -> tuple[list, list[int]]:  # fmt: skip
    """Run `fd` on `values` (in `slots`) and append its steps; its outputs and their slots.
    `device`: where the run is, for a fusion that reads no CUDA tensor."""
    device = None if _on_gpu(values) else device
    plan, why = _plan(fd, values, device)
    # random numbers (seeds that advance each run) and outputs that alias inputs (views made
    # after the launch) are the executor's launch to handle: replayed through it
    ex = executor_for(fd) if plan is not None else None
    special = ex is not None and (getattr(ex, "seeded", False) or getattr(ex, "aliased", False))
    if isinstance(plan, LaunchPlan) and not special:
        start = len(b.steps)
        step = _kernel_step(plan, slots, b)
        b.steps.append(step)
        env: dict[int, Any] = dict(zip(slots, values))
        try:
            for s in b.steps[start:]:
                s.run(env)
        except (ValueError, TypeError):
            raise
        except Exception as err:  # a launch the driver refused: execute() falls back, or raises
            del b.steps[start:]
            why = f"its launch failed when recorded: {type(err).__name__}: {err}"
        else:
            executor_for(fd).last_plan = plan
            fd._cache.counters["kernel_launches"] += step.count
            return [env[s] for s, *_ in step.allocs], [s for s, *_ in step.allocs]
    elif isinstance(plan, SegmentedPlan):
        return _record_segments(plan, values, slots, b, device)
    elif plan is not None and device is None:  # the executor's own launch of other plans
        outs = ex.launch(plan, list(values))
        writes = tuple(b.slot() for _ in outs)
        call = getattr(plan, "call", None) if isinstance(plan, AtenPlan) and not special else None
        b.steps.append(PlanStep(ex, plan, tuple(slots), writes) if call is None else
                       AtenStep(call, tuple(slots), writes))  # fmt: skip
        return outs, list(writes)
    elif plan is not None:
        why = (f"a {type(plan).__name__}" + (" with random numbers or aliased outputs" if special
               else "") + " of a fusion reading no tensor")  # fmt: skip
    # CPU inputs, the reference evaluator, a plan kind not recorded here: execute() each time
    outs = fd.execute(list(values), device=device)
    writes = tuple(b.slot() for _ in outs)
    b.steps.append(ExecuteStep(fd, tuple(slots), writes, device, why))
    return outs, list(writes)


def _plan(fd: FusionDefinition, values: Sequence[Any],
          device: torch.device | None) -> tuple[Any, str]:  # fmt: skip
    """The executor's plan for CUDA inputs (or, reading none, for `device`), or None where
    execute() is to run instead, and why."""
    on_device = device is not None and device.type == "cuda"
    if not (on_device or _on_gpu(values)):
        return None, "no CUDA tensor and no CUDA device"
    ex = executor_for(fd)
    if ex.dumps:
        return None, "dumps print from execute's own path"
    if getattr(getattr(ex, "aliases", None), "all_views", False):
        return None, "views of its inputs: no plan"
    try:
        if on_device:  # a fusion reading no tensor runs on the current device: this one
            with torch.cuda.device(device):
                return ex.plan(values, ex.key(values)), ""
        return ex.plan(values, ex.key(values)), ""
    except (ValueError, TypeError):
        raise
    except Exception as err:  # codegen or compile failures: execute() falls back, or raises
        return None, f"no plan: {type(err).__name__}: {err}"


def _kernel_step(plan: LaunchPlan, slots: list[int], b: _Builder) -> KernelStep:
    spec = plan.spec
    device = plan.device
    for i in plan.host_inputs:  # read from a device copy made by a step of its own
        dst = b.slot()
        b.steps.append(TensorStep(slots[i], dst, _to_device(device)))
        slots = [*slots[:i], dst, *slots[i + 1 :]]
    out_slots, allocs = [], []
    for o in spec.outputs:
        if o.alias_input is not None:
            out_slots.append(slots[o.alias_input])  # written in place, not returned
        else:
            out_slots.append(b.slot())
            shape = tuple(o.shape)
            strides = getattr(o, "strides", None)  # Note [Output layouts], else contiguous
            if strides is None:
                strides = torch.empty(shape, device="meta").stride()
            allocs.append((out_slots[-1], shape, tuple(strides), to_torch(o.dtype)))
    scratch = []
    for numel, dtype in spec.workspaces:
        scratch.append((b.slot(), (numel,), (1,), to_torch(dtype)))
    barrier = b.slot() if any(k.cooperative for k in spec.kernels) else None
    work_slots = [s for s, *_ in scratch] + ([barrier] if barrier is not None else [])
    launches = []
    for kernel, launch, fills in zip(plan.kernels, spec.kernels, plan.slots):
        template = list(launch.args)
        pointers, scalars = [], []
        for pos, ref in fills:
            template[pos] = None
            if ref.kind == "input":
                pointers.append((pos, slots[ref.index]))
            elif ref.kind == "output":
                pointers.append((pos, out_slots[ref.index]))
            elif ref.kind == "workspace":
                pointers.append((pos, work_slots[ref.index]))
            else:
                scalars.append((pos, slots[ref.index]))
        launches.append(kernel.bind(launch.grid, launch.block, launch.arg_types, template,
                                    pointers, scalars, launch.shared_mem,
                                    cooperative=launch.cooperative, dependent=launch.dependent))
    return KernelStep(tuple(allocs), tuple(scratch), tuple(launches), plan, barrier)


def _record_segments(plan: SegmentedPlan, values: Sequence[Any], slots: list[int], b: _Builder,
                     device: torch.device | None) -> tuple[list, list[int]]:  # fmt: skip
    """Each segment recorded in turn into the same slots (Note [Segment index space]: the
    original's state indices name the values between segments)."""
    env = dict(zip(plan.input_states, values))
    where = dict(zip(plan.input_states, slots))
    device = run_device(values) or device
    for seg in plan.segments:
        args = [env[v] for v in seg.sub.inputs]
        arg_slots = [where[v] for v in seg.sub.inputs]
        for k, i in enumerate(seg.dense_inputs):  # an ATen result read where strides are fixed
            make = seg.densify(k)
            args[i] = make(args[i])
            arg_slots[i] = b.slot()
            b.steps.append(TensorStep(where[seg.sub.inputs[i]], arg_slots[i], make))
        outs, out_slots = _record(seg.definition, args, arg_slots, b, device)
        for v, value, slot in zip(seg.sub.outputs, outs, out_slots):
            env[v], where[v] = value, slot
        for v in seg.drop_after:
            env.pop(v, None)
    # an input returned as an output is the input itself (Note [Outputs that alias inputs])
    results = [env[v] for v in plan.output_states]
    result_slots = [where[v] for v in plan.output_states]
    return results, result_slots
