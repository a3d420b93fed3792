"""Few long rows split over the whole GPU.

Note [Split rows]: a pure reduction of a few long contiguous rows (a sum or mean to a
scalar, a reduction keeping a few outputs) leaves most SMs idle in the row kernel, which
gives a row one block or a cluster of 8. Here every row is split into SPLIT slices, enough
blocks to give each SM BLOCKS_PER_SM; a block streams its slice with 16-byte loads, UNROLL
vectors in flight a thread, and writes one partial a reduction to a [SPLIT, rows]
workspace. The outer finish kernel (Note [Outer finish]) folds a row's partials in slice
order and computes the row's outputs, launched to start while the first kernel runs (Note
[Dependent launch]): the same finish as the outer sums' split, rows taking the place of
columns. The order of every combine is fixed by the plan, so results repeat bit for bit.
"""
from __future__ import annotations

from codegen.cuda_ops import ELEMENT_BYTES, RANDOM_STMTS
from codegen.kernel_ir import has_index_statements
from codegen.reduction.outer_kernel import outer_arg_types
from codegen.reduction.split_kernel import SPLIT_NAME, render_split
from codegen.reduction.variants import OuterVariant, SplitVariant
from fusion_cache.frontend.dtypes import DataType

from ..base import ArgRef, KernelLaunch, LaunchSpec
from ..layout import index_type
from ..tuning import knob
from ..views import describe_views
from .finish import outer_finish
from .lowering import NAME
from .problem import Problem

# rows of the row kernel's plan (clusters of 8 blocks for long rows) under which it fills
# fewer than two blocks an SM: split them instead
_FEW_ROWS_PER_SM = 2 / 8


def split_rows(p: Problem) -> LaunchSpec | None:
    """The split plan of a few long rows, or None where the row kernel keeps them."""
    program = p.program
    threads = knob("split.threads", 512)
    few = p.rows < knob("split.max_rows", int(p.sm * _FEW_ROWS_PER_SM) + 1)
    if not (p.pure and p.inner and few and not p.k2 and len(p.i_sizes) == 1
            and not p.accumulate and not p.finish and p.primary is not None):  # fmt: skip
        return None
    if any(st.op in RANDOM_STMTS for st in program.stmts):
        return None  # the row kernel numbers the elements (Note [Philox numbers])
    if has_index_statements(program):
        return None  # pads, cats and gathers are read by the row kernel alone
    welford = any(r.op == "welford" for r in program.reductions)
    if welford and p.N >= 2**31:
        return None  # the partials' counts are ints
    moving = [program.accesses[i].dtype for i in p.elem]
    vec = max(1, 16 // max(ELEMENT_BYTES[d] for d in moving))
    while vec > 1 and p.N % vec:
        vec //= 2
    modes = []
    for i, a in enumerate(program.accesses):
        aligned = p.ptrs[i] % (vec * ELEMENT_BYTES[a.dtype]) == 0 and p.i_strides[i][0] % vec == 0
        modes.append("row" if p.ks[i] == 0 else "vec" if p.ks[i] == 1 and aligned else "strided")
    # eight vectors in flight a thread, slices for four blocks an SM (two resident at 54
    # registers: two waves of half slices). sum f32 67108864: H100 2642 GB/s against 2607-2610
    # at 2 blocks and unroll 4 (sweep-shortrows1.json), 2575 against 2539 (sweep-layouts6);
    # H200 3589 against 3538, torch.compile 3611 (sweep-shortrows2.json). Either alone did
    # not gain (2 blocks, unroll 8: 2542; 4 blocks, unroll 4: 2527)
    unroll = knob("split.unroll", 8)
    steps = -(-p.N // (threads * vec))
    want = -(-p.sm * knob("split.blocks_per_sm", 4) // p.rows)
    split = min(want, steps // 4)  # at least four steps of the block's threads a slice
    if split < 2:
        return None
    itype = index_type(p.loop, p.strides)
    variant = SplitVariant(threads, vec, unroll, split, itype, tuple(modes),
                           knob("load.hint", 3))  # fmt: skip
    finish = OuterVariant(32, 1, 1, split, itype,
                          tuple("bcast" if s[0] == 0 else "strided" for s in p.i_strides),
                          tuple(x != 0 for x in p.ks[:p.n_acc]))  # fmt: skip
    args: list = []
    for k in range(len(p.tensors)):
        args.append(ArgRef("input", program.accesses[k].input_pos) if k < p.n_acc
                    else ArgRef("output", k - p.n_acc))  # fmt: skip
        args += [p.i_strides[k][0], p.ks[k]]
    args += [p.rows, p.N]
    workspaces: list = []
    for r in program.reductions:
        kinds = [r.dtype, r.dtype, DataType.Int32] if r.op == "welford" else [r.dtype]
        for dt in kinds:
            args.append(ArgRef("workspace", len(workspaces)))
            workspaces.append((split * p.rows, dt))
    args += p.scalars
    types = outer_arg_types(program, finish, True)
    kernels = (KernelLaunch(SPLIT_NAME, render_split(program, variant), (split, p.rows, 1),
                            (threads, 1, 1), types, tuple(args)),
               outer_finish(p, finish, types, tuple(args)))  # fmt: skip
    return LaunchSpec(NAME, tuple(p.outputs), tuple(workspaces), kernels,
                      variant.describe() + describe_views(program.views, p.env))
