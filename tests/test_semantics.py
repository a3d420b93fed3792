"""nvFuser's semantics that its tests and its clients rely on, each against what nvFuser
documents or asserts: layouts of inputs (contiguity in allocation order, expanded
broadcasts), compute_contiguity / compute_tensor_descriptor, aliases and views of inputs,
the cache's counts, where's promotion, error messages clients match, empty tensors."""
from __future__ import annotations

import pytest
import torch

from fusion_cache import (
    DataType,
    FusionCache,
    FusionDefinition,
    compute_contiguity,
    compute_tensor_descriptor,
)

# (sizes, strides, contiguity in allocation order, stride order), as nvFuser's tests expect
DESCRIPTORS = [
    ([2, 1, 3, 1, 4, 3], [12, 4, 4, 4, 1, 0], [True, None, True, None, True, None], [5, 4, 3, 2, 1, 0]),
    ([2, 3, 1, 5, 4], [28, 4, 14, 0, 1], [False, None, True, None, True], [4, 2, 3, 1, 0]),
    ([2, 2, 1, 1, 2, 2, 2], [8, 4, 3, 9, 2, 0, 1], [None, True, True, None, True, None, True],
     [5, 4, 3, 6, 2, 1, 0]),
    ([2, 2, 1, 2, 4, 2], [2, 32, 1, 8, 0, 4], [False, True, True, False, None, None], [2, 5, 0, 4, 1, 3]),
    ([2, 2, 2, 2], [8, 4, 2, 1], [True, True, True, True], [3, 2, 1, 0]),
    ([2, 1, 3, 1, 4], [24, 4, 8, 4, 2], [True, True, None, None, False], [4, 2, 3, 1, 0]),
    ([2, 2, 2, 2], [8, 4, 0, 2], [True, True, None, False], [3, 2, 1, 0]),
]  # fmt: skip


@pytest.mark.parametrize("sizes,strides,contiguity,order", DESCRIPTORS)
def test_compute_tensor_descriptor(sizes, strides, contiguity, order):
    assert compute_tensor_descriptor(sizes, strides) == (contiguity, order)


def test_compute_contiguity_is_per_logical_dim_and_none_for_broadcasts():
    sizes = [2, 1, 3, 1, 4, 5, 6]
    assert compute_contiguity(sizes, [80, 30, 30, 456456465465, 0, 6, 1]) == [
        False, None, True, None, None, True, True]  # fmt: skip
    assert compute_contiguity(sizes, [800, 300, 300, 456456465465, 0, 60, 10]) == [
        False, None, True, None, None, True, False]  # fmt: skip
    with pytest.raises(ValueError, match="same number of dimensions"):
        compute_contiguity([2, 3], [1])
    with pytest.raises(ValueError, match="negative stride"):
        compute_tensor_descriptor([2, 3], [3, -1])


def layouts():
    base = torch.randn(5 * 960)
    return [
        torch.randn(3, 4, 5),
        torch.randn(5, 4, 3).permute(2, 1, 0),
        torch.randn(3, 1, 5).expand(3, 4, 5),                     # expanded middle dim
        torch.randn(2, 3).unsqueeze(-1).expand(2, 3, 4).transpose(2, 0),
        base.as_strided((5, 4, 1, 5, 16), (960, 48, 16, 192, 1)),
        torch.randn(6).as_strided((2, 16, 3), (3, 0, 1)),
        torch.randn(4, 6)[:, ::2],                                 # not contiguous
    ]


@pytest.mark.parametrize("k", range(7))
def test_thunders_descriptor_round_trip(k):
    """Thunder defines each input from compute_tensor_descriptor's contiguity and stride
    order; the same tensor must then be accepted and read (expanded dims without copies)."""
    x = layouts()[k]
    contiguity, order = compute_tensor_descriptor(x.shape, x.stride())
    shape = [1 if n == 1 else -1 for n in x.shape]
    with FusionDefinition() as fd:
        t0 = fd.define_tensor(shape=shape, contiguity=contiguity, dtype=DataType.Float,
                              stride_order=order)  # fmt: skip
        fd.add_output(fd.ops.mul(t0, 2.0))
    (out,) = fd.execute([x])
    torch.testing.assert_close(out, x * 2)
    # and from_pytorch, which does the same
    with FusionDefinition() as fd2:
        fd2.add_output(fd2.ops.mul(fd2.from_pytorch(x), 2.0))
    torch.testing.assert_close(fd2.execute([x])[0], x * 2)


def test_contiguity_is_in_allocation_order_with_a_stride_order():
    # nvFuser's test_stride_order_with_explicit_broadcast: dim 1 is outermost and expanded
    x = torch.randn(6).as_strided((2, 16, 3), (3, 0, 1))
    with FusionDefinition() as fd:
        t3 = fd.define_tensor(shape=[-1, 16, 3], contiguity=[None, True, True],
                              dtype=DataType.Float, stride_order=[1, 2, 0])  # fmt: skip
        fd.add_output(fd.ops.mul(t3, 3.0))
    torch.testing.assert_close(fd.execute([x])[0], x * 3.0)
    # issue 1953's layout: contiguous in allocation order [0, 2, 1, 3], not in logical order
    y = torch.randn(2 * 4 * 6 * 8).as_strided((2, 6, 4, 8), (192, 8, 48, 1))
    with FusionDefinition() as fd:
        t = fd.define_tensor(shape=[-1, -1, -1, -1], contiguity=[True, True, True, True],
                             dtype=DataType.Float, stride_order=[3, 1, 2, 0])  # fmt: skip
        fd.add_output(fd.ops.neg(t))
    torch.testing.assert_close(fd.execute([y])[0], -y)
    with pytest.raises(ValueError, match="stride order"):
        fd.execute([y.contiguous()])  # row-major is not that allocation order


