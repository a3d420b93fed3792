"""Lowerings of aten's slicing and joining ops onto fd.ops.slice, pad and cat: split,
split_with_sizes, unbind, select, slice, narrow, cat, stack, constant_pad_nd and the
backward ops of slice and select.

Indices are normalised here as torch does (negative from the end, clamped to the size), so
the fusion sees in-bounds static bounds; the sizes come from the frontend's hints (Note
[Frontend shapes]): the torch.compile frontend knows every concrete size.
"""
from __future__ import annotations

from typing import Any

from .lowering import Args, LoweringContext, UnsupportedOpError, is_handle, lowers


def _size(ctx: LoweringContext, x: Any, dim: int) -> int:
    size = ctx.known_extent(x, dim)
    if size is None:
        raise UnsupportedOpError(f"slicing dim {dim}, whose size is known only at run time")
    return size


def _static(value: Any, what: str) -> Any:
    if is_handle(value):
        raise UnsupportedOpError(f"{what} known only at run time")
    return value


def slice_dim(ctx: LoweringContext, x: Any, dim: int, start: Any, end: Any, step: int = 1) -> Any:
    """x[..., start:end:step, ...] along `dim`, with Python's bounds (None, negative, past
    the end); the whole dim at step 1 is x itself."""
    dim = dim % x.ndim
    size = _size(ctx, x, dim)
    step = _static(step, "slice step")
    if step <= 0:
        raise UnsupportedOpError(f"slice step {step} (torch takes positive steps only)")
    start, end, _ = slice(_static(start, "slice start"), _static(end, "slice end")).indices(size)
    end = max(end, start)
    if (start, end, step) == (0, size, 1):
        return x
    starts = [0] * x.ndim
    ends = [_size(ctx, x, d) for d in range(x.ndim)]
    steps = [1] * x.ndim
    starts[dim], ends[dim], steps[dim] = start, end, step
    out = ctx.ops.slice(x, starts, ends, steps)
    ctx.hint(out, [len(range(s, e, k)) for s, e, k in zip(starts, ends, steps)])
    return out


def _select(ctx: LoweringContext, x: Any, dim: int, index: int) -> Any:
    dim = dim % x.ndim
    size = _size(ctx, x, dim)
    index = _static(index, "select index")
    if not -size <= index < size:
        raise UnsupportedOpError(f"select index {index} out of range for size {size}")
    index %= size
    return ctx.ops.squeeze(slice_dim(ctx, x, dim, index, index + 1), [dim])


@lowers("slice", "slice_copy")
def _slice(ctx: LoweringContext, a: Args) -> Any:
    return slice_dim(ctx, a[0], a.get("dim", 0), a.get("start"), a.get("end"), a.get("step", 1))


@lowers("narrow", "narrow_copy")
def _narrow(ctx: LoweringContext, a: Args) -> Any:
    x, dim, start, length = a[0], a[1] % a[0].ndim, a[2], a[3]
    start = _static(start, "narrow start") % max(_size(ctx, x, dim), 1)
    return slice_dim(ctx, x, dim, start, start + length)


@lowers("select", "select_copy")
def _select_op(ctx: LoweringContext, a: Args) -> Any:
    return _select(ctx, a[0], a[1], a[2])


@lowers("unbind", "unbind_copy")
def _unbind(ctx: LoweringContext, a: Args) -> Any:
    x = a[0]
    dim = a.get("dim", 0) % x.ndim
    return tuple(_select(ctx, x, dim, i) for i in range(_size(ctx, x, dim)))


def _split_at(ctx: LoweringContext, x: Any, dim: int, sizes: list[int]) -> tuple:
    dim = dim % x.ndim
    if sum(sizes) != _size(ctx, x, dim):
        raise UnsupportedOpError(f"split sizes {sizes} do not add up to dim {dim}'s size")
    out, start = [], 0
    for n in sizes:
        out.append(slice_dim(ctx, x, dim, start, start + n))
        start += n
    return tuple(out)


