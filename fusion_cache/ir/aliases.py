"""Outputs nvFuser returns as the inputs' own memory.

Note [Outputs that alias inputs]: nvFuser hands back, without computing them, outputs that
are an input itself or a view of one (reshape where torch could view, permute, squeeze,
broadcasts, expand, slice), and for an output also written into an input in place
(`add_output(t, alias_input=x)`) every other return of `t` is that input. Its tests check
`data_ptr()`; clients (Thunder's in-place updates) rely on it. The runtime computes such
outputs as torch views of the inputs after the run (`view_outputs`), and a fusion whose
returns are all views runs no kernel at all.
"""
from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from fusion_cache.frontend.records import Record, Ref

# `set` is a copy: clients make clones with it (Thunder's clone, the frontends' pass-through)
VIEW_OPS = frozenset({"reshape", "permute", "squeeze", "broadcast", "broadcast_in_dim",
                      "expand", "slice"})  # fmt: skip


@dataclass(frozen=True)
class AliasPlan:
    views: dict  # returned position -> (state, the records that compute it from the inputs)
    written: dict  # returned position -> position of the input it was written into
    all_views: bool  # every returned output is a view and nothing is written in place


def _analyse(records: tuple[Record, ...]) -> AliasPlan:
    producers = {o.index: r for r in records if r.kind == "op" for o in r.outputs}
    inputs = {r.outputs[0].index: r for r in records if r.kind == "tensor"}
    input_refs = [r.outputs[0] for r in records if r.kind == "tensor" or (
        r.kind in ("scalar", "vector") and r.kw("is_input"))]  # fmt: skip
    input_pos = {ref.index: k for k, ref in enumerate(input_refs)}

    def closure(state: int, seen: dict) -> bool:
        """Whether `state` is a tensor input or views of one; collects the records."""
        if state in inputs:
            return True
        rec = producers.get(state)
        if rec is None or rec.name not in VIEW_OPS:
            return False
        if rec.name == "slice" and rec.kw("strides") is not None:
            return False  # a strided slice is a view in torch but nvFuser copies it
        seen[id(rec)] = rec
        tensor_arg = rec.args[0]
        return isinstance(tensor_arg, Ref) and closure(tensor_arg.index, seen)

    outputs = [r for r in records if r.kind == "output"]
    written_into = {r.args[0].index: input_pos[r.kw("alias_input").index]
                    for r in outputs if r.kw("alias_input") is not None}  # fmt: skip
    views, written = {}, {}
    returned = [r for r in outputs if r.kw("alias_input") is None]
    for pos, r in enumerate(returned):
        state = r.args[0].index
        if r.kw("stride_order") or r.args[0].kind != "T":
            continue
        if state in written_into:
            written[pos] = written_into[state]
            continue
        seen: dict = {}
        if closure(state, seen):
            # the view ops, and whatever makes scalars and vectors (their sizes), in order
            chain = tuple(rec for rec in records if id(rec) in seen or _makes_sizes(rec))
            views[pos] = (state, chain)
    all_views = bool(returned) and len(views) == len(returned) and not written_into
    return AliasPlan(views, written, all_views)


NO_ALIASES = AliasPlan({}, {}, False)


def _makes_sizes(rec: Record) -> bool:
    if rec.kind in ("scalar", "vector"):
        return not rec.kw("is_input")
    return rec.kind == "op" and bool(rec.outputs) and all(o.kind in "SV" for o in rec.outputs)


@functools.lru_cache(maxsize=4096)
def alias_plan(records: tuple[Record, ...]) -> AliasPlan:
    return _analyse(records)


def aliases_of(fd: Any) -> AliasPlan:
    """The alias plan of a user's fusion. A segment's definition returns fresh tensors: the
    segments after it declare what it hands them as contiguous, and the fusion around it
    makes its own returns views."""
    cached = fd.__dict__.get("_alias_plan_cache")
    if cached is not None and cached[0] == len(fd._records):
        return cached[1]
    plan = alias_plan(tuple(fd._records)) if getattr(fd, "_counted", True) else NO_ALIASES
    fd.__dict__["_alias_plan_cache"] = (len(fd._records), plan)  # records only grow
    return plan


def has_aliases(fd: Any) -> bool:
    plan = aliases_of(fd)
    return bool(plan.views or plan.written)


def view_outputs(fd: Any, values: Sequence[Any], outs: list) -> list:
    """`outs` with each output that aliases an input replaced by that input's memory
    (Note [Outputs that alias inputs]); `outs` may be None where all are views."""
    from .interpret import evaluate

    plan = aliases_of(fd)
    result = list(outs) if outs is not None else [None] * len(plan.views)
    for pos, input_pos in plan.written.items():
        result[pos] = values[input_pos]
    for pos, (state, chain) in plan.views.items():
        value = _run_chain(evaluate, fd, chain, values, state)
        if value is not None:
            result[pos] = value
    return result


def _run_chain(evaluate: Any, fd: Any, chain: tuple, values: Sequence[Any], state: int) -> Any:
    try:
        env = evaluate(chain, fd._infos, fd.input_refs(), values)
    except (RuntimeError, ValueError, KeyError, TypeError):
        return None  # sizes the chain cannot view: the kernel's (or reference's) copy stays
    value = env.get(state)
    if not isinstance(value, torch.Tensor):
        return None
    base = next((v for v in values if isinstance(v, torch.Tensor)
                 and v.untyped_storage().data_ptr() == value.untyped_storage().data_ptr()), None)  # fmt: skip
    return value if base is not None or value.numel() == 0 else None
