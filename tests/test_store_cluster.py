"""Compile once across nodes: processes with their own FUSION_CACHE_DIR (as on separate nodes)
and one PostgreSQL database compile each kernel once in total, and a holder killed while it
compiles blocks nobody.

Workers are plain Python processes (no torch), as in test_store_stress.py; they compile real
kernels with NVRTC, which needs no GPU.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from test_store_postgres import pg_url  # noqa: F401  (fixture: a fresh schema)
from test_store_stress import BARE, ROOT, worker_env

pytestmark = pytest.mark.postgres

WORKER = BARE + r'''
import hashlib, json, random, time
from codegen.nvrtc import compile_cubin, default_options
from fusion_cache.store import KernelMeta, open_store

args = json.loads(sys.argv[1])
options = tuple(default_options(90))

def source(i):
    return ('extern "C" __global__ void k%d(float* x, int n) {\n'
            '  int i = blockIdx.x * blockDim.x + threadIdx.x;\n'
            '  if (i < n) x[i] = x[i] * %d.0f + 1.0f;\n}\n' % (i, i + 2))

def compile_fn(i):
    def run():
        if args.get("die_while_compiling"):
            print("compiling", flush=True)
            time.sleep(60)  # killed here, lock held
        cubin = compile_cubin(source(i), 90, options=options)
        with open(args["log"], "a") as log:  # one line per compile, from every process
            log.write("k%d %d %f\n" % (i, os.getpid(), time.time()))
        return cubin, KernelMeta("k%d" % i, 90, "13.0", options, source(i))
    return run

open(os.path.join(args["dir"], "ready.%d" % args["rank"]), "w").close()
while not os.path.exists(os.path.join(args["dir"], "go")):
    time.sleep(0.001)
store = open_store()
assert store.persistent, getattr(store, "reason", None)
print("opened", flush=True)
kernels = list(range(args["n"]))
random.Random(args["rank"]).shuffle(kernels)
result = {}
t0 = time.monotonic()
for i in kernels:
    cubin, here = store.compile_once("key-%d" % i, compile_fn(i), timeout_s=args["timeout"])
    result["key-%d" % i] = [hashlib.sha256(cubin).hexdigest(), here]
store.close()
with open(args["out"], "w") as f:
    json.dump({"result": result, "seconds": time.monotonic() - t0}, f)
'''


def start(args: dict, env: dict) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", WORKER, json.dumps(args)], env=env,
                            cwd=str(ROOT), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)  # fmt: skip


def launch(tmp: Path, url: str, procs: int, n: int, timeout: float = 60,
           extra: dict[int, dict] | None = None):  # fmt: skip
    run_dir = tmp / "run"
    run_dir.mkdir(exist_ok=True)
    workers = []
    for rank in range(procs):
        args = {"rank": rank, "n": n, "dir": str(run_dir), "log": str(tmp / "compiles.log"),
                "out": str(run_dir / f"out.{rank}.json"), "timeout": timeout}
        args.update((extra or {}).get(rank, {}))
        # a cache directory of its own for each process, as on separate nodes
        workers.append(start(args, worker_env(tmp / f"node{args['rank']}", url)))
    deadline = time.monotonic() + 60
    while len(list(run_dir.glob("ready.*"))) < procs:
        assert time.monotonic() < deadline, "workers did not start"
        assert all(w.poll() is None for w in workers), [w.communicate() for w in workers]
        time.sleep(0.01)
    (run_dir / "go").touch()
    return run_dir, workers


def finish(workers) -> None:
    try:
        for w in workers:
            out, err = w.communicate(timeout=120)
            assert w.returncode == 0, f"{out}\n{err}"
    finally:
        for w in workers:
            if w.poll() is None:
                w.kill()


@pytest.mark.slow
def test_eight_nodes_compile_each_kernel_once_in_total(pg_url, tmp_path):  # noqa: F811
    n = 5
    run_dir, workers = launch(tmp_path, pg_url, procs=8, n=n)
    finish(workers)
    compiles = (tmp_path / "compiles.log").read_text().split("\n")[:-1]
    assert sorted(line.split()[0] for line in compiles) == [f"k{i}" for i in range(n)], compiles
    results = [json.loads((run_dir / f"out.{r}.json").read_text())["result"] for r in range(8)]
    for key in results[0]:
        assert len({r[key][0] for r in results}) == 1, f"processes got different cubins for {key}"
    assert sum(here for r in results for _, here in r.values()) == n


def test_a_holder_killed_while_compiling_blocks_nobody(pg_url, tmp_path):  # noqa: F811
    run_dir, workers = launch(tmp_path, pg_url, procs=1, n=1,
                              extra={0: {"die_while_compiling": True}})
    holder = workers[0]
    assert holder.stdout.readline().strip() == "opened"
    assert holder.stdout.readline().strip() == "compiling"  # holds key-0's lock now
    _, waiters = launch(tmp_path, pg_url, procs=1, n=1, timeout=60,
                        extra={0: {"rank": 1, "out": str(run_dir / "out.1.json")}})
    assert waiters[0].stdout.readline().strip() == "opened"
    time.sleep(2)  # long enough to compile: the waiter is blocked on the holder's lock
    assert waiters[0].poll() is None
    killed_at = time.time()
    os.kill(holder.pid, signal.SIGKILL)
    holder.wait(10)
    finish(waiters)
    name, pid, compiled_at = (tmp_path / "compiles.log").read_text().split()
    assert (name, int(pid)) == ("k0", waiters[0].pid)
    # it waited for the holder, and the dead holder's lock went with its connection
    assert killed_at < float(compiled_at) < killed_at + 10


def test_a_cluster_lock_held_too_long_is_not_waited_on(pg_url, tmp_path):  # noqa: F811
    import warnings

    from fusion_cache.store import KernelMeta, StoreWarning, open_store
    from fusion_cache.store.locks import AdvisoryLock

    with open_store(pg_url, cache_dir=tmp_path / "a") as a, \
            open_store(pg_url, cache_dir=tmp_path / "b") as b:
        other = AdvisoryLock(a._engine, "k")  # another node compiling k, for ever
        assert other.acquire(1)
        try:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                t0 = time.monotonic()
                got = b.compile_once("k", lambda: (b"cubin", KernelMeta("k", 90, "13", (), "")),
                                     timeout_s=0.5)
            assert got == (b"cubin", True) and time.monotonic() - t0 < 5
            assert [str(w.message) for w in caught if w.category is StoreWarning] == [
                f"fusion-cache store {b.url}: compile_once failed (TimeoutError: kernel lock "
                "held over 0.5 s); compiling here as well"]
            free = AdvisoryLock(b._engine, "other-key")
            assert free.acquire(0.1)  # other keys are free
            free.release()
        finally:
            other.release()
