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


def permuted_grad(vocab: int, h: int, fill: float) -> FusionDefinition:
    """Float sums into `fill` of value rows read through a permute of [h, N] (not contiguous:
    one column a thread)."""
    with FusionDefinition() as fd:
        idx = fd.define_tensor(shape=[-1], contiguity=[True], dtype=DataType.Int)
        value = fd.define_tensor(shape=[-1, -1], contiguity=[True, True], dtype=DataType.Float)
        zeros = fd.ops.full([vocab, h], fd.define_scalar(fill), DataType.Float)
        fd.add_output(fd.ops.index_put_accumulate(zeros, idx, fd.ops.permute(value, [1, 0])))
    return fd


def padded_tokens(rest: list[int], dtype: torch.dtype, run: bool = True) -> tuple:
    """(idx, value) of 100 tokens into 301 rows: a padding row of 40 packed tokens (0), a row
    of 9 spread over the warps (42), where `run` a run of 4 in one warp (7); rows of two, of
    one and of none."""
    g = torch.Generator().manual_seed(11)
    idx = torch.randint(0, 301, (100,), generator=g)
    idx[50:90] = 0
    idx[3:100:11] = 42
    if run:
        idx[5:9] = 7
    return idx, torch.randn((100, *rest), generator=g).to(dtype)


OLD_WALK = {"rows.chain": True, "rows.slab_walk": 0, "rows.bound": 0}  # Note [Row chains]'s walk


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
    with overriding({"rows.chain": False}):  # the four kernels, no longer the default
        (got,) = run_plan_on_host(fd, [idx, value])
    assert _plan_names(fd) == ["fc_rows_fill", "fc_rows_claim", "fc_rows_add", "fc_rows_out"]
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(got, _want(idx, value, vocab, 0.25, dtype), rtol=tol, atol=tol)


@needs_gxx
def test_row_sums_of_strided_values_take_one_column_a_thread(monkeypatch):
    """Values read through a permute: rows are not contiguous, so no vectors."""
    monkeypatch.setenv("FUSION_CACHE_DETERMINISTIC", "0")
    vocab, n, h = 11, 16, 8
    fd = permuted_grad(vocab, h, 0.0)
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
    with overriding({"rows.chain": False}):
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
    monkeypatch.setenv("FUSION_CACHE_DETERMINISTIC", "0")
    vocab, n = 37, 90
    g = torch.Generator().manual_seed(3)
    idx = torch.randint(0, vocab, (n,), generator=g)
    idx[:20] = 5
    value = torch.randn((n, *rest), generator=g).to(dtype)
    fd = _embedding_grad(vocab, rest, dtype, 0.25)
    with overriding({**OLD_WALK, "rows.early": True, "rows.units": units}):
        (got,) = run_plan_on_host(fd, [idx, value])
    assert _plan_names(fd) == ["fc_rows_fill", "fc_rows_link", "fc_rows_walk"]
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(got, _want(idx, value, vocab, 0.25, dtype), rtol=tol, atol=tol)


def test_row_chains_compile_for_h100(monkeypatch):
    monkeypatch.setenv("FUSION_CACHE_DETERMINISTIC", "0")
    fd = _embedding_grad(50304, [768], torch.bfloat16, 0.0)
    inputs = [torch.empty(8192, dtype=torch.int64, device="meta"),
              torch.empty(8192, 768, dtype=torch.bfloat16, device="meta")]  # fmt: skip
    with overriding({**OLD_WALK, "rows.early": True, "rows.units": 4}):
        refs = fd.precompile(inputs, target="h100")
    assert [r.name for r in refs] == ["fc_rows_fill", "fc_rows_link", "fc_rows_walk"]
    assert "fc_launch_dependents();" in refs[0].source.split("end prelude")[1]


