"""The kernel IR: the programs schedulers hand to the renderers. A program is the fusion's
work as statements over one loop space, with the tensors it reads (accesses) and writes
(stores); the renderers turn it, with a variant of launch choices, into CUDA C++.

Note [Pointwise accesses] and Note [Reduction loop space] (schedulers/pointwise.py and
schedulers/reduction/lowering.py) say how the schedulers build them.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from fusion_cache.frontend.dtypes import DataType

if TYPE_CHECKING:
    from schedulers.views import ReshapeFrame


@dataclass(frozen=True)
class Access:
    """One read of an input tensor through a dim map (input dim -> loop dim or None, or
    inside reshapes, -> the innermost reshape source's dim)."""

    input_pos: int  # position in execute's input list
    state: int  # the tensor's state index
    dim_map: tuple[int | None, ...]
    dtype: DataType
    frames: tuple[ReshapeFrame, ...] = ()  # the reshapes it is read through, innermost last
    # Note [Index accesses]: "iota" reads no memory; its value is the element's index along
    # the tensor's one dim (offset from the strides a plan gives it), input_pos is -1
    virtual: str = ""

    @property
    def loop_map(self) -> tuple[int | None, ...]:
        """The dims of the loop this access can vary along (a superset, with reshapes)."""
        return self.frames[0].out_map if self.frames else self.dim_map


@dataclass(frozen=True)
class Stmt:
    var: str
    dtype: DataType  # the value's dtype (half/bf16 live in float registers)
    op: str  # 'load', 'scalar', or an op name
    operands: tuple = ()  # vars, or for 'load' the access index
    compute: DataType | None = None  # the dtype operands are converted to
    attrs: tuple = ()


@dataclass(frozen=True)
class Store:
    var: str
    state: int
    dtype: DataType
    alias_input: int | None  # input position written in place
    # the memory order a fresh output is written in (Note [Output layouts]); (): row-major
    stride_order: tuple[int, ...] = ()


@dataclass(frozen=True)
class PointwiseProgram:
    loop_rank: int
    accesses: tuple[Access, ...]
    stmts: tuple[Stmt, ...]
    stores: tuple[Store, ...]
    scalar_inputs: tuple[tuple[int, DataType], ...]  # (input position, dtype) passed as params
    host_scalars: tuple[tuple[int, DataType], ...]  # (state, dtype) computed from sizes
    output_states: tuple[int, ...]
    has_alias: bool = False
    views: tuple[tuple[int, int], ...] = ()  # (reshape output state, its source state)

    def describe(self) -> str:
        return (
            f"pointwise: loop rank {self.loop_rank}, {len(self.accesses)} input accesses, "
            f"{len(self.stmts)} statements, {len(self.stores)} outputs"
        )


@dataclass(frozen=True)
class Reduction:
    var: str  # the accumulator's name; for Welford the triple's
    op: str  # 'sum', 'prod', 'max', 'min' or 'welford'
    input: str
    dtype: DataType  # accumulator dtype (register type of the result)
    stage: int


@dataclass(frozen=True)
class ReductionProgram:
    rank: int
    reduced: tuple[int, ...]  # K: the reduced loop dims
    accesses: tuple[Access, ...]
    stmts: tuple[Stmt, ...]  # in dependence order; reductions appear as 'reduce' stmts
    reductions: tuple[Reduction, ...]
    stores: tuple[Store, ...]
    store_rowlevel: tuple[bool, ...]
    output_maps: tuple[tuple[int | None, ...], ...]
    scalar_inputs: tuple[tuple[int, DataType], ...]
    host_scalars: tuple[tuple[int, DataType], ...]
    output_states: tuple[int, ...]
    loop_state: int  # a reduction input: its shape is the loop space
    element_vars: frozenset[str]  # vars that depend on K
    stage_of: tuple[tuple[str, int], ...]  # var -> the stage after which it can be computed
    views: tuple[tuple[int, int], ...] = ()  # (reshape output state, its source state)

    @property
    def stages(self) -> int:
        return max((r.stage for r in self.reductions), default=0)

    def describe(self) -> str:
        ops = ",".join(r.op for r in self.reductions)
        return (f"reduction: rank {self.rank}, reduced dims {list(self.reduced)}, {ops} in "
                f"{self.stages} stage(s), {len(self.accesses)} accesses")  # fmt: skip


def needed(program: ReductionProgram, targets: Sequence[str],
           carried: frozenset[str] = frozenset()) -> tuple[list[Any], list[str]]:  # fmt: skip
    """The element-level statements (in order) that `targets` depend on, and the carried
    values (kept in registers by an earlier pass) they read instead of recomputing."""
    by_var = {s.var: s for s in program.stmts}
    want: set[str] = set()
    leaves: set[str] = set()
    stack = [t for t in targets if t in program.element_vars]
    while stack:
        v = stack.pop()
        if v in want or v in leaves:
            continue
        if v in carried:
            leaves.add(v)
            continue
        want.add(v)
        st = by_var[v]
        if st.op == "reduce":
            continue
        stack.extend(o for o in st.operands if isinstance(o, str) and o in program.element_vars)
    order = [s.var for s in program.stmts]
    return ([s for s in program.stmts if s.var in want and s.op != "reduce"],
            sorted(leaves, key=order.index))  # fmt: skip
