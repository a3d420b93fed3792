"""The benchmark suite: each case is a fusion written with the public API plus its torch twin.

A case is one (op, dtype, shape). `define` adds inputs, ops and outputs to a FusionDefinition;
`eager` computes the same outputs with torch from the same inputs, in the same order, the way
a user would write it without us. The runner picks cases by family, so the reduction and
normalization cases written here for the next issue are switched on by asking for them.

16-bit cases follow what nvFuser's users (Thunder) emit: cast the inputs up to f32, compute,
cast the outputs down once. The correctness reference therefore runs eager on f32 copies of
the inputs (see `Case.reference`), so the check measures the fusion's error rather than
eager's per-op bf16 rounding.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from functools import cached_property
from typing import Any

import torch
import torch.nn.functional as F

from .resize_cases import MOVED, RESIZE, SIZE_MATCHED

Shape = tuple[int, ...]
Tensors = list[torch.Tensor]
DefineFn = Callable[[Any, torch.dtype, Shape], None]  # (fd, dtype, shape) -> None
InputsFn = Callable[[Shape, torch.dtype, Any], Tensors]  # (shape, dtype, device) -> inputs
EagerFn = Callable[..., Any]  # (*inputs) -> Tensor or tuple of Tensors

FAMILIES = ("pointwise", "reduction", "normalization", "host", "aten", "resize", "layouts")
DTYPES = (torch.float32, torch.bfloat16)
LARGE_BYTES = 256 * 2**20  # "a large size" in PERFORMANCE.md's first target
EPS = 1e-5
BN_MOMENTUM = 0.1

POINTWISE_SHAPES: tuple[Shape, ...] = ((1024, 1024), (4096, 4096), (16384, 4096))
# Rows from 262144 down to 256, always 2**26 elements (256 MiB of f32 per tensor).
ROW_LENGTHS = (256, 1024, 4096, 16384, 65536, 262144)
REDUCTION_SHAPES: tuple[Shape, ...] = tuple((2**26 // n, n) for n in ROW_LENGTHS)
BATCH_NORM_SHAPES: tuple[Shape, ...] = ((32, 256, 56, 56), (256, 64, 28, 28))
HOST_SHAPE: Shape = (8, 8)
# issue 28: transposes, reductions over middle and every dim, short rows
ATTENTION_SHAPE: Shape = (8, 2048, 32, 128)  # [B, T, H, D]
MIDDLE_SHAPES: tuple[Shape, ...] = ((64, 4096, 1024), (8, 16384, 4096))
SHORT_ROW_SHAPES: tuple[Shape, ...] = ((2097152, 32), (524288, 128))


def short_dtype(dtype: torch.dtype) -> str:
    return {torch.float32: "f32", torch.bfloat16: "bf16", torch.float16: "f16"}[dtype]


def as_list(outputs: Any) -> Tensors:
    return [outputs] if isinstance(outputs, torch.Tensor) else list(outputs)


def _tolerance(dtype: torch.dtype, family: str) -> tuple[float, float]:
    """(atol in units of the output's mean |value|, rtol). Scaling atol keeps it meaningful
    both for a softmax row of 1/262144 and for a sum of 262144 values."""
    if dtype == torch.float32:
        return (1e-5, 1e-5) if family in ("pointwise", "host") else (1e-4, 1e-4)
    return 1e-2, 1.6e-2  # one bf16 rounding of an f32 result, with room for f32 noise


@dataclass(frozen=True)
class Case:
    name: str
    op: str  # the case's group: same op, other dtypes and shapes
    family: str
    dtype: torch.dtype
    shape: Shape
    define: DefineFn
    eager: EagerFn
    make_inputs: InputsFn
    atol: float
    rtol: float
    # for random cases: the reference from the inputs and the fusion's own outputs (eager
    # on the fusion's dropout mask), as eager draws other numbers
    replay: Callable[[Tensors, Tensors], Tensors] | None = None
    # (inputs, outputs) -> the bytes the op must move, where that is not every input read
    # once and every output written once (a gather reads only the rows it picks)
    moved: Callable[[Tensors, Tensors], int] | None = None
    # Note [Error against eager's own]: judged by eager's error instead of a tolerance
    by_eager_error: bool = False
    # also time a copy of the case's own bytes in the same rounds (benchmarks.run: the bound a
    # kernel of that size meets under the same timer); reported beside, judged by nothing
    size_matched: bool = False

    @cached_property
    def bytes_moved(self) -> int:
        """Bytes of every input read once plus every output written once (or the case's
        own count, `moved`); shapes come from running eager on the meta device, so nothing
        is allocated."""
        inputs = self.make_inputs(self.shape, self.dtype, "meta")
        outputs = as_list(self.eager(*inputs))
        if self.moved is not None:
            return self.moved(inputs, outputs)
        return sum(t.numel() * t.element_size() for t in [*inputs, *outputs])

    @property
    def large(self) -> bool:
        return self.bytes_moved >= LARGE_BYTES

    def inputs(self, device: Any, shape: Shape | None = None) -> Tensors:
        """Fresh random inputs; `shape` overrides the case's (the CPU test uses small ones)."""
        return self.make_inputs(shape or self.shape, self.dtype, device)

    def build(self, shape: Shape | None = None) -> Any:
        """The case's FusionDefinition, built through the public API only."""
        from fusion_cache import FusionDefinition

        with FusionDefinition() as fd:
            self.define(fd, self.dtype, shape or self.shape)
        return fd

    def reference(self, inputs: Sequence[torch.Tensor],
                  outputs: Sequence[torch.Tensor] | None = None) -> Tensors:  # fmt: skip
        """Eager on f32 copies of the inputs, rounded to the dtypes eager itself returns; a
        random case replays eager on the fusion's `outputs` (its mask) instead."""
        if self.replay is not None:
            return as_list(self.replay(list(inputs), as_list(outputs)))
        wide = [t.float() if t.is_floating_point() else t for t in inputs]
        dtypes = [o.dtype for o in as_list(self.eager(*[t.to("meta") for t in inputs]))]
        return [o.to(d) for o, d in zip(as_list(self.eager(*wide)), dtypes)]

    def check(self, inputs: Sequence[torch.Tensor],
              outputs: Sequence[torch.Tensor]) -> tuple[float | None, str | None]:  # fmt: skip
        """(max abs error, why the outputs are wrong or None): the check benchmarks.run makes."""
        if self.by_eager_error and self.replay is None:
            return compare_by_eager_error(outputs, self.eager, inputs, self.dtype)
        return self.compare(outputs, self.reference(inputs, outputs))

    def compare(
        self, outputs: Sequence[torch.Tensor], reference: Sequence[torch.Tensor]
    ) -> tuple[float | None, str | None]:
        """(max abs error over all outputs, why they are out of tolerance or None)."""
        outputs = as_list(outputs)
        if len(outputs) != len(reference):
            return None, f"{len(outputs)} outputs, expected {len(reference)}"
        max_err, problems = 0.0, []
        for i, (out, ref) in enumerate(zip(outputs, reference)):
            if out.shape == ref.shape and out.numel():
                max_err = max(max_err, (out.float() - ref.float()).abs().max().item())
            scale = ref.float().abs().mean().item() if ref.numel() else 1.0
            try:
                torch.testing.assert_close(
                    out, ref, atol=self.atol * (scale or 1.0), rtol=self.rtol
                )
            except AssertionError as e:
                problems.append(f"output {i}: {e}")
        return (max_err if math.isfinite(max_err) else None), ("\n".join(problems) or None)


# Note [Error against eager's own]: a fusion of several ops in 16 bits (a layer norm, a GEMM,
# attention, another GEMM) rounds its intermediates as eager does, and each rounding moves the
# result; a fixed tolerance against an f32 run then fails on a few elements of millions
# (the attention block's 4 of 6291456 on the H100) while eager itself would fail it too. So
# these cases compute an exact answer (eager on f32 copies of a 16-bit case's inputs, f64
# copies of an f32 case's: a reference whose own error is far below either result's) and accept the
# fusion's result when its error, largest and mean, is within ERROR_MULTIPLE of eager's own
# error on the same inputs in the same dtype, plus an ulp at the statistic's scale (one f32
# value rounded the other way, where eager rounds its f32 result once).
ERROR_MULTIPLE = 2.0


def compare_by_eager_error(outputs: Sequence[torch.Tensor], eager: EagerFn,
                           inputs: Sequence[torch.Tensor], dtype: torch.dtype,
                           ) -> tuple[float | None, str | None]:  # fmt: skip
    """(max abs error of `outputs` against the wide answer, why they are worse than eager's
    own result or None); integer and bool outputs must equal eager's."""
    outputs = as_list(outputs)
    wide = torch.float64 if dtype == torch.float32 else torch.float32
    exact = as_list(eager(*[t.to(wide) if t.is_floating_point() else t for t in inputs]))
    ours_eager = as_list(eager(*inputs))
    if len(outputs) != len(exact):
        return None, f"{len(outputs)} outputs, expected {len(exact)}"
    max_err, problems = 0.0, []
    for i, (out, want, theirs) in enumerate(zip(outputs, exact, ours_eager)):
        if out.shape != want.shape or out.dtype != theirs.dtype:
            problems.append(f"output {i}: {out.dtype} {list(out.shape)}, eager gives "
                            f"{theirs.dtype} {list(want.shape)}")  # fmt: skip
            continue
        if not out.is_floating_point():
            if not torch.equal(out, theirs):
                problems.append(f"output {i}: differs from eager's")
            continue
        if not out.numel():
            continue
        ours_err = (out.double() - want).abs()
        eager_err = (theirs.double() - want).abs()
        max_err = max(max_err, ours_err.max().item())
        for stat in ("max", "mean"):
            got, bound = getattr(ours_err, stat)().item(), getattr(eager_err, stat)().item()
            # an ulp at the statistic's scale: one rounding the other way of an f32 value
            ulp = torch.finfo(out.dtype).eps * getattr(want.abs(), stat)().item()
            if not got <= ERROR_MULTIPLE * bound + ulp:  # NaN fails too
                problems.append(f"output {i}: {stat} error {got:.3g} against eager's "
                                f"{bound:.3g} (allowed {ERROR_MULTIPLE:g}x + {ulp:.2g})")
    return (max_err if math.isfinite(max_err) else None), ("\n".join(problems) or None)


# --- Helpers over the public API -------------------------------------------------------------


def _datatype(dtype: torch.dtype) -> Any:
    # Imported late so the registry (and its CPU test) loads while the library is unfinished.
    from fusion_cache import DataType

    return {
        torch.float32: DataType.Float,
        torch.bfloat16: DataType.BFloat16,
        torch.float16: DataType.Half,
    }[dtype]


def _tensor(fd: Any, rank: int, dtype: torch.dtype) -> Any:
    """A contiguous input of symbolic sizes, as Thunder defines them."""
    return fd.define_tensor(shape=[-1] * rank, contiguity=[True] * rank, dtype=_datatype(dtype))


def _up(fd: Any, t: Any, dtype: torch.dtype) -> Any:
    return t if dtype == torch.float32 else fd.ops.cast(t, _datatype(torch.float32))


def _down(fd: Any, t: Any, dtype: torch.dtype) -> Any:
    return t if dtype == torch.float32 else fd.ops.cast(t, _datatype(dtype))


def _input(fd: Any, rank: int, dtype: torch.dtype) -> Any:
    """An input, already cast up to f32 for computing."""
    return _up(fd, _tensor(fd, rank, dtype), dtype)


def _const(fd: Any, value: float) -> Any:
    from fusion_cache import DataType

    return fd.define_scalar(value, dtype=DataType.Double)


def _rows(fd: Any, t: Any, shape: Shape) -> Any:
    """Broadcast a per-row [M] value across [M, N]."""
    return fd.ops.broadcast_in_dim(t, list(shape), [0])


def _cols(fd: Any, t: Any, shape: Shape) -> Any:
    """Broadcast a per-column [N] value across [M, N]."""
    return fd.ops.broadcast_in_dim(t, list(shape), [1])


def _row_mean(fd: Any, t: Any, shape: Shape) -> Any:
    return fd.ops.mul(fd.ops.sum(t, dims=[1]), _const(fd, 1.0 / shape[1]))


# --- Inputs ---------------------------------------------------------------------------------


def _randn(shapes: Sequence[Shape], dtype: torch.dtype, device: Any) -> Tensors:
    return [torch.randn(s, dtype=dtype, device=device) for s in shapes]


def _matrices(n: int) -> InputsFn:
    def make(shape: Shape, dtype: torch.dtype, device: Any) -> Tensors:
        return [torch.randn(shape, dtype=dtype, device=device) for _ in range(n)]

    return make


def _matrix_and_row(shape: Shape, dtype: torch.dtype, device: Any) -> Tensors:
    return _randn([shape, shape[1:]], dtype, device)


def _matrix_and_column(shape: Shape, dtype: torch.dtype, device: Any) -> Tensors:
    return _randn([shape, shape[:1]], dtype, device)


def _norm_inputs(shape: Shape, dtype: torch.dtype, device: Any) -> Tensors:
    """x [M, N], weight [N], bias [N]."""
    return _randn([shape, shape[1:], shape[1:]], dtype, device)


def _rms_norm_inputs(shape: Shape, dtype: torch.dtype, device: Any) -> Tensors:
    """x [M, N], weight [N]."""
    return _randn([shape, shape[1:]], dtype, device)


def _rms_norm_bwd_inputs(shape: Shape, dtype: torch.dtype, device: Any) -> Tensors:
    """grad [M, N], x [M, N], rstd [M] (f32, as the forward saves it), weight [N]."""
    grad, x, weight = _randn([shape, shape, shape[1:]], dtype, device)
    rstd = torch.rsqrt(x.float().pow(2).mean(-1) + EPS)
    return [grad, x, rstd, weight]


def _layer_norm_bwd_inputs(shape: Shape, dtype: torch.dtype, device: Any) -> Tensors:
    """grad [M, N], x [M, N], mean [M] and rstd [M] (f32, as saved), weight [N]."""
    grad, x, weight = _randn([shape, shape, shape[1:]], dtype, device)
    var, mean = torch.var_mean(x.float(), dim=-1, correction=0)
    return [grad, x, mean, torch.rsqrt(var + EPS), weight]


def _batch_norm_inputs(shape: Shape, dtype: torch.dtype, device: Any) -> Tensors:
    """x [N, C, H, W], weight [C], bias [C]."""
    return _randn([shape, shape[1:2], shape[1:2]], dtype, device)


# --- Pointwise --------------------------------------------------------------------------------


def define_relu_mul_add(fd: Any, dtype: torch.dtype, shape: Shape) -> None:
    a, b, c = _input(fd, 2, dtype), _input(fd, 2, dtype), _input(fd, 2, dtype)
    fd.add_output(_down(fd, fd.ops.relu(fd.ops.add(fd.ops.mul(a, b), c)), dtype))


def eager_relu_mul_add(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
    return torch.relu(a * b + c)


def define_gelu_bias(fd: Any, dtype: torch.dtype, shape: Shape) -> None:
    a, bias = _input(fd, 2, dtype), _input(fd, 1, dtype)
    x = fd.ops.add(a, _cols(fd, bias, shape))
    # gelu, tanh form: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
    x3 = fd.ops.mul(fd.ops.mul(x, x), x)
    inner = fd.ops.add(x, fd.ops.mul(x3, _const(fd, 0.044715)))
    t = fd.ops.tanh(fd.ops.mul(inner, _const(fd, math.sqrt(2.0 / math.pi))))
    y = fd.ops.mul(fd.ops.mul(x, _const(fd, 0.5)), fd.ops.add(t, _const(fd, 1.0)))
    fd.add_output(_down(fd, y, dtype))


def eager_gelu_bias(a: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    return F.gelu(a + bias, approximate="tanh")


def define_add_row(fd: Any, dtype: torch.dtype, shape: Shape) -> None:
    a, row = _input(fd, 2, dtype), _input(fd, 1, dtype)
    fd.add_output(_down(fd, fd.ops.add(a, _cols(fd, row, shape)), dtype))


def eager_add_row(a: torch.Tensor, row: torch.Tensor) -> torch.Tensor:
    return a + row


def define_add_column(fd: Any, dtype: torch.dtype, shape: Shape) -> None:
    a, col = _input(fd, 2, dtype), _input(fd, 1, dtype)
    fd.add_output(_down(fd, fd.ops.add(a, _rows(fd, col, shape)), dtype))


def eager_add_column(a: torch.Tensor, col: torch.Tensor) -> torch.Tensor:
    return a + col[:, None]


def define_cast_chain(fd: Any, dtype: torch.dtype, shape: Shape) -> None:
    a, b, c = _input(fd, 2, dtype), _input(fd, 2, dtype), _input(fd, 2, dtype)
    y = fd.ops.mul(fd.ops.tanh(fd.ops.add(fd.ops.mul(a, b), c)), a)
    fd.add_output(_down(fd, y, dtype))


def eager_cast_chain(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
    # Written with explicit casts, as mixed-precision code is: eager pays a kernel for each.
    af, bf, cf = a.float(), b.float(), c.float()
    return (torch.tanh(af * bf + cf) * af).to(a.dtype)


# --- Reductions -------------------------------------------------------------------------------


def define_sum_inner(fd: Any, dtype: torch.dtype, shape: Shape) -> None:
    x = _input(fd, 2, dtype)
    fd.add_output(_down(fd, fd.ops.sum(x, dims=[1]), dtype))


def eager_sum_inner(x: torch.Tensor) -> torch.Tensor:
    return x.sum(dim=1)


def define_sum_outer(fd: Any, dtype: torch.dtype, shape: Shape) -> None:
    x = _input(fd, 2, dtype)
    fd.add_output(_down(fd, fd.ops.sum(x, dims=[0]), dtype))


def eager_sum_outer(x: torch.Tensor) -> torch.Tensor:
    return x.sum(dim=0)


def define_var_mean(fd: Any, dtype: torch.dtype, shape: Shape) -> None:
    x = _input(fd, 2, dtype)
    var, mean = fd.ops.var_mean(x, dims=[1], correction=0)
    fd.add_output(_down(fd, var, dtype))
    fd.add_output(_down(fd, mean, dtype))


def eager_var_mean(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.var_mean(x, dim=1, correction=0)


def define_softmax(fd: Any, dtype: torch.dtype, shape: Shape) -> None:
    x = _input(fd, 2, dtype)
    shifted = fd.ops.sub(x, _rows(fd, fd.ops.max(x, dims=[1]), shape))
    e = fd.ops.exp(shifted)
    y = fd.ops.div(e, _rows(fd, fd.ops.sum(e, dims=[1]), shape))
    fd.add_output(_down(fd, y, dtype))


def eager_softmax(x: torch.Tensor) -> torch.Tensor:
    return torch.softmax(x, dim=-1)


# --- Normalizations ---------------------------------------------------------------------------


def define_layer_norm(fd: Any, dtype: torch.dtype, shape: Shape) -> None:
    x, w, b = _input(fd, 2, dtype), _input(fd, 1, dtype), _input(fd, 1, dtype)
    var, mean = fd.ops.var_mean(x, dims=[1], correction=0)
    rstd = fd.ops.rsqrt(fd.ops.add(var, _const(fd, EPS)))
    xhat = fd.ops.mul(fd.ops.sub(x, _rows(fd, mean, shape)), _rows(fd, rstd, shape))
    y = fd.ops.add(fd.ops.mul(xhat, _cols(fd, w, shape)), _cols(fd, b, shape))
    fd.add_output(_down(fd, y, dtype))


def eager_layer_norm(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return F.layer_norm(x, x.shape[-1:], w, b, EPS)


def define_layer_norm_bwd(fd: Any, dtype: torch.dtype, shape: Shape) -> None:
    g, x = _input(fd, 2, dtype), _input(fd, 2, dtype)
    mean, rstd = _tensor(fd, 1, torch.float32), _tensor(fd, 1, torch.float32)
    w = _input(fd, 1, dtype)
    rstd_b = _rows(fd, rstd, shape)
    xhat = fd.ops.mul(fd.ops.sub(x, _rows(fd, mean, shape)), rstd_b)
    gw = fd.ops.mul(g, _cols(fd, w, shape))
    # dx = rstd * (gw - mean(gw) - xhat * mean(gw * xhat)), means over the row
    mean_gw = _rows(fd, _row_mean(fd, gw, shape), shape)
    mean_gwx = _rows(fd, _row_mean(fd, fd.ops.mul(gw, xhat), shape), shape)
    dx = fd.ops.mul(rstd_b, fd.ops.sub(fd.ops.sub(gw, mean_gw), fd.ops.mul(xhat, mean_gwx)))
    dw = fd.ops.sum(fd.ops.mul(g, xhat), dims=[0])
    db = fd.ops.sum(g, dims=[0])
    for out in (dx, dw, db):
        fd.add_output(_down(fd, out, dtype))


def eager_layer_norm_bwd(
    g: torch.Tensor, x: torch.Tensor, mean: torch.Tensor, rstd: torch.Tensor, w: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    # What autograd runs. The bias argument only sizes dbias, and w has its shape and dtype.
    if x.device.type == "cpu":  # the CPU forward saves its statistics in the input's dtype
        mean, rstd = mean.to(x.dtype), rstd.to(x.dtype)
    return torch.ops.aten.native_layer_norm_backward(
        g, x, x.shape[-1:], mean[:, None], rstd[:, None], w, w, [True, True, True]
    )


def define_rms_norm(fd: Any, dtype: torch.dtype, shape: Shape) -> None:
    x, w = _input(fd, 2, dtype), _input(fd, 1, dtype)
    ms = _row_mean(fd, fd.ops.mul(x, x), shape)
    rstd = fd.ops.rsqrt(fd.ops.add(ms, _const(fd, EPS)))
    y = fd.ops.mul(fd.ops.mul(x, _rows(fd, rstd, shape)), _cols(fd, w, shape))
    fd.add_output(_down(fd, y, dtype))


def eager_rms_norm(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return F.rms_norm(x, x.shape[-1:], w, EPS)


def define_rms_norm_bwd(fd: Any, dtype: torch.dtype, shape: Shape) -> None:
    g, x = _input(fd, 2, dtype), _input(fd, 2, dtype)
    rstd, w = _tensor(fd, 1, torch.float32), _input(fd, 1, dtype)
    rstd_b = _rows(fd, rstd, shape)
    gw = fd.ops.mul(g, _cols(fd, w, shape))
    # dx = rstd * (gw - x * rstd^2 * mean(gw * x)), the mean over the row
    proj = _rows(fd, _row_mean(fd, fd.ops.mul(gw, x), shape), shape)
    x_rstd2 = fd.ops.mul(x, fd.ops.mul(rstd_b, rstd_b))
    dx = fd.ops.mul(rstd_b, fd.ops.sub(gw, fd.ops.mul(x_rstd2, proj)))
    dw = fd.ops.sum(fd.ops.mul(fd.ops.mul(g, x), rstd_b), dims=[0])
    fd.add_output(_down(fd, dx, dtype))
    fd.add_output(_down(fd, dw, dtype))


def eager_rms_norm_bwd(
    g: torch.Tensor, x: torch.Tensor, rstd: torch.Tensor, w: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    # Composed, as autograd runs it for rms_norm: there is no single backward kernel.
    gf, xf, r = g.float(), x.float(), rstd[:, None]
    gw = gf * w.float()
    dx = r * (gw - xf * r * r * (gw * xf).mean(-1, keepdim=True))
    dw = (gf * xf * r).sum(0)
    return dx.to(x.dtype), dw.to(w.dtype)


def define_batch_norm(fd: Any, dtype: torch.dtype, shape: Shape) -> None:
    x, w, b = _input(fd, 4, dtype), _input(fd, 1, dtype), _input(fd, 1, dtype)
    y, _mean, _invstd = fd.ops.batch_norm(
        x, w, b, None, None, _const(fd, BN_MOMENTUM), _const(fd, EPS), True
    )
    fd.add_output(_down(fd, y, dtype))


def eager_batch_norm(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return F.batch_norm(x, None, None, w, b, training=True, momentum=BN_MOMENTUM, eps=EPS)


# --- Layouts (issue 28) -----------------------------------------------------------------------


def define_transpose_add(fd: Any, dtype: torch.dtype, shape: Shape) -> None:
    """add(permute(a, [1, 0]), b): a is [M, N], b and the output [N, M]."""
    a, b = _input(fd, 2, dtype), _input(fd, 2, dtype)
    fd.add_output(_down(fd, fd.ops.add(fd.ops.permute(a, [1, 0]), b), dtype))


def eager_transpose_add(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return a.t() + b


def _square_pair(shape: Shape, dtype: torch.dtype, device: Any) -> Tensors:
    return _randn([shape, shape[::-1]], dtype, device)


def define_transpose_scale(fd: Any, dtype: torch.dtype, shape: Shape) -> None:
    """mul(permute(a, [0, 2, 1]), 2), written out contiguous."""
    a = _input(fd, 3, dtype)
    fd.add_output(_down(fd, fd.ops.mul(fd.ops.permute(a, [0, 2, 1]), _const(fd, 2.0)), dtype))


def eager_transpose_scale(a: torch.Tensor) -> torch.Tensor:
    return (a.permute(0, 2, 1) * 2).contiguous()


def define_attention_heads(fd: Any, dtype: torch.dtype, shape: Shape) -> None:
    """[B, T, H, D] -> [B, H, T, D] with the attention scale 1/sqrt(D), as q is prepared."""
    x = _input(fd, 4, dtype)
    y = fd.ops.mul(fd.ops.permute(x, [0, 2, 1, 3]), _const(fd, 1.0 / math.sqrt(shape[-1])))
    fd.add_output(_down(fd, y, dtype))


def eager_attention_heads(x: torch.Tensor) -> torch.Tensor:
    return (x.transpose(1, 2) * (1.0 / math.sqrt(x.shape[-1]))).contiguous()


def define_attention_merge(fd: Any, dtype: torch.dtype, shape: Shape) -> None:
    """The inverse: [B, H, T, D] -> [B, T, H, D], scaled, as the backward returns it."""
    x = _input(fd, 4, dtype)
    y = fd.ops.mul(fd.ops.permute(x, [0, 2, 1, 3]), _const(fd, 1.0 / math.sqrt(shape[-1])))
    fd.add_output(_down(fd, y, dtype))


def define_nchw_to_nhwc(fd: Any, dtype: torch.dtype, shape: Shape) -> None:
    x = _tensor(fd, 4, dtype)
    # a copy in the new order: the permute alone returns a view of the input, as nvFuser's
    # does, and moves no byte (the first H100 run timed that view at 313294 "GB/s")
    fd.add_output(fd.ops.set(fd.ops.permute(x, [0, 2, 3, 1])))


def eager_nchw_to_nhwc(x: torch.Tensor) -> torch.Tensor:
    return x.permute(0, 2, 3, 1).contiguous()


def define_mid_sum(fd: Any, dtype: torch.dtype, shape: Shape) -> None:
    x = _input(fd, 3, dtype)
    fd.add_output(_down(fd, fd.ops.sum(x, dims=[1]), dtype))


def eager_mid_sum(x: torch.Tensor) -> torch.Tensor:
    return x.sum(dim=1)


def define_mid_var_mean(fd: Any, dtype: torch.dtype, shape: Shape) -> None:
    x = _input(fd, 3, dtype)
    var, mean = fd.ops.var_mean(x, dims=[1], correction=0)
    fd.add_output(_down(fd, var, dtype))
    fd.add_output(_down(fd, mean, dtype))


def eager_mid_var_mean(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.var_mean(x, dim=1, correction=0)


def define_mid_softmax(fd: Any, dtype: torch.dtype, shape: Shape) -> None:
    x = _input(fd, 3, dtype)
    mx = fd.ops.broadcast_in_dim(fd.ops.max(x, dims=[1]), list(shape), [0, 2])
    e = fd.ops.exp(fd.ops.sub(x, mx))
    y = fd.ops.div(e, fd.ops.broadcast_in_dim(fd.ops.sum(e, dims=[1]), list(shape), [0, 2]))
    fd.add_output(_down(fd, y, dtype))


def eager_mid_softmax(x: torch.Tensor) -> torch.Tensor:
    return torch.softmax(x, dim=1)


def define_all_sum(fd: Any, dtype: torch.dtype, shape: Shape) -> None:
    x = _input(fd, 1, dtype)
    fd.add_output(_down(fd, fd.ops.sum(x, dims=[0]), dtype))


def eager_all_sum(x: torch.Tensor) -> torch.Tensor:
    return x.sum()


def define_all_mean(fd: Any, dtype: torch.dtype, shape: Shape) -> None:
    x = _input(fd, 1, dtype)
    fd.add_output(_down(fd, fd.ops.mul(fd.ops.sum(x, dims=[0]), _const(fd, 1.0 / shape[0])), dtype))


def eager_all_mean(x: torch.Tensor) -> torch.Tensor:
    return x.mean()


# --- The registry -----------------------------------------------------------------------------


def _cases(
    op: str,
    family: str,
    define: DefineFn,
    eager: EagerFn,
    make_inputs: InputsFn,
    shapes: Sequence[Shape],
    dtypes: Sequence[torch.dtype] = DTYPES,
    moved: Callable[[Tensors, Tensors], int] | None = None,
    size_matched: bool = False,
) -> list[Case]:
    out = []
    for dtype in dtypes:
        for shape in shapes:
            name = f"{op}_{short_dtype(dtype)}_{'x'.join(map(str, shape))}"
            atol, rtol = _tolerance(dtype, family)
            out.append(
                Case(name, op, family, dtype, tuple(shape), define, eager, make_inputs, atol, rtol,
                     moved=moved, size_matched=size_matched)
            )
    return out


def _registry() -> list[Case]:
    pw, red, norm, lay = "pointwise", "reduction", "normalization", "layouts"
    rs, bs = REDUCTION_SHAPES, BATCH_NORM_SHAPES
    three, one = _matrices(3), _matrices(1)
    return [
        # issue 3: pointwise
        *_cases("relu_mul_add", pw, define_relu_mul_add, eager_relu_mul_add, three,
                POINTWISE_SHAPES),
        *_cases("gelu_bias", pw, define_gelu_bias, eager_gelu_bias, _matrix_and_row,
                POINTWISE_SHAPES, (torch.float32,)),
        *_cases("gelu_bias", pw, define_gelu_bias, eager_gelu_bias, _matrix_and_row,
                (*POINTWISE_SHAPES, (16384, 8192)), (torch.bfloat16,)),
        *_cases("add_row", pw, define_add_row, eager_add_row, _matrix_and_row,
                POINTWISE_SHAPES),
        *_cases("add_column", pw, define_add_column, eager_add_column, _matrix_and_column,
                POINTWISE_SHAPES),
        *_cases("cast_chain", pw, define_cast_chain, eager_cast_chain, three, POINTWISE_SHAPES),
        # host overhead: the smallest fusion worth launching, timed per call on the host
        *_cases("host_relu_mul_add", "host", define_relu_mul_add, eager_relu_mul_add, three,
                (HOST_SHAPE,), (torch.float32,)),
        # next issue: reductions and normalizations, off unless their family is asked for
        *_cases("sum_inner", red, define_sum_inner, eager_sum_inner, one, rs),
        *_cases("sum_outer", red, define_sum_outer, eager_sum_outer, one, rs),
        *_cases("var_mean", red, define_var_mean, eager_var_mean, one, rs),
        *_cases("softmax", norm, define_softmax, eager_softmax, one, rs),
        *_cases("layer_norm", norm, define_layer_norm, eager_layer_norm, _norm_inputs, rs),
        *_cases("layer_norm_bwd", norm, define_layer_norm_bwd, eager_layer_norm_bwd,
                _layer_norm_bwd_inputs, rs),
        *_cases("rms_norm", norm, define_rms_norm, eager_rms_norm, _rms_norm_inputs, rs),
        *_cases("rms_norm_bwd", norm, define_rms_norm_bwd, eager_rms_norm_bwd,
                _rms_norm_bwd_inputs, rs),
        *_cases("batch_norm", norm, define_batch_norm, eager_batch_norm, _batch_norm_inputs,
                bs),
        # issue 27: resize and indexing ops (benchmarks/resize_cases.py), in bf16
        *(case for op, (define, eager, inputs, shape, _) in RESIZE.items()
          for case in _cases(op, "resize", define, eager, inputs, (shape,), (torch.bfloat16,),
                             MOVED.get(op), op in SIZE_MATCHED)),
        # issue 28: layouts (transposes, reductions over middle and every dim, short rows)
        *_cases("transpose_add", lay, define_transpose_add, eager_transpose_add, _square_pair,
                ((8192, 8192),)),
        *_cases("transpose_scale", lay, define_transpose_scale, eager_transpose_scale, one,
                ((64, 1024, 1024),)),
        *_cases("attention_heads", lay, define_attention_heads, eager_attention_heads, one,
                (ATTENTION_SHAPE,), (torch.bfloat16,)),
        *_cases("attention_merge", lay, define_attention_merge, eager_attention_heads, one,
                ((8, 32, 2048, 128),), (torch.bfloat16,)),
        *_cases("nchw_to_nhwc", lay, define_nchw_to_nhwc, eager_nchw_to_nhwc, one,
                ((64, 256, 56, 56),)),
        *_cases("mid_sum", lay, define_mid_sum, eager_mid_sum, one, MIDDLE_SHAPES),
        *_cases("mid_var_mean", lay, define_mid_var_mean, eager_mid_var_mean, one,
                MIDDLE_SHAPES),
        *_cases("mid_softmax", lay, define_mid_softmax, eager_mid_softmax, one,
                ((32, 4096, 512),)),
        *_cases("all_sum", lay, define_all_sum, eager_all_sum, one, ((67108864,),),
                (torch.float32,)),
        *_cases("all_mean", lay, define_all_mean, eager_all_mean, one, ((67108864,),),
                (torch.float32,)),
        *_cases("short_softmax", lay, define_softmax, eager_softmax, one, SHORT_ROW_SHAPES),
        *_cases("short_layer_norm", lay, define_layer_norm, eager_layer_norm, _norm_inputs,
                SHORT_ROW_SHAPES),
    ]


def _aten_cases() -> list[Case]:
    """Issue 29: GEMMs and attention as ATen segments, dropout drawn in kernels."""
    from . import aten_cases as a

    bf16 = (torch.bfloat16,)
    out = [
        *_cases("linear_bias_gelu", "aten", a.define_linear_bias_gelu, a.eager_linear_bias_gelu,
                a.linear_inputs, ((8192, 768),), bf16),
        *_cases("gpt_mlp", "aten", a.define_mlp, a.eager_mlp, a.mlp_inputs, ((8192, 768),), bf16),
        *_cases("attention", "aten", a.define_attention, a.eager_attention, a.attention_inputs,
                ((8, 1024, 768),), bf16),
        *_cases("dropout_ln_bwd", "aten", a.define_dropout_ln_bwd, a.eager_dropout_ln_bwd,
                a.dropout_ln_bwd_inputs, ((16384, 4096),), bf16),
    ]
    out = [replace(c, by_eager_error=True) for c in out]  # Note [Error against eager's own]
    return out + [replace(c, replay=a.replay_dropout_ln) for c in _cases(
        "dropout_ln", "aten", a.define_dropout_ln, a.eager_dropout_ln, a.dropout_ln_inputs,
        ((16384, 4096),), bf16)]  # fmt: skip


CASES: list[Case] = _registry() + _aten_cases()


def select(
    families: Sequence[str], quick: bool = False, pattern: str | None = None
) -> list[Case]:
    """Cases of the given families, in registry order, whose name contains `pattern` (or one
    of its comma-separated parts); `quick` keeps only the first shape listed for each op and
    dtype (the smallest, for the pointwise ones)."""
    parts = pattern.split(",") if pattern else []
    chosen = [c for c in CASES if c.family in families and (not parts or any(p in c.name for p in parts))]
    if not quick:
        return chosen
    first: dict[tuple[str, torch.dtype], Case] = {}
    for c in chosen:
        first.setdefault((c.op, c.dtype), c)
    return list(first.values())


def named_on_gpu(prog: str, names: Sequence[str]) -> list[Case] | None:
    """The cases `names` for a GPU probe (`prog`), or None after saying on stderr why not:
    no CUDA GPU visible, or names the registry does not know."""
    import sys

    if not torch.cuda.is_available():
        print(f"{prog} needs a CUDA GPU; none is visible", file=sys.stderr)
        return None
    known = {c.name: c for c in CASES}
    unknown = [n for n in names if n not in known]
    if unknown:
        print(f"unknown case(s) {unknown}; see benchmarks/cases.py", file=sys.stderr)
        return None
    return [known[n] for n in names]
