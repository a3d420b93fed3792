"""Lowerings of primitive aten ops: elementwise math, casts, reductions and shape ops."""
from __future__ import annotations

from typing import Any

from fusion_cache.frontend.dtypes import DataType, is_float, is_integral

from .lowering import (
    Args,
    LoweringContext,
    UnsupportedOpError,
    as_datatype,
    dims_of,
    is_handle,
    is_tensor,
    lowers,
    scalar_type_code,
)

# ---- elementwise ----------------------------------------------------------------------------

# aten names that are fd.ops unary ops of the same name and meaning
_UNARY = (
    "abs acos acosh asin asinh atan atanh ceil cos cosh exp exp2 expm1 erf erfc erfinv floor "
    "frac lgamma log log10 log1p log2 neg reciprocal round rsqrt sigmoid sign silu sin sinh "
    "sqrt tan tanh trunc relu isfinite isinf isnan logical_not bitwise_not signbit"
).split()
_BINARY = (
    "mul eq ne lt le gt ge maximum minimum fmod remainder atan2 logical_and logical_or "
    "bitwise_and bitwise_or bitwise_xor"
).split()


def _unary(name: str):
    def lower(ctx: LoweringContext, a: Args) -> Any:
        if name == "round" and a.get("decimals", 0) != 0:
            raise UnsupportedOpError("round with decimals != 0")
        return getattr(ctx.ops, name)(a[0])

    return lower


def _binary(name: str):
    def lower(ctx: LoweringContext, a: Args) -> Any:
        return getattr(ctx.ops, name)(a[0], a[1])

    return lower


for _name in _UNARY:
    lowers(_name)(_unary(_name))
for _name in _BINARY:
    lowers(_name)(_binary(_name))


for _dunder, _name in (("__and__", "bitwise_and"), ("__or__", "bitwise_or"),
                       ("__xor__", "bitwise_xor")):
    lowers(_dunder)(_binary(_name))


@lowers("__invert__")
def _invert(ctx: LoweringContext, a: Args) -> Any:
    x = a[0]
    return ctx.ops.logical_not(x) if x.dtype is DataType.Bool else ctx.ops.bitwise_not(x)


@lowers("positive")
def _positive(ctx: LoweringContext, a: Args) -> Any:
    return a[0]


@lowers("square")
def _square(ctx: LoweringContext, a: Args) -> Any:
    return ctx.ops.mul(a[0], a[0])


def _is_one(value: Any) -> bool:
    return not is_handle(value) and value == 1


@lowers("add")
def _add(ctx: LoweringContext, a: Args) -> Any:
    alpha = a.get("alpha", 1)
    if _is_one(alpha):
        return ctx.ops.add(a[0], a[1])
    return ctx.ops.add_alpha(a[0], a[1], alpha)


@lowers("sub")
def _sub(ctx: LoweringContext, a: Args) -> Any:
    alpha = a.get("alpha", 1)
    if _is_one(alpha):
        return ctx.ops.sub(a[0], a[1])
    return ctx.ops.sub_alpha(a[0], a[1], alpha)


@lowers("rsub")
def _rsub(ctx: LoweringContext, a: Args) -> Any:
    alpha = a.get("alpha", 1)  # other - alpha * self
    if _is_one(alpha):
        return ctx.ops.sub(a[1], a[0])
    return ctx.ops.sub_alpha(a[1], a[0], alpha)


def _dtype_of(value: Any) -> DataType:
    if is_handle(value):
        return value.dtype
    if isinstance(value, bool):
        return DataType.Bool
    return DataType.Int if isinstance(value, int) else DataType.Double


