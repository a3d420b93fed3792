"""nvFuser conformance on the GPU: outputs in a stride order written by the kernel, fusions
with no tensor input on the current CUDA device, zero-size tensors, and execute's profile
and fallback options (the CPU side is in tests/test_output_layout.py,
tests/test_execute_options.py and tests/test_semantics.py)."""
from __future__ import annotations

import itertools

import pytest
import torch

from fusion_cache import DataType, FusionCache, FusionDefinition
from fusion_cache.ir.output_layout import strides_for

pytestmark = pytest.mark.gpu


def stats():
    return dict(FusionCache.get().stats())


def ran_kernels_only(before):
    after = stats()
    return (after["kernel_launches"] > before["kernel_launches"]
            and after["reference_runs"] == before["reference_runs"])  # fmt: skip


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("how", ["keyword", "op"])
def test_pointwise_outputs_in_every_stride_order(dtype, how):
    x = torch.randn(6, 10, 12, 34, device="cuda").to(dtype)
    for perm in itertools.permutations(range(4)):
        with FusionDefinition() as fd:
            t1 = fd.ops.mul(fd.from_pytorch(x), fd.define_scalar(3.0))
            if how == "keyword":
                fd.add_output(fd.ops.cast(t1, DataType.Float), stride_order=list(perm))
            else:
                fd.add_output(fd.ops.stride_order(fd.ops.cast(t1, DataType.Float), list(perm)))
        before = stats()
        (out,) = fd.execute([x])
        assert ran_kernels_only(before)
        assert out.stride() == tuple(strides_for(x.shape, perm))
        tol = {} if dtype is torch.float32 else {"rtol": 1.6e-2, "atol": 1e-2}
        torch.testing.assert_close(out, (x * 3).float(), **tol)


@pytest.mark.parametrize("order", [[0, 1], [1, 0]])
def test_reduction_output_in_a_stride_order(order):
    x = torch.randn(64, 48, 1000, device="cuda")
    with FusionDefinition() as fd:
        t0 = fd.from_pytorch(x)
        fd.add_output(fd.ops.sum(t0, [2]), stride_order=order)
        fd.add_output(fd.ops.max(t0, [2]), order)
    before = stats()
    total, top = fd.execute([x])
    assert ran_kernels_only(before)
    assert total.stride() == top.stride() == tuple(strides_for((64, 48), order))
    torch.testing.assert_close(total, x.sum(2), rtol=1e-4, atol=1e-3)
    torch.testing.assert_close(top, x.amax(2))


def test_fusion_without_tensor_inputs_runs_on_the_current_device():
    with FusionDefinition() as fd:
        n = fd.define_scalar(dtype=DataType.Int)
        v = fd.define_scalar(dtype=DataType.Double)
        fd.add_output(fd.ops.full([n, 3], v, DataType.Float))
    before = stats()
    (out,) = fd.execute([4, 2.5])
    assert out.device == torch.device("cuda", torch.cuda.current_device())
    assert torch.equal(out, torch.full((4, 3), 2.5, device="cuda"))
    assert stats()["reference_runs"] == before["reference_runs"]
    # the next fusion takes it as a CUDA input, as with nvFuser
    with FusionDefinition() as fd2:
        fd2.add_output(fd2.ops.add(fd2.from_pytorch(out), 1.0))
    assert fd2.execute([out])[0].is_cuda


def test_iota_without_tensor_inputs_is_on_cuda():
    with FusionDefinition() as fd:
        fd.add_output(fd.ops.iota(fd.define_scalar(5, DataType.Int), 2, 3, DataType.Int))
        fd.add_output(fd.ops.iota(fd.define_scalar(4, DataType.Int), 0.5, 0.25, DataType.Float))
    before = stats()
    a, b = fd.execute([])
    assert ran_kernels_only(before)
    assert a.is_cuda and a.tolist() == [2, 5, 8, 11, 14]
    assert b.tolist() == [0.5, 0.75, 1.0, 1.25]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.bool])
@pytest.mark.parametrize("diagonal", [-2, 0, 3])
def test_triu_runs_in_a_pointwise_kernel(dtype, diagonal):
    x = (torch.randn(3, 37, 129, device="cuda") > 0) if dtype is torch.bool else torch.randn(
        3, 37, 129, device="cuda").to(dtype)
    with FusionDefinition() as fd:
        fd.add_output(fd.ops.triu(fd.from_pytorch(x), diagonal))
    before = stats()
    (out,) = fd.execute([x])
    assert ran_kernels_only(before)
    assert torch.equal(out, torch.triu(x, diagonal))


def test_cross_entropy_style_iota_mask():
    logits = torch.randn(64, 50257, device="cuda")
    target = torch.randint(0, 50257, (64,), device="cuda")
    with FusionDefinition() as fd:
        a, t = fd.from_pytorch(logits), fd.from_pytorch(target)
        io = fd.ops.iota(fd.ops.size(a, 1), 0, 1, DataType.Int)
        hit = fd.ops.eq(fd.ops.broadcast_in_dim(io, fd.ops.shape(a), [1]),
                        fd.ops.broadcast_in_dim(t, fd.ops.shape(a), [0]))  # fmt: skip
        fd.add_output(fd.ops.sum(fd.ops.where(hit, a, 0.0), [1]))
    before = stats()
    (out,) = fd.execute([logits, target])
    assert ran_kernels_only(before)
    torch.testing.assert_close(out, logits.gather(1, target[:, None])[:, 0])


