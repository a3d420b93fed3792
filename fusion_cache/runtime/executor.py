"""The GPU path of execute(): per fusion an executor holds the scheduled program and a
cache of launch plans keyed by the inputs' dtypes, sizes, strides and alignment.

Note [Plan cache]: a plan is everything a run needs that depends on the inputs but not on
their data: output shapes, scratch buffers, and the kernels with their argument templates.
Validation depends only on the same key, so a hit skips it: it costs a key, a dict lookup,
output allocation and the launches.
"""
from __future__ import annotations

import json
import threading
import time
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

import torch

from fusion_cache.frontend.dtypes import to_torch
from fusion_cache.frontend.options import dump_options, fallback_disabled
from fusion_cache.frontend.trie import FusionCache
from fusion_cache.ir.shape_eval import ShapeUnknown, evaluate_shapes
from schedulers.base import ArgRef, LaunchSpec, SchedulerRefused
from schedulers.registry import plan_for, schedule

from .kernel_cache import KernelRef, cubin_for, load_function
from .reference import evaluate, run_reference

if TYPE_CHECKING:
    from fusion_cache.frontend.definition import FusionDefinition


class FusionUnsupportedError(RuntimeError):
    """No scheduler took the fusion (or its kernel failed) and fallback is disabled."""


class FallbackDisabledError(FusionUnsupportedError):
    """Raised where a fusion would have fallen back, naming it; the runs around it (its own
    first run, a segmented fusion holding it) pass it on unchanged."""


@dataclass(frozen=True)
class ReferencePlan:
    """Inputs of this signature run on the reference evaluator, for `reason`."""

    reason: str


@dataclass
class LaunchPlan:
    spec: LaunchSpec
    kernels: list  # LoadedKernel per launch (None when planned ahead without a GPU)
    refs: list[KernelRef]
    slots: list[list[tuple[int, ArgRef]]]  # per launch: (arg slot, what fills it)
    device: Any = None  # the torch.device outputs go to
    fresh: tuple = ()  # (shape, torch dtype) of each output to allocate, in order
    host_inputs: tuple = ()  # Note [CPU scalar tensors]: inputs copied to `device` per call
    # Note [Finish in the row kernel]: a cooperative kernel's barrier counters, per stream
    barriers: dict = field(default_factory=dict)
    captured: list = field(default_factory=list)  # those of CUDA graphs, kept for replays
    # fresh outputs and plain launches only: the cache hit's lean path runs it (launch)
    lean: bool = field(init=False)

    def __post_init__(self) -> None:
        spec = self.spec
        self.lean = not spec.workspaces and all(o.alias_input is None for o in spec.outputs) and not any(
            k.cooperative or k.dependent for k in spec.kernels)  # fmt: skip

    def barrier(self) -> torch.Tensor:
        """The zeroed counters of a grid barrier for the current stream: launches on one
        stream run one after another and each leaves them zeroed; streams get their own.
        A launch captured into a CUDA graph gets counters of its own, which live as long
        as the plan: its replays may run beside launches on any stream."""
        if torch.cuda.is_current_stream_capturing():
            self.captured.append(torch.zeros(2, dtype=torch.int32, device=self.device))
            return self.captured[-1]
        from codegen.launch import current_raw_stream

        stream = current_raw_stream(self.device.index)
        counters = self.barriers.get(stream)
        if counters is None:
            counters = self.barriers[stream] = torch.zeros(2, dtype=torch.int32, device=self.device)
        return counters


def _alignment(ptr: int) -> int:
    return 16 if ptr % 16 == 0 else (ptr & -ptr if ptr else 16)


def input_key(values: Sequence[Any]) -> tuple:
    key = []
    for v in values:
        if isinstance(v, torch.Tensor):
            ptr = v.data_ptr()
            align = 16 if ptr & 15 == 0 else _alignment(ptr)
            key.append((v.dtype, v.shape, v.stride(), align, v.get_device()))
        elif type(v) is int:
            key.append(v)  # ints may size tensors
        elif isinstance(v, (list, tuple)):
            key.append(tuple(v))  # a vector input: its values may size tensors too
        else:
            key.append(type(v))
    return tuple(key)


