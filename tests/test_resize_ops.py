"""Resize and indexing ops on the reference evaluator (CPU), against torch: slice (constant,
symbolic and vector bounds, negative indices, strides, manual_normalization), pad, cat
(manual_padding), select, index_select, gather, take_along_axis, scatter,
index_put_accumulate, embedding_fwd, iota, triu, tensor_sizes, at and Vector indexing,
reshape to a runtime vector; each for every dtype it claims. Also: the printed definition
rebuilds the same fusion, the Fusion IR names each op, and bad input names the argument."""
from __future__ import annotations

import re

import pytest
import torch
import torch.nn.functional as F

from fusion_cache import DataType, FusionDefinition
from fusion_cache.frontend.dtypes import from_torch

DATA = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int32, torch.int64,
        torch.bool]  # fmt: skip
INDEX = [torch.int64, torch.int32, torch.float32]  # float indices truncate, as nvFuser's do


def rand(shape, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    if dtype == torch.bool:
        return torch.randint(0, 2, shape, generator=g).bool()
    if not dtype.is_floating_point:
        return torch.randint(-50, 50, shape, generator=g, dtype=dtype)
    return torch.randn(shape, generator=g, dtype=torch.float64).to(dtype)


def indices(shape, high, dtype=torch.int64, seed=1):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, high, shape, generator=g).to(dtype)


def tensor(fd, t):
    return fd.define_tensor(shape=[-1] * t.dim(), contiguity=True, dtype=from_torch(t.dtype))


def run(build, inputs):
    """Inputs: tensors become symbolic tensors, ints Int scalars, lists Int vectors."""
    with FusionDefinition() as fd:
        vals = []
        for x in inputs:
            if isinstance(x, torch.Tensor):
                vals.append(tensor(fd, x))
            elif isinstance(x, list):
                vals.append(fd.define_vector(len(x)))
            else:
                vals.append(fd.define_scalar(dtype=DataType.Int))
        outs = build(fd, *vals)
        for o in outs if isinstance(outs, (list, tuple)) else [outs]:
            fd.add_output(o)
    return fd, fd.execute(inputs)


def same(got, want):
    assert got.dtype == want.dtype and got.shape == want.shape, (got.dtype, got.shape, want.shape)
    torch.testing.assert_close(got, want, rtol=0, atol=0)


# ---- slice -----------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", DATA, ids=str)
def test_slice_constant_bounds_negative_and_strides(dtype):
    x = rand((7, 9), dtype)
    _, (a, b, c) = run(lambda fd, t: [fd.ops.slice(t, [1, -6], [5, 8]),
                                      fd.ops.slice(t, [0, 1], [7, 9], [2, 3]),
                                      fd.ops.slice(t, [-7, 0], [-1, 9], strides=[3, 1])], [x])
    same(a, x[1:5, -6:8])
    same(b, x[0:7:2, 1:9:3])
    same(c, x[-7:-1:3, :])


@pytest.mark.parametrize("bounds", [(1, 5), (-4, -1), (-100, 3), (2, 100), (5, 2), (-1, 100)])
def test_slice_symbolic_bounds_normalize_and_clamp(bounds):
    x = rand((6, 8))
    start, stop = bounds
    _, (out,) = run(lambda fd, t, a, b: fd.ops.slice(t, [a, 0], [b, 8]), [x, start, stop])
    same(out, x[start:stop])


def test_slice_bounds_from_vectors_and_shape_arithmetic():
    x = rand((5, 12))

    def build(fd, t, starts, ends):
        n = fd.ops.size(t, 1)
        half = fd.ops.div(n, 2)
        return [fd.ops.slice(t, starts, ends), fd.ops.slice(t, [0, half], [5, n]),
                fd.ops.slice(t, [0, 0], [5, half], [1, 2])]

    _, (a, b, c) = run(build, [x, [1, 2], [4, -3]])
    same(a, x[1:4, 2:-3])
    same(b, x[:, 6:])
    same(c, x[:, 0:6:2])


