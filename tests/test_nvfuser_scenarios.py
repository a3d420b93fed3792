"""Scenarios of nvFuser's own frontend tests (tests/python/test_python_frontend.py at the
legacy frontend's last version), restated for fusion-cache on CPU tensors (the reference
evaluator; the GPU runs the same definitions through kernels). Each is named after the
nvFuser test it follows. `run` does what that file's exec_nvfuser does: define, execute,
rebuild the definition from its printed Python (same fusion id, same results) and count the
fusions the cache gained.

Left out: what needs a GPU to mean anything (profiles of kernels, device selection,
misalignment), random numbers, matmul/linear/sdpa, gather/scatter/index ops and float8
(other issues), and user schedules (refused here by design).
"""
from __future__ import annotations

import copy
import itertools

import pytest
import torch
import torch.nn.functional as F

from fusion_cache import (
    DataType,
    FusionCache,
    FusionDefinition,
    compute_contiguity,
    compute_tensor_descriptor,
)


def run(body, inputs, new_fusion_expected=True):
    fc = FusionCache.get()
    before = fc.num_fusions()
    kept = copy.deepcopy(inputs)  # as nvFuser's harness: storage copied, strides kept
    with FusionDefinition() as fd:
        body(fd)
    out = fd.execute(inputs)
    # the printed definition rebuilds the same fusion, with the same results
    scope: dict = {"DataType": DataType, "FusionDefinition": FusionDefinition}
    exec(repr(fd), scope)
    with FusionDefinition() as again:
        scope[f"nvfuser_fusion_id{fd.id()}"](again)
    assert again.id() == fd.id()
    for a, b in zip(again.execute(kept), out):
        torch.testing.assert_close(a, b, equal_nan=True)
    assert fc.num_fusions() - before == int(new_fusion_expected)
    return out, fd


def test_basic():
    inputs = [torch.ones(2, 4, 8), torch.ones(2, 4, 8)]

    def body(fd):
        t0, t1 = fd.from_pytorch(inputs[0]), fd.from_pytorch(inputs[1])
        t3 = fd.ops.mul(fd.ops.add(t0, t1), fd.define_scalar(3.0))
        fd.add_output(fd.ops.sum(t3, [-1], False, DataType.Float))

    out1, _ = run(body, inputs)
    out2, fd2 = run(body, inputs, new_fusion_expected=False)
    out3 = FusionDefinition(fd2.id()).execute(inputs)
    eager = torch.sum((inputs[0] + inputs[1]) * 3.0, dim=-1)
    for o in (out1, out2, out3):
        torch.testing.assert_close(o[0], eager)


@pytest.mark.parametrize("dtype", [torch.float16, torch.float64])
def test_basic_fp16_and_cast_double_to_half(dtype):
    inputs = [torch.randn(2, 4, dtype=dtype), torch.randn(2, 4, dtype=dtype)]

    def body(fd):
        t0, t1 = fd.from_pytorch(inputs[0]), fd.from_pytorch(inputs[1])
        t2 = fd.ops.add(fd.ops.cast(t0, DataType.Half), fd.ops.cast(t1, DataType.Half))
        fd.add_output(fd.ops.cast(fd.ops.relu(t2), DataType.Half))

    out, _ = run(body, inputs)
    torch.testing.assert_close(out[0], torch.relu(inputs[0].half() + inputs[1].half()))


def test_promote_to_double():
    inputs = [torch.randn(2, 4, dtype=torch.float16), torch.randn(2, 4, dtype=torch.float64)]
    out, _ = run(lambda fd: fd.add_output(fd.ops.relu(fd.ops.add(fd.from_pytorch(inputs[0]),
                                                                 fd.from_pytorch(inputs[1])))), inputs)  # fmt: skip
    assert out[0].dtype == torch.float64
    torch.testing.assert_close(out[0], torch.relu(inputs[0] + inputs[1]))


@pytest.mark.parametrize("case", ["implicit", "explicit", "mixing", "ops_broadcast"])
def test_broadcasts(case):
    shapes = {"implicit": ((3,), (2, 3, 4)), "explicit": ((1, 1, 4), (2, 3, 4)),
              "mixing": ((3, 1), (3,)), "ops_broadcast": ((3,), (2, 3, 4))}[case]  # fmt: skip
    inputs = [torch.randn(*shapes[0]), torch.randn(*shapes[1])]

    def body(fd):
        t0, t1 = fd.from_pytorch(inputs[0]), fd.from_pytorch(inputs[1])
        if case == "implicit":
            fd.add_output(fd.ops.add(fd.ops.broadcast_in_dim(t0, [2, 3, 4], [1]), t1))
        elif case == "explicit":
            fd.add_output(fd.ops.add(fd.ops.broadcast_in_dim(t0, inputs[1].size(), [0, 1, 2]), t1))
        elif case == "mixing":
            fd.add_output(fd.ops.add(t0, fd.ops.broadcast_in_dim(t1, [3, 3], [0])))
        else:
            fd.add_output(fd.ops.add(fd.ops.broadcast(t0, [True, False, True]), t1))

    out, _ = run(body, inputs)
    a, b = inputs
    want = {"implicit": lambda: a[None, :, None] + b, "explicit": lambda: a + b,
            "mixing": lambda: a + b[:, None].expand(3, 3), "ops_broadcast": lambda: a[None, :, None] + b}[case]  # fmt: skip
    torch.testing.assert_close(out[0], want())


