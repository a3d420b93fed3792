"""Reproduction scripts: a definition and inputs of the same shapes, strides, dtypes and
devices as a run's, as runnable Python (`fd.repro_script_for`, `fd.last_repro_script`,
`execute(print_repro=True)`; inputs kept by `execute(save_repro_inputs=True)`)."""
from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from .definition import FusionDefinition


class InputReproducer:
    """What a script needs to make a stand-in for one input: its layout and value range,
    not its data (kept by `save_repro_inputs=True` at the cost of one min/max)."""

    def __init__(self, value: Any) -> None:
        self.is_tensor = isinstance(value, torch.Tensor)
        if not self.is_tensor:
            self.value = value
            return
        self.size = tuple(value.shape)
        self.strides = tuple(value.stride())
        self.dtype = value.dtype
        self.device = value.device
        self.low, self.high = _value_range(value)

    def expression(self) -> str:
        """Python that makes a stand-in for the input."""
        if not self.is_tensor:
            return _python_literal(self.value)
        # a buffer big enough for the strides, viewed with them: expanded (stride-0) and
        # permuted inputs keep their layout
        span = 1 + sum((n - 1) * s for n, s in zip(self.size, self.strides)) if all(self.size) else 0
        if self.dtype.is_floating_point or self.dtype.is_complex:
            make = f"torch.randn({span}, dtype={self.dtype}, device='{self.device}')"
            if self.low is not None and math.isfinite(self.low) and math.isfinite(self.high):
                lo, hi = self.low, self.high
                make = (f"torch.testing.make_tensor(({span},), dtype={self.dtype}, "
                        f"device='{self.device}', low={lo!r}, high={hi!r})") if lo < hi else (
                        f"torch.full(({span},), {lo!r}, dtype={self.dtype}, device='{self.device}')")  # fmt: skip
        elif self.dtype is torch.bool:
            make = f"torch.randint(0, 2, ({span},), device='{self.device}').bool()"
        else:
            lo, hi = (0, 1) if self.low is None else (int(self.low), int(self.high) + 1)
            make = f"torch.randint({lo}, {hi}, ({span},), dtype={self.dtype}, device='{self.device}')"
        return f"{make}.as_strided({self.size}, {self.strides})"


def _value_range(t: torch.Tensor) -> tuple[Any, Any]:
    if t.numel() == 0 or t.dtype is torch.bool or t.is_complex():
        return None, None
    with torch.no_grad():
        x = t.float() if t.dtype.is_floating_point and t.element_size() == 1 else t
        lo, hi = torch.aminmax(x.detach())
    return lo.item(), hi.item()


def _python_literal(value: Any) -> str:
    if isinstance(value, float) and not math.isfinite(value):
        return 'float("nan")' if value != value else ('float("inf")' if value > 0 else 'float("-inf")')
    return repr(value)


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("fusion-cache")
    except PackageNotFoundError:
        return "(not installed)"


def repro_script(fd: FusionDefinition, inputs: Sequence[Any] | None) -> str:
    lines = [
        "# a fusion-cache reproduction script",
        f"# fusion-cache {_version()}, torch {torch.__version__}, CUDA {torch.version.cuda}",
    ]
    if torch.cuda.is_available():
        lines += [f"#  GPU {i}: {torch.cuda.get_device_name(i)}" for i in range(torch.cuda.device_count())]
    lines += ["import torch", "from fusion_cache import DataType, FusionDefinition", "",
              repr(fd).rstrip("\n"), "", "with FusionDefinition() as fd:",
              f"    nvfuser_fusion_id{fd.id()}(fd)"]  # fmt: skip
    if inputs is not None:
        lines += ["", "inputs = ["]
        for value in inputs:
            rep = value if isinstance(value, InputReproducer) else InputReproducer(value)
            lines.append(f"    {rep.expression()},")
        lines += ["]", "fd.execute(inputs)"]
    return "\n".join(lines) + "\n"
