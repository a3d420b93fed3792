"""Several worker processes, as torchrun would start them, running the same fusions on one
shared store: each kernel is compiled once in total and every rank sees the same fusion ids.

    python examples/multiprocess_job.py --workers 8      # launcher (spawns the ranks)

A rank reads RANK / WORLD_SIZE like a torchrun worker; on a GPU machine it runs the fusions
on cuda:LOCAL_RANK % device_count, otherwise it compiles them for --target (default h100)."""
import argparse
import json
import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def worker() -> None:
    import torch
    from five_fusions import define_all, example_inputs

    from fusion_cache import FusionCache

    rank = int(os.environ["RANK"])
    gpu = torch.cuda.is_available()
    start = time.perf_counter()
    fds = define_all()
    for i, fd in enumerate(fds):
        if gpu:
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", rank)) % torch.cuda.device_count())
            fd.execute(example_inputs(i, "cuda"))
        else:
            fd.precompile(example_inputs(i, "meta"), target=os.environ.get("TARGET", "h100"))
    stats = FusionCache.get().stats()
    print(json.dumps({"rank": rank, "ids": [fd.id() for fd in fds], "seconds": round(time.perf_counter() - start, 3),
                      "kernels_compiled": stats["kernels_compiled"], "kernels_loaded": stats["kernels_loaded"]}))  # fmt: skip


def launch(workers: int, target: str) -> int:
    procs = []
    for rank in range(workers):
        env = dict(os.environ, RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(workers), TARGET=target)
        procs.append(subprocess.Popen([sys.executable, __file__, "--worker"], env=env,
                                      stdout=subprocess.PIPE, text=True))  # fmt: skip
    results = [json.loads(p.communicate()[0].strip().splitlines()[-1]) for p in procs]
    for r in sorted(results, key=lambda r: r["rank"]):
        print(r)
    compiled = sum(r["kernels_compiled"] for r in results)
    same = len({tuple(r["ids"]) for r in results}) == 1
    print(f"{workers} ranks: {compiled} kernels compiled in total, fusion ids identical: {same}")
    return 0 if same and all(p.returncode == 0 for p in procs) else 1


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--target", default="h100")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        worker()
    else:
        sys.exit(launch(args.workers, args.target))