def test_prim_layer_norm_and_rms_norm_fwd():
    x, w, b = torch.randn(4, 8, 64), torch.randn(64), torch.randn(64)

    def body(fd):
        t = fd.define_tensor(shape=[-1, -1, -1], contiguity=[True, True, True])
        tw = fd.define_tensor(shape=[-1], contiguity=[True])
        tb = fd.define_tensor(shape=[-1], contiguity=[True])
        var, mean = fd.ops.var_mean(t, dims=[2], correction=0, keepdim=True)
        invstd = fd.ops.rsqrt(fd.ops.add(var, fd.define_scalar(1e-12)))
        y = fd.ops.mul(fd.ops.sub(t, mean), invstd)
        y = fd.ops.add(fd.ops.mul(y, fd.ops.broadcast_in_dim(tw, [4, 8, 64], [2])),
                       fd.ops.broadcast_in_dim(tb, [4, 8, 64], [2]))  # fmt: skip
        fd.add_output(y)
        ms = fd.ops.div(fd.ops.sum(fd.ops.mul(t, t), dims=[2], keepdim=True), fd.define_scalar(64))
        fd.add_output(fd.ops.mul(t, fd.ops.rsqrt(fd.ops.add(ms, fd.define_scalar(1e-12)))))

    (ln, rms), _ = run(body, [x, w, b])
    torch.testing.assert_close(ln, F.layer_norm(x, [64], w, b, eps=1e-12), atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(rms, x * torch.rsqrt(x.square().mean(2, keepdim=True) + 1e-12))


def test_tensor_ndim_and_execute_with_tuple_and_list():
    shape = [2] * 12
    new_shape = shape[:9] + [8]
    x = torch.randn(shape)

    def body(fd):
        t1 = fd.ops.reshape(fd.from_pytorch(x), fd.define_vector(10))
        fd.add_output(fd.ops.sum(t1, dims=[3]))

    out, _ = run(body, [x, new_shape])
    torch.testing.assert_close(out[0], x.reshape(new_shape).sum(3))
    out, _ = run(body, [x, tuple(new_shape)], new_fusion_expected=False)
    torch.testing.assert_close(out[0], x.reshape(new_shape).sum(3))


def test_tensor_shape_and_sizes():
    a, b = torch.randn(2, 3, 4), torch.randn(4)
    out, _ = run(lambda fd: (lambda t0, t1: fd.add_output(
        fd.ops.sub(t0, fd.ops.broadcast_in_dim(t1, t0.shape(), [2]))))(
        fd.from_pytorch(a), fd.from_pytorch(b)), [a, b])  # fmt: skip
    torch.testing.assert_close(out[0], a - b)
    c, d = torch.randn(1, 3), torch.randn(2, 1)

    def both(fd):
        t0, t1 = fd.from_pytorch(c), fd.from_pytorch(d)
        shape = [t1.size(0), t0.size(1)]
        fd.add_output(fd.ops.add(fd.ops.broadcast_in_dim(t0, shape, [0, 1]),
                                 fd.ops.broadcast_in_dim(t1, shape, [0, 1])))  # fmt: skip

    out, _ = run(both, [c, d])
    torch.testing.assert_close(out[0], c + d)


def test_tensor_shape_with_output_bcast_is_dynamic():
    def body(fd):
        t0 = fd.define_tensor(shape=[-1, -1, -1], contiguity=[True, True, True])
        fd.add_output(fd.ops.broadcast_in_dim(fd.ops.sum(t0, dims=[2]), t0.shape(), [0, 1]))

    for k, shape in enumerate([(2, 3, 4), (4, 5, 32)]):
        x = torch.randn(shape)
        out, _ = run(body, [x], new_fusion_expected=k == 0)
        torch.testing.assert_close(out[0], x.sum(-1, keepdim=True).expand(shape))


def test_alias_output_to_input():
    x = torch.ones(4, 4)

    def body(fd):
        t0 = fd.from_pytorch(x)
        t1 = fd.ops.add(t0, fd.define_scalar(1.0))
        fd.add_output(t1, alias_input=t0)
        fd.add_output(fd.ops.add(t1, fd.define_scalar(2.0)))

    with FusionDefinition() as fd:
        body(fd)
    out = fd.execute([x])
    assert len(out) == 1 and torch.equal(out[0], torch.full((4, 4), 4.0))
    assert torch.equal(x, torch.full((4, 4), 2.0))


def test_squeeze():
    inputs = [torch.randn(4), torch.randn(1, 4, 1), torch.randn(2, 1, 4)]

    def body(fd):
        t0 = fd.define_tensor(shape=[-1], contiguity=[True])
        t1 = fd.define_tensor(sizes=[1, 4, 1], strides=[4, 1, 1])
        t2 = fd.define_tensor(sizes=[2, 1, 4], strides=[4, 4, 1])
        t5 = fd.ops.sum(fd.ops.squeeze(t2, [-2]), [0])
        fd.add_output(fd.ops.mul(fd.ops.mul(t0, fd.ops.squeeze(t1, [0, -1])), t5))

    out, _ = run(body, inputs)
    torch.testing.assert_close(out[0], inputs[0] * inputs[1].sum([0, -1]) * inputs[2].sum([0, 1]))


def test_no_definition_and_func_definition():
    with pytest.raises(NotImplementedError):
        FusionDefinition().execute([torch.randn(4, 4)])
    x = torch.randn(4, 4)

    class MyFusion(FusionDefinition):
        def definition(self):
            self.add_output(self.ops.sigmoid(self.from_pytorch(x)))

    torch.testing.assert_close(MyFusion().execute([x])[0], torch.sigmoid(x))


def test_python_version_api():
    import sys

    import fusion_cache

    saved = {k: sys.modules.pop(k) for k in list(sys.modules) if k.split(".")[0] in ("nvfuser", "nvfuser_direct")}
    try:
        fusion_cache.install_as_nvfuser()
        from nvfuser import version
        from nvfuser.nvfuser_version import Version

        assert version() > "0.0.0" and version() > Version("0.0.0")
    finally:
        for k in [k for k in sys.modules if k.split(".")[0] in ("nvfuser", "nvfuser_direct")]:
            del sys.modules[k]
        sys.modules.update(saved)


def test_zero_size_dim_and_static_sizes():
    out, _ = run(lambda fd: fd.add_output(fd.ops.relu(
        fd.define_tensor(shape=[0, 0], contiguity=[True, True]))), [torch.ones(0, 0)])  # fmt: skip
    assert out[0].numel() == 0
    a, b = torch.randn(4, 5, 1), torch.randn(1, 5, 6)
    out, _ = run(lambda fd: fd.add_output(fd.ops.mul(fd.from_pytorch(a, static_sizes=True),
                                                     fd.from_pytorch(b, static_sizes=True))), [a, b])  # fmt: skip
    torch.testing.assert_close(out[0], a * b)


def test_where_dtypes():
    cond = torch.arange(2).bool()
    cases = [(3.0, None, torch.float64), (3.0, DataType.Float, torch.float32),
             (3.0, DataType.Double, torch.float64), (3, DataType.Int32, torch.int32),
             (3, None, torch.int64), (complex(3.0), None, torch.complex128),
             (3.0 + 0j, DataType.ComplexFloat, torch.complex64),
             (3.0 + 0j, DataType.ComplexDouble, torch.complex128), (True, DataType.Bool, torch.bool)]  # fmt: skip

    def body(fd):
        t0 = fd.from_pytorch(cond)
        for value, dt, _ in cases:
            other = type(value)(0) if not isinstance(value, bool) else False
            a = fd.define_scalar(value, dt) if dt else fd.define_scalar(value)
            b = fd.define_scalar(other, dt) if dt else fd.define_scalar(other)
            fd.add_output(fd.ops.where(t0, a, b))

    outs, _ = run(body, [cond])
    assert [o.dtype for o in outs] == [c[2] for c in cases]


def test_where_op_and_complex_constants():
    pred = torch.tensor([True, False, True, True, False])
    for a_dt, b_dt in itertools.product([torch.float16, torch.float32, torch.bfloat16], repeat=2):
        a, b = torch.randn(5, dtype=a_dt), torch.randn(5, dtype=b_dt)
        with FusionDefinition() as fd:
            tp = fd.define_tensor(sizes=pred.shape, strides=pred.stride(), dtype=DataType.Bool)
            fd.add_output(fd.ops.where(tp, fd.from_pytorch(a), fd.from_pytorch(b)))
        assert torch.equal(fd.execute([pred, a, b])[0], torch.where(pred, a, b))
    z = torch.arange(2).to(torch.complex64)
    out, _ = run(lambda fd: fd.add_output(fd.ops.mul(fd.from_pytorch(z), fd.define_scalar(complex(3.0, 0.5)))), [z])
    assert out[0].dtype == torch.complex64 and torch.equal(out[0], z * (3.0 + 0.5j))


def test_iota():
    def body(fd):
        for n, start, step, dt in [(2, 0, 2, DataType.Int), (3, 100, 1, DataType.Int32)]:
            fd.add_output(fd.ops.iota(fd.define_scalar(n), fd.define_scalar(start),
                                      fd.define_scalar(step), dt))  # fmt: skip

    out, _ = run(body, [])
    assert out[0].tolist() == [0, 2] and out[1].tolist() == [100, 101, 102]
    assert out[1].dtype == torch.int32


def test_complex_rsqrt_and_reduction():
    a, b = torch.randn(4, dtype=torch.complex64), torch.randn(4, dtype=torch.complex128)
    out, _ = run(lambda fd: [fd.add_output(fd.ops.rsqrt(fd.from_pytorch(t))) for t in (a, b)], [a, b])
    torch.testing.assert_close(out[0], a.rsqrt())
    torch.testing.assert_close(out[1], b.rsqrt())
    c = torch.randn(2, 32, dtype=torch.complex64)
    out, _ = run(lambda fd: fd.add_output(fd.ops.sum(fd.from_pytorch(c), [-1], False, DataType.ComplexFloat)), [c])
    torch.testing.assert_close(out[0], c.sum(-1))


def test_arithmetic_ops_and_signbit():
    x, y = torch.randn(3, 4, 5), torch.randn(3, 4, 5)

    def body(fd):
        t0, t1 = fd.from_pytorch(x), fd.from_pytorch(y)
        c0 = fd.define_scalar(1.0)
        ta, tb = -t0, abs(t0)
        fd.add_output(ta)
        fd.add_output(tb)
        fd.add_output(-ta * (c0 - t0 * t0) / tb + abs(c0) ** -c0 - c0)
        fd.add_output(fd.ops.where(fd.ops.signbit(t0), -abs(t1), abs(t1)))

    out, _ = run(body, [x, y])
    torch.testing.assert_close(out[2], x * (1.0 - x * x) / x.abs())
    torch.testing.assert_close(out[3], torch.where(torch.signbit(x), -y.abs(), y.abs()))


def test_var_mean_and_var_corrections():
    x = torch.randn(2, 2, 2)
    for correction in (0, 1):
        with FusionDefinition() as fd:
            t1, t2 = fd.ops.var_mean(fd.from_pytorch(x), [0, 1, 2], correction)
            fd.add_output(t1)
            fd.add_output(t2)
        for got, want in zip(fd.execute([x]), torch.var_mean(x, [0, 1, 2], correction=correction)):
            torch.testing.assert_close(got, want)
    y = torch.randn(2, 2)
    for correction in range(7):
        with FusionDefinition() as fd:
            fd.add_output(fd.ops.var(fd.from_pytorch(y), [-1], correction))
        torch.testing.assert_close(fd.execute([y])[0], torch.var(y, [-1], correction=correction),
                                   equal_nan=True)  # fmt: skip


def test_scalar_only_inputs():
    with FusionDefinition() as fd:
        s2 = fd.ops.add(fd.define_scalar(), fd.define_scalar())
        t3 = fd.ops.full(shape=[2, 2], fill_value=fd.define_scalar(1.0, DataType.Float), dtype=DataType.Float)
        fd.add_output(fd.ops.mul(t3, s2))
    torch.testing.assert_close(fd.execute([2.0, 3.0])[0].cpu(), torch.full([2, 2], 5.0))


def test_addcmul_and_constant_nans():
    a, b, c = torch.randn(4), torch.randn(4), torch.randn(4)
    out, _ = run(lambda fd: fd.add_output(fd.ops.addcmul(fd.from_pytorch(a), fd.from_pytorch(b),
                                                         fd.from_pytorch(c), fd.define_scalar(0.1))), [a, b, c])  # fmt: skip
    torch.testing.assert_close(out[0], torch.addcmul(a, b, c, value=0.1))
    out, _ = run(lambda fd: fd.add_output(fd.ops.add(fd.from_pytorch(a), fd.define_scalar(float("nan")))), [a])
    assert out[0].isnan().all()


def test_compute_contiguity_and_tensor_descriptor():
    sizes = [2, 1, 3, 1, 4, 5, 6]
    assert compute_contiguity(sizes, [80, 30, 30, 456456465465, 0, 6, 1]) == [
        False, None, True, None, None, True, True]  # fmt: skip
    assert compute_tensor_descriptor([2, 2, 1, 2, 4, 2], [2, 32, 1, 8, 0, 4]) == (
        [False, True, True, False, None, None], [2, 5, 0, 4, 1, 3])  # fmt: skip


def test_stride_order_with_explicit_broadcast():
    inputs = [
        torch.randn(3).unsqueeze(-1),
        torch.randn(2, 3).unsqueeze(-1).expand(2, 3, 4).transpose(2, 0),
        torch.randn(5 * 960).as_strided((5, 4, 1, 5, 16), (960, 48, 16, 192, 1)),
        torch.randn(6).as_strided((2, 16, 3), (3, 0, 1)),
    ]

    def body(fd):
        t0, t1, t2 = (fd.from_pytorch(x) for x in inputs[:3])
        t3 = fd.define_tensor(shape=[-1, 16, 3], contiguity=[None, True, True],
                              dtype=DataType.Float, stride_order=[1, 2, 0], is_cpu=False)  # fmt: skip
        c0 = fd.define_scalar(3.0)
        fd.add_output(fd.ops.add(fd.ops.broadcast(t0, [True, False, False]), t1))
        fd.add_output(fd.ops.add(t2, c0))
        fd.add_output(fd.ops.mul(t3, c0))

    out, _ = run(body, inputs)
    torch.testing.assert_close(out[0], inputs[0] + inputs[1])
    torch.testing.assert_close(out[1], inputs[2] + 3.0)
    torch.testing.assert_close(out[2], inputs[3] * 3.0)


def test_prod_overloads():
    x = torch.ones(2, 4, 8)

    def body(fd):
        t0 = fd.from_pytorch(x)
        fd.add_output(fd.ops.prod(t0, DataType.Float))
        fd.add_output(fd.ops.prod(t0, 1, False, DataType.Float))
        fd.add_output(fd.ops.prod(t0, 1, True, DataType.Float))
        fd.add_output(fd.ops.prod(t0, [-1], False, DataType.Float))

    out, _ = run(body, [x])
    want = [x.prod(), x.prod(1), x.prod(1, True), x.prod(-1)]
    assert [tuple(o.shape) for o in out] == [tuple(w.shape) for w in want]


def test_output_stride_order():
    x = torch.arange(0, 120).reshape(2, 3, 4, 5).float()
    for perm in itertools.permutations(range(4)):
        for use_op in (False, True):
            def body(fd, perm=perm, use_op=use_op):
                t1 = fd.ops.add(fd.from_pytorch(x), fd.define_scalar(3.0))
                if use_op:
                    fd.add_output(fd.ops.stride_order(t1, perm))
                else:
                    fd.add_output(t1, perm)

            out, _ = run(body, [x])
            assert torch.equal(out[0], x + 3.0)
            stride = list(out[0].stride())
            ranked = list(stride)
            for idx, axis in enumerate(perm):
                ranked[3 - axis] = stride[idx]
            assert sorted(ranked, reverse=True) == ranked


def test_expanded_bcast_tensor_and_issue1393():
    inputs = [torch.tensor(1.5), torch.randn(5, 5, 5),
              torch.randint(0, 1, (5, 5)).bool().unsqueeze(-1).expand(5, 5, 5)]  # fmt: skip
    out, _ = run(lambda fd: (lambda t0, t1, t2: fd.add_output(fd.ops.add(t2, fd.ops.add(t0, t1))))(
        *(fd.from_pytorch(x) for x in inputs)), inputs)  # fmt: skip
    torch.testing.assert_close(out[0], inputs[0] + inputs[1] + inputs[2])


def test_segment_set_and_fix_2549():
    x = torch.randn(5, 5, 5)
    out, _ = run(lambda fd: fd.add_output(fd.ops.relu(fd.ops.segment_set(fd.ops.neg(fd.from_pytorch(x))))), [x])
    torch.testing.assert_close(out[0], x.neg().relu())
    a, b = torch.ones(4, 1, dtype=torch.double), torch.ones(4, 4, dtype=torch.double)

    def body(fd):
        t0 = fd.define_tensor(sizes=a.shape, strides=a.stride(), dtype=DataType.Double, is_cpu=False)
        t1 = fd.define_tensor(sizes=b.shape, strides=b.stride(), dtype=DataType.Double, is_cpu=False)
        fd.add_output(fd.ops.div(t1, fd.ops.broadcast_in_dim(t0, shape=[4, 4], broadcast_dims=[0, 1])))

    out, _ = run(body, [a, b])
    torch.testing.assert_close(out[0], b / a)


def test_real_imag():
    for dtype in (torch.complex128, torch.complex64):
        z = torch.randn(5, dtype=dtype)
        out, _ = run(lambda fd, z=z: (lambda t: (fd.add_output(fd.ops.real(t)), fd.add_output(fd.ops.imag(t))))(
            fd.from_pytorch(z)), [z])  # fmt: skip
        assert torch.equal(out[0], z.real) and torch.equal(out[1], z.imag)


def test_pad_and_pad_cache():
    x = torch.randn(1, 2, 3)

    def body(fd):
        t0 = fd.from_pytorch(x)
        for widths in ([1, 1, 1, 1], [0, 0, 2, 3], [0, 0, 0, 0], [2, 3]):
            fd.add_output(fd.ops.pad(t0, widths))
        fd.add_output(fd.ops.pad(t0, [2, 3], fd.define_scalar(2.0)))
        fd.add_output(fd.ops.pad(t0, [2, 3, 0, 0, 0, 0]))

    out, _ = run(body, [x])
    wants = [F.pad(x, [1, 1, 1, 1]), F.pad(x, [0, 0, 2, 3]), x, F.pad(x, [2, 3]),
             F.pad(x, [2, 3], "constant", 2.0), F.pad(x, [2, 3, 0, 0, 0, 0])]  # fmt: skip
    for got, want in zip(out, wants):
        assert torch.equal(got, want)
    y = torch.randn(2, 3)
    for widths, value, new in (([1, 1], None, True), ([1, 1], None, False), ([2, 2], None, True),
                               ([1, 1], 2.0, True), ([1, 1], 2.0, False)):  # fmt: skip
        def pad(fd, widths=widths, value=value):
            v = None if value is None else fd.define_scalar(value)
            fd.add_output(fd.ops.pad(fd.from_pytorch(y), widths, v))

        out, _ = run(pad, [y], new_fusion_expected=new)
        assert torch.equal(out[0], F.pad(y, widths, "constant", value or 0.0))


def test_cat():
    a, b, c = torch.randn(2, 4), torch.randn(2, 3), torch.randn(4, 4)

    def body(fd):
        t0, t1, t2 = fd.from_pytorch(a), fd.from_pytorch(b), fd.from_pytorch(c)
        fd.add_output(fd.ops.cat([t0, t1], 1))
        fd.add_output(fd.ops.cat([t0, t2], 0))

    out, _ = run(body, [a, b, c])
    assert torch.equal(out[0], torch.cat([a, b], 1)) and torch.equal(out[1], torch.cat([a, c], 0))


def test_nextafter():
    inputs = [torch.randn(4), torch.randn(4, dtype=torch.float64)]

    def body(fd):
        t0, t1 = fd.from_pytorch(inputs[0]), fd.from_pytorch(inputs[1])
        s0 = fd.define_scalar(1.0, dtype=DataType.Float)
        s1 = fd.define_scalar(-1.0, dtype=DataType.Double)
        for a, b in itertools.product([t0, t1, s0, s1], repeat=2):
            t = fd.ops.nextafter(a, b)
            if type(t).__name__ == "Tensor":
                fd.add_output(t)

    out, _ = run(body, inputs)
    vals = [inputs[0], inputs[1], 1.0, -1.0]
    want = [torch.nextafter(torch.as_tensor(a), torch.as_tensor(b))
            for a, b in itertools.product(vals, repeat=2)
            if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor)]  # fmt: skip
    for got, w in zip(out, want):
        assert torch.equal(got, w)


