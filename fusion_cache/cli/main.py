"""The `fusion-cache` command: parse, dispatch, and turn every failure into one line and
an exit code (Note [Exit codes] in common.py)."""
from __future__ import annotations

import argparse
import re
import sys
import traceback
import warnings
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

from fusion_cache import __version__  # the package root imports nothing heavy (PEP 562)

from . import store_commands, warmup
from .common import PROBLEMS, USAGE, CliError, shown_warnings


class Parser(argparse.ArgumentParser):
    """argparse, with a usage error raised as one CliError line instead of usage + exit, and
    no abbreviated options (a script's --max-age would break when a --max-age-x came)."""

    def __init__(self, *args, **kwargs) -> None:
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> None:  # type: ignore[override]
        raise CliError(f"{message} (see `{self.prog} --help`)", USAGE, prog=self.prog)


def _demo(args: argparse.Namespace) -> int:
    from .demo import run_demo  # torch and the frontend: only when the demo runs

    return run_demo(args.device)


def _device(text: str) -> str:
    if not re.fullmatch(r"cpu|cuda(:\d+)?", text):
        raise argparse.ArgumentTypeError(f"not a device: {text!r} (cpu, cuda or cuda:N)")
    return text


def build_parser() -> Parser:
    parser = Parser(
        prog="fusion-cache",
        description="Run nvFuser-style fusions as cached CUDA kernels; manage the kernel store.",
        epilog="Exit codes: 0 done, 1 problems found, 2 usage error or store unavailable. "
        "The store is FUSION_CACHE_DB_URL, else SQLite in FUSION_CACHE_DIR "
        "(default ~/.cache/fusion_cache).",
    )
    parser.add_argument("--version", action="version", version=f"fusion-cache {__version__}")
    parser.add_argument("--debug", action="store_true", help="show tracebacks")
    common = argparse.ArgumentParser(add_help=False)
    # after the command too; SUPPRESS keeps it from resetting a --debug given before it
    common.add_argument("--debug", action="store_true", default=argparse.SUPPRESS,
                        help="show tracebacks")  # fmt: skip
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=Parser)
    demo = sub.add_parser("demo", parents=[common], help="define, print, run and check a few fusions",
                          description="Define a few fusions, print their definitions and Fusion "
                          "IR, run them and check the results against torch.")  # fmt: skip
    demo.add_argument("--device", type=_device, default=None,
                      help="cpu, cuda or cuda:N (default: cuda if available)")  # fmt: skip
    demo.set_defaults(func=_demo)
    warmup.register(sub, common)
    store_commands.register(sub, common)
    return parser


@contextmanager
def one_line_warnings() -> Iterator[None]:
    """Warnings as one line each on stderr (not Python's two, with a source line), and
    counted by category for common.persisting."""

    def show(message, category, filename, lineno, file=None, line=None) -> None:
        shown_warnings.append(category.__name__)
        text = str(message).strip().splitlines() or [category.__name__]
        print(f"fusion-cache: warning: {text[0]}", file=sys.stderr)

    with warnings.catch_warnings():
        warnings.simplefilter("default")
        warnings.showwarning = show
        yield


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in argv
    command = None
    with one_line_warnings():
        try:
            parser = build_parser()
            args = parser.parse_args(argv)
            command = args.command
            if not getattr(args, "func", None):
                parser.print_help(sys.stderr)
                return USAGE
            return int(args.func(args) or 0)
        except SystemExit as done:  # --help, --version; a warmup script's sys.exit
            return done.code if isinstance(done.code, int) else (0 if done.code is None else 1)
        except CliError as err:
            if debug:
                traceback.print_exception(err.__cause__ or err)
            prog = err.prog or (f"fusion-cache {command}" if command else "fusion-cache")
            print(f"{prog}: {err}", file=sys.stderr)
            return err.code
        except KeyboardInterrupt:
            print("fusion-cache: interrupted", file=sys.stderr)
            return 130
        except Exception as err:
            if debug:
                raise
            first = str(err).strip().splitlines()[:1]
            print(f"fusion-cache: {type(err).__name__}{': ' + first[0] if first else ''} "
                  "(--debug shows the traceback)", file=sys.stderr)  # fmt: skip
            return PROBLEMS


if __name__ == "__main__":
    sys.exit(main())
