"""Resize and indexing ops in the schedulers' lowering, and their plan-time resolution.

Note [Resize frames]: a slice, select, pad or cat operand is lowered as a reshape is (Note
[Reshape frames] in views.py): its source in its own dim space, inside a frame. Nothing is
copied. At plan time each frame maps its source's coordinates to its output's, one dim at a
time, source = step * output + start: a slice scales the strides by its step and moves the
pointer by its start, a select fixes one dim at its index, a pad or a cat operand moves the
pointer back by its left width (its offset along the cat dim), and a broadcast operand of a
cat gets step 0. A pad and a cat operand also have a *window*: the output positions their
source fills. Loads inside a window are predicated by it (positions outside read nothing),
and a 'guard' statement tests it: a pad picks its fill value outside, a cat the next
operand. A window is an interval of output coordinates; resolved through the frames around
it, it becomes an interval of one loop dim (or of an index value), passed as two kernel
arguments; those loop dims are not collapsed with their neighbours.

Note [Gather loads]: index_select, gather, take_along_axis and embedding_fwd read their
index tensor first. The value, cast to an integer and checked against the extent of the
dim it indexes (a device-side assert naming the op otherwise, as torch's kernels assert),
becomes that dim's coordinate: the indexed tensor is lowered with the value's name in its
dim map where a loop dim would be, and at plan time the stride of that dim goes with the
value. Where the value is the same across a thread's vector (an index read once per row,
as an embedding's token), the gathered row is still read with vector loads.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

from codegen.cuda_ops import RANDOM_STMTS as _RANDOM
from codegen.kernel_ir import IndexCheck, Position
from fusion_cache.frontend.dtypes import DataType, is_complex, is_float
from fusion_cache.frontend.records import Record, Ref
from fusion_cache.frontend.shapes import normalize_index
from fusion_cache.ir.interpret.resize import slice_bounds
from fusion_cache.ir.view import Keep, analyze_view, apply_view_strides

from .base import SchedulerRefused
from .layout import collapse, row_major
from .loop_split import (
    LoopSplit,
    carried,
    loop_split,
    merged_part,
    part_through,
    resize_parts,
    view_parts,
)
from .views import ReshapeFrame

FRAMED = {"slice", "select", "pad", "cat"}
GATHERS = {"index_select", "gather", "take_along_axis", "embedding_fwd"}


class ResizeFrame(NamedTuple):
    """A slice, select, pad or cat operand being lowered (Note [Resize frames]): the record,
    how the enclosing space reads its output (output dim -> enclosing dim, None or an index
    value) and, for a cat, which operand."""

    record: Record
    out_map: tuple
    operand: int = 0

    @property
    def state(self) -> int:
        return self.record.outputs[0].index

    @property
    def source(self) -> int:
        arg = self.record.args[0]
        return arg[self.operand].index if self.record.name == "cat" else arg.index


# ---- lowering ------------------------------------------------------------------------------


class ResizeLowering:
    """The resize and indexing ops of _Lowering (pointwise.py), shared by every scheduler
    that lowers through it. Expects _Lowering's tensor/scalar/emit/memo/frame."""

    positions: list
    guards: list
    checks: list

    def resize_op(self, rec: Record, out_map: tuple) -> str:
        name = rec.name
        if is_complex(self.info(rec.outputs[0].index).dtype):
            raise SchedulerRefused(f"{name} ({rec.outputs[0]}) of complex values")
        if name in ("slice", "select"):
            return self.framed(ResizeFrame(rec, tuple(out_map)))
        if name == "pad":
            return self.padded(rec, out_map)
        if name == "cat":
            return self.concatenated(rec, out_map)
        if name in GATHERS:
            return self.gathered(rec, out_map)
        raise SchedulerRefused(f"{name} ({rec.outputs[0]}) is not a resize op")

    @staticmethod
    def index_values(dim_map: tuple, frames: tuple) -> tuple[str, ...]:
        """The index values a read through `dim_map` inside `frames` takes its address from."""
        names = [m for m in dim_map if isinstance(m, str)]
        names += [m for f in frames for m in f.out_map if isinstance(m, str)]
        return tuple(dict.fromkeys(names))

    def framed(self, frame: ResizeFrame) -> str:
        """The frame's output: its source lowered in its own dims inside the frame."""
        outer = self.frame
        self.frame = (*outer, frame)
        try:
            return self.tensor(frame.source, tuple(range(self.info(frame.source).ndim)))
        finally:
            self.frame = outer

    def guard(self, frame: ResizeFrame) -> str:
        """A bool: whether the current position lies in `frame`'s window."""
        key = (*self.frame, frame)
        if key not in self.guards:
            self.guards.append(key)
        return self.emit(DataType.Bool, "guard", self.index_values((), key),
                         attrs=(("guard", self.guards.index(key)),))  # fmt: skip

    def padded(self, rec: Record, out_map: tuple) -> str:
        dtype = self.info(rec.outputs[0].index).dtype
        frame = ResizeFrame(rec, tuple(out_map))
        inside = self.guard(frame)
        value = self.framed(frame)
        if rec.kw("value") is None:
            fill = self.emit(dtype, "const", attrs=(("value", False if dtype is DataType.Bool else 0),))
        else:
            fill = self.scalar(rec.kw("value"))
        return self.emit(dtype, "where", (inside, value, fill), compute=dtype)

    def concatenated(self, rec: Record, out_map: tuple) -> str:
        """Each operand in its window of the output, the last one where no other is."""
        dtype = self.info(rec.outputs[0].index).dtype
        operands = rec.args[0]
        parts = []
        for k, ref in enumerate(operands):
            if rec.kw("manual_padding", False):
                # each operand is a pad to the output's shape: its window is the pad's
                pad = self.producers[ref.index]
                inside = self.guard(ResizeFrame(pad, tuple(out_map))) if k < len(operands) - 1 else None
                value = self.tensor(ref.index, tuple(out_map))
            else:
                frame = ResizeFrame(rec, tuple(out_map), k)
                inside = self.guard(frame) if k < len(operands) - 1 else None
                value = self.framed(frame)
            if self.info(ref.index).dtype is not dtype:
                value = self.emit(dtype, "cast", (value,), compute=dtype)
            parts.append((inside, value))
        result = parts[-1][1]
        for inside, value in reversed(parts[:-1]):
            result = self.emit(dtype, "where", (inside, value, result), compute=dtype)
        return result

    # ---- gathers (Note [Gather loads]) -----------------------------------------------------

    def index_value(self, rec: Record, index: Ref, index_map: tuple, state: int, dim: int) -> str:
        """The checked integer index read from `index` through `index_map`, for dim `dim` of
        `state` (the tensor it indexes)."""
        raw = self.tensor(index.index, index_map)
        if self.info(index.index).dtype is not DataType.Int:
            raw = self.emit(DataType.Int, "cast", (raw,), compute=DataType.Int)
        check = IndexCheck(state, dim, f"{rec.name} ({rec.outputs[0]})")
        if check not in self.checks:
            self.checks.append(check)
        return self.emit(DataType.Int, "index", (raw,), attrs=(("check", self.checks.index(check)),))

    def gathered(self, rec: Record, out_map: tuple) -> str:
        name = rec.name
        if name == "embedding_fwd":
            if rec.kw("max_norm") is not None:
                raise SchedulerRefused(f"embedding_fwd ({rec.outputs[0]}) with max_norm "
                                       "(ir/decompose.py rewrites it for the reduction scheduler)")  # fmt: skip
            index, weight = rec.args[0], rec.args[1]
            value = self.index_value(rec, index, tuple(out_map[:-1]), weight.index, 0)
            return self.tensor(weight.index, (value, out_map[-1]))
        src, index = rec.args[0], rec.args[1]
        sinfo, iinfo = self.info(src.index), self.info(index.index)
        d = rec.kw("dim") % sinfo.ndim
        if name == "index_select":
            imap = (out_map[d],) if iinfo.ndim else ()
            value = self.index_value(rec, index, imap, src.index, d)
            smap = tuple(value if k == d else m for k, m in enumerate(out_map))
        else:
            imap = tuple(None if code == 1 else m for code, m in zip(iinfo.shape, out_map))
            value = self.index_value(rec, index, imap, src.index, d)
            smap = tuple(value if k == d else (None if code == 1 else m)
                         for k, (code, m) in enumerate(zip(sinfo.shape, out_map)))  # fmt: skip
        return self.tensor(src.index, smap)

    # ---- positions ---------------------------------------------------------------------------

    def position(self, entry: Any) -> str:
        pos = Position(self.frame, entry)
        if pos not in self.positions:
            self.positions.append(pos)
        return self.emit(DataType.Int, "position", self.index_values((entry,), self.frame),
                         attrs=(("position", self.positions.index(pos)),))  # fmt: skip

    def positioned_iota(self, rec: Record, out_map: tuple) -> str:
        """start + step * i in the output's dtype (double math for floats, as torch.arange),
        i a position: the iota read through a frame or by index, or in a reduction kernel,
        where no index access (Note [Index accesses]) can say where an element lies."""
        dtype = self.info(rec.outputs[0].index).dtype
        n, start, step = rec.args
        calc = DataType.Double if is_float(dtype) else DataType.Int
        i = self.position(out_map[0])
        if calc is DataType.Double:
            i = self.emit(calc, "cast", (i,), compute=calc)
        value = self.emit(calc, "add", (self.emit(calc, "mul", (i, self.scalar(step)), compute=calc),
                                        self.scalar(start)), compute=calc)  # fmt: skip
        return value if dtype is calc else self.emit(dtype, "cast", (value,), compute=dtype)


