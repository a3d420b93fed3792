"""Random numbers drawn in kernels against the CPU reference (Note [Philox numbers]): the
same numbers for a seed and offset on any launch shape, fresh ones each execute from
torch's CUDA generator, distributions on 10^6 samples, and dropout fused into a layer norm
kernel forward and backward against eager."""
import math

import pytest
import torch
import torch.nn.functional as F
from aten_patterns import dropout_residual_layer_norm, dropout_residual_layer_norm_backward
from test_random import SAMPLES, ks_statistic, normal_cdf, seeded

from fusion_cache import DataType, FusionCache, FusionDefinition
from fusion_cache.ir.interpret.random import philox_values

pytestmark = pytest.mark.gpu
SHAPES = [[1000], [3, 1001], [64, 4096], [7, 13, 129]]


def launches():
    return FusionCache.get().stats()["kernel_launches"]


@pytest.mark.parametrize("dtype", [DataType.Float, DataType.BFloat16, DataType.Half,
                                   DataType.Double], ids=str)  # fmt: skip
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_uniform_kernel_equals_the_reference_bit_for_bit(dtype, shape):
    fd = seeded("uniform", shape, dtype, -1.5, 2.5)
    dummy = torch.zeros(1, device="cuda")  # a CUDA input puts the fusion on the GPU
    with FusionDefinition() as on_gpu:
        s, o = on_gpu.define_scalar(dtype=DataType.Int), on_gpu.define_scalar(dtype=DataType.Int)
        on_gpu.define_tensor(shape=[-1], contiguity=True)
        on_gpu.add_output(on_gpu.ops.uniform(-1.5, 2.5, shape, rng_seed=s, rng_offset=o,
                                             dtype=dtype))  # fmt: skip
    before = launches()
    (got,) = on_gpu.execute([2**62 + 12345, 77, dummy])
    assert launches() == before + 1 and got.is_cuda
    (want,) = fd.execute([2**62 + 12345, 77], device="cpu")  # the reference's numbers
    assert torch.equal(got.cpu(), want)


@pytest.mark.parametrize("dtype", [DataType.Float, DataType.BFloat16, DataType.Double], ids=str)
def test_normal_kernel_matches_the_reference(dtype):
    with FusionDefinition() as fd:
        s, o = fd.define_scalar(dtype=DataType.Int), fd.define_scalar(dtype=DataType.Int)
        x = fd.define_tensor(shape=[-1, -1], contiguity=True, dtype=dtype)
        fd.add_output(fd.ops.add(x, fd.ops.normal(0.5, 2.0, fd.ops.shape(x), rng_seed=s,
                                                  rng_offset=o, dtype=dtype)))  # fmt: skip
    x = torch.zeros(300, 1000, dtype=from_torch_dtype(dtype), device="cuda")
    (got,) = fd.execute([9, 1, x])
    (want,) = fd.execute([9, 1, x.cpu()])
    tol = {DataType.Float: 2e-6, DataType.Double: 1e-13, DataType.BFloat16: 8e-3}[dtype]
    torch.testing.assert_close(got.cpu(), want, rtol=tol, atol=tol)


@pytest.mark.parametrize("op,lo,hi", [("uniform", 0.0, 1.0), ("uniform", -1.5, 2.5),
                                      ("normal", 0.5, 2.0)])  # fmt: skip
@pytest.mark.parametrize("dtype", [DataType.Float, DataType.Double], ids=str)
def test_row_kernel_stores_the_numbers_it_draws(op, lo, hi, dtype):
    """A row kernel drawing by lane (rows of a multiple of 4; Note [Philox lanes]) stores the
    numbers it sums from the pass that draws them (Note [Stores in the first pass]): the
    reference's, bit for bit for uniforms; rows of 1002 compare groups."""
    with FusionDefinition() as fd:
        s, o = fd.define_scalar(dtype=DataType.Int), fd.define_scalar(dtype=DataType.Int)
        x = fd.define_tensor(shape=[-1, -1], contiguity=True, dtype=dtype)
        r = getattr(fd.ops, op)(lo, hi, fd.ops.shape(x), rng_seed=s, rng_offset=o, dtype=dtype)
        fd.add_output(r)
        fd.add_output(fd.ops.sum(fd.ops.mul(x, r), [1]))
    for shape in ((64, 4096), (33, 1002)):
        x = torch.randn(*shape, dtype=from_torch_dtype(dtype), device="cuda")
        before = launches()
        got, got_sum = fd.execute([2**40 + 7, 5, x])
        assert launches() == before + 1
        want, want_sum = fd.execute([2**40 + 7, 5, x.cpu()])
        if op == "uniform":
            assert torch.equal(got.cpu(), want)
        else:
            tol = 2e-6 if dtype is DataType.Float else 1e-13
            torch.testing.assert_close(got.cpu(), want, rtol=tol, atol=tol)
        torch.testing.assert_close(got_sum.cpu(), want_sum, rtol=1e-4, atol=1e-3)


def from_torch_dtype(dtype):
    return {DataType.Float: torch.float32, DataType.Double: torch.float64,
            DataType.BFloat16: torch.bfloat16, DataType.Half: torch.float16}[dtype]  # fmt: skip


