"""The store's CLI subcommands (ls, show, stats, verify, prune, export, import, migrate),
driven through fusion_cache.cli.main as the `fusion-cache` entry point drives them."""
from __future__ import annotations

import argparse
import hashlib
import io
import json
import sqlite3

import pytest
from test_store_postgres import pg_url  # noqa: F401  (the fixture)

from fusion_cache.cli import main
from fusion_cache.cli.output import Status, print_table
from fusion_cache.cli.store_commands import parse_size
from fusion_cache.store import KernelMeta, default_store, reset_default_store
from fusion_cache.store.keys import kernel_key


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def define_pointwise() -> int:
    """relu(a * b + bias): the pointwise scheduler takes it."""
    from fusion_cache import DataType, FusionDefinition

    with FusionDefinition() as fd:
        a = fd.define_tensor(shape=[-1, -1], contiguity=[True, True], dtype=DataType.Float)
        b = fd.define_tensor(shape=[-1, -1], contiguity=[True, True], dtype=DataType.Float)
        c = fd.define_tensor(shape=[-1], contiguity=[True], dtype=DataType.Float)
        bias = fd.ops.broadcast_in_dim(c, shape=fd.ops.shape(a), broadcast_dims=[1])
        fd.add_output(fd.ops.relu(a * b + bias))
    return fd.id()


def define_reduction() -> int:
    from fusion_cache import DataType, FusionDefinition

    with FusionDefinition() as fd:
        t0 = fd.define_tensor(shape=[-1, 1, -1], contiguity=[True, None, True], dtype=DataType.Float)
        t1 = fd.define_tensor(shape=[-1, -1, -1], contiguity=[True, True, True],
                              dtype=DataType.BFloat16)  # fmt: skip
        s = fd.define_scalar(dtype=DataType.Double)
        t2 = fd.ops.add(t0, fd.ops.cast(t1, DataType.Float))
        fd.add_output(fd.ops.sum(fd.ops.mul(t2, s), dims=[-1]))
    return fd.id()


DEF_KEY = hashlib.sha256(b"[]").hexdigest()  # the key of no records: bundles check keys
KERN_KEY = kernel_key("// src", ("-O3",), 90)  # the key of the kernel fill() stores


def fill(fid: int | None = None, key: str = KERN_KEY) -> int:
    """A fusion with a plan and a kernel that has been hit once."""
    store = default_store()
    if fid is None:
        text = "def nvfuser_fusion_id(fd : FusionDefinition) -> None :\n    pass\n"
        fid = store.fusion_id_for(DEF_KEY, "[]", text)
    plan = {"scheduler": "pointwise", "plan": "rank=2 vec=4", "kernels": [{"key": key}]}
    sig = json.dumps(["(torch.float32, torch.Size([64, 128]), (128, 1), 16, -1)", "<class 'float'>"])
    store.put_plan(fid, sig, "sm_90", json.dumps(plan))
    store.put_kernel(key, b"\x7fELF" * 500, KernelMeta(
        "pointwise_0", 90, "13.0", ("-O3",), "// src", "pointwise", '{"vec": 4}', 42.0))
    store.link_kernel(fid, key)
    store.get_kernel(key)
    return fid


# ---- item 8: ls says what each fusion does -------------------------------------------------


def test_ls_shows_inputs_ops_outputs_plans_kernels_hits_and_last_use(capsys):
    assert run(capsys, "ls")[:2] == (0, f"no fusions in {default_store().url}\n")
    fill(define_pointwise())
    define_reduction()
    code, out, _ = run(capsys, "ls")
    assert code == 0 and "\x1b" not in out  # not a terminal: plain columns, no colours
    header, first, second = out.splitlines()
    assert header.split() == ["id", "inputs", "ops", "outputs", "plans", "kernels", "hits", "last",
                              "use", "key"]  # fmt: skip
    assert "0  f32[?,?], f32[?,?], f32[?]" in first
    assert "5 (shape, broadcast_in_dim, mul, add, relu)" in first
    # outputs, plans, kernels, hits; then the date of the kernel's last use
    assert "  1      1        1     1  20" in first
    assert "f32[?,1,?], bf16[?,?,?], f64" in second and "4 (cast, add, mul, sum)" in second
    assert "  1      0        0     0  -" in second


def test_ls_table_on_a_terminal_is_rich_and_plain_otherwise():
    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    rows = [["0", "f32[?,?]", "3"], ["12", "bf16[?]", "10"]]
    tty, plain = Terminal(), io.StringIO()
    print_table(["id", "inputs", "ops"], rows, right=["id", "ops"], stream=tty)
    print_table(["id", "inputs", "ops"], rows, right=["id", "ops"], stream=plain)
    assert plain.getvalue() == "id  inputs    ops\n 0  f32[?,?]    3\n12  bf16[?]    10\n"
    assert "f32[?,?]" in tty.getvalue() and "bf16[?]" in tty.getvalue()