# ---- plan time: frames resolved for sizes (env) ---------------------------------------------


def env_sizes(env: dict, value: Any) -> list[int]:
    """A shape argument (a vector's Ref, or ints and scalar Refs) as ints from `env`."""
    if isinstance(value, Ref):
        return [int(v) for v in env[value.index]]
    return [int(env[v.index]) if isinstance(v, Ref) else int(v) for v in value]


def frame_steps(frame: ResizeFrame, env: dict) -> tuple[list, list]:
    """(per source dim: (output dim or None, step, start), windows: (output dim, lo, hi)).
    Source coordinate = step * output coordinate + start (Note [Resize frames])."""
    rec = frame.record
    src = tuple(env[frame.source])
    name = rec.name
    if name == "slice":
        bounds = slice_bounds(rec, src, lambda v: env_sizes(env, v))
        return [(d, k, a) for d, (a, _, k) in enumerate(bounds)], []
    if name == "select":
        dim = rec.kw("dim") % len(src)
        index = normalize_index(f"select ({rec.outputs[0]})", "index", int(env[rec.args[1].index]),
                                src[dim])  # fmt: skip
        return [(d - (d > dim), 1, 0) if d != dim else (None, 0, index) for d in range(len(src))], []
    if name == "pad":
        widths = env_sizes(env, rec.kw("pad_widths"))
        steps, windows = [], []
        for d, n in enumerate(src):
            k = len(src) - 1 - d
            lo, hi = (widths[2 * k], widths[2 * k + 1]) if 2 * k < len(widths) else (0, 0)
            steps.append((d, 1, -lo))
            if lo or hi:
                windows.append((d, lo, lo + n))
        return steps, windows
    # a cat operand: its place along the cat dim, broadcast along size-1 dims
    out = tuple(env[frame.state])
    dim = rec.kw("dim") % len(out)
    offset = sum(env[a.index][dim] for a in rec.args[0][:frame.operand])
    steps = []
    for d, n in enumerate(src):
        if d == dim:
            steps.append((d, 1, -offset))
        else:
            steps.append((d, 0 if n == 1 and out[d] != 1 else 1, 0))
    return steps, [(dim, offset, offset + src[dim])]


