"""Execute-time checks: each input against what the definition declared, with errors that
name the input index, its state name and what was expected."""
from __future__ import annotations

import numbers
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch

from .dtypes import DataType, from_torch, is_complex, is_float
from .values import ScalarInfo, TensorInfo, VectorInfo

if TYPE_CHECKING:
    from .definition import FusionDefinition


def validate_inputs(fd: FusionDefinition, inputs: Sequence[Any],
                    caller: str = "execute") -> list[Any]:  # fmt: skip
    """`caller` (execute, precompile, segment) names the call in the messages."""
    if isinstance(inputs, torch.Tensor) or not isinstance(inputs, (list, tuple)):
        raise TypeError(
            f"{caller}: inputs must be a list or tuple of tensors and scalars, got {type(inputs).__name__}"
        )
    refs = fd.input_refs()
    if len(inputs) != len(refs):
        raise ValueError(
            f"{caller}: fusion {fd._fid} expects {len(refs)} inputs "
            f"({', '.join(str(r) for r in refs)}), got {len(inputs)}"
        )
    out = []
    for i, (ref, value) in enumerate(zip(refs, inputs)):
        info = fd._infos[ref.index]
        where = f"input {i} ({ref})"
        if isinstance(info, TensorInfo):
            out.append(_check_tensor(where, info, value))
        elif isinstance(info, ScalarInfo):
            out.append(_check_scalar(where, info, value))
        else:
            out.append(_check_vector(where, info, value))
    return out


def _check_tensor(where: str, info: TensorInfo, value: Any) -> torch.Tensor:
    if not isinstance(value, torch.Tensor):
        raise TypeError(f"{where} must be a tensor, got {type(value).__name__} {value!r:.40}")
    try:
        dtype = from_torch(value.dtype)
    except TypeError:
        raise TypeError(f"{where} has unsupported dtype {value.dtype}") from None
    if dtype is not info.dtype:
        raise TypeError(f"{where} has dtype {dtype!r} ({value.dtype}), the definition expects {info.dtype!r}")
    if value.dim() != info.ndim:
        raise ValueError(
            f"{where} has {value.dim()} dims (shape {list(value.shape)}), the definition expects {info.ndim}"
        )
    sizes, strides = value.shape, value.stride()
    for d, (code, size) in enumerate(zip(info.shape, sizes)):
        if code == 1 and size != 1:
            raise ValueError(f"{where}: dim {d} has size {size} but the definition declares it a broadcast dim (size 1)")
        if code not in (-1, 1) and size != code:
            raise ValueError(f"{where}: dim {d} has size {size} but the definition declares static size {code}")
    if info.contiguity is not None and value.numel() > 1:
        _check_strides(where, info, sizes, strides)
    return value


def _check_strides(where: str, info: TensorInfo, sizes, strides) -> None:
    n = info.ndim
    order = info.stride_order or tuple(range(n - 1, -1, -1))
    inner_to_outer = sorted(range(n), key=lambda d: order[d])
    expected = 1
    for d in inner_to_outer:
        if sizes[d] == 1:
            continue  # any stride describes a size-1 dim
        if info.contiguity[d] is None:
            # an expanded broadcast: one element read for every index along the dim
            if strides[d] != 0:
                raise ValueError(
                    f"{where}: dim {d} is declared an expanded broadcast (contiguity None, "
                    f"size {sizes[d]}) but has stride {strides[d]}, not 0; strides are "
                    f"{list(strides)}"
                )
            continue
        if info.contiguity[d] and strides[d] != expected:
            raise ValueError(
                f"{where}: dim {d} has stride {strides[d]} but the declared contiguity "
                f"(per dim {list(info.contiguity)}, stride order {list(order)}) needs "
                f"{expected}; strides are {list(strides)}"
            )
        expected = strides[d] * sizes[d]


def _check_scalar(where: str, info: ScalarInfo, value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        if value.dim() == 0 and value.device.type == "cpu":
            value = value.item()
        else:
            raise TypeError(f"{where} must be a Python scalar of {info.dtype!r}, got a tensor of shape {list(value.shape)}")
    if not isinstance(value, numbers.Number):
        raise TypeError(f"{where} must be a Python scalar of {info.dtype!r}, got {type(value).__name__}")
    dt = info.dtype
    if dt is DataType.Bool:
        if not isinstance(value, (bool, int)) or value not in (0, 1):
            raise TypeError(f"{where} must be a bool, got {value!r}")
        return bool(value)
    if dt in (DataType.Int, DataType.Int32, DataType.UInt64):
        if not isinstance(value, numbers.Integral):
            raise TypeError(f"{where} must be an int, got {type(value).__name__} {value!r}")
        return int(value)
    if is_float(dt):
        if isinstance(value, numbers.Complex) and not isinstance(value, numbers.Real):
            raise TypeError(f"{where} must be a real number, got {value!r}")
        return float(value)
    if is_complex(dt):
        return complex(value)
    raise TypeError(f"{where}: unsupported scalar dtype {dt!r}")


def _check_vector(where: str, info: VectorInfo, value: Any) -> tuple[int, ...]:
    if isinstance(value, torch.Tensor) or not isinstance(value, (list, tuple, torch.Size)):
        raise TypeError(f"{where} must be a list of {info.size} ints, got {type(value).__name__}")
    if len(value) != info.size:
        raise ValueError(f"{where} must have {info.size} entries, got {len(value)}")
    for k, v in enumerate(value):
        if isinstance(v, bool) or not isinstance(v, numbers.Integral):
            raise TypeError(f"{where}[{k}] must be an int, got {v!r}")
    return tuple(int(v) for v in value)
