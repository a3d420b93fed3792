"""A reduction fusion lowered to a ReductionProgram: its loop space, statements, stages and
which values are row-level.

Note [Reduction loop space]: the loop space is the shape of the reductions' inputs (all
reductions of a fusion reduce the same axes K of tensors of one shape); the other dims I
index rows. Walking back from the outputs as the pointwise scheduler does, each value is
either *row-level* (a function of I only: reduction results and what follows from them) or
*element-level* (depends on K too). Reductions come in stages: a reduction whose input needs
another's result (softmax's sum needs the max) runs one stage later. An inner kernel gives
each row to TX threads (TY rows per block), keeps the row's loads in registers when they fit
and makes one pass over the row per stage, plus a last pass for element-level outputs: the
input is read from memory once. An outer kernel (K strided, I contiguous) gives columns to
threads and splits K over blocks, with a second kernel combining the partial results.

A reshape before the reductions (a prologue) is read through strides as in the pointwise
scheduler (Note [Reshape frames] in schedulers/views.py). A reshape of a reduction's result,
or of any value computed from one, is refused: its rows would be regrouped, which one
kernel's row assignment cannot follow, so the segmenter cuts the fusion there.
"""
from __future__ import annotations

from typing import Any

from codegen.cuda_ops import RANDOM_STMTS
from codegen.kernel_ir import Reduction, ReductionProgram, Stmt, Store
from fusion_cache.frontend.dtypes import DataType, is_complex, is_float, real_part
from fusion_cache.frontend.records import Record
from fusion_cache.frontend.values import TensorInfo
from fusion_cache.ir.output_layout import output_stride_orders

from ..base import SchedulerRefused
from ..pointwise import _Lowering

NAME = "reduction"  # the scheduler's name in the registry
REDUCTIONS = {"sum", "prod", "max", "min", "var", "var_mean", "welford"}


class _ReductionLowering(_Lowering):
    def __init__(self, fd: Any, producers: dict, input_pos: dict, rank: int,
                 reduced: tuple[int, ...]) -> None:  # fmt: skip
        super().__init__(fd, producers, input_pos)
        self.rank = rank
        self.reduced = reduced
        self.reductions: list[Reduction] = []
        self.loop_state: int = -1

    def op(self, rec: Record, out_map: tuple, index: int | None = None) -> str:
        if rec.name == "iota":  # index accesses are the pointwise kernel's alone
            raise SchedulerRefused(f"iota ({rec.outputs[0]}) in a reduction kernel")
        if rec.name not in REDUCTIONS:
            return super().op(rec, out_map, index)
        if self.frame:
            raise SchedulerRefused(
                f"reshape (T{self.frame[-1].state}) of a value computed from {rec.name} "
                f"({rec.outputs[0]}): a reshape after a reduction regroups its rows"
            )
        src = rec.args[0]
        info = self.info(src.index)
        if info.ndim != self.rank:
            raise SchedulerRefused(f"{rec.name} reduces a rank-{info.ndim} tensor, the loop has {self.rank}")
        axes = tuple(sorted({d % self.rank for d in rec.kw("dims")}))
        if axes != self.reduced:
            raise SchedulerRefused(f"reductions over different dims {list(axes)} and {list(self.reduced)}")
        keep = rec.kw("keepdim", False)
        kept = [d for d in range(self.rank) if d not in axes]
        expect = tuple(None if (keep and d in axes) else d for d in (range(self.rank) if keep else kept))
        if tuple(out_map) != expect:
            raise SchedulerRefused(f"the result of {rec.name} ({rec.outputs[0]}) is read through a view")
        x = self.tensor(src.index, tuple(range(self.rank)))
        if self.loop_state < 0:
            self.loop_state = src.index
        out_dtype = self.info(rec.outputs[0].index).dtype
        if is_complex(info.dtype):
            return self.complex_sum(rec, x, info.dtype, out_dtype)
        if rec.name in ("sum", "prod", "max", "min"):
            acc = self.new_var()
            self.stmts.append(Stmt(acc, out_dtype, "reduce", (x,), out_dtype, (("op", rec.name),)))
            self.reductions.append(Reduction(acc, rec.name, x, out_dtype, 0))
            return acc
        if not is_float(info.dtype):
            raise SchedulerRefused(f"{rec.name} of {info.dtype!r}")
        acc_dtype = DataType.Double if info.dtype is DataType.Double else DataType.Float
        w = self.new_var()
        self.stmts.append(Stmt(w, acc_dtype, "reduce", (x,), acc_dtype, (("op", "welford"),)))
        self.reductions.append(Reduction(w, "welford", x, acc_dtype, 0))
        outs = {}
        if rec.name in ("var", "var_mean"):
            corr = float(rec.kw("correction"))
            outs[rec.outputs[0].index] = self.emit(info.dtype, "welford_var", (w,), acc_dtype,
                                                   (("correction", corr),))  # fmt: skip
        if rec.name == "var_mean":
            outs[rec.outputs[1].index] = self.emit(info.dtype, "welford_mean", (w,), acc_dtype)
        if rec.name == "welford":
            outs[rec.outputs[0].index] = self.emit(info.dtype, "welford_mean", (w,), acc_dtype)
            outs[rec.outputs[1].index] = self.emit(info.dtype, "welford_m2", (w,), acc_dtype)
            outs[rec.outputs[2].index] = self.emit(DataType.Int, "welford_count", (w,), acc_dtype)
        for idx, var in outs.items():
            self.memo[self.key(idx, out_map)] = var
        return outs[rec.outputs[0].index if index is None else index]

    def loop_rank(self, out_map: tuple) -> int:
        return self.rank  # random numbers are element-level: they have the loop's shape

    def complex_sum(self, rec: Record, x: str, dtype: DataType, out_dtype: DataType) -> str:
        """Note [Complex sums]: a sum of complex values is two sums of floats, of the real
        and of the imaginary parts, joined after the reduction: the reduction machinery
        (warps, clusters, partials) only ever adds real numbers."""
        if rec.name != "sum" or not is_complex(out_dtype):
            raise SchedulerRefused(f"{rec.name} ({rec.outputs[0]}) of complex values has no kernel")
        part = real_part(out_dtype)
        sums = []
        for op in ("real", "imag"):
            value = self.emit(part, op, (x,), dtype)
            acc = self.new_var()
            self.stmts.append(Stmt(acc, part, "reduce", (value,), part, (("op", "sum"),)))
            self.reductions.append(Reduction(acc, "sum", value, part, 0))
            sums.append(acc)
        return self.emit(out_dtype, "complex", tuple(sums), part)


