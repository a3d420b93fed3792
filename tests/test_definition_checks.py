"""Bad arguments are refused where they are written (at definition time when the sizes are
known there, else at execute with a message naming the op), not by torch's internals; and
the reduction overloads nvFuser's clients use."""
from __future__ import annotations

import pytest
import torch

from fusion_cache import DataType, FusionDefinition


def tensor(fd, shape):
    return fd.define_tensor(shape=shape, contiguity=[True] * len(shape), dtype=DataType.Float)


def define(body):
    with FusionDefinition() as fd:
        body(fd)
    return fd


@pytest.mark.parametrize("correction", ["x", 1.5, None])
def test_var_correction_must_be_an_int(correction):
    for op in ("var", "var_mean"):
        with pytest.raises(TypeError, match=f"{op}: correction must be an int"):
            define(lambda fd, op=op: getattr(fd.ops, op)(tensor(fd, [-1, -1]), [0], correction=correction))


def test_var_negative_correction():
    with pytest.raises(ValueError, match="correction must be >= 0"):
        define(lambda fd: fd.ops.var(tensor(fd, [-1]), [0], correction=-1))


def test_pad_that_makes_a_dim_negative():
    # static size: at definition
    with pytest.raises(ValueError, match="pad: padding makes dim 0 negative"):
        define(lambda fd: fd.ops.pad(tensor(fd, [3]), [-10, 0]))
    # symbolic size: at execute, naming the op and the sizes
    fd = define(lambda fd: fd.add_output(fd.ops.pad(tensor(fd, [-1]), [-10, 0])))
    with pytest.raises(ValueError, match=r"pad \(T1\): pad_widths \[-10, 0\] make dim 0 of size 3 negative"):
        fd.execute([torch.randn(3)])
    fd = define(lambda fd: fd.add_output(fd.ops.pad(tensor(fd, [-1]), [-1, 2])))
    x = torch.randn(3)
    torch.testing.assert_close(fd.execute([x])[0], torch.nn.functional.pad(x, [-1, 2]))


@pytest.mark.parametrize("op,shape", [("broadcast_in_dim", [-5, 4]), ("expand", [-1, -7])])
def test_negative_target_sizes(op, shape):
    def body(fd):
        t = tensor(fd, [-1] if op == "broadcast_in_dim" else [-1, 1])
        if op == "broadcast_in_dim":
            fd.ops.broadcast_in_dim(t, shape, [1])
        else:
            fd.ops.expand(t, shape)

    with pytest.raises(ValueError, match=rf"{op}: shape\[\d\] = -\d is not a size"):
        define(body)


def test_negative_size_from_an_input_scalar_is_caught_at_execute():
    def body(fd):
        t = tensor(fd, [-1, 1])
        n = fd.define_scalar(dtype=DataType.Int)
        fd.add_output(fd.ops.expand(t, [-1, n]))

    fd = define(body)
    with pytest.raises(ValueError, match="expand"):
        fd.execute([torch.randn(2, 1), -7])
    torch.testing.assert_close(fd.execute([torch.ones(2, 1), 3])[0], torch.ones(2, 3))


def test_cat_of_disagreeing_sizes_names_the_dim():
    with pytest.raises(ValueError, match=r"cat: tensors\[1\] has size 4 at dim 1 but tensors\[0\] has 3"):
        define(lambda fd: fd.ops.cat([tensor(fd, [2, 3]), tensor(fd, [2, 4])], 0))


def test_full_with_a_negative_size():
    def const(fd):
        n = fd.define_scalar(-4, DataType.Int)
        fd.ops.full([n, 3], 1.0, DataType.Float)

    with pytest.raises(ValueError, match="full: shape .* has a negative size"):
        define(const)

    def symbolic(fd):
        n = fd.define_scalar(dtype=DataType.Int)
        fd.add_output(fd.ops.full([n, 3], 1.0, DataType.Float))

    fd = define(symbolic)
    with pytest.raises(ValueError, match=r"full \(T\d+\): shape \[-4, 3\] has a negative size"):
        fd.execute([-4])
    assert fd.execute([2])[0].shape == (2, 3)


def test_broadcast_needs_a_list_of_bools():
    for bad in (5, [1, 0], "TF"):
        with pytest.raises(TypeError, match="broadcast: is_broadcast_dim must be a list of bools"):
            define(lambda fd, bad=bad: fd.ops.broadcast(tensor(fd, [-1, -1]), bad))


@pytest.mark.parametrize("correction", [0, 1])
def test_var_and_var_mean_over_no_dims_keep_the_shape(correction):
    def body(fd):
        t = tensor(fd, [-1, -1])
        fd.add_output(fd.ops.var(t, [], correction=correction))
        for o in fd.ops.var_mean(t, [], correction=correction):
            fd.add_output(o)
        fd.add_output(fd.ops.sum(t, []))

    fd = define(body)
    x = torch.randn(2, 3)
    var, var2, mean, total = fd.execute([x])
    assert var.shape == var2.shape == mean.shape == total.shape == (2, 3)
    expect = torch.zeros(2, 3) if correction == 0 else torch.full((2, 3), float("nan"))
    torch.testing.assert_close(var, expect, equal_nan=True)
    torch.testing.assert_close(var2, expect, equal_nan=True)
    torch.testing.assert_close(mean, x)
    torch.testing.assert_close(total, x)


@pytest.mark.parametrize("op", ["sum", "prod", "max", "min"])
def test_reduction_overloads(op):
    x = torch.randn(3, 4, 5)
    def prod(t, dims, keepdim=False):
        for d in sorted([dims] if isinstance(dims, int) else dims, reverse=True):
            t = torch.prod(t, d, keepdim=keepdim)
        return t

    fn = {"sum": torch.sum, "prod": prod, "max": torch.amax, "min": torch.amin}[op]

    def body(fd):
        t = tensor(fd, [-1, -1, -1])
        red = getattr(fd.ops, op)
        fd.add_output(red(t, 1))                               # an int dim
        fd.add_output(red(t, dim=-1, keepdim=True))            # dim=
        fd.add_output(red(t, [0, 2]))                          # a list of dims
        fd.add_output(red(t, axes=[0]))                        # the early keyword
        fd.add_output(red(t, DataType.Double))                 # a positional dtype: every dim
        fd.add_output(red(t, [1], False, DataType.Double))     # dims, keepdim, dtype

    fd = define(body)
    outs = fd.execute([x])
    expect = [fn(x, 1), fn(x, -1, keepdim=True), fn(x, (0, 2)), fn(x, 0),
              fn(x.double(), (0, 1, 2)), fn(x.double(), 1)]  # fmt: skip
    for got, want in zip(outs, expect):
        assert got.dtype == want.dtype
        torch.testing.assert_close(got, want)


def test_reduction_overload_misuse():
    with pytest.raises(TypeError, match="give the reduced dims once"):
        define(lambda fd: fd.ops.sum(tensor(fd, [-1]), [0], dim=0))
    with pytest.raises(TypeError, match="keepdim must be a bool"):
        define(lambda fd: fd.ops.sum(tensor(fd, [-1]), [0], "yes"))
    with pytest.raises(TypeError, match="dims must be an int or a list"):
        define(lambda fd: fd.ops.sum(tensor(fd, [-1]), "0"))


def test_an_int_dim_and_a_list_of_it_are_one_fusion():
    a = define(lambda fd: fd.add_output(fd.ops.sum(tensor(fd, [-1, -1]), 1)))
    b = define(lambda fd: fd.add_output(fd.ops.sum(tensor(fd, [-1, -1]), [1])))
    assert a.id() == b.id()
