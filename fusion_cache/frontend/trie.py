"""FusionCache: the trie of records that maps a definition to its fusion id.

Note [Trie walk]: each frontend call appends a record and steps a cursor from the current
node to the child holding an equal record, creating it (under the lock, after a re-check)
on a miss. The end record's node holds the fusion id. A record whose checks failed keeps
its error on its node, so defining the same thing again raises the same error at once.
Ids come from the store (`fusion_id_for`), so every process sharing a store agrees on them.
"""
from __future__ import annotations

import hashlib
import threading
from dataclasses import dataclass, field
from typing import Any

from .records import Record, records_from_json, records_to_json


@dataclass(eq=False)
class TrieNode:
    record: Record | None
    children: dict[Record, TrieNode] = field(default_factory=dict)
    error: tuple[type, str] | None = None
    fusion_id: int | None = None
    records: tuple[Record, ...] = ()  # the whole path, on end nodes


def definition_key(records: tuple[Record, ...] | list[Record]) -> str:
    """The store's key for a definition: sha256 of its canonical records."""
    return hashlib.sha256(records_to_json(records).encode()).hexdigest()


class FusionCache:
    """Process-wide trie of definitions plus the counters `stats()` reports."""

    _singleton: FusionCache | None = None
    _singleton_lock = threading.Lock()

    def __init__(self, store: Any = None) -> None:
        self.root = TrieNode(None)
        self._lock = threading.RLock()
        self._by_id: dict[int, TrieNode] = {}
        self._store = store
        self.executors: dict[int, Any] = {}  # fusion id -> GPU executor (gpu_runtime)
        self.counters: dict[str, int] = {
            "trie_hits": 0,
            "trie_misses": 0,
            "kernels_compiled": 0,
            "kernels_loaded": 0,
            "plan_cache_hits": 0,
            "plan_cache_misses": 0,
            "reference_runs": 0,
            "kernel_launches": 0,
            "segmented_runs": 0,
        }

    # ---- the process-wide instance ----------------------------------------------------

    @classmethod
    def get(cls) -> FusionCache:
        inst = cls._singleton
        if inst is None:
            with cls._singleton_lock:
                if cls._singleton is None:
                    cls._singleton = cls()
                inst = cls._singleton
        return inst

    @classmethod
    def reset(cls) -> None:
        """Forget the in-memory trie and reopen the store from the environment next time."""
        with cls._singleton_lock:
            cls._singleton = None
        try:
            from fusion_cache.store import reset_default_store
        except ImportError:  # store not built in this checkout
            return
        reset_default_store()

    @property
    def store(self) -> Any:
        if self._store is None:
            try:
                from fusion_cache.store import default_store
            except ImportError:  # a checkout without the store: ids live in this process
                from fusion_cache.store.memory import MemoryStore

                self._store = MemoryStore()
            else:
                self._store = default_store()
        return self._store

    # ---- the walk -----------------------------------------------------------------------

    def step(self, node: TrieNode, record: Record) -> TrieNode:
        child = node.children.get(record)
        if child is not None:
            self._count("trie_hits")
            return child
        with self._lock:
            child = node.children.get(record)
            if child is None:
                child = TrieNode(record)
                node.children[record] = child
                self.counters["trie_misses"] += 1
            else:
                self.counters["trie_hits"] += 1
            return child

    def set_error(self, node: TrieNode, error: BaseException) -> None:
        with self._lock:
            node.error = (type(error), str(error))

    def finalize(self, node: TrieNode, records: tuple[Record, ...], python_text: Any) -> int:
        """Give the end node its fusion id (from the store) and remember the path."""
        if node.fusion_id is not None:
            return node.fusion_id
        with self._lock:
            if node.fusion_id is None:
                fid = self.store.fusion_id_for(
                    definition_key(records), records_to_json(records), python_text()
                )
                node.records = records
                node.fusion_id = fid
                self._by_id[fid] = node
            return node.fusion_id

    def records_for(self, fid: int) -> tuple[Record, ...]:
        node = self._by_id.get(fid)
        if node is not None:
            return node.records
        entry = self.store.fusion_by_id(fid)
        if entry is None:
            # the store's ids, not only this process's: another process may have defined them
            known = sorted({f.id for f in self.store.fusions()} | set(self._by_id))
            raise ValueError(
                f"fusion id {fid} is not in this cache or its store ({self.store.url}); "
                f"ids in the store: {known[:20]}{' ...' if len(known) > 20 else ''}"
            )
        return tuple(records_from_json(entry.records_json))

    # ---- reporting ------------------------------------------------------------------------

    def _count(self, name: str, n: int = 1) -> None:
        # racy increments are fine for statistics; the lock guards structure only
        self.counters[name] = self.counters.get(name, 0) + n

    def num_fusions(self) -> int:
        return len(self._by_id)

    def stats(self) -> dict[str, Any]:
        out: dict[str, Any] = {"num_fusions": self.num_fusions()}
        out.update(self.counters)
        return out

    def __repr__(self) -> str:
        lines = [f"FusionCache: {self.num_fusions()} fusions"]
        for fid in sorted(self._by_id):
            lines.append(f"  fusion {fid}: {len(self._by_id[fid].records)} records")
        stats = ", ".join(f"{k}={v}" for k, v in self.stats().items())
        lines.append(f"  stats: {stats}")
        return "\n".join(lines)

    def print(self) -> None:
        print(repr(self))
