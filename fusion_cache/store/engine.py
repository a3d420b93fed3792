"""Where a store lives (URL, cache dir) and the SQLAlchemy engine that talks to it.

Note [SQLite transactions]
    The database is shared by every process of a node. WAL lets readers run beside one
    writer; `synchronous=NORMAL` in WAL mode survives a killed process (only an OS crash can
    lose the last commits). pysqlite's own BEGIN handling is switched off and we emit BEGIN
    ourselves: plain (deferred) for readers, IMMEDIATE for writers, so a writer takes the
    write lock up front and waits for it under the busy timeout instead of failing with
    SQLITE_BUSY when it upgrades a read lock halfway through a transaction.
"""
from __future__ import annotations

import math
import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from sqlalchemy import Connection, Engine, create_engine, event, text
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import make_url

from .models import VERSION_TABLE

DEFAULT_DIR = "~/.cache/fusion_cache"
DEFAULT_TIMEOUT_S = 30.0
DB_FILE = "store.db"
MEMORY_URL = "memory://"

# Execution option that makes the SQLite 'begin' hook take the write lock at BEGIN.
_WRITE = "fusion_cache_write"


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
    if url == MEMORY_URL:
        return url
    try:
        return make_url(url).render_as_string(hide_password=True)
    except Exception:
        return url


def create_store_engine(loc: Location, timeout_s: float) -> Engine:
    if loc.is_sqlite:
        return _sqlite_engine(loc, timeout_s)
    return _server_engine(loc, timeout_s)


def _sqlite_engine(loc: Location, timeout_s: float) -> Engine:
    engine = create_engine(loc.url, connect_args={"timeout": timeout_s})
    busy_ms = int(timeout_s * 1000)

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_conn, _record) -> None:
        dbapi_conn.isolation_level = None  # Note [SQLite transactions]
        cur = dbapi_conn.cursor()
        cur.execute(f"PRAGMA busy_timeout = {busy_ms}")
        cur.execute("PRAGMA synchronous = NORMAL")
        cur.execute("PRAGMA foreign_keys = ON")
        cur.close()

    @event.listens_for(engine, "begin")
    def _on_begin(conn: Connection) -> None:
        write = conn.get_execution_options().get(_WRITE, False)
        conn.exec_driver_sql("BEGIN IMMEDIATE" if write else "BEGIN")

    return engine


def _server_engine(loc: Location, timeout_s: float) -> Engine:
    connect_args = {}
    if loc.url.startswith("postgresql"):
        # whole seconds, and libpq waits at least 2; one connect attempt per open (migrate.py)
        connect_args["connect_timeout"] = max(2, math.ceil(timeout_s))
    # pre_ping: a server restart between two operations costs a reconnect, not an error.
    engine = create_engine(loc.url, connect_args=connect_args, pool_pre_ping=True)
    if engine.dialect.name == "postgresql":
        lock_ms = int(timeout_s * 1000)

        @event.listens_for(engine, "connect")
        def _on_connect(dbapi_conn, _record) -> None:
            # Waiting for a row or advisory lock gives up after the timeout instead of hanging.
            # The keepalives end the session of a vanished node (and free its kernel locks)
            # in about 30 s (Note [Cluster single flight]); ignored over a Unix socket.
            with dbapi_conn.cursor() as cur:
                cur.execute(f"SET lock_timeout = {lock_ms}; SET tcp_keepalives_idle = 15; "
                            "SET tcp_keepalives_interval = 5; SET tcp_keepalives_count = 3")
            dbapi_conn.commit()

    return engine


def prepare_sqlite_file(engine: Engine) -> None:
    """One-time settings stored in the SQLite file itself: WAL journal, and incremental
    auto-vacuum (only settable before the first table) so prune can return space. Callers
    hold the migration lock: changing the journal mode needs the database to themselves."""
    raw = engine.raw_connection()  # pysqlite in autocommit: PRAGMAs run outside a BEGIN
    try:
        cur = raw.cursor()
        if cur.execute("SELECT count(*) FROM sqlite_master").fetchone()[0] == 0:
            cur.execute("PRAGMA auto_vacuum = INCREMENTAL")
        mode = cur.execute("PRAGMA journal_mode").fetchone()[0]
        if str(mode).lower() != "wal":
            cur.execute("PRAGMA journal_mode = WAL").fetchall()
        cur.close()
    finally:
        raw.close()


@contextmanager
def write_transaction(engine: Engine) -> Iterator[Connection]:
    """A committed-on-success transaction that holds SQLite's write lock from its BEGIN."""
    with engine.connect() as conn:
        conn.execution_options(**{_WRITE: True})
        with conn.begin():
            yield conn


def probe_writable(engine: Engine) -> None:
    """Raise if this process cannot write (read-only file or server, lock held too long)."""
    with engine.connect() as conn:
        conn.execution_options(**{_WRITE: True})
        with conn.begin() as txn:
            if conn.dialect.name == "postgresql":
                if conn.exec_driver_sql("SHOW transaction_read_only").scalar() == "on":
                    raise PermissionError("the PostgreSQL server is read-only")
            else:
                # BEGIN IMMEDIATE succeeds on a read-only SQLite file; a write does not.
                # Rolled back, so nothing reaches the file.
                conn.exec_driver_sql(f"UPDATE {VERSION_TABLE} SET version_num = version_num")
            txn.rollback()


def insert_ignore(conn: Connection, table, values: dict | list[dict]) -> None:
    """INSERT that leaves an existing row (same primary/unique key) alone."""
    conn.execute(_dialect_insert(conn, table).on_conflict_do_nothing(), values)


def upsert(conn: Connection, table, values: dict, keys: list[str]) -> None:
    """INSERT, or UPDATE the non-key columns of the row with the same `keys`."""
    stmt = _dialect_insert(conn, table).values(values)
    changes = {k: stmt.excluded[k] for k in values if k not in keys}
    conn.execute(stmt.on_conflict_do_update(index_elements=keys, set_=changes))


def _dialect_insert(conn: Connection, table):
    name = conn.dialect.name
    if name == "sqlite":
        return sqlite.insert(table)
    if name == "postgresql":
        return postgresql.insert(table)
    raise NotImplementedError(f"fusion-cache store supports SQLite and PostgreSQL, not {name}")


def lock_fusion_ids(conn: Connection) -> None:
    """Serialise fusion id allocation (max + 1) across processes, for this transaction.

    SQLite: the IMMEDIATE transaction already holds the database's single write lock.
    PostgreSQL: EXCLUSIVE mode blocks other writers of the table but not its readers.
    """
    if conn.dialect.name == "postgresql":
        conn.execute(text("LOCK TABLE fc_fusions IN EXCLUSIVE MODE"))
