"""A hash of a part of this build's sources: what a stored result names so that a build
whose code for it changed does not take it (the AOT cache's backend tag, the stored
segmentations' version)."""
from __future__ import annotations

import hashlib
from pathlib import Path


def sources_digest(root: Path, patterns: tuple[str, ...]) -> str:
    """sha256 hex of the files under `root` matching the glob `patterns`, each by its path
    relative to `root` and its bytes, in sorted order."""
    digest = hashlib.sha256()
    for path in sorted({p for pattern in patterns for p in root.glob(pattern)}):
        digest.update(path.relative_to(root).as_posix().encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()
