"""Five fusions of a small training step, shared by the warmup and restart examples."""
import torch

from fusion_cache import DataType, FusionDefinition

SHAPE = (4096, 1024)


def _bias_gelu(fd):
    x = fd.define_tensor(shape=[-1, -1], contiguity=True, dtype=DataType.BFloat16)
    b = fd.define_tensor(shape=[-1], contiguity=True, dtype=DataType.BFloat16)
    v = fd.ops.cast(x, DataType.Float) + fd.ops.cast(fd.ops.broadcast(b, [True, False]), DataType.Float)
    inner = (v + v * v * v * 0.044715) * 0.7978845608028654
    fd.add_output(fd.ops.cast(v * 0.5 * (fd.ops.tanh(inner) + 1.0), DataType.BFloat16))


def _residual_scale(fd):
    x = fd.define_tensor(shape=[-1, -1], contiguity=True, dtype=DataType.BFloat16)
    r = fd.define_tensor(shape=[-1, -1], contiguity=True, dtype=DataType.BFloat16)
    s = fd.define_scalar(dtype=DataType.Double)
    fd.add_output(fd.ops.cast(fd.ops.cast(x, DataType.Float) * s + fd.ops.cast(r, DataType.Float),
                              DataType.BFloat16))  # fmt: skip


def _relu_mul_add(fd):
    a, b, c = (fd.define_tensor(shape=[-1, -1], contiguity=True, dtype=DataType.Float) for _ in range(3))
    fd.add_output(fd.ops.relu(a * b + c))


def _sigmoid_gate(fd):
    a = fd.define_tensor(shape=[-1, -1], contiguity=True, dtype=DataType.Float)
    g = fd.define_tensor(shape=[-1, -1], contiguity=True, dtype=DataType.Float)
    fd.add_output(a * fd.ops.sigmoid(g))
    fd.add_output(fd.ops.silu(g))


def _dropout_mask_scale(fd):
    a = fd.define_tensor(shape=[-1, -1], contiguity=True, dtype=DataType.Float)
    u = fd.define_tensor(shape=[-1, -1], contiguity=True, dtype=DataType.Float)
    keep = u > 0.1
    fd.add_output(fd.ops.where(keep, a / 0.9, 0.0))


BUILDERS = [_bias_gelu, _residual_scale, _relu_mul_add, _sigmoid_gate, _dropout_mask_scale]


def example_inputs(i, device):
    m, n = SHAPE
    if device == "meta":
        bf = lambda *s: torch.empty(*s, dtype=torch.bfloat16, device="meta")  # noqa: E731
        f32 = lambda *s: torch.empty(*s, dtype=torch.float32, device="meta")  # noqa: E731
    else:
        bf = lambda *s: torch.randn(*s, device=device).to(torch.bfloat16)  # noqa: E731
        f32 = lambda *s: torch.randn(*s, device=device)  # noqa: E731
    return [
        [bf(m, n), bf(n)],
        [bf(m, n), bf(m, n), 0.5],
        [f32(m, n), f32(m, n), f32(m, n)],
        [f32(m, n), f32(m, n)],
        [f32(m, n), f32(m, n).abs() if device != "meta" else f32(m, n)],
    ][i]


def define_all():
    fds = []
    for build in BUILDERS:
        with FusionDefinition() as fd:
            build(fd)
        fds.append(fd)
    return fds
