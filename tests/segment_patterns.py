"""Fusions that no single scheduler takes, with their eager oracles: shared by the CPU
segmentation tests and the GPU ones."""
import torch

from fusion_cache import DataType, FusionDefinition

DTYPES = {torch.float32: DataType.Float, torch.float16: DataType.Half,
          torch.bfloat16: DataType.BFloat16, torch.float64: DataType.Double}  # fmt: skip


def _up(fd, t, dtype):
    return fd.ops.cast(t, DataType.Float) if dtype in (torch.float16, torch.bfloat16) else t


def _down(fd, t, dtype):
    return fd.ops.cast(t, DTYPES[dtype]) if dtype in (torch.float16, torch.bfloat16) else t


def seed_002() -> FusionDefinition:
    """Seed document 002: a row sum broadcast back and added to a wider tensor."""
    with FusionDefinition() as fd:
        t0 = fd.define_tensor(shape=[-1, -1], contiguity=[True, True], dtype=DataType.Float,
                              is_cpu=False)  # fmt: skip
        t1 = fd.define_tensor(shape=[-1, -1], contiguity=[True, True], dtype=DataType.Float,
                              is_cpu=False)  # fmt: skip
        t2 = fd.ops.sum(t0, dims=[1], keepdim=False, dtype=DataType.Float)
        t3 = fd.ops.broadcast(t2, is_broadcast_dim=[False, True])
        t4 = fd.ops.add(t1, t3)
        fd.add_output(t4)
    return fd


def seed_002_eager(t0, t1):
    return [t1 + t0.sum(1, keepdim=True)]


def max_then_scale(dtype) -> FusionDefinition:
    """A row max of x [R, K] scaling y [R, M]: the epilogue runs over another extent."""
    with FusionDefinition() as fd:
        x = fd.define_tensor(shape=[-1, -1], dtype=DTYPES[dtype])
        y = fd.define_tensor(shape=[-1, -1], dtype=DTYPES[dtype])
        m = fd.ops.max(_up(fd, x, dtype), dims=[1], keepdim=True)
        out = fd.ops.mul(_up(fd, y, dtype), fd.ops.exp(fd.ops.neg(m)))
        fd.add_output(_down(fd, out, dtype))
    return fd


def max_then_scale_eager(x, y):
    m = x.float().amax(1, keepdim=True)
    return [(y.float() * torch.exp(-m)).to(y.dtype)]


def _layer_norm_backward_sums(fd, dtype):
    """Defines layer norm backward's inputs; returns dx, dw and db in f32."""
    dy = fd.define_tensor(shape=[-1, -1], dtype=DTYPES[dtype])
    x = fd.define_tensor(shape=[-1, -1], dtype=DTYPES[dtype])
    mean = fd.define_tensor(shape=[-1, 1], contiguity=[True, None], dtype=DataType.Float)
    rstd = fd.define_tensor(shape=[-1, 1], contiguity=[True, None], dtype=DataType.Float)
    w = fd.define_tensor(shape=[-1], dtype=DTYPES[dtype])
    dyf, xf = _up(fd, dy, dtype), _up(fd, x, dtype)
    n = fd.ops.size(x, 1)
    xhat = fd.ops.mul(fd.ops.sub(xf, mean), rstd)
    g = fd.ops.mul(dyf, fd.ops.broadcast(_up(fd, w, dtype), [True, False]))
    a = fd.ops.sum(g, [1], keepdim=True)
    b = fd.ops.sum(fd.ops.mul(g, xhat), [1], keepdim=True)
    t = fd.ops.sub(fd.ops.sub(fd.ops.mul(g, n), a), fd.ops.mul(xhat, b))
    dx = fd.ops.mul(fd.ops.div(rstd, n), t)
    return dx, fd.ops.sum(fd.ops.mul(dyf, xhat), [0]), fd.ops.sum(dyf, [0])


def layer_norm_backward(dtype) -> FusionDefinition:
    """dx (a row reduction) and dw, db (column reductions) of layer norm, from the saved
    mean and rstd: no one kernel holds both kinds of reduction."""
    with FusionDefinition() as fd:
        for out in _layer_norm_backward_sums(fd, dtype):
            fd.add_output(_down(fd, out, dtype))
    return fd


