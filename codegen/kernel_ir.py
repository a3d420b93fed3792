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
    from schedulers.resize import ResizeFrame
    from schedulers.views import ReshapeFrame


@dataclass(frozen=True)
class Position:
    """The coordinate along one dim of a value lowered inside `frames`: `entry` is a dim of
    the innermost frame's source space (of the loop without frames), None for a broadcast
    dim (coordinate 0) or an index value's name. 'position' statements read it (iota, triu)."""

    frames: tuple
    entry: int | str | None


@dataclass(frozen=True)
class IndexCheck:
    """An index value must lie in [0, extent of dim `dim` of state `state`); `what` names
    the op in the device-side assert's message."""

    state: int
    dim: int
    what: str


@dataclass(frozen=True)
class Access:
    """One read of an input tensor through a dim map (input dim -> loop dim or None, or
    inside frames, -> the innermost frame source's dim; or the name of an index value that
    gives the coordinate of that dim: Note [Gather loads] in schedulers/resize.py)."""

    input_pos: int  # position in execute's input list
    state: int  # the tensor's state index
    dim_map: tuple[int | str | None, ...]
    dtype: DataType
    # the reshapes, slices, pads and cat operands it is read through, innermost last
    frames: tuple[ReshapeFrame | ResizeFrame, ...] = ()
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
    # a scatter's store (Note [Scatter kernels] in schedulers/scatter.py): the output's dims ->
    # loop dims or index values, as an Access's dim_map; None: the loop is the output
    dim_map: tuple | None = None
    accumulate: bool = False  # add to what is there (atomically), not overwrite
    # the memory order a fresh output is written in (Note [Output layouts]); (): row-major
    stride_order: tuple[int, ...] = ()
    # Note [Outputs of other shapes] (schedulers/pointwise.py): computed through a reshape of
    # the loop (the first output's shape) into its own, written row-major as the loop runs
    reshaped: bool = False


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
    # Note [Resize frames] (schedulers/resize.py): 'position', 'guard' and 'index' statements
    # index these; a guard is the frames down to a pad or cat operand, whose window it tests
    positions: tuple[Position, ...] = ()
    guards: tuple[tuple, ...] = ()
    checks: tuple[IndexCheck, ...] = ()
    loop_state: int | None = None  # the loop is this state's shape, not the outputs'

    @property
    def resized(self) -> bool:
        return is_resized(self)

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
    positions: tuple[Position, ...] = ()  # as PointwiseProgram's
    guards: tuple[tuple, ...] = ()
    checks: tuple[IndexCheck, ...] = ()

    @property
    def resized(self) -> bool:
        return is_resized(self)

    @property
    def stages(self) -> int:
        return max((r.stage for r in self.reductions), default=0)

    def describe(self) -> str:
        ops = ",".join(r.op for r in self.reductions)
        return (f"reduction: rank {self.rank}, reduced dims {list(self.reduced)}, {ops} in "
                f"{self.stages} stage(s), {len(self.accesses)} accesses")  # fmt: skip


def is_resized(program: Any) -> bool:
    """Whether anything is read through a slice, pad or cat, by index or by position, or
    stored at an index (Note [Resize frames] in schedulers/resize.py)."""
    return bool(program.positions or program.guards or program.checks) or any(
        hasattr(f, "record") for a in program.accesses for f in a.frames) or any(
        s.dim_map is not None for s in program.stores)


def has_index_statements(program: Any) -> bool:
    """Whether the program computes positions, window guards or checked indices (pads, cats,
    gathers): statements only the pointwise and row kernels render (codegen/resize_cuda.py).
    A slice alone is an offset in the strides and needs none."""
    return bool(program.positions or program.guards or program.checks)


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
