"""The store's API on both implementations (SQLite-backed and in-memory): same semantics."""
from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import sys
import threading
import time
import warnings
from pathlib import Path

import pytest

from fusion_cache.store import (
    KernelMeta,
    MemoryStore,
    SqlStore,
    Store,
    StoreWarning,
    default_store,
    open_store,
    reset_default_store,
)
from fusion_cache.store.engine import normalize_url, resolve_location
from fusion_cache.store.locks import FileLock, kernel_lock_path


def meta(name: str = "k", ms: float = 1.5) -> KernelMeta:
    return KernelMeta(name, 90, "13.0", ("-O3", "-arch=sm_90"), f"// {name}", "pointwise",
                      '{"vec": 4}', ms)


def cubin(tag: str, size: int = 4000) -> bytes:
    return hashlib.shake_256(tag.encode()).digest(size)


@pytest.fixture(autouse=True)
def _no_default_store():
    reset_default_store()
    yield
    reset_default_store()


@pytest.fixture(params=["sql", "memory"])
def store(request, fresh_store) -> Store:
    s = open_store() if request.param == "sql" else MemoryStore()
    assert isinstance(s, SqlStore if request.param == "sql" else MemoryStore)
    yield s
    s.close()


def test_ids_are_dense_from_zero_and_stable(store):
    ids = [store.fusion_id_for(f"key-{i}", f"[{i}]", f"def f{i}(fd): ...") for i in range(5)]
    assert ids == [0, 1, 2, 3, 4]
    assert store.fusion_id_for("key-3", "other", "other") == 3
    entry = store.fusion_by_id(3)
    assert (entry.id, entry.definition_key, entry.records_json) == (3, "key-3", "[3]")
    assert entry.python_definition == "def f3(fd): ..."
    assert [f.id for f in store.fusions()] == ids
    assert store.fusion_by_id(99) is None


def test_same_key_same_id_in_two_store_objects(fresh_store):
    a, b = open_store(), open_store()
    try:
        assert a.fusion_id_for("x", "[]", "") == 0
        assert b.fusion_id_for("y", "[]", "") == 1
        assert b.fusion_id_for("x", "[]", "") == 0
        assert a.fusion_id_for("y", "[]", "") == 1
    finally:
        a.close()
        b.close()


def test_plans(store):
    fid = store.fusion_id_for("k", "[]", "")
    assert store.get_plan(fid, "sig", "sm_90") is None
    store.put_plan(fid, "sig", "sm_90", '{"segments": 1}')
    store.put_plan(fid, "sig", "sm_90", '{"segments": 1}')  # idempotent
    store.put_plan(fid, "sig", "sm_80", '{"segments": 2}')
    assert store.get_plan(fid, "sig", "sm_90") == '{"segments": 1}'
    assert [(p.signature_key, p.target) for p in store.plans_for(fid)] == [
        ("sig", "sm_80"),
        ("sig", "sm_90"),
    ]
    store.put_plan(fid, "sig", "sm_90", '{"segments": 3}')  # a newer plan replaces
    assert store.get_plan(fid, "sig", "sm_90") == '{"segments": 3}'
    assert len(store.plans_for(fid)) == 2


def test_kernels_roundtrip_with_meta_and_hits(store):
    data = cubin("a")
    assert store.get_kernel("a") is None
    store.put_kernel("a", data, meta("a"))
    store.put_kernel("a", cubin("different"), meta("a"))  # the key names the content
    assert store.get_kernel("a") == data
    assert store.get_kernel("a") == data
    entry = store.kernel_meta("a")
    assert entry.meta == meta("a")
    assert (entry.size, entry.sha256) == (len(data), hashlib.sha256(data).hexdigest())
    assert entry.hits == 2
    assert entry.last_used >= entry.created_at
    assert "source" not in repr(entry)  # long text stays out of reprs
    assert store.kernel_bytes("a") == data
    assert store.kernel_meta("a").hits == 2  # kernel_bytes counts no hit
    assert store.kernel_meta("missing") is None


