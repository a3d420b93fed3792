"""SqlStore: the persistent store (SQLite or PostgreSQL, plus the node-local blob tier).

Every public method either works or degrades (Note [Degrade, never crash] in store.py): its
database work runs through `_guard`, which on an error warns once and falls back to the
in-memory overlay. Overlay fusion ids start at OVERLAY_ID_BASE so they can never collide
with the database's ids, and anything keyed by such an id stays in memory.

Note [Hit counting]
    get_kernel is the hot path (a warm process loads every kernel through it), so hits and
    last-use times are gathered in memory and written in one transaction every few seconds,
    at close() and at exit, not once per hit. A killed process loses at most those counts.
"""
from __future__ import annotations

import atexit
import dataclasses
import hashlib
import logging
import os
import threading
import time
import warnings
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TypeVar

from sqlalchemy import Engine, and_, bindparam, delete, func, select, update

from . import migrate
from .blobs import BlobTier
from .engine import (
    Location,
    create_store_engine,
    display_url,
    insert_ignore,
    lock_fusion_ids,
    probe_writable,
    upsert,
    write_transaction,
)
from .entries import (
    FusionEntry,
    KernelEntry,
    KernelMeta,
    PlanEntry,
    PruneReport,
    StoreWarning,
    VerifyReport,
    check_kernel_args,
    choose_prunable,
    kernel_entry,
    options_from_json,
    options_to_json,
)
from .locks import FileLock, kernel_lock_path
from .memory import MemoryStore
from .models import fusion_kernels, fusions, kernels, plans
from .store import Store, iter_chunks

log = logging.getLogger("fusion_cache.store")

OVERLAY_ID_BASE = 1 << 40
HIT_FLUSH_S = 2.0
HIT_FLUSH_COUNT = 512

T = TypeVar("T")


