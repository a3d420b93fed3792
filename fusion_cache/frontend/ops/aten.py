"""Ops a library does best, run as one torch call each in an ATen segment (Note [ATen
segments] in schedulers/aten.py): matmul, bmm, linear, sdpfa_fwd/sdpfa_bwd,
sdpa_cudnn_fwd/sdpa_cudnn_bwd, sdpa_efficient_fwd/sdpa_efficient_bwd, grouped_mm, scaled_mm,
cumsum, argsort, topk. Arguments and outputs follow nvFuser's frontend."""
from __future__ import annotations

from typing import Any

from .. import shapes
from ..dtypes import DataType, check_dtype, is_float, is_integral
from ..records import Record
from ..values import TensorInfo
from .base import OpsBase

SYM = shapes.SYMBOLIC
ATTENTION_DTYPES = (DataType.Half, DataType.BFloat16, DataType.Float, DataType.Double)


def _same_dtype(op: str, infos: dict) -> DataType:
    dtypes = {name: info.dtype for name, info in infos.items()}
    if len(set(dtypes.values())) > 1:
        listed = ", ".join(f"{k} {v!r}" for k, v in dtypes.items())
        raise TypeError(f"{op}: operands must share one dtype, got {listed}")
    return next(iter(dtypes.values()))


def _join(op: str, what: str, a: int, b: int) -> int:
    """Two shape codes that must describe one extent."""
    if a == SYM or a == b:
        return b
    if b == SYM:
        return a
    raise ValueError(f"{op}: {what} sizes {a} and {b} differ")