def test_integer_division_shifts_and_gcd():
    a = torch.randint(-100, 100, (1024,))
    b = torch.randint(1, 100, (1024,))

    def body(fd):
        t0, t1 = fd.from_pytorch(a), fd.from_pytorch(b)
        fd.add_output(fd.ops.div(t0, t1))
        fd.add_output(fd.ops.truediv(t0, t1))
        fd.add_output(fd.ops.gcd(t0, t1))

    out, _ = run(body, [a, b])
    assert torch.equal(out[0], torch.div(a, b, rounding_mode="trunc"))
    torch.testing.assert_close(out[1], torch.true_divide(a, b))
    assert torch.equal(out[2], torch.gcd(a, b))
    x = torch.tensor([-2147483648, 1073741824], dtype=torch.int32)
    out, _ = run(lambda fd: fd.add_output(fd.ops.bitwise_right_shift(fd.from_pytorch(x), fd.define_scalar(3))), [x])
    assert torch.equal(out[0], torch.bitwise_right_shift(x, 3))
    v = torch.tensor([-1, -2147483648, 1073741824, -64463884, -65968277, 4042311, -98914167, 5526216])
    expect32 = [536870911, 268435456, 134217728, 528812926, 528624877, 505288, 524506641, 690777]
    out, _ = run(lambda fd: fd.add_output(fd.ops.logical_right_shift(
        fd.from_pytorch(v.int()), fd.define_constant(3))), [v.int()])  # fmt: skip
    assert out[0].tolist() == expect32
    for dtype, bits in ((torch.int32, 32), (torch.int64, 64)):
        out, _ = run(lambda fd, dtype=dtype: fd.add_output(fd.ops.logical_right_shift(
            fd.from_pytorch(v.to(dtype)), fd.define_scalar(None, dtype=DataType.Int))), [v.to(dtype), bits])  # fmt: skip
        assert not out[0].any()


