"""The GPU path of execute(): per fusion an executor holds the scheduled program and a
cache of launch plans keyed by the inputs' dtypes, sizes, strides and alignment.

Note [Plan cache]: a plan is everything a run needs that depends on the inputs but not on
their data: output shapes, scratch buffers, and the kernels with their argument templates.
Validation depends only on the same key, so a hit skips it: it costs a key, a dict lookup,
output allocation and the launches.

Note [Segmented replay]: a segmented plan's run fed each segment to execute(): per segment an
input key, a plan lookup and the argument bookkeeping between segments, on top of its
launches (an attention block of one kernel and three torch calls cost more host time than
its GPU time on the H100). The first run of a segmented plan records a launch sequence
(Note [Launch sequence]), as the torch.compile backend does for its regions, and later runs
of the same plan replay it: kernels launched from argument templates, ATen segments' prepared
calls, intermediates dropped after their last reader. The plan's key fixed every input's
dtype, shape, strides and alignment and every int, so the replay needs no guard of its own.
Dumps and profiles keep the segment-by-segment run, which names each segment.

Note [Stored segmentations]: searching a segmentation is the costly part of planning a big
fusion (a torch.compile region holding a whole layer stack: seconds), and a new process on
a warm store would search again for the same fusion and inputs. So a segmented plan's
summary in the store keeps its groups (each segment's owned and computed ops) beside the
segmenter's version, and a later plan for the same fusion, signature and target takes
them after checking they fit the fusion (schedulers/segmenter.py, `given`), searching
again only where they do not, or where a group would land on the reference evaluator.
The version names a hash of the schedulers' sources: a build whose schedulers change (a
scheduler that now takes a merged group, 2026-11-28's Note [Split loops]) searches again
rather than replaying a segmentation it would improve on.

Note [Stored kinds]: a warm process given the stored groups still tried every scheduler on
each group to learn which takes it: on the Llama-style model's warm first step (CPU, stub
launches, cProfile) 0.51 of its 1.41 s of first region calls, for 90 groups. The record keeps
each group's scheduler as the search found it, and the segmenter takes them as it takes a
forked search's (Note [Searches apart]): every segment is planned again by its own executor,
which asks the schedulers in priority order, so a kind only decides which inputs a segment
takes with torch's strides. A record without kinds, or naming a scheduler not registered,
has its groups tried as before.
"""
from __future__ import annotations

import functools
import json
import threading
import time
import warnings
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from fusion_cache.frontend.dtypes import to_torch
from fusion_cache.frontend.options import dump_options
from fusion_cache.frontend.trie import FusionCache
from fusion_cache.ir.aliases import aliases_of, view_outputs
from fusion_cache.ir.empty_reductions import empty_reductions, without_empty_reductions
from fusion_cache.ir.shape_eval import runtime_shapes
from schedulers.aten import NAME as ATEN
from schedulers.base import ArgRef, SchedulerRefused
from schedulers.registry import plan_for, schedule

from . import pending_compiles, run_context, searches_apart
from .aten_calls import prepare_call
from .aten_segments import AtenPlan, run_aten
from .kernel_cache import cubin_for, load_function
from .plans import LaunchPlan, ReferencePlan, fill_args, host_inputs_of, input_key
from .reference import run_reference
from .rng import run_seeds, with_seeds
from .source_digest import sources_digest

if TYPE_CHECKING:
    from fusion_cache.frontend.definition import FusionDefinition


class FusionUnsupportedError(RuntimeError):
    """No scheduler took the fusion (or its kernel failed) and fallback is disabled."""


class FallbackDisabledError(FusionUnsupportedError):
    """Raised where a fusion would have fallen back, naming it; the runs around it (its own
    first run, a segmented fusion holding it) pass it on unchanged."""


