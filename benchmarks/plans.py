"""Which scheduler takes each benchmark case, and its plan, without a GPU.

    python -m benchmarks.plans [--family layouts] [--target h100] [-k NAME]

Each case is precompiled on meta tensors for the target profile (NVRTC runs; a persistent
FUSION_CACHE_DIR makes a second run fast) and one line printed: the case, the scheduler of
each kernel plan (segments: one a segment), the kernels' grids and the plan's description.
"""
from __future__ import annotations

import argparse
import sys
from typing import Any

from .cases import FAMILIES, select


def describe_case(case: Any, target: str) -> str:
    from fusion_cache.runtime.executor import executor_for
    from fusion_cache.runtime.plans import LaunchPlan

    fd = case.build()
    fd.precompile(case.inputs("meta"), target=target)
    plan = executor_for(fd).last_plan
    if isinstance(plan, LaunchPlan):
        spec = plan.spec
        grids = " ".join(f"{k.name}{list(k.grid)}x{list(k.block)}" for k in spec.kernels)
        return f"{spec.scheduler}: {grids}: {spec.description}"
    parts = []
    for seg in plan.segments:
        sub = executor_for(seg.definition).last_plan
        spec = getattr(sub, "spec", None)
        parts.append(f"{seg.scheduler or 'reference'}"
                     + (f" ({spec.description})" if spec is not None else ""))  # fmt: skip
    return f"segmented: {' | '.join(parts)}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.plans",
                                     description=__doc__.split("\n\n")[0])  # fmt: skip
    parser.add_argument("--family", action="append", choices=FAMILIES)
    parser.add_argument("--target", default="h100")
    parser.add_argument("-k", dest="pattern", default=None, help="only cases naming this")
    args = parser.parse_args(argv)
    for case in select(args.family or ["layouts"], pattern=args.pattern):
        try:
            line = describe_case(case, args.target)
        except Exception as e:  # noqa: BLE001 - one case's failure is its line
            line = f"FAILED: {type(e).__name__}: {e}"
        print(f"{case.name:40s} {line}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
