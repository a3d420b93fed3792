"""Random ops without an explicit seed, given one: the definition the GPU path schedules.

Note [Random seeds]: a random op with rng_seed and rng_offset is a pure function of them
(Note [Philox numbers]). One without draws them from torch's generator at each execute,
once per run of the whole fusion: a segmented fusion's kernels, and a kernel recomputing a
value another already made, must see the same numbers. So, for scheduling only, the fusion
gains two Int scalar inputs in front of its own, the run's seed and offset, and its k-th
random op without a seed (rand_like and randn_like become uniform and normal of the same
shape) takes rng_seed=seed, rng_offset=offset + k. Each execute fills them from torch's CUDA
generator (runtime/rng.py), whose offset then moves on by 4 per 4 such ops (torch's own
kernels move it in multiples of 4): the next execute draws new numbers, and a run repeats
under torch.manual_seed. The user's definition, its id and its printed form are unchanged.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from fusion_cache.frontend.dtypes import DataType
from fusion_cache.frontend.records import Record, Ref

if TYPE_CHECKING:
    from fusion_cache.frontend.definition import FusionDefinition

RANDOM_OPS = frozenset({"uniform", "normal", "rand_like", "randn_like"})
SEED_INPUTS = 2  # the run's seed and offset, inputs 0 and 1 of the seeded definition


def unseeded_ops(fd: FusionDefinition) -> int:
    """How many random ops of `fd` draw from torch's generator."""
    return sum(1 for r in fd._records if r.kind == "op" and r.name in RANDOM_OPS
               and r.kw("rng_seed") is None)  # fmt: skip


def with_seed_inputs(fd: FusionDefinition) -> FusionDefinition:
    """A scratch definition whose unseeded random ops read the seed inputs 0 and 1 (Note
    [Random seeds]); `fd` itself when it has none."""
    if not unseeded_ops(fd):
        return fd
    from fusion_cache.frontend.replay import replay_records

    from .subfusion import ScratchDefinition

    seeded = ScratchDefinition()
    count = [0]

    def rewrite(new: Any, r: Record, args: list, kwargs: dict) -> Any:
        if r.kind != "op" or r.name not in RANDOM_OPS or r.kw("rng_seed") is not None:
            return None
        k = count[0]
        count[0] += 1
        offset = new.ops.add(base, k) if k else base
        if r.name in ("rand_like", "randn_like"):
            x = args[0]
            dist = new.ops.uniform if r.name == "rand_like" else new.ops.normal
            return dist(0.0, 1.0, new.ops.shape(x), rng_seed=seed, rng_offset=offset,
                        dtype=x.dtype)  # fmt: skip
        return getattr(new.ops, r.name)(*args, rng_seed=seed, rng_offset=offset,
                                        dtype=kwargs["dtype"])  # fmt: skip

    with seeded:
        seed = seeded.define_scalar(dtype=DataType.Int)
        base = seeded.define_scalar(dtype=DataType.Int)
        replay_records(seeded, fd._records, rewrite)
    seeded._fid = fd._fid
    return seeded


def seed_only_inputs(fd: FusionDefinition) -> frozenset[int]:
    """Positions of the scalar inputs read only as a random op's rng_seed or rng_offset:
    their values size nothing, so plans need not be keyed on them (a training step passes
    a new seed and offset every time)."""
    only_seed: dict[int, bool] = {}
    for r in fd._records:
        seeds = [v for k, v in r.kwargs if k in ("rng_seed", "rng_offset") and isinstance(v, Ref)
                 ] if r.kind == "op" and r.name in RANDOM_OPS else []  # fmt: skip
        others = list(r.refs())
        for ref in seeds:
            others.remove(ref)
            only_seed.setdefault(ref.index, True)
        for ref in others:
            only_seed[ref.index] = False
    return frozenset(pos for pos, ref in enumerate(fd.input_refs())
                     if ref.kind == "S" and only_seed.get(ref.index, False))  # fmt: skip