@lowers("div", "true_divide", "floordiv")
def _div(ctx: LoweringContext, a: Args) -> Any:
    x, y = a[0], a[1]
    mode = a.get("rounding_mode")
    if a.op == "aten::floordiv":
        mode = "floor"
    if mode is None:
        return ctx.ops.truediv(x, y)
    ints = is_integral(_dtype_of(x)) and is_integral(_dtype_of(y))
    if mode == "trunc":
        return ctx.ops.div(x, y) if ints else ctx.ops.trunc(ctx.ops.truediv(x, y))
    if mode == "floor" and not ints:
        return ctx.ops.floor(ctx.ops.truediv(x, y))
    if mode == "floor" and not is_tensor(x) and not is_tensor(y):
        return ctx.ops.div(x, y)  # sizes in view arithmetic: non-negative, so trunc == floor
    raise UnsupportedOpError(f"division with rounding_mode={mode!r} on integers")


@lowers("pow")
def _pow(ctx: LoweringContext, a: Args) -> Any:
    return ctx.ops.pow(a[0], a[1])


@lowers("where")
def _where(ctx: LoweringContext, a: Args) -> Any:
    return ctx.ops.where(a[0], a[1], a[2])


@lowers("masked_fill")
def _masked_fill(ctx: LoweringContext, a: Args) -> Any:
    x, mask, value = a[0], a[1], a[2]
    if is_tensor(value) and value.dtype is not x.dtype:
        value = ctx.ops.cast(value, x.dtype)
    return _cast_to(ctx, ctx.ops.where(mask, value, x), x.dtype)


@lowers("lerp")
def _lerp(ctx: LoweringContext, a: Args) -> Any:
    return ctx.ops.lerp(a[0], a[1], a[2])


@lowers("addcmul")
def _addcmul(ctx: LoweringContext, a: Args) -> Any:
    return ctx.ops.addcmul(a[0], a[1], a[2], a.get("value", 1))


@lowers("clamp", "clip")
def _clamp(ctx: LoweringContext, a: Args) -> Any:
    x, lo, hi = a[0], a.get("min"), a.get("max")
    if lo is not None and hi is not None and not is_tensor(lo) and not is_tensor(hi):
        return ctx.ops.clamp(x, lo, hi)
    if lo is not None:
        x = ctx.ops.maximum(x, lo)
    if hi is not None:
        x = ctx.ops.minimum(x, hi)
    return x


@lowers("clamp_min")
def _clamp_min(ctx: LoweringContext, a: Args) -> Any:
    return ctx.ops.maximum(a[0], a[1])


@lowers("clamp_max")
def _clamp_max(ctx: LoweringContext, a: Args) -> Any:
    return ctx.ops.minimum(a[0], a[1])


@lowers("threshold")
def _threshold(ctx: LoweringContext, a: Args) -> Any:
    return ctx.ops.threshold(a[0], a[1], a[2])


@lowers("leaky_relu")
def _leaky_relu(ctx: LoweringContext, a: Args) -> Any:
    x, slope = a[0], a.get("negative_slope", 0.01)
    return ctx.ops.where(ctx.ops.gt(x, 0), x, ctx.ops.mul(x, slope))


# ---- casts ----------------------------------------------------------------------------------


def _cast_to(ctx: LoweringContext, x: Any, dtype: DataType) -> Any:
    if is_handle(x) and x.dtype is dtype:
        return x
    return ctx.ops.cast(x, dtype)


@lowers("to", "_to_copy")
def _to(ctx: LoweringContext, a: Args) -> Any:
    # the device argument is not ours to honour: a fusion runs where its inputs are
    other = a.get("other")
    if is_tensor(other):
        return _cast_to(ctx, a[0], other.dtype)
    dtype = a.get("dtype")
    if dtype is None and len(a) > 1 and not a.names:
        dtype = a[1]
    return a[0] if dtype is None else _cast_to(ctx, a[0], as_datatype(dtype))


@lowers("type_as")
def _type_as(ctx: LoweringContext, a: Args) -> Any:
    return _cast_to(ctx, a[0], a[1].dtype)


@lowers("prims::convert_element_type", "_autocast_to_reduced_precision")
def _convert(ctx: LoweringContext, a: Args) -> Any:
    return _cast_to(ctx, a[0], as_datatype(a[1]))


