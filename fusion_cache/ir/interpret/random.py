"""Rules of the random ops (uniform, normal, rand_like, randn_like): Philox 4x32-10 written
with torch integer ops, so the reference draws the numbers the kernels draw.

Note [Philox numbers]: element i (its row-major index in the op's output) of a random op
with seed s and offset o takes words of X = philox4x32_10(key = (s_lo, s_hi), counter =
(g_lo, g_hi, o_lo, o_hi)) for its group g:
  - float, half, bfloat16 (drawn in float): g = i >> 2, one word w = X[i & 3];
    uniform u = (w >> 8) * 2^-24 in [0, 1);
    normal: the pair (a, b) = X[0:2] for i & 3 in {0, 1}, X[2:4] otherwise; u1 = ((a >> 8) + 1)
    * 2^-24 in (0, 1], u2 = (b >> 8) * 2^-24, z = sqrt(-2 ln u1) * (cos, sin)(2 pi u2) for
    even, odd i (Box-Muller).
  - double: g = i >> 1, two words a, b = X[0:2] (even i) or X[2:4] (odd i); uniform u =
    (a * 2^21 + (b >> 11)) * 2^-53; normal: u1 from X[0:2] plus 2^-53, u2 from X[2:4], z as
    above (cos for even i, sin for odd).
  - uniform = lo + (hi - lo) * u, normal = mean + std * z, multiplied and added separately
    (no fused multiply-add) in float (double for Double), then rounded to the dtype.
So the numbers depend on (seed, offset, index) alone: not on the grid, the block, the vector
width or the GPU. Uniform numbers match the kernels' bit for bit; normal ones within a few
ulp (the kernels' logf/sqrtf/sincosf against torch's CPU functions). A 16-bit uniform can
round up to hi.
"""
from __future__ import annotations

import math

import torch

from fusion_cache.frontend.dtypes import DataType, to_torch
from fusion_cache.frontend.records import Record

from .core import Interpreter, rule

M32 = 0xFFFFFFFF
_MUL = (0xD2511F53, 0xCD9E8D57)
_WEYL = (0x9E3779B9, 0xBB67AE85)


