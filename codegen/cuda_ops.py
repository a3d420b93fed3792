"""Op name -> CUDA C++ expression, given operand expressions already in the compute type.

Half, bfloat16 and float8 values live in float registers (Note [Register types]); they are
rounded only where the fusion casts to them and where they are stored. Complex values are
fc_complex<float|double> (prelude/complex.cuh) in registers and memory alike.
"""
from __future__ import annotations

import math

from fusion_cache.frontend.dtypes import COMPLEX, FLOAT4, FLOAT8, DataType, real_part

REGISTER_TYPE = {
    DataType.Double: "double", DataType.Float: "float", DataType.Half: "float",
    DataType.BFloat16: "float", DataType.Int: "long long", DataType.Int32: "int",
    DataType.Bool: "bool", DataType.UInt64: "unsigned long long",
    DataType.ComplexFloat: "fc_complex<float>", DataType.ComplexDouble: "fc_complex<double>",
    DataType.Float8_e4m3fn: "float", DataType.Float8_e5m2: "float",
    DataType.Float8_e8m0fnu: "float",
}  # fmt: skip

# one-word names (the prelude's int64_t and uint64_t, not "long long"): renderers
# value-initialise with `T()`, which C++ does not take of a two-word type
MEMORY_TYPE = {
    DataType.Double: "double", DataType.Float: "float", DataType.Half: "fc_half",
    DataType.BFloat16: "fc_bf16", DataType.Int: "int64_t", DataType.Int32: "int",
    DataType.Bool: "bool", DataType.UInt64: "uint64_t",
    DataType.ComplexFloat: "fc_complex<float>", DataType.ComplexDouble: "fc_complex<double>",
    DataType.Float8_e4m3fn: "fc_e4m3", DataType.Float8_e5m2: "fc_e5m2",
    DataType.Float8_e8m0fnu: "fc_e8m0",
}  # fmt: skip

ELEMENT_BYTES = {
    DataType.Double: 8, DataType.Float: 4, DataType.Half: 2, DataType.BFloat16: 2,
    DataType.Int: 8, DataType.Int32: 4, DataType.Bool: 1, DataType.UInt64: 8,
    DataType.ComplexFloat: 8, DataType.ComplexDouble: 16, DataType.Float8_e4m3fn: 1,
    DataType.Float8_e5m2: 1, DataType.Float8_e8m0fnu: 1,
}  # fmt: skip

# storage types held in float registers: their conversion functions, by memory type
NARROW_FLOAT = {"fc_half": "fc_to_half", "fc_bf16": "fc_to_bf16", "fc_e4m3": "fc_to_e4m3",
                "fc_e5m2": "fc_to_e5m2", "fc_e8m0": "fc_to_e8m0"}  # fmt: skip

# the complex math of prelude/complex.cuh (Note [Complex math]): op -> its function there
COMPLEX_MATH = {"exp": "fc_exp", "log": "fc_log", "sqrt": "fc_sqrt", "sin": "fc_sin",
                "cos": "fc_cos", "tan": "fc_tan", "sinh": "fc_sinh", "cosh": "fc_cosh",
                "tanh": "fc_tanh", "sigmoid": "fc_sigmoid"}  # fmt: skip
# complex ops a kernel computes; the rest of the table refuses complex operands
COMPLEX_OPS = frozenset({"add", "sub", "mul", "div", "truediv", "neg", "abs", "real", "imag",
                         "conj", "where", "eq", "ne", "set", "segment_set", "reciprocal",
                         "isnan", "isinf", "isfinite", "add_alpha", "sub_alpha", *COMPLEX_MATH})
# complex ops whose result is not of their complex compute type
COMPLEX_TO_REAL = frozenset({"abs", "real", "imag"})
COMPLEX_TO_BOOL = frozenset({"eq", "ne", "isnan", "isinf", "isfinite"})


# random-number statements (Note [Philox numbers]): they read the element's linear index,
# FC_ELEM_INDEX, which each kernel family defines, its lane FC_ELEM_LANE (Note [Philox
# lanes] in prelude/philox.cuh) and a per-thread cache `<var>_rc`
RANDOM_STMTS = frozenset({"uniform", "normal"})


def random_setup(stmts, index: str, lane: str | None = None) -> tuple[list[str], list[str]]:
    """(lines before the kernel, lines at the top of its body) that random statements need:
    the element index and lane macros and one Philox cache each; nothing without them.
    `lane`: the element's place in its vector where every vector's lane 0 starts a Philox
    group, else None."""
    rng = [s.var for s in stmts if s.op in RANDOM_STMTS]
    if not rng:
        return [], []
    return [f"#define FC_ELEM_INDEX ((unsigned long long)({index}))",
            f"#define FC_ELEM_LANE ({lane if lane is not None else -1})"], [
        f"fc_rng_cache {v}_rc = fc_rng_cache_init();" for v in rng]  # fmt: skip


