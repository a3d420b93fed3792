"""Every fd.ops entry of API.md, executed on CPU and compared with torch eager.

Each test builds a fusion from fresh seeded random inputs, runs it, and checks values, shape
and dtype against the torch expression that nvFuser's op corresponds to.
"""
from __future__ import annotations

import math
from collections.abc import Callable

import pytest
import torch
import torch.nn.functional as F

from fusion_cache import DataType, FusionDefinition

FLOATS = [torch.float32, torch.float64, torch.float16, torch.bfloat16]
INTS = [torch.int32, torch.int64]

TORCH_TO_DT = {
    torch.float32: DataType.Float,
    torch.float64: DataType.Double,
    torch.float16: DataType.Half,
    torch.bfloat16: DataType.BFloat16,
    torch.int32: DataType.Int32,
    torch.int64: DataType.Int,
    torch.bool: DataType.Bool,
    torch.complex64: DataType.ComplexFloat,
    torch.complex128: DataType.ComplexDouble,
}


# --------------------------------------------------------------------------------------------
# helpers


def gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def make(shape, dtype=torch.float32, seed=0, low=-2.0, high=2.0) -> torch.Tensor:
    """Fresh random data in [low, high) of the given dtype (never all zeros or ones)."""
    g = gen(seed)
    if dtype == torch.bool:
        return torch.randint(0, 2, shape, generator=g).bool()
    if dtype in INTS:
        return torch.randint(int(low), int(high), shape, generator=g, dtype=dtype)
    if dtype.is_complex:
        return torch.randn(shape, generator=g, dtype=dtype)
    x = torch.rand(shape, generator=g, dtype=torch.float64) * (high - low) + low
    return x.to(dtype)


def nonzero(shape, dtype, seed, lo=0.5, hi=2.0) -> torch.Tensor:
    """Random magnitudes in [lo, hi) with random signs: safe as a divisor."""
    g = gen(seed)
    mag = torch.rand(shape, generator=g, dtype=torch.float64) * (hi - lo) + lo
    sign = torch.randint(0, 2, shape, generator=g) * 2 - 1
    x = mag * sign
    if dtype in INTS:
        return torch.where(sign > 0, torch.randint(1, 9, shape, generator=g),
                           -torch.randint(1, 9, shape, generator=g)).to(dtype)
    return x.to(dtype)


def with_specials(x: torch.Tensor) -> torch.Tensor:
    x = x.clone()
    flat = x.view(-1)
    flat[0], flat[1], flat[2], flat[3] = float("inf"), float("-inf"), float("nan"), 0.0
    return x


def define_input(fd: FusionDefinition, x):
    if isinstance(x, torch.Tensor):
        return fd.from_pytorch(x)
    if isinstance(x, bool):
        return fd.define_scalar(dtype=DataType.Bool)
    if isinstance(x, int):
        return fd.define_scalar(dtype=DataType.Int)
    if isinstance(x, float):
        return fd.define_scalar(dtype=DataType.Double)
    raise TypeError(f"no input form for {type(x)}")


def run(build: Callable, inputs: list) -> tuple[FusionDefinition, list[torch.Tensor]]:
    """Define inputs from `inputs`, let `build(fd, *vals)` make outputs, execute."""
    with FusionDefinition() as fd:
        vals = [define_input(fd, x) for x in inputs]
        outs = build(fd, *vals)
        if not isinstance(outs, (list, tuple)):
            outs = [outs]
        for o in outs:
            fd.add_output(o)
    return fd, fd.execute(inputs)


def tol(dtype):
    if dtype in (torch.float16, torch.bfloat16):
        return {"rtol": 2e-2, "atol": 2e-2}
    if dtype == torch.float32:
        return {"rtol": 1e-5, "atol": 1e-5}
    if dtype == torch.float64:
        return {"rtol": 1e-10, "atol": 1e-10}
    return {"rtol": 0, "atol": 0}


def check(got: torch.Tensor, expected: torch.Tensor, what: str = "", **kw):
    assert isinstance(got, torch.Tensor), f"{what}: got {type(got)}"
    assert got.dtype == expected.dtype, f"{what}: dtype {got.dtype} != torch {expected.dtype}"
    assert tuple(got.shape) == tuple(expected.shape), (
        f"{what}: shape {tuple(got.shape)} != torch {tuple(expected.shape)}")
    base = expected.dtype
    if expected.is_complex():
        base = torch.float32 if expected.dtype == torch.complex64 else torch.float64
    t = {**tol(base), **kw}
    torch.testing.assert_close(got, expected, equal_nan=True, msg=lambda m: f"{what}: {m}", **t)


def reference(fn, *args):
    """torch eager result; skip the case when torch CPU has no kernel for the dtype."""
    try:
        return fn(*args)
    except (RuntimeError, NotImplementedError) as e:
        pytest.skip(f"torch CPU has no reference: {e}")


def check_op(build, torch_fn, inputs, what=""):
    expected = reference(torch_fn, *inputs)
    _, outs = run(build, inputs)
    if not isinstance(expected, (list, tuple)):
        expected = [expected]
    assert len(outs) == len(expected), f"{what}: {len(outs)} outputs, expected {len(expected)}"
    for i, (g, e) in enumerate(zip(outs, expected)):
        check(g, e, f"{what} out{i}")


def op(name):
    return lambda fd, *a: getattr(fd.ops, name)(*a)


# --------------------------------------------------------------------------------------------
# unary

DOMAINS = {
    "any": (-3.0, 3.0),
    "unit": (-0.9, 0.9),
    "pos": (0.1, 3.0),
    "ge1": (1.1, 3.0),
    "two": (0.1, 1.9),
}

FLOAT_UNARY = [
    ("abs", torch.abs, "any"),
    ("acos", torch.acos, "unit"),
    ("acosh", torch.acosh, "ge1"),
    ("asin", torch.asin, "unit"),
    ("asinh", torch.asinh, "any"),
    ("atan", torch.atan, "any"),
    ("atanh", torch.atanh, "unit"),
    ("ceil", torch.ceil, "any"),
    ("cos", torch.cos, "any"),
    ("cosh", torch.cosh, "any"),
    ("exp", torch.exp, "any"),
    ("exp2", torch.exp2, "any"),
    ("expm1", torch.expm1, "any"),
    ("erf", torch.erf, "any"),
    ("erfc", torch.erfc, "any"),
    ("erfinv", torch.erfinv, "unit"),
    ("erfcinv", lambda x: torch.erfinv(1 - x.double()).to(
        x.dtype if x.is_floating_point() else torch.float32), "two"),
    ("floor", torch.floor, "any"),
    ("frac", torch.frac, "any"),
    ("lgamma", torch.lgamma, "pos"),
    ("log", torch.log, "pos"),
    ("log10", torch.log10, "pos"),
    ("log1p", torch.log1p, "pos"),
    ("log2", torch.log2, "pos"),
    ("neg", torch.neg, "any"),
    ("logical_not", torch.logical_not, "any"),
    ("relu", torch.relu, "any"),
    ("reciprocal", torch.reciprocal, "pos"),
    ("round", torch.round, "any"),
    ("rsqrt", torch.rsqrt, "pos"),
    ("set", torch.clone, "any"),
    ("sign", torch.sign, "any"),
    ("sigmoid", torch.sigmoid, "any"),
    ("signbit", torch.signbit, "any"),
    ("silu", F.silu, "any"),
    ("sin", torch.sin, "any"),
    ("sinh", torch.sinh, "any"),
    ("sqrt", torch.sqrt, "pos"),
    ("tan", torch.tan, "unit"),
    ("tanh", torch.tanh, "any"),
    ("trunc", torch.trunc, "any"),
    ("isreal", torch.isreal, "any"),
]

SPECIAL_UNARY = [
    ("isfinite", torch.isfinite),
    ("isinf", torch.isinf),
    ("isnan", torch.isnan),
    ("isneginf", torch.isneginf),
    ("isposinf", torch.isposinf),
]

INT_UNARY = [
    ("abs", torch.abs),
    ("neg", torch.neg),
    ("sign", torch.sign),
    ("bitwise_not", torch.bitwise_not),
    ("logical_not", torch.logical_not),
    ("set", torch.clone),
]

BOOL_UNARY = [
    ("bitwise_not", torch.bitwise_not),
    ("logical_not", torch.logical_not),
    ("set", torch.clone),
]


@pytest.mark.parametrize("dtype", FLOATS, ids=str)
@pytest.mark.parametrize("name,fn,domain", FLOAT_UNARY, ids=[u[0] for u in FLOAT_UNARY])
def test_unary_float(name, fn, domain, dtype):
    lo, hi = DOMAINS[domain]
    x = make([3, 5], dtype, seed=sum(map(ord, name)), low=lo, high=hi)
    check_op(op(name), fn, [x], f"{name}({dtype})")


@pytest.mark.parametrize("dtype", FLOATS, ids=str)
@pytest.mark.parametrize("name,fn", SPECIAL_UNARY, ids=[u[0] for u in SPECIAL_UNARY])
def test_unary_special_values(name, fn, dtype):
    x = with_specials(make([4, 6], dtype, seed=7))
    check_op(op(name), fn, [x], f"{name}({dtype})")


@pytest.mark.parametrize("dtype", INTS, ids=str)
@pytest.mark.parametrize("name,fn", INT_UNARY, ids=[u[0] for u in INT_UNARY])
def test_unary_int(name, fn, dtype):
    x = make([4, 6], dtype, seed=11, low=-50, high=50)
    check_op(op(name), fn, [x], f"{name}({dtype})")


@pytest.mark.parametrize("name,fn", BOOL_UNARY, ids=[u[0] for u in BOOL_UNARY])
def test_unary_bool(name, fn):
    x = make([4, 6], torch.bool, seed=12)
    check_op(op(name), fn, [x], f"{name}(bool)")


@pytest.mark.parametrize("name", ["real", "imag"])
@pytest.mark.parametrize("dtype", [torch.complex64, torch.complex128], ids=str)
def test_unary_complex(name, dtype):
    x = make([3, 4], dtype, seed=13)
    check_op(op(name), getattr(torch, name), [x], f"{name}({dtype})")


