"""repr(fd) rebuilds the same fusion; fusion_ir() speaks nvFuser's notation."""
from __future__ import annotations

import re

import pytest

import fusion_cache
from fusion_cache import DataType, FusionDefinition


def names(text: str) -> list[str]:
    return text.split()


HEADER = re.compile(r"def nvfuser_fusion_id(\d+)\(fd : FusionDefinition\) -> None :")

UNARY = names(
    "abs acos acosh asin asinh atan atanh ceil cos cosh exp exp2 expm1 erf erfc erfinv erfcinv "
    "floor frac lgamma log log10 log1p log2 neg logical_not relu reciprocal round rsqrt set sign "
    "sigmoid signbit silu sin sinh sqrt tan tanh trunc isfinite isinf isnan isneginf isposinf "
    "isreal"
)
INT_UNARY = ["bitwise_not"]
BINARY = names(
    "add sub mul div truediv fmod remainder mod pow atan2 minimum maximum nextafter eq ne lt le "
    "gt ge logical_and logical_or"
)
INT_BINARY = names(
    "gcd bitwise_and bitwise_or bitwise_xor bitwise_left_shift bitwise_right_shift "
    "logical_right_shift"
)


def f2(fd, dtype=DataType.Float):
    return fd.define_tensor(shape=[-1, -1], contiguity=[True, True], dtype=dtype)


def unary(name, dtype=DataType.Float):
    def build(fd):
        fd.add_output(getattr(fd.ops, name)(f2(fd, dtype)))
    return build


def binary(name, dtype=DataType.Float):
    def build(fd):
        fd.add_output(getattr(fd.ops, name)(f2(fd, dtype), f2(fd, dtype)))
    return build


def b_alpha(fd):
    t0, t1 = f2(fd), f2(fd)
    fd.add_output(fd.ops.add_alpha(t0, t1, fd.define_scalar(2.0)))
    fd.add_output(fd.ops.sub_alpha(t0, t1, fd.define_scalar(0.5)))


def b_scalar_ops(fd):
    t0 = f2(fd)
    s = fd.define_scalar(dtype=DataType.Double)
    i = fd.define_scalar(dtype=DataType.Int)
    fd.add_output(fd.ops.mul(fd.ops.add(t0, s), i))
    fd.add_output(fd.ops.sub(fd.define_constant(3), t0))


def b_operators(fd):
    t0, t1 = f2(fd), f2(fd)
    fd.add_output((t0 + t1) * 2.0 - (-t0) / t1)
    fd.add_output(t0 ** 2)
    fd.add_output(2.0 - t0)
    fd.add_output(~(t0 > t1))


def b_ternary(fd):
    c = f2(fd, DataType.Bool)
    t0, t1, t2 = f2(fd), f2(fd), f2(fd)
    fd.add_output(fd.ops.where(c, t0, t1))
    fd.add_output(fd.ops.lerp(t0, t1, t2))
    fd.add_output(fd.ops.lerp(t0, t1, fd.define_scalar(0.25)))
    fd.add_output(fd.ops.clamp(t0, fd.define_scalar(-1.0), fd.define_scalar(1.0)))
    fd.add_output(fd.ops.threshold(t0, fd.define_scalar(0.5), fd.define_scalar(0.0)))
    fd.add_output(fd.ops.addcmul(t0, t1, t2, fd.define_scalar(2.0)))


def b_reductions(fd):
    t0 = fd.define_tensor(shape=[-1, -1, -1], contiguity=True, dtype=DataType.Half)
    fd.add_output(fd.ops.sum(t0, [1], False, DataType.Float))
    fd.add_output(fd.ops.prod(t0, [0, 2], True))
    fd.add_output(fd.ops.max(t0, [-1]))
    fd.add_output(fd.ops.min(t0, dims=[0], keepdim=True, dtype=DataType.Double))
    fd.add_output(fd.ops.sum(t0, axes=[2], keepdim=False))


def b_int_sum(fd):
    t0 = f2(fd, DataType.Int32)
    fd.add_output(fd.ops.sum(t0, [0]))


