"""Many processes on one store: restarts, cold-start races, and writers killed with -9.

The workers are separate Python processes (subprocess + `python -c`), started on purpose
without fusion_cache/__init__ (the frontend, which imports torch): the store must stand on
its own, and eight torch imports on a small CI machine would cost more than the tests.
test_store_postgres.py runs the same scenarios against PostgreSQL.
"""
from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# The start of every worker script (here and in the other store tests): the repository on
# sys.path and fusion_cache as a bare package, so importing the store skips fusion_cache's
# __init__. The root comes from FC_TEST_ROOT (worker_env), else the first argument.
BARE = r'''
import os, sys, types
root = os.environ.get("FC_TEST_ROOT") or sys.argv[1]
sys.path.insert(0, root)
pkg = types.ModuleType("fusion_cache")
pkg.__path__ = [os.path.join(root, "fusion_cache")]
sys.modules.setdefault("fusion_cache", pkg)
'''

WORKER = BARE + r'''
import hashlib, json, random, time
from fusion_cache.store import KernelMeta, open_store

args = json.loads(sys.argv[1])
mode = args["mode"]

def expected(key):
    """Deterministic cubin for a key: 1 KB .. 160 KB, so any visible entry can be checked."""
    size = 1000 + int(hashlib.sha256(key.encode()).hexdigest(), 16) % 160_000
    return hashlib.shake_256(key.encode()).digest(size)

def meta(key, ms=0.0):
    return KernelMeta("k_" + key, 90, "13.0", ("-O3", "--std=c++17"), "// src " + key,
                      "pointwise", json.dumps({"key": key}), ms)

def plan_for(fkey):
    return json.dumps({"plan": fkey})

def out(obj):
    with open(args["out"], "w") as f:
        json.dump(obj, f)

if mode == "race":
    # Start together: everyone is imported and waiting before anyone opens the store.
    open(os.path.join(args["dir"], "ready.%d" % args["rank"]), "w").close()
    go = os.path.join(args["dir"], "go")
    while not os.path.exists(go):
        time.sleep(0.001)

store = open_store()
assert store.persistent, getattr(store, "reason", None)

if mode == "fill":
    rng = random.Random()
    result = {}
    for i in range(args["n"]):
        fkey, kkey = "def-%d" % i, "kern-%d" % i
        fid = store.fusion_id_for(fkey, '[{"op": %d}]' % i, "def fusion_%d(fd): ..." % i)
        store.put_plan(fid, "sig-%d" % i, "sm_90", plan_for(fkey))
        def compile_fn():
            time.sleep(0.005)
            return rng.randbytes(rng.randint(2000, 8000)), meta(kkey, 5.0)
        cubin, _ = store.compile_once(kkey, compile_fn)
        store.link_kernel(fid, kkey)
        result[kkey] = [fid, hashlib.sha256(cubin).hexdigest()]
    store.close()
    out(result)

elif mode == "check":
    calls = []
    result = {}
    for i in range(args["n"]):
        fkey, kkey = "def-%d" % i, "kern-%d" % i
        fid = store.fusion_id_for(fkey, "ignored", "ignored")
        def compile_fn():
            calls.append(kkey)
            return b"recompiled", meta(kkey)
        cubin, here = store.compile_once(kkey, compile_fn)
        result[kkey] = [fid, hashlib.sha256(cubin).hexdigest(),
                        store.get_plan(fid, "sig-%d" % i, "sm_90") == plan_for(fkey),
                        [k.key for k in store.kernels(fid)]]
    store.close()
    out({"calls": calls, "result": result})

elif mode == "race":
    rng = random.Random(args["rank"])
    keys = ["key-%02d" % i for i in range(args["n"])]
    rng.shuffle(keys)
    result = {}
    for key in keys:
        fid = store.fusion_id_for("def-" + key, "[]", "")
        def compile_fn(key=key):
            marker = os.path.join(args["dir"], "compiled.%s.%d" % (key, os.getpid()))
            fd = os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
            os.close(fd)
            time.sleep(0.02)
            return expected(key), meta(key, 20.0)
        cubin, _ = store.compile_once(key, compile_fn)
        assert cubin == expected(key)
        store.link_kernel(fid, key)
        result[key] = fid
    store.close()
    out(result)

elif mode == "churn":
    # Write as fast as possible until killed.
    rng = random.Random(os.getpid())
    print("ready", flush=True)
    step = 0
    while True:
        step += 1
        i = rng.randrange(300)
        fkey, kkey = "def-%d" % i, "kern-%d" % i
        fid = store.fusion_id_for(fkey, "[]", "def f(fd): ...")
        store.put_plan(fid, "sig", "sm_90", plan_for(fkey))
        def compile_fn(kkey=kkey):
            time.sleep(rng.random() * 0.01)
            return expected(kkey), meta(kkey)
        store.compile_once(kkey, compile_fn)
        store.link_kernel(fid, kkey)
        if step % 25 == 0:
            store.prune(max_bytes=4_000_000)

elif mode == "audit":
    # After the kills: nothing partial, nothing wrong, and the store still works.
    report = store.verify()
    bad = [repr(b) for b in report.bad]
    wrong = []
    for k in store.kernels():
        data = store.get_kernel(k.key)
        if data is not None and data != expected(k.key):
            wrong.append(k.key)
        if k.size != len(expected(k.key)) or k.meta != meta(k.key):
            wrong.append("meta:" + k.key)
    fusions = store.fusions()
    ids = [f.id for f in fusions]
    plans_ok = all(store.get_plan(f.id, "sig", "sm_90") in (None, plan_for(f.definition_key))
                   for f in fusions)
    cubin, here = store.compile_once("after-kills", lambda: (b"fresh" * 100, meta("x")))
    fid = store.fusion_id_for("def-after-kills", "[]", "")
    store.close()
    out({"bad": bad, "checked": report.checked, "wrong": wrong, "ids": ids,
         "plans_ok": plans_ok, "compiled_after": here, "new_fid": fid})
'''


