"""The SQLAlchemy engine that talks to a store, and the SQL helpers every writer shares.

Imported only when a store needs SQLAlchemy (a write, a miss, maintenance, a server store):
a warm SQLite hit reads through sqlite_reader.py and never imports it (Note [Warm path]).

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
from collections.abc import Iterator
from contextlib import contextmanager

from sqlalchemy import Connection, Engine, create_engine, event, text
from sqlalchemy.dialects import postgresql, sqlite

from .location import (  # noqa: F401  (re-exported: where a store lives)
    DB_FILE,
    DEFAULT_DIR,
    DEFAULT_TIMEOUT_S,
    MAX_TIMEOUT_S,
    MEMORY_URL,
    Location,
    check_timeout,
    display_url,
    env_cache_dir,
    env_timeout,
    normalize_url,
    resolve_location,
)
from .schema import VERSION_TABLE

# Execution option that makes the SQLite 'begin' hook take the write lock at BEGIN.
_WRITE = "fusion_cache_write"


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


def upsert_many(conn: Connection, table, rows: list[dict], keys: list[str]) -> None:
    """`upsert` of each row, in order, as one statement executed for all of them."""
    if not rows:
        return
    stmt = _dialect_insert(conn, table)
    changes = {k: stmt.excluded[k] for k in rows[0] if k not in keys}
    conn.execute(stmt.on_conflict_do_update(index_elements=keys, set_=changes), rows)


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
