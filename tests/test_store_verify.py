"""verify on a store it cannot open fails loudly (non-zero, the reason), and verify --repair
reports only the repairs it made."""
from __future__ import annotations

import sqlite3
import warnings

import pytest
from sqlalchemy import event

from fusion_cache.cli import main
from fusion_cache.store import (
    KernelMeta,
    SqlStore,
    open_store,
    reset_default_store,
)
from fusion_cache.store.models import VERSION_TABLE


@pytest.fixture(autouse=True)
def _fresh_default():
    reset_default_store()
    yield
    reset_default_store()


def meta() -> KernelMeta:
    return KernelMeta("k", 90, "13.0", (), "// src")


def run(capsys, *argv: str) -> tuple[int, str]:
    """The `fusion-cache` entry point; its exit code and what it printed, out and err."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # open_store's own warning; verify must say it too
        code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out + err


def filled(fresh_store) -> None:
    with open_store() as store:
        store.put_kernel("k", b"cubin" * 100, meta())


def corrupt_header(fresh_store, monkeypatch, tmp_path):
    filled(fresh_store)
    with open(fresh_store / "store.db", "r+b") as f:
        f.write(b"this is not SQLite")


def dir_is_a_file(fresh_store, monkeypatch, tmp_path):
    (tmp_path / "f").write_text("")
    monkeypatch.setenv("FUSION_CACHE_DIR", str(tmp_path / "f"))


def newer_schema(fresh_store, monkeypatch, tmp_path):
    filled(fresh_store)
    with sqlite3.connect(fresh_store / "store.db") as db:
        db.execute(f"UPDATE {VERSION_TABLE} SET version_num = '0099'")


def read_only(fresh_store, monkeypatch, tmp_path):
    filled(fresh_store)
    monkeypatch.setenv("FUSION_CACHE_DB_URL",
                       f"sqlite:///file:{fresh_store / 'store.db'}?mode=ro&uri=true")


@pytest.mark.parametrize("damage,why", [
    (corrupt_header, "not a database"),
    (dir_is_a_file, "is not a directory"),
    (newer_schema, "newer schema"),
    (read_only, "read-only"),
])
def test_verify_fails_on_a_store_it_cannot_open(fresh_store, monkeypatch, tmp_path, capsys,
                                                damage, why):  # fmt: skip
    damage(fresh_store, monkeypatch, tmp_path)
    for argv in (["verify"], ["verify", "--repair"]):
        code, out = run(capsys, *argv)
        assert code != 0 and "cannot use the store" in out and why in out, out
        assert "checked 0 kernels" not in out and "repaired" not in out, out


def test_the_report_says_the_store_was_not_opened(fresh_store, monkeypatch, tmp_path):
    newer_schema(fresh_store, monkeypatch, tmp_path)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        store = open_store()
    report = store.verify(repair=True)
    assert report.repaired == 0 and report.checked == 0
    assert "newer schema" in report.unusable  # what was checked is only the stand-in
    assert "memory://" in store.url
    from fusion_cache.store import MemoryStore

    assert MemoryStore().verify().unusable is None  # memory:// asked for is no failure


def test_repair_of_a_damaged_blob_index_counts_nothing_it_did_not_do(fresh_store, capsys):
    filled(fresh_store)
    (fresh_store / "blobs" / "cache.db").write_bytes(b"garbage" * 1000)  # index unreadable
    store = open_store()
    try:
        report = store.verify(repair=True)
        assert [b.where for b in report.bad] == ["blobs"]
        assert report.repaired == 0, report
        assert "repair failed" in report.bad[0].reason
    finally:
        store.close()
    code, out = run(capsys, "verify", "--repair")
    assert code == 1 and ", 0 repaired" in out, out


def test_repair_on_a_full_disk_counts_nothing_it_did_not_do(fresh_store, capsys):
    filled(fresh_store)
    with sqlite3.connect(fresh_store / "store.db") as db:
        db.execute("UPDATE fc_kernels SET sha256 = ?", ("0" * 64,))
    store = open_store()
    assert isinstance(store, SqlStore)

    @event.listens_for(store._engine, "before_cursor_execute")
    def full(conn, cursor, statement, params, context, executemany):
        if statement.startswith(("DELETE", "UPDATE fc_kernels SET cubin")):
            raise sqlite3.OperationalError("database or disk is full")

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            report = store.verify(repair=True)
        db_bad = [b for b in report.bad if b.where == "db"]
        assert len(db_bad) == 1 and "repair failed" in db_bad[0].reason, report
        assert report.repaired == 1, report  # the blob copy was dropped; the row was not
        event.remove(store._engine, "before_cursor_execute", full)
        assert store.kernel_meta("k") is not None  # still there: nothing was removed
        assert not store.verify().ok
    finally:
        store.close()