def kernel_refusal(dtype: DataType) -> str | None:
    """Why no generated kernel holds values of `dtype` (None when one can)."""
    if dtype in FLOAT4:
        return (f"{dtype!r} packs two e2m1 values a byte; no generated kernel reads or writes "
                "it (cast through torch, or unpack it first)")
    if dtype not in REGISTER_TYPE:
        return f"{dtype!r} has no kernel type"
    return None


def prelude_features(stmts, stores=()) -> tuple[str, ...]:
    """The prelude features a program's statements and stores need beside core and math:
    complex and float8 values, random numbers."""
    found = {s.dtype for s in (*stmts, *stores)}
    random = any(s.op in RANDOM_STMTS for s in stmts)
    return ((("complex",) if found & COMPLEX else ()) + (("float8",) if found & FLOAT8 else ())
            + (("philox",) if random else ()))  # fmt: skip


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
    if dtype is DataType.UInt64:
        return f"{int(value) % 2**64}ULL"
    if dtype in (DataType.Int, DataType.Int32):
        v = int(value)
        if v == -(2**63):
            return "(-9223372036854775807LL - 1)"
        return f"{v}LL" if dtype is DataType.Int else f"{v}"
    if dtype in COMPLEX:
        part = real_part(dtype)
        z = complex(value)
        return f"fc_make_complex<{REGISTER_TYPE[part]}>({literal(z.real, part)}, {literal(z.imag, part)})"
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
    if dst in COMPLEX:
        return f"fc_to_complex<{REGISTER_TYPE[real_part(dst)]}>({expr})"
    if src in COMPLEX and dst is DataType.Bool:  # nonzero in either part, as torch
        return f"fc_complex_nonzero({expr})"
    if src in COMPLEX:  # to a real dtype: the imaginary part is dropped, as torch does
        return convert(f"({expr}).re", real_part(src), dst)
    narrow = NARROW_FLOAT.get(MEMORY_TYPE[dst])
    if narrow is not None:
        return f"fc_to_float({narrow}({expr}))"
    if dst is DataType.Bool:
        return f"(({expr}) != 0)"
    if REGISTER_TYPE[src] == REGISTER_TYPE[dst]:
        return expr
    return f"(({REGISTER_TYPE[dst]})({expr}))"


def _is_int(dtype: DataType) -> bool:
    return dtype in (DataType.Int, DataType.Int32, DataType.Bool, DataType.UInt64)


def render_op(name: str, args: list[str], compute: DataType) -> str:
    """`args` are already converted to `compute` (promotion done by the caller)."""
    a = args[0] if args else ""
    b = args[1] if len(args) > 1 else ""
    ct = REGISTER_TYPE[compute]
    if compute in COMPLEX:
        return _complex_op(name, args, compute)
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
        "logical_right_shift": lambda: f"fc_shr({a}, {b})" if compute is DataType.UInt64 else (
            f"(({b}) < 0 || ({b}) >= (long long)(8 * sizeof({ct})) ? ({ct})0 : "
            f"({ct})((unsigned {ct})({a}) >> ({b})))"
        ),
        "conj": lambda: a,
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


def _complex_op(name: str, args: list[str], compute: DataType) -> str:
    """A complex op (COMPLEX_OPS) on operands of the complex compute type."""
    a = args[0]
    b = args[1] if len(args) > 1 else ""
    part = REGISTER_TYPE[real_part(compute)]
    if name in COMPLEX_MATH:
        return f"{COMPLEX_MATH[name]}({a})"
    table = {
        "add": lambda: f"({a} + {b})", "sub": lambda: f"({a} - {b})",
        "mul": lambda: f"({a} * {b})", "div": lambda: f"({a} / {b})",
        "truediv": lambda: f"({a} / {b})", "neg": lambda: f"(-{a})",
        "abs": lambda: f"fc_abs({a})", "real": lambda: f"({a}).re", "imag": lambda: f"({a}).im",
        "conj": lambda: f"fc_conj({a})", "where": lambda: f"({a} ? {b} : {args[2]})",
        "eq": lambda: f"({a} == {b})", "ne": lambda: f"({a} != {b})",
        "set": lambda: a, "segment_set": lambda: a, "reciprocal": lambda: f"fc_reciprocal({a})",
        "isnan": lambda: f"fc_isnan({a})", "isinf": lambda: f"fc_isinf({a})",
        "isfinite": lambda: f"fc_isfinite({a})",
        "add_alpha": lambda: f"({a} + {args[2]} * {b})",
        "sub_alpha": lambda: f"({a} - {args[2]} * {b})",
    }  # fmt: skip
    if name not in table:
        raise KeyError(f"{name} of fc_complex<{part}>")
    return table[name]()
