"""`fusion-cache` subcommands that look after the store. fusion_cache/cli.py wires them in:

    register_commands(subparsers)      # adds ls, stats, verify, prune, export, import,
    args = parser.parse_args()         # migrate, show; each sets args.func
    sys.exit(args.func(args))          # a handler returns its exit code

All of them act on default_store(). `show` also prints describe_fusion(entry) when the
frontend has set that hook (the fusion's IR, say).
"""
from __future__ import annotations

import argparse
import json
import re
import sys
import time
from collections.abc import Callable

from .bundle import BundleError
from .entries import FusionEntry
from .factory import default_store

# Set by the frontend to add its own description of a fusion to `show`.
describe_fusion: Callable[[FusionEntry], str] | None = None

_UNITS = {"": 1, "k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12}


def parse_size(text: str) -> int:
    """'2GB' -> 2e9, '512MiB' -> 512 * 2**20, '100' -> 100 bytes (ccache's convention:
    K/M/G/T are powers of 1000, Ki/Mi/Gi/Ti powers of 1024)."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([kmgt]?)(i?)b?\s*", text.lower())
    if not m:
        raise argparse.ArgumentTypeError(f"not a size: {text!r} (try 500MB or 2GiB)")
    number, unit, binary = m.groups()
    scale = 1024 ** ("kmgt".index(unit) + 1) if binary and unit else _UNITS[unit]
    return int(float(number) * scale)


def _human(n: int | float) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if abs(n) < 1000:
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} TB"


def _when(t: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M", time.localtime(t)) if t else "-"


def register_commands(subparsers) -> None:
    """Add the store subcommands to an argparse subparsers object."""
    add = subparsers.add_parser
    add("ls", help="list stored fusions").set_defaults(func=cmd_ls)

    p = add("stats", help="counts and sizes per cache level")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(func=cmd_stats)

    p = add("verify", help="check every stored cubin against its sha256")
    p.add_argument("--repair", action="store_true", help="remove (or restore) bad entries")
    p.set_defaults(func=cmd_verify)

    p = add("prune", help="drop least recently used kernels")
    p.add_argument("--max-age-days", type=float, help="drop kernels unused for N days")
    p.add_argument("--max-size", type=parse_size, help="then shrink to this size (e.g. 2GB)")
    p.set_defaults(func=cmd_prune)

    p = add("export", help="write the store to a portable bundle (zip)")
    p.add_argument("file")
    p.set_defaults(func=cmd_export)

    p = add("import", help="merge a bundle into the store")
    p.add_argument("file")
    p.set_defaults(func=cmd_import)

    add("migrate", help="bring the store's schema up to date").set_defaults(func=cmd_migrate)

    p = add("show", help="a fusion's definition, plans and kernels")
    p.add_argument("fid", type=int)
    p.set_defaults(func=cmd_show)


def _out(*lines: str) -> None:
    for line in lines:
        print(line, file=sys.stdout)


def cmd_ls(args) -> int:
    store = default_store()
    entries = store.fusions()
    if not entries:
        _out(f"no fusions in {store.url}")
        return 0
    _out(f"{'id':>5}  {'plans':>5}  {'kernels':>7}  {'created':16}  definition key")
    for f in entries:
        plans, kernels = len(store.plans_for(f.id)), len(store.kernels(f.id))
        _out(f"{f.id:>5}  {plans:>5}  {kernels:>7}  {_when(f.created_at):16}  {f.definition_key}")
    return 0


def cmd_stats(args) -> int:
    stats = default_store().stats()
    if getattr(args, "json", False):
        _out(json.dumps(stats, indent=2, sort_keys=True, default=str))
        return 0
    for key, value in stats.items():
        if key.endswith("_bytes") and isinstance(value, int):
            value = f"{value} ({_human(value)})"
        _out(f"{key:>16}: {value}")
    return 0


def cmd_verify(args) -> int:
    repair = getattr(args, "repair", False)
    report = default_store().verify(repair=repair)
    if report.unusable is not None:
        _out(f"cannot open the store: {report.unusable}")
        return 1
    for bad in report.bad:
        _out(f"BAD  {bad.where:8} {bad.key or '-'}  {bad.reason}")
    _out(
        f"checked {report.checked} kernels: {len(report.bad)} problems"
        + (f", {report.repaired} repaired" if repair else "")
    )
    if report.bad and not repair:
        _out("run `fusion-cache verify --repair` to remove them (they will be recompiled)")
    return 0 if report.ok or (repair and report.repaired >= len(report.bad)) else 1


def cmd_prune(args) -> int:
    age, size = getattr(args, "max_age_days", None), getattr(args, "max_size", None)
    if age is None and size is None:
        _out("prune: give --max-age-days N and/or --max-size SIZE")
        return 2
    report = default_store().prune(max_age_days=age, max_bytes=size)
    _out(
        f"removed {report.removed} kernels ({_human(report.freed_bytes)}); "
        f"kept {report.kept} ({_human(report.kept_bytes)})"
    )
    return 0


def cmd_export(args) -> int:
    try:
        n = default_store().export_bundle(args.file)
    except OSError as err:
        _out(f"export failed: {err}")
        return 1
    _out(f"exported {n} entries to {args.file}")
    return 0


def cmd_import(args) -> int:
    try:
        n = default_store().import_bundle(args.file)
    except BundleError as err:
        _out(f"import failed: {err}")
        return 1
    _out(f"imported {n} entries from {args.file}")
    return 0


def cmd_migrate(args) -> int:
    store = default_store()  # opening applies the migrations
    if not store.persistent:
        _out(f"no persistent store: {getattr(store, 'reason', None) or store.url}")
        return 1
    stats = store.stats()
    _out(f"{store.url}: schema at {stats.get('schema_revision')} "
         f"(head {stats.get('head_revision')})")
    return 0


def cmd_show(args) -> int:
    store = default_store()
    entry = store.fusion_by_id(args.fid)
    if entry is None:
        _out(f"no fusion {args.fid} in {store.url}")
        return 1
    _out(f"fusion {entry.id}  key {entry.definition_key}  created {_when(entry.created_at)}", "")
    _out(entry.python_definition.rstrip(), "")
    if describe_fusion is not None:
        try:
            _out(describe_fusion(entry).rstrip(), "")
        except Exception as err:  # a broken hook must not hide the rest
            _out(f"(describe_fusion failed: {type(err).__name__}: {err})", "")
    plans = store.plans_for(entry.id)
    _out(f"plans ({len(plans)}):")
    for p in plans:
        _out(f"  signature {p.signature_key}  target {p.target}", f"    {p.plan_json}")
    kernels = store.kernels(entry.id)
    _out(f"kernels ({len(kernels)}):")
    for k in kernels:
        _out(
            f"  {k.kernel_name}  scheduler {k.scheduler or '-'}  sm_{k.arch}  "
            f"nvrtc {k.nvrtc_version}  {_human(k.size)}  compile {k.compile_ms:.1f} ms  "
            f"hits {k.hits}",
            f"    key {k.key}",
            f"    params {k.params_json}",
        )
    return 0