def test_expanded_broadcast_inputs():
    # nvFuser's test_expanded_bcast_tensor and test_issue1393
    inputs = [torch.tensor(1.5), torch.randn(5, 5, 5),
              torch.randint(0, 2, (5, 5)).bool().unsqueeze(-1).expand(5, 5, 5)]  # fmt: skip
    with FusionDefinition() as fd:
        t0, t1, t2 = (fd.from_pytorch(x) for x in inputs)
        fd.add_output(fd.ops.add(t2, fd.ops.add(t0, t1)))
    torch.testing.assert_close(fd.execute(inputs)[0], inputs[0] + inputs[1] + inputs[2])

    a = torch.randn(5, dtype=torch.float16).as_strided((3, 4, 5), (0, 0, 1))
    b = torch.randn(3, dtype=torch.float16).as_strided((3, 4), (1, 0))
    with FusionDefinition() as fd:
        t0 = fd.define_tensor(shape=[-1, -1, -1], contiguity=[None, None, True], dtype=DataType.Half)
        t1 = fd.define_tensor(shape=[-1, -1], contiguity=[True, None], dtype=DataType.Half)
        prod = fd.ops.mul(fd.ops.cast(t0, DataType.Float),
                          fd.ops.broadcast_in_dim(fd.ops.cast(t1, DataType.Float), [3, 4, 5], [0, 1]))  # fmt: skip
        fd.add_output(fd.ops.cast(prod, DataType.Half))
    torch.testing.assert_close(fd.execute([a, b])[0], a * b.unsqueeze(-1))
    # a dim declared expanded must come with stride 0
    with pytest.raises(ValueError, match="expanded broadcast"):
        fd.execute([torch.randn(3, 4, 5, dtype=torch.float16), b])


def test_reduction_of_an_expanded_input():
    x = torch.tensor(1.0).as_strided((2, 3), (0, 0))
    for keepdim in (False, True):
        with FusionDefinition() as fd:
            t0 = fd.define_tensor(shape=[-1, -1], contiguity=[None, None], dtype=DataType.Float,
                                  stride_order=[1, 0])  # fmt: skip
            fd.add_output(fd.ops.sum(t0, dims=[0], keepdim=keepdim))
        torch.testing.assert_close(fd.execute([x])[0], x.sum(0, keepdim=keepdim))


def test_outputs_written_into_an_input_return_that_input():
    # nvFuser's test_returning_aliased_outputs and test_alias_output_to_input
    x = torch.randn(1, 2, 3, 4)
    expect = torch.where(x > 0, x, 0.0)
    with FusionDefinition() as fd:
        t0 = fd.define_tensor(shape=[-1] * 4, contiguity=[True] * 4, dtype=DataType.Float)
        t4 = fd.ops.where(fd.ops.gt(t0, 0.0), t0, 0.0)
        fd.add_output(t4)
        fd.add_output(t4, t0)  # written into t0, and not returned for this record
        fd.add_output(t4)
        fd.add_output(t0)
    outs = fd.execute([x])
    assert len(outs) == 3
    assert all(o.data_ptr() == x.data_ptr() for o in outs)
    torch.testing.assert_close(x, expect)

    y = torch.ones(4, 4)
    with FusionDefinition() as fd:
        t0 = fd.from_pytorch(y)
        t1 = fd.ops.add(t0, 1.0)
        fd.add_output(t1, alias_input=t0)
        fd.add_output(fd.ops.add(t1, 2.0))
    (out,) = fd.execute([y])
    assert torch.equal(out, torch.full((4, 4), 4.0)) and torch.equal(y, torch.full((4, 4), 2.0))


def test_views_of_inputs_are_views():
    # nvFuser's test_mark_alias_pass: a reshape of an input is returned as a view of it
    x = torch.rand(2, 3, 4)
    with FusionDefinition() as fd:
        t = fd.define_tensor([2, 3, 4], contiguity=[True, True, True], dtype=DataType.Float)
        fd.add_output(fd.ops.reshape(t, [2, 12]))
        fd.add_output(fd.ops.permute(t, [2, 0, 1]))
        fd.add_output(fd.ops.slice(t, [0, 1, 0], [2, 3, 4]))
        fd.add_output(fd.ops.broadcast_in_dim(t, [5, 2, 3, 4], [1, 2, 3]))
        fd.add_output(t)
    outs = fd.execute([x])
    expects = [x.reshape(2, 12), x.permute(2, 0, 1), x[:, 1:, :], x.expand(5, 2, 3, 4), x]
    for out, want in zip(outs, expects):
        assert out.untyped_storage().data_ptr() == x.untyped_storage().data_ptr()
        assert torch.equal(out, want)
    # a reshape torch cannot view is computed, as nvFuser does
    y = torch.randn(4, 3).t()
    with FusionDefinition() as fd:
        t = fd.define_tensor(sizes=y.shape, strides=y.stride(), dtype=DataType.Float)
        fd.add_output(fd.ops.reshape(t, [12]))
    (out,) = fd.execute([y])
    assert torch.equal(out, y.reshape(12))
    # a computed output beside a view: the computed one is fresh, the view is a view
    with FusionDefinition() as fd:
        t = fd.from_pytorch(x)
        fd.add_output(fd.ops.exp(t))
        fd.add_output(fd.ops.squeeze(fd.ops.broadcast(t, [True, False, False, False]), [0]))
    e, v = fd.execute([x])
    assert e.untyped_storage().data_ptr() != x.untyped_storage().data_ptr()
    assert v.data_ptr() == x.data_ptr() and torch.equal(v, x)
