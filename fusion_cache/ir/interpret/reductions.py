"""Rules of the reductions and statistics: sum, prod, max, min, var, var_mean, welford."""
from __future__ import annotations

import math

import torch

from fusion_cache.frontend.dtypes import to_torch
from fusion_cache.frontend.records import Record

from .core import Interpreter, rule


@rule('sum', 'prod', 'max', 'min')
def _reduction(run: Interpreter, r: Record) -> list:
    x = run.get(r.args[0])
    out_dtype = to_torch(run.infos[r.outputs[0].index].dtype)
    dims = sorted({d % x.dim() for d in r.kw("dims")}) if x.dim() else []
    keepdim = r.kw("keepdim")
    if not dims:
        return [x.to(out_dtype).clone()]
    if r.name == "sum":
        return [torch.sum(x, dims, keepdim=keepdim, dtype=out_dtype)]
    if r.name == "prod":
        y = x.to(out_dtype)
        for d in reversed(dims):
            y = torch.prod(y, d, keepdim=keepdim)
        return [y]
    if any(x.shape[d] == 0 for d in dims):  # Note [Empty reductions]: the identity
        from fusion_cache.ir.empty_reductions import identity

        shape = [1 if d in dims else n for d, n in enumerate(x.shape)]
        full = torch.full(shape, identity(r.name, run.infos[r.outputs[0].index].dtype),
                          dtype=out_dtype, device=x.device)  # fmt: skip
        return [full if keepdim else full.squeeze(dims)]
    fn = torch.amax if r.name == "max" else torch.amin
    return [fn(x, dims, keepdim=keepdim).to(out_dtype)]


@rule('var', 'var_mean', 'welford')
def _stats(run: Interpreter, r: Record) -> list:
    x = run.get(r.args[0])
    dims = sorted({d % x.dim() for d in r.kw("dims")})
    if not dims and r.name != "welford":
        # over no dims each element is its own mean: the shape stays (as sum(dims=[]) keeps
        # it) and the variance is 0 / (1 - correction), as nvFuser computes it; torch would
        # read [] as every dim
        var = (x - x) * (x - x) / (1 - r.kw("correction"))
        return [var] if r.name == "var" else [var, x.clone()]
    if r.name == "var":
        return [torch.var(x, dims, correction=r.kw("correction"), keepdim=r.kw("keepdim"))]
    if r.name == "var_mean":
        var, mean = torch.var_mean(x, dims, correction=r.kw("correction"), keepdim=r.kw("keepdim"))
        return [var, mean]
    mean = torch.mean(x, dims, keepdim=True)
    var_sum = torch.sum((x - mean) ** 2, dims)
    count = math.prod(x.shape[d] for d in dims)
    mean = mean.squeeze(dims) if dims else mean
    return [mean, var_sum, torch.full_like(mean, count, dtype=torch.int64)]