def _mulhilo(m: int, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(high, low) 32 bits of m * x for 32-bit x in int64, without overflowing int64."""
    a = (x & 0xFFFF) * m
    b = (x >> 16) * m
    t = (a & M32) + ((b & 0xFFFF) << 16)
    return ((a >> 32) + (b >> 16) + (t >> 32)) & M32, t & M32


def philox4x32_10(seed: int, offset: int, group: torch.Tensor) -> list[torch.Tensor]:
    """The four 32-bit words (int64 tensors) for counters (group, offset) under key seed."""
    k0, k1 = seed & M32, (seed >> 32) & M32
    c0, c1 = group & M32, (group >> 32) & M32
    c2 = torch.full_like(group, offset & M32)
    c3 = torch.full_like(group, (offset >> 32) & M32)
    for _ in range(10):
        hi0, lo0 = _mulhilo(_MUL[0], c0)
        hi1, lo1 = _mulhilo(_MUL[1], c2)
        c0, c1, c2, c3 = hi1 ^ c1 ^ k0, lo1, hi0 ^ c3 ^ k1, lo0
        k0, k1 = (k0 + _WEYL[0]) & M32, (k1 + _WEYL[1]) & M32
    return [c0, c1, c2, c3]


def _unit_double(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return (a * 2**21 + (b >> 11)).to(torch.float64) * 2.0**-53


def _box_muller(u1: torch.Tensor, u2: torch.Tensor, odd: torch.Tensor) -> torch.Tensor:
    r = torch.sqrt(-2.0 * torch.log(u1))
    theta = u2 * torch.tensor(2 * math.pi, dtype=u2.dtype, device=u2.device)
    return torch.where(odd, r * torch.sin(theta), r * torch.cos(theta))


def philox_values(dist: str, numel: int, seed: int, offset: int, double: bool,
                  device: torch.device) -> torch.Tensor:  # fmt: skip
    """u (uniform) or z (normal) of elements 0..numel-1, float32 or float64 (Note [Philox
    numbers]). Philox runs once a group: 4 float elements or 2 double ones."""
    seed, offset = seed % 2**64, offset % 2**64
    per = 2 if double else 4
    groups = torch.arange(-(-numel // per), dtype=torch.int64, device=device)
    words = torch.stack(philox4x32_10(seed, offset, groups), 1)  # [groups, 4]
    odd = (torch.arange(numel, device=device) & 1) == 1
    if not double:
        if dist == "uniform":
            return (words.reshape(-1)[:numel] >> 8).to(torch.float32) * 2.0**-24
        pairs = words.reshape(-1, 2).repeat_interleave(2, 0)[:numel]  # (a, b) per element
        u1 = ((pairs[:, 0] >> 8) + 1).to(torch.float32) * 2.0**-24
        u2 = (pairs[:, 1] >> 8).to(torch.float32) * 2.0**-24
        return _box_muller(u1, u2, odd)
    if dist == "uniform":
        pairs = words.reshape(-1, 2)[:numel]
        return _unit_double(pairs[:, 0], pairs[:, 1])
    u1 = (_unit_double(words[:, 0], words[:, 1]) + 2.0**-53).repeat_interleave(2)[:numel]
    u2 = _unit_double(words[:, 2], words[:, 3]).repeat_interleave(2)[:numel]
    return _box_muller(u1, u2, odd)


def generator_state(device: torch.device, increment: int = 4) -> tuple[int, int]:
    """(seed, offset) for random ops without an explicit seed, moving torch's generator on
    by `increment`: on CUDA the Philox generator's seed and offset (Note [Random seeds] in
    fusion_cache/ir/random_seeds.py); on the CPU, whose generator is not counter-based, a
    fresh seed drawn from it and offset 0."""
    if device.type == "cuda":
        gen = torch.cuda.default_generators[device.index if device.index is not None
                                            else torch.cuda.current_device()]  # fmt: skip
        offset = gen.get_offset()
        gen.set_offset(offset + increment)
        return gen.initial_seed(), offset
    return int(torch.randint(0, 2**63 - 1, (), dtype=torch.int64)), 0


def _draw(run: Interpreter, r: Record, dist: str, a, b, shape: list[int], dtype: DataType):
    seed_ref, offset_ref = r.kw("rng_seed"), r.kw("rng_offset")
    if seed_ref is None:
        seed, offset = generator_state(run.device)
    else:
        seed, offset = int(run.get(seed_ref)), int(run.get(offset_ref))
    double = dtype is DataType.Double
    numel = math.prod(shape)
    device = run.device if run.device.type != "meta" else torch.device("meta")
    if device.type == "meta":
        return torch.empty(shape, dtype=to_torch(dtype), device="meta")
    v = philox_values(dist, numel, seed, offset, double, device)
    ct = torch.float64 if double else torch.float32
    lo, span = torch.tensor(a, dtype=ct, device=device), torch.tensor(b, dtype=ct, device=device)
    if dist == "uniform":
        span = span - lo  # hi - lo in the compute type, as the kernels compute it
    return (lo + span * v).reshape(shape).to(to_torch(dtype))


@rule("uniform", "normal")
def _uniform_normal(run: Interpreter, r: Record) -> list:
    a, b = run.get(r.args[0]), run.get(r.args[1])
    return [_draw(run, r, r.name, a, b, run.sizes(r.args[2]), r.kw("dtype"))]


@rule("rand_like", "randn_like")
def _like(run: Interpreter, r: Record) -> list:
    x = run.get(r.args[0])
    dist = "uniform" if r.name == "rand_like" else "normal"
    dtype = run.infos[r.outputs[0].index].dtype
    return [_draw(run, r, dist, 0.0, 1.0, list(x.shape), dtype)]
