"""Without a GPU: resize and indexing ops and the patterns built from them (RoPE forward and
backward, a KV cache's pad + cat, cross-entropy forward and backward, embedding forward and
backward, cat of three, pad) take generated kernels for h100 with fallback disabled (the
conftest disables it), in the number of kernels asserted here; no segment runs on the
reference evaluator. The kernels themselves, compiled by g++ and run on the host
(tests/host_kernels.py), compute what torch does, for every dtype, odd sizes, symbolic
bounds, negative indices and non-contiguous inputs."""
from __future__ import annotations

import random
import re

import pytest
import torch
from host_kernels import HAVE_GXX, run_plan_on_host
from resize_patterns import PATTERNS, define

from benchmarks.resize_cases import RESIZE
from fusion_cache import DataType, FusionDefinition
from fusion_cache.frontend.dtypes import from_torch
from fusion_cache.runtime.executor import executor_for
from fusion_cache.runtime.plans import LaunchPlan

needs_gxx = pytest.mark.skipif(not HAVE_GXX, reason="no g++ to run kernels on the host")
DATA = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int32, torch.int64,
        torch.bool]  # fmt: skip


def rand(shape, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    if dtype == torch.bool:
        return torch.randint(0, 2, shape, generator=g).bool()
    if not dtype.is_floating_point:
        return torch.randint(-50, 50, shape, generator=g).to(dtype)
    return torch.randn(shape, generator=g).to(dtype)


def launches(fd, inputs) -> list:
    """The kernels a run of `fd` on `inputs` launches, planned for h100 without running; no
    segment may be left to the reference evaluator."""
    fd.precompile(inputs, target="h100")
    plan = executor_for(fd).last_plan
    if isinstance(plan, LaunchPlan):
        return list(plan.spec.kernels)
    out = []
    for seg in plan.segments:
        assert seg.scheduler is not None, f"a segment runs on the reference evaluator: {plan.description}"
        ex = executor_for(seg.definition)
        out += list(ex.last_plan.spec.kernels)
    return out


def close(got, want, dtype):
    tol = {torch.float16: 2e-2, torch.bfloat16: 3e-2, torch.float32: 1e-5, torch.float64: 1e-9}
    t = tol.get(dtype, 0)
    torch.testing.assert_close(got, want, rtol=t, atol=t)


# ---- patterns ------------------------------------------------------------------------------

# launches a run takes, where it is not the pattern's (resize_patterns.py)
KERNELS: dict = {}


@needs_gxx
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("name", sorted(PATTERNS))
def test_pattern_kernels_and_values(name, dtype):
    pattern = PATTERNS[name]
    fd = define(pattern, dtype)
    inputs = pattern.make(dtype, "cpu", pattern.shape)
    ran: list = []
    got = run_plan_on_host(fd, inputs, ran)
    assert len(ran) == KERNELS.get((name, dtype), pattern.kernels), [k.name for k in ran]
    want = pattern.reference(*inputs)
    for g, w in zip(got, want if isinstance(want, list) else [want]):
        close(g, w, dtype)


@pytest.mark.parametrize("name", sorted(PATTERNS))
def test_patterns_precompile_at_benchmark_sizes(name):
    """The benchmark shapes plan (meta tensors) as the small ones do."""
    pattern = PATTERNS[name]
    inputs = pattern.make(torch.bfloat16, "meta", pattern.big)
    assert len(launches(define(pattern, torch.bfloat16), inputs)) == KERNELS.get(
        (name, torch.bfloat16), pattern.kernels)


def test_rope_reads_with_vector_loads():
    """Slices at half the head dim are whole vectors: no element-wise predicated loads."""
    pattern = PATTERNS["rope_fwd"]
    fd = define(pattern, torch.bfloat16)
    (kernel,) = launches(fd, pattern.make(torch.bfloat16, "meta", (8, 32, 2048, 128)))
    desc = executor_for(fd).last_plan.spec.description
    assert "loads=vec,vec,vec,vec,vec " in desc and "~" not in desc, desc


def test_embedding_reads_rows_with_vector_loads():
    pattern = PATTERNS["embedding_fwd"]
    fd = define(pattern, torch.bfloat16)
    launches(fd, pattern.make(torch.bfloat16, "meta", (50304, 768, 8, 1024)))
    desc = executor_for(fd).last_plan.spec.description
    assert "loads=bcast,vgather" in desc and "vec=8" in desc, desc


# ---- cross-entropy: Note [Online row softmax] -----------------------------------------------


def _body(source: str) -> str:
    """A kernel's source past its prelude."""
    return source.split("// ---- end prelude ----", 1)[1]


def _ce(dtype, n: int, v: int):
    pattern = PATTERNS["ce_fwd"]
    with FusionDefinition() as fd:
        RESIZE["ce_fwd"][0](fd, dtype, (n, v))
    return fd, pattern


@needs_gxx
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("v", [37, 1000, 4099])
@pytest.mark.parametrize("cached", [True, False], ids=["registers", "reread"])
def test_cross_entropy_flushed_softmax_terms_on_the_host(dtype, v, cached):
    """The sum's exps are flushed below 2^-126 and read x*log2(e) - m*log2(e) (Note [Flushed
    softmax terms]), from registers or from memory, on rows of one block (host runs have no
    clusters): odd rows, half a row -inf (a masked vocabulary), a label on a masked value
    (an infinite loss)."""
    from schedulers.tuning import overriding

    n = 5
    fd, pattern = _ce(dtype, n, v)
    torch.manual_seed(v)
    logits, labels = pattern.make(dtype, "cpu", (n, v))
    logits[0, : v // 2] = float("-inf")
    labels[1] = 0
    logits[1, 0] = float("-inf")
    ran: list = []
    with overriding({"inner.cluster": 1, "inner.cache": cached}):
        got = run_plan_on_host(fd, [logits, labels], ran)
    assert [k.name for k in ran] == ["fc_inner_reduction"]
    desc = executor_for(fd).last_plan.spec.description
    assert ("uncached" in desc) != cached, desc
    body = _body(ran[0].source)
    assert body.count("fc_exp2_flushed(fmaf(") == 1 and "exp2f(" not in body, body
    for g, w in zip(got, pattern.reference(logits, labels)):
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-5)


def test_cross_entropy_forward_for_h100_is_one_clustered_kernel():
    """At the benchmark's size ([8192, 50304] bf16) the rows split over clusters of 4 blocks
    whose threads keep 64 values each, a block a row."""
    fd, pattern = _ce(torch.bfloat16, 8192, 50304)
    (kernel,) = launches(fd, pattern.make(torch.bfloat16, "meta", (8192, 50304)))
    desc = executor_for(fd).last_plan.spec.description
    assert "clusters of 4" in desc and "iters 8" in desc and "224x1 threads" in desc, desc
    assert kernel.grid[0] == 8192 * 4
    body = _body(kernel.source)
    assert body.count("fc_cluster_reduce") == 2 and "fc_bf16_at(a2_c[it], j)" in body, body


def test_softmax_output_keeps_exact_exps():
    """Softmax carries its exps from the sum's pass to its output's: those keep exp2f."""
    with FusionDefinition() as fd:
        x = fd.define_tensor(shape=[-1, -1], contiguity=True, dtype=DataType.BFloat16)
        xf = fd.ops.cast(x, DataType.Float)
        m = fd.ops.broadcast_in_dim(fd.ops.max(xf, [1]), [64, 4096], [0])
        e = fd.ops.exp(fd.ops.sub(xf, m))
        s = fd.ops.broadcast_in_dim(fd.ops.sum(e, [1]), [64, 4096], [0])
        fd.add_output(fd.ops.cast(fd.ops.div(e, s), DataType.BFloat16))
    (kernel,) = launches(fd, [torch.empty(64, 4096, dtype=torch.bfloat16, device="meta")])
    body = _body(kernel.source)
    assert "exp2f(" in body and "fc_exp2_flushed" not in body, body


def test_cross_entropy_backward_is_one_kernel_storing_each_value_rounded_once():
    """The gradient cast down to bf16 is stored from its float, not rounded a second time."""
    with FusionDefinition() as fd:
        RESIZE["ce_bwd"][0](fd, torch.bfloat16, (8192, 50304))
    inputs = RESIZE["ce_bwd"][2]((8192, 50304), torch.bfloat16, "meta")
    (kernel,) = launches(fd, inputs)
    assert kernel.name == "fc_pointwise"
    (stored,) = re.findall(r"o0_v\[j\] = fc_to_bf16\((v\d+)\);", kernel.source)
    assert f"fc_to_float(fc_to_bf16({stored}))" in kernel.source


# ---- every op, every dtype -------------------------------------------------------------------


def _all_ops(fd, x, x3, i1, i2, s, rows=5, cols=8):
    """Outputs of one shape [rows, cols], so one kernel holds them all."""
    r, c = rows, cols
    return [fd.ops.pad(fd.ops.slice(x, [1, 0], [r, c]), [0, 0, 1, 0]),
            fd.ops.cat([fd.ops.slice(x, [0, c - 3], [r, c]), fd.ops.slice(x, [0, 0], [r, c - 3])], 1),
            fd.ops.triu(x, 1), fd.ops.index_select(x, i1, 1), fd.ops.take_along_axis(x, i2, 1),
            fd.ops.gather(x, i2, 1), fd.ops.select(x3, s, 0),
            fd.ops.pad(fd.ops.slice(x, [0, -(c - 1)], [r - 1, c], [1, 2]), [0, c - c // 2, 0, 1],
                       fd.define_scalar(1)),
            fd.ops.slice(fd.ops.cat([x, fd.ops.select(x3, s, 1)], 0), [0, 0], [r, c])]  # fmt: skip


@needs_gxx
@pytest.mark.parametrize("dtype", DATA, ids=str)
def test_every_op_in_one_kernel_for_every_dtype(dtype):
    x, x3 = rand((5, 8), dtype), rand((3, 5, 8), dtype, 1)
    i1, i2 = torch.randint(0, 8, (8,)), torch.randint(0, 8, (5, 8))
    inputs = [x, x3, i1, i2, -2]
    with FusionDefinition() as fd:
        vals = [fd.from_pytorch(x), fd.from_pytorch(x3), fd.from_pytorch(i1), fd.from_pytorch(i2),
                fd.define_scalar(dtype=DataType.Int)]  # fmt: skip
        for out in _all_ops(fd, *vals):
            fd.add_output(out)
    ran: list = []
    got = run_plan_on_host(fd, inputs, ran)
    assert len(ran) == 1
    for g, w in zip(got, fd.execute(inputs)):
        torch.testing.assert_close(g, w, rtol=0, atol=0)



@needs_gxx
@pytest.mark.parametrize("unroll", [2, 4])
def test_gathers_ahead_with_several_vectors_a_thread(unroll):
    """Note [Gathers ahead] (codegen/pointwise_cuda.py): an embedding and every op together,
    their vector gathers issued for all of a thread's vectors first, against torch."""
    from schedulers.tuning import overriding

    pattern = PATTERNS["embedding_fwd"]
    with overriding({"pointwise.unroll": unroll}):
        fd = define(pattern, torch.bfloat16)
        for shape in [pattern.shape, (37, 24, 7, 11)]:
            inputs = pattern.make(torch.bfloat16, "cpu", shape)
            ran: list = []
            (got,) = run_plan_on_host(fd, inputs, ran)
            assert "const int j = 0;" in ran[0].source and "vgather" in (
                executor_for(fd).last_plan.spec.description)  # fmt: skip
            torch.testing.assert_close(got, pattern.reference(*inputs), rtol=0, atol=0)
        x, x3 = rand((5, 8)), rand((3, 5, 8), seed=1)
        i1, i2 = torch.randint(0, 8, (8,)), torch.randint(0, 8, (5, 8))
        inputs = [x, x3, i1, i2, -2]
        with FusionDefinition() as fd:
            vals = [fd.from_pytorch(x), fd.from_pytorch(x3), fd.from_pytorch(i1),
                    fd.from_pytorch(i2), fd.define_scalar(dtype=DataType.Int)]  # fmt: skip
            for out in _all_ops(fd, *vals):
                fd.add_output(out)
        got = run_plan_on_host(fd, inputs)
    for g, w in zip(got, fd.execute(inputs)):
        torch.testing.assert_close(g, w, rtol=0, atol=0)


@needs_gxx
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int32, torch.bool], ids=str)
@pytest.mark.parametrize("deterministic", [False, True], ids=["atomic", "deterministic"])
def test_scatter_and_index_put_accumulate(dtype, deterministic, monkeypatch):
    monkeypatch.setenv("FUSION_CACHE_DETERMINISTIC", "1" if deterministic else "0")
    acc, value = rand((13, 3, 5), dtype), rand((70, 3, 5), dtype, 1)
    idx = torch.randint(0, 13, (70,), generator=torch.Generator().manual_seed(2))
    with FusionDefinition() as fd:
        fd.add_output(fd.ops.index_put_accumulate(fd.from_pytorch(acc), fd.from_pytorch(idx),
                                                  fd.from_pytorch(value)))  # fmt: skip
    ran: list = []
    (got,) = run_plan_on_host(fd, [acc, idx, value], ran)
    assert len(ran) == 2
    want = acc.index_put((idx,), value, accumulate=True)
    if dtype == torch.bfloat16:  # float sums, rounded once (Note [16-bit accumulation])
        want = acc.float().index_put((idx,), value.float(), accumulate=True).to(dtype)
    close(got, want, dtype)
    x, src = rand((6, 9), dtype), rand((5, 9), dtype, 3)
    index = torch.randint(0, 6, (4, 9), generator=torch.Generator().manual_seed(4))
    with FusionDefinition() as fd:
        fd.add_output(fd.ops.scatter(fd.from_pytorch(x), fd.from_pytorch(index),
                                     fd.from_pytorch(src), 0))  # fmt: skip
    ran = []
    (got,) = run_plan_on_host(fd, [x, index, src], ran)
    assert len(ran) == (4 if deterministic else 2)
    if deterministic:  # the last index wins, as torch does on the CPU
        torch.testing.assert_close(got, torch.scatter(x, 0, index, src), rtol=0, atol=0)
    else:  # which of repeated targets lands is unspecified: each element is one candidate
        want = torch.scatter(x, 0, index, src)
        hit = torch.zeros_like(x, dtype=torch.bool).scatter(0, index, True)
        torch.testing.assert_close(got[~hit], x[~hit], rtol=0, atol=0)
        for r, c in hit.nonzero().tolist():
            cands = [src[k, c] for k in range(4) if index[k, c] == r]
            assert any(torch.equal(got[r, c], v) for v in cands), (r, c)
        del want