class FusionExecutor:
    def __init__(self, fd: FusionDefinition) -> None:
        from fusion_cache.ir.decompose import expand_composites
        from fusion_cache.ir.random_seeds import seed_only_inputs, unseeded_ops, with_seed_inputs

        # what the schedulers see: primitives only, random ops seeded (Note [Random seeds])
        self.seeded = unseeded_ops(fd)
        self.fd = with_seed_inputs(expand_composites(fd))
        self.free_ints = seed_only_inputs(fd)  # inputs the plan key leaves out
        self.fid = fd._fid
        self.dumps = dump_options()
        self.scheduler, self.program, self.refusals = schedule(self.fd)
        # Note [Outputs that alias inputs]: returned as the inputs' memory after each run
        self.aliases = aliases_of(fd)
        self.aliased = bool(self.aliases.views or self.aliases.written)
        self.plans: dict[tuple, LaunchPlan] = {}
        self.replays: dict[int, tuple] = {}  # id of a segmented plan -> (it, its sequence)
        self.ahead: dict[tuple, Any] = {}  # Note [Plans kept from ahead]: for the first call
        self.lock = threading.Lock()
        self.last_plan: LaunchPlan | None = None
        self.warned = False
        if "fusion_ir" in self.dumps:
            print(fd.fusion_ir())
        if "scheduler" in self.dumps:
            taken = self.scheduler or "none (reference evaluator)"
            print(f"fusion {self.fid}: scheduler {taken}; refusals: "
                  f"{[str(r) for r in self.refusals] or 'none'}")  # fmt: skip

    def key(self, values: Sequence[Any]) -> tuple:
        """The plan cache's key of these inputs (Note [Plan cache]); an int read only as a
        random op's seed or offset is keyed by its type, not its value."""
        key = input_key(values)
        if not self.free_ints:
            return key
        return tuple(int if i in self.free_ints else k for i, k in enumerate(key))

    def scheduled_inputs(self, values: Sequence[Any], seeds: tuple[int, int] = (0, 0)) -> list:
        """The inputs of the definition the schedulers see: the user's, after the run's seed
        and offset where it has unseeded random ops (Note [Random seeds])."""
        return with_seeds(values, seeds) if self.seeded else list(values)

    def make_plan(self, values: Sequence[Any], profile: Any, load: bool) -> Any:
        """A LaunchPlan when one scheduler takes the fusion for these (the user's) inputs,
        else a SegmentedPlan (Note [Greedy segmentation])."""
        return self._make_plan(self.scheduled_inputs(values), profile, load)

    def _make_plan(self, values: Sequence[Any], profile: Any, load: bool) -> Any:
        host = host_inputs_of(values) if load else ()
        env = runtime_shapes(self.fd, values)
        if empty_reductions(self.fd, env):  # Note [Empty reductions]
            rewritten = without_empty_reductions(self.fd, env)
            renv = runtime_shapes(rewritten, values)
            spec = _plan_single(rewritten, values, renv, profile)
            if spec is not None:
                return self._load_plan(spec, values, profile, load, host)
            return self.segmented(values, renv, profile, "empty reductions as identities",
                                  rewritten)  # fmt: skip
        if self.program is None:
            return self.segmented(values, env, profile, "; ".join(str(r) for r in self.refusals))
        ahead = _ahead_key(values, profile) if pending_compiles.plans_kept() else None
        spec = self.ahead.get(ahead) if ahead is not None else None  # Note [Plans kept from ahead]
        try:
            if spec is None:
                spec = plan_for(self.scheduler, self.program, values, env, profile)
        except SchedulerRefused as why:
            return self.segmented(values, env, profile, f"{self.scheduler}: {why}")
        if ahead is not None:
            if pending_compiles.deferring():
                self.ahead[ahead] = spec
            else:
                self.ahead.pop(ahead, None)
        if spec.scheduler == ATEN:  # one torch call, no kernels (Note [ATen segments])
            self.record(values, profile, {"scheduler": ATEN, "plan": spec.description})
            return AtenPlan(spec, self.program, call=prepare_call(self.fd, values))
        return self._load_plan(spec, values, profile, load, host)

    def _load_plan(self, spec: Any, values: Sequence[Any], profile: Any, load: bool,
                   host: tuple) -> Any:  # fmt: skip
        """Compile (or find) and load a spec's kernels: the LaunchPlan."""
        kernels, refs, slots = [], [], []
        device = home_device(values) if load else next(
            (v.device.index for v in values if isinstance(v, torch.Tensor) and v.is_cuda), 0)
        for launch in spec.kernels:
            if len(launch.args) != len(launch.arg_types):
                # a planner's bug, caught where planning ends (on the CPU too, by precompile)
                # rather than as a launch error, or a fault, on the GPU
                raise RuntimeError(f"fusion {self.fid}: {launch.name} was planned with "
                                   f"{len(launch.args)} arguments for {len(launch.arg_types)} "
                                   f"parameters {launch.arg_types} ({spec.description})")
            if "cuda_kernel" in self.dumps:
                print(launch.source)
            params = json.dumps({"grid": launch.grid, "block": launch.block, "plan": spec.description})
            cubin, ref = cubin_for(launch.source, launch.name, profile.arch, fusion_id=self.fid,
                                   scheduler=spec.scheduler, params_json=params)  # fmt: skip
            kernel = load_function(cubin, ref, device) if load else None
            if kernel is not None and _cluster_does_not_fit(kernel, launch, profile):
                # Note [Cluster fallback]: clusters of 16 are planned where the GPU was
                # measured to run them, but this process may get fewer SMs (MPS, a green
                # context) or a kernel too big for 16 SMs of a GPC. The driver says none
                # fits: plan again within the portable size rather than fail at launch
                return self._make_plan(values, replace(profile, max_cluster=8), load)
            if kernel is not None and not kernels and spec.wave:
                # Note [One wave of partials]: the planner estimated the resident clusters;
                # the driver knows them for this kernel on this GPU. Before the other kernels
                # load: the same kernels, another grid
                resident = kernel.max_resident(launch.block, launch.shared_mem)
                if resident and resident != spec.wave:
                    return self._make_plan(values, replace(profile, measured_wave=resident), load)
            if kernel is not None and launch.cooperative and not _all_resident(kernel, launch):
                # Note [Finish in the row kernel]: a cooperative launch needs every block
                # resident at once; where the driver says they are not, a second kernel
                return self._make_plan(values, replace(profile, fused_finish=False), load)
            refs.append(ref)
            kernels.append(kernel)
            slots.append([(i, a) for i, a in enumerate(launch.args) if isinstance(a, ArgRef)])
            if "launch_param" in self.dumps:
                print(f"fusion {self.fid}: {launch.name} grid {launch.grid} block {launch.block} "
                      f"smem {launch.shared_mem} ({spec.description})")  # fmt: skip
        if spec.kernels:
            self.record(values, profile, {"scheduler": spec.scheduler, "plan": spec.description,
                                          "kernels": [r.to_json() for r in refs]})  # fmt: skip
        fresh = tuple((o.shape, to_torch(o.dtype), o.strides) for o in spec.outputs
                      if o.alias_input is None)  # fmt: skip
        return LaunchPlan(spec, kernels, refs, slots, torch.device("cuda", device), fresh, host)

    def segmented(self, values: Sequence[Any], env: dict, profile: Any, why: str,
                  fd: Any = None) -> Any:  # fmt: skip
        """`fd`: what to segment, default the fusion (a rewrite of it must keep its inputs
        and returned outputs in order)."""
        from schedulers.segmenter import segment

        from .segmented import build_plan, describe_plan

        kept = fd is None and pending_compiles.plans_kept()  # Note [Plans kept from ahead]
        ahead = _ahead_key(values, profile) if kept else None
        if ahead is not None and ahead in self.ahead:  # Note [Plans kept from ahead]
            return self.ahead[ahead] if pending_compiles.deferring() else self.ahead.pop(ahead)
        stored, kinds = self.stored_groups(values, profile) if fd is None else (None, None)
        drafts = None
        if stored is None and fd is None:  # Note [Searches apart]: found by a child, checked
            key = (self.fid, plan_signature(values), profile.arch)
            stored, kinds = searches_apart.take_hint(key) or (None, None)
            if stored is None and searches_apart.holding():
                raise searches_apart.SearchNeeded(key, self.fd, list(values), env, profile)
        fd = self.fd if fd is None else fd
        if stored is not None:  # Note [Stored segmentations]
            try:
                drafts = segment(fd, values, env, profile, stored, kinds)
            except SchedulerRefused:
                drafts = None
            if drafts is not None and any(d.scheduler is None for d in drafts):
                drafts = None  # a segment only the reference runs: search again, to be sure
        try:
            if drafts is None:
                drafts = segment(fd, values, env, profile)
        except SchedulerRefused as err:
            raise FusionUnsupportedError(f"no scheduler takes it ({why}) and it cannot be "
                                         f"segmented: {err}") from None  # fmt: skip
        if len(drafts) < 2:
            raise FusionUnsupportedError(f"no scheduler takes it ({why})")
        plan = build_plan(fd, drafts)
        if "segments" in self.dumps:
            print(describe_plan(fd, plan))
        # recorded like a kernel plan, so `fusion-cache show` tells which fusions run it
        self.record(values, profile, {"scheduler": "segmented", "plan": plan.description,
                                      "segments": [s.definition.id() for s in plan.segments],
                                      "refused": why, "segmenter": segmenter_version(),
                                      "groups": [[sorted(d.owned), sorted(d.ops)]
                                                 for d in drafts],
                                      "kinds": [d.scheduler for d in drafts]})  # fmt: skip
        if ahead is not None and pending_compiles.deferring():
            self.ahead[ahead] = plan
        return plan

    def stored_groups(self, values: Sequence[Any],
                      profile: Any) -> tuple[list | None, list | None]:  # fmt: skip
        """(the groups a segmentation of these inputs found before, as the store holds them,
        or None: none stored, another segmenter's, or not well-formed; the scheduler the
        search gave each, or None where the record has none or names one not registered)."""
        try:
            store = FusionCache.get().store
            text = store.get_plan(self.fid, plan_signature(values), f"sm_{profile.arch}")
            found = json.loads(text) if text else None
            if not isinstance(found, dict) or found.get("segmenter") != segmenter_version():
                return None, None
            groups = []
            for owned, ops in found["groups"]:
                if not all(type(p) is int for p in (*owned, *ops)):
                    return None, None
                groups.append((frozenset(owned), frozenset(ops)))
            return groups, _stored_kinds(found.get("kinds"), len(groups))
        except (KeyError, TypeError, ValueError):
            return None, None

    def record(self, values: Sequence[Any], profile: Any, plan: dict) -> None:
        """Keep a plan's summary in the store under these inputs' signature and target."""
        FusionCache.get().store.put_plan(self.fid, plan_signature(values), f"sm_{profile.arch}",
                                         json.dumps(plan))  # fmt: skip

    def plan(self, values: Sequence[Any], key: tuple) -> Any:
        with self.lock:
            plan = self.plans.get(key)
            if plan is None:
                from schedulers.device import current_profile

                FusionCache.get()._count("plan_cache_misses")
                try:
                    plan = self.make_plan(values, current_profile(home_device(values)), load=True)
                except FusionUnsupportedError as why:
                    plan = ReferencePlan(str(why))  # remembered: no re-analysis per call
                self.plans[key] = plan
            return plan

    def launch(self, plan: Any, values: Sequence[Any]) -> list[torch.Tensor]:
        if self.seeded:  # this run's numbers (Note [Random seeds])
            values = with_seeds(values, run_seeds(values, self.seeded))
        outs = self._launch(plan, values)
        return view_outputs(self.fd, values, outs) if self.aliased else outs

    def _launch(self, plan: Any, values: Sequence[Any]) -> list[torch.Tensor]:
        if plan.__class__ is not LaunchPlan:
            return self._launch_other(plan, values)
        if plan.host_inputs:
            # non_blocking: the driver stages a pageable source at once, so the value is
            # taken now, and the stream is not synchronized as a blocking copy would
            values = list(values)
            for i in plan.host_inputs:
                values[i] = values[i].to(plan.device, non_blocking=True)
        self.last_plan = plan
        spec = plan.spec
        if self.dumps or not plan.lean or run_context.ACTIVE:
            return self._launch_general(plan, values)
        # the plain case, kept lean: it is the whole host cost of a cache hit
        device = plan.device
        outs = [torch.empty(shape, dtype=dtype, device=device) if strides is None else
                torch.empty_strided(shape, strides, dtype=dtype, device=device)
                for shape, dtype, strides in plan.fresh]  # fmt: skip
        for kernel, launch, slots in zip(plan.kernels, spec.kernels, plan.slots):
            args = fill_args(launch.args, slots, values, outs, ())
            kernel.launch(launch.grid, launch.block, launch.arg_types, args, launch.shared_mem)
        self.fd._cache.counters["kernel_launches"] += len(spec.kernels)
        return outs

    def _launch_other(self, plan: Any, values: Sequence[Any]) -> list[Any]:
        if isinstance(plan, ReferencePlan):
            return _fallback(self.fd, self, values, plan.reason)
        if isinstance(plan, AtenPlan):
            self.last_plan = plan
            self.fd._cache._count("aten_runs")
            return run_aten(self.fd, plan, values)
        from .segmented import run_segments

        self.last_plan = plan
        counters = self.fd._cache.counters
        counters["segmented_runs"] += 1
        if self.dumps or run_context.ACTIVE:  # dumps and profiles name each segment's run
            return run_segments(self.fd, plan, values, dump="segments" in self.dumps)
        # Note [Segmented replay]
        found = self.replays.get(id(plan))
        if found is None or found[0] is not plan:  # an id outlives a dropped plan
            from .sequence import record_segmented

            replay, outs = record_segmented(self.fd, plan, values)
            self.replays[id(plan)] = (plan, replay)
            return outs
        counters["plan_cache_hits"] += len(plan.segments)  # each segment's plan, replayed
        return found[1].run(values)

    def _launch_general(self, plan: LaunchPlan, values: Sequence[Any]) -> list[torch.Tensor]:
        """Aliased outputs, scratch buffers and the dump knobs."""
        spec = plan.spec
        device = plan.device
        outs = [_allocate(o, device) if o.alias_input is None else values[o.alias_input]
                for o in spec.outputs]  # fmt: skip
        # scratch is written in full before it is read: the plan's own (Note [Scratch per stream])
        work = list(plan.scratch())
        if any(launch.cooperative for launch in spec.kernels):
            work.append(plan.barrier())
        if "print_args" in self.dumps:
            print(f"fusion {self.fid} inputs:", [(tuple(v.shape), v.stride(), v.dtype)
                  if isinstance(v, torch.Tensor) else v for v in values])  # fmt: skip
        timing = "eff_bandwidth" in self.dumps
        if timing:
            torch.cuda.synchronize()
            start = time.perf_counter()
        ctx = run_context.current() if run_context.ACTIVE else None
        profiling = ctx is not None and ctx.options.profile
        for kernel, launch, slots in zip(plan.kernels, spec.kernels, plan.slots):
            args = fill_args(launch.args, slots, values, outs, work)
            if profiling:
                read, written = _bytes_of(slots, values, outs, work)
                start, end = ctx.record_launch(launch, spec.scheduler, device.index, read, written)
                start.record()
            kernel.launch(launch.grid, launch.block, launch.arg_types, args, launch.shared_mem,
                          cooperative=launch.cooperative, dependent=launch.dependent)  # fmt: skip
            if profiling:
                end.record()
        self.fd._cache.counters["kernel_launches"] += len(spec.kernels)
        if timing:
            torch.cuda.synchronize()
            secs = time.perf_counter() - start
            moved = sum(v.numel() * v.element_size() for v in values if isinstance(v, torch.Tensor))
            moved += sum(o.numel() * o.element_size() for o in outs)
            print(f"fusion {self.fid}: {moved / secs / 1e9:.1f} GB/s ({secs * 1e6:.1f} us)")
        return [o for o, s in zip(outs, spec.outputs) if s.alias_input is None]