class SqlStore(Store):
    persistent = True

    def __init__(self, loc: Location, engine: Engine, timeout_s: float, revision: str,
                 local_dir: bool = True) -> None:  # fmt: skip
        super().__init__()
        self.location = loc
        self.url = display_url(loc.url)
        self.cache_dir = loc.cache_dir
        self.revision = revision
        self._engine = engine
        self._timeout = timeout_s
        self._pid = os.getpid()
        self._local_dir = local_dir  # False: no cubin tier, no compile locks (a server store)
        self._blobs = BlobTier(loc.cache_dir / "blobs", timeout_s, usable=local_dir)
        self._mem = MemoryStore(id_base=OVERLAY_ID_BASE)
        self._ids: dict[str, int] = {}  # ids never change, so this cache never goes stale
        self._hits: dict[str, tuple[int, float]] = {}
        self._hits_lock = threading.Lock()
        self._last_flush = time.monotonic()
        self._closed = False
        atexit.register(_flush_at_exit, weakref.ref(self))

    @classmethod
    def open(cls, loc: Location, timeout_s: float) -> SqlStore:
        """Create the directory, migrate (Note [Serialised migrations]), check we can write.
        Raises on any problem; open_store turns that into a MemoryStore."""
        local_dir = True
        try:
            loc.cache_dir.mkdir(parents=True, exist_ok=True)
        except OSError as err:
            local_dir = False
            if loc.db_path is not None:
                raise  # SQLite's file lives there
            # a server store needs the directory only for its node-local cubin tier and
            # compile locks, both best-effort: keep the server rather than degrade to memory
            warnings.warn(f"fusion-cache: the node-local directory {loc.cache_dir} is unusable "
                          f"({type(err).__name__}: {err}); the store at {display_url(loc.url)} "
                          "works without its cubin tier and compile locks", StoreWarning,
                          stacklevel=3)  # fmt: skip
        engine = create_store_engine(loc, timeout_s)
        try:
            revision = migrate.upgrade(engine, loc, timeout_s)
            probe_writable(engine)
        except BaseException:
            engine.dispose()
            raise
        return cls(loc, engine, timeout_s, revision, local_dir)

    # -- plumbing ---------------------------------------------------------------------------

    @property
    def _db(self) -> Engine:
        if self._pid != os.getpid():
            # Forked: the parent's pooled connections are not ours to use (or close).
            self._engine.dispose(close=False)
            self._pid = os.getpid()
            with self._hits_lock:
                self._hits.clear()
        return self._engine

    def _guard(self, op: str, work: Callable[[], T], fallback: Callable[[], T]) -> T:
        try:
            return work()
        except Exception as err:
            self._warn_once(op, err)
            return fallback()

    @contextmanager
    def _read(self) -> Iterator:
        with self._db.connect() as conn:
            yield conn

    def _in_overlay(self, fusion_id: int) -> bool:
        return fusion_id >= OVERLAY_ID_BASE

    # -- level 1 ----------------------------------------------------------------------------

    def fusion_id_for(self, definition_key: str, records_json: str, python_definition: str) -> int:
        fid = self._ids.get(definition_key)
        if fid is None:
            fid = self._guard(
                "fusion_id_for",
                lambda: self._db_fusion_id(definition_key, records_json, python_definition),
                lambda: self._mem.fusion_id_for(definition_key, records_json, python_definition),
            )
            self._ids[definition_key] = fid
        return fid

    def _db_fusion_id(self, key: str, records_json: str, python_definition: str) -> int:
        find = select(fusions.c.id).where(fusions.c.definition_key == key)
        with self._read() as conn:
            fid = conn.execute(find).scalar()
        if fid is not None:
            return fid
        with write_transaction(self._db) as conn:
            lock_fusion_ids(conn)
            fid = conn.execute(find).scalar()  # re-check under the writer lock
            if fid is None:
                fid = conn.execute(select(func.coalesce(func.max(fusions.c.id) + 1, 0))).scalar()
                conn.execute(
                    fusions.insert().values(
                        id=fid,
                        definition_key=key,
                        records_json=records_json,
                        python_definition=python_definition,
                        created_at=time.time(),
                    )
                )
            return fid

    def fusion_by_id(self, fid: int) -> FusionEntry | None:
        if self._in_overlay(fid):
            return self._mem.fusion_by_id(fid)

        def work() -> FusionEntry | None:
            with self._read() as conn:
                row = conn.execute(select(fusions).where(fusions.c.id == fid)).first()
            return _fusion(row) if row else None

        return self._guard("fusion_by_id", work, lambda: None)

    def fusions(self) -> list[FusionEntry]:
        def work() -> list[FusionEntry]:
            with self._read() as conn:
                rows = conn.execute(select(fusions).order_by(fusions.c.id)).all()
            return [_fusion(r) for r in rows]

        return self._guard("fusions", work, list) + self._mem.fusions()

    # -- level 2 ----------------------------------------------------------------------------

    def get_plan(self, fusion_id: int, signature_key: str, target: str) -> str | None:
        found = self._mem.get_plan(fusion_id, signature_key, target)
        if found is not None or self._in_overlay(fusion_id):
            return found
        query = select(plans.c.plan_json).where(
            plans.c.fusion_id == fusion_id,
            plans.c.signature_key == signature_key,
            plans.c.target == target,
        )

        def work() -> str | None:
            with self._read() as conn:
                return conn.execute(query).scalar()

        return self._guard("get_plan", work, lambda: None)

    def put_plan(self, fusion_id: int, signature_key: str, target: str, plan_json: str) -> None:
        def keep_in_memory() -> None:
            self._mem.put_plan(fusion_id, signature_key, target, plan_json)

        if self._in_overlay(fusion_id):
            return keep_in_memory()
        row = dict(
            fusion_id=fusion_id,
            signature_key=signature_key,
            target=target,
            plan_json=plan_json,
            created_at=time.time(),
        )

        def work() -> None:
            with write_transaction(self._db) as conn:
                upsert(conn, plans, row, ["fusion_id", "signature_key", "target"])

        self._guard("put_plan", work, keep_in_memory)

    def plans_for(self, fusion_id: int) -> list[PlanEntry]:
        def work() -> list[PlanEntry]:
            query = (
                select(plans)
                .where(plans.c.fusion_id == fusion_id)
                .order_by(plans.c.signature_key, plans.c.target)
            )
            with self._read() as conn:
                return [_plan(r) for r in conn.execute(query)]

        found = [] if self._in_overlay(fusion_id) else self._guard("plans_for", work, list)
        return found + self._mem.plans_for(fusion_id)

    # -- level 3 ----------------------------------------------------------------------------

    def get_kernel(self, key: str) -> bytes | None:
        if self._mem.kernel_meta(key) is not None:
            return self._mem.get_kernel(key)
        data = self._guard("get_kernel", lambda: self._load(key), lambda: None)
        if data is not None:
            self._count_hit(key)
        return data

    def kernel_bytes(self, key: str) -> bytes | None:
        if self._mem.kernel_meta(key) is not None:
            return self._mem.kernel_bytes(key)
        return self._guard("kernel_bytes", lambda: self._load(key), lambda: None)

    def _load(self, key: str) -> bytes | None:
        """The database decides whether an entry exists and what its hash is; the bytes
        come from the blob tier when its copy matches, else from the database."""
        with self._read() as conn:
            row = conn.execute(
                select(kernels.c.sha256, kernels.c.size).where(kernels.c.key == key)
            ).first()
        if row is None:
            return None
        local = self._blobs.get(key)
        if local is not None and local[0] == row.sha256 and len(local[1]) == row.size:
            return local[1]
        with self._read() as conn:
            row = conn.execute(
                select(kernels.c.sha256, kernels.c.size, kernels.c.cubin, kernels.c.created_at)
                .where(kernels.c.key == key)
            ).first()
        if row is None:
            return None
        data = bytes(row.cubin)
        if len(data) != row.size or hashlib.sha256(data).hexdigest() != row.sha256:
            log.warning("fusion-cache: kernel %s is damaged in the database; removing it", key)
            self._remove_kernel(key, row.created_at)
            return None
        self._blobs.put(key, data)
        return data

    def _remove_kernel(self, key: str, created_at: float | None = None) -> None:
        """Drop a kernel everywhere; with created_at, only that version of it (so a repair
        written meanwhile by another process survives)."""
        cond = kernels.c.key == key
        if created_at is not None:
            cond = and_(cond, kernels.c.created_at == created_at)
        with write_transaction(self._db) as conn:
            conn.execute(delete(kernels).where(cond))
        self._blobs.delete(key)

    def put_kernel(self, key: str, cubin: bytes, meta: KernelMeta) -> None:
        check_kernel_args(key, cubin, meta)
        cubin = bytes(cubin)
        row = _kernel_row(kernel_entry(key, cubin, meta, time.time()), cubin)

        def work() -> None:
            # One row in one transaction: readers see all of it or none of it, also if we
            # are killed halfway. The key names the content, so an existing row stays.
            with write_transaction(self._db) as conn:
                insert_ignore(conn, kernels, row)
            self._blobs.put(key, cubin)

        self._guard("put_kernel", work, lambda: self._mem.put_kernel(key, cubin, meta))

    def kernel_meta(self, key: str) -> KernelEntry | None:
        if self._mem.kernel_meta(key) is not None:
            return self._mem.kernel_meta(key)
        self.flush_hits()

        def work() -> KernelEntry | None:
            with self._read() as conn:
                row = conn.execute(_kernel_columns().where(kernels.c.key == key)).first()
            return _kernel(key, row) if row else None

        return self._guard("kernel_meta", work, lambda: None)

    def kernels(self, fusion_id: int | None = None) -> list[KernelEntry]:
        self.flush_hits()

        def work() -> list[KernelEntry]:
            query = _kernel_columns().order_by(kernels.c.key)
            if fusion_id is not None:
                linked = select(fusion_kernels.c.kernel_key).where(
                    fusion_kernels.c.fusion_id == fusion_id
                )
                query = query.where(kernels.c.key.in_(linked))
            with self._read() as conn:
                return [_kernel(r.key, r) for r in conn.execute(query)]

        if fusion_id is not None and self._in_overlay(fusion_id):
            found = []
        else:
            found = self._guard("kernels", work, list)
        known = {e.key for e in found}
        return found + [e for e in self._mem.kernels(fusion_id) if e.key not in known]

    def link_kernel(self, fusion_id: int, key: str) -> None:
        def keep_in_memory() -> None:
            self._mem.link_kernel(fusion_id, key)

        if self._in_overlay(fusion_id):
            return keep_in_memory()

        def work() -> None:
            with write_transaction(self._db) as conn:
                insert_ignore(conn, fusion_kernels, {"fusion_id": fusion_id, "kernel_key": key})

        self._guard("link_kernel", work, keep_in_memory)

    def links(self) -> list[tuple[int, str]]:
        """Every (fusion id, kernel key) link, whether or not the kernel is stored."""

        def work() -> list[tuple[int, str]]:
            query = select(fusion_kernels.c.fusion_id, fusion_kernels.c.kernel_key)
            with self._read() as conn:
                return [tuple(r) for r in conn.execute(query)]

        return sorted(set(self._guard("links", work, list)) | set(self._mem.links()))

    @contextmanager
    def _kernel_lock(self, key: str, timeout_s: float) -> Iterator[bool | None]:
        if not self._local_dir:
            yield None  # no lock to take: compiles may overlap, results are the same
            return
        lock = FileLock(kernel_lock_path(self.cache_dir, key))
        try:
            held = lock.acquire(timeout_s)
        except Exception as err:  # e.g. the cache dir vanished: compile without the lock
            self._warn_once("kernel lock", err,
                            then="compiling without it (another process may compile the same kernel)")
            held = None  # no lock here, not one held too long
        try:
            yield held
        finally:
            lock.release()

    # -- hits (Note [Hit counting]) ---------------------------------------------------------

    def _count_hit(self, key: str) -> None:
        now = time.time()
        with self._hits_lock:
            count, _ = self._hits.get(key, (0, 0.0))
            self._hits[key] = (count + 1, now)
            due = (
                len(self._hits) >= HIT_FLUSH_COUNT
                or time.monotonic() - self._last_flush >= HIT_FLUSH_S
            )
        if due:
            self.flush_hits()

    def flush_hits(self) -> None:
        with self._hits_lock:
            pending, self._hits = self._hits, {}
            self._last_flush = time.monotonic()
        if not pending or self._closed:
            return
        stmt = (
            update(kernels)
            .where(kernels.c.key == bindparam("k"))
            .values(hits=kernels.c.hits + bindparam("n"), last_used=bindparam("t"))
        )
        params = [{"k": k, "n": n, "t": t} for k, (n, t) in sorted(pending.items())]
        try:
            with write_transaction(self._db) as conn:
                conn.execute(stmt, params)
        except Exception as err:  # usage statistics only: never worth a warning
            log.debug("fusion-cache: could not record %d kernel hits: %r", len(params), err)

    # -- maintenance ------------------------------------------------------------------------

    def verify(self, repair: bool = False) -> VerifyReport:
        """Check every stored cubin against its sha256, in the database and in this node's
        blob tier. repair=True removes what is bad, after restoring a damaged database copy
        from an intact blob when there is one."""
        from .maintenance import verify_store

        return verify_store(self, repair)

    def prune(
        self, max_age_days: float | None = None, max_bytes: int | None = None
    ) -> PruneReport:
        self.flush_hits()

        def work() -> PruneReport:
            query = select(
                kernels.c.key, kernels.c.size, kernels.c.last_used, kernels.c.created_at
            ).order_by(kernels.c.last_used, kernels.c.key)
            with self._read() as conn:
                rows = conn.execute(query).all()
            doomed = choose_prunable(rows, max_age_days, max_bytes, time.time())
            # Delete a kernel only if nobody used it since we looked.
            stmt = delete(kernels).where(
                kernels.c.key == bindparam("k"), kernels.c.last_used == bindparam("t")
            )
            for chunk in iter_chunks(doomed, 500):
                with write_transaction(self._db) as conn:
                    conn.execute(stmt, [{"k": r.key, "t": r.last_used} for r in chunk])
            for r in doomed:
                self._blobs.delete(r.key)
            self._sweep_blobs()
            self._reclaim_space()
            gone = {r.key for r in doomed}
            kept = [r for r in rows if r.key not in gone]
            return PruneReport(
                len(doomed),
                sum(r.size for r in doomed),
                len(kept),
                sum(r.size for r in kept),
            )

        mem = self._mem.prune(max_age_days, max_bytes)
        db = self._guard("prune", work, lambda: PruneReport(0, 0, 0, 0))
        return PruneReport(
            db.removed + mem.removed,
            db.freed_bytes + mem.freed_bytes,
            db.kept + mem.kept,
            db.kept_bytes + mem.kept_bytes,
        )

    def _sweep_blobs(self) -> None:
        """Drop local blobs whose kernel left the database (pruned here or on another node)."""
        with self._read() as conn:
            known = set(conn.execute(select(kernels.c.key)).scalars())
        for key in list(self._blobs.keys()):
            if key not in known:
                self._blobs.delete(key)

    def _reclaim_space(self) -> None:
        """Give freed SQLite pages back to the file system (the database is created with
        auto_vacuum=INCREMENTAL, so this is cheap); best effort."""
        if self._db.dialect.name != "sqlite":
            return
        try:
            raw = self._db.raw_connection()  # outside any transaction (pysqlite autocommit)
            try:
                raw.cursor().execute("PRAGMA incremental_vacuum").fetchall()
            finally:
                raw.close()
        except Exception as err:
            log.debug("fusion-cache: incremental vacuum failed: %r", err)

    def stats(self) -> dict:
        self.flush_hits()

        def work() -> dict:
            counts = {
                "fusions": select(func.count()).select_from(fusions),
                "plans": select(func.count()).select_from(plans),
                "kernels": select(func.count()).select_from(kernels),
                "kernel_bytes": select(func.sum(kernels.c.size)),
                # a link outlives its kernel's prune: count those that still lead somewhere
                "links": select(func.count()).select_from(fusion_kernels).where(
                    fusion_kernels.c.kernel_key.in_(select(kernels.c.key))
                ),
                "hits": select(func.sum(kernels.c.hits)),
            }
            with self._read() as conn:
                out = {name: conn.execute(q).scalar() or 0 for name, q in counts.items()}
                out["schema_revision"] = migrate.current_revision(conn)
            return out

        out = {"url": self.url, "persistent": True, "cache_dir": str(self.cache_dir)}
        out.update(self._guard("stats", work, dict))
        out["head_revision"] = migrate.head_revision()
        out["blob_entries"], out["blob_bytes"] = self._blobs.usage()
        if len(self._mem):
            out["in_memory_only"] = self._mem.stats()
        return out

    def close(self) -> None:
        if self._closed:
            return
        self.flush_hits()
        self._closed = True
        self._blobs.close()
        if self._pid == os.getpid():
            self._engine.dispose()
        else:
            self._engine.dispose(close=False)


