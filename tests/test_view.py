"""Reshape analysis (fusion_cache/view.py): step lists, -1 inference, errors, and properties
over random shapes, with torch.Tensor.view as the oracle for apply_view_strides."""

from __future__ import annotations

import itertools
import math
import random

import pytest
import torch

from fusion_cache.ir.view import (
    Broadcast,
    Keep,
    Merge,
    MergeSplit,
    Split,
    Squeeze,
    analyze_view,
    apply_view_strides,
    group_dims,
    infer_new_shape,
)

CASES = [
    ([2, 3, 4], [2, 3, 4], [Keep(0, 0), Keep(1, 1), Keep(2, 2)]),
    ([2, 3, 4], [6, 4], [Merge((0, 1), 0), Keep(2, 1)]),
    ([2, 3, 4], [24], [Merge((0, 1, 2), 0)]),
    ([6, 4], [2, 3, 4], [Split(0, (0, 1)), Keep(1, 2)]),
    ([6, 4], [4, 6], [MergeSplit((0, 1), (0, 1))]),
    ([2, 6], [3, 4], [MergeSplit((0, 1), (0, 1))]),
    ([5, 6, 4, 7], [5, 2, 12, 7], [Keep(0, 0), MergeSplit((1, 2), (1, 2)), Keep(3, 3)]),
    ([2, 3, 4, 5], [6, 2, 2, 5], [Merge((0, 1), 0), Split(2, (1, 2)), Keep(3, 3)]),
    # size-1 dims: squeeze, broadcast, keep, or absorb, whichever takes fewest steps
    ([2, 1, 3], [2, 3], [Squeeze(1), Keep(0, 0), Keep(2, 1)]),
    ([2, 3], [2, 1, 3], [Keep(0, 0), Keep(1, 2), Broadcast(1)]),
    ([4, 1], [4, 1], [Keep(0, 0), Keep(1, 1)]),
    ([1, 4], [4, 1], [MergeSplit((0, 1), (0, 1))]),
    ([2, 1, 3], [6], [Merge((0, 1, 2), 0)]),
    ([6], [2, 1, 3], [Split(0, (0, 1, 2))]),
    ([1, 2, 3, 1], [1, 6], [Keep(0, 0), Merge((1, 2, 3), 1)]),  # the 1 joins the merge
    ([1, 1], [1], [Squeeze(1), Keep(0, 0)]),
    ([1, 5, 1], [5], [Merge((0, 1, 2), 0)]),
    ([5], [1, 5, 1], [Split(0, (0, 1, 2))]),
    ([1, 5, 2], [5, 2, 1], [Squeeze(0), Keep(1, 0), Keep(2, 1), Broadcast(2)]),
    ([1, 5], [5, 1], [MergeSplit((0, 1), (0, 1))]),
    ([], [1, 1], [Broadcast(0), Broadcast(1)]),
    ([1], [], [Squeeze(0)]),
    ([], [], []),
    # finest groups even when one merge-split would be fewer steps (Note [View grouping])
    ([4, 6], [2, 2, 2, 3], [Split(0, (0, 1)), Split(1, (2, 3))]),
    # zero-size shapes: cut only where products match on both sides
    ([0, 3], [3, 0], [MergeSplit((0, 1), (0, 1))]),
    ([2, 0], [2, 0], [Keep(0, 0), Keep(1, 1)]),
    ([0, 3], [0, 5], [MergeSplit((0, 1), (0, 1))]),
    ([2, 0, 3], [2, 3, 0], [Keep(0, 0), MergeSplit((1, 2), (1, 2))]),
    ([0], [2, 0], [Split(0, (0, 1))]),
    ([1, 0], [0], [Squeeze(0), Keep(1, 0)]),
]


@pytest.mark.parametrize("original,new,steps", CASES, ids=lambda v: str(v).replace(" ", ""))
def test_steps(original, new, steps):
    analysis = analyze_view(original, new)
    assert analysis.steps == tuple(steps)
    assert analysis.original == tuple(original) and analysis.new == tuple(new)
    check_steps(analysis.original, analysis.new, analysis.steps)


def test_describe_transforms_and_constraint():
    analysis = analyze_view([1, 7, 2, 3, 4, 5], [7, 6, 2, 2, 5, 1])
    assert (
        analysis.describe()
        == "squeeze 0, keep 1->0, merge (2,3)->1, split 4->(2,3), keep 5->4, broadcast 5"
    )
    assert analysis.transforms() == 4
    assert analysis.constraint() == (
        ("squeeze", 0), ("keep", (1,), (0,)), ("merge", (2, 3), (1,)), ("split", (4,), (2, 3)),
        ("keep", (5,), (4,)), ("broadcast", 5),
    )  # fmt: skip
    hash(analysis.constraint())
    assert analyze_view([], []).describe() == "no dims"
    assert analyze_view([3], [3]).transforms() == 0


