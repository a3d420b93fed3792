"""The blob tier touches only files inside its own directory, and reads no more than the
store recorded: a damaged diskcache index row is a miss to repair, never a file deleted or
read elsewhere."""
from __future__ import annotations

import hashlib
import os
import sqlite3
import subprocess
import sys

import pytest
from test_store_stress import BARE, ROOT

from fusion_cache.store import KernelMeta, open_store

DATA = hashlib.shake_256(b"blob").digest(40_000)


def meta() -> KernelMeta:
    return KernelMeta("k", 90, "13.0", ("-O3",), "// src", "pointwise", "{}", 3.0)


@pytest.fixture
def store(fresh_store):
    s = open_store()
    s.put_kernel("k", DATA, meta())
    yield s
    s.close()


def point_row_at(store, filename: str) -> None:
    """Damage the blob index: kernel k's row names another file."""
    with sqlite3.connect(store.cache_dir / "blobs" / "cache.db") as db:
        assert db.execute("UPDATE Cache SET filename = ? WHERE key = 'k'", (filename,)).rowcount
    store._blobs.close()


def test_relative_path_out_of_the_tier_is_neither_read_nor_deleted(store):
    db_file = store.location.db_path
    before = db_file.read_bytes()[:100]
    point_row_at(store, "../store.db")
    assert store.get_kernel("k") == DATA  # from the database; the row is a miss
    assert db_file.exists() and db_file.read_bytes()[:100] == before
    store.put_kernel("k2", b"two", meta())  # the store still works
    assert store.get_kernel("k2") == b"two"
    assert store.verify().ok  # the miss was repaired with a fresh blob


def test_absolute_path_is_refused(store, tmp_path):
    victim = tmp_path / "victim.bin"
    victim.write_bytes(b"FCB1" + hashlib.sha256(b"evil").digest() + b"evil")  # a valid frame
    point_row_at(store, str(victim))
    assert store.get_kernel("k") == DATA
    assert victim.exists()
    report = store.verify(repair=True)
    assert victim.exists()
    assert store.verify().ok, report


def test_verify_repair_deletes_nothing_outside(store, tmp_path):
    victim = tmp_path / "victim.bin"
    victim.write_bytes(b"precious")
    point_row_at(store, str(victim))
    report = store.verify(repair=True)
    assert [b.where for b in report.bad] == ["blobs"]
    assert "outside" in report.bad[0].reason
    assert victim.read_bytes() == b"precious"
    assert store.get_kernel("k") == DATA  # the blob is written again
    point_row_at(store, "../store.db")
    store.verify(repair=True)
    assert store.location.db_path.exists()
    assert store.get_kernel("k") == DATA


def test_symlink_out_of_the_tier_is_refused(store, tmp_path):
    victim = tmp_path / "victim.bin"
    victim.write_bytes(b"precious")
    link = store.cache_dir / "blobs" / "aa" / "bb" / "link.val"
    link.parent.mkdir(parents=True, exist_ok=True)
    link.symlink_to(victim)
    point_row_at(store, "aa/bb/link.val")
    assert store.get_kernel("k") == DATA
    assert victim.read_bytes() == b"precious"


def test_a_blob_larger_than_recorded_is_a_miss(store):
    with sqlite3.connect(store.cache_dir / "blobs" / "cache.db") as db:
        (name,) = db.execute("SELECT filename FROM Cache WHERE key = 'k'").fetchone()
    big = DATA * 50  # a valid frame of other, larger content: never read whole
    (store.cache_dir / "blobs" / name).write_bytes(
        b"FCB1" + hashlib.sha256(big).digest() + big)
    assert store._blobs.get("k", len(DATA)) is None
    assert store.get_kernel("k") == DATA
    assert store.verify().ok


DEV_ZERO = BARE + r'''
import sqlite3
from fusion_cache.store import KernelMeta, open_store
store = open_store()
data = b"x" * 5000
store.put_kernel("k", data, KernelMeta("k", 90, "13.0", (), "// src"))
with sqlite3.connect(store.cache_dir / "blobs" / "cache.db") as db:
    db.execute("UPDATE Cache SET filename = ? WHERE key = 'k'", (sys.argv[2],))
store._blobs.close()
assert store.get_kernel("k") == data
report = store.verify(repair=True)
assert store.verify().ok, report
import resource
print("ok", resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024)
'''


ENDLESS = [p for p in ("/dev/zero", "/dev/full", "/dev/urandom") if os.path.exists(p)]


@pytest.mark.skipif(not ENDLESS, reason="no endless character device here")
def test_dev_zero_is_not_read(fresh_store):
    # in a child with a memory limit: an unbounded read of /dev/zero fails there, not here
    import resource

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))

    env = dict(os.environ, FUSION_CACHE_DIR=str(fresh_store))
    done = subprocess.run([sys.executable, "-c", DEV_ZERO, str(ROOT), ENDLESS[0]], env=env,
                          preexec_fn=limit, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr[-2000:]
    word, peak_mib = done.stdout.split()
    # bounded by the recorded size: an unbounded read would pass the 2 GiB limit; the
    # interpreter alone took up to 530 MiB on a loaded machine
    assert word == "ok" and int(peak_mib) < 1024, done.stdout
