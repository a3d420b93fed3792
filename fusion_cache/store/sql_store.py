"""SqlStore: the persistent store (SQLite or PostgreSQL, plus the node-local blob tier).

Every public method either works or degrades (Note [Degrade, never crash] in store.py): its
database work runs through `_guard`, which on an error warns once and falls back to the
in-memory overlay. Overlay fusion ids start at OVERLAY_ID_BASE so they can never collide
with the database's ids, and anything keyed by such an id stays in memory.

Note [Store file watch]
    A process keeps its SQLite file open, so a cache directory deleted (or a store.db
    replaced, say by a restored backup) under it used to go unnoticed: the process wrote on
    into an unlinked file. At most once a second, the first operation compares the file's
    (device, inode) with the one opened; on a change it warns once and reopens a store at
    the same path (creating it if it is gone). Kernels are keyed by content and go to the new
    store; fusion ids are per store, so this process keeps the ids it handed out and takes
    its new fusions, plans and links into the in-memory overlay (`_detached`): an id of the
    old store never names a fusion of the new one.

Note [Hit counting]
    get_kernel is the hot path (a warm process loads every kernel through it), so hits and
    last-use times are gathered in memory and written in one transaction every few seconds,
    at close() and at exit, not once per hit. A killed process loses at most those counts.
"""
from __future__ import annotations

import atexit
import dataclasses
import hashlib
import importlib
import logging
import os
import threading
import time
import warnings
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

from .blobs import BlobTier
from .entries import (
    FusionEntry,
    KernelEntry,
    KernelMeta,
    PlanEntry,
    PruneReport,
    StoreError,
    StoreWarning,
    VerifyReport,
    check_kernel_args,
    choose_prunable,
    kernel_entry,
    options_from_json,
    options_to_json,
)
from .location import Location, display_url
from .locks import AdvisoryLock, FileLock, kernel_lock_path
from .memory import MemoryStore
from .schema import HEAD_REVISION
from .sqlite_reader import FusionRows, SqliteReader
from .store import Store, iter_chunks

if TYPE_CHECKING:
    from sqlalchemy import Engine

    from .bundle import BundleContents


class _Lazy:
    """A module imported on first attribute access (Note [Warm path]: a warm hit on a SQLite
    store never imports SQLAlchemy)."""

    def __init__(self, name: str) -> None:
        self._name = name
        self._module = None
        self._lock = threading.Lock()

    def __getattr__(self, attr: str):
        module = self._module
        if module is None:
            with self._lock:
                if self._module is None:
                    self._module = importlib.import_module(self._name)
                module = self._module
        return getattr(module, attr)


sa = _Lazy("sqlalchemy")
E = _Lazy("fusion_cache.store.engine")  # engines and the SQL helpers writers share
M = _Lazy("fusion_cache.store.models")  # the tables
migrate = _Lazy("fusion_cache.store.migrate")

log = logging.getLogger("fusion_cache.store")

OVERLAY_ID_BASE = 1 << 40
HIT_FLUSH_S = 2.0
HIT_FLUSH_COUNT = 512
WATCH_S = 1.0  # how often the SQLite file's identity is checked (Note [Store file watch])

T = TypeVar("T")