def test_constraint_is_size_free():
    assert (
        analyze_view([2, 3, 4], [6, 4]).constraint()
        == analyze_view([5, 7, 9], [35, 9]).constraint()
    )
    assert (
        analyze_view([6, 4], [2, 3, 4]).constraint() != analyze_view([2, 3, 4], [6, 4]).constraint()
    )
    # a size-1 dim changes the grouping, so the signature's "which extents are 1" matters
    assert analyze_view([2, 3], [6]).constraint() != analyze_view([1, 3], [3]).constraint()


def test_infer_minus_one():
    assert infer_new_shape([2, 3, 4], [-1, 4]) == (6, 4)
    assert infer_new_shape([2, 3, 4], [2, -1]) == (2, 12)
    assert infer_new_shape([2, 3, 4], [-1]) == (24,)
    assert infer_new_shape([0, 3], [-1, 3]) == (0, 3)
    assert infer_new_shape([], [-1]) == (1,)
    assert infer_new_shape(torch.Size([2, 3]), (3, 2)) == (3, 2)
    assert analyze_view([2, 3, 4], [-1, 4]).steps == (Merge((0, 1), 0), Keep(2, 1))


@pytest.mark.parametrize(
    "original,new,why",
    [
        ([2, 3], [4, 2], "6 elements, but the new shape holds 8"),
        ([2, 3], [-1, -1], "more than one -1"),
        ([2, 3], [-2, -3], "negative size -3"),
        ([2, -1], [2], "original shape has a negative size"),
        ([2, 3], [-1, 4], "6 elements do not divide into parts of 4"),
        ([0, 3], [-1, 0], "-1 is ambiguous"),
        ([2, 3], [-1, 0], "-1 is ambiguous"),
        ([0, 3], [3], "0 elements, but the new shape holds 3"),
    ],
)
def test_value_errors_name_both_shapes(original, new, why):
    with pytest.raises(ValueError) as info:
        analyze_view(original, new)
    message = str(info.value)
    assert message.startswith("reshape: ") and why in message
    assert str(list(original)) in message and str(list(new)) in message


@pytest.mark.parametrize(
    "original,new,bad",
    [([2, 3], [6.0], "6.0"), ([2, 3], [True, 6], "True"), ([2, "3"], [6], "'3'"),
     ([2, 3], [None], "None")],
)  # fmt: skip
def test_type_errors(original, new, bad):
    with pytest.raises(TypeError, match=f"reshape: .* has a non-int entry {bad}"):
        analyze_view(original, new)
    with pytest.raises(TypeError, match="must be a sequence of ints"):
        analyze_view(6, [6])


# --------------------------------------------------------------------------------------------
# properties over random shapes


def check_steps(original, new, steps):
    """Applies the steps to the original sizes and checks they give the new shape exactly."""
    kinds = [0 if isinstance(s, Squeeze) else 2 if isinstance(s, Broadcast) else 1 for s in steps]
    assert kinds == sorted(kinds), "squeezes, then groups, then broadcasts"
    squeezed = [s.dim for s in steps if isinstance(s, Squeeze)]
    broadcast = [s.dim for s in steps if isinstance(s, Broadcast)]
    assert all(original[d] == 1 for d in squeezed) and squeezed == sorted(squeezed)
    assert all(new[d] == 1 for d in broadcast) and broadcast == sorted(broadcast)
    left = [size for d, size in enumerate(original) if d not in squeezed]  # after squeezing
    built, used_src, used_dst = [], [], []
    for step in steps:
        if isinstance(step, (Squeeze, Broadcast)):
            continue
        srcs, dsts = group_dims(step)
        assert list(srcs) == list(range(srcs[0], srcs[-1] + 1)), "original dims are consecutive"
        assert list(dsts) == list(range(dsts[0], dsts[-1] + 1)), "new dims are consecutive"
        assert not used_src or srcs[0] > used_src[-1], "groups in order"
        assert not used_dst or dsts[0] > used_dst[-1], "groups in order"
        expected_type = {(1, 1): Keep, (2, 1): Merge, (1, 2): Split, (2, 2): MergeSplit}
        assert type(step) is expected_type[(min(len(srcs), 2), min(len(dsts), 2))]
        taken, left = left[: len(srcs)], left[len(srcs) :]
        if isinstance(step, (Keep, Merge)):
            built.append(math.prod(taken))  # the new size follows from the original ones
        else:
            assert math.prod(taken) == math.prod(new[d] for d in dsts)
            built.extend(new[d] for d in dsts)
        used_src += list(srcs)
        used_dst += list(dsts)
    assert not left and sorted(used_src + squeezed) == list(range(len(original)))
    for d in broadcast:
        built.insert(d, 1)
    assert tuple(built) == tuple(new)
    assert sorted(used_dst + broadcast) == list(range(len(new)))


