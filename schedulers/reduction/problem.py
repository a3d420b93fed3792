"""What planning a reduction reads from one call's inputs: the loop, each tensor's strides
collapsed into reduced and kept runs, the rows, the outputs; and the refusals found on the
way. The row plan (row_plan.py) and the outer plan (outer_plan.py) both start here."""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from codegen.cuda_ops import ELEMENT_BYTES
from codegen.kernel_ir import ReductionProgram
from fusion_cache.ir.output_layout import strides_for

from ..base import ArgRef, OutputSpec, SchedulerRefused
from ..layout import access_strides, collapse, row_major
from ..resize import collapse_keeping, resize_layout
from ..views import resolve_access


@dataclass(frozen=True)
class Problem:
    """A reduction program at these inputs' shapes and strides. Tensors are the accesses,
    then the stores; `i_` sizes and strides are the kept (row) dims collapsed, `k_sizes`
    the reduced ones (two runs: Note [Two reduced dims]), `ks`/`k0s` each tensor's stride
    along the inner/outer reduced run."""

    program: ReductionProgram
    values: Sequence[Any]
    env: dict
    profile: Any
    accumulate: tuple[int, ...]  # Note [Column partials]
    finish: tuple[str, ...]  # Note [Finish in the row kernel]
    loop: tuple[int, ...]
    tensors: list[Any]
    outputs: list[OutputSpec]
    strides: list[list[int]]
    k_sizes: list[int]
    k2: bool
    N: int  # elements a row reduces
    ks: list[int]
    k0s: list[int]
    i_sizes: list[int]
    i_strides: list[list[int]]
    rows: int
    elem: list[int]  # accesses read along the reduced dims
    ptrs: list[int]  # data pointers (alignment), 0 for the stores
    primary: int | None  # the largest of `elem`
    pure: bool  # row-level outputs only, one stage
    inner: bool  # a row kernel, not an outer one
    scalars: list[Any]
    # Note [Resize frames], [Gather loads] (schedulers/resize.py): the frames resolved for
    # these sizes, and each loop dim's collapsed row dim (None: reduced or dropped)
    resize: Any = None
    row_dim_of: tuple = ()

    @property
    def n_acc(self) -> int:
        return len(self.program.accesses)

    @property
    def sm(self) -> int:
        return self.profile.sm_count


class _Shape:
    """Shape and strides of a tensor that does not exist yet (a fresh output), row-major or
    in a stride order (Note [Output layouts])."""

    def __init__(self, shape: Sequence[int], order: Sequence[int] = ()) -> None:
        self.shape = tuple(shape)
        self.dense = tuple(strides_for(shape, order)) if order else None
        self._strides = row_major(shape) if not order else [
            0 if n == 1 else x for n, x in zip(shape, self.dense)]

    def stride(self, d: int) -> int:
        return self._strides[d]


def next_pow2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


def _check_fit(program: ReductionProgram, tensors: Sequence[Any], maps: Sequence[tuple],
               loop: tuple[int, ...]) -> None:  # fmt: skip
    """Sizes must agree with the loop where they are mapped. A reshape's output that does
    not has regrouped the loop's dims, e.g. merged a reduced dim into a kept one."""
    for k, (t, m) in enumerate(zip(tensors, maps)):
        for i, d in enumerate(m):
            if d is None or t.shape[i] in (1, loop[d]):
                continue
            frames = program.accesses[k].frames if k < len(program.accesses) else ()
            if frames:
                raise SchedulerRefused(
                    f"reshape (T{frames[0].state}) gives shape {list(t.shape)} where the loop is "
                    f"{list(loop)}: it mixes reduced and kept dims"
                )
            raise SchedulerRefused(f"a tensor of shape {list(t.shape)} does not fit the loop "
                                   f"{list(loop)}")  # fmt: skip


def empty_outputs(program: ReductionProgram, env: dict,
                  accumulate: tuple[int, ...]) -> tuple[OutputSpec, ...] | None:  # fmt: skip
    """With no rows every output is empty (element-level ones span the loop too): their
    specs, for a launch of no kernel; None when there are rows (or column partials)."""
    loop = tuple(env[program.loop_state])
    if accumulate or all(loop[d] for d in range(program.rank) if d not in program.reduced):
        return None
    return tuple(OutputSpec(tuple(env[st.state]), st.dtype, st.alias_input,
                            _Shape(env[st.state], st.stride_order).dense
                            if st.alias_input is None else None)
                 for st in program.stores)  # fmt: skip


