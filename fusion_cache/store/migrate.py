"""Bring a store's schema to the head revision, once, however many processes open it.

Note [Serialised migrations]
    Opening a store checks the schema revision with one read; at head (the common case)
    nothing else happens. Otherwise the opener takes a lock, re-checks, and upgrades inside
    one transaction, so processes starting together on a cold store see either no schema
    or the finished one:
      SQLite      an flock on `<db>.migrate.lock` (released if the holder dies), then an
                  IMMEDIATE transaction; SQLite's DDL is transactional.
      PostgreSQL  pg_advisory_xact_lock inside the migration transaction: cluster-wide,
                  released at commit or when the connection dies.
    A revision this code does not know means a newer fusion-cache migrated the database:
    NewerSchemaError, and the caller degrades instead of touching it.
"""
from __future__ import annotations

import functools
import hashlib
from pathlib import Path
from typing import TYPE_CHECKING

from sqlalchemy import Connection, Engine, text
from sqlalchemy.exc import SQLAlchemyError

import migrations

from .engine import Location, prepare_sqlite_file, write_transaction
from .entries import NewerSchemaError, StoreError
from .locks import file_lock, migration_lock_path
from .schema import HEAD_REVISION, VERSION_TABLE

if TYPE_CHECKING:
    from alembic.config import Config
    from alembic.script import ScriptDirectory


SCRIPT_LOCATION = Path(migrations.__file__).resolve().parent


def alembic_config(connection: Connection | None = None, url: str | None = None) -> Config:
    """A Config with no alembic.ini behind it: script_location is the installed package."""
    from alembic.config import Config

    cfg = Config()
    cfg.set_main_option("script_location", str(SCRIPT_LOCATION))
    if url is not None:
        cfg.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    cfg.attributes["connection"] = connection
    return cfg


@functools.cache
def _scripts() -> ScriptDirectory:
    from alembic.script import ScriptDirectory

    return ScriptDirectory.from_config(alembic_config())


def head_revision() -> str:
    return _scripts().get_current_head()


def _resolve(revision: str) -> str:
    return _scripts().get_revision(revision).revision


def current_revision(conn: Connection) -> str | None:
    from alembic.runtime.migration import MigrationContext

    ctx = MigrationContext.configure(conn, opts={"version_table": VERSION_TABLE})
    return ctx.get_current_revision()


def read_revision(engine: Engine) -> str | None:
    with engine.connect() as conn:
        return current_revision(conn)


def check_known(revision: str | None) -> None:
    if revision is None or revision == HEAD_REVISION:
        return
    from alembic.util import CommandError

    try:
        _scripts().get_revision(revision)
    except CommandError:
        raise NewerSchemaError(
            f"schema revision {revision!r} is newer than this fusion-cache knows "
            f"(head {head_revision()!r}); upgrade fusion-cache or use another store"
        ) from None


def upgrade(engine: Engine, loc: Location, timeout_s: float, target: str = "head") -> str:
    """Upgrade to `target` (default head) under the migration lock; returns the revision."""
    if target == "head" and _fast_revision(engine) == HEAD_REVISION:
        return HEAD_REVISION
    want = _resolve(target)
    have = read_revision(engine)
    check_known(have)
    if have == want:
        return have
    if loc.db_path is None:
        return _upgrade_locked(engine, want)
    lock_path = migration_lock_path(loc.db_path)
    with file_lock(lock_path, timeout_s) as held:
        if not held:
            raise StoreError(f"migration lock {lock_path} held for more than {timeout_s:g} s")
        prepare_sqlite_file(engine)
        return _upgrade_locked(engine, want)


def _upgrade_locked(engine: Engine, want: str) -> str:
    with write_transaction(engine) as conn:
        if conn.dialect.name == "postgresql":
            conn.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": _advisory_key(conn)})
        have = current_revision(conn)  # someone may have finished while we waited
        check_known(have)
        if have != want:
            from alembic import command

            command.upgrade(alembic_config(conn), want)
        return want


def _fast_revision(engine: Engine) -> str | None:
    """The stored revision by one plain query; None when the table is missing or unreadable.
    A database that cannot be reached raises here: trying again would wait a second timeout."""
    with engine.connect() as conn:
        try:
            rows = conn.execute(text(f"SELECT version_num FROM {VERSION_TABLE}")).fetchall()
        except SQLAlchemyError:
            return None
    return rows[0][0] if len(rows) == 1 else None


def _advisory_key(conn: Connection) -> int:
    """A 63-bit lock id per schema, so two stores in one database don't wait on each other."""
    schema = conn.execute(text("SELECT current_schema()")).scalar() or ""
    digest = hashlib.sha256(f"fusion_cache.migrate:{schema}".encode()).digest()
    return int.from_bytes(digest[:8], "big") >> 1