def _allocate(o: Any, device: Any) -> torch.Tensor:
    """A fresh output, in its stride order where it has one (Note [Output layouts])."""
    if o.strides is None:
        return torch.empty(o.shape, dtype=to_torch(o.dtype), device=device)
    return torch.empty_strided(o.shape, o.strides, dtype=to_torch(o.dtype), device=device)


def executor_for(fd: FusionDefinition) -> FusionExecutor:
    executors = fd._cache.executors
    ex = executors.get(fd._fid)
    if ex is None:
        with fd._cache._lock:
            ex = executors.get(fd._fid)
            if ex is None:
                ex = FusionExecutor(fd)
                executors[fd._fid] = ex
    return ex


def try_cached_launch(fd: FusionDefinition, inputs: Sequence[Any]) -> list | None:
    """The hot path: a plan for exactly these dtypes/sizes/strides exists, so the inputs were
    validated before; launch at once. None when there is no such plan."""
    ex = fd._cache.executors.get(fd._fid)
    if ex is None or not ex.plans:
        return None
    plan = ex.plans.get(ex.key(inputs))
    if plan is None:
        return None
    fd._cache.counters["plan_cache_hits"] += 1
    return ex.launch(plan, inputs)


def _plan_single(fd: Any, values: Sequence[Any], env: dict, profile: Any) -> Any:
    """The spec of one scheduler for `fd` (a rewrite made for these sizes), or None."""
    name, program, _ = schedule(fd)
    if program is None:
        return None
    try:
        return plan_for(name, program, values, env, profile)
    except SchedulerRefused:
        return None


