"""Elementwise op semantics in one table: arity, result dtype rule and the torch reference.

The frontend (`ops.py`) builds records from this table, the reference evaluator runs the
torch functions, and codegen maps the same names to CUDA expressions, so the three cannot
drift apart on which ops exist.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from ..dtypes import (
    DataType,
    float_result,
    is_complex,
    is_float,
    is_integral,
    is_storage_only,
    promote,
    real_part,
    to_torch,
)
from ..values import ScalarInfo

# dtype rules: a function of the promoted input dtype -> result dtype (or TypeError)


def _same(dt: DataType) -> DataType:
    return dt


def _to_bool(dt: DataType) -> DataType:
    return DataType.Bool


def _integral_only(name: str) -> Callable[[DataType], DataType]:
    def rule(dt: DataType) -> DataType:
        if not is_integral(dt):
            raise TypeError(f"{name} needs integer or bool operands, got {dt!r}")
        return dt

    return rule


def _int_only(name: str) -> Callable[[DataType], DataType]:
    def rule(dt: DataType) -> DataType:
        if dt not in (DataType.Int, DataType.Int32, DataType.UInt64):
            raise TypeError(f"{name} needs integer operands, got {dt!r}")
        return dt

    return rule


def _div_rule(dt: DataType) -> DataType:
    # nvFuser's div truncates on integers (C semantics); bools divide as ints
    return DataType.Int if dt is DataType.Bool else dt


def _real_float_only(name: str) -> Callable[[DataType], DataType]:
    def rule(dt: DataType) -> DataType:
        if is_complex(dt):
            raise TypeError(f"{name} does not take complex operands, got {dt!r}")
        return float_result(dt)

    return rule


def _not_complex(name: str, then: Callable[[DataType], DataType]) -> Callable:
    def rule(dt: DataType) -> DataType:
        if is_complex(dt):
            raise TypeError(f"{name} does not take complex operands, got {dt!r}")
        return then(dt)

    return rule


@dataclass(frozen=True)
class ElementwiseOp:
    name: str
    arity: int
    result: Callable[[DataType], DataType]
    torch_fn: Callable[..., Any]
    # which operands take part in type promotion (ternary ops: where's condition does not)
    promote_args: tuple[int, ...] = ()


def _tensorize(args: tuple, dtype: DataType, like: torch.Tensor | None) -> list:
    """torch functions that refuse Python numbers get 0-dim tensors of the compute dtype."""
    out = []
    for a in args:
        if isinstance(a, torch.Tensor):
            out.append(a)
        else:
            device = like.device if like is not None else "cpu"
            out.append(torch.tensor(a, dtype=to_torch(dtype), device=device))
    return out


def _first_tensor(args: tuple) -> torch.Tensor | None:
    return next((a for a in args if isinstance(a, torch.Tensor)), None)


def _needs_tensors(fn: Callable) -> Callable:
    def run(*args: Any, dtype: DataType) -> Any:
        return fn(*_tensorize(args, dtype, _first_tensor(args)))

    return run


def _div(a: Any, b: Any, *, dtype: DataType) -> Any:
    if is_integral(dtype) or dtype is DataType.Int:
        a, b = _tensorize((a, b), dtype, _first_tensor((a, b)))
        return torch.div(a, b, rounding_mode="trunc")
    return torch.true_divide(*_tensorize((a, b), dtype, _first_tensor((a, b))))


def _truediv(a: Any, b: Any, *, dtype: DataType) -> Any:
    return torch.true_divide(*_tensorize((a, b), dtype, _first_tensor((a, b))))


def _float_unary(fn: Callable) -> Callable:
    def run(a: Any, *, dtype: DataType) -> Any:
        if not isinstance(a, torch.Tensor):
            return fn(torch.tensor(a, dtype=torch.float64))
        if not (a.is_floating_point() or a.is_complex()):
            a = a.to(to_torch(float_result(dtype)))  # torch computes ints in the default float
        return fn(a)

    return run


def _pow(a: Any, b: Any, *, dtype: DataType) -> Any:
    if isinstance(a, torch.Tensor) and not isinstance(b, torch.Tensor):
        return torch.pow(a, b)  # a Python exponent keeps torch's scalar path (bool ** True)
    return torch.pow(*_tensorize((a, b), dtype, _first_tensor((a, b))))


def _erfcinv(t: torch.Tensor) -> torch.Tensor:
    return torch.erfinv(1 - t)


def _logical_right_shift(a: Any, b: Any, *, dtype: DataType) -> Any:
    a, b = _tensorize((a, b), dtype, _first_tensor((a, b)))
    bits = 32 if dtype is DataType.Int32 else 64
    if bits == 32:
        wide = a.to(torch.int64) & 0xFFFFFFFF
        return torch.where(b >= 32, 0, wide >> b.clamp(0, 31)).to(torch.int32)
    safe = b.clamp(1, 63)
    mask = (torch.ones_like(a) << (64 - safe)) - 1
    shifted = (a >> safe) & mask
    return torch.where(b <= 0, a, torch.where(b >= 64, torch.zeros_like(a), shifted))


def _add_alpha(a: Any, b: Any, alpha: Any, *, dtype: DataType) -> Any:
    return torch.add(*_tensorize((a, b), dtype, _first_tensor((a, b))), alpha=alpha)


def _sub_alpha(a: Any, b: Any, alpha: Any, *, dtype: DataType) -> Any:
    return torch.sub(*_tensorize((a, b), dtype, _first_tensor((a, b))), alpha=alpha)


def _where(c: Any, a: Any, b: Any, *, dtype: DataType) -> Any:
    like = _first_tensor((c, a, b))
    (c,) = _tensorize((c,), DataType.Bool, like)
    a, b = _tensorize((a, b), dtype, like)
    return torch.where(c, a.to(to_torch(dtype)), b.to(to_torch(dtype)))


def _lerp(s: Any, e: Any, w: Any, *, dtype: DataType) -> Any:
    s, e, w = _tensorize((s, e, w), dtype, _first_tensor((s, e, w)))
    td = to_torch(dtype)
    return torch.lerp(s.to(td), e.to(td), w.to(td))


def _clamp(x: Any, lo: Any, hi: Any, *, dtype: DataType) -> Any:
    (x,) = _tensorize((x,), dtype, None)
    return torch.clamp(x, lo, hi)


def _threshold(x: Any, th: Any, value: Any, *, dtype: DataType) -> Any:
    (x,) = _tensorize((x,), dtype, None)
    return torch.where(x > th, x, torch.as_tensor(value, dtype=x.dtype, device=x.device))


def _addcmul(a: Any, b: Any, c: Any, value: Any, *, dtype: DataType) -> Any:
    a, b, c = _tensorize((a, b, c), dtype, _first_tensor((a, b, c)))
    td = to_torch(dtype)
    return torch.addcmul(a.to(td), b.to(td), c.to(td), value=value)


def _set(a: Any, *, dtype: DataType) -> Any:
    return a.clone() if isinstance(a, torch.Tensor) else a


def _imag(a: Any, *, dtype: DataType) -> Any:
    (t,) = _tensorize((a,), dtype, None)
    return torch.imag(t) if t.is_complex() else torch.zeros_like(t)


def _frac(a: Any, *, dtype: DataType) -> Any:
    (t,) = _tensorize((a,), dtype, None)
    return torch.frac(t) if t.is_floating_point() else torch.zeros_like(t)


def _sign(a: Any, *, dtype: DataType) -> Any:
    (t,) = _tensorize((a,), dtype, None)
    return torch.sign(t) if t.dtype != torch.bool else t.clone()


def _rounding(fn: Callable) -> Callable:
    def run(a: Any, *, dtype: DataType) -> Any:
        (t,) = _tensorize((a,), dtype, None)
        return fn(t) if t.is_floating_point() else t.clone()

    return run


UNARY_FLOAT = {
    "acos": torch.acos, "acosh": torch.acosh, "asin": torch.asin, "asinh": torch.asinh,
    "atan": torch.atan, "atanh": torch.atanh, "cos": torch.cos, "cosh": torch.cosh,
    "exp": torch.exp, "exp2": torch.exp2, "expm1": torch.expm1, "erf": torch.erf,
    "erfc": torch.erfc, "erfinv": torch.erfinv, "erfcinv": _erfcinv, "lgamma": torch.lgamma,
    "log": torch.log, "log10": torch.log10, "log1p": torch.log1p, "log2": torch.log2,
    "reciprocal": torch.reciprocal, "rsqrt": torch.rsqrt, "sigmoid": torch.sigmoid,
    "silu": torch.nn.functional.silu, "sin": torch.sin, "sinh": torch.sinh, "sqrt": torch.sqrt,
    "tan": torch.tan, "tanh": torch.tanh,
}  # fmt: skip

# Note [UInt64 semantics]: torch has CPU kernels for few UInt64 ops, so the reference
# computes these on the int64 bit pattern: wrapping arithmetic and bitwise ops give the same
# bits, ordering flips the sign bit first, right shifts are logical, shifts of 64 or more
# give 0. Other ops refuse UInt64 operands when the definition is built.
_U64_WRAPPING = {"add", "sub", "mul", "neg", "bitwise_and", "bitwise_or", "bitwise_xor",
                 "bitwise_not", "bitwise_left_shift", "bitwise_right_shift",
                 "logical_right_shift", "eq", "ne", "where", "set", "segment_set", "abs", "relu"}
_U64_ORDERED = {"lt", "le", "gt", "ge", "maximum", "minimum"}
UINT64_OPS = frozenset(_U64_WRAPPING | _U64_ORDERED) | frozenset(UNARY_FLOAT)
_SIGN = -(2**63)


def _as_int64(v: Any, like: torch.Tensor | None) -> torch.Tensor:
    if isinstance(v, torch.Tensor):
        return v.view(torch.int64) if v.dtype == torch.uint64 else v
    v = int(v)
    v = v - 2**64 if v >= 2**63 else v
    return torch.tensor(v, dtype=torch.int64, device=like.device if like is not None else "cpu")


def _uint64(name: str, args: tuple) -> torch.Tensor:
    like = _first_tensor(args)
    if name == "where":
        c, a, b = args
        (c,) = _tensorize((c,), DataType.Bool, like)
        return torch.where(c, _as_int64(a, like), _as_int64(b, like)).view(torch.uint64)
    ts = [_as_int64(a, like) for a in args]
    if name in _U64_ORDERED:
        flipped = [t ^ _SIGN for t in ts]
        out = getattr(torch, name)(*flipped)
        return out if out.dtype == torch.bool else (out ^ _SIGN).view(torch.uint64)
    if name in ("set", "segment_set", "abs", "relu"):
        return ts[0].clone().view(torch.uint64)
    if name in ("bitwise_left_shift", "bitwise_right_shift", "logical_right_shift"):
        a, b = ts
        unsigned_big = (b < 0) | (b >= 64)
        safe = b.clamp(0, 63)
        if name == "bitwise_left_shift":
            shifted = a << safe
        else:  # logical: clear what the arithmetic shift smeared from the sign bit
            shifted = (a >> safe) & ((torch.ones_like(a) << (64 - safe).clamp(max=63)) - 1
                                     ).where(safe > 0, torch.full_like(a, -1))
        return torch.where(unsigned_big, torch.zeros_like(shifted), shifted).view(torch.uint64)
    out = getattr(torch, name)(*ts)
    return out if out.dtype == torch.bool else out.view(torch.uint64)


def _with_uint64(name: str, result: Callable, fn: Callable) -> tuple[Callable, Callable]:
    """The op's dtype rule and torch function, with UInt64 as Note [UInt64 semantics] says."""
    if name in UNARY_FLOAT:  # computed in Float after a cast, as torch does
        return result, fn

    def rule(dt: DataType) -> DataType:
        if dt is DataType.UInt64 and name not in UINT64_OPS:
            raise TypeError(f"{name} does not take UInt64 operands (torch has no such kernel)")
        return result(dt)

    def run(*args: Any, dtype: DataType) -> Any:
        if dtype is DataType.UInt64:
            return _uint64(name, args)
        return fn(*args, dtype=dtype)

    return rule, run


