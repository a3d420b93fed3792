"""Reductions over dims between kept ones on the GPU against torch eager (Note [Middle
reductions]): odd sizes, splits in a cluster and through a finish kernel, f32 and bf16."""
import pytest
import torch
from fusion_patterns import define, softmax, standardize

from fusion_cache import DataType, FusionDefinition
from fusion_cache.frontend.dtypes import from_torch
from fusion_cache.runtime.executor import executor_for
from schedulers.tuning import overriding

pytestmark = pytest.mark.gpu

TOL = {torch.float32: 1e-4, torch.bfloat16: 1.6e-2, torch.float16: 2e-3}


@pytest.fixture
def gen():
    return torch.Generator(device="cuda").manual_seed(29)


def rand(shape, dtype, gen):
    return torch.randn(shape, generator=gen, device="cuda", dtype=torch.float32).to(dtype)


def close(got, want):
    tol = TOL[want.dtype]
    scale = want.float().abs().mean().item() or 1.0
    torch.testing.assert_close(got.float(), want.float(), rtol=tol, atol=tol * scale)


def outer(fd):
    spec = executor_for(fd).last_plan.spec
    assert spec.description.startswith("outer"), spec.description
    return spec


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shape", [(3, 1001, 37), (16, 4096, 1024), (2, 8192, 520)], ids=str)
def test_sum_and_var_mean_over_the_middle_dim(shape, dtype, gen):
    with FusionDefinition() as fd:
        x = fd.define_tensor(shape=[-1] * 3, contiguity=[True] * 3, dtype=from_torch(dtype))
        xf = fd.ops.cast(x, DataType.Float)
        fd.add_output(fd.ops.cast(fd.ops.sum(xf, dims=[1]), from_torch(dtype)))
    x = rand(shape, dtype, gen)
    close(fd.execute([x])[0], x.float().sum(1).to(dtype))
    outer(fd)
    with FusionDefinition() as fd2:
        x2 = fd2.define_tensor(shape=[-1] * 3, contiguity=[True] * 3, dtype=from_torch(dtype))
        var, mean = fd2.ops.var_mean(fd2.ops.cast(x2, DataType.Float), dims=[1], correction=0)
        fd2.add_output(fd2.ops.cast(var, from_torch(dtype)))
        fd2.add_output(fd2.ops.cast(mean, from_torch(dtype)))
    got_var, got_mean = fd2.execute([x])
    want_var, want_mean = torch.var_mean(x.float(), dim=1, correction=0)
    close(got_var, want_var.to(dtype))
    close(got_mean, want_mean.to(dtype))
    outer(fd2)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("shape", [(64, 4096, 1024), (3, 1003, 41), (53, 129, 1000)], ids=str)
