"""Time to first result of five fusions in a fresh process, with the compile counts.

Run it twice on one store: the first run compiles (cold), the second loads every kernel
from the store (warm). Prints one JSON line."""
import json
import os
import sys
import time

start = time.perf_counter()
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch  # noqa: E402
from five_fusions import define_all, example_inputs  # noqa: E402

from fusion_cache import FusionCache  # noqa: E402

device = "cuda" if torch.cuda.is_available() else "cpu"
torch.zeros(1, device=device)  # CUDA context creation is not the runtime's cost
inputs = [example_inputs(i, device) for i in range(5)]
if device == "cuda":
    torch.cuda.synchronize()
profile = None
if os.environ.get("RESTART_PROFILE"):  # where the time goes, on stderr
    import cProfile

    profile = cProfile.Profile()
    profile.enable()
t0 = time.perf_counter()
fds = define_all()
outs = [fd.execute(inputs[i]) for i, fd in enumerate(fds)]
if device == "cuda":
    torch.cuda.synchronize()
t1 = time.perf_counter()
if profile is not None:
    import pstats

    profile.disable()
    pstats.Stats(profile, stream=sys.stderr).sort_stats("cumulative").print_stats("fusion_cache|codegen|schedulers|sqlalchemy/engine/base", 40)
print(json.dumps({"device": device, "first_results_s": round(t1 - t0, 4),
                  "process_s": round(t1 - start, 3), "ids": [fd.id() for fd in fds],
                  **FusionCache.get().stats()}))  # fmt: skip
