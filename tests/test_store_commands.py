"""The store's CLI subcommands, driven through argparse the way fusion_cache/cli.py does."""
from __future__ import annotations

import argparse
import hashlib
import json
import sqlite3

import pytest

from fusion_cache.store import KernelMeta, commands, default_store, reset_default_store
from fusion_cache.store.keys import kernel_key


@pytest.fixture(autouse=True)
def _fresh_default():
    reset_default_store()
    yield
    reset_default_store()
    commands.describe_fusion = None


def run(*argv: str) -> int:
    parser = argparse.ArgumentParser(prog="fusion-cache")
    commands.register_commands(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(list(argv))
    return args.func(args)


DEF_KEY = hashlib.sha256(b"[]").hexdigest()  # the key of a definition with no records
KERN_KEY = kernel_key("// src", ("-O3",), 90)


def fill() -> int:
    store = default_store()
    fid = store.fusion_id_for(DEF_KEY, "[]", "def fusion(fd):\n    t0 = fd.define_tensor()")
    store.put_plan(fid, "f32[?,?]c", "sm_90", '{"segments": 1}')
    store.put_kernel(KERN_KEY, b"\x7fELF" * 500, KernelMeta(
        "pointwise_0", 90, "13.0", ("-O3",), "// src", "pointwise", '{"vec": 4}', 42.0))
    store.link_kernel(fid, KERN_KEY)
    store.get_kernel(KERN_KEY)
    return fid


def test_ls_and_show(capsys):
    assert run("ls") == 0
    assert "no fusions" in capsys.readouterr().out
    fid = fill()
    assert run("ls") == 0
    out = capsys.readouterr().out
    assert DEF_KEY in out and f"{fid:>5}" in out
    commands.describe_fusion = lambda entry: f"IR of fusion {entry.id}"
    assert run("show", str(fid)) == 0
    out = capsys.readouterr().out
    for text in ["def fusion(fd):", "IR of fusion 0", "f32[?,?]c", "sm_90", '{"segments": 1}',
                 "pointwise_0", "scheduler pointwise", '{"vec": 4}', "nvrtc 13.0", "42.0 ms",
                 "hits 1", "2.0 KB"]:
        assert text in out, text
    assert run("show", "7") == 1


def test_stats_verify_migrate(capsys):
    fill()
    assert run("stats") == 0
    assert "schema_revision: 0002" in capsys.readouterr().out
    assert run("stats", "--json") == 0
    assert json.loads(capsys.readouterr().out)["kernels"] == 1
    assert run("verify") == 0
    assert "1 kernels: 0 problems" in capsys.readouterr().out
    assert run("migrate") == 0
    assert "schema at 0002 (head 0002)" in capsys.readouterr().out


def test_verify_reports_and_repairs(capsys, fresh_store):
    fill()
    with sqlite3.connect(fresh_store / "store.db") as db:
        db.execute("UPDATE fc_kernels SET sha256 = ?", ("0" * 64,))
    assert run("verify") == 1
    assert "BAD" in capsys.readouterr().out
    assert run("verify", "--repair") == 0
    assert run("verify") == 0


def test_prune(capsys):
    fill()
    assert run("prune") == 2
    assert run("prune", "--max-age-days", "30") == 0
    assert "removed 0 kernels" in capsys.readouterr().out
    assert run("prune", "--max-size", "1KB") == 0
    assert "removed 1 kernels" in capsys.readouterr().out


def test_export_import(capsys, tmp_path, monkeypatch):
    fill()
    assert run("export", str(tmp_path / "b.zip")) == 0
    assert "exported 3 entries" in capsys.readouterr().out
    reset_default_store()
    (tmp_path / "other").mkdir()
    monkeypatch.setenv("FUSION_CACHE_DIR", str(tmp_path / "other"))
    assert run("import", str(tmp_path / "b.zip")) == 0
    assert "imported 3 entries" in capsys.readouterr().out
    assert default_store().get_kernel(KERN_KEY) == b"\x7fELF" * 500
    (tmp_path / "junk").write_bytes(b"junk")
    assert run("import", str(tmp_path / "junk")) == 1


def test_migrate_without_a_usable_store(capsys, monkeypatch, tmp_path):
    (tmp_path / "f").write_text("")
    monkeypatch.setenv("FUSION_CACHE_DIR", str(tmp_path / "f" / "d"))
    with pytest.warns(UserWarning):
        assert run("migrate") == 1
    assert "no persistent store" in capsys.readouterr().out


@pytest.mark.parametrize("text,size", [("100", 100), ("2GB", 2 * 10**9), ("1.5M", 1_500_000),
                                       ("512MiB", 512 * 2**20), ("4kib", 4096)])
def test_parse_size(text, size):
    assert commands.parse_size(text) == size


def test_parse_size_rejects_nonsense():
    with pytest.raises(argparse.ArgumentTypeError):
        commands.parse_size("lots")
