"""Turn a results JSON into a Markdown table and a bar chart beside it; needs no GPU.

    python -m benchmarks.report benchmarks/results/<device-slug>.json

Writes <device-slug>.md and, when matplotlib is installed, <device-slug>.png. The summary
checks the targets of PERFORMANCE.md against the numbers of the same run.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Any

from benchmarks.cases import FAMILIES

AT_CEILING = 90.0  # target 1: % of the copy ceiling
MIN_VS_COMPILE = 0.95  # target 2: no case slower than this x torch.compile
GEOMEAN_VS_COMPILE = 1.15
SOFTMAX_VS_COMPILE = 1.5


def load_results(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text())


def families_in(data: dict[str, Any]) -> list[str]:
    """The families present, known ones in suite order, then any others."""
    present = data.get("families", {})
    return [f for f in FAMILIES if f in present] + [f for f in present if f not in FAMILIES]


def all_cases(data: dict[str, Any]) -> list[dict[str, Any]]:
    return [c for fam in families_in(data) for c in data["families"][fam]["cases"]]


def geomean(values: list[float]) -> float | None:
    return math.exp(sum(map(math.log, values)) / len(values)) if values else None


def at_ceiling_vs_compile(case: dict[str, Any]) -> float | None:
    """The most a fusion can do against torch.compile in this case's run: the copy ceiling
    (the fusion's GB/s over its fraction of it) over torch.compile's GB/s."""
    pct, fusion, compiled = case.get("pct_of_ceiling"), case.get("fusion_gbps"), case.get("compile_gbps")
    return fusion * 100 / pct / compiled if pct and fusion and compiled else None


def summarize(data: dict[str, Any]) -> dict[str, Any]:
    """The figures PERFORMANCE.md sets targets for, over the cases that ran."""
    cases = all_cases(data)
    timed = [c for c in cases if c["family"] != "host" and c.get("fusion_gbps")]
    large = [c for c in timed if c.get("large")]
    ratios = {c["name"]: c["speedup_vs_compile"] for c in timed if c.get("speedup_vs_compile")}
    softmax = [r for name, r in ratios.items() if name.startswith("softmax_")]
    # where torch.compile already runs near the ceiling, no kernel can lead it by much
    softmax_bound = [at_ceiling_vs_compile(c) for c in timed if c["name"].startswith("softmax_")]
    slowest = min(ratios, key=ratios.__getitem__) if ratios else None
    host = next((c for c in cases if c["family"] == "host" and c.get("fusion_ms")), None)
    checked = [c for c in cases if c.get("correct") is not None]
    return {
        "cases": len(cases),
        "timed": len(timed),
        "large": len(large),
        "large_at_ceiling": sum(c["pct_of_ceiling"] >= AT_CEILING for c in large),
        "slowest_vs_compile": slowest,
        "min_vs_compile": ratios.get(slowest) if slowest else None,
        "geomean_vs_compile": geomean(list(ratios.values())),
        "softmax_vs_compile": geomean(softmax),
        "softmax_at_ceiling": geomean(softmax_bound) if None not in softmax_bound else None,
        "host": host,
        "correct": sum(bool(c["correct"]) for c in checked),
        "checked": len(checked),
        "failed": [c for c in cases if c.get("error") or c.get("correct") is False],
    }


def _num(value: float | None, fmt: str, suffix: str = "") -> str:
    return format(value, fmt) + suffix if value is not None else "-"


def _met(ok: bool | None) -> str:
    return {True: "yes", False: "**no**", None: "-"}[ok]


def _at_least(value: float | None, bar: float) -> bool | None:
    return None if value is None else value >= bar


def _us(ms: float | None) -> str:
    return _num(ms * 1e3 if ms is not None else None, ".1f", " us")


def targets_table(s: dict[str, Any]) -> list[str]:
    host = s["host"]
    host_ok = None
    host_text = "-"
    if host:
        host_ok = host.get("eager_ms") is not None and host["fusion_ms"] < host["eager_ms"]
        host_text = (f"{_us(host['fusion_ms'])} vs eager {_us(host.get('eager_ms'))}, "
                     f"torch.compile {_us(host.get('compile_ms'))}")
    large_ok = s["large_at_ceiling"] == s["large"] if s["large"] else None
    slowest = f" ({s['slowest_vs_compile']})" if s["slowest_vs_compile"] else ""
    bound = (f"; {s['softmax_at_ceiling']:.3f}x with every case at the copy ceiling"
             if s.get("softmax_at_ceiling") else "")
    return [
        "| target | result | met |",
        "|---|---|---|",
        f"| large cases at >= {AT_CEILING:.0f}% of the copy ceiling | "
        f"{s['large_at_ceiling']} of {s['large']} | {_met(large_ok)} |",
        f"| slowest vs torch.compile >= {MIN_VS_COMPILE}x | "
        f"{_num(s['min_vs_compile'], '.3f', 'x')}{slowest} | "
        f"{_met(_at_least(s['min_vs_compile'], MIN_VS_COMPILE))} |",
        f"| geometric mean vs torch.compile >= {GEOMEAN_VS_COMPILE}x | "
        f"{_num(s['geomean_vs_compile'], '.3f', 'x')} | "
        f"{_met(_at_least(s['geomean_vs_compile'], GEOMEAN_VS_COMPILE))} |",
        f"| softmax vs torch.compile >= {SOFTMAX_VS_COMPILE}x (geometric mean) | "
        f"{_num(s['softmax_vs_compile'], '.3f', 'x')}{bound} | "
        f"{_met(_at_least(s['softmax_vs_compile'], SOFTMAX_VS_COMPILE))} |",
        f"| host time of a cached execute below eager's | {host_text} | {_met(host_ok)} |",
        f"| correct against eager | {s['correct']} of {s['checked']} checked "
        f"({s['cases']} cases) | {_met(s['correct'] == s['cases'] if s['cases'] else None)} |",
    ]


def family_table(family: str, run: dict[str, Any]) -> list[str]:
    quick = ", quick run" if run.get("quick") else ""
    rounds = max((len(c.get("fusion_rounds_ms") or ()) for c in run["cases"]), default=0)
    timing = f", the median of {rounds} interleaved timing rounds" if rounds > 1 else ""
    lines = [f"## {family}", "",
             f"Run {run.get('date')}, copy ceiling {_num(run.get('copy_ceiling_gbps'), '.0f')} "
             f"GB/s{quick}{timing}.", ""]
    if run.get("note"):  # e.g. cases re-measured in a later run
        lines += [f"Note: {run['note']}.", ""]
    correct = {True: "yes", False: "**no**", None: "**error**"}
    if family == "host":
        lines += ["| case | fusion | eager | torch.compile | x eager | x compile | correct |",
                  "|---|---|---|---|---|---|---|"]
        lines += [f"| {c['name']} | {_us(c.get('fusion_ms'))} | {_us(c.get('eager_ms'))} | "
                  f"{_us(c.get('compile_ms'))} | {_num(c.get('speedup_vs_eager'), '.2f', 'x')} | "
                  f"{_num(c.get('speedup_vs_compile'), '.2f', 'x')} | {correct[c.get('correct')]} |"
                  for c in run["cases"]]
        return lines + [""]
    # cases timed beside a copy of their own bytes (Case.size_matched): one more column
    sized = any(c.get("pct_of_size_copy") is not None for c in run["cases"])
    lines += ["| case | MiB | fusion GB/s | eager GB/s | compile GB/s | % ceiling | x compile "
              "| correct | max err |" + (" % copy of its size |" if sized else ""),
              "|---|---|---|---|---|---|---|---|---|" + ("---|" if sized else "")]
    lines += [f"| {c['name']} | {c['bytes'] / 2**20:.0f} | {_num(c.get('fusion_gbps'), '.0f')} | "
              f"{_num(c.get('eager_gbps'), '.0f')} | {_num(c.get('compile_gbps'), '.0f')} | "
              f"{_num(c.get('pct_of_ceiling'), '.0f', '%')} | "
              f"{_num(c.get('speedup_vs_compile'), '.2f', 'x')} | {correct[c.get('correct')]} | "
              f"{_num(c.get('max_err'), '.2g')} |"
              + (f" {_size_copy(c)} |" if sized else "")
              for c in run["cases"]]
    if sized:
        lines += ["", "% copy of its size: the fusion's GB/s over a device-to-device copy of the "
                  "case's own bytes timed in the same rounds (launch, ramp, tail and the flush's "
                  "dirty lines weigh on both); % ceiling (the 1 GiB copy) stays the judged figure."]
    return lines + [""]


def _size_copy(c: dict[str, Any]) -> str:
    pct = c.get("pct_of_size_copy")
    return f"{pct:.0f}% of {c['size_copy_gbps']:.0f}" if pct is not None else "-"


def render_markdown(data: dict[str, Any]) -> str:
    s = summarize(data)
    lines = [
        f"# Benchmarks on {data.get('device')}", "",
        f"Last run {data.get('date')}: torch {data.get('torch')}, triton {data.get('triton')}, "
        f"CUDA {data.get('cuda')}, copy ceiling {_num(data.get('copy_ceiling_gbps'), '.0f')} GB/s."
        " GB/s counts bytes read plus bytes written once each, at the median time of "
        "`triton.testing.do_bench` (of the median of several rounds, the fusion, eager and "
        "torch.compile timed in turn in each, where a family's line says so); each family's "
        "own run is dated below and its % of ceiling uses the ceiling of that run.", "",
        "## Targets (PERFORMANCE.md)", "", *targets_table(s), "",
    ]
    for family in families_in(data):
        lines += family_table(family, data["families"][family])
    if s["failed"]:
        lines += ["## Failures", ""]
        for c in s["failed"]:
            first = (c.get("error") or "out of tolerance").strip().splitlines()[0]
            lines.append(f"- `{c['name']}`: {first[:300]}")
        lines.append("")
    return "\n".join(lines)


def render_plot(data: dict[str, Any], path: Path) -> bool:
    """A bar chart per family; False when matplotlib is missing."""
    try:
        import matplotlib

        matplotlib.use("Agg")  # no display on the machines this runs on
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed (pip install matplotlib): no plot written",
              file=sys.stderr)
        return False
    runs = [(f, data["families"][f]) for f in families_in(data) if f != "host"]
    runs = [(f, r) for f, r in runs if r["cases"]]
    if not runs:
        return False
    widest = max(len(r["cases"]) for _, r in runs)
    fig, axes = plt.subplots(len(runs), 1, figsize=(max(8.0, 0.4 * widest), 4.5 * len(runs)),
                             squeeze=False)
    bar = 0.27
    for ax, (family, run) in zip(axes[:, 0], runs):
        cases = run["cases"]
        xs = range(len(cases))
        for i, (key, label) in enumerate((("fusion_gbps", "fusion"), ("eager_gbps", "eager"),
                                          ("compile_gbps", "torch.compile"))):
            heights = [c.get(key) or 0.0 for c in cases]
            ax.bar([x + (i - 1) * bar for x in xs], heights, bar, label=label)
        ceiling = run.get("copy_ceiling_gbps")
        if ceiling:
            ax.axhline(ceiling, color="black", linewidth=1, label="copy ceiling")
            ax.axhline(ceiling * AT_CEILING / 100, color="black", linestyle="--", linewidth=1,
                       label=f"{AT_CEILING:.0f}% of ceiling")
        ax.set_xticks(list(xs))
        labels = [c["name"] + ("" if c.get("correct") else " (failed)") for c in cases]
        ax.set_xticklabels(labels, rotation=75, ha="right", fontsize=7)
        ax.set_ylabel("GB/s")
        ax.set_title(f"{family} on {data.get('device')}, {run.get('date')}")
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.report", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("results", type=Path, help="benchmarks/results/<device-slug>.json")
    args = parser.parse_args(argv)
    data = load_results(args.results)
    md = args.results.with_suffix(".md")
    md.write_text(render_markdown(data))
    print(f"wrote {md}")
    png = args.results.with_suffix(".png")
    if render_plot(data, png):
        print(f"wrote {png}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