def test_input_scalar_and_debug_output():
    x = torch.randn(3)
    with FusionDefinition() as fd:
        fd.add_output(fd.ops.div(fd.from_pytorch(x), fd.define_scalar()))
    fd.execute([x, 0.1])
    assert fd.debug_output() is None
    fd.execute([x, 0.1], capture_debug_output=True)
    assert fd.debug_output() is not None


def test_expand_to_zero_and_pad_expanded_empty():
    a, b = torch.zeros(1, 0), torch.zeros(1, 1)

    def body(fd):
        t0, t1 = fd.from_pytorch(a), fd.from_pytorch(b)
        fd.add_output(fd.ops.broadcast_in_dim(t0, shape=[0, 0], broadcast_dims=[0, 1]))
        fd.add_output(fd.ops.broadcast_in_dim(t1, shape=[0, 0], broadcast_dims=[0, 1]))

    out, _ = run(body, [a, b])
    assert out[0].shape == (0, 0) and out[1].shape == (0, 0)
    e = torch.randn(0, dtype=torch.float64).as_strided((2, 0, 3), (0, 0, 0))
    out, _ = run(lambda fd: fd.add_output(fd.ops.pad(fd.from_pytorch(e), [0, 0, 1, 1, 1, 0],
                                                     fd.define_scalar(-3.70753, dtype=DataType.Double))), [e])  # fmt: skip
    assert torch.equal(out[0], F.pad(e, (0, 0, 1, 1, 1, 0), "constant", -3.70753))


