"""Bundles: a store's contents in one portable zip (JSON manifest + cubin files; no pickles).

Use: fill a store on a build machine, `fusion-cache export warm.zip`, ship it, and
`fusion-cache import warm.zip` on the cluster. Fusion ids are per store, so import maps them
by definition key: a key the target knows keeps the target's id, a new key gets a new id,
and plans and links follow the mapping.

Note [Bundle trust]
    A bundle comes from elsewhere and is trusted for nothing it does not prove. Before the
    store is touched, read_bundle reads the manifest (bounded) and checks all of it: the
    type and length of every field, counts, unique ids, keys and members, every fusion key
    recomputed from its records (which may name only known record kinds and fd.ops ops),
    every kernel key recomputed from its source, options and arch (keys.kernel_key). The
    store then takes everything in one transaction (Store.import_entries), reading each
    member once and checking its size and sha256 as it goes: one bad entry, or a store
    failure halfway, rolls the whole import back.
    No check short of compiling proves that a cubin is what NVRTC makes of its source: take
    bundles from producers you would take a binary from. An entry the store already has
    under the same key is kept (the NVRTC version is not in the key, so bytes may differ).
"""
from __future__ import annotations

import hashlib
import json
import math
import os
import re
import tempfile
import time
import zipfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .entries import MAX_CUBIN_BYTES, KernelMeta
from .keys import kernel_key
from .upcalls import records_codec

if TYPE_CHECKING:
    from .store import Store

FORMAT = "fusion-cache-bundle"
VERSION = 1
MANIFEST = "manifest.json"
# Bounds on what an import reads (Note [Bundle trust]); a real store's bundle is far below.
MAX_MANIFEST_BYTES = 64 << 20
MAX_ENTRIES = 200_000  # fusions, plans, kernels or links
MAX_TEXT = 4 << 20  # records, Python text, kernel source, plan JSON (characters)
MAX_NAME = 4096  # names, signature keys, targets, versions, one option
MAX_OPTIONS = 256
MAX_TOTAL_CUBIN_BYTES = 16 << 30

_HEX64 = re.compile(r"[0-9a-f]{64}")
# The record kinds replay knows (frontend replay._call); 'op' records name an fd.ops method.
_RECORD_KINDS = {"tensor", "scalar", "vector", "op", "output", "end"}


class BundleError(ValueError):
    """The file is not a bundle this version can read, or it fails a check; nothing was
    imported."""


class BundleImportError(BundleError):
    """The store failed while taking a bundle; the import was rolled back."""


@dataclass(frozen=True)
class BundleFusion:
    id: int  # the id in the source store; import maps it by definition key
    definition_key: str
    records_json: str = field(repr=False)
    python_definition: str = field(repr=False)


@dataclass(frozen=True)
class BundlePlan:
    fusion_id: int  # a BundleFusion.id
    signature_key: str
    target: str
    plan_json: str = field(repr=False)


@dataclass(frozen=True)
class BundleKernel:
    key: str
    member: str  # the zip member holding the cubin
    sha256: str
    size: int
    meta: KernelMeta


@dataclass(frozen=True)
class BundleContents:
    """A checked bundle: everything but the cubins, which `cubin` reads and checks."""

    fusions: tuple[BundleFusion, ...]
    plans: tuple[BundlePlan, ...]
    kernels: tuple[BundleKernel, ...]
    links: tuple[tuple[int, str], ...]  # (BundleFusion.id, kernel key)
    cubin: Callable[[BundleKernel], bytes] = field(repr=False)

    @property
    def entries(self) -> int:
        """What import_bundle reports: fusions + plans + kernels."""
        return len(self.fusions) + len(self.plans) + len(self.kernels)