def test_deterministic_scatter_of_computed_operands_splits_them_off(monkeypatch):
    """The deterministic kernels read index and source from memory: the work computing them
    gets a kernel of its own (the segmenter), still none on the reference evaluator."""
    monkeypatch.setenv("FUSION_CACHE_DETERMINISTIC", "1")
    with FusionDefinition() as fd:
        acc = fd.define_tensor(shape=[-1, -1], contiguity=True)
        idx = fd.define_tensor(shape=[-1], contiguity=True, dtype=DataType.Int)
        value = fd.define_tensor(shape=[-1, -1], contiguity=True)
        fd.add_output(fd.ops.index_put_accumulate(acc, idx, fd.ops.mul(value, 2.0)))
    meta = [torch.empty(7, 4, device="meta"), torch.empty(9, dtype=torch.int64, device="meta"),
            torch.empty(9, 4, device="meta")]  # fmt: skip
    names = [k.name for k in launches(fd, meta)]
    assert names == ["fc_pointwise", "fc_pointwise", "fc_accumulate_ordered"], names


# ---- bounds, indices and layouts ------------------------------------------------------------


@needs_gxx
def test_symbolic_and_vector_bounds_normalize_at_run_time():
    x = rand((7, 12))
    with FusionDefinition() as fd:
        t = fd.define_tensor(shape=[-1, -1], contiguity=True)
        a = fd.define_scalar(dtype=DataType.Int)
        starts = fd.define_vector(2)
        fd.add_output(fd.ops.slice(t, starts, [7, fd.ops.sub(fd.ops.size(t, 1), a)]))
    for start, stop in [([1, 2], 3), ([-5, -100], -1), ([0, 0], 0), ([2, 11], 1)]:
        (got,) = run_plan_on_host(fd, [x, stop, start])
        torch.testing.assert_close(got, x[start[0]:7, start[1]:12 - stop], rtol=0, atol=0)


