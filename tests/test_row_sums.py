"""The row-sums kernels of an accumulate into a constant fill (Note [Row sums],
schedulers/row_sums.py): planned for h100 (NVRTC compiles them), run on the host by g++
(tests/host_kernels.py) against torch's index_put, with rows named by many tokens, by one,
by none; rows that are contiguous (vector columns) or not (one column a thread); and the
deterministic switch taking the ordered kernel instead."""
from __future__ import annotations

import pytest
import torch
from host_kernels import HAVE_GXX, run_plan_on_host

from fusion_cache import DataType, FusionDefinition
from fusion_cache.runtime.executor import executor_for

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


@needs_gxx
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("rest", [[24], [7], [3, 8]], ids=["vector", "odd", "two_dims"])
def test_row_sums_against_index_put(dtype, rest, monkeypatch):
    monkeypatch.setenv("FUSION_CACHE_DETERMINISTIC", "0")
    vocab, n = 37, 90
    g = torch.Generator().manual_seed(1)
    idx = torch.randint(0, vocab, (n,), generator=g)
    idx[:20] = 5  # a hot row; others by one token or by none
    idx[20:23] = 36
    value = torch.randn((n, *rest), generator=g).to(dtype)
    fd = _embedding_grad(vocab, rest, dtype, 0.25)
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
    """NVRTC (ptxas) accepts red.global.add.v4.f32 for sm_90; 16-byte rows of bf16."""
    monkeypatch.setenv("FUSION_CACHE_DETERMINISTIC", "0")
    fd = _embedding_grad(50304, [768], torch.bfloat16, 0.0)
    inputs = [torch.empty(8192, dtype=torch.int64, device="meta"),
              torch.empty(8192, 768, dtype=torch.bfloat16, device="meta")]  # fmt: skip
    refs = fd.precompile(inputs, target="h100")
    assert [r.name for r in refs] == ["fc_rows_fill", "fc_rows_claim", "fc_rows_add",
                                      "fc_rows_out"]  # fmt: skip
    add = next(r for r in refs if r.name == "fc_rows_add")
    assert "red.global.add.v4.f32" in add.source
    assert "vw=8" in executor_for(fd).last_plan.spec.description


@needs_gxx
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("rest", [[24], [7], [3, 8]], ids=["vector", "odd", "two_dims"])
@pytest.mark.parametrize("units", [1, 3])
def test_row_chains_against_index_put(dtype, rest, units, monkeypatch):
    """Note [Row chains] (knob rows.chain, with the early dependents' trigger): a hot row's list
    of 20, rows of one token and of none."""
    from schedulers.tuning import overriding

    monkeypatch.setenv("FUSION_CACHE_DETERMINISTIC", "0")
    vocab, n = 37, 90
    g = torch.Generator().manual_seed(3)
    idx = torch.randint(0, vocab, (n,), generator=g)
    idx[:20] = 5
    value = torch.randn((n, *rest), generator=g).to(dtype)
    fd = _embedding_grad(vocab, rest, dtype, 0.25)
    with overriding({"rows.chain": True, "rows.early": True, "rows.units": units}):
        (got,) = run_plan_on_host(fd, [idx, value])
    assert _plan_names(fd) == ["fc_rows_fill", "fc_rows_link", "fc_rows_walk"]
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(got, _want(idx, value, vocab, 0.25, dtype), rtol=tol, atol=tol)


def test_row_chains_compile_for_h100(monkeypatch):
    from schedulers.tuning import overriding

    monkeypatch.setenv("FUSION_CACHE_DETERMINISTIC", "0")
    fd = _embedding_grad(50304, [768], torch.bfloat16, 0.0)
    inputs = [torch.empty(8192, dtype=torch.int64, device="meta"),
              torch.empty(8192, 768, dtype=torch.bfloat16, device="meta")]  # fmt: skip
    with overriding({"rows.chain": True, "rows.early": True, "rows.units": 4}):
        refs = fd.precompile(inputs, target="h100")
    assert [r.name for r in refs] == ["fc_rows_fill", "fc_rows_link", "fc_rows_walk"]
    assert "fc_launch_dependents();" in refs[0].source.split("end prelude")[1]


@needs_gxx
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("rest", [[24], [7], [3, 8]], ids=["vector", "odd", "two_dims"])
def test_bounded_row_chains_against_index_put(dtype, rest, monkeypatch):
    """Note [Row chains] with lists of at most 4 (knob rows.bound): rows of 20 and 9 tokens
    take slots of float sums for their overflow, rows of 4 or fewer do not."""
    from schedulers.tuning import overriding

    monkeypatch.setenv("FUSION_CACHE_DETERMINISTIC", "0")
    vocab, n = 37, 90
    g = torch.Generator().manual_seed(5)
    idx = torch.randint(0, vocab, (n,), generator=g)
    idx[:20] = 5
    idx[30:39] = 36
    idx[50:54] = 2
    value = torch.randn((n, *rest), generator=g).to(dtype)
    fd = _embedding_grad(vocab, rest, dtype, 0.25)
    with overriding({"rows.chain": True, "rows.bound": 4, "rows.units": 2}):
        (got,) = run_plan_on_host(fd, [idx, value])
    assert "at most 4" in executor_for(fd).last_plan.spec.description
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(got, _want(idx, value, vocab, 0.25, dtype), rtol=tol, atol=tol)


def test_bounded_row_chains_compile_for_h100(monkeypatch):
    from schedulers.tuning import overriding

    monkeypatch.setenv("FUSION_CACHE_DETERMINISTIC", "0")
    fd = _embedding_grad(50304, [768], torch.bfloat16, 0.0)
    inputs = [torch.empty(8192, dtype=torch.int64, device="meta"),
              torch.empty(8192, 768, dtype=torch.bfloat16, device="meta")]  # fmt: skip
    with overriding({"rows.chain": True, "rows.bound": 16}):
        refs = fd.precompile(inputs, target="h100")
    assert [r.name for r in refs] == ["fc_rows_fill", "fc_rows_link", "fc_rows_walk"]
    assert "red.global.add.v4.f32" in refs[1].source
