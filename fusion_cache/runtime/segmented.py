"""Running a segmented fusion: the original definition as the argument manager.

Each segment is a definition of its own (its own fusion id, executor, plan cache and
kernels); see Note [Segment index space]. A run keeps a map from the original's state
indices to values, feeds each segment what it reads, files what it returns, and drops
every intermediate as soon as no later segment or output needs it, so peak memory is the
live set at one boundary, not the sum of all intermediates.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from fusion_cache.ir.output_layout import channels_last_format, channels_last_order, strides_for

from . import run_context

if TYPE_CHECKING:
    from fusion_cache.frontend.definition import FusionDefinition
    from fusion_cache.ir.subfusion import SubFusion


@dataclass(frozen=True)
class Segment:
    definition: FusionDefinition
    sub: SubFusion
    scheduler: str | None  # None: no scheduler takes it (the reference evaluator runs it)
    drop_after: tuple[int, ...]  # original states no later segment or output reads
    dense_inputs: tuple[int, ...] = ()  # inputs an ATen segment makes, wanted dense
    # per dense input, the stride order it is wanted in (() row-major; Note [Output layouts])
    dense_orders: tuple[tuple[int, ...], ...] = ()

    def densify(self, k: int) -> Callable[[Any], Any]:
        """The torch call that lays dense input `dense_inputs[k]` out as the segment reads it."""
        order = self.dense_orders[k] if k < len(self.dense_orders) else ()
        return dense_as(order)


@dataclass(frozen=True)
class SegmentedPlan:
    segments: tuple[Segment, ...]
    input_states: tuple[int, ...]  # the original's inputs, in execute order
    output_states: tuple[int, ...]  # the original's returned (not in-place) outputs
    description: str


def build_plan(fd: FusionDefinition, drafts: Sequence[Any]) -> SegmentedPlan:
    """Register each draft as a definition and work out when each value dies."""
    outputs = tuple(r.args[0].index for r in fd.output_records() if r.kw("alias_input") is None)
    last_use: dict[int, int] = {}
    for k, d in enumerate(drafts):
        for v in d.sub.inputs:
            last_use[v] = k
    inputs = {r.index for r in fd.input_refs()}
    drops: list[list[int]] = [[] for _ in drafts]
    for v, k in last_use.items():
        if v not in inputs and v not in outputs:
            drops[k].append(v)
    from_aten = {v for d in drafts if d.scheduler == "aten" for v in d.sub.outputs}
    segments = []
    for k, d in enumerate(drafts):
        # values computed but read by no later segment and not returned die at once too
        dead = [v for v in d.sub.outputs if v not in last_use and v not in outputs]
        definition = d.sub.build()
        infos = [definition._infos[r.index] for r in definition.input_refs()]
        dense = tuple(i for i, (v, info) in enumerate(zip(d.sub.inputs, infos))
                      if v in from_aten and info.contiguity and False not in info.contiguity)
        orders = tuple(tuple(infos[i].stride_order or ()) for i in dense)
        segments.append(Segment(definition, d.sub, d.scheduler, tuple(drops[k] + dead), dense,
                                orders))  # fmt: skip
    text = ", ".join(f"{_kind(s)}[fusion {s.definition.id()}]" for s in segments)
    return SegmentedPlan(tuple(segments), tuple(r.index for r in fd.input_refs()), outputs,
                         f"{len(segments)} segments: {text}")  # fmt: skip


def run_segments(fd: FusionDefinition, plan: SegmentedPlan, inputs: Sequence[Any],
                 dump: bool = False) -> list[Any]:  # fmt: skip
    ctx = run_context.current() if run_context.ACTIVE else None
    env = dict(zip(plan.input_states, inputs))
    device = run_device(inputs)
    for k, seg in enumerate(plan.segments):
        if ctx is not None:
            ctx.segment = k  # a profile tells which segment each kernel ran for
        args = [env[v] for v in seg.sub.inputs]
        for k, i in enumerate(seg.dense_inputs):  # an ATen result read where strides are fixed
            args[i] = seg.densify(k)(args[i])
        # a segment reading no CUDA tensor (it only creates values) runs where the rest does
        outs = seg.definition.execute(args, device=None if run_device(args) else device)
        for v, value in zip(seg.sub.outputs, outs):
            env[v] = value
        for v in seg.drop_after:
            env.pop(v, None)
        if dump:
            print(describe_segment(k, seg))
    # an input returned as an output is the input itself (Note [Outputs that alias inputs])
    return [env[v] for v in plan.output_states]


def dense_as(order: Sequence[int]) -> Callable[[Any], Any]:
    """A tensor laid out densely in stride order `order` (itself where it already is): torch's
    memory formats for row-major and channels-last, a copy through the strides otherwise."""
    if not order:
        return torch.Tensor.contiguous
    fmt = channels_last_format(len(order))
    if fmt is not None and tuple(order) == channels_last_order(len(order)):
        return lambda t: t.contiguous(memory_format=fmt)

    def copy(t: Any) -> Any:
        strides = strides_for(t.shape, order)
        if all(n == 1 or s == x for n, s, x in zip(t.shape, t.stride(), strides)):
            return t
        return torch.empty_strided(t.shape, strides, dtype=t.dtype, device=t.device).copy_(t)

    return copy


def run_device(values: Sequence[Any]) -> Any:
    """The CUDA device of the first CUDA tensor among `values`, else None."""
    return next((v.device for v in values if getattr(v, "is_cuda", False)), None)


def _kind(seg: Segment) -> str:
    """How a segment runs: its scheduler's name, 'aten:<op>' for a torch call (Note [ATen
    segments]), 'reference' where nothing takes it."""
    if seg.scheduler == "aten":
        from schedulers.aten import lower_aten

        return f"aten:{lower_aten(seg.definition).op}"
    return seg.scheduler or "reference"


def describe_segment(k: int, seg: Segment) -> str:
    ex = seg.definition._cache.executors.get(seg.definition._fid)
    last = ex.last_plan if ex is not None else None
    launches = last.spec.kernels if last is not None and hasattr(last, "spec") else ()
    kernels = [f"{k.name} grid {k.grid} block {k.block}" for k in launches]
    ran = "; ".join(kernels) if kernels else "reference evaluator"
    if seg.scheduler == "aten":
        from schedulers.aten import lower_aten

        ran = lower_aten(seg.definition).describe().replace("aten: ", "ATen ")
    maps = ", ".join(f"{a}->{b}" for a, b in seg.sub.index_map.items())
    return (f"  segment {k}: fusion {seg.definition.id()} ({seg.scheduler or 'no scheduler'}) "
            f"maps {maps}: {ran}")  # fmt: skip


def describe_plan(fd: FusionDefinition, plan: SegmentedPlan) -> str:
    lines = [f"fusion {fd._fid}: {plan.description}"]
    lines += [describe_segment(k, s) for k, s in enumerate(plan.segments)]
    return "\n".join(lines)