@needs_gxx
def test_non_contiguous_and_broadcast_inputs():
    base = rand((9, 14))
    x = base.t()[2:12:2]  # [5, 9], strides (2, 14), offset
    row = rand((1, 9), seed=1).expand(5, 9)
    idx = torch.randint(0, 9, (10, 5)).t()  # [5, 10] transposed
    with FusionDefinition() as fd:
        t = fd.define_tensor(shape=[-1, -1], contiguity=[False, False])
        r = fd.define_tensor(shape=[1, -1], contiguity=[None, True])
        i = fd.define_tensor(shape=[-1, -1], contiguity=[False, False], dtype=DataType.Int)
        both = fd.ops.add(t, r)
        fd.add_output(fd.ops.cat([fd.ops.slice(both, [0, 1], [5, 9]), fd.ops.pad(t, [0, -8])], 1))
        fd.add_output(fd.ops.take_along_axis(both, fd.ops.slice(i, [0, 0], [5, 9]), 1))
    got = run_plan_on_host(fd, [x, row[:1], idx])
    for g, w in zip(got, fd.execute([x, row[:1], idx])):
        torch.testing.assert_close(g, w, rtol=0, atol=0)


@needs_gxx
def test_iota_triu_causal_mask_and_runtime_reshape():
    x = rand((6, 6))
    with FusionDefinition() as fd:
        t = fd.define_tensor(shape=[-1, -1], contiguity=True)
        shape = fd.define_vector(2)
        n = fd.ops.size(t, 0)
        rows = fd.ops.broadcast_in_dim(fd.ops.iota(n, dtype=DataType.Int), [n, n], [0])
        cols = fd.ops.broadcast_in_dim(fd.ops.iota(n, fd.define_scalar(1), fd.define_scalar(1),
                                                   DataType.Float), [n, n], [1])  # fmt: skip
        masked = fd.ops.where(fd.ops.ge(rows, cols), t, fd.define_scalar(float("-inf")))
        fd.add_output(fd.ops.reshape(fd.ops.add(fd.ops.triu(masked, -1), cols), shape))
    (got,) = run_plan_on_host(fd, [x, [4, 9]])
    torch.testing.assert_close(got, fd.execute([x, [4, 9]])[0], rtol=0, atol=0)
    (got,) = run_plan_on_host(fd, [x, [36, 1]])
    torch.testing.assert_close(got, fd.execute([x, [36, 1]])[0], rtol=0, atol=0)


