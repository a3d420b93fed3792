"""open_store and the process-wide default store.

open_store never raises for an unusable store (Note [Degrade, never crash]): it warns once,
naming the cause, and returns a MemoryStore so the process keeps compiling in memory.
"""
from __future__ import annotations

import errno
import os
import threading
import warnings
from pathlib import Path

from .entries import NewerSchemaError, StoreWarning
from .location import check_timeout, display_url, env_timeout, resolve_location
from .memory import MemoryStore
from .sql_store import SqlStore
from .store import Store


def open_store(
    url: str | None = None,
    cache_dir: str | os.PathLike | None = None,
    *,
    timeout_s: float | None = None,
) -> Store:
    """Open (creating and migrating as needed) the store at `url`.

    url None -> FUSION_CACHE_DB_URL, else SQLite at <cache_dir or FUSION_CACHE_DIR or
    ~/.cache/fusion_cache>/store.db; cubin blobs and locks live in that directory (for a
    PostgreSQL URL too, where a directory that cannot be created only turns them off).
    `memory://` asks for a MemoryStore. timeout_s (default
    FUSION_CACHE_DB_TIMEOUT or 30) bounds every wait for a lock or a busy database; a
    nonsensical one raises ValueError naming the setting.
    """
    # settings that make no sense are the caller's mistake, not store trouble: raise
    timeout = env_timeout() if timeout_s is None else check_timeout(timeout_s, "timeout_s")
    shown = url or os.environ.get("FUSION_CACHE_DB_URL") or "the default store"
    loc = None
    try:
        loc = resolve_location(url, cache_dir)
        shown = display_url(loc.url)
        if loc.is_memory:
            return MemoryStore()
        return SqlStore.open(loc, timeout)
    except Exception as err:
        cause = describe_failure(err, timeout)
        if loc is not None and loc.db_path is not None:
            cause += wal_leftover_hint(loc.db_path)
        warnings.warn(
            f"fusion-cache: cannot use the store at {shown} ({cause}); using an in-memory "
            "store, so kernels compiled by this process will not be kept",
            StoreWarning,
            stacklevel=2,
        )
        return MemoryStore(reason=cause)


def describe_failure(err: BaseException, timeout_s: float) -> str:
    """A short human cause: the five ways a store is unusable, else the exception."""
    text = str(err).lower()
    detail = f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}"
    if isinstance(err, NewerSchemaError):
        return f"newer schema: {err}"
    if isinstance(err, NotADirectoryError) and "cache directory" in text:
        return str(err)
    if "database is locked" in text or "lock timeout" in text or "held for more" in text:
        return f"locked for more than {timeout_s:g} s ({detail})"
    if (isinstance(err, OSError) and err.errno == errno.ENOSPC) or "disk is full" in text:
        return f"disk full ({detail})"
    if (
        isinstance(err, PermissionError)
        or (isinstance(err, OSError) and err.errno in (errno.EROFS, errno.EACCES, errno.ENOTDIR))
        or "readonly" in text
        or "read-only" in text
        or "unable to open database" in text
    ):
        return f"read-only or not creatable ({detail})"
    if "connect" in text or "could not translate host" in text or "timeout" in text:
        return f"unreachable ({detail})"
    return detail


def wal_leftover_hint(db_path: Path) -> str:
    """The way out when SQLite's -wal/-shm files beside the database are not ours to write:
    a process of their owner stopped without closing the store (killed), and until the
    leftovers go every other user's process falls back to memory. Deleting them blindly
    could lose what the WAL holds, and a process of theirs may still be running, so we say
    how rather than remove them."""
    stuck = [p for p in (Path(f"{db_path}-wal"), Path(f"{db_path}-shm"))
             if p.exists() and not os.access(p, os.W_OK)]  # fmt: skip
    if not stuck:
        return ""
    owners = sorted({str(p.stat().st_uid) for p in stuck})
    names = " and ".join(p.name for p in stuck)
    return (f"; {names} (owner uid {', '.join(owners)}) are not writable by this user "
            f"(uid {os.geteuid()}): left by a process of their owner that did not close the "
            f"store. Open it once as that user (`fusion-cache stats`), which folds them into "
            f"{db_path.name} and removes them, or, when no process uses the store, delete both "
            f"files (what they hold is compiled again)")


_default: Store | None = None
_default_lock = threading.Lock()


def default_store() -> Store:
    """The process-wide store, opened on first use from the environment."""
    global _default
    with _default_lock:
        if _default is None:
            _default = open_store()
        return _default


def reset_default_store() -> None:
    """Close and forget the default store (tests call this when FUSION_CACHE_DIR changes)."""
    global _default
    with _default_lock:
        store, _default = _default, None
    if store is not None:
        store.close()
