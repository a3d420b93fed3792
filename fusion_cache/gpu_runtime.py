"""The GPU path of execute(): per fusion an executor holds the scheduled program and a
cache of launch plans keyed by the inputs' sizes, strides and alignment.

Note [Plan cache]: a plan is everything a launch needs that depends on the inputs but not
on their data: output shapes, the collapsed loop sizes and strides, the kernel variant and
the loaded function. A hit costs a dict lookup, output allocation and the launch.
"""
from __future__ import annotations

import json
import math
import threading
import time
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from codegen.cuda_ops import ELEMENT_BYTES
from codegen.pointwise_cuda import (
    BLOCK,
    KERNEL_NAME,
    PointwiseVariant,
    arg_types,
    render_pointwise,
    vector_width,
)
from schedulers.registry import schedule

from .debug import dump_options, fallback_disabled
from .dtypes import to_torch
from .kernel_cache import KernelRef, cubin_for, load_function
from .reference import evaluate, run_reference
from .shape_eval import ShapeUnknown, evaluate_shapes
from .trie import FusionCache

if TYPE_CHECKING:
    from .definition import FusionDefinition


class FusionUnsupportedError(RuntimeError):
    """No scheduler took the fusion (or its kernel failed) and fallback is disabled."""


@dataclass
class LaunchPlan:
    variant: PointwiseVariant | None
    kernel: Any  # a LoadedKernel, or None when the launch is empty
    ref: KernelRef | None
    out_shape: tuple[int, ...]
    arg_template: list
    ptr_slots: list[tuple[int, int]]  # (arg slot, input position) for input pointers
    out_slots: list[int]  # arg slot per allocated output
    scalar_slots: list[tuple[int, int]]  # (arg slot, input position)
    alias_slots: list[tuple[int, int]]
    grid: tuple[int, int, int]
    arg_types: tuple[str, ...]
    numel: int


def _alignment(ptr: int) -> int:
    return 16 if ptr % 16 == 0 else (ptr & -ptr if ptr else 16)


def _shape_key(values: Sequence[Any]) -> tuple:
    key = []
    for v in values:
        if isinstance(v, torch.Tensor):
            key.append((v.shape, v.stride(), _alignment(v.data_ptr()), v.device.index))
        elif isinstance(v, (int, tuple)) and not isinstance(v, bool):
            key.append(v)  # ints may size tensors
        else:
            key.append(None)
    return tuple(key)


def _meta(v: Any) -> Any:
    if isinstance(v, torch.Tensor):
        return torch.empty_strided(v.shape, v.stride(), dtype=v.dtype, device="meta")
    return v


def _collapse(sizes: list[int], strides: list[list[int]]) -> tuple[list[int], list[list[int]]]:
    """Drop size-1 dims and merge neighbours that are contiguous for every tensor."""
    dims = [d for d in range(len(sizes)) if sizes[d] != 1]
    out_sizes: list[int] = []
    out_strides: list[list[int]] = [[] for _ in strides]
    for d in dims:
        if out_sizes and all(s[-1] == t[d] * sizes[d] for s, t in zip(out_strides, strides)):
            out_sizes[-1] *= sizes[d]
            for s, t in zip(out_strides, strides):
                s[-1] = t[d]
        else:
            out_sizes.append(sizes[d])
            for s, t in zip(out_strides, strides):
                s.append(t[d])
    if not out_sizes:
        return [1], [[0] for _ in strides]
    return out_sizes, out_strides


