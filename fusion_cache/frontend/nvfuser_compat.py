"""The route in for clients that `import nvfuser`: after `install_as_nvfuser()`, the module
`nvfuser` and the submodules its clients import are this project.

Note [nvFuser API level]: clients gate what they call on `nvfuser.version()`. Lightning
Thunder 0.2.6 speaks the legacy frontend (`nvfuser.FusionDefinition`) for versions in
[0.2.23, 0.2.28) and the direct bindings (`nvfuser_direct`) from 0.2.28 on, so the route in
reports the last legacy level, NVFUSER_API_LEVEL, while `fusion_cache.version()` stays the
project's own version. `nvfuser_direct` is hidden (importing it raises ImportError): a
client that finds it would take the direct-bindings path, which this project does not speak.
"""
from __future__ import annotations

import sys
import types
from typing import Any

NVFUSER_API_LEVEL = "0.2.27"


class NvfuserVersion(str):
    """A version string that compares as a version ('0.2.27' > '0.2.9'), as nvFuser's does;
    a local part ('+git...') is ignored."""

    @staticmethod
    def _key(value: Any) -> tuple[int, ...]:
        text = str(value).split("+")[0]
        parts = []
        for piece in text.split("."):
            digits = "".join(ch for ch in piece if ch.isdigit())
            parts.append(int(digits) if digits else 0)
        while len(parts) > 1 and parts[-1] == 0:
            parts.pop()
        return tuple(parts)

    def __lt__(self, other: Any) -> bool:
        return self._key(self) < self._key(other)

    def __le__(self, other: Any) -> bool:
        return self._key(self) <= self._key(other)

    def __gt__(self, other: Any) -> bool:
        return self._key(self) > self._key(other)

    def __ge__(self, other: Any) -> bool:
        return self._key(self) >= self._key(other)

    def __eq__(self, other: Any) -> bool:
        return self._key(self) == self._key(other)

    def __ne__(self, other: Any) -> bool:
        return not self == other

    __hash__ = str.__hash__


def nvfuser_version() -> NvfuserVersion:
    """`nvfuser.version()` under the route in (Note [nvFuser API level])."""
    return NvfuserVersion(NVFUSER_API_LEVEL)


# ---- nvfuser.pytorch_utils ------------------------------------------------------------------


def torch_dtype_to_nvfuser_dtype(dtype: Any) -> Any:
    """torch dtype (or the Python types bool/int/float/complex) -> DataType."""
    from .dtypes import DataType, from_torch

    python_types = {bool: DataType.Bool, int: DataType.Int, float: DataType.Double,
                    complex: DataType.ComplexDouble}  # fmt: skip
    if dtype in python_types:
        return python_types[dtype]
    return from_torch(dtype)


def python_scalar_to_nvfuser_dtype(value: Any) -> Any:
    return torch_dtype_to_nvfuser_dtype(type(value))


def _device_properties() -> dict | None:
    """nvFuser's DEVICE_PROPERTIES, from torch's view of the current GPU (None without one)."""
    import torch

    if not torch.cuda.is_available():
        return None
    props = torch.cuda.get_device_properties(torch.cuda.current_device())
    return {
        "gpu_name": props.name,
        "gpu_compute_capability_major": props.major,
        "gpu_compute_capability_minor": props.minor,
        "gpu_gmem_bytes": props.total_memory,
        "gpu_sm_count": props.multi_processor_count,
        "gpu_l2_bytes": getattr(props, "L2_cache_size", 0),
        "gpu_max_threads_per_sm": getattr(props, "max_threads_per_multi_processor", 0),
        "gpu_regs_per_block": getattr(props, "regs_per_multiprocessor", 0),
    }


def _lazy_device_properties(name: str) -> Any:
    if name == "DEVICE_PROPERTIES":
        return _device_properties()
    raise AttributeError(f"module 'nvfuser.pytorch_utils' has no attribute {name!r}")