@lowers("split", "split_copy")
def _split(ctx: LoweringContext, a: Args) -> Any:
    x, chunk, dim = a[0], _static(a[1], "split size"), a.get("dim", 0)
    if isinstance(chunk, (list, tuple)):  # split.sizes
        return _split_at(ctx, x, dim, list(chunk))
    size = _size(ctx, x, dim % x.ndim)
    if chunk <= 0:
        raise UnsupportedOpError(f"split size {chunk}")
    sizes = [min(chunk, size - s) for s in range(0, size, chunk)] or [0]
    return _split_at(ctx, x, dim, sizes)


@lowers("split_with_sizes", "split_with_sizes_copy")
def _split_with_sizes(ctx: LoweringContext, a: Args) -> Any:
    return _split_at(ctx, a[0], a.get("dim", 0), [_static(s, "split size") for s in a[1]])


@lowers("cat", "concat", "concatenate")
def _cat(ctx: LoweringContext, a: Args) -> Any:
    tensors = list(a[0])
    if not tensors:
        raise UnsupportedOpError("cat of no tensors")
    rank = max(t.ndim for t in tensors)
    # torch skips 1-d empty tensors in cat (legacy behaviour); so do we
    tensors = [t for t in tensors if not (t.ndim == 1 and rank > 1 and _size(ctx, t, 0) == 0)]
    if len(tensors) == 1:
        return ctx.ops.set(tensors[0])
    return ctx.ops.cat(tensors, a.get("dim", 0) % rank)


@lowers("stack")
def _stack(ctx: LoweringContext, a: Args) -> Any:
    tensors = list(a[0])
    if not tensors:
        raise UnsupportedOpError("stack of no tensors")
    rank = tensors[0].ndim + 1
    dim = a.get("dim", 0) % rank
    flags = [d == dim for d in range(rank)]
    parts = [ctx.ops.broadcast(t, flags) for t in tensors]
    return parts[0] if len(parts) == 1 else ctx.ops.cat(parts, dim)


@lowers("constant_pad_nd")
def _constant_pad_nd(ctx: LoweringContext, a: Args) -> Any:
    x, widths, value = a[0], [_static(w, "pad width") for w in a[1]], a.get("value", 0)
    if len(widths) % 2 or len(widths) > 2 * x.ndim:
        raise UnsupportedOpError(f"pad widths {widths} for a rank-{x.ndim} tensor")
    # negative widths crop: slice those off first, then pad by what is left
    for i in range(len(widths) // 2):
        dim = x.ndim - 1 - i
        lo, hi = widths[2 * i], widths[2 * i + 1]
        if lo < 0 or hi < 0:
            size = _size(ctx, x, dim)
            x = slice_dim(ctx, x, dim, max(-lo, 0), size - max(-hi, 0))
    widths = [max(w, 0) for w in widths]
    if not any(widths):
        return x
    return ctx.ops.pad(x, widths, value)


def _pad_dim(ctx: LoweringContext, x: Any, dim: int, lo: int, hi: int) -> Any:
    widths = [0] * (2 * (x.ndim - dim))
    widths[-2], widths[-1] = lo, hi
    return ctx.ops.pad(x, widths, 0.0) if lo or hi else x


@lowers("slice_backward")
def _slice_backward(ctx: LoweringContext, a: Args) -> Any:
    grad, sizes, dim, start, end, step = a[0], list(a[1]), a[2], a[3], a[4], a[5]
    dim %= len(sizes)
    start, end, step = slice(start, end, step).indices(sizes[dim])
    if step != 1:
        raise UnsupportedOpError(f"slice_backward with step {step}")
    return _pad_dim(ctx, grad, dim, start, sizes[dim] - max(end, start))


@lowers("select_backward")
def _select_backward(ctx: LoweringContext, a: Args) -> Any:
    grad, sizes, dim, index = a[0], list(a[1]), a[2] % len(a[1]), a[3]
    index %= sizes[dim]
    grown = ctx.ops.broadcast(grad, [d == dim for d in range(len(sizes))])
    return _pad_dim(ctx, grown, dim, index, sizes[dim] - index - 1)
