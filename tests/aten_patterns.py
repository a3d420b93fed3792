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
