"""Outputs in a stride order (Note [Output layouts]): `add_output(t, stride_order=...)`, its
positional spelling and `fd.ops.stride_order`, in nvFuser's convention (stride_order[i] is
dim i's rank by stride, 0 innermost). On the CPU the reference lays them out; ahead-of-time
plans show the kernel writing them through their strides (the GPU run is in
tests/gpu/test_output_layout_gpu.py)."""
from __future__ import annotations

import itertools

import pytest
import torch

from fusion_cache import DataType, FusionDefinition
from fusion_cache.frontend.trie import FusionCache
from fusion_cache.ir.output_layout import strides_for


def assert_in_order(out: torch.Tensor, perm) -> None:
    """nvFuser's check: strides sorted by the order's ranks descend."""
    stride = out.stride()
    rank = len(stride)
    ranked = list(stride)
    for idx, axis in enumerate(perm):
        ranked[rank - 1 - axis] = stride[idx]
    assert sorted(ranked, reverse=True) == ranked, (perm, stride)


def add3(fd, x, how, perm):
    t1 = fd.ops.add(fd.from_pytorch(x), fd.define_scalar(3.0))
    if how == "keyword":
        fd.add_output(t1, stride_order=perm)
    elif how == "positional":
        fd.add_output(t1, perm)
    else:
        fd.add_output(fd.ops.stride_order(t1, perm))


@pytest.mark.parametrize("how", ["keyword", "positional", "op"])
def test_every_permutation_on_the_reference(how):
    x = torch.randn(2, 3, 4, 5)
    for perm in itertools.permutations(range(4)):
        with FusionDefinition() as fd:
            add3(fd, x, how, list(perm))
        (out,) = fd.execute([x])
        assert torch.equal(out, x + 3)
        assert out.stride() == tuple(strides_for(x.shape, perm))
        assert_in_order(out, perm)


def test_stride_order_of_an_intermediate_changes_nothing():
    x = torch.randn(3, 4)
    with FusionDefinition() as fd:
        t0 = fd.from_pytorch(x)
        t1 = fd.ops.stride_order(fd.ops.exp(t0), [0, 1])
        fd.add_output(fd.ops.mul(t1, 2.0))
    (out,) = fd.execute([x])
    torch.testing.assert_close(out, torch.exp(x) * 2)
    assert out.is_contiguous()


def test_stride_order_checks():
    with pytest.raises(ValueError, match="same length as input"):
        with FusionDefinition() as fd:
            fd.ops.stride_order(fd.define_tensor(shape=[-1, -1], contiguity=True), [0])
    with pytest.raises(ValueError, match="repeats"):
        with FusionDefinition() as fd:
            fd.ops.stride_order(fd.define_tensor(shape=[-1, -1], contiguity=True), [0, 0])
    for bad, msg in (([0], "same length"), ([0, 2], "within"), ([1, 1], "duplicated")):
        with pytest.raises(ValueError, match=msg):
            with FusionDefinition() as fd:
                fd.add_output(fd.define_tensor(shape=[-1, -1], contiguity=True), stride_order=bad)


def test_the_op_and_the_keyword_print_and_replay():
    with FusionDefinition() as fd:
        t0 = fd.define_tensor(shape=[-1, -1, -1], contiguity=True)
        fd.add_output(fd.ops.stride_order(fd.ops.neg(t0), [0, 2, 1]))
        fd.add_output(fd.ops.abs(t0), [1, 0, 2])
    text = repr(fd)
    assert "fd.ops.stride_order(T1, stride_order=[0, 2, 1])" in text
    assert "fd.add_output(T3, stride_order=[1, 0, 2])" in text
    again = FusionDefinition(fd.id())
    assert repr(again) == text


def _plan_outputs(fd, inputs):
    fd.precompile(inputs, target="h100")
    ex = FusionCache.get().executors[fd.id()]
    return ex.last_plan


@pytest.mark.parametrize("perm", [[0, 1, 2], [1, 2, 0], [2, 0, 1]])
def test_pointwise_plan_writes_the_order_in_the_kernel(perm):
    with FusionDefinition() as fd:
        t0 = fd.define_tensor(shape=[-1, -1, -1], contiguity=True, dtype=DataType.Float)
        fd.add_output(fd.ops.stride_order(fd.ops.sin(t0), perm))
    shape = (8, 16, 32)
    plan = _plan_outputs(fd, [torch.empty(shape, device="meta")])
    (out,) = plan.spec.outputs
    assert out.strides == tuple(strides_for(shape, perm))
    assert plan.fresh[0][2] == out.strides  # what the executor allocates
    (kernel,) = plan.spec.kernels
    # the store's per-dim strides are kernel arguments: the permuted layout is written there,
    # by the pointwise kernel, or by the tiled one where the order moves the innermost dim
    # and tiles pay (Note [Transpose tiles]: [2, 0, 1] runs along dim 1 of 16)
    tiled = perm == [2, 0, 1]
    assert plan.spec.scheduler == ("transpose" if tiled else "pointwise"), plan.spec.description
    assert kernel.name == ("fc_transpose" if tiled else "fc_pointwise")


def test_reduction_plan_writes_the_order_in_the_kernel():
    with FusionDefinition() as fd:
        t0 = fd.define_tensor(shape=[-1, -1, -1], contiguity=True, dtype=DataType.Float)
        fd.add_output(fd.ops.sum(t0, [2]), stride_order=[0, 1])  # column-major [8, 16]
    plan = _plan_outputs(fd, [torch.empty(8, 16, 32, device="meta")])
    assert plan.spec.scheduler == "reduction"
    assert plan.spec.outputs[0].strides == (1, 8)
