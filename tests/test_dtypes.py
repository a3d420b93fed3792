"""Every DataType nvFuser lists: torch names, printing, promotion, the reference's semantics
(against torch, and for UInt64 against Python's integers mod 2**64), and kernels that
compile for complex, float8 and UInt64, or refuse with a reason (packed float4)."""
import pytest
import torch

from fusion_cache import DataType, FusionDefinition
from fusion_cache.frontend.dtypes import from_torch, promote, to_torch
from fusion_cache.runtime.executor import FusionUnsupportedError, executor_for

NVFUSER_MEMBERS = ["Double", "Float", "Half", "BFloat16", "Int", "Int32", "UInt64", "Bool",
                   "ComplexFloat", "ComplexDouble", "Float8_e4m3fn", "Float8_e5m2",
                   "Float8_e8m0fnu", "Float4_e2m1fn", "Float4_e2m1fn_x2", "Null"]  # fmt: skip
TORCH = {
    "UInt64": torch.uint64, "Float8_e4m3fn": torch.float8_e4m3fn,
    "Float8_e5m2": torch.float8_e5m2, "Float8_e8m0fnu": torch.float8_e8m0fnu,
    "Float4_e2m1fn_x2": torch.float4_e2m1fn_x2, "ComplexFloat": torch.complex64,
    "ComplexDouble": torch.complex128,
}  # fmt: skip
FLOAT8 = [(DataType.Float8_e4m3fn, torch.float8_e4m3fn), (DataType.Float8_e5m2, torch.float8_e5m2),
          (DataType.Float8_e8m0fnu, torch.float8_e8m0fnu)]  # fmt: skip
COMPLEX = [(DataType.ComplexFloat, torch.complex64), (DataType.ComplexDouble, torch.complex128)]


def meta(*shape, dtype=torch.float32):
    return torch.empty(*shape, dtype=dtype, device="meta")


@pytest.mark.parametrize("name", NVFUSER_MEMBERS)
def test_every_nvfuser_member_exists_and_prints(name):
    member = getattr(DataType, name)
    assert repr(member) == f"DataType.{name}"
    if name in TORCH:
        assert to_torch(member) == TORCH[name] and from_torch(TORCH[name]) is member


def test_float4_unpacked_has_no_torch_dtype():
    with pytest.raises(TypeError, match="packed two a byte"):
        to_torch(DataType.Float4_e2m1fn)


def test_new_dtypes_round_trip_through_the_printer():
    with FusionDefinition() as fd:
        a = fd.define_tensor(shape=[-1], contiguity=True, dtype=DataType.Float8_e5m2)
        b = fd.define_tensor(shape=[-1], contiguity=True, dtype=DataType.UInt64)
        fd.add_output(fd.ops.cast(a, DataType.Float8_e4m3fn))
        fd.add_output(fd.ops.cast(b, DataType.Float4_e2m1fn_x2))
    text = repr(fd)
    assert "dtype=DataType.Float8_e5m2" in text and "DataType.Float4_e2m1fn_x2" in text
    scope: dict = {}
    exec(text, {"DataType": DataType, "FusionDefinition": FusionDefinition}, scope)
    with FusionDefinition() as again:
        next(iter(scope.values()))(again)
    assert again.id() == fd.id()
    assert "__e4m3" in fd.fusion_ir() and "uint64_t" in fd.fusion_ir()


# ---- promotion ---------------------------------------------------------------------------


@pytest.mark.parametrize("dt", [d for d, _ in FLOAT8] + [DataType.Float4_e2m1fn_x2])
def test_storage_only_dtypes_refuse_arithmetic_but_move_and_cast(dt):
    with pytest.raises(TypeError, match="take part in no arithmetic"):
        promote(((2, dt), (2, DataType.Float)))
    with FusionDefinition() as fd:
        a = fd.define_tensor(shape=[-1], contiguity=True, dtype=dt)
        c = fd.define_tensor(shape=[-1], contiguity=True, dtype=DataType.Bool)
        with pytest.raises(TypeError, match=f"{dt!r} values take part in no arithmetic"):
            fd.ops.add(a, a)
        moved = fd.ops.where(c, a, a)
        assert moved.dtype is dt and fd.ops.set(a).dtype is dt
        assert fd.ops.cast(a, DataType.Float).dtype is DataType.Float