def random_shapes(rng: random.Random) -> tuple[list[int], list[int]]:
    """A random factorization regrouped two ways, with 1s (and now and then a 0) inserted."""
    factors = [rng.choice([2, 2, 3, 4, 5, 6, 7]) for _ in range(rng.randint(0, 5))]
    if rng.random() < 0.08:
        factors.append(0)

    def regroup(fs: list[int]) -> list[int]:
        fs = fs[:]
        rng.shuffle(fs)
        cuts = sorted(rng.sample(range(1, len(fs)), rng.randint(0, max(len(fs) - 1, 0))))
        return [math.prod(fs[a:b]) for a, b in zip([0, *cuts], [*cuts, len(fs)])] if fs else []

    def ones(shape: list[int]) -> list[int]:
        for _ in range(rng.choice([0, 0, 1, 1, 2, 3])):
            shape.insert(rng.randint(0, len(shape)), 1)
        return shape

    return ones(regroup(factors)), ones(regroup(factors))


def atomic(original, new, i, i2, j, j2) -> bool:
    prod_o = lambda a, b: math.prod(original[a:b])
    prod_n = lambda a, b: math.prod(new[a:b])
    return not any(
        prod_o(i, a) == prod_n(j, b) and prod_o(a, i2) == prod_n(b, j2)
        for a in range(i + 1, i2)
        for b in range(j + 1, j2)
    )


def all_decompositions(original, new, i=0, j=0):
    """Every way to cover both shapes with squeezes, broadcasts and matching groups: yields
    (transforms, keeps, every group atomic)."""
    if i == len(original) and j == len(new):
        yield 0, 0, True
    if i < len(original) and original[i] == 1:
        for t, k, a in all_decompositions(original, new, i + 1, j):
            yield t + 1, k, a
    if j < len(new) and new[j] == 1:
        for t, k, a in all_decompositions(original, new, i, j + 1):
            yield t + 1, k, a
    for i2, j2 in itertools.product(range(i + 1, len(original) + 1), range(j + 1, len(new) + 1)):
        if math.prod(original[i:i2]) == math.prod(new[j:j2]):
            keep = i2 - i == 1 and j2 - j == 1
            is_atomic = atomic(original, new, i, i2, j, j2)
            for t, k, a in all_decompositions(original, new, i2, j2):
                yield t + (not keep), k + keep, a and is_atomic


def naive_transforms(original, new) -> int:
    """Squeeze every original 1, broadcast every new 1, group the rest by the product walk."""
    o, n = [s for s in original if s != 1], [s for s in new if s != 1]
    count = len(original) - len(o) + len(new) - len(n)
    if 0 in o:
        return count + (o != n)
    i = j = 0
    while i < len(o):
        i2, j2 = i + 1, j + 1
        while math.prod(o[i:i2]) != math.prod(n[j:j2]):
            if math.prod(o[i:i2]) < math.prod(n[j:j2]):
                i2 += 1
            else:
                j2 += 1
        count += not (i2 - i == 1 and j2 - j == 1)
        i, j = i2, j2
    return count


def test_random_shapes_property():
    rng = random.Random(1234)
    seen = set()
    for _ in range(500):
        original, new = random_shapes(rng)
        analysis = analyze_view(original, new)
        check_steps(analysis.original, analysis.new, analysis.steps)
        for step in analysis.groups():  # finest groups: none can be cut in two
            srcs, dsts = group_dims(step)
            assert atomic(original, new, srcs[0], srcs[-1] + 1, dsts[0], dsts[-1] + 1), step
        assert analysis.transforms() <= naive_transforms(original, new)
        if len(original) + len(new) <= 10:  # brute force over atomic decompositions
            best = min((t, -k) for t, k, a in all_decompositions(original, new) if a)
            keeps = sum(isinstance(s, Keep) for s in analysis.steps)
            assert (analysis.transforms(), -keeps) == best, (original, new, analysis.describe())
        if original and new and rng.random() < 0.3:  # -1 resolves to the same analysis
            hole = rng.randrange(len(new))
            if math.prod(new[:hole] + new[hole + 1 :]) != 0:
                assert analyze_view(original, new[:hole] + [-1] + new[hole + 1 :]) == analysis
        seen.update(type(s) for s in analysis.steps)
    assert seen == {Squeeze, Keep, Merge, Split, MergeSplit, Broadcast}


