"""The `fd.ops` namespace: each method checks its arguments, builds a record and infers the
dtype and shape of what it creates (raising TypeError/ValueError naming the argument).

One module a family of ops; `Operators` joins them. The op table (table.py) gives the
elementwise ops' semantics, shared with the interpreter and codegen.
"""
from __future__ import annotations

from .aten import AtenOps
from .convolution import ConvolutionOps
from .creation import CreationOps
from .elementwise import ElementwiseOps
from .indexing import IndexingOps
from .masks import MaskOps
from .normalization import NormalizationOps
from .random import RandomOps
from .reductions import ReductionOps
from .resize import ResizeOps
from .shape import ShapeOps


class Operators(ElementwiseOps, ReductionOps, NormalizationOps, ShapeOps, ResizeOps, CreationOps,
                MaskOps, AtenOps, ConvolutionOps, RandomOps, IndexingOps):
    """`fd.ops` of one FusionDefinition."""


__all__ = ["Operators"]