def _meta(v: Any) -> Any:
    if isinstance(v, torch.Tensor):
        return torch.empty_strided(v.shape, v.stride(), dtype=v.dtype, device="meta")
    return v


def runtime_shapes(fd: FusionDefinition, values: Sequence[Any]) -> dict:
    try:
        return evaluate_shapes(fd._records, fd._infos, fd.input_refs(), values)
    except ShapeUnknown:  # an op the shape evaluator lacks: torch's meta kernels shape it
        env = evaluate(fd._records, fd._infos, fd.input_refs(), [_meta(v) for v in values])
        return {k: tuple(v.shape) if isinstance(v, torch.Tensor) else v for k, v in env.items()}


class FusionExecutor:
    def __init__(self, fd: FusionDefinition) -> None:
        from fusion_cache.ir.decompose import expand_composites

        self.fd = expand_composites(fd)  # what the schedulers see: primitives only
        self.fid = fd._fid
        self.dumps = dump_options()
        self.scheduler, self.program, self.refusals = schedule(self.fd)
        self.plans: dict[tuple, LaunchPlan] = {}
        self.lock = threading.Lock()
        self.last_plan: LaunchPlan | None = None
        self.warned = False
        if "fusion_ir" in self.dumps:
            print(fd.fusion_ir())
        if "scheduler" in self.dumps:
            taken = self.scheduler or "none (reference evaluator)"
            print(f"fusion {self.fid}: scheduler {taken}; refusals: "
                  f"{[str(r) for r in self.refusals] or 'none'}")  # fmt: skip

    def make_plan(self, values: Sequence[Any], profile: Any, load: bool) -> Any:
        """A LaunchPlan when one scheduler takes the fusion for these inputs, else a
        SegmentedPlan (Note [Greedy segmentation])."""
        host = _host_inputs(values) if load else ()
        env = runtime_shapes(self.fd, values)
        if self.program is None:
            return self.segmented(values, env, profile, "; ".join(str(r) for r in self.refusals))
        try:
            spec = plan_for(self.scheduler, self.program, values, env, profile)
        except SchedulerRefused as why:
            return self.segmented(values, env, profile, f"{self.scheduler}: {why}")
        kernels, refs, slots = [], [], []
        device = next((v.device.index for v in values if isinstance(v, torch.Tensor) and v.is_cuda), 0)
        for launch in spec.kernels:
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
                return self.make_plan(values, replace(profile, max_cluster=8), load)
            if kernel is not None and not kernels and spec.wave:
                # Note [One wave of partials]: the planner estimated the resident clusters;
                # the driver knows them for this kernel on this GPU. Before the other kernels
                # load: the same kernels, another grid
                resident = kernel.max_resident(launch.block, launch.shared_mem)
                if resident and resident != spec.wave:
                    return self.make_plan(values, replace(profile, measured_wave=resident), load)
            if kernel is not None and launch.cooperative and not _all_resident(kernel, launch):
                # Note [Finish in the row kernel]: a cooperative launch needs every block
                # resident at once; where the driver says they are not, a second kernel
                return self.make_plan(values, replace(profile, fused_finish=False), load)
            refs.append(ref)
            kernels.append(kernel)
            slots.append([(i, a) for i, a in enumerate(launch.args) if isinstance(a, ArgRef)])
            if "launch_param" in self.dumps:
                print(f"fusion {self.fid}: {launch.name} grid {launch.grid} block {launch.block} "
                      f"smem {launch.shared_mem} ({spec.description})")  # fmt: skip
        if spec.kernels:
            self.record(values, profile, {"scheduler": spec.scheduler, "plan": spec.description,
                                          "kernels": [r.to_json() for r in refs]})  # fmt: skip
        fresh = tuple((o.shape, to_torch(o.dtype)) for o in spec.outputs if o.alias_input is None)
        return LaunchPlan(spec, kernels, refs, slots, torch.device("cuda", device), fresh, host)

    def segmented(self, values: Sequence[Any], env: dict, profile: Any, why: str) -> Any:
        from schedulers.segmenter import segment

        from .segmented import build_plan, describe_plan

        try:
            drafts = segment(self.fd, values, env, profile)
        except SchedulerRefused as err:
            raise FusionUnsupportedError(f"no scheduler takes it ({why}) and it cannot be "
                                         f"segmented: {err}") from None  # fmt: skip
        if len(drafts) < 2:
            raise FusionUnsupportedError(f"no scheduler takes it ({why})")
        plan = build_plan(self.fd, drafts)
        if "segments" in self.dumps:
            print(describe_plan(self.fd, plan))
        # recorded like a kernel plan, so `fusion-cache show` tells which fusions run it
        self.record(values, profile, {"scheduler": "segmented", "plan": plan.description,
                                      "segments": [s.definition.id() for s in plan.segments],
                                      "refused": why})  # fmt: skip
        return plan

    def record(self, values: Sequence[Any], profile: Any, plan: dict) -> None:
        """Keep a plan's summary in the store under these inputs' signature and target."""
        sig = json.dumps([repr(k) for k in input_key(values)])
        FusionCache.get().store.put_plan(self.fid, sig, f"sm_{profile.arch}", json.dumps(plan))

    def plan(self, values: Sequence[Any], key: tuple) -> Any:
        with self.lock:
            plan = self.plans.get(key)
            if plan is None:
                from schedulers.device import current_profile

                FusionCache.get()._count("plan_cache_misses")
                device = next(v.device.index for v in values if isinstance(v, torch.Tensor) and v.is_cuda)
                try:
                    plan = self.make_plan(values, current_profile(device), load=True)
                except FusionUnsupportedError as why:
                    plan = ReferencePlan(str(why))  # remembered: no re-analysis per call
                self.plans[key] = plan
            return plan

    def launch(self, plan: Any, values: Sequence[Any]) -> list[torch.Tensor]:
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
        if self.dumps or not plan.lean:
            return self._launch_general(plan, values)
        # the plain case, kept lean: it is the whole host cost of a cache hit
        device = plan.device
        outs = [torch.empty(shape, dtype=dtype, device=device) for shape, dtype in plan.fresh]
        for kernel, launch, slots in zip(plan.kernels, spec.kernels, plan.slots):
            args = _fill_args(launch.args, slots, values, outs, ())
            kernel.launch(launch.grid, launch.block, launch.arg_types, args, launch.shared_mem)
        self.fd._cache.counters["kernel_launches"] += len(spec.kernels)
        return outs

    def _launch_other(self, plan: Any, values: Sequence[Any]) -> list[Any]:
        if isinstance(plan, ReferencePlan):
            return _fallback(self.fd, self, values, plan.reason)
        from .segmented import run_segments

        self.last_plan = plan
        self.fd._cache.counters["segmented_runs"] += 1
        return run_segments(self.fd, plan, values, dump="segments" in self.dumps)

    def _launch_general(self, plan: LaunchPlan, values: Sequence[Any]) -> list[torch.Tensor]:
        """Aliased outputs, scratch buffers and the dump knobs."""
        spec = plan.spec
        device = plan.device
        outs = [torch.empty(o.shape, dtype=to_torch(o.dtype), device=device)
                if o.alias_input is None else values[o.alias_input] for o in spec.outputs]  # fmt: skip
        # scratch is written in full before it is read: no need to clear it
        work = [torch.empty(n, dtype=to_torch(dt), device=device) for n, dt in spec.workspaces]
        if any(launch.cooperative for launch in spec.kernels):
            work.append(plan.barrier())
        if "print_args" in self.dumps:
            print(f"fusion {self.fid} inputs:", [(tuple(v.shape), v.stride(), v.dtype)
                  if isinstance(v, torch.Tensor) else v for v in values])  # fmt: skip
        timing = "eff_bandwidth" in self.dumps
        if timing:
            torch.cuda.synchronize()
            start = time.perf_counter()
        for kernel, launch, slots in zip(plan.kernels, spec.kernels, plan.slots):
            args = _fill_args(launch.args, slots, values, outs, work)
            kernel.launch(launch.grid, launch.block, launch.arg_types, args, launch.shared_mem,
                          cooperative=launch.cooperative, dependent=launch.dependent)  # fmt: skip
        self.fd._cache.counters["kernel_launches"] += len(spec.kernels)
        if timing:
            torch.cuda.synchronize()
            secs = time.perf_counter() - start
            moved = sum(v.numel() * v.element_size() for v in values if isinstance(v, torch.Tensor))
            moved += sum(o.numel() * o.element_size() for o in outs)
            print(f"fusion {self.fid}: {moved / secs / 1e9:.1f} GB/s ({secs * 1e6:.1f} us)")
        return [o for o, s in zip(outs, spec.outputs) if s.alias_input is None]


