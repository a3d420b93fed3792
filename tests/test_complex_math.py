"""Complex math kernels (Note [Complex math] in codegen/prelude/complex.cuh): each op compiles
for h100 to one pointwise kernel for complex64 and complex128, and the kernel run on the host
by g++ (tests/host_kernels.py) matches torch on random values from tiny to near-overflow
magnitudes, real arguments and the scaled ranges past exp's overflow."""
import math

import pytest
import torch
from host_kernels import HAVE_GXX, run_plan_on_host

from codegen.cuda_ops import COMPLEX_MATH
from fusion_cache import FusionDefinition
from fusion_cache.frontend.dtypes import from_torch
from fusion_cache.runtime.executor import executor_for

COMPLEX = [torch.complex64, torch.complex128]
needs_gxx = pytest.mark.skipif(not HAVE_GXX, reason="no g++ to run kernels on the host")


def define(op: str, td: torch.dtype) -> FusionDefinition:
    with FusionDefinition() as fd:
        a = fd.define_tensor(shape=[-1], contiguity=True, dtype=from_torch(td))
        fd.add_output(getattr(fd.ops, op)(a))
    return fd


def spread(td: torch.dtype, n: int, re_exp: tuple, im_exp: tuple, seed: int) -> torch.Tensor:
    """n values whose parts are randn scaled by 10**U(lo, hi) of each range, signs random."""
    gen = torch.Generator().manual_seed(seed)
    real = torch.float64

    def part(lo, hi):
        scale = 10 ** (torch.rand(n, generator=gen, dtype=real) * (hi - lo) + lo)
        return torch.randn(n, generator=gen, dtype=real) * scale

    return torch.complex(part(*re_exp), part(*im_exp)).to(td)


def inputs(op: str, td: torch.dtype, seed: int) -> torch.Tensor:
    """Random values in each op's range of finite results, plus its special points."""
    wide = 36 if td == torch.complex64 else 300  # decimal exponent range of the part type
    emax = 88.7 if td == torch.complex64 else 709.7
    if op in ("log", "sqrt"):
        x = spread(td, 1003, (-wide, wide), (-wide, wide), seed)
        gen = torch.Generator().manual_seed(seed + 1)
        near_one = torch.polar(1 + torch.randn(200, generator=gen, dtype=torch.float64) * 1e-3,
                               torch.rand(200, generator=gen, dtype=torch.float64) * 6.28 - 3.14
                               ).to(td)  # fmt: skip
        special = [0j, complex(-0.0, 0), complex(-4, 0), complex(-4, -0.0), 1e-30 + 1e-30j,
                   3e37 - 3e37j, complex(-2e36, 1e36), complex(0, math.inf), 3e38 + 3e38j,
                   complex(-3e38, 1e38)]  # fmt: skip
    elif op in ("tan", "tanh"):
        x = spread(td, 1003, (-6, 1.5), (-6, 1.5), seed)
        near_one = torch.empty(0, dtype=td)
        special = [3 + 0j, complex(25, 1), complex(-30, -2), complex(1, 25), complex(0.5, -30)]
    else:  # exp-like: parts whose exponentials stay finite, and the scaled range past emax
        x = spread(td, 1003, (-6, 1.85 if td == torch.complex64 else 2.8), (-6, 2), seed)
        near_one = torch.empty(0, dtype=td)
        special = [0j, 2 + 0j, complex(-3, -0.0), complex(emax + 0.5, 2.0),
                   complex(-(emax + 0.5), 0.7), complex(0.7, emax + 0.5), complex(1e-30, -1e-30)]
    x = torch.cat([x, near_one, torch.tensor(special, dtype=td)])
    # sigmoid past exp's overflow is torch's 1 / (1 + inf + i*inf) = nan in complex64 too
    return x[x.real.abs() < 80] if op == "sigmoid" else x


def assert_near(got: torch.Tensor, want: torch.Tensor, td: torch.dtype) -> None:
    """|got - want| within a few ulp of |want| (a complex-magnitude bound: a part much smaller
    than the other carries the other's rounding), infinities and nans where torch has them."""
    rtol = 1e-5 if td == torch.complex64 else 1e-12
    finite = torch.isfinite(want)
    assert torch.equal(torch.isfinite(got), finite), got[torch.isfinite(got) != finite]
    err = (got[finite] - want[finite]).abs()
    bound = rtol * want[finite].abs() + 1e-35
    bad = (err > bound).nonzero().flatten()
    assert not len(bad), [(complex(got[finite][i]), complex(want[finite][i])) for i in bad[:8]]


@pytest.mark.parametrize("td", COMPLEX, ids=str)
@pytest.mark.parametrize("op", sorted(COMPLEX_MATH))
def test_complex_math_is_one_pointwise_kernel(op, td, monkeypatch):
    monkeypatch.setenv("FUSION_CACHE_DISABLE_FALLBACK", "1")
    fd = define(op, td)
    refs = fd.precompile([torch.empty(1023, dtype=td, device="meta")], target="h100")
    assert executor_for(fd).scheduler == "pointwise" and len(refs) == 1
    assert f"{COMPLEX_MATH[op]}(" in refs[0].source


@needs_gxx
@pytest.mark.parametrize("td", COMPLEX, ids=str)
@pytest.mark.parametrize("op", sorted(COMPLEX_MATH))
def test_complex_math_matches_torch_on_the_host(op, td, monkeypatch):
    monkeypatch.setenv("FUSION_CACHE_DISABLE_FALLBACK", "1")
    x = inputs(op, td, seed=sum(map(ord, op)))
    (got,) = run_plan_on_host(define(op, td), [x])
    # torch on the CPU in double precision, rounded: the exact answer for complex64 cases
    want = getattr(torch, op)(x.to(torch.complex128)).to(td)
    assert_near(got, want, td)
    if op in ("exp", "sinh", "tanh", "sqrt", "log"):  # a real argument keeps its zero's sign
        real = torch.tensor([complex(2, 0.0), complex(2, -0.0)], dtype=td)
        (got,) = run_plan_on_host(define(op, td), [real])
        assert torch.equal(torch.signbit(got.imag), torch.tensor([False, True]))