def test_links_select_kernels_of_a_fusion(store):
    f0 = store.fusion_id_for("f0", "[]", "")
    f1 = store.fusion_id_for("f1", "[]", "")
    for k in ("a", "b", "c"):
        store.put_kernel(k, cubin(k), meta(k))
    store.link_kernel(f0, "a")
    store.link_kernel(f0, "b")
    store.link_kernel(f0, "b")
    store.link_kernel(f1, "c")
    store.link_kernel(f1, "not-yet-compiled")
    assert [k.key for k in store.kernels(f0)] == ["a", "b"]
    assert [k.key for k in store.kernels(f1)] == ["c"]
    assert [k.key for k in store.kernels()] == ["a", "b", "c"]
    assert (f1, "not-yet-compiled") in store.links()


def test_compile_once_threads_compile_once(store):
    calls = []

    def compile_fn():
        calls.append(1)
        time.sleep(0.05)
        return cubin("t"), meta("t")

    results = []
    threads = [
        threading.Thread(target=lambda: results.append(store.compile_once("t", compile_fn)))
        for _ in range(6)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(calls) == 1
    assert sorted(here for _, here in results) == [False] * 5 + [True]
    assert all(data == cubin("t") for data, _ in results)


def test_compile_error_propagates_and_frees_the_lock(store):
    def broken():
        raise RuntimeError("nvrtc: error")

    with pytest.raises(RuntimeError, match="nvrtc"):
        store.compile_once("k", broken, timeout_s=1)
    t0 = time.monotonic()
    assert store.compile_once("k", lambda: (b"ok", meta()), timeout_s=5) == (b"ok", True)
    assert time.monotonic() - t0 < 1


def test_compile_once_ignores_a_lock_held_too_long(fresh_store):
    store = open_store()
    lock = FileLock(kernel_lock_path(store.cache_dir, "k"))
    assert lock.acquire(1)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            t0 = time.monotonic()
            data, here = store.compile_once("k", lambda: (b"x", meta()), timeout_s=0.2)
        assert (data, here) == (b"x", True)
        assert time.monotonic() - t0 < 2
        assert [w.category for w in caught] == [StoreWarning]
    finally:
        lock.release()
        store.close()


def test_lock_of_a_killed_process_is_released(fresh_store):
    store = open_store()
    path = kernel_lock_path(store.cache_dir, "k")
    path.parent.mkdir(parents=True, exist_ok=True)
    holder = subprocess.Popen(
        [sys.executable, "-c", (
            "import fcntl, os, sys, time\n"
            f"fd = os.open({str(path)!r}, os.O_RDWR | os.O_CREAT)\n"
            "fcntl.flock(fd, fcntl.LOCK_EX)\n"
            "print('held', flush=True)\n"
            "time.sleep(60)\n"
        )],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        assert not FileLock(path).acquire(0.05)
        os.kill(holder.pid, signal.SIGKILL)
        holder.wait(10)
        t0 = time.monotonic()
        assert store.compile_once("k", lambda: (b"x", meta()), timeout_s=30) == (b"x", True)
        assert time.monotonic() - t0 < 2
    finally:
        if holder.poll() is None:
            holder.kill()
        holder.stdout.close()
        store.close()


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_store_survives_fork(fresh_store):
    """A store opened before fork (DataLoader workers) keeps working on both sides."""
    store = open_store()
    store.put_kernel("parent", b"p", meta())
    assert store.get_kernel("parent") == b"p"
    pid = os.fork()
    if pid == 0:  # child: report through the exit code only
        code = 3
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("error")
                ok = store.get_kernel("parent") == b"p"
                store.put_kernel("child", b"c", meta())
                ok = ok and store.fusion_id_for("from-child", "[]", "") == 0
                store.close()
            code = 0 if ok else 1
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert store.get_kernel("child") == b"c"
    assert store.fusion_by_id(0).definition_key == "from-child"
    store.close()


def test_put_kernel_rejects_caller_mistakes(store):
    with pytest.raises(TypeError):
        store.put_kernel("k", "not bytes", meta())
    with pytest.raises(TypeError):
        store.put_kernel("k", b"x", {"kernel_name": "k"})


def test_prune_least_recently_used_first(store):
    for k in ("a", "b", "c"):
        store.put_kernel(k, cubin(k, 1000), meta(k))
        time.sleep(0.01)
    store.get_kernel("a")  # now a is the most recently used
    report = store.prune(max_bytes=1500)
    assert (report.removed, report.freed_bytes, report.kept, report.kept_bytes) == (
        2, 2000, 1, 1000
    )
    assert [k.key for k in store.kernels()] == ["a"]
    assert store.prune(max_age_days=1).removed == 0
    assert store.prune(max_age_days=0).removed == 1
    assert store.get_kernel("a") is None


def test_stats(store):
    fid = store.fusion_id_for("k", "[]", "")
    store.put_plan(fid, "s", "t", "{}")
    store.put_kernel("a", cubin("a", 100), meta())
    store.link_kernel(fid, "a")
    store.get_kernel("a")
    stats = store.stats()
    assert {k: stats[k] for k in ("fusions", "plans", "kernels", "kernel_bytes", "links",
                                  "hits")} == dict(fusions=1, plans=1, kernels=1,
                                                   kernel_bytes=100, links=1, hits=1)
    assert stats["persistent"] is store.persistent
    if store.persistent:
        assert stats["schema_revision"] == stats["head_revision"] == "0002"
        assert stats["blob_entries"] == 1


def test_locations(tmp_path, monkeypatch):
    monkeypatch.setenv("FUSION_CACHE_DIR", str(tmp_path / "env"))
    loc = resolve_location(None, None)
    assert (loc.cache_dir, loc.db_path) == (tmp_path / "env", tmp_path / "env" / "store.db")
    loc = resolve_location(None, tmp_path / "arg")
    assert loc.db_path == tmp_path / "arg" / "store.db"
    loc = resolve_location(f"sqlite:///{tmp_path}/x/my.db", None)
    assert (loc.cache_dir, loc.db_path) == (tmp_path / "x", tmp_path / "x" / "my.db")
    loc = resolve_location("postgresql://u@h/db", None)
    assert loc.url == "postgresql+psycopg://u@h/db"
    assert loc.cache_dir == tmp_path / "env" and loc.db_path is None
    assert normalize_url("postgres://h/db") == "postgresql+psycopg://h/db"
    assert normalize_url("postgresql+psycopg://h/db") == "postgresql+psycopg://h/db"
    monkeypatch.setenv("FUSION_CACHE_DB_URL", f"sqlite:///{tmp_path}/env-url.db")
    assert resolve_location(None, None).db_path == tmp_path / "env-url.db"


def test_open_store_creates_files_where_asked(tmp_path):
    with open_store(cache_dir=tmp_path / "here") as store:
        store.put_kernel("a", b"abc", meta())
    assert (tmp_path / "here" / "store.db").is_file()
    assert (tmp_path / "here" / "blobs" / "cache.db").is_file()


def test_default_store_follows_the_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("FUSION_CACHE_DIR", str(tmp_path / "one"))
    first = default_store()
    assert default_store() is first
    assert first.fusion_id_for("a", "[]", "") == 0
    monkeypatch.setenv("FUSION_CACHE_DIR", str(tmp_path / "two"))
    assert default_store() is first
    reset_default_store()
    second = default_store()
    assert second is not first and second.fusions() == []


def test_memory_url_is_an_explicit_choice(monkeypatch):
    monkeypatch.setenv("FUSION_CACHE_DB_URL", "memory://")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        store = open_store()
    assert isinstance(store, MemoryStore) and store.reason is None


def test_bundle_methods_exist_on_both(store, tmp_path):
    from fusion_cache.store.keys import kernel_key

    m = meta()
    key = kernel_key(m.source, m.options, m.arch)  # a bundle's keys must be the real ones
    fid = store.fusion_id_for(hashlib.sha256(b"[]").hexdigest(), "[]", "")
    store.put_kernel(key, b"abc", m)
    store.link_kernel(fid, key)
    assert store.export_bundle(tmp_path / "b.zip") == 2
    other = MemoryStore()
    assert other.import_bundle(tmp_path / "b.zip") == 2
    assert other.kernels(0)[0].key == key


def test_files_are_plain(fresh_store):
    """Nothing the store writes is a pickle: the blob tier holds framed raw bytes."""
    with open_store() as store:
        store.put_kernel("a", b"\x7fELF" + bytes(100), meta())
    blob_files = [p for p in Path(fresh_store, "blobs").rglob("*.val")]
    assert len(blob_files) == 1
    assert blob_files[0].read_bytes().startswith(b"FCB1")
    assert blob_files[0].read_bytes().endswith(b"\x7fELF" + bytes(100))