@needs_gxx
def test_index_tensors_of_every_kind():
    """int32, int64, float (truncated) and 0-dim indices."""
    x = rand((6, 5))
    for index in (torch.tensor([5, 0, 2]), torch.tensor([1, 4], dtype=torch.int32),
                  torch.tensor([2.7, 0.2, 5.9]), torch.tensor(3)):  # fmt: skip
        with FusionDefinition() as fd:
            fd.add_output(fd.ops.index_select(fd.from_pytorch(x), fd.from_pytorch(index), 0))
        (got,) = run_plan_on_host(fd, [x, index])
        torch.testing.assert_close(got, torch.index_select(x, 0, index.long().reshape(-1)))


@needs_gxx
def test_out_of_range_index_stops_the_kernel():
    """A device-side assert on the GPU; here the host run reports it."""
    x = rand((6, 5))
    with FusionDefinition() as fd:
        fd.add_output(fd.ops.index_select(fd.define_tensor(shape=[-1, -1], contiguity=True),
                                          fd.define_tensor(shape=[-1], contiguity=True,
                                                           dtype=DataType.Int), 0))  # fmt: skip
    with pytest.raises(RuntimeError, match="failed on the host"):
        run_plan_on_host(fd, [x, torch.tensor([1, 6])])
    with pytest.raises(RuntimeError, match="failed on the host"):
        run_plan_on_host(fd, [x, torch.tensor([-1, 2])])