# ---- the modules ----------------------------------------------------------------------------


def _names() -> dict[str, Any]:
    """What `nvfuser` (and `nvfuser._C`, its bindings module) export here."""
    from .definition import FusionDefinition
    from .dtypes import DataType
    from .layout import compute_contiguity, compute_tensor_descriptor
    from .trie import FusionCache
    from .values import Scalar, Tensor, Vector

    return {
        "FusionDefinition": FusionDefinition,
        "_FusionDefinition": FusionDefinition,
        "FusionCache": FusionCache,
        "DataType": DataType,
        "Tensor": Tensor,
        "Scalar": Scalar,
        "Vector": Vector,
        "compute_contiguity": compute_contiguity,
        "compute_tensor_descriptor": compute_tensor_descriptor,
        "version": nvfuser_version,
        "__version__": nvfuser_version(),
    }


def _module(name: str, doc: str, attrs: dict[str, Any]) -> types.ModuleType:
    mod = types.ModuleType(name, doc)
    mod.__dict__.update(attrs)
    mod.__fusion_cache__ = True  # how install_as_nvfuser recognises its own modules
    return mod


def _build_modules() -> dict[str, types.ModuleType]:
    names = _names()
    c_mod = _module("nvfuser._C", "fusion-cache standing in for nvFuser's bindings.", dict(names))
    utils = _module("nvfuser.pytorch_utils", "dtype helpers, as in nvFuser.", {
        "torch_dtype_to_nvfuser_dtype": torch_dtype_to_nvfuser_dtype,
        "python_scalar_to_nvfuser_dtype": python_scalar_to_nvfuser_dtype,
        "DataType": names["DataType"],
        "__getattr__": _lazy_device_properties,  # CUDA is not touched until it is read
    })  # fmt: skip
    version_mod = _module("nvfuser.nvfuser_version", "nvFuser's version type.", {
        "NvfuserVersion": NvfuserVersion, "Version": NvfuserVersion,
        "__version__": nvfuser_version(),
    })  # fmt: skip
    root = _module("nvfuser", "fusion-cache, installed as nvfuser (install_as_nvfuser).", {
        **names, "_C": c_mod, "pytorch_utils": utils, "nvfuser_version": version_mod,
        "__path__": [],  # a package, so `import nvfuser.<sub>` looks in sys.modules
    })  # fmt: skip
    return {"nvfuser": root, "nvfuser._C": c_mod, "nvfuser.pytorch_utils": utils,
            "nvfuser.nvfuser_version": version_mod}  # fmt: skip


def install_as_nvfuser(hide_nvfuser_direct: bool = True) -> types.ModuleType:
    """Make `import nvfuser` (and `nvfuser._C`, `nvfuser.pytorch_utils`,
    `nvfuser.nvfuser_version`) resolve to this project; returns the `nvfuser` module.

    Call it before anything imports nvfuser (Thunder reads nvfuser when `thunder` is
    imported). Calling it again is harmless. An nvFuser already imported is an error rather
    than something replaced under its users' feet."""
    present = sys.modules.get("nvfuser")
    if present is not None and not getattr(present, "__fusion_cache__", False):
        raise RuntimeError(
            "install_as_nvfuser: a real nvfuser is already imported "
            f"({getattr(present, '__file__', present)!r}); call fusion_cache.install_as_nvfuser() "
            "before anything imports nvfuser (for Thunder: before `import thunder`)"
        )
    if present is None:
        sys.modules.update(_build_modules())
    if hide_nvfuser_direct:
        direct = sys.modules.get("nvfuser_direct", None)
        if direct is not None:
            raise RuntimeError(
                "install_as_nvfuser: nvfuser_direct is already imported; a client would use it "
                "instead of fusion-cache. Call install_as_nvfuser() first"
            )
        sys.modules["nvfuser_direct"] = None  # type: ignore[assignment]  # import -> ImportError
    return sys.modules["nvfuser"]
