"""Damaged entries: found on read and by verify(), never served, repaired by the next put."""
from __future__ import annotations

import hashlib
import os
import pickle
import sqlite3
from pathlib import Path

import diskcache
import pytest

from fusion_cache.store import KernelMeta, open_store, reset_default_store
from fusion_cache.store.blobs import BytesOnlyDisk


def meta() -> KernelMeta:
    return KernelMeta("k", 90, "13.0", ("-O3",), "// src", "pointwise", "{}", 3.0)


DATA = hashlib.shake_256(b"cubin").digest(50_000)


@pytest.fixture
def store(fresh_store):
    reset_default_store()
    s = open_store()
    s.put_kernel("k", DATA, meta())
    yield s
    s.close()


def blob_file(store, key: str) -> Path:
    with sqlite3.connect(store.cache_dir / "blobs" / "cache.db") as db:
        (name,) = db.execute("SELECT filename FROM Cache WHERE key = ?", (key,)).fetchone()
    return store.cache_dir / "blobs" / name


def sql(store, statement: str, *params) -> None:
    with sqlite3.connect(store.location.db_path) as db:
        db.execute(statement, params)


def test_truncated_blob_is_served_from_the_database_and_rewritten(store):
    path = blob_file(store, "k")
    path.write_bytes(path.read_bytes()[:1000])
    report = store.verify()
    assert [(b.key, b.where) for b in report.bad] == [("k", "blobs")]
    assert store.get_kernel("k") == DATA
    assert blob_file(store, "k").read_bytes().endswith(DATA)  # repaired
    assert store.verify().ok


def test_truncated_database_copy_is_a_miss_and_the_next_put_repairs_it(store):
    sql(store, "UPDATE fc_kernels SET cubin = substr(cubin, 1, 100) WHERE key = 'k'")
    blob_file(store, "k").unlink()
    report = store.verify()
    assert [(b.key, b.where) for b in report.bad] == [("k", "db")]
    assert "truncated" in report.bad[0].reason
    assert store.get_kernel("k") is None  # a miss, never wrong bytes
    assert store.kernel_meta("k") is None  # the bad entry is gone
    data, compiled = store.compile_once("k", lambda: (DATA, meta()))
    assert (data, compiled) == (DATA, True)
    assert store.get_kernel("k") == DATA
    assert store.verify().ok


def test_wrong_hash_is_found_by_verify_and_on_read(store):
    sql(store, "UPDATE fc_kernels SET sha256 = ? WHERE key = 'k'", "0" * 64)
    report = store.verify()
    assert sorted((b.key, b.where) for b in report.bad) == [("k", "blobs"), ("k", "db")]
    assert store.get_kernel("k") is None
    store.put_kernel("k", DATA, meta())
    assert store.get_kernel("k") == DATA
    assert store.verify().ok


def test_verify_repair(store):
    store.put_kernel("other", b"fine", meta())
    sql(store, "UPDATE fc_kernels SET sha256 = ? WHERE key = 'k'", "0" * 64)
    report = store.verify(repair=True)
    assert len(report.bad) == 2 and report.repaired == 2 and report.checked == 2
    assert store.kernel_meta("k") is None
    assert store.get_kernel("other") == b"fine"
    assert store.verify().ok


def test_verify_restores_a_damaged_database_copy_from_an_intact_blob(store):
    sql(store, "UPDATE fc_kernels SET cubin = zeroblob(50000) WHERE key = 'k'")
    report = store.verify(repair=True)
    assert [(b.where, b.reason) for b in report.bad] == [
        ("db", "sha256 mismatch; intact copy in the blob tier")
    ]
    with sqlite3.connect(store.location.db_path) as db:
        (cubin,) = db.execute("SELECT cubin FROM fc_kernels WHERE key = 'k'").fetchone()
    assert cubin == DATA
    assert store.verify().ok


class Exploit:
    """Unpickling this would create a file: proof that someone unpickled it."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self):
        return (open, (self.marker, "w"))


def test_pickled_value_in_the_blob_tier_is_refused(store, tmp_path):
    marker = tmp_path / "unpickled"
    with diskcache.Cache(str(store.cache_dir / "blobs")) as foreign:  # default Disk pickles
        foreign.set("k", Exploit(str(marker)))
    report = store.verify()
    assert [(b.where, b.reason) for b in report.bad] == [("blobs", "pickled value in the blob tier")]
    assert store.get_kernel("k") == DATA  # from the database, never from the pickle
    assert not marker.exists()
    assert store.verify().ok  # the refused value was replaced by the real bytes


def test_blob_disk_stores_bytes_only(tmp_path):
    with diskcache.Cache(str(tmp_path / "c"), disk=BytesOnlyDisk) as cache:
        cache.set("a", b"raw")
        assert cache.get("a") == b"raw"
        with pytest.raises(TypeError):
            cache.set("b", {"not": "bytes"})
        with pytest.raises(TypeError):
            cache.set(("tuple", "key"), b"x")
    pickled = pickle.dumps({"x": 1})
    assert pickled not in (tmp_path / "c" / "cache.db").read_bytes()


def test_blob_tier_trouble_is_only_a_miss(store):
    """The blob tier's directory turned into a file: reads and writes fall back to the DB."""
    store._blobs.close()
    blobs = store.cache_dir / "blobs"
    for p in sorted(blobs.rglob("*"), reverse=True):
        p.unlink() if p.is_file() else p.rmdir()
    blobs.rmdir()
    blobs.write_bytes(b"not a directory")
    assert store.get_kernel("k") == DATA
    store.put_kernel("k2", b"two", meta())
    assert store.get_kernel("k2") == b"two"
    os.unlink(blobs)