# ---- the reduction scheduler's prologues and epilogues -------------------------------------


def _sum_slice(fd, x, _):
    fd.add_output(fd.ops.sum(fd.ops.slice(x, [2, 3], [30, -3]), [1]))


def _softmax_cat(fd, x, y):
    c = fd.ops.cat([x, y], 1)
    m = fd.ops.max(c, [1])
    e = fd.ops.exp(fd.ops.sub(c, fd.ops.broadcast(m, [False, True])))
    fd.add_output(fd.ops.div(e, fd.ops.broadcast(fd.ops.sum(e, [1]), [False, True])))


def _padded_rows(fd, x, _):
    p = fd.ops.pad(x, [0, 0, 2, 3], fd.define_scalar(1.0))
    fd.add_output(fd.ops.sum(fd.ops.mul(p, p), [1]))


def _gathered_sum(fd, x, y):
    index = fd.ops.cast(fd.ops.mul(fd.ops.abs(y), 10.0), DataType.Int)
    fd.add_output(fd.ops.sum(fd.ops.gather(x, fd.ops.slice(index, [0, 0], [37, 15]), 1), [1]))


def _first_above(fd, x, _):
    n, v = fd.ops.tensor_sizes(x)
    cols = fd.ops.broadcast_in_dim(fd.ops.iota(v, dtype=DataType.Float), [n, v], [1])
    fd.add_output(fd.ops.min(fd.ops.where(fd.ops.gt(x, 1.0), cols, fd.define_scalar(1e9)), [1]))


REDUCTIONS = {"sum_slice": _sum_slice, "softmax_cat": _softmax_cat, "padded_rows": _padded_rows,
              "gathered_sum": _gathered_sum, "first_above": _first_above}  # fmt: skip


@needs_gxx
@pytest.mark.parametrize("name", sorted(REDUCTIONS))
def test_reductions_read_through_resize_ops_in_one_kernel(name):
    x, y = rand((37, 53)), rand((37, 20), seed=1)
    with FusionDefinition() as fd:
        REDUCTIONS[name](fd, fd.from_pytorch(x), fd.from_pytorch(y))
    ran: list = []
    got = run_plan_on_host(fd, [x, y], ran)
    assert [k.name for k in ran] == ["fc_inner_reduction"]
    for g, w in zip(got, fd.execute([x, y])):
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-5)


