"""Each aten lowering through torch.compile(backend="fusion_cache") on tiny CPU tensors (the
reference evaluator runs the regions here): forward and backward against eager, on fresh
random inputs, and the op shows up fused in the graph reports (not left to eager)."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from fusion_cache.frontends import dynamo_backend, register_backend


@pytest.fixture(autouse=True)
def fresh_dynamo(monkeypatch):
    import torch._dynamo

    register_backend()
    monkeypatch.setenv("FUSION_CACHE_SINGLE_NODE", "1")  # a lone op still makes a region
    monkeypatch.delenv("FUSION_CACHE_DUMP", raising=False)
    torch._dynamo.reset()
    dynamo_backend.reset_reports()
    yield
    torch._dynamo.reset()


def _rope(x):
    b, t, d = x.shape
    x1, x2 = (x * 1.5).reshape(b, t, d // 2, 2).unbind(-1)
    cos, sin = torch.cos(x1), torch.sin(x2)
    return torch.stack((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1).flatten(2)


# name -> (function, input shapes, ops the forward must fuse, ops the backward must fuse)
CASES = {
    "split_sizes": (lambda x: [t * (i + 2) for i, t in enumerate((x * 2).split([2, 3, 1], 1))],
                    [(4, 6)], {"split_with_sizes"}, {"cat"}),
    "split_even": (lambda x: [t.exp() for t in (x + 1).split(2, -1)], [(3, 5)], {"split"},
                   {"cat"}),
    "chunk": (lambda x: (lambda q, k: q * k)(*(x * 2).chunk(2, dim=-1)), [(2, 3, 8)], {"split"},
              {"cat"}),
    "unbind_stack_rope": (_rope, [(2, 3, 8)], {"unbind", "stack"}, {"stack"}),
    "stack_dim1": (lambda x, y: torch.stack([x * 2, y + 1, x * y], dim=1).sin(),
                   [(3, 4), (3, 4)], {"stack"}, set()),
    "select": (lambda x: (x * 2)[:, 1] * 3 + (x * 2)[-1], [(5, 5)], {"select"},
               {"select_backward"}),
    "slice": (lambda x: (x * 2)[:, 1:4] + (x * 3)[:, -3:], [(3, 6)], {"slice"},
              {"slice_backward"}),
    "slice_step": (lambda x: (x * 2)[::2, 1::3].exp(), [(5, 7)], {"slice"}, set()),
    "narrow": (lambda x: (x * 2).narrow(1, 1, 2) + 1, [(3, 5)], {"slice"}, set()),
    "cat": (lambda x, y: torch.cat([x.sin(), y.cos(), x * 2], dim=0) * 3, [(2, 4), (3, 4)],
            {"cat"}, set()),
    "cat_last_dim": (lambda x, y: torch.cat([x * 2, y.exp()], dim=-1).tanh(),
                     [(2, 3, 4), (2, 3, 1)], {"cat"}, set()),
    "pad": (lambda x: F.pad(x * 2, (1, 2, 0, 1), value=0.5).exp(), [(3, 4)],
            {"constant_pad_nd"}, {"constant_pad_nd"}),
    "pad_crop": (lambda x: F.pad(x * 2, (-1, 2)).exp(), [(3, 4)], {"constant_pad_nd"},
                 {"constant_pad_nd"}),
}


def _check(fn, shapes, fwd_ops, bwd_ops, dtype=torch.float64, rtol=None, atol=None):
    torch.manual_seed(0)
    inputs = [torch.randn(s, dtype=dtype, requires_grad=True) for s in shapes]
    same = [t.detach().clone().requires_grad_() for t in inputs]
    compiled = torch.compile(fn, backend="fusion_cache")
    got, want = compiled(*inputs), fn(*same)
    got = list(got) if isinstance(got, (list, tuple)) else [got]
    want = list(want) if isinstance(want, (list, tuple)) else [want]
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=rtol, atol=atol)
    # a random weighting of the outputs, so every gradient path carries distinct values
    weights = [torch.randn_like(w) for w in want]
    sum(((g * k).sum() for g, k in zip(got, weights)), torch.zeros((), dtype=dtype)).backward()
    sum(((w * k).sum() for w, k in zip(want, weights)), torch.zeros((), dtype=dtype)).backward()
    for a, b in zip(inputs, same):
        torch.testing.assert_close(a.grad, b.grad, rtol=rtol, atol=atol)
    reports = dynamo_backend.reports()
    fused = {k: set() for k in ("forward", "backward")}
    for r in reports:
        fused[r["graph"]] |= set(r["fused_ops"])
    assert fwd_ops <= fused["forward"], (fused, [r["eager_ops"] for r in reports])
    assert bwd_ops <= fused["backward"], (fused, [r["eager_ops"] for r in reports])
    return reports


@pytest.mark.parametrize("name", sorted(CASES))
def test_lowering_matches_eager(name):
    fn, shapes, fwd_ops, bwd_ops = CASES[name]
    _check(fn, shapes, fwd_ops, bwd_ops)