def test_slice_manual_normalization():
    x = rand((6, 8))
    fd, (out,) = run(lambda fd, t, a: fd.ops.slice(t, [a, 0], [5, 8], manual_normalization=True),
                     [x, 2])  # fmt: skip
    same(out, x[2:5])
    assert "manual_normalization=True" in repr(fd)
    with pytest.raises(ValueError, match="manual_normalization=True needs 0 <= start_indices"):
        fd.execute([x, -1])
    with FusionDefinition() as fd2:  # static shape and bounds: at definition time
        t = fd2.define_tensor(shape=[6, 8], contiguity=True)
        with pytest.raises(ValueError, match=r"manual_normalization=True needs .* got -2:8"):
            fd2.ops.slice(t, [0, -2], [6, 8], manual_normalization=True)


# ---- pad and cat ----------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", DATA, ids=str)
def test_pad_widths_and_value(dtype):
    x = rand((4, 5, 3), dtype)
    value = True if dtype == torch.bool else 3
    _, (a, b, c) = run(lambda fd, t: [
        fd.ops.pad(t, [1, 2]), fd.ops.pad(t, [0, 1, 2, 0, 1, 1], fd.define_scalar(value)),
        fd.ops.pad(t, [-1, 1, 1, -2])], [x])  # fmt: skip
    same(a, F.pad(x, [1, 2]))
    same(b, F.pad(x, [0, 1, 2, 0, 1, 1], value=value))
    same(c, F.pad(x, [-1, 1, 1, -2]))


def test_pad_symbolic_widths():
    x = rand((4, 5))
    _, (out,) = run(lambda fd, t, a, b: fd.ops.pad(t, [a, b], fd.define_scalar(-1.5)), [x, 3, 1])
    same(out, F.pad(x, [3, 1], value=-1.5))


@pytest.mark.parametrize("dtype", DATA, ids=str)
@pytest.mark.parametrize("dim", [0, 1, -1])
def test_cat_of_three(dtype, dim):
    xs = [rand((3, 4), dtype, 0), rand((3, 4), dtype, 1), rand((3, 4), dtype, 2)]
    xs[1] = (xs[1][:2] if dim == 0 else xs[1][:, :1]).contiguous()
    _, (out,) = run(lambda fd, *ts: fd.ops.cat(list(ts), dim), xs)
    same(out, torch.cat(xs, dim))


def test_cat_promotes_and_broadcasts():
    a, b = rand((3, 2), torch.bfloat16), rand((1, 5), torch.float32)
    with FusionDefinition() as fd:
        ta = tensor(fd, a)
        tb = fd.define_tensor(shape=[1, -1], contiguity=[None, True], dtype=DataType.Float)
        fd.add_output(fd.ops.cat([ta, tb], 1))
    (out,) = fd.execute([a, b])
    same(out, torch.cat([a.float(), b.float().expand(3, 5)], 1))


def test_cat_manual_padding():
    a, b = rand((2, 3)), rand((2, 4), seed=1)
    fd, (out,) = run(lambda fd, x, y: fd.ops.cat(
        [fd.ops.pad(x, [0, 4]), fd.ops.pad(y, [3, 0])], 1, manual_padding=True), [a, b])
    same(out, torch.cat([a, b], 1))
    assert "manual_padding=True" in repr(fd)


# ---- select and the gathers ------------------------------------------------------------------


@pytest.mark.parametrize("dtype", DATA, ids=str)
@pytest.mark.parametrize("dim,index", [(0, 2), (1, -1), (-1, 0)])
def test_select(dtype, dim, index):
    x = rand((4, 5, 3), dtype)
    _, (out,) = run(lambda fd, t, i: fd.ops.select(t, i, dim), [x, index])
    same(out, x.select(dim, index))


