"""MemoryStore: the Store semantics in dicts, for one process and its threads.

It is what open_store returns when the persistent store is unusable, what
FUSION_CACHE_DB_URL=memory:// asks for, and the overlay in which an SqlStore keeps the
entries it failed to write (Note [Degrade, never crash]).
"""
from __future__ import annotations

import hashlib
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from typing import TYPE_CHECKING

from .entries import (
    BadEntry,
    FusionEntry,
    KernelEntry,
    KernelMeta,
    PlanEntry,
    PruneReport,
    VerifyReport,
    check_kernel_args,
    choose_prunable,
    kernel_entry,
)
from .location import MEMORY_URL
from .store import Store

if TYPE_CHECKING:
    from .bundle import BundleContents


class MemoryStore(Store):
    persistent = False

    def __init__(self, reason: str | None = None, id_base: int = 0) -> None:
        super().__init__()
        self.url = MEMORY_URL
        self.reason = reason  # why the persistent store was not used, if it was wanted
        self._lock = threading.RLock()
        self._ids: dict[str, int] = {}
        self._fusions: dict[int, FusionEntry] = {}
        self._next_id = id_base
        self._plans: dict[tuple[int, str, str], PlanEntry] = {}
        self._kernels: dict[str, tuple[bytes, KernelEntry]] = {}
        self._links: set[tuple[int, str]] = set()
        self._key_locks: dict[str, threading.Lock] = {}

    def __len__(self) -> int:
        return len(self._fusions) + len(self._plans) + len(self._kernels) + len(self._links)

    def has_fusion(self, fid: int) -> bool:
        return fid in self._fusions

    def fusion_id_for(self, definition_key: str, records_json: str, python_definition: str) -> int:
        with self._lock:
            fid = self._ids.get(definition_key)
            if fid is None:
                fid, self._next_id = self._next_id, self._next_id + 1
                self._ids[definition_key] = fid
                self._fusions[fid] = FusionEntry(
                    fid, definition_key, records_json, python_definition, time.time()
                )
            return fid

    def fusion_by_id(self, fid: int) -> FusionEntry | None:
        return self._fusions.get(fid)

    def fusions(self) -> list[FusionEntry]:
        with self._lock:
            return sorted(self._fusions.values(), key=lambda f: f.id)

    def get_plan(self, fusion_id: int, signature_key: str, target: str) -> str | None:
        entry = self._plans.get((fusion_id, signature_key, target))
        return entry.plan_json if entry else None

    def put_plan(self, fusion_id: int, signature_key: str, target: str, plan_json: str) -> None:
        with self._lock:
            key = (fusion_id, signature_key, target)
            old = self._plans.get(key)
            if old is None or old.plan_json != plan_json:
                self._plans[key] = PlanEntry(
                    fusion_id, signature_key, target, plan_json, time.time()
                )

    def plans_for(self, fusion_id: int) -> list[PlanEntry]:
        with self._lock:
            found = [p for (fid, _, _), p in self._plans.items() if fid == fusion_id]
        return sorted(found, key=lambda p: (p.signature_key, p.target))

    def _verified(self, key: str) -> bytes | None:
        item = self._kernels.get(key)
        if item is None:
            return None
        data, entry = item
        if hashlib.sha256(data).hexdigest() != entry.sha256:
            self._kernels.pop(key, None)
            return None
        return data

    def get_kernel(self, key: str) -> bytes | None:
        with self._lock:
            data = self._verified(key)
            if data is not None:
                _, entry = self._kernels[key]
                used = replace(entry, hits=entry.hits + 1, last_used=time.time())
                self._kernels[key] = (data, used)
            return data

    def kernel_bytes(self, key: str) -> bytes | None:
        with self._lock:
            return self._verified(key)

    def put_kernel(self, key: str, cubin: bytes, meta: KernelMeta) -> None:
        check_kernel_args(key, cubin, meta)
        with self._lock:
            if self._verified(key) is not None:
                return
            now = time.time()
            self._kernels[key] = (bytes(cubin), kernel_entry(key, cubin, meta, now))

    def kernel_meta(self, key: str) -> KernelEntry | None:
        item = self._kernels.get(key)
        return item[1] if item else None

    def kernels(self, fusion_id: int | None = None) -> list[KernelEntry]:
        with self._lock:
            entries = [e for _, e in self._kernels.values()]
            if fusion_id is not None:
                linked = {k for fid, k in self._links if fid == fusion_id}
                entries = [e for e in entries if e.key in linked]
        return sorted(entries, key=lambda e: e.key)

    def link_kernel(self, fusion_id: int, key: str) -> None:
        with self._lock:
            self._links.add((fusion_id, key))

    def links(self) -> list[tuple[int, str]]:
        with self._lock:
            return sorted(self._links)

    def import_entries(self, bundle: BundleContents) -> int:
        cubins = {k.key: bundle.cubin(k) for k in bundle.kernels}  # checked before any change
        with self._lock:
            ids = {f.id: self.fusion_id_for(f.definition_key, f.records_json,
                                            f.python_definition) for f in bundle.fusions}  # fmt: skip
            for p in bundle.plans:
                self.put_plan(ids[p.fusion_id], p.signature_key, p.target, p.plan_json)
            for k in bundle.kernels:
                self.put_kernel(k.key, cubins[k.key], k.meta)
            for fid, key in bundle.links:
                self.link_kernel(ids[fid], key)
        return bundle.entries

    def verify(self, repair: bool = False) -> VerifyReport:
        with self._lock:
            bad = []
            for key, (data, entry) in list(self._kernels.items()):
                if hashlib.sha256(data).hexdigest() != entry.sha256:
                    bad.append(BadEntry(key, "memory", "sha256 mismatch"))
                    if repair:
                        del self._kernels[key]
            # reason: a persistent store was asked for and could not be opened
            return VerifyReport(len(self._kernels), tuple(bad), len(bad) if repair else 0,
                                unusable=self.reason)

    def prune(
        self, max_age_days: float | None = None, max_bytes: int | None = None
    ) -> PruneReport:
        with self._lock:
            entries = sorted((e for _, e in self._kernels.values()), key=lambda e: e.last_used)
            doomed = choose_prunable(entries, max_age_days, max_bytes, time.time())
            for e in doomed:
                del self._kernels[e.key]
            kept = [e for _, e in self._kernels.values()]
            return PruneReport(
                len(doomed),
                sum(e.size for e in doomed),
                len(kept),
                sum(e.size for e in kept),
            )

    def stats(self) -> dict:
        with self._lock:
            return {
                "url": self.url,
                "persistent": False,
                "reason": self.reason,
                "schema_revision": None,
                "fusions": len(self._fusions),
                "plans": len(self._plans),
                "kernels": len(self._kernels),
                "kernel_bytes": sum(e.size for _, e in self._kernels.values()),
                "links": sum(key in self._kernels for _, key in self._links),
                "hits": sum(e.hits for _, e in self._kernels.values()),
            }

    def close(self) -> None:
        pass

    @contextmanager
    def _kernel_lock(self, key: str, timeout_s: float) -> Iterator[bool]:
        with self._lock:
            lock = self._key_locks.setdefault(key, threading.Lock())
        held = lock.acquire(timeout=max(0.0, timeout_s))
        try:
            yield held
        finally:
            if held:
                lock.release()
