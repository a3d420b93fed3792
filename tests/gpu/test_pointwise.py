"""Pointwise kernels on the GPU against torch eager, across dtypes, layouts and sizes."""
import pytest
import torch

from fusion_cache import DataType, FusionCache, FusionDefinition
from fusion_cache.frontend.dtypes import from_torch
from fusion_cache.runtime.executor import executor_for

pytestmark = pytest.mark.gpu

FLOATS = [torch.float64, torch.float32, torch.float16, torch.bfloat16]
TOL = {torch.float64: 1e-9, torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1.6e-2}


def rand(shape, dtype, gen):
    if dtype == torch.bool:
        return torch.rand(shape, generator=gen, device="cuda") > 0.5
    if not dtype.is_floating_point:
        return torch.randint(-1000, 1000, shape, generator=gen, device="cuda", dtype=dtype)
    return torch.randn(shape, generator=gen, device="cuda", dtype=torch.float32).to(dtype)


@pytest.fixture
def gen():
    return torch.Generator(device="cuda").manual_seed(1234)


def kernels_ran():
    return FusionCache.get().stats()["kernel_launches"]


@pytest.mark.parametrize("dtype", FLOATS)
def test_relu_mul_add(dtype, gen):
    with FusionDefinition() as fd:
        a, b, c = (fd.define_tensor(shape=[-1, -1], contiguity=True, dtype=from_torch(dtype)) for _ in range(3))
        fd.add_output(fd.ops.relu(a * b + c))
    xs = [rand((257, 1001), dtype, gen) for _ in range(3)]
    before = kernels_ran()
    out = fd.execute(xs)[0]
    assert kernels_ran() == before + 1
    ref = torch.relu(xs[0] * xs[1] + xs[2])
    torch.testing.assert_close(out, ref, rtol=TOL[dtype], atol=TOL[dtype])


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64])
def test_integer_ops_exact(dtype, gen):
    dt = from_torch(dtype)
    with FusionDefinition() as fd:
        a = fd.define_tensor(shape=[-1], contiguity=True, dtype=dt)
        b = fd.define_tensor(shape=[-1], contiguity=True, dtype=dt)
        fd.add_output(fd.ops.div(a, b))
        fd.add_output(fd.ops.remainder(a, b))
        fd.add_output(fd.ops.bitwise_xor(a, b) + fd.ops.abs(a))
        fd.add_output(fd.ops.maximum(a, b) * 3)
        fd.add_output(a > b)
    x, y = rand((5000,), dtype, gen), rand((5000,), dtype, gen)
    y[y == 0] = 7
    outs = fd.execute([x, y])
    torch.testing.assert_close(outs[0], torch.div(x, y, rounding_mode="trunc"), rtol=0, atol=0)
    torch.testing.assert_close(outs[1], torch.remainder(x, y), rtol=0, atol=0)
    torch.testing.assert_close(outs[2], (x ^ y) + x.abs(), rtol=0, atol=0)
    torch.testing.assert_close(outs[3], torch.maximum(x, y) * 3, rtol=0, atol=0)
    assert torch.equal(outs[4], x > y)


def test_bool_ops(gen):
    with FusionDefinition() as fd:
        a = fd.define_tensor(shape=[-1, -1], contiguity=True, dtype=DataType.Bool)
        b = fd.define_tensor(shape=[-1, -1], contiguity=True, dtype=DataType.Bool)
        fd.add_output(fd.ops.logical_and(a, fd.ops.logical_not(b)))
        fd.add_output(fd.ops.bitwise_or(a, b))
    x, y = rand((33, 65), torch.bool, gen), rand((33, 65), torch.bool, gen)
    o = fd.execute([x, y])
    assert torch.equal(o[0], x & ~y) and torch.equal(o[1], x | y)


@pytest.mark.parametrize("dtype", FLOATS)
def test_unary_math(dtype, gen):
    names = ["exp", "log", "sqrt", "tanh", "sigmoid", "sin", "cos", "erf", "rsqrt", "abs", "neg",
             "floor", "ceil", "round", "trunc", "silu", "reciprocal", "log1p", "expm1", "sign"]
    with FusionDefinition() as fd:
        a = fd.define_tensor(shape=[-1], contiguity=True, dtype=from_torch(dtype))
        pos = fd.ops.abs(a) + 0.1
        for n in names:
            fd.add_output(getattr(fd.ops, n)(pos if n in ("log", "sqrt", "rsqrt", "log1p") else a))
    x = rand((4099,), dtype, gen)
    outs = fd.execute([x])
    p = x.abs() + 0.1
    for n, o in zip(names, outs):
        arg = p if n in ("log", "sqrt", "rsqrt", "log1p") else x
        ref = getattr(torch, n)(arg) if n != "silu" else torch.nn.functional.silu(arg)
        tol = 4 * TOL[dtype]
        torch.testing.assert_close(o, ref, rtol=tol, atol=tol, msg=n)