def layer_norm_backward_inputs(rows, cols, dtype, device="cpu", seed=0):
    gen = torch.Generator(device=device).manual_seed(seed)
    x = torch.randn(rows, cols, generator=gen, device=device)
    mean = x.mean(1, keepdim=True)
    rstd = torch.rsqrt(x.var(1, unbiased=False, keepdim=True) + 1e-5)
    dy = torch.randn(rows, cols, generator=gen, device=device)
    w = torch.randn(cols, generator=gen, device=device)
    return [dy.to(dtype), x.to(dtype), mean, rstd, w.to(dtype)]


def layer_norm_backward_eager(dy, x, mean, rstd, w):
    wf = w.float()
    out = torch.ops.aten.native_layer_norm_backward(
        dy.float(), x.float(), [x.shape[1]], mean, rstd, wf, torch.zeros_like(wf),
        [True, True, True])  # fmt: skip
    return [o.to(dt) for o, dt in zip(out, (x.dtype, w.dtype, w.dtype))]


def layer_norm_backward_with_bias_grad(dtype) -> FusionDefinition:
    """Layer norm backward whose dx also feeds the bias gradient of the layer below: three
    column sums (dw, db, sum of dx) beside the row reductions."""
    with FusionDefinition() as fd:
        dx, dw, db = _layer_norm_backward_sums(fd, dtype)
        for out in (dx, dw, db, fd.ops.sum(dx, [0])):
            fd.add_output(_down(fd, out, dtype))
    return fd


def layer_norm_backward_with_bias_grad_eager(dy, x, mean, rstd, w):
    dx, dw, db = layer_norm_backward_eager(dy, x, mean, rstd, w)
    wf = w.float()
    full = torch.ops.aten.native_layer_norm_backward(
        dy.float(), x.float(), [x.shape[1]], mean, rstd, wf, torch.zeros_like(wf),
        [True, False, False])[0]  # fmt: skip
    return [dx, dw, db, full.sum(0).to(w.dtype)]


def rms_norm_backward(dtype) -> FusionDefinition:
    """dx (one row reduction) and dw (one column sum) of RMS norm, from the saved rstd [R]."""
    with FusionDefinition() as fd:
        dy = fd.define_tensor(shape=[-1, -1], dtype=DTYPES[dtype])
        x = fd.define_tensor(shape=[-1, -1], dtype=DTYPES[dtype])
        rstd = fd.define_tensor(shape=[-1], dtype=DataType.Float)
        w = fd.define_tensor(shape=[-1], dtype=DTYPES[dtype])
        dyf, xf = _up(fd, dy, dtype), _up(fd, x, dtype)
        r = fd.ops.broadcast(rstd, [False, True])
        g = fd.ops.mul(dyf, fd.ops.broadcast(_up(fd, w, dtype), [True, False]))
        proj = fd.ops.div(fd.ops.sum(fd.ops.mul(g, xf), [1], keepdim=True), fd.ops.size(x, 1))
        dx = fd.ops.mul(r, fd.ops.sub(g, fd.ops.mul(fd.ops.mul(xf, fd.ops.mul(r, r)), proj)))
        dw = fd.ops.sum(fd.ops.mul(fd.ops.mul(dyf, xf), r), [0])
        fd.add_output(_down(fd, dx, dtype))
        fd.add_output(_down(fd, dw, dtype))
    return fd


def rms_norm_backward_inputs(rows, cols, dtype, device="cpu", seed=0):
    gen = torch.Generator(device=device).manual_seed(seed)
    x = torch.randn(rows, cols, generator=gen, device=device)
    rstd = torch.rsqrt(x.pow(2).mean(1) + 1e-5)
    dy = torch.randn(rows, cols, generator=gen, device=device)
    w = torch.randn(cols, generator=gen, device=device)
    return [dy.to(dtype), x.to(dtype), rstd, w.to(dtype)]