def b_statistics(fd):
    t0 = fd.define_tensor(shape=[-1, -1, -1], contiguity=True, dtype=DataType.Float)
    fd.add_output(fd.ops.var(t0, [1, 2], 1, False))
    var, mean = fd.ops.var_mean(t0, [0], correction=0, keepdim=True)
    fd.add_output(var)
    fd.add_output(mean)
    avg, var_sum, n = fd.ops.welford(t0, [2])
    fd.add_output(avg)
    fd.add_output(var_sum)
    fd.add_output(n)


def batch_norm(training):
    def build(fd):
        x = fd.define_tensor(shape=[-1, -1, -1, -1], contiguity=True, dtype=DataType.Float)
        w, b, rm, rv = (fd.define_tensor(shape=[-1], contiguity=True, dtype=DataType.Float)
                        for _ in range(4))
        out, mean, invstd = fd.ops.batch_norm(x, w, b, rm, rv, fd.define_scalar(0.1),
                                              fd.define_scalar(1e-5), training)
        fd.add_output(out)
        fd.add_output(mean)
        fd.add_output(invstd)
    return build


def b_shapes(fd):
    t0 = f2(fd)
    t1 = fd.define_tensor(shape=[-1], contiguity=True, dtype=DataType.Float)
    t2 = fd.define_tensor(shape=[1, -1], contiguity=[None, True], dtype=DataType.Float)
    fd.add_output(fd.ops.broadcast(t1, [False, True]))
    fd.add_output(fd.ops.broadcast_in_dim(t1, [4, 3], [1]))
    fd.add_output(fd.ops.broadcast_in_dim(t1, fd.define_vector([fd.ops.size(t0, 0),
                                                               fd.ops.size(t1, 0)]), [1]))
    fd.add_output(fd.ops.expand(t2, [5, 3]))
    fd.add_output(fd.ops.permute(t0, [1, 0]))
    fd.add_output(fd.ops.squeeze(t2, [0]))
    fd.add_output(fd.ops.slice(t0, [0, 1], [2, 3]))
    fd.add_output(fd.ops.slice(t0, [0, 0], [4, 6], [2, 3]))
    fd.add_output(fd.ops.pad(t0, [1, 2], fd.define_scalar(0.5)))
    fd.add_output(fd.ops.pad(t0, [0, 1, 1, 0]))
    fd.add_output(fd.ops.cat([t0, t0], 1))
    fd.add_output(fd.ops.cast(t0, DataType.Half))


def b_reshapes(fd):
    t0 = f2(fd)
    fd.add_output(fd.ops.reshape(t0, [4, 6]))
    fd.add_output(fd.ops.reshape(t0, fd.define_vector([fd.define_scalar(6), fd.define_scalar(4)])))
    fd.add_output(fd.ops.reshape(t0, [2, 12], [3, 8]))
    fd.add_output(fd.ops.reshape(t0, fd.ops.shape(t0)))


def b_creation(fd):
    t0 = f2(fd)
    fd.add_output(fd.ops.full([2, 3], fd.define_scalar(1.5), DataType.Float))
    fd.add_output(fd.ops.iota(fd.define_scalar(5), fd.define_scalar(0), fd.define_scalar(1),
                              DataType.Int))
    fd.add_output(fd.ops.mul(t0, fd.ops.size(t0, 1)))


def b_complex(fd):
    t0 = f2(fd, DataType.ComplexFloat)
    fd.add_output(fd.ops.real(t0))
    fd.add_output(fd.ops.imag(t0))


