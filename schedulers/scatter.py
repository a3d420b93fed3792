"""The scatter scheduler: a fusion whose output is a scatter or an index_put_accumulate, its
operands computed by pointwise work.

Note [Scatter kernels]: two pointwise programs, launched in order on one output buffer.
The first writes the tensor scattered into (scatter's `arg1`, index_put_accumulate's `acc`)
over the output's shape. The second runs over the index's shape (a scatter's) or the
value's (an accumulate's), reads the index and the source there, and stores each value at
the output element its index names: a Store with a dim map, as an Access reads through one
(Note [Gather loads] in resize.py). A scatter's store overwrites; where indices repeat,
which of the values lands is unspecified (as in torch). An accumulate adds atomically
(fc_atomic_add, prelude/index.cuh), so float results depend on the order the adds land in.
The deterministic path (FUSION_CACHE_DETERMINISTIC=1, or torch's
use_deterministic_algorithms) replaces the second program: see Note [Deterministic scatter].

Note [Deterministic scatter]: a scatter lets the last index (in the index tensor's
row-major order) win, as torch does on the CPU: a first kernel keeps, for each output
element, the largest position aiming at it (an atomic max on a workspace of int64, set to
-1 by the first program's kernel), and a second stores only the winners. An accumulate
adds each output row's values in index order: codegen/scatter_cuda.py, one block a tile of
rows and of 32-column strips, each warp scanning the index 32 at a time.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, replace
from typing import Any

import torch

from codegen.kernel_ir import PointwiseProgram, Store
from fusion_cache.frontend.dtypes import DataType, is_complex
from fusion_cache.frontend.values import TensorInfo

from .base import LaunchSpec, SchedulerRefused
from .pointwise import _Lowering, plan_pointwise

NAME = "scatter"
SCATTERS = {"scatter", "index_put_accumulate"}


@dataclass(frozen=True)
class ScatterProgram:
    init: PointwiseProgram  # the output = the tensor scattered into
    scatter: PointwiseProgram  # each source value stored (or added) at its index
    op: str  # 'scatter' or 'index_put_accumulate'
    out_state: int
    dtype: DataType
    # for the deterministic kernels, which read the index and source from memory
    dim: int
    index_pos: int | None  # execute's input position of the index, None when computed
    source_pos: int | None
    index_dtype: DataType
    source_dtype: DataType

    def describe(self) -> str:
        return f"scatter: {self.op} into a {self.dtype!r} output"


def deterministic() -> bool:
    """Note [Deterministic scatter]: asked for by the knob or by torch's own switch."""
    return os.environ.get("FUSION_CACHE_DETERMINISTIC", "") not in ("", "0") or (
        torch.are_deterministic_algorithms_enabled())


def lower_scatter(fd: Any) -> ScatterProgram:
    producers = {o.index: r for r in fd._records if r.kind == "op" for o in r.outputs}
    input_pos = {ref.index: i for i, ref in enumerate(fd.input_refs())}
    outs = fd.output_records()
    if len(outs) != 1:
        raise SchedulerRefused(f"{len(outs)} outputs; a scatter kernel writes one")
    out = outs[0]
    state = out.args[0].index
    rec = producers.get(state)
    if rec is None or rec.name not in SCATTERS:
        raise SchedulerRefused("the output is not a scatter or index_put_accumulate")
    if out.kw("alias_input") is not None or out.kw("stride_order"):
        raise SchedulerRefused(f"output {out.args[0]} is written in place or in a stride order")
    info: TensorInfo = fd._infos[state]
    if is_complex(info.dtype):
        raise SchedulerRefused(f"{rec.name} of complex values")
    for r in fd._records:  # the scattered output feeds nothing else
        if r.kind == "op" and r is not rec and any(a.index == state for a in r.refs()):
            raise SchedulerRefused(f"{rec.name} ({rec.outputs[0]}) is read by {r.name}")
    target, index, source = rec.args
    loop_out = tuple(range(info.ndim))
    init = _Lowering(fd, producers, input_pos)
    var = init.tensor(target.index, loop_out)
    init_program = _program(init, info.ndim, (Store(var, state, info.dtype, None),), (state,))
    low = _Lowering(fd, producers, input_pos)
    src_info = fd._infos[source.index]
    d = rec.kw("dim") % info.ndim if rec.name == "scatter" else 0
    if rec.name == "scatter":
        loop = index.index
        rank = fd._infos[index.index].ndim
        value_map = tuple(range(rank))
        at = low.index_value(rec, index, value_map, state, d)
        dim_map = tuple(at if k == d else k for k in range(rank))
    else:
        loop = source.index
        rank = src_info.ndim
        value_map = tuple(None if code == 1 else k for k, code in enumerate(src_info.shape))
        at = low.index_value(rec, index, (0,), state, 0)
        dim_map = (at,) + tuple(range(1, rank))
    value = low.tensor(source.index, value_map)
    if src_info.dtype is not info.dtype:
        value = low.emit(info.dtype, "cast", (value,), compute=info.dtype)
    store = Store(value, state, info.dtype, None, dim_map, rec.name == "index_put_accumulate")
    scatter_program = replace(_program(low, rank, (store,), (state,)), loop_state=loop)
    return ScatterProgram(init_program, scatter_program, rec.name, state, info.dtype, d,
                          input_pos.get(index.index), input_pos.get(source.index),
                          fd._infos[index.index].dtype, src_info.dtype)  # fmt: skip


def _program(low: _Lowering, rank: int, stores: tuple, outputs: tuple) -> PointwiseProgram:
    return PointwiseProgram(
        loop_rank=rank, accesses=tuple(low.accesses), stmts=tuple(low.stmts), stores=stores,
        scalar_inputs=tuple(sorted(low.scalar_inputs.items())),
        host_scalars=tuple(sorted(low.host_scalars.items())), output_states=outputs,
        views=tuple(low.views.items()), positions=tuple(low.positions), guards=tuple(low.guards),
        checks=tuple(low.checks),
    )  # fmt: skip


def plan_scatter(program: ScatterProgram, values: Any, env: dict, profile: Any) -> LaunchSpec:
    first = plan_pointwise(program.init, values, env, profile)
    if not first.kernels:  # an empty output: nothing to scatter into
        return replace(first, scheduler=NAME)
    if deterministic():
        from .scatter_deterministic import plan_deterministic

        return plan_deterministic(program, first, values, env, profile)
    # the second program's ArgRef('output', 0) is the first's output: one buffer
    second = plan_pointwise(program.scatter, values, env, profile)
    kernels = first.kernels + second.kernels
    return LaunchSpec(NAME, first.outputs, (), kernels,
                      f"{program.op}: {first.description}; then {second.description}")  # fmt: skip