@lowers("prim::dtype")
def _prim_dtype(ctx: LoweringContext, a: Args) -> Any:
    return scalar_type_code(a[0].dtype)


# ---- reductions -----------------------------------------------------------------------------


def _reduce_dims(a: Args, x: Any) -> list[int]:
    return dims_of(a.get("dim"), x.ndim)


def _reduced_precision(dtype: DataType) -> bool:
    return dtype in (DataType.Half, DataType.BFloat16)


@lowers("sum")
def _sum(ctx: LoweringContext, a: Args) -> Any:
    x = a[0]
    dtype = a.get("dtype")
    out = DataType.Null if dtype is None else as_datatype(dtype)
    return ctx.ops.sum(x, _reduce_dims(a, x), bool(a.get("keepdim", False)), out)


@lowers("mean")
def _mean(ctx: LoweringContext, a: Args) -> Any:
    x = a[0]
    if a.get("dtype") is not None:
        x = _cast_to(ctx, x, as_datatype(a.get("dtype")))
    if not is_float(x.dtype):
        raise UnsupportedOpError(f"mean of a {x.dtype!r} tensor (torch refuses it too)")
    dims = _reduce_dims(a, x)
    wide = _cast_to(ctx, x, DataType.Float) if _reduced_precision(x.dtype) else x
    total = ctx.ops.sum(wide, dims, bool(a.get("keepdim", False)))
    return _cast_to(ctx, ctx.ops.truediv(total, ctx.numel(x, dims)), x.dtype)


@lowers("amax", "amin")
def _amax(ctx: LoweringContext, a: Args) -> Any:
    x = a[0]
    fn = ctx.ops.max if a.op == "aten::amax" else ctx.ops.min
    return fn(x, _reduce_dims(a, x), bool(a.get("keepdim", False)))


@lowers("max", "min")
def _max(ctx: LoweringContext, a: Args) -> Any:
    x = a[0]
    if len(a) == 1:  # max(Tensor): the full reduction
        fn = ctx.ops.max if a.op == "aten::max" else ctx.ops.min
        return fn(x, list(range(x.ndim)), False)
    if is_tensor(a[1]) and len(a) == 2:  # max.other: elementwise
        return (ctx.ops.maximum if a.op == "aten::max" else ctx.ops.minimum)(x, a[1])
    raise UnsupportedOpError(f"{a.op} along a dim (it returns indices)")


def _correction(a: Args) -> int | float:
    if "correction" in a.names:
        c = a.get("correction")
        return 1 if c is None else c
    return 1 if a.get("unbiased", True) else 0


@lowers("var", "std")
def _var(ctx: LoweringContext, a: Args) -> Any:
    x = a[0]
    dims = _reduce_dims(a, x)
    wide = _cast_to(ctx, x, DataType.Float) if _reduced_precision(x.dtype) else x
    var = ctx.ops.var(wide, dims, _correction(a), bool(a.get("keepdim", False)))
    if a.op == "aten::std":
        var = ctx.ops.sqrt(var)
    return _cast_to(ctx, var, x.dtype)


@lowers("var_mean")
def _var_mean(ctx: LoweringContext, a: Args) -> Any:
    x = a[0]
    var, mean = ctx.ops.var_mean(x, _reduce_dims(a, x), _correction(a),
                                 bool(a.get("keepdim", False)))  # fmt: skip
    return var, mean


# ---- shape ops ------------------------------------------------------------------------------


def _same(ctx: LoweringContext, a: Args) -> Any:
    return a[0]


for _name in ("contiguous", "clone", "detach", "alias", "lift_fresh_copy", "_unsafe_view_copy"):
    lowers(_name)(_same)