def test_progress_is_plain_lines_off_a_terminal():
    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    plain = io.StringIO()
    with Status(plain) as status:
        status.update("warmup: 1 precompile calls")
        status.update("warmup: 2 precompile calls")
    assert plain.getvalue() == "warmup: 1 precompile calls\nwarmup: 2 precompile calls\n"
    with Status(Terminal()) as status:  # rich's live line; nothing to assert but that it works
        status.update("warmup: 1 precompile calls")


def test_warmup_progress_in_a_log_has_no_carriage_returns(capsys):
    code, out, err = run(capsys, "warmup", "examples/warmup_script.py", "--target", "h100")
    assert code == 0, err
    assert "\r" not in err and "\r" not in out
    assert [line for line in err.splitlines() if line.startswith("warmup: ")][-1].startswith(
        "warmup: 5 precompile calls, 5 kernels (5 compiled, 0 from the store)")
    assert "5 kernels compiled" in out


# ---- item 7: counts and labels ------------------------------------------------------------


def test_show_names_the_fusion_and_its_scheduler_once(capsys):
    fid = fill(define_pointwise())
    code, out, _ = run(capsys, "show", str(fid))
    assert code == 0
    assert f"def nvfuser_fusion_id{fid}(fd : FusionDefinition) -> None :" in out
    assert out.count("scheduler: pointwise") == 1 and "pointwise: pointwise" not in out
    for text in ["float32[64, 128] strides (128, 1)", "sm_90", "rank=2 vec=4", "pointwise_0",
                 "nvrtc 13.0", "42.0 ms", "hits 1", "2.0 KB", "Fusion IR" ]:  # fmt: skip
        assert (text in out) == (text != "Fusion IR"), text
    code, out, _ = run(capsys, "show", str(fid), "--ir")
    assert code == 0 and "Fusion IR:" in out and "T" in out
    assert out.count("scheduler: pointwise") == 1 and "pointwise: pointwise" not in out
    assert "analysis: pointwise takes it whole (loop rank 2" in out


def test_show_of_an_unknown_id_lists_the_stored_ones(capsys):
    fill()
    default_store().fusion_id_for("other", "[]", "")
    code, _, err = run(capsys, "show", "7")
    assert code == 1 and "no fusion 7" in err and "[0, 1]" in err


def test_binding_an_unknown_id_lists_the_ids_in_the_store():
    from fusion_cache import FusionCache, FusionDefinition

    define_pointwise()
    default_store().fusion_id_for("defined-by-another-process", "[]", "")
    FusionCache.reset()  # a new process: its trie knows no ids, the store knows 0 and 1
    define_pointwise()
    with pytest.raises(ValueError, match=r"ids in the store: \[0, 1\]"):
        FusionDefinition(7)


def test_empty_store_has_no_blob_bytes(capsys):
    code, out, _ = run(capsys, "stats", "--json")
    stats = json.loads(out)
    assert code == 0 and stats["kernels"] == 0 and stats["blob_bytes"] == 0
    fill()
    stats = json.loads(run(capsys, "stats", "--json")[1])
    assert 2000 <= stats["blob_bytes"] < 2000 + 100  # the cubin and its frame, not the index


def test_stats_after_prune_counts_no_links_to_pruned_kernels(capsys):
    fill()
    fill(key="other-kernel")
    assert json.loads(run(capsys, "stats", "--json")[1])["links"] == 2
    assert run(capsys, "prune", "--max-size", "0")[0] == 0
    stats = json.loads(run(capsys, "stats", "--json")[1])
    assert stats["kernels"] == 0 and stats["links"] == 0


def test_stats_verify_migrate(capsys):
    fill()
    code, out, _ = run(capsys, "stats")
    assert code == 0 and "schema_revision: 0002" in out
    code, out, _ = run(capsys, "verify")
    assert code == 0 and "1 kernels: 0 problems" in out
    code, out, _ = run(capsys, "migrate")
    assert code == 0 and "schema at 0002 (head 0002)" in out


def test_verify_reports_and_repairs(capsys, fresh_store):
    fill()
    with sqlite3.connect(fresh_store / "store.db") as db:
        db.execute("UPDATE fc_kernels SET sha256 = ?", ("0" * 64,))
    code, out, _ = run(capsys, "verify")
    assert code == 1 and "BAD" in out
    assert run(capsys, "verify", "--repair")[0] == 0
    assert run(capsys, "verify")[0] == 0


