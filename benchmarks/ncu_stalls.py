"""Where a kernel's warps wait, from an Nsight Compute report: the stall reasons per issued
instruction and the SASS instructions holding most stall samples, each with its main reason.

    ncu --section WarpStateStats --section SourceCounters \\
        --metrics "regex:smsp__average_warps_issue_stalled_.*_per_issue_active\\.ratio" \\
        -k regex:fc_ --launch-skip 2 --launch-count 1 -o /tmp/case python3 -m benchmarks.profile_case CASE
    python -m benchmarks.ncu_stalls /tmp/case.ncu-rep

The report should hold one kernel launch (--launch-count 1). Reading it takes the `ncu`
command; the parsing below does not, so it runs in the CPU tests.
"""

from __future__ import annotations

import argparse
import csv
import io
import subprocess
import sys

STALL_METRIC = "smsp__average_warps_issue_stalled_"
STALL_SUFFIX = "_per_issue_active.ratio"
SAMPLES = "Warp Stall Sampling (All Samples)"


def _number(text: str) -> float:
    try:
        return float(text.replace(",", ""))
    except ValueError:
        return 0.0


def stall_reasons(raw_csv: str) -> list[tuple[str, float]]:
    """(reason, warps stalled per issued instruction) from `ncu --page raw --csv`, largest
    first; the first data row is the (only) kernel's."""
    rows = list(csv.reader(io.StringIO(raw_csv)))
    if len(rows) < 3:  # header, units, one kernel
        return []
    found = [(name[len(STALL_METRIC):-len(STALL_SUFFIX)], _number(value))
             for name, value in zip(rows[0], rows[2])
             if name.startswith(STALL_METRIC) and name.endswith(STALL_SUFFIX)]  # fmt: skip
    return sorted(found, key=lambda x: -x[1])


def top_instructions(source_csv: str, count: int = 20) -> list[tuple[float, str, str]]:
    """(share of all stall samples, SASS text, its largest stall reason) for the `count`
    instructions with most samples, from `ncu --page source --print-source sass --csv`."""
    rows = list(csv.reader(io.StringIO(source_csv)))
    at = next((i for i, r in enumerate(rows) if "Source" in r and SAMPLES in r), None)
    if at is None:
        return []
    header, body = rows[at], [r for r in rows[at + 1:] if len(r) == len(rows[at])]
    samples, source = header.index(SAMPLES), header.index("Source")
    reasons = [(i, h[len("stall_"):]) for i, h in enumerate(header)
               if h.startswith("stall_") and "(" not in h]  # fmt: skip
    total = sum(_number(r[samples]) for r in body) or 1.0
    out = []
    for r in sorted(body, key=lambda r: -_number(r[samples]))[:count]:
        main = max(reasons, key=lambda ir: _number(r[ir[0]]), default=(0, ""))[1]
        out.append((_number(r[samples]) / total, " ".join(r[source].split()), main))
    return out


def _ncu_page(report: str, *page: str) -> str:
    done = subprocess.run(["ncu", "-i", report, "--csv", *page], capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"ncu -i {report} failed: {done.stderr.strip()[:400]}")
    return done.stdout


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.ncu_stalls", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("reports", nargs="+", metavar="REPORT.ncu-rep")
    parser.add_argument("--top", type=int, default=20, help="instructions to list (default 20)")
    args = parser.parse_args(argv)
    for report in args.reports:
        print(f"== {report}")
        for reason, value in stall_reasons(_ncu_page(report, "--page", "raw"))[:10]:
            print(f"  {reason:24s} {value:6.2f} warps stalled per issued instruction")
        source = _ncu_page(report, "--page", "source", "--print-source", "sass")
        for share, sass, reason in top_instructions(source, args.top):
            print(f"  {share * 100:5.1f}%  {reason:14s} {sass[:90]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