def rms_norm_backward_eager(dy, x, rstd, w):
    dyf, xf, r = dy.double(), x.double(), rstd.double()[:, None]
    g = dyf * w.double()
    dx = r * (g - xf * r * r * (g * xf).mean(1, keepdim=True))
    dw = (dyf * xf * r).sum(0)
    return [dx.to(x.dtype), dw.to(w.dtype)]


def rms_norm_backward_3d(dtype) -> FusionDefinition:
    """RMS norm's backward over [B, T, C] as autograd hands it over: dx a reduction over C,
    and dw and the sum of dy (a bias gradient) summed over both B and T."""
    with FusionDefinition() as fd:
        dy = fd.define_tensor(shape=[-1, -1, -1], dtype=DTYPES[dtype])
        x = fd.define_tensor(shape=[-1, -1, -1], dtype=DTYPES[dtype])
        rstd = fd.define_tensor(shape=[-1, -1], dtype=DataType.Float)
        w = fd.define_tensor(shape=[-1], dtype=DTYPES[dtype])
        dyf, xf = _up(fd, dy, dtype), _up(fd, x, dtype)
        r = fd.ops.broadcast(rstd, [False, False, True])
        g = fd.ops.mul(dyf, fd.ops.broadcast(_up(fd, w, dtype), [True, True, False]))
        proj = fd.ops.div(fd.ops.sum(fd.ops.mul(g, xf), [2], keepdim=True), fd.ops.size(x, 2))
        dx = fd.ops.mul(r, fd.ops.sub(g, fd.ops.mul(fd.ops.mul(xf, fd.ops.mul(r, r)), proj)))
        dw = fd.ops.sum(fd.ops.mul(fd.ops.mul(dyf, xf), r), [0, 1])
        for out in (dx, dw, fd.ops.sum(dyf, [0, 1])):
            fd.add_output(_down(fd, out, dtype))
    return fd


def rms_norm_backward_3d_inputs(b, t, c, dtype, device="cpu", seed=0):
    dy, x, rstd, w = rms_norm_backward_inputs(b * t, c, dtype, device, seed)
    return [dy.view(b, t, c), x.view(b, t, c), rstd.view(b, t), w]


def rms_norm_backward_3d_eager(dy, x, rstd, w):
    b, t, c = x.shape
    dx, dw = rms_norm_backward_eager(dy.reshape(b * t, c), x.reshape(b * t, c),
                                     rstd.reshape(b * t), w)  # fmt: skip
    return [dx.view(b, t, c), dw, dy.double().sum((0, 1)).to(w.dtype)]


def chain_with_boundaries(count: int, dtype=torch.float32) -> FusionDefinition:
    """exp, *2, +1, neg... with a segment_set after each step but the last: `count`
    pointwise segments in a line."""
    with FusionDefinition() as fd:
        x = fd.define_tensor(shape=[-1, -1], dtype=DTYPES[dtype])
        steps = [fd.ops.exp, lambda t: fd.ops.mul(t, 2.0), lambda t: fd.ops.add(t, 1.0), fd.ops.neg]
        t = x
        for k in range(count):
            t = steps[k % len(steps)](t)
            if k < count - 1:
                t = fd.ops.segment_set(t)
        fd.add_output(t)
    return fd


def chain_eager(count: int):
    def run(x):
        steps = [torch.exp, lambda t: t * 2.0, lambda t: t + 1.0, torch.neg]
        for k in range(count):
            x = steps[k % len(steps)](x)
        return [x]

    return run


def row_sum_spread(rows: int, cols: int) -> FusionDefinition:
    """A row sum broadcast back to the full static shape and returned at that size."""
    with FusionDefinition() as fd:
        x = fd.define_tensor(shape=[-1, -1], dtype=DataType.Float)
        s = fd.ops.sum(x, [1])
        fd.add_output(fd.ops.broadcast_in_dim(s, shape=[rows, cols], broadcast_dims=[0]))
        fd.add_output(fd.ops.mul(x, 2.0))
    return fd


def row_sum_spread_eager(x):
    return [x.sum(1, keepdim=True).expand(x.shape).contiguous(), x * 2.0]
