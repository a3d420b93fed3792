"""The target `precompile(target=None)` compiles for, which `fusion-cache warmup --target`
sets (the command itself lives in fusion_cache/cli/warmup.py)."""
from __future__ import annotations

import os

TARGET_ENV = "FUSION_CACHE_TARGET"


def default_target() -> str | None:
    """The target `precompile(target=None)` uses: --target of warmup, else the current GPU."""
    return os.environ.get(TARGET_ENV) or None
