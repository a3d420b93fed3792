"""The reference evaluator: computes a fusion with torch ops, on CPU or CUDA tensors.

It runs CPU inputs, serves as the fallback when no kernel can be made, and is the oracle
the GPU tests compare against. It checks at run time what the definition left symbolic
(sizes of non-broadcast dims that must agree, squeezed dims that must be 1).
"""
from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import torch

from fusion_cache.frontend.dtypes import to_torch
from fusion_cache.frontend.ops import promoted_dtype
from fusion_cache.frontend.ops.table import OPS, scalar_result
from fusion_cache.frontend.records import Record, Ref
from fusion_cache.frontend.values import TensorInfo
from fusion_cache.ir.shape_eval import reshape_shape

if TYPE_CHECKING:
    from fusion_cache.frontend.definition import FusionDefinition

Env = dict[int, Any]


class _Run:
    def __init__(self, records: Sequence[Record], infos: list, device: torch.device) -> None:
        self.records, self.infos, self.device = records, infos, device
        self.env: Env = {}

    def get(self, v: Any) -> Any:
        if isinstance(v, Ref):
            return self.env[v.index]
        if isinstance(v, tuple):
            return tuple(self.get(x) for x in v)
        return v

    def sizes(self, v: Any, like: torch.Tensor | None = None, keep: Sequence[int] = ()) -> list[int]:
        return [int(x) for x in (self.get(v) if not isinstance(v, Ref) else self.env[v.index])]


def _check_same_sizes(r: Record, infos: list, values: list) -> None:
    tensors = [(infos[a.index], v) for a, v in zip(r.args, values) if isinstance(v, torch.Tensor)]
    rank = max((t.dim() for _, t in tensors), default=0)
    for pos in range(rank):
        seen: dict[int, int] = {}
        for info, t in tensors:
            d = pos - rank + t.dim()
            if d < 0 or info.shape[d] == 1:
                continue
            seen.setdefault(t.shape[d], d)
        if len(seen) > 1:
            a, b = list(seen)[:2]
            raise ValueError(
                f"{r.name} ({', '.join(map(str, r.outputs))}): sizes {a} and {b} meet at dim {pos}; "
                "only dims declared broadcast (size 1) in the definition broadcast"
            )


def _elementwise(run: _Run, r: Record) -> list:
    spec = OPS[r.name]
    values = [run.get(a) for a in r.args]
    infos = [run.infos[a.index] for a in r.args]
    _check_same_sizes(r, run.infos, values)
    compute = promoted_dtype(spec, infos)
    out_info = run.infos[r.outputs[0].index]
    result = spec.torch_fn(*values, dtype=compute)
    if isinstance(out_info, TensorInfo):
        return [result.to(to_torch(out_info.dtype))]
    return [scalar_result(result, out_info.dtype)]


def _reduction(run: _Run, r: Record) -> list:
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
    fn = torch.amax if r.name == "max" else torch.amin
    return [fn(x, dims, keepdim=keepdim).to(out_dtype)]


def _stats(run: _Run, r: Record) -> list:
    x = run.get(r.args[0])
    dims = sorted({d % x.dim() for d in r.kw("dims")})
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


def _batch_norm(run: _Run, r: Record) -> list:
    x, w, b, rm, rv, momentum, eps = (run.get(a) if a is not None else None for a in r.args)
    training = run.get(r.kw("training"))
    channels_last = r.kw("channels_last")
    if channels_last:  # channels are the last logical dim: move them to dim 1 for torch
        x = x.movedim(-1, 1)
    out, mean, invstd = torch.native_batch_norm(
        x, w, b, rm, rv, bool(training), float(momentum), float(eps)
    )
    if channels_last:
        out = out.movedim(1, -1)
    return [out, mean, invstd]


def _broadcast(run: _Run, r: Record) -> list:
    x = run.get(r.args[0])
    index = tuple(None if flag else slice(None) for flag in r.kw("is_broadcast_dim"))
    return [x[index]]


def _resolve_sizes(run: _Run, value: Any) -> list[int]:
    return [int(v) for v in run.get(value)]


def _broadcast_in_dim(run: _Run, r: Record) -> list:
    x = run.get(r.args[0])
    shape = _resolve_sizes(run, r.kw("shape"))
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


def _expand(run: _Run, r: Record) -> list:
    x = run.get(r.args[0])
    shape = _resolve_sizes(run, r.kw("shape"))
    try:
        return [x.expand(shape)]
    except RuntimeError as err:
        raise ValueError(f"expand: cannot expand {list(x.shape)} to {shape}: {err}") from None


def _reshape(run: _Run, r: Record) -> list:
    x = run.get(r.args[0])
    rank = run.infos[r.outputs[0].index].ndim
    return [x.reshape(reshape_shape(r, rank, x.shape, _resolve_sizes(run, r.kw("new_shape"))))]


def _squeeze(run: _Run, r: Record) -> list:
    x = run.get(r.args[0])
    dims = [d % x.dim() for d in r.kw("dims")]
    for d in dims:
        if x.shape[d] != 1:
            raise ValueError(f"squeeze: dim {d} has size {x.shape[d]} at run time, not 1")
    return [x.squeeze(tuple(dims)) if dims else x]


def _slice(run: _Run, r: Record) -> list:
    x = run.get(r.args[0])
    starts = _resolve_sizes(run, r.kw("start_indices"))
    ends = _resolve_sizes(run, r.kw("end_indices"))
    steps = [1] * x.dim() if r.kw("strides") is None else _resolve_sizes(run, r.kw("strides"))
    return [x[tuple(slice(a, b, k) for a, b, k in zip(starts, ends, steps))]]