OPS: dict[str, ElementwiseOp] = {}


def _add(name: str, arity: int, result: Callable, fn: Callable, promote=None) -> None:
    result, fn = _with_uint64(name, result, fn)
    OPS[name] = ElementwiseOp(name, arity, result, fn, promote or tuple(range(arity)))


for _name, _fn in UNARY_FLOAT.items():
    _add(_name, 1, _not_complex(_name, float_result) if _name in ("erfinv", "erfcinv", "lgamma",
         "erf", "erfc", "expm1", "exp2", "log1p") else float_result, _float_unary(_fn))

_add("abs", 1, real_part, _needs_tensors(torch.abs))
_add("neg", 1, _same, _needs_tensors(torch.neg))
_add("ceil", 1, _same, _rounding(torch.ceil))
_add("floor", 1, _same, _rounding(torch.floor))
_add("round", 1, _same, _rounding(torch.round))
_add("trunc", 1, _same, _rounding(torch.trunc))
_add("frac", 1, _same, _frac)
_add("relu", 1, _same, _needs_tensors(torch.relu))
_add("sign", 1, _same, _sign)
_add("set", 1, _same, _set)
_add("segment_set", 1, _same, _set)
_add("bitwise_not", 1, _integral_only("bitwise_not"), _needs_tensors(torch.bitwise_not))
_add("logical_not", 1, _to_bool, _needs_tensors(torch.logical_not))
_add("signbit", 1, _not_complex("signbit", _to_bool), _needs_tensors(torch.signbit))
for _name, _fn in {"isfinite": torch.isfinite, "isinf": torch.isinf, "isnan": torch.isnan,
                   "isneginf": torch.isneginf, "isposinf": torch.isposinf,
                   "isreal": torch.isreal}.items():
    _add(_name, 1, _to_bool, _needs_tensors(_fn))