@needs_gxx
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("rest", [[24], [7], [3, 8]], ids=["vector", "odd", "two_dims"])
def test_bounded_row_chains_against_index_put(dtype, rest, monkeypatch):
    """Note [Row chains] with lists of at most 4 (knob rows.bound): rows of 20 and 9 tokens
    take slots of float sums for their overflow, rows of 4 or fewer do not."""
    monkeypatch.setenv("FUSION_CACHE_DETERMINISTIC", "0")
    vocab, n = 37, 90
    g = torch.Generator().manual_seed(5)
    idx = torch.randint(0, vocab, (n,), generator=g)
    idx[:20] = 5
    idx[30:39] = 36
    idx[50:54] = 2
    value = torch.randn((n, *rest), generator=g).to(dtype)
    fd = _embedding_grad(vocab, rest, dtype, 0.25)
    with overriding({**OLD_WALK, "rows.bound": 4, "rows.units": 2, "rows.warp_adds": False}):
        (got,) = run_plan_on_host(fd, [idx, value])
    assert "at most 4" in executor_for(fd).last_plan.spec.description
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(got, _want(idx, value, vocab, 0.25, dtype), rtol=tol, atol=tol)


def test_bounded_row_chains_compile_for_h100(monkeypatch):
    monkeypatch.setenv("FUSION_CACHE_DETERMINISTIC", "0")
    fd = _embedding_grad(50304, [768], torch.bfloat16, 0.0)
    inputs = [torch.empty(8192, dtype=torch.int64, device="meta"),
              torch.empty(8192, 768, dtype=torch.bfloat16, device="meta")]  # fmt: skip
    with overriding({**OLD_WALK, "rows.bound": 16, "rows.warp_adds": False}):
        refs = fd.precompile(inputs, target="h100")
    assert [r.name for r in refs] == ["fc_rows_fill", "fc_rows_link", "fc_rows_walk"]
    assert "red.global.add.v4.f32" in refs[1].source


SLAB_WALK = {"rows.chain": True, "rows.slab_walk": 2, "rows.kept": False, "rows.split": False}


@needs_gxx
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("rest", [[16], [7], [3, 8]], ids=["vector", "odd", "two_dims"])
@pytest.mark.parametrize("bound", [0, 4])
def test_slab_walk_against_index_put(dtype, rest, bound, monkeypatch):
    """Note [Slab walk] (knob rows.slab_walk): blocks of the whole rows of 512 units (or
    fewer, where rows are odd), the fill stored first to rows no token names;
    a hot row of 20 tokens (with rows.bound 4: a list of 4 and a slot of sums for 16), rows
    of three, of one and of none; repeated ids."""
    monkeypatch.setenv("FUSION_CACHE_DETERMINISTIC", "0")
    vocab, n = 301, 120
    g = torch.Generator().manual_seed(7)
    idx = torch.randint(0, vocab, (n,), generator=g)
    idx[:20] = 150
    idx[30:33] = vocab - 1
    idx[40:42] = 0
    value = torch.randn((n, *rest), generator=g).to(dtype)
    fd = _embedding_grad(vocab, rest, dtype, 0.25)
    with overriding({**SLAB_WALK, "rows.bound": bound}):
        (got,) = run_plan_on_host(fd, [idx, value])
    spec = executor_for(fd).last_plan.spec
    assert _plan_names(fd) == ["fc_rows_fill", "fc_rows_link", "fc_rows_slab_walk"]
    assert spec.kernels[2].grid[0] > 1 and "(2 units a thread)" in spec.description
    assert ("at most 4" in spec.description) == bool(bound)
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(got, _want(idx, value, vocab, 0.25, dtype), rtol=tol, atol=tol)


@needs_gxx
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("rest", [[16], [7], [3, 8], [600]], ids=["vector", "odd", "two_dims", "long"])
@pytest.mark.parametrize("kept", [False, True])
def test_warp_adds_against_index_put(dtype, rest, kept, monkeypatch):
    """Note [Warp adds] (knob rows.warp_adds): tokens past a bound of 2 added a warp at a
    time: a padding row of 40 packed tokens (whole warps on one slot), a row of 9 spread
    over the warps (runs of one), rows of two and of one; rows of 600 floats take two column
    passes of 128 vectors."""
    monkeypatch.setenv("FUSION_CACHE_DETERMINISTIC", "0")
    vocab = 301
    idx, value = padded_tokens(rest, dtype, run=False)
    fd = _embedding_grad(vocab, rest, dtype, 0.25)
    knobs = {**SLAB_WALK, "rows.bound": 2, "rows.warp_adds": True, "rows.kept": kept}
    scratch: list = []
    for _ in range(2 if kept else 1):
        with overriding(knobs):
            (got,) = run_plan_on_host(fd, [idx, value], scratch=scratch)
        assert "__ballot_sync" in executor_for(fd).last_plan.spec.kernels[-2].source
        tol = 1e-5 if dtype == torch.float32 else 2e-2
        torch.testing.assert_close(got, _want(idx, value, vocab, 0.25, dtype), rtol=tol, atol=tol)


