"""The `fusion-cache` command."""
from __future__ import annotations

import argparse
import sys

from fusion_cache import __version__


def _demo(args: argparse.Namespace) -> int:
    from .demo import run_demo

    return run_demo(args.device)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="fusion-cache",
        description="Run nvFuser-style fusions as cached CUDA kernels; manage the kernel store.",
    )
    parser.add_argument("--version", action="version", version=f"fusion-cache {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    demo = sub.add_parser("demo", help="define, print, run and check a few fusions")
    demo.add_argument("--device", default=None, help="cpu or cuda (default: cuda if available)")
    demo.set_defaults(func=_demo)
    try:
        from .store_commands import register_commands
    except ImportError:
        pass
    else:
        register_commands(sub)
        from .describe import install

        install()
    try:
        from .warmup import register_warmup
    except ImportError:
        pass
    else:
        register_warmup(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
