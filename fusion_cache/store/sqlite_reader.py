"""The warm read path of a SQLite store, in the standard library's sqlite3.

Note [Warm path]
    A process restarted on a warm store needs only reads: the schema revision, each
    definition's fusion id, and its plans and kernels. Importing SQLAlchemy and building an
    engine cost about a third of a second, more than all those reads, so a plain SQLite
    store opens and reads through SqliteReader and imports SQLAlchemy (engine.py, models.py,
    migrate.py) only for what a hit never does: a write, a miss, maintenance, a migration,
    or a server store. Opening checks the revision with one query of the version table and
    whether we can write (a rolled-back BEGIN IMMEDIATE); at head nothing else happens.
    Looking up a definition fetches its id, its plans and its kernels' hashes and sizes in
    one query (`fusion`), so that a known fusion's plan, links and cubins then cost no
    further query but the cubin's read, and rewriting a plan or link the store already holds
    writes nothing. Reads run in autocommit, each statement its own snapshot; what a lookup
    learnt is kept for the process (a plan another process replaces later is seen by the
    next process, as plans are only the runtime's record of what it chose). A definition this
    process adds to the store is kept the same way, empty, with what it writes: a cold first
    step writes each plan and link two or three times (planned ahead, at the first call, for
    every region a segment is in; tiny Llama-style: 171 plans, 58 distinct) and only the first
    is a transaction.
"""
from __future__ import annotations

import os
import sqlite3
import threading
from dataclasses import dataclass, field
from pathlib import Path

from .schema import VERSION_TABLE


@dataclass
class FusionRows:
    """What one query tells about a stored definition (Note [Warm path])."""

    id: int
    plans: dict[tuple[str, str], str] = field(default_factory=dict)  # (signature, target)
    links: dict[str, tuple[str, int] | None] = field(default_factory=dict)  # key -> (sha, size)


# A definition's id, plans and linked kernels (sha256, size; NULL when not stored) in one go.
_FUSION = """
SELECT f.id, 'p', p.signature_key, p.target, p.plan_json, NULL
  FROM fc_fusions f LEFT JOIN fc_plans p ON p.fusion_id = f.id
 WHERE f.definition_key = :key
UNION ALL
SELECT f.id, 'k', fk.kernel_key, k.sha256, NULL, k.size
  FROM fc_fusions f
  JOIN fc_fusion_kernels fk ON fk.fusion_id = f.id
  LEFT JOIN fc_kernels k ON k.key = fk.kernel_key
 WHERE f.definition_key = :key
"""


class SqliteReader:
    """Reads (and the hit counts) of one SQLite store file; a connection per thread and
    process, like the engine's pool. Errors propagate: SqlStore's guard decides."""

    def __init__(self, db_path: Path, timeout_s: float) -> None:
        self.db_path = Path(db_path)
        self._timeout = timeout_s
        self._local = threading.local()
        self._all: list[tuple[int, sqlite3.Connection]] = []
        self._lock = threading.Lock()

    def _conn(self) -> sqlite3.Connection:
        conn = getattr(self._local, "conn", None)
        if conn is None or self._local.pid != os.getpid():
            # mode=rw: never create a file here (a missing store is the full opener's job)
            conn = sqlite3.connect(f"file:{self.db_path}?mode=rw", uri=True,
                                   timeout=self._timeout, isolation_level=None,
                                   check_same_thread=False)  # fmt: skip
            conn.execute(f"PRAGMA busy_timeout = {int(self._timeout * 1000)}")
            self._local.conn, self._local.pid = conn, os.getpid()
            with self._lock:
                self._all.append((os.getpid(), conn))
        return conn

    def revision(self) -> str | None:
        try:
            rows = self._conn().execute(f"SELECT version_num FROM {VERSION_TABLE}").fetchall()
        except sqlite3.OperationalError as err:
            if "no such table" in str(err):
                return None
            raise
        return rows[0][0] if len(rows) == 1 else None

    def probe_writable(self) -> None:
        """Raise if this process cannot write (as engine.probe_writable does)."""
        conn = self._conn()
        conn.execute("BEGIN IMMEDIATE")
        try:
            conn.execute(f"UPDATE {VERSION_TABLE} SET version_num = version_num")
        finally:
            conn.execute("ROLLBACK")

    def fusion(self, definition_key: str) -> FusionRows | None:
        found: FusionRows | None = None
        for fid, kind, a, b, plan_json, size in self._conn().execute(_FUSION, {"key": definition_key}):
            found = found or FusionRows(fid)
            if kind == "p" and a is not None:
                found.plans[(a, b)] = plan_json
            elif kind == "k":
                found.links[a] = None if b is None else (b, size)
        return found

    def fusion_by_id(self, fid: int) -> tuple | None:
        return self._conn().execute(
            "SELECT id, definition_key, records_json, python_definition, created_at "
            "FROM fc_fusions WHERE id = ?", (fid,)).fetchone()  # fmt: skip

    def plan(self, fid: int, signature_key: str, target: str) -> str | None:
        row = self._conn().execute(
            "SELECT plan_json FROM fc_plans WHERE fusion_id = ? AND signature_key = ? "
            "AND target = ?", (fid, signature_key, target)).fetchone()  # fmt: skip
        return row[0] if row else None

    def kernel_row(self, key: str) -> tuple[str, int] | None:
        return self._conn().execute(
            "SELECT sha256, size FROM fc_kernels WHERE key = ?", (key,)).fetchone()

    def kernel_cubin(self, key: str) -> tuple[str, int, bytes, float] | None:
        return self._conn().execute(
            "SELECT sha256, size, cubin, created_at FROM fc_kernels WHERE key = ?",
            (key,)).fetchone()  # fmt: skip

    def add_hits(self, params: list[dict]) -> None:
        """Note [Hit counting]: one IMMEDIATE transaction for a batch of hits."""
        conn = self._conn()
        conn.execute("BEGIN IMMEDIATE")
        try:
            conn.executemany("UPDATE fc_kernels SET hits = hits + :n, last_used = :t "
                             "WHERE key = :k", params)  # fmt: skip
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        conn.execute("COMMIT")

    def close(self) -> None:
        with self._lock:
            conns, self._all = self._all, []
        for pid, conn in conns:
            if pid != os.getpid():
                continue  # a parent's connection, inherited through fork: not ours to close
            try:
                conn.close()
            except sqlite3.Error:
                pass
        self._local = threading.local()
