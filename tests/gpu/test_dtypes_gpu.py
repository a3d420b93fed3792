"""Kernels of complex, float8 and UInt64 values on the GPU against torch eager (float8 casts
bit for bit, over a sweep of float bit patterns and every float8 byte)."""
import pytest
import torch

from fusion_cache import DataType, FusionCache, FusionDefinition
from fusion_cache.frontend.dtypes import from_torch

pytestmark = pytest.mark.gpu

FLOAT8 = [torch.float8_e4m3fn, torch.float8_e5m2, torch.float8_e8m0fnu]
COMPLEX = [torch.complex64, torch.complex128]


def launches():
    return FusionCache.get().stats()["kernel_launches"]


def _float_sweep() -> torch.Tensor:
    """About two million float bit patterns spread over the whole range, both signs, with
    the neighbourhoods of every float8 rounding boundary densely covered by the stride."""
    bits = torch.arange(0, 2**32, 2039, dtype=torch.int64, device="cuda")
    bits = torch.where(bits >= 2**31, bits - 2**32, bits).to(torch.int32)
    return bits.view(torch.float32)


@pytest.mark.parametrize("td", FLOAT8, ids=str)
@pytest.mark.parametrize("src", [torch.float32, torch.float64, torch.bfloat16, torch.float16])
def test_float8_cast_bits_match_torch(td, src):
    x = _float_sweep().to(src)
    with FusionDefinition() as fd:
        a = fd.define_tensor(shape=[-1], contiguity=True, dtype=from_torch(src))
        fd.add_output(fd.ops.cast(a, from_torch(td)))
    before = launches()
    (out,) = fd.execute([x])
    assert launches() == before + 1
    ours, theirs = out.view(torch.uint8), x.to(td).view(torch.uint8)
    bad = (ours != theirs).nonzero().flatten()
    detail = [(float(x[i]), hex(int(x.view(torch.int32)[i]) & 0xFFFFFFFF) if src == torch.float32
               else None, int(ours[i]), int(theirs[i])) for i in bad[:12].tolist()]  # fmt: skip
    assert not len(bad), f"{len(bad)} of {len(x)} differ (value, bits, ours, torch): {detail}"


@pytest.mark.parametrize("td", FLOAT8, ids=str)
@pytest.mark.parametrize("dst", [torch.float32, torch.float64, torch.bfloat16, torch.int32])
def test_float8_every_byte_widens_as_torch(td, dst):
    x = torch.arange(256, dtype=torch.uint8, device="cuda").view(td)
    if dst == torch.int32:
        x = x[~x.float().isnan() & (x.float().abs() < 2**30)]
    with FusionDefinition() as fd:
        a = fd.define_tensor(shape=[-1], contiguity=True, dtype=from_torch(td))
        fd.add_output(fd.ops.cast(a, from_torch(dst)))
        fd.add_output(fd.ops.cast(fd.ops.mul(fd.ops.cast(a, DataType.Float), 0.5), from_torch(td)))
    out, halved = fd.execute([x])
    torch.testing.assert_close(out, x.to(dst), equal_nan=True, rtol=0, atol=0)
    assert torch.equal(halved.view(torch.uint8), (x.float() * 0.5).to(td).view(torch.uint8))


