"""An unusable store degrades to memory with exactly one warning; an operation that fails
on an open store keeps its entry in memory, warns once, and never raises."""
from __future__ import annotations

import sqlite3
import time
import warnings

import pytest
from sqlalchemy import event

from fusion_cache.store import KernelMeta, MemoryStore, SqlStore, StoreWarning, open_store
from fusion_cache.store.locks import FileLock
from fusion_cache.store.sql_store import OVERLAY_ID_BASE


def meta() -> KernelMeta:
    return KernelMeta("k", 90, "13.0", (), "// src")


def open_warned(*args, **kwargs):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        t0 = time.monotonic()
        store = open_store(*args, **kwargs)
        elapsed = time.monotonic() - t0
    return store, caught, elapsed


def assert_works_in_memory(store) -> None:
    assert isinstance(store, MemoryStore) and not store.persistent
    assert store.fusion_id_for("a", "[]", "") == 0
    assert store.fusion_id_for("b", "[]", "") == 1
    store.put_plan(0, "s", "t", "{}")
    assert store.get_plan(0, "s", "t") == "{}"
    assert store.compile_once("k", lambda: (b"cubin", meta())) == (b"cubin", True)
    assert store.compile_once("k", lambda: (b"other", meta())) == (b"cubin", False)


def check_one_warning(caught, *words: str) -> None:
    assert len(caught) == 1, [str(w.message) for w in caught]
    assert caught[0].category is StoreWarning
    text = str(caught[0].message)
    for word in words:
        assert word in text, text


def test_directory_that_cannot_be_created(tmp_path):
    # Tests run as root, where chmod stops nothing: a regular file where a folder should be.
    (tmp_path / "file").write_text("x")
    store, caught, _ = open_warned(cache_dir=tmp_path / "file" / "cache")
    check_one_warning(caught, "read-only or not creatable", "in-memory")
    assert_works_in_memory(store)
    assert "Errno" in store.reason or "Directory" in store.reason


def test_read_only_database(fresh_store):
    with open_store() as store:
        store.put_kernel("k", b"cubin", meta())
    url = f"sqlite:///file:{fresh_store / 'store.db'}?mode=ro&uri=true"  # as on a ro mount
    store, caught, _ = open_warned(url)
    check_one_warning(caught, "read-only")
    assert_works_in_memory(store)


def test_database_locked_beyond_the_timeout(fresh_store):
    open_store().close()
    blocker = sqlite3.connect(fresh_store / "store.db", isolation_level=None)
    blocker.execute("BEGIN IMMEDIATE")  # a writer that never finishes
    try:
        store, caught, elapsed = open_warned(timeout_s=0.3)
    finally:
        blocker.execute("ROLLBACK")
        blocker.close()
    check_one_warning(caught, "locked for more than 0.3 s")
    assert elapsed < 5
    assert_works_in_memory(store)


def test_migration_lock_held_beyond_the_timeout(fresh_store):
    fresh_store.mkdir(parents=True)
    lock = FileLock(fresh_store / "store.db.migrate.lock")
    assert lock.acquire(1)  # another process stuck in its migration of this cold store
    try:
        store, caught, elapsed = open_warned(timeout_s=0.3)
    finally:
        lock.release()
    check_one_warning(caught, "locked for more than 0.3 s")
    assert elapsed < 5
    assert_works_in_memory(store)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert isinstance(open_store(), SqlStore)  # once released, the store opens


def test_unreachable_server():
    pytest.importorskip("psycopg")
    store, caught, elapsed = open_warned("postgresql://postgres@127.0.0.1:1/test", timeout_s=2)
    check_one_warning(caught, "unreachable", "127.0.0.1:1")
    assert elapsed < 10
    assert_works_in_memory(store)


def test_password_is_not_shown(tmp_path):
    pytest.importorskip("psycopg")
    store, caught, _ = open_warned("postgresql://u:secret@127.0.0.1:1/x", timeout_s=2)
    assert "secret" not in str(caught[0].message)


def test_operations_on_a_locked_store_keep_working_in_memory(fresh_store):
    store = open_store(timeout_s=0.2)
    fid = store.fusion_id_for("persisted", "[]", "")
    store.put_kernel("old", b"old", meta())
    blocker = sqlite3.connect(fresh_store / "store.db", isolation_level=None)
    blocker.execute("BEGIN IMMEDIATE")
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            new = store.fusion_id_for("new", "[]", "")
            store.put_plan(new, "s", "t", "{}")
            store.put_plan(fid, "s", "t", '{"p": 1}')
            store.put_kernel("k", b"cubin", meta())
            store.link_kernel(new, "k")
            assert store.compile_once("k2", lambda: (b"two", meta())) == (b"two", True)
            assert store.get_kernel("k") == b"cubin"
            assert store.get_kernel("old") == b"old"  # reads still work under WAL
            assert store.get_plan(new, "s", "t") == "{}"
            assert store.get_plan(fid, "s", "t") == '{"p": 1}'
            assert [k.key for k in store.kernels(new)] == ["k"]
            assert store.fusion_id_for("new", "", "") == new
        check_one_warning(caught, "locked")
        assert new >= OVERLAY_ID_BASE  # never confused with a database id
    finally:
        blocker.execute("ROLLBACK")
        blocker.close()
    # The lock is gone: new entries persist again, the in-memory ones stay visible.
    assert store.fusion_id_for("later", "[]", "") == 1
    store.put_kernel("k3", b"three", meta())
    store.close()
    with open_store() as again:
        assert again.kernel_bytes("k3") == b"three" and again.kernel_bytes("k") is None


def test_disk_full_during_put(fresh_store):
    store = open_store()
    store.put_kernel("small", b"s", meta())

    @event.listens_for(store._engine, "connect")
    def _tiny(dbapi_conn, _record):
        dbapi_conn.execute("PRAGMA max_page_count = 40")  # SQLite's own "disk full"

    store._engine.dispose()
    big = bytes(range(256)) * 4096  # 1 MiB
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        store.put_kernel("big", big, meta())
        store.put_kernel("big2", big[::-1], meta())
    check_one_warning(caught, "put_kernel", "full")
    assert store.get_kernel("big") == big
    assert store.get_kernel("big2") == big[::-1]
    assert store.get_kernel("small") == b"s"
    assert sorted(k.key for k in store.kernels()) == ["big", "big2", "small"]
    store.close()


def test_kernel_locks_that_cannot_be_taken_compile_without_them(tmp_path):
    # a file where the lock folder should be: compile_once still compiles and stores the
    # kernel, and its one warning says what it does instead of the lock
    store = open_store(cache_dir=tmp_path / "cache")
    try:
        assert isinstance(store, SqlStore)
        (tmp_path / "cache" / "locks").write_text("x")
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            assert store.compile_once("k", lambda: (b"cubin", meta())) == (b"cubin", True)
        check_one_warning(caught, "kernel lock failed", "compiling without it")
        assert store.get_kernel("k") == b"cubin"  # kept in the database, not only in memory
    finally:
        store.close()
    with open_store(cache_dir=tmp_path / "cache") as again:
        assert again.get_kernel("k") == b"cubin"
