"""The fusion trie seen from the frontend: ids, hits and misses, errors, threads."""
from __future__ import annotations

import threading
from collections.abc import Callable

import pytest
import torch

from fusion_cache import DataType, FusionCache, FusionDefinition


def define(build: Callable[[FusionDefinition], None]) -> FusionDefinition:
    with FusionDefinition() as fd:
        build(fd)
    return fd


def fid(build) -> int:
    return define(build).id()


def scaled(shape=(-1, -1), contiguity=(True, True), dtype=DataType.Float, const=2.0,
           stride_order=None):
    def build(fd):
        kw = {} if stride_order is None else {"stride_order": list(stride_order)}
        t0 = fd.define_tensor(shape=list(shape), contiguity=list(contiguity), dtype=dtype, **kw)
        fd.add_output(fd.ops.mul(t0, fd.define_scalar(const)))
    return build


def rand(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def stats() -> dict:
    s = FusionCache.get().stats()
    assert isinstance(s, dict)
    for key in ("num_fusions", "trie_hits", "trie_misses"):
        assert key in s, f"stats() lacks {key!r}: {s}"
    return s


def test_same_definition_same_id():
    a = fid(scaled())
    b = fid(scaled())
    assert a == b
    assert FusionCache.get().num_fusions() == 1


def test_ids_are_distinct_ints():
    ids = [fid(scaled(const=c)) for c in (1.0, 2.0, 3.0)]
    assert all(isinstance(i, int) for i in ids)
    assert len(set(ids)) == 3
    assert FusionCache.get().num_fusions() == 3


def test_early_and_last_spellings_share_an_id():
    def early(fd):
        t0 = fd.define_tensor(symbolic_sizes=[-1, 1, -1], contiguous=[True, True, True],
                              dtype=DataType.Float)
        fd.add_output(fd.ops.relu(t0))

    def last(fd):
        t0 = fd.define_tensor(shape=[-1, 1, -1], contiguity=[True, None, True],
                              dtype=DataType.Float)
        fd.add_output(fd.ops.relu(t0))

    assert fid(early) == fid(last)
    assert FusionCache.get().num_fusions() == 1


def test_rank_only_equals_all_false_contiguity():
    def rank_only(fd):
        fd.add_output(fd.ops.neg(fd.define_tensor(2)))

    def spelled(fd):
        t0 = fd.define_tensor(shape=[-1, -1], contiguity=[False, False], dtype=DataType.Float)
        fd.add_output(fd.ops.neg(t0))

    assert fid(rank_only) == fid(spelled)


def test_contiguity_true_equals_list_of_true():
    def scalar_true(fd):
        t0 = fd.define_tensor(shape=[-1, -1], contiguity=True, dtype=DataType.Float)
        fd.add_output(fd.ops.neg(t0))

    def list_true(fd):
        t0 = fd.define_tensor(shape=[-1, -1], contiguity=[True, True], dtype=DataType.Float)
        fd.add_output(fd.ops.neg(t0))

    assert fid(scalar_true) == fid(list_true)


def test_from_pytorch_equals_explicit_define_tensor():
    x = rand(3, 4)

    def from_pt(fd):
        fd.add_output(fd.ops.neg(fd.from_pytorch(x)))

    def explicit(fd):
        t0 = fd.define_tensor(shape=[-1, -1], contiguity=[True, True], dtype=DataType.Float)
        fd.add_output(fd.ops.neg(t0))

    assert fid(from_pt) == fid(explicit)


def test_define_constant_and_define_scalar_value_agree():
    def with_scalar(fd):
        t0 = fd.define_tensor(2)
        fd.add_output(fd.ops.mul(t0, fd.define_scalar(3.0)))

    def with_constant(fd):
        t0 = fd.define_tensor(2)
        fd.add_output(fd.ops.mul(t0, fd.define_constant(3.0)))

    assert fid(with_scalar) == fid(with_constant)


@pytest.mark.parametrize("variant", [
    {"const": 2.5},
    {"const": 2},
    {"dtype": DataType.Double},
    {"dtype": DataType.Half},
    {"contiguity": (False, True)},
    {"contiguity": (True, False)},
    {"stride_order": (0, 1)},
    {"shape": (4, -1)},
    {"shape": (-1, 1), "contiguity": (True, None)},
    {"shape": (-1, -1, -1), "contiguity": (True, True, True)},
], ids=str)
def test_each_difference_makes_a_new_id(variant):
    base = fid(scaled())
    other = fid(scaled(**variant))
    assert other != base, f"{variant} should not share the base fusion's id"
    assert FusionCache.get().num_fusions() == 2
    assert fid(scaled(**variant)) == other


def test_different_op_or_output_set_makes_new_id():
    def add(fd):
        t0, t1 = fd.define_tensor(2), fd.define_tensor(2)
        fd.add_output(fd.ops.add(t0, t1))

    def sub(fd):
        t0, t1 = fd.define_tensor(2), fd.define_tensor(2)
        fd.add_output(fd.ops.sub(t0, t1))

    def swapped(fd):
        t0, t1 = fd.define_tensor(2), fd.define_tensor(2)
        fd.add_output(fd.ops.add(t1, t0))

    def two_outputs(fd):
        t0, t1 = fd.define_tensor(2), fd.define_tensor(2)
        fd.add_output(fd.ops.add(t0, t1))
        fd.add_output(t0)

    ids = [fid(b) for b in (add, sub, swapped, two_outputs)]
    assert len(set(ids)) == 4, ids


def test_stats_counters():
    cache = FusionCache.get()
    s0 = stats()
    assert s0["num_fusions"] == 0 == cache.num_fusions()

    fid(scaled())
    s1 = stats()
    assert s1["num_fusions"] == 1 == cache.num_fusions()
    assert s1["trie_misses"] > s0["trie_misses"]

    fid(scaled())
    s2 = stats()
    assert s2["num_fusions"] == 1
    assert s2["trie_hits"] > s1["trie_hits"], (s1, s2)
    assert s2["trie_misses"] == s1["trie_misses"], (s1, s2)

    fid(scaled(const=7.0))
    s3 = stats()
    assert s3["num_fusions"] == 2 == cache.num_fusions()
    assert s3["trie_misses"] > s2["trie_misses"]


def test_reset_empties_the_cache():
    fid(scaled())
    assert FusionCache.get().num_fusions() == 1
    FusionCache.reset()
    assert FusionCache.get().num_fusions() == 0
    assert stats()["num_fusions"] == 0


def test_cache_print_and_repr():
    fid(scaled())
    text = repr(FusionCache.get())
    assert isinstance(text, str) and text


def test_fusion_definition_by_id_reexecutes():
    x = rand(3, 5, seed=1)
    fd = define(scaled(const=1.5))
    (r1,) = fd.execute([x])
    torch.testing.assert_close(r1, x * 1.5)
    again = FusionDefinition(fd.id())
    assert again.id() == fd.id()
    y = rand(4, 2, seed=2)
    (r2,) = again.execute([y])
    torch.testing.assert_close(r2, y * 1.5)


def test_failing_definition_raises_each_time_and_cache_survives():
    def bad(fd):
        t0 = fd.define_tensor(shape=[-1, -1], contiguity=[True, True], dtype=DataType.Float)
        fd.add_output(fd.ops.sum(t0, [5]))

    good_before = fid(scaled())
    with pytest.raises(Exception) as first:
        define(bad)
    with pytest.raises(type(first.value)):
        define(bad)
    assert isinstance(first.value, (ValueError, TypeError, IndexError)), repr(first.value)

    assert fid(scaled()) == good_before
    x = rand(2, 3, seed=3)
    fd = define(scaled(const=4.0))
    assert fd.id() != good_before
    (r,) = fd.execute([x])
    torch.testing.assert_close(r, x * 4.0)


def _builders():
    """Six distinct fusions; threads define overlapping subsets of them."""
    def make(k):
        def build(fd):
            t0 = fd.define_tensor(shape=[-1, -1], contiguity=[True, True], dtype=DataType.Float)
            t1 = fd.ops.mul(t0, fd.define_scalar(float(k)))
            if k % 2:
                t1 = fd.ops.sum(t1, [1])
            fd.add_output(t1)
        return build
    return [make(k) for k in range(6)]


def test_threads_get_consistent_ids():
    builders = _builders()
    n_threads = 8
    results: list[dict[int, int]] = [{} for _ in range(n_threads)]
    errors: list[BaseException] = []
    barrier = threading.Barrier(n_threads)

    def worker(i):
        try:
            barrier.wait()
            order = [(i + j) % 6 for j in range(4)] * 3  # overlapping sets, repeated
            x = rand(3, 4, seed=i)
            for k in order:
                fd = define(builders[k])
                got = results[i].setdefault(k, fd.id())
                assert got == fd.id()
                (r,) = fd.execute([x])
                exp = x * float(k)
                torch.testing.assert_close(r, exp.sum(1) if k % 2 else exp)
        except BaseException as e:  # noqa: BLE001 - reported in the main thread
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(n_threads)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not errors, errors
    merged: dict[int, set[int]] = {}
    for res in results:
        for k, v in res.items():
            merged.setdefault(k, set()).add(v)
    assert set(merged) == set(range(6))
    assert all(len(v) == 1 for v in merged.values()), merged
    assert len({next(iter(v)) for v in merged.values()}) == 6
    assert FusionCache.get().num_fusions() == 6


@pytest.mark.parametrize("value", [float("nan"), float("inf"), -float("inf"), 1e-300, 0.1,
                                   2**40, True, 1 + 2j], ids=repr)
def test_special_constants_hit_the_cache(value):
    def build(fd):
        t0 = fd.define_tensor(2, DataType.Double)
        fd.add_output(fd.ops.add(t0, fd.define_scalar(value)))

    first = fid(build)
    hits = stats()["trie_hits"]
    assert fid(build) == first, f"constant {value!r} does not match itself in the trie"
    assert stats()["trie_hits"] > hits
    assert FusionCache.get().num_fusions() == 1


def test_nan_constant_values_execute():
    x = rand(2, 3, seed=4).double()

    def build(fd):
        t0 = fd.define_tensor(2, DataType.Double)
        fd.add_output(fd.ops.maximum(t0, fd.define_scalar(float("-inf"))))
        fd.add_output(fd.ops.add(t0, fd.define_scalar(float("nan"))))

    r = define(build).execute([x])
    torch.testing.assert_close(r[0], x)
    assert torch.isnan(r[1]).all()


def test_one_and_one_point_zero_differ_by_dtype():
    def as_int(fd):
        fd.add_output(fd.ops.mul(fd.define_tensor(2), fd.define_scalar(1)))

    def as_float(fd):
        fd.add_output(fd.ops.mul(fd.define_tensor(2), fd.define_scalar(1.0)))

    def as_bool(fd):
        fd.add_output(fd.ops.mul(fd.define_tensor(2), fd.define_scalar(True)))

    assert len({fid(as_int), fid(as_float), fid(as_bool)}) == 3


def test_subclass_and_with_block_share_an_id():
    def body(fd):
        t0 = fd.define_tensor(shape=[-1, -1], contiguity=[True, True], dtype=DataType.Float)
        fd.add_output(fd.ops.exp(t0))

    class Sub(FusionDefinition):
        def definition(self):
            body(self)

    sub = Sub()
    x = rand(2, 2, seed=6)
    (r,) = sub.execute([x])
    torch.testing.assert_close(r, torch.exp(x))
    assert sub.id() == fid(body)


def test_unknown_fusion_id_raises():
    fid(scaled())
    with pytest.raises((ValueError, KeyError, IndexError)):
        FusionDefinition(12345).execute([rand(2, 2)])


def test_max_length_is_enforced():
    with pytest.raises(ValueError, match=r"(?i)max_length|length|long"):
        with FusionDefinition(max_length=3) as fd:
            t = fd.define_tensor(2)
            for _ in range(5):
                t = fd.ops.neg(t)
            fd.add_output(t)


def test_fusion_by_id_in_a_new_process(fresh_store):
    """FusionDefinition(fid) works in a fresh process that shares the persistent store."""
    import os
    import subprocess
    import sys
    import textwrap

    script = textwrap.dedent("""
        import sys, torch
        from fusion_cache import FusionDefinition, DataType
        x = torch.arange(6, dtype=torch.float32).reshape(2, 3)
        if sys.argv[1] == "define":
            with FusionDefinition() as fd:
                t0 = fd.define_tensor(shape=[-1, -1], contiguity=[True, True],
                                      dtype=DataType.Float)
                fd.add_output(fd.ops.mul(fd.ops.add(t0, fd.define_scalar(1.0)), t0))
            fd.execute([x])
            print(fd.id())
        else:
            (r,) = FusionDefinition(int(sys.argv[2])).execute([x])
            assert torch.equal(r, (x + 1.0) * x), r
            print("ok")
    """)
    env = {**os.environ, "FUSION_CACHE_DIR": str(fresh_store)}
    first = subprocess.run([sys.executable, "-c", script, "define"], env=env,
                           capture_output=True, text=True, timeout=60)
    assert first.returncode == 0, first.stderr
    fusion_id = first.stdout.strip().splitlines()[-1]
    second = subprocess.run([sys.executable, "-c", script, "lookup", fusion_id], env=env,
                            capture_output=True, text=True, timeout=60)
    assert second.returncode == 0, second.stderr
    assert second.stdout.strip().endswith("ok")


def test_more_spellings_share_an_id():
    base = fid(scaled())
    assert fid(scaled(stride_order=(1, 0))) == base, "default stride order spelled out"

    def sizes_strides(fd):
        t0 = fd.define_tensor(sizes=[2, 3], strides=[3, 1], dtype=DataType.Float)
        fd.add_output(fd.ops.mul(t0, fd.define_scalar(2.0)))

    assert fid(sizes_strides) == base, "sizes/strides of a contiguous tensor"


def test_static_sizes_distinguish_each_other():
    ids = {fid(scaled(shape=s)) for s in [(4, -1), (5, -1), (-1, 4), (4, 4)]}
    assert len(ids) == 4


def test_failed_definition_is_not_a_fusion():
    fid(scaled())
    before = FusionCache.get().num_fusions()
    with pytest.raises(ValueError):
        with FusionDefinition() as fd:
            fd.add_output(fd.ops.sum(fd.define_tensor(2), [5]))
    assert FusionCache.get().num_fusions() == before
