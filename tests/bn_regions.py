"""Batch norm training forward and backward as one region each (the aten ops AOTAutograd
writes for nn.BatchNorm2d in training), beside torch's own results and an f64 oracle:
shared by tests/test_batch_norm_training.py (CPU, the reference evaluator) and
tests/gpu/test_batch_norm_training_gpu.py (the generated kernels)."""
from __future__ import annotations

import torch
from torch.fx.experimental.proxy_tensor import make_fx

from fusion_cache.frontends.fx_region import RegionCall, build_region, spec_of

_aten = torch.ops.aten
MOMENTUM, EPS = 0.1, 1e-5
FORWARD_NAMES = ("y", "mean", "invstd", "running_mean", "running_var")
BACKWARD_NAMES = ("grad_input", "grad_weight", "grad_bias")


def forward(x, w, b, rm, rv):
    return _aten._native_batch_norm_legit_functional.default(x, w, b, rm, rv, True, MOMENTUM, EPS)


def backward(g, x, w, mean, invstd):
    return _aten.native_batch_norm_backward.default(g, x, w, None, None, mean, invstd, True, EPS,
                                                    [True, True, True])  # fmt: skip


def region_of(fn, args: tuple) -> RegionCall:
    """`fn` traced to an aten graph and lowered to one region."""
    gm = make_fx(fn, tracing_mode="fake")(*args)
    specs = tuple(spec_of(a) for a in args)
    fd, constants = build_region(gm, specs)
    return RegionCall(fn.__name__, gm, fd, specs, constants)


def inputs(shape, dtype, device, gen):
    """Activations off zero with a spread per channel (as a convolution's output), weights,
    biases, running statistics and an output gradient, all fresh random."""
    c = shape[1]
    per_channel = [1, c] + [1] * (len(shape) - 2)

    def rand(*s):
        return torch.randn(*s, generator=gen, dtype=torch.float64).to(device)

    x = rand(*shape) * (0.5 + rand(c).abs()).view(per_channel) + rand(c).view(per_channel) * 3
    w, b = rand(c), rand(c)
    rm, rv = rand(c), rand(c).abs() + 0.5
    g = rand(*shape)
    return tuple(t.to(dtype) for t in (x, w, b, rm, rv, g))


def run_both(shape, dtype, device, gen) -> dict[str, tuple]:
    """name -> (ours, torch's in `dtype`, torch's in f64) for every output of the forward
    and of the backward; the backward takes the forward's saved statistics, each side its own."""
    x, w, b, rm, rv, g = inputs(shape, dtype, device, gen)
    wide = [t.double() for t in (x, w, b, rm, rv, g)]
    ours_fwd = region_of(forward, (x, w, b, rm, rv))(x, w, b, rm, rv)
    torch_fwd = forward(x, w, b, rm, rv)
    f64_fwd = forward(*wide[:5])
    ours_bwd = region_of(backward, (g, x, w, ours_fwd[1], ours_fwd[2]))(
        g, x, w, ours_fwd[1], ours_fwd[2])  # fmt: skip
    torch_bwd = backward(g, x, w, torch_fwd[1], torch_fwd[2])
    f64_bwd = backward(wide[5], wide[0], wide[1], f64_fwd[1], f64_fwd[2])
    out = {}
    for names, ours, theirs, exact in ((FORWARD_NAMES, ours_fwd, torch_fwd, f64_fwd),
                                       (BACKWARD_NAMES, ours_bwd, torch_bwd, f64_bwd)):  # fmt: skip
        for name, o, t, e in zip(names, ours, theirs, exact):
            out[name] = (o, t, e)
    return out


def worst(a: torch.Tensor, exact: torch.Tensor) -> float:
    """The largest error relative to the exact tensor's scale."""
    return float((a.double() - exact).abs().max() / exact.abs().max().clamp_min(1e-30))