PRIMES = [2, 3, 5, 7, 11, 13, 17, 19, 23, 29, 31, 37]


def pattern_shapes(rng: random.Random, k: int) -> list[list[int]]:
    """Two (original, new) pairs with one factor-to-dim pattern: k factors cut into original
    dims in order and into new dims in a shuffled order, with 1s inserted, then filled with
    two sets of distinct primes (which rule out accidental product matches)."""
    order = rng.sample(range(k), k)
    layouts = []
    for factors in (list(range(k)), order):
        cuts = sorted(rng.sample(range(1, k), rng.randint(0, k - 1)))
        parts = [factors[a:b] for a, b in zip([0, *cuts], [*cuts, k])]
        for _ in range(rng.randint(0, 2)):
            parts.insert(rng.randint(0, len(parts)), [])  # a size-1 dim
        layouts.append(parts)
    pairs = []
    for values in (rng.sample(PRIMES, k), rng.sample(PRIMES, k)):
        pairs.append([[math.prod(values[f] for f in part) for part in parts] for parts in layouts])
    return pairs


def test_constraint_depends_only_on_the_pattern():
    rng = random.Random(99)
    for _ in range(300):
        (o1, n1), (o2, n2) = pattern_shapes(rng, rng.randint(1, 5))
        a, b = analyze_view(o1, n1), analyze_view(o2, n2)
        assert a.constraint() == b.constraint(), (a, b)


# --------------------------------------------------------------------------------------------
# apply_view_strides against torch.Tensor.view


def random_layout(rng: random.Random, shape: list[int]) -> torch.Tensor:
    """A tensor of `shape` that is contiguous, permuted, sliced and/or expanded."""
    dims = len(shape)
    base = list(shape)
    expanded = [d for d in range(dims) if shape[d] > 1 and rng.random() < 0.15]
    for d in expanded:
        base[d] = 1
    sliced = [d for d in range(dims) if rng.random() < 0.25]
    step = {d: rng.choice([1, 2, 3]) for d in sliced}
    start = {d: rng.randint(0, 2) for d in sliced}
    alloc = [start.get(d, 0) + step.get(d, 1) * base[d] + (d in sliced) for d in range(dims)]
    perm = list(range(dims))
    if rng.random() < 0.5:
        rng.shuffle(perm)
    t = torch.empty([alloc[p] for p in perm]).permute([perm.index(d) for d in range(dims)])
    t = t[tuple(slice(start.get(d, 0), None, step.get(d, 1)) for d in range(dims))]
    t = t[tuple(slice(0, base[d]) for d in range(dims))]
    return t.expand(shape) if expanded else t


def test_apply_view_strides_matches_torch():
    rng = random.Random(7)
    outcomes = {True: 0, False: 0}
    for _ in range(500):
        original, new = random_shapes(rng)
        analysis = analyze_view(original, new)
        for _ in range(4):
            t = random_layout(rng, original)
            assert list(t.shape) == original
            try:
                expected = t.view(new).stride()
            except RuntimeError:
                expected = None
            got = apply_view_strides(t.shape, t.stride(), analysis)
            assert got == expected, (original, new, t.stride(), analysis.describe())
            outcomes[expected is not None] += 1
    assert min(outcomes.values()) > 200, outcomes  # both outcomes well covered


def test_apply_view_strides_examples():
    a = analyze_view([4, 6], [2, 2, 2, 3])
    assert apply_view_strides([4, 6], [12, 1], a) == (24, 12, 3, 1)  # rows sliced: still a view
    assert apply_view_strides([4, 6], [1, 4], a) == (2, 1, 12, 4)  # transposed: splits still are
    assert apply_view_strides([4, 6], [1, 4], analyze_view([4, 6], [6, 4])) is None
    assert apply_view_strides([4, 6], [6, 1], analyze_view([4, 6], [24])) == (1,)
    assert apply_view_strides([4, 6], [12, 1], analyze_view([4, 6], [24])) is None
    with pytest.raises(ValueError, match="do not fit the analysis"):
        apply_view_strides([4, 5], [5, 1], a)
