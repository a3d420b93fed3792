"""The row-slab kernels of an embedding's gradient (Note [Row slabs], schedulers/row_sums.py;
knob rows.slab): planned for h100 (NVRTC compiles them), run on the host by g++
(tests/host_kernels.py) against torch's index_put, with hot rows (more tokens than the slab
kernel sums, split over index segments), rows of a few tokens, of one, of none; contiguous
and strided values; every sum in index order."""
from __future__ import annotations

import pytest
import torch
from host_kernels import HAVE_GXX, run_plan_on_host

from fusion_cache import DataType, FusionDefinition
from fusion_cache.runtime.executor import executor_for
from schedulers.tuning import overriding

needs_gxx = pytest.mark.skipif(not HAVE_GXX, reason="no g++ to run kernels on the host")
DT = {torch.float32: DataType.Float, torch.bfloat16: DataType.BFloat16,
      torch.float16: DataType.Half}  # fmt: skip
NAMES = ["fc_slabs_reset", "fc_slabs_rows", "fc_slabs_hot"]
SMALL = {"rows.slab": True, "rows.slab_rows": 8, "rows.slab_most": 4}


def _embedding_grad(vocab: int, rest: list[int], dtype: torch.dtype, fill: float) -> FusionDefinition:
    """Sums of value rows [N, *rest] at index [N] into `fill`, in float, cast to `dtype`."""
    with FusionDefinition() as fd:
        idx = fd.define_tensor(shape=[-1], contiguity=[True], dtype=DataType.Int)
        value = fd.define_tensor(shape=[-1] * (1 + len(rest)), contiguity=[True] * (1 + len(rest)),
                                 dtype=DT[dtype])  # fmt: skip
        up = fd.ops.cast(value, DataType.Float) if dtype != torch.float32 else value
        zeros = fd.ops.full([vocab, *rest], fd.define_scalar(fill), DataType.Float)
        out = fd.ops.index_put_accumulate(zeros, idx, up)
        fd.add_output(fd.ops.cast(out, DT[dtype]) if dtype != torch.float32 else out)
    return fd


def _want(idx, value, vocab, fill, dtype):
    acc = torch.full((vocab, *value.shape[1:]), fill, dtype=torch.float64)
    return acc.index_put((idx,), value.double(), accumulate=True).to(dtype)


def _ordered(idx, value, vocab, fill):
    """Each row's float sum in index order, from the fill (what the slab kernel adds)."""
    out = torch.full((vocab, *value.shape[1:]), fill, dtype=torch.float32)
    for t, r in enumerate(idx.tolist()):
        out[r] += value[t].float()
    return out


