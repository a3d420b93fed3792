"""Tiled transposes on the GPU against torch eager: odd sizes, tails, every way a tensor is
read or written (Note [Transpose tiles]), 16- and 32-bit dtypes, the tuning knobs."""
import pytest
import torch

from fusion_cache import DataType, FusionDefinition
from fusion_cache.frontend.dtypes import from_torch
from fusion_cache.runtime.executor import executor_for
from schedulers.tuning import overriding

pytestmark = pytest.mark.gpu

TOL = {torch.float32: 1e-5, torch.bfloat16: 1.6e-2, torch.float16: 2e-3, torch.float64: 1e-9}


@pytest.fixture
def gen():
    return torch.Generator(device="cuda").manual_seed(28)


def rand(shape, dtype, gen):
    if not dtype.is_floating_point:
        return torch.randint(-1000, 1000, shape, generator=gen, device="cuda", dtype=dtype)
    return torch.randn(shape, generator=gen, device="cuda", dtype=torch.float32).to(dtype)


def tensor(fd, rank, dtype, order=None):
    return fd.define_tensor(shape=[-1] * rank, contiguity=[True] * rank, dtype=from_torch(dtype),
                            stride_order=order)  # fmt: skip


def tiled(fd):
    """The last run took the tiled kernel; its plan's description."""
    spec = executor_for(fd).last_plan.spec
    assert spec.scheduler == "transpose", spec.description
    return spec.description


def close(got, want):
    torch.testing.assert_close(got, want, rtol=TOL.get(want.dtype, 0), atol=TOL.get(want.dtype, 0))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.float64,
                                   torch.int32])  # fmt: skip
@pytest.mark.parametrize("shape", [(1024, 768), (1023, 517), (96, 4100)], ids=str)
def test_add_of_a_transposed_input(dtype, shape, gen):
    with FusionDefinition() as fd:
        a, b = tensor(fd, 2, dtype), tensor(fd, 2, dtype)
        fd.add_output(fd.ops.add(fd.ops.permute(a, [1, 0]), b))
    x, y = rand(shape, dtype, gen), rand(shape[::-1], dtype, gen)
    close(fd.execute([x, y])[0], x.t() + y)
    tiled(fd)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_batched_transpose_scaled_and_cast(dtype, gen):
    with FusionDefinition() as fd:
        a = tensor(fd, 3, dtype)
        s = fd.define_scalar(dtype=DataType.Double)
        y = fd.ops.mul(fd.ops.cast(fd.ops.permute(a, [0, 2, 1]), DataType.Float), s)
        fd.add_output(fd.ops.cast(y, from_torch(dtype)))
    for shape in [(7, 300, 129), (3, 1024, 1024), (2, 64, 8)]:
        x = rand(shape, dtype, gen)
        close(fd.execute([x, 0.75])[0], (x.permute(0, 2, 1).float() * 0.75).to(dtype))
    assert "not tiled: tiles of" in executor_for(fd).last_plan.spec.description  # 64 x 8


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_nchw_to_nhwc_with_a_channel_bias(dtype, gen):
    with FusionDefinition() as fd:
        x, b = tensor(fd, 4, dtype), tensor(fd, 1, dtype)
        y = fd.ops.permute(x, [0, 2, 3, 1])
        fd.add_output(fd.ops.relu(y + fd.ops.broadcast_in_dim(b, fd.ops.shape(y), [3])))
    x, b = rand((3, 72, 13, 11), dtype, gen), rand((72,), dtype, gen)
    close(fd.execute([x, b])[0], torch.relu(x.permute(0, 2, 3, 1) + b))
    assert "loads=tile,vec" in tiled(fd)


def test_rank_five_and_outer_dims_between(gen):
    with FusionDefinition() as fd:
        x = tensor(fd, 5, torch.bfloat16)
        fd.add_output(fd.ops.neg(fd.ops.permute(x, [4, 1, 3, 2, 0])))
    x = rand((120, 3, 2, 5, 33), torch.bfloat16, gen)
    close(fd.execute([x])[0], -x.permute(4, 1, 3, 2, 0))
    assert "rank=5" in tiled(fd)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_stride_order_input_and_open_strides(dtype, gen):
    with FusionDefinition() as fd:
        a = tensor(fd, 2, dtype, order=[0, 1])  # column-major
        w = tensor(fd, 1, dtype)
        c = fd.define_tensor(shape=[-1, -1], contiguity=[False, False], dtype=from_torch(dtype))
        y = fd.ops.mul(a, fd.ops.broadcast_in_dim(w, fd.ops.shape(a), [0])) + c
        fd.add_output(y)
    base, w = rand((520, 1000), dtype, gen), rand((1000,), dtype, gen)
    x = base.t()  # [1000, 520], column-major
    c = rand((1000, 520), dtype, gen)
    close(fd.execute([x, w, c])[0], x * w[:, None] + c)
    assert "loads=tile,elem,vec" in tiled(fd)
    c2 = rand((520, 1000), dtype, gen).t()  # both strided the same way
    close(fd.execute([x, w, c2])[0], x * w[:, None] + c2)
    assert "loads=tile,elem,tile" in tiled(fd)


