"""Reshape analysis (nvFuser's view analysis): how a reshape regroups the dims of a tensor.

`analyze_view(original, new)` resolves a -1 and describes the reshape as steps: squeezes of
original size-1 dims, then groups in order (keep, merge, split, merge-split), then broadcasts
of new size-1 dims. Steps hold dim indices, never sizes, so `ViewAnalysis.constraint()` is the
same for every pair of shapes that regroups the same way: one plan and one kernel serve them
all, with the sizes passed as kernel arguments. Pure Python; no torch.

Note [View grouping]
  Groups are atomic: no group can be cut into two smaller groups whose products also match.
  On the dims of size > 1 this is the walk "accumulate products left to right until they
  match", and its cuts are exactly where torch.Tensor.view may change stride, which is what
  `apply_view_strides` relies on. Size-1 dims can go several ways (squeezed, broadcast, kept,
  or absorbed into a neighbouring group); among atomic decompositions we take the fewest
  non-Keep steps, then the most Keeps, then the one that matches dims earliest:
    [2,1,3] -> [2,3]   squeeze 1            (merge (0,1)->0 is also one step, one keep fewer)
    [2,3] -> [2,1,3]   broadcast 1
    [2,1,3] -> [6]     merge (0,1,2)->0     (squeeze 1 + merge (0,2)->0 would be two)
    [4,1] -> [4,1]     keep 0->0, keep 1->1
  This is not the fewest steps over every grouping: [4,6] -> [2,2,2,3] is two splits rather
  than one merge-split, because dims that stay apart stay independent for schedulers and can
  still be viewed in place when the tensor is not contiguous.
  Zero-size shapes follow the same rule, with a cut allowed only where the products match on
  both sides of it: [0,3] -> [3,0] is one merge-split of everything, [2,0] -> [2,0] two keeps,
  [0,3] -> [0,5] one merge-split.

Shapes are concrete sizes (execute time). Checking that a size vector has the tensor's rank,
or that definition-time symbolic sizes were resolved, is the caller's job.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache, lru_cache


@dataclass(frozen=True)
class Squeeze:
    """Drop original dim `dim`, of size 1."""

    dim: int


@dataclass(frozen=True)
class Keep:
    """Original dim `src` is new dim `dst`, same size."""

    src: int
    dst: int


@dataclass(frozen=True)
class Merge:
    """Consecutive original dims `srcs` become new dim `dst`."""

    srcs: tuple[int, ...]
    dst: int


@dataclass(frozen=True)
class Split:
    """Original dim `src` becomes consecutive new dims `dsts`."""

    src: int
    dsts: tuple[int, ...]


@dataclass(frozen=True)
class MergeSplit:
    """Consecutive original dims `srcs` are flattened and re-split into new dims `dsts`."""

    srcs: tuple[int, ...]
    dsts: tuple[int, ...]


@dataclass(frozen=True)
class Broadcast:
    """Insert new dim `dim`, of size 1."""

    dim: int


Group = Keep | Merge | Split | MergeSplit
Step = Squeeze | Group | Broadcast


def group_dims(step: Group) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(original dims, new dims) of a group step."""
    if isinstance(step, Keep):
        return (step.src,), (step.dst,)
    if isinstance(step, Merge):
        return step.srcs, (step.dst,)
    if isinstance(step, Split):
        return (step.src,), step.dsts
    return step.srcs, step.dsts


@dataclass(frozen=True)
class ViewAnalysis:
    original: tuple[int, ...]
    new: tuple[int, ...]
    steps: tuple[Step, ...]  # squeezes, then groups in order, then broadcasts

    def groups(self) -> tuple[Group, ...]:
        return tuple(s for s in self.steps if not isinstance(s, (Squeeze, Broadcast)))

    def transforms(self) -> int:
        """Number of non-Keep steps: what Note [View grouping] minimizes first."""
        return sum(not isinstance(s, Keep) for s in self.steps)

    def constraint(self) -> tuple:
        """Size-free, hashable, JSON-friendly form of the steps, for plan keys."""
        return tuple(_step_key(s) for s in self.steps)

    def describe(self) -> str:
        return ", ".join(_describe(s) for s in self.steps) or "no dims"