def _fill_args(template: tuple, slots: list, values: Sequence[Any], outs: list,
               work: Sequence[torch.Tensor]) -> list:  # fmt: skip
    """A launch's arguments: the plan's template with this run's pointers and scalars."""
    args = list(template)
    for slot, ref in slots:
        kind = ref.kind
        if kind == "input":
            args[slot] = values[ref.index].data_ptr()
        elif kind == "output":
            args[slot] = outs[ref.index].data_ptr()
        elif kind == "workspace":
            args[slot] = work[ref.index].data_ptr()
        else:
            args[slot] = values[ref.index]
    return args


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
    plan = ex.plans.get(input_key(inputs))
    if plan is None:
        return None
    fd._cache.counters["plan_cache_hits"] += 1
    return ex.launch(plan, inputs)


def _fallback(fd: FusionDefinition, ex: FusionExecutor, values: Sequence[Any], why: str) -> list:
    if fallback_disabled():
        raise FallbackDisabledError(f"fusion {fd._fid}: {why} (fallback is disabled)")
    if not ex.warned:
        ex.warned = True
        warnings.warn(f"fusion_cache: fusion {fd._fid} runs on the reference evaluator: {why}",
                      stacklevel=4)  # fmt: skip
    FusionCache.get()._count("reference_runs")
    return run_reference(fd, values)