class Read(NamedTuple):
    """An access resolved for sizes: strides over the loop dims, the element offset of its
    first element and the stride of each index value it is read by; `compounds`: the loop
    dims it reads merged without a view (Note [Split loops]), with their parts."""

    strides: list[int]
    offset: int
    gathers: dict[str, int]
    compounds: dict | None = None


def map_strides(shape: Sequence[int], strides: Sequence[int], dim_map: Sequence,
                 rank: int, gathers: dict[str, int]) -> list[int]:  # fmt: skip
    """`access_strides` for maps that may name index values (their strides go there)."""
    eff = [0] * rank
    for i, m in enumerate(dim_map):
        if m is None or shape[i] == 1:
            continue
        if isinstance(m, str):
            gathers[m] = gathers.get(m, 0) + strides[i]
        else:
            eff[m] += strides[i]
    return eff


def resolve_read(tensor: Any, access: Any, env: dict, rank: int, split: bool = False) -> Read:
    """Note [Resize frames] and [Reshape frames], innermost frame first; with `split`, a
    merge that is no view becomes a compound dim (Note [Split loops])."""
    shape = tuple(tensor.shape)
    strides = [tensor.stride(d) for d in range(len(shape))]
    dim_map, offset, gathers = access.dim_map, 0, {}
    compounds: dict = {}
    for frame in reversed(access.frames):
        src_shape = tuple(env[frame.source])
        src = map_strides(shape, strides, dim_map, len(src_shape), gathers)
        what = f"T{frame.state}"
        compounds = carried(compounds, dim_map, what) if compounds else compounds
        out_shape = tuple(env[frame.state])
        if isinstance(frame, ReshapeFrame):
            analysis = analyze_view(src_shape, out_shape)
            viewed = None if compounds else apply_view_strides(src_shape, tuple(src), analysis)
            if viewed is not None:
                strides = list(viewed)
            elif split:
                strides, compounds = view_parts(src_shape, src, analysis, compounds,
                                                f"reshape ({what})")  # fmt: skip
            else:
                raise SchedulerRefused(
                    f"reshape ({what}) of {list(src_shape)} to {list(out_shape)} is not a "
                    f"view of its source's strides {list(src)} ({analysis.describe()} needs a copy)"
                )
        else:
            steps, windows = frame_steps(frame, env)
            if compounds:
                compounds = resize_parts(compounds, steps, windows, f"{frame.record.name} ({what})")
            strides = [0] * len(out_shape)
            for d, (e, step, start) in enumerate(steps):
                offset += src[d] * start
                if e is not None:
                    strides[e] += src[d] * step
        shape, dim_map = out_shape, frame.out_map
    if compounds:
        compounds = carried(compounds, dim_map, f"T{access.state}")
    return Read(map_strides(shape, strides, dim_map, rank, gathers), offset, gathers,
                compounds or None)


