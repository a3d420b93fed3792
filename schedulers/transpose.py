"""The transpose scheduler: pointwise fusions whose inputs and outputs disagree on their
innermost dim (a permuted input, a transposed tensor passed in, an output asked for in
another stride order), run as tiles staged through shared memory (Note [Transpose tiles] in
codegen/transpose_cuda.py) instead of the pointwise kernel's strided reads.

It takes a fusion when the definition says its layouts may disagree (a permute reaching an
input, an input declared in another stride order or with strides it leaves open); the plan
then looks at the real strides, and where tiles do not apply or do not pay, plans the same
program as the pointwise scheduler does and says why in the plan's description.
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from codegen.cuda_ops import COMPLEX, ELEMENT_BYTES
from codegen.kernel_ir import Access, PointwiseProgram
from fusion_cache.frontend.values import TensorInfo
from fusion_cache.ir.output_layout import output_stride_orders, strides_for

from .base import ArgRef, KernelLaunch, LaunchSpec, OutputSpec, SchedulerRefused
from .layout import access_strides, collapse, index_type, row_major
from .pointwise import lower_pointwise, plan_pointwise
from .tuning import knob
from .views import describe_views, resolve_access

NAME = "transpose"
THREADS = 256


def lower_transpose(fd: Any) -> PointwiseProgram:
    """The pointwise program of a fusion whose layouts may disagree, or SchedulerRefused."""
    signals = _layout_signals(fd)
    if not signals:
        raise SchedulerRefused("no permute, no input in another stride order or with open "
                               "strides, no output stride order")  # fmt: skip
    try:
        program = lower_pointwise(fd)
    except SchedulerRefused as why:
        raise SchedulerRefused(f"not a pointwise fusion ({why})") from None
    if signals == {"permute"} and not any(_permuted(a) for a in program.accesses):
        raise SchedulerRefused("its permutes cancel out: every input keeps the loop's dim order")
    return program


def _layout_signals(fd: Any) -> set[str]:
    """What in the definition may make inputs and outputs disagree on their innermost dim."""
    found = set()
    for r in fd._records:
        if r.kind == "op" and r.name == "permute":
            found.add("permute")
    for ref in fd.input_refs():
        info = fd._infos[ref.index]
        if not isinstance(info, TensorInfo) or info.ndim < 2:
            continue
        order = info.stride_order
        if order and tuple(order) != tuple(range(info.ndim - 1, -1, -1)):
            found.add("input stride order")
        if info.contiguity is not None and False in info.contiguity:
            found.add("open strides")
    if any(output_stride_orders(fd)):
        found.add("output stride order")
    return found


def _permuted(access: Access) -> bool:
    maps = [access.dim_map] + [f.out_map for f in access.frames]
    for m in maps:
        dims = [d for d in m if d is not None]
        if dims != sorted(dims):
            return True
    return False


@dataclass(frozen=True)
class Tiling:
    """A transpose plan before it is rendered: the variant and the kernel's arguments."""

    variant: Any  # TransposeVariant
    args: tuple
    tiles: int
    blocks: int
    smem: int
    outputs: tuple[OutputSpec, ...]
    wave: int  # the resident blocks the grid was sized for; 0: fewer tiles than that


def plan_transpose(program: PointwiseProgram, values: Sequence[Any], env: dict,
                   profile: Any) -> LaunchSpec:  # fmt: skip
    """Tiles where the real strides disagree and tiles pay; else the pointwise plan."""
    from codegen.transpose_cuda import KERNEL_NAME, arg_types, render_transpose

    tiling = plan_tiles(program, values, env, profile)
    notes = describe_views(program.views, env)
    if isinstance(tiling, str):
        spec = plan_pointwise(program, values, env, profile)
        return replace(spec, description=f"{spec.description}; not tiled: {tiling}")
    v = tiling.variant
    kernel = KernelLaunch(KERNEL_NAME, render_transpose(program, v), (tiling.blocks, 1, 1),
                          (v.threads, 1, 1), arg_types(program, v), tiling.args,
                          tiling.smem)  # fmt: skip
    return LaunchSpec(NAME, tiling.outputs, (), (kernel,),
                      f"{v.describe()} tiles={tiling.tiles}{notes}", tiling.wave)  # fmt: skip