_add("real", 1, real_part, _needs_tensors(torch.real))
_add("imag", 1, real_part, _imag)
_add("conj", 1, _same, _needs_tensors(torch.conj_physical))

_add("add", 2, _same, _needs_tensors(torch.add))
_add("sub", 2, _same, _needs_tensors(torch.sub))
_add("mul", 2, _same, _needs_tensors(torch.mul))
_add("div", 2, _div_rule, _div)
_add("truediv", 2, float_result, _truediv)
_add("fmod", 2, _not_complex("fmod", _same), _needs_tensors(torch.fmod))
_add("remainder", 2, _not_complex("remainder", _same), _needs_tensors(torch.remainder))
_add("mod", 2, _not_complex("mod", _same), _needs_tensors(torch.remainder))
_add("pow", 2, _same, _pow)
_add("atan2", 2, _real_float_only("atan2"), _needs_tensors(torch.atan2))
_add("minimum", 2, _not_complex("minimum", _same), _needs_tensors(torch.minimum))
_add("maximum", 2, _not_complex("maximum", _same), _needs_tensors(torch.maximum))
_add("nextafter", 2, _real_float_only("nextafter"), _needs_tensors(torch.nextafter))
_add("gcd", 2, _int_only("gcd"), _needs_tensors(torch.gcd))
for _name, _fn in {"eq": torch.eq, "ne": torch.ne, "lt": torch.lt, "le": torch.le,
                   "gt": torch.gt, "ge": torch.ge}.items():
    _add(_name, 2, _to_bool, _needs_tensors(_fn))
