"""The persistent kernel store: fusion ids, plans and cubins shared by every process.

    store = open_store()               # or default_store(), process-wide
    fid = store.fusion_id_for(key, records_json, python_definition)
    cubin, compiled_here = store.compile_once(kernel_key, compile_fn)

See store.py for the interface, sql_store.py for the SQLite/PostgreSQL implementation,
memory.py for the in-memory one; the `fusion-cache` commands live in fusion_cache/cli/.
The names below load on first use (PEP 562): importing one small module of the store (the
kernel key, the upcalls) loads no database code.
"""
from __future__ import annotations

import importlib
from typing import Any

# public name -> the module that defines it
_EXPORTS = {
    **dict.fromkeys(["BadEntry", "FusionEntry", "KernelEntry", "KernelMeta", "NewerSchemaError",
                     "PlanEntry", "PruneReport", "StoreError", "StoreWarning", "VerifyReport"],
                    "fusion_cache.store.entries"),
    **dict.fromkeys(["default_store", "open_store", "reset_default_store"],
                    "fusion_cache.store.factory"),
    "MemoryStore": "fusion_cache.store.memory",
    "SqlStore": "fusion_cache.store.sql_store",
    "Store": "fusion_cache.store.store",
}  # fmt: skip

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        # a submodule reached as an attribute (fusion_cache.store.migrate, say)
        try:
            return importlib.import_module(f"{__name__}.{name}")
        except ModuleNotFoundError:
            raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # later lookups skip __getattr__
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_EXPORTS])
