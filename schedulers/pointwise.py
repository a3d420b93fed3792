"""The pointwise scheduler: any fusion of elementwise ops, casts, broadcasts, expands,
permutes and size-1 squeezes whose tensor outputs share one shape.

Note [Pointwise accesses]: the loop space is the outputs' shape. Walking back from each
output, every view op transforms the map "this tensor's dim -> loop dim (or None for a
broadcast dim)", until an input is reached. An input read through a given map is one
*access*; at run time its strides are summed per loop dim, so broadcasting, permutes,
expands and arbitrary input strides all become "pointer + sum(coord_d * stride_d)". The
program is the same for every size; only the variant (collapsed rank, vector width, index
type, per-access load mode) depends on the inputs, and sizes are kernel arguments.
A reshape is lowered as a frame around its source (Note [Reshape frames] in views.py) and
becomes strides at plan time too.

Note [Outputs of other shapes]: outputs of one size but other shapes (RoPE's rotated query
heads [b, t, h, d/2, 2] beside its key heads expanded over their groups [b, t, kv, g, d])
share one loop, the first output's shape: each other output is lowered in its own dims
inside a frame that reshapes them into the loop's, and written row-major as the loop runs
(its elements in the same order as the loop's). Where the reshape is no view of what the
output reads, the loop is split (Note [Split loops] in loop_split.py). Outputs written in
place or in a stride order keep the loop's shape.
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from codegen.cuda_ops import COMPLEX_OPS, ELEMENT_BYTES, RANDOM_STMTS, kernel_refusal
from codegen.kernel_ir import Access, PointwiseProgram, Stmt, Store
from fusion_cache.frontend.dtypes import DataType, is_complex, is_float, is_integral
from fusion_cache.frontend.ops.table import OPS, promoted_dtype
from fusion_cache.frontend.records import Record, Ref
from fusion_cache.frontend.values import ScalarInfo, TensorInfo
from fusion_cache.ir.output_layout import output_stride_orders, strides_for

from .base import ArgRef, KernelLaunch, LaunchSpec, OutputSpec, SchedulerRefused
from .layout import access_strides, collapse, index_type, row_major, vector_ok
from .resize import (
    FRAMED,
    GATHERS,
    ResizeLowering,
    collapse_keeping,
    index_bound,
    paired_halves,
    resize_layout,
    resize_variant,
)
from .tuning import knob, switched_on
from .views import ReshapeFrame, describe_views, resolve_access

NAME = "pointwise"


def check_kernel_dtype(dtype: DataType, rec: Record) -> None:
    """Refuse values no generated kernel can hold (packed float4), naming the op."""
    why = kernel_refusal(dtype)
    if why is not None:
        raise SchedulerRefused(f"{rec.name} ({rec.outputs[0]}): {why}")
VIEW_OPS = {"broadcast", "broadcast_in_dim", "expand", "permute", "squeeze"}


@dataclass
class _Lowering(ResizeLowering):
    fd: Any
    producers: dict[int, Record]
    input_pos: dict[int, int]
    accesses: list[Access] = field(default_factory=list)
    stmts: list[Stmt] = field(default_factory=list)
    memo: dict[tuple, str] = field(default_factory=dict)
    scalar_inputs: dict[int, DataType] = field(default_factory=dict)
    host_scalars: dict[int, DataType] = field(default_factory=dict)
    frame: tuple[ReshapeFrame, ...] = ()  # the reshapes being lowered, innermost last
    views: dict[int, int] = field(default_factory=dict)  # reshape output -> its source
    # Note [Resize frames] and [Gather loads] (resize.py)
    positions: list = field(default_factory=list)
    guards: list = field(default_factory=list)
    checks: list = field(default_factory=list)

    def info(self, index: int):
        return self.fd._infos[index]

    def new_var(self) -> str:
        return f"v{len(self.stmts)}"

    def emit(self, dtype: DataType, op: str, operands: tuple = (), compute=None, attrs=()) -> str:
        var = self.new_var()
        self.stmts.append(Stmt(var, dtype, op, operands, compute, attrs))
        return var

    # ---- scalars ----------------------------------------------------------------------

    def scalar(self, ref: Ref) -> str:
        key = ("S", ref.index)
        if key in self.memo:
            return self.memo[key]
        info = self.info(ref.index)
        if not isinstance(info, ScalarInfo):
            raise SchedulerRefused(f"{ref} is not a scalar")
        if info.is_const:
            var = self.emit(info.dtype, "const", attrs=(("value", info.value),))
        elif info.is_input and is_complex(info.dtype):
            raise SchedulerRefused(f"the complex scalar input {ref} has no kernel parameter type")
        elif info.is_input:
            self.scalar_inputs[self.input_pos[ref.index]] = info.dtype
            var = self.emit(info.dtype, "param", attrs=(("pos", self.input_pos[ref.index]),))
        elif self.from_sizes(ref):
            # a function of tensor sizes alone: sizes are in the plan key, so the planner
            # computes it on the host and passes it as an argument
            self.host_scalars[ref.index] = info.dtype
            var = self.emit(info.dtype, "hostval", attrs=(("state", ref.index),))
        else:
            rec = self.producers.get(ref.index)
            if rec is None or rec.name not in OPS and rec.name != "cast":
                raise SchedulerRefused(f"scalar {ref} comes from {rec.name if rec else '?'}")
            var = self.elementwise(rec, ())
        self.memo[key] = var
        return var

    def from_sizes(self, ref: Ref) -> bool:
        info = self.info(ref.index)
        if isinstance(info, ScalarInfo) and info.is_const:
            return True
        rec = self.producers.get(ref.index)
        if rec is None:
            return False
        if rec.name in ("size", "tensor_sizes", "at"):
            return True  # sizes, and vector inputs' values: both are in the plan key
        if rec.name in OPS or rec.name == "cast":
            return all(isinstance(a, Ref) and a.kind == "S" and self.from_sizes(a) for a in rec.args)
        return False

    # ---- tensors ----------------------------------------------------------------------

    def key(self, index: int, dim_map: tuple) -> tuple:
        # a dim map means something else inside a reshape's frame
        return ("T", index, dim_map, self.frame)

    def tensor(self, index: int, dim_map: tuple[int | None, ...]) -> str:
        key = self.key(index, dim_map)
        if key in self.memo:
            return self.memo[key]
        info = self.info(index)
        if index in self.input_pos:
            why = kernel_refusal(info.dtype)
            if why is not None:
                raise SchedulerRefused(f"input T{index}: {why}")
            self.accesses.append(Access(self.input_pos[index], index, dim_map, info.dtype,
                                        self.frame))  # fmt: skip
            # an address that takes index values depends on them (Note [Gather loads])
            var = self.emit(info.dtype, "load", (len(self.accesses) - 1,
                                                 *self.index_values(dim_map, self.frame)))
        else:
            rec = self.producers[index]
            var = self.op(rec, dim_map, index)
        self.memo[key] = var
        return var

    def op(self, rec: Record, out_map: tuple, index: int | None = None) -> str:
        """The value of output `index` of `rec`, read through `out_map`."""
        name = rec.name
        if name in OPS or name == "cast":
            return self.elementwise(rec, out_map)
        if name in VIEW_OPS:
            src = rec.args[0]
            return self.tensor(src.index, self.view_map(rec, out_map))
        if name == "reshape":
            return self.reshaped(rec, out_map)
        if name in FRAMED or name in GATHERS:
            return self.resize_op(rec, out_map)
        if name in RANDOM_STMTS:
            return self.random(rec, out_map)
        if name == "full":
            fill = self.scalar(rec.kw("fill_value"))
            dt = rec.kw("dtype")
            return self.emit(dt, "cast", (fill,), compute=dt)
        if name == "iota":
            return self.iota(rec, out_map, index)
        raise SchedulerRefused(f"{name} ({rec.outputs[0]}) is not a pointwise op")

    def elementwise(self, rec: Record, out_map: tuple) -> str:
        out_info = self.info(rec.outputs[0].index)
        check_kernel_dtype(out_info.dtype, rec)
        if rec.name != "cast" and any(is_complex(self.info(a.index).dtype) for a in rec.args
                                      ) and rec.name not in COMPLEX_OPS:  # fmt: skip
            raise SchedulerRefused(f"{rec.name} ({rec.outputs[0]}) of complex values has no kernel")
        rank = len(out_map)
        operands = []
        for a in rec.args:
            if a.kind == "S":
                operands.append(self.scalar(a))
                continue
            ainfo = self.info(a.index)
            check_kernel_dtype(ainfo.dtype, rec)
            shift = rank - ainfo.ndim
            amap = tuple(None if code == 1 else out_map[i + shift] for i, code in enumerate(ainfo.shape))
            operands.append(self.tensor(a.index, amap))
        if rec.name == "cast":
            return self.emit(out_info.dtype, "cast", tuple(operands), compute=out_info.dtype)
        spec = OPS[rec.name]
        compute = promoted_dtype(spec, [self.info(a.index) for a in rec.args])
        if is_integral(compute) and is_float(out_info.dtype):
            compute = out_info.dtype  # sin(int), truediv(int, int): math happens in the float
        return self.emit(out_info.dtype, rec.name, tuple(operands), compute=compute)

    def random(self, rec: Record, out_map: tuple) -> str:
        """uniform or normal numbers (Note [Philox numbers]); the kernel's element index
        is the op's own only when the op has the loop's shape, unpermuted."""
        if self.frame or tuple(out_map) != tuple(range(self.loop_rank(out_map))):
            raise SchedulerRefused(f"{rec.name} ({rec.outputs[0]}) is read through a view or "
                                   "broadcast: its numbers follow its own element order")  # fmt: skip
        seed, offset = rec.kw("rng_seed"), rec.kw("rng_offset")
        if seed is None:
            raise SchedulerRefused(f"{rec.name} ({rec.outputs[0]}) has no rng_seed (the executor "
                                   "gives it one: Note [Random seeds])")  # fmt: skip
        out = self.info(rec.outputs[0].index).dtype
        compute = DataType.Double if out is DataType.Double else DataType.Float
        operands = tuple(self.scalar(x) for x in (rec.args[0], rec.args[1], seed, offset))
        var = self.emit(compute, rec.name, operands, compute)
        return var if out is compute else self.emit(out, "cast", (var,), compute=out)

    def loop_rank(self, out_map: tuple) -> int:
        """The rank of the loop a value is read in (the outputs' rank here)."""
        return len(out_map)

    def iota(self, rec: Record, out_map: tuple, index: int | None) -> str:
        """start + i * step, i the element's index along the iota's dim (Note [Index
        accesses]): an access of no tensor, whose offset the plan's strides make the index."""
        if self.frame or any(isinstance(m, str) for m in out_map):
            return self.positioned_iota(rec, out_map)  # Note [Resize frames] (resize.py)
        state = rec.outputs[0].index
        dt = self.info(state).dtype
        self.accesses.append(Access(-1, state, tuple(out_map), DataType.Int, (), "iota"))
        i = self.emit(DataType.Int, "load", (len(self.accesses) - 1,))
        _, start, step = rec.args
        scaled = self.emit(dt, "mul", (i, self.scalar(step)), compute=dt)
        return self.emit(dt, "add", (scaled, self.scalar(start)), compute=dt)

    def reshaped(self, rec: Record, out_map: tuple) -> str:
        """The reshape's output read through `out_map`: its source, lowered in its own dims
        inside a new frame (Note [Reshape frames])."""
        src = rec.args[0]
        out = rec.outputs[0].index
        if is_complex(self.info(src.index).dtype):
            raise SchedulerRefused(f"reshape ({rec.outputs[0]}) of a complex tensor")
        self.views.setdefault(out, src.index)
        outer = self.frame
        self.frame = (*outer, ReshapeFrame(out, tuple(out_map), src.index))
        try:
            return self.tensor(src.index, tuple(range(self.info(src.index).ndim)))
        finally:
            self.frame = outer

    def reshaped_output(self, index: int, first: int, loop: tuple) -> str:
        """Note [Outputs of other shapes]: output `index`, of another shape than the first
        output `first` (the loop), lowered in its own dims inside a frame that reshapes them
        into the loop's, as a reshape's source is (Note [Reshape frames])."""
        outer = self.frame
        self.frame = (*outer, ReshapeFrame(first, loop, index))
        try:
            return self.tensor(index, tuple(range(self.info(index).ndim)))
        finally:
            self.frame = outer

    def view_map(self, rec: Record, out_map: tuple) -> tuple:
        src = self.info(rec.args[0].index)
        name = rec.name
        if name == "broadcast":
            kept = [m for m, flag in zip(out_map, rec.kw("is_broadcast_dim")) if not flag]
            return tuple(None if src.shape[i] == 1 else m for i, m in enumerate(kept))
        if name == "broadcast_in_dim":
            rank = len(out_map)
            bdims = [d % rank for d in rec.kw("broadcast_dims")]
            return tuple(None if src.shape[i] == 1 else out_map[d] for i, d in enumerate(bdims))
        if name == "expand":
            return tuple(None if code == 1 else out_map[i] for i, code in enumerate(src.shape))
        if name == "permute":
            result: list = [None] * src.ndim
            for j, d in enumerate(rec.kw("dims")):
                result[d % src.ndim] = out_map[j]
            return tuple(result)
        if name == "squeeze":
            dropped = {d % src.ndim for d in rec.kw("dims")}
            it = iter(out_map)
            return tuple(None if i in dropped else next(it) for i in range(src.ndim))
        raise SchedulerRefused(f"unknown view op {name}")


def _viewed_from(index: int, producers: dict[int, Record], outputs: set[int]) -> bool:
    """Whether tensor `index` is view ops (reshapes included) of one of `outputs`."""
    rec = producers.get(index)
    while rec is not None and (rec.name in VIEW_OPS or rec.name == "reshape"):
        index = rec.args[0].index
        if index in outputs:
            return True
        rec = producers.get(index)
    return False


def _same_shape(a: Sequence[int], b: Sequence[int]) -> bool:
    """Whether two outputs' defined shapes may be one shape (-1: a size known at run time)."""
    return len(a) == len(b) and all(x == y or x == -1 or y == -1 for x, y in zip(a, b))


def lower_pointwise(fd: Any) -> PointwiseProgram:
    """Shape-independent lowering of a definition, or SchedulerRefused with the reason."""
    producers: dict[int, Record] = {}
    for r in fd._records:
        if r.kind == "op":
            for o in r.outputs:
                producers[o.index] = r
    input_pos = {ref.index: i for i, ref in enumerate(fd.input_refs())}
    outs = fd.output_records()
    if not outs:
        raise SchedulerRefused("the fusion has no outputs")
    for r in outs:
        if not isinstance(fd._infos[r.args[0].index], TensorInfo):
            raise SchedulerRefused(f"output {r.args[0]} is a scalar")
    first = outs[0].args[0].index
    rank = fd._infos[first].ndim
    split = switched_on("SPLIT_LOOPS")
    low = _Lowering(fd, producers, input_pos)
    loop = tuple(range(rank))
    stores = []
    for r, order in zip(outs, output_stride_orders(fd)):
        idx = r.args[0].index
        alias = r.kw("alias_input")
        reshaped = not _same_shape(fd._infos[idx].shape, fd._infos[first].shape)
        if reshaped and not split:
            raise SchedulerRefused(f"outputs have different shapes {list(fd._infos[first].shape)}"
                                   f" and {list(fd._infos[idx].shape)}")  # fmt: skip
        if reshaped and (alias is not None or order):
            raise SchedulerRefused(f"output {r.args[0]} has another shape than {outs[0].args[0]} "
                                   "and is written in place or in a stride order")  # fmt: skip
        if reshaped and _viewed_from(idx, producers, {o.args[0].index for o in outs} - {idx}):
            # a second copy of an output: its reader views that one (Note [Views go with
            # their readers] in segmenter.py)
            raise SchedulerRefused(f"output {r.args[0]} is a view of another output")
        var = low.reshaped_output(idx, first, loop) if reshaped else low.tensor(idx, loop)
        stores.append(Store(var, idx, fd._infos[idx].dtype,
                            None if alias is None else input_pos[alias.index], stride_order=order,
                            reshaped=reshaped))  # fmt: skip
    return PointwiseProgram(
        loop_rank=rank,
        accesses=tuple(low.accesses),
        stmts=tuple(low.stmts),
        stores=tuple(stores),
        scalar_inputs=tuple(sorted(low.scalar_inputs.items())),
        host_scalars=tuple(sorted(low.host_scalars.items())),
        output_states=tuple(r.args[0].index for r in outs),
        has_alias=any(s.alias_input is not None for s in stores),
        views=tuple(low.views.items()),
        positions=tuple(low.positions),
        guards=tuple(low.guards),
        checks=tuple(low.checks),
    )


def _rows_a_thread(program: PointwiseProgram, sizes: list, live: tuple, modes: list,
                   rows: int) -> int:  # fmt: skip
    """Note [Broadcast rows]: how many rows of the outermost dim a thread takes (1: none),
    where an input read by vectors is dead along that dim (RoPE's cos and sin tables)."""
    n_acc = len(program.accesses)
    if rows <= 1 or len(sizes) < 2 or sizes[0] % rows or any(
            s.op in RANDOM_STMTS for s in program.stmts):  # fmt: skip
        return 1
    if any(m in ("vgather", "scatter", "atomic") for m in modes):
        return 1
    shared = [k for k in range(n_acc) if not live[k][0] and modes[k] in ("vec", "bcast")]
    return rows if shared else 1


def _store_modes(program: PointwiseProgram, dtypes: list, strides: list, ptrs: list,
                 vec: int) -> list[str]:  # fmt: skip
    modes = []
    for st, dt, s, ptr in zip(program.stores, dtypes, strides, ptrs):
        if st.dim_map is not None:
            modes.append("atomic" if st.accumulate else "scatter")
        else:
            modes.append("vec" if s[-1] != 0 and vector_ok(ptr, dt, vec, s[-1], s[:-1]) else "strided")
    return modes


class _IndexSpace:
    """What an index access (Note [Index accesses]) reads: its dim's extent, stride 1."""

    def __init__(self, extent: int) -> None:
        self.shape = (extent,)

    def stride(self, d: int) -> int:
        return 1


def _accessed(values: Sequence[Any], access: Access, env: dict) -> Any:
    if access.virtual:
        return _IndexSpace(int(env[access.state][0]))
    return values[access.input_pos]


def memory_loop_order(program: PointwiseProgram, stores: Sequence[Sequence[int]]) -> list[int]:
    """Note [Loop in memory order]: the loop's dims, outermost first, in the order the first
    output lays them out in memory. A channels-last output (Note [Channels-last convolutions])
    is then walked with its channels innermost: its reads and writes coalesce and collapse to
    [N*H*W, C], where the logical order would step W by C elements (every access strided).
    Row-major outputs keep the logical order. Random numbers are numbered by the logical
    row-major index (Note [Philox numbers]) and index accesses read it: those keep it too."""
    rank = len(stores[0]) if stores else 0
    logical = list(range(rank))
    if not stores or program.resized or any(a.virtual for a in program.accesses) or any(
            st.op in RANDOM_STMTS for st in program.stmts):  # fmt: skip
        return logical
    ref = stores[0]
    return sorted(logical, key=lambda d: -ref[d])  # stable: equal strides keep their order


def plan_pointwise(program: PointwiseProgram, values: Sequence[Any], env: dict,
                   profile: Any) -> LaunchSpec:  # fmt: skip
    """The launch for these inputs: collapse the loop, choose vector width, index type and
    load modes (Note [Pointwise accesses])."""
    from codegen.cuda_ops import TRANSCENDENTAL
    from codegen.pointwise_cuda import (
        BLOCK,
        KERNEL_NAME,
        PointwiseVariant,
        arg_types,
        render_pointwise,
        vector_width,
    )

    if program.loop_state is not None:  # a scatter's loop: Note [Scatter kernels] (scatter.py)
        shapes_out = {tuple(env[program.loop_state])}
    else:
        shapes_out = {tuple(env[st.state]) for st in program.stores if not st.reshaped}
    if len(shapes_out) != 1:
        raise SchedulerRefused(f"outputs have different shapes {sorted(shapes_out)}")
    out_shape = shapes_out.pop()
    for st in program.stores:  # Note [Outputs of other shapes]
        if st.reshaped and math.prod(env[st.state]) != math.prod(out_shape):
            raise SchedulerRefused(f"outputs have different sizes {list(env[st.state])} and "
                                   f"{list(out_shape)}")  # fmt: skip
    rank = len(out_shape)
    layout = None
    split = switched_on("SPLIT_LOOPS")
    sources = [_accessed(values, a, env) for a in program.accesses]
    if not program.resized:
        try:
            seen = [resolve_access(t, a, env) for t, a in zip(sources, program.accesses)]
        except SchedulerRefused:
            if not split:
                raise
            # a merge that is no view: the layout below may split the loop for it (Note
            # [Split loops] in loop_split.py), else it refuses as this did
            layout = resize_layout(program, sources, env, out_shape, split=True)
        else:
            strides = [access_strides(t, m, rank) for t, m in seen]
            ptrs = [0 if a.virtual else values[a.input_pos].data_ptr() for a in program.accesses]
    if program.resized or layout is not None:  # Note [Resize frames], [Gather loads] (resize.py)
        if layout is None:
            layout = resize_layout(program, sources, env, out_shape, split=split)
        strides = [list(r.strides) for r in layout.reads]
        ptrs = [0 if a.virtual else values[a.input_pos].data_ptr() + r.offset * ELEMENT_BYTES[a.dtype]
                for a, r in zip(program.accesses, layout.reads)]  # fmt: skip
    n_reads = len(strides)
    outputs = []
    for k, st in enumerate(program.stores):
        if st.dim_map is not None:  # through the output's own strides, at index values
            strides.append(list(layout.writes[k].strides))
            ptrs.append(0)
            outputs.append(OutputSpec(tuple(env[st.state]), st.dtype, None))
        elif st.alias_input is not None:
            t = values[st.alias_input]
            if tuple(t.shape) != out_shape:
                raise SchedulerRefused(f"output {st.state} has shape {out_shape}, its alias {list(t.shape)}")
            strides.append([t.stride(d) if t.shape[d] != 1 else 0 for d in range(rank)])
            ptrs.append(t.data_ptr())
            outputs.append(OutputSpec(out_shape, st.dtype, st.alias_input))
        elif st.stride_order:
            # Note [Output layouts]: stored through the order's strides, in the kernel
            dense = strides_for(out_shape, st.stride_order)
            strides.append([0 if n == 1 else x for n, x in zip(out_shape, dense)])
            ptrs.append(0)
            outputs.append(OutputSpec(out_shape, st.dtype, None, tuple(dense)))
        else:  # row-major as the loop runs, also where the output has another shape
            strides.append(row_major(out_shape))
            ptrs.append(0)  # fresh allocations are aligned
            outputs.append(OutputSpec(tuple(env[st.state]), st.dtype, st.alias_input))
    numel = math.prod(out_shape)
    notes = describe_views(program.views, env)
    if numel == 0:
        return LaunchSpec(NAME, tuple(outputs), (), (), "empty" + notes)
    if layout is None:
        order = memory_loop_order(program, strides[len(program.accesses):])
        sizes, strides = collapse([out_shape[d] for d in order],
                                  [[s[d] for d in order] for s in strides])  # fmt: skip
    else:
        loop = list(out_shape)
        if layout.split is not None:  # Note [Split loops] (loop_split.py): stores read it too
            loop = list(layout.split.shape)
            strides[n_reads:] = [layout.split.strides(s) for s in strides[n_reads:]]
        sizes, strides, dim_of = collapse_keeping(loop, strides, layout.keep)
    dtypes = [a.dtype for a in program.accesses] + [s.dtype for s in program.stores]
    virtual = [a.virtual for a in program.accesses] + [""] * len(program.stores)
    vec = knob("pointwise.vec", 0) or vector_width(
        [dt for dt, s, v in zip(dtypes, strides, virtual) if s[-1] != 0 and not v])
    while vec > 1 and sizes[-1] % vec:
        vec //= 2
    n_acc = len(program.accesses)
    rv, extra = None, []
    if layout is None:
        modes = []
        for dt, s, ptr, v in zip(dtypes, strides, ptrs, virtual):
            if v:
                modes.append("strided")  # Note [Index accesses]: the offset is the value
            elif s[-1] == 0:
                modes.append("bcast")
            elif vector_ok(ptr, dt, vec, s[-1], s[:-1]):
                modes.append("vec")
            else:
                modes.append("strided")
    else:
        modes, rv, extra = resize_variant(program, layout, sizes, dim_of, strides, ptrs, vec, vector_ok)
        modes += _store_modes(program, dtypes[n_acc:], strides[n_acc:], ptrs[n_acc:], vec)
    if vec > 1 and "vec" not in modes and "vgather" not in modes:
        vec = 1
        if layout is not None:  # the same reads, one element a thread
            modes, rv, extra = resize_variant(program, layout, sizes, dim_of, strides, ptrs, 1,
                                              vector_ok)  # fmt: skip
            modes += _store_modes(program, dtypes[n_acc:], strides[n_acc:], ptrs[n_acc:], 1)
    if vec == 1:
        modes = [m if m in ("bcast", "dead", "gather", "scatter", "atomic")
                 else "gather" if m == "vgather" else "strided" for m in modes]  # fmt: skip
    block = knob("pointwise.block", BLOCK)
    # 16-bit vectors with transcendental math: two vectors a thread keep enough loads in
    # flight (gelu bf16 16384x8192 2730 -> 2875 GB/s on the H100); cheap bodies do not gain,
    # nor grids under four blocks an SM that way (gelu bf16 1024x1024: 554 GB/s with two, 637
    # with one; benchmarks/results/sweep-pure_small.json)
    # with values broadcast along the rows (cross-entropy backward's log-sum-exp, label and
    # gradient a row) one vector a thread ran faster: bf16 8192x50304 2933 -> 3001 GB/s
    # (benchmarks/sweeps/ce.json, H100 2026-11-26)
    heavy = vec >= 8 and any(s.op in TRANSCENDENTAL for s in program.stmts) and (
        numel >= block * vec * 2 * 4 * profile.sm_count) and "bcast" not in modes[:n_acc]
    # a row gather waits on its index's load: several vectors a thread, all gathers issued
    # before any is used (Note [Gathers ahead]): an embedding of 8192 tokens x 768 bf16 1593 ->
    # 1729 GB/s on the H100 with two (sweep of resize_perf.json, 2026-11-26; four: below);
    # same size rule as above
    gathers = "vgather" in modes[:n_acc] and numel >= block * vec * 2 * 4 * profile.sm_count
    if layout is None:
        itype = index_type(sizes, strides)
    else:
        itype = "int" if index_bound(sizes, strides, layout) < 2**30 else "long long"
    pair = pair_guards = None
    # Note [Paired halves]: RoPE bf16 [8, 32, 2048, 128] forward 2095 -> 2749 GB/s, backward
    # 1750 -> 2729 on the H100 (vec 4; 8, or two vectors a thread, gained nothing more)
    if layout is not None and knob("pointwise.pair", True):
        found = paired_halves(program, layout, sizes, dim_of, strides, ptrs, modes[:n_acc], vec)
        pair, pair_guards = found if found is not None else (None, None)
    live = tuple(tuple(x != 0 for x in s) for s in strides)
    # Note [Broadcast rows]: paired halves with tables dead along the outermost dim (RoPE's
    # cos/sin) take two rows a thread: bf16 [8, 32, 2048, 128] forward 2737 -> 2812 GB/s,
    # backward 2761 -> 2825 on the H100 (four: 2769 and 2778; eight: 2732 and 2751; sweep
    # of benchmarks/sweeps/resize_round5.json, 2026-11-27). Other kernels were not timed so.
    rows = _rows_a_thread(program, sizes, live, modes,
                          knob("pointwise.rows", 2 if pair is not None else 1))
    variant = PointwiseVariant(
        len(sizes), vec, itype, tuple(modes[:n_acc]),
        tuple(m if m in ("vec", "scatter", "atomic") else "strided" for m in modes[n_acc:]),
        live, block,
        rows if rows > 1 else knob("pointwise.unroll", 4 if gathers else 2 if heavy else 1),
        knob("load.hint", 0), knob("store.hint", 0),
        rv, pair, pair_guards, rows > 1,
    )  # fmt: skip
    if pair is not None:  # the loop covers the first half; each thread takes both
        sizes = [*sizes[:-1], sizes[-1] // 2]
        numel //= 2
    if rows > 1:  # Note [Broadcast rows]: the loop covers row groups; a thread takes `rows`
        numel //= rows
    args: list = []
    for k, s in enumerate(strides):
        if k < n_acc:
            if not program.accesses[k].virtual:
                args.append(ArgRef("input", program.accesses[k].input_pos))
        else:
            args.append(ArgRef("output", k - n_acc))
        args.extend(s)
    args += [*sizes, numel]
    args += [ArgRef("scalar", pos) for pos, _ in program.scalar_inputs]
    args += [env[state] for state, _ in program.host_scalars]
    args += extra
    per_block = block * vec * (1 if variant.rows else variant.unroll)
    blocks = max(1, min(-(-numel // per_block), 2**31 - 1))
    # Note [Gathers ahead], a grid that loops: row gathers four vectors a thread, at most four
    # blocks an SM: embedding 8192 tokens x 768 bf16 1667 -> 1733 GB/s on the H100 (eager 1671;
    # two a thread and eight blocks 1725, four and no bound 1663; sweep of
    # benchmarks/sweeps/embedding_round6.json, 2026-11-27)
    per_sm = knob("pointwise.blocks_per_sm", 4 if gathers else 0)
    if per_sm:  # a grid that loops: at most so many blocks an SM
        blocks = min(blocks, profile.sm_count * per_sm)
    kernel = KernelLaunch(KERNEL_NAME, render_pointwise(program, variant), (blocks, 1, 1),
                          (block, 1, 1), arg_types(program, variant), tuple(args))  # fmt: skip
    return LaunchSpec(NAME, tuple(outputs), (), (kernel,), variant.describe() + notes)