@pytest.mark.parametrize("dtype", INTS, ids=str)
def test_unary_float_op_on_int_promotes(dtype):
    x = make([3, 4], dtype, seed=14, low=0, high=5)
    check_op(op("sin"), torch.sin, [x], "sin(int)")
    check_op(op("exp"), torch.exp, [x], "exp(int)")


# --------------------------------------------------------------------------------------------
# binary


def _trunc_div(a, b):
    return torch.div(a, b, rounding_mode="trunc")


FLOAT_BINARY = [
    ("add", torch.add, "any"),
    ("sub", torch.sub, "any"),
    ("mul", torch.mul, "any"),
    ("div", torch.div, "nz"),
    ("truediv", torch.true_divide, "nz"),
    ("fmod", torch.fmod, "nz"),
    ("remainder", torch.remainder, "nz"),
    ("mod", torch.remainder, "nz"),
    ("pow", torch.pow, "posbase"),
    ("atan2", torch.atan2, "any"),
    ("minimum", torch.minimum, "any"),
    ("maximum", torch.maximum, "any"),
    ("nextafter", torch.nextafter, "any"),
    ("eq", torch.eq, "eqmix"),
    ("ne", torch.ne, "eqmix"),
    ("lt", torch.lt, "eqmix"),
    ("le", torch.le, "eqmix"),
    ("gt", torch.gt, "eqmix"),
    ("ge", torch.ge, "eqmix"),
    ("logical_and", torch.logical_and, "eqmix"),
    ("logical_or", torch.logical_or, "eqmix"),
]

INT_BINARY = [
    ("add", torch.add, "any"),
    ("sub", torch.sub, "any"),
    ("mul", torch.mul, "any"),
    ("div", _trunc_div, "nz"),
    ("truediv", torch.true_divide, "nz"),
    ("fmod", torch.fmod, "nz"),
    ("remainder", torch.remainder, "nz"),
    ("mod", torch.remainder, "nz"),
    ("pow", torch.pow, "smallexp"),
    ("minimum", torch.minimum, "any"),
    ("maximum", torch.maximum, "any"),
    ("gcd", torch.gcd, "any"),
    ("eq", torch.eq, "eqmix"),
    ("ne", torch.ne, "eqmix"),
    ("lt", torch.lt, "eqmix"),
    ("le", torch.le, "eqmix"),
    ("gt", torch.gt, "eqmix"),
    ("ge", torch.ge, "eqmix"),
    ("logical_and", torch.logical_and, "eqmix"),
    ("logical_or", torch.logical_or, "eqmix"),
    ("bitwise_and", torch.bitwise_and, "any"),
    ("bitwise_or", torch.bitwise_or, "any"),
    ("bitwise_xor", torch.bitwise_xor, "any"),
    ("bitwise_left_shift", torch.bitwise_left_shift, "shift"),
    ("bitwise_right_shift", torch.bitwise_right_shift, "shift"),
]

BOOL_BINARY = [
    ("logical_and", torch.logical_and),
    ("logical_or", torch.logical_or),
    ("bitwise_and", torch.bitwise_and),
    ("bitwise_or", torch.bitwise_or),
    ("bitwise_xor", torch.bitwise_xor),
    ("eq", torch.eq),
    ("ne", torch.ne),
]


def binary_inputs(kind, dtype, shape=(4, 6)):
    shape = list(shape)
    is_int = dtype in INTS
    if kind == "nz":
        a = make(shape, dtype, 1, -20 if is_int else -3, 20 if is_int else 3)
        return a, nonzero(shape, dtype, 2)
    if kind == "posbase":
        return make(shape, dtype, 1, 0.2, 2.0), make(shape, dtype, 2, -2.0, 2.0)
    if kind == "smallexp":
        return make(shape, dtype, 1, -5, 6), make(shape, dtype, 2, 0, 4)
    if kind == "shift":
        return make(shape, dtype, 1, -1000, 1000), make(shape, dtype, 2, 0, 8)
    if kind == "eqmix":
        a = make(shape, dtype, 1, -3, 3)
        b = make(shape, dtype, 2, -3, 3)
        b.view(-1)[::3] = a.view(-1)[::3]  # some equal pairs, so eq/le/ge see both outcomes
        if not is_int:
            a.view(-1)[1] = 0.0  # a zero for the logical ops
        return a, b
    lo, hi = (-100, 100) if is_int else (-3.0, 3.0)
    return make(shape, dtype, 1, lo, hi), make(shape, dtype, 2, lo, hi)


@pytest.mark.parametrize("dtype", FLOATS, ids=str)
@pytest.mark.parametrize("name,fn,kind", FLOAT_BINARY, ids=[b[0] for b in FLOAT_BINARY])
def test_binary_float(name, fn, kind, dtype):
    a, b = binary_inputs(kind, dtype)
    check_op(op(name), fn, [a, b], f"{name}({dtype})")


@pytest.mark.parametrize("dtype", INTS, ids=str)
@pytest.mark.parametrize("name,fn,kind", INT_BINARY, ids=[b[0] for b in INT_BINARY])
def test_binary_int(name, fn, kind, dtype):
    a, b = binary_inputs(kind, dtype)
    check_op(op(name), fn, [a, b], f"{name}({dtype})")


@pytest.mark.parametrize("name,fn", BOOL_BINARY, ids=[b[0] for b in BOOL_BINARY])
def test_binary_bool(name, fn):
    a, b = make([4, 6], torch.bool, 1), make([4, 6], torch.bool, 2)
    check_op(op(name), fn, [a, b], f"{name}(bool)")


def test_int_div_truncates_like_c():
    a = torch.tensor([7, -7, 7, -7, 9, -1], dtype=torch.int64)
    b = torch.tensor([2, 2, -2, -2, 4, 3], dtype=torch.int64)
    _, (q,) = run(op("div"), [a, b])
    check(q, torch.tensor([3, -3, -3, 3, 2, 0]), "int div")
    _, (t,) = run(op("truediv"), [a, b])
    check(t, torch.true_divide(a, b), "int truediv")


def test_fmod_vs_remainder_signs():
    a = torch.tensor([5.5, -5.5, 5.5, -5.5], dtype=torch.float32)
    b = torch.tensor([2.0, 2.0, -2.0, -2.0], dtype=torch.float32)
    cases = [("fmod", torch.fmod), ("remainder", torch.remainder), ("mod", torch.remainder)]
    for name, fn in cases:
        _, (r,) = run(op(name), [a, b])
        check(r, fn(a, b), name)


@pytest.mark.parametrize("dtype", INTS, ids=str)
def test_logical_right_shift(dtype):
    bits = 32 if dtype == torch.int32 else 64
    a = make([3, 5], dtype, 3, -1000, 1000)
    s = make([3, 5], dtype, 4, 1, 8)
    # shift the unsigned bit pattern: (a mod 2**bits) >> s, computed in Python integers
    expected = torch.tensor([[((x % (1 << bits)) >> k) for x, k in zip(ra, rs)]
                             for ra, rs in zip(a.tolist(), s.tolist())], dtype=dtype)
    _, (r,) = run(op("logical_right_shift"), [a, s])
    check(r, expected, "logical_right_shift")


MIXED_PROMOTION = [
    (torch.int32, torch.float32),
    (torch.float16, torch.float32),
    (torch.float16, torch.bfloat16),
    (torch.int32, torch.int64),
    (torch.bool, torch.int32),
    (torch.bool, torch.float16),
    (torch.float32, torch.float64),
]


@pytest.mark.parametrize("da,db", MIXED_PROMOTION, ids=str)
@pytest.mark.parametrize("name", ["add", "mul", "maximum"])
def test_binary_tensor_promotion(name, da, db):
    a, b = make([3, 4], da, 5, -5, 5), make([3, 4], db, 6, -5, 5)
    check_op(op(name), getattr(torch, name), [a, b], f"{name}({da},{db})")


SCALAR_CASES = [
    (torch.float16, 2.5),
    (torch.bfloat16, -1.5),
    (torch.float32, 0.75),
    (torch.float64, 3.25),
    (torch.int32, 2.5),  # int tensor with a float scalar becomes float32
    (torch.int64, 3),
    (torch.int32, 3),
]


@pytest.mark.parametrize("dtype,s", SCALAR_CASES, ids=str)
@pytest.mark.parametrize("name", ["add", "sub", "mul", "truediv", "maximum", "lt"])
def test_binary_tensor_scalar_input(name, dtype, s):
    """A scalar *input* (define_scalar(dtype=...)) follows torch's tensor-scalar promotion."""
    x = make([3, 4], dtype, 8, -5, 5)
    fn = {"truediv": torch.true_divide}.get(name, getattr(torch, name, None))
    ref = (lambda a, b: torch.maximum(a, torch.tensor(b).to(torch.result_type(a, b)))) \
        if name == "maximum" else fn
    check_op(op(name), ref, [x, s], f"{name}({dtype}, {s!r})")


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32, torch.int32], ids=str)
def test_binary_scalar_first_and_constants(dtype):
    x = make([3, 4], dtype, 9, 1, 5)

    def build(fd, t):
        c = fd.define_scalar(2.5)
        k = fd.define_constant(3)
        return [fd.ops.sub(c, t), fd.ops.mul(t, k), fd.ops.add(fd.ops.mul(t, c), k)]

    _, outs = run(build, [x])
    check(outs[0], 2.5 - x, "2.5 - t")
    check(outs[1], x * 3, "t * 3")
    check(outs[2], x * 2.5 + 3, "t * 2.5 + 3")


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16], ids=str)
def test_add_sub_alpha(dtype):
    a, b = make([3, 4], dtype, 1), make([3, 4], dtype, 2)

    def build(fd, x, y):
        alpha = fd.define_scalar(2.0)
        return [fd.ops.add_alpha(x, y, alpha), fd.ops.sub_alpha(x, y, alpha)]

    _, outs = run(build, [a, b])
    check(outs[0], torch.add(a, b, alpha=2.0), "add_alpha")
    check(outs[1], torch.sub(a, b, alpha=2.0), "sub_alpha")


