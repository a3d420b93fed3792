"""Where a store lives: its URL, its node-local directory, and the settings read from the
environment. Plain Python: deciding where the store is must not import SQLAlchemy."""
from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path

DEFAULT_DIR = "~/.cache/fusion_cache"
DEFAULT_TIMEOUT_S = 30.0
DB_FILE = "store.db"
MEMORY_URL = "memory://"

@dataclass(frozen=True)
class Location:
    """A resolved store: the SQLAlchemy URL and the node-local directory (blobs, locks)."""

    url: str
    cache_dir: Path
    db_path: Path | None = None  # the SQLite file; None for a server database

    @property
    def is_sqlite(self) -> bool:
        return self.url.startswith("sqlite")

    @property
    def is_memory(self) -> bool:
        return self.url == MEMORY_URL


def env_cache_dir() -> Path:
    return Path(os.environ.get("FUSION_CACHE_DIR") or DEFAULT_DIR).expanduser()


MAX_TIMEOUT_S = 86400.0


def env_timeout() -> float:
    """Busy timeout and lock wait in seconds: FUSION_CACHE_DB_TIMEOUT, default 30. A value
    that is not a number of seconds from 0 to a day raises ValueError naming the variable
    (inf once meant an in-memory store, silently)."""
    text = os.environ.get("FUSION_CACHE_DB_TIMEOUT", "")
    if not text.strip():
        return DEFAULT_TIMEOUT_S
    return check_timeout(text, f"FUSION_CACHE_DB_TIMEOUT={text!r}")


def check_timeout(value: object, name: str) -> float:
    """value as seconds, or ValueError naming `name`."""
    try:
        seconds = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        seconds = math.nan
    if not 0 <= seconds <= MAX_TIMEOUT_S:  # also refuses nan
        raise ValueError(f"{name}: expected a number of seconds from 0 to {MAX_TIMEOUT_S:g}")
    return seconds


def normalize_url(url: str) -> str:
    """postgres:// and postgresql:// -> postgresql+psycopg:// (psycopg 3 is our driver)."""
    for prefix in ("postgres://", "postgresql://"):
        if url.startswith(prefix):
            return "postgresql+psycopg://" + url[len(prefix):]
    return url


def resolve_location(url: str | None, cache_dir: str | os.PathLike | None) -> Location:
    """url None -> FUSION_CACHE_DB_URL, else SQLite in the cache dir.

    The cache dir is `cache_dir`, else the SQLite file's folder for an explicit SQLite URL,
    else FUSION_CACHE_DIR, else ~/.cache/fusion_cache.
    """
    url = url or os.environ.get("FUSION_CACHE_DB_URL") or None
    explicit_dir = Path(cache_dir).expanduser() if cache_dir is not None else None
    if url is None:
        root = explicit_dir or env_cache_dir()
        db = root / DB_FILE
        return Location(f"sqlite:///{db}", root, db)
    url = normalize_url(url.strip())
    if url in (MEMORY_URL, "memory:", "memory"):
        return Location(MEMORY_URL, explicit_dir or env_cache_dir())
    if url.startswith("sqlite"):
        from sqlalchemy.engine import make_url  # an explicit URL: parse it as SQLAlchemy will

        parsed = make_url(url)
        database = parsed.database or ""
        if database in ("", ":memory:") or "mode=memory" in url:
            raise ValueError(f"an in-memory SQLite URL cannot be shared: use {MEMORY_URL}")
        # A URI filename ("file:...?mode=ro&uri=true") keeps its parameters.
        db = Path(database.removeprefix("file:")).expanduser()
        url = url if parsed.query else f"sqlite:///{db}"
        return Location(url, explicit_dir or db.parent, db)
    return Location(url, explicit_dir or env_cache_dir())


def display_url(url: str) -> str:
    """The URL with any password masked, for messages and stats."""
    if url == MEMORY_URL or url.startswith("sqlite"):
        return url  # no password to hide
    try:
        from sqlalchemy.engine import make_url

        return make_url(url).render_as_string(hide_password=True)
    except Exception:
        return url


