"""fusion-cache: nvFuser's Python frontend, run as generated CUDA kernels kept in a persistent store.

Scripts written for nvFuser's frontend run by changing the import:
`from nvfuser import FusionDefinition, DataType` -> `from fusion_cache import FusionDefinition, DataType`.

The names below load on first use (PEP 562), so `import fusion_cache` (and the
`fusion-cache` command) costs no torch import until a name that needs it is touched.
"""
from __future__ import annotations

import importlib
from typing import Any

from fusion_cache.frontend import engine as _engine
from fusion_cache.store import upcalls as _upcalls

__version__ = "0.1.0"

# public name -> the module that defines it
_EXPORTS = {
    "DataType": "fusion_cache.frontend.dtypes",
    "Fusion": "fusion_cache.frontend.definition",
    "FusionCache": "fusion_cache.frontend.trie",
    "FusionDefinition": "fusion_cache.frontend.definition",
    "FusionDefinitionError": "fusion_cache.frontend.definition",
    "Scalar": "fusion_cache.frontend.values",
    "Tensor": "fusion_cache.frontend.values",
    "Vector": "fusion_cache.frontend.values",
    "compute_contiguity": "fusion_cache.frontend.layout",
    "compute_tensor_descriptor": "fusion_cache.frontend.layout",
    "from_torchscript": "fusion_cache.frontends",
    "install_as_nvfuser": "fusion_cache.frontend.nvfuser_compat",
    "register_backend": "fusion_cache.frontends",
}


def _load_runtime() -> _engine.Engine:
    """Note [Runtime interface]: the frontend's calls up land in the runtime, loaded here."""
    from fusion_cache.runtime.engine import ENGINE

    return ENGINE


_engine.install_loader(_load_runtime)


def _load_records_codec() -> _upcalls.RecordsCodec:
    """Note [Store upcalls]: what the store asks of the frontend to check a bundle."""
    from fusion_cache.frontend.ops import Operators
    from fusion_cache.frontend.records import records_from_json, records_to_json
    from fusion_cache.frontend.trie import definition_key

    ops = frozenset(n for n in dir(Operators)
                    if not n.startswith("_") and callable(getattr(Operators, n)))  # fmt: skip
    return _upcalls.RecordsCodec(records_from_json, records_to_json, definition_key, ops)


_upcalls.install_records_loader(_load_records_codec)


def version() -> str:
    return __version__


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'fusion_cache' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # later lookups skip __getattr__
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_EXPORTS])


__all__ = [*_EXPORTS, "version"]