def test_add_alpha_int():
    a, b = make([3, 4], torch.int64, 1, -9, 9), make([3, 4], torch.int64, 2, -9, 9)

    def build(fd, x, y):
        return [fd.ops.add_alpha(x, y, fd.define_scalar(3)),
                fd.ops.sub_alpha(x, y, fd.define_scalar(3))]

    _, outs = run(build, [a, b])
    check(outs[0], torch.add(a, b, alpha=3), "add_alpha int")
    check(outs[1], torch.sub(a, b, alpha=3), "sub_alpha int")


# --------------------------------------------------------------------------------------------
# ternary


@pytest.mark.parametrize("dtype", FLOATS, ids=str)
def test_where(dtype):
    c = make([4, 5], torch.bool, 1)
    a, b = make([4, 5], dtype, 2), make([4, 5], dtype, 3)
    check_op(op("where"), torch.where, [c, a, b], "where(t, t, t)")

    def build(fd, cond, x):
        return fd.ops.where(cond, x, fd.define_scalar(0.5))

    _, (r,) = run(build, [c, a])
    check(r, torch.where(c, a, torch.tensor(0.5, dtype=dtype)), "where(t, t, s)")


def test_where_int_and_mixed():
    c = make([4, 5], torch.bool, 1)
    a, b = make([4, 5], torch.int32, 2, -9, 9), make([4, 5], torch.float32, 3)
    check_op(op("where"), torch.where, [c, a, b], "where(int32, float32)")


@pytest.mark.parametrize("dtype", FLOATS, ids=str)
def test_lerp(dtype):
    a, b, w = make([4, 5], dtype, 1), make([4, 5], dtype, 2), make([4, 5], dtype, 3, 0, 1)
    check_op(op("lerp"), torch.lerp, [a, b, w], "lerp tensor weight")

    def build(fd, x, y):
        return fd.ops.lerp(x, y, fd.define_scalar(0.3))

    _, (r,) = run(build, [a, b])
    check(r, torch.lerp(a, b, 0.3), "lerp scalar weight")


@pytest.mark.parametrize("dtype", FLOATS + INTS, ids=str)
def test_clamp(dtype):
    x = make([4, 5], dtype, 1, -10, 10)

    def build(fd, t):
        if dtype in INTS:
            return fd.ops.clamp(t, fd.define_scalar(-3), fd.define_scalar(4))
        return fd.ops.clamp(t, fd.define_scalar(-0.5), fd.define_scalar(1.25))

    lo, hi = (-3, 4) if dtype in INTS else (-0.5, 1.25)
    _, (r,) = run(build, [x])
    check(r, torch.clamp(x, lo, hi), "clamp")


@pytest.mark.parametrize("dtype", FLOATS, ids=str)
def test_threshold(dtype):
    x = make([4, 5], dtype, 1)

    def build(fd, t):
        return fd.ops.threshold(t, fd.define_scalar(0.25), fd.define_scalar(-7.0))

    _, (r,) = run(build, [x])
    check(r, F.threshold(x, 0.25, -7.0), "threshold")


@pytest.mark.parametrize("dtype", FLOATS, ids=str)
def test_addcmul(dtype):
    a, b, c = make([4, 5], dtype, 1), make([4, 5], dtype, 2), make([4, 5], dtype, 3)

    def build(fd, x, y, z):
        return fd.ops.addcmul(x, y, z, fd.define_scalar(0.5))

    _, (r,) = run(build, [a, b, c])
    check(r, torch.addcmul(a, b, c, value=0.5), "addcmul")


# --------------------------------------------------------------------------------------------
# reductions

RED_DIMS = [[0], [1], [-1], [0, 1], [0, 2]]


def torch_reduce(name, x, dims, keepdim, dtype=None):
    if name == "sum":
        return torch.sum(x, dim=dims, keepdim=keepdim, dtype=dtype)
    if name == "prod":
        r = x
        for d in sorted((d % x.dim() for d in dims), reverse=True):
            r = torch.prod(r, dim=d, keepdim=keepdim, dtype=dtype)
            dtype = None
        return r
    r = (torch.amax if name == "max" else torch.amin)(x, dim=dims, keepdim=keepdim)
    return r if dtype is None else r.to(dtype)


@pytest.mark.parametrize("dtype", FLOATS, ids=str)
@pytest.mark.parametrize("dims", RED_DIMS, ids=str)
@pytest.mark.parametrize("name", ["sum", "prod", "max", "min"])
def test_reduction(name, dims, dtype):
    lo, hi = (0.7, 1.3) if name == "prod" else (-3, 3)
    x = make([3, 4, 5], dtype, 21, lo, hi)
    for keepdim in (False, True):
        _, (r,) = run(lambda fd, t, k=keepdim: getattr(fd.ops, name)(t, dims, k), [x])
        check(r, torch_reduce(name, x, dims, keepdim), f"{name}{dims} keepdim={keepdim}")


@pytest.mark.parametrize("dtype", INTS + [torch.bool], ids=str)
@pytest.mark.parametrize("name", ["sum", "prod", "max", "min"])
def test_reduction_int(name, dtype):
    if dtype == torch.bool and name in ("max", "min"):
        pytest.skip("amax of bool is not defined in torch")
    x = make([3, 4], dtype, 22, -3, 4)
    _, (r,) = run(lambda fd, t: getattr(fd.ops, name)(t, [1]), [x])
    check(r, torch_reduce(name, x, [1], False), f"{name}({dtype})")


def test_sum_int_and_bool_give_int64():
    for dtype in [torch.int32, torch.bool]:
        x = make([5, 6], dtype, 23, -9, 9)
        _, (r,) = run(lambda fd, t: fd.ops.sum(t, [0, 1]), [x])
        assert r.dtype == torch.int64
        check(r, torch.sum(x), f"sum({dtype})")


@pytest.mark.parametrize("name", ["sum", "prod", "max", "min"])
def test_reduction_dtype_arg_casts(name):
    x = make([4, 6], torch.float16, 24, 0.8, 1.2)

    def build(fd, t):
        return getattr(fd.ops, name)(t, [1], False, DataType.Float)

    _, (r,) = run(build, [x])
    check(r, torch_reduce(name, x, [1], False, torch.float32), f"{name} dtype=Float")

    _, (r,) = run(lambda fd, t: getattr(fd.ops, name)(t, dims=[0], dtype=DataType.Double), [x])
    check(r, torch_reduce(name, x, [0], False, torch.float64), f"{name} dtype=Double")


def test_reduction_keyword_spellings():
    x = make([3, 4, 5], torch.float32, 25)
    _, (a,) = run(lambda fd, t: fd.ops.sum(t, axes=[1], keepdim=True), [x])
    check(a, x.sum(1, keepdim=True), "sum(axes=)")
    _, (b,) = run(lambda fd, t: fd.ops.sum(t, dims=[0, 2], keepdim=False), [x])
    check(b, x.sum((0, 2)), "sum(dims=)")
    _, (c,) = run(lambda fd, t: fd.ops.max(t, axes=[-1]), [x])
    check(c, x.amax(-1), "max(axes=)")
    _, (d,) = run(lambda fd, t: fd.ops.sum(t, [-1], False, DataType.Float), [x])
    check(d, x.sum(-1), "sum positional")


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16], ids=str)
@pytest.mark.parametrize("correction", [0, 1])
@pytest.mark.parametrize("keepdim", [False, True])
def test_var_and_var_mean(dtype, correction, keepdim):
    x = make([4, 6, 5], dtype, 26)
    _, (v,) = run(lambda fd, t: fd.ops.var(t, [1, 2], correction, keepdim), [x])
    ev = reference(lambda: torch.var(x, dim=[1, 2], correction=correction, keepdim=keepdim))
    check(v, ev, "var")

    def build(fd, t):
        var, mean = fd.ops.var_mean(t, [0], correction=correction, keepdim=keepdim)
        return [var, mean]

    _, (v2, m2) = run(build, [x])
    ev, em = torch.var_mean(x, dim=[0], correction=correction, keepdim=keepdim)
    check(v2, ev, "var_mean var")
    check(m2, em, "var_mean mean")


def test_var_mean_default_correction():
    x = make([5, 7], torch.float32, 27)

    def build(fd, t):
        return list(fd.ops.var_mean(t, [1]))

    _, (v, m) = run(build, [x])
    check(v, torch.var(x, 1), "var_mean default correction=1")
    check(m, torch.mean(x, 1), "var_mean mean")