def _tokens(vocab: int, n: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    idx = torch.randint(0, vocab, (n,), generator=g)
    idx[::3] = 5  # hot: a third of the tokens, spread over every index segment
    idx[7:10] = 36  # three tokens; rows of one and of none from the rest
    idx[200:260] = 0  # hot and packed, as a padding row is
    return idx


@needs_gxx
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("rest", [[24], [7], [3, 8]], ids=["vector", "odd", "two_dims"])
def test_row_slabs_against_index_put(dtype, rest):
    vocab, n = 37, 300  # 5 index segments of 64 in the hot kernel
    idx = _tokens(vocab, n, 1)
    value = torch.randn((n, *rest), generator=torch.Generator().manual_seed(2)).to(dtype)
    fd = _embedding_grad(vocab, rest, dtype, 0.25)
    with overriding(SMALL):
        (got,) = run_plan_on_host(fd, [idx, value])
    assert [k.name for k in executor_for(fd).last_plan.spec.kernels] == NAMES
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(got, _want(idx, value, vocab, 0.25, dtype), rtol=tol, atol=tol)
    counts = torch.bincount(idx, minlength=vocab)
    cool = counts <= SMALL["rows.slab_most"]  # summed by the slab kernel, in index order
    want = _ordered(idx, value, vocab, 0.25).to(dtype)
    assert torch.equal(got[cool], want[cool])


@needs_gxx
def test_row_slabs_of_strided_values_and_default_sizes():
    """Values read through a permute (one column a thread), the default slab and hot sizes."""
    vocab, n, h = 11, 160, 8
    with FusionDefinition() as fd:
        idx = fd.define_tensor(shape=[-1], contiguity=[True], dtype=DataType.Int)
        value = fd.define_tensor(shape=[-1, -1], contiguity=[True, True], dtype=DataType.Float)
        zeros = fd.ops.full([vocab, h], fd.define_scalar(0.0), DataType.Float)
        fd.add_output(fd.ops.index_put_accumulate(zeros, idx, fd.ops.permute(value, [1, 0])))
    g = torch.Generator().manual_seed(3)
    idx = torch.randint(0, vocab, (n,), generator=g)
    idx[:40] = 4  # hot at the default threshold (16)
    value = torch.randn((h, n), generator=g)
    with overriding({"rows.slab": True}):
        (got,) = run_plan_on_host(fd, [idx, value])
    assert "vw=1" in executor_for(fd).last_plan.spec.description
    torch.testing.assert_close(got, _want(idx, value.t(), vocab, 0.0, torch.float32))


@needs_gxx
def test_row_slabs_out_of_range_index_fails():
    fd = _embedding_grad(37, [8], torch.float32, 0.0)
    idx = torch.tensor([1, 2, 37, 3])
    # one slab: the host's lockstep runner keeps one barrier across blocks, which a failed
    # thread leaves short for the next block
    with overriding({"rows.slab": True}), pytest.raises(RuntimeError, match="failed on the host"):
        run_plan_on_host(fd, [idx, torch.randn(4, 8)])


@pytest.mark.parametrize("deterministic", ["0", "1"])
def test_row_slabs_compile_for_h100(deterministic, monkeypatch):
    """The benchmark's embedding gradient: three kernels, 16-byte rows; the deterministic
    switch keeps them (their sums do not depend on the order threads run in)."""
    monkeypatch.setenv("FUSION_CACHE_DETERMINISTIC", deterministic)
    monkeypatch.setenv("FUSION_CACHE_DISABLE_FALLBACK", "1")
    fd = _embedding_grad(50304, [768], torch.bfloat16, 0.0)
    inputs = [torch.empty(8192, dtype=torch.int64, device="meta"),
              torch.empty(8192, 768, dtype=torch.bfloat16, device="meta")]  # fmt: skip
    with overriding({"rows.slab": True}):
        refs = fd.precompile(inputs, target="h100")
    assert [r.name for r in refs] == NAMES
    assert "vw=8" in executor_for(fd).last_plan.spec.description


@pytest.mark.parametrize("deterministic", ["0", "1"])
def test_row_slabs_leave_long_indexes_to_the_other_kernels(deterministic, monkeypatch):
    """Every slab reads the whole index: with more index bytes to read than output bytes to
    write (and 4 MB), the default's kernels (or, deterministic, the ordered kernel) take the sums."""
    monkeypatch.setenv("FUSION_CACHE_DETERMINISTIC", deterministic)
    fd = _embedding_grad(8192, [64], torch.bfloat16, 0.0)  # 1 MB of output, 128 slabs
    inputs = [torch.empty(65536, dtype=torch.int64, device="meta"),  # 64 MB of index reads
              torch.empty(65536, 64, dtype=torch.bfloat16, device="meta")]  # fmt: skip
    with overriding({"rows.slab": True}):
        refs = fd.precompile(inputs, target="h100")
    names = [r.name for r in refs]
    assert names == (["fc_accumulate_ordered"] if deterministic == "1" else
                     ["fc_rows_link", "fc_rows_split_walk"])  # Note [Split walk]


@needs_gxx
def test_row_slabs_hot_row_over_many_segments():
    """A hot row in each of ten index segments: its finish adds ten partials (eight loads in
    flight, then the rest), in segment order."""
    vocab, n = 37, 600
    idx = _tokens(vocab, n, 4)
    idx[::2] = 5
    value = torch.randn((n, 24), generator=torch.Generator().manual_seed(5))
    fd = _embedding_grad(vocab, [24], torch.float32, 0.0)
    with overriding(SMALL):
        (got,) = run_plan_on_host(fd, [idx, value])
    hot = executor_for(fd).last_plan.spec.kernels[2]
    assert hot.grid[0] == 10
    torch.testing.assert_close(got, _want(idx, value, vocab, 0.0, torch.float32))
