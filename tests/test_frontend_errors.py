"""Bad definitions and bad inputs: the right exception type, a message that names the culprit,
and a cache that still works afterwards."""
from __future__ import annotations

import pytest
import torch

from fusion_cache import DataType, FusionDefinition


def rand(*shape, seed=0, dtype=torch.float32):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(dtype)


def idx(i: int) -> str:
    """Matches a message naming input i: 'input 1', 'inputs[1]', 'input #1', 'argument 1'."""
    return rf"(?i)(input|arg(ument)?)s?\s*(#|\[)?\s*{i}\b"


@pytest.fixture(autouse=True)
def cache_still_works():
    """After every error, a fresh simple fusion still defines and runs correctly."""
    yield
    x, y = rand(3, 4, seed=100), rand(3, 4, seed=101)
    with FusionDefinition() as fd:
        t0 = fd.define_tensor(shape=[-1, -1], contiguity=[True, True], dtype=DataType.Float)
        t1 = fd.define_tensor(shape=[-1, -1], contiguity=[True, True], dtype=DataType.Float)
        fd.add_output(fd.ops.add(fd.ops.mul(t0, fd.define_scalar(2.0)), t1))
    (r,) = fd.execute([x, y])
    torch.testing.assert_close(r, x * 2.0 + y)


def f(fd, shape=(-1, -1), dtype=DataType.Float, contiguity=None):
    contiguity = [True if s != 1 else None for s in shape] if contiguity is None else contiguity
    return fd.define_tensor(shape=list(shape), contiguity=contiguity, dtype=dtype)


# --------------------------------------------------------------------------------------------
# definition time


def _other_fd_tensor(fd):
    with FusionDefinition() as other:
        foreign = f(other)
        other.add_output(other.ops.neg(foreign))
    fd.add_output(fd.ops.add(f(fd), foreign))


def _output_from_other_fd(fd):
    with FusionDefinition() as other:
        foreign = f(other)
        other.add_output(other.ops.neg(foreign))
    f(fd)
    fd.add_output(foreign)


