"""The frontends on CUDA: TorchScript lowering and the torch.compile backend against eager."""
from __future__ import annotations

import copy
import sys
import warnings
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from fusion_cache import FusionCache

# the model examples/train_with_backend.py trains, so what the example reports is what is tested
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))
from train_with_backend import Block  # noqa: E402

from fusion_cache.frontends import dynamo_backend, from_torchscript, register_backend

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.filterwarnings("ignore:`torch.jit.script` is deprecated"),
]


def seed_001(x: torch.Tensor, rm1: torch.Tensor, rv1: torch.Tensor, w1: torch.Tensor,
             b1: torch.Tensor, rm2: torch.Tensor, rv2: torch.Tensor, w2: torch.Tensor,
             b2: torch.Tensor):  # fmt: skip
    a = F.batch_norm(x, rm1, rv1, w1, b1, False, 0.1, 1e-5)
    b = F.batch_norm(x, rm2, rv2, w2, b2, False, 0.1, 1e-5)
    return torch.relu(torch.add(a, b, alpha=1))


def _seed_inputs(dtype: torch.dtype) -> list[torch.Tensor]:
    c = 32
    params = []
    for _ in range(2):
        params += [torch.randn(c, device="cuda", dtype=dtype),
                   torch.rand(c, device="cuda", dtype=dtype) + 0.5,
                   torch.randn(c, device="cuda", dtype=dtype),
                   torch.randn(c, device="cuda", dtype=dtype)]  # fmt: skip
    return [torch.randn(8, c, 17, 33, device="cuda", dtype=dtype), *params]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_seed_001_runs_as_a_kernel(dtype):
    """Pointwise with broadcasts: the pointwise scheduler takes it (fallback stays off)."""
    scripted = torch.jit.script(seed_001)
    fd = from_torchscript(scripted.graph, _seed_inputs(dtype))
    inputs = _seed_inputs(dtype)
    before = FusionCache.get().stats().get("kernel_launches", 0)
    out = fd.execute(inputs)[0]
    assert FusionCache.get().stats().get("kernel_launches", 0) > before
    tol = 1e-5 if dtype == torch.float32 else 1e-12
    torch.testing.assert_close(out, scripted(*inputs), rtol=tol, atol=tol)


def softmax_layer_norm(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor):
    return F.layer_norm(torch.softmax(x, dim=-1), [x.size(-1)], w, b, 1e-5)


def test_torchscript_reductions_on_cuda(monkeypatch):
    monkeypatch.delenv("FUSION_CACHE_DISABLE_FALLBACK", raising=False)  # kernels may lag
    scripted = torch.jit.script(softmax_layer_norm)
    make = lambda: [torch.randn(64, 100, device="cuda"), torch.randn(100, device="cuda"),
                    torch.randn(100, device="cuda")]  # fmt: skip
    fd = from_torchscript(scripted.graph, make())
    inputs = make()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out = fd.execute(inputs)[0]
    torch.testing.assert_close(out, scripted(*inputs), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_backend_training_matches_eager_on_cuda(dtype, monkeypatch):
    import torch._dynamo

    monkeypatch.delenv("FUSION_CACHE_DISABLE_FALLBACK", raising=False)  # kernels may lag
    register_backend()
    torch._dynamo.reset()
    dynamo_backend.reset_reports()
    torch.manual_seed(0)
    eager = Block(64, 256).to("cuda", dtype).eval()
    mine = copy.deepcopy(eager)
    compiled = torch.compile(mine, backend="fusion_cache")
    opt_e = torch.optim.SGD(eager.parameters(), lr=0.01)
    opt_c = torch.optim.SGD(mine.parameters(), lr=0.01)
    tol = dict(rtol=1e-4, atol=1e-4) if dtype == torch.float32 else dict(rtol=5e-2, atol=5e-2)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for _ in range(3):
            x = torch.randn(4, 32, 64, device="cuda", dtype=dtype)
            losses = []
            for model, opt in ((eager, opt_e), (compiled, opt_c)):
                opt.zero_grad()
                loss = model(x).float().square().mean()
                loss.backward()
                opt.step()
                losses.append(loss.detach())
            torch.testing.assert_close(losses[1], losses[0], **tol)
            for p1, p2 in zip(mine.parameters(), eager.parameters()):
                torch.testing.assert_close(p1.grad, p2.grad, **tol)
    torch._dynamo.reset()
    reports = dynamo_backend.reports()
    assert {"forward", "backward"} <= {r["graph"] for r in reports}
    assert all(r["regions"] > 0 for r in reports)