def infer_new_shape(original: Sequence[int], new: Sequence[int],
                    where: str = "reshape") -> tuple[int, ...]:  # fmt: skip
    """The new shape with its -1 (if any) resolved against the original's element count;
    errors start with `where` (e.g. "reshape (T3)") and name both shapes."""
    return _resolve(original, new, where)[1]


def analyze_view(original: Sequence[int], new: Sequence[int]) -> ViewAnalysis:
    """Steps that turn `original` into `new` (one -1 allowed); see Note [View grouping]."""
    return _analyze(*_resolve(original, new))


def apply_view_strides(
    sizes: Sequence[int], strides: Sequence[int], analysis: ViewAnalysis
) -> tuple[int, ...] | None:
    """Strides of `analysis.new` if a tensor with these sizes and strides can be viewed as it
    without a copy (torch.Tensor.view semantics), else None.

    Each group's original dims of size > 1 must be contiguous with each other. Size-1 dims may
    have any stride; we give them the ones torch.Tensor.view gives, so results compare equal.
    """
    sizes, strides, new = tuple(sizes), tuple(strides), analysis.new
    if sizes != analysis.original or len(strides) != len(sizes):
        raise ValueError(
            f"reshape: sizes {list(sizes)} and strides {list(strides)} do not fit the "
            f"analysis of {list(analysis.original)} -> {list(new)}"
        )
    if math.prod(sizes) == 0:  # nothing is ever read, so any strides will do
        return strides if sizes == new else _contiguous_strides(new)
    out = [0] * len(new)
    for step in analysis.groups():
        srcs, dsts = group_dims(step)
        real = [d for d in srcs if sizes[d] != 1]
        if any(strides[a] != strides[b] * sizes[b] for a, b in zip(real, real[1:])):
            return None
        stride = strides[real[-1]] if real else 0
        for d in reversed(dsts):
            out[d] = stride
            stride *= new[d]
    for d in reversed(range(len(new))):
        if new[d] == 1:
            out[d] = out[d + 1] * new[d + 1] if d + 1 < len(new) else (strides or (1,))[-1]
    return tuple(out)


# --------------------------------------------------------------------------------------------
# resolving shapes


