"""The `fusion-cache` command: main.py parses and dispatches; one module per group of
subcommands (store_commands, warmup, demo)."""
from .main import build_parser, main

__all__ = ["build_parser", "main"]
