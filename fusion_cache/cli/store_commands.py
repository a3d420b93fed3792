"""`fusion-cache` subcommands that look after the store: ls, show, stats, verify, prune,
export, import, migrate. Each opens the process-wide store through common.open_store (an
unusable one is refused, Note [Exit codes]) and returns its exit code.

`show --ir` also prints describe_fusion(entry): the Fusion IR and which scheduler takes
the fusion (describe.py; it imports the frontend, so only that flag pays for torch).
"""
from __future__ import annotations

import argparse
import json
import os
import re
import time
from collections import defaultdict
from pathlib import Path

from .common import (
    OK,
    PROBLEMS,
    USAGE,
    CliError,
    add_persist_options,
    non_negative,
    open_store,
    persisting,
    say,
)
from .output import human_bytes, print_table, when
from .summary import summarize

_UNITS = {"": 1, "k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12}


def parse_size(text: str) -> int:
    """'2GB' -> 2e9, '512MiB' -> 512 * 2**20, '100' -> 100 bytes (ccache's convention:
    K/M/G/T are powers of 1000, Ki/Mi/Gi/Ti powers of 1024). Negative sizes do not parse."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([kmgt]?)(i?)b?\s*", text.lower())
    if not m:
        raise argparse.ArgumentTypeError(f"not a size: {text!r} (try 500MB or 2GiB)")
    number, unit, binary = m.groups()
    scale = 1024 ** ("kmgt".index(unit) + 1) if binary and unit else _UNITS[unit]
    return int(float(number) * scale)


def register(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    """Add the store subcommands to an argparse subparsers object."""

    def add(name: str, help: str) -> argparse.ArgumentParser:
        return sub.add_parser(name, help=help, description=help, parents=[common])

    add("ls", "list stored fusions: inputs, ops, outputs, plans, kernels, hits, last use"
        ).set_defaults(func=cmd_ls)  # fmt: skip

    p = add("show", "a fusion's definition, plans and kernels")
    p.add_argument("fid", type=non_negative(int, "a fusion id"), help="fusion id (see ls)")
    p.add_argument("--ir", action="store_true",
                   help="also the Fusion IR and which scheduler takes it (imports torch)")  # fmt: skip
    p.set_defaults(func=cmd_show)

    p = add("stats", "counts and sizes per cache level")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(func=cmd_stats)

    p = add("verify", "check every stored cubin against its sha256")
    p.add_argument("--repair", action="store_true", help="remove (or restore) bad entries")
    add_persist_options(p)
    p.set_defaults(func=cmd_verify)

    p = add("prune", "drop least recently used kernels")
    p.add_argument("--max-age-days", type=non_negative(float, "a number of days"),
                   metavar="DAYS", help="drop kernels unused for DAYS days")  # fmt: skip
    p.add_argument("--max-size", type=parse_size, metavar="SIZE",
                   help="then drop the least recently used until the rest fit (e.g. 2GB)")  # fmt: skip
    p.add_argument("--dry-run", action="store_true", help="list what would go, remove nothing")
    add_persist_options(p)
    p.set_defaults(func=cmd_prune)

    p = add("export", "write the store to a portable bundle (zip)")
    p.add_argument("file", help="the bundle to write, in an existing directory")
    add_persist_options(p)
    p.set_defaults(func=cmd_export)

    p = add("import", "merge a bundle into the store")
    p.add_argument("file", help="a bundle written by `fusion-cache export`")
    add_persist_options(p)
    p.set_defaults(func=cmd_import)

    p = add("migrate", "bring the store's schema up to date")
    add_persist_options(p)
    p.set_defaults(func=cmd_migrate)


def cmd_ls(args: argparse.Namespace) -> int:
    store = open_store(args, persist=False)
    fusions = store.fusions()
    if not fusions:
        say(f"no fusions in {store.url}")
        return OK
    stored = {k.key: k for k in store.kernels()}
    kernels = defaultdict(list)
    for fid, key in store.links():
        if key in stored:  # a link outlives a pruned kernel
            kernels[fid].append(stored[key])
    rows = []
    for f in fusions:
        s = summarize(f.records_json)
        ks = kernels[f.id]
        rows.append([str(f.id), s.inputs, f"{s.ops} ({s.op_names})" if s.ops else "0",
                     str(s.outputs), str(len(store.plans_for(f.id))), str(len(ks)),
                     str(sum(k.hits for k in ks)), when(max((k.last_used for k in ks), default=0)),
                     f.definition_key[:12]])  # fmt: skip
    print_table(["id", "inputs", "ops", "outputs", "plans", "kernels", "hits", "last use", "key"],
                rows, right=["id", "outputs", "plans", "kernels", "hits"])  # fmt: skip
    return OK


def _known_ids(store) -> str:
    ids = [f.id for f in store.fusions()]
    if not ids:
        return "the store holds no fusions"
    return f"ids in the store: {ids[:20]}{' ...' if len(ids) > 20 else ''}"


_TENSOR_KEY = re.compile(r"\(torch\.(\w+), torch\.Size\(\[([^\]]*)\]\), \(([^)]*)\)")


def _signature(text: str) -> str:
    """A plan's input signature (reprs of gpu_runtime.input_key) as dtype[sizes]."""
    try:
        items = json.loads(text)
    except ValueError:
        return text
    out = []
    for item in items if isinstance(items, list) else [text]:
        m = _TENSOR_KEY.match(str(item))
        out.append(f"{m.group(1)}[{m.group(2)}] strides ({m.group(3)})" if m else str(item))
    return ", ".join(out)


def cmd_show(args: argparse.Namespace) -> int:
    store = open_store(args, persist=False)
    entry = store.fusion_by_id(args.fid)
    if entry is None:
        raise CliError(f"no fusion {args.fid} in {store.url}; {_known_ids(store)}", PROBLEMS)
    say(f"fusion {entry.id}  key {entry.definition_key}  created {when(entry.created_at)}", "")
    # the store keeps the text printed before the store gave the id: name the fusion here
    name = "def nvfuser_fusion_id"
    text = entry.python_definition.replace(f"{name}(", f"{name}{entry.id}(", 1)
    say(text.rstrip(), "")
    if args.ir:
        from .describe import describe_fusion

        say(describe_fusion(entry).rstrip(), "")
    plans = store.plans_for(entry.id)
    say(f"plans ({len(plans)}):")
    for p in plans:
        try:
            plan = json.loads(p.plan_json)
        except ValueError:
            plan = {}
        say(f"  {p.target}  scheduler: {plan.get('scheduler', '?')}  {plan.get('plan', p.plan_json)}",
            f"    inputs {_signature(p.signature_key)}")  # fmt: skip
        if plan.get("segments"):
            say(f"    segments: fusions {', '.join(map(str, plan['segments']))}")
        if plan.get("refused"):
            say(f"    one kernel refused: {plan['refused']}")
    kernels = store.kernels(entry.id)
    say(f"kernels ({len(kernels)}):")
    for k in kernels:
        say(f"  {k.kernel_name}  sm_{k.arch}  nvrtc {k.nvrtc_version}  {human_bytes(k.size)}  "
            f"compile {k.compile_ms:.1f} ms  hits {k.hits}  last use {when(k.last_used)}",
            f"    key {k.key}", f"    params {k.params_json}")  # fmt: skip
    return OK


def cmd_stats(args: argparse.Namespace) -> int:
    stats = open_store(args, persist=False).stats()
    if args.json:
        say(json.dumps(stats, indent=2, sort_keys=True, default=str))
        return OK
    for key, value in stats.items():
        if key.endswith("_bytes") and isinstance(value, int):
            value = f"{value} ({human_bytes(value)})"
        say(f"{key:>16}: {value}")
    return OK


@persisting
def cmd_verify(args: argparse.Namespace) -> int:
    report = open_store(args, persist=True).verify(repair=args.repair)
    for bad in report.bad:
        say(f"BAD  {bad.where:8} {bad.key or '-'}  {bad.reason}")
    say(f"checked {report.checked} kernels: {len(report.bad)} problems"
        + (f", {report.repaired} repaired" if args.repair else ""))  # fmt: skip
    if report.bad and not args.repair:
        say("run `fusion-cache verify --repair` to remove them (they will be recompiled)")
    return OK if report.ok or (args.repair and report.repaired >= len(report.bad)) else PROBLEMS


@persisting
def cmd_prune(args: argparse.Namespace) -> int:
    age, size = args.max_age_days, args.max_size
    if age is None and size is None:
        raise CliError("give --max-age-days DAYS and/or --max-size SIZE", USAGE)
    store = open_store(args, persist=not args.dry_run)
    if args.dry_run:
        from fusion_cache.store.entries import choose_prunable  # what prune() itself chooses

        entries = sorted(store.kernels(), key=lambda e: (e.last_used, e.key))
        doomed = choose_prunable(entries, age, size, time.time())
        for e in doomed:
            say(f"would remove {e.key[:16]}  {e.kernel_name}  {human_bytes(e.size)}  "
                f"last use {when(e.last_used)}")  # fmt: skip
        kept = len(entries) - len(doomed)
        kept_bytes = sum(e.size for e in entries) - sum(e.size for e in doomed)
        say(f"would remove {len(doomed)} kernels ({human_bytes(sum(e.size for e in doomed))}); "
            f"would keep {kept} ({human_bytes(kept_bytes)})")  # fmt: skip
        return OK
    report = store.prune(max_age_days=age, max_bytes=size)
    say(f"removed {report.removed} kernels ({human_bytes(report.freed_bytes)}); "
        f"kept {report.kept} ({human_bytes(report.kept_bytes)})")  # fmt: skip
    return OK


@persisting
def cmd_export(args: argparse.Namespace) -> int:
    path = Path(args.file)
    folder = path.parent
    if not folder.is_dir():
        raise CliError(f"{args.file}: no directory {str(folder)!r} (export creates none)", USAGE)
    if path.is_dir():
        raise CliError(f"{args.file} is a directory: name the bundle file to write", USAGE)
    if not os.access(folder, os.W_OK):
        raise CliError(f"{args.file}: directory {str(folder)!r} is not writable", USAGE)
    store = open_store(args, persist=True)
    try:
        n = store.export_bundle(path)
    except OSError as err:
        raise CliError(f"export to {args.file} failed: {err}", PROBLEMS) from err
    say(f"exported {n} entries to {args.file}")
    return OK


_KINDS = ("fusions", "plans", "kernels")


@persisting
def cmd_import(args: argparse.Namespace) -> int:
    from fusion_cache.store.bundle import BundleError

    if not Path(args.file).is_file():
        raise CliError(f"no such bundle: {args.file}", USAGE)
    store = open_store(args, persist=True)
    before = store.stats()
    try:  # all or nothing: a bundle with one bad entry is refused whole (Note [Bundle trust])
        taken = store.import_bundle(args.file)
    except BundleError as err:
        raise CliError(f"import failed: {err}", PROBLEMS) from err
    after = store.stats()
    new = {k: int(after.get(k) or 0) - int(before.get(k) or 0) for k in _KINDS}
    fresh = sum(new.values())
    say(f"imported {fresh} new entries from {args.file} "
        f"({', '.join(f'{new[k]} {k}' for k in _KINDS)}); "
        f"{max(taken - fresh, 0)} were already in the store")  # fmt: skip
    return OK


@persisting
def cmd_migrate(args: argparse.Namespace) -> int:
    store = open_store(args, persist=True)  # opening applies the migrations
    if not store.persistent:
        say(f"in memory ({store.url}): no schema to migrate")
        return OK
    stats = store.stats()
    say(f"{store.url}: schema at {stats.get('schema_revision')} "
        f"(head {stats.get('head_revision')})")  # fmt: skip
    return OK