_add("logical_and", 2, _to_bool, _needs_tensors(torch.logical_and))
_add("logical_or", 2, _to_bool, _needs_tensors(torch.logical_or))
_add("bitwise_and", 2, _integral_only("bitwise_and"), _needs_tensors(torch.bitwise_and))
_add("bitwise_or", 2, _integral_only("bitwise_or"), _needs_tensors(torch.bitwise_or))
_add("bitwise_xor", 2, _integral_only("bitwise_xor"), _needs_tensors(torch.bitwise_xor))
_add("bitwise_left_shift", 2, _int_only("bitwise_left_shift"),
     _needs_tensors(torch.bitwise_left_shift))
_add("bitwise_right_shift", 2, _int_only("bitwise_right_shift"),
     _needs_tensors(torch.bitwise_right_shift))
_add("logical_right_shift", 2, _int_only("logical_right_shift"), _logical_right_shift)
_add("add_alpha", 3, _same, _add_alpha, (0, 1, 2))
_add("sub_alpha", 3, _same, _sub_alpha, (0, 1, 2))

_add("where", 3, _same, _where, (1, 2))
_add("lerp", 3, _not_complex("lerp", float_result), _lerp)
_add("clamp", 3, _not_complex("clamp", _same), _clamp, (0,))
_add("threshold", 3, _not_complex("threshold", _same), _threshold, (0,))
_add("addcmul", 4, _same, _addcmul, (0, 1, 2))

_MOVES_ONLY = frozenset({"set", "segment_set", "where"})


def scalar_result(value: Any, dtype: DataType) -> Any:
    """Bring a 0-dim torch result of a scalar-only op back to a Python number."""
    if isinstance(value, torch.Tensor):
        value = value.item()
    if dtype is DataType.Bool:
        return bool(value)
    if dtype in (DataType.Int, DataType.Int32, DataType.UInt64):
        return int(value)
    if is_float(dtype):
        return float(value)
    return complex(value)


def promoted_dtype(spec: ElementwiseOp, infos: Sequence) -> DataType:
    """The dtype an elementwise op computes in, by torch's rules (Note [Promotion])."""
    if spec.name in _MOVES_ONLY:
        dts = {infos[idx].dtype for idx in spec.promote_args}
        if len(dts) == 1 and is_storage_only(next(iter(dts))):
            return dts.pop()  # moving storage-only values computes nothing
    classes = []
    for idx in spec.promote_args:
        info = infos[idx]
        cls = 0 if isinstance(info, ScalarInfo) else (2 if info.ndim else 1)
        classes.append((cls, info.dtype))
    return promote(tuple(classes))
