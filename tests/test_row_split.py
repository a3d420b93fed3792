"""The split walk of an embedding's gradient (Note [Split walk], schedulers/row_sums.py;
codegen/row_split_cuda.py): named blocks, a warp a row the link listed, and fill blocks
that store the fill to rows no token names. Planned for h100, run on the host by g++
(tests/host_kernels.py) against torch's index_put: hot rows, rows of several tokens, of one,
of none; kept words over runs; out-of-range ids; no tokens at all."""
from __future__ import annotations

import pytest
import torch
from host_kernels import HAVE_GXX, run_plan_on_host
from test_row_sums import (
    SLAB_WALK,
    _embedding_grad,
    _in_token_order,
    _want,
    padded_tokens,
    permuted_grad,
)

from fusion_cache.runtime.executor import executor_for
from schedulers.tuning import overriding

needs_gxx = pytest.mark.skipif(not HAVE_GXX, reason="no g++ to run kernels on the host")
SPLIT = {**SLAB_WALK, "rows.kept": True, "rows.split": True}


def _names(fd) -> list[str]:
    return [k.name for k in executor_for(fd).last_plan.spec.kernels]


@needs_gxx
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("rest", [[16], [7], [600]], ids=["vector", "odd", "long"])
@pytest.mark.parametrize("bound", [2, 16])
@pytest.mark.parametrize("walk_adds", [False, True])
def test_split_walk_against_index_put(dtype, rest, bound, walk_adds, monkeypatch):
    """A padding row of 40 tokens (past a bound of 2 or 16: slot sums, added by the link or,
    Note [Walk adds], by the walk's hot blocks), a row of 9 spread over the warps, a run of 4,
    rows of two, one and none; three runs on one scratch, the words (lists of named rows and
    of hot tokens, pending counts) back at -1 and the sums at 0 after each."""
    monkeypatch.setenv("FUSION_CACHE_DETERMINISTIC", "0")
    vocab = 301
    idx, value = padded_tokens(rest, dtype)
    fd = _embedding_grad(vocab, rest, dtype, 0.25)
    scratch: list = []
    for _ in range(3):
        with overriding({**SPLIT, "rows.bound": bound, "rows.walk_adds": walk_adds}):
            (got,) = run_plan_on_host(fd, [idx, value], scratch=scratch)
        assert _names(fd) == ["fc_rows_link", "fc_rows_split_walk"]
        link, walk = (k.source for k in executor_for(fd).last_plan.spec.kernels)
        assert ("hot_t[k] = (int)t;" in link) == walk_adds
        assert ("fc_red_add_vec<VW>(" in link) != walk_adds
        assert ("fc_red_add_vec<VW>(" in walk) == walk_adds
        assert "split slab walk" in executor_for(fd).last_plan.spec.description
        tol = 1e-5 if dtype == torch.float32 else 2e-2
        torch.testing.assert_close(got, _want(idx, value, vocab, 0.25, dtype), rtol=tol, atol=tol)
        assert bool((scratch[0] == -1).all()) and bool((scratch[2] == 0).all())


@needs_gxx
def test_split_walk_with_sorted_lists_sums_in_token_order(monkeypatch):
    """rows.sorted: every row (none past the bound of 32) is the fill plus its tokens in
    token order, bit for bit, over two runs."""
    monkeypatch.setenv("FUSION_CACHE_DETERMINISTIC", "0")
    vocab, n, h = 50, 200, 24
    g = torch.Generator().manual_seed(3)
    idx = torch.randint(0, vocab, (n,), generator=g)
    value = torch.randn((n, h), generator=g) * torch.logspace(-3, 3, n).unsqueeze(1)
    fd = _embedding_grad(vocab, [h], torch.float32, 0.25)
    scratch: list = []
    for _ in range(2):
        with overriding({**SPLIT, "rows.bound": 32, "rows.sorted": True, "rows.walk_adds": True}):
            (got,) = run_plan_on_host(fd, [idx, value], scratch=scratch)
        assert torch.equal(got, _in_token_order(idx, value, vocab, 0.25))