def output_strides(store: Any, shape: Sequence[int]) -> list[int]:
    """The strides a fresh output is allocated with: row-major over the loop, or in its
    stride order (Note [Output layouts]); size-1 dims read none."""
    if not store.stride_order:
        return row_major(shape)
    return [0 if n == 1 else x for n, x in zip(shape, strides_for(shape, store.stride_order))]


def plan_tiles(program: PointwiseProgram, values: Sequence[Any], env: dict,
               profile: Any) -> Tiling | str:  # fmt: skip
    """The tiling for these inputs, or why the fusion is better run untiled."""
    from codegen.transpose_cuda import SmemTile, TransposeVariant, numbers_elements

    shapes = {tuple(env[s]) for s in program.output_states}
    if len(shapes) != 1:
        return f"outputs have different shapes {sorted(shapes)}"
    (out_shape,) = shapes
    if program.has_alias:
        return "an output is written in place"
    if any(a.virtual for a in program.accesses):
        return "index accesses (Note [Index accesses]) stay in the pointwise kernel"
    if program.resized:  # slices, pads, cats and gathers are read by the pointwise kernel
        return "resize and index reads (Note [Resize frames]) stay in the pointwise kernel"
    odd = sorted({repr(d) for d in [*(a.dtype for a in program.accesses),
                                    *(s.dtype for s in program.stores)]
                  if d in COMPLEX or ELEMENT_BYTES[d] not in (2, 4, 8)})  # fmt: skip
    if odd:
        return f"tiles hold 16-, 32- and 64-bit real values, not {', '.join(odd)}"
    if math.prod(out_shape) == 0:
        return "no elements"
    rank = len(out_shape)
    seen = [resolve_access(values[a.input_pos], a, env) for a in program.accesses]
    strides = [access_strides(t, m, rank) for t, m in seen]
    strides += [output_strides(st, out_shape) for st in program.stores]
    ptrs = [values[a.input_pos].data_ptr() for a in program.accesses] + [0] * len(program.stores)
    dtypes = [a.dtype for a in program.accesses] + [s.dtype for s in program.stores]
    sizes, strides = collapse(list(out_shape), strides)
    n_acc = len(program.accesses)
    if len(sizes) < 2:
        return "the loop collapses to one dim"
    unit = [max((d for d, x in enumerate(s) if x == 1), default=None) for s in strides]
    numel = math.prod(sizes)

    def weight(k: int) -> int:
        count = values[program.accesses[k].input_pos].numel() if k < n_acc else numel
        return count * ELEMENT_BYTES[dtypes[k]]

    def heaviest(ks: Sequence[int]) -> int | None:
        by_dim: dict[int, int] = {}
        for k in ks:
            if unit[k] is not None:
                by_dim[unit[k]] = by_dim.get(unit[k], 0) + weight(k)
        return max(by_dim, key=lambda d: (by_dim[d], d)) if by_dim else None

    stores = range(n_acc, len(strides))
    dim_a = heaviest(stores)
    if dim_a is None:
        return "no output is contiguous along any dim"
    across = [k for k in range(len(strides)) if unit[k] not in (None, dim_a)
              and (k >= n_acc or strides[k][dim_a] != 0)]  # fmt: skip
    dim_b = heaviest(across)
    if dim_b is None:
        if any(unit[k] not in (None, dim_a) for k in range(n_acc)):
            return (f"inputs contiguous along another dim than dim {dim_a} are broadcast along "
                    "it (read once a column)")  # fmt: skip
        return f"every input and output is contiguous along dim {dim_a}"
    n_a, n_b = sizes[dim_a], sizes[dim_b]
    smallest = knob("transpose.min_side", 16)
    if min(n_a, n_b) < smallest:
        return f"tiles of {n_a} x {n_b} elements would be mostly empty"
    modes = []
    for k, s in enumerate(strides):
        if unit[k] == dim_b and k in across:
            modes.append("tile")
        elif s[dim_a] == 1:
            modes.append("vec")
        else:
            modes.append("elem")
    moving = [ELEMENT_BYTES[dtypes[k]] for k in range(len(strides)) if modes[k] != "elem"]
    vec = min(8, 16 // max(moving), knob("transpose.vec", 8))
    while vec > 1 and (n_a % vec or n_b % vec):
        vec //= 2
    for k, s in enumerate(strides):
        along = {"tile": dim_b, "vec": dim_a}.get(modes[k])
        if along is None:
            continue
        if ptrs[k] % (vec * ELEMENT_BYTES[dtypes[k]]) or any(
                x % vec for d, x in enumerate(s) if d != along):  # fmt: skip
            vec = 1
    tiled = [ELEMENT_BYTES[dtypes[k]] for k in range(len(strides)) if modes[k] == "tile"]
    # 16 x 16 blocks of V x V (one a thread of 256), rows of at least 128 bytes and as many
    # rows as one wavefront of blocks needs (SmemTile.unfit)
    tile_a = knob("transpose.tile_a", max(16 * vec, 32, *(vec * SmemTile(vec, z, 0, 0).lanes
                                                         for z in tiled)))
    tile_b = knob("transpose.tile_b", max(16 * vec, 32, *(128 // z for z in tiled)))
    # a dim shorter than the tile: the smallest tile over it whose swizzle still holds
    while tile_a // 2 >= n_a and all(
            SmemTile(vec, z, tile_a // 2, tile_b).unfit() is None for z in tiled):  # fmt: skip
        tile_a //= 2
    while tile_b // 2 >= n_b and all(
            SmemTile(vec, z, tile_a, tile_b // 2).unfit() is None for z in tiled):  # fmt: skip
        tile_b //= 2
    for z in tiled:
        why = SmemTile(vec, z, tile_a, tile_b).unfit()
        if why:
            return f"tile {tile_a} x {tile_b} of {z}-byte values: {why}"
    threads = knob("transpose.threads", THREADS)
    staged_bytes = sum(SmemTile(vec, ELEMENT_BYTES[dtypes[k]], tile_a, tile_b).nbytes
                       for k in range(n_acc) if modes[k] == "tile")  # fmt: skip
    out_bytes = sum(SmemTile(vec, ELEMENT_BYTES[dtypes[k]], tile_a, tile_b).nbytes
                    for k in stores if modes[k] == "tile")  # fmt: skip
    # cp.async moves 4, 8 or 16 bytes (sm_80 on); narrower chunks go through registers
    can_async = profile.arch >= 80 and all(vec * z >= 4 for z in tiled)
    stages = knob("transpose.stages", 2) if can_async and staged_bytes else 0
    room = profile.smem_per_block_optin
    while stages > 1 and stages * staged_bytes + out_bytes > room:
        stages -= 1
    smem = max(stages, 1) * staged_bytes + out_bytes
    if smem > room:
        return f"tiles need {smem} bytes of shared memory, a block has {room}"
    tiles_a, tiles_b = -(-n_a // tile_a), -(-n_b // tile_b)
    tiles = numel // (n_a * n_b) * tiles_a * tiles_b
    # a block a tile or one resident wave of blocks looping over tiles (Note [Transpose
    # tiles]); the kernel asks for as many blocks an SM as its registers allow. A thread
    # keeps, for each block it computes (the loop is unrolled), V x V values of each input
    # read along A or B and of each output through a tile and V of each other output; copies
    # through registers hold a value and an address each; and about 24 more. Measured by ptxas:
    # 61 registers for the f32 add of a transposed input, 120 for bf16 (capped at 80 for
    # three blocks an SM it spilled), 16-bit values one at a time spilled at 64 in 64 x 64 tiles
    blocks_each = -(-(tile_a // vec) * (tile_b // vec) // threads)
    held = sum(-(-blocks_each * (vec if k >= n_acc and modes[k] == "vec" else vec * vec)
                 * ELEMENT_BYTES[dtypes[k]] // 4) for k in range(len(strides)) if modes[k] != "elem")
    if not stages:
        held += 3 * -(-tile_a * (tile_b // vec) // threads) * sum(
            1 for k in range(n_acc) if modes[k] == "tile")
    # outputs stored a value at a time: an address a block each (three outputs of 16-bit
    # values one at a time spilled 20 bytes at 64 registers)
    held += 2 * blocks_each * sum(1 for k in stores if modes[k] == "elem")
    if numbers_elements(program):  # a Philox cache each and the rounds' temporaries
        held += 32  # (64 registers spilled 12 bytes for one uniform)
    regs = -(-(24 + held) // 8) * 8
    per_sm = min(profile.max_threads_per_sm // threads, profile.max_blocks_per_sm,
                 profile.smem_per_sm // (smem + profile.smem_reserved_per_block),
                 profile.regs_per_sm // (threads * max(64, regs)))  # fmt: skip
    per_sm = max(1, min(per_sm, knob("transpose.blocks_per_sm", per_sm)))
    wave = profile.measured_wave or profile.sm_count * per_sm
    blocks = max(1, min(tiles, wave))
    # a block a tile, which the GPU hands out as blocks finish, rather than one resident
    # wave looping over tiles with the next ones' copies in flight: a block that finishes
    # early takes the next tile at once instead of idling to the wave's last round, and the
    # wave's loop ends on a ragged last round anyway. f32 on the H100: 8192 x 8192 add of a
    # transposed input 2845 -> 2931 GB/s, [64, 1024, 1024] 2794 -> 2921, NCHW -> NHWC [64,
    # 256, 56, 56] 2767 -> 2897 (benchmarks/sweeps/layouts2_r2.json, 2026-11-26; -1, the
    # wave's tiles shared out evenly: 2835, 2778, 2757); bf16, the same three: +2.5 to 3.6%,
    # 2858, 2817, 2738 beside torch.compile's 2887, 2832, 2738 (H100, 2026-11-26; rerun in
    # benchmarks/sweeps/layouts3.json)
    each = knob("transpose.tiles_each", 1)
    if each == -1:
        blocks = -(-tiles // -(-tiles // blocks))
    elif each > 0:
        blocks = max(1, -(-tiles // each))
    variant = TransposeVariant(
        len(sizes), dim_a, dim_b, vec, tile_a, tile_b, threads, stages,
        index_type(sizes, strides), tuple(modes[:n_acc]), tuple(modes[n_acc:]),
        tuple(tuple(x != 0 for x in s) for s in strides),
        knob("load.hint", 0), knob("store.hint", 0), per_sm,
    )  # fmt: skip
    args: list = []
    for k, s in enumerate(strides):
        args.append(ArgRef("input", program.accesses[k].input_pos) if k < n_acc
                    else ArgRef("output", k - n_acc))  # fmt: skip
        args.extend(s)
    args += [*sizes, tiles]
    if numbers_elements(program):  # the loop's row-major strides: each element's number
        args += row_major(sizes)
    args += [ArgRef("scalar", pos) for pos, _ in program.scalar_inputs]
    args += [env[state] for state, _ in program.host_scalars]
    outputs = tuple(OutputSpec(out_shape, st.dtype, None, tuple(strides_for(out_shape, st.stride_order))
                               if st.stride_order else None) for st in program.stores)  # fmt: skip
    # the runtime asks the driver for the real wave and plans again (Note [One wave of
    # partials] in reduction.py): fewer tiles than a wave have nothing to fit
    return Tiling(variant, tuple(args), tiles, blocks, smem, outputs,
                  wave if tiles > wave and each <= 0 else 0)
