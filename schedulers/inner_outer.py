"""The inner-outer scheduler: row reductions and column sums of the same rows in one pass.

Layer norm and RMS norm backward reduce each row (for dx) and sum over the rows (for dw
and db). Split in two kernels, the column sums read the inputs a second time. Here the row
kernel also adds the values the column sums need into per-thread registers as it goes
(Note [Column partials]); each block then writes one row of partial sums and one small
finish kernel adds up every column sum's partials in a fixed order. Inputs are read once.

Shape of what it takes: a loop [rows..., N]; reductions over its last dim (any, with their
epilogues), and sums over every other dim of element-level values whose results are outputs,
as they are or cast. Anything else is refused and the segmenter splits the fusion.

Note [Leading dims as rows]: the row kernel collapses a loop's kept dims into its rows, so a
column sum over [B, T] of a [B, T, C] loop (GPT-2's layer-norm weight and bias gradients,
which autograd sums over both leading dims) is the same column sum as over the rows of
[B * T, C]; taking rank 3 saves the two outer-reduction kernels that read the f32 values
the row kernel had to write for them.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from fusion_cache.frontend.dtypes import DataType
from fusion_cache.frontend.values import TensorInfo

from .base import ArgRef, KernelLaunch, LaunchSpec, OutputSpec, SchedulerRefused
from .reduction import (
    REDUCTIONS,
    ReductionProgram,
    dependent_launch,
    lower_reduction,
    plan_reduction,
)
from .tuning import knob, switched_on

NAME = "inner_outer"


@dataclass(frozen=True)
class ColumnSum:
    output_pos: int  # position among the fusion's returned outputs
    dtype: DataType  # the output's dtype
    store: int  # the row program's store that feeds it


@dataclass(frozen=True)
class InnerOuterProgram:
    rows: ReductionProgram  # the row kernel; some stores are column partials
    rows_fd: Any  # the definition it was lowered from (its own inputs and states)
    input_positions: tuple[int, ...]  # rows_fd input -> this fusion's input position
    row_outputs: tuple[int, ...]  # rows_fd returned output -> this fusion's output position
    columns: tuple[ColumnSum, ...]

    def describe(self) -> str:
        return f"inner-outer: {self.rows.describe()}; {len(self.columns)} column sums"


def _dims(rec: Any, rank: int) -> set[int]:
    return {d % rank for d in rec.kw("dims")}


def lower_inner_outer(fd: Any) -> InnerOuterProgram:
    from fusion_cache.frontend.records import Record, Ref
    from fusion_cache.frontend.replay import replay_records
    from fusion_cache.frontend.values import Tensor
    from fusion_cache.ir.subfusion import FusionGraph, ScratchDefinition

    records, infos = fd._records, fd._infos
    producer = {o.index: r for r in records for o in r.outputs}
    column, row, ranks = [], 0, set()
    leading = switched_on("LEADING_ROWS")  # Note [Unmeasured switches]
    for r in records:
        if r.kind != "op" or r.name not in REDUCTIONS:
            continue
        src = infos[r.args[0].index]
        rank = src.ndim
        dims = _dims(r, max(rank, 1))
        ranks.add(rank)
        # Note [Leading dims as rows]: the row kernel takes the kept dims of a loop of any
        # rank as its rows, so a sum over every dim but the last is a column sum
        if (rank == 2 or leading) and rank >= 2 and dims == set(range(rank - 1)) and \
                r.name == "sum" and not r.kw("keepdim", False):  # fmt: skip
            column.append(r)
        elif (rank == 2 or leading) and rank >= 2 and dims == {rank - 1}:
            row += 1
        else:
            raise SchedulerRefused(f"{r.name} ({r.outputs[0]}) is neither a row reduction nor a "
                                   "column sum (over every dim but the last)")  # fmt: skip
    if len(ranks) > 1:
        raise SchedulerRefused(f"reductions of loops of ranks {sorted(ranks)}")
    if not column or not row:
        raise SchedulerRefused("needs both row reductions and column sums")
    graph = FusionGraph(fd)
    outputs = [r for r in fd.output_records() if r.kw("alias_input") is None]
    if len(outputs) != len(fd.output_records()):
        raise SchedulerRefused("an output is written in place")
    sums = {r.outputs[0].index: r for r in column}
    finals: dict[int, tuple[Any, Any]] = {}  # column output state -> (sum record, cast)
    for r in outputs:
        v = r.args[0].index
        src = producer.get(v)
        if src is not None and src.name == "cast" and src.args[0].index in sums:
            finals[v] = (sums[src.args[0].index], src)
        elif v in sums:
            finals[v] = (sums[v], None)
    used = {rec.outputs[0].index for rec, _ in finals.values()}
    if used != set(sums) or len(used) != len(finals):
        raise SchedulerRefused("a column sum feeds something other than one output")
    for v, (rec, cast) in finals.items():
        readers = graph.consumers.get(rec.outputs[0].index, set())
        if readers - ({graph.producer[v]} if cast is not None else set()):
            raise SchedulerRefused(f"column sum {rec.outputs[0]} is read inside the fusion")
    skipped = {graph.producer[rec.outputs[0].index] for rec, _ in finals.values()}
    skipped |= {graph.producer[v] for v, (_, cast) in finals.items() if cast is not None}
    group = [pos for pos in graph.ops if pos not in skipped]
    row_values = {r.args[0].index for r in outputs if r.args[0].index not in finals}
    fed = [rec.args[0].index for rec, _ in finals.values()]
    if len(set(fed)) != len(fed) or set(fed) & row_values:
        raise SchedulerRefused("one value feeds two column sums or is also returned")
    sub = graph.carve(group, row_values, {v for v in fed if v in graph.produced(group)})
    back = {orig: seg for seg, orig in sub.index_map.items()}
    inputs = list(sub.inputs)
    of_inputs = [v for v in fed if v not in graph.produced(group)]
    for v in of_inputs:
        if v not in back:
            raise SchedulerRefused(f"column sum of T{v}, which the rows never read")

    def copy_summed_inputs(new: Any, r: Record, args: list, kwargs: dict) -> None:
        # a column sum of an input: the row program stores a copy of it, which the kernel
        # then keeps as column partials
        if r.kind == "end":
            for v in of_inputs:
                copy = new.ops.set(Tensor(new, Ref("T", back[v])))
                new.add_output(copy)
                back[v] = copy.index

    rows_fd = ScratchDefinition()
    with rows_fd:
        replay_records(rows_fd, list(sub.records) + [Record("end")], copy_summed_inputs)
    program = lower_reduction(rows_fd)
    store_of = {}
    for k, st in enumerate(program.stores):
        store_of.setdefault(st.state, k)
    positions = {ref.index: i for i, ref in enumerate(fd.input_refs())}
    returned = [r.args[0].index for r in outputs]
    columns = []
    for v, (rec, _) in finals.items():
        src = rec.args[0].index
        info = infos[v]
        if not isinstance(info, TensorInfo):
            raise SchedulerRefused(f"output T{v} is not a tensor")
        columns.append(ColumnSum(returned.index(v), info.dtype, store_of[back[src]]))
    row_outputs = tuple(returned.index(sub.index_map[st.state]) for k, st in enumerate(program.stores)
                        if k not in {c.store for c in columns})  # fmt: skip
    return InnerOuterProgram(program, rows_fd, tuple(positions[v] for v in inputs),
                             row_outputs, tuple(columns))  # fmt: skip


def plan_inner_outer(program: InnerOuterProgram, values: Sequence[Any], env: dict,
                     profile: Any) -> LaunchSpec:  # fmt: skip
    from codegen.cuda_ops import MEMORY_TYPE
    from codegen.reduction.column_finish import (
        COLUMN_FINISH_NAME,
        STRIP_COLUMNS,
        STRIP_THREADS,
        render_column_finish,
    )
    from codegen.reduction.common import acc_type
    from fusion_cache.ir.shape_eval import runtime_shapes

    row_values = [values[p] for p in program.input_positions]
    row_env = runtime_shapes(program.rows_fd, row_values)
    acc = tuple(c.store for c in program.columns)
    finish = tuple(MEMORY_TYPE[c.dtype] for c in program.columns)
    spec = plan_reduction(program.rows, row_values, row_env, profile, accumulate=acc,
                          finish=finish)  # fmt: skip
    (kernel,) = spec.kernels
    n_out = len(program.row_outputs) + len(program.columns)
    outputs: list[Any] = [None] * n_out
    for k, pos in enumerate(program.row_outputs):
        outputs[pos] = spec.outputs[k]

    def remap(arg: Any) -> Any:
        if isinstance(arg, ArgRef) and arg.kind == "input":
            return ArgRef("input", program.input_positions[arg.index])
        if isinstance(arg, ArgRef) and arg.kind == "output":
            return ArgRef("output", program.row_outputs[arg.index])
        return arg

    index = "i64" if "typedef long long idx_t" in kernel.source else "i32"
    n = tuple(row_env[program.rows.stores[program.columns[0].store].state])[-1]
    blocks = spec.workspaces[0][0] // n  # rows of partials: one a block (or cluster)
    sums, args = [], []
    for w, col in enumerate(program.columns):
        store = program.rows.stores[col.store]
        outputs[col.output_pos] = OutputSpec((n,), col.dtype)
        sums.append((acc_type(store.dtype), col.dtype))
        args += [ArgRef("workspace", w), ArgRef("output", col.output_pos)]
    row_args = tuple(remap(a) for a in kernel.args)
    if kernel.cooperative:
        # Note [Finish in the row kernel]: the column sums' outputs, then the barrier's
        # counters, which the runtime keeps after the workspaces
        row_args += tuple(args[1::2]) + (ArgRef("workspace", len(spec.workspaces)),)
        return LaunchSpec(NAME, tuple(outputs), spec.workspaces,
                          (replace(kernel, args=row_args),),
                          f"{spec.description}; {len(program.columns)} column sums over "
                          f"{blocks} blocks, finished in the row kernel", spec.wave)  # fmt: skip
    kernels = [replace(kernel, args=row_args)]
    # one launch for every column sum (blockIdx.y); where its blocks of 32 columns leave
    # SMs idle (rows of 256), 32 threads a column share the partials instead of 8; few
    # blocks of partials go to threads of four columns each (Note [Column strips]) where
    # those strips still give every SM a block
    col_blocks = max(1, -(-n // 32))
    strip_blocks = max(1, -(-n // (STRIP_COLUMNS * STRIP_THREADS)))
    strips = knob("finish.strips", blocks <= 32 and strip_blocks * len(sums) >= profile.sm_count)
    rows = 0 if strips else knob("finish.rows", 32 if col_blocks * len(sums) < profile.sm_count else 8)
    source = render_column_finish(sums, "long long" if index == "i64" else "int", rows)
    grid, block = (col_blocks, len(sums), 1), (32, rows, 1)
    if strips:
        grid = (strip_blocks, len(sums), 1)
        block = (STRIP_THREADS, 1, 1)
    kernels.append(KernelLaunch(COLUMN_FINISH_NAME, source, grid, block,
                                ("ptr", "ptr") * len(sums) + (index, index), (*args, n, blocks),
                                dependent=dependent_launch(profile)))
    return LaunchSpec(NAME, tuple(outputs), spec.workspaces, tuple(kernels),
                      f"{spec.description}; {len(program.columns)} column sums over {blocks} "
                      "blocks", spec.wave)  # fmt: skip