@needs_gxx
@pytest.mark.parametrize("bound", [0, 2])
def test_slab_walk_of_long_rows(bound, monkeypatch):
    """Rows of 150 vectors: a lane takes four units of a named row at a time (AH), twice per
    row, three rows a block; lists of five and of one."""
    monkeypatch.setenv("FUSION_CACHE_DETERMINISTIC", "0")
    vocab, n, h = 40, 24, 600
    g = torch.Generator().manual_seed(9)
    idx = torch.randint(0, vocab, (n,), generator=g)
    idx[:5] = 3
    value = torch.randn((n, h), generator=g)
    fd = _embedding_grad(vocab, [h], torch.float32, -1.0)
    with overriding({**SLAB_WALK, "rows.bound": bound}):
        (got,) = run_plan_on_host(fd, [idx, value])
    assert "#define AH 4" in executor_for(fd).last_plan.spec.kernels[2].source
    torch.testing.assert_close(got, _want(idx, value, vocab, -1.0, torch.float32))


@needs_gxx
def test_slab_walk_of_strided_values_and_no_tokens(monkeypatch):
    """Values through a permute (one column a thread, so a block's 512 units are 64 rows of
    8), and an empty index: every row the fill."""
    monkeypatch.setenv("FUSION_CACHE_DETERMINISTIC", "0")
    vocab, n, h = 150, 40, 8
    fd = permuted_grad(vocab, h, 1.5)
    g = torch.Generator().manual_seed(8)
    for count in (n, 0):
        idx = torch.randint(0, vocab, (count,), generator=g)
        value = torch.randn((h, count), generator=g)
        with overriding(SLAB_WALK):
            (got,) = run_plan_on_host(fd, [idx, value])
        assert "64 rows a block (2 units a thread), vw=1" in executor_for(fd).last_plan.spec.description
        torch.testing.assert_close(got, _want(idx, value.t(), vocab, 1.5, torch.float32))


@needs_gxx
def test_slab_walk_out_of_range_index_fails(monkeypatch):
    monkeypatch.setenv("FUSION_CACHE_DETERMINISTIC", "0")
    fd = _embedding_grad(37, [8], torch.float32, 0.0)
    idx = torch.tensor([1, 2, 37, 3])
    with overriding(SLAB_WALK), pytest.raises(RuntimeError, match="fc_rows_link failed on the host"):
        run_plan_on_host(fd, [idx, torch.randn(4, 8)])