DEF_CASES = [
    ("negative_ndims", lambda fd: fd.define_tensor(-1),
     ValueError, r"(?i)ndim|rank|dim|negative"),
    ("shape_contiguity_lengths", lambda fd: fd.define_tensor(
        shape=[-1, -1], contiguity=[True], dtype=DataType.Float),
     ValueError, r"(?i)contiguity"),
    ("symbolic_sizes_contiguous_lengths", lambda fd: fd.define_tensor(
        symbolic_sizes=[-1, -1, -1], contiguous=[True, True], dtype=DataType.Float),
     ValueError, r"(?i)contigu"),
    ("bad_shape_code", lambda fd: fd.define_tensor(
        shape=[-2, -1], contiguity=[True, True], dtype=DataType.Float),
     ValueError, r"(?i)shape|size|-2"),
    ("stride_order_repeated", lambda fd: fd.define_tensor(
        shape=[-1, -1], contiguity=[True, True], dtype=DataType.Float, stride_order=[0, 0]),
     ValueError, r"(?i)stride"),
    ("stride_order_length", lambda fd: fd.define_tensor(
        shape=[-1, -1], contiguity=[True, True], dtype=DataType.Float, stride_order=[0, 1, 2]),
     ValueError, r"(?i)stride"),
    ("stride_order_out_of_range", lambda fd: fd.define_tensor(
        shape=[-1, -1], contiguity=[True, True], dtype=DataType.Float, stride_order=[0, 5]),
     ValueError, r"(?i)stride"),
    ("sizes_strides_lengths", lambda fd: fd.define_tensor(
        sizes=[2, 3], strides=[1], dtype=DataType.Float),
     ValueError, r"(?i)stride|size"),
    ("define_tensor_bad_dtype", lambda fd: fd.define_tensor(2, "float"),
     TypeError, r"(?i)dtype|DataType"),
    ("define_scalar_bad_dtype", lambda fd: fd.define_scalar(dtype="double"),
     TypeError, r"(?i)dtype|DataType"),
    ("binary_static_4_vs_6", lambda fd: fd.ops.add(f(fd, (4, -1)), f(fd, (6, -1))),
     ValueError, r"(?i)size|shape|broadcast|dim"),
    ("broadcast_in_dim_dim_out_of_range", lambda fd: fd.ops.broadcast_in_dim(
        f(fd, (-1,)), [2, 3], [5]),
     ValueError, r"(?i)broadcast|dim"),
    ("sum_axis_5_of_2d", lambda fd: fd.ops.sum(f(fd), [5]),
     ValueError, r"(?i)axis|axes|dim"),
    ("max_axis_minus_3_of_2d", lambda fd: fd.ops.max(f(fd), [-3]),
     ValueError, r"(?i)axis|axes|dim"),
    ("var_axis_out_of_range", lambda fd: fd.ops.var(f(fd), [2], 1, False),
     ValueError, r"(?i)axis|axes|dim"),
    ("permute_repeated", lambda fd: fd.ops.permute(f(fd), [0, 0]),
     ValueError, r"(?i)permute|dim"),
    ("permute_missing", lambda fd: fd.ops.permute(f(fd, (-1, -1, -1)), [0, 2]),
     ValueError, r"(?i)permute|dim"),
    ("reshape_count_mismatch", lambda fd: fd.ops.reshape(f(fd, (2, 3)), [4, 2]),
     ValueError, r"(?i)reshape|element|numel|size"),
    ("reshape_early_count_mismatch", lambda fd: fd.ops.reshape(f(fd, (2, 3)), [2, 3], [7]),
     ValueError, r"(?i)reshape|element|numel|size"),
    ("tensor_from_other_definition", _other_fd_tensor,
     ValueError, r"(?i)fusion|definition|belong|other"),
    ("add_output_from_other_definition", _output_from_other_fd,
     ValueError, r"(?i)fusion|definition|belong|other|output"),
    ("add_output_python_int", lambda fd: (f(fd), fd.add_output(5)),
     TypeError, r"(?i)output|tensor|scalar|int"),
    ("broadcast_in_dim_dims_length", lambda fd: fd.ops.broadcast_in_dim(
        f(fd, (-1, -1)), [2, 3, 4], [0]),
     ValueError, r"(?i)broadcast"),
    ("broadcast_in_dim_shape_too_short", lambda fd: fd.ops.broadcast_in_dim(
        f(fd, (-1, -1, -1)), [2, 3], [0, 1, 2]),
     ValueError, r"(?i)broadcast|shape|rank|dim"),
    ("broadcast_flags_vs_rank", lambda fd: fd.ops.broadcast(f(fd, (-1, -1)), [True, False]),
     ValueError, r"(?i)broadcast|rank|dim"),
    ("cat_rank_mismatch", lambda fd: fd.ops.cat([f(fd, (-1, -1)), f(fd, (-1, -1, -1))], 0),
     ValueError, r"(?i)cat|rank|dim"),
    ("cat_dim_out_of_range", lambda fd: fd.ops.cat([f(fd), f(fd)], 2),
     ValueError, r"(?i)cat|dim|axis"),
    ("cast_to_string", lambda fd: fd.ops.cast(f(fd), "half"),
     TypeError, r"(?i)dtype|DataType"),
    ("cast_to_int", lambda fd: fd.ops.cast(f(fd), 3),
     TypeError, r"(?i)dtype|DataType"),
    ("squeeze_static_4", lambda fd: fd.ops.squeeze(f(fd, (4, -1)), [0]),
     ValueError, r"(?i)squeeze|dim|size|broadcast"),
    ("squeeze_dim_out_of_range", lambda fd: fd.ops.squeeze(f(fd, (1, -1)), [3]),
     ValueError, r"(?i)squeeze|dim|axis"),
    ("slice_out_of_bounds", lambda fd: fd.ops.slice(f(fd, (4, 6)), [0, 0], [5, 6]),
     ValueError, r"(?i)slice|bound|end|index|range"),
    ("slice_length_mismatch", lambda fd: fd.ops.slice(f(fd, (4, 6)), [0], [2]),
     ValueError, r"(?i)slice|start|end|indices|rank|dim"),
    ("slice_zero_stride", lambda fd: fd.ops.slice(f(fd, (4, 6)), [0, 0], [4, 6], [0, 1]),
     ValueError, r"(?i)slice|stride|step"),
    ("pad_odd_widths", lambda fd: fd.ops.pad(f(fd), [1, 2, 3]),
     ValueError, r"(?i)pad"),
    ("pad_too_many_widths", lambda fd: fd.ops.pad(f(fd), [1, 1, 1, 1, 1, 1]),
     ValueError, r"(?i)pad"),
    ("expand_wrong_rank", lambda fd: fd.ops.expand(f(fd, (1, -1)), [4, 3, 2]),
     ValueError, r"(?i)expand|shape|rank|dim"),
    ("expand_static_non_1", lambda fd: fd.ops.expand(f(fd, (4, 3)), [5, 3]),
     ValueError, r"(?i)expand|size|shape|dim"),
    ("op_on_string", lambda fd: fd.ops.add(f(fd), "abc"),
     TypeError, r"(?i)str|tensor|scalar|operand|arg"),
    ("unary_on_list", lambda fd: fd.ops.exp([1.0, 2.0]),
     TypeError, r"(?i)list|tensor|scalar|operand|arg"),
    ("bitwise_and_on_floats", lambda fd: fd.ops.bitwise_and(f(fd), f(fd)),
     (TypeError, ValueError), r"(?i)dtype|float|integ|bool|bitwise"),
]