@pytest.mark.parametrize("dims", [[1], [0, 1], [-1]], ids=str)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
def test_welford(dims, dtype):
    x = make([4, 6, 3], dtype, 28)

    def build(fd, t):
        avg, var_sum, n = fd.ops.welford(t, dims)
        return [avg, var_sum, n]

    _, (avg, var_sum, n) = run(build, [x])
    count = math.prod(x.shape[d] for d in dims)
    mean = x.mean(dims)
    check(avg, mean, "welford avg")
    check(var_sum, ((x - x.mean(dims, keepdim=True)) ** 2).sum(dims), "welford var_sum")
    assert tuple(n.shape) == tuple(mean.shape)
    assert torch.all(n.double() == count), f"welford n: {n} != {count}"


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
def test_batch_norm_training(dtype):
    x = make([4, 3, 5, 5], dtype, 29)
    w, b = make([3], dtype, 30), make([3], dtype, 31)
    rm, rv = make([3], dtype, 32, -0.5, 0.5), make([3], dtype, 33, 0.5, 1.5)
    rm_ref, rv_ref = rm.clone(), rv.clone()

    def build(fd, t, w_, b_, rm_, rv_):
        momentum, eps = fd.define_scalar(0.1), fd.define_scalar(1e-5)
        out, mean, invstd = fd.ops.batch_norm(t, w_, b_, rm_, rv_, momentum, eps, True)
        return [out, mean, invstd]

    _, (out, mean, invstd) = run(build, [x, w, b, rm, rv])
    e_out, e_mean, e_invstd = torch.native_batch_norm(x, w, b, rm_ref, rv_ref, True, 0.1, 1e-5)
    check(out, e_out, "bn out", rtol=1e-4, atol=1e-4)
    check(mean, e_mean, "bn mean")
    check(invstd, e_invstd, "bn invstd", rtol=1e-4, atol=1e-4)
    check(rm, rm_ref, "running_mean updated in place")
    check(rv, rv_ref, "running_var updated in place", rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
def test_batch_norm_eval(dtype):
    x = make([4, 3, 5, 5], dtype, 34)
    w, b = make([3], dtype, 35), make([3], dtype, 36)
    rm, rv = make([3], dtype, 37, -0.5, 0.5), make([3], dtype, 38, 0.5, 1.5)
    rm0, rv0 = rm.clone(), rv.clone()

    def build(fd, t, w_, b_, rm_, rv_):
        momentum, eps = fd.define_scalar(0.1), fd.define_scalar(1e-5)
        out, mean, invstd = fd.ops.batch_norm(t, w_, b_, rm_, rv_, momentum, eps, False)
        return [out, mean, invstd]

    _, (out, mean, invstd) = run(build, [x, w, b, rm, rv])
    e_out, _, _ = torch.native_batch_norm(x, w, b, rm0.clone(), rv0.clone(), False, 0.1, 1e-5)
    check(out, e_out, "bn eval out", rtol=1e-4, atol=1e-4)
    # torch CPU returns empty save_mean/invstd in eval; nvFuser returns the running stats.
    if mean.numel():
        check(mean, rm0, "bn eval mean")
        check(invstd, torch.rsqrt(rv0 + 1e-5), "bn eval invstd", rtol=1e-4, atol=1e-5)
    check(rm, rm0, "running_mean untouched in eval")
    check(rv, rv0, "running_var untouched in eval")


# --------------------------------------------------------------------------------------------
# shape ops


def test_broadcast():
    x, y = make([3], seed=40), make([3, 4], seed=41)

    def build(fd, a, b):
        t = fd.ops.broadcast(a, [False, True])
        return [t, fd.ops.add(b, t)]

    _, (t, s) = run(build, [x, y])
    check(t, x.unsqueeze(1), "broadcast")
    check(s, y + x.unsqueeze(1), "broadcast + add")


def test_broadcast_in_dim_ints():
    x, y = make([3], seed=42), make([1, 3], seed=43)

    def build(fd, a, b):
        return [fd.ops.broadcast_in_dim(a, [2, 3], [1]),
                fd.ops.broadcast_in_dim(a, [3, 4], [0]),
                fd.ops.broadcast_in_dim(b, [4, 3], [0, 1]),
                fd.ops.broadcast_in_dim(b, [2, 4, 3], [1, 2])]

    _, outs = run(build, [x, y])
    check(outs[0], x.expand(2, 3), "bid [3]->[2,3]")
    check(outs[1], x.unsqueeze(1).expand(3, 4), "bid [3]->[3,4]")
    check(outs[2], y.expand(4, 3), "bid [1,3]->[4,3]")
    check(outs[3], y.expand(2, 4, 3), "bid [1,3]->[2,4,3]")


def test_broadcast_in_dim_vector():
    x, z = make([3], seed=44), make([5, 3], seed=45)

    def build(fd, a, c):
        v = fd.define_vector([fd.ops.size(c, 0), fd.ops.size(c, 1)])
        w = fd.define_vector([5, 3])
        return [fd.ops.broadcast_in_dim(a, v, [1]), fd.ops.broadcast_in_dim(a, w, [1])]

    _, (r, r2) = run(build, [x, z])
    check(r, x.expand(5, 3), "bid with define_vector of scalars")
    check(r2, x.expand(5, 3), "bid with define_vector of ints")


def test_expand():
    x = make([1, 3], seed=46)

    def build(fd, a):
        return [fd.ops.expand(a, [4, 3])]

    _, (r,) = run(build, [x])
    check(r, x.expand(4, 3), "expand")


@pytest.mark.parametrize("dims", [[1, 0, 2], [2, 0, 1], [0, 2, 1], [-1, 0, 1]], ids=str)
def test_permute(dims):
    x = make([2, 3, 4], seed=47)
    _, (r,) = run(lambda fd, a: fd.ops.permute(a, dims), [x])
    check(r, x.permute(dims), "permute")


def test_binary_implicit_leading_broadcast():
    """nvFuser broadcasts the lower-rank operand on its leading dims."""
    x, y = make([2, 3, 4], seed=39), make([3, 4], seed=38)
    check_op(op("add"), torch.add, [x, y], "add([2,3,4], [3,4])")
    check_op(op("mul"), torch.mul, [y, x], "mul([3,4], [2,3,4])")


def test_permute_then_pointwise():
    x, y = make([2, 3], seed=48), make([3, 2], seed=49)
    _, (r,) = run(lambda fd, a, b: fd.ops.add(fd.ops.permute(a, [1, 0]), b), [x, y])
    check(r, x.t() + y, "permute+add")


@pytest.mark.parametrize("shape,dims", [([1, 3, 1], [0]), ([1, 3, 1], [0, 2]),
                                        ([4, 3, 1], [-1])], ids=str)
def test_squeeze(shape, dims):
    x = make(shape, seed=50)
    _, (r,) = run(lambda fd, a: fd.ops.squeeze(a, dims), [x])
    check(r, x.squeeze(tuple(dims)), f"squeeze{dims}")


def test_reshape_new_form_ints():
    x = make([2, 12], seed=51)
    _, (r, r2) = run(lambda fd, a: [fd.ops.reshape(a, [4, 6]), fd.ops.reshape(a, [2, 3, 4])], [x])
    check(r, x.reshape(4, 6), "reshape [4,6]")
    check(r2, x.reshape(2, 3, 4), "reshape [2,3,4]")


def test_reshape_new_form_vector():
    x = make([2, 12], seed=52)

    def build(fd, a):
        v = fd.define_vector([fd.define_scalar(4), fd.define_scalar(6)])
        v2 = fd.define_vector([fd.ops.size(a, 1), fd.ops.size(a, 0)])
        return [fd.ops.reshape(a, v), fd.ops.reshape(a, v2)]

    _, (r, r2) = run(build, [x])
    check(r, x.reshape(4, 6), "reshape vector of constants")
    check(r2, x.reshape(12, 2), "reshape vector of sizes")


def test_reshape_early_form():
    x = make([2, 12], seed=53)
    _, (r,) = run(lambda fd, a: fd.ops.reshape(a, [2, 12], [3, 8]), [x])
    check(r, x.reshape(3, 8), "reshape(x, original, new)")


def test_reshape_to_shape_of_other():
    x, y = make([6], seed=54), make([2, 3], seed=55)
    _, (r,) = run(lambda fd, a, b: fd.ops.add(fd.ops.reshape(a, fd.ops.shape(b)), b), [x, y])
    check(r, x.reshape(2, 3) + y, "reshape(x, shape(y))")


def test_size_op():
    x = make([3, 8], seed=56)
    _, (r,) = run(lambda fd, a: fd.ops.mul(a, fd.ops.size(a, 1)), [x])
    check(r, x * 8, "x * size(x, 1)")
    _, (r2,) = run(lambda fd, a: fd.ops.add(a, fd.ops.size(a, -1)), [x])
    check(r2, x + 8, "x + size(x, -1)")


def test_slice():
    x = make([6, 8], seed=57)
    _, (r,) = run(lambda fd, a: fd.ops.slice(a, [1, 2], [5, 7]), [x])
    check(r, x[1:5, 2:7], "slice")
    _, (r2,) = run(lambda fd, a: fd.ops.slice(a, [0, 1], [6, 8], [2, 3]), [x])
    check(r2, x[0:6:2, 1:8:3], "slice with strides")
    _, (r3,) = run(lambda fd, a: fd.ops.slice(a, start_indices=[2, 0], end_indices=[4, 8],
                                            strides=[1, 1]), [x])
    check(r3, x[2:4, :], "slice keywords")


@pytest.mark.parametrize("widths", [[1, 2], [0, 1, 2, 0], [2, 2, 1, 1]], ids=str)
def test_pad(widths):
    x = make([3, 4], seed=58)
    _, (r,) = run(lambda fd, a: fd.ops.pad(a, widths), [x])
    check(r, F.pad(x, widths), f"pad{widths}")
    _, (r2,) = run(lambda fd, a: fd.ops.pad(a, widths, fd.define_scalar(1.5)), [x])
    check(r2, F.pad(x, widths, value=1.5), f"pad{widths} value=1.5")


@pytest.mark.parametrize("dim", [0, 1, -1])
def test_cat(dim):
    shapes = {0: ([2, 3], [4, 3]), 1: ([2, 3], [2, 5]), -1: ([2, 3], [2, 2])}[dim]
    x, y, z = make(shapes[0], seed=59), make(shapes[1], seed=60), make(shapes[0], seed=61)
    _, (r,) = run(lambda fd, a, b, c: fd.ops.cat([a, b, c], dim), [x, y, z])
    check(r, torch.cat([x, y, z], dim), f"cat dim={dim}")


CASTS = [
    (torch.float32, DataType.Half),
    (torch.float32, DataType.BFloat16),
    (torch.float32, DataType.Double),
    (torch.float32, DataType.Int),
    (torch.float32, DataType.Int32),
    (torch.float32, DataType.Bool),
    (torch.float16, DataType.Float),
    (torch.int32, DataType.Float),
    (torch.int64, DataType.Int32),
    (torch.bool, DataType.Float),
    (torch.bool, DataType.Int),
    (torch.float64, DataType.Float),
]
DT_TO_TORCH = {v: k for k, v in TORCH_TO_DT.items()}


@pytest.mark.parametrize("src,dst", CASTS, ids=str)
def test_cast(src, dst):
    x = make([4, 5], src, 62, -20, 20)
    _, (r,) = run(lambda fd, a: fd.ops.cast(a, dst), [x])
    check(r, x.to(DT_TO_TORCH[dst]), f"cast {src}->{dst}")
    _, (r2,) = run(lambda fd, a: fd.ops.cast(a, dtype=dst), [x])
    check(r2, x.to(DT_TO_TORCH[dst]), f"cast(dtype=) {src}->{dst}")


@pytest.mark.parametrize("dtype", [DataType.Float, DataType.Double, DataType.Half,
                                   DataType.Int, DataType.Bool], ids=str)
def test_full(dtype):
    x = make([2, 3], seed=63)
    fill = True if dtype == DataType.Bool else (7 if dtype == DataType.Int else 2.5)

    def build(fd, a):
        f = fd.ops.full([2, 3], fd.define_scalar(fill), dtype)
        return [f, fd.ops.add(a, f)]

    _, (f, s) = run(build, [x])
    ef = torch.full([2, 3], fill, dtype=DT_TO_TORCH[dtype])
    check(f, ef, "full")
    check(s, x + ef, "x + full")


@pytest.mark.parametrize("length,start,step,dtype", [
    (5, 0, 1, DataType.Int),
    (4, 3, 2, DataType.Int),
    (6, 100, -3, DataType.Int32),
    (5, 0.5, 0.25, DataType.Float),
    (3, -1.0, 1.5, DataType.Double),
], ids=str)
def test_iota(length, start, step, dtype):
    x = make([length], seed=64)

    def build(fd, a):
        i = fd.ops.iota(fd.define_scalar(length), fd.define_scalar(start),
                        fd.define_scalar(step), dtype)
        return [i, fd.ops.add(a, i)]

    _, (i, s) = run(build, [x])
    td = DT_TO_TORCH[dtype]
    ei = torch.tensor([start + k * step for k in range(length)], dtype=torch.float64).to(td)
    check(i, ei, "iota")
    check(s, x + ei, "x + iota")


def test_shape_op_feeds_full():
    x = make([3, 4], seed=65)

    def build(fd, a):
        return fd.ops.add(a, fd.ops.full(fd.ops.shape(a), fd.define_scalar(1.5), DataType.Float))

    _, (r,) = run(build, [x])
    check(r, x + 1.5, "x + full(shape(x))")


# --------------------------------------------------------------------------------------------
# Python operators


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16], ids=str)
def test_python_operators(dtype):
    a, b = make([3, 4], dtype, 70), nonzero([3, 4], dtype, 71)
    cases = [
        ("t0 + t1", lambda x, y: x + y),
        ("t0 - t1", lambda x, y: x - y),
        ("t0 * t1", lambda x, y: x * y),
        ("t0 / t1", lambda x, y: x / y),
        ("t0 * 2.0", lambda x, y: x * 2.0),
        ("t0 + 3", lambda x, y: x + 3),
        ("2.0 - t0", lambda x, y: 2.0 - x),
        ("2.0 * t0", lambda x, y: 2.0 * x),
        ("1.0 / t1", lambda x, y: 1.0 / y),
        ("-t0", lambda x, y: -x),
        ("abs(t0)", lambda x, y: abs(x)),
        ("t0 ** 2", lambda x, y: x ** 2),
        ("t0 > t1", lambda x, y: x > y),
        ("t0 < t1", lambda x, y: x < y),
        ("t0 >= t1", lambda x, y: x >= y),
        ("t0 <= t1", lambda x, y: x <= y),
        ("t0 == t1", lambda x, y: x == y),
        ("t0 != t1", lambda x, y: x != y),
        ("t0 > 0.5", lambda x, y: x > 0.5),
    ]
    for text, fn in cases:
        _, (r,) = run(lambda fd, x, y, fn=fn: fn(x, y), [a, b])
        check(r, fn(a, b), text)


