"""Convolution and its backward, run as one torch call each in an ATen segment (Note [ATen
segments] in schedulers/aten.py), as torch's aten::convolution and aten::convolution_backward:
any rank of spatial dims, stride, padding, dilation, groups, transposed with output padding.
The layout parameters are Python ints fixed by the definition (records' keyword arguments);
`convolution_backward` returns (grad_input, grad_weight, grad_bias) with None for a gradient
`output_mask` does not ask for, as torch's does.

Note [Channels-last convolutions]: cuDNN runs its convolutions in NHWC on the H100; given NCHW
tensors, torch converts each operand and the result around every call (ResNet-18's training
step: 105 nchwToNhwc and 50 nhwcToNchw kernels, 0.9 ms). `channels_last=True` asks the call to
take its activations (input, grad_output) in channels-last order: a no-op where they already
are, and the results come back channels-last. The fusions around it then keep that layout
(fusion_cache/ir/output_layout.py, `prefers_channels_last`), as inductor's layout optimization
does, so the conversions happen once, at the first convolution's input. Recorded only when set,
so definitions without it keep their ids."""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .. import shapes
from ..dtypes import DataType
from ..records import Record
from ..values import TensorInfo
from .base import OpsBase

SYM = shapes.SYMBOLIC
CONV_DTYPES = (DataType.Half, DataType.BFloat16, DataType.Float, DataType.Double)
# the keyword arguments of both records, in torch's argument order
LAYOUT = ("stride", "padding", "dilation", "transposed", "output_padding", "groups")


def conv_layout(spatial: int, stride: Any, padding: Any, dilation: Any, transposed: Any,
                output_padding: Any, groups: Any) -> tuple:  # fmt: skip
    """The record's keyword arguments: each list widened to `spatial` entries (torch repeats a
    single value), checked."""

    def widen(name: str, value: Any, least: int) -> tuple[int, ...]:
        items = tuple(value) if isinstance(value, (list, tuple)) else (value,)
        if len(items) == 1:
            items *= spatial
        if len(items) != spatial or not all(isinstance(v, int) and v >= least for v in items):
            raise ValueError(f"convolution: {name} must be {spatial} ints >= {least}, got "
                             f"{list(items)}")  # fmt: skip
        return tuple(int(v) for v in items)

    if not isinstance(groups, int) or groups < 1:
        raise ValueError(f"convolution: groups must be an int >= 1, got {groups!r}")
    return (("stride", widen("stride", stride, 1)), ("padding", widen("padding", padding, 0)),
            ("dilation", widen("dilation", dilation, 1)), ("transposed", bool(transposed)),
            ("output_padding", widen("output_padding", output_padding, 0)),
            ("groups", int(groups)))  # fmt: skip