@pytest.mark.parametrize("shape", [(0, 7), (5, 0), (0,)])
def test_zero_size_inputs(shape):
    x = torch.randn(shape, device="cuda")
    with FusionDefinition() as fd:
        t0 = fd.from_pytorch(x)
        fd.add_output(fd.ops.exp(t0))
        fd.add_output(fd.ops.sum(t0, [-1]))
        mx = fd.ops.max(t0, [-1], keepdim=True) if x.shape[-1] else fd.ops.sum(t0, [-1], keepdim=True)
        fd.add_output(fd.ops.sub(t0, mx))
    exp, total, centred = fd.execute([x])
    assert exp.shape == x.shape and exp.is_cuda and total.shape == x.sum(-1).shape
    torch.testing.assert_close(total, x.sum(-1))
    assert centred.shape == x.shape


def test_log_softmax_of_a_zero_size_input():
    x = torch.randn(0, 16, device="cuda")
    with FusionDefinition() as fd:
        t0 = fd.from_pytorch(x)
        m = fd.ops.max(t0, [1], keepdim=True)
        s = fd.ops.sub(t0, m)
        lse = fd.ops.log(fd.ops.sum(fd.ops.exp(s), [1], keepdim=True))
        fd.add_output(fd.ops.sub(s, lse))
    (out,) = fd.execute([x])
    assert out.shape == (0, 16) and out.is_cuda


def test_profile_times_each_kernel():
    x = torch.randn(1024, 4096, device="cuda")
    with FusionDefinition() as fd:
        t0 = fd.from_pytorch(x)
        fd.add_output(fd.ops.sum(fd.ops.exp(t0), [1]))
        fd.add_output(fd.ops.sin(t0))
    fd.execute([x])  # compile outside the profiled call
    fd.execute([x], profile=True)
    prof = fd.profile()
    assert prof.ran_on == "kernels" and prof.segments >= 1 and prof.kernel_profiles
    for k in prof.kernel_profiles:
        assert k.name.startswith("fc_") and k.time_ms > 0 and k.effective_bandwidth_gbs > 1
    assert prof.input_bytes >= x.numel() * 4 and prof.output_bytes >= x.numel() * 4
    print(prof)


def test_disable_fallback_option_raises_where_the_reference_would_run(monkeypatch):
    monkeypatch.delenv("FUSION_CACHE_DISABLE_FALLBACK", raising=False)
    x = torch.randn(8, device="cuda", dtype=torch.complex64)
    with FusionDefinition() as fd:
        t0 = fd.from_pytorch(x)
        fd.add_output(fd.ops.asin(t0))  # complex asin: no kernel computes it (README.md)
    with pytest.warns(UserWarning, match="reference evaluator"):
        fd.execute([x])
    with pytest.raises(Exception, match="fallback is disabled"):
        fd.execute([x], _disable_options=["fallback"])


def test_views_and_aliases_on_the_gpu():
    x = torch.rand(2, 3, 4, device="cuda")
    with FusionDefinition() as fd:
        t = fd.from_pytorch(x)
        fd.add_output(fd.ops.reshape(t, [2, 12]))
        fd.add_output(fd.ops.permute(t, [2, 0, 1]))
    before = stats()
    a, b = fd.execute([x])
    assert stats()["kernel_launches"] == before["kernel_launches"]  # views: no kernel
    assert a.data_ptr() == b.data_ptr() == x.data_ptr()
    y = torch.randn(1, 2, 3, 4, device="cuda")
    expect = torch.where(y > 0, y, 0.0)
    with FusionDefinition() as fd:
        t0 = fd.from_pytorch(y)
        t4 = fd.ops.where(fd.ops.gt(t0, 0.0), t0, 0.0)
        fd.add_output(t4)
        fd.add_output(t4, t0)
        fd.add_output(t0)
    outs = fd.execute([y])
    assert len(outs) == 2 and all(o.data_ptr() == y.data_ptr() for o in outs)
    torch.testing.assert_close(y, expect)


def test_expanded_input_is_read_without_a_copy():
    x = torch.randn(1, 4096, device="cuda").expand(2048, 4096)
    with FusionDefinition() as fd:
        t0 = fd.from_pytorch(x)
        fd.add_output(fd.ops.sum(fd.ops.mul(t0, 2.0), [0]))
        fd.add_output(fd.ops.exp(t0))
    before = stats()
    total, e = fd.execute([x])
    assert ran_kernels_only(before)
    torch.testing.assert_close(total, (x * 2).sum(0), rtol=1e-4, atol=1e-3)
    torch.testing.assert_close(e, x.exp())