@pytest.mark.parametrize("name,build,exc,pattern", DEF_CASES, ids=[c[0] for c in DEF_CASES])
def test_definition_error(name, build, exc, pattern):
    with pytest.raises(exc, match=pattern), FusionDefinition() as fd:
        build(fd)


def _closed_fd():
    with FusionDefinition() as fd:
        t0 = f(fd)
        fd.add_output(fd.ops.neg(t0))
    return fd, t0


def test_op_after_with_block_closed():
    fd, t0 = _closed_fd()
    with pytest.raises(ValueError, match=r"(?i)closed|finali[sz]ed|definition|with"):
        fd.ops.exp(t0)


def test_add_output_after_with_block_closed():
    fd, t0 = _closed_fd()
    with pytest.raises(ValueError, match=r"(?i)closed|finali[sz]ed|definition|with|output"):
        fd.add_output(t0)


def test_define_tensor_after_with_block_closed():
    fd, _ = _closed_fd()
    with pytest.raises(ValueError, match=r"(?i)closed|finali[sz]ed|definition|with"):
        fd.define_tensor(2)


def test_same_failing_definition_fails_again():
    for _ in range(2):
        with pytest.raises(ValueError, match=r"(?i)axis|axes|dim"):  # noqa: SIM117
            with FusionDefinition() as fd:
                fd.add_output(fd.ops.sum(f(fd), [5]))


# --------------------------------------------------------------------------------------------
# execute time


def two_input_fd(shape0=(-1, -1), shape1=(-1, -1), dtype0=DataType.Float,
                 dtype1=DataType.Float):
    with FusionDefinition() as fd:
        t0, t1 = f(fd, shape0, dtype0), f(fd, shape1, dtype1)
        fd.add_output(fd.ops.add(t0, t1))
    return fd


def scalar_fd():
    with FusionDefinition() as fd:
        t0 = f(fd)
        s = fd.define_scalar(dtype=DataType.Double)
        fd.add_output(fd.ops.mul(t0, s))
    return fd


def test_too_few_inputs():
    with pytest.raises(ValueError, match=r"(?i)input|expected|2"):
        two_input_fd().execute([rand(2, 3)])


def test_too_many_inputs():
    with pytest.raises(ValueError, match=r"(?i)input|expected|2|3"):
        two_input_fd().execute([rand(2, 3), rand(2, 3), rand(2, 3)])


def test_wrong_dtype_input_0():
    with pytest.raises((TypeError, ValueError), match=idx(0)):
        two_input_fd().execute([rand(2, 3, dtype=torch.float64), rand(2, 3)])


def test_wrong_dtype_input_1_names_dtype():
    with pytest.raises((TypeError, ValueError), match=r"(?i)dtype|Half|float16"):
        two_input_fd().execute([rand(2, 3), rand(2, 3, dtype=torch.float16)])
    with pytest.raises((TypeError, ValueError), match=idx(1)):
        two_input_fd().execute([rand(2, 3), rand(2, 3, dtype=torch.float16)])


def test_int_tensor_where_float_expected():
    with pytest.raises((TypeError, ValueError), match=idx(1)):
        two_input_fd().execute([rand(2, 3), torch.randint(0, 5, (2, 3))])


def test_wrong_rank():
    with pytest.raises(ValueError, match=idx(1)):
        two_input_fd().execute([rand(2, 3), rand(2, 3, 4)])
    with pytest.raises(ValueError, match=r"(?i)rank|dim|ndim"):
        two_input_fd().execute([rand(2, 3), rand(2, 3, 4)])


def test_size_3_where_broadcast():
    fd = two_input_fd(shape0=(-1, 1), shape1=(-1, -1))
    (r,) = fd.execute([rand(2, 1, seed=1), rand(2, 3, seed=2)])
    torch.testing.assert_close(r, rand(2, 1, seed=1) + rand(2, 3, seed=2))
    with pytest.raises(ValueError, match=idx(0)):
        fd.execute([rand(2, 3), rand(2, 3)])


def test_size_3_where_static_4():
    fd = two_input_fd(shape0=(4, -1), shape1=(4, -1))
    with pytest.raises(ValueError, match=idx(1)):
        fd.execute([rand(4, 2), rand(3, 2)])
    with pytest.raises(ValueError, match=r"(?i)size|shape|4|3"):
        fd.execute([rand(4, 2), rand(3, 2)])


def test_strides_contradict_contiguity():
    fd = two_input_fd()
    strided = rand(3, 8)[:, ::2]
    with pytest.raises(ValueError, match=idx(0)):
        fd.execute([strided, rand(3, 4)])
    with pytest.raises(ValueError, match=r"(?i)stride|contig"):
        fd.execute([strided, rand(3, 4)])


