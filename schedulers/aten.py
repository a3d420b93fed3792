"""The ATen scheduler: a fusion of one op a library does best (GEMM, attention, convolution,
sort, scan) runs as that op's torch call.

Note [ATen segments]: nvFuser runs its matmuls and attention through ATen (its expression
evaluator scheduler) inside a segmented fusion, and generates the kernels around them; so do
we. This scheduler takes a fusion whose only tensor work is one ATen op (ATEN_OPS), plus
view ops leading into its operands (torch views, free: the QKV split before attention, the
head merge before the output projection); every other scheduler refuses
such an op, so the segmenter (Note [Greedy segmentation]) gives each ATen op a segment of
its own and keeps the pointwise and normalization work before and after it in generated
kernels: bias + GELU after a linear is one kernel after the GEMM. The segment runs the op's
interpreter rule (fusion_cache/ir/interpret/aten.py), which is the torch call itself
(cuBLAS, flash attention, ...), never the reference evaluator of a whole fusion.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from fusion_cache.frontend.values import TensorInfo
from fusion_cache.ir.subfusion import is_tensor_op

from .base import LaunchSpec, OutputSpec, SchedulerRefused

NAME = "aten"
# the torch function each ATen op calls on CUDA tensors (names for plans and dumps)
TORCH_CALLS = {
    "matmul": "torch.matmul", "bmm": "torch.bmm", "linear": "torch.nn.functional.linear",
    "sdpfa_fwd": "aten._scaled_dot_product_flash_attention",
    "sdpfa_bwd": "aten._scaled_dot_product_flash_attention_backward",
    "sdpa_cudnn_fwd": "aten._scaled_dot_product_cudnn_attention",
    "sdpa_cudnn_bwd": "aten._scaled_dot_product_cudnn_attention_backward",
    "sdpa_efficient_fwd": "aten._scaled_dot_product_efficient_attention",
    "sdpa_efficient_bwd": "aten._scaled_dot_product_efficient_attention_backward",
    "grouped_mm": "torch._grouped_mm", "scaled_mm": "torch._scaled_mm",
    "cumsum": "torch.cumsum", "argsort": "torch.argsort", "topk": "torch.topk",
    "convolution": "aten.convolution", "convolution_backward": "aten.convolution_backward",
}  # fmt: skip
ATEN_OPS = frozenset(TORCH_CALLS)
# ops torch runs as views (no copy) on the way into the ATen op's operands
VIEW_OPS = frozenset({"permute", "reshape", "squeeze", "broadcast", "broadcast_in_dim", "expand",
                      "slice"})


@dataclass(frozen=True)
class AtenProgram:
    op: str
    output_states: tuple[int, ...]
    output_dtypes: tuple[Any, ...]  # DataType of each
    views: tuple[str, ...] = ()  # view ops taken along, in record order

    def describe(self) -> str:
        views = f" with views {', '.join(self.views)}" if self.views else ""
        return f"aten: {self.op} as {TORCH_CALLS[self.op]}{views}"


def lower_aten(fd: Any) -> AtenProgram:
    """One ATen op and views around it, or SchedulerRefused with the reason."""
    ops = [r for r in fd._records if is_tensor_op(fd, r)]
    aten = [r for r in ops if r.name in ATEN_OPS]
    if not aten:
        raise SchedulerRefused("the fusion has no ATen op")
    if len(aten) > 1:
        raise SchedulerRefused(f"an ATen segment runs one ATen op; this fusion has "
                               f"{', '.join(r.name for r in aten)}")  # fmt: skip
    taken, results = _attached_views(ops, aten[0])
    others = [r.name for r in ops if r is not aten[0] and id(r) not in taken]
    if others:
        raise SchedulerRefused(f"an ATen segment runs {aten[0].name} and views of its operands; "
                               f"this fusion also has {', '.join(others)}")  # fmt: skip
    outs = fd.output_records()
    if not outs:
        raise SchedulerRefused("the fusion has no outputs")
    for r in outs:
        if not isinstance(fd._infos[r.args[0].index], TensorInfo):
            raise SchedulerRefused(f"output {r.args[0]} is a scalar")
        if r.args[0].index not in results:
            raise SchedulerRefused(f"output {r.args[0]} is not a result of {aten[0].name}")
        if r.kw("alias_input") is not None:
            raise SchedulerRefused(f"output {r.args[0]} is written into an input")
    views = tuple(r.name for r in ops if id(r) in taken)
    states = tuple(r.args[0].index for r in outs)
    return AtenProgram(aten[0].name, states, tuple(fd._infos[s].dtype for s in states), views)


def _attached_views(ops: list, op: Any) -> tuple[set[int], set[int]]:
    """(ids of the view records leading into `op`'s operands, the states of its results)."""
    producers = {o.index: r for r in ops for o in r.outputs}
    taken: set[int] = set()
    stack = [a for a in op.refs() if a.kind == "T"]
    while stack:
        r = producers.get(stack.pop().index)
        if r is not None and r.name in VIEW_OPS and id(r) not in taken:
            taken.add(id(r))
            stack.extend(a for a in r.refs() if a.kind == "T")
    # views of the results are left to the consumers: a view that leaves a segment is
    # copied to a contiguous tensor, one that enters the next ATen op is free
    return taken, {o.index for o in op.outputs}


def plan_aten(program: AtenProgram, values: Sequence[Any], env: dict, profile: Any) -> LaunchSpec:
    """The outputs' shapes; no kernels: the runtime makes the torch call (Note [ATen
    segments])."""
    del values, profile  # the torch call decides for itself on the GPU at hand
    outputs = tuple(OutputSpec(tuple(env[s]), dt)
                    for s, dt in zip(program.output_states, program.output_dtypes))
    return LaunchSpec(NAME, outputs, (), (), program.describe())
