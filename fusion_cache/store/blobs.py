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
    The index (diskcache's own SQLite file) is trusted no more than the files: a row may
    name `../store.db`, an absolute path, a symlink or `/dev/zero`. `BytesOnlyDisk` reads
    only regular files inside the tier's directory, no more bytes than the store recorded
    for the key, and deletes nothing outside it; anything else is a miss that the store
    repairs by writing the entry again.
"""
from __future__ import annotations

import errno
import hashlib
import logging
import os
import re
import stat
import threading
from collections.abc import Iterator
from pathlib import Path

import diskcache
from diskcache.core import MODE_BINARY, MODE_PICKLE, MODE_RAW, UNKNOWN

from .entries import MAX_CUBIN_BYTES

log = logging.getLogger(__name__)

MAGIC = b"FCB1"
_HEADER = len(MAGIC) + 32
SIZE_LIMIT = 4 << 30  # bytes; diskcache evicts the oldest stored entries beyond it
# The only file names diskcache.Disk.filename gives our entries.
_ENTRY_FILE = re.compile(r"[0-9a-f]{2}/[0-9a-f]{2}/[0-9a-f]{28}\.val")


class UnsafeBlobError(Exception):
    """A value or key in the blob tier is pickled, or its row names a file we must not read;
    we never unpickle and never leave the tier's directory."""


class BytesOnlyDisk(diskcache.Disk):
    """diskcache's Disk, for bytes only and confined to its directory (Note [Blob tier])."""

    def __init__(self, directory, **kwargs) -> None:
        super().__init__(directory, **kwargs)
        self._root = os.path.realpath(directory)
        self._limit = threading.local()  # the most bytes the current read may return

    def read_limit(self, limit: int) -> None:
        self._limit.value = limit

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
        limit = getattr(self._limit, "value", MAX_CUBIN_BYTES + _HEADER)
        if mode == MODE_RAW and not read:
            data = bytes(value)
            if len(data) > limit:
                raise UnsafeBlobError(f"value of {len(data)} bytes, over the {limit} expected")
            return data
        if mode != MODE_BINARY or read:
            raise UnsafeBlobError(f"blob stored in mode {mode}, not as bytes")
        return self._read_inside(filename, limit)

    def _inside(self, filename: object) -> str:
        """The full path of an entry file named by the index, if it has the shape diskcache
        gives our files (`ab/cd/<28 hex>.val`) and its folders resolve inside the tier. The
        file itself is not followed: reads refuse a link, remove() drops only the link."""
        if not isinstance(filename, str) or not _ENTRY_FILE.fullmatch(filename):
            raise UnsafeBlobError(f"index names a path outside the tier: {filename!r}")
        folder = os.path.realpath(os.path.join(self._root, os.path.dirname(filename)))
        if os.path.commonpath([folder, self._root]) != self._root:
            raise UnsafeBlobError(f"index names a path outside the tier: {filename!r}")
        return os.path.join(folder, os.path.basename(filename))

    def _read_inside(self, filename: object, limit: int) -> bytes:
        full = self._inside(filename)
        try:
            fd = os.open(full, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        except OSError as err:
            if err.errno == errno.ELOOP:
                raise UnsafeBlobError(f"index names a link: {filename!r}") from None
            raise  # missing: diskcache reads that as a miss
        with os.fdopen(fd, "rb") as reader:
            info = os.fstat(reader.fileno())
            if not stat.S_ISREG(info.st_mode):
                raise UnsafeBlobError(f"index names a path outside the tier: {filename!r} is "
                                      "not a regular file")  # fmt: skip
            if info.st_size > limit:
                raise UnsafeBlobError(f"blob of {info.st_size} bytes, over the {limit} expected")
            data = reader.read(limit + 1)
        if len(data) > limit:  # grew while we read
            raise UnsafeBlobError(f"blob over the {limit} bytes expected")
        return data

    def remove(self, file_path):
        """Delete an entry's file (and its emptied subfolders) only inside the tier."""
        try:
            full = self._inside(file_path)
        except UnsafeBlobError:
            log.warning("fusion-cache blob tier: refused to delete %r, outside %s",
                        file_path, self._root)  # fmt: skip
            return
        try:
            os.remove(full)
        except OSError:
            return  # another process removed it first
        for folder in (os.path.dirname(full), os.path.dirname(os.path.dirname(full))):
            if folder == self._root or os.path.commonpath([folder, self._root]) != self._root:
                break
            try:
                os.rmdir(folder)  # only once empty
            except OSError:
                break


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

    def _fetch(self, key: str, size: int | None):
        """The raw value of `key`, reading at most the frame of a `size`-byte payload."""
        cache = self._open()
        limit = MAX_CUBIN_BYTES if size is None else size
        cache.disk.read_limit(limit + _HEADER)
        return cache.get(key)

    def get(self, key: str, size: int | None = None) -> tuple[str, bytes] | None:
        """(sha256 hex, payload) of an intact entry whose payload is at most `size` bytes
        (the size the store recorded), else None; a damaged or refused entry is dropped."""
        try:
            value = self._fetch(key, size)
        except UnsafeBlobError as err:
            log.warning("fusion-cache: refused the blob of %s (%s); dropping it", key, err)
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

    def delete(self, key: str) -> bool:
        """True when the key is gone from the tier afterwards (or the tier is off)."""
        try:
            cache = self._open()
            cache.delete(key)
            return key not in cache
        except _TierOff:
            return True
        except Exception as err:
            self._failed("delete", err)
            return False

    def inspect(self, key: str, size: int | None = None
                ) -> tuple[str | None, tuple[str, bytes] | None]:  # fmt: skip
        """(problem, (sha256 hex, payload)) without dropping anything: problem is None for
        an intact or absent entry; the pair is None unless the entry is intact."""
        try:
            value = self._fetch(key, size)
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
