"""export_bundle / import_bundle: a portable zip, fusion ids remapped by definition key."""
from __future__ import annotations

import json
import zipfile

import pytest

from fusion_cache.store import KernelMeta, open_store
from fusion_cache.store.bundle import BundleError


def meta(name: str) -> KernelMeta:
    return KernelMeta(name, 90, "13.0", ("-O3",), f"// {name}", "reduction", '{"x": 1}', 7.0)


def fill_source(store) -> None:
    for i, name in enumerate(["alpha", "beta", "gamma"]):
        fid = store.fusion_id_for(f"def-{name}", f"[{i}]", f"def {name}(fd): ...")
        assert fid == i
        store.put_plan(fid, "sig", "sm_90", json.dumps({"fusion": name}))
        store.put_kernel(f"kern-{name}", name.encode() * 100, meta(name))
        store.link_kernel(fid, f"kern-{name}")


def test_roundtrip_into_a_store_with_other_fusions(tmp_path):
    with open_store(cache_dir=tmp_path / "a") as src:
        fill_source(src)
        assert src.export_bundle(tmp_path / "warm.zip") == 9
    with open_store(cache_dir=tmp_path / "b") as dst:
        assert dst.fusion_id_for("def-other", "[]", "") == 0
        assert dst.fusion_id_for("def-beta", "[1]", "def beta(fd): ...") == 1
        assert dst.fusion_id_for("def-another", "[]", "") == 2
        assert dst.import_bundle(tmp_path / "warm.zip") == 9
        ids = {f.definition_key: f.id for f in dst.fusions()}
        assert ids == {"def-other": 0, "def-beta": 1, "def-another": 2, "def-alpha": 3,
                       "def-gamma": 4}
        for name in ["alpha", "beta", "gamma"]:
            fid = ids[f"def-{name}"]
            assert dst.get_plan(fid, "sig", "sm_90") == json.dumps({"fusion": name})
            assert [k.key for k in dst.kernels(fid)] == [f"kern-{name}"]
            assert dst.get_kernel(f"kern-{name}") == name.encode() * 100
            assert dst.kernel_meta(f"kern-{name}").meta == meta(name)
        assert dst.fusion_by_id(ids["def-gamma"]).python_definition == "def gamma(fd): ..."
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


def test_damaged_cubin_in_a_bundle_is_skipped(tmp_path):
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
        assert dst.import_bundle(tmp_path / "bad.zip") == 8
        assert dst.get_kernel("kern-beta") is None
        assert dst.get_kernel("kern-alpha") == b"alpha" * 100


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
