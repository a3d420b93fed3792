"""Note [Lone convolutions] (fusion_cache/frontends/dynamo_backend.py): with
FUSION_CACHE_LONE_CONVOLUTIONS=1 the stem's convolution and a shortcut's, each alone in its
piece of a region, join a neighbour's region rather than staying eager; training matches
eager (the reference evaluator on the CPU)."""
import copy

import pytest
import torch
import torch.nn as nn

from benchmarks.model_defs import BasicBlock
from fusion_cache.frontends import dynamo_backend

pytestmark = pytest.mark.usefixtures("fresh_dynamo")  # tests/conftest.py


def _model() -> nn.Module:
    torch.manual_seed(0)
    stem = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1, bias=False), nn.BatchNorm2d(4), nn.ReLU())
    return nn.Sequential(stem, BasicBlock(4, 8, 2), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                         nn.Linear(8, 3))  # fmt: skip


def _train(model: nn.Module, batches) -> list[torch.Tensor]:
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    out = []
    for x in batches:
        opt.zero_grad()
        loss = model(x).square().mean()
        loss.backward()
        opt.step()
        out.append(loss.detach())
    return out + [p.detach() for p in model.parameters()] + [b for b in model.buffers()]


@pytest.mark.parametrize("switch", ["0", "1"])
def test_lone_convolutions_join_a_region(monkeypatch, switch):
    monkeypatch.setenv("FUSION_CACHE_LONE_CONVOLUTIONS", switch)
    eager = _model()
    compiled = torch.compile(copy.deepcopy(eager), backend="fusion_cache")
    batches = [torch.randn(4, 3, 8, 8) for _ in range(3)]
    want, got = _train(eager, batches), _train(compiled, batches)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-5)
    eager_ops = {op: why for r in dynamo_backend.reports() for op, why in r["eager_ops"].items()}
    if switch == "1":
        assert "convolution" not in eager_ops, eager_ops
    else:  # the stem's and the shortcut's
        assert sum(eager_ops["convolution"].values()) == 2, eager_ops


def test_paired_pieces_halve_the_regions(monkeypatch):
    """Note [Paired pieces]: two neighbouring pieces of a cut partition are one region; training
    still matches eager."""
    batches = [torch.randn(4, 3, 8, 8) for _ in range(3)]
    counts = {}
    for switch in ("0", "1"):
        monkeypatch.setenv("FUSION_CACHE_PAIRED_PIECES", switch)
        torch._dynamo.reset()
        dynamo_backend.reset_reports()
        eager = _model()
        compiled = torch.compile(copy.deepcopy(eager), backend="fusion_cache")
        want, got = _train(eager, batches), _train(compiled, batches)
        for g, w in zip(got, want):
            torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-5)
        counts[switch] = sum(r["regions"] for r in dynamo_backend.reports())
    assert counts["1"] < counts["0"], counts
