"""The row-sums kernels of an accumulate into a constant fill (Note [Row sums],
schedulers/row_sums.py): planned for h100 (NVRTC compiles them), run on the host by g++
(tests/host_kernels.py) against torch's index_put, with rows named by many tokens, by one,
by none; rows that are contiguous (vector columns) or not (one column a thread); the two
kernels on kept words (Note [Row sums on kept words]) run again on the words the last run
left; the four kernels behind the knob; and the deterministic switch taking the ordered kernel
instead."""
from __future__ import annotations

import pytest
import torch
from host_kernels import HAVE_GXX, run_plan_on_host

from codegen.row_sums_cuda import kept_layout
from fusion_cache import DataType, FusionDefinition
from fusion_cache.runtime.executor import executor_for
from schedulers.tuning import overriding

needs_gxx = pytest.mark.skipif(not HAVE_GXX, reason="no g++ to run kernels on the host")
DT = {torch.float32: DataType.Float, torch.bfloat16: DataType.BFloat16,
      torch.float16: DataType.Half}  # fmt: skip


def _embedding_grad(vocab: int, rest: list[int], dtype: torch.dtype, fill: float,
                    sum_dtype: DataType = DataType.Float) -> FusionDefinition:  # fmt: skip
    """Sums of value rows [N, *rest] at index [N] into `fill`, cast to `dtype`."""
    with FusionDefinition() as fd:
        idx = fd.define_tensor(shape=[-1], contiguity=[True], dtype=DataType.Int)
        value = fd.define_tensor(shape=[-1] * (1 + len(rest)), contiguity=[True] * (1 + len(rest)),
                                 dtype=DT[dtype])  # fmt: skip
        up = fd.ops.cast(value, sum_dtype) if DT[dtype] is not sum_dtype else value
        zeros = fd.ops.full([vocab, *rest], fd.define_scalar(fill), sum_dtype)
        out = fd.ops.index_put_accumulate(zeros, idx, up)
        fd.add_output(fd.ops.cast(out, DT[dtype]) if sum_dtype is not DT[dtype] else out)
    return fd


def _want(idx, value, vocab, fill, dtype):
    acc = torch.full((vocab, *value.shape[1:]), fill, dtype=torch.float64)
    return acc.index_put((idx,), value.double(), accumulate=True).to(dtype)


def _plan_names(fd) -> list[str]:
    return [k.name for k in executor_for(fd).last_plan.spec.kernels]