def export_bundle(store: Store, path: str | os.PathLike, fusion_ids: set[int] | None = None) -> int:
    """Write every fusion (or those of `fusion_ids`), plan, kernel and link; returns the
    number of fusions + plans + kernels written. The file appears whole or not at all (temp
    file + os.replace)."""
    path = Path(path)
    fusions = [f for f in store.fusions() if fusion_ids is None or f.id in fusion_ids]
    plans = [p for f in fusions for p in store.plans_for(f.id)]
    manifest: dict = {
        "format": FORMAT,
        "version": VERSION,
        "created_at": time.time(),
        "source_url": store.url,
        "fusions": [
            {
                "id": f.id,
                "definition_key": f.definition_key,
                "records_json": f.records_json,
                "python_definition": f.python_definition,
            }
            for f in fusions
        ],
        "plans": [
            {
                "fusion_id": p.fusion_id,
                "signature_key": p.signature_key,
                "target": p.target,
                "plan_json": p.plan_json,
            }
            for p in plans
        ],
        "kernels": [],
        "links": [[fid, key] for fid, key in store.links()
                  if fusion_ids is None or fid in fusion_ids],  # fmt: skip
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        with zipfile.ZipFile(tmp, "w", compression=zipfile.ZIP_DEFLATED) as zf:
            linked = {key for _, key in manifest["links"]}
            for entry in store.kernels():
                if fusion_ids is not None and entry.key not in linked:
                    continue
                data = store.kernel_bytes(entry.key)
                if data is None:  # vanished or damaged since listed
                    continue
                name = f"kernels/{len(manifest['kernels']):06d}.cubin"
                zf.writestr(name, data)
                manifest["kernels"].append(
                    {
                        "key": entry.key,
                        "file": name,
                        "sha256": hashlib.sha256(data).hexdigest(),
                        "size": len(data),
                        "meta": entry.meta.to_json(),
                    }
                )
            zf.writestr(MANIFEST, json.dumps(manifest, indent=1, sort_keys=True))
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return len(manifest["fusions"]) + len(manifest["plans"]) + len(manifest["kernels"])


def import_bundle(store: Store, path: str | os.PathLike) -> int:
    """Merge a bundle into `store`, all or nothing; returns the number of fusions + plans +
    kernels taken (already-present entries count: importing twice changes nothing and
    returns the same). Raises BundleError, naming the entry and field, for a file that is
    not a readable bundle or fails a check (Note [Bundle trust])."""
    try:
        zf = zipfile.ZipFile(path)
    except (OSError, zipfile.BadZipFile, ValueError) as err:
        raise BundleError(f"{path}: not a bundle ({err})") from None
    with zf:
        contents = read_bundle(zf, str(path))
        return store.import_entries(contents)


def read_bundle(zf: zipfile.ZipFile, where: str = "bundle") -> BundleContents:
    """Read and check a bundle's manifest and member list (not the cubins themselves)."""
    names = [info.filename for info in zf.infolist()]
    if len(names) != len(set(names)):
        twice = sorted({n for n in names if names.count(n) > 1})
        raise BundleError(f"{where}: members stored twice: {twice[:5]}")
    manifest = _read_manifest(zf, where)
    fusions = _items(manifest, "fusions", where, _fusion)
    plans = _items(manifest, "plans", where, _plan)
    kernels = _items(manifest, "kernels", where, _kernel)
    links = _items(manifest, "links", where, _link)

    ids = _unique(fusions, lambda f: f.id, "fusions", "id", where)
    _unique(fusions, lambda f: f.definition_key, "fusions", "definition_key", where)
    _unique(plans, lambda p: (p.fusion_id, p.signature_key, p.target), "plans",
            "(fusion_id, signature_key, target)", where)  # fmt: skip
    _unique(kernels, lambda k: k.key, "kernels", "key", where)
    _unique(kernels, lambda k: k.member, "kernels", "file", where)  # each member read once
    for i, p in enumerate(plans):
        if p.fusion_id not in ids:
            raise BundleError(f"{where}: plans[{i}].fusion_id: no fusion {p.fusion_id} here")
    for i, (fid, _) in enumerate(links):
        if fid not in ids:
            raise BundleError(f"{where}: links[{i}]: no fusion {fid} here")
    members = {info.filename: info for info in zf.infolist()}
    for i, k in enumerate(kernels):
        info = members.get(k.member)
        if info is None:
            raise BundleError(f"{where}: kernels[{i}].file: no member {k.member!r}")
        if info.file_size != k.size:
            raise BundleError(f"{where}: kernels[{i}]: member {k.member!r} holds "
                              f"{info.file_size} bytes, the manifest says {k.size}")  # fmt: skip
    total = sum(k.size for k in kernels)
    if total > MAX_TOTAL_CUBIN_BYTES:
        raise BundleError(f"{where}: {total} bytes of cubins, over the {MAX_TOTAL_CUBIN_BYTES}"
                          " an import takes")  # fmt: skip
    for i, f in enumerate(fusions):
        _check_records(f, f"{where}: fusions[{i}]")
    for i, k in enumerate(kernels):
        if kernel_key(k.meta.source, k.meta.options, k.meta.arch) != k.key:
            raise BundleError(f"{where}: kernels[{i}].key is not the key of its source, options"
                              " and arch (forged or damaged)")  # fmt: skip

    def cubin(k: BundleKernel) -> bytes:
        try:
            with zf.open(members[k.member]) as member:
                data = member.read(k.size + 1)  # to the end: zipfile checks the CRC there
        except (zipfile.BadZipFile, OSError, EOFError) as err:  # CRC error, truncated archive
            raise BundleError(f"{where}: kernel {k.key}: member {k.member!r} unreadable "
                              f"({err})") from None  # fmt: skip
        if len(data) != k.size or hashlib.sha256(data).hexdigest() != k.sha256:
            raise BundleError(f"{where}: kernel {k.key}: member {k.member!r} fails its size or "
                              "sha256")  # fmt: skip
        return data

    return BundleContents(tuple(fusions), tuple(plans), tuple(kernels), tuple(links), cubin)


def _read_manifest(zf: zipfile.ZipFile, where: str) -> dict:
    try:
        info = zf.getinfo(MANIFEST)
    except KeyError:
        raise BundleError(f"{where}: no {MANIFEST}") from None
    if info.file_size > MAX_MANIFEST_BYTES:
        raise BundleError(f"{where}: manifest of {info.file_size} bytes, over the "
                          f"{MAX_MANIFEST_BYTES} an import reads")  # fmt: skip
    try:
        with zf.open(info) as member:
            text = member.read(MAX_MANIFEST_BYTES + 1)
        manifest = json.loads(text)
    except (ValueError, RecursionError, zipfile.BadZipFile, OSError, EOFError) as err:
        raise BundleError(f"{where}: unreadable manifest ({type(err).__name__}: {err})") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise BundleError(f"{where}: not a {FORMAT}")
    version = _field(manifest, "version", int, "manifest")
    if version > VERSION:
        raise BundleError(f"{where}: bundle version {version} is newer than this fusion-cache "
                          f"reads ({VERSION})")  # fmt: skip
    if version < 1:
        raise BundleError(f"{where}: manifest.version: {version} is not a bundle version")
    return manifest


# -- checking the manifest's fields ---------------------------------------------------------

_KINDS = {int: "an integer", str: "a string", list: "a list", dict: "an object",
          float: "a number"}  # fmt: skip


def _field(obj: Any, name: str, kind: type, where: str, *, limit: int | None = None,
           default: Any = None) -> Any:  # fmt: skip
    """obj[name], checked to be of `kind` (no bool for int; int or float for float) and at
    most `limit` long; `default` when absent and given, else an error."""
    if not isinstance(obj, dict):
        raise BundleError(f"{where}: expected an object, got {type(obj).__name__}")
    if name not in obj:
        if default is not None:
            return default
        raise BundleError(f"{where}.{name}: missing")
    value = obj[name]
    if kind is float:
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
        ok = ok and math.isfinite(value)
    else:
        ok = isinstance(value, kind) and not (kind is int and isinstance(value, bool))
    if not ok:
        shown = repr(value) if len(repr(value)) <= 40 else repr(value)[:37] + "..."
        raise BundleError(f"{where}.{name}: expected {_KINDS[kind]}, got "
                          f"{type(value).__name__} {shown}")  # fmt: skip
    if limit is not None and len(value) > limit:
        raise BundleError(f"{where}.{name}: {len(value)} long, over the limit of {limit}")
    return value


def _hex64(obj: Any, name: str, where: str) -> str:
    value = _field(obj, name, str, where, limit=64)
    if not _HEX64.fullmatch(value):
        raise BundleError(f"{where}.{name}: expected 64 hex digits (a sha256), got {value!r}")
    return value


def _count(obj: Any, name: str, where: str, upper: int) -> int:
    value = _field(obj, name, int, where)
    if not 0 <= value <= upper:
        raise BundleError(f"{where}.{name}: {value} is outside 0..{upper}")
    return value


def _items(manifest: dict, name: str, where: str, parse: Callable[[Any, str], Any]) -> list:
    items = _field(manifest, name, list, "manifest", limit=MAX_ENTRIES)
    try:
        return [parse(item, f"{name}[{i}]") for i, item in enumerate(items)]
    except BundleError as err:
        raise BundleError(f"{where}: {err}") from None


def _fusion(d: Any, where: str) -> BundleFusion:
    return BundleFusion(
        id=_count(d, "id", where, 1 << 40),
        definition_key=_hex64(d, "definition_key", where),
        records_json=_field(d, "records_json", str, where, limit=MAX_TEXT),
        python_definition=_field(d, "python_definition", str, where, limit=MAX_TEXT),
    )


def _plan(d: Any, where: str) -> BundlePlan:
    return BundlePlan(
        fusion_id=_count(d, "fusion_id", where, 1 << 40),
        signature_key=_field(d, "signature_key", str, where, limit=MAX_TEXT),
        target=_field(d, "target", str, where, limit=MAX_NAME),
        plan_json=_field(d, "plan_json", str, where, limit=MAX_TEXT),
    )


def _kernel(d: Any, where: str) -> BundleKernel:
    m = _field(d, "meta", dict, where)
    mw = f"{where}.meta"
    options = _field(m, "options", list, mw, limit=MAX_OPTIONS)
    for i, option in enumerate(options):
        if not isinstance(option, str) or len(option) > MAX_NAME:
            raise BundleError(f"{mw}.options[{i}]: expected a string of at most {MAX_NAME}")
    compile_ms = _field(m, "compile_ms", float, mw, default=0.0)
    meta = KernelMeta(
        kernel_name=_field(m, "kernel_name", str, mw, limit=MAX_NAME),
        arch=_count(m, "arch", mw, 10_000),
        nvrtc_version=_field(m, "nvrtc_version", str, mw, limit=MAX_NAME),
        options=tuple(options),
        source=_field(m, "source", str, mw, limit=MAX_TEXT),
        scheduler=_field(m, "scheduler", str, mw, limit=MAX_NAME, default=""),
        params_json=_field(m, "params_json", str, mw, limit=MAX_TEXT, default="{}"),
        compile_ms=float(max(0.0, compile_ms)),
    )
    return BundleKernel(
        key=_hex64(d, "key", where),
        member=_field(d, "file", str, where, limit=MAX_NAME),
        sha256=_hex64(d, "sha256", where),
        size=_count(d, "size", where, MAX_CUBIN_BYTES),
        meta=meta,
    )


def _link(d: Any, where: str) -> tuple[int, str]:
    if not isinstance(d, list) or len(d) != 2:
        raise BundleError(f"{where}: expected [fusion id, kernel key], got {str(d)[:40]}")
    pair = {"fusion_id": d[0], "kernel_key": d[1]}
    return _count(pair, "fusion_id", where, 1 << 40), _hex64(pair, "kernel_key", where)


def _unique(items: list, key: Callable, name: str, what: str, where: str) -> set:
    seen: set = set()
    for i, item in enumerate(items):
        k = key(item)
        if k in seen:
            raise BundleError(f"{where}: {name}[{i}]: {what} {k!r} appears twice")
        seen.add(k)
    return seen


# -- the frontend's view of records (Note [Store upcalls]) --------------------------------------


def _check_records(f: BundleFusion, where: str) -> None:
    """The fusion's records are records of known kinds and ops, in canonical form, and its
    key is their hash: otherwise FusionDefinition(id) would replay something else."""
    try:  # Note [Store upcalls]
        records_from_json, records_to_json, definition_key, ops = records_codec()
    except LookupError as err:
        raise BundleError(f"{where}: cannot check the bundle's fusions ({err})") from None
    try:
        records = records_from_json(f.records_json)
    except Exception as err:  # any shape of malformed JSON: KeyError, TypeError, ...
        raise BundleError(f"{where}.records_json: not records ({type(err).__name__}: "
                          f"{str(err)[:200]})") from None  # fmt: skip
    for i, r in enumerate(records):
        if not isinstance(r.kind, str) or r.kind not in _RECORD_KINDS:
            raise BundleError(f"{where}: record {i} has unknown kind {str(r.kind)[:40]!r}")
        if not isinstance(r.name, str) or not all(isinstance(k, str) for k, _ in r.kwargs):
            raise BundleError(f"{where}: record {i} has a name or keyword that is not a string")
        if (r.kind == "op") != bool(r.name) or r.kind == "op" and r.name not in ops:
            raise BundleError(f"{where}: record {i} names op {r.name[:40]!r}, which fd.ops "
                              "does not have")  # fmt: skip
    if records_to_json(records) != f.records_json:
        raise BundleError(f"{where}.records_json: not in the canonical form the frontend writes")
    if definition_key(records) != f.definition_key:
        raise BundleError(f"{where}.definition_key is not the hash of its records (forged or "
                          "damaged)")  # fmt: skip
