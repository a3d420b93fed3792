"""Rules of the view and shape ops: broadcasts, expand, reshape, permute, squeeze, size, shape."""
from __future__ import annotations

import torch

from fusion_cache.frontend.records import Record
from fusion_cache.ir.view import reshape_shape

from .core import Interpreter, rule


@rule('broadcast')
def _broadcast(run: Interpreter, r: Record) -> list:
    x = run.get(r.args[0])
    index = tuple(None if flag else slice(None) for flag in r.kw("is_broadcast_dim"))
    return [x[index]]


@rule('broadcast_in_dim')
def _broadcast_in_dim(run: Interpreter, r: Record) -> list:
    x = run.get(r.args[0])
    shape = run.sizes(r.kw("shape"))
    bdims = [d % len(shape) for d in r.kw("broadcast_dims")]
    view = [1] * len(shape)
    for src, dst in enumerate(bdims):
        view[dst] = x.shape[src]
        if shape[dst] == -1:
            shape[dst] = x.shape[src]
    try:
        return [x.reshape(view).expand(shape)]
    except RuntimeError as err:
        raise ValueError(f"broadcast_in_dim: cannot broadcast {list(x.shape)} to {shape}: {err}") from None


@rule('expand')
def _expand(run: Interpreter, r: Record) -> list:
    x = run.get(r.args[0])
    shape = run.sizes(r.kw("shape"))
    try:
        return [x.expand(shape)]
    except RuntimeError as err:
        raise ValueError(f"expand: cannot expand {list(x.shape)} to {shape}: {err}") from None


@rule('reshape')
def _reshape(run: Interpreter, r: Record) -> list:
    x = run.get(r.args[0])
    rank = run.infos[r.outputs[0].index].ndim
    return [x.reshape(reshape_shape(f"reshape ({r.outputs[0]})", rank, x.shape,
                                    run.sizes(r.kw("new_shape"))))]


@rule('permute')
def _permute(run: Interpreter, r: Record) -> list:
    return [run.get(r.args[0]).permute(*r.kw("dims"))]


@rule('squeeze')
def _squeeze(run: Interpreter, r: Record) -> list:
    x = run.get(r.args[0])
    dims = [d % x.dim() for d in r.kw("dims")]
    for d in dims:
        if x.shape[d] != 1:
            raise ValueError(f"squeeze: dim {d} has size {x.shape[d]} at run time, not 1")
    return [x.squeeze(tuple(dims)) if dims else x]


@rule('size')
def _size(run: Interpreter, r: Record) -> list:
    return [int(run.get(r.args[0]).shape[r.kw("dim")])]


@rule('shape')
def _shape(run: Interpreter, r: Record) -> list:
    return [tuple(int(s) for s in run.get(r.args[0]).shape)]


@rule('stride_order')
def _stride_order(run: Interpreter, r: Record) -> list:
    # the values are the input's; an output's layout is collect_outputs' business
    # (Note [Output layouts])
    return [run.get(r.args[0])]


@rule('triu')
def _triu(run: Interpreter, r: Record) -> list:
    return [torch.triu(run.get(r.args[0]), r.kw("diagonal"))]
