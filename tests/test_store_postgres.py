"""The store on PostgreSQL: the API, the upgrade path, restarts, cold-start races, kill -9.

Server: FUSION_CACHE_TEST_PG_URL, default postgresql://postgres@127.0.0.1:5432/test; the
tests skip when it is unreachable. Each test works in a schema of its own (search_path set
through the URL's `options`), dropped afterwards.
"""
from __future__ import annotations

import os
import uuid
import warnings

import pytest
from test_store_stress import kill_scenario, race_scenario, restart_scenario, worker_env

from fusion_cache.store import KernelMeta, SqlStore, StoreWarning, migrate, open_store
from fusion_cache.store.engine import create_store_engine, resolve_location

pytestmark = pytest.mark.postgres

PG_URL = os.environ.get(
    "FUSION_CACHE_TEST_PG_URL", "postgresql://postgres@127.0.0.1:5432/test"
)


def _admin():
    psycopg = pytest.importorskip("psycopg")
    plain = PG_URL.replace("postgresql+psycopg://", "postgresql://")
    try:
        return psycopg.connect(plain, connect_timeout=3, autocommit=True)
    except psycopg.Error as err:
        pytest.skip(f"PostgreSQL not reachable at {PG_URL}: {err}")


@pytest.fixture
def pg_url():
    """A store URL whose tables live in a fresh schema."""
    schema = f"fc_test_{uuid.uuid4().hex[:12]}"
    with _admin() as conn:
        conn.execute(f'CREATE SCHEMA "{schema}"')
    sep = "&" if "?" in PG_URL else "?"
    yield f"{PG_URL}{sep}options=-csearch_path%3D{schema}"
    with _admin() as conn:
        conn.execute(f'DROP SCHEMA "{schema}" CASCADE')


def meta(name: str = "k") -> KernelMeta:
    return KernelMeta(name, 90, "13.0", ("-O3",), "// src", "pointwise", "{}", 1.0)


def test_api_on_postgres(pg_url):
    with warnings.catch_warnings():
        warnings.simplefilter("error", StoreWarning)
        store = open_store(pg_url)
    try:
        assert isinstance(store, SqlStore) and store.url.startswith("postgresql+psycopg://")
        assert [store.fusion_id_for(k, "[]", "") for k in "abca"] == [0, 1, 2, 0]
        store.put_plan(1, "sig", "sm_90", "{}")
        store.put_plan(1, "sig", "sm_90", '{"v": 2}')
        assert store.get_plan(1, "sig", "sm_90") == '{"v": 2}'
        store.put_kernel("k", b"\x00cubin\xff" * 1000, meta())
        store.link_kernel(1, "k")
        assert store.get_kernel("k") == b"\x00cubin\xff" * 1000
        assert [k.key for k in store.kernels(1)] == ["k"]
        assert store.kernel_meta("k").hits == 1
        assert store.stats()["schema_revision"] == "0002"
        assert store.verify().ok
        assert store.prune(max_bytes=0).removed == 1
    finally:
        store.close()
    with open_store(pg_url) as again:  # a second open finds the schema at head
        assert again.fusion_id_for("b", "", "") == 1


def test_0001_upgrades_to_head_on_postgres(pg_url, tmp_path):
    loc = resolve_location(pg_url, tmp_path)
    engine = create_store_engine(loc, 10)
    try:
        assert migrate.upgrade(engine, loc, 10, target="0001") == "0001"
        with engine.begin() as conn:
            conn.exec_driver_sql(
                "INSERT INTO fc_fusions VALUES (0, 'def-a', '[]', 'def a(fd): ...', 1.0)"
            )
            conn.exec_driver_sql(
                "INSERT INTO fc_kernels VALUES ('kern', 'k', 90, '13.0', '[]', '', '', '{}',"
                " 1.0, encode(sha256('abc'), 'hex'), 3, 'abc'::bytea, 5.0)"
            )
    finally:
        engine.dispose()
    with open_store(pg_url) as store:
        assert store.stats()["schema_revision"] == "0002"
        assert store.fusion_id_for("def-a", "", "") == 0
        assert store.kernel_meta("kern").last_used == 5.0  # backfilled from created_at
        assert store.get_kernel("kern") == b"abc"


def test_restart_on_postgres(pg_url, tmp_path):
    restart_scenario(tmp_path, worker_env(tmp_path / "cache", pg_url))


@pytest.mark.slow
def test_eight_processes_on_postgres(pg_url, tmp_path):
    race_scenario(tmp_path, worker_env(tmp_path / "cache", pg_url))


@pytest.mark.slow
def test_kill_nines_on_postgres(pg_url, tmp_path):
    kill_scenario(tmp_path, worker_env(tmp_path / "cache", pg_url), kills=10)


def test_postgres_store_works_without_its_node_local_directory(pg_url, tmp_path):
    # the cache dir holds only the cubin tier and compile locks for a server store: when it
    # cannot be created (here a path under a plain file), the store says so once and keeps
    # PostgreSQL instead of falling back to an in-memory store; using it warns no further
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    with pytest.warns(StoreWarning, match="node-local directory .* is unusable") as caught:
        store = open_store(pg_url, cache_dir=blocker / "cache")
    assert len(caught) == 1, [str(w.message) for w in caught]
    cubin = bytes(range(256)) * 64
    try:
        assert isinstance(store, SqlStore), store
        with warnings.catch_warnings():
            warnings.simplefilter("error", StoreWarning)
            got, compiled = store.compile_once("k2", lambda: (cubin, meta("k2")))
            assert compiled and got == cubin
            assert store.get_kernel("k2") == cubin  # from the server, no blob tier
            assert store.compile_once("k2", lambda: pytest.fail("compiled twice"))[1] is False
            assert store.verify().ok  # no blob tier is not a damaged one
    finally:
        store.close()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", StoreWarning)
        with open_store(pg_url, cache_dir=tmp_path / "fresh") as again:  # the kernel is kept
            assert again.get_kernel("k2") == cubin
