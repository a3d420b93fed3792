"""The store's one way up: the frontend's view of records, for checking a bundle's fusions.

Note [Store upcalls]: a bundle's fusion is taken only if its key is the hash of its records
and those are records the frontend can replay (Note [Bundle trust]). Only the frontend knows
its records and its ops, and the store stands below it, so the store names here what it
needs, and the package root (`fusion_cache/__init__.py`) installs a loader that imports the
frontend's parts on first use, as Note [Runtime interface] does for the runtime.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple


class RecordsCodec(NamedTuple):
    records_from_json: Callable[[str], list]  # raises on anything that is not records
    records_to_json: Callable[[Any], str]  # the canonical text the frontend writes
    definition_key: Callable[[Any], str]  # the key a definition of these records gets
    op_names: frozenset[str]  # what an 'op' record may name: the methods of fd.ops


_loader: Callable[[], RecordsCodec] | None = None
_codec: RecordsCodec | None = None


def install_records_loader(loader: Callable[[], RecordsCodec]) -> None:
    """Called once by the package root: `loader()` imports the frontend's parts."""
    global _loader, _codec
    _loader, _codec = loader, None


def records_codec() -> RecordsCodec:
    """The frontend's records codec; LookupError where no loader is installed."""
    global _codec
    if _codec is None:
        if _loader is None:
            raise LookupError("no frontend installed to check records: import fusion_cache")
        _codec = _loader()
    return _codec
