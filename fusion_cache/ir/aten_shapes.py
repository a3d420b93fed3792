"""Run-time output shapes of the ATen ops (fusion_cache/frontend/ops/aten.py), from their
inputs' shapes, for the shape evaluator (shape_eval.py): plain Python, no meta tensors."""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fusion_cache.frontend.records import Record

Shape = tuple[int, ...]
# (record, get: Ref or literal -> run-time value) -> one shape per output
ShapeRule = Callable[[Record, Callable[[Any], Any]], list[Shape]]


def _broadcast(a: Shape, b: Shape, op: str) -> Shape:
    rank = max(len(a), len(b))
    a, b = (1,) * (rank - len(a)) + a, (1,) * (rank - len(b)) + b
    out = []
    for x, y in zip(a, b):
        if x != y and 1 not in (x, y):
            raise ValueError(f"{op}: batch sizes {x} and {y} do not broadcast")
        out.append(y if x == 1 else x)
    return tuple(out)


def _contract(op: str, k1: int, k2: int) -> None:
    if k1 != k2:
        raise ValueError(f"{op}: contracted sizes {k1} and {k2} differ")


def _matmul(r: Record, get) -> list[Shape]:
    a, b = get(r.args[0]), get(r.args[1])
    xs = (1, *a) if len(a) == 1 else a
    ys = (*b, 1) if len(b) == 1 else b
    _contract("matmul", xs[-1], ys[-2])
    batch = _broadcast(xs[:-2], ys[:-2], "matmul")
    return [(*batch, *((xs[-2],) if len(a) > 1 else ()), *((ys[-1],) if len(b) > 1 else ()))]


def _bmm(r: Record, get) -> list[Shape]:
    a, b = get(r.args[0]), get(r.args[1])
    if a[0] != b[0]:
        raise ValueError(f"bmm: batch sizes {a[0]} and {b[0]} differ")
    _contract("bmm", a[2], b[1])
    return [(a[0], a[1], b[2])]


def _linear(r: Record, get) -> list[Shape]:
    x, w = get(r.args[0]), get(r.args[1])
    _contract("linear", x[-1], w[-1])
    return [(*x[:-1], *w[:-1])]


def _sdpfa_fwd(r: Record, get) -> list[Shape]:
    q, k, v = (get(a) for a in r.args[:3])
    if k[2] != v[2] or q[3] != k[3] or q[:2] != k[:2] or q[:2] != v[:2]:
        raise ValueError(f"sdpfa_fwd: query {list(q)}, key {list(k)} and value {list(v)} do "
                         "not fit [N, H, L, E], [N, H, S, E], [N, H, S, Ev]")  # fmt: skip
    return [(*q[:3], v[3]), tuple(q[:3]), (2,), ()]


def _sdpa_cudnn_fwd(r: Record, get) -> list[Shape]:
    out, lse, _, _ = _sdpfa_fwd(r, get)
    return [out, (*lse, 1), (), ()]


def _sdpa_efficient_fwd(r: Record, get) -> list[Shape]:
    from fusion_cache.frontend.ops.aten import efficient_lse_length

    out, lse, _, _ = _sdpfa_fwd(r, get)
    return [out, (*lse[:2], efficient_lse_length(lse[2])), (), ()]


def _sdpfa_bwd(r: Record, get) -> list[Shape]:
    return [tuple(get(a)) for a in r.args[1:4]]


def _grouped_mm(r: Record, get) -> list[Shape]:
    a, b, offs = (get(x) for x in r.args)
    if len(a) == 2 and len(b) == 2:
        _contract("grouped_mm", a[1], b[0])
        return [(offs[0], a[0], b[1])]
    if len(a) == 2:
        _contract("grouped_mm", a[1], b[1])
        return [(a[0], b[2])]
    _contract("grouped_mm", a[2], b[0])
    return [(a[1], b[1])]


def _scaled_mm(r: Record, get) -> list[Shape]:
    a, b = get(r.args[0]), get(r.args[1])
    _contract("scaled_mm", a[1], b[0])
    return [(a[0], b[1])]


def _same(r: Record, get) -> list[Shape]:
    return [tuple(get(r.args[0]))]


def _topk(r: Record, get) -> list[Shape]:
    x, k = get(r.args[0]), int(get(r.args[1]))
    d = r.kw("dim") % max(len(x), 1)
    if not 0 <= k <= (x[d] if x else 1):
        raise ValueError(f"topk: k={k} is out of range for dim {d} of size {x[d]}")
    shape = tuple(k if i == d else e for i, e in enumerate(x))
    return [shape, shape]


def _convolution(r: Record, get) -> list[Shape]:
    from fusion_cache.frontend.ops.convolution import check_conv_operands, conv_output_shape

    x, w = tuple(get(r.args[0])), tuple(get(r.args[1]))
    kw = dict(r.kwargs)
    check_conv_operands("convolution", x, w, kw)
    return [conv_output_shape(x, w, kw)]


def _convolution_backward(r: Record, get) -> list[Shape]:
    go, x, w = (tuple(get(a)) for a in r.args)
    grads = (x, w, (go[1],))
    return [g for g, m in zip(grads, r.kw("output_mask")) if m]


ATEN_SHAPES: dict[str, ShapeRule] = {
    "matmul": _matmul, "bmm": _bmm, "linear": _linear, "sdpfa_fwd": _sdpfa_fwd,
    "sdpfa_bwd": _sdpfa_bwd, "sdpa_cudnn_fwd": _sdpa_cudnn_fwd, "sdpa_cudnn_bwd": _sdpfa_bwd,
    "sdpa_efficient_fwd": _sdpa_efficient_fwd, "sdpa_efficient_bwd": _sdpfa_bwd,
    "grouped_mm": _grouped_mm, "scaled_mm": _scaled_mm, "cumsum": _same, "argsort": _same,
    "topk": _topk, "convolution": _convolution, "convolution_backward": _convolution_backward,
}  # fmt: skip