def test_prune_dry_run_lists_what_prune_removes(capsys):
    fill()
    fill(key="second-kernel")
    code, out, _ = run(capsys, "prune", "--max-size", "2KB", "--dry-run")
    assert code == 0 and out.count(f"would remove {KERN_KEY[:16]}") == 1
    assert "would remove 1 kernels (2.0 KB); would keep 1 (2.0 KB)" in out
    assert len(default_store().kernels()) == 2
    code, out, _ = run(capsys, "prune", "--max-age-days", "30")
    assert code == 0 and "removed 0 kernels" in out
    code, out, _ = run(capsys, "prune", "--max-size", "2KB")
    assert code == 0 and "removed 1 kernels (2.0 KB)" in out
    assert [k.key for k in default_store().kernels()] == ["second-kernel"]


def test_export_import_counts_only_new_entries(capsys, tmp_path, monkeypatch):
    fill()
    code, out, _ = run(capsys, "export", str(tmp_path / "b.zip"))
    assert code == 0 and "exported 3 entries" in out
    reset_default_store()
    monkeypatch.setenv("FUSION_CACHE_DIR", str(tmp_path / "other"))
    code, out, _ = run(capsys, "import", str(tmp_path / "b.zip"))
    assert code == 0
    assert "imported 3 new entries" in out and "(1 fusions, 1 plans, 1 kernels); 0 were already" in out
    code, out, _ = run(capsys, "import", str(tmp_path / "b.zip"))
    assert code == 0 and "imported 0 new entries" in out and "3 were already in the store" in out
    assert default_store().get_kernel(KERN_KEY) == b"\x7fELF" * 500


def test_import_of_junk_or_a_damaged_bundle(capsys, tmp_path):
    import zipfile

    (tmp_path / "junk").write_bytes(b"junk")
    code, _, err = run(capsys, "import", str(tmp_path / "junk"))
    assert code == 1 and "not a bundle" in err
    fill()
    run(capsys, "export", str(tmp_path / "b.zip"))
    with zipfile.ZipFile(tmp_path / "b.zip") as src, zipfile.ZipFile(tmp_path / "bad.zip", "w") as dst:
        for info in src.infolist():
            data = src.read(info)
            dst.writestr(info, data[:-1] + b"X" if info.filename.endswith(".cubin") else data)
    reset_default_store()
    code, out, err = run(capsys, "import", str(tmp_path / "bad.zip"))
    # all or nothing: one damaged cubin fails the whole import
    assert code == 1 and "fails its size or sha256" in err and "imported" not in out


def test_export_into_a_missing_directory_creates_nothing(capsys, tmp_path):
    code, _, err = run(capsys, "export", str(tmp_path / "no" / "dir" / "b.zip"))
    assert code == 2 and "no directory" in err
    assert not (tmp_path / "no").exists()
    code, _, err = run(capsys, "export", str(tmp_path))
    assert code == 2 and "is a directory" in err


@pytest.mark.parametrize("text,size", [("100", 100), ("2GB", 2 * 10**9), ("1.5M", 1_500_000),
                                       ("512MiB", 512 * 2**20), ("4kib", 4096)])
def test_parse_size(text, size):
    assert parse_size(text) == size


@pytest.mark.parametrize("text", ["lots", "-1", "-5GB", ""])
def test_parse_size_rejects_nonsense(text):
    with pytest.raises(argparse.ArgumentTypeError):
        parse_size(text)


@pytest.mark.postgres
def test_store_commands_on_postgres(capsys, monkeypatch, tmp_path, request):
    """The same counts through PostgreSQL: import twice, links after a prune, ls."""
    url = request.getfixturevalue("pg_url")  # skips without a server
    fill()
    assert run(capsys, "export", str(tmp_path / "b.zip"))[0] == 0
    reset_default_store()
    monkeypatch.setenv("FUSION_CACHE_DB_URL", url)
    code, out, err = run(capsys, "import", str(tmp_path / "b.zip"))
    assert code == 0 and "imported 3 new entries" in out, err
    code, out, _ = run(capsys, "import", str(tmp_path / "b.zip"))
    assert code == 0 and "imported 0 new entries" in out and "3 were already" in out
    code, out, _ = run(capsys, "ls")
    assert code == 0 and out.splitlines()[1].split()[:5] == ["0", "-", "0", "0", "1"]
    assert run(capsys, "prune", "--max-size", "0")[0] == 0
    stats = json.loads(run(capsys, "stats", "--json")[1])
    assert stats["kernels"] == 0 and stats["links"] == 0
