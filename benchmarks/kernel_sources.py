"""The sha256 of every kernel the benchmark cases generate, per target, without a GPU.

A refactor that must not change generated code (moving modules, splitting a renderer)
shows it by printing the same table before and after:

    python -m benchmarks.kernel_sources --json before.json
    ... change ...
    python -m benchmarks.kernel_sources --compare before.json

Cases are precompiled on meta tensors for each named target profile (NVRTC runs, so a
persistent FUSION_CACHE_DIR makes the second run fast: the same sources hit the store).
"""
from __future__ import annotations

import argparse
import hashlib
import json
import sys


def kernel_hashes(targets: list[str], pattern: str | None = None) -> dict[str, list[str]]:
    from fusion_cache import FusionDefinition

    from .cases import CASES

    table: dict[str, list[str]] = {}
    for case in CASES:
        if pattern and pattern not in case.name:
            continue
        for target in targets:
            with FusionDefinition() as fd:
                case.define(fd, case.dtype, case.shape)
            refs = fd.precompile(case.make_inputs(case.shape, case.dtype, "meta"), target=target)
            table[f"{case.name}@{target}"] = [
                hashlib.sha256(ref.source.encode()).hexdigest()[:16] for ref in refs
            ]
    return table


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.kernel_sources",
                                     description=__doc__.split("\n\n")[0])  # fmt: skip
    parser.add_argument("--targets", default="h100,a100", help="comma-separated profiles")
    parser.add_argument("-k", dest="pattern", default=None, help="only cases naming this")
    parser.add_argument("--json", help="write the table here")
    parser.add_argument("--compare", help="a table written earlier: list what differs")
    args = parser.parse_args(argv)
    table = kernel_hashes(args.targets.split(","), args.pattern)
    kernels = sum(len(v) for v in table.values())
    digest = hashlib.sha256(json.dumps(table, sort_keys=True).encode()).hexdigest()[:16]
    print(f"{len(table)} case-targets, {kernels} kernels, digest {digest}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(table, f, indent=1, sort_keys=True)
    if args.compare:
        with open(args.compare) as f:
            before = json.load(f)
        differ = sorted(k for k in before.keys() | table.keys() if before.get(k) != table.get(k))
        for k in differ:
            print(f"differs: {k}: {before.get(k)} -> {table.get(k)}")
        print("same kernel sources" if not differ else f"{len(differ)} case-targets differ")
        return 1 if differ else 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