def test_dynamic_reshape_and_reshape_dynamic():
    def body(fd):
        x = fd.define_tensor([-1, -1], [True, True])
        shape = fd.define_vector([fd.ops.size(x, 0), fd.define_scalar(dtype=DataType.Int32),
                                  fd.define_scalar(dtype=DataType.Int32)])  # fmt: skip
        fd.add_output(fd.ops.reshape(x, shape))

    x = torch.rand(3, 4)
    out, _ = run(body, [x, 2, 2])
    assert out[0].shape == (3, 2, 2) and torch.equal(out[0].flatten(), x.flatten())


def test_allocation_domain_concretization():
    x = torch.randn(0, dtype=torch.float64).as_strided((1, 0, 1, 1), (0, 1, 1, 1))

    def body(fd):
        t1 = fd.define_tensor(shape=[1, -1, 1, 1], contiguity=[True, None, None, None],
                              dtype=DataType.Double, is_cpu=False, stride_order=[0, 3, 2, 1])  # fmt: skip
        fd.add_output(fd.ops.mul(t1, fd.define_scalar(2.0, dtype=DataType.Double)))

    out, _ = run(body, [x])
    assert torch.equal(out[0], x * 2.0)


def test_mark_alias_pass():
    x = torch.rand(2, 3, 4)
    out, _ = run(lambda fd: fd.add_output(fd.ops.reshape(
        fd.define_tensor([2, 3, 4], contiguity=[True, True, True], dtype=DataType.Float), [2, 12])), [x])  # fmt: skip
    assert out[0].data_ptr() == x.data_ptr()


