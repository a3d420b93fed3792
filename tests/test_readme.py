"""The README as a newcomer uses it: every ```python block runs as written, on its own (as a
reader pastes it), in a fresh process with a fresh FUSION_CACHE_DIR; every `fusion-cache ...`
command, in a ```bash block or an inline `code` span, names a real subcommand with flags the
CLI accepts (parsed by the CLI's own parser; nothing runs). In a command, an UPPERCASE word
(SCRIPT.py too) is a placeholder, [--flag] an optional part and a|b a choice (the first is
parsed)."""
from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from fusion_cache.cli.common import CliError
from fusion_cache.cli.main import build_parser

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
BLOCK = re.compile(r"^```(\w*)[^\n]*\n(.*?)^```", re.M | re.S)
SPAN = re.compile(r"(?<!`)`([^`\n]*fusion-cache [^`\n]*)`(?!`)")


def blocks(language: str) -> list[tuple[int, str]]:
    """(line number, text) of each fenced block in that language."""
    text = README.read_text()
    return [(text[:m.start()].count("\n") + 1, m.group(2)) for m in BLOCK.finditer(text)
            if m.group(1) == language]  # fmt: skip


def cli_commands(block: str) -> list[list[str]]:
    """The argument lists of every `fusion-cache` (or `.venv/bin/fusion-cache`) call in shell
    text: pipelines and chains split, comments dropped."""
    found = []
    for line in block.splitlines():
        line = line.split(" #", 1)[0].strip()
        if line.startswith("#"):
            continue
        for part in re.split(r"&&|\|\||;|\s\|\s", line):
            words = shlex.split(part)
            if words and words[0].endswith("fusion-cache"):
                found.append(words[1:])
    return found


def inline_commands(text: str) -> list[tuple[int, list[str]]]:
    """(line, arguments) of each inline `fusion-cache ...` code span."""
    return [(text[:m.start()].count("\n") + 1, shlex.split(m.group(1))[1:])
            for m in SPAN.finditer(text) if m.group(1).startswith("fusion-cache ")]  # fmt: skip


def as_parsed(words: list[str]) -> list[str]:
    """Placeholders become a value every argument type takes; [--opt] becomes --opt; a
    choice a|b becomes a."""
    out = []
    for w in words:
        w = w.strip("[]").split("|")[0]
        out.append("0" if re.fullmatch(r"[A-Z][A-Z_]*(\.\w+)?", w) else w)
    return out


PYTHON_BLOCKS = blocks("python")
CLI_LINES = [(line, words) for line, block in blocks("bash") for words in cli_commands(block)]
CLI_LINES += inline_commands(README.read_text())


def test_the_readme_has_snippets_and_commands():
    assert PYTHON_BLOCKS and CLI_LINES
    named = {words[0] for _, words in CLI_LINES if words}
    # the CLI reference names every command a newcomer needs
    assert {"demo", "warmup", "ls", "show", "stats", "verify", "prune", "export", "import",
            "migrate"} <= named, named  # fmt: skip


@pytest.mark.parametrize("line,code", PYTHON_BLOCKS, ids=[f"line {n}" for n, _ in PYTHON_BLOCKS])
def test_python_snippet_runs_as_written(line, code, tmp_path):
    env = dict(os.environ, FUSION_CACHE_DIR=str(tmp_path / "fusion_cache"))
    env.pop("FUSION_CACHE_DB_URL", None)
    env.pop("FUSION_CACHE_DISABLE_FALLBACK", None)  # as a newcomer's shell has it
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=tmp_path, env=env, timeout=300)  # fmt: skip
    assert done.returncode == 0, f"README.md line {line}:\n{code}\n{done.stderr[-3000:]}"
    assert "Traceback" not in done.stderr and "Failed to initialize NumPy" not in done.stderr


@pytest.mark.parametrize("line,words", CLI_LINES,
                         ids=[" ".join(w) or "(none)" for _, w in CLI_LINES])  # fmt: skip
def test_cli_line_names_a_real_command_with_valid_flags(line, words):
    try:
        args = build_parser().parse_args(as_parsed(words))
    except CliError as err:
        pytest.fail(f"README.md line {line}: fusion-cache {' '.join(words)}: {err}")
    assert args.command, f"README.md line {line}: `fusion-cache {' '.join(words)}` names no command"


def test_the_checks_catch_what_they_should():
    """The extraction sees pipelines and chained commands; the parser refuses bad flags."""
    assert cli_commands("fusion-cache ls | show FID ; .venv/bin/fusion-cache demo  # try it") == [
        ["ls"], ["demo"]]
    assert inline_commands("- `fusion-cache show FID [--ir]`: one; `fusion-cache-x` no") == [
        (1, ["show", "FID", "[--ir]"])]
    assert as_parsed(["demo", "[--device", "cpu|cuda]", "SCRIPT.py"]) == [
        "demo", "--device", "cpu", "0"]
    for bad in (["nosuch"], ["prune", "--max-age", "3"], ["prune", "--max-age-days", "-1"]):
        with pytest.raises(CliError):
            build_parser().parse_args(as_parsed(bad))
    assert build_parser().parse_args(as_parsed(["verify", "[--repair]"])).repair


def test_precompile_and_segment_errors_name_the_call():
    """The README's old precompile line, given one input for a fusion of three, failed with
    an error that began 'execute:'."""
    import torch

    from fusion_cache import DataType, FusionDefinition

    with FusionDefinition() as fd:
        t0 = fd.define_tensor(shape=[-1, -1], contiguity=[True, True], dtype=DataType.Float)
        t1 = fd.define_tensor(shape=[-1, -1], contiguity=[True, True], dtype=DataType.Float)
        fd.add_output(fd.ops.add(t0, t1))
    inputs = [torch.empty(4, 8, device="meta")]
    with pytest.raises(ValueError, match=r"^precompile: fusion \d+ expects 2 inputs"):
        fd.precompile(inputs, target="h100")
    with pytest.raises(ValueError, match=r"^segment: fusion \d+ expects 2 inputs"):
        fd.segment(inputs, target="h100")
    with pytest.raises(ValueError, match=r"^execute: fusion \d+ expects 2 inputs"):
        fd.execute([torch.ones(4, 8)])