def test_var_mean_over_the_middle_dim_away_from_zero(shape, dtype, gen):
    """Note [Outer Welford add]: rows joined a group at a time keep the variance of values
    whose mean is far from zero (f32 against float64 at 1e-4). 16-bit columns enough for
    three blocks an SM of 16 x 8 threads take such blocks ([64, 4096, 1024], [53, 129, 1000])."""
    with FusionDefinition() as fd:
        x = fd.define_tensor(shape=[-1] * 3, contiguity=[True] * 3, dtype=from_torch(dtype))
        var, mean = fd.ops.var_mean(fd.ops.cast(x, DataType.Float), dims=[1], correction=0)
        fd.add_output(var)
        fd.add_output(mean)
    x = (rand(shape, torch.float32, gen) * 2 + 100).to(dtype)
    got_var, got_mean = fd.execute([x])
    want_var, want_mean = torch.var_mean(x.double(), dim=1, correction=0)
    torch.testing.assert_close(got_var.double(), want_var, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(got_mean.double(), want_mean, rtol=1e-5, atol=1e-5)
    sms = torch.cuda.get_device_properties(x.device).multi_processor_count
    narrow = dtype != torch.float32 and shape[0] * shape[2] >= 3 * sms * 128
    assert outer(fd).description.startswith("outer 16x8 " if narrow else "outer 32x"), (
        outer(fd).description)


@pytest.mark.parametrize("knobs", [{}, {"outer.cluster": 0}], ids=["cluster", "finish"])
def test_splits(knobs, gen):
    with FusionDefinition() as fd:
        x = fd.define_tensor(shape=[-1] * 3, contiguity=[True] * 3, dtype=DataType.Float)
        fd.add_output(fd.ops.sum(x, dims=[1]))
        fd.add_output(fd.ops.max(x, dims=[1]))
    for shape in [(2, 2048, 2304), (2, 4096, 64), (5, 3333, 100)]:
        x = rand(shape, torch.float32, gen)
        with overriding(knobs):
            s, m = fd.execute([x])
        close(s, x.sum(1))
        assert torch.equal(m, x.amax(1))
        outer(fd)


def test_relatives(gen):
    with FusionDefinition() as fd:
        x = fd.define_tensor(shape=[-1] * 5, contiguity=[True] * 5, dtype=DataType.BFloat16)
        y = fd.ops.sum(fd.ops.cast(x, DataType.Float), dims=[1, 3])
        fd.add_output(fd.ops.cast(y, DataType.BFloat16))
    x = rand((3, 20, 4, 30, 16), torch.bfloat16, gen)
    close(fd.execute([x])[0], x.float().sum((1, 3)).to(torch.bfloat16))
    assert "two reduced runs" in outer(fd).description
    with FusionDefinition() as fd2:
        y = fd2.define_tensor(shape=[-1] * 4, contiguity=[True] * 4, dtype=DataType.Float)
        var, mean = fd2.ops.var_mean(y, dims=[0, 2], correction=1)
        fd2.add_output(var)
        fd2.add_output(mean)
    y = rand((12, 5, 33, 8), torch.float32, gen)
    want_var, want_mean = torch.var_mean(y, dim=(0, 2), correction=1)
    got_var, got_mean = fd2.execute([y])
    close(got_var, want_var)
    close(got_mean, want_mean)
    outer(fd2)


def split(fd):
    spec = executor_for(fd).last_plan.spec
    assert spec.description.startswith("split rows"), spec.description
    return spec


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("n", [2**24, 2**22 + 3, 1234567], ids=str)
def test_sum_mean_var_max_to_a_scalar(n, dtype, gen):
    with FusionDefinition() as fd:
        x = fd.ops.cast(fd.define_tensor(shape=[-1], contiguity=[True], dtype=from_torch(dtype)),
                        DataType.Float)  # fmt: skip
        total = fd.ops.sum(x, dims=[0])
        fd.add_output(total)
        fd.add_output(fd.ops.mul(total, fd.define_scalar(1.0 / n)))
    x = rand((n,), dtype, gen)
    s, m = fd.execute([x])
    close(s, x.double().sum().float())
    close(m, x.double().mean().float())
    split(fd)
    with FusionDefinition() as fd2:
        y = fd2.ops.cast(fd2.define_tensor(shape=[-1], contiguity=[True], dtype=from_torch(dtype)),
                         DataType.Float)  # fmt: skip
        var, mean = fd2.ops.var_mean(y, dims=[0], correction=1)
        fd2.add_output(var)
        fd2.add_output(mean)
        fd2.add_output(fd2.ops.max(y, dims=[0]))
    var, mean, mx = fd2.execute([x])
    want_var, want_mean = torch.var_mean(x.double(), correction=1)
    close(var, want_var.float())
    close(mean, want_mean.float())
    assert torch.equal(mx, x.float().amax())
    split(fd2)


def test_a_few_rows_and_every_dim_of_a_tensor(gen):
    with FusionDefinition() as fd:
        x = fd.define_tensor(shape=[-1, -1], contiguity=[True, True], dtype=DataType.Float)
        fd.add_output(fd.ops.sum(x, dims=[1]))
    x = rand((5, 3000001), torch.float32, gen)
    close(fd.execute([x])[0], x.double().sum(1).float())
    assert split(fd).kernels[0].grid[1] == 5
    with FusionDefinition() as fd2:
        y = fd2.define_tensor(shape=[-1] * 3, contiguity=[True] * 3, dtype=DataType.BFloat16)
        fd2.add_output(fd2.ops.sum(fd2.ops.cast(y, DataType.Float), dims=[0, 1, 2]))
    y = rand((33, 257, 129), torch.bfloat16, gen)
    close(fd2.execute([y])[0], y.double().sum().float())
    split(fd2)


def column_norm(fd):
    spec = executor_for(fd).last_plan.spec
    assert spec.description.startswith("column norm"), spec.description
    return spec


# Note [Whole column tiles]: one block a tile of the whole reduced dim, in shared memory
WHOLE = {"colnorm.cluster": 1, "colnorm.tx": 1, "colnorm.ty": 256, "colnorm.smem": True,
         "colnorm.min_blocks": 3, "colnorm.persistent": False}


CLUSTERED = [{"colnorm.cluster": 4, "colnorm.tx": 4, "colnorm.ty": 64, "colnorm.chunks": 4,
              "colnorm.refill": True},
             {"colnorm.cluster": 8, "colnorm.tx": 8, "colnorm.ty": 32, "colnorm.chunks": 4,
              "colnorm.min_blocks": 2, "colnorm.refill": True},
             {"colnorm.cluster": 4, "colnorm.tx": 4, "colnorm.ty": 64, "colnorm.chunks": 4},
             {"colnorm.cluster": 16, "colnorm.tx": 4, "colnorm.ty": 32, "colnorm.chunks": 2,
              "colnorm.refill": True, "colnorm.min_blocks": 4}]


@pytest.mark.parametrize("more", [*CLUSTERED, {"colnorm.chunks": 4, "colnorm.refill": True},
                                  {"colnorm.chunks": 3, "colnorm.refill": True, "colnorm.ty": 128},
                                  {"colnorm.chunks": 4, "colnorm.refill": True, "colnorm.tx": 2,
                                   "colnorm.min_blocks": 1}, {}, {"colnorm.chunks": 4},
                                  {"colnorm.refill": True}], ids=str)  # fmt: skip
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_whole_column_tiles(dtype, more, gen):
    """Softmax, log-softmax and a standardization with the rows in shared memory, copied in
    groups (colnorm.chunks) into slots refilled tile after tile (colnorm.refill), in one
    block or a cluster: rows short of the thread rows, tails of columns (an odd count of
    16-byte vectors over the column threads), more tiles than resident blocks."""
    knobs = {**WHOLE, **more}
    for shape, log in [((5, 4000, 136), False), ((3, 1001, 40), True), ((7, 2049, 1000), False)]:
        build, ref = softmax(log=log, dim=1)
        fd = define(build, dtype, 3)
        x = rand(shape, dtype, gen) * 4
        with overriding(knobs):
            close(fd.execute([x])[0], ref(x))
        description = column_norm(fd).description
        assert "rows in smem" in description
        assert f"clusters of {knobs['colnorm.cluster']}," in description
        assert ("refilled" in description) == bool(knobs.get("colnorm.refill"))
    build, ref = standardize(dim=1)
    fd = define(build, dtype, 3)
    y = (rand((6, 700, 1000), torch.float32, gen) * 3 + 1).to(dtype)
    with overriding(knobs):
        got = fd.execute([y])
    for g, w in zip(got, ref(y), strict=True):
        close(g, w)
    assert "rows in smem" in column_norm(fd).description


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shape", [(32, 4096, 512), (3, 1001, 37), (5, 33, 1030)], ids=str)
def test_softmax_over_the_middle_dim(shape, dtype, gen):
    fd = define(softmax(dim=1)[0], dtype, 3)
    x = rand(shape, dtype, gen)
    close(fd.execute([x])[0], torch.softmax(x.float(), 1).to(dtype))
    column_norm(fd)


@pytest.mark.parametrize("knobs", [{}, {"colnorm.deep": False}, {"colnorm.deep": True},
                                   {"colnorm.online": False},
                                   {"colnorm.persistent": True},
                                   {"colnorm.persistent": True, "colnorm.min_blocks": 2,
                                    "colnorm.online": False}, {"colnorm.push": True},
                                   {"colnorm.vec": 4}, {"colnorm.vec": 4, "colnorm.cluster": 16,
                                                        "colnorm.ty": 32},
                                   {"colnorm.reuse_exp": True},
                                   {"colnorm.reuse_exp": True, "colnorm.vec": 4,
                                    "colnorm.cluster": 16, "colnorm.ty": 32},
                                   {"colnorm.smem": False},
                                   {"colnorm.smem": True, "colnorm.persistent": False},
                                   {"colnorm.smem": True, "colnorm.persistent": True},
                                   {"colnorm.smem": True, "colnorm.persistent": True,
                                    "colnorm.tx": 4, "colnorm.min_blocks": 2},
                                   {**WHOLE}, {**WHOLE, "colnorm.chunks": 4},
                                   {**WHOLE, "colnorm.chunks": 4, "colnorm.refill": True},
                                   {**WHOLE, "colnorm.chunks": 16, "colnorm.refill": True},
                                   {**WHOLE, "colnorm.refill": True, "colnorm.tx": 2,
                                    "colnorm.min_blocks": 1, "colnorm.chunks": 4},
                                   *({**WHOLE, **more} for more in CLUSTERED)],
                         ids=str)  # fmt: skip
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_softmax_over_the_middle_dim_with_masked_blocks(dtype, knobs, gen):
    """Note [Online column softmax]: blocks whose rows are all -inf add nothing to the sum;
    the others' sums are rescaled to the column's max (values spread over +-40). Note
    [Column tiles in flight]: clusters looping over tiles (more tiles than clusters)."""
    fd = define(softmax(dim=1)[0], dtype, 3)
    x = rand((4, 4096, 1032), torch.float32, gen) * 20
    x[:, :700] = float("-inf")
    x[:, 3000:3100] += 30
    x = x.to(dtype)
    with overriding(knobs):
        close(fd.execute([x])[0], torch.softmax(x.float(), 1).to(dtype))
    description = column_norm(fd).description
    assert ("two exchanges" in description) == (knobs.get("colnorm.online") is False)
    if "colnorm.smem" in knobs:  # else 16-bit rows of 16-byte vectors (Note [Column rows in smem])
        assert ("rows in smem" in description) == knobs["colnorm.smem"]
    # 32-bit rows loop over tiles unless told not to (Note [Column tiles in flight]) or
    # taking deep tiles (Note [Whole column tiles])
    deep = "4 chunks" in description and "colnorm.chunks" not in knobs
    assert ("next tile in flight" in description) == knobs.get(
        "colnorm.persistent", dtype == torch.float32 and not deep)  # fmt: skip


@pytest.mark.parametrize("knobs", [{}, {"colnorm.cluster": 1, "colnorm.ty": 64},
                                   {"colnorm.values": 64}, {"colnorm.cluster": 8},
                                   {"colnorm.min_blocks": 0}, {"colnorm.persistent": True},
                                   {"colnorm.persistent": True, "colnorm.cluster": 4},
                                   {"colnorm.push": True}, {"colnorm.smem": True},
                                   {"colnorm.smem": True, "colnorm.persistent": False},
                                   {**WHOLE, "colnorm.refill": True}], ids=str)  # fmt: skip
def test_column_norm_knobs_and_welford(knobs, gen):
    build, ref = standardize(dim=1)
    fd = define(build, torch.float32, 3)
    x = rand((6, 700, 1000), torch.float32, gen) * 3 + 1  # 188 tiles: persistent clusters loop
    with overriding(knobs):
        got = fd.execute([x])
    for g, w in zip(got, ref(x), strict=True):
        close(g, w)
    column_norm(fd)


def test_permuted_inputs(gen):
    with FusionDefinition() as fd:
        x = fd.define_tensor(shape=[-1] * 3, contiguity=[True] * 3, dtype=DataType.Float)
        xt = fd.ops.permute(x, [0, 2, 1])
        shape = fd.ops.shape(xt)
        mx = fd.ops.broadcast_in_dim(fd.ops.max(xt, dims=[2]), shape, [0, 1])
        e = fd.ops.exp(fd.ops.sub(xt, mx))
        fd.add_output(fd.ops.div(e, fd.ops.broadcast_in_dim(fd.ops.sum(e, dims=[2]), shape, [0, 1])))
    x = rand((3, 777, 64), torch.float32, gen)
    close(fd.execute([x])[0], torch.softmax(x.permute(0, 2, 1), 2))
    column_norm(fd)
    with FusionDefinition() as fd2:
        a = fd2.define_tensor(shape=[-1, -1], contiguity=[True, True], dtype=DataType.Float)
        b = fd2.define_tensor(shape=[-1, -1], contiguity=[True, True], dtype=DataType.Float)
        fd2.add_output(fd2.ops.sum(fd2.ops.mul(a, fd2.ops.permute(b, [1, 0])), dims=[1]))
        fd2.add_output(fd2.ops.sum(fd2.ops.permute(b, [1, 0]), dims=[0]))
    a, b = rand((300, 1000), torch.float32, gen), rand((1000, 300), torch.float32, gen)
    s, t = fd2.execute([a, b])
    close(s, (a * b.t()).sum(1))
    close(t, b.t().sum(0))