class SqlStore(Store):
    persistent = True

    def __init__(self, loc: Location, engine: Engine | None, timeout_s: float, revision: str,
                 local_dir: bool = True, reader: SqliteReader | None = None) -> None:  # fmt: skip
        super().__init__()
        self.location = loc
        self.url = display_url(loc.url)
        self.cache_dir = loc.cache_dir
        self.revision = revision
        self._engine_now = engine  # None until something needs SQLAlchemy (Note [Warm path])
        self._engine_lock = threading.Lock()
        self._reader = reader  # a plain SQLite file's warm read path; None for servers
        self._known: dict[int, FusionRows] = {}  # fusion id -> what the store held for it
        self._held: list[tuple] | None = None  # Note [Writes together]: plans, links to write
        self._held_depth = 0
        self._held_lock = threading.Lock()
        self._kernel_rows: dict[str, tuple[str, int]] = {}  # key -> (sha256, size), from those
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
        self._detached = False  # Note [Store file watch]
        self._lost: StoreError | None = None  # the file is gone and reopening failed
        self._watch_lock = threading.Lock()
        self._identity = _file_identity(loc.db_path)
        self._next_check = time.monotonic() + WATCH_S
        atexit.register(_flush_at_exit, weakref.ref(self))

    @classmethod
    def open(cls, loc: Location, timeout_s: float) -> SqlStore:
        """Create the directory, migrate (Note [Serialised migrations]), check we can write.
        Raises on any problem; open_store turns that into a MemoryStore."""
        local_dir = True
        try:
            if loc.cache_dir.exists() and not loc.cache_dir.is_dir():
                raise NotADirectoryError(f"the cache directory {loc.cache_dir} is not a directory")
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
        reader = _warm_reader(loc, timeout_s)
        if reader is not None:
            return cls(loc, None, timeout_s, HEAD_REVISION, local_dir, reader)
        engine, revision = _open_engine(loc, timeout_s)
        return cls(loc, engine, timeout_s, revision, local_dir, _reader_for(loc, timeout_s))

    # -- plumbing ---------------------------------------------------------------------------

    @property
    def _engine(self) -> Engine:
        """The SQLAlchemy engine, created on first need (Note [Warm path])."""
        engine = self._engine_now
        if engine is None:
            with self._engine_lock:
                if self._engine_now is None:
                    self._engine_now = E.create_store_engine(self.location, self._timeout)
                engine = self._engine_now
        return engine

    def _checked(self) -> None:
        """Before any database work: a fork, a deleted or replaced file (Note [Store file
        watch]), a store that could not be reopened."""
        if self._pid != os.getpid():
            # Forked: the parent's pooled connections are not ours to use (or close).
            if self._engine_now is not None:
                self._engine_now.dispose(close=False)
            self._pid = os.getpid()
            with self._hits_lock:
                self._hits.clear()
        if self._identity is not None and time.monotonic() >= self._next_check:
            self._check_file()
        if self._lost is not None:
            raise self._lost

    @property
    def _db(self) -> Engine:
        self._checked()
        return self._engine

    @property
    def _rd(self) -> SqliteReader | None:
        """The warm read path, when there is one (a plain SQLite file)."""
        if self._reader is not None:
            self._checked()
        return self._reader

    def _check_file(self) -> None:
        """Note [Store file watch]: reopen if the SQLite file was deleted or replaced."""
        with self._watch_lock:
            if time.monotonic() < self._next_check:
                return  # another thread just checked
            self._next_check = time.monotonic() + WATCH_S
            path = self.location.db_path
            if self._lost is None:
                now = _file_identity(path)
                if now == self._identity:
                    return
                what = "was deleted" if now is None else "was replaced"
                warnings.warn(
                    f"fusion-cache store {self.url}: the database file {what} while this "
                    f"process ran; reopening a store at {path}: new kernels go there, and "
                    "this process keeps its new fusion ids in memory (ids are per store)",
                    StoreWarning, stacklevel=5)  # fmt: skip
                self._detached = True
                with self._hits_lock:
                    self._hits.clear()  # counts for the old file's rows
                self._blobs.close()  # its directory may have gone too; reopened on use
            try:
                self.location.cache_dir.mkdir(parents=True, exist_ok=True)
                engine, self.revision = _open_engine(self.location, self._timeout)
            except Exception as err:  # every operation degrades until a retry works
                self._lost = StoreError(f"the database file {path} is gone and could not be "
                                        f"reopened ({type(err).__name__}: {err})")  # fmt: skip
                return
            old, self._engine_now, self._lost = self._engine_now, engine, None
            if self._reader is not None:
                self._reader.close()
                self._reader = _reader_for(self.location, self._timeout)
            self._known.clear()
            self._identity = _file_identity(path)
            if old is not None:
                old.dispose()

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
        return fusion_id >= OVERLAY_ID_BASE or self._detached

    # -- level 1 ----------------------------------------------------------------------------

    def fusion_id_for(self, definition_key: str, records_json: str, python_definition: str) -> int:
        fid = self._ids.get(definition_key)
        if fid is None:
            in_memory = lambda: self._mem.fusion_id_for(  # noqa: E731
                definition_key, records_json, python_definition)
            fid = self._guard(
                "fusion_id_for",
                lambda: in_memory() if self._detached_now() else self._db_fusion_id(
                    definition_key, records_json, python_definition),
                in_memory,
            )
            self._ids[definition_key] = fid
        return fid

    def _detached_now(self) -> bool:
        self._checked()
        return self._detached

    def _db_fusion_id(self, key: str, records_json: str, python_definition: str) -> int:
        reader = self._rd
        if reader is not None:  # one query: the id, its plans and kernels (Note [Warm path])
            rows = reader.fusion(key)
            if rows is not None:
                self._known[rows.id] = rows
                self._kernel_rows.update((k, r) for k, r in rows.links.items() if r is not None)
                return rows.id
        find = sa.select(M.fusions.c.id).where(M.fusions.c.definition_key == key)
        if reader is None:  # (the reader just looked: a new definition, checked again below)
            with self._read() as conn:
                fid = conn.execute(find).scalar()
            if fid is not None:
                return fid
        with E.write_transaction(self._db) as conn:
            E.lock_fusion_ids(conn)
            fid = conn.execute(find).scalar()  # re-check under the writer lock
            if fid is not None:
                return fid
            fid = conn.execute(sa.select(sa.func.coalesce(sa.func.max(M.fusions.c.id) + 1, 0))).scalar()
            conn.execute(
                M.fusions.insert().values(
                    id=fid,
                    definition_key=key,
                    records_json=records_json,
                    python_definition=python_definition,
                    created_at=time.time(),
                )
            )
        # Note [Warm path], cold: a fusion made here holds no plan or link yet, and those this
        # process writes are kept, so the same one again costs no transaction
        self._known.setdefault(fid, FusionRows(fid))
        return fid

    def fusion_by_id(self, fid: int) -> FusionEntry | None:
        if self._in_overlay(fid):
            return self._mem.fusion_by_id(fid)

        def work() -> FusionEntry | None:
            reader = self._rd
            if reader is not None:
                row = reader.fusion_by_id(fid)
                return FusionEntry(*row) if row else None
            with self._read() as conn:
                row = conn.execute(sa.select(M.fusions).where(M.fusions.c.id == fid)).first()
            return _fusion(row) if row else None

        return self._guard("fusion_by_id", work, lambda: None)

    def fusions(self) -> list[FusionEntry]:
        def work() -> list[FusionEntry]:
            with self._read() as conn:
                rows = conn.execute(sa.select(M.fusions).order_by(M.fusions.c.id)).all()
            return [_fusion(r) for r in rows]

        if self._detached_now():
            return self._mem.fusions()
        return self._guard("fusions", work, list) + self._mem.fusions()

    # -- level 2 ----------------------------------------------------------------------------

    def get_plan(self, fusion_id: int, signature_key: str, target: str) -> str | None:
        found = self._mem.get_plan(fusion_id, signature_key, target)
        if found is not None or self._in_overlay(fusion_id):
            return found
        known = self._known.get(fusion_id)
        if known is not None and (signature_key, target) in known.plans:
            return known.plans[(signature_key, target)]
        if self._reader is not None:
            return self._guard("get_plan", lambda: self._rd.plan(fusion_id, signature_key,
                                                                 target), lambda: None)  # fmt: skip
        query = sa.select(M.plans.c.plan_json).where(
            M.plans.c.fusion_id == fusion_id,
            M.plans.c.signature_key == signature_key,
            M.plans.c.target == target,
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
        known = self._known.get(fusion_id)
        if known is not None and known.plans.get((signature_key, target)) == plan_json:
            return  # the store holds this plan already: nothing to write (Note [Warm path])
        row = dict(
            fusion_id=fusion_id,
            signature_key=signature_key,
            target=target,
            plan_json=plan_json,
            created_at=time.time(),
        )

        if known is not None and self._hold(("plan", row)):
            known.plans[(signature_key, target)] = plan_json
            return

        def work() -> None:
            with E.write_transaction(self._db) as conn:
                E.upsert(conn, M.plans, row, ["fusion_id", "signature_key", "target"])
            if known is not None:
                known.plans[(signature_key, target)] = plan_json

        self._guard("put_plan", work, keep_in_memory)

    def plans_for(self, fusion_id: int) -> list[PlanEntry]:
        def work() -> list[PlanEntry]:
            query = (
                sa.select(M.plans)
                .where(M.plans.c.fusion_id == fusion_id)
                .order_by(M.plans.c.signature_key, M.plans.c.target)
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
        row = self._kernel_rows.get(key)
        if row is None:
            row = self._kernel_row(key)
            if row is None:
                return None
        sha256, size = row
        local = self._blobs.get(key, size)
        if local is not None and local[0] == sha256 and len(local[1]) == size:
            return local[1]
        self._kernel_rows.pop(key, None)  # the database's row may have changed: ask again
        found = self._kernel_cubin(key)
        if found is None:
            return None
        sha256, size, cubin, created_at = found
        data = bytes(cubin)
        if len(data) != size or hashlib.sha256(data).hexdigest() != sha256:
            log.warning("fusion-cache: kernel %s is damaged in the database; removing it", key)
            self._remove_kernel(key, created_at)
            return None
        self._blobs.put(key, data)
        return data

    def _kernel_row(self, key: str) -> tuple[str, int] | None:
        reader = self._rd
        if reader is not None:
            return reader.kernel_row(key)
        with self._read() as conn:
            return conn.execute(sa.select(M.kernels.c.sha256, M.kernels.c.size)
                                .where(M.kernels.c.key == key)).first()  # fmt: skip

    def _kernel_cubin(self, key: str) -> tuple[str, int, bytes, float] | None:
        reader = self._rd
        if reader is not None:
            return reader.kernel_cubin(key)
        columns = (M.kernels.c.sha256, M.kernels.c.size, M.kernels.c.cubin, M.kernels.c.created_at)
        with self._read() as conn:
            return conn.execute(sa.select(*columns).where(M.kernels.c.key == key)).first()

    def _remove_kernel(self, key: str, created_at: float | None = None) -> None:
        """Drop a kernel everywhere; with created_at, only that version of it (so a repair
        written meanwhile by another process survives)."""
        cond = M.kernels.c.key == key
        if created_at is not None:
            cond = sa.and_(cond, M.kernels.c.created_at == created_at)
        with E.write_transaction(self._db) as conn:
            conn.execute(sa.delete(M.kernels).where(cond))
        self._blobs.delete(key)

    def put_kernel(self, key: str, cubin: bytes, meta: KernelMeta) -> None:
        check_kernel_args(key, cubin, meta)
        cubin = bytes(cubin)
        row = _kernel_row(kernel_entry(key, cubin, meta, time.time()), cubin)

        def work() -> None:
            # One row in one transaction: readers see all of it or none of it, also if we
            # are killed halfway. The key names the content, so an existing row stays.
            with E.write_transaction(self._db) as conn:
                E.insert_ignore(conn, M.kernels, row)
            self._blobs.put(key, cubin)

        self._guard("put_kernel", work, lambda: self._mem.put_kernel(key, cubin, meta))

    def kernel_meta(self, key: str) -> KernelEntry | None:
        if self._mem.kernel_meta(key) is not None:
            return self._mem.kernel_meta(key)
        self.flush_hits()

        def work() -> KernelEntry | None:
            with self._read() as conn:
                row = conn.execute(_kernel_columns().where(M.kernels.c.key == key)).first()
            return _kernel(key, row) if row else None

        return self._guard("kernel_meta", work, lambda: None)

    def kernels(self, fusion_id: int | None = None) -> list[KernelEntry]:
        self.flush_hits()

        def work() -> list[KernelEntry]:
            query = _kernel_columns().order_by(M.kernels.c.key)
            if fusion_id is not None:
                linked = sa.select(M.fusion_kernels.c.kernel_key).where(
                    M.fusion_kernels.c.fusion_id == fusion_id
                )
                query = query.where(M.kernels.c.key.in_(linked))
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
        known = self._known.get(fusion_id)
        if known is not None and key in known.links:
            return  # linked already: nothing to write (Note [Warm path])

        if known is not None and self._hold(("link", {"fusion_id": fusion_id, "kernel_key": key})):
            known.links.setdefault(key, None)
            return

        def work() -> None:
            with E.write_transaction(self._db) as conn:
                E.insert_ignore(conn, M.fusion_kernels, {"fusion_id": fusion_id, "kernel_key": key})
            if known is not None:
                known.links.setdefault(key, None)

        self._guard("link_kernel", work, keep_in_memory)

    # Note [Writes together]: a cold first step planning its regions ahead (Note [Compiles
    # ahead]) wrote each plan and kernel link in a transaction of its own, a few hundred of
    # them, most of their time SQLAlchemy's building of the statement (a third of the
    # planning left beside searches run apart, CPU). Within `writes_together`, those of
    # definitions whose rows this process knows (Note [Warm path]) are held, seen at once by
    # this process through the known rows, and written in one transaction at its end;
    # other processes see them then. Where that transaction fails they stay in memory, as a
    # failed write does. FUSION_CACHE_WRITES_TOGETHER=0: each written at once.

    @contextmanager
    def writes_together(self) -> Iterator[None]:
        if os.environ.get("FUSION_CACHE_WRITES_TOGETHER", "1").strip().lower() in (
                "0", "false", "off", "no"):  # fmt: skip
            yield
            return
        with self._held_lock:
            self._held_depth += 1
            if self._held is None:
                self._held = []
        try:
            yield
        finally:
            with self._held_lock:
                self._held_depth -= 1
                held = self._held if self._held_depth == 0 else None
                if held is not None:
                    self._held = None
            if held:
                self._write_held(held)

    def _hold(self, write: tuple) -> bool:
        with self._held_lock:
            if self._held is None:
                return False
            self._held.append(write)
            return True

    def _write_held(self, held: list[tuple]) -> None:
        # the last of each key's plans, as writing them one after another would leave
        plans = list({(row["fusion_id"], row["signature_key"], row["target"]): row
                      for kind, row in held if kind == "plan"}.values())  # fmt: skip
        links = [row for kind, row in held if kind == "link"]

        def work() -> None:
            with E.write_transaction(self._db) as conn:
                E.upsert_many(conn, M.plans, plans, ["fusion_id", "signature_key", "target"])
                if links:
                    E.insert_ignore(conn, M.fusion_kernels, links)

        def keep_in_memory() -> None:
            for row in plans:
                self._mem.put_plan(row["fusion_id"], row["signature_key"], row["target"],
                                   row["plan_json"])  # fmt: skip
            for row in links:
                self._mem.link_kernel(row["fusion_id"], row["kernel_key"])

        self._guard("writes_together", work, keep_in_memory)

    def links(self) -> list[tuple[int, str]]:
        """Every (fusion id, kernel key) link, whether or not the kernel is stored."""

        def work() -> list[tuple[int, str]]:
            query = sa.select(M.fusion_kernels.c.fusion_id, M.fusion_kernels.c.kernel_key)
            with self._read() as conn:
                return [tuple(r) for r in conn.execute(query)]

        found = [] if self._detached_now() else self._guard("links", work, list)
        return sorted(set(found) | set(self._mem.links()))

    # -- bundles (Note [Bundle trust] in bundle.py) ------------------------------------------

    def import_entries(self, bundle: BundleContents) -> int:
        from .bundle import BundleError, BundleImportError

        try:
            with E.write_transaction(self._db) as conn:
                self._import_in(conn, bundle)
        except BundleError:
            raise
        except Exception as err:
            raise BundleImportError(f"the store at {self.url} failed while importing "
                                    f"({type(err).__name__}: {err}); nothing was imported"
                                    ) from err  # fmt: skip
        return bundle.entries

    def _import_in(self, conn, bundle: BundleContents) -> None:
        E.lock_fusion_ids(conn)
        known: dict[str, int] = {}
        for chunk in iter_chunks([f.definition_key for f in bundle.fusions], 500):
            find = sa.select(M.fusions.c.definition_key, M.fusions.c.id)
            known.update(conn.execute(find.where(M.fusions.c.definition_key.in_(chunk))).all())
        next_id = conn.execute(sa.select(sa.func.coalesce(sa.func.max(M.fusions.c.id) + 1, 0))).scalar()
        now = time.time()
        ids, new = {}, []
        for f in bundle.fusions:
            fid = known.get(f.definition_key)
            if fid is None:
                fid, next_id = next_id, next_id + 1
                new.append(dict(id=fid, definition_key=f.definition_key, created_at=now,
                                records_json=f.records_json,
                                python_definition=f.python_definition))  # fmt: skip
            ids[f.id] = fid
        if new:
            conn.execute(M.fusions.insert(), new)
        for p in bundle.plans:
            row = dict(fusion_id=ids[p.fusion_id], signature_key=p.signature_key,
                       target=p.target, plan_json=p.plan_json, created_at=now)  # fmt: skip
            E.upsert(conn, M.plans, row, ["fusion_id", "signature_key", "target"])
        for k in bundle.kernels:
            cubin = bundle.cubin(k)  # read once, checked; a bad one rolls everything back
            E.insert_ignore(conn, M.kernels, _kernel_row(kernel_entry(k.key, cubin, k.meta, now),
                                                     cubin))  # fmt: skip
        links = sorted({(ids[fid], key) for fid, key in bundle.links})
        for chunk in iter_chunks(links, 500):
            E.insert_ignore(conn, M.fusion_kernels,
                          [{"fusion_id": fid, "kernel_key": key} for fid, key in chunk])

    @contextmanager
    def _kernel_lock(self, key: str, timeout_s: float) -> Iterator[bool | None]:
        """The node's flock, then on PostgreSQL the cluster's advisory lock (Note [Cluster
        single flight]); None where neither can be had."""
        deadline = time.monotonic() + max(0.0, timeout_s)
        with self._node_lock(key, timeout_s) as node_held:
            if node_held is False or self._db.dialect.name != "postgresql":
                yield node_held
                return
            lock = AdvisoryLock(self._db, key)
            try:
                held = lock.acquire(max(0.0, deadline - time.monotonic()))
            except Exception as err:
                self._warn_once("cluster kernel lock", err,
                                then="compiling without it (another node may compile the same "
                                     "kernel)")  # fmt: skip
                held = node_held  # the node's lock alone
            try:
                yield held
            finally:
                lock.release()

    @contextmanager
    def _node_lock(self, key: str, timeout_s: float) -> Iterator[bool | None]:
        if not self._local_dir:
            yield None  # no node-local directory
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
        params = [{"k": k, "n": n, "t": t} for k, (n, t) in sorted(pending.items())]
        try:
            reader = self._rd
            if reader is not None:
                reader.add_hits(params)
                return
        except Exception as err:  # usage statistics only: never worth a warning
            log.debug("fusion-cache: could not record %d kernel hits: %r", len(params), err)
            return
        stmt = (
            sa.update(M.kernels)
            .where(M.kernels.c.key == sa.bindparam("k"))
            .values(hits=M.kernels.c.hits + sa.bindparam("n"), last_used=sa.bindparam("t"))
        )
        try:
            with E.write_transaction(self._db) as conn:
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
            query = sa.select(
                M.kernels.c.key, M.kernels.c.size, M.kernels.c.last_used, M.kernels.c.created_at
            ).order_by(M.kernels.c.last_used, M.kernels.c.key)
            with self._read() as conn:
                rows = conn.execute(query).all()
            doomed = choose_prunable(rows, max_age_days, max_bytes, time.time())
            # Delete a kernel only if nobody used it since we looked.
            stmt = sa.delete(M.kernels).where(
                M.kernels.c.key == sa.bindparam("k"), M.kernels.c.last_used == sa.bindparam("t")
            )
            for chunk in iter_chunks(doomed, 500):
                with E.write_transaction(self._db) as conn:
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
            known = set(conn.execute(sa.select(M.kernels.c.key)).scalars())
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
                "fusions": sa.select(sa.func.count()).select_from(M.fusions),
                "plans": sa.select(sa.func.count()).select_from(M.plans),
                "kernels": sa.select(sa.func.count()).select_from(M.kernels),
                "kernel_bytes": sa.select(sa.func.sum(M.kernels.c.size)),
                # a link outlives its kernel's prune: count those that still lead somewhere
                "links": sa.select(sa.func.count()).select_from(M.fusion_kernels).where(
                    M.fusion_kernels.c.kernel_key.in_(sa.select(M.kernels.c.key))
                ),
                "hits": sa.select(sa.func.sum(M.kernels.c.hits)),
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
        if self._reader is not None:
            self._reader.close()
        engine = self._engine_now
        if engine is None:
            return
        if self._pid == os.getpid():
            engine.dispose()
        else:
            engine.dispose(close=False)


def _open_engine(loc: Location, timeout_s: float) -> tuple[Engine, str]:
    """An engine on a migrated store we can write (Note [Serialised migrations])."""
    engine = E.create_store_engine(loc, timeout_s)
    try:
        revision = migrate.upgrade(engine, loc, timeout_s)
        E.probe_writable(engine)
    except BaseException:
        engine.dispose()
        raise
    return engine, revision


def _reader_for(loc: Location, timeout_s: float) -> SqliteReader | None:
    """The warm read path for a plain SQLite file (not a URI filename with parameters, such
    as mode=ro, which only SQLAlchemy's URL carries)."""
    if loc.db_path is None or loc.url != f"sqlite:///{loc.db_path}":
        return None
    return SqliteReader(loc.db_path, timeout_s)


def _warm_reader(loc: Location, timeout_s: float) -> SqliteReader | None:
    """A reader on a store already at head that we can write: then opening is done
    (Note [Warm path]). None sends the opener down the full path (create, migrate, probe),
    which also raises the errors worth reporting."""
    reader = _reader_for(loc, timeout_s)
    if reader is None:
        return None
    try:
        if reader.revision() == HEAD_REVISION:
            reader.probe_writable()
            return reader
    except Exception as err:  # sqlite3.Error, OSError: the full path will say what it is
        log.debug("fusion-cache: warm open of %s failed (%r); opening in full", loc.url, err)
    reader.close()
    return None


def _file_identity(path: Path | None) -> tuple[int, int] | None:
    """(device, inode) of the SQLite file; None for a server store or a missing file."""
    if path is None:
        return None
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino


def _flush_at_exit(ref: weakref.ref) -> None:
    store = ref()
    if store is not None and not store._closed and store._pid == os.getpid():
        store.flush_hits()


def _kernel_columns():
    return sa.select(*[c for c in M.kernels.c if c.name != "cubin"])


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