@pytest.mark.parametrize("td", COMPLEX, ids=str)
def test_complex_pointwise_against_eager(td):
    gen = torch.Generator(device="cuda").manual_seed(11)
    x, y = (torch.randn(517, 1031, dtype=td, device="cuda", generator=gen) for _ in range(2))
    real = torch.float64 if td == torch.complex128 else torch.float32
    w = torch.randn(517, 1031, dtype=real, device="cuda", generator=gen)
    with FusionDefinition() as fd:
        a, b = (fd.define_tensor(shape=[-1, -1], contiguity=True, dtype=from_torch(td))
                for _ in range(2))  # fmt: skip
        r = fd.define_tensor(shape=[-1, -1], contiguity=True, dtype=from_torch(real))
        fd.add_output(a * b + a / b - fd.ops.conj(a) + complex(0.5, -2))
        fd.add_output(fd.ops.abs(a) + fd.ops.real(b) * fd.ops.imag(a))
        fd.add_output(fd.ops.where(r > 0, a, r))
        fd.add_output(fd.ops.eq(a, fd.ops.where(r > 0, a, b)))
        fd.add_output(fd.ops.cast(a, DataType.ComplexDouble if td == torch.complex64
                                  else DataType.ComplexFloat))  # fmt: skip
        fd.add_output(fd.ops.cast(fd.ops.mul(a, fd.ops.gt(r, 0.5)), DataType.Bool))
    before = launches()
    outs = fd.execute([x, y, w])
    assert launches() == before + 1
    tol = dict(rtol=1e-5, atol=1e-5) if td == torch.complex64 else dict(rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(outs[0], x * y + x / y - x.conj() + complex(0.5, -2), **tol)
    torch.testing.assert_close(outs[1], x.abs() + y.real * x.imag, **tol)
    torch.testing.assert_close(outs[2], torch.where(w > 0, x, w.to(td)), rtol=0, atol=0)
    assert torch.equal(outs[3], x == torch.where(w > 0, x, y))
    torch.testing.assert_close(outs[4], x.to(outs[4].dtype), rtol=0, atol=0)
    assert torch.equal(outs[5], (x * (w > 0.5)).to(torch.bool))


COMPLEX_MATH = ["exp", "log", "sqrt", "sin", "cos", "tan", "sinh", "cosh", "tanh", "sigmoid"]


@pytest.mark.parametrize("td", COMPLEX, ids=str)
@pytest.mark.parametrize("op", COMPLEX_MATH)
def test_complex_math_against_eager(op, td):
    """Note [Complex math]: one kernel per op, as close to eager as a few ulp of the result's
    magnitude, on parts from 1e-4 to ~1e2 (1e-30 to 1e30 for log and sqrt), real arguments and
    exp's scaled range."""
    gen = torch.Generator(device="cuda").manual_seed(13)
    lo, hi = (-30, 30) if op in ("log", "sqrt") else (-4, 1.2)

    def part(n):
        scale = 10 ** (torch.rand(n, device="cuda", generator=gen, dtype=torch.float64)
                       * (hi - lo) + lo)  # fmt: skip
        return torch.randn(n, device="cuda", generator=gen, dtype=torch.float64) * scale

    emax = 88.7 if td == torch.complex64 else 709.7
    special = [0j, 2 + 0j, complex(-3, -0.0), complex(0.5, 1e-30)]
    if op in ("exp", "sinh", "cosh", "sin", "cos"):
        z = complex(emax + 0.5, 2.0)
        special += [z.conjugate() * 1j if op in ("sin", "cos") else z]  # sin, cos: y past emax
    x = torch.cat([torch.complex(part(40009), part(40009)).to(td),
                   torch.tensor(special, dtype=td, device="cuda")])
    with FusionDefinition() as fd:
        a = fd.define_tensor(shape=[-1], contiguity=True, dtype=from_torch(td))
        fd.add_output(getattr(fd.ops, op)(a))
    before = launches()
    (out,) = fd.execute([x])
    assert launches() == before + 1
    want = getattr(torch, op)(x)
    assert torch.equal(torch.isfinite(out), torch.isfinite(want))
    ok = torch.isfinite(want)
    rtol = 2e-5 if td == torch.complex64 else 1e-12
    err = (out[ok] - want[ok]).abs()
    bad = (err > rtol * (want[ok].abs() + 1)).nonzero().flatten()
    assert not len(bad), [(complex(x[ok][i]), complex(out[ok][i]), complex(want[ok][i]))
                          for i in bad[:6].tolist()]  # fmt: skip


@pytest.mark.parametrize("td", COMPLEX, ids=str)
@pytest.mark.parametrize("shape,dim", [((512, 1000), 1), ((512, 1000), 0), ((64, 100000), 1),
                                       ((100000, 16), 0), ((8192, 4096), 0)])  # fmt: skip
def test_complex_sums_against_eager(td, shape, dim):
    gen = torch.Generator(device="cuda").manual_seed(5)
    x = torch.randn(*shape, dtype=td, device="cuda", generator=gen)
    with FusionDefinition() as fd:
        a = fd.define_tensor(shape=[-1, -1], contiguity=True, dtype=from_torch(td))
        s = fd.ops.sum(a * a, [dim])
        fd.add_output(s)
        fd.add_output(fd.ops.abs(s))
    s, mag = fd.execute([x])
    ref = (x * x).sum(dim)
    tol = dict(rtol=1e-4, atol=1e-3) if td == torch.complex64 else dict(rtol=1e-10, atol=1e-9)
    torch.testing.assert_close(s, ref, **tol)
    torch.testing.assert_close(mag, ref.abs(), **tol)


def test_uint64_kernel_matches_the_reference_exactly():
    gen = torch.Generator(device="cuda").manual_seed(9)
    x = torch.randint(-(2**63), 2**63 - 1, (100003,), device="cuda", generator=gen).view(torch.uint64)
    y = torch.randint(-(2**63), 2**63 - 1, (100003,), device="cuda", generator=gen).view(torch.uint64)
    with FusionDefinition() as fd:
        a, b = (fd.define_tensor(shape=[-1], contiguity=True, dtype=DataType.UInt64) for _ in range(2))
        k = fd.define_scalar(dtype=DataType.UInt64)
        fd.add_output(a * b + k)
        fd.add_output(fd.ops.maximum(a, b))
        fd.add_output(a < b)
        fd.add_output(fd.ops.bitwise_right_shift(a, fd.ops.bitwise_and(b, 127)))
        fd.add_output(fd.ops.cast(a, DataType.Float))
    before = launches()
    outs = fd.execute([x, y, 2**64 - 3])
    assert launches() == before + 1
    refs = fd.execute([x.cpu(), y.cpu(), 2**64 - 3])  # the reference (Note [UInt64 semantics])
    for got, ref in zip(outs, refs):
        assert torch.equal(got.cpu(), ref)