@pytest.mark.parametrize("bound", [0, 16])
@pytest.mark.parametrize("units", [4, 8, 16])
def test_slab_walk_compiles_for_h100(units, bound, monkeypatch):
    """The benchmark's gradient: a block of 256 threads takes the units * 256 // 96 whole rows
    of 768 bf16 in `units` 16-byte units a thread, their head (and slot) words in shared memory."""
    monkeypatch.setenv("FUSION_CACHE_DETERMINISTIC", "0")
    fd = _embedding_grad(50304, [768], torch.bfloat16, 0.0)
    inputs = [torch.empty(8192, dtype=torch.int64, device="meta"),
              torch.empty(8192, 768, dtype=torch.bfloat16, device="meta")]  # fmt: skip
    with overriding({"rows.chain": True, "rows.slab_walk": units, "rows.bound": bound,
                     "rows.kept": False}):  # fmt: skip
        refs = fd.precompile(inputs, target="h100")
    assert [r.name for r in refs] == ["fc_rows_fill", "fc_rows_link", "fc_rows_slab_walk"]
    rows = 256 * units // 96
    assert f"#define SR {rows}" in refs[2].source
    assert executor_for(fd).last_plan.spec.kernels[2].grid[0] == -(-50304 // rows)


@needs_gxx
@pytest.mark.parametrize("bound", [0, 3])
def test_slab_walk_with_kept_words_over_runs(bound, monkeypatch):
    """Note [Kept words] (knob rows.kept): no fill kernel; the words start at -1 (the hot
    rows' sums at 0) when the plan's scratch is made, and each run leaves them so: three runs
    on one scratch, with a hot row, then none, then another, each against torch."""
    monkeypatch.setenv("FUSION_CACHE_DETERMINISTIC", "0")
    vocab, n, rest = 301, 120, [16]
    fd = _embedding_grad(vocab, rest, torch.bfloat16, 0.0)
    g = torch.Generator().manual_seed(10)
    scratch: list = []
    for hot in (150, None, 7):
        idx = torch.randint(0, vocab, (n,), generator=g)
        if hot is not None:
            idx[: n // 3] = hot
        value = torch.randn((n, *rest), generator=g).to(torch.bfloat16)
        with overriding({**SLAB_WALK, "rows.bound": bound, "rows.kept": True}):
            (got,) = run_plan_on_host(fd, [idx, value], scratch=scratch)
        spec = executor_for(fd).last_plan.spec
        assert _plan_names(fd) == ["fc_rows_link", "fc_rows_slab_walk"]
        assert "words kept between runs" in spec.description
        torch.testing.assert_close(got, _want(idx, value, vocab, 0.0, torch.bfloat16),
                                   rtol=2e-2, atol=2e-2)  # fmt: skip
        assert bool((scratch[0] == -1).all())
        if bound:
            assert bool((scratch[2] == 0).all())


@needs_gxx
@pytest.mark.parametrize("kept", [False, True])
def test_persistent_slab_walk(kept, monkeypatch):
    """rows.slab_persist = 1: 132 blocks (the h100 profile's SMs) take 3000 slabs of one
    row of 1024 floats in turn, the words of each slab read before the next is loaded."""
    monkeypatch.setenv("FUSION_CACHE_DETERMINISTIC", "0")
    vocab, n, h = 3000, 64, 1024
    g = torch.Generator().manual_seed(12)
    idx = torch.randint(0, vocab, (n,), generator=g)
    idx[:20] = 2999
    value = torch.randn((n, h), generator=g)
    fd = _embedding_grad(vocab, [h], torch.float32, 0.5)
    knobs = {"rows.chain": True, "rows.slab_walk": 1, "rows.slab_persist": 1, "rows.bound": 4,
             "rows.warp_adds": True, "rows.kept": kept}  # fmt: skip
    scratch: list = []
    for _ in range(2):
        with overriding(knobs):
            (got,) = run_plan_on_host(fd, [idx, value], scratch=scratch)
        walk = executor_for(fd).last_plan.spec.kernels[-1]
        assert walk.grid[0] == 132 and "#define SR 1\n" in walk.source
        torch.testing.assert_close(got, _want(idx, value, vocab, 0.5, torch.float32))


@pytest.mark.parametrize("knobs", [{"rows.kept": False}, {"rows.kept": True, "rows.slab_persist": 4},
                                   {"rows.kept": True, "rows.warp_adds": True, "store.hint": 1}],
                         ids=["fill", "persistent_kept", "kept_warp_adds_hint"])  # fmt: skip
def test_slab_walk_variants_compile_for_h100(knobs, monkeypatch):
    """The benchmark's gradient under the sweep's other knobs: kept words drop the fill kernel."""
    monkeypatch.setenv("FUSION_CACHE_DETERMINISTIC", "0")
    fd = _embedding_grad(50304, [768], torch.bfloat16, 0.0)
    inputs = [torch.empty(8192, dtype=torch.int64, device="meta"),
              torch.empty(8192, 768, dtype=torch.bfloat16, device="meta")]  # fmt: skip
    with overriding({"rows.chain": True, "rows.slab_walk": 8, "rows.bound": 16, "rows.split": False,
                     **knobs}):  # fmt: skip
        refs = fd.precompile(inputs, target="h100")
    names = ["fc_rows_link", "fc_rows_slab_walk"]
    assert [r.name for r in refs] == (names if knobs["rows.kept"] else ["fc_rows_fill", *names])
    grid = executor_for(fd).last_plan.spec.kernels[-1].grid[0]
    assert grid == (4 * 132 if "rows.slab_persist" in knobs else -(-50304 // 21))


def test_the_default_is_the_split_walk_with_kept_words(monkeypatch):
    """Note [Split walk]: by default an embedding's gradient is two kernels, the bounded link
    (lists of at most 4; matched places, Note [Matched places]) listing the named rows and the
    tokens past the bound, and the split walk adding those (Note [Walk adds]), its words kept
    between runs (Note [Kept words]: -1, and 0 for the hot rows' sums, when made). rows.split
    False: the slab walk of 8 units a thread, the link adding the hot tokens (Note [Warp adds])."""
    monkeypatch.setenv("FUSION_CACHE_DETERMINISTIC", "0")
    fd = _embedding_grad(50304, [768], torch.bfloat16, 0.0)
    inputs = [torch.empty(8192, dtype=torch.int64, device="meta"),
              torch.empty(8192, 768, dtype=torch.bfloat16, device="meta")]  # fmt: skip
    refs = fd.precompile(inputs, target="h100")
    spec = executor_for(fd).last_plan.spec
    assert [r.name for r in refs] == ["fc_rows_link", "fc_rows_split_walk"]
    assert "at most 4" in spec.description and "hot tokens added in the walk" in spec.description
    assert spec.workspace_fills == (-1, None, 0.0)
    assert "__match_any_sync" in refs[0].source and "fc_launch_dependents();" in refs[0].source
    with overriding({"rows.split": False}):
        refs = fd.precompile(inputs, target="h100")
    spec = executor_for(fd).last_plan.spec
    assert [r.name for r in refs] == ["fc_rows_link", "fc_rows_slab_walk"]
    assert "(8 units a thread)" in spec.description and "fc_red_add_vec<VW>(" in refs[0].source


@needs_gxx
@pytest.mark.parametrize("bound", [0, 4])
def test_fill_first_slab_walk(bound, monkeypatch):
    """Note [Fill first] (knob rows.fill_first): every row the fill first, the named rows'
    sums over it after the barrier; kept words over two runs, odd rows spanning blocks."""
    monkeypatch.setenv("FUSION_CACHE_DETERMINISTIC", "0")
    vocab, n, rest = 301, 120, [7]
    g = torch.Generator().manual_seed(13)
    idx = torch.randint(0, vocab, (n,), generator=g)
    idx[:30] = 77
    value = torch.randn((n, *rest), generator=g)
    fd = _embedding_grad(vocab, rest, torch.float32, 0.25)
    scratch: list = []
    for _ in range(2):
        with overriding({"rows.slab_walk": 2, "rows.bound": bound, "rows.fill_first": True}):
            (got,) = run_plan_on_host(fd, [idx, value], scratch=scratch)
        walk = executor_for(fd).last_plan.spec.kernels[-1].source
        assert "if (hs[row - r0] < 0)" not in walk
        assert walk.index("every row the fill") < walk.index("fc_wait_prior_grid();\n  if (")
        torch.testing.assert_close(got, _want(idx, value, vocab, 0.25, torch.float32))


@needs_gxx
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("rest", [[16], [7], [600]], ids=["vector", "odd", "long"])
@pytest.mark.parametrize("bound", [2, 4, 16])
def test_matched_places_against_index_put(dtype, rest, bound, monkeypatch):
    """Note [Matched places] (knob rows.link_match): a warp's lanes naming one row take their
    places with one atomic: a padding row of 40 packed tokens (whole warps on one row, one
    lane of each waiting for the slot), a row of 9 spread over the warps, a run of 4 in one
    warp, rows of two and of one; a last warp of 4 lanes; kept words over two runs."""
    monkeypatch.setenv("FUSION_CACHE_DETERMINISTIC", "0")
    vocab = 301
    idx, value = padded_tokens(rest, dtype)
    fd = _embedding_grad(vocab, rest, dtype, 0.25)
    knobs = {**SLAB_WALK, "rows.bound": bound, "rows.kept": True, "rows.link_match": True}
    scratch: list = []
    for _ in range(2):
        with overriding(knobs):
            (got,) = run_plan_on_host(fd, [idx, value], scratch=scratch)
        assert "__match_any_sync" in executor_for(fd).last_plan.spec.kernels[-2].source
        tol = 1e-5 if dtype == torch.float32 else 2e-2
        torch.testing.assert_close(got, _want(idx, value, vocab, 0.25, dtype), rtol=tol, atol=tol)
    assert bool((scratch[0] == -1).all()) and bool((scratch[2] == 0).all())


@needs_gxx
def test_matched_places_out_of_range_index_fails(monkeypatch):
    monkeypatch.setenv("FUSION_CACHE_DETERMINISTIC", "0")
    fd = _embedding_grad(37, [8], torch.float32, 0.0)
    idx = torch.tensor([1, 2, 37, 3])
    with overriding({**SLAB_WALK, "rows.bound": 4, "rows.link_match": True}), \
            pytest.raises(RuntimeError, match="fc_rows_link failed on the host"):  # fmt: skip
        run_plan_on_host(fd, [idx, torch.randn(4, 8)])


def _in_token_order(idx, value, vocab, fill):
    """Each row: the fill, then its tokens' values added in float in ascending token order."""
    want = torch.full((vocab, *value.shape[1:]), fill, dtype=torch.float32)
    for t in range(idx.shape[0]):
        want[idx[t]] += value[t].float()
    return want


@needs_gxx
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("matched", [False, True])
def test_sorted_lists_sum_in_token_order(dtype, matched, monkeypatch):
    """Note [Sorted lists] (knob rows.sorted): every row of at most `bound` tokens is the
    fill plus its tokens' values in token order, bit for bit, whatever order the link's
    atomics gave its list (here a stack: the reverse), values over six decades so that the
    order shows; rows of 600 floats take two column passes; kept words over two runs."""
    monkeypatch.setenv("FUSION_CACHE_DETERMINISTIC", "0")
    vocab, n, h = 50, 200, 600
    g = torch.Generator().manual_seed(3)
    idx = torch.randint(0, vocab, (n,), generator=g)
    value = (torch.randn((n, h), generator=g) * torch.logspace(-3, 3, n).unsqueeze(1)).to(dtype)
    fd = _embedding_grad(vocab, [h], dtype, 0.25)
    want = _in_token_order(idx, value, vocab, 0.25).to(dtype)
    knobs = {**SLAB_WALK, "rows.bound": 32, "rows.kept": True, "rows.link_match": matched}
    assert int(torch.bincount(idx).max()) <= 32
    scratch: list = []
    for _ in range(2):
        with overriding({**knobs, "rows.sorted": True}):
            (got,) = run_plan_on_host(fd, [idx, value], scratch=scratch)
        assert "order[warp][rank]" in executor_for(fd).last_plan.spec.kernels[-1].source
        assert torch.equal(got, want)
    if dtype == torch.float32:  # list order: not the same bits (bf16's rounding may hide it)
        with overriding(knobs):
            (got,) = run_plan_on_host(fd, [idx, value])
        assert not torch.equal(got, want)


@needs_gxx
def test_sorted_lists_with_a_hot_row(monkeypatch):
    """rows.sorted with rows.bound 4: a padding row of 40 tokens adds its list of 4 in token
    order and its slot of sums; rows of one, two, none; out-of-range ids still fail."""
    monkeypatch.setenv("FUSION_CACHE_DETERMINISTIC", "0")
    vocab, n, rest = 301, 100, [24]
    g = torch.Generator().manual_seed(5)
    idx = torch.randint(0, vocab, (n,), generator=g)
    idx[50:90] = 0
    value = torch.randn((n, *rest), generator=g)
    fd = _embedding_grad(vocab, rest, torch.float32, 0.25)
    knobs = {**SLAB_WALK, "rows.bound": 4, "rows.sorted": True, "rows.fill_first": True}
    with overriding(knobs):
        (got,) = run_plan_on_host(fd, [idx, value])
    torch.testing.assert_close(got, _want(idx, value, vocab, 0.25, torch.float32))
    with overriding(knobs), pytest.raises(RuntimeError, match="failed on the host"):
        run_plan_on_host(fd, [torch.tensor([1, 2, 301, 3]), torch.randn(4, 24)])


def test_sorted_lists_need_a_bound_of_at_most_32(monkeypatch):
    """Unbounded lists (or bounds past a warp) walk in list order: the sort holds 32 tokens."""
    monkeypatch.setenv("FUSION_CACHE_DETERMINISTIC", "0")
    fd = _embedding_grad(50304, [768], torch.bfloat16, 0.0)
    inputs = [torch.empty(8192, dtype=torch.int64, device="meta"),
              torch.empty(8192, 768, dtype=torch.bfloat16, device="meta")]  # fmt: skip
    for bound, sorted_ in ((0, False), (64, False), (32, True), (16, True)):
        with overriding({"rows.bound": bound, "rows.sorted": True}):
            refs = fd.precompile(inputs, target="h100")
        assert ("order[warp][rank]" in refs[-1].source) == sorted_