class AtenOps(OpsBase):
    def _qkv(self, op: str, query: Any, key: Any, value: Any) -> tuple:
        return tuple(self._tensor(t, op, n) for t, n in ((query, "query"), (key, "key"),
                                                         (value, "value")))  # fmt: skip

    def _attention_flags(self, op: str, dropout_p: Any, is_causal: Any, scale: Any) -> tuple:
        return tuple(self._optional_scalar(s, op, n) for s, n in (
            (dropout_p, "dropout_p"), (is_causal, "is_causal"), (scale, "scale")))  # fmt: skip

    def _attention_forward(self, op: str, qkv: tuple, flags: tuple, lse_shape: Any,
                           seeds: list, attn_bias: Any = None, masked: bool = False) -> Any:
        """An attention forward's record: (output, log_sumexp of lse_shape(N, H, L), the
        random state `seeds`); `masked` ops take attn_bias after the value."""
        q, k, v = self._qkv(op, *qkv)
        bias = None if attn_bias is None else self._tensor(attn_bias, op, "attn_bias")
        extra = self._attention_flags(op, *flags)

        def infer() -> list:
            iq, ik, iv = self._info(q), self._info(k), self._info(v)
            dt, n, h = _attention_shape(op, iq, ik, iv)
            if bias is not None and self._info(bias).ndim > 4:
                raise ValueError(f"{op}: attn_bias must broadcast to [N, H, L, S]")
            self._check_flags(op, extra)
            return [TensorInfo(dt, (n, h, iq.shape[2], iv.shape[3])),
                    TensorInfo(DataType.Float, lse_shape(n, h, iq.shape[2])), *seeds]

        args = (q, k, v, bias, *extra) if masked else (q, k, v, *extra)
        return self._apply(Record("op", op, args, (), self._out("TTTT")), infer)

    def _optional_scalar(self, value: Any, op: str, arg: str) -> Any:
        return None if value is None else self._ref(value, op, arg, "S")

    def matmul(self, arg1, arg2):
        op = "matmul"
        a, b = self._tensor(arg1, op, "arg1"), self._tensor(arg2, op, "arg2")

        def infer() -> list:
            x, y = self._info(a), self._info(b)
            dt = _same_dtype(op, {"arg1": x, "arg2": y})
            if x.ndim == 0 or y.ndim == 0:
                raise ValueError(f"{op}: operands must have at least 1 dim, got ranks {x.ndim} "
                                 f"and {y.ndim}")  # fmt: skip
            xs = (1, *x.shape) if x.ndim == 1 else x.shape
            ys = (*y.shape, 1) if y.ndim == 1 else y.shape
            _join(op, "contracted (arg1's last, arg2's second to last)", xs[-1], ys[-2])
            batch = shapes.broadcast_shapes(op, [xs[:-2], ys[:-2]])
            out = (*batch, *((xs[-2],) if x.ndim > 1 else ()), *((ys[-1],) if y.ndim > 1 else ()))
            return [TensorInfo(dt, out)]

        return self._apply(Record("op", op, (a, b), (), self._out("T")), infer)

    def bmm(self, mat1, mat2):
        """Batched matrix multiplication, as torch.bmm: [B, M, K] x [B, K, N] -> [B, M, N]."""
        op = "bmm"
        a, b = self._tensor(mat1, op, "mat1"), self._tensor(mat2, op, "mat2")

        def infer() -> list:
            x, y = self._info(a), self._info(b)
            dt = _same_dtype(op, {"mat1": x, "mat2": y})
            if x.ndim != 3 or y.ndim != 3:
                raise ValueError(f"{op}: expects 3-D tensors, got ranks {x.ndim} and {y.ndim}")
            batch = _join(op, "batch", x.shape[0], y.shape[0])
            _join(op, "contracted (mat1's last, mat2's second)", x.shape[2], y.shape[1])
            return [TensorInfo(dt, (batch, x.shape[1], y.shape[2]))]

        return self._apply(Record("op", op, (a, b), (), self._out("T")), infer)

    def linear(self, arg1, arg2, bias=None):
        op = "linear"
        a, w = self._tensor(arg1, op, "arg1"), self._tensor(arg2, op, "arg2")
        c = None if bias is None else self._tensor(bias, op, "bias")

        def infer() -> list:
            x, wt = self._info(a), self._info(w)
            operands = {"arg1": x, "arg2": wt}
            if c is not None:
                operands["bias"] = self._info(c)
            dt = _same_dtype(op, operands)
            if x.ndim == 0 or wt.ndim not in (1, 2):
                raise ValueError(f"{op}: arg1 needs at least 1 dim and arg2 (the weight) 1 or 2, "
                                 f"got ranks {x.ndim} and {wt.ndim}")  # fmt: skip
            _join(op, "in-feature (arg1's last, arg2's last)", x.shape[-1], wt.shape[-1])
            out = (*x.shape[:-1], *wt.shape[:-1])
            if c is not None:
                bshape = self._info(c).shape
                if len(bshape) > 1 or (bshape and wt.ndim == 1):
                    raise ValueError(f"{op}: bias must be 0-D or 1-D (out features), got rank "
                                     f"{len(bshape)}")  # fmt: skip
                if bshape and wt.ndim == 2:
                    _join(op, "out-feature (arg2's first, bias)", wt.shape[0], bshape[0])
            return [TensorInfo(dt, out)]

        return self._apply(Record("op", op, (a, w, c), (), self._out("T")), infer)

    def sdpfa_fwd(self, query, key, value, dropout_p=None, is_causal=None, scale=None):
        return self._attention_forward(
            "sdpfa_fwd", (query, key, value), (dropout_p, is_causal, scale),
            lambda n, h, L: (n, h, L),
            [TensorInfo(DataType.UInt64, (2,)), TensorInfo(DataType.UInt64, ())])

    def sdpfa_bwd(self, grad_output, query, key, value, output, log_sumexp, dropout_p=None,
                  is_causal=None, philox_seed=None, philox_offset=None, scale=None):  # fmt: skip
        op = "sdpfa_bwd"
        names = ("grad_output", "query", "key", "value", "output", "log_sumexp")
        tensors = tuple(self._tensor(t, op, n) for t, n in zip(
            (grad_output, query, key, value, output, log_sumexp), names))  # fmt: skip
        if philox_seed is None or philox_offset is None:
            raise TypeError(f"{op}: philox_seed and philox_offset (sdpfa_fwd's third and fourth "
                            "outputs) are required")  # fmt: skip
        seed = self._tensor(philox_seed, op, "philox_seed")
        offset = self._tensor(philox_offset, op, "philox_offset")
        p = self._optional_scalar(dropout_p, op, "dropout_p")
        causal = self._optional_scalar(is_causal, op, "is_causal")
        sc = self._optional_scalar(scale, op, "scale")

        def infer() -> list:
            go, iq, ik, iv, out, lse = (self._info(t) for t in tensors)
            dt = _attention_operands(op, iq, ik, iv)
            _check_gradients(op, dt, go, out, lse, lse_rank=3)
            self._check_flags(op, (p, causal, sc))
            return [TensorInfo(dt, iq.shape), TensorInfo(dt, ik.shape), TensorInfo(dt, iv.shape)]

        args = (*tensors, p, causal, seed, offset, sc)
        return self._apply(Record("op", op, args, (), self._out("TTT")), infer)

    def sdpa_cudnn_fwd(self, query, key, value, dropout_p=None, is_causal=None, scale=None):
        """cuDNN's attention, as torch's _scaled_dot_product_cudnn_attention: (output,
        log_sumexp [N, H, L, 1], philox_seed, philox_offset). Its own op beside sdpfa_fwd:
        its log-sum-exp and random state are what cuDNN's backward reads, so a region
        holding one half of a forward/backward pair pairs with eager's other half."""
        return self._attention_forward(
            "sdpa_cudnn_fwd", (query, key, value), (dropout_p, is_causal, scale),
            lambda n, h, L: (n, h, L, 1), [TensorInfo(DataType.Int, ()), TensorInfo(DataType.Int, ())])

    def sdpa_cudnn_bwd(self, grad_output, query, key, value, output, log_sumexp, philox_seed,
                       philox_offset, dropout_p=None, is_causal=None, scale=None):  # fmt: skip
        """The gradients of query, key and value, as torch's
        _scaled_dot_product_cudnn_attention_backward, from sdpa_cudnn_fwd's outputs."""
        op = "sdpa_cudnn_bwd"
        names = ("grad_output", "query", "key", "value", "output", "log_sumexp", "philox_seed",
                 "philox_offset")  # fmt: skip
        tensors = tuple(self._tensor(t, op, n) for t, n in zip(
            (grad_output, query, key, value, output, log_sumexp, philox_seed, philox_offset),
            names))  # fmt: skip
        flags = self._attention_flags(op, dropout_p, is_causal, scale)

        def infer() -> list:
            go, iq, ik, iv, out, lse = (self._info(t) for t in tensors[:6])
            dt = _attention_operands(op, iq, ik, iv)
            _check_gradients(op, dt, go, out, lse, lse_rank=4)
            self._check_flags(op, flags)
            return [TensorInfo(dt, iq.shape), TensorInfo(dt, ik.shape), TensorInfo(dt, iv.shape)]

        return self._apply(Record("op", op, (*tensors, *flags), (), self._out("TTT")), infer)

    def sdpa_efficient_fwd(self, query, key, value, attn_bias=None, dropout_p=None,
                           is_causal=None, scale=None):  # fmt: skip
        """Memory-efficient attention, as torch's _scaled_dot_product_efficient_attention
        with its log-sum-exp: (output, log_sumexp [N, H, L rounded up to 32], philox_seed,
        philox_offset). `attn_bias`: an additive mask broadcast to [N, H, L, S]."""
        return self._attention_forward(
            "sdpa_efficient_fwd", (query, key, value), (dropout_p, is_causal, scale),
            lambda n, h, L: (n, h, efficient_lse_length(L)),
            [TensorInfo(DataType.Int, ()), TensorInfo(DataType.Int, ())], attn_bias, masked=True)

    def sdpa_efficient_bwd(self, grad_output, query, key, value, attn_bias, output, log_sumexp,
                           philox_seed, philox_offset, dropout_p=None, is_causal=None,
                           scale=None):  # fmt: skip
        """The gradients of query, key and value, as torch's
        _scaled_dot_product_efficient_attention_backward, from sdpa_efficient_fwd's outputs
        (the mask's gradient is not taken)."""
        op = "sdpa_efficient_bwd"
        names = ("grad_output", "query", "key", "value")
        tensors = tuple(self._tensor(t, op, n) for t, n in zip(
            (grad_output, query, key, value), names))  # fmt: skip
        bias = None if attn_bias is None else self._tensor(attn_bias, op, "attn_bias")
        rest = tuple(self._tensor(t, op, n) for t, n in zip(
            (output, log_sumexp, philox_seed, philox_offset),
            ("output", "log_sumexp", "philox_seed", "philox_offset")))  # fmt: skip
        flags = self._attention_flags(op, dropout_p, is_causal, scale)

        def infer() -> list:
            go, iq, ik, iv = (self._info(t) for t in tensors)
            out, lse = self._info(rest[0]), self._info(rest[1])
            dt = _attention_operands(op, iq, ik, iv)
            _check_gradients(op, dt, go, out, lse, lse_rank=3)
            self._check_flags(op, flags)
            return [TensorInfo(dt, iq.shape), TensorInfo(dt, ik.shape), TensorInfo(dt, iv.shape)]

        args = (*tensors, bias, *rest, *flags)
        return self._apply(Record("op", op, args, (), self._out("TTT")), infer)

    def _check_flags(self, op: str, flags: tuple) -> None:
        p, causal, sc = flags
        for ref, name, ok in ((p, "dropout_p", is_float), (sc, "scale", is_float),
                              (causal, "is_causal", lambda d: d is DataType.Bool)):  # fmt: skip
            if ref is not None and not ok(self._info(ref).dtype):
                raise TypeError(f"{op}: {name} has dtype {self._info(ref).dtype!r}")

    def grouped_mm(self, mat1, mat2, offsets):
        op = "grouped_mm"
        a, b = self._tensor(mat1, op, "mat1"), self._tensor(mat2, op, "mat2")
        offs = self._tensor(offsets, op, "offsets")

        def infer() -> list:
            x, y, o = self._info(a), self._info(b), self._info(offs)
            dt = _same_dtype(op, {"mat1": x, "mat2": y})
            if o.ndim != 1 or o.dtype not in (DataType.Int32, DataType.Int):
                raise TypeError(f"{op}: offsets must be a 1-D Int32 tensor, got rank {o.ndim} "
                                f"{o.dtype!r}")  # fmt: skip
            ranks = (x.ndim, y.ndim)
            if ranks == (2, 2):  # groups split K: [M, K] x [K, N] -> [G, M, N]
                _join(op, "contracted", x.shape[1], y.shape[0])
                out = (o.shape[0], x.shape[0], y.shape[1])
            elif ranks == (2, 3):  # groups split M: [M, K] x [G, K, N] -> [M, N]
                _join(op, "contracted", x.shape[1], y.shape[1])
                _join(op, "group", o.shape[0], y.shape[0])
                out = (x.shape[0], y.shape[2])
            elif ranks == (3, 2):  # groups split N: [G, M, K] x [K, N] -> [M, N]
                _join(op, "contracted", x.shape[2], y.shape[0])
                _join(op, "group", o.shape[0], x.shape[0])
                out = (x.shape[1], y.shape[1])
            else:
                raise ValueError(f"{op}: mat1 and mat2 must be 2-D or 3-D, not both 3-D; got "
                                 f"ranks {ranks}")  # fmt: skip
            return [TensorInfo(dt, out)]

        return self._apply(Record("op", op, (a, b, offs), (), self._out("T")), infer)

    def scaled_mm(self, mat1, mat2, scale1, scale2, alpha=None, bias=None, beta=None,
                  dtype=DataType.BFloat16, output_block_scale_size=0,
                  output_block_scale_dtype=DataType.Float, output_gamma=False):  # fmt: skip
        """mat1 @ mat2 of float8 operands with their scales, as torch._scaled_mm; returns
        (out, None, None): block-scaled outputs and gamma are not supported (as in nvFuser)."""
        op = "scaled_mm"
        if output_block_scale_size or output_gamma:
            raise ValueError(f"{op}: output_block_scale_size and output_gamma are not supported")
        check_dtype(output_block_scale_dtype, f"{op}: output_block_scale_dtype")
        refs = tuple(self._tensor(t, op, n) for t, n in ((mat1, "mat1"), (mat2, "mat2"),
                                                        (scale1, "scale1"), (scale2, "scale2")))
        opt = tuple(None if t is None else self._tensor(t, op, n)
                    for t, n in ((alpha, "alpha"), (bias, "bias"), (beta, "beta")))  # fmt: skip
        dt = check_dtype(dtype, f"{op}: dtype")

        def infer() -> list:
            x, y = self._info(refs[0]), self._info(refs[1])
            if x.ndim != 2 or y.ndim != 2:
                raise ValueError(f"{op}: mat1 and mat2 must be 2-D, got ranks {x.ndim} and {y.ndim}")
            for name, info in (("mat1", x), ("mat2", y)):
                if info.dtype not in (DataType.Float8_e4m3fn, DataType.Float8_e5m2):
                    raise TypeError(f"{op}: {name} must be Float8_e4m3fn or Float8_e5m2, got "
                                    f"{info.dtype!r} (block-scaled float4 has no kernel here)")
            _join(op, "contracted", x.shape[1], y.shape[0])
            return [TensorInfo(dt, (x.shape[0], y.shape[1]))]

        out = self._apply(Record("op", op, refs + opt, (("dtype", dt),), self._out("T")), infer)
        return out, None, None

    def cumsum(self, arg, dim):
        op = "cumsum"
        x = self._tensor(arg, op)

        def infer() -> list:
            info = self._info(x)
            shapes.normalize_dim(dim, info.ndim, op)
            dt = DataType.Int if is_integral(info.dtype) and info.dtype is not DataType.UInt64 \
                else info.dtype  # torch sums integers and bools in int64
            return [TensorInfo(dt, info.shape)]

        return self._apply(Record("op", op, (x,), (("dim", dim),), self._out("T")), infer)

    def argsort(self, arg, dim, descending=False, stable=False):
        op = "argsort"
        x = self._tensor(arg, op)

        def infer() -> list:
            info = self._info(x)
            shapes.normalize_dim(dim, info.ndim, op)
            return [TensorInfo(DataType.Int, info.shape)]

        kwargs = (("dim", dim), ("descending", bool(descending)), ("stable", bool(stable)))
        return self._apply(Record("op", op, (x,), kwargs, self._out("T")), infer)

    def topk(self, arg, k, dim=-1, largest=True, sorted=False):
        op = "topk"
        x = self._tensor(arg, op)
        kk = self._ref(k, op, "k", "S")

        def infer() -> list:
            info = self._info(x)
            d = shapes.normalize_dim(dim, info.ndim, op)
            if self._info(kk).dtype not in (DataType.Int, DataType.Int32):
                raise TypeError(f"{op}: k must be an Int scalar, got {self._info(kk).dtype!r}")
            const = self._const_int(kk)
            if const is not None and (const < 0 or (info.shape[d] >= 0 and const > info.shape[d])
                                      and info.shape[d] != SYM):  # fmt: skip
                raise ValueError(f"{op}: k={const} is out of range for dim {d} of size "
                                 f"{info.shape[d]}")  # fmt: skip
            size = SYM if const is None else const
            shape = tuple(size if i == d else e for i, e in enumerate(info.shape))
            return [TensorInfo(info.dtype, shape), TensorInfo(DataType.Int, shape)]

        kwargs = (("dim", dim), ("largest", bool(largest)), ("sorted", bool(sorted)))
        return self._apply(Record("op", op, (x, kk), kwargs, self._out("TT")), infer)