class FusionExecutor:
    def __init__(self, fd: FusionDefinition) -> None:
        self.fd = fd
        self.fid = fd._fid
        self.dumps = dump_options()
        self.scheduler, self.program, self.refusals = schedule(fd)
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

    # ---- planning ------------------------------------------------------------------------

    def make_plan(self, values: Sequence[Any], arch: int | None, load: bool) -> LaunchPlan:
        program = self.program
        fd = self.fd
        try:
            env = evaluate_shapes(fd._records, fd._infos, fd.input_refs(), values)
        except ShapeUnknown:  # an op the shape evaluator lacks: let torch's meta kernels shape it
            env = evaluate(fd._records, fd._infos, fd.input_refs(), [_meta(v) for v in values])
            env = {k: tuple(v.shape) if isinstance(v, torch.Tensor) else v for k, v in env.items()}
        out_shapes = {tuple(env[s]) for s in program.output_states}
        if len(out_shapes) != 1:
            raise FusionUnsupportedError(f"pointwise outputs have different shapes {sorted(out_shapes)}")
        out_shape = out_shapes.pop()
        rank = len(out_shape)
        tensors_strides: list[list[int]] = []
        for acc in program.accesses:
            t = values[acc.input_pos]
            eff = [0] * rank
            for i, m in enumerate(acc.dim_map):
                if m is not None and t.shape[i] != 1:
                    eff[m] += t.stride(i)
            tensors_strides.append(eff)
        row_major = [0] * rank
        acc_ = 1
        for d in range(rank - 1, -1, -1):
            row_major[d] = acc_
            acc_ *= max(out_shape[d], 1)
        for st in program.stores:
            if st.alias_input is not None:
                t = values[st.alias_input]
                if tuple(t.shape) != out_shape:
                    raise FusionUnsupportedError(
                        f"aliased output {st.state} has shape {out_shape}, its input {list(t.shape)}"
                    )
                tensors_strides.append([t.stride(d) if t.shape[d] != 1 else 0 for d in range(rank)])
            else:
                tensors_strides.append([row_major[d] if out_shape[d] != 1 else 0 for d in range(rank)])
        numel = math.prod(out_shape)
        sizes, strides = _collapse(list(out_shape), tensors_strides)
        variant = self._variant(values, sizes, strides, numel)
        types = arg_types(program, variant)
        n_acc = len(program.accesses)
        template: list = []
        ptr_slots, out_slots, alias_slots = [], [], []
        for k, s in enumerate(strides):
            if k < n_acc:
                ptr_slots.append((len(template), program.accesses[k].input_pos))
            else:
                st = program.stores[k - n_acc]
                if st.alias_input is not None:
                    alias_slots.append((len(template), st.alias_input))
                else:
                    out_slots.append(len(template))
            template.append(0)
            template.extend(s)
        template.extend(sizes)
        template.append(numel)
        scalar_slots = []
        for pos, _ in program.scalar_inputs:
            scalar_slots.append((len(template), pos))
            template.append(0)
        blocks = max(1, min(-(-numel // (BLOCK * variant.vec)), 2**31 - 1))
        kernel = ref = None
        if numel:
            source = render_pointwise(program, variant)
            if "cuda_kernel" in self.dumps:
                print(source)
            params = json.dumps({"variant": variant.describe(), "block": BLOCK})
            cubin, ref = cubin_for(source, KERNEL_NAME, arch, fusion_id=self.fid,
                                   scheduler=self.scheduler, params_json=params)  # fmt: skip
            if load:
                device = next(v.device.index for v in values if isinstance(v, torch.Tensor) and v.is_cuda)
                kernel = load_function(cubin, ref, device)
            sig = json.dumps([repr(k) for k in _shape_key(values)])
            plan_json = json.dumps({"scheduler": self.scheduler, "variant": variant.describe(),
                                    "kernel": ref.to_json(), "out_shape": list(out_shape)})  # fmt: skip
            FusionCache.get().store.put_plan(self.fid, sig, f"sm_{arch}", plan_json)
        plan = LaunchPlan(variant, kernel, ref, out_shape, template, ptr_slots, out_slots,
                          scalar_slots, alias_slots, (blocks, 1, 1), types, numel)  # fmt: skip
        if "launch_param" in self.dumps:
            print(f"fusion {self.fid}: grid {plan.grid} block ({BLOCK}, 1, 1) {variant.describe()} "
                  f"sizes {sizes}")  # fmt: skip
        return plan

    def _variant(self, values, sizes, strides, numel) -> PointwiseVariant:
        program = self.program
        dtypes = [a.dtype for a in program.accesses] + [s.dtype for s in program.stores]
        ptrs = [values[a.input_pos].data_ptr() for a in program.accesses]
        for st in program.stores:
            ptrs.append(values[st.alias_input].data_ptr() if st.alias_input is not None else 0)
        inner = sizes[-1]
        moving = [dt for dt, s in zip(dtypes, strides) if s[-1] != 0]
        vec = vector_width(moving)
        while vec > 1 and inner % vec:
            vec //= 2
        modes = []
        for dt, s, ptr in zip(dtypes, strides, ptrs):
            if s[-1] == 0:
                modes.append("bcast")
            elif (s[-1] == 1 and vec > 1 and ptr % (vec * ELEMENT_BYTES[dt]) == 0
                  and all(x % vec == 0 for x in s[:-1])):  # fmt: skip
                modes.append("vec")
            else:
                modes.append("strided")
        if vec > 1 and "vec" not in modes:
            vec = 1
        if vec == 1:
            modes = ["bcast" if m == "bcast" else "strided" for m in modes]
        n_acc = len(program.accesses)
        store_modes = tuple("vec" if m == "vec" else "strided" for m in modes[n_acc:])
        biggest = max([numel] + [sum((n - 1) * abs(x) for n, x in zip(sizes, s)) for s in strides])
        index_type = "int" if biggest < 2**30 else "long long"
        live = tuple(tuple(x != 0 for x in s) for s in strides)
        return PointwiseVariant(len(sizes), vec, index_type, tuple(modes[:n_acc]), store_modes, live)

    # ---- running -----------------------------------------------------------------------------

    def run(self, values: Sequence[Any]) -> list[torch.Tensor]:
        key = _shape_key(values)
        plan = self.plans.get(key)
        cache = FusionCache.get()
        if plan is None:
            with self.lock:
                plan = self.plans.get(key)
                if plan is None:
                    cache._count("plan_cache_misses")
                    from schedulers.device import current_profile

                    device = next(v.device.index for v in values if isinstance(v, torch.Tensor) and v.is_cuda)
                    plan = self.make_plan(values, current_profile(device).arch, load=True)
                    self.plans[key] = plan
        else:
            cache._count("plan_cache_hits")
        self.last_plan = plan
        device = next(v.device for v in values if isinstance(v, torch.Tensor) and v.is_cuda)
        outs = []
        for st in self.program.stores:
            if st.alias_input is None:
                outs.append(torch.empty(plan.out_shape, dtype=to_torch(st.dtype), device=device))
        if not plan.numel:
            return outs
        args = list(plan.arg_template)
        for slot, pos in plan.ptr_slots:
            args[slot] = values[pos].data_ptr()
        for slot, out in zip(plan.out_slots, outs):
            args[slot] = out.data_ptr()
        for slot, pos in plan.alias_slots:
            args[slot] = values[pos].data_ptr()
        for slot, pos in plan.scalar_slots:
            args[slot] = values[pos]
        if "print_args" in self.dumps:
            print(f"fusion {self.fid} inputs:", [(tuple(v.shape), v.stride(), v.dtype)
                  if isinstance(v, torch.Tensor) else v for v in values])  # fmt: skip
        if "eff_bandwidth" in self.dumps:
            torch.cuda.synchronize()
            start = time.perf_counter()
        plan.kernel.launch(plan.grid, (BLOCK, 1, 1), plan.arg_types, args)
        cache._count("kernel_launches")
        if "eff_bandwidth" in self.dumps:
            torch.cuda.synchronize()
            secs = time.perf_counter() - start
            moved = sum(v.numel() * v.element_size() for v in values if isinstance(v, torch.Tensor))
            moved += sum(o.numel() * o.element_size() for o in outs)
            print(f"fusion {self.fid}: {moved / secs / 1e9:.1f} GB/s ({secs * 1e6:.1f} us)")
        return outs


_executors: dict[int, FusionExecutor] = {}
_executors_lock = threading.Lock()


def executor_for(fd: FusionDefinition) -> FusionExecutor:
    cache = FusionCache.get()
    key = (id(cache), fd._fid)
    ex = _executors.get(key)
    if ex is None:
        with _executors_lock:
            ex = _executors.get(key)
            if ex is None:
                ex = FusionExecutor(fd)
                _executors[key] = ex
    return ex


def _fallback(fd: FusionDefinition, ex: FusionExecutor, values: Sequence[Any], why: str) -> list:
    if fallback_disabled():
        raise FusionUnsupportedError(f"fusion {fd._fid}: {why} (fallback is disabled)")
    if not ex.warned:
        ex.warned = True
        warnings.warn(f"fusion_cache: fusion {fd._fid} runs on the reference evaluator: {why}",
                      stacklevel=4)  # fmt: skip
    FusionCache.get()._count("reference_runs")
    return run_reference(fd, values)


def run_on_gpu(fd: FusionDefinition, values: Sequence[Any]) -> list[Any]:
    ex = executor_for(fd)
    if ex.program is None:
        reasons = "; ".join(str(r) for r in ex.refusals)
        return _fallback(fd, ex, values, f"no scheduler takes it ({reasons})")
    try:
        outs = ex.run(values)
    except FusionUnsupportedError as err:
        return _fallback(fd, ex, values, str(err))
    except (ValueError, TypeError):
        raise
    except Exception as err:  # codegen, NVRTC or driver failures degrade to the reference
        if fallback_disabled():
            raise
        return _fallback(fd, ex, values, f"kernel failed: {type(err).__name__}: {err}")
    return _with_outputs(fd, ex, outs)


def _with_outputs(fd: FusionDefinition, ex: FusionExecutor, outs: list) -> list:
    return outs


def precompile(fd: FusionDefinition, inputs: Sequence[Any], target: Any = None) -> list[KernelRef]:
    """Schedule and compile for `inputs` (meta, CPU or CUDA tensors standing for the real
    ones) for a named target profile or the current GPU, without running anything."""
    from schedulers.device import resolve_target

    from .validate import validate_inputs

    if target is None:
        from .warmup import default_target

        target = default_target()
    profile = resolve_target(target)
    values = validate_inputs(fd, inputs)
    ex = executor_for(fd)
    if ex.program is None:
        reasons = "; ".join(str(r) for r in ex.refusals)
        raise FusionUnsupportedError(f"fusion {fd._fid}: no scheduler takes it ({reasons})")
    plan = ex.make_plan(values, profile.arch, load=False)
    ex.last_plan = plan
    return [plan.ref] if plan.ref is not None else []
