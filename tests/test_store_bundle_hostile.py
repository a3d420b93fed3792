"""Hostile bundles: forged keys, swapped blobs, duplicate members, oversized manifests,
malformed fields and failures halfway are refused with a clear BundleError, and the store is
left exactly as it was (Note [Bundle trust])."""
from __future__ import annotations

import copy
import hashlib
import json
import zipfile
from collections.abc import Callable
from pathlib import Path

import pytest
from sqlalchemy import event
from test_store_bundle import NAMES, fill_source, fusion, kern, meta
from test_store_postgres import pg_url  # noqa: F401  (fixture: a fresh schema)

from fusion_cache.store import MemoryStore, SqlStore, open_store
from fusion_cache.store import bundle as bundle_module
from fusion_cache.store.bundle import BundleError, BundleImportError
from fusion_cache.store.keys import kernel_key


@pytest.fixture
def source_zip(tmp_path) -> Path:
    with open_store(cache_dir=tmp_path / "src") as src:
        fill_source(src)
        src.export_bundle(tmp_path / "good.zip")
    return tmp_path / "good.zip"


@pytest.fixture(params=["sql", "memory"])
def target(request, tmp_path):
    """A store that already holds one fusion and one kernel of its own."""
    store = open_store(cache_dir=tmp_path / "dst") if request.param == "sql" else MemoryStore()
    store.fusion_id_for(*fusion("resident"))
    store.put_kernel(kern("resident"), b"resident" * 10, meta("resident"))
    yield store
    store.close()


def snapshot(store) -> tuple:
    return ([(f.id, f.definition_key) for f in store.fusions()],
            [(k.key, k.sha256) for k in store.kernels()], store.links(),
            [p for f in store.fusions() for p in store.plans_for(f.id)])  # fmt: skip


def tamper(good: Path, out: Path, edit: Callable[[dict], None] | None = None,
           members: dict[str, bytes] | None = None, extra: list | None = None) -> Path:
    """A copy of `good` with its manifest edited and members replaced or added."""
    with zipfile.ZipFile(good) as zin:
        manifest = json.loads(zin.read("manifest.json"))
        data = {i.filename: zin.read(i) for i in zin.infolist() if i.filename != "manifest.json"}
    if edit:
        edit(manifest)
    data.update(members or {})
    with zipfile.ZipFile(out, "w") as zout:
        for name, blob in data.items():
            zout.writestr(name, blob)
        for name, blob in extra or []:
            zout.writestr(name, blob)
        zout.writestr("manifest.json", json.dumps(manifest))
    return out


def refused(store, path: Path, match: str) -> None:
    before = snapshot(store)
    with pytest.raises(BundleError, match=match):
        store.import_bundle(path)
    assert snapshot(store) == before, "a refused import changed the store"


def by_key(manifest: dict, name: str) -> dict:
    return next(k for k in manifest["kernels"] if k["key"] == kern(name))


# -- forged keys ---------------------------------------------------------------------------


def test_forged_fusion_key_is_refused(target, source_zip, tmp_path):
    # alpha's key with beta's records: FusionDefinition(alpha's id) would replay beta
    def edit(m):
        m["fusions"][0]["records_json"] = m["fusions"][1]["records_json"]

    refused(target, tamper(source_zip, tmp_path / "b.zip", edit),
            r"fusions\[0\]\.definition_key is not the hash of its records")


def test_forged_kernel_key_is_refused(target, source_zip, tmp_path):
    # kernel alpha's key on beta's source, options and arch (and beta's bytes)
    def edit(m):
        a, b = by_key(m, "alpha"), by_key(m, "beta")
        b["key"] = a["key"]
        a["key"] = kernel_key("// other", ("-O3",), 90)

    refused(target, tamper(source_zip, tmp_path / "b.zip", edit),
            r"kernels\[\d\]\.key is not the key of its source, options and arch")


def test_kernel_key_of_another_arch_is_refused(target, source_zip, tmp_path):
    def edit(m):
        by_key(m, "alpha")["meta"]["arch"] = 80

    refused(target, tamper(source_zip, tmp_path / "b.zip", edit), "not the key of its source")


def test_records_must_name_known_ops(target, source_zip, tmp_path):
    # a definition of op __init__, keyed honestly: it would import and break on replay
    _, records, _ = fusion("alpha")
    evil = records.replace('"name":"mul"', '"name":"__init__"')
    def edit(m):
        m["fusions"][0].update(records_json=evil,
                               definition_key=hashlib.sha256(evil.encode()).hexdigest())

    refused(target, tamper(source_zip, tmp_path / "b.zip", edit),
            r"names op '__init__', which fd.ops does not have")