@pytest.mark.parametrize("dtype", FLOATS)
def test_broadcast_row_and_column(dtype, gen):
    dt = from_torch(dtype)
    with FusionDefinition() as fd:
        a = fd.define_tensor(shape=[-1, -1], contiguity=True, dtype=dt)
        row = fd.define_tensor(shape=[-1], contiguity=True, dtype=dt)
        col = fd.define_tensor(shape=[-1], contiguity=True, dtype=dt)
        r = fd.ops.broadcast_in_dim(row, shape=fd.ops.shape(a), broadcast_dims=[1])
        c = fd.ops.broadcast(col, [False, True])
        fd.add_output(a + r)
        fd.add_output(a * c)
    x, r, c = rand((300, 512), dtype, gen), rand((512,), dtype, gen), rand((300,), dtype, gen)
    o = fd.execute([x, r, c])
    torch.testing.assert_close(o[0], x + r, rtol=TOL[dtype], atol=TOL[dtype])
    torch.testing.assert_close(o[1], x * c[:, None], rtol=TOL[dtype], atol=TOL[dtype])


def test_permuted_sliced_and_size_one_inputs(gen):
    with FusionDefinition() as fd:
        a = fd.define_tensor(shape=[-1, -1, -1], contiguity=[False, False, False], dtype=DataType.Float)
        b = fd.define_tensor(shape=[-1, 1, -1], contiguity=[True, None, True], dtype=DataType.Float)
        c = fd.ops.permute(a, [2, 0, 1])
        fd.add_output(fd.ops.permute(c, [1, 2, 0]) + b)
    base = rand((40, 9, 70), torch.float32, gen)
    x = base.permute(0, 2, 1)[:, 3:60, :]  # non-contiguous, sliced view [40, 57, 9]
    x = x.permute(0, 2, 1)  # [40, 9, 57]
    y = rand((40, 1, 57), torch.float32, gen)
    out = fd.execute([x, y])[0]
    torch.testing.assert_close(out, x + y)


def test_zero_size_and_scalar_inputs(gen):
    with FusionDefinition() as fd:
        a = fd.define_tensor(shape=[-1, -1], contiguity=True, dtype=DataType.Float)
        s = fd.define_scalar(dtype=DataType.Double)
        fd.add_output(a * s - 1.5)
    for shape in [(0, 5), (1, 1), (3, 0), (1, 7)]:
        x = rand(shape, torch.float32, gen)
        out = fd.execute([x, 2.5])[0]
        assert out.shape == x.shape
        torch.testing.assert_close(out, x * 2.5 - 1.5)


def test_cast_chain_bf16(gen):
    with FusionDefinition() as fd:
        a = fd.define_tensor(shape=[-1, -1], contiguity=True, dtype=DataType.BFloat16)
        f = fd.ops.cast(a, DataType.Float)
        h = fd.ops.cast(fd.ops.tanh(f * 1.7 + 0.3), DataType.Half)
        fd.add_output(fd.ops.cast(fd.ops.cast(h, DataType.Float) * 2.0, DataType.BFloat16))
    x = rand((1024, 2048), torch.bfloat16, gen)
    out = fd.execute([x])[0]
    ref = ((torch.tanh(x.float() * 1.7 + 0.3)).half().float() * 2.0).bfloat16()
    torch.testing.assert_close(out, ref, rtol=1.6e-2, atol=1.6e-2)


def test_fifty_leading_sizes_compile_at_most_two_kernels(gen):
    with FusionDefinition() as fd:
        a = fd.define_tensor(shape=[-1, -1], contiguity=True, dtype=DataType.Float)
        b = fd.define_tensor(shape=[-1], contiguity=True, dtype=DataType.Float)
        fd.add_output(fd.ops.sigmoid(a) * fd.ops.broadcast(b, [True, False]))
    before = FusionCache.get().stats()["kernels_compiled"]
    b = rand((256,), torch.float32, gen)
    for n in range(1, 51):
        x = rand((n * 3, 256), torch.float32, gen)
        torch.testing.assert_close(fd.execute([x, b])[0], torch.sigmoid(x) * b)
    compiled = FusionCache.get().stats()["kernels_compiled"] - before
    assert compiled <= 2, compiled