def _kept_dim(frame: ReshapeFrame, d: int, env: dict) -> int:
    """The reshape output dim that source dim d stays as, or a refusal."""
    analysis = analyze_view(tuple(env[frame.source]), tuple(env[frame.state]))
    for step in analysis.steps:
        if isinstance(step, Keep) and step.src == d:
            return step.dst
    raise SchedulerRefused(f"a position along dim {d} of the source of reshape (T{frame.state}) "
                           f"is needed outside it, and {analysis.describe()} regroups that dim")  # fmt: skip


def resolve_position(frames: Sequence, entry: Any, env: dict,
                     split: LoopSplit | None = None) -> tuple[Any, int, int]:  # fmt: skip
    """(target, a, b): the coordinate is a * target + b, where the target is a loop dim, an
    index value's name, or None (a constant b). With `split` (Note [Split loops]) the target
    is a dim of the split loop, and a position inside a merge that is no view is its part's."""
    a, b = 1, 0
    part = None  # (part, the parts' sizes) while the entry is a compound dim
    for frame in reversed(frames):
        if entry is None or isinstance(entry, str):
            break
        sizes = env[frame.source]
        if sizes[entry] == 1 and part is None:
            return None, 0, b
        if isinstance(frame, ReshapeFrame):
            analysis = analyze_view(tuple(sizes), tuple(env[frame.state]))
            if part is not None:
                dst, plain = part_through(analysis, entry, *part, sizes)
                part = None if plain else part
                entry = frame.out_map[dst]
                continue
            merged = None if split is None else merged_part(analysis, entry, sizes)
            if merged is not None:
                dst, k, parts = merged
                part, entry = (k, parts), frame.out_map[dst]
                continue
            entry = frame.out_map[_kept_dim(frame, entry, env)]
            continue
        e, step, start = frame_steps(frame, env)[0][entry]
        if part is not None and (step != 1 or start != 0 or e is None):
            raise SchedulerRefused(f"{frame.record.name} (T{frame.state}) moves dims merged "
                                   "without a view")  # fmt: skip
        a, b = a * step, a * start + b
        if e is None or a == 0:
            return None, 0, b
        entry = frame.out_map[e]
    if part is not None:
        k, parts = part
        if not isinstance(entry, int) or split is None or split.splits.get(entry) != parts:
            raise SchedulerRefused("a position inside dims merged without a view reaches no "
                                   "loop dim split into them")  # fmt: skip
        return split.place(entry) + k, a, b
    if entry is None:
        return None, 0, b
    if split is not None and isinstance(entry, int):
        if entry in split.splits:
            raise SchedulerRefused(f"a position along loop dim {entry}, which is split for dims "
                                   "merged without a view")  # fmt: skip
        entry = split.place(entry)
    return entry, a, b


