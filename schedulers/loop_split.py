"""Loop dims split where a reshape merges dims whose strides do not nest.

Note [Split loops]: a reshape that merges dims is a view only where their strides nest
(Note [Reshape frames] in views.py). Two patterns of real programs merge dims that do not:
RoPE on interleaved pairs stacks its two halves on a new innermost dim (a cat of two
broadcasts: stride 0 and a window each) and flattens it with the dim beside it, [.., d/2, 2]
-> [.., d]; and grouped-query attention expands each key/value head over its group (stride 0)
and merges the two dims into the query heads. Read elementwise, such a merge is no copy:
element (i, j) of the merged dims is element (i, j) of its source. So the pointwise planner,
instead of refusing, keeps the merged dims apart as a *compound* dim, one (size, stride) a
part, through the frames around the reshape (kept whole, or split back into the same
parts), and splits the loop dim it reaches into those parts. Every other access, and every
store, reads that loop dim split (a split is always a view); windows and positions inside the
merge land on their part's loop dim. A compound that another frame regroups, offsets or
windows is refused as the merge was. Plans that resolved before are unchanged: only where
the plain resolution refuses is a loop split.

Llama-style forward, a layer: the key heads' RoPE and their expansion over the query heads were
two kernels (the rotated heads written and read again), the merge being the kernel boundary;
with Note [Outputs of other shapes] (pointwise.py) and Note [Same views once] (recompute.py)
the query and key heads' RoPE is one kernel: 69 -> 61 launches a training step (the forward's
31 kernels -> 23, inductor's count). H100 80GB HBM3 (benchmarks.ab_steps, 2026-11-28 03:50
UTC, results/ab-steps-rope-kernels-*): Llama-style 8.91 ms a step against 8.89 with both
switched off (paired rounds 0.986, 3 of 5 the other way: within the noise; inductor 8.19), the
forward's compiled graphs 2.54 against 2.65 ms of host; GPT-2 unchanged in its kernels.
"""
from __future__ import annotations

import math
from collections.abc import Sequence

from fusion_cache.ir.view import ViewAnalysis, group_dims

from .base import SchedulerRefused

Parts = tuple[tuple[int, int], ...]  # a compound dim: (size, stride) of each part, outermost first


def _groups(analysis: ViewAnalysis, sizes: Sequence[int]):
    """Each group of a reshape as (its output dims, its source dims of size > 1, its output
    dims of size > 1): size-1 dims take no part in a merge or a split."""
    for step in analysis.groups():
        srcs, dsts = group_dims(step)
        yield (dsts, [d for d in srcs if sizes[d] != 1],
               [d for d in dsts if analysis.new[d] != 1])  # fmt: skip


def carried(compounds: dict[int, Parts], dim_map: Sequence, what: str) -> dict[int, Parts]:
    """The compounds at dims of a tensor, moved to the dims `dim_map` sends those dims to."""
    out: dict[int, Parts] = {}
    for d, parts in compounds.items():
        m = dim_map[d]
        if not isinstance(m, int) or m in out:
            raise SchedulerRefused(f"{what}: dims merged without a view are read by index, "
                                   "broadcast away or merged again")  # fmt: skip
        out[m] = parts
    return out


def view_parts(sizes: Sequence[int], strides: Sequence[int], analysis: ViewAnalysis,
               compounds: dict[int, Parts], what: str) -> tuple[list[int], dict[int, Parts]]:  # fmt: skip
    """A reshape's output strides and compounds (Note [Split loops]) from its source's: a
    group whose dims nest is a view as in apply_view_strides; a merge whose dims do not nest
    becomes a compound of its output dim (stride 0 there: the parts carry the strides); a
    compound dim kept whole stays one, split back into its parts it is plain dims again."""
    new = analysis.new
    out = [0] * len(new)
    made: dict[int, Parts] = {}
    for dsts, real, real_dsts in _groups(analysis, sizes):
        inside = [d for d in real if d in compounds]
        if inside:
            parts = compounds[inside[0]]
            if len(real) != 1:
                raise SchedulerRefused(f"{what}: {analysis.describe()} merges dims that were "
                                       "merged without a view with others")  # fmt: skip
            if len(real_dsts) == 1:
                made[real_dsts[0]] = parts
            elif [new[d] for d in real_dsts] == [size for size, _ in parts]:
                for d, (_, stride) in zip(real_dsts, parts):
                    out[d] = stride
            else:
                raise SchedulerRefused(f"{what}: {analysis.describe()} splits dims merged "
                                       "without a view into other parts")  # fmt: skip
            continue
        if all(strides[a] == strides[b] * sizes[b] for a, b in zip(real, real[1:])):
            stride = strides[real[-1]] if real else 0
            for d in reversed(dsts):
                out[d] = stride
                stride *= new[d]
        elif len(real_dsts) == 1:
            made[real_dsts[0]] = tuple((sizes[d], strides[d]) for d in real)
        else:
            raise SchedulerRefused(f"{what}: {analysis.describe()} merges and splits dims whose "
                                   f"strides {[strides[d] for d in real]} do not nest")  # fmt: skip
    return out, made