def test_plan_cache_hits(gen):
    with FusionDefinition() as fd:
        a = fd.define_tensor(shape=[-1], contiguity=True, dtype=DataType.Float)
        fd.add_output(a + 1.0)
    x = rand((1000,), torch.float32, gen)
    fd.execute([x])
    hits = FusionCache.get().stats()["plan_cache_hits"]
    fd.execute([rand((1000,), torch.float32, gen)])
    assert FusionCache.get().stats()["plan_cache_hits"] == hits + 1


def test_input_over_2_31_elements():
    n = 2**31 + 1024
    if torch.cuda.get_device_properties(0).total_memory < 4 * n:
        pytest.skip("not enough GPU memory")
    with FusionDefinition() as fd:
        a = fd.define_tensor(shape=[-1], contiguity=True, dtype=DataType.BFloat16)
        fd.add_output(fd.ops.cast(fd.ops.cast(a, DataType.Float) * 2.0, DataType.BFloat16))
    x = torch.empty(n, dtype=torch.bfloat16, device="cuda").uniform_(-1, 1)
    out = fd.execute([x])[0]
    assert torch.equal(out[-4096:], (x[-4096:].float() * 2).bfloat16())
    assert torch.equal(out[:4096], (x[:4096].float() * 2).bfloat16())
    del x, out
    torch.cuda.empty_cache()


def test_cuda_code_and_last_cuda_code(gen):
    with FusionDefinition() as fd:
        a = fd.define_tensor(shape=[-1], contiguity=True, dtype=DataType.Float)
        fd.add_output(fd.ops.exp(a))
    fd.execute([rand((64,), torch.float32, gen)])
    assert "fc_pointwise" in fd.last_cuda_code()
    assert "scheduler: pointwise" in fd.last_scheduled_fusion_ir()


KNOB_SETS = [{}, {"pointwise.unroll": 2}, {"pointwise.unroll": 4, "pointwise.block": 128},
             {"pointwise.block": 512, "load.hint": 3, "store.hint": 1}, {"load.hint": 1},
             {"load.hint": 2}]  # fmt: skip


def knob_id(knobs):
    return ",".join(f"{a}={b}" for a, b in knobs.items()) or "default"


@pytest.mark.parametrize("knobs", KNOB_SETS, ids=knob_id)
@pytest.mark.parametrize("shape", [(3, 4104), (1000, 1000), (8192, 520)])
def test_tuning_knobs_keep_results(knobs, shape, gen):
    # every choice a sweep can make (Note [Tuning knobs]) computes the same function; the
    # tails of unrolled loops and partial blocks included
    from schedulers.tuning import overriding

    with FusionDefinition() as fd:
        a = fd.define_tensor(shape=[-1, -1], contiguity=True, dtype=DataType.BFloat16)
        b = fd.define_tensor(shape=[-1], contiguity=True, dtype=DataType.BFloat16)
        x = fd.ops.cast(a, DataType.Float) + fd.ops.broadcast(
            fd.ops.cast(b, DataType.Float), [True, False])
        fd.add_output(fd.ops.cast(fd.ops.tanh(x) * x, DataType.BFloat16))
    a, b = rand(shape, torch.bfloat16, gen), rand(shape[1:], torch.bfloat16, gen)
    executor_for(fd).plans.clear()
    with overriding(knobs):
        out = fd.execute([a, b])[0]
    x = a.float() + b.float()
    torch.testing.assert_close(out, (torch.tanh(x) * x).bfloat16(), rtol=1.6e-2, atol=1.6e-2)


