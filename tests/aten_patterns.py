"""The aten benchmark family's fusions (benchmarks/aten_cases.py) as FusionDefinitions, for
the CPU plan tests and the GPU tests."""
from __future__ import annotations

import torch

from benchmarks import aten_cases as cases
from fusion_cache import FusionDefinition


def build(define, shape: tuple[int, ...]) -> FusionDefinition:
    with FusionDefinition() as fd:
        define(fd, torch.bfloat16, shape)
    return fd


def linear_bias_gelu() -> FusionDefinition:
    return build(cases.define_linear_bias_gelu, (0, 0))


def mlp_block() -> FusionDefinition:
    return build(cases.define_mlp, (0, 0))


def attention_block(batch: int, seq: int, heads: int, head_dim: int) -> FusionDefinition:
    assert head_dim == cases.HEAD_DIM
    return build(cases.define_attention, (batch, seq, heads * head_dim))


def dropout_residual_layer_norm(p: float) -> FusionDefinition:
    assert p == cases.P
    return build(cases.define_dropout_ln, (0, 0))


def dropout_residual_layer_norm_backward(p: float) -> FusionDefinition:
    assert p == cases.P
    return build(cases.define_dropout_ln_bwd, (0, 0))


# ---- views around ATen segments: each (definition, inputs, torch's answer) ----------------------


def _t(fd: FusionDefinition, rank: int, dtype):
    return fd.define_tensor(shape=[-1] * rank, contiguity=True, dtype=dtype)


def _randn(*shape, device, dtype, scale=1.0, gen=None):
    return (torch.randn(*shape, generator=gen, device=device) * scale).to(dtype)


VIEW_PATTERNS = ("matmul_permuted_out", "linear_heads_out", "bmm_sliced_out",
                 "linear_views_sdpfa_views_out", "bmm_of_a_permute_into_a_kernel")


def view_pattern(name: str):
    """One of view_patterns(), built in the current cache (a test's fresh store)."""
    found = [p for p in view_patterns() if p[0] == name]
    assert len(found) == 1 and [p[0] for p in view_patterns()] == list(VIEW_PATTERNS)
    return found[0]


def view_patterns(dtype=torch.bfloat16):
    """Fusions whose ATen op's result is viewed (returned as a view, or read through views by
    another ATen op or a kernel), and fusions whose op reads its operands through views (the
    prepared calls' as_strided, Note [Prepared ATen calls]). Each is (name, definition,
    inputs(device, gen), torch's function)."""
    from fusion_cache.frontend.dtypes import from_torch

    dt = from_torch(dtype)
    out = []

    def pattern(name, build, shapes, torch_fn):
        with FusionDefinition() as fd:
            build(fd, *(_t(fd, len(s), dt) for s in shapes))

        def inputs(device, gen=None):
            return [_randn(*s, device=device, dtype=dtype, scale=s[-1] ** -0.5, gen=gen)
                    for s in shapes]  # fmt: skip

        out.append((name, fd, inputs, torch_fn))

    # the ATen op's result viewed on the way out
    pattern("matmul_permuted_out",
            lambda fd, a, b: fd.add_output(fd.ops.permute(fd.ops.matmul(a, b), [1, 0])),
            [(64, 32), (32, 48)], lambda a, b: (a @ b).t())
    pattern("linear_heads_out",
            lambda fd, x, w: fd.add_output(fd.ops.permute(
                fd.ops.reshape(fd.ops.linear(x, w), [2, 16, 4, 32]), [0, 2, 1, 3])),
            [(2, 16, 64), (128, 64)],
            lambda x, w: torch.nn.functional.linear(x, w).reshape(2, 16, 4, 32).permute(0, 2, 1, 3))

    def bmm_slice(fd, a, b):
        y = fd.ops.bmm(a, b)
        fd.add_output(fd.ops.slice(y, [0, 1, 0], [2, 5, 8]))
        fd.add_output(y)

    pattern("bmm_sliced_out", bmm_slice, [(3, 8, 16), (3, 16, 8)],
            lambda a, b: (torch.bmm(a, b)[0:2, 1:5], torch.bmm(a, b)))

    # views between two ATen ops, and from an op's result into a kernel
    def heads(fd, x, w):
        q = fd.ops.permute(fd.ops.reshape(fd.ops.linear(x, w), [2, 16, 2, 64]), [0, 2, 1, 3])
        o, _, _, _ = fd.ops.sdpfa_fwd(q, q, q, None, True, None)
        fd.add_output(fd.ops.reshape(fd.ops.permute(o, [0, 2, 1, 3]), [2, 16, 128]))

    def torch_heads(x, w):
        q = torch.nn.functional.linear(x, w).reshape(2, 16, 2, 64).permute(0, 2, 1, 3)
        o = torch.nn.functional.scaled_dot_product_attention(q, q, q, is_causal=True)
        return o.permute(0, 2, 1, 3).reshape(2, 16, 128)

    pattern("linear_views_sdpfa_views_out", heads, [(2, 16, 128), (128, 128)], torch_heads)

    def bmm_t_relu(fd, a, b):
        y = fd.ops.permute(fd.ops.bmm(a, fd.ops.permute(b, [0, 2, 1])), [0, 2, 1])
        fd.add_output(fd.ops.relu(y))

    pattern("bmm_of_a_permute_into_a_kernel", bmm_t_relu, [(4, 8, 16), (4, 12, 16)],
            lambda a, b: torch.bmm(a, b.transpose(1, 2)).transpose(1, 2).relu())
    return out