def _resolve(original: Sequence[int], new: Sequence[int],
             where: str = "reshape") -> tuple[tuple[int, ...], ...]:  # fmt: skip
    orig, want = _sizes(original, "original shape"), _sizes(new, "new shape")

    def error(why: str) -> ValueError:
        return ValueError(f"{where}: cannot reshape {list(orig)} to {list(want)}: {why}")

    if any(s < 0 for s in orig):
        raise error("the original shape has a negative size")
    if any(s < -1 for s in want):
        raise error(f"negative size {min(want)} (only -1, for 'infer', is allowed)")
    if want.count(-1) > 1:
        raise error("more than one -1")
    numel = math.prod(orig)
    known = math.prod(s for s in want if s != -1)
    if -1 in want:
        if known == 0:
            raise error("-1 is ambiguous because the other sizes multiply to 0")
        if numel % known:
            raise error(f"{numel} elements do not divide into parts of {known}")
        return orig, tuple(numel // known if s == -1 else s for s in want)
    if known != numel:
        raise error(f"{numel} elements, but the new shape holds {known}")
    return orig, want


def _sizes(shape: Sequence[int], what: str) -> tuple[int, ...]:
    try:
        items = list(shape)
    except TypeError:
        raise TypeError(f"reshape: {what} must be a sequence of ints, got {shape!r}") from None
    for e in items:
        if isinstance(e, bool) or not hasattr(type(e), "__index__"):
            raise TypeError(f"reshape: {what} {items!r} has a non-int entry {e!r}")
    return tuple(operator.index(e) for e in items)


# --------------------------------------------------------------------------------------------
# the search (Note [View grouping])


@lru_cache(maxsize=4096)  # runs on every execute; training loops repeat their shapes
def _analyze(orig: tuple[int, ...], new: tuple[int, ...]) -> ViewAnalysis:
    rank = {Squeeze: 0, Broadcast: 2}
    steps = sorted(_best_steps(orig, new), key=lambda s: rank.get(type(s), 1))  # stable
    return ViewAnalysis(orig, new, tuple(steps))


def _best_steps(orig: tuple[int, ...], new: tuple[int, ...]) -> tuple[Step, ...]:
    """Cheapest decomposition into squeezes, broadcasts and atomic groups, left to right.

    Cost is (non-Keep steps, -Keeps); on equal cost the first move tried wins, and groups are
    tried before squeezes and broadcasts, smaller groups first.
    """
    n, m = len(orig), len(new)
    po, pn = _range_products(orig), _range_products(new)
    nonzero = math.prod(orig) != 0  # then products only grow, so the scan can stop early

    def atomic(i: int, i2: int, j: int, j2: int) -> bool:
        return not any(
            po[i][a] == pn[j][b] and po[a][i2] == pn[b][j2]
            for a in range(i + 1, i2)
            for b in range(j + 1, j2)
        )

    def moves(i: int, j: int):
        for i2 in range(i + 1, n + 1):
            if nonzero and po[i][i2] > pn[j][m]:
                break
            for j2 in range(j + 1, m + 1):
                if po[i][i2] == pn[j][j2] and atomic(i, i2, j, j2):
                    yield _group(tuple(range(i, i2)), tuple(range(j, j2))), i2, j2
                elif nonzero and pn[j][j2] > po[i][i2]:
                    break
        if i < n and orig[i] == 1:
            yield Squeeze(i), i + 1, j
        if j < m and new[j] == 1:
            yield Broadcast(j), i, j + 1

    @cache
    def best(i: int, j: int) -> tuple[tuple[int, int], tuple[Step, ...]] | None:
        if i == n and j == m:
            return (0, 0), ()
        found = None
        for step, i2, j2 in moves(i, j):
            rest = best(i2, j2)
            if rest is None:
                continue
            keep = isinstance(step, Keep)
            cost = (rest[0][0] + (not keep), rest[0][1] - keep)
            if found is None or cost < found[0]:
                found = cost, (step, *rest[1])
        return found

    found = best(0, 0)
    assert found is not None, (orig, new)  # equal element counts always decompose
    return found[1]


def _range_products(shape: tuple[int, ...]) -> list[list[int]]:
    """table[i][k] = prod(shape[i:k])."""
    return [[math.prod(shape[i:k]) for k in range(len(shape) + 1)] for i in range(len(shape) + 1)]


def _group(srcs: tuple[int, ...], dsts: tuple[int, ...]) -> Group:
    if len(srcs) == 1 and len(dsts) == 1:
        return Keep(srcs[0], dsts[0])
    if len(dsts) == 1:
        return Merge(srcs, dsts[0])
    if len(srcs) == 1:
        return Split(srcs[0], dsts)
    return MergeSplit(srcs, dsts)


def _contiguous_strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    out, stride = [], 1
    for size in reversed(shape):
        out.append(stride)
        stride *= max(size, 1)
    return tuple(reversed(out))


# --------------------------------------------------------------------------------------------
# printing and keys


_NAMES = {Squeeze: "squeeze", Keep: "keep", Merge: "merge", Split: "split",
          MergeSplit: "merge-split", Broadcast: "broadcast"}  # fmt: skip


def _step_key(step: Step) -> tuple:
    name = _NAMES[type(step)]
    if isinstance(step, (Squeeze, Broadcast)):
        return name, step.dim
    return (name, *group_dims(step))


def _describe(step: Step) -> str:
    name = _NAMES[type(step)]
    if isinstance(step, (Squeeze, Broadcast)):
        return f"{name} {step.dim}"
    srcs, dsts = group_dims(step)
    return f"{name} {_dims(srcs)}->{_dims(dsts)}"


def _dims(dims: tuple[int, ...]) -> str:
    return str(dims[0]) if len(dims) == 1 else "(" + ",".join(map(str, dims)) + ")"


__all__ = ["Broadcast", "Group", "Keep", "Merge", "MergeSplit", "Split", "Squeeze", "Step",
           "ViewAnalysis", "analyze_view", "apply_view_strides", "group_dims",
           "infer_new_shape"]  # fmt: skip


def reshape_shape(where: str, rank: int, old: Sequence[int], new: Sequence[int]) -> tuple[int, ...]:
    """A reshape's run-time shape (a -1 resolved); errors name the reshape (`where`) and
    both shapes."""
    if len(new) != rank:
        # only a vector input can change length; the definition fixed the result's rank
        raise ValueError(f"{where}: cannot reshape {list(old)} to {list(new)}: the size "
                         f"vector has {len(new)} entries, the result's rank is {rank}")  # fmt: skip
    return infer_new_shape(old, new, where)