def _flush_at_exit(ref: weakref.ref) -> None:
    store = ref()
    if store is not None and not store._closed and store._pid == os.getpid():
        store.flush_hits()


def _kernel_columns():
    return select(*[c for c in kernels.c if c.name != "cubin"])


def _fusion(row) -> FusionEntry:
    return FusionEntry(
        row.id, row.definition_key, row.records_json, row.python_definition, row.created_at
    )


def _plan(row) -> PlanEntry:
    return PlanEntry(row.fusion_id, row.signature_key, row.target, row.plan_json, row.created_at)


def _kernel_row(entry: KernelEntry, cubin: bytes) -> dict:
    """A kernel's database row: the entry's fields, options as JSON, and the bytes."""
    row = dataclasses.asdict(entry)
    row["options_json"] = options_to_json(row.pop("options"))
    row["cubin"] = cubin
    return row


def _kernel(key: str, row) -> KernelEntry:
    return KernelEntry(
        key=key,
        kernel_name=row.kernel_name,
        arch=row.arch,
        nvrtc_version=row.nvrtc_version,
        options=options_from_json(row.options_json),
        source=row.source,
        scheduler=row.scheduler,
        params_json=row.params_json,
        compile_ms=row.compile_ms,
        sha256=row.sha256,
        size=row.size,
        hits=row.hits,
        created_at=row.created_at,
        last_used=row.last_used,
    )
