"""The warm path (Note [Warm path]): a process restarted on a warm SQLite store opens it with
one read of the version table, never imports SQLAlchemy for hits, finds a known fusion's id,
plans and kernels in one query, and writes nothing the store already holds."""
from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from test_store_stress import BARE, ROOT

from fusion_cache.store import KernelMeta, SqlStore, open_store
from fusion_cache.store.keys import kernel_key

DEF = hashlib.sha256(b"[]").hexdigest()
META = KernelMeta("k", 90, "13.0", ("-O3",), "// src")
KEY = kernel_key(META.source, META.options, META.arch)
CUBIN = bytes(range(256)) * 40


def fill(cache_dir: Path) -> None:
    with open_store(cache_dir=cache_dir) as store:
        fid = store.fusion_id_for(DEF, "[]", "def f(fd): ...")
        store.put_plan(fid, "sig", "sm_90", '{"plan": 1}')
        store.put_kernel(KEY, CUBIN, META)
        store.link_kernel(fid, KEY)


WARM = BARE + r'''
import json
from fusion_cache.store import open_store
args = json.loads(sys.argv[2])
store = open_store()
fid = store.fusion_id_for(args["def"], "[]", "def f(fd): ...")
plan = store.get_plan(fid, "sig", "sm_90")
cubin, compiled = store.compile_once(args["key"], lambda: 1 / 0)
store.put_plan(fid, "sig", "sm_90", plan)  # what the runtime does on every plan it makes
store.link_kernel(fid, args["key"])
store.close()
print(json.dumps({"sqlalchemy": "sqlalchemy" in sys.modules, "plan": plan,
                  "ok": cubin == bytes(range(256)) * 40 and not compiled}))
'''


def test_a_warm_hit_never_imports_sqlalchemy(fresh_store):
    fill(fresh_store)
    done = subprocess.run(
        [sys.executable, "-c", WARM, str(ROOT), json.dumps({"def": DEF, "key": KEY})],
        env=dict(os.environ, FUSION_CACHE_DIR=str(fresh_store)), capture_output=True,
        text=True, timeout=60)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == {"sqlalchemy": False, "plan": '{"plan": 1}', "ok": True}


def test_a_known_fusion_is_one_query_and_no_writes(fresh_store):
    fill(fresh_store)
    store = open_store()
    assert isinstance(store, SqlStore) and store._engine_now is None  # no engine yet
    statements: list[str] = []
    store._reader._conn().set_trace_callback(statements.append)
    fid = store.fusion_id_for(DEF, "[]", "")
    assert store.get_plan(fid, "sig", "sm_90") == '{"plan": 1}'
    assert store.get_kernel(KEY) == CUBIN  # its bytes from the blob tier
    store.put_plan(fid, "sig", "sm_90", '{"plan": 1}')
    store.link_kernel(fid, KEY)
    assert len(statements) == 1 and "fc_fusions" in statements[0], statements
    assert store._engine_now is None  # nothing needed SQLAlchemy
    # what the store does not hold yet is still written, and read back by others
    store.put_plan(fid, "sig", "sm_80", '{"plan": 2}')
    store.put_plan(fid, "sig", "sm_90", '{"plan": 3}')
    store.link_kernel(fid, "0" * 64)
    store.close()
    with open_store() as other:
        assert other.get_plan(fid, "sig", "sm_80") == '{"plan": 2}'
        assert other.get_plan(fid, "sig", "sm_90") == '{"plan": 3}'
        assert (fid, "0" * 64) in other.links()
        assert other.kernel_meta(KEY).hits == 1  # the hit was counted through the reader


def test_plans_written_by_another_process_after_the_lookup_are_found(fresh_store):
    fill(fresh_store)
    store = open_store()
    fid = store.fusion_id_for(DEF, "[]", "")
    with open_store() as other:
        other.put_plan(fid, "sig2", "sm_90", '{"other": 1}')
    assert store.get_plan(fid, "sig2", "sm_90") == '{"other": 1}'
    store.close()


def test_a_store_below_head_opens_in_full_and_migrates(fresh_store):
    from test_store_migrations import store_at_0001

    store_at_0001(fresh_store)
    with open_store() as store:
        assert store.revision == "0002" and store.get_kernel("kern") is not None


@pytest.mark.slow
def test_warm_store_benchmark_runs_on_the_cpu(tmp_path):
    done = subprocess.run([sys.executable, "-m", "benchmarks.warm_store", "--runs", "1",
                           "--fusions", "2"], cwd=ROOT, capture_output=True, text=True,
                          timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    out = done.stdout
    assert "open on first use" in out and "SQLAlchemy imported: False" in out, out
    assert "compiles 0, loaded 2 a run" in out, out


def test_a_new_fusions_plans_and_links_are_written_once_and_together(fresh_store):
    """Note [Warm path], cold, and Note [Writes together]: what this process wrote of a
    definition it added is not written again, and within writes_together the plans and
    links are held (seen by this process at once) and written in one transaction."""
    from fusion_cache.store import engine

    store = open_store()
    fid = store.fusion_id_for(DEF, "[]", "")
    written = []
    transaction = engine.write_transaction
    engine.write_transaction = lambda db: written.append(1) or transaction(db)
    try:
        store.put_plan(fid, "sig", "sm_90", '{"plan": 1}')
        store.put_plan(fid, "sig", "sm_90", '{"plan": 1}')
        assert len(written) == 1
        with store.writes_together():
            store.put_plan(fid, "sig", "sm_80", '{"plan": 2}')
            store.put_plan(fid, "sig", "sm_80", '{"plan": 3}')
            store.link_kernel(fid, KEY)
            store.link_kernel(fid, KEY)
            assert store.get_plan(fid, "sig", "sm_80") == '{"plan": 3}'
            with open_store() as other:  # not yet written
                assert other.get_plan(fid, "sig", "sm_80") is None
            assert len(written) == 1
        assert len(written) == 2
    finally:
        engine.write_transaction = transaction
    store.close()
    with open_store() as other:
        assert other.get_plan(fid, "sig", "sm_90") == '{"plan": 1}'
        assert other.get_plan(fid, "sig", "sm_80") == '{"plan": 3}'
        assert (fid, KEY) in other.links()
