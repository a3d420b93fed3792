"""Bundles: a store's contents in one portable zip (JSON manifest + cubin files; no pickles).

Use: fill a store on a build machine, `fusion-cache export warm.zip`, ship it, and
`fusion-cache import warm.zip` on the cluster. Fusion ids are per store, so import maps them
by definition key: a key the target knows keeps the target's id, a new key gets a new id,
and plans and links follow the mapping. Every cubin is checked against its sha256 and size
before it is stored; a damaged one is skipped (a later run recompiles it).
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import tempfile
import time
import zipfile
from pathlib import Path
from typing import TYPE_CHECKING

from .entries import KernelMeta

if TYPE_CHECKING:
    from .store import Store

log = logging.getLogger("fusion_cache.store")

FORMAT = "fusion-cache-bundle"
VERSION = 1
MANIFEST = "manifest.json"
MAX_MANIFEST_BYTES = 1 << 30


class BundleError(ValueError):
    """The file is not a bundle this version can read."""


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
    """Merge a bundle into `store`; returns the number of fusions + plans + kernels taken
    (already-present entries count: importing twice changes nothing and returns the same).
    Raises BundleError for a file that is not a readable bundle."""
    try:
        zf = zipfile.ZipFile(path)
    except (OSError, zipfile.BadZipFile) as err:
        raise BundleError(f"{path}: not a bundle ({err})") from None
    with zf:
        manifest = _read_manifest(zf, path)
        try:
            return _apply(store, zf, manifest)
        except (KeyError, TypeError, ValueError) as err:
            raise BundleError(f"{path}: malformed manifest ({err!r})") from None


def _read_manifest(zf: zipfile.ZipFile, path) -> dict:
    try:
        info = zf.getinfo(MANIFEST)
    except KeyError:
        raise BundleError(f"{path}: no {MANIFEST}") from None
    if info.file_size > MAX_MANIFEST_BYTES:
        raise BundleError(f"{path}: manifest of {info.file_size} bytes is implausible")
    try:
        manifest = json.loads(zf.read(info))
    except (ValueError, zipfile.BadZipFile) as err:
        raise BundleError(f"{path}: unreadable manifest ({err})") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise BundleError(f"{path}: not a {FORMAT}")
    if int(manifest.get("version", 0)) > VERSION:
        raise BundleError(
            f"{path}: bundle version {manifest['version']} is newer than this fusion-cache "
            f"reads ({VERSION})"
        )
    return manifest


def _apply(store: Store, zf: zipfile.ZipFile, manifest: dict) -> int:
    ids: dict[int, int] = {}
    for f in manifest["fusions"]:
        ids[int(f["id"])] = store.fusion_id_for(
            str(f["definition_key"]), str(f["records_json"]), str(f["python_definition"])
        )
    taken = len(ids)
    for p in manifest["plans"]:
        fid = ids.get(int(p["fusion_id"]))
        if fid is None:
            log.warning("fusion-cache bundle: plan for unknown fusion %s skipped", p["fusion_id"])
            continue
        store.put_plan(fid, str(p["signature_key"]), str(p["target"]), str(p["plan_json"]))
        taken += 1
    names = set(zf.namelist())
    for k in manifest["kernels"]:
        data = _read_cubin(zf, names, k)
        if data is None:
            continue
        store.put_kernel(str(k["key"]), data, KernelMeta.from_json(k["meta"]))
        taken += 1
    for fid, key in manifest["links"]:
        if int(fid) in ids:
            store.link_kernel(ids[int(fid)], str(key))
    return taken


def _read_cubin(zf: zipfile.ZipFile, names: set[str], k: dict) -> bytes | None:
    name, size = str(k["file"]), int(k["size"])
    if name not in names or zf.getinfo(name).file_size != size:
        log.warning("fusion-cache bundle: kernel %s missing or wrong size; skipped", k["key"])
        return None
    try:
        data = zf.read(name)
    except (zipfile.BadZipFile, OSError) as err:  # CRC error, truncated archive
        log.warning("fusion-cache bundle: kernel %s unreadable (%s); skipped", k["key"], err)
        return None
    if hashlib.sha256(data).hexdigest() != k["sha256"]:
        log.warning("fusion-cache bundle: kernel %s fails its sha256; skipped", k["key"])
        return None
    return data
