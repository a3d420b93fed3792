"""Numerics of the inner kernel's shortcuts on the GPU: divisions by a row's value through its
reciprocal (Note [Row divisors]), the two-pass Welford of rows kept in registers (Note
[Two-pass Welford]) and the vector-at-a-time Welford of rows read from memory."""
import pytest
import torch

from fusion_cache import DataType, FusionDefinition
from fusion_cache.runtime.executor import executor_for

pytestmark = pytest.mark.gpu


@pytest.fixture
def gen():
    return torch.Generator(device="cuda").manual_seed(11)


def _row_division(dt):
    """y = x / d[:, None] and the row sums of x: an element-level division by a row value."""
    with FusionDefinition() as fd:
        x = fd.define_tensor(shape=[-1, -1], contiguity=[True, True], dtype=dt)
        d = fd.define_tensor(shape=[-1], contiguity=[True], dtype=dt)
        fd.add_output(fd.ops.div(x, fd.ops.broadcast_in_dim(d, [x.size(0), x.size(1)], [0])))
        fd.add_output(fd.ops.sum(x, dims=[1]))
    return fd


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
@pytest.mark.parametrize("n", [7, 1000, 4097])
def test_division_by_row_values_matches_ieee_division(dtype, n, gen):
    fd = _row_division(DataType.Float if dtype == torch.float32 else DataType.Double)
    info = torch.finfo(dtype)
    specials = [0.0, -0.0, float("inf"), float("-inf"), float("nan"), info.max, -info.max / 3,
                info.tiny / 8, -info.tiny / 1000, info.tiny, 1.0, -3.5, 1e-30, 7e30]  # fmt: skip
    rows = len(specials) + 5
    d = torch.cat([torch.tensor(specials, dtype=dtype, device="cuda"),
                   torch.randn(5, generator=gen, device="cuda").to(dtype)])  # fmt: skip
    x = torch.randn(rows, n, generator=gen, device="cuda").to(dtype)
    x[:, :3] = torch.tensor([0.0, float("inf"), info.tiny / 4], dtype=dtype)  # special numerators
    x[-1] *= 1e-36 if dtype == torch.float32 else 1e-300  # tiny quotients near underflow
    y, s = fd.execute([x, d])
    want = x / d[:, None]
    assert torch.equal(torch.isnan(y), torch.isnan(want))
    assert torch.equal(torch.isinf(y), torch.isinf(want))
    finite = torch.isfinite(want)
    # within 1.5 ulp, and subnormal quotients within their absolute spacing
    torch.testing.assert_close(y[finite], want[finite], rtol=2 * info.eps, atol=4 * info.smallest_normal * info.eps)
    assert torch.equal(torch.signbit(y[want == 0]), torch.signbit(want[want == 0]))
    torch.testing.assert_close(s, x.sum(1), rtol=1e-5, atol=1e-5 * n)


def _var_mean(dt, dims):
    with FusionDefinition() as fd:
        x = fd.define_tensor(shape=[-1, -1, -1], contiguity=[True, True, True], dtype=dt)
        v, m = fd.ops.var_mean(x, dims=dims, correction=1)
        fd.add_output(v)
        fd.add_output(m)
    return fd


@pytest.mark.parametrize("n", [1000, 16384, 65537, 262144])  # registers; memory, odd; memory
def test_var_mean_of_rows_far_from_zero(n, gen):
    # var 1 around a mean of 3000: a one-pass sum of squares would lose every digit
    fd = _var_mean(DataType.Float, [2])
    x = 3000.0 + torch.randn(3, 5, n, generator=gen, device="cuda")
    var, mean = fd.execute([x])
    want_var, want_mean = torch.var_mean(x.double(), [2], correction=1)
    torch.testing.assert_close(mean, want_mean.float(), rtol=1e-6, atol=0)
    torch.testing.assert_close(var, want_var.float(), rtol=2e-4, atol=0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_var_mean_over_a_strided_dim_kept_in_registers(dtype, gen):
    # reducing the middle dim of [5, 300, 7]: the kept dims do not collapse, so the inner
    # kernel reads the row with stride 7 into its registers
    dt = DataType.Float if dtype == torch.float32 else DataType.BFloat16
    fd = _var_mean(dt, [1])
    x = (2.0 + torch.randn(5, 300, 7, generator=gen, device="cuda")).to(dtype)
    var, mean = fd.execute([x])
    assert executor_for(fd).scheduler == "reduction"
    want_var, want_mean = torch.var_mean(x.double(), [1], correction=1)
    tol = 1e-5 if dtype == torch.float32 else 1e-2
    torch.testing.assert_close(mean.double(), want_mean, rtol=tol, atol=tol)
    torch.testing.assert_close(var.double(), want_var, rtol=tol, atol=tol)