@lowers("view", "reshape", "_unsafe_view", "_reshape_alias", "view_copy")
def _view(ctx: LoweringContext, a: Args) -> Any:
    x, sizes = a[0], list(a[1])
    static = all(isinstance(s, int) and not isinstance(s, bool) for s in sizes)
    old = [ctx.known_extent(x, d) for d in range(x.ndim)]
    if static and old == sizes:
        return x  # a view to the same sizes (common in aten graphs) changes nothing
    unit = [d for d, s in enumerate(old) if s == 1]
    if static and unit and None not in old and 1 not in sizes \
            and [s for s in old if s != 1] == sizes and all(ctx.shape(x)[d] == 1 for d in unit):
        # every size-1 dim dropped (a keepdim sum viewed to a bias's shape): a squeeze, which
        # a reduction takes as its epilogue, where a reshape split it into a second kernel
        # (GPT-2's bias gradients under autocast)
        return ctx.ops.squeeze(x, unit)
    return ctx.ops.reshape(x, sizes)


@lowers("flatten")
def _flatten(ctx: LoweringContext, a: Args) -> Any:
    x = a[0]
    if x.ndim == 0:
        return ctx.ops.reshape(x, [1])
    start, end = dims_of(a.get("start_dim", 0), x.ndim)[0], dims_of(a.get("end_dim", -1), x.ndim)[0]
    if start >= end:
        return x
    sizes = ctx.extents(x)
    return ctx.ops.reshape(x, sizes[:start] + [-1] + sizes[end + 1 :])


@lowers("permute")
def _permute(ctx: LoweringContext, a: Args) -> Any:
    x = a[0]
    order = [d % x.ndim for d in a[1]]
    return x if order == list(range(x.ndim)) else ctx.ops.permute(x, order)


@lowers("t", "numpy_T")
def _t(ctx: LoweringContext, a: Args) -> Any:
    x = a[0]
    return x if x.ndim < 2 else ctx.ops.permute(x, list(range(x.ndim))[::-1])


@lowers("transpose")
def _transpose(ctx: LoweringContext, a: Args) -> Any:
    x = a[0]
    if x.ndim < 2:
        return x
    d0, d1 = a[1] % x.ndim, a[2] % x.ndim
    if d0 == d1:
        return x
    order = list(range(x.ndim))
    order[d0], order[d1] = order[d1], order[d0]
    return ctx.ops.permute(x, order)


@lowers("unsqueeze")
def _unsqueeze(ctx: LoweringContext, a: Args) -> Any:
    x = a[0]
    d = a[1] % (x.ndim + 1)
    return ctx.ops.broadcast(x, [i == d for i in range(x.ndim + 1)])


@lowers("squeeze")
def _squeeze(ctx: LoweringContext, a: Args) -> Any:
    # torch leaves a dim of size != 1 alone; Note [Frontend shapes]: size-1 dims are
    # declared as broadcast (1), so a symbolic (-1) dim is one that is not squeezed
    x = a[0]
    dims = dims_of(a.get("dim"), x.ndim)
    dims = [d for d in dims if ctx.shape(x)[d] == 1]
    return ctx.ops.squeeze(x, dims) if dims else x


def _expand_to(ctx: LoweringContext, x: Any, sizes: list[Any]) -> Any:
    extra = len(sizes) - x.ndim
    if extra < 0:
        raise UnsupportedOpError(f"expand to {sizes}: fewer dims than the tensor's {x.ndim}")
    if extra:
        x = ctx.ops.broadcast(x, [True] * extra + [False] * (len(sizes) - extra))
    codes = ctx.shape(x)
    # nothing to do when every target size is -1 or the same static size
    if all(is_handle(s) is False and (s == -1 or s == c) for s, c in zip(sizes, codes)):
        return x
    return ctx.ops.expand(x, sizes)


@lowers("expand", "expand_copy")
def _expand(ctx: LoweringContext, a: Args) -> Any:
    return _expand_to(ctx, a[0], list(a[1]))


@lowers("expand_as")
def _expand_as(ctx: LoweringContext, a: Args) -> Any:
    return _expand_to(ctx, a[0], ctx.extents(a[1]))