def test_python_operators_int_and_bool():
    a, b = make([3, 4], torch.int64, 72, -50, 50), nonzero([3, 4], torch.int64, 73)
    p, q = make([3, 4], torch.bool, 74), make([3, 4], torch.bool, 75)
    for text, fn in [("t0 & t1", lambda x, y: x & y), ("t0 | t1", lambda x, y: x | y),
                     ("t0 ^ t1", lambda x, y: x ^ y), ("~t0", lambda x, y: ~x),
                     ("t0 << 2", lambda x, y: x << 2),
                     ("t0 >> 1", lambda x, y: x >> 1)]:
        _, (r,) = run(lambda fd, x, y, fn=fn: fn(x, y), [a, b])
        check(r, fn(a, b), f"int {text}")
    for text, fn in [("~b", lambda x, y: ~x), ("b & c", lambda x, y: x & y),
                     ("b | c", lambda x, y: x | y)]:
        _, (r,) = run(lambda fd, x, y, fn=fn: fn(x, y), [p, q])
        check(r, fn(p, q), f"bool {text}")


def test_python_operators_on_scalars():
    x = make([3, 4], seed=76)

    def build(fd, t, s):
        u = s * 2.0 + 1.0  # scalar arithmetic stays a scalar
        return t * u - (-s)

    _, (r,) = run(build, [x, 1.5])
    check(r, x * (1.5 * 2.0 + 1.0) + 1.5, "scalar operators")


# --------------------------------------------------------------------------------------------
# scalar inputs, define_tensor forms, subclass style, seed examples


def test_scalar_input_positions():
    x, y = make([2, 3], seed=80), make([2, 3], seed=81)
    with FusionDefinition() as fd:
        t0 = fd.define_tensor(2, DataType.Float)
        s = fd.define_scalar(dtype=DataType.Double)
        t1 = fd.define_tensor(2, DataType.Float)
        i = fd.define_scalar(dtype=DataType.Int)
        fd.add_output(fd.ops.add(fd.ops.mul(t0, s), fd.ops.mul(t1, i)))
    (r,) = fd.execute([x, 0.5, y, 3])
    check(r, x * 0.5 + y * 3, "scalar inputs")
    (r,) = fd.execute([x, -2.0, y, 7])
    check(r, x * -2.0 + y * 7, "scalar inputs, new values")


def _pointwise_check(fd, inputs, expected_fn, what):
    outs = fd.execute(inputs)
    check(outs[0], expected_fn(*inputs), what)


def test_define_tensor_rank_only():
    x, y = make([2, 4, 8], seed=82), make([2, 4, 8], seed=83)
    with FusionDefinition() as fd:
        t0, t1 = fd.define_tensor(3), fd.define_tensor(3)
        fd.add_output(fd.ops.add(t0, t1))
    _pointwise_check(fd, [x, y], torch.add, "define_tensor(3)")
    # contiguity all False: non-contiguous views are accepted too
    xs = make([4, 8, 8], seed=84)[::2, :, ::2]
    _pointwise_check(fd, [xs, make([2, 8, 4], seed=85)], torch.add, "define_tensor(3) strided")


def test_define_tensor_rank_and_dtype():
    x = make([3, 5], torch.float16, 86)
    with FusionDefinition() as fd:
        t0 = fd.define_tensor(2, DataType.Half)
        fd.add_output(fd.ops.mul(t0, t0))
    _pointwise_check(fd, [x], lambda a: a * a, "define_tensor(2, Half)")


def test_define_tensor_symbolic_sizes_early():
    x, y = make([4, 1, 6], seed=87), make([4, 5, 6], seed=88)
    with FusionDefinition() as fd:
        t0 = fd.define_tensor(symbolic_sizes=[-1, 1, -1], contiguous=[True, True, True],
                              dtype=DataType.Float)
        t1 = fd.define_tensor(symbolic_sizes=[-1, -1, -1], contiguous=[True, True, True],
                              dtype=DataType.Float)
        fd.add_output(fd.ops.add(t0, t1))
    _pointwise_check(fd, [x, y], torch.add, "symbolic_sizes")


def test_define_tensor_shape_contiguity():
    x, y = make([4, 6], seed=89), make([4, 6], seed=90)
    with FusionDefinition() as fd:
        t0 = fd.define_tensor(shape=[-1, -1], contiguity=[True, True], dtype=DataType.Float,
                              is_cpu=False)
        t1 = fd.define_tensor(shape=[-1, -1], contiguity=True, dtype=DataType.Float)
        fd.add_output(fd.ops.sub(t0, t1))
    _pointwise_check(fd, [x, y], torch.sub, "shape/contiguity")


def test_define_tensor_broadcast_none_contiguity():
    x, y = make([4, 1], seed=91), make([4, 6], seed=92)
    with FusionDefinition() as fd:
        t0 = fd.define_tensor(shape=[-1, 1], contiguity=[True, None], dtype=DataType.Float)
        t1 = fd.define_tensor(shape=[-1, -1], contiguity=[True, True], dtype=DataType.Float)
        fd.add_output(fd.ops.mul(t0, t1))
    _pointwise_check(fd, [x, y], torch.mul, "contiguity None = broadcast")


def test_define_tensor_stride_order():
    base = make([3, 4], seed=93)
    x = base.t()  # shape [4, 3], strides (1, 4): column-major
    y = make([4, 3], seed=94)
    with FusionDefinition() as fd:
        t0 = fd.define_tensor(shape=[-1, -1], contiguity=[True, True], dtype=DataType.Float,
                              is_cpu=False, stride_order=[0, 1])
        t1 = fd.define_tensor(shape=[-1, -1], contiguity=[True, True], dtype=DataType.Float,
                              stride_order=[1, 0])
        fd.add_output(fd.ops.add(t0, t1))
    _pointwise_check(fd, [x, y], torch.add, "stride_order")


def test_define_tensor_sizes_strides():
    x = make([2, 4, 6], seed=95)
    y = make([2, 4, 6], seed=96)
    with FusionDefinition() as fd:
        t0 = fd.define_tensor(sizes=[2, 4, 6], strides=[24, 6, 1], dtype=DataType.Float)
        t1 = fd.define_tensor(sizes=x.shape, strides=x.stride(), dtype=DataType.Float,
                              static_sizes=True)
        fd.add_output(fd.ops.mul(t0, t1))
    _pointwise_check(fd, [x, y], torch.mul, "sizes/strides")
    # static_sizes=False (the default): another shape with the same layout runs too
    x2 = make([3, 5, 6], seed=97)
    with FusionDefinition() as fd2:
        t0 = fd2.define_tensor(sizes=[2, 4, 6], strides=[24, 6, 1], dtype=DataType.Float)
        fd2.add_output(fd2.ops.neg(t0))
    _pointwise_check(fd2, [x2], torch.neg, "sizes/strides symbolic")