def _bytes_of(slots: list, values: Sequence[Any], outs: list, work: list) -> tuple[int, int]:
    """Bytes a launch's tensor arguments span: (inputs and scratch read, outputs written)."""
    read = written = 0
    for _, ref in slots:
        if ref.kind == "input":
            v = values[ref.index]
            read += v.numel() * v.element_size() if isinstance(v, torch.Tensor) else 0
        elif ref.kind == "output":
            written += outs[ref.index].numel() * outs[ref.index].element_size()
        elif ref.kind == "workspace":
            read += work[ref.index].numel() * work[ref.index].element_size()
    return read, written


def _fallback(fd: FusionDefinition, ex: FusionExecutor, values: Sequence[Any], why: str) -> list:
    if run_context.no_fallback():
        raise FallbackDisabledError(f"fusion {fd._fid}: {why} (fallback is disabled)")
    if not ex.warned:
        ex.warned = True
        warnings.warn(f"fusion_cache: fusion {fd._fid} runs on the reference evaluator: {why}",
                      stacklevel=4)  # fmt: skip
    FusionCache.get()._count("reference_runs")
    if run_context.ACTIVE and (ctx := run_context.current()) is not None:
        ctx.reference_runs += 1
    reads_tensors = any(isinstance(v, torch.Tensor) for v in values)
    device = None if reads_tensors or not torch.cuda.is_available() else torch.device(
        "cuda", torch.cuda.current_device())  # no tensor input: the current device
    return run_reference(fd, values, device)