def test_mixed_layouts_dtypes_and_two_outputs(gen):
    with FusionDefinition() as fd:
        a, b, c = tensor(fd, 2, torch.bfloat16), tensor(fd, 2, torch.float32), tensor(fd, 2, torch.bfloat16)
        at = fd.ops.cast(fd.ops.permute(a, [1, 0]), DataType.Float)
        ct = fd.ops.cast(fd.ops.permute(c, [1, 0]), DataType.Float)
        fd.add_output(fd.ops.add(at, b))
        fd.add_output(fd.ops.cast(fd.ops.mul(ct, at), DataType.BFloat16))
    x, y, z = (rand((777, 1030), torch.bfloat16, gen), rand((1030, 777), torch.float32, gen),
               rand((777, 1030), torch.bfloat16, gen))  # fmt: skip
    o1, o2 = fd.execute([x, y, z])
    close(o1, x.t().float() + y)
    close(o2, (z.t().float() * x.t().float()).to(torch.bfloat16))
    tiled(fd)


@pytest.mark.parametrize("knobs", [{"transpose.stages": 3}, {"transpose.stages": 1},
                                   {"transpose.vec": 4}, {"transpose.threads": 128},
                                   {"transpose.tile_a": 64, "transpose.tile_b": 128},
                                   {"transpose.blocks_per_sm": 1},
                                   {"transpose.tiles_each": -1}, {"transpose.tiles_each": 1},
                                   {"transpose.tiles_each": 3, "transpose.tile_a": 128}],
                         ids=str)  # fmt: skip
def test_knobs_keep_the_values(knobs, gen):
    with FusionDefinition() as fd:
        a, b = tensor(fd, 3, torch.bfloat16), tensor(fd, 3, torch.bfloat16)
        fd.add_output(fd.ops.sub(fd.ops.permute(a, [0, 2, 1]), b))
    x, y = rand((3, 520, 776), torch.bfloat16, gen), rand((3, 776, 520), torch.bfloat16, gen)
    with overriding(knobs):
        close(fd.execute([x, y])[0], x.permute(0, 2, 1) - y)
    tiled(fd)


def test_random_numbers_of_a_tiled_fusion_are_the_reference_ones(gen):
    # each element's numbers follow its index in the loop (Note [Philox numbers]), as the
    # reference evaluator computes them on the CPU
    with FusionDefinition() as fd:
        a = tensor(fd, 2, torch.float32)
        s, o = fd.define_scalar(dtype=DataType.Int), fd.define_scalar(dtype=DataType.Int)
        at = fd.ops.permute(a, [1, 0])
        noise = fd.ops.uniform(-1.0, 1.0, fd.ops.shape(at), rng_seed=s, rng_offset=o)
        fd.add_output(noise)
        fd.add_output(fd.ops.mul(at, noise))
    x = rand((1000, 520), torch.float32, gen)
    noise, prod = fd.execute([x, 1234, 5])
    tiled(fd)
    want_noise, want_prod = fd.execute([x.cpu(), 1234, 5])
    assert torch.equal(noise.cpu(), want_noise)
    close(prod.cpu(), want_prod)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_outputs_in_another_stride_order(dtype, gen):
    # Note [Output layouts]: written in their order by the tiled kernel, not copied after
    with FusionDefinition() as fd:
        a, b = tensor(fd, 3, dtype), tensor(fd, 3, dtype)
        y = fd.ops.add(fd.ops.permute(a, [0, 2, 1]), b)
        fd.add_output(y)
        fd.add_output(fd.ops.mul(y, fd.define_scalar(3.0)), stride_order=[2, 0, 1])
        fd.add_output(fd.ops.stride_order(fd.ops.neg(b), [0, 1, 2]))
    x, z = rand((3, 777, 1030), dtype, gen), rand((3, 1030, 777), dtype, gen)
    y, y3, nb = fd.execute([x, z])
    want = x.permute(0, 2, 1) + z
    close(y, want)
    close(y3, want * 3)
    close(nb, -z)
    assert y3.stride() == (1030 * 777, 1, 1030) and nb.stride() == (1, 3, 3 * 1030)
    # y3 runs along the transposed input's dim (through a tile); -b along dim 0, neither A
    # nor B, a value at a time
    assert "stores=vec,tile,elem" in tiled(fd)
