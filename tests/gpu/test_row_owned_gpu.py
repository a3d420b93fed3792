"""The owned-rows kernel of an embedding's gradient on the GPU (Note [Owned rows], knob
rows.owned) against eager: the benchmark's sizes uniform and padded, odd sizes, repeated ids,
each dtype, one launch, the same bits on every run."""
from __future__ import annotations

import pytest
import torch

from fusion_cache import FusionCache, FusionDefinition

pytestmark = pytest.mark.gpu
CUDA = "cuda"


def _launches() -> int:
    return FusionCache.get().stats()["kernel_launches"]


def _run(dtype, vocab, dim, idx, knobs):
    from benchmarks.resize_cases import define_embedding_bwd, eager_embedding_bwd
    from schedulers.tuning import overriding

    with FusionDefinition() as fd:
        define_embedding_bwd(fd, dtype, (0, 0, 0, 0))
    g = torch.Generator().manual_seed(1)
    grad = torch.randn((*idx.shape, dim), generator=g).to(dtype=dtype, device=CUDA)
    weight = torch.randn((vocab, dim), generator=g).to(dtype=dtype, device=CUDA)
    with overriding({"rows.owned": True, **knobs}):
        before = _launches()
        runs = [fd.execute([idx, grad, weight])[0] for _ in range(2)]
        assert _launches() - before == 2
    want = eager_embedding_bwd(idx, grad.float(), weight.float())
    tol = {torch.float32: 1e-4, torch.bfloat16: 3e-2, torch.float16: 2e-2}[dtype]
    torch.testing.assert_close(runs[0].float(), want, rtol=tol, atol=tol * 40)
    assert torch.equal(runs[0], runs[1])


@pytest.mark.parametrize("padded", [False, True], ids=["uniform", "padded"])
@pytest.mark.parametrize("knobs", [{}, {"rows.owned_blocks": 1}, {"rows.owned_early": 4},
                                   {"rows.owned_threads": 1024, "rows.owned_blocks": 1}],
                         ids=["default", "one_block", "early", "wide"])  # fmt: skip
def test_owned_rows_at_the_benchmark_sizes(padded, knobs):
    idx = torch.randint(0, 50304, (8, 1024), device=CUDA)
    if padded:
        idx[:, 768:] = 0  # 2048 tokens on the padding row: 64 runs, summed in 24 slices
    _run(torch.bfloat16, 50304, 768, idx, knobs)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
def test_owned_rows_of_odd_sizes_and_repeated_ids(dtype):
    """5003 rows of 200, 4000 tokens: a padding row (a run), a row of 40 not in runs, a
    few ids repeated everywhere."""
    vocab = 5003
    idx = torch.randint(0, vocab, (4, 1000), device=CUDA)
    idx[:, :300] = 0
    idx[1, 300:340] = vocab - 1
    idx[:, 500::7] = 17
    idx[2, 3::5] = 4999
    _run(dtype, vocab, 200, idx, {})