def plan_signature(values: Sequence[Any]) -> str:
    """The stored plans' key of these inputs: the plan key less the tensors' device index. A
    plan is the same on every GPU of one arch (the arch is keyed beside it), and a region
    planned ahead on meta stand-ins (Note [Compiles ahead]) stores the segmentation its
    first call on the GPU then finds."""
    return json.dumps([repr(k[:-1] if isinstance(v, torch.Tensor) else k)
                       for v, k in zip(values, input_key(values))])  # fmt: skip


def _ahead_key(values: Sequence[Any], profile: Any) -> tuple | None:
    """Note [Plans kept from ahead]: the plan key of these inputs with the device index read
    as whether the tensor is a CPU scalar (Note [CPU scalar tensors]), so that a region's meta
    stand-ins and its first call's CUDA tensors agree; None where the profile has no hash."""
    key = input_key(values)
    devices = tuple(isinstance(v, torch.Tensor) and v.device.type == "cpu" and v.dim() == 0
                    for v in values)  # fmt: skip
    out = (tuple(k[:-1] if isinstance(v, torch.Tensor) else k for v, k in zip(values, key)),
           devices, profile)  # fmt: skip
    try:
        hash(out)
    except TypeError:
        return None
    return out


def _stored_kinds(kinds: Any, n_groups: int) -> list | None:
    """Note [Stored kinds]: a stored segmentation's schedulers, one a group, each a
    registered scheduler's name; anything else is searched again (None)."""
    from schedulers.registry import SCHEDULERS

    names = {name for name, *_ in SCHEDULERS}
    if not isinstance(kinds, list) or len(kinds) != n_groups:
        return None
    if not all(isinstance(kind, str) and kind in names for kind in kinds):
        return None
    return kinds


