"""No silent loss: nonsensical settings are refused by name, an unanswering server costs one
timeout, a store directory deleted or replaced under a running process is noticed, and
WAL leftovers the process cannot write are cleaned up or named with the way out."""
from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import warnings
from pathlib import Path

import pytest
from test_store_stress import BARE, ROOT

from fusion_cache.store import KernelMeta, MemoryStore, SqlStore, open_store
from fusion_cache.store.engine import DEFAULT_TIMEOUT_S, env_timeout
from fusion_cache.store.sql_store import OVERLAY_ID_BASE


def meta(name: str = "k") -> KernelMeta:
    return KernelMeta(name, 90, "13.0", (), "// src")


# -- settings ---------------------------------------------------------------------------------


@pytest.mark.parametrize("value", ["inf", "-inf", "nan", "abc", "-1", "1e9", "30s"])
def test_nonsensical_timeout_is_refused_by_name(monkeypatch, value):
    monkeypatch.setenv("FUSION_CACHE_DB_TIMEOUT", value)
    with pytest.raises(ValueError, match=f"FUSION_CACHE_DB_TIMEOUT={value!r}: expected"):
        env_timeout()
    with pytest.raises(ValueError, match="FUSION_CACHE_DB_TIMEOUT"):
        open_store()  # not a silent in-memory store


@pytest.mark.parametrize("value,seconds", [("", DEFAULT_TIMEOUT_S), (" 2.5 ", 2.5), ("0", 0.0),
                                           ("86400", 86400.0)])
def test_sensible_timeouts(monkeypatch, value, seconds):
    monkeypatch.setenv("FUSION_CACHE_DB_TIMEOUT", value)
    assert env_timeout() == seconds


def test_timeout_argument_is_checked_too(fresh_store):
    for bad in (float("inf"), -1.0, float("nan")):
        with pytest.raises(ValueError, match="timeout_s"):
            open_store(timeout_s=bad)


# -- an unanswering server ------------------------------------------------------------------


def test_an_unanswering_server_costs_one_timeout(tmp_path):
    pytest.importorskip("psycopg")
    # a host that takes the connection and never says a word (a hung server, a black hole)
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        listener.settimeout(0.1)
        while not stop.is_set():
            try:
                held.append(listener.accept()[0])
            except OSError:
                pass

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    port = listener.getsockname()[1]
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            t0 = time.monotonic()
            store = open_store(f"postgresql://u@127.0.0.1:{port}/db", cache_dir=tmp_path / "c",
                               timeout_s=2)
            elapsed = time.monotonic() - t0
    finally:
        stop.set()
        thread.join()
        for s in held:
            s.close()
        listener.close()
    assert isinstance(store, MemoryStore)
    assert len(caught) == 1 and "unreachable" in str(caught[0].message)
    assert elapsed < 3.0, f"open took {elapsed:.1f} s for a 2 s timeout"


# -- the store deleted or replaced under a running process ------------------------------------


def test_deleted_store_directory_is_noticed_and_reopened(fresh_store):
    store = open_store()
    assert isinstance(store, SqlStore)
    fid = store.fusion_id_for("a" * 64, "[]", "")
    store.put_kernel("before", b"before", meta())
    shutil.rmtree(fresh_store)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        store._next_check = 0  # as if a second had passed
        store.put_kernel("after", b"after", meta())
        store.put_kernel("after2", b"after2", meta())
        new = store.fusion_id_for("b" * 64, "[]", "")
    assert len(caught) == 1, [str(w.message) for w in caught]
    assert "was deleted" in str(caught[0].message) and str(fresh_store) in str(caught[0].message)
    assert (fresh_store / "store.db").exists()  # a fresh store where the old one was
    assert store.get_kernel("after") == b"after"
    assert store.fusion_id_for("a" * 64, "[]", "") == fid  # ids this process handed out stay
    assert new != fid
    store.close()
    with open_store() as again:  # kernels written after the loss were kept on disk
        assert again.get_kernel("after") == b"after" and again.get_kernel("before") is None