def _thunder_cross_entropy(fd, n, v):
    """Thunder's cross-entropy fusion (labels shifted by a pad and a slice, a float index
    from a `where`, the mean over rows kept), as nvFuser received it."""
    logits = fd.define_tensor(shape=[1, -1, -1], contiguity=[None, True, True], dtype=DataType.BFloat16)
    labels = fd.define_tensor(shape=[1, -1], contiguity=[None, True], dtype=DataType.Int)
    x = fd.ops.reshape(fd.ops.cast(logits, DataType.Float), new_shape=[n, v])
    shifted = fd.ops.slice(fd.ops.pad(labels, [0, 1, 0, 0], fd.define_scalar(-100)), [0, 1], [1, n + 1],
                           [1, 1], manual_normalization=0)  # fmt: skip
    t = fd.ops.reshape(shifted, new_shape=[n])
    keep = fd.ops.ne(t, fd.define_scalar(-100))
    zero = fd.define_scalar(0.0, dtype=DataType.Float)
    rows = fd.ops.at(fd.ops.shape(t), index=-1)
    index = fd.ops.broadcast_in_dim(fd.ops.where(keep, t, zero), shape=[rows, 1], broadcast_dims=[0])
    picked = fd.ops.reshape(fd.ops.take_along_axis(x, index, dim=1), new_shape=[rows])
    m = fd.ops.max(x, dims=[1])
    lse = fd.ops.log(fd.ops.sum(fd.ops.exp(fd.ops.sub(x, fd.ops.broadcast_in_dim(m, [rows, 1], [0]))), [1]))
    loss = fd.ops.where(keep, fd.ops.neg(fd.ops.sub(fd.ops.sub(picked, m), lse)), zero)
    count = fd.ops.cast(fd.ops.sum(keep, dims=[0]), DataType.Float)
    fd.add_output(fd.ops.div(fd.ops.sum(loss, dims=[0]), count))


def thunder_case(n: int, v: int) -> tuple:
    """(Thunder's cross-entropy fusion, its logits and labels (one ignored), the loss)."""
    with FusionDefinition() as fd:
        _thunder_cross_entropy(fd, n, v)
    logits = rand((1, n, v), torch.bfloat16)
    labels = torch.randint(0, v, (1, n), generator=torch.Generator().manual_seed(3))
    labels[0, 7] = -100
    want = torch.nn.functional.cross_entropy(logits[0, :-1].float(), labels[0, 1:], ignore_index=-100)
    return fd, logits, labels, want


@needs_gxx
def test_thunder_cross_entropy_takes_two_reduction_kernels():
    fd, logits, labels, want = thunder_case(40, 301)
    ran: list = []
    (got,) = run_plan_on_host(fd, [logits, labels], ran)
    assert [k.name for k in ran] == ["fc_inner_reduction"] * 2  # rows' losses, then their mean
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_kernel_source_names_the_op_in_its_assert():
    with FusionDefinition() as fd:
        x = fd.define_tensor(shape=[-1, -1], contiguity=True)
        i = fd.define_tensor(shape=[-1], contiguity=True, dtype=DataType.Int)
        fd.add_output(fd.ops.index_select(x, i, 1))
    meta = [torch.empty(4, 8, device="meta"), torch.empty(3, dtype=torch.int64, device="meta")]
    source = fd.cuda_code_for(meta)
    assert 'fc_check_index((long long)' in source and '"index_select (T2)"' in source