def _tokens(vocab: int, n: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    idx = torch.randint(0, vocab, (n,), generator=g)
    idx[:20] = 5  # a hot row; others by one token or by none
    idx[20:23] = vocab - 1
    return idx[torch.randperm(n, generator=g)]


@needs_gxx
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("rest", [[24], [7], [3, 8]], ids=["vector", "odd", "two_dims"])
def test_row_sums_against_index_put(dtype, rest, monkeypatch):
    """The claim-and-add kernel with two blocks (its loop over tokens wraps), run twice on the
    same kept words: the second run's claims and sums start from what the first left."""
    monkeypatch.setenv("FUSION_CACHE_DETERMINISTIC", "0")
    vocab, n = 37, 90
    fd = _embedding_grad(vocab, rest, dtype, 0.25)
    kept: dict = {}

    def words(spec):
        return kept.setdefault("w", torch.zeros(2 + spec.kept, dtype=torch.int32))

    tol = 1e-5 if dtype == torch.float32 else 2e-2
    for seed in (1, 2):
        idx = _tokens(vocab, n, seed)
        value = torch.randn((n, *rest), generator=torch.Generator().manual_seed(seed)).to(dtype)
        with overriding({"rows.claim_blocks": 2}):
            (got,) = run_plan_on_host(fd, [idx, value], kept_words=words)
        assert _plan_names(fd) == ["fc_rows_claim_add", "fc_rows_out_kept"]
        assert executor_for(fd).last_plan.spec.kernels[0].grid == (2, 1, 1)
        torch.testing.assert_close(got, _want(idx, value, vocab, 0.25, dtype), rtol=tol, atol=tol)
        spec = executor_for(fd).last_plan.spec
        _, sums_at, total = kept_layout(vocab, n, got[0].numel())
        w = kept["w"]
        assert w[:2].tolist() == [0, 0]  # the barrier's counters, zeroed again
        assert w[2].item() == seed  # the run count
        assert not w[2 + sums_at:2 + total].any()  # sums left zero for the next run
        assert spec.kept == total


@needs_gxx
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_four_row_sums_kernels_against_index_put(dtype, monkeypatch):
    """rows.kept=False: fill, claim, add and out kernels (Note [Row sums])."""
    monkeypatch.setenv("FUSION_CACHE_DETERMINISTIC", "0")
    vocab, n = 37, 90
    idx = _tokens(vocab, n, 1)
    value = torch.randn((n, 24), generator=torch.Generator().manual_seed(1)).to(dtype)
    fd = _embedding_grad(vocab, [24], dtype, 0.25)
    with overriding({"rows.kept": False}):
        (got,) = run_plan_on_host(fd, [idx, value])
    assert _plan_names(fd) == ["fc_rows_fill", "fc_rows_claim", "fc_rows_add", "fc_rows_out"]
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(got, _want(idx, value, vocab, 0.25, dtype), rtol=tol, atol=tol)


@needs_gxx
def test_row_sums_of_strided_values_take_one_column_a_thread(monkeypatch):
    """Values read through a permute: rows are not contiguous, so no vectors."""
    monkeypatch.setenv("FUSION_CACHE_DETERMINISTIC", "0")
    vocab, n, h = 11, 16, 8
    with FusionDefinition() as fd:
        idx = fd.define_tensor(shape=[-1], contiguity=[True], dtype=DataType.Int)
        value = fd.define_tensor(shape=[-1, -1], contiguity=[True, True], dtype=DataType.Float)
        zeros = fd.ops.full([vocab, h], fd.define_scalar(0.0), DataType.Float)
        fd.add_output(fd.ops.index_put_accumulate(zeros, idx, fd.ops.permute(value, [1, 0])))
    g = torch.Generator().manual_seed(2)
    idx = torch.randint(0, vocab, (n,), generator=g)
    value = torch.randn((h, n), generator=g)
    (got,) = run_plan_on_host(fd, [idx, value])
    assert "vw=1" in executor_for(fd).last_plan.spec.description
    torch.testing.assert_close(got, _want(idx, value.t(), vocab, 0.0, torch.float32))


def test_deterministic_switch_takes_the_ordered_kernel(monkeypatch):
    monkeypatch.setenv("FUSION_CACHE_DETERMINISTIC", "1")
    fd = _embedding_grad(50304, [768], torch.bfloat16, 0.0)
    inputs = [torch.empty(8192, dtype=torch.int64, device="meta"),
              torch.empty(8192, 768, dtype=torch.bfloat16, device="meta")]  # fmt: skip
    fd.precompile(inputs, target="h100")
    assert _plan_names(fd) == ["fc_accumulate_ordered"]


def test_embedding_gradient_compiles_for_h100_with_vector_atomics(monkeypatch):
    """NVRTC (ptxas) accepts red.global.add.v4.f32 for sm_90; 16-byte rows of bf16; the rows
    launched dependent on the claims."""
    monkeypatch.setenv("FUSION_CACHE_DETERMINISTIC", "0")
    fd = _embedding_grad(50304, [768], torch.bfloat16, 0.0)
    inputs = [torch.empty(8192, dtype=torch.int64, device="meta"),
              torch.empty(8192, 768, dtype=torch.bfloat16, device="meta")]  # fmt: skip
    refs = fd.precompile(inputs, target="h100")
    assert [r.name for r in refs] == ["fc_rows_claim_add", "fc_rows_out_kept"]
    assert "red.global.add.v4.f32" in refs[0].source
    spec = executor_for(fd).last_plan.spec
    assert "vw=8" in spec.description
    claim, out = spec.kernels
    assert claim.grid == (1024, 1, 1) and out.dependent and not claim.cooperative
    assert out.grid == (50304 * 768 // 8 // 256, 1, 1)


@needs_gxx
def test_token_out_of_range_stops_the_claims(monkeypatch):
    """The claim checks each token against the rows (a device-side assert on the GPU; the
    host run reports it)."""
    monkeypatch.setenv("FUSION_CACHE_DETERMINISTIC", "0")
    fd = _embedding_grad(11, [8], torch.float32, 0.0)
    idx = torch.tensor([1, 3, 11, 2])
    with pytest.raises(RuntimeError, match="failed on the host"):
        run_plan_on_host(fd, [idx, torch.randn(4, 8)])


@needs_gxx
@pytest.mark.parametrize("rest", [[24], [7]], ids=["vector", "odd"])
def test_rows_kernel_with_several_vectors_a_thread(rest, monkeypatch):
    """rows.out_units=3: a thread's claims and values loaded before its stores; the last
    thread's units run past the rows."""
    monkeypatch.setenv("FUSION_CACHE_DETERMINISTIC", "0")
    vocab, n = 37, 90
    idx = _tokens(vocab, n, 3)
    value = torch.randn((n, *rest), generator=torch.Generator().manual_seed(3))
    fd = _embedding_grad(vocab, rest, torch.float32, -1.5)
    with overriding({"rows.out_units": 3}):
        (got,) = run_plan_on_host(fd, [idx, value])
    assert "u2" in executor_for(fd).last_plan.spec.kernels[1].source
    torch.testing.assert_close(got, _want(idx, value, vocab, -1.5, torch.float32))