def test_issue1270_empty_expanded():
    inputs = [torch.randn(0, dtype=torch.bfloat16).as_strided((5, 0), (1, 0)),
              torch.randn(0, dtype=torch.bfloat16).as_strided((5, 0), (0, 1))]  # fmt: skip

    def body(fd):
        t0 = fd.define_tensor(shape=[-1, -1], contiguity=[True, None], dtype=DataType.BFloat16)
        t1 = fd.define_tensor(shape=[-1, -1], contiguity=[None, True], dtype=DataType.BFloat16)
        t5 = fd.ops.cast(fd.ops.full(fill_value=fd.define_scalar(1.0), shape=[5, 0],
                                     dtype=DataType.BFloat16), dtype=DataType.Float)  # fmt: skip
        fd.add_output(fd.ops.sum(fd.ops.mul(fd.ops.cast(t1, DataType.Float), t5), dims=[1]))
        fd.add_output(fd.ops.sum(fd.ops.mul(fd.ops.cast(t0, DataType.Float), t5), dims=[0]))

    out, _ = run(body, inputs)
    assert torch.equal(out[0], torch.zeros(5)) and out[1].shape == (0,)


def test_issue1273_reshape_var_mean():
    x = torch.randn(4).as_strided((2, 2), (2, 1))

    def body(fd):
        t0 = fd.define_tensor(shape=[-1, -1], contiguity=[True, True], dtype=DataType.Float)
        s1 = fd.define_scalar(None, dtype=DataType.Double)
        t7 = fd.ops.reshape(t0, new_shape=[2, 1, 2])
        t8, t9 = fd.ops.var_mean(t7, dims=[2], correction=0, keepdim=False)
        t21 = fd.ops.rsqrt(fd.ops.add(fd.ops.broadcast_in_dim(t8, shape=[2, 1, 1], broadcast_dims=[0, 1]), s1))
        t27 = fd.ops.sub(t7, fd.ops.broadcast_in_dim(fd.ops.broadcast_in_dim(t9, shape=[2, 1, 1], broadcast_dims=[0, 1]),
                                                     shape=[2, 1, 2], broadcast_dims=[0, 1, 2]))  # fmt: skip
        t33 = fd.ops.mul(t27, fd.ops.broadcast_in_dim(t21, shape=[2, 1, 2], broadcast_dims=[0, 1, 2]))
        fd.add_output(fd.ops.reshape(t33, new_shape=[2, 2]))

    out, _ = run(body, [x, 1e-05])
    t7 = x.reshape(2, 1, 2)
    want = ((t7 - t7.mean(2, keepdim=True)) * torch.rsqrt(t7.var(2, unbiased=False, keepdim=True) + 1e-5)).reshape(2, 2)
    torch.testing.assert_close(out[0], want)