def _random_chain(rng: random.Random, fd, t, shape: list[int], reshape: bool):
    """A few resize and view ops on a rank-3 tensor, keeping every dim at least 1 long; a
    reshape first, where the input is contiguous (a reshape of what needs a copy, a padded
    or strided tensor, takes a kernel of its own: Note [Reshape frames])."""
    if reshape and rng.random() < 0.5:
        t = fd.ops.reshape(fd.ops.reshape(t, [shape[0] * shape[1], shape[2]]), shape)
    ops = ["slice", "pad", "cat", "permute", "select_bcast", "math"]
    for _ in range(rng.randint(1, 4)):
        op = rng.choice(ops)
        rank = len(shape)
        if op == "slice":
            starts = [rng.randint(-n, n - 1) for n in shape]
            lo = [(s + n) % n if s < 0 else s for s, n in zip(starts, shape)]
            stops = [rng.randint(a + 1, n) for a, n in zip(lo, shape)]
            steps = [rng.randint(1, 2) for _ in shape]
            t = fd.ops.slice(t, starts, stops, steps)
            shape = [-(-(b - a) // k) for a, b, k in zip(lo, stops, steps)]
        elif op == "pad":
            widths = []
            for n in reversed(shape):
                lo_w, hi_w = rng.randint(-1 if n > 2 else 0, 2), rng.randint(0, 2)
                widths += [lo_w, hi_w]
            t = fd.ops.pad(t, widths, fd.define_scalar(rng.choice([0.0, -1.5])))
            shape = [n + widths[2 * (rank - 1 - d)] + widths[2 * (rank - 1 - d) + 1]
                     for d, n in enumerate(shape)]  # fmt: skip
        elif op == "cat":
            d = rng.randrange(rank)
            other = fd.ops.mul(t, 0.5)
            parts = [t, other] if rng.random() < 0.5 else [other, t, other]
            t = fd.ops.cat(parts, d)
            shape[d] *= len(parts)
        elif op == "permute":
            dims = list(range(rank))
            rng.shuffle(dims)
            t = fd.ops.permute(t, dims)
            shape = [shape[k] for k in dims]
        elif op == "select_bcast":
            d = rng.randrange(rank)
            t = fd.ops.broadcast_in_dim(fd.ops.select(t, rng.randrange(shape[d]), d), shape,
                                        [k for k in range(rank) if k != d])  # fmt: skip
        else:
            t = fd.ops.add(fd.ops.exp(fd.ops.mul(t, 0.1)), 1.0)
    return t


def chain_case(seed: int, most: int) -> tuple:
    """(a fusion of a random chain of resize ops, its input: dims up to `most`, half of them
    non-contiguous)."""
    rng = random.Random(seed)
    shape = [rng.randint(1, most) for _ in range(3)]
    x = rand(shape, seed=seed)
    strided = rng.random() < 0.5
    if strided:
        x = rand([shape[2], shape[1], shape[0]], seed=seed).permute(2, 1, 0)
    with FusionDefinition() as fd:
        t = fd.define_tensor(shape=[-1, -1, -1], contiguity=[False] * 3)
        fd.add_output(_random_chain(rng, fd, t, list(shape), reshape=not strided))
    return fd, x


@needs_gxx
@pytest.mark.parametrize("seed", range(16))
def test_random_resize_chains_in_one_kernel(seed):
    fd, x = chain_case(seed, 6)
    ran: list = []
    (got,) = run_plan_on_host(fd, [x], ran)
    assert len(ran) == 1
    torch.testing.assert_close(got, fd.execute([x])[0], rtol=1e-6, atol=1e-6)


def test_every_op_shape_evaluated_without_the_interpreter():
    """Run-time shapes (ir/shape_eval.py) agree with the reference evaluator's, and need no
    meta tensors (torch's tracing stack) for these ops."""
    from fusion_cache.ir import shape_eval

    x, x3 = rand((5, 8)), rand((3, 5, 8), seed=1)
    i1, i2 = torch.randint(0, 8, (8,)), torch.randint(0, 8, (5, 8))
    with FusionDefinition() as fd:
        vals = [fd.from_pytorch(x), fd.from_pytorch(x3), fd.from_pytorch(i1), fd.from_pytorch(i2),
                fd.define_scalar(dtype=DataType.Int)]  # fmt: skip
        outs = _all_ops(fd, *vals)
        outs.append(fd.ops.iota(fd.ops.size(vals[0], 1), dtype=DataType.Float))
        outs.append(fd.ops.embedding_fwd(vals[2], fd.ops.permute(vals[0], [1, 0])))
        outs.append(fd.ops.scatter(vals[0], vals[3], vals[0], 1))
        for o in outs:
            fd.add_output(o)
    inputs = [x, x3, i1, i2, 1]
    env = shape_eval.evaluate_shapes(fd._records, fd._infos, fd.input_refs(), inputs)
    for o, want in zip(outs, fd.execute(inputs)):
        assert tuple(env[o.index]) == tuple(want.shape), o


def test_reshape_to_a_runtime_vector_takes_the_pointwise_scheduler():
    with FusionDefinition() as fd:
        t = fd.define_tensor(shape=[-1, -1], contiguity=True, dtype=from_torch(torch.float32))
        fd.add_output(fd.ops.relu(fd.ops.reshape(t, fd.define_vector(3))))
    (kernel,) = launches(fd, [torch.empty(4, 6, device="meta"), [2, 3, 4]])
    assert kernel.name == "fc_pointwise"


def _i(fd, rank=1):
    return fd.define_tensor(shape=[-1] * rank, contiguity=True, dtype=DataType.Int)


def _f(fd, rank=2):
    return fd.define_tensor(shape=[-1] * rank, contiguity=True)


# each op alone: (build, inputs as meta tensors or values)
ALONE = {
    "slice": (lambda fd: fd.add_output(fd.ops.slice(_f(fd), [1, -3], [4, 7], [1, 2])), [(6, 9)]),
    "slice_symbolic": (lambda fd: fd.add_output(fd.ops.slice(
        _f(fd), [fd.define_scalar(dtype=DataType.Int), 0], [5, 9], manual_normalization=True)),
        [(6, 9), 2]),
    "pad": (lambda fd: fd.add_output(fd.ops.pad(_f(fd), [1, 2, 0, 3])), [(6, 9)]),
    "cat": (lambda fd: fd.add_output(fd.ops.cat([_f(fd), _f(fd)], 0)), [(6, 9), (2, 9)]),
    "cat_manual": (lambda fd: fd.add_output(fd.ops.cat(
        [fd.ops.pad(t := _f(fd), [0, 3]), fd.ops.pad(t, [3, 0])], 1, manual_padding=True)),
        [(6, 9)]),
    "select": (lambda fd: fd.add_output(fd.ops.select(_f(fd), fd.define_scalar(dtype=DataType.Int), 1)),
               [(6, 9), -1]),
    "index_select": (lambda fd: fd.add_output(fd.ops.index_select(_f(fd), _i(fd), 1)),
                     [(6, 9), ((4,), torch.int64)]),
    "gather": (lambda fd: fd.add_output(fd.ops.gather(_f(fd), _i(fd, 2), 0)),
               [(6, 9), ((3, 9), torch.int64)]),
    "take_along_axis": (lambda fd: fd.add_output(fd.ops.take_along_axis(_f(fd), _i(fd, 2), 1)),
                        [(6, 9), ((6, 2), torch.int64)]),
    "scatter": (lambda fd: fd.add_output(fd.ops.scatter(_f(fd), _i(fd, 2), _f(fd), 0)),
                [(6, 9), ((3, 9), torch.int64), (3, 9)]),
    "index_put_accumulate": (lambda fd: fd.add_output(fd.ops.index_put_accumulate(
        _f(fd), _i(fd), _f(fd))), [(6, 9), ((4,), torch.int64), (4, 9)]),
    "embedding_fwd": (lambda fd: fd.add_output(fd.ops.embedding_fwd(_i(fd, 2), _f(fd))),
                      [((3, 4), torch.int64), (6, 9)]),
    "embedding_max_norm": (lambda fd: fd.add_output(fd.ops.embedding_fwd(
        _i(fd, 2), _f(fd), None, fd.define_scalar(1.0))), [((3, 4), torch.int64), (6, 9)]),
    "iota": (lambda fd: fd.add_output(fd.ops.add(_f(fd, 1), fd.ops.iota(
        fd.ops.size(_f(fd, 1), 0), dtype=DataType.Float))), [(7,), (7,)]),
    "triu": (lambda fd: fd.add_output(fd.ops.triu(_f(fd, 3), -1)), [(2, 6, 9)]),
    "reshape_vector": (lambda fd: fd.add_output(fd.ops.reshape(_f(fd), fd.define_vector(3))),
                       [(6, 9), [3, 2, 9]]),
    "tensor_sizes_at": (lambda fd: fd.add_output(fd.ops.reshape(
        t := _f(fd, 3), [fd.ops.tensor_sizes(t)[0], fd.ops.mul(t.shape()[-1], t.shape().at(1))])),
        [(2, 6, 9)]),
}  # fmt: skip


def _meta(spec):
    if isinstance(spec, tuple) and len(spec) == 2 and isinstance(spec[1], torch.dtype):
        return torch.empty(spec[0], dtype=spec[1], device="meta")
    if isinstance(spec, tuple):
        return torch.empty(spec, device="meta")
    return spec


@pytest.mark.parametrize("name", sorted(ALONE))
def test_each_op_alone_precompiles_for_h100_without_the_reference(name):
    """Fallback is disabled (conftest): precompile fails loudly if no scheduler takes it,
    and `launches` fails if a segment is left to the reference evaluator."""
    build, specs = ALONE[name]
    with FusionDefinition() as fd:
        build(fd)
    assert launches(fd, [_meta(s) for s in specs]), name


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64, torch.int64,
                                   torch.int32, torch.bool], ids=str)  # fmt: skip
@pytest.mark.parametrize("deterministic", ["0", "1"], ids=["atomic", "deterministic"])
def test_scatter_kernels_compile_for_h100_every_dtype(dtype, deterministic, monkeypatch):
    """NVRTC (ptxas) checks what only the GPU would otherwise: the ordered accumulate's
    static shared memory for 8-byte sums (int64 asked for 72 KiB of 48 on the H100)."""
    monkeypatch.setenv("FUSION_CACHE_DETERMINISTIC", deterministic)
    acc, value = torch.empty((1000, 3, 70), dtype=dtype), torch.empty((5000, 3, 70), dtype=dtype)
    idx = torch.empty(5000, dtype=torch.int64)
    with FusionDefinition() as fd:
        fd.add_output(fd.ops.index_put_accumulate(fd.from_pytorch(acc), fd.from_pytorch(idx),
                                                  fd.from_pytorch(value)))  # fmt: skip
    refs = fd.precompile([t.to("meta") for t in (acc, idx, value)], target="h100")
    assert refs
