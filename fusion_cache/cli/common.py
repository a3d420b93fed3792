"""What every subcommand shares: exit codes, the one-line error, and the store it may use.

Note [Exit codes]
    0: done. 1: the command ran and found problems (a damaged kernel, a fusion not in the
    store, a bundle entry skipped, results that differ from torch). 2: it could not run:
    a usage error, or a store it cannot use. A command that exists to persist (warmup,
    import, export, prune, migrate, verify) refuses a store that degraded to memory, since
    it would keep nothing, unless told --allow-memory; one whose store degrades while it
    runs (a warning says so) ends with 1. Errors are one line on stderr; --debug adds the
    traceback.

Note [No torch in the CLI's modules]
    `fusion-cache --help`, ls, stats and show must answer in well under a second, and
    importing torch alone takes one to two. So the modules of this package import only
    the standard library at module level; the store (SQLAlchemy) is imported by the
    commands that open it, torch and the frontend only by those that define or compile
    fusions (demo, warmup, show --ir). tests/test_cli.py checks sys.modules after each.
"""
from __future__ import annotations

import argparse
import functools
import os
import sys
from collections.abc import Callable
from typing import Any

OK, PROBLEMS, UNAVAILABLE = 0, 1, 2
USAGE = UNAVAILABLE  # Note [Exit codes]: a usage error and an unusable store share 2

# category names of the warnings shown in this run, in order (main.one_line_warnings)
shown_warnings: list[str] = []


class CliError(Exception):
    """A failure the user can act on: printed as one line, the command exits with `code`."""

    def __init__(self, message: str, code: int = USAGE, prog: str | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.prog = prog  # the (sub)command's name when the parser raised it


def say(*lines: str) -> None:
    for line in lines:
        print(line, file=sys.stdout)


def note(line: str) -> None:
    """A remark on stderr that does not change the exit code."""
    print(f"fusion-cache: {line}", file=sys.stderr)


def non_negative(kind: Callable[[str], Any], what: str) -> Callable[[str], Any]:
    """An argparse type: `kind(text)`, refusing negative values and NaN."""

    def parse(text: str) -> Any:
        try:
            value = kind(text)
        except (TypeError, ValueError):
            raise argparse.ArgumentTypeError(f"not {what}: {text!r}") from None
        if value != value or value < 0:
            raise argparse.ArgumentTypeError(f"must be {what} >= 0, not {text!r}")
        return value

    return parse


def store_location() -> str:
    """Where the environment points the store, for messages."""
    url = os.environ.get("FUSION_CACHE_DB_URL")
    if url:
        from fusion_cache.store.engine import display_url

        return f"FUSION_CACHE_DB_URL={display_url(url)}"
    directory = os.environ.get("FUSION_CACHE_DIR")
    return f"FUSION_CACHE_DIR={directory}" if directory else "~/.cache/fusion_cache"


def open_store(args: argparse.Namespace, *, persist: bool) -> Any:
    """The process-wide store. One that degraded to memory is refused (exit 2), but for a
    persisting command run with --allow-memory (Note [Exit codes])."""
    import warnings

    from fusion_cache.store import StoreWarning, default_store

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", StoreWarning)  # said below, once, in our words
        store = default_store()
    if store.persistent:
        return store
    reason = getattr(store, "reason", None) or "FUSION_CACHE_DB_URL asks for an in-memory store"
    where = store_location()
    if persist and getattr(args, "allow_memory", False):
        note(f"cannot use the store ({where}): {reason}; --allow-memory: working in memory, "
             "nothing will be kept")  # fmt: skip
        return store
    hint = " (--allow-memory runs in memory anyway, keeping nothing)" if persist else ""
    raise CliError(f"cannot use the store ({where}): {reason}{hint}", UNAVAILABLE)


def persisting(command: Callable[[argparse.Namespace], int]) -> Callable[[argparse.Namespace], int]:
    """Note [Exit codes]: a store that degrades while a persisting command runs (a
    StoreWarning) leaves something unkept, so the command ends with 1."""

    @functools.wraps(command)
    def run(args: argparse.Namespace) -> int:
        before = shown_warnings.count("StoreWarning")
        code = command(args)
        if code == OK and shown_warnings.count("StoreWarning") > before:
            note("the store degraded during the command (see the warning above): "
                 "some entries were not kept")  # fmt: skip
            return PROBLEMS
        return code

    return run


def add_persist_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--allow-memory", action="store_true",
                        help="run even when the store cannot be used (nothing is kept)")  # fmt: skip