def test_expanded_reduction():
    x = torch.tensor(1.0).as_strided((2, 3), (0, 0))
    for keepdim in (False, True):
        def body(fd, keepdim=keepdim):
            t0 = fd.define_tensor(shape=[-1, -1], contiguity=[None, None], dtype=DataType.Float,
                                  stride_order=[1, 0])  # fmt: skip
            fd.add_output(fd.ops.sum(t0, dims=[0], keepdim=keepdim))

        out, _ = run(body, [x])
        assert torch.equal(out[0], x.sum(0, keepdim=keepdim))


def test_issue1872_full_slices():
    def body(fd):
        t3 = fd.ops.full(shape=fd.define_vector([fd.define_scalar(5, dtype=DataType.Int)], dtype=DataType.Int),
                         fill_value=fd.define_scalar(1.0, dtype=DataType.Double), dtype=DataType.Float)  # fmt: skip
        fd.add_output(fd.ops.cast(fd.ops.slice(t3, start_indices=[0], end_indices=[2], strides=[1]), dtype=DataType.Half))
        fd.add_output(fd.ops.cast(fd.ops.slice(t3, start_indices=[2], end_indices=[5], strides=[1]), dtype=DataType.Half))

    out, _ = run(body, [])
    assert out[0].tolist() == [1.0, 1.0] and out[1].tolist() == [1.0, 1.0, 1.0]


