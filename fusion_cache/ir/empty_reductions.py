"""Reductions over nothing.

Note [Empty reductions]: a reduction whose reduced extent is 0 at run time reads nothing and
yields its identity per row (sum 0, prod 1, max -inf, min +inf, var and mean NaN, Welford's
count 0), as nvFuser's "remove empty" pass makes it. Plans depend on the sizes, so for such
sizes the executor plans a definition in which each of those reductions is a `full` of its
identity, shaped as its output; what follows it (a log of the sum, a division by it) is
then an ordinary pointwise fusion. The interpreter gives the same values.
"""
from __future__ import annotations

import math
from typing import Any

from fusion_cache.frontend.dtypes import DataType, is_float
from fusion_cache.frontend.records import Record

REDUCTIONS = frozenset({"sum", "prod", "max", "min", "var", "var_mean", "welford"})


def identity(op: str, dtype: DataType, output: int = 0) -> Any:
    """The value a reduction `op` gives over no elements (output `output` of var_mean and
    welford: var then mean; avg, var_sum, n)."""
    floating = is_float(dtype)
    if op == "sum":
        return 0.0 if floating else 0
    if op == "prod":
        return 1.0 if floating else 1
    if op in ("max", "min"):
        if floating:
            return -math.inf if op == "max" else math.inf
        if dtype is DataType.Bool:
            return op == "min"
        bits = 31 if dtype is DataType.Int32 else 63
        return -(2**bits) if op == "max" else 2**bits - 1
    if op == "welford":
        return (math.nan, 0.0, 0)[output]
    return math.nan  # var, var_mean


def empty_reductions(fd: Any, env: dict) -> list[Record]:
    """The reductions of `fd` whose reduced extent is 0 for these run-time shapes."""
    found = []
    for r in fd._records:
        if r.kind == "op" and r.name in REDUCTIONS:
            shape = env.get(r.args[0].index)
            if shape is None:
                continue
            rank = max(len(shape), 1)
            if any(shape[d % rank] == 0 for d in r.kw("dims")) and shape:
                found.append(r)
    return found


def without_empty_reductions(fd: Any, env: dict) -> Any:
    """A scratch definition of the same inputs and outputs with each empty reduction made a
    `full` of its identity (static shapes: the plan it serves is for these sizes only)."""
    from fusion_cache.frontend.replay import replay_records

    from .subfusion import ScratchDefinition

    empty = {id(r) for r in empty_reductions(fd, env)}

    def rewrite(new: Any, r: Record, args: list, kwargs: dict) -> Any:
        if id(r) not in empty:
            return None
        made = []
        for k, out in enumerate(r.outputs):
            dtype = fd._infos[out.index].dtype
            shape = [int(n) for n in env[out.index]]
            made.append(new.ops.full(shape, new.define_scalar(identity(r.name, dtype, k), dtype), dtype))
        return tuple(made) if len(made) > 1 else made[0]

    scratch = ScratchDefinition()
    with scratch:
        replay_records(scratch, list(fd._records), rewrite)
    scratch._fid = fd._fid
    return scratch