@lowers("copy_")
def _copy_into_input(ctx: LoweringContext, a: Args) -> Any:
    """Note [Buffer updates in place]: AOTAutograd, told to keep input mutations
    (keep_inference_input_mutations), ends a training forward with copy_(buffer, new value)
    for each module buffer it updates (batch norm's running statistics and counter). Into a
    region input, the copy is an output written into that input (alias_input): the kernel
    that computes the value stores it in place, where eager copied it over after the graph."""
    dst, src = a[0], a[1]
    if not (is_tensor(dst) and dst.index in ctx.fd.inputs()):
        raise UnsupportedOpError("copy_ into a value the region computes (not one of its inputs)")
    value = _cast_to(ctx, src, dst.dtype) if is_tensor(src) else ctx.ops.full(
        ctx.extents(dst), src, dst.dtype)  # fmt: skip
    value = _expand_to(ctx, value, ctx.extents(dst)) if value.ndim == dst.ndim else (
        ctx.ops.broadcast_in_dim(value, ctx.extents(dst),
                                 list(range(dst.ndim - value.ndim, dst.ndim))))  # fmt: skip
    if value.index == dst.index:
        return dst
    ctx.fd.add_output(value, alias_input=dst)
    return dst


@lowers("size")
def _size(ctx: LoweringContext, a: Args) -> Any:
    x = a[0]
    if len(a) > 1 and a[1] is not None:
        return ctx.extent(x, a[1] % x.ndim)
    return ctx.extents(x)


@lowers("dim")
def _dim(ctx: LoweringContext, a: Args) -> Any:
    return a[0].ndim


@lowers("numel")
def _numel(ctx: LoweringContext, a: Args) -> Any:
    return ctx.numel(a[0], list(range(a[0].ndim)))


@lowers("zeros_like", "ones_like", "full_like")
def _full_like(ctx: LoweringContext, a: Args) -> Any:
    x = a[0]
    fill = {"aten::zeros_like": 0, "aten::ones_like": 1}.get(a.op)
    if fill is None:
        fill = a[1]
    dtype = a.get("dtype")
    dt = x.dtype if dtype is None else as_datatype(dtype)
    return ctx.ops.full(ctx.extents(x), fill, dt)


def _creation_dtype(a: Args, like: Any, fill: Any) -> DataType:
    dtype = a.get("dtype")
    if dtype is not None:
        return as_datatype(dtype)
    if like is not None:
        return like.dtype
    return _dtype_of(fill) if isinstance(fill, (bool, int)) else DataType.Float


@lowers("full", "zeros", "ones", "new_full", "new_zeros", "new_ones", "scalar_tensor")
def _full(ctx: LoweringContext, a: Args) -> Any:
    name = a.op.split("::")[-1]
    like = a[0] if name.startswith("new_") else None
    shape = [] if name == "scalar_tensor" else list(a[1] if like is not None else a[0])
    if name == "scalar_tensor":
        fill = a[0]
    elif name.endswith("full"):
        fill = a[2] if like is not None else a[1]
    else:
        fill = 0 if name.endswith("zeros") else 1
    return ctx.ops.full(shape, fill, _creation_dtype(a, like, fill))


@lowers("arange")
def _arange(ctx: LoweringContext, a: Args) -> Any:
    if "start" in a.names:  # arange.start / arange.start_step
        start, end, step = a.get("start", 0), a.get("end"), a.get("step", 1)
    else:
        start, end, step = 0, a[0], 1
    if any(is_handle(v) for v in (start, end, step)):
        raise UnsupportedOpError("arange whose bounds are known only at run time")
    length = max(0, -(-(end - start) // step)) if all(isinstance(v, int) for v in
                                                       (start, end, step)) else None  # fmt: skip
    if length is None:
        raise UnsupportedOpError("arange over floats")
    dtype = as_datatype(a.get("dtype")) if a.get("dtype") is not None else DataType.Int
    return ctx.ops.iota(length, start, step, dtype)