@pytest.mark.parametrize("dtype", DATA, ids=str)
@pytest.mark.parametrize("itype", INDEX, ids=str)
def test_index_select(dtype, itype):
    x = rand((6, 5), dtype)
    for dim in (0, 1):
        idx = indices((7,), x.shape[dim], itype)
        _, (out,) = run(lambda fd, t, i, d=dim: fd.ops.index_select(t, i, d), [x, idx])
        same(out, torch.index_select(x, dim, idx.long()))
    scalar = torch.tensor(3)
    _, (out,) = run(lambda fd, t, i: fd.ops.index_select(t, i, 1), [x, scalar])
    same(out, torch.index_select(x, 1, scalar))


@pytest.mark.parametrize("dtype", DATA, ids=str)
@pytest.mark.parametrize("itype", INDEX, ids=str)
def test_gather_index_smaller_than_input(dtype, itype):
    x = rand((5, 7, 3), dtype)
    for dim in (0, 1, 2):
        shape = [4, 6, 2]
        shape[dim] = 9
        idx = indices(shape, x.shape[dim], itype)
        _, (out,) = run(lambda fd, t, i, d=dim: fd.ops.gather(t, i, d), [x, idx])
        same(out, torch.gather(x, dim, idx.long()))


@pytest.mark.parametrize("dtype", DATA, ids=str)
def test_take_along_axis_broadcasts_like_take_along_dim(dtype):
    x = rand((5, 7), dtype)
    idx = indices((5, 3), 7)
    _, (out,) = run(lambda fd, t, i: fd.ops.take_along_axis(t, i, 1), [x, idx])
    same(out, torch.take_along_dim(x, idx, 1))
    col = indices((5, 1), 7, seed=3)  # one index a row: cross-entropy's shape
    with FusionDefinition() as fd:
        t = tensor(fd, x)
        i = fd.define_tensor(shape=[-1, 1], contiguity=[True, None], dtype=DataType.Int)
        fd.add_output(fd.ops.take_along_axis(t, i, 1))
        b = fd.define_tensor(shape=[1, -1], contiguity=[None, True], dtype=DataType.Int)
        fd.add_output(fd.ops.take_along_axis(t, b, 0))
    row = indices((1, 7), 5, seed=4)
    out, out2 = fd.execute([x, col, row])
    same(out, torch.gather(x, 1, col))
    same(out2, torch.take_along_dim(x, row, 0))


@pytest.mark.parametrize("dtype", DATA, ids=str)
def test_scatter(dtype):
    x, src = rand((5, 6), dtype), rand((4, 6), dtype, seed=2)
    # a permutation along dim 0 per column: no index repeats, so the result is defined
    idx = torch.stack([torch.randperm(5, generator=torch.Generator().manual_seed(c))[:3]
                       for c in range(4)], 1)  # fmt: skip
    _, (out,) = run(lambda fd, t, i, s: fd.ops.scatter(t, i, s, 0), [x, idx, src])
    same(out, torch.scatter(x, 0, idx, src))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16, torch.int64],
                         ids=str)  # fmt: skip
def test_index_put_accumulate_repeated_indices(dtype):
    acc, value = rand((6, 4), dtype), rand((9, 4), dtype, seed=5)
    idx = torch.tensor([0, 3, 3, 5, 0, 0, 1, 3, 2])
    _, (out,) = run(lambda fd, a, i, v: fd.ops.index_put_accumulate(a, i, v), [acc, idx, value])
    want = acc.index_put((idx,), value, accumulate=True)
    torch.testing.assert_close(out, want, rtol=1e-2 if dtype == torch.bfloat16 else 1e-6, atol=1e-2)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("itype", [torch.int64, torch.int32], ids=str)
def test_embedding_fwd(dtype, itype):
    weight = rand((11, 6), dtype)
    idx = indices((3, 4), 11, itype)
    _, (out,) = run(lambda fd, i, w: fd.ops.embedding_fwd(i, w, fd.define_scalar(0)), [idx, weight])
    same(out, F.embedding(idx.long(), weight, padding_idx=0))
    _, (normed,) = run(lambda fd, i, w: fd.ops.embedding_fwd(
        i, w, None, fd.define_scalar(1.0), fd.define_scalar(2.0)), [idx, weight])
    want = F.embedding(idx.long(), weight.clone(), max_norm=1.0)
    torch.testing.assert_close(normed, want)


