"""export_bundle / import_bundle: a portable zip, fusion ids remapped by definition key.

Bundles carry real fusions (records written by the frontend, keyed by their hash) and real
kernel keys (keys.kernel_key of their source, options and arch): import checks both.
tests/test_store_bundle_hostile.py holds the bundles that must be refused.
"""
from __future__ import annotations

import json
import zipfile

import pytest

from fusion_cache import DataType, FusionCache, FusionDefinition
from fusion_cache.store import KernelMeta, open_store
from fusion_cache.store.bundle import BundleError
from fusion_cache.store.keys import kernel_key

NAMES = ["alpha", "beta", "gamma"]


def meta(name: str) -> KernelMeta:
    return KernelMeta(name, 90, "13.0", ("-O3",), f"// {name}", "reduction", '{"x": 1}', 7.0)


def kern(name: str) -> str:
    return kernel_key(f"// {name}", ("-O3",), 90)


def fusion(name: str) -> tuple[str, str, str]:
    """(definition key, records JSON, Python text) of a real definition, one per name."""
    const = float(NAMES.index(name) + 2) if name in NAMES else float(len(name) + 10)
    with FusionDefinition() as fd:
        t0 = fd.define_tensor(shape=[-1], contiguity=[True], dtype=DataType.Float)
        fd.add_output(fd.ops.mul(t0, fd.define_scalar(const)))
    e = FusionCache.get().store.fusion_by_id(fd.id())
    return e.definition_key, e.records_json, e.python_definition


def fill_source(store) -> None:
    for i, name in enumerate(NAMES):
        fid = store.fusion_id_for(*fusion(name))
        assert fid == i
        store.put_plan(fid, "sig", "sm_90", json.dumps({"fusion": name}))
        store.put_kernel(kern(name), name.encode() * 100, meta(name))
        store.link_kernel(fid, kern(name))


def test_roundtrip_into_a_store_with_other_fusions(tmp_path):
    with open_store(cache_dir=tmp_path / "a") as src:
        fill_source(src)
        assert src.export_bundle(tmp_path / "warm.zip") == 9
    with open_store(cache_dir=tmp_path / "b") as dst:
        key = {name: fusion(name)[0] for name in NAMES + ["other", "another"]}
        assert dst.fusion_id_for(*fusion("other")) == 0
        assert dst.fusion_id_for(*fusion("beta")) == 1
        assert dst.fusion_id_for(*fusion("another")) == 2
        assert dst.import_bundle(tmp_path / "warm.zip") == 9
        ids = {f.definition_key: f.id for f in dst.fusions()}
        assert ids == {key["other"]: 0, key["beta"]: 1, key["another"]: 2, key["alpha"]: 3,
                       key["gamma"]: 4}
        for name in NAMES:
            fid = ids[key[name]]
            assert dst.get_plan(fid, "sig", "sm_90") == json.dumps({"fusion": name})
            assert [k.key for k in dst.kernels(fid)] == [kern(name)]
            assert dst.get_kernel(kern(name)) == name.encode() * 100
            assert dst.kernel_meta(kern(name)).meta == meta(name)
        assert dst.fusion_by_id(ids[key["gamma"]]).python_definition == fusion("gamma")[2]
        assert dst.import_bundle(tmp_path / "warm.zip") == 9  # twice changes nothing
        assert len(dst.fusions()) == 5 and len(dst.kernels()) == 3
        assert dst.verify().ok


def test_bundle_is_json_and_raw_cubins(tmp_path):
    with open_store(cache_dir=tmp_path / "a") as src:
        fill_source(src)
        src.export_bundle(tmp_path / "warm.zip")
    with zipfile.ZipFile(tmp_path / "warm.zip") as zf:
        names = sorted(zf.namelist())
        manifest = json.loads(zf.read("manifest.json"))
        assert zf.read(manifest["kernels"][0]["file"]) == b"alpha" * 100
    assert names == ["kernels/000000.cubin", "kernels/000001.cubin", "kernels/000002.cubin",
                     "manifest.json"]
    assert manifest["format"] == "fusion-cache-bundle" and manifest["version"] == 1
    assert not list(tmp_path.glob(".warm.zip.*"))  # no temp file left behind


def test_damaged_cubin_fails_the_whole_import(tmp_path):
    with open_store(cache_dir=tmp_path / "a") as src:
        fill_source(src)
        src.export_bundle(tmp_path / "warm.zip")
    with zipfile.ZipFile(tmp_path / "warm.zip") as zin, \
            zipfile.ZipFile(tmp_path / "bad.zip", "w") as zout:
        for info in zin.infolist():
            data = zin.read(info)
            if info.filename == "kernels/000001.cubin":
                data = b"BETA" + data[4:]  # same size, wrong hash
            zout.writestr(info.filename, data)
    with open_store(cache_dir=tmp_path / "b") as dst:
        with pytest.raises(BundleError, match="000001.cubin' fails its size or sha256"):
            dst.import_bundle(tmp_path / "bad.zip")
        assert dst.fusions() == [] and dst.kernels() == []  # all or nothing
        assert dst.get_kernel(kern("alpha")) is None


def test_not_a_bundle(tmp_path):
    (tmp_path / "x.zip").write_bytes(b"garbage")
    with zipfile.ZipFile(tmp_path / "y.zip", "w") as zf:
        zf.writestr("manifest.json", json.dumps({"format": "something-else"}))
    with zipfile.ZipFile(tmp_path / "z.zip", "w") as zf:
        zf.writestr("manifest.json", json.dumps({"format": "fusion-cache-bundle", "version": 9}))
    with open_store(cache_dir=tmp_path / "b") as dst:
        for name, why in [("x.zip", "not a bundle"), ("y.zip", "not a fusion-cache-bundle"),
                          ("z.zip", "newer")]:
            with pytest.raises(BundleError, match=why):
                dst.import_bundle(tmp_path / name)
        assert dst.fusions() == []