def b_define_tensor_forms(fd):
    a = fd.define_tensor(3)
    b = fd.define_tensor(3, DataType.Half)
    c = fd.define_tensor(symbolic_sizes=[-1, 1, -1], contiguous=[True, True, True],
                         dtype=DataType.Float)
    d = fd.define_tensor(shape=[-1, -1, -1], contiguity=[True, False, True],
                         dtype=DataType.BFloat16, is_cpu=False, stride_order=[0, 1, 2])
    e = fd.define_tensor(sizes=[2, 4, 6], strides=[24, 6, 1], dtype=DataType.Float)
    f = fd.define_tensor(shape=[2, -1, 1], contiguity=[True, True, None], dtype=DataType.Double)
    fd.add_output(fd.ops.add(fd.ops.add(a, b), fd.ops.add(c, d)))
    fd.add_output(fd.ops.add(e, f))


def b_readme(fd):
    t0 = fd.define_tensor(symbolic_sizes=[-1, 1, -1], contiguous=[True, True, True],
                          dtype=DataType.Float)
    t1 = fd.define_tensor(3)
    c0 = fd.define_constant(3.0)
    t2 = fd.ops.add(t0, t1)
    t3 = fd.ops.mul(t2, c0)
    fd.add_output(fd.ops.sum(t3, [-1], False, DataType.Float))


BUILDERS = (
    [(f"unary_{n}", unary(n)) for n in UNARY]
    + [(f"unary_{n}", unary(n, DataType.Int)) for n in INT_UNARY]
    + [(f"binary_{n}", binary(n)) for n in BINARY]
    + [(f"binary_{n}", binary(n, DataType.Int)) for n in INT_BINARY]
    + [("unary_half_exp", unary("exp", DataType.Half)),
       ("alpha", b_alpha), ("scalar_ops", b_scalar_ops), ("operators", b_operators),
       ("ternary", b_ternary), ("reductions", b_reductions), ("int_sum", b_int_sum),
       ("statistics", b_statistics), ("batch_norm_train", batch_norm(True)),
       ("batch_norm_eval", batch_norm(False)), ("shapes", b_shapes),
       ("reshapes", b_reshapes), ("creation", b_creation), ("complex", b_complex),
       ("define_tensor_forms", b_define_tensor_forms), ("readme", b_readme)]
)


def define(build) -> FusionDefinition:
    with FusionDefinition() as fd:
        build(fd)
    return fd


def rebuild_from_text(text: str) -> FusionDefinition:
    match = HEADER.search(text)
    assert match, text
    namespace = {"FusionDefinition": FusionDefinition, "DataType": DataType,
                 "fusion_cache": fusion_cache}
    exec(compile(text, "<repr(fd)>", "exec"), namespace)  # noqa: S102 - the point of the test
    func = namespace[f"nvfuser_fusion_id{match.group(1)}"]
    with FusionDefinition() as fd2:
        func(fd2)
    return fd2


@pytest.mark.parametrize("name,build", BUILDERS, ids=[b[0] for b in BUILDERS])
def test_repr_round_trips(name, build):
    fd = define(build)
    text = repr(fd)
    assert text.lstrip().startswith("def nvfuser_fusion_id"), text[:200]
    match = HEADER.match(text.lstrip())
    assert match, f"header mismatch: {text.splitlines()[0]!r}"
    assert int(match.group(1)) == fd.id()
    assert str(fd) == text
    fd2 = rebuild_from_text(text)
    assert fd2.id() == fd.id(), f"{name}: rebuilt id {fd2.id()} != {fd.id()}\n{text}"
    assert repr(fd2) == text


def test_repr_is_stable_under_double_round_trip():
    fd = define(b_shapes)
    fd2 = rebuild_from_text(repr(fd))
    fd3 = rebuild_from_text(repr(fd2))
    assert fd.id() == fd2.id() == fd3.id()


def test_repr_of_distinct_fusions_differ():
    texts = {repr(define(b)) for _, b in BUILDERS[:10]}
    assert len(texts) == 10


def reduction_broadcast_fusion() -> FusionDefinition:
    with FusionDefinition() as fd:
        t0 = fd.define_tensor(shape=[-1, -1], contiguity=[True, True], dtype=DataType.Float)
        t1 = fd.define_tensor(shape=[-1, -1], contiguity=[True, True], dtype=DataType.Float)
        t2 = fd.ops.sum(t0, dims=[1])
        t3 = fd.ops.broadcast(t2, is_broadcast_dim=[False, True])
        t4 = fd.ops.add(t1, t3)
        fd.add_output(t4)
    return fd