@pytest.mark.parametrize("dtype", DATA, ids=str)
@pytest.mark.parametrize("diagonal", [0, 1, -2, 5])
def test_triu(dtype, diagonal):
    x = rand((2, 4, 6), dtype)
    _, (out,) = run(lambda fd, t: fd.ops.triu(t, diagonal), [x])
    same(out, torch.triu(x, diagonal))


@pytest.mark.parametrize("dtype", [DataType.Int, DataType.Int32, DataType.Float, DataType.Double])
def test_iota_causal_mask(dtype):
    def build(fd, n):
        rows = fd.ops.broadcast(fd.ops.iota(n, dtype=dtype), [False, True])
        cols = fd.ops.broadcast(fd.ops.iota(n, fd.define_scalar(1), fd.define_scalar(2),
                                            dtype=dtype), [True, False])  # fmt: skip
        return [fd.ops.ge(rows, cols), fd.ops.add(rows, cols)]

    _, (mask, total) = run(build, [5])
    torch_dt = {DataType.Int: torch.int64, DataType.Int32: torch.int32,
                DataType.Float: torch.float32, DataType.Double: torch.float64}[dtype]  # fmt: skip
    r = torch.arange(5, dtype=torch_dt)[:, None]
    c = (torch.arange(5, dtype=torch_dt) * 2 + 1)[None, :]
    same(mask, r >= c)
    same(total, r + c)


# ---- scalars of shapes: tensor_sizes, at, Vector indexing, reshape to a runtime vector ------


def test_tensor_sizes_at_and_vector_indexing():
    x = rand((3, 4, 5))

    def build(fd, t):
        d0, d1, d2 = fd.ops.tensor_sizes(t)
        shape = t.shape()
        last = shape[-1]
        return [fd.ops.reshape(t, [d0, fd.ops.mul(d1, last)]),
                fd.ops.reshape(t, [fd.ops.at(shape, 0), shape.at(1), d2])]

    fd, (a, b) = run(build, [x])
    same(a, x.reshape(3, 20))
    same(b, x)
    with FusionDefinition() as fd2:
        v = fd2.define_vector([2, 7])
        assert len(v) == 2
        with pytest.raises(IndexError, match="at: index 2 is out of range"):
            v[2]


def test_reshape_to_a_runtime_vector():
    x = rand((4, 6))
    fd, (out,) = run(lambda fd, t, shape: fd.ops.reshape(t, shape), [x, [3, 8]])
    same(out, x.reshape(3, 8))
    (out,) = fd.execute([x, (2, 12)])
    same(out, x.reshape(2, 12))
    with pytest.raises(ValueError, match="reshape"):
        fd.execute([x, [5, 5]])


# ---- bad input ------------------------------------------------------------------------------


def _t(fd, shape=(-1, -1), dtype=DataType.Float):
    return fd.define_tensor(shape=list(shape), contiguity=True, dtype=dtype)