def test_execute_on_a_named_device(gen):
    # execute(device=...): CUDA inputs on that device run as without it; a CUDA input
    # asked to run elsewhere is named in the error; a fusion that reads only scalars gives
    # its outputs on the device asked for
    with FusionDefinition() as fd:
        t0 = fd.define_tensor(shape=[-1], contiguity=[True], dtype=DataType.Float)
        s0 = fd.define_tensor(shape=[], contiguity=[], dtype=DataType.Float, is_cpu=True)
        fd.add_output(fd.ops.mul(t0, s0))
    x, s = rand((1000,), torch.float32, gen), torch.tensor(0.75)
    for device in (0, "cuda", "cuda:0", torch.device("cuda", 0)):
        (out,) = fd.execute([x, s], device=device)
        assert out.device == x.device
        torch.testing.assert_close(out, x * 0.75)
    with pytest.raises(ValueError, match=r"input 0 is on cuda:0"):
        fd.execute([x, s], device="cpu")
    with FusionDefinition() as fd2:
        v = fd2.define_scalar(dtype=DataType.Double)
        fd2.add_output(fd2.ops.full([7], v, dtype=DataType.Float))
    (full,) = fd2.execute([2.5], device="cuda")
    assert full.device == torch.device("cuda", 0)
    torch.testing.assert_close(full, torch.full((7,), 2.5, device="cuda"))


def test_cpu_scalar_tensors_beside_cuda_inputs(gen):
    # Note [CPU scalar tensors]: a 0-dim CPU tensor (is_cpu=True) read with CUDA tensors,
    # in a pointwise and in a reduction fusion, on the first call and on cached ones; a CPU
    # tensor with dims beside CUDA ones is named in the error
    with FusionDefinition() as fd:
        t0 = fd.define_tensor(shape=[-1, -1], contiguity=[True, True], dtype=DataType.Float)
        s0 = fd.define_tensor(shape=[], contiguity=[], dtype=DataType.Float, is_cpu=True)
        y = fd.ops.mul(t0, s0)
        fd.add_output(y)
        fd.add_output(fd.ops.sum(y, dims=[1]))
    x = rand((37, 1001), torch.float32, gen)
    for value in (0.75, -2.5, 3.0):
        s = torch.tensor(value)
        before = kernels_ran()
        out, total = fd.execute([x, s])
        assert kernels_ran() > before  # kernels, not the reference evaluator
        torch.testing.assert_close(out, x * value)
        torch.testing.assert_close(total, (x * value).sum(1), rtol=1e-5, atol=1e-4)
    # one CPU tensor changed in place between calls: each call reads the value it had then
    s = torch.tensor(1.0)
    outs = []
    for value in (4.0, -1.0):
        s.fill_(value)
        outs.append(fd.execute([x, s])[0])
    torch.testing.assert_close(outs[0], x * 4.0)
    torch.testing.assert_close(outs[1], -x)
    with FusionDefinition() as fd2:
        a = fd2.define_tensor(shape=[-1], contiguity=[True], dtype=DataType.Float)
        b = fd2.define_tensor(shape=[-1], contiguity=[True], dtype=DataType.Float)
        fd2.add_output(fd2.ops.add(a, b))
    with pytest.raises(ValueError, match=r"input 1 is a 1-dim tensor on cpu"):
        fd2.execute([rand((5,), torch.float32, gen), torch.randn(5)])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_channels_last_loop_in_memory_order(dtype, gen):
    """Note [Loop in memory order]: channels-last inputs, a per-channel scale and a
    channels-last output (a batch norm's epilogue, Note [Channels-last convolutions]) run as
    one vectorized [N*H*W, C] loop, and match eager."""
    x, y = (rand((8, 24, 10, 6), dtype, gen).to(memory_format=torch.channels_last)
            for _ in range(2))
    scale = rand((24,), torch.float32, gen)
    with FusionDefinition() as fd:
        a, b = (fd.define_tensor(sizes=list(x.shape), strides=list(x.stride()),
                                 dtype=from_torch(dtype)) for _ in range(2))  # fmt: skip
        s = fd.define_tensor(shape=[-1], contiguity=True, dtype=DataType.Float)
        out = fd.ops.relu(fd.ops.mul(fd.ops.add(a, b), fd.ops.broadcast(s, [True, False, True, True])))
        fd.add_output(fd.ops.cast(out, from_torch(dtype)), stride_order=[3, 0, 2, 1])
    got = fd.execute([x, y, scale])[0]
    want = torch.relu((x.float() + y.float()) * scale[:, None, None]).to(dtype)
    assert got.is_contiguous(memory_format=torch.channels_last)
    torch.testing.assert_close(got, want, rtol=TOL[dtype], atol=TOL[dtype])
    plan = executor_for(fd).last_plan
    assert "rank=2 " in plan.spec.description and "vec=1 " not in plan.spec.description, \
        plan.spec.description
