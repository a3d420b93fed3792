"""Cross-process locks: fcntl.flock on files in the cache directory (one node), and
PostgreSQL advisory locks (every node that shares the database).

Note [Why flock]
    The kernel releases a flock when the last descriptor of its holder closes, which
    includes the holder being killed with -9; so a dead compiler never blocks the others,
    and no expiry has to be guessed. A diskcache Lock with expiry would need an expiry
    longer than the slowest compile (minutes), during which a dead holder's lock would stall
    every waiter. Each acquisition opens its own descriptor, so two threads of one process
    exclude each other too. Waiting is a poll with a deadline: a lock held too long is
    reported (False), never waited on forever.

Note [Cluster single flight]
    On PostgreSQL, compile once means once per cluster, so the kernel lock lives in the
    database: a session-level advisory lock keyed by (schema, kernel key), taken on a
    connection of its own that stays checked out (and idle, outside any transaction) while
    the holder compiles. Its lease is the holder's session: the server drops the lock when
    the connection closes, at once when the holder process dies (its socket is closed), and
    within about 30 s when its node vanishes (server-side TCP keepalives, set in engine.py).
    A holder alive but stuck past the caller's timeout is not waited on (compile_once
    compiles anyway, with a warning). A node's processes first queue on the node's flock,
    so one connection per node, not per process, waits in the database.
"""
from __future__ import annotations

import fcntl
import hashlib
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from sqlalchemy import Connection, Engine

# Kernel locks are striped over a fixed set of files: lock files are never deleted (deleting
# a lock file races with a process that just opened it), so one file per key would grow
# without bound. Two keys sharing a stripe only means one waits for the other's compile.
KERNEL_LOCK_STRIPES = 1024


class FileLock:
    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self._fd: int | None = None

    def acquire(self, timeout_s: float) -> bool:
        """Take the lock, waiting at most timeout_s; False if it stayed held."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o666)
        deadline = time.monotonic() + max(0.0, timeout_s)
        pause = 0.001
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                self._fd = fd
                return True
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    os.close(fd)
                    return False
                time.sleep(pause)
                pause = min(pause * 2, 0.05)
            except BaseException:
                os.close(fd)
                raise

    def release(self) -> None:
        if self._fd is not None:
            fd, self._fd = self._fd, None
            os.close(fd)  # closing the only descriptor drops the flock

    @property
    def held(self) -> bool:
        return self._fd is not None


@contextmanager
def file_lock(path: Path, timeout_s: float) -> Iterator[bool]:
    """`with file_lock(p, 5) as held:` -- held is False when the wait timed out."""
    lock = FileLock(path)
    held = lock.acquire(timeout_s)
    try:
        yield held
    finally:
        lock.release()


def kernel_lock_path(cache_dir: Path, key: str) -> Path:
    stripe = int.from_bytes(hashlib.sha256(key.encode()).digest()[:4], "big")
    return Path(cache_dir) / "locks" / f"kernel-{stripe % KERNEL_LOCK_STRIPES:04d}.lock"


def migration_lock_path(db_path: Path) -> Path:
    """Beside the SQLite file whose schema it guards (PostgreSQL uses an advisory lock)."""
    return db_path.with_name(db_path.name + ".migrate.lock")


class AdvisoryLock:
    """A PostgreSQL session-level advisory lock (Note [Cluster single flight])."""

    def __init__(self, engine: Engine, name: str) -> None:
        self._engine = engine
        self._name = name
        self._conn: Connection | None = None

    def acquire(self, timeout_s: float) -> bool:
        """Take the lock, waiting at most timeout_s; False if it stayed held. Raises on a
        database error (the caller decides what to do without the lock)."""
        from sqlalchemy import text
        from sqlalchemy.exc import OperationalError

        conn = self._engine.connect()
        try:
            # lock_timeout bounds the wait; SET LOCAL ends with this transaction
            conn.execute(text(f"SET LOCAL lock_timeout = {max(1, int(timeout_s * 1000))}"))
            try:
                conn.execute(text(f"SELECT pg_advisory_lock({_LOCK_ID})"), {"n": self._name})
            except OperationalError as err:
                if getattr(err.orig, "sqlstate", None) != "55P03":  # lock_not_available
                    raise
                conn.rollback()
                conn.close()
                return False
            conn.commit()  # the lock outlives the transaction; the session holds it idle
        except BaseException:
            conn.invalidate()  # closing the session drops whatever it holds
            conn.close()
            raise
        self._conn = conn
        return True

    def release(self) -> None:
        conn, self._conn = self._conn, None
        if conn is None:
            return
        from sqlalchemy import text

        try:
            conn.execute(text(f"SELECT pg_advisory_unlock({_LOCK_ID})"), {"n": self._name})
            conn.commit()
        except Exception:
            conn.invalidate()  # the server drops the lock with the session
        finally:
            conn.close()


# The lock's 64-bit id, computed by the server from the schema and the name, so two stores in
# one database (two schemas) never wait on each other.
_LOCK_ID = "hashtextextended('fusion_cache.kernel:' || current_schema() || ':' || :n, 0)"
