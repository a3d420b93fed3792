"""The persistent kernel store: fusion ids, plans and cubins shared by every process.

    store = open_store()               # or default_store(), process-wide
    fid = store.fusion_id_for(key, records_json, python_definition)
    cubin, compiled_here = store.compile_once(kernel_key, compile_fn)

See store.py for the interface, sql_store.py for the SQLite/PostgreSQL implementation,
memory.py for the in-memory one; the `fusion-cache` commands live in fusion_cache/cli/.
"""
from .entries import (
    BadEntry,
    FusionEntry,
    KernelEntry,
    KernelMeta,
    NewerSchemaError,
    PlanEntry,
    PruneReport,
    StoreError,
    StoreWarning,
    VerifyReport,
)
from .factory import default_store, open_store, reset_default_store
from .memory import MemoryStore
from .sql_store import SqlStore
from .store import Store

__all__ = [
    "BadEntry",
    "FusionEntry",
    "KernelEntry",
    "KernelMeta",
    "MemoryStore",
    "NewerSchemaError",
    "PlanEntry",
    "PruneReport",
    "SqlStore",
    "Store",
    "StoreError",
    "StoreWarning",
    "VerifyReport",
    "default_store",
    "open_store",
    "reset_default_store",
]
