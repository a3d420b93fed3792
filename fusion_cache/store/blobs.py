"""The node-local cubin tier: a diskcache of framed bytes in front of the database.

Note [Blob tier]
    The database holds every cubin and stays the source of truth (a PostgreSQL cluster
    shares cubins through it); this tier keeps a node-local copy so a hit reads a local
    file instead of fetching the bytes again. It is a cache: every failure here is a miss,
    logged once, never an error for the caller.
    Values are bytes and only bytes: `BytesOnlyDisk` refuses to store anything else and
    refuses to read back a value diskcache would unpickle (someone else's writes into our
    directory must not become code execution). Each value is framed as
    MAGIC + sha256(payload) + payload, so a truncated or altered file is caught without
    asking the database.
"""
from __future__ import annotations

import hashlib
import logging
import os
from collections.abc import Iterator
from pathlib import Path

import diskcache
from diskcache.core import MODE_PICKLE, UNKNOWN

log = logging.getLogger(__name__)

MAGIC = b"FCB1"
_HEADER = len(MAGIC) + 32
SIZE_LIMIT = 4 << 30  # bytes; diskcache evicts the oldest stored entries beyond it


class UnsafeBlobError(Exception):
    """A value or key in the blob tier is pickled; we never unpickle."""


class BytesOnlyDisk(diskcache.Disk):
    def put(self, key):
        if type(key) is not str:
            raise TypeError("blob tier keys are str")
        return super().put(key)

    def get(self, key, raw):
        if not raw:
            raise UnsafeBlobError("pickled key in the blob tier")
        return super().get(key, raw)

    def store(self, value, read, key=UNKNOWN):
        if type(value) is not bytes:
            raise TypeError("blob tier values are bytes")
        return super().store(value, read, key=key)

    def fetch(self, mode, filename, value, read):
        if mode == MODE_PICKLE:
            raise UnsafeBlobError("pickled value in the blob tier")
        return super().fetch(mode, filename, value, read)


def frame(payload: bytes) -> bytes:
    return MAGIC + hashlib.sha256(payload).digest() + payload


def unframe(value: object) -> tuple[str, bytes] | None:
    """(sha256 hex, payload) if value is an intact frame, else None."""
    if not isinstance(value, bytes) or len(value) < _HEADER or not value.startswith(MAGIC):
        return None
    digest, payload = value[len(MAGIC):_HEADER], value[_HEADER:]
    if hashlib.sha256(payload).digest() != digest:
        return None
    return digest.hex(), payload


class _TierOff(Exception):
    """The tier's directory is unusable (BlobTier.usable False)."""


class BlobTier:
    """Best-effort: methods never raise; failures read as misses."""

    def __init__(self, directory: Path, timeout_s: float, usable: bool = True) -> None:
        self.directory = Path(directory)
        self.usable = usable  # False: the directory cannot exist; every call is a quiet miss
        self._timeout = timeout_s
        self._pid = -1
        self._cache: diskcache.Cache | None = None
        self._warned = False

    def _open(self) -> diskcache.Cache:
        if not self.usable:
            raise _TierOff
        # A Cache inherited through fork shares its parent's SQLite handles: open our own.
        if self._cache is None or self._pid != os.getpid():
            self._cache = diskcache.Cache(
                str(self.directory),
                timeout=self._timeout,
                disk=BytesOnlyDisk,
                size_limit=SIZE_LIMIT,
                eviction_policy="least-recently-stored",  # no write per read
                disk_min_file_size=0,  # every cubin a file of its own
            )
            self._pid = os.getpid()
        return self._cache

    def _failed(self, op: str, err: BaseException) -> None:
        if isinstance(err, _TierOff):
            return
        level = logging.DEBUG if self._warned else logging.WARNING
        self._warned = True
        log.log(level, "fusion-cache blob tier %s failed at %s: %r", op, self.directory, err)

    def get(self, key: str) -> tuple[str, bytes] | None:
        try:
            value = self._open().get(key)
        except UnsafeBlobError as err:
            log.warning("fusion-cache: refused %s for %s; dropping it", err, key)
            self.delete(key)
            return None
        except Exception as err:
            self._failed("get", err)
            return None
        if value is None:
            return None
        framed = unframe(value)
        if framed is None:
            log.warning("fusion-cache: damaged blob for %s; dropping it", key)
            self.delete(key)
        return framed

    def put(self, key: str, payload: bytes) -> None:
        try:
            self._open().set(key, frame(payload))
        except Exception as err:
            self._failed("put", err)

    def delete(self, key: str) -> None:
        try:
            self._open().delete(key)
        except Exception as err:
            self._failed("delete", err)

    def inspect(self, key: str) -> tuple[str | None, tuple[str, bytes] | None]:
        """(problem, (sha256 hex, payload)) without dropping anything: problem is None for
        an intact or absent entry; the pair is None unless the entry is intact."""
        try:
            value = self._open().get(key)
        except UnsafeBlobError as err:
            return str(err), None
        except _TierOff:
            return None, None
        except Exception as err:
            return f"unreadable: {err!r}", None
        if value is None:
            return None, None
        framed = unframe(value)
        if framed is None:
            return "truncated or altered (frame hash mismatch)", None
        return None, framed

    def keys(self) -> Iterator[str]:
        try:
            yield from self._open().iterkeys()
        except Exception as err:
            self._failed("iterate", err)

    def usage(self) -> tuple[int, int]:
        """(entries, bytes of their files); volume() would add diskcache's own index."""
        try:
            cache = self._open()
            return len(cache), int(cache.reset("size"))  # reads the stored total
        except Exception as err:
            self._failed("stat", err)
            return 0, 0

    def close(self) -> None:
        if self._cache is not None and self._pid == os.getpid():
            try:
                self._cache.close()
            except Exception:
                pass
        self._cache = None
