"""Where a training step's GPU time goes: torch.profiler over steady steps, per contender.

    python -m benchmarks.step_kernels [--models gpt2,llama,resnet18]
        [--contenders eager,inductor,fusion_cache,fusion_cache_graphs,inductor_graphs,
                      fusion_cache_switched,fusion_cache_switched_graphs]
        [--warmup 6] [--steps 3] [--top 30] [--out DIR]

benchmarks.profile_model says where the host time goes; this says where the device time goes:
for each model and contender, the summed kernel time of a step, the kernels launched per step,
the step's wall time, and the busiest kernels (CUDA time per step, calls per step), grouped
as GEMM / attention / convolution / ours / triton / other ATen. With CUDA graphs the replayed
kernels show too. Text tables to stdout and DIR/step-kernels-<model>.txt.
"""

from __future__ import annotations

import argparse
import re
import statistics
import time
import warnings
from collections import defaultdict
from contextlib import nullcontext
from pathlib import Path

import torch

from benchmarks import models
from benchmarks.model_defs import model_cases

GROUPS = (  # first match wins: the kernel name's family
    ("attention", re.compile(r"flash|fmha|attention|sdpa|cudnn.*(mha|sdpa)", re.I)),
    ("gemm", re.compile(r"gemm|cutlass|sm90_xmma|xmma|nvjet|ampere_|sm80_|s16816|s1688|cublas", re.I)),
    ("conv", re.compile(r"conv|implicit_convolve|winograd|fft|cudnn|dgrad|wgrad", re.I)),
    ("ours", re.compile(r"^fc_")),
    ("triton", re.compile(r"^triton_")),
)


def group_of(name: str) -> str:
    return next((g for g, pat in GROUPS if pat.search(name)), "aten-other")


def profile_contender(case, contender: str, warmup: int, steps: int):
    device = "cuda"
    model = models.initial_model(case, device)
    fn = models.compiled(contender, model)
    params = list(model.parameters())
    batches = models.batches_for(case, warmup + steps, device)
    models.train(fn, params, case, batches[:warmup], device)
    walls = []
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        _, walls = models.train(fn, params, case, batches[warmup:], device)
    per_kernel: dict[str, list[float]] = defaultdict(lambda: [0.0, 0])
    for ev in prof.events():
        if ev.device_type != torch.autograd.DeviceType.CUDA:
            continue
        name = ev.name
        if name.startswith(("Memcpy", "Memset")) or "memcpy" in name.lower():
            name = name.split(" ")[0]
        row = per_kernel[name]
        row[0] += ev.device_time_total if hasattr(ev, "device_time_total") else ev.cuda_time_total
        row[1] += 1
    models.release_memory(device)
    return per_kernel, walls


def render(model: str, contender: str, per_kernel, walls, steps: int, top: int) -> str:
    total = sum(v[0] for v in per_kernel.values()) / steps
    launches = sum(v[1] for v in per_kernel.values()) / steps
    groups: dict[str, list[float]] = defaultdict(lambda: [0.0, 0])
    for name, (us, n) in per_kernel.items():
        g = groups[group_of(name)]
        g[0] += us / steps
        g[1] += n / steps
    lines = [f"## {model} / {contender}: step wall {statistics.median(walls) * 1e3:.2f} ms, "
             f"kernel time {total / 1e3:.3f} ms, kernels {launches:.0f} per step"]
    lines.append("  groups: " + ", ".join(f"{g} {us / 1e3:.3f} ms ({n:.0f})"
                                          for g, (us, n) in sorted(groups.items(), key=lambda kv: -kv[1][0])))
    for name, (us, n) in sorted(per_kernel.items(), key=lambda kv: -kv[1][0])[:top]:
        lines.append(f"  {us / steps:9.1f} us {n / steps:5.0f}x  [{group_of(name)}] {name[:150]}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.step_kernels", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default="gpt2,llama,resnet18")
    parser.add_argument("--contenders",
                        default="eager,inductor,fusion_cache,inductor_graphs,fusion_cache_graphs")
    parser.add_argument("--warmup", type=int, default=6)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--top", type=int, default=30)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    warnings.filterwarnings("ignore")
    cases = {c.name: c for c in model_cases(False)}
    for name in args.models.split(","):
        text = []
        for contender in args.contenders.split(","):
            start = time.perf_counter()
            switched = models.switches_on() if models.SWITCHED in contender else nullcontext()
            with switched:  # Note [Unmeasured switches]
                per_kernel, walls = profile_contender(cases[name],
                                                      contender.replace(models.SWITCHED, ""),
                                                      args.warmup, args.steps)  # fmt: skip
            block = render(name, contender, per_kernel, walls, args.steps, args.top)
            print(block + f"\n  ({time.perf_counter() - start:.0f} s)", flush=True)
            text.append(block)
        if args.out is not None:
            args.out.mkdir(parents=True, exist_ok=True)
            (args.out / f"step-kernels-{name}.txt").write_text("\n\n".join(text) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