def test_from_pytorch():
    for dtype in [torch.float32, torch.float16, torch.int32, torch.bool]:
        x = make([3, 1, 5], dtype, 99, -5, 5)
        with FusionDefinition() as fd:
            t0 = fd.from_pytorch(x)
            fd.add_output(fd.ops.set(t0))
        _pointwise_check(fd, [x], torch.clone, f"from_pytorch {dtype}")
        with FusionDefinition() as fd2:
            t0 = fd2.from_pytorch(x, static_sizes=True)
            fd2.add_output(fd2.ops.logical_not(t0))
        _pointwise_check(fd2, [x], torch.logical_not, f"from_pytorch static {dtype}")


def test_subclass_definition():
    class MyFusion(FusionDefinition):
        def definition(self):
            t0 = self.define_tensor(shape=[-1, -1], contiguity=[True, True],
                                    dtype=DataType.Float)
            t1 = self.define_tensor(shape=[-1, -1], contiguity=[True, True],
                                    dtype=DataType.Float)
            self.add_output(self.ops.relu(self.ops.add(t0, t1)))

    x, y = make([3, 4], seed=100), make([3, 4], seed=101)
    fd = MyFusion()
    (r,) = fd.execute([x, y])
    check(r, torch.relu(x + y), "subclass")
    (r,) = MyFusion().execute([y, x])
    check(r, torch.relu(x + y), "subclass again")


def test_multiple_outputs_and_intermediates():
    x = make([4, 8], seed=102)

    def build(fd, a):
        m = fd.ops.max(a, [1])
        e = fd.ops.exp(fd.ops.sub(a, fd.ops.broadcast(m, [False, True])))
        s = fd.ops.sum(e, [1])
        return [fd.ops.div(e, fd.ops.broadcast(s, [False, True])), m]

    _, (sm, m) = run(build, [x])
    check(sm, torch.softmax(x, 1), "softmax")
    check(m, x.amax(1), "softmax max")


def test_readme_example_and_lookup_by_id():
    from fusion_cache import Fusion

    fs = Fusion()
    with FusionDefinition(fs) as fd:
        t0 = fd.define_tensor(symbolic_sizes=[-1, 1, -1], contiguous=[True, True, True],
                              dtype=DataType.Float)
        t1 = fd.define_tensor(3)
        c0 = fd.define_constant(3.0)
        t2 = fd.ops.add(t0, t1)
        t3 = fd.ops.mul(t2, c0)
        t4 = fd.ops.sum(t3, [-1], False, DataType.Float)
        fd.add_output(t4)

    input1, input2 = make([2, 1, 8], seed=103), make([2, 4, 8], seed=104)
    expected = ((input1 + input2) * 3.0).sum(-1)
    out = fs.execute([input1, input2])[0]
    check(out, expected, "README example")

    fs2 = Fusion(fs.id())
    check(fs2.execute([input1, input2])[0], expected, "README lookup by id")
    fd3 = FusionDefinition(fs.id())
    check(fd3.execute([input1, input2])[0], expected, "FusionDefinition(id)")


def test_reduction_broadcast_pointwise_example():
    x, y = make([2, 32], seed=105), make([2, 32], seed=106)
    with FusionDefinition() as fd:
        t0 = fd.define_tensor(shape=[-1, -1], contiguity=[True, True], dtype=DataType.Float)
        t1 = fd.define_tensor(shape=[-1, -1], contiguity=[True, True], dtype=DataType.Float)
        t2 = fd.ops.sum(t0, dims=[1])
        t3 = fd.ops.broadcast(t2, is_broadcast_dim=[False, True])
        t4 = fd.ops.add(t1, t3)
        fd.add_output(t4)
    (r,) = fd.execute([x, y])
    check(r, y + x.sum(1, keepdim=True), "reduction+broadcast+pointwise")
    x2, y2 = make([5, 7], seed=107), make([5, 7], seed=108)
    (r2,) = fd.execute([x2, y2])
    check(r2, y2 + x2.sum(1, keepdim=True), "same fusion, new sizes")


def test_compute_contiguity_and_descriptor():
    from fusion_cache import compute_contiguity, compute_tensor_descriptor

    x = make([2, 3, 4], seed=109)
    assert list(compute_contiguity(list(x.shape), list(x.stride()))) == [True, True, True]
    assert list(compute_contiguity([2, 3], [6, 1])) == [False, True]
    contiguity, stride_order = compute_tensor_descriptor(list(x.shape), list(x.stride()))
    assert list(contiguity) == [True, True, True]
    assert list(stride_order) == [2, 1, 0]


# --------------------------------------------------------------------------------------------
# edge cases: promotion corners, NaN, broadcast and empty inputs, outputs


def test_python_truediv_operator_on_ints_is_true_division():
    a, b = make([3, 4], torch.int64, 110, -50, 50), nonzero([3, 4], torch.int64, 111)
    _, (r,) = run(lambda fd, x, y: x / y, [a, b])
    check(r, a / b, "int t0 / t1")


def test_reflected_comparison_and_pow_operators():
    a = make([3, 4], torch.float32, 112, 0.5, 2.0)
    cases = [("0.5 < t0", lambda x: 0.5 < x), ("2.0 ** t0", lambda x: 2.0 ** x),
             ("t0 ** t0", lambda x: x ** x), ("1 + t0", lambda x: 1 + x)]
    for text, fn in cases:
        _, (r,) = run(lambda fd, x, fn=fn: fn(x), [a])
        check(r, fn(a), text)


@pytest.mark.parametrize("dtype,s", [(torch.bool, 2.5), (torch.int32, True),
                                     (torch.float16, 3), (torch.bfloat16, True),
                                     (torch.float32, 2.5j)], ids=str)
def test_promotion_with_python_constants(dtype, s):
    x = make([3, 4], dtype, 113, -4, 4)

    def build(fd, t):
        return [fd.ops.add(t, fd.define_scalar(s)), fd.ops.mul(t, s)]

    _, (r1, r2) = run(build, [x])
    check(r1, torch.add(x, s), f"add({dtype}, {s!r})")
    check(r2, torch.mul(x, s), f"mul({dtype}, {s!r})")


def test_double_scalar_input_accepts_python_int():
    x = make([3, 4], seed=114)
    with FusionDefinition() as fd:
        t = fd.from_pytorch(x)
        fd.add_output(fd.ops.mul(t, fd.define_scalar(dtype=DataType.Double)))
    (r,) = fd.execute([x, 3])
    check(r, x * 3.0, "Double scalar fed a Python int")
    (r,) = fd.execute((x, 0.5))
    check(r, x * 0.5, "inputs as a tuple")


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=str)
def test_nan_propagation(dtype):
    x = with_specials(make([4, 6], dtype, 115))  # row 0 holds inf, -inf, nan, 0
    y = make([4, 6], dtype, 116)
    for name, fn in [("maximum", torch.maximum), ("minimum", torch.minimum)]:
        check_op(op(name), fn, [x, y], f"{name} with NaN")
    for name in ["max", "min"]:
        _, (r,) = run(lambda fd, t, name=name: getattr(fd.ops, name)(t, [1]), [x])
        check(r, torch_reduce(name, x, [1], False), f"{name} reduction with NaN")
    _, (r,) = run(lambda fd, t: fd.ops.sum(t, [0]), [x])
    check(r, x.sum(0), "sum with inf/nan")


def test_half_sum_accumulates_in_float():
    x = make([4, 4096], torch.float16, 117, 0.0, 1.0)
    _, (r,) = run(lambda fd, t: fd.ops.sum(t, [1]), [x])
    exact = x.double().sum(1)
    assert r.dtype == torch.float16
    torch.testing.assert_close(r.double(), exact, rtol=2e-3, atol=0)


def test_reduce_over_broadcast_dim():
    x = make([3, 1, 4], seed=118)
    _, (r, r2) = run(lambda fd, t: [fd.ops.sum(t, [1]), fd.ops.max(t, [1, 2], True)], [x])
    check(r, x.sum(1), "sum over a size-1 dim")
    check(r2, x.amax((1, 2), keepdim=True), "max over size-1 and other dim")


def test_reduce_after_permute_and_broadcast():
    x, y = make([3, 5], seed=119), make([5, 4], seed=120)

    def build(fd, a, b):
        p = fd.ops.permute(a, [1, 0])                  # [5, 3]
        s = fd.ops.sum(p, [1], keepdim=True)           # [5, 1]
        return fd.ops.mul(fd.ops.add(b, s), fd.ops.broadcast(fd.ops.sum(b, [0]), [True, False]))

    _, (r,) = run(build, [x, y])
    check(r, (y + x.t().sum(1, keepdim=True)) * y.sum(0).unsqueeze(0), "permute/sum/broadcast")


def test_zero_size_inputs():
    x, y = make([0, 4], seed=121), make([0, 4], seed=122)
    _, (r,) = run(op("add"), [x, y])
    check(r, x + y, "add of empty")
    _, (s,) = run(lambda fd, t: fd.ops.sum(t, [0]), [x])
    check(s, x.sum(0), "sum over an empty dim")
    _, (p,) = run(lambda fd, t: fd.ops.prod(t, [0]), [x])
    check(p, x.prod(0), "prod over an empty dim")


def test_zero_dim_tensor_input():
    x, y = make([], seed=123), make([3, 4], seed=124)
    _, (r,) = run(op("mul"), [y, x])
    check(r, y * x, "[3,4] * 0-d")
    _, (r2,) = run(op("exp"), [x])
    check(r2, torch.exp(x), "exp of 0-d")


def test_expanded_input_from_pytorch():
    x = make([3, 1], seed=125).expand(3, 4)   # stride 0 on dim 1
    y = make([3, 4], seed=126)
    _, (r,) = run(op("add"), [x, y])
    check(r, x + y, "expanded input + y")
    _, (s,) = run(lambda fd, t: fd.ops.sum(t, [1]), [x])
    check(s, x.sum(1), "sum over an expanded dim")


