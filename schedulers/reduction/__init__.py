"""Reduction and normalization scheduling (Note [Reduction loop space] in lowering.py).

One module a decision: `lowering` (a fusion -> ReductionProgram), `problem` (what planning
reads from one call's inputs), `plan` (plan_reduction: a row or an outer kernel),
`row_shape` (a row's vector width, access modes, threads), `clusters` (blocks a row, their
exchange, the deferred row end, one wave of clusters), `row_loads` (rows in shared memory,
the pipeline, weights loaded once), `row_plan` (the row kernel's launch), `outer_plan` (the
dim-0 and middle-dim layouts and split), `split_plan` (a few long rows split over the GPU),
`column_norm_plan` (normalizations along a strided dim), `finish` (where partials are added
up).
"""
from codegen.kernel_ir import ReductionProgram

from .finish import dependent_launch
from .lowering import NAME, REDUCTIONS, lower_reduction
from .plan import plan_reduction

__all__ = ["NAME", "REDUCTIONS", "ReductionProgram", "dependent_launch", "lower_reduction",
           "plan_reduction"]  # fmt: skip