DEFINITION_ERRORS = [
    ("bool_index", lambda fd: fd.ops.index_select(_t(fd), _t(fd, (-1,), DataType.Bool), 0),
     TypeError, "index_select: argument 'index' must hold integer indices"),
    ("index_rank", lambda fd: fd.ops.index_select(_t(fd), _t(fd, (-1, -1), DataType.Int), 0),
     ValueError, "index_select: argument 'index' must be a 0-dim or 1-dim"),
    ("gather_rank", lambda fd: fd.ops.gather(_t(fd), _t(fd, (-1,), DataType.Int), 0),
     ValueError, "gather: argument 'index' has rank 1"),
    ("gather_dim", lambda fd: fd.ops.gather(_t(fd), _t(fd, (-1, -1), DataType.Int), 2),
     ValueError, "gather: dim 2 is out of range"),
    ("gather_static_too_big", lambda fd: fd.ops.gather(_t(fd, (3, 4)), _t(fd, (5, 2), DataType.Int), 1),
     ValueError, "gather: index has size 5 at dim 0, more than 3"),
    ("take_along_mismatch", lambda fd: fd.ops.take_along_axis(_t(fd, (3, 4)),
                                                               _t(fd, (2, 4), DataType.Int), 1),
     ValueError, "take_along_axis"),
    ("scatter_dtype", lambda fd: fd.ops.scatter(_t(fd), _t(fd, (-1, -1), DataType.Int),
                                                _t(fd, (-1, -1), DataType.Half), 0),
     TypeError, "scatter: argument 'src' has dtype DataType.Half"),
    ("index_put_rank", lambda fd: fd.ops.index_put_accumulate(
        _t(fd), _t(fd, (-1, -1), DataType.Int), _t(fd)),
     ValueError, "index_put_accumulate: argument 'index' must be 1-dim"),
    ("index_put_value_shape", lambda fd: fd.ops.index_put_accumulate(
        _t(fd, (5, 4)), _t(fd, (3,), DataType.Int), _t(fd, (3, 5))),
     ValueError, "index_put_accumulate: value against"),
    ("embedding_float_input", lambda fd: fd.ops.embedding_fwd(_t(fd, (-1,)), _t(fd)),
     TypeError, "embedding_fwd: argument 'input' must hold integer indices"),
    ("embedding_weight_rank", lambda fd: fd.ops.embedding_fwd(_t(fd, (-1,), DataType.Int),
                                                              _t(fd, (-1,))),
     ValueError, "embedding_fwd: argument 'weight' must be 2-dim"),
    ("select_static_index", lambda fd: fd.ops.select(_t(fd, (3, 4)), 4, 1),
     IndexError, "select: index 4 is out of range for a dim of size 4"),
    ("select_float_index", lambda fd: fd.ops.select(_t(fd), fd.define_scalar(1.0), 1),
     TypeError, "select: argument 'index' must be an Int scalar"),
    ("triu_rank", lambda fd: fd.ops.triu(_t(fd, (-1,))),
     ValueError, "triu: input must have at least 2 dims"),
    ("cat_manual_unpadded", lambda fd: fd.ops.cat([_t(fd), _t(fd)], 1, manual_padding=True),
     ValueError, "cat: manual_padding=True needs every tensor padded"),
    ("cat_mismatch", lambda fd: fd.ops.cat([_t(fd, (3, 4)), _t(fd, (2, 4))], 1),
     ValueError, "cat: tensors[1] has size 2 at dim 0 but tensors[0] has 3"),
    ("at_vector_only", lambda fd: fd.ops.at(_t(fd), 0),
     TypeError, "at: argument 'arg' must be a vector"),
    ("slice_static_past_end", lambda fd: fd.ops.slice(_t(fd, (4, 6)), [0, 0], [5, 6]),
     ValueError, "slice: slice 0:5 is out of bounds for dim 0 of size 4"),
]


@pytest.mark.parametrize("name,build,exc,msg", DEFINITION_ERRORS, ids=[e[0] for e in DEFINITION_ERRORS])
def test_definition_errors_name_the_argument(name, build, exc, msg):
    with FusionDefinition() as fd:
        with pytest.raises(exc, match=msg.replace("(", r"\(").replace("[", r"\[")):
            build(fd)


def test_out_of_range_indices_raise_on_the_reference_evaluator():
    x = rand((4, 5))
    fd, _ = run(lambda fd, t, i: fd.ops.index_select(t, i, 0), [x, torch.tensor([0, 3])])
    with pytest.raises(IndexError, match=r"index_select \(T2\): index 4 is out of range"):
        fd.execute([x, torch.tensor([1, 4])])
    with pytest.raises(IndexError, match="index -1 is out of range"):
        fd.execute([x, torch.tensor([-1, 0])])
    fd, _ = run(lambda fd, t, i: fd.ops.select(t, i, 1), [x, 1])
    with pytest.raises(IndexError, match="select .*: index 5 is out of range"):
        fd.execute([x, 5])
    fd, _ = run(lambda fd, i, w: fd.ops.embedding_fwd(i, w), [torch.tensor([1]), x])
    with pytest.raises(IndexError, match="embedding_fwd .*: input index 7 is out of range"):
        fd.execute([torch.tensor([7]), x])


