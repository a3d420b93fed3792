"""benchmarks/thunder_models.py on the CPU: the route check it runs before importing
Thunder, its models (run eagerly at small sizes), and its refusal without a GPU."""
from __future__ import annotations

import sys

import pytest
import torch

from benchmarks import thunder_models as tm

_KEYS = ("nvfuser", "nvfuser._C", "nvfuser.pytorch_utils", "nvfuser.nvfuser_version",
         "nvfuser_direct")  # fmt: skip


@pytest.fixture(autouse=True)
def restore_modules():
    saved = {k: sys.modules[k] for k in _KEYS if k in sys.modules}
    yield
    for k in _KEYS:
        sys.modules.pop(k, None)
    sys.modules.update(saved)


def test_route_check_reports_only_what_is_missing():
    problems = tm.check_route()
    import fusion_cache

    missing = [n for n in ("Float8_e4m3fn", "Float8_e5m2", "UInt64")
               if not hasattr(fusion_cache.DataType, n)]  # fmt: skip
    assert problems == [f"DataType.{n} (read by Thunder at import) is missing" for n in missing]
    assert tm.main(["--check"]) == (1 if missing else 0)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal without a GPU")
def test_without_a_gpu_it_says_so(capsys):
    assert tm.main(["--steps", "1"]) == 2
    assert "needs a CUDA GPU" in capsys.readouterr().out


def test_models_run_eagerly_and_train():
    torch.manual_seed(0)
    c = tm.GPTConfig(vocab=64, seq=16, layers=2, heads=2, width=32, dropout=0.1)
    model = tm.GPT2(c)
    idx = torch.randint(0, c.vocab, (2, c.seq))
    loss = model(idx, torch.randint(0, c.vocab, (2, c.seq)))
    loss.backward()
    assert loss.dim() == 0 and model.tok.weight.grad is not None
    q = torch.randn(1, 2, 8, 16)
    cos, sin = tm.rope_tables(8, 16, "cpu", torch.float32)
    rq, rk = tm.Rope()(q, q, cos, sin)
    assert rq.shape == q.shape and torch.allclose(rq.norm(dim=-1), q.norm(dim=-1), atol=1e-5)
    x = torch.randn(4, 8)
    assert torch.allclose(tm.Softmax()(x).sum(-1), torch.ones(4))
    assert tm.PointwiseChain()(x, x).shape == x.shape
    assert tm.GeluMLP(8)(x).shape == x.shape and tm.LayerNorm(8)(x).shape == x.shape
    assert {case.name for case in tm._cases()} == {"pointwise", "softmax", "layer_norm",
                                                   "gelu_mlp", "rope", "gpt2"}  # fmt: skip
