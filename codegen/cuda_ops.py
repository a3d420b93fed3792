"""Op name -> CUDA C++ expression, given operand expressions already in the compute type.

Half and bfloat16 values live in float registers (Note [Register types]); they are rounded
only where the fusion casts to them and where they are stored.
"""
from __future__ import annotations

import math

from fusion_cache.frontend.dtypes import DataType

REGISTER_TYPE = {
    DataType.Double: "double", DataType.Float: "float", DataType.Half: "float",
    DataType.BFloat16: "float", DataType.Int: "long long", DataType.Int32: "int",
    DataType.Bool: "bool",
}  # fmt: skip

# one-word names (the prelude's int64_t, not "long long"): renderers value-initialise with
# `T()`, which C++ does not take of a two-word type
MEMORY_TYPE = {
    DataType.Double: "double", DataType.Float: "float", DataType.Half: "fc_half",
    DataType.BFloat16: "fc_bf16", DataType.Int: "int64_t", DataType.Int32: "int",
    DataType.Bool: "bool",
}  # fmt: skip

ELEMENT_BYTES = {
    DataType.Double: 8, DataType.Float: 4, DataType.Half: 2, DataType.BFloat16: 2,
    DataType.Int: 8, DataType.Int32: 4, DataType.Bool: 1,
}  # fmt: skip

# float-math functions: same name for float and double thanks to CUDA's C++ overloads
_MATH = {
    "acos": "acos", "acosh": "acosh", "asin": "asin", "asinh": "asinh", "atan": "atan",
    "atanh": "atanh", "cos": "cos", "cosh": "cosh", "exp": "exp", "exp2": "exp2",
    "expm1": "expm1", "erf": "erf", "erfc": "erfc", "erfinv": "fc_erfinv",
    "erfcinv": "fc_erfcinv", "lgamma": "fc_lgamma", "log": "log", "log10": "log10",
    "log1p": "log1p", "log2": "log2", "rsqrt": "rsqrt", "sigmoid": "fc_sigmoid",
    "silu": "fc_silu", "sin": "sin", "sinh": "sinh", "sqrt": "sqrt", "tan": "tan",
    "tanh": "tanh",
}  # fmt: skip

# ops costing tens of instructions a value: a body with one is compute-heavy per byte
TRANSCENDENTAL = frozenset(_MATH) | {"pow", "atan2", "fmod", "remainder"}

_PREDICATES = {
    "isfinite": "fc_isfinite", "isinf": "fc_isinf", "isnan": "fc_isnan",
    "isneginf": "fc_isneginf", "isposinf": "fc_isposinf", "signbit": "fc_signbit",
}  # fmt: skip

_COMPARE = {"eq": "==", "ne": "!=", "lt": "<", "le": "<=", "gt": ">", "ge": ">="}
_BITWISE = {"bitwise_and": "&", "bitwise_or": "|", "bitwise_xor": "^"}


def literal(value: object, dtype: DataType) -> str:
    """A constant as a CUDA literal of its register type."""
    ctype = REGISTER_TYPE[dtype]
    if dtype is DataType.Bool:
        return "true" if value else "false"
    if dtype in (DataType.Int, DataType.Int32):
        v = int(value)
        if v == -(2**63):
            return "(-9223372036854775807LL - 1)"
        return f"{v}LL" if dtype is DataType.Int else f"{v}"
    v = float(value)
    if math.isnan(v):
        return f"fc_nan<{ctype}>()"
    if math.isinf(v):
        return f"({'-' if v < 0 else ''}fc_inf<{ctype}>())"
    text = repr(v)
    return f"{text}f" if ctype == "float" else text


def convert(expr: str, src: DataType, dst: DataType) -> str:
    """Convert a register value between dtypes; casts to half/bf16 round through storage."""
    if src is dst:
        return expr
    if dst is DataType.Half:
        return f"fc_to_float(fc_to_half({expr}))"
    if dst is DataType.BFloat16:
        return f"fc_to_float(fc_to_bf16({expr}))"
    if dst is DataType.Bool:
        return f"(({expr}) != 0)"
    if REGISTER_TYPE[src] == REGISTER_TYPE[dst]:
        return expr
    return f"(({REGISTER_TYPE[dst]})({expr}))"


def _is_int(dtype: DataType) -> bool:
    return dtype in (DataType.Int, DataType.Int32, DataType.Bool)


