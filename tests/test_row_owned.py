"""The owned-rows kernel of an embedding's gradient (Note [Owned rows], schedulers/row_sums.py;
knob rows.owned): planned for h100 (NVRTC compiles it), run on the host by g++
(tests/host_kernels.py) against torch's index_put: hot rows (runs of 32 tokens on one row,
summed in slices by other blocks), rows of several tokens, of one, of none; every row that is
not hot the fill plus its tokens in token order, bit for bit."""
from __future__ import annotations

import pytest
import torch
from host_kernels import HAVE_GXX, run_plan_on_host
from test_row_sums import _embedding_grad, _in_token_order, _want, permuted_grad

from fusion_cache.runtime.executor import executor_for
from schedulers.tuning import overriding

needs_gxx = pytest.mark.skipif(not HAVE_GXX, reason="no g++ to run kernels on the host")
OWNED = {"rows.owned": True, "rows.owned_threads": 64}  # two warps: host threads are OS threads


def _tokens(vocab: int, n: int, seed: int) -> torch.Tensor:
    """Uniform ids, a padding row (0) over positions 32-95 (two runs of 32), a row of 9
    spread out (42), a run of 4 (7)."""
    g = torch.Generator().manual_seed(seed)
    idx = torch.randint(0, vocab, (n,), generator=g)
    idx[32:96] = 0
    idx[3:n:11] = 42
    idx[100:104] = 7
    return idx


def _spec(fd):
    return executor_for(fd).last_plan.spec


@needs_gxx
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("rest", [[16], [7], [3, 8], [600]], ids=["vector", "odd", "two_dims", "long"])
@pytest.mark.parametrize("early", [0, 2])
def test_owned_rows_against_index_put(dtype, rest, early):
    """Blocks of 64 threads over 301 rows (the grid one wave of 2 blocks an SM of 132: 1 or
    2 rows a block; with early fills, slice blocks own fewer), 150 tokens; rows of 600
    floats take two column passes of 3 vectors."""
    vocab, n = 301, 150
    idx = _tokens(vocab, n, 1)
    value = (torch.randn((n, *rest), generator=torch.Generator().manual_seed(2))
             * torch.logspace(-3, 3, n).view(-1, *[1] * len(rest))).to(dtype)  # fmt: skip
    fd = _embedding_grad(vocab, rest, dtype, 0.25)
    with overriding({**OWNED, "rows.owned_early": early, "rows.owned_slice_rows": 2 * early}):
        (got,) = run_plan_on_host(fd, [idx, value])
    spec = _spec(fd)
    assert [k.name for k in spec.kernels] == ["fc_rows_owned"] and not spec.workspaces
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    want = _want(idx, value, vocab, 0.25, dtype)
    torch.testing.assert_close(got, want, rtol=tol, atol=tol * 1e3)
    cool = torch.ones(vocab, dtype=torch.bool)
    cool[0] = False  # hot: summed in slices, each a tree of partials
    assert torch.equal(got[cool], _in_token_order(idx, value, vocab, 0.25).to(dtype)[cool])


@needs_gxx
@pytest.mark.parametrize("blocks", [1, 2])
@pytest.mark.parametrize("slice_rows", [0, 4])
def test_owned_rows_of_many_hot_rows_and_few_blocks(blocks, slice_rows):
    """Hot rows in several blocks' ranges, one whose runs are far apart, slices taken by
    blocks that own rows named too (with rows.owned_slice_rows, fewer rows than the others);
    larger blocks (128 threads, 4 ids a thread)."""
    vocab, n, h = 40, 500, 24
    g = torch.Generator().manual_seed(5)
    idx = torch.randint(0, vocab, (n,), generator=g)
    idx[0:64] = 39
    idx[128:160] = 3
    idx[448:480] = 39
    idx[256:320] = 20
    value = torch.randn((n, h), generator=g)
    fd = _embedding_grad(vocab, [h], torch.float32, 0.0)
    with overriding({**OWNED, "rows.owned_threads": 128, "rows.owned_blocks": blocks,
                     "rows.owned_slice_rows": slice_rows}):  # fmt: skip
        (got,) = run_plan_on_host(fd, [idx, value])
    assert "owned rows" in _spec(fd).description
    torch.testing.assert_close(got, _want(idx, value, vocab, 0.0, torch.float32))
    cool = torch.ones(vocab, dtype=torch.bool)
    cool[[39, 3, 20]] = False
    assert torch.equal(got[cool], _in_token_order(idx, value, vocab, 0.0)[cool])


@needs_gxx
def test_owned_rows_of_strided_values_and_no_tokens():
    """Values through a permute (one column a thread), and an empty index: every row the
    fill."""
    vocab, h = 150, 8
    fd = permuted_grad(vocab, h, 1.5)
    g = torch.Generator().manual_seed(8)
    for count in (70, 0):
        idx = torch.randint(0, vocab, (count,), generator=g)
        if count:
            idx[32:64] = 149
        value = torch.randn((h, count), generator=g)
        with overriding(OWNED):
            (got,) = run_plan_on_host(fd, [idx, value])
        assert [k.name for k in _spec(fd).kernels] == ["fc_rows_owned"]
        torch.testing.assert_close(got, _want(idx, value.t(), vocab, 1.5, torch.float32))


@needs_gxx
def test_owned_rows_out_of_range_index_fails():
    fd = _embedding_grad(37, [8], torch.float32, 0.0)
    with overriding(OWNED), pytest.raises(RuntimeError, match="fc_rows_owned failed"):
        run_plan_on_host(fd, [torch.tensor([1, 2, 37, 3]), torch.randn(4, 8)])


def test_owned_rows_compile_for_h100(monkeypatch):
    """The benchmark's gradient: 264 blocks of 512 threads (two an SM of 132) of 191 rows,
    16 ids a thread; 16384 tokens do not fit the registers, and the plan falls back to the
    default with the reason in its description."""
    monkeypatch.setenv("FUSION_CACHE_DETERMINISTIC", "0")
    fd = _embedding_grad(50304, [768], torch.bfloat16, 0.0)

    def inputs(n):
        return [torch.empty(n, dtype=torch.int64, device="meta"),
                torch.empty(n, 768, dtype=torch.bfloat16, device="meta")]  # fmt: skip

    with overriding({"rows.owned": True}):
        refs = fd.precompile(inputs(8192), target="h100")
        assert [r.name for r in refs] == ["fc_rows_owned"]
        spec = _spec(fd)
        assert spec.kernels[0].grid == (264, 1, 1) and spec.kernels[0].block == (512, 1, 1)
        assert "#define R 192" in refs[0].source and "#define P 16" in refs[0].source
        refs = fd.precompile(inputs(16384), target="h100")
        assert "fc_rows_owned" not in [r.name for r in refs]
        assert "owned rows refused: 16384 tokens" in _spec(fd).description
