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
An accumulate into a constant fill (an embedding's gradient) takes the row-sums kernels
instead of both programs, unless the deterministic path is asked for: Note [Row sums] in
row_sums.py.

Note [Deterministic scatter]: a scatter lets the last index (in the index tensor's
row-major order) win, as torch does on the CPU: a first kernel keeps, for each output
element, the largest position aiming at it (an atomic max on a workspace of int64, set to
-1 by the first program's kernel), and a second stores only the winners. An accumulate
adds each output row's values in index order: codegen/scatter_cuda.py, one block a tile of
rows and of 32-column strips, each warp scanning the index 32 at a time.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

import torch

from codegen.cuda_ops import REGISTER_TYPE
from codegen.kernel_ir import Access, PointwiseProgram, Store
from fusion_cache.frontend.dtypes import DataType, is_complex
from fusion_cache.frontend.options import env_flag
from fusion_cache.frontend.records import Record, Ref
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
    # for the deterministic kernels, which read the index and source from memory: an input
    # read through views and casts a kernel makes anyway (None: computed, Note [Scatter reads])
    dim: int
    index_read: Access | None
    source_read: Access | None
    index_dtype: DataType  # as read from memory
    source_dtype: DataType
    # Note [Sums cast down]: an accumulate into a constant fill (an embedding's gradient)
    # runs as the ordered kernel alone where its index scans are cheap, summing from the fill
    # in the accumulate's dtype and storing the fusion's (a cast down that follows, fused):
    # no fill kernel, no atomics, no cast kernel, one write of the output
    fill: float | None = None
    final_dtype: DataType | None = None  # the cast's dtype, where one follows
    index_state: int = -1  # the index operand and the source as the scatter reads them
    source_state: int = -1

    def describe(self) -> str:
        return f"scatter: {self.op} into a {self.dtype!r} output"


def deterministic() -> bool:
    """Note [Deterministic scatter]: asked for by the knob or by torch's own switch."""
    return env_flag("FUSION_CACHE_DETERMINISTIC", False) or (
        torch.are_deterministic_algorithms_enabled())


def _ordered_sums(program: ScatterProgram, values: Any, env: dict) -> bool:
    """Note [16-bit accumulation]: an index_put_accumulate into half or bfloat16 adds each row's
    values in float, in index order, and rounds once (the deterministic kernel), as torch's
    CUDA kernel does, rather than rounding every atomic add (torch on the CPU), where its
    index scans cost at most four times the output's and the values' bytes: each block of
    rows reads the whole index from L2 (embedding backward 50304 x 768, 8192 tokens: 309 MB
    of index reads against 167 MB)."""
    if program.op != "index_put_accumulate" or program.dtype not in (DataType.Half,
                                                                     DataType.BFloat16):
        return False
    return _cheap_scans(program, values, env)


def _cheap_scans(program: ScatterProgram, values: Any, env: dict) -> bool:
    if program.index_read is None or program.source_read is None:
        return False
    from codegen.scatter_cuda import BLOCK, rows_for

    out = tuple(env[program.out_state])
    rows, cols = out[0], math.prod(out[1:])
    n = math.prod(env[program.index_state])
    if cols > 65535 * BLOCK:  # the ordered kernel's grid holds no wider rows
        return False
    scans = -(-rows // rows_for(program.dtype)) * -(-cols // BLOCK) * n * 8
    return scans <= 4 * (rows * cols * 4 + n * cols * 2)


def lower_scatter(fd: Any) -> ScatterProgram:
    producers = {o.index: r for r in fd._records if r.kind == "op" for o in r.outputs}
    input_pos = {ref.index: i for i, ref in enumerate(fd.input_refs())}
    outs = fd.output_records()
    if len(outs) != 1:
        raise SchedulerRefused(f"{len(outs)} outputs; a scatter kernel writes one")
    out = outs[0]
    state = out.args[0].index
    rec = producers.get(state)
    final = None
    if rec is not None and rec.name == "cast" and isinstance(rec.args[0], Ref):
        inner = producers.get(rec.args[0].index)
        if inner is not None and inner.name == "index_put_accumulate":
            final, rec, state = rec, inner, inner.outputs[0].index
    if rec is None or rec.name not in SCATTERS:
        raise SchedulerRefused("the output is not a scatter or index_put_accumulate")
    if out.kw("alias_input") is not None or out.kw("stride_order"):
        raise SchedulerRefused(f"output {out.args[0]} is written in place or in a stride order")
    info: TensorInfo = fd._infos[state]
    if is_complex(info.dtype):
        raise SchedulerRefused(f"{rec.name} of complex values")
    for r in fd._records:  # the scattered output feeds nothing else
        if r.kind == "op" and r is not rec and r is not final and any(
                a.index == state for a in r.refs()):  # fmt: skip
            raise SchedulerRefused(f"{rec.name} ({rec.outputs[0]}) is read by {r.name}")
    target, index, source = rec.args
    if final is not None:
        return _sums_cast_down(fd, rec, final, producers, input_pos)
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
    store = Store(value, state, info.dtype, None, dim_map=dim_map,
                  accumulate=rec.name == "index_put_accumulate")
    scatter_program = replace(_program(low, rank, (store,), (state,)), loop_state=loop)
    index_read = _memory_read(fd, producers, input_pos, index.index, DataType.Int)
    source_read = _memory_read(fd, producers, input_pos, source.index, info.dtype)
    fill = _constant_fill(fd, producers, target.index) if rec.name != "scatter" else None
    return ScatterProgram(init_program, scatter_program, rec.name, state, info.dtype, d,
                          index_read, source_read, _read_dtype(fd, index_read, index.index),
                          _read_dtype(fd, source_read, source.index), fill, None, index.index,
                          source.index)  # fmt: skip


def _constant_fill(fd: Any, producers: dict, state: int) -> float | None:
    """The value of a `full` with a constant fill (None for anything else)."""
    rec = producers.get(state)
    if rec is None or rec.name != "full":
        return None
    info = fd._infos[rec.kw("fill_value").index]
    return float(info.value) if info.is_const else None


def _read_dtype(fd: Any, access: Access | None, state: int) -> DataType:
    return access.dtype if access is not None else fd._infos[state].dtype


def _memory_read(fd: Any, producers: dict, input_pos: dict, state: int,
                 target: DataType) -> Access | None:  # fmt: skip
    """Note [Scatter reads]: the deterministic kernels read an operand straight from memory
    with strides, converting each value to the sums' (or an index's) type as they go: an
    input, read through views (reshapes, permutes, broadcasts) and casts to `target` that
    this conversion makes anyway. None for anything computed."""
    low = _Lowering(fd, producers, input_pos)
    try:
        low.tensor(state, tuple(range(fd._infos[state].ndim)))
    except SchedulerRefused:
        return None
    if len(low.accesses) != 1 or any(hasattr(f, "record") for f in low.accesses[0].frames):
        return None
    for st in low.stmts:
        if st.op == "load":
            continue
        up = st.op == "cast" and st.dtype is target and (
            target is DataType.Int or REGISTER_TYPE[target] in ("float", "double"))
        if not up:
            return None
    return low.accesses[0]


def _sums_cast_down(fd: Any, rec: Record, final: Record, producers: dict,
                    input_pos: dict) -> ScatterProgram:  # fmt: skip
    """Note [Sums cast down]: what the ordered kernel needs, or a refusal (the segmenter then
    gives the cast a kernel of its own)."""
    target, index, source = rec.args
    fill = _constant_fill(fd, producers, target.index)
    if fill is None:
        raise SchedulerRefused(f"a cast of {rec.name} ({rec.outputs[0]}) runs with it where it "
                               "sums into a constant fill")  # fmt: skip
    info = fd._infos[rec.outputs[0].index]
    index_read = _memory_read(fd, producers, input_pos, index.index, DataType.Int)
    source_read = _memory_read(fd, producers, input_pos, source.index, info.dtype)
    if index_read is None or source_read is None:
        raise SchedulerRefused(f"a cast of {rec.name} ({rec.outputs[0]}) runs with it where its "
                               "index and values are read from memory")  # fmt: skip
    empty = PointwiseProgram(0, (), (), (), (), (), ())
    return ScatterProgram(empty, empty, rec.name, final.outputs[0].index, info.dtype, 0,
                          index_read, source_read, index_read.dtype, source_read.dtype,
                          fill, final.kw("dtype"), index.index, source.index)  # fmt: skip


def _program(low: _Lowering, rank: int, stores: tuple, outputs: tuple) -> PointwiseProgram:
    return PointwiseProgram(
        loop_rank=rank, accesses=tuple(low.accesses), stmts=tuple(low.stmts), stores=stores,
        scalar_inputs=tuple(sorted(low.scalar_inputs.items())),
        host_scalars=tuple(sorted(low.host_scalars.items())), output_states=outputs,
        views=tuple(low.views.items()), positions=tuple(low.positions), guards=tuple(low.guards),
        checks=tuple(low.checks),
    )  # fmt: skip


def plan_scatter(program: ScatterProgram, values: Any, env: dict, profile: Any) -> LaunchSpec:
    from .row_sums import plan_row_sums, row_sums_refusal, slabs_fit
    from .scatter_deterministic import plan_deterministic

    slabs = slabs_fit(program, env)
    if slabs or (not deterministic() and row_sums_refusal(program) is None):
        return plan_row_sums(program, values, env, profile, slabs)  # Note [Row sums], [Row slabs]
    if program.fill is not None and (deterministic() or _cheap_scans(program, values, env)):
        return plan_deterministic(program, None, values, env, profile)  # Note [Sums cast down]
    if program.final_dtype is not None:
        raise SchedulerRefused("index scans of the ordered sums would cost more than atomics "
                               "and a cast")  # fmt: skip
    first = plan_pointwise(program.init, values, env, profile)
    if not first.kernels:  # an empty output: nothing to scatter into
        return replace(first, scheduler=NAME)
    if deterministic() or _ordered_sums(program, values, env):
        return plan_deterministic(program, first, values, env, profile)
    # the second program's ArgRef('output', 0) is the first's output: one buffer
    second = plan_pointwise(program.scatter, values, env, profile)
    kernels = first.kernels + second.kernels
    return LaunchSpec(NAME, first.outputs, (), kernels,
                      f"{program.op}: {first.description}; then {second.description}")  # fmt: skip

