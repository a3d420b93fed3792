"""The launch of a reduction program for one call's inputs: a row kernel (row_plan.py) or an
outer kernel and its finish (outer_plan.py)."""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from codegen.cuda_ops import RANDOM_STMTS
from codegen.kernel_ir import ReductionProgram

from ..base import LaunchSpec, SchedulerRefused
from .column_norm_plan import column_norm
from .lowering import NAME
from .outer_plan import plan_columns
from .problem import empty_outputs, read_problem
from .row_plan import plan_rows
from .split_plan import split_rows


def plan_reduction(program: ReductionProgram, values: Sequence[Any], env: dict,
                   profile: Any, accumulate: tuple[int, ...] = (),
                   finish: tuple[str, ...] = ()) -> LaunchSpec:  # fmt: skip
    """The launch for these inputs. `accumulate`: element-level stores summed over rows
    into per-block column partials instead of written (Note [Column partials]); they get
    workspaces of [blocks, N] partials, in order, and no outputs. `finish`: the memory
    types of the column sums, which the kernel may add up itself (Note [Finish in the row
    kernel]); its launch is then cooperative and takes their outputs and a barrier."""
    empty = empty_outputs(program, env, accumulate)
    if empty is not None:
        return LaunchSpec(NAME, empty, (), (), "empty")
    p = read_problem(program, values, env, profile, accumulate, finish)
    rank, reduced = program.rank, program.reduced
    if any(st.op in RANDOM_STMTS for st in program.stmts) and (
            not p.inner or reduced != tuple(range(rank - len(reduced), rank))):  # fmt: skip
        # the row kernel numbers element k of row r as r * N + k, the loop's row-major
        # index, only when the reduced dims are the innermost (Note [Philox numbers])
        raise SchedulerRefused("random numbers in a reduction kernel need the reduced dims "
                               "innermost and the row kernel")  # fmt: skip
    if p.inner and p.primary is not None and p.ks[p.primary] not in (0, 1) and not p.pure:
        # a row whose elements are strided apart would be read uncoalesced, once per stage:
        # a column kernel keeps it in registers (Note [Column norms]); where it cannot,
        # outer reductions and a pointwise kernel (segments) read it coalesced
        plan = column_norm(p)
        if isinstance(plan, str):
            raise SchedulerRefused(f"a normalization along a strided dim: {plan}")
        return plan
    if p.inner:
        return split_rows(p) or plan_rows(p)
    if accumulate:
        raise SchedulerRefused("column partials ride on the inner kernel only")
    return plan_columns(p)