def segmenter_version() -> str:
    """What a stored segmentation was found with: the format and the schedulers a group
    could be given to (a build with another scheduler list searches again), a hash of the
    schedulers' sources (a build whose schedulers take other groups searches again: the
    stored groups still plan, but a segmentation the new ones improve on would be kept for
    ever), and the switches on (Note [Unmeasured switches] in schedulers/tuning.py)."""
    from schedulers.registry import SCHEDULERS
    from schedulers.tuning import switches_on

    on = switches_on()  # Note [Unmeasured switches]
    return (f"fc-segments-1:{_schedulers_hash()}:" + ",".join(name for name, *_ in SCHEDULERS)
            + (f"+{','.join(on)}" if on else ""))  # fmt: skip


@functools.cache
def _schedulers_hash() -> str:
    import schedulers

    return sources_digest(Path(schedulers.__file__).resolve().parent, ("**/*.py",))[:12]


def home_device(values: Sequence[Any]) -> int:
    """The CUDA device a run goes to: its first CUDA input's, else (no tensor input, as for
    iota or full alone) the current device, as nvFuser does."""
    for v in values:
        if isinstance(v, torch.Tensor) and v.is_cuda:
            return v.device.index
    return torch.cuda.current_device()


def run_on_gpu(fd: FusionDefinition, values: Sequence[Any]) -> list[Any]:
    ex = executor_for(fd)
    if ex.aliases.all_views:  # nothing to compute: views of the inputs
        outs = view_outputs(fd, values, None)
        if all(o is not None for o in outs):
            return outs
    try:
        key = ex.key(values)
        if not any(isinstance(v, torch.Tensor) for v in values):
            key += (("device", home_device(values)),)  # nothing else says where
        plan = ex.plan(values, key)
        return ex.launch(plan, values)
    except FallbackDisabledError:
        raise  # named where it happened, perhaps in a segment
    except FusionUnsupportedError as err:
        return _fallback(fd, ex, values, str(err))
    except (ValueError, TypeError):
        raise
    except Exception as err:  # codegen, NVRTC or driver failures degrade to the reference
        if run_context.no_fallback():
            raise
        return _fallback(fd, ex, values, f"kernel failed: {type(err).__name__}: {err}")


def _all_resident(kernel: Any, launch: Any) -> bool:
    """Whether the GPU holds every block (cluster) of `launch` at once."""
    width, height = kernel.cluster_dims
    groups = launch.grid[0] * launch.grid[1] * launch.grid[2] // (width * height)
    return kernel.max_resident(launch.block, launch.shared_mem) >= groups


def _cluster_does_not_fit(kernel: Any, launch: Any, profile: Any) -> bool:
    """A kernel with clusters wider than the portable 8 blocks that the driver cannot place
    even once on this GPU (Note [Cluster fallback])."""
    width, height = kernel.cluster_dims
    if profile.max_cluster <= 8 or width * height <= 8:
        return False
    return kernel.max_resident(launch.block, launch.shared_mem) == 0