def test_execute_time_shape_errors_name_the_op():
    x, idx = rand((4, 5)), indices((3, 2), 5)
    fd, _ = run(lambda fd, t, i: fd.ops.take_along_axis(t, i, 1), [x, indices((4, 2), 5)])
    with pytest.raises(ValueError, match=r"take_along_axis \(T2\): index has size 3 at dim 0"):
        fd.execute([x, idx])
    fd, _ = run(lambda fd, a, b: fd.ops.cat([a, b], 1), [x, x])
    with pytest.raises(ValueError, match=r"cat \(T2\): tensors have sizes \[3, 4\] at dim 0|cat"):
        fd.execute([x, rand((3, 5))])


# ---- printer and Fusion IR ----------------------------------------------------------------------


def b_everything(fd):
    t = _t(fd)
    i1 = _t(fd, (-1,), DataType.Int)
    i2 = _t(fd, (-1, -1), DataType.Int)
    s = fd.define_scalar(dtype=DataType.Int)
    v = fd.define_vector(2)
    fd.add_output(fd.ops.slice(t, [s, -2], v, [1, 2], manual_normalization=False))
    fd.add_output(fd.ops.slice(t, [0, 0], [1, 1], manual_normalization=True))
    fd.add_output(fd.ops.pad(t, [s, 1], fd.define_scalar(2.5)))
    fd.add_output(fd.ops.cat([fd.ops.pad(t, [0, 2]), fd.ops.pad(t, [2, 0])], 1, manual_padding=True))
    fd.add_output(fd.ops.cat([t, t, t], -1))
    fd.add_output(fd.ops.select(t, s, 0))
    fd.add_output(fd.ops.index_select(t, i1, 1))
    fd.add_output(fd.ops.gather(t, i2, 1))
    fd.add_output(fd.ops.take_along_axis(t, i2, 0))
    fd.add_output(fd.ops.scatter(t, i2, t, 1))
    fd.add_output(fd.ops.index_put_accumulate(t, i1, t))
    fd.add_output(fd.ops.embedding_fwd(i2, t, fd.define_scalar(0), fd.define_scalar(1.0)))
    fd.add_output(fd.ops.triu(t, -1))
    fd.add_output(fd.ops.iota(fd.ops.size(t, 0), dtype=DataType.Float))
    (d0,) = fd.ops.tensor_sizes(i1)
    fd.ops.tensor_sizes(fd.ops.sum(i1, [0]))
    fd.add_output(fd.ops.reshape(t, [fd.ops.at(t.shape(), -1), t.shape()[0], d0]))


def test_printed_definition_rebuilds_the_same_fusion():
    from test_frontend_printer import rebuild_from_text

    with FusionDefinition() as fd:
        b_everything(fd)
    text = repr(fd)
    assert re.search(r"\n    S\d+, = fd.ops.tensor_sizes\(T1\)\n", text), text
    assert re.search(r"\n    fd.ops.tensor_sizes\(T\d+\)\n", text), text  # of a 0-dim tensor
    fd2 = rebuild_from_text(text)
    assert fd2.id() == fd.id(), text
    assert repr(fd2) == text
    assert repr(FusionDefinition(fd.id())) == text


def test_fusion_ir_names_every_op():
    with FusionDefinition() as fd:
        b_everything(fd)
    ir = fd.fusion_ir()
    for op in ("slice", "pad", "cat", "select", "index_select", "gather", "take_along_axis",
               "scatter", "index_put_accumulate", "embedding_fwd", "triu", "iota",
               "tensor_sizes", "at"):  # fmt: skip
        assert f"= {op}(" in ir, f"{op} missing:\n{ir}"
    # the gathers iterate their index's dims, select drops one
    line = next(ln for ln in ir.splitlines() if "= gather(" in ln)
    assert line.startswith("T") and "iS" in line, line
