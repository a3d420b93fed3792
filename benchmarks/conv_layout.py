"""FUSION_CACHE_CONV_LAYOUT on and off, one process: a convolutional model's training step.

    python -m benchmarks.conv_layout [--model resnet18] [--steps 20] [--graphs] [--kernels]
        [--inductor-graphs] [--out DIR]

Note [Channels-last convolutions] is a layout choice made when the graphs are lowered, so the
two layouts can be timed in one process, beside eager and inductor on the same card: per
contender the median step (steps 5 to the last), the first step, the largest loss difference
from eager's and inductor's own, regions and ops left to eager; `--graphs` adds
fusion_cache's CUDA-graph mode in both layouts (`--inductor-graphs` inductor's),
`--kernels` the GPU kernel time of a steady step by family for fusion_cache in both layouts
(benchmarks.step_kernels), with its busiest kernels. JSON to DIR/conv-layout-<model>.json.
"""
from __future__ import annotations

import argparse
import json
import os
import time
import warnings
from pathlib import Path

import torch

from benchmarks import models, step_kernels
from benchmarks.model_defs import model_cases

LAYOUTS = ("as_traced", "channels_last")


def _contenders(graphs: bool, inductor_graphs: bool) -> list[tuple[str, str, str]]:
    """(label, contender, layout) in run order."""
    rows = [("eager", "eager", ""), ("inductor", "inductor", "")]
    rows += [(f"fusion_cache/{lay}", "fusion_cache", lay) for lay in LAYOUTS]
    if graphs:
        rows += [(f"fusion_cache_graphs/{lay}", "fusion_cache_graphs", lay) for lay in LAYOUTS]
    if inductor_graphs:
        rows.append(("inductor_graphs", "inductor_graphs", ""))
    return rows


def _set_layout(layout: str) -> None:
    if layout:
        os.environ["FUSION_CACHE_CONV_LAYOUT"] = layout
    else:
        os.environ.pop("FUSION_CACHE_CONV_LAYOUT", None)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.conv_layout", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="resnet18")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--graphs", action="store_true")
    parser.add_argument("--inductor-graphs", action="store_true")
    parser.add_argument("--kernels", action="store_true")
    parser.add_argument("--tiny", action="store_true")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    warnings.filterwarnings("ignore")
    case = next(c for c in model_cases(args.tiny) if c.name == args.model)
    rows: dict[str, dict] = {}
    eager_losses: list[float] = []
    for label, contender, layout in _contenders(args.graphs, args.inductor_graphs):
        _set_layout(layout)
        start = time.perf_counter()
        row = models.run_contender(contender, case, args.steps, args.device)
        if contender == "eager":
            eager_losses = row["losses"]
        diff = max(abs(a - b) for a, b in zip(row["losses"], eager_losses))
        keep = {k: row.get(k) for k in ("median_ms", "first_step_s", "losses", "regions",
                                         "ops_fused", "ops_eager", "eager_ops", "redefined")}
        rows[label] = {**keep, "max_loss_diff": diff}
        print(f"{label:32} step {row['median_ms']:7.2f} ms  first {row['first_step_s']:6.2f} s  "
              f"loss diff {diff:.2e}  regions {row.get('regions', '-')}  eager ops "
              f"{row.get('ops_eager', '-')}  ({time.perf_counter() - start:.0f} s)", flush=True)
    kernels = {}
    if args.kernels and args.device == "cuda":
        for layout in LAYOUTS:
            _set_layout(layout)
            per_kernel, walls = step_kernels.profile_contender(case, "fusion_cache", 6, 3)
            text = step_kernels.render(args.model, f"fusion_cache/{layout}", per_kernel, walls,
                                       3, 12)  # fmt: skip
            kernels[layout] = text
            print(text, flush=True)
    _set_layout("")
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        meta = {"device": torch.cuda.get_device_name() if args.device == "cuda" else "cpu",
                "torch": torch.__version__, "steps": args.steps}  # fmt: skip
        path = args.out / f"conv-layout-{args.model}.json"
        path.write_text(json.dumps({"meta": meta, "rows": rows, "kernels": kernels}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
