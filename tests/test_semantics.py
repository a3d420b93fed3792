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


def test_num_fusions_counts_definitions_not_segments():
    fc = FusionCache.get()
    before = fc.num_fusions()
    with FusionDefinition() as fd:
        t0 = fd.define_tensor(shape=[-1, -1], contiguity=True, dtype=DataType.Float)
        fd.add_output(fd.ops.exp(fd.ops.segment_set(fd.ops.neg(t0))))
    x = torch.empty(8, 16, device="meta")
    assert len(fd.segment([x])) == 2  # two segment definitions now exist ...
    fd.precompile([x], target="h100")
    assert fc.num_fusions() == before + 1  # ... but one fusion was defined
    with FusionDefinition() as again:  # the same definition: no new fusion
        t0 = again.define_tensor(shape=[-1, -1], contiguity=True, dtype=DataType.Float)
        again.add_output(again.ops.exp(again.ops.segment_set(again.ops.neg(t0))))
    assert fc.num_fusions() == before + 1 and again.id() == fd.id()


def test_max_fusions_bounds_the_cache():
    FusionCache.reset()
    fc = FusionCache.get(max_fusions=2)
    for k in range(2):
        with FusionDefinition() as fd:
            fd.add_output(fd.ops.add(fd.define_tensor(shape=[-1], contiguity=True), float(k)))
    with pytest.raises(RuntimeError, match="exceeded 2 fusions"):
        with FusionDefinition() as fd:
            fd.add_output(fd.ops.add(fd.define_tensor(shape=[-1], contiguity=True), 7.0))
    with pytest.raises(ValueError, match="less than the number of fusions"):
        FusionCache.get(max_fusions=1)
    assert FusionCache.get(max_fusions=3) is fc and fc.num_fusions() == 2


def test_serialize_and_deserialize_through_a_bundle(tmp_path):
    def body(fd):
        t0 = fd.define_tensor(shape=[-1, -1], contiguity=True, dtype=DataType.Float)
        fd.add_output(fd.ops.sum(fd.ops.mul(t0, 3.0), [1]))

    with FusionDefinition() as fd:
        body(fd)
    path = str(tmp_path / "cache.zip")
    FusionCache.get().serialize(path)
    # another store: the fusion comes back with deserialize, and defining it again finds it
    import os

    os.environ["FUSION_CACHE_DIR"] = str(tmp_path / "other")
    FusionCache.reset()
    fc = FusionCache.get()
    fc.deserialize(path)
    assert fc.num_fusions() == 1
    with FusionDefinition() as fd2:
        body(fd2)
    assert fc.num_fusions() == 1
    x = torch.randn(3, 5)
    torch.testing.assert_close(fd2.execute([x])[0], (x * 3).sum(1))


def test_an_error_inside_with_leaves_the_cache_consistent():
    fc = FusionCache.get()
    before = fc.num_fusions()

    def bad(fd):
        t0 = fd.define_tensor(shape=[-1, -1], contiguity=True, dtype=DataType.Float)
        fd.ops.permute(t0, [0, 0])

    for _ in range(2):  # the same bad definition raises the same error again
        with pytest.raises(ValueError, match="permute"):
            with FusionDefinition() as fd:
                bad(fd)
    assert fc.num_fusions() == before
    with FusionDefinition() as ok:
        t0 = ok.define_tensor(shape=[-1, -1], contiguity=True, dtype=DataType.Float)
        ok.add_output(ok.ops.permute(t0, [1, 0]))
    assert fc.num_fusions() == before + 1
    x = torch.randn(2, 3)
    assert torch.equal(ok.execute([x])[0], x.t())


def test_error_types_and_messages_clients_match():
    with pytest.raises(NotImplementedError):
        FusionDefinition().execute([torch.randn(4, 4)])  # nvFuser's test_no_definition
    with FusionDefinition() as fd:
        fd.add_output(fd.ops.relu(fd.define_tensor(shape=[-1], contiguity=True)))
    for query in (fd.last_cuda_code, fd.last_scheduled_fusion_ir):
        with pytest.raises(RuntimeError, match="Invalid fusion definition!"):
            query()
    with pytest.raises(RuntimeError, match="Attempting to add to a completed definition!"):
        fd.add_output(fd.define_tensor(shape=[-1], contiguity=True))


@pytest.mark.parametrize("value,dtype,torch_dtype", [
    (3.0, None, torch.float64), (3.0, DataType.Float, torch.float32),
    (3, DataType.Int32, torch.int32), (3, None, torch.int64),
    (complex(3.0), None, torch.complex128), (3.0 + 0j, DataType.ComplexFloat, torch.complex64),
    (True, DataType.Bool, torch.bool),
])  # fmt: skip
def test_where_of_scalar_branches_takes_their_dtype(value, dtype, torch_dtype):
    # nvFuser's test_where_dtypes: scalar branches keep their dtype (torch would default)
    cond = torch.arange(2).bool()
    with FusionDefinition() as fd:
        t0 = fd.from_pytorch(cond)
        a = fd.define_scalar(value, dtype) if dtype else fd.define_scalar(value)
        b = fd.define_scalar(type(value)(0), dtype) if dtype else fd.define_scalar(type(value)(0))
        fd.add_output(fd.ops.where(t0, a, b))
    (out,) = fd.execute([cond])
    assert out.dtype == torch_dtype
    assert out.tolist() == [type(value)(0), value]


