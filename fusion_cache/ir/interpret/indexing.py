"""Rules of the ops that read or write by position: select, index_select, gather,
take_along_axis, scatter, index_put_accumulate, embedding_fwd, and of tensor_sizes/at.

Out-of-range indices raise IndexError naming the op and the index, as torch raises on the
CPU; a float index is truncated toward zero (frontend/ops/indexing.py says why).
"""
from __future__ import annotations

import torch

from fusion_cache.frontend.records import Record
from fusion_cache.frontend.shapes import normalize_index

from .core import Interpreter, rule


def check_indices(r: Record, index: torch.Tensor, size: int, what: str = "index") -> torch.Tensor:
    """`index` as int64, every entry in [0, size)."""
    index = index.to(torch.int64)
    if index.numel():
        lo, hi = int(index.min()), int(index.max())
        bad = lo if lo < 0 else hi if hi >= size else None
        if bad is not None:
            raise IndexError(f"{r.name} ({r.outputs[0]}): {what} {bad} is out of range for a dim "
                             f"of size {size}")  # fmt: skip
    return index


@rule('select')
def _select(run: Interpreter, r: Record) -> list:
    x, index = run.get(r.args[0]), int(run.get(r.args[1]))
    d = r.kw("dim") % x.dim()
    k = normalize_index(f"select ({r.outputs[0]})", "index", index, x.shape[d])
    return [x.select(d, k)]


@rule('index_select')
def _index_select(run: Interpreter, r: Record) -> list:
    x, index = run.get(r.args[0]), run.get(r.args[1])
    d = r.kw("dim") % x.dim()
    index = check_indices(r, index, x.shape[d]).reshape(-1)
    return [torch.index_select(x, d, index)]


@rule('gather', 'take_along_axis')
def _gather(run: Interpreter, r: Record) -> list:
    x, index = run.get(r.args[0]), run.get(r.args[1])
    d = r.kw("dim") % x.dim()
    index = check_indices(r, index, x.shape[d])
    for k, (a, b) in enumerate(zip(x.shape, index.shape)):
        if k == d or a == b:
            continue
        if r.name == "gather" and b > a or r.name == "take_along_axis" and 1 not in (a, b):
            raise ValueError(f"{r.name} ({r.outputs[0]}): index has size {b} at dim {k}, the "
                             f"indexed tensor {a}")  # fmt: skip
    if r.name == "gather":
        return [torch.gather(x, d, index)]
    return [torch.take_along_dim(x, index, d)]


@rule('scatter')
def _scatter(run: Interpreter, r: Record) -> list:
    x, index, src = (run.get(a) for a in r.args)
    d = r.kw("dim") % x.dim()
    index = check_indices(r, index, x.shape[d])
    return [torch.scatter(x, d, index, src)]


@rule('index_put_accumulate')
def _index_put_accumulate(run: Interpreter, r: Record) -> list:
    acc, index, value = (run.get(a) for a in r.args)
    index = check_indices(r, index, acc.shape[0])
    value = value.expand((index.shape[0],) + tuple(acc.shape[1:]))
    return [acc.index_put((index,), value, accumulate=True)]


@rule('embedding_fwd')
def _embedding_fwd(run: Interpreter, r: Record) -> list:
    index, weight = run.get(r.args[0]), run.get(r.args[1])
    index = check_indices(r, index, weight.shape[0], "input index")
    max_norm = r.kw("max_norm")
    if max_norm is None:
        return [torch.nn.functional.embedding(index, weight)]
    norm_type = r.kw("norm_type")
    p = 2.0 if norm_type is None else float(run.get(norm_type))
    # torch renormalizes the weight's rows in place; the fusion is functional: a copy
    rows = weight.detach().clone()
    return [torch.nn.functional.embedding(index, rows, max_norm=float(run.get(max_norm)),
                                          norm_type=p)]  # fmt: skip


@rule('tensor_sizes')
def _tensor_sizes(run: Interpreter, r: Record) -> list:
    return [int(s) for s in run.get(r.args[0]).shape]


@rule('at')
def _at(run: Interpreter, r: Record) -> list:
    vec = run.get(r.args[0])
    return [int(vec[normalize_index(f"at ({r.outputs[0]})", "index", r.kw("index"), len(vec))])]
