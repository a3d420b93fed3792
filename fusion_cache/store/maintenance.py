"""verify(): every stored cubin checked against its sha256, in the database and in this
node's blob tier, with optional repair. Kept apart from SqlStore's hot paths."""
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
    bad: list[BadEntry] = []
    repaired = 0
    checked = 0
    try:
        bad += _database_check(store)
        with store._read() as conn:
            keys = list(conn.execute(select(kernels.c.key).order_by(kernels.c.key)).scalars())
        for key in keys:
            found, fixed = _verify_kernel(store, key, repair)
            checked += found is not None
            bad += found or []
            repaired += fixed
        known = set(keys)
        for key in [k for k in store._blobs.keys() if k not in known]:
            problem, _ = store._blobs.inspect(key)
            if problem:
                bad.append(BadEntry(key, "blobs", problem))
                if repair:
                    store._blobs.delete(key)
                    repaired += 1
    except Exception as err:
        store._warn_once("verify", err)
        bad.append(BadEntry("", "database", f"verify stopped: {type(err).__name__}: {err}"))
    mem = store._mem.verify(repair)
    return VerifyReport(checked + mem.checked, tuple(bad) + mem.bad, repaired + mem.repaired)


def _database_check(store: SqlStore) -> list[BadEntry]:
    if store._db.dialect.name != "sqlite":
        return []
    with store._read() as conn:
        rows = [r[0] for r in conn.execute(text("PRAGMA quick_check"))]
    return [] if rows == ["ok"] else [BadEntry("", "database", "; ".join(rows[:10]))]


def _verify_kernel(store: SqlStore, key: str, repair: bool) -> tuple[list[BadEntry] | None, int]:
    """(problems found, or None if the row vanished meanwhile; entries repaired)."""
    query = select(
        kernels.c.sha256, kernels.c.size, kernels.c.cubin, kernels.c.created_at
    ).where(kernels.c.key == key)
    with store._read() as conn:
        row = conn.execute(query).first()
    if row is None:
        return None, 0
    bad: list[BadEntry] = []
    fixed = 0

    problem, local = store._blobs.inspect(key, row.size)
    if problem is None and local is not None and local[0] != row.sha256:
        problem, local = "differs from the database copy", None
    if problem:
        bad.append(BadEntry(key, "blobs", problem))
        if repair:
            store._blobs.delete(key)
            fixed += 1

    data = bytes(row.cubin)
    if len(data) != row.size:
        problem = f"size {len(data)} != recorded {row.size} (truncated?)"
    elif hashlib.sha256(data).hexdigest() != row.sha256:
        problem = "sha256 mismatch"
    else:
        return bad, fixed
    if local is not None and len(local[1]) == row.size:
        # The blob tier holds an intact copy with the recorded hash: restore from it.
        bad.append(BadEntry(key, "db", problem + "; intact copy in the blob tier"))
        if repair:
            restore = (
                update(kernels)
                .where(kernels.c.key == key, kernels.c.created_at == row.created_at)
                .values(cubin=local[1])
            )
            with write_transaction(store._db) as conn:
                conn.execute(restore)
            fixed += 1
    else:
        bad.append(BadEntry(key, "db", problem))
        if repair:
            store._remove_kernel(key, row.created_at)
            fixed += 1
    return bad, fixed
