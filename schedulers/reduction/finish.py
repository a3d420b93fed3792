"""Finishes: where a row kernel's column sums are added up (in the kernel itself, Note
[Finish in the row kernel]), how an outer reduction's partials are combined (Note [Outer
finish]), and whether a finish kernel starts while the kernel before it runs."""
from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from codegen.reduction.outer_kernel import FINISH_NAME, render_outer
from codegen.reduction.variants import OuterVariant

from ..base import KernelLaunch
from ..tuning import knob
from .problem import Problem


def dependent_launch(profile: Any) -> bool:
    """Whether a kernel that reads the previous one's partials is launched to start while
    that one runs (Note [Dependent launch] in codegen/prelude/core.cuh): sm_90 and up. On
    the H100, same run: sums over dim 0 split over a finish kernel bf16 +2.2 to +2.4% (bf16
    16384x4096 2378 -> 2436 GB/s), f32 +1.2 to +1.3%, layer and rms norm backward with a
    column-sum finish -0.1 to +1.2% (benchmarks/results/sweep-dependent.json)."""
    return profile.arch >= 90 and bool(knob("launch.dependent", True))


def fused_finish(p: Problem) -> bool:
    """Whether the row kernel adds up its column sums itself."""
    profile = p.profile
    # Note [Finish in the row kernel]: on sm_90, where a cooperative launch of clusters
    # was seen to hold (benchmarks/results/cooperative-probe-*.txt), for column sums of
    # at most two tiles of 32 columns an SM: on the H100 rms norm backward bf16
    # 262144x256 2659 -> 2725 GB/s, 16384x4096 2672 -> 2700, layer norm's 2604 -> 2674
    # and 2628 -> 2645, f32 within 1%; longer rows, whose finish a few resident blocks
    # take in many steps, lost 4-15% (1024x65536, 256x262144; sweep-fused_finish.json)
    few_tiles = -(-p.N // 32) * len(p.finish) <= 2 * p.sm
    return (bool(p.finish) and profile.arch >= 90 and profile.fused_finish and few_tiles
            and bool(knob("finish.fused", True)))  # fmt: skip


def outer_finish(p: Problem, variant: OuterVariant, types: tuple[str, ...],
                 args: Sequence[Any]) -> KernelLaunch:  # fmt: skip
    """The kernel combining an outer reduction's `split` partials a column."""
    cols = math.prod(p.i_sizes)
    # combining partials is latency-bound: up to 16 thread rows share a column's
    # partials, four or more each (Note [Outer finish]). On the H100 sum over dim 0 f32
    # 262144x256 (256 partials) 2577 GB/s with 16 rows, 2568 with 32, 2490 folding one
    # column a thread in blocks of 128; bf16 2277, 2260 and 2147; with 16 partials
    # (16384x4096) all within 0.5% (benchmarks/results/sweep-finish_rows.json)
    rows = knob("outer.finish_ty", max(1, min(16, variant.split // 4)))
    finish = replace(variant, tx=knob("outer.finish_tx", 32), ty=rows, vec=1)
    return KernelLaunch(FINISH_NAME, render_outer(p.program, finish, True),
                        (-(-cols // finish.tx), 1, 1), (finish.tx, finish.ty, 1), types,
                        tuple(args), dependent=dependent_launch(p.profile))  # fmt: skip
