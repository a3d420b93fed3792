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

    def __init__(self, store: Any = None, max_fusions: int = 16384) -> None:
        self.root = TrieNode(None)
        self._lock = threading.RLock()
        self._by_id: dict[int, TrieNode] = {}
        # the fusions users defined (num_fusions); segments' definitions are not among them
        self._user_ids: set[int] = set()
        self.max_fusions = max_fusions
        self.selected_device: int | None = None
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
    def get(cls, max_fusions: int | None = None, selected_device: int | None = None,
            load_from_default_workspace: bool = True) -> FusionCache:  # fmt: skip
        """The process-wide cache. `max_fusions` bounds how many fusions it holds (nvFuser's
        default 16384); `selected_device` is kept for clients that read it back. Fusions
        always load from the persistent store, so load_from_default_workspace=False only
        means nothing beyond that."""
        inst = cls._singleton
        if inst is None:
            with cls._singleton_lock:
                if cls._singleton is None:
                    cls._singleton = cls(max_fusions=16384 if max_fusions is None else max_fusions)
                inst = cls._singleton
        if max_fusions is not None:
            if isinstance(max_fusions, bool) or not isinstance(max_fusions, int) or max_fusions < 1:
                raise ValueError(f"FusionCache.get: max_fusions must be a positive int, got {max_fusions!r}")
            if max_fusions < inst.num_fusions():
                raise ValueError("The max fusions is set less than the number of fusions in the "
                                 f"cache ({max_fusions} < {inst.num_fusions()}).")  # fmt: skip
            inst.max_fusions = max_fusions
        if selected_device is not None:
            inst.selected_device = selected_device
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

    def finalize(self, node: TrieNode, records: tuple[Record, ...], python_text: Any,
                 counted: bool = True) -> int:  # fmt: skip
        """Give the end node its fusion id (from the store) and remember the path. `counted`:
        a user's definition (num_fusions), not a segment's."""
        if node.fusion_id is not None:
            if counted and node.fusion_id not in self._user_ids:
                self._count_user(node.fusion_id)
            return node.fusion_id
        with self._lock:
            if counted and len(self._user_ids) >= self.max_fusions:
                self._count_user(-1)  # raises
            if node.fusion_id is None:
                text = records_to_json(records)
                fid = self.store.fusion_id_for(
                    hashlib.sha256(text.encode()).hexdigest(), text, python_text()
                )
                node.records = records
                node.fusion_id = fid
                self._by_id[fid] = node
            if counted:
                self._count_user(node.fusion_id)
            return node.fusion_id

    def _count_user(self, fid: int) -> None:
        with self._lock:
            if fid not in self._user_ids and len(self._user_ids) >= self.max_fusions:
                raise RuntimeError(
                    f"The number of fusions in nvfuser has exceeded {self.max_fusions} fusions. "
                    "The max_fusions for the FusionCache might need to be increased if the max "
                    "number is not being exceeded due to an error "
                    "(FusionCache.get(max_fusions=...))."
                )
            self._user_ids.add(fid)

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
        """The fusions users defined, not the segments made from them."""
        return len(self._user_ids)

    # ---- nvFuser's serialization, as the store's bundles ------------------------------------

    def serialize(self, filename: str) -> None:
        """Write this cache's fusions, with their plans and kernels, to a bundle file (the
        store keeps them anyway; this is for moving them to another store)."""
        from fusion_cache.store.bundle import export_bundle

        export_bundle(self.store, filename, fusion_ids=set(self._user_ids))

    def deserialize(self, filename: str) -> None:
        """Merge a bundle written by serialize (or `fusion-cache export`) into the store and
        walk its fusions into this cache, so that defining one again finds it."""
        import json
        import zipfile

        from fusion_cache.store.bundle import MANIFEST, import_bundle

        from .records import END

        import_bundle(self.store, filename)
        with zipfile.ZipFile(filename) as zf:
            fusions = json.loads(zf.read(MANIFEST))["fusions"]
        for f in fusions:
            records = tuple(records_from_json(f["records_json"]))
            node = self.root
            for r in records:
                node = self.step(node, r)
            node = self.step(node, END)
            self.finalize(node, records, lambda f=f: f["python_definition"])

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
