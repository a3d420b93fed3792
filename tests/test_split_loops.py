"""Note [Split loops] (schedulers/loop_split.py): a reshape that merges dims whose strides do
not nest (a stacked pair flattened, heads expanded over their group and merged) splits the
pointwise loop instead of ending the kernel. The kernels run on the host (tests/host_kernels.py)
against torch on fresh random inputs; the plans are counted for the h100."""
from __future__ import annotations

import pytest
import torch
from host_kernels import HAVE_GXX, run_plan_on_host

from fusion_cache import DataType, FusionDefinition
from fusion_cache.frontend.dtypes import from_torch as to_dtype
from fusion_cache.runtime.executor import executor_for
from fusion_cache.runtime.plans import LaunchPlan

needs_gxx = pytest.mark.skipif(not HAVE_GXX, reason="no g++ to run kernels on the host")
DTYPES = [torch.float32, torch.bfloat16]


def _pairs(fd, x, h, d, cos, sin, b=2, t=6):
    """RoPE on interleaved pairs of x [b, t, h, d] as the Llama-style model writes it: the
    pairs unbound, rotated, stacked on a new innermost dim and flattened back to d."""
    pairs = fd.ops.reshape(x, new_shape=[b, t, h, d // 2, 2])
    ends = [b, t, h, d // 2]
    x1 = fd.ops.squeeze(fd.ops.slice(pairs, [0] * 5, [*ends, 1], [1] * 5), dims=[4])
    x2 = fd.ops.squeeze(fd.ops.slice(pairs, [0, 0, 0, 0, 1], [*ends, 2], [1] * 5), dims=[4])
    r1 = fd.ops.sub(fd.ops.mul(x1, cos), fd.ops.mul(x2, sin))
    r2 = fd.ops.add(fd.ops.mul(x1, sin), fd.ops.mul(x2, cos))
    new = [False] * 4 + [True]
    stacked = fd.ops.cat([fd.ops.broadcast(r1, new), fd.ops.broadcast(r2, new)], dim=4)
    return fd.ops.reshape(stacked, new_shape=[b, t, h, d])


def _rope_ref(x, cos, sin):
    b, t, h, d = x.shape
    x1, x2 = x.float().reshape(b, t, h, d // 2, 2).unbind(-1)
    out = torch.stack((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1)
    return out.flatten(3)


def _key_heads(dtype, kv=2, group=3, d=8, b=2, t=6):
    """RoPE'd key heads expanded over their query heads: [b, t, kv, group, d]."""
    with FusionDefinition() as fd:
        cos = fd.define_tensor(shape=[1, -1, 1, -1], contiguity=[None, True, None, True])
        sin = fd.define_tensor(shape=[1, -1, 1, -1], contiguity=[None, True, None, True])
        k = fd.define_tensor(shape=[-1, -1, -1, -1], contiguity=[True] * 4, dtype=to_dtype(dtype))
        rot = fd.ops.cast(_pairs(fd, fd.ops.cast(k, DataType.Float), kv, d, cos, sin, b, t),
                          to_dtype(dtype))  # fmt: skip
        wide = fd.ops.broadcast(rot, [False, False, False, True, False])
        fd.add_output(fd.ops.expand(wide, shape=[b, t, kv, group, d]))
    return fd


def _inputs(dtype, kv=2, d=8):
    cos, sin = torch.randn(1, 6, 1, d // 2), torch.randn(1, 6, 1, d // 2)
    return [cos, sin, torch.randn(2, 6, kv, d, dtype=dtype)]


def _tol(dtype):
    return {"rtol": 2e-2, "atol": 2e-2} if dtype == torch.bfloat16 else {}


@needs_gxx
@pytest.mark.parametrize("dtype", DTYPES)
def test_rope_then_expand_is_one_kernel(dtype):
    fd = _key_heads(dtype)
    cos, sin, k = inputs = _inputs(dtype)
    launches: list = []
    (got,) = run_plan_on_host(fd, inputs, launches)
    assert len(launches) == 1 and isinstance(executor_for(fd).last_plan, LaunchPlan)
    want = _rope_ref(k, cos, sin).to(dtype)[:, :, :, None].expand(2, 6, 2, 3, 8)
    torch.testing.assert_close(got, want, **_tol(dtype))


@needs_gxx
@pytest.mark.parametrize("dtype", DTYPES)
def test_stack_flattened_into_an_output(dtype):
    """The flatten is the output itself, read again by a multiply in the same kernel."""
    with FusionDefinition() as fd:
        cos = fd.define_tensor(shape=[1, -1, 1, -1], contiguity=[None, True, None, True])
        sin = fd.define_tensor(shape=[1, -1, 1, -1], contiguity=[None, True, None, True])
        x = fd.define_tensor(shape=[-1, -1, -1, -1], contiguity=[True] * 4, dtype=to_dtype(dtype))
        rot = _pairs(fd, fd.ops.cast(x, DataType.Float), 4, 16, cos, sin)
        fd.add_output(fd.ops.cast(rot, to_dtype(dtype)))
        fd.add_output(fd.ops.mul(rot, rot))
    cos, sin, x = inputs = [torch.randn(1, 6, 1, 8), torch.randn(1, 6, 1, 8),
                            torch.randn(2, 6, 4, 16, dtype=dtype)]
    launches: list = []
    got = run_plan_on_host(fd, inputs, launches)
    want = _rope_ref(x, cos, sin)
    assert len(launches) == 1
    torch.testing.assert_close(got[0], want.to(dtype), **_tol(dtype))
    torch.testing.assert_close(got[1], want * want, **_tol(dtype))


@needs_gxx
@pytest.mark.parametrize("dtype", DTYPES)
def test_heads_expanded_and_merged_read_in_a_kernel(dtype):
    """Grouped-query attention's value heads expanded and merged to the query heads' count
    (stride 0 merged with the head dim), added to a tensor of that shape in one kernel."""
    with FusionDefinition() as fd:
        v = fd.define_tensor(shape=[-1, -1, -1, -1], contiguity=[True] * 4, dtype=to_dtype(dtype))
        y = fd.define_tensor(shape=[-1, -1, -1, -1], contiguity=[True] * 4, dtype=to_dtype(dtype))
        wide = fd.ops.expand(fd.ops.broadcast(v, [False, False, False, True, False]),
                             shape=[2, 5, 2, 3, 8])
        heads = fd.ops.reshape(wide, new_shape=[2, 5, 6, 8])
        fd.add_output(fd.ops.add(heads, y))
    v, y = inputs = [torch.randn(2, 5, 2, 8, dtype=dtype), torch.randn(2, 5, 6, 8, dtype=dtype)]
    launches: list = []
    (got,) = run_plan_on_host(fd, inputs, launches)
    want = v[:, :, :, None].expand(2, 5, 2, 3, 8).reshape(2, 5, 6, 8) + y
    assert len(launches) == 1
    torch.testing.assert_close(got, want, **_tol(dtype))


@needs_gxx
@pytest.mark.parametrize("dtype", DTYPES)
def test_query_and_key_heads_in_one_kernel(dtype):
    """Note [Outputs of other shapes]: the query heads' RoPE [b, t, h, d] beside the key heads'
    expanded over their groups [b, t, kv, g, d]: one loop, both written as it runs."""
    with FusionDefinition() as fd:
        cos = fd.define_tensor(shape=[1, -1, 1, -1], contiguity=[None, True, None, True])
        sin = fd.define_tensor(shape=[1, -1, 1, -1], contiguity=[None, True, None, True])
        q = fd.define_tensor(shape=[2, 6, 6, 8], contiguity=[True] * 4, dtype=to_dtype(dtype))
        k = fd.define_tensor(shape=[2, 6, 2, 8], contiguity=[True] * 4, dtype=to_dtype(dtype))
        fd.add_output(fd.ops.cast(_pairs(fd, fd.ops.cast(q, DataType.Float), 6, 8, cos, sin),
                                  to_dtype(dtype)))  # fmt: skip
        rot = fd.ops.cast(_pairs(fd, fd.ops.cast(k, DataType.Float), 2, 8, cos, sin), to_dtype(dtype))
        fd.add_output(fd.ops.expand(fd.ops.broadcast(rot, [False, False, False, True, False]),
                                    shape=[2, 6, 2, 3, 8]))  # fmt: skip
    cos, sin = torch.randn(1, 6, 1, 4), torch.randn(1, 6, 1, 4)
    q, k = torch.randn(2, 6, 6, 8, dtype=dtype), torch.randn(2, 6, 2, 8, dtype=dtype)
    launches: list = []
    got = run_plan_on_host(fd, [cos, sin, q, k], launches)
    assert len(launches) == 1
    assert got[0].shape == (2, 6, 6, 8) and got[1].shape == (2, 6, 2, 3, 8)
    torch.testing.assert_close(got[0], _rope_ref(q, cos, sin).to(dtype), **_tol(dtype))
    want_k = _rope_ref(k, cos, sin).to(dtype)[:, :, :, None].expand(2, 6, 2, 3, 8)
    torch.testing.assert_close(got[1], want_k, **_tol(dtype))


@needs_gxx
def test_outputs_of_other_shapes_and_a_transposed_read():
    """A [4, 6] output beside a flat [24] one reading a transposed input: one loop."""
    with FusionDefinition() as fd:
        x = fd.define_tensor(shape=[4, 6], dtype=DataType.Float)
        y = fd.define_tensor(shape=[24], contiguity=[True], dtype=DataType.Float)
        fd.add_output(fd.ops.exp(x))
        fd.add_output(fd.ops.add(fd.ops.reshape(fd.ops.exp(x), [24]), y))
    x, y = torch.randn(6, 4).t(), torch.randn(24)
    launches: list = []
    got = run_plan_on_host(fd, [x, y], launches)
    assert len(launches) == 1
    torch.testing.assert_close(got[0], torch.exp(x))
    torch.testing.assert_close(got[1], torch.exp(x).reshape(24) + y)


def test_outputs_of_other_sizes_are_two_kernels():
    with FusionDefinition() as fd:
        x = fd.define_tensor(shape=[4, 6], contiguity=[True] * 2, dtype=DataType.Float)
        y = fd.define_tensor(shape=[3, 5], contiguity=[True] * 2, dtype=DataType.Float)
        fd.add_output(fd.ops.exp(x))
        fd.add_output(fd.ops.exp(y))
    refs = fd.precompile([torch.empty(4, 6, device="meta"), torch.empty(3, 5, device="meta")],
                         target="h100")  # fmt: skip
    assert len(refs) == 2 and not isinstance(executor_for(fd).last_plan, LaunchPlan)


def test_same_size_with_symbolic_shapes_is_still_one_loop():
    """Outputs whose defined shapes may be equal take the loop's shape at plan time, and a
    run where they differ is refused there (two kernels), as before."""
    with FusionDefinition() as fd:
        x = fd.define_tensor(shape=[-1, -1], contiguity=[True] * 2, dtype=DataType.Float)
        y = fd.define_tensor(shape=[-1, -1], contiguity=[True] * 2, dtype=DataType.Float)
        fd.add_output(fd.ops.exp(x))
        fd.add_output(fd.ops.exp(y))
    fd.precompile([torch.empty(4, 6, device="meta"), torch.empty(4, 6, device="meta")], target="h100")
    assert isinstance(executor_for(fd).last_plan, LaunchPlan)
    fd.precompile([torch.empty(4, 6, device="meta"), torch.empty(3, 8, device="meta")], target="h100")
    assert not isinstance(executor_for(fd).last_plan, LaunchPlan)


def test_switched_off_the_merge_is_a_kernel_boundary(monkeypatch):
    """FUSION_CACHE_SPLIT_LOOPS=0: the key heads' RoPE and their expansion are two kernels,
    as before the loop could split."""
    monkeypatch.setenv("FUSION_CACHE_SPLIT_LOOPS", "0")
    fd = _key_heads(torch.float32)
    refs = fd.precompile([t.to("meta") for t in _inputs(torch.float32)], target="h100")
    assert len(refs) == 2 and not isinstance(executor_for(fd).last_plan, LaunchPlan)