def test_column_major_sizes_strides_input():
    x = make([3, 4], seed=127).t()  # sizes [4, 3], strides [1, 4]
    with FusionDefinition() as fd:
        t0 = fd.define_tensor(sizes=[4, 3], strides=[1, 4], dtype=DataType.Float)
        fd.add_output(fd.ops.mul(t0, fd.ops.sum(t0, [0], keepdim=True)))
    (r,) = fd.execute([x])
    check(r, x * x.sum(0, keepdim=True), "column-major input")


def test_expand_minus_one_keeps_size():
    x = make([1, 3], seed=128)
    _, (r,) = run(lambda fd, a: fd.ops.expand(a, [4, -1]), [x])
    check(r, x.expand(4, -1), "expand with -1")


def test_reshape_minus_one_is_inferred():
    x = make([2, 12], seed=129)
    _, (r,) = run(lambda fd, a: fd.ops.reshape(a, [-1, 6]), [x])
    check(r, x.reshape(-1, 6), "reshape with -1")


def test_slice_negative_indices_normalize():
    x = make([6, 8], seed=130)
    _, (r,) = run(lambda fd, a: fd.ops.slice(a, [-3, 0], [6, -1]), [x])
    check(r, x[-3:6, 0:-1], "slice with negative indices")


def test_iota_defaults():
    x = make([5], seed=131)

    def build(fd, a):
        i = fd.ops.iota(fd.define_scalar(5))
        return [i, fd.ops.add(a, i)]

    _, (i, s) = run(build, [x])
    check(i, torch.arange(5), "iota(5)")
    check(s, x + torch.arange(5), "x + iota(5)")


def test_full_with_vector_shape():
    x = make([2, 3], seed=132)

    def build(fd, a):
        v = fd.define_vector([fd.ops.size(a, 0), fd.ops.size(a, 1)])
        return fd.ops.sub(fd.ops.full(v, fd.define_scalar(0.25), DataType.Float), a)

    _, (r,) = run(build, [x])
    check(r, 0.25 - x, "full(vector) - x")


@pytest.mark.parametrize("weights,stats", [(False, True), (True, False), (False, False)])
def test_batch_norm_optional_args(weights, stats):
    x = make([4, 3, 5], torch.float32, 133)
    w, b = (make([3], seed=134), make([3], seed=135)) if weights else (None, None)
    rm, rv = (make([3], seed=136, low=-0.5, high=0.5),
              make([3], seed=137, low=0.5, high=1.5)) if stats else (None, None)
    rm_ref = rm.clone() if stats else None
    rv_ref = rv.clone() if stats else None
    inputs = [t for t in (x, w, b, rm, rv) if t is not None]

    def build(fd, *vals):
        it = iter(vals)
        t = next(it)
        w_ = next(it) if weights else None
        b_ = next(it) if weights else None
        rm_ = next(it) if stats else None
        rv_ = next(it) if stats else None
        out, mean, invstd = fd.ops.batch_norm(t, w_, b_, rm_, rv_, fd.define_scalar(0.2),
                                              fd.define_scalar(1e-3), True)
        return [out, mean, invstd]

    _, (out, mean, invstd) = run(build, inputs)
    e = torch.native_batch_norm(x, w, b, rm_ref, rv_ref, True, 0.2, 1e-3)
    check(out, e[0], "bn out", rtol=1e-4, atol=1e-4)
    check(mean, e[1], "bn mean")
    check(invstd, e[2], "bn invstd", rtol=1e-4, atol=1e-4)
    if stats:
        check(rm, rm_ref, "running_mean")
        check(rv, rv_ref, "running_var", rtol=1e-4, atol=1e-5)


def test_complex_arithmetic():
    a, b = make([3, 4], torch.complex64, 138), make([3, 4], torch.complex64, 139)
    for name in ["add", "mul", "sub"]:
        check_op(op(name), getattr(torch, name), [a, b], f"{name}(complex64)")
    check_op(op("abs"), torch.abs, [a], "abs(complex64)")


def test_results_do_not_alias_across_executions():
    x, y = make([3, 4], seed=140), make([3, 4], seed=141)
    with FusionDefinition() as fd:
        t = fd.from_pytorch(x)
        fd.add_output(fd.ops.mul(t, fd.define_scalar(2.0)))
        fd.add_output(fd.ops.set(t))
    r1 = fd.execute([x])
    r2 = fd.execute([y])
    check(r1[0], x * 2.0, "first result after a second execute")
    check(r2[0], y * 2.0, "second result")
    r2[1].add_(1.0)
    check(y, make([3, 4], seed=141), "set() output does not alias its input")


def test_output_passthrough_and_duplicate():
    x = make([3, 4], seed=142)
    with FusionDefinition() as fd:
        t = fd.from_pytorch(x)
        e = fd.ops.exp(t)
        fd.add_output(t)
        fd.add_output(e)
        fd.add_output(e)
    outs = fd.execute([x])
    assert len(outs) == 3
    check(outs[0], x, "input as output")
    check(outs[1], torch.exp(x), "exp")
    check(outs[2], torch.exp(x), "exp again")


def test_output_stride_order():
    x = make([3, 4], seed=143)
    with FusionDefinition() as fd:
        t = fd.from_pytorch(x)
        fd.add_output(fd.ops.relu(t), stride_order=[0, 1])
    (r,) = fd.execute([x])
    check(r, torch.relu(x), "relu with output stride order")
    assert r.stride() == (1, 3), f"stride_order [0, 1] should make dim 1 outermost: {r.stride()}"


def test_alias_input_updates_in_place():
    x, acc = make([3, 4], seed=144), make([3, 4], seed=145)
    expected = acc + x
    with FusionDefinition() as fd:
        t = fd.from_pytorch(x)
        a = fd.from_pytorch(acc)
        fd.add_output(fd.ops.add(a, t), alias_input=a)
    fd.execute([x, acc])
    check(acc, expected, "alias_input written in place")


# --------------------------------------------------------------------------------------------
# dtype sweeps: every dtype pair against torch's promotion (one test per op; failures listed)

SWEEP_DTYPES = [torch.bool, torch.int32, torch.int64, torch.float16, torch.bfloat16,
                torch.float32, torch.float64]
NO_ZERO = {"div", "truediv", "fmod", "remainder", "mod"}


def _integral(dtype):
    return dtype == torch.bool or dtype in INTS


def _sweep_reference(name):
    fns = {name: fn for name, fn, _ in FLOAT_BINARY + INT_BINARY}

    def div(a, b):
        if _integral(a.dtype) and _integral(b.dtype):
            return torch.div(a, b, rounding_mode="trunc")
        return torch.true_divide(a, b)

    return div if name == "div" else fns[name]


def _sweep_operand(dtype, seed, safe_divisor):
    if dtype == torch.bool:
        return torch.ones(3, 4, dtype=torch.bool) if safe_divisor else make([3, 4], dtype, seed)
    if safe_divisor:
        return nonzero([3, 4], dtype, seed)
    return make([3, 4], dtype, seed, -5, 5)


def _report(failures):
    assert not failures, f"{len(failures)} mismatches:\n" + "\n".join(failures[:40])


def _compare(got, expected, what, failures, low_precision=False):
    try:
        check(got, expected, what, **(tol(torch.float16) if low_precision else {}))
    except AssertionError as e:
        failures.append(str(e).splitlines()[0][:200])


SWEEP_OPS = ["add", "sub", "mul", "div", "truediv", "fmod", "remainder", "mod", "pow",
             "atan2", "minimum", "maximum", "eq", "ne", "lt", "ge", "logical_and",
             "logical_or", "bitwise_and", "bitwise_xor", "bitwise_left_shift", "gcd",
             "nextafter"]


@pytest.mark.parametrize("name", SWEEP_OPS)
def test_binary_dtype_sweep(name):
    ref = _sweep_reference(name)
    failures: list[str] = []
    for da in SWEEP_DTYPES:
        for db in SWEEP_DTYPES:
            a = _sweep_operand(da, 1, False)
            b = _sweep_operand(db, 2, name in NO_ZERO)
            if name in ("pow", "bitwise_left_shift"):
                b = b.abs() if b.dtype != torch.bool else b
                a = a.abs() if name == "pow" and a.dtype != torch.bool else a
            try:
                expected = ref(a, b)
            except (RuntimeError, TypeError, NotImplementedError):
                continue  # torch has no such op for these dtypes
            what = f"{name}({da}, {db})"
            try:
                _, (got,) = run(op(name), [a, b])
            except Exception as e:  # noqa: BLE001 - collected, reported below
                failures.append(f"{what}: raised {type(e).__name__}: {e}"[:200])
                continue
            _compare(got, expected, what, failures)
    _report(failures)


PY_SCALARS = [True, 3, -2.5, 1.5j]


def _c_div(a, b):
    """nvFuser's div: truncating when both operands are integral, else true division."""
    if _integral(torch.result_type(a, b)):
        a_t = a if isinstance(a, torch.Tensor) else torch.tensor(a)
        return torch.div(a_t, b, rounding_mode="trunc").to(torch.result_type(a, b))
    return torch.true_divide(a, b)


REFLECTED = {
    "div": _c_div,
    "add": lambda s, t: s + t, "sub": lambda s, t: s - t, "mul": lambda s, t: s * t,
    "truediv": lambda s, t: s / t, "eq": lambda s, t: s == t, "lt": lambda s, t: s < t,
    "pow": lambda s, t: s ** t, "remainder": lambda s, t: s % t,
    "maximum": lambda s, t: torch.maximum(torch.tensor(s, dtype=torch.result_type(t, s)), t),
}
FORWARD = {
    "div": _c_div,
    "truediv": torch.true_divide,
    "maximum": lambda t, s: torch.maximum(t, torch.tensor(s, dtype=torch.result_type(t, s))),
}