def test_uint64_promotes_as_torch_does():
    assert promote(((2, DataType.UInt64), (0, DataType.Int))) is DataType.UInt64
    assert promote(((2, DataType.UInt64), (2, DataType.Float))) is DataType.Float
    with pytest.raises(TypeError, match="no type promotion between torch.uint64 and torch.int64"):
        promote(((2, DataType.UInt64), (2, DataType.Int)))
    with FusionDefinition() as fd:
        a = fd.define_tensor(shape=[-1], contiguity=True, dtype=DataType.UInt64)
        with pytest.raises(TypeError, match="div does not take UInt64"):
            fd.ops.div(a, a)
        with pytest.raises(TypeError, match="out of range"):
            fd.define_scalar(-1, dtype=DataType.UInt64)


# ---- the reference's semantics -------------------------------------------------------------


def _u64(values):
    return torch.tensor([v - 2**64 if v >= 2**63 else v for v in values],
                        dtype=torch.int64).view(torch.uint64)  # fmt: skip


def _py(t):
    return [v % 2**64 for v in t.view(torch.int64).tolist()]


def test_uint64_reference_matches_integers_mod_2_64():
    gen = torch.Generator().manual_seed(7)
    xs = [int(v) for v in torch.randint(0, 2**62, (64,), generator=gen)] + [0, 1, 2**64 - 1, 2**63]
    ys = [int(v) for v in torch.randint(0, 2**62, (64,), generator=gen)] + [2**63 + 5, 3, 1, 2**63]
    xs = [x * 3 % 2**64 for x in xs]
    with FusionDefinition() as fd:
        a = fd.define_tensor(shape=[-1], contiguity=True, dtype=DataType.UInt64)
        b = fd.define_tensor(shape=[-1], contiguity=True, dtype=DataType.UInt64)
        k = fd.define_scalar(dtype=DataType.UInt64)
        fd.add_output(a * b + k)
        fd.add_output(a - b)
        fd.add_output(fd.ops.maximum(a, b))
        fd.add_output(a < b)
        fd.add_output(fd.ops.bitwise_right_shift(a, fd.ops.bitwise_and(b, 63)))
        fd.add_output(fd.ops.bitwise_left_shift(a, fd.ops.bitwise_and(b, 127)))
        fd.add_output(fd.ops.cast(a, DataType.Double))
    big = 2**64 - 3
    outs = fd.execute([_u64(xs), _u64(ys), big])
    assert _py(outs[0]) == [(x * y + big) % 2**64 for x, y in zip(xs, ys)]
    assert _py(outs[1]) == [(x - y) % 2**64 for x, y in zip(xs, ys)]
    assert _py(outs[2]) == [max(x, y) for x, y in zip(xs, ys)]
    assert outs[3].tolist() == [x < y for x, y in zip(xs, ys)]
    assert _py(outs[4]) == [x >> (y & 63) for x, y in zip(xs, ys)]
    assert _py(outs[5]) == [(x << (y & 127)) % 2**64 if y & 127 < 64 else 0 for x, y in zip(xs, ys)]
    assert outs[6].tolist() == [float(x) for x in xs]


@pytest.mark.parametrize("dt,td", FLOAT8, ids=lambda v: str(v))
def test_float8_casts_follow_torch_saturation_and_nan(dt, td):
    specials = [0.0, -0.0, 1.0, 447.0, 448.0, 449.0, 464.0, 480.0, 1e9, 57344.0, 61440.0, 65536.0,
                float("inf"), float("-inf"), float("nan"), -500.0, 2.0**-10, 3.0, 2.0**-130]
    x = torch.cat([torch.tensor(specials), torch.randn(4096) * 100])
    with FusionDefinition() as fd:
        a = fd.define_tensor(shape=[-1], contiguity=True, dtype=DataType.Float)
        b = fd.define_tensor(shape=[-1], contiguity=True, dtype=DataType.Double)
        c = fd.ops.cast(a, dt)
        fd.add_output(c)
        fd.add_output(fd.ops.cast(b, dt))
        fd.add_output(fd.ops.cast(c, DataType.BFloat16))
    outs = fd.execute([x, x.double()])
    assert torch.equal(outs[0].view(torch.uint8), x.to(td).view(torch.uint8))
    assert torch.equal(outs[1].view(torch.uint8), x.double().to(td).view(torch.uint8))
    torch.testing.assert_close(outs[2], x.to(td).to(torch.bfloat16), equal_nan=True)


