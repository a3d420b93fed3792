"""verify(): every stored cubin checked against its sha256, in the database and in this
node's blob tier, with optional repair. Kept apart from SqlStore's hot paths.

A repair counts only once it is done: a blob delete the tier confirms, a database row
removed or restored in a committed transaction. A repair that fails stays a problem, its
reason saying why (a damaged blob index, a full disk), so `verify --repair` never reports
repairs it did not make.
"""
from __future__ import annotations

import hashlib
from typing import TYPE_CHECKING

from sqlalchemy import select, text, update

from .engine import write_transaction
from .entries import BadEntry, VerifyReport
from .models import kernels

if TYPE_CHECKING:
    from .sql_store import SqlStore


def verify_store(store: SqlStore, repair: bool) -> VerifyReport:
    store.flush_hits()
    found = _Found(repair)
    checked = 0
    try:
        found.bad += _database_check(store)
        with store._read() as conn:
            keys = list(conn.execute(select(kernels.c.key).order_by(kernels.c.key)).scalars())
        for key in keys:
            checked += _verify_kernel(store, key, found)
        known = set(keys)
        for key in [k for k in store._blobs.keys() if k not in known]:
            problem, _ = store._blobs.inspect(key)
            if problem:
                found.problem(key, "blobs", problem, lambda k=key: _drop_blob(store, k))
    except Exception as err:
        store._warn_once("verify", err)
        found.bad.append(BadEntry("", "database", f"verify stopped: {type(err).__name__}: {err}"))
    mem = store._mem.verify(repair)
    return VerifyReport(checked + mem.checked, tuple(found.bad) + mem.bad,
                        found.repaired + mem.repaired)  # fmt: skip


class _Found:
    """Problems found, and repairs counted only when they succeed."""

    def __init__(self, repair: bool) -> None:
        self.repair = repair
        self.bad: list[BadEntry] = []
        self.repaired = 0

    def problem(self, key: str, where: str, reason: str, fix) -> bool:
        """Record a problem; with repair on, run fix() and count it if it worked. True when
        the problem is gone."""
        if not self.repair:
            self.bad.append(BadEntry(key, where, reason))
            return False
        try:
            fix()
        except Exception as err:
            self.bad.append(BadEntry(key, where, f"{reason}; repair failed: "
                                                 f"{type(err).__name__}: {err}"))  # fmt: skip
            return False
        self.bad.append(BadEntry(key, where, reason))
        self.repaired += 1
        return True


def _drop_blob(store: SqlStore, key: str) -> None:
    if not store._blobs.delete(key):
        raise OSError(f"the blob tier at {store._blobs.directory} did not drop it")


def _database_check(store: SqlStore) -> list[BadEntry]:
    if store._db.dialect.name != "sqlite":
        return []
    with store._read() as conn:
        rows = [r[0] for r in conn.execute(text("PRAGMA quick_check"))]
    return [] if rows == ["ok"] else [BadEntry("", "database", "; ".join(rows[:10]))]


def _verify_kernel(store: SqlStore, key: str, found: _Found) -> int:
    """Check (and repair) one kernel; 0 if its row vanished meanwhile, else 1."""
    query = select(
        kernels.c.sha256, kernels.c.size, kernels.c.cubin, kernels.c.created_at
    ).where(kernels.c.key == key)
    with store._read() as conn:
        row = conn.execute(query).first()
    if row is None:
        return 0

    problem, local = store._blobs.inspect(key, row.size)
    if problem is None and local is not None and local[0] != row.sha256:
        problem, local = "differs from the database copy", None
    if problem:
        found.problem(key, "blobs", problem, lambda: _drop_blob(store, key))

    data = bytes(row.cubin)
    if len(data) != row.size:
        problem = f"size {len(data)} != recorded {row.size} (truncated?)"
    elif hashlib.sha256(data).hexdigest() != row.sha256:
        problem = "sha256 mismatch"
    else:
        return 1
    if local is not None and len(local[1]) == row.size:
        # The blob tier holds an intact copy with the recorded hash: restore from it.
        def restore() -> None:
            with write_transaction(store._db) as conn:
                conn.execute(
                    update(kernels)
                    .where(kernels.c.key == key, kernels.c.created_at == row.created_at)
                    .values(cubin=local[1])
                )

        found.problem(key, "db", problem + "; intact copy in the blob tier", restore)
    else:
        found.problem(key, "db", problem, lambda: store._remove_kernel(key, row.created_at))
    return 1