@needs_gxx
def test_split_walk_of_no_tokens_and_of_strided_values(monkeypatch):
    """Values through a permute (one column a thread) and an empty index: no link kernel,
    no named blocks, every row the fill."""
    monkeypatch.setenv("FUSION_CACHE_DETERMINISTIC", "0")
    vocab, h = 150, 8
    fd = permuted_grad(vocab, h, 1.5)
    g = torch.Generator().manual_seed(8)
    for count in (40, 0):
        idx = torch.randint(0, vocab, (count,), generator=g)
        value = torch.randn((h, count), generator=g)
        with overriding({**SPLIT, "rows.bound": 4, "rows.walk_adds": True}):
            (got,) = run_plan_on_host(fd, [idx, value])
        assert _names(fd)[-1] == "fc_rows_split_walk"
        torch.testing.assert_close(got, _want(idx, value.t(), vocab, 1.5, torch.float32))


@needs_gxx
def test_split_walk_out_of_range_index_fails(monkeypatch):
    monkeypatch.setenv("FUSION_CACHE_DETERMINISTIC", "0")
    fd = _embedding_grad(37, [8], torch.float32, 0.0)
    with overriding({**SPLIT, "rows.bound": 4, "rows.walk_adds": True}), \
            pytest.raises(RuntimeError, match="fc_rows_link failed"):  # fmt: skip
        run_plan_on_host(fd, [torch.tensor([1, 2, 37, 3]), torch.randn(4, 8)])


def test_split_walk_compiles_for_h100(monkeypatch):
    """The benchmark's gradient, the hot tokens added in the link: 1024 named blocks (a warp
    for each of 8192 tokens' rows at most) among the 2396 fill blocks of 21 rows; the link
    lists the named rows."""
    monkeypatch.setenv("FUSION_CACHE_DETERMINISTIC", "0")
    fd = _embedding_grad(50304, [768], torch.bfloat16, 0.0)
    inputs = [torch.empty(8192, dtype=torch.int64, device="meta"),
              torch.empty(8192, 768, dtype=torch.bfloat16, device="meta")]  # fmt: skip
    with overriding({"rows.walk_adds": False, "rows.bound": 16}):
        refs = fd.precompile(inputs, target="h100")
    assert [r.name for r in refs] == ["fc_rows_link", "fc_rows_split_walk"]
    assert "__match_any_sync" in refs[0].source and "3 * V + 2 + taken" in refs[0].source
    spec = executor_for(fd).last_plan.spec
    assert spec.kernels[-1].grid[0] == 1024 + -(-50304 // 21)
    assert spec.workspaces[0][0] == 3 * 50304 + 2 + 8192


def test_walk_adds_compile_for_h100(monkeypatch):
    """Note [Walk adds], the default: 128 hot blocks (a warp each 8 of 8192 tokens past a bound) first in
    the grid, then the named and fill blocks; the words grow by a counter, the hot tokens and
    their slots and a pending count for each of 8192 / 5 hot rows at most."""
    monkeypatch.setenv("FUSION_CACHE_DETERMINISTIC", "0")
    fd = _embedding_grad(50304, [768], torch.bfloat16, 0.0)
    inputs = [torch.empty(8192, dtype=torch.int64, device="meta"),
              torch.empty(8192, 768, dtype=torch.bfloat16, device="meta")]  # fmt: skip
    refs = fd.precompile(inputs, target="h100")  # the default (Note [Walk adds])
    spec = executor_for(fd).last_plan.spec
    assert spec.kernels[-1].grid[0] == 128 + 1024 + -(-50304 // 21)
    assert "#define HB 128" in refs[-1].source
    assert spec.workspaces[0][0] == 3 * 50304 + 2 + 8192 + 1 + 2 * 8192 + 8192 // 5
