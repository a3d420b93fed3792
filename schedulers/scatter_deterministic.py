"""Plans of the deterministic scatter kernels (Note [Deterministic scatter] in scatter.py):
the index and the source must be tensors in memory (fusion inputs); a fusion that computes
them is refused here, and the segmenter gives that work a kernel of its own."""
from __future__ import annotations

import math
from typing import Any

from codegen import scatter_cuda as sc
from fusion_cache.frontend.dtypes import DataType

from .base import ArgRef, KernelLaunch, LaunchSpec, OutputSpec, SchedulerRefused
from .layout import access_strides, row_major
from .views import resolve_access


def plan_deterministic(program: Any, first: LaunchSpec | None, values: Any, env: dict,
                       profile: Any) -> LaunchSpec:  # fmt: skip
    """`first`: the plan of the kernel writing the output before the scatter; None for sums
    from a constant fill (Note [Sums cast down]), which need no such kernel."""
    if program.index_read is None or program.source_read is None:
        raise SchedulerRefused(f"the deterministic {program.op} reads its index and source from "
                               "memory; this fusion computes them")  # fmt: skip
    index = _Read(program.index_read, values, env, program.index_state)
    source = _Read(program.source_read, values, env, program.source_state)
    out_shape = tuple(env[program.out_state])
    if program.op == "index_put_accumulate":
        kernels = (_accumulate(program, index, source, out_shape, first is None),)
        work: tuple = ()
    else:
        kernels = _claim_and_store(program, index, source, out_shape)
        work = ((math.prod(out_shape), DataType.Int),)
    if first is None:
        outputs = (OutputSpec(out_shape, program.final_dtype or program.dtype),)
        return LaunchSpec("scatter", outputs, work, kernels,
                          f"{program.op} ordered from {program.fill!r}, cast to "
                          f"{program.final_dtype!r}")  # fmt: skip
    return LaunchSpec("scatter", first.outputs, work, first.kernels + kernels,
                      f"{program.op} deterministic: {first.description}")  # fmt: skip


class _Read:
    """An operand as the scatter reads it (Note [Scatter reads]): its input, shape and
    strides through the views on the way."""

    def __init__(self, access: Any, values: Any, env: dict, state: int) -> None:
        tensor, dim_map = resolve_access(values[access.input_pos], access, env)
        self.shape = tuple(env[state])
        self.ref = ArgRef("input", access.input_pos)
        self.strides = access_strides(tensor, dim_map, len(self.shape))

    def dim(self) -> int:
        return len(self.shape)

    def numel(self) -> int:
        return math.prod(self.shape)


def _stride(t: _Read, d: int) -> int:
    return 0 if t.shape[d] == 1 else t.strides[d]


def _accumulate(program: Any, index: Any, value: Any, out_shape: tuple,
                fill: bool) -> KernelLaunch:  # fmt: skip
    rest = len(out_shape) - 1
    n, v = index.shape[0], out_shape[0]
    h = math.prod(out_shape[1:])
    source = sc.render_ordered_accumulate(program.final_dtype or program.dtype,
                                          program.index_dtype, program.source_dtype, rest,
                                          program.dtype, fill)  # fmt: skip
    args: list = [ArgRef("output", 0), index.ref, _stride(index, 0), value.ref,
                  _stride(value, 0)]  # fmt: skip
    for d in range(rest):
        args += [out_shape[1 + d], _stride(value, 1 + d)]
    args += [n, v, h] + ([program.fill] if fill else [])
    types = ("ptr", "ptr", "i64", "ptr", "i64") + ("i64",) * (2 * rest + 3) + ("f64",) * fill
    grid = (max(1, -(-v // sc.rows_for(program.dtype))), max(1, -(-h // sc.BLOCK)), 1)
    if grid[1] > 65535:  # the grid's y dim: rows of at most 16.7M values
        raise SchedulerRefused(f"{program.op} over rows of {h} values: too wide for the ordered "
                               "kernel's grid")  # fmt: skip
    return KernelLaunch(sc.ACCUMULATE_NAME, source, grid, (sc.BLOCK, 1, 1), types, tuple(args))


def _claim_and_store(program: Any, index: Any, src: Any, out_shape: tuple) -> tuple:
    rank, dim = index.dim(), program.dim
    numel = index.numel()
    out_numel = math.prod(out_shape)
    shape_args = ([index.ref] + list(index.shape)
                  + [_stride(index, d) for d in range(rank)] + row_major(out_shape)
                  + [out_shape[dim], numel])  # fmt: skip
    shape_types = ("ptr",) + ("i64",) * (3 * rank + 2)

    def launch(name: str, source: str, lead: list, lead_types: tuple, count: int,
               rest: list, rest_types: tuple) -> KernelLaunch:  # fmt: skip
        grid = (max(1, -(-count // sc.BLOCK)), 1, 1)
        return KernelLaunch(name, source, grid, (sc.BLOCK, 1, 1), lead_types + rest_types,
                            tuple(lead + rest))  # fmt: skip

    fill = launch(sc.FILL_NAME, sc.render_fill(), [ArgRef("workspace", 0)], ("ptr",), out_numel,
                  [out_numel], ("i64",))  # fmt: skip
    if numel == 0:
        return ()
    claim = launch(sc.CLAIM_NAME, sc.render_claim(rank, dim, program.index_dtype),
                   [ArgRef("workspace", 0)], ("ptr",), numel, shape_args, shape_types)  # fmt: skip
    winners = launch(
        sc.WINNERS_NAME, sc.render_winners(rank, dim, program.index_dtype, program.dtype,
                                           program.source_dtype),
        [ArgRef("output", 0), ArgRef("workspace", 0), src.ref]
        + [_stride(src, d) for d in range(rank)],
        ("ptr", "ptr", "ptr") + ("i64",) * rank, numel, shape_args, shape_types)  # fmt: skip
    return fill, claim, winners
