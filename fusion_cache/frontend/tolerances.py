"""Tolerances for `fd.validate`: by dtype, widened where a reduction sums many terms."""
from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch

# (atol, rtol) per result dtype, about torch.testing's defaults
_BASE = {
    torch.float64: (1e-7, 1e-7),
    torch.float32: (1e-5, 1.3e-6),
    torch.float16: (1e-3, 1e-3),
    torch.bfloat16: (1e-2, 1.6e-2),
    torch.complex64: (1e-5, 1.3e-6),
    torch.complex128: (1e-7, 1e-7),
}


def _largest_reduction(fd: Any, inputs: Sequence[Any]) -> int:
    """Elements summed by the fusion's largest reduction (1 without one), from the input
    that has the most elements: a bound, not an exact count."""
    if not any(r.kind == "op" and r.name in ("sum", "prod", "var", "var_mean", "welford",
                                             "batch_norm") for r in fd._records):  # fmt: skip
        return 1
    return max((v.numel() for v in inputs if isinstance(v, torch.Tensor)), default=1)


def check_outputs(fd: Any, outputs: list, references: list, inputs: Sequence[Any]) -> None:
    if len(outputs) != len(references):
        raise AssertionError(f"Expected {len(outputs)} reference outputs for validation, "
                             f"got {len(references)}")  # fmt: skip
    widen = math.sqrt(_largest_reduction(fd, inputs))
    for i, (out, ref) in enumerate(zip(outputs, references)):
        ref = torch.as_tensor(ref).to(out.device)
        if tuple(out.shape) != tuple(ref.shape):
            raise AssertionError(f"output {i}: Mismatch in reference and fusion output dimensions "
                                 f"{list(out.shape)} vs {list(ref.shape)}")  # fmt: skip
        if out.is_floating_point() or out.is_complex():
            atol, rtol = _BASE.get(out.dtype, (1e-5, 1.3e-6))
            torch.testing.assert_close(out, ref.to(out.dtype), atol=atol * widen, rtol=rtol,
                                       equal_nan=True, msg=lambda m, i=i: f"output {i}: {m}")  # fmt: skip
        elif not torch.equal(out, ref.to(out.dtype)):
            raise AssertionError(f"output {i}: Mismatch in reference and fusion output values, "
                                 "datatype is not float/complex.")  # fmt: skip