def resize_parts(compounds: dict[int, Parts], steps: Sequence, windows: Sequence,
                 what: str) -> dict[int, Parts]:  # fmt: skip
    """The compounds through a slice, select, pad or cat frame (Note [Resize frames]): only
    along dims it neither moves, scales nor windows."""
    windowed = {e for e, _, _ in windows}
    out: dict[int, Parts] = {}
    for d, parts in compounds.items():
        e, step, start = steps[d]
        if e is None or step != 1 or start != 0 or e in windowed:
            raise SchedulerRefused(f"{what}: dims merged without a view are sliced, padded or "
                                   "concatenated along")  # fmt: skip
        out[e] = parts
    return out


class LoopSplit:
    """The loop's dims split into the parts of the compounds that reach them: `shape` the
    split loop, `place(d)` where loop dim d starts in it."""

    def __init__(self, shape: Sequence[int], splits: dict[int, tuple[int, ...]]) -> None:
        self.splits = splits
        self.starts: list[int] = []
        out: list[int] = []
        for d, n in enumerate(shape):
            self.starts.append(len(out))
            out.extend(splits.get(d, (n,)))
        self.shape = tuple(out)

    def place(self, d: int) -> int:
        return self.starts[d]

    def strides(self, strides: Sequence[int], compounds: dict[int, Parts] | None = None) -> list[int]:
        """Strides over the loop, split: a compound's parts at its dim, any other stride of a
        split dim spread over the parts as a contiguous split would (always a view)."""
        out: list[int] = []
        for d, s in enumerate(strides):
            sizes = self.splits.get(d)
            if sizes is None:
                out.append(s)
            elif compounds and d in compounds:
                if s:
                    raise SchedulerRefused("a loop dim split for dims merged without a view is "
                                           "read through another dim as well")  # fmt: skip
                out.extend(stride for _, stride in compounds[d])
            else:
                out.extend(s * math.prod(sizes[k + 1:]) for k in range(len(sizes)))
        return out


def loop_split(shape: Sequence[int], found: Sequence[dict[int, Parts]]) -> LoopSplit | None:
    """The split of the loop the accesses' compounds ask for (None: no compound), or a
    refusal where two ask for different parts of one loop dim."""
    splits: dict[int, tuple[int, ...]] = {}
    for compounds in found:
        for d, parts in compounds.items():
            sizes = tuple(size for size, _ in parts)
            if splits.setdefault(d, sizes) != sizes:
                raise SchedulerRefused(f"loop dim {d} of {list(shape)} is merged without a view "
                                       f"from parts {list(splits[d])} and {list(sizes)}")  # fmt: skip
    return LoopSplit(shape, splits) if splits else None


def merged_part(analysis: ViewAnalysis, d: int, sizes: Sequence[int]) -> tuple[int, int, tuple[int, ...]] | None:
    """(output dim, part, the parts' sizes) where source dim `d` is merged with others into
    one output dim; None where the group is no plain merge."""
    for _, real, real_dsts in _groups(analysis, sizes):
        if d in real and len(real) > 1 and len(real_dsts) == 1:
            return real_dsts[0], real.index(d), tuple(sizes[s] for s in real)
    return None


def part_through(analysis: ViewAnalysis, d: int, part: int, parts: tuple[int, ...],
                 sizes: Sequence[int]) -> tuple[int, bool]:  # fmt: skip
    """Where part `part` of the compound at source dim `d` goes through a reshape: (output
    dim, whether it is a plain dim there, the compound split back into its parts)."""
    for _, real, real_dsts in _groups(analysis, sizes):
        if d not in real:
            continue
        if len(real) == 1 and len(real_dsts) == 1:
            return real_dsts[0], False
        if len(real) == 1 and tuple(analysis.new[x] for x in real_dsts) == parts:
            return real_dsts[part], True
        break
    raise SchedulerRefused(f"{analysis.describe()} regroups dims merged without a view")