def render_op(name: str, args: list[str], compute: DataType) -> str:
    """`args` are already converted to `compute` (promotion done by the caller)."""
    a = args[0] if args else ""
    b = args[1] if len(args) > 1 else ""
    ct = REGISTER_TYPE[compute]
    if name == "exp" and compute is not DataType.Double:
        # exp2 of x*log2(e): the hardware's exp2 path, within a few ulp of expf and much cheaper
        return f"exp2f({a} * 1.4426950408889634f)"
    if name in _MATH:
        return f"{_MATH[name]}({a})"
    if name in _PREDICATES:
        return f"{_PREDICATES[name]}({a})"
    if name in _COMPARE:
        return f"({a} {_COMPARE[name]} {b})"
    if name in _BITWISE:
        return f"({a} {_BITWISE[name]} {b})"
    table = {
        "abs": lambda: f"fc_abs({a})" if not _is_int(compute) else f"({a} < 0 ? -{a} : {a})",
        "neg": lambda: f"(-{a})",
        "ceil": lambda: f"ceil({a})" if not _is_int(compute) else a,
        "floor": lambda: f"floor({a})" if not _is_int(compute) else a,
        "trunc": lambda: f"trunc({a})" if not _is_int(compute) else a,
        "round": lambda: f"fc_round_half_even({a})" if not _is_int(compute) else a,
        "frac": lambda: f"fc_frac({a})" if not _is_int(compute) else f"(({ct})0)",
        "relu": lambda: f"({a} > ({ct})0 ? {a} : ({ct})0)" if _is_int(compute) else f"fc_relu({a})",
        "sign": lambda: (f"(({ct})(({a} > 0) - ({a} < 0)))" if _is_int(compute)
                         else f"fc_sign({a})"),
        "set": lambda: a,
        "segment_set": lambda: a,
        "reciprocal": lambda: f"(({ct})1 / {a})",
        "bitwise_not": lambda: f"(!{a})" if compute is DataType.Bool else f"(~{a})",
        "logical_not": lambda: f"(!{a})",
        "isreal": lambda: "true",
        "real": lambda: a,
        "imag": lambda: f"(({ct})0)",
        "add": lambda: f"({a} + {b})" if compute is not DataType.Bool else f"({a} || {b})",
        "sub": lambda: f"({a} - {b})",
        "mul": lambda: f"({a} * {b})" if compute is not DataType.Bool else f"({a} && {b})",
        "div": lambda: f"fc_div_trunc({a}, {b})" if _is_int(compute) else f"({a} / {b})",
        "truediv": lambda: f"({a} / {b})",
        "fmod": lambda: f"fc_fmod({a}, {b})",
        "remainder": lambda: f"fc_remainder({a}, {b})",
        "mod": lambda: f"fc_remainder({a}, {b})",
        "pow": lambda: f"fc_pow({a}, {b})",
        "atan2": lambda: f"atan2({a}, {b})",
        "minimum": lambda: f"fc_minimum({a}, {b})",
        "maximum": lambda: f"fc_maximum({a}, {b})",
        "nextafter": lambda: f"fc_nextafter({a}, {b})",
        "gcd": lambda: f"fc_gcd({a}, {b})",
        "logical_and": lambda: f"(({a} != 0) && ({b} != 0))",
        "logical_or": lambda: f"(({a} != 0) || ({b} != 0))",
        "bitwise_left_shift": lambda: f"fc_shl({a}, {b})",
        "bitwise_right_shift": lambda: f"fc_shr({a}, {b})",
        "logical_right_shift": lambda: (
            f"(({b}) < 0 || ({b}) >= (long long)(8 * sizeof({ct})) ? ({ct})0 : "
            f"({ct})((unsigned {ct})({a}) >> ({b})))"
        ),
        "add_alpha": lambda: f"({a} + {args[2]} * {b})",
        "sub_alpha": lambda: f"({a} - {args[2]} * {b})",
        "where": lambda: f"({a} ? {b} : {args[2]})",
        "lerp": lambda: f"({a} + {args[2]} * ({b} - {a}))",
        "clamp": lambda: f"fc_minimum(fc_maximum({a}, {b}), {args[2]})",
        "threshold": lambda: f"({a} > {b} ? {a} : {args[2]})",
        "addcmul": lambda: f"({a} + {args[3]} * {b} * {args[2]})",
    }
    if name not in table:
        raise KeyError(name)
    return table[name]()