def resolve_guard(frames: Sequence, env: dict,
                  split: LoopSplit | None = None) -> list[tuple[Any, int, int]] | None:  # fmt: skip
    """The window of frames[-1] as intervals [lo, hi) of targets (loop dims or index values),
    or None when no position lies in it. An interval holding every position is left out."""
    frame = frames[-1]
    out: list[tuple[Any, int, int]] = []
    for e, lo, hi in frame_steps(frame, env)[1]:
        target, a, b = resolve_position(frames[:-1], frame.out_map[e], env, split)
        if target is None:
            if not lo <= b < hi:
                return None
            continue
        # lo <= a t + b < hi with a > 0: t in [ceil((lo - b) / a), ceil((hi - b) / a))
        out.append((target, -((b - lo) // a), -((b - hi) // a)))
    return out


def clip_intervals(intervals: list, sizes: Sequence[int]) -> list | None:
    """Intervals of loop dims clipped to their extents and intersected per target; None when
    one is empty. Size-1 dims (coordinate 0) are decided here."""
    merged: dict[Any, list[int]] = {}
    for target, lo, hi in intervals:
        if isinstance(target, int):
            lo, hi = max(lo, 0), min(hi, sizes[target])
        cur = merged.setdefault(target, [lo, hi])
        cur[0], cur[1] = max(cur[0], lo), min(cur[1], hi)
    out = []
    for target, (lo, hi) in merged.items():
        if lo >= hi:
            return None
        if isinstance(target, int) and (lo, hi) == (0, sizes[target]):
            continue
        out.append((target, lo, hi))
    return out



# ---- plan time: the pointwise kernel's layout of windows, positions and gathers -----------


class ResizeLayout(NamedTuple):
    reads: list[Read]  # per access
    writes: list[Read | None]  # per store: a scatter's strides and index values, else None
    windows: list  # per window: intervals [(target, lo, hi)] or None (never inside)
    preds: list[tuple[int, ...]]  # per access: the windows it is read inside
    positions: list[tuple[Any, int, int]]  # per position: (target, a, b)
    keep: frozenset[int]  # loop dims that windows and positions read: never collapsed
    extents: dict[str, int]  # index value -> the extent it indexes
    # Note [Split loops]: the loop split where reads merge dims without a view (None: not
    # split); the reads, windows and positions above are over the split loop
    split: LoopSplit | None = None


def resize_layout(program: Any, sources: Sequence[Any], env: dict,
                  shape: tuple[int, ...], split: bool = False) -> ResizeLayout:  # fmt: skip
    """Resolve every frame, window and position of `program` for these sizes; `sources`:
    what each access reads (a tensor, or an index access's index space). With `split`, a
    merge that is no view splits the loop (Note [Split loops]); the planner then reads the
    stores' strides through `layout.split` too."""
    rank = len(shape)
    reads = [resolve_read(t, a, env, rank, split) for t, a in zip(sources, program.accesses)]
    cut = loop_split(shape, [r.compounds for r in reads if r.compounds])
    if cut is not None:
        if any(st.dim_map is not None for st in program.stores):
            raise SchedulerRefused("a scatter reads dims merged without a view")
        reads = [r._replace(strides=cut.strides(r.strides, r.compounds), compounds=None)
                 for r in reads]  # fmt: skip
        shape = cut.shape
        rank = len(shape)
    keys = list(program.guards)  # guard k is window k; accesses add the windows they sit in
    preds = []
    for a in program.accesses:
        mine = []
        for k, frame in enumerate(a.frames):
            if isinstance(frame, ResizeFrame) and frame.record.name in ("pad", "cat"):
                key = a.frames[:k + 1]
                if key not in keys:
                    keys.append(key)
                mine.append(keys.index(key))
        preds.append(tuple(mine))
    windows = []
    for key in keys:
        intervals = resolve_guard(key, env, cut)
        windows.append(None if intervals is None else clip_intervals(intervals, shape))
    positions = []
    for p in program.positions:
        target, a, b = resolve_position(p.frames, p.entry, env, cut)
        positions.append((None, 0, b) if isinstance(target, int) and shape[target] == 1
                         else (target, a, b))  # fmt: skip
    keep = {t for w in windows if w for t, _, _ in w if isinstance(t, int)}
    keep |= {t for t, _, _ in positions if isinstance(t, int)}
    extents = {}
    for st in program.stmts:
        if st.op == "index":
            check = program.checks[dict(st.attrs)["check"]]
            extents[st.var] = int(env[check.state][check.dim])
    writes: list[Read | None] = []
    for st in program.stores:
        if st.dim_map is None:
            writes.append(None)
            continue
        out = tuple(env[st.state])
        gathers: dict[str, int] = {}
        writes.append(Read(map_strides(out, row_major(out), st.dim_map, rank, gathers), 0, gathers))
    return ResizeLayout(reads, writes, windows, preds, positions, frozenset(keep), extents, cut)


def collapse_keeping(sizes: Sequence[int], strides: Sequence[Sequence[int]],
                     keep: frozenset[int]) -> tuple[list[int], list[list[int]], list]:  # fmt: skip
    """layout.collapse with `keep` dims of their own, and each loop dim's collapsed dim."""
    dim_of: list = [None] * len(sizes)
    out_sizes, out_strides = collapse(sizes, strides, keep=keep, dim_of=dim_of)
    return out_sizes, out_strides, dim_of


def resize_variant(program: Any, layout: ResizeLayout, sizes: Sequence[int], dim_of: list,
                   strides: Sequence[Sequence[int]], ptrs: Sequence[int], vec: int,
                   ok: Any) -> tuple[list[str], Any, list]:  # fmt: skip
    """(load modes, the ResizeVariant, its kernel arguments) for a collapsed loop of `sizes`
    and vector width `vec`; `ok(ptr, dtype, vec, inner, outer)` says whether a vector load
    is aligned (layout.vector_ok). Modes follow the statements in order, as whether an index
    value is the same across a vector depends on the loads it comes from."""
    from codegen.resize_cuda import Interval

    last = len(sizes) - 1

    def target(t: Any) -> Any:
        return dim_of[t] if isinstance(t, int) else t

    def uniform(t: Any, lo: int, hi: int) -> bool:
        return not isinstance(t, str) and (target(t) != last or (lo % vec == 0 and hi % vec == 0))

    windows = [None if w is None else tuple(Interval(target(t), uniform(t, lo, hi)) for t, lo, hi in w)
               for w in layout.windows]  # fmt: skip
    varies: set[str] = set()
    modes = ["strided"] * len(program.accesses)
    for st in program.stmts:
        operands = [o for o in st.operands if isinstance(o, str)]
        if st.op == "load":
            i = st.operands[0]
            modes[i] = _load_mode(program, layout, i, strides[i], ptrs[i], vec, windows, varies, ok)
            if modes[i] not in ("bcast", "dead"):
                varies.add(st.var)
        elif st.op == "guard":
            w = windows[dict(st.attrs)["guard"]]
            if w and any(not iv.uniform and not (isinstance(iv.target, str) and iv.target not in varies)
                         for iv in w):  # fmt: skip
                varies.add(st.var)
        elif st.op == "position":
            t = layout.positions[dict(st.attrs)["position"]][0]
            if (isinstance(t, int) and target(t) == last and sizes[last] > 1) or t in varies:
                varies.add(st.var)
        elif any(o in varies for o in operands):
            varies.add(st.var)
    rv, args = assemble(program, layout, tuple(windows),
                        tuple(target(t) for t, _, _ in layout.positions))
    return modes, rv, args


def assemble(program: Any, layout: ResizeLayout, windows: tuple, positions: tuple) -> tuple:
    """(the ResizeVariant, its kernel arguments) of a program whose windows' and positions'
    targets a kernel has named; the arguments in resize_params' order."""
    from codegen.resize_cuda import ResizeVariant

    def names(r: Read | None) -> tuple[str, ...]:
        return tuple(sorted(r.gathers, key=lambda v: int(v[1:]))) if r is not None else ()

    gathers = tuple(names(r) for r in layout.reads)
    store_gathers = tuple(names(w) for w in layout.writes)
    rv = ResizeVariant(
        offsets=tuple(any(isinstance(f, ResizeFrame) for f in a.frames) for a in program.accesses),
        gathers=gathers, windows=windows, preds=tuple(layout.preds), positions=positions,
        checks=len(program.checks), store_gathers=store_gathers,
    )  # fmt: skip
    args: list = [r.offset for r, on in zip(layout.reads, rv.offsets) if on]
    args += [r.gathers[v] for r, vs in zip(layout.reads, gathers) for v in vs]
    args += [w.gathers[v] for w, vs in zip(layout.writes, store_gathers) for v in vs]
    for w in layout.windows:
        for _, lo, hi in w or ():
            args += [lo, hi]
    for _, a, b in layout.positions:
        args += [a, b]
    return rv, args + _check_extents(program, layout)


def _check_extents(program: Any, layout: ResizeLayout) -> list[int]:
    """Extent argument e{k} of index check k (every statement of a check reads the same)."""
    out = [0] * len(program.checks)
    for st in program.stmts:
        if st.op == "index":
            out[dict(st.attrs)["check"]] = layout.extents[st.var]
    return out


def _load_mode(program: Any, layout: ResizeLayout, i: int, strides: Sequence[int], ptr: int,
               vec: int, windows: list, varies: set[str], ok: Any) -> str:  # fmt: skip
    acc = program.accesses[i]
    if acc.virtual:  # Note [Index accesses]: the offset is the value
        return "strided"
    mine = [windows[w] for w in layout.preds[i]]
    if any(w is None for w in mine):
        return "dead"
    intervals = [iv for w in mine for iv in w]
    once = all(iv.uniform for iv in intervals)  # decidable once per vector, before the loop
    names = layout.reads[i].gathers
    if names:
        same = all(v not in varies for v in names) and all(
            iv.uniform or (isinstance(iv.target, str) and iv.target not in varies) for iv in intervals)
        if vec > 1 and same and strides[-1] == 1 and ok(
                ptr, acc.dtype, vec, 1, list(strides[:-1]) + list(names.values())):  # fmt: skip
            return "vgather"
        return "gather"
    if strides[-1] == 0:
        return "bcast" if once else "strided"
    if once and ok(ptr, acc.dtype, vec, strides[-1], strides[:-1]):
        return "vec"
    return "strided"


def index_bound(sizes: Sequence[int], strides: Sequence[Sequence[int]], layout: ResizeLayout) -> int:
    """The largest offset any access reaches, offsets and index values included."""
    biggest = 1
    for n in sizes:
        biggest *= n
    rw = list(layout.reads) + list(layout.writes)
    for k, s in enumerate(strides):
        reach = sum((n - 1) * abs(x) for n, x in zip(sizes, s))
        r = rw[k] if k < len(rw) else None
        if r is not None:
            reach += abs(r.offset) + sum((layout.extents.get(v, 1) - 1) * abs(g)
                                         for v, g in r.gathers.items())  # fmt: skip
        biggest = max(biggest, reach)
    return biggest


# ---- what a position or window may resolve to, whatever the sizes (for the reduction
# scheduler's split of row-level and element-level values) -----------------------------------


def position_targets(frames: Sequence, entries: set) -> set:
    """The loop dims and index values positions along `entries` of the innermost frame's
    source space may resolve to (None: a constant); a reshape may send them anywhere."""
    for frame in reversed(frames):
        nxt: set = set()
        for e in entries:
            if e is None or isinstance(e, str):
                nxt.add(e)
            elif isinstance(frame, ReshapeFrame):
                nxt |= set(frame.out_map)
            elif frame.record.name == "select":
                dim = frame.record.kw("dim") % (len(frame.out_map) + 1)
                nxt.add(None if e == dim else frame.out_map[e - (e > dim)])
            else:
                nxt.add(frame.out_map[e])
        entries = nxt
    return entries


def guard_targets(frames: Sequence) -> set:
    """What a window's test may read: the pad's padded dims or the cat dim, resolved."""
    frame = frames[-1]
    rec, rank = frame.record, len(frame.out_map)
    if rec.name == "cat":
        dims = {rec.kw("dim") % rank}
    else:
        widths = rec.kw("pad_widths")
        if isinstance(widths, Ref):  # a vector: any dim may be padded
            dims = set(range(rank))
        else:
            dims = {rank - 1 - k // 2 for k, w in enumerate(widths) if w != 0 and k // 2 < rank}
    return position_targets(frames[:-1], {frame.out_map[d] for d in dims})


# ---- Note [Paired halves] ------------------------------------------------------------------


def paired_halves(program: Any, layout: ResizeLayout, sizes: Sequence[int], dim_of: list,
                  strides: Sequence[Sequence[int]], ptrs: Sequence[int], modes: Sequence[str],
                  vec: int) -> tuple | None:  # fmt: skip
    """Note [Paired halves]: rotate-half reads (RoPE: a cat of the two halves of the head dim,
    read back at +-half) make each element read its partner's input again. A thread that
    takes a vector in each half of the innermost dim reads both halves once: an access
    whose window covers the other half only reads nothing there, and one that reads at
    exactly what another access reads in the other half (the same tensor, strides and
    address) takes that access's vector. Per access, per half: 'load', 'dead' or (access,
    half); and per guard, per half, True or False where its windows decide it in that half
    (None: tested at run time). None where the innermost dim does not split into halves of
    whole vectors, or where no access takes another's vector (a cat of parts that are not
    partners saves no read: its loads outside their windows read nothing already)."""
    from codegen.cuda_ops import ELEMENT_BYTES

    last, n = len(sizes) - 1, sizes[-1]
    if n % 2 or (n // 2) % vec or n < 2 or any(s.op in _RANDOM for s in program.stmts):
        return None
    if any(st.dim_map is not None for st in program.stores):  # scatters: Note [Scatter kernels]
        return None
    hn = n // 2
    pair: list[list] = []
    reps: dict[tuple, tuple[int, int]] = {}
    saved = False
    for i, acc in enumerate(program.accesses):
        entry = []
        for h in range(2):
            lo_h, hi_h = h * hn, (h + 1) * hn
            dead, whole = modes[i] == "dead", True
            for w in layout.preds[i]:
                for t, lo, hi in layout.windows[w] or ():
                    if not (isinstance(t, int) and dim_of[t] == last):
                        whole = False  # a window on another dim: tested at run time
                    elif hi <= lo_h or lo >= hi_h:
                        dead = True
                    elif not (lo <= lo_h and hi_h <= hi):
                        whole = False
            if dead:  # a predicated load reads nothing already: no read saved
                entry.append("dead")
                continue
            if modes[i] != "vec" or acc.virtual or not whole or layout.reads[i].gathers:
                entry.append("load")
                continue
            step = hn * strides[i][-1] * ELEMENT_BYTES[acc.dtype]
            key = (acc.input_pos, acc.dtype, tuple(strides[i]), ptrs[i] + h * step)
            if key in reps:
                entry.append(reps[key])
                saved = True
            else:
                reps[key] = (i, h)
                entry.append("load")
        pair.append(tuple(entry))
    if not saved:
        return None
    guards = []  # per guard: its answer in each half where its windows decide it there
    for w in range(len(program.guards)):
        answer: list = []
        for h in range(2):
            lo_h, hi_h = h * hn, (h + 1) * hn
            known: bool | None = True
            for t, lo, hi in layout.windows[w] or ():
                if not (isinstance(t, int) and dim_of[t] == last):
                    known = None if known is not False else False
                elif hi <= lo_h or lo >= hi_h:
                    known = False
                elif not (lo <= lo_h and hi_h <= hi) and known is True:
                    known = None
            answer.append(False if layout.windows[w] is None else known)
        guards.append(tuple(answer))
    return tuple(pair), tuple(guards)