def test_deleted_store_that_cannot_be_recreated_degrades_to_memory(fresh_store):
    store = open_store()
    store.put_kernel("before", b"before", meta())
    shutil.rmtree(fresh_store)
    fresh_store.write_text("a file where the store was")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        store._next_check = 0
        store.put_kernel("after", b"after", meta())
        assert store.get_kernel("after") == b"after"
        assert store.fusion_id_for("c" * 64, "[]", "") >= OVERLAY_ID_BASE
    texts = [str(w.message) for w in caught]
    assert len(texts) == 2 and "was deleted" in texts[0], texts
    assert "could not be reopened" in texts[1] and "in memory" in texts[1], texts
    store.close()


def test_replaced_store_file_is_noticed(fresh_store, tmp_path):
    store = open_store()
    store.fusion_id_for("a" * 64, "[]", "")
    other = open_store(cache_dir=tmp_path / "other")
    other.put_kernel("theirs", b"theirs", meta())
    other.close()
    for suffix in ("", "-wal", "-shm"):
        Path(f"{fresh_store / 'store.db'}{suffix}").unlink(missing_ok=True)
    shutil.copy(tmp_path / "other" / "store.db", fresh_store / "store.db")  # a restored backup
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        store._next_check = 0
        assert store.get_kernel("theirs") == b"theirs"
    assert len(caught) == 1 and "was replaced" in str(caught[0].message)
    # fusion ids are per store: this process keeps its own, new ones stay in memory
    assert store.fusion_by_id(0) is None or store.fusion_by_id(0).definition_key == "a" * 64
    store.close()


# -- read-only WAL leftovers ------------------------------------------------------------------

LEFTOVERS = BARE + r'''
import tempfile
import warnings
warnings.simplefilter("always")
from fusion_cache.store import open_store
open_store(cache_dir=tempfile.mkdtemp()).close()  # every module loaded while still root
os.setgid(65534)
os.setuid(65534)  # the interpreter lives under /root: become the user only now
with warnings.catch_warnings(record=True) as caught:
    store = open_store()
print(type(store).__name__)
for w in caught:
    print("WARNING", w.message)
'''

KILLED_WRITER = BARE + r'''
from fusion_cache.store import KernelMeta, open_store
store = open_store()
store.put_kernel("k", b"cubin", KernelMeta("k", 90, "13.0", (), ""))
os._exit(0)  # no close: the -wal and -shm files stay behind, as after kill -9
'''


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to run a process as another user")
def test_wal_leftovers_of_another_user_are_named_with_the_way_out(monkeypatch):
    # root ran the job and was killed; a user then runs it on the same store, whose database
    # file was made writable for everyone, but not root's -wal and -shm leftovers
    shared = Path(tempfile.mkdtemp(prefix="fc-shared-"))  # pytest's tmp_path is root's only
    try:
        store_dir = shared / "fusion_cache"
        monkeypatch.setenv("FUSION_CACHE_DIR", str(store_dir))
        env = dict(os.environ)
        subprocess.run([sys.executable, "-c", KILLED_WRITER, str(ROOT)], env=env, check=True)
        db = store_dir / "store.db"
        assert Path(f"{db}-wal").exists() and Path(f"{db}-shm").exists()
        for p in [shared, *shared.rglob("*")]:
            os.chmod(p, 0o777 if p.is_dir() else 0o666)
        for leftover in (f"{db}-wal", f"{db}-shm"):
            os.chmod(leftover, 0o644)
        user = subprocess.run([sys.executable, "-c", LEFTOVERS, str(ROOT)], env=env,
                              capture_output=True, text=True, timeout=60)  # fmt: skip
        assert user.returncode == 0, user.stderr
        kind, *warned = user.stdout.splitlines()
        assert kind == "MemoryStore" and len(warned) == 1, user.stdout
        for words in ("store.db-wal", "store.db-shm", "not writable by this user (uid 65534)",
                      "uid 0", "`fusion-cache stats`", "delete both"):
            assert words in warned[0], warned[0]
        # the way out it names works: opened once by their owner, the leftovers are gone
        with open_store() as owner:
            assert owner.kernel_bytes("k") == b"cubin"
        assert not Path(f"{db}-wal").exists() and not Path(f"{db}-shm").exists()
    finally:
        shutil.rmtree(shared)