@pytest.mark.parametrize("records,why", [
    ('[{"kind":"eval","name":"","args":[],"kwargs":[],"outputs":[]}]', "unknown kind 'eval'"),
    ("not json", "records_json: not records"),
    ('[{"kind":"op"}]', "records_json: not records"),
    ('[ ]', "not in the canonical form"),
    ("[" * 100_000 + "]" * 100_000, "records_json: not records"),
])
def test_records_that_are_not_records(target, source_zip, tmp_path, records, why):
    def edit(m):
        m["fusions"][0].update(records_json=records,
                               definition_key=hashlib.sha256(records.encode()).hexdigest())

    refused(target, tamper(source_zip, tmp_path / "b.zip", edit), why)


# -- swapped blobs and duplicate members ---------------------------------------------------


def test_swapped_members_fail_their_sha256(target, source_zip, tmp_path):
    # alpha's and gamma's cubins are the same size: swap the bytes under their names
    with zipfile.ZipFile(source_zip) as zf:
        m = json.loads(zf.read("manifest.json"))
        a, g = by_key(m, "alpha")["file"], by_key(m, "gamma")["file"]
        swapped = {a: zf.read(g), g: zf.read(a)}
    refused(target, tamper(source_zip, tmp_path / "b.zip", members=swapped),
            "fails its size or sha256")


def test_swapped_file_names_fail_their_sha256(target, source_zip, tmp_path):
    def edit(m):
        a, g = by_key(m, "alpha"), by_key(m, "gamma")
        a["file"], g["file"] = g["file"], a["file"]

    refused(target, tamper(source_zip, tmp_path / "b.zip", edit), "fails its size or sha256")


def test_entries_sharing_one_member_are_refused(target, source_zip, tmp_path):
    # ten entries on one member once wrote the member ten times over
    def edit(m):
        first = m["kernels"][0]
        for i in range(10):
            clone = copy.deepcopy(first)
            clone["meta"]["source"] = f"// clone {i}"
            clone["key"] = kernel_key(f"// clone {i}", ("-O3",), 90)
            m["kernels"].append(clone)

    refused(target, tamper(source_zip, tmp_path / "b.zip", edit),
            r"kernels\[3\]: file 'kernels/000000.cubin' appears twice")


def test_a_member_stored_twice_is_refused(target, source_zip, tmp_path):
    with zipfile.ZipFile(source_zip) as zf:
        first = by_key(json.loads(zf.read("manifest.json")), "alpha")["file"]
    with pytest.warns(UserWarning, match="Duplicate name"):
        bad = tamper(source_zip, tmp_path / "b.zip", extra=[(first, b"other bytes")])
    refused(target, bad, "members stored twice")


def test_duplicate_keys_are_refused(target, source_zip, tmp_path):
    def edit(m):
        m["fusions"].append(dict(m["fusions"][0], id=99))

    refused(target, tamper(source_zip, tmp_path / "b.zip", edit),
            r"fusions\[3\]: definition_key '[0-9a-f]{64}' appears twice")


def test_missing_member_or_wrong_size(target, source_zip, tmp_path):
    def missing(m):
        m["kernels"][0]["file"] = "kernels/nowhere.cubin"

    def size(m):
        m["kernels"][0]["size"] += 1

    refused(target, tamper(source_zip, tmp_path / "a.zip", missing), "no member")
    refused(target, tamper(source_zip, tmp_path / "b.zip", size), "the manifest says")


# -- sizes and counts ------------------------------------------------------------------------


def test_oversized_manifest_is_refused_before_it_is_read(target, source_zip, monkeypatch):
    monkeypatch.setattr(bundle_module, "MAX_MANIFEST_BYTES", 1000)
    refused(target, source_zip, r"manifest of \d+ bytes, over the 1000 an import reads")


def test_counts_and_lengths_are_bounded(target, source_zip, tmp_path, monkeypatch):
    monkeypatch.setattr(bundle_module, "MAX_ENTRIES", 2)
    refused(target, source_zip, r"manifest.fusions: 3 long, over the limit of 2")
    monkeypatch.setattr(bundle_module, "MAX_ENTRIES", 100)
    monkeypatch.setattr(bundle_module, "MAX_TEXT", 50)
    refused(target, source_zip, r"fusions\[0\].records_json: \d+ long, over the limit of 50")


def test_oversized_cubins_are_refused(target, source_zip, monkeypatch):
    monkeypatch.setattr(bundle_module, "MAX_TOTAL_CUBIN_BYTES", 1000)
    refused(target, source_zip, "1400 bytes of cubins, over the 1000 an import takes")


# -- malformed manifests ---------------------------------------------------------------------