def read_problem(program: ReductionProgram, values: Sequence[Any], env: dict, profile: Any,
                 accumulate: tuple[int, ...], finish: tuple[str, ...]) -> Problem:  # fmt: skip
    rank, K = program.rank, program.reduced
    loop = tuple(env[program.loop_state])
    sources = [values[a.input_pos] for a in program.accesses]  # no index accesses here
    layout = resize_layout(program, sources, env, loop) if program.resized else None
    seen = [resolve_access(values[a.input_pos], a, env) if layout is None or not _framed(a)
            else (None, None) for a in program.accesses]  # fmt: skip
    tensors: list[Any] = [t for t, _ in seen]
    maps = [m for _, m in seen]
    outputs = []
    for k, st in enumerate(program.stores):
        shape = tuple(env[st.state])
        if st.alias_input is not None:
            # in place, as batch norm's running statistics: one value per row, written
            # by one thread after the row is reduced
            target = values[st.alias_input]
            if tuple(target.shape) != shape or not program.store_rowlevel[k]:
                raise SchedulerRefused(f"output {st.state} is written in place but varies "
                                       "along the reduced dims")  # fmt: skip
            outputs.append(OutputSpec(shape, st.dtype, st.alias_input))
            tensors.append(target)
        else:
            fresh = _Shape(shape, st.stride_order)
            if k not in accumulate:
                outputs.append(OutputSpec(shape, st.dtype, None, fresh.dense))
            tensors.append(fresh)
        maps.append(program.output_maps[k])
    if layout is None:
        strides = [access_strides(t, m, rank) for t, m in zip(tensors, maps)]
        _check_fit(program, tensors, maps, loop)
    else:  # resolved through their frames: their sizes are the frames' business
        strides = [list(r.strides) for r in layout.reads]
        strides += [access_strides(t, m, rank) for t, m in zip(tensors[len(strides):], maps[len(strides):])]
        plain = [k for k in range(len(tensors)) if tensors[k] is not None]
        _check_fit(program, [tensors[k] for k in plain], [maps[k] for k in plain], loop)
        tensors = [t if t is not None else _Shape(loop) for t in tensors]
    kept_dims = [d for d in range(rank) if d not in K]
    k_sizes, k_strides = collapse(loop, strides, K)
    if len(k_sizes) > 2:
        raise SchedulerRefused(f"the reduced dims {list(K)} form {len(k_sizes)} strided runs; "
                               "at most two are scheduled")  # fmt: skip
    row_dim_of: tuple = ()
    if layout is not None and layout.keep & set(K) and len([d for d in K if loop[d] != 1]) > 1:
        raise SchedulerRefused("a window or position along reduced dims that are not one dim")
    k2 = len(k_sizes) == 2  # Note [Two reduced dims]
    N = k_sizes[0] * k_sizes[-1] if k2 else k_sizes[0]
    ks = [s[-1] for s in k_strides]
    k0s = [s[0] for s in k_strides]
    if layout is None:
        i_sizes, i_strides = collapse(loop, strides, kept_dims)
    else:  # dims that windows and positions read stay dims of their own
        sub = [[s[d] for d in kept_dims] for s in strides]
        i_sizes, i_strides, dims = collapse_keeping([loop[d] for d in kept_dims], sub,
                                                    frozenset(kept_dims.index(d) for d in layout.keep
                                                              if d in kept_dims))  # fmt: skip
        row_dim_of = tuple(dims[kept_dims.index(d)] if d in kept_dims else None for d in range(rank))
    rows = 1
    for n in i_sizes:
        rows *= n
    if rows == 0 or N == 0:
        # rows over nothing: the executor plans the fusion with the reductions replaced by
        # their identities (Note [Empty reductions] in fusion_cache/ir/empty_reductions.py)
        raise SchedulerRefused("empty reduction")
    elem = [i for i, a in enumerate(program.accesses) if ks[i] != 0]
    ptrs = [values[a.input_pos].data_ptr() for a in program.accesses] + [0] * len(program.stores)
    if layout is not None:  # the first element read, past a slice's start or a pad's width
        for k, (a, r) in enumerate(zip(program.accesses, layout.reads)):
            ptrs[k] += r.offset * ELEMENT_BYTES[a.dtype]
    written = {st.alias_input for st in program.stores if st.alias_input is not None}
    for i, a in enumerate(program.accesses):
        if a.input_pos in written and ks[i] != 0:
            raise SchedulerRefused(f"input {a.input_pos} is read along the reduced dims and "
                                   "written in place")  # fmt: skip
    primary = max(elem, key=lambda i: values[program.accesses[i].input_pos].numel()) if elem else None
    pure = all(program.store_rowlevel) and program.stages == 1
    # outer kernels suit pure reductions whose reduced dims are strided and whose innermost
    # kept dim is contiguous, also where kept dims sit on both sides of reduced ones (Note
    # [Middle reductions] in outer_plan.py); anything else takes the inner kernel, with
    # strided loads where the reduced dim is not contiguous; the outer kernel reads no
    # resize frames
    inner = (primary is None or ks[primary] == 1 or not pure or i_strides[primary][-1] != 1
             or layout is not None)
    scalars = [ArgRef("scalar", pos) for pos, _ in program.scalar_inputs]
    scalars += [env[state] for state, _ in program.host_scalars]
    return Problem(program, values, env, profile, accumulate, finish, loop, tensors, outputs,
                   strides, k_sizes, k2, N, ks, k0s, i_sizes, i_strides, rows, elem, ptrs,
                   primary, pure, inner, scalars, layout, row_dim_of)  # fmt: skip


def _framed(access: Any) -> bool:
    """Read through a resize frame or by index: resolved by resize_layout instead."""
    return any(hasattr(f, "record") for f in access.frames) or any(
        isinstance(m, str) for m in access.dim_map)
