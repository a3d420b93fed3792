"""How the regions of a model's training step segment for a GPU, without a GPU.

    python -m benchmarks.region_kernels [--models llama,gpt2] [--tiny] [--target h100] [-v]
        [--switches]

One training step runs on the CPU through backend="fusion_cache" (the regions run on the
reference evaluator there); each region the backend lowered is then precompiled for the
target profile on meta stand-ins of its traced inputs, and its plan counted: generated
kernels, ATen segments (GEMM, attention: one torch call each) and reference segments (a
defect on a GPU). With -v, each region's segments and schedulers; with --switches, every
switch of Note [Unmeasured switches] on. Sizes are the benchmark's unless --tiny. On the
CPU, attention's backward gets two small fills of a random state the GPU's forward hands
it instead (two kernels a layer counted here that a GPU step does not run). The counts are what a step launches from the regions; what the
graph leaves to eager is not counted (none for the transformers).
"""
from __future__ import annotations

import argparse
import sys
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import torch


@dataclass
class RegionPlan:
    """One region's plan for the target: its segments as (scheduler or 'reference', kernels)."""

    graph: str
    name: str
    fusion_id: int
    # (scheduler, kernels, plan, the op names of its definition) of each segment
    segments: list[tuple[str, int, str, frozenset[str]]] = field(default_factory=list)

    @property
    def kernels(self) -> int:
        return sum(s[1] for s in self.segments)

    def count(self, scheduler: str) -> int:
        return sum(1 for s in self.segments if s[0] == scheduler)


def _meta(spec: Any) -> Any:
    if not spec.is_tensor:
        return {bool: True, int: 1, float: 1.0}[spec.dtype]
    if spec.cpu_scalar:
        return torch.zeros((), dtype=spec.dtype)
    return torch.empty_strided(spec.sizes, spec.strides, dtype=spec.dtype, device="meta")


def _ops(fd: Any) -> frozenset[str]:
    return frozenset(r.name for r in fd._records if r.kind == "op")


def _plan_of(fd: Any, inputs: list, target: str) -> list[tuple[str, int, str, frozenset[str]]]:
    from fusion_cache.runtime.executor import executor_for
    from fusion_cache.runtime.plans import LaunchPlan

    fd.precompile(inputs, target=target)
    plan = executor_for(fd).last_plan
    if isinstance(plan, LaunchPlan):
        return [(plan.spec.scheduler, len(plan.spec.kernels), plan.spec.description, _ops(fd))]
    if not hasattr(plan, "segments"):  # one ATen call
        return [("aten", 0, getattr(getattr(plan, "spec", None), "description", ""), _ops(fd))]
    out = []
    for seg in plan.segments:
        sub = executor_for(seg.definition).last_plan
        spec = getattr(sub, "spec", None)
        kernels = len(spec.kernels) if isinstance(sub, LaunchPlan) else 0
        out.append((seg.scheduler or "reference", kernels,
                    spec.description if spec is not None else "", _ops(seg.definition)))
    return out


def step_regions(name: str, tiny: bool) -> list[tuple[str, Any]]:
    """(graph kind, RegionCall) of each region of one CPU training step of model `name`."""
    from benchmarks import models
    from benchmarks.model_defs import model_cases
    from fusion_cache.frontends import dynamo_backend

    case = next(c for c in model_cases(tiny) if c.name == name)
    model = models.initial_model(case, "cpu")
    fn = models.compiled("fusion_cache", model)
    dynamo_backend.reset_reports()
    before = len(dynamo_backend._reports)
    models.train(fn, list(model.parameters()), case, models.batches_for(case, 1, "cpu"), "cpu")
    with dynamo_backend._lock:
        reports = dynamo_backend._reports[before:]
    return [(r.graph, region) for r in reports for region in r.regions_list]


def region_plans(name: str, tiny: bool = False, target: str = "h100") -> list[RegionPlan]:
    """Each region of a step of `name`, planned for `target` at its traced inputs."""
    plans = []
    for graph, region in step_regions(name, tiny):
        # the definition its calls ran: the last one made (a region whose inputs came with
        # other strides than traced was defined again at its first call)
        specs, (fd, _) = list(region._definitions.items())[-1]
        plan = RegionPlan(graph, region.__name__, fd.id())
        plan.segments = _plan_of(fd, [_meta(s) for s in specs], target)
        plans.append(plan)
    return plans


def summary(plans: list[RegionPlan]) -> Counter:
    total: Counter = Counter()
    for p in plans:
        total["regions"] += 1
        total["kernels"] += p.kernels
        for s in p.segments:
            total["segments"] += 1
            total[s[0]] += 1
    return total


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.region_kernels",
                                     description=__doc__.split("\n\n")[0])  # fmt: skip
    parser.add_argument("--models", default="llama,gpt2")
    parser.add_argument("--tiny", action="store_true")
    parser.add_argument("--target", default="h100")
    parser.add_argument("-v", "--verbose", action="store_true")
    parser.add_argument("--switches", action="store_true")
    args = parser.parse_args(argv)
    if args.switches:
        import os

        from schedulers.tuning import SWITCHES

        os.environ.update({f"FUSION_CACHE_{name}": "1" for name in SWITCHES})
    for name in args.models.split(","):
        plans = region_plans(name, args.tiny, args.target)
        for p in plans:
            print(f"{name} {p.graph:<8} {p.name:<18} fusion {p.fusion_id:<5} "
                  f"{p.kernels:>3} kernels, {p.count('aten'):>2} aten, "
                  f"{len(p.segments):>3} segments")  # fmt: skip
            if args.verbose:
                for s, k, desc, _ in p.segments:
                    print(f"      {s:<14} {k} {desc[:150]}")
        print(f"{name}: {dict(summary(plans))}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