@pytest.mark.parametrize("edit,why", [
    (lambda m: m.update(version="two"), "manifest.version: expected an integer, got str 'two'"),
    (lambda m: m.update(version=True), "manifest.version: expected an integer, got bool"),
    (lambda m: m.update(version=0), "0 is not a bundle version"),
    (lambda m: m.pop("version"), "manifest.version: missing"),
    (lambda m: m.update(fusions={}), "manifest.fusions: expected a list, got dict"),
    (lambda m: m.update(kernels=None), "manifest.kernels: expected a list, got NoneType"),
    (lambda m: m["fusions"].__setitem__(0, "x"), r"fusions\[0\]: expected an object, got str"),
    (lambda m: m["fusions"][0].update(id="0"), r"fusions\[0\].id: expected an integer"),
    (lambda m: m["fusions"][0].update(id=-1), r"fusions\[0\].id: -1 is outside"),
    (lambda m: m["fusions"][0].pop("records_json"), r"fusions\[0\].records_json: missing"),
    (lambda m: m["fusions"][0].update(definition_key="../x"), "expected 64 hex digits"),
    (lambda m: m["plans"][0].update(fusion_id=7), r"plans\[0\].fusion_id: no fusion 7 here"),
    (lambda m: m["plans"][0].update(plan_json={"a": 1}), r"plans\[0\].plan_json: expected a"),
    (lambda m: m["kernels"][0].update(size=2.5), r"kernels\[0\].size: expected an integer"),
    (lambda m: m["kernels"][0].update(size=1 << 40), r"kernels\[0\].size: \d+ is outside"),
    (lambda m: m["kernels"][0].update(sha256="zz"), r"kernels\[0\].sha256: expected 64 hex"),
    (lambda m: m["kernels"][0]["meta"].update(options="-O3"), r"meta.options: expected a list"),
    (lambda m: m["kernels"][0]["meta"].update(options=[3]), r"meta.options\[0\]: expected a"),
    (lambda m: m["kernels"][0]["meta"].update(compile_ms="NaN"), "compile_ms: expected a number"),
    (lambda m: m["kernels"][0]["meta"].pop("source"), r"meta.source: missing"),
    (lambda m: m["links"].append([0]), r"links\[3\]: expected \[fusion id, kernel key\]"),
    (lambda m: m["links"].append([42, "0" * 64]), r"links\[3\]: no fusion 42 here"),
    (lambda m: m["links"].append(["0", "0" * 64]), r"links\[3\].fusion_id: expected an integer"),
])
def test_malformed_manifest(target, source_zip, tmp_path, edit, why):
    refused(target, tamper(source_zip, tmp_path / "b.zip", edit), why)


def test_manifest_that_is_not_an_object(target, source_zip, tmp_path):
    with zipfile.ZipFile(tmp_path / "b.zip", "w") as zf:
        zf.writestr("manifest.json", "[1, 2]")
    refused(target, tmp_path / "b.zip", "not a fusion-cache-bundle")
    with zipfile.ZipFile(tmp_path / "c.zip", "w") as zf:
        zf.writestr("manifest.json", "{" * 100_000)
    refused(target, tmp_path / "c.zip", "unreadable manifest")


# -- failure halfway -------------------------------------------------------------------------


def test_a_bad_last_cubin_rolls_back_everything(target, source_zip, tmp_path):
    # fusions, plans and two kernels are written before the third cubin fails its check
    with zipfile.ZipFile(source_zip) as zf:
        last = json.loads(zf.read("manifest.json"))["kernels"][-1]["file"]
        data = bytearray(zf.read(last))
    data[-1] ^= 1
    refused(target, tamper(source_zip, tmp_path / "b.zip", members={last: bytes(data)}),
            f"{last}' fails its size or sha256")
    assert target.import_bundle(source_zip) == 9  # the good bundle still goes in whole
    assert {k.key for k in target.kernels()} == {kern(n) for n in NAMES + ["resident"]}


def test_a_store_failing_halfway_imports_nothing(source_zip, tmp_path):
    store = open_store(cache_dir=tmp_path / "dst")
    assert isinstance(store, SqlStore)
    store.fusion_id_for(*fusion("resident"))
    before = snapshot(store)
    calls = []

    @event.listens_for(store._engine, "before_cursor_execute")
    def fail_on_kernels(conn, cursor, statement, params, context, executemany):
        if statement.startswith("INSERT INTO fc_kernels"):
            calls.append(statement)
            if len(calls) == 2:  # the disk fills up after the first kernel
                raise OSError(28, "No space left on device")

    with pytest.raises(BundleImportError, match="No space left on device.*nothing was imported"):
        store.import_bundle(source_zip)
    event.remove(store._engine, "before_cursor_execute", fail_on_kernels)
    assert snapshot(store) == before
    assert store.import_bundle(source_zip) == 9
    store.close()


@pytest.mark.postgres
def test_all_or_nothing_on_postgres(pg_url, source_zip, tmp_path):  # noqa: F811
    with zipfile.ZipFile(source_zip) as zf:
        last = json.loads(zf.read("manifest.json"))["kernels"][-1]["file"]
        size = len(zf.read(last))
    bad = tamper(source_zip, tmp_path / "b.zip", members={last: b"x" * size})
    with open_store(pg_url, cache_dir=tmp_path / "pg") as store:
        assert isinstance(store, SqlStore)
        store.fusion_id_for(*fusion("resident"))
        refused(store, bad, "fails its size or sha256")
        assert store.import_bundle(source_zip) == 9
        assert [f.id for f in store.fusions()] == [0, 1, 2, 3]