def test_numbers_do_not_depend_on_the_launch_shape():
    """The same elements with other vector widths and grids: a misaligned view makes the
    kernel load element by element, a longer tensor takes more blocks."""
    with FusionDefinition() as fd:
        s, o = fd.define_scalar(dtype=DataType.Int), fd.define_scalar(dtype=DataType.Int)
        x = fd.define_tensor(shape=[-1], contiguity=True)
        fd.add_output(fd.ops.add(x, fd.ops.uniform(0.0, 1.0, fd.ops.shape(x), rng_seed=s,
                                                   rng_offset=o)))  # fmt: skip
    base = torch.zeros(2**22 + 1, device="cuda")
    (long,) = fd.execute([5, 6, base[: 2**22]])
    (odd,) = fd.execute([5, 6, base[1 : 100001]])  # noqa: E203 - misaligned by one element
    (short,) = fd.execute([5, 6, base[:1000]])
    assert torch.equal(long[:100000], odd) and torch.equal(long[:1000], short)


def test_without_a_seed_each_execute_moves_torch_generator_on():
    with FusionDefinition() as fd:
        x = fd.define_tensor(shape=[-1, -1], contiguity=True)
        fd.add_output(fd.ops.rand_like(x))
        fd.add_output(fd.ops.randn_like(x))
    x = torch.zeros(128, 1000, device="cuda")
    gen = torch.cuda.default_generators[x.device.index]
    torch.manual_seed(3)
    start = gen.get_offset()
    u1, n1 = fd.execute([x])
    assert gen.get_offset() == start + 4  # two ops: one step of 4
    u2, n2 = fd.execute([x])
    torch.manual_seed(3)
    u3, n3 = fd.execute([x])
    assert torch.equal(u1, u3) and torch.equal(n1, n3)
    assert (u1 != u2).float().mean() > 0.99 and (n1 != n2).float().mean() > 0.99
    # the run's numbers are the reference's for the generator's seed and offset
    want = philox_values("uniform", x.numel(), gen.initial_seed(), start, False, "cpu")
    assert torch.equal(u1.cpu().flatten(), want)


@pytest.mark.parametrize("dtype", [DataType.Float, DataType.BFloat16], ids=str)
@pytest.mark.parametrize("dist", ["uniform", "normal"])
def test_distributions_of_a_million_samples_on_the_gpu(dist, dtype):
    a, b = (-3.0, 5.0) if dist == "uniform" else (2.0, 0.5)
    with FusionDefinition() as fd:
        x = fd.define_tensor(shape=[-1], contiguity=True, dtype=dtype)
        fd.add_output(getattr(fd.ops, dist)(a, b, fd.ops.shape(x), dtype=dtype))
    (x,) = fd.execute([torch.zeros(SAMPLES, dtype=from_torch_dtype(dtype), device="cuda")])
    x = x.cpu()
    if dist == "uniform":
        mean, var = (a + b) / 2, (b - a) ** 2 / 12
        cdf = lambda v: ((v - a) / (b - a)).clamp(0, 1)  # noqa: E731
    else:
        mean, var = a, b**2
        cdf = lambda v: normal_cdf((v - a) / b)  # noqa: E731
    xd = x.double()
    assert abs(xd.mean().item() - mean) < 5 * math.sqrt(var / SAMPLES)
    assert abs(xd.var().item() - var) < 5 * var * math.sqrt(2 / SAMPLES) + (b - a) ** 2 / 2**18
    assert ks_statistic(x, cdf) < 1.95 / math.sqrt(SAMPLES)


@pytest.mark.parametrize("n,c", [(4096, 1024), (1024, 4096), (300, 5000), (64, 1002)])
def test_dropout_residual_layer_norm_forward_and_backward(n, c):
    """Rows of multiples of 4 and of 1002 (vectors of 2)."""
    p = 0.1
    fwd, bwd = dropout_residual_layer_norm(p), dropout_residual_layer_norm_backward(p)
    gen = torch.Generator(device="cuda").manual_seed(4)
    x, h, dy = (torch.randn(n, c, device="cuda", generator=gen).bfloat16() for _ in range(3))
    w, b = (torch.randn(c, device="cuda", generator=gen).bfloat16() for _ in range(2))
    cuda_gen = torch.cuda.default_generators[x.device.index]
    seed, offset = cuda_gen.initial_seed(), cuda_gen.get_offset()
    before = launches()
    y, keep, mean, invstd = fwd.execute([x, h, w, b])
    assert launches() == before + 1  # dropout, residual and layer norm: one kernel
    # the mask is the reference's numbers for the run's seed and offset
    u = philox_values("uniform", n * c, seed, offset, False, "cpu").reshape(n, c)
    assert torch.equal(keep.cpu(), u < 1 - p)
    assert abs(keep.float().mean().item() - (1 - p)) < 0.01
    r = (x.float() + torch.where(keep, h.float(), 0.0) / (1 - p)).requires_grad_()
    wf, bf = w.float().requires_grad_(), b.float().requires_grad_()
    want = F.layer_norm(r, (c,), wf, bf, 1e-5)
    torch.testing.assert_close(y, want.bfloat16(), rtol=2e-2, atol=2e-2)
    torch.testing.assert_close(mean.squeeze(1), r.detach().mean(1), rtol=1e-4, atol=1e-4)
    want.backward(dy.float())
    before = launches()
    dr, dh, dw, db = bwd.execute([dy, x, h, keep, mean, invstd, w])
    assert launches() - before in (1, 2)  # a row kernel, and a finish where it needs one
    torch.testing.assert_close(dr, r.grad.bfloat16(), rtol=2e-2, atol=2e-2)
    torch.testing.assert_close(dh, (torch.where(keep, r.grad, 0.0) / (1 - p)).bfloat16(),
                               rtol=2e-2, atol=2e-2)  # fmt: skip
    torch.testing.assert_close(dw.float(), wf.grad, rtol=2e-2, atol=2e-1)
    torch.testing.assert_close(db.float(), bf.grad, rtol=2e-2, atol=2e-1)