@pytest.mark.parametrize("name", sorted(REFLECTED))
def test_tensor_python_scalar_sweep(name):
    """Tensor op Python constant (both orders) follows torch's tensor-scalar promotion."""
    failures: list[str] = []
    for dtype in SWEEP_DTYPES + [torch.complex64]:
        a = make([3, 4], dtype, 3, 1, 4)
        for s in PY_SCALARS:
            if dtype == torch.float16 and isinstance(s, complex):
                continue  # torch gives ComplexHalf, which DataType lacks; see the test below
            for order in ("ts", "st"):
                try:
                    if order == "ts":
                        fn = FORWARD[name] if name in FORWARD else getattr(torch, name)
                        expected = fn(a, s)
                    else:
                        expected = REFLECTED[name](s, a)
                except (RuntimeError, TypeError, NotImplementedError):
                    continue
                if expected.dtype == torch.complex32:
                    continue  # no ComplexHalf in DataType
                what = (f"{name}(t, {s!r})" if order == "ts" else f"{name}({s!r}, t)") + \
                    f" with t:{dtype}"

                def build(fd, t, order=order, s=s):
                    c = fd.define_scalar(s)
                    return getattr(fd.ops, name)(*((t, c) if order == "ts" else (c, t)))

                try:
                    _, (got,) = run(build, [a])
                except Exception as e:  # noqa: BLE001 - collected, reported below
                    failures.append(f"{what}: raised {type(e).__name__}: {e}"[:200])
                    continue
                low = dtype in (torch.float16, torch.bfloat16)
                _compare(got, expected, what, failures, low)
    _report(failures)


def test_half_tensor_compared_with_complex_constant():
    x = make([3, 4], torch.float16, 4)
    _, (r,) = run(lambda fd, t: fd.ops.eq(t, fd.define_scalar(1.5j)), [x])
    check(r, torch.eq(x.to(torch.complex64), 1.5j), "eq(half, 1.5j)")


UNARY_SWEEP = [u[0] for u in FLOAT_UNARY] + [u[0] for u in SPECIAL_UNARY] + ["bitwise_not"]


@pytest.mark.parametrize("dtype", [torch.bool, torch.int32, torch.int64], ids=str)
def test_unary_on_integral_sweep(dtype):
    """Unary ops on bool/int inputs: value and dtype as torch (float ops promote to float32)."""
    refs = {n: fn for n, fn, _ in FLOAT_UNARY} | dict(SPECIAL_UNARY) | {
        "bitwise_not": torch.bitwise_not}
    x = make([3, 4], dtype, 5, 1, 4)
    failures: list[str] = []
    for name in UNARY_SWEEP:
        try:
            expected = refs[name](x)
        except (RuntimeError, TypeError, NotImplementedError):
            continue
        try:
            _, (got,) = run(op(name), [x])
        except Exception as e:  # noqa: BLE001 - collected, reported below
            failures.append(f"{name}({dtype}): raised {type(e).__name__}: {e}"[:200])
            continue
        _compare(got, expected, f"{name}({dtype})", failures)
    _report(failures)


# --------------------------------------------------------------------------------------------
# layouts and runtime extents


def test_partial_contiguity_accepts_strided_outer_dim():
    base = make([6, 5], seed=150)
    x = base[::2, :]  # strides (10, 1): inner dim contiguous, outer not
    with FusionDefinition() as fd:
        t0 = fd.define_tensor(shape=[-1, -1], contiguity=[False, True], dtype=DataType.Float)
        fd.add_output(fd.ops.mul(t0, t0))
    (r,) = fd.execute([x])
    check(r, x * x, "contiguity [False, True] with a strided outer dim")


def test_size_one_dim_with_any_stride_is_contiguous():
    x = make([4, 1], seed=151).t()  # shape [1, 4], strides (1, 1); torch calls it contiguous
    assert x.is_contiguous()
    with FusionDefinition() as fd:
        t0 = fd.define_tensor(shape=[-1, -1], contiguity=[True, True], dtype=DataType.Float)
        fd.add_output(fd.ops.neg(t0))
    (r,) = fd.execute([x])
    check(r, -x, "size-1 dim with an odd stride")


def test_symbolic_dim_accepts_runtime_size_one():
    x, y = make([1, 4], seed=152), make([1, 4], seed=153)
    with FusionDefinition() as fd:
        t0 = fd.define_tensor(shape=[-1, -1], contiguity=[True, True], dtype=DataType.Float)
        t1 = fd.define_tensor(shape=[-1, -1], contiguity=[True, True], dtype=DataType.Float)
        fd.add_output(fd.ops.add(t0, t1))
    (r,) = fd.execute([x, y])
    check(r, x + y, "symbolic dims bound to 1")


def test_slice_end_past_symbolic_extent_clamps():
    x = make([4, 6], seed=154)
    with FusionDefinition() as fd:
        t0 = fd.define_tensor(shape=[-1, -1], contiguity=[True, True], dtype=DataType.Float)
        fd.add_output(fd.ops.slice(t0, [1, 0], [100, 2]))
    (r,) = fd.execute([x])
    check(r, x[1:100, 0:2], "slice end clamped to the runtime extent")


def test_batch_norm_channels_last():
    x = make([2, 4, 5, 3], torch.float32, 155)  # N, H, W, C
    w, b = make([3], seed=156), make([3], seed=157)
    rm, rv = make([3], seed=158, low=-0.5, high=0.5), make([3], seed=159, low=0.5, high=1.5)
    rm_ref, rv_ref = rm.clone(), rv.clone()

    def build(fd, t, w_, b_, rm_, rv_):
        out, mean, invstd = fd.ops.batch_norm(t, w_, b_, rm_, rv_, fd.define_scalar(0.1),
                                              fd.define_scalar(1e-5), True, channels_last=True)
        return [out, mean, invstd]

    _, (out, mean, invstd) = run(build, [x, w, b, rm, rv])
    e = torch.native_batch_norm(x.permute(0, 3, 1, 2), w, b, rm_ref, rv_ref, True, 0.1, 1e-5)
    check(out, e[0].permute(0, 2, 3, 1), "bn channels_last out", rtol=1e-4, atol=1e-4)
    check(mean, e[1], "bn channels_last mean")
    check(invstd, e[2], "bn channels_last invstd", rtol=1e-4, atol=1e-4)
    check(rm, rm_ref, "bn channels_last running_mean")
    check(rv, rv_ref, "bn channels_last running_var", rtol=1e-4, atol=1e-5)


def test_layer_norm_composed():
    """Layer norm composed from var_mean/broadcast/rsqrt, as API.md describes."""
    x = make([4, 16], torch.float32, 160)
    w, b = make([16], seed=161), make([16], seed=162)

    def build(fd, t, w_, b_):
        var, mean = fd.ops.var_mean(t, [1], correction=0, keepdim=False)
        mean_b = fd.ops.broadcast(mean, [False, True])
        inv = fd.ops.rsqrt(fd.ops.add(var, fd.define_scalar(1e-5)))
        y = fd.ops.mul(fd.ops.sub(t, mean_b), fd.ops.broadcast(inv, [False, True]))
        return fd.ops.add(fd.ops.mul(y, fd.ops.broadcast(w_, [True, False])),
                          fd.ops.broadcast(b_, [True, False]))

    _, (r,) = run(build, [x, w, b])
    check(r, F.layer_norm(x, [16], w, b, 1e-5), "layer_norm", rtol=1e-5, atol=1e-5)


def test_define_vector_input():
    x = make([2, 12], seed=163)
    with FusionDefinition() as fd:
        t = fd.define_tensor(2)
        v = fd.define_vector(2)
        fd.add_output(fd.ops.reshape(t, v))
    (r,) = fd.execute([x, [4, 6]])
    check(r, x.reshape(4, 6), "reshape to a vector input")
    (r,) = fd.execute([x, (3, 8)])
    check(r, x.reshape(3, 8), "reshape to a vector input (tuple)")


def test_segment_single_segment():
    x, y = make([3, 4], seed=164), make([3, 4], seed=165)
    with FusionDefinition() as fd:
        t0, t1 = fd.from_pytorch(x), fd.from_pytorch(y)
        fd.add_output(fd.ops.add(fd.ops.sum(t0, [1], keepdim=True), t1))
    assert fd.segment([x, y]) == []
    assert fd.segments == []
    (r,) = fd.execute([x, y])
    check(r, x.sum(1, keepdim=True) + y, "execute after segment()")


def test_exports():
    import fusion_cache

    for name in ["FusionDefinition", "FusionCache", "DataType", "Tensor", "Scalar", "version",
                 "compute_contiguity", "compute_tensor_descriptor"]:
        assert hasattr(fusion_cache, name), name
    assert isinstance(fusion_cache.version(), str)
    for dt in ["Double", "Float", "Half", "BFloat16", "Int", "Int32", "Bool", "ComplexFloat",
               "ComplexDouble", "Null"]:
        assert hasattr(DataType, dt), dt


def test_reduction_dtype_arg_on_ints():
    x = make([4, 5], torch.int32, 166, -9, 9)
    _, (r,) = run(lambda fd, t: fd.ops.sum(t, [1], dtype=DataType.Int32), [x])
    check(r, torch.sum(x, 1, dtype=torch.int32), "sum(int32, dtype=Int32)")
    _, (r,) = run(lambda fd, t: fd.ops.sum(t, [1], dtype=DataType.Float), [x])
    check(r, torch.sum(x, 1, dtype=torch.float32), "sum(int32, dtype=Float)")


def test_reshape_to_list_of_scalars():
    x = make([2, 12], seed=167)

    def build(fd, a):
        s0, s1 = fd.ops.size(a, 0), fd.ops.size(a, 1)
        return fd.ops.reshape(a, [fd.ops.mul(s0, 2), fd.ops.div(s1, 2)])

    _, (r,) = run(build, [x])
    check(r, x.reshape(4, 6), "reshape to [size*2, size/2]")


def test_requires_grad_input():
    x = make([3, 4], seed=168).requires_grad_()
    _, (r,) = run(op("sin"), [x])
    check(r.detach(), torch.sin(x).detach(), "sin of a requires_grad input")