@pytest.mark.parametrize("dt,td", COMPLEX, ids=lambda v: str(v))
def test_complex_reference_matches_torch(dt, td):
    gen = torch.Generator().manual_seed(3)
    x, y = (torch.randn(33, 70, dtype=td, generator=gen) for _ in range(2))
    r = torch.randn(33, 70, generator=gen, dtype=torch.float64 if td == torch.complex128 else None)
    with FusionDefinition() as fd:
        a, b = (fd.define_tensor(shape=[-1, -1], contiguity=True, dtype=dt) for _ in range(2))
        w = fd.define_tensor(shape=[-1, -1], contiguity=True, dtype=from_torch(r.dtype))
        fd.add_output(a * b + a / b - fd.ops.conj(a))
        fd.add_output(fd.ops.abs(a) + fd.ops.real(b) * fd.ops.imag(a))
        fd.add_output(fd.ops.where(w > 0, a, w))
        fd.add_output(fd.ops.sum(a * b, [1]))
    outs = fd.execute([x, y, r])
    torch.testing.assert_close(outs[0], x * y + x / y - x.conj())
    torch.testing.assert_close(outs[1], x.abs() + y.real * x.imag)
    torch.testing.assert_close(outs[2], torch.where(r > 0, x, r.to(td)))
    torch.testing.assert_close(outs[3], (x * y).sum(1))


# ---- kernels: compiled for h100 with NVRTC here, run against eager in tests/gpu -----------


@pytest.mark.parametrize("dt,td", COMPLEX, ids=lambda v: str(v))
def test_complex_kernels_compile(dt, td):
    with FusionDefinition() as fd:
        a, b = (fd.define_tensor(shape=[-1, -1], contiguity=True, dtype=dt) for _ in range(2))
        w = fd.define_tensor(shape=[-1, -1], contiguity=True, dtype=DataType.Float)
        fd.add_output(a * b + a / b - fd.ops.conj(a) + complex(1, 2))
        fd.add_output(fd.ops.abs(a) + fd.ops.real(b) * fd.ops.imag(a))
        fd.add_output(fd.ops.where(w > 0, a, w))
        fd.add_output(a == b)
        fd.add_output(fd.ops.cast(a, DataType.Bool))
    refs = fd.precompile([meta(64, 128, dtype=td)] * 2 + [meta(64, 128)], target="h100")
    assert "fc_complex_nonzero" in refs[0].source
    assert len(refs) == 1 and "fc_complex" in refs[0].source
    for dim in (0, 1):
        with FusionDefinition() as fd:
            a = fd.define_tensor(shape=[-1, -1], contiguity=True, dtype=dt)
            s = fd.ops.sum(a * a, [dim])
            fd.add_output(s)
            fd.add_output(fd.ops.abs(s))
        refs = fd.precompile([meta(4096, 512, dtype=td)], target="h100")
        assert executor_for(fd).scheduler == "reduction" and refs


def test_complex_ops_without_a_kernel_say_why():
    with FusionDefinition() as fd:
        a = fd.define_tensor(shape=[-1], contiguity=True, dtype=DataType.ComplexFloat)
        fd.add_output(fd.ops.asin(a))  # complex math beyond Note [Complex math]
    with pytest.raises(FusionUnsupportedError, match="asin .* of complex values has no kernel"):
        fd.precompile([meta(64, dtype=torch.complex64)], target="h100")


@pytest.mark.parametrize("dt,td", FLOAT8, ids=lambda v: str(v))
def test_float8_kernels_compile(dt, td):
    with FusionDefinition() as fd:
        a = fd.define_tensor(shape=[-1, -1], contiguity=True, dtype=DataType.Float)
        b = fd.define_tensor(shape=[-1, -1], contiguity=True, dtype=dt)
        fd.add_output(fd.ops.cast(a, dt))
        fd.add_output(fd.ops.cast(b, DataType.BFloat16))
        fd.add_output(fd.ops.sum(fd.ops.cast(b, DataType.Float), [1]))
    refs = fd.precompile([meta(64, 128), meta(64, 128, dtype=td)], target="h100")
    assert refs and all("fc_to_float" in r.source for r in refs)


def test_uint64_kernel_compiles():
    with FusionDefinition() as fd:
        a, b = (fd.define_tensor(shape=[-1], contiguity=True, dtype=DataType.UInt64) for _ in range(2))
        s = fd.define_scalar(dtype=DataType.UInt64)
        fd.add_output(a * b + s)
        fd.add_output(fd.ops.maximum(a, b))
        fd.add_output(fd.ops.logical_right_shift(a, b))
    refs = fd.precompile([meta(64, dtype=torch.uint64)] * 2 + [2**64 - 1], target="h100")
    assert len(refs) == 1 and "unsigned long long" in refs[0].source


def test_packed_float4_has_no_kernel_and_says_why():
    with FusionDefinition() as fd:
        a = fd.define_tensor(shape=[-1, -1], contiguity=True, dtype=DataType.Float4_e2m1fn_x2)
        fd.add_output(fd.ops.permute(a, [1, 0]))
    with pytest.raises(FusionUnsupportedError, match="packs two e2m1 values a byte"):
        fd.precompile([meta(8, 16, dtype=torch.float4_e2m1fn_x2)], target="h100")