def worker_env(cache_dir: Path, db_url: str | None = None) -> dict:
    env = dict(os.environ)
    env["FC_TEST_ROOT"] = str(ROOT)
    env["FUSION_CACHE_DIR"] = str(cache_dir)
    env.pop("FUSION_CACHE_DB_URL", None)
    if db_url:
        env["FUSION_CACHE_DB_URL"] = db_url
    return env


def start(args: dict, env: dict, **kw) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-c", WORKER, json.dumps(args)], env=env, cwd=str(ROOT), **kw
    )


def run_worker(args: dict, env: dict, timeout: float = 120) -> dict:
    proc = start(args, env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    stdout, stderr = proc.communicate(timeout=timeout)
    assert proc.returncode == 0, f"worker {args['mode']} failed:\n{stdout}\n{stderr}"
    return json.loads(Path(args["out"]).read_text())


def restart_scenario(tmp: Path, env: dict, n: int = 12) -> None:
    first = run_worker({"mode": "fill", "n": n, "out": str(tmp / "fill.json")}, env)
    assert sorted(fid for fid, _ in first.values()) == list(range(n))
    second = run_worker({"mode": "check", "n": n, "out": str(tmp / "check.json")}, env)
    assert second["calls"] == []  # zero compiles on a warm store
    for key, (fid, sha, plan_ok, linked) in second["result"].items():
        assert [fid, sha] == first[key]
        assert plan_ok and linked == [key]


def race_scenario(tmp: Path, env: dict, procs: int = 8, keys: int = 20) -> None:
    race_dir = tmp / "race"
    race_dir.mkdir()
    outs = [race_dir / f"out.{r}.json" for r in range(procs)]
    workers = [
        start(
            {"mode": "race", "rank": r, "n": keys, "dir": str(race_dir), "out": str(outs[r])},
            env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for r in range(procs)
    ]
    try:
        deadline = time.monotonic() + 60
        while len(list(race_dir.glob("ready.*"))) < procs:
            assert time.monotonic() < deadline, "workers did not start"
            assert all(w.poll() is None for w in workers), "a worker died before the start"
            time.sleep(0.01)
        (race_dir / "go").touch()
        for w in workers:
            stdout, stderr = w.communicate(timeout=120)
            assert w.returncode == 0, f"{stdout}\n{stderr}"
    finally:
        for w in workers:
            if w.poll() is None:
                w.kill()
    results = [json.loads(o.read_text()) for o in outs]
    assert all(r == results[0] for r in results), "processes disagree on fusion ids"
    assert sorted(results[0].values()) == list(range(keys))
    markers = [p.name.split(".")[1] for p in race_dir.glob("compiled.*")]
    assert sorted(markers) == sorted(f"key-{i:02d}" for i in range(keys)), (
        "every kernel must be compiled exactly once in total"
    )


def _wait_ready(proc: subprocess.Popen, timeout: float) -> None:
    line: list[str] = []
    reader = threading.Thread(target=lambda: line.append(proc.stdout.readline()), daemon=True)
    reader.start()
    reader.join(timeout)
    assert line and line[0].strip() == "ready", f"churn worker did not start: {line}"


def kill_scenario(tmp: Path, env: dict, kills: int = 20, per_round: int = 5) -> None:
    rng = random.Random(1234)
    killed = 0
    while killed < kills:
        logs = [tmp / f"churn.{killed + i}.err" for i in range(min(per_round, kills - killed))]
        batch = []
        for log in logs:
            with log.open("w") as err:  # the child keeps its own copy of the descriptor
                batch.append(start({"mode": "churn"}, env, stdout=subprocess.PIPE, stderr=err,
                                   text=True))
        try:
            for proc in batch:
                _wait_ready(proc, 60)
            for proc, log in zip(batch, logs):  # each dies at its own moment, mid-write or not
                time.sleep(rng.uniform(0.0, 0.3))
                assert proc.poll() is None, f"a churn worker exited: {log.read_text()}"
                os.kill(proc.pid, signal.SIGKILL)
                proc.wait(10)
                killed += 1
        finally:
            for proc in batch:
                if proc.poll() is None:
                    proc.kill()
                proc.stdout.close()
    audit = run_worker({"mode": "audit", "out": str(tmp / "audit.json")}, env)
    assert audit["bad"] == [], audit["bad"]
    assert audit["wrong"] == []
    assert audit["checked"] > 0
    assert audit["ids"] == list(range(len(audit["ids"]))), "fusion ids must stay dense"
    assert audit["plans_ok"]
    assert audit["compiled_after"] is True
    assert audit["new_fid"] == len(audit["ids"])


@pytest.mark.slow
def test_restart_finds_everything_without_compiling(tmp_path):
    restart_scenario(tmp_path, worker_env(tmp_path / "cache"))


@pytest.mark.slow
def test_eight_processes_on_a_cold_store_compile_each_kernel_once(tmp_path):
    race_scenario(tmp_path, worker_env(tmp_path / "cache"))


@pytest.mark.slow
def test_twenty_kill_nines_leave_a_clean_store(tmp_path):
    kill_scenario(tmp_path, worker_env(tmp_path / "cache"))