def test_transposed_input_contradicts_contiguity():
    fd = two_input_fd()
    with pytest.raises(ValueError, match=r"(?i)stride|contig|input 1"):
        fd.execute([rand(3, 4), rand(4, 3).t()])


def test_python_float_where_tensor_expected():
    with pytest.raises(TypeError, match=idx(0)):
        two_input_fd().execute([1.5, rand(2, 3)])


def test_tensor_where_scalar_expected():
    with pytest.raises(TypeError, match=idx(1)):
        scalar_fd().execute([rand(2, 3), rand(2, 3)])


def test_string_input():
    with pytest.raises(TypeError, match=idx(1)):
        scalar_fd().execute([rand(2, 3), "1.5"])


def test_inputs_not_a_list():
    with pytest.raises(TypeError, match=r"(?i)input|list|tuple|sequence"):
        scalar_fd().execute(rand(2, 3))


def test_scalar_fd_runs_after_errors():
    fd = scalar_fd()
    x = rand(2, 3, seed=5)
    with pytest.raises(TypeError):
        fd.execute([x, x])
    (r,) = fd.execute([x, 2.5])
    torch.testing.assert_close(r, x * 2.5)


def test_symbolic_extents_that_disagree():
    with pytest.raises(ValueError, match=r"(?i)size|extent|dim|shape"):
        two_input_fd().execute([rand(2, 3), rand(3, 3)])


def test_static_sizes_from_pytorch_reject_new_shape():
    x = rand(2, 3)
    with FusionDefinition() as fd:
        fd.add_output(fd.ops.neg(fd.from_pytorch(x, static_sizes=True)))
    fd.execute([x])
    with pytest.raises(ValueError, match=idx(0)):
        fd.execute([rand(2, 4)])


def test_reshape_of_runtime_sizes_that_cannot_match():
    with FusionDefinition() as fd:
        fd.add_output(fd.ops.reshape(f(fd), [4, 6]))
    (r,) = fd.execute([rand(2, 12, seed=7)])
    torch.testing.assert_close(r, rand(2, 12, seed=7).reshape(4, 6))
    with pytest.raises(ValueError, match=r"(?i)reshape|element|numel|size"):
        fd.execute([rand(3, 5)])


def test_float_into_int_scalar_input():
    with FusionDefinition() as fd:
        t0 = f(fd)
        fd.add_output(fd.ops.mul(t0, fd.define_scalar(dtype=DataType.Int)))
    with pytest.raises(TypeError, match=idx(1)):
        fd.execute([rand(2, 3), 2.5])


def test_inner_stride_breaks_partial_contiguity():
    with FusionDefinition() as fd:
        t0 = fd.define_tensor(shape=[-1, -1], contiguity=[False, True], dtype=DataType.Float)
        fd.add_output(fd.ops.neg(t0))
    with pytest.raises(ValueError, match=idx(0)):
        fd.execute([rand(3, 8)[:, ::2]])


def test_row_major_input_for_column_major_definition():
    with FusionDefinition() as fd:
        t0 = fd.define_tensor(shape=[-1, -1], contiguity=[True, True], dtype=DataType.Float,
                              stride_order=[0, 1])
        fd.add_output(fd.ops.neg(t0))
    fd.execute([rand(4, 3).t()])
    with pytest.raises(ValueError, match=r"(?i)stride|contig|input 0"):
        fd.execute([rand(3, 4)])


def test_execute_undefined_definition():
    fd = FusionDefinition()
    with pytest.raises(ValueError, match=r"(?i)defin"):
        fd.execute([rand(2, 2)])


def test_nested_with_same_definition():
    fd = FusionDefinition()
    with pytest.raises(ValueError, match=r"(?i)already|defin|open"):  # noqa: SIM117
        with fd:
            with fd:
                pass


def test_execute_on_a_device_other_than_the_inputs_names_the_input():
    # execute(device=...) asks the tensors to be there already, as nvFuser does; a 0-dim
    # CPU tensor (a scalar) may stay on the CPU
    with FusionDefinition() as fd:
        t0 = fd.define_tensor(shape=[-1], contiguity=[True], dtype=DataType.Float)
        s0 = fd.define_tensor(shape=[], contiguity=[], dtype=DataType.Float, is_cpu=True)
        fd.add_output(fd.ops.mul(t0, s0))
    x, s = rand(5, seed=3), torch.tensor(1.5)
    (out,) = fd.execute([x, s], device="cpu")
    assert out.device.type == "cpu"
    torch.testing.assert_close(out, x * 1.5)
    with pytest.raises(ValueError, match=idx(0)) as err:
        fd.execute([x, s], device="meta")
    assert "cpu" in str(err.value) and "meta" in str(err.value)
    with pytest.raises(ValueError, match=r"device='gpu' is not a device"):
        fd.execute([x, s], device="gpu")