def test_where_of_tensor_branches_promotes_as_torch():
    pred = torch.tensor([True, False, True])
    for a_dt in (torch.float16, torch.float32, torch.bfloat16):
        for b_dt in (torch.float16, torch.float32, torch.bfloat16):
            a, b = torch.randn(3, dtype=a_dt), torch.randn(3, dtype=b_dt)
            with FusionDefinition() as fd:
                ts = [fd.define_tensor(sizes=t.shape, strides=t.stride(), dtype=d)
                      for t, d in ((pred, DataType.Bool), (a, None), (b, None)) if d]  # fmt: skip
                ta = fd.from_pytorch(a)
                tb = fd.from_pytorch(b)
                fd.add_output(fd.ops.where(ts[0], ta, tb))
            out = fd.execute([pred, a, b])[0]
            assert out.dtype == torch.where(pred, a, b).dtype
            assert torch.equal(out, torch.where(pred, a, b))


def test_extents_index_the_input_sizes():
    with FusionDefinition() as fd:
        t0 = fd.define_tensor(shape=[-1, -1], contiguity=True)
        s = fd.define_scalar(dtype=DataType.Double)
        t1 = fd.define_tensor(shape=[-1], contiguity=True)
        fd.add_output(fd.ops.add(fd.ops.mul(t0, s), t1))
    ext = fd.extents()
    assert len(ext) == 3 and len(set(ext + fd.inputs())) == 3 + len(fd.inputs())
    assert min(ext) >= len(fd._infos)


def test_validate_against_the_reference_and_given_outputs():
    with FusionDefinition() as fd:
        t0 = fd.define_tensor(shape=[-1, -1], contiguity=True)
        fd.add_output(fd.ops.sum(fd.ops.exp(t0), [1]))
    x = torch.randn(4, 100)
    fd.validate([x])
    fd.validate([x], [torch.exp(x).sum(1)])
    with pytest.raises(AssertionError, match="output 0"):
        fd.validate([x], [torch.exp(x).sum(1) + 1])
    with pytest.raises(AssertionError, match="dimensions"):
        fd.validate([x], [torch.zeros(3)])


def test_scheduled_fusion_ir_for_plans_without_running():
    with FusionDefinition() as fd:
        t0 = fd.define_tensor(shape=[-1, -1], contiguity=True)
        fd.add_output(fd.ops.sum(fd.ops.exp(t0), [1]))
    text = fd.scheduled_fusion_ir_for([torch.empty(64, 1024, device="meta")])
    assert "scheduler: reduction" in text and "kernel fc_" in text


def test_zero_size_tensors_everywhere():
    for shape in [(0, 7), (5, 0), (0,), (0, 0)]:
        x = torch.randn(shape)
        with FusionDefinition() as fd:
            t0 = fd.from_pytorch(x)
            m = fd.ops.max(t0, [-1], keepdim=True) if shape[-1] else fd.ops.sum(t0, [-1], keepdim=True)
            s = fd.ops.sub(t0, m)
            lse = fd.ops.log(fd.ops.sum(fd.ops.exp(s), [-1], keepdim=True))
            fd.add_output(fd.ops.sub(s, lse))  # log-softmax
            fd.add_output(fd.ops.sum(t0, [0]))
            fd.add_output(fd.ops.relu(t0))
        ls, total, r = fd.execute([x])
        assert ls.shape == x.shape and r.shape == x.shape
        torch.testing.assert_close(total, x.sum(0))


@pytest.mark.parametrize("shape", [(0, 16), (16, 0), (0, 0)])
def test_empty_reductions_plan_without_the_reference(shape):
    """Note [Empty reductions]: rows over nothing are their identities; no segment of the
    plan is left to the reference evaluator (planned for the h100 profile, not run)."""
    with FusionDefinition() as fd:
        t0 = fd.define_tensor(shape=[-1, -1], contiguity=True)
        m = fd.ops.max(t0, [1], keepdim=True)
        s = fd.ops.sub(t0, m)
        lse = fd.ops.log(fd.ops.sum(fd.ops.exp(s), [1], keepdim=True))
        fd.add_output(fd.ops.sub(s, lse))
        fd.add_output(fd.ops.max(t0, [1]))
    fd.precompile([torch.empty(shape, device="meta")], target="h100")
    plan = FusionCache.get().executors[fd.id()].last_plan
    text = getattr(plan, "description", "") or plan.spec.description
    assert "reference" not in text, text
    x = torch.randn(shape)
    log_softmax, top = fd.execute([x])
    assert log_softmax.shape == shape and top.shape == (shape[0],)
    if shape[0]:
        assert torch.equal(top, torch.full((shape[0],), -torch.inf))


def test_set_of_an_input_is_a_copy():
    """Thunder's clone is fd.ops.set, and the frontends pass inputs through with it."""
    x = torch.randn(3, 4)
    with FusionDefinition() as fd:
        fd.add_output(fd.ops.set(fd.from_pytorch(x)))
    (out,) = fd.execute([x])
    assert torch.equal(out, x) and out.untyped_storage().data_ptr() != x.untyped_storage().data_ptr()