def run_on_gpu(fd: FusionDefinition, values: Sequence[Any]) -> list[Any]:
    ex = executor_for(fd)
    try:
        plan = ex.plan(values, input_key(values))
        return ex.launch(plan, values)
    except FallbackDisabledError:
        raise  # named where it happened, perhaps in a segment
    except FusionUnsupportedError as err:
        return _fallback(fd, ex, values, str(err))
    except (ValueError, TypeError):
        raise
    except Exception as err:  # codegen, NVRTC or driver failures degrade to the reference
        if fallback_disabled():
            raise
        return _fallback(fd, ex, values, f"kernel failed: {type(err).__name__}: {err}")


def _host_inputs(values: Sequence[Any]) -> tuple[int, ...]:
    """Note [CPU scalar tensors]: a 0-dim CPU tensor (define_tensor(is_cpu=True)) may come with
    CUDA inputs, as in nvFuser; a kernel cannot read host memory, so each call copies it to
    the GPU first (a few bytes, stream-ordered). Any other CPU tensor beside CUDA ones is an
    error that names it."""
    host = []
    for i, v in enumerate(values):
        if isinstance(v, torch.Tensor) and not v.is_cuda:
            if v.dim() != 0:
                raise ValueError(f"input {i} is a {v.dim()}-dim tensor on {v.device} while other inputs "
                                 "are on the GPU; only 0-dim CPU tensors (scalars) may stay on the CPU")  # fmt: skip
            host.append(i)
    return tuple(host)


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


def precompile(fd: FusionDefinition, inputs: Sequence[Any], target: Any = None) -> list[KernelRef]:
    """Schedule and compile for `inputs` (meta, CPU or CUDA tensors standing for the real
    ones) for a named target profile or the current GPU, without running anything."""
    from fusion_cache.frontend.validate import validate_inputs
    from schedulers.device import resolve_target

    if target is None:
        from schedulers.device import default_target

        target = default_target()
    profile = resolve_target(target)
    values = validate_inputs(fd, inputs, "precompile")
    ex = executor_for(fd)
    try:
        plan = ex.make_plan(values, profile, load=False)
    except FusionUnsupportedError as err:
        raise FusionUnsupportedError(f"fusion {fd._fid}: {err}") from None
    ex.last_plan = plan
    if isinstance(plan, LaunchPlan):
        return plan.refs
    from .segmented import precompile_segments

    return precompile_segments(ex.fd, plan, values, target)