def _loop_space(fd: Any) -> tuple[int, tuple[int, ...]]:
    found = None
    for r in fd._records:
        if r.kind == "op" and r.name in REDUCTIONS:
            info = fd._infos[r.args[0].index]
            key = (info.ndim, tuple(sorted({d % max(info.ndim, 1) for d in r.kw("dims")})))
            if found is not None and key != found:
                raise SchedulerRefused(f"reductions over different loop spaces {found} and {key}")
            found = key
    if found is None:
        raise SchedulerRefused("the fusion has no reduction")
    if not found[1]:
        raise SchedulerRefused("a reduction over no dims")
    return found


def lower_reduction(fd: Any) -> ReductionProgram:
    rank, reduced = _loop_space(fd)
    producers = {o.index: r for r in fd._records if r.kind == "op" for o in r.outputs}
    input_pos = {ref.index: i for i, ref in enumerate(fd.input_refs())}
    low = _ReductionLowering(fd, producers, input_pos, rank, reduced)
    kept = [d for d in range(rank) if d not in reduced]
    stores, maps = [], []
    for r, order in zip(fd.output_records(), output_stride_orders(fd)):
        idx = r.args[0].index
        info = fd._infos[idx]
        if not isinstance(info, TensorInfo):
            raise SchedulerRefused(f"output {r.args[0]} is a scalar")
        if info.ndim == rank:
            omap = tuple(None if (d in reduced and info.shape[d] == 1) else d for d in range(rank))
        elif info.ndim == len(kept):
            omap = tuple(kept)
        else:
            raise SchedulerRefused(f"output {r.args[0]} of rank {info.ndim} fits neither the loop nor a row")
        var = low.tensor(idx, omap)
        alias = r.kw("alias_input")
        stores.append(Store(var, idx, info.dtype, None if alias is None else input_pos[alias.index],
                            order))  # fmt: skip
        maps.append(omap)
    # which values depend on K, and after which stage each can be computed
    element: set[str] = set()
    stage: dict[str, int] = {}
    reductions = []
    red_by_var = {r.var: r for r in low.reductions}
    for st in low.stmts:
        if st.op == "load":
            acc = low.accesses[st.operands[0]]
            if any(m in reduced for m in acc.loop_map if m is not None):
                element.add(st.var)
            stage[st.var] = 0
        elif st.op in RANDOM_STMTS:  # one number an element of the loop
            element.add(st.var)
            stage[st.var] = 0
        elif st.op == "reduce":
            src = st.operands[0]
            if src not in element:
                raise SchedulerRefused(f"a reduction of a value that does not vary along {list(reduced)}")
            stage[st.var] = stage[src] + 1
            reductions.append(Reduction(st.var, red_by_var[st.var].op, src, st.dtype, stage[st.var]))
        else:
            ops = [o for o in st.operands if isinstance(o, str)]
            if any(o in element for o in ops):
                element.add(st.var)
            stage[st.var] = max((stage[o] for o in ops), default=0)
    rowlevel = tuple(s.var not in element for s in stores)
    for s, om, row in zip(stores, maps, rowlevel):
        if not row and any(m is None for m in om):
            raise SchedulerRefused(f"output {s.state} varies along reduced dims it does not have")
        if row and any(m in reduced for m in om if m is not None):
            # a per-row value spread over the reduced dims: cheaper to hand the row value to
            # a pointwise consumer than to write it out at full size here
            raise SchedulerRefused(f"output {s.state} broadcasts a per-row value over the "
                                   "reduced dims")  # fmt: skip
    return ReductionProgram(
        rank, reduced, tuple(low.accesses), tuple(low.stmts), tuple(reductions), tuple(stores),
        rowlevel, tuple(maps), tuple(sorted(low.scalar_inputs.items())),
        tuple(sorted(low.host_scalars.items())),
        tuple(s.state for s in stores), low.loop_state, frozenset(element), tuple(stage.items()),
        tuple(low.views.items()),
    )  # fmt: skip