def efficient_lse_length(length: int) -> int:
    """The log-sum-exp's last extent of memory-efficient attention: the query length
    rounded up to the kernel's 32-row tiles (symbolic where the length is)."""
    return length if length == SYM else -(-length // 32) * 32


def _attention_operands(op: str, iq: TensorInfo, ik: TensorInfo, iv: TensorInfo) -> DataType:
    dt = _same_dtype(op, {"query": iq, "key": ik, "value": iv})
    if dt not in ATTENTION_DTYPES:
        raise TypeError(f"{op}: query, key and value must be floating point, got {dt!r}")
    if (iq.ndim, ik.ndim, iv.ndim) != (4, 4, 4):
        raise ValueError(f"{op}: query, key and value must be 4-D [N, H, L, E], got ranks "
                         f"{iq.ndim}, {ik.ndim}, {iv.ndim}")  # fmt: skip
    return dt


def _attention_shape(op: str, iq: Any, ik: Any, iv: Any) -> tuple:
    """The attention operands' dtype, batch and heads, their sizes checked against each other."""
    dt = _attention_operands(op, iq, ik, iv)
    n = _join(op, "batch", _join(op, "batch", iq.shape[0], ik.shape[0]), iv.shape[0])
    h = _join(op, "head", _join(op, "head", iq.shape[1], ik.shape[1]), iv.shape[1])
    _join(op, "key/value sequence", ik.shape[2], iv.shape[2])
    _join(op, "query/key head dim", iq.shape[3], ik.shape[3])
    return dt, n, h


def _check_gradients(op: str, dt: Any, go: Any, out: Any, lse: Any, lse_rank: int) -> None:
    if go.dtype is not dt or out.dtype is not dt:
        raise TypeError(f"{op}: grad_output and output must be {dt!r}, got "
                        f"{go.dtype!r} and {out.dtype!r}")  # fmt: skip
    if go.ndim != 4 or out.ndim != 4 or lse.ndim != lse_rank:
        raise ValueError(f"{op}: grad_output and output must be 4-D and log_sumexp "
                         f"{lse_rank}-D")  # fmt: skip
