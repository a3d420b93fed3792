"""Schema revisions: an old store upgrades with its data, the models match the migrations,
and a store from a newer fusion-cache is left alone."""
from __future__ import annotations

import hashlib
import sqlite3
import warnings

from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext

from fusion_cache.store import KernelMeta, MemoryStore, SqlStore, StoreWarning, migrate, open_store
from fusion_cache.store.engine import create_store_engine, resolve_location
from fusion_cache.store.models import VERSION_TABLE, Base

CUBIN = bytes(range(256)) * 8


def store_at_0001(cache_dir):
    """A store as revision 0001 left it, with one row per table (written as 0001's SQL)."""
    loc = resolve_location(None, cache_dir)
    loc.cache_dir.mkdir(parents=True)
    engine = create_store_engine(loc, 5)
    assert migrate.upgrade(engine, loc, 5, target="0001") == "0001"
    engine.dispose()
    with sqlite3.connect(loc.db_path) as db:
        db.execute("INSERT INTO fc_fusions VALUES (0, 'def-a', '[1]', 'def a(fd): ...', 100.0)")
        db.execute("INSERT INTO fc_fusions VALUES (1, 'def-b', '[2]', 'def b(fd): ...', 101.0)")
        db.execute("INSERT INTO fc_plans VALUES (1, 'sig', 'sm_90', '{\"p\": 1}', 102.0)")
        db.execute(
            "INSERT INTO fc_kernels VALUES ('kern', 'k', 90, '13.0', '[\"-O3\"]', '// src',"
            " 'pointwise', '{}', 12.5, ?, ?, ?, 103.0)",
            (hashlib.sha256(CUBIN).hexdigest(), len(CUBIN), CUBIN),
        )
        db.execute("INSERT INTO fc_fusion_kernels VALUES (1, 'kern')")
    return loc


def test_0001_store_upgrades_to_head_with_its_data(fresh_store):
    loc = store_at_0001(fresh_store)
    with sqlite3.connect(loc.db_path) as db:
        columns = [r[1] for r in db.execute("PRAGMA table_info(fc_kernels)")]
    assert "hits" not in columns
    store = open_store()
    try:
        assert isinstance(store, SqlStore)
        assert store.stats()["schema_revision"] == migrate.head_revision() == "0002"
        assert [(f.id, f.definition_key) for f in store.fusions()] == [(0, "def-a"), (1, "def-b")]
        assert store.fusion_by_id(0).python_definition == "def a(fd): ..."
        assert store.get_plan(1, "sig", "sm_90") == '{"p": 1}'
        entry = store.kernel_meta("kern")
        assert (entry.hits, entry.last_used, entry.created_at) == (0, 103.0, 103.0)
        assert entry.meta == KernelMeta("k", 90, "13.0", ("-O3",), "// src", "pointwise", "{}",
                                        12.5)
        assert store.get_kernel("kern") == CUBIN
        assert [k.key for k in store.kernels(1)] == ["kern"]
        assert store.fusion_id_for("def-b", "", "") == 1
        assert store.fusion_id_for("def-c", "", "") == 2
        assert store.verify().ok
    finally:
        store.close()


def test_models_match_the_migrations(fresh_store):
    with open_store() as store:
        with store._engine.connect() as conn:
            ctx = MigrationContext.configure(conn, opts={"version_table": VERSION_TABLE})
            assert compare_metadata(ctx, Base.metadata) == []


def test_opening_at_head_is_one_read(fresh_store):
    open_store().close()
    with sqlite3.connect(fresh_store / "store.db") as db:
        assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert db.execute("PRAGMA auto_vacuum").fetchone()[0] == 2  # incremental
    lock = fresh_store / "store.db.migrate.lock"
    lock.unlink()
    open_store().close()
    assert not lock.exists()  # already at head: no lock taken


def test_newer_schema_is_left_alone(fresh_store):
    with open_store() as store:
        store.fusion_id_for("kept", "[]", "")
    with sqlite3.connect(fresh_store / "store.db") as db:
        db.execute(f"UPDATE {VERSION_TABLE} SET version_num = '0099'")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        store = open_store()
    assert isinstance(store, MemoryStore)
    assert len(caught) == 1 and caught[0].category is StoreWarning
    assert "newer schema" in str(caught[0].message) and "0099" in str(caught[0].message)
    assert store.fusion_id_for("x", "[]", "") == 0  # works, in memory
    with sqlite3.connect(fresh_store / "store.db") as db:  # and the database is untouched
        assert db.execute(f"SELECT version_num FROM {VERSION_TABLE}").fetchall() == [("0099",)]
        assert db.execute("SELECT definition_key FROM fc_fusions").fetchall() == [("kept",)]


def test_head_revision_constant_matches_alembic():
    """The fast open path trusts HEAD_REVISION; it must be Alembic's head."""
    from fusion_cache.store import migrate

    assert migrate.HEAD_REVISION == migrate._scripts().get_current_head()