def test_returning_aliased_outputs():
    x = torch.randn(1, 2, 3, 4)

    def body(fd):
        t0 = fd.define_tensor(shape=[-1] * 4, contiguity=[True] * 4, dtype=DataType.Float,
                              stride_order=[3, 2, 1, 0])  # fmt: skip
        t4 = fd.ops.where(fd.ops.gt(t0, fd.define_scalar(0.0)), t0, fd.define_scalar(0.0))
        fd.add_output(t4)
        fd.add_output(t4, t0)
        fd.add_output(t4)
        fd.add_output(t0)

    with FusionDefinition() as fd:
        body(fd)
    out = fd.execute([x])
    assert len(out) == 3 and all(o.data_ptr() == x.data_ptr() for o in out)


def test_empty_reshape_and_remove_empty():
    x = torch.randint(0, 10, (0, 1, 2, 3, 4))

    def body(fd):
        t0 = fd.define_tensor(shape=[-1, 1, -1, -1, -1], contiguity=[False, None, True, True, True],
                              dtype=DataType.Int, stride_order=[4, 3, 2, 1, 0])  # fmt: skip
        fd.add_output(fd.ops.reshape(t0, new_shape=fd.define_vector(
            [fd.define_scalar(5, dtype=DataType.Int), fd.define_scalar(0, dtype=DataType.Int)])))  # fmt: skip

    out, _ = run(body, [x])
    assert out[0].shape == (5, 0)


def test_issue1691_reshapes_of_reductions():
    a = torch.randn(12).as_strided((1, 3, 4), (12, 4, 1))
    b = torch.randn(12).as_strided((4, 3), (3, 1))

    def body(fd):
        t0 = fd.define_tensor(shape=[1, -1, -1], contiguity=[None, True, True], dtype=DataType.Float,
                              stride_order=[2, 1, 0])  # fmt: skip
        t1 = fd.define_tensor(shape=[-1, -1], contiguity=[True, True], dtype=DataType.Float,
                              stride_order=[1, 0])  # fmt: skip
        four = fd.define_vector([fd.define_scalar(4, dtype=DataType.Int)], dtype=DataType.Int)
        t6 = fd.ops.reshape(fd.ops.sum(t1, dims=[1]), new_shape=four)
        t9 = fd.ops.reshape(fd.ops.sum(t0, dims=[1, 0]), new_shape=four)
        fd.add_output(fd.ops.sum(fd.ops.mul(t6, t9), dims=[0]))

    out, _ = run(body, [a, b])
    torch.testing.assert_close(out[0], (a.sum(dim=[0, 1]) * b.sum(dim=1)).sum(dim=0))


def test_fusion_profiler_before_execute():
    with FusionDefinition() as fd:
        fd.add_output(fd.ops.sum(fd.define_tensor(shape=[-1, -1], contiguity=True), dim=-1))
    with pytest.raises(ValueError):
        fd.profile()
