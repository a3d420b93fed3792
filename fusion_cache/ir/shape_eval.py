"""Run-time shapes of a fusion's tensors from its inputs' sizes, without touching data.

The plan path needs output shapes and the same size checks the reference evaluator makes;
evaluating on torch meta tensors would do it but pulls in torch's tracing stack (seconds on
first use), so the ops the kernel schedulers accept are shaped here in plain Python.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch

from fusion_cache.frontend.ops.table import OPS, promoted_dtype, scalar_result
from fusion_cache.frontend.records import Record, Ref
from fusion_cache.frontend.values import ScalarInfo

from .aten_shapes import ATEN_SHAPES
from .view import reshape_shape

if TYPE_CHECKING:
    from fusion_cache.frontend.definition import FusionDefinition


class ShapeUnknown(Exception):
    """An op this evaluator does not shape; the caller falls back to another route."""


def _broadcast(r: Record, infos: list, shapes: list[tuple | None]) -> tuple[int, ...]:
    tensors = [(infos[a.index], s) for a, s in zip(r.args, shapes) if s is not None]
    rank = max((len(s) for _, s in tensors), default=0)
    out = []
    for pos in range(rank):
        size = 1
        seen = None
        for info, s in tensors:
            d = pos - rank + len(s)
            if d < 0 or info.shape[d] == 1:
                continue
            if seen is not None and s[d] != seen:
                raise ValueError(
                    f"{r.name} ({', '.join(map(str, r.outputs))}): sizes {seen} and {s[d]} meet at "
                    f"dim {pos}; only dims declared broadcast (size 1) in the definition broadcast"
                )
            seen = s[d]
        if seen is not None:
            size = seen
        out.append(size)
    return tuple(out)


def evaluate_shapes(records: Sequence[Record], infos: list, input_refs: Sequence[Ref],
                    values: Sequence[Any]) -> dict[int, Any]:  # fmt: skip
    """State index -> a tensor's shape (tuple), a scalar's value, or a vector's sizes."""
    env: dict[int, Any] = {}
    for ref, v in zip(input_refs, values):
        env[ref.index] = tuple(v.shape) if ref.kind == "T" else v

    def get(v: Any) -> Any:
        if isinstance(v, Ref):
            return env[v.index]
        if isinstance(v, tuple):
            return tuple(get(x) for x in v)
        return v

    def sizes(v: Any) -> list[int]:
        return [int(x) for x in get(v)]

    for r in records:
        if r.kind == "scalar" and not r.kw("is_input"):
            env[r.outputs[0].index] = r.kw("value")
        elif r.kind == "vector" and not r.kw("is_input"):
            env[r.outputs[0].index] = tuple(int(get(e)) for e in r.kw("elements"))
        elif r.kind == "op" and r.name in ATEN_SHAPES:
            for o, shape in zip(r.outputs, ATEN_SHAPES[r.name](r, get)):
                env[o.index] = shape
        elif r.kind == "op":
            shape = _shape_op(r, infos, env, get, sizes)
            for o in r.outputs if r.name in _REDUCTIONS else r.outputs[:1]:
                env[o.index] = shape
    return env


def _shape_op(r: Record, infos: list, env: dict, get, sizes) -> Any:
    name = r.name
    out_info = infos[r.outputs[0].index]
    if name in OPS or name == "cast":
        if isinstance(out_info, ScalarInfo):  # scalar arithmetic, e.g. sizes for a reshape
            if name == "cast":
                return scalar_result(get(r.args[0]), out_info.dtype)
            spec = OPS[name]
            compute = promoted_dtype(spec, [infos[a.index] for a in r.args])
            return scalar_result(spec.torch_fn(*(get(a) for a in r.args), dtype=compute),
                                 out_info.dtype)  # fmt: skip
        shapes = [get(a) if a.kind == "T" else None for a in r.args]
        return _broadcast(r, infos, shapes)
    if name in _REDUCTIONS:
        return _reduced_shape(r, get(r.args[0]))
    if len(r.outputs) != 1:
        raise ShapeUnknown(name)
    x = get(r.args[0]) if r.args and isinstance(r.args[0], Ref) else None
    if name == "size":
        return int(x[r.kw("dim")])
    if name == "shape":
        return tuple(x)
    if name == "broadcast":
        it = iter(x)
        return tuple(1 if flag else next(it) for flag in r.kw("is_broadcast_dim"))
    if name in ("broadcast_in_dim", "expand"):
        target = sizes(r.kw("shape"))
        if any(t < -1 for t in target):
            raise ValueError(f"{name} ({r.outputs[0]}): shape {target} has a negative size "
                             "(-1 keeps the input's size)")  # fmt: skip
        if name == "expand":
            bdims = list(range(len(target)))
        else:
            bdims = [d % len(target) for d in r.kw("broadcast_dims")]
        for src, dst in enumerate(bdims):
            if target[dst] == -1:
                target[dst] = x[src]
            elif x[src] != 1 and x[src] != target[dst]:
                raise ValueError(f"{name}: cannot broadcast {list(x)} to {target}")
        return tuple(target)
    if name == "permute":
        return tuple(x[d % len(x)] for d in r.kw("dims"))
    if name == "squeeze":
        dims = {d % len(x) for d in r.kw("dims")}
        for d in dims:
            if x[d] != 1:
                raise ValueError(f"squeeze: dim {d} has size {x[d]} at run time, not 1")
        return tuple(e for i, e in enumerate(x) if i not in dims)
    if name == "iota":
        return (int(get(r.args[0])),)
    if name == "full":
        shape = tuple(sizes(r.kw("shape")))
        if any(n < 0 for n in shape):
            raise ValueError(f"full ({r.outputs[0]}): shape {list(shape)} has a negative size")
        return shape
    if name in ("uniform", "normal"):
        return tuple(sizes(r.args[2]))
    if name in ("rand_like", "randn_like"):
        return tuple(x)
    if name == "reshape":
        return reshape_shape(f"reshape ({r.outputs[0]})", out_info.ndim, x, sizes(r.kw("new_shape")))
    raise ShapeUnknown(name)


_REDUCTIONS = {"sum", "prod", "max", "min", "var", "var_mean", "welford"}


def _reduced_shape(r: Record, x: tuple[int, ...]) -> Any:
    """The shape of every output of a reduction (welford's count included)."""
    rank = max(len(x), 1)
    axes = {d % rank for d in r.kw("dims")}
    if r.kw("keepdim", False):
        shape = tuple(1 if d in axes else e for d, e in enumerate(x))
    else:
        shape = tuple(e for d, e in enumerate(x) if d not in axes)
    return shape


def _meta(v: Any) -> Any:
    if isinstance(v, torch.Tensor):
        return torch.empty_strided(v.shape, v.stride(), dtype=v.dtype, device="meta")
    return v


def runtime_shapes(fd: FusionDefinition, values: Sequence[Any]) -> dict:
    """Every state's run-time shape (or value) for these inputs."""
    try:
        return evaluate_shapes(fd._records, fd._infos, fd.input_refs(), values)
    except ShapeUnknown:  # an op the shape evaluator lacks: torch's meta kernels shape it
        from .interpret import evaluate

        env = evaluate(fd._records, fd._infos, fd.input_refs(), [_meta(v) for v in values],
                       torch.device("meta"))  # fmt: skip
        return {k: tuple(v.shape) if isinstance(v, torch.Tensor) else v for k, v in env.items()}