def test_fusion_ir_notation():
    ir = reduction_broadcast_fusion().fusion_ir()
    assert isinstance(ir, str)
    for fragment in ["T0_g[", "T1_g[", "_l[", "rS", "bS", "iS", "= broadcast("]:
        assert fragment in ir, f"{fragment!r} missing from fusion_ir():\n{ir}"


def test_fusion_ir_reduction_line_has_reduced_axis():
    ir = reduction_broadcast_fusion().fusion_ir()
    lines = [ln for ln in ir.splitlines() if "rS" in ln]
    assert lines, ir
    bcast = [ln for ln in ir.splitlines() if "= broadcast(" in ln]
    assert bcast and "bS" in bcast[0], ir


def test_print_ir_does_not_raise(capsys):
    fd = reduction_broadcast_fusion()
    fd.print_ir()
    out = capsys.readouterr().out
    assert "T0_g[" in out or "T0_g[" in fd.fusion_ir()


@pytest.mark.parametrize("value", [float("nan"), float("inf"), -float("inf"), 0.1, 1e-300,
                                   -2.5e17, 2**40, -7, True, False, 1 + 2j], ids=repr)
def test_repr_round_trips_special_constants(value):
    def build(fd):
        t0 = fd.define_tensor(2, DataType.Double)
        fd.add_output(fd.ops.add(t0, fd.define_scalar(value)))

    fd = define(build)
    fd2 = rebuild_from_text(repr(fd))
    assert fd2.id() == fd.id(), repr(fd)


def b_io_variants(fd):
    t0 = fd.define_tensor(shape=[-1, -1], contiguity=[True, True], dtype=DataType.Float)
    acc = fd.define_tensor(shape=[-1, -1], contiguity=[True, True], dtype=DataType.Float)
    s_int = fd.define_scalar(dtype=DataType.Int)
    s_bool = fd.define_scalar(dtype=DataType.Bool)
    s_half = fd.define_scalar(None, dtype=DataType.Float)
    c = fd.define_scalar(2, dtype=DataType.Double)
    t1 = fd.ops.where(s_bool, fd.ops.mul(t0, s_int), fd.ops.add(t0, s_half))
    fd.add_output(fd.ops.mul(t1, c), stride_order=[0, 1])
    fd.add_output(fd.ops.add(acc, t0), alias_input=acc)


def test_repr_round_trips_io_variants():
    fd = define(b_io_variants)
    fd2 = rebuild_from_text(repr(fd))
    assert fd2.id() == fd.id(), repr(fd)


def test_repr_of_fusion_bound_by_id():
    fd = define(b_shapes)
    again = FusionDefinition(fd.id())
    assert repr(again) == repr(fd)


@pytest.mark.parametrize("var", ["FUSION_CACHE_DUMP", "NVFUSER_DUMP", "PYTORCH_NVFUSER_DUMP"])
def test_dump_python_definition(var, monkeypatch, capsys):
    for other in ["FUSION_CACHE_DUMP", "NVFUSER_DUMP", "PYTORCH_NVFUSER_DUMP"]:
        monkeypatch.delenv(other, raising=False)
    monkeypatch.setenv(var, "python_definition")
    fd = define(b_readme)
    out = capsys.readouterr().out
    assert f"def nvfuser_fusion_id{fd.id()}(fd : FusionDefinition) -> None :" in out, out


def test_print_writes_the_definition(capsys):
    fd = define(b_readme)
    fd.print()
    assert capsys.readouterr().out.strip() == repr(fd).strip()


@pytest.mark.parametrize("name,build", BUILDERS, ids=[b[0] for b in BUILDERS])
def test_fusion_ir_for_every_builder(name, build):
    ir = define(build).fusion_ir()
    assert isinstance(ir, str) and "_g[" in ir, ir
    assert "%kernel_math" in ir or "=" in ir, ir