def _pad(run: _Run, r: Record) -> list:
    x = run.get(r.args[0])
    widths = _resolve_sizes(run, r.kw("pad_widths"))
    value = run.get(r.kw("value")) if r.kw("value") is not None else 0
    if x.dtype == torch.bool:
        value = bool(value)
    return [torch.nn.functional.pad(x, widths, mode="constant", value=value)]


def _cat(run: _Run, r: Record) -> list:
    tensors = [run.get(a) for a in r.args[0]]
    dtype = to_torch(run.infos[r.outputs[0].index].dtype)
    return [torch.cat([t.to(dtype) for t in tensors], dim=r.kw("dim"))]


def _cast(run: _Run, r: Record) -> list:
    x = run.get(r.args[0])
    dt = r.kw("dtype")
    if isinstance(x, torch.Tensor):
        return [x.to(to_torch(dt))]
    return [scalar_result(torch.tensor(x).to(to_torch(dt)), dt)]


def _full(run: _Run, r: Record) -> list:
    shape = _resolve_sizes(run, r.kw("shape"))
    return [torch.full(shape, run.get(r.kw("fill_value")), dtype=to_torch(r.kw("dtype")), device=run.device)]


def _iota(run: _Run, r: Record) -> list:
    n, start, step = (run.get(a) for a in r.args)
    dt = to_torch(r.kw("dtype"))
    base = torch.arange(int(n), dtype=torch.float64 if dt.is_floating_point else torch.int64,
                        device=run.device)  # fmt: skip
    return [(base * step + start).to(dt)]


def _permute(run: _Run, r: Record) -> list:
    return [run.get(r.args[0]).permute(*r.kw("dims"))]


def _size(run: _Run, r: Record) -> list:
    return [int(run.get(r.args[0]).shape[r.kw("dim")])]


def _shape(run: _Run, r: Record) -> list:
    return [tuple(int(s) for s in run.get(r.args[0]).shape)]


SPECIAL: dict[str, Callable[[_Run, Record], list]] = {
    "sum": _reduction, "prod": _reduction, "max": _reduction, "min": _reduction,
    "var": _stats, "var_mean": _stats, "welford": _stats, "batch_norm": _batch_norm,
    "broadcast": _broadcast, "broadcast_in_dim": _broadcast_in_dim, "expand": _expand,
    "reshape": _reshape, "permute": _permute, "squeeze": _squeeze, "slice": _slice,
    "pad": _pad, "cat": _cat, "cast": _cast, "full": _full, "iota": _iota, "size": _size,
    "shape": _shape,
}  # fmt: skip


def _device_of(values: Sequence[Any]) -> torch.device:
    for v in values:
        if isinstance(v, torch.Tensor) and not (v.device.type == "cpu" and v.dim() == 0):
            return v.device
    return torch.device("cpu")


def evaluate(records: Sequence[Record], infos: list, input_refs: Sequence[Ref],
             values: Sequence[Any]) -> Env:  # fmt: skip
    """Run every record; returns the environment of state index -> value."""
    run = _Run(records, infos, _device_of(values))
    for ref, v in zip(input_refs, values):
        run.env[ref.index] = v
    for r in records:
        if r.kind == "scalar" and not r.kw("is_input"):
            run.env[r.outputs[0].index] = r.kw("value")
        elif r.kind == "vector" and not r.kw("is_input"):
            run.env[r.outputs[0].index] = tuple(int(run.get(e)) for e in r.kw("elements"))
        elif r.kind == "op":
            impl = SPECIAL.get(r.name, _elementwise)
            for ref, value in zip(r.outputs, impl(run, r)):
                run.env[ref.index] = value
    return run.env


def run_reference(fd: FusionDefinition, values: Sequence[Any]) -> list[Any]:
    env = evaluate(fd._records, fd._infos, fd.input_refs(), values)
    return collect_outputs(fd, env, values)


def collect_outputs(fd: FusionDefinition, env: Env, values: Sequence[Any]) -> list[Any]:
    """Apply aliases and output stride orders; return the non-aliased outputs in order."""
    input_storages = {
        v.untyped_storage().data_ptr() for v in values if isinstance(v, torch.Tensor) and v.numel()
    }
    results = []
    for r in fd.output_records():
        value = env[r.args[0].index]
        alias = r.kw("alias_input")
        if alias is not None:
            env[alias.index].copy_(value)
            continue
        if not isinstance(value, torch.Tensor):
            results.append(torch.tensor(value, dtype=to_torch(fd._infos[r.args[0].index].dtype)))
            continue
        order = r.kw("stride_order")
        if order:
            results.append(_with_stride_order(value, order))
        elif value.numel() and value.untyped_storage().data_ptr() in input_storages:
            results.append(value.clone(memory_format=torch.contiguous_format))
        else:
            results.append(value.contiguous())
    return results


def _with_stride_order(value: torch.Tensor, order: Sequence[int]) -> torch.Tensor:
    n = value.dim()
    strides = [0] * n
    acc = 1
    for d in sorted(range(n), key=lambda d: order[d]):
        strides[d] = acc
        acc *= max(value.shape[d], 1)
    out = torch.empty_strided(value.shape, strides, dtype=value.dtype, device=value.device)
    out.copy_(value)
    return out