def conv_output_shape(x: Sequence[int], w: Sequence[int], kw: dict) -> tuple[int, ...]:
    """The output's shape codes (sizes where every code is known; SYM where one is not)."""
    transposed, groups = kw["transposed"], kw["groups"]
    if transposed:
        channels = SYM if w[1] == SYM else w[1] * groups
    else:
        channels = w[0]
    spatial = []
    for i, (n, k) in enumerate(zip(x[2:], w[2:])):
        if n == SYM or k == SYM:
            spatial.append(SYM)
            continue
        s, p, d, op = (kw[name][i] for name in ("stride", "padding", "dilation",
                                                 "output_padding"))  # fmt: skip
        if transposed:
            spatial.append((n - 1) * s - 2 * p + d * (k - 1) + op + 1)
        else:
            spatial.append((n + 2 * p - d * (k - 1) - 1) // s + 1)
    return (x[0], channels, *spatial)


def check_conv_operands(op: str, x: Sequence[int], w: Sequence[int], kw: dict) -> None:
    """Ranks, channel counts and the output's spatial sizes of known extents."""
    groups = kw["groups"]
    in_channels = w[0] if kw["transposed"] else (SYM if w[1] == SYM else w[1] * groups)
    if x[1] not in (SYM, in_channels) and in_channels != SYM:
        raise ValueError(f"{op}: input has {x[1]} channels, the weight expects {in_channels} "
                         f"(groups={groups})")  # fmt: skip
    if not kw["transposed"] and w[0] not in (SYM,) and w[0] % groups:
        raise ValueError(f"{op}: {w[0]} output channels do not split into {groups} groups")
    if any(e != SYM and e < 1 for e in conv_output_shape(x, w, kw)[2:]):
        raise ValueError(f"{op}: input {list(x)} with weight {list(w)} and {kw} gives an empty "
                         "output")  # fmt: skip


class ConvolutionOps(OpsBase):
    def _conv_infos(self, op: str, x: Any, w: Any, layout: tuple) -> tuple:
        ix, iw = self._info(x), self._info(w)
        if ix.dtype is not iw.dtype or ix.dtype not in CONV_DTYPES:
            raise TypeError(f"{op}: input and weight must share one floating dtype, got "
                            f"{ix.dtype!r} and {iw.dtype!r}")  # fmt: skip
        if ix.ndim < 3 or ix.ndim != iw.ndim:
            raise ValueError(f"{op}: input and weight must be [N, C, *spatial] and [C_out, "
                             f"C_in / groups, *kernel] of one rank >= 3, got ranks {ix.ndim} "
                             f"and {iw.ndim}")  # fmt: skip
        kw = dict(layout)
        check_conv_operands(op, ix.shape, iw.shape, kw)
        return ix, iw, kw

    def convolution(self, input, weight, bias=None, stride=(1,), padding=(0,), dilation=(1,),
                    transposed=False, output_padding=(0,), groups=1, channels_last=False):  # fmt: skip
        """torch's aten::convolution: [N, C_in, *spatial] with a weight [C_out, C_in /
        groups, *kernel] ([C_in, C_out / groups, *kernel] transposed) and an optional bias
        [C_out]. `channels_last`: Note [Channels-last convolutions]."""
        op = "convolution"
        x, w = self._tensor(input, op, "input"), self._tensor(weight, op, "weight")
        b = None if bias is None else self._tensor(bias, op, "bias")
        layout = conv_layout(self._info(x).ndim - 2, stride, padding, dilation, transposed,
                             output_padding, groups)  # fmt: skip
        layout += _channels_last_kw(channels_last, self._info(x).ndim)

        def infer() -> list:
            ix, iw, kw = self._conv_infos(op, x, w, layout)
            out = conv_output_shape(ix.shape, iw.shape, kw)
            if b is not None:
                ib = self._info(b)
                if ib.dtype is not ix.dtype or ib.ndim != 1:
                    raise ValueError(f"{op}: bias must be 1-D {ix.dtype!r}, got rank {ib.ndim} "
                                     f"{ib.dtype!r}")  # fmt: skip
                if SYM not in (ib.shape[0], out[1]) and ib.shape[0] != out[1]:
                    raise ValueError(f"{op}: bias has {ib.shape[0]} entries for {out[1]} "
                                     "output channels")  # fmt: skip
            return [TensorInfo(ix.dtype, out)]

        return self._apply(Record("op", op, (x, w, b), layout, self._out("T")), infer)

    def convolution_backward(self, grad_output, input, weight, stride=(1,), padding=(0,),
                             dilation=(1,), transposed=False, output_padding=(0,), groups=1,
                             output_mask=(True, True, True), channels_last=False):  # fmt: skip
        """torch's aten::convolution_backward: (grad_input, grad_weight, grad_bias), None
        where `output_mask` does not ask for it; grad_bias is the sum over all dims but the
        channels (the bias's size is the output's channel count). `channels_last`: Note
        [Channels-last convolutions]."""
        op = "convolution_backward"
        go = self._tensor(grad_output, op, "grad_output")
        x, w = self._tensor(input, op, "input"), self._tensor(weight, op, "weight")
        layout = conv_layout(self._info(x).ndim - 2, stride, padding, dilation, transposed,
                             output_padding, groups)  # fmt: skip
        mask = tuple(bool(m) for m in output_mask)
        if len(mask) != 3 or not any(mask):
            raise ValueError(f"{op}: output_mask must be 3 flags, one at least set, got "
                             f"{list(output_mask)}")  # fmt: skip

        def infer() -> list:
            ix, iw, kw = self._conv_infos(op, x, w, layout)
            igo = self._info(go)
            out = conv_output_shape(ix.shape, iw.shape, kw)
            if igo.dtype is not ix.dtype or igo.ndim != ix.ndim:
                raise ValueError(f"{op}: grad_output must be a {ix.ndim}-D {ix.dtype!r} tensor, "
                                 f"got rank {igo.ndim} {igo.dtype!r}")  # fmt: skip
            for e, g in zip(out, igo.shape):
                if SYM not in (e, g) and e != g:
                    raise ValueError(f"{op}: grad_output {list(igo.shape)} is not the "
                                     f"output's shape {list(out)}")  # fmt: skip
            grads = (TensorInfo(ix.dtype, ix.shape), TensorInfo(ix.dtype, iw.shape),
                     TensorInfo(ix.dtype, (igo.shape[1],)))  # fmt: skip
            return [g for g, m in zip(grads, mask) if m]

        kwargs = (*layout, ("output_mask", mask),
                  *_channels_last_kw(channels_last, self._info(x).ndim))  # fmt: skip
        outs = self._apply(Record("op", op, (go, x, w), kwargs, self._out("T" * sum(mask))),
                           infer)  # fmt: skip
        outs = list(outs) if isinstance(outs, (tuple, list)) else [outs]
        return tuple(outs.pop(0) if m else None for m in mask)


def _channels_last_kw(asked: Any, ndim: int) -> tuple:
    """The record's channels_last keyword: present only when set (Note [Channels-last
    convolutions]); ranks torch has no channels-last format for refuse it."""
    if not asked:
        return ()
    if ndim not in (4, 5):  # torch's channels_last and channels_last_3d
        raise ValueError(f"convolution: channels_last needs a 4-D or 5-D input, got rank {ndim}")
    return (("channels_last", True),)
