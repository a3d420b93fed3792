"""The store's content keys: what a kernel key and a fusion key are the hash of.

Nothing read from disk or from a bundle is trusted beyond these (DESIGN.md, The store): a
bundle's kernel key must be the key of the source, options and arch it carries, and its
fusion key the hash of its records (the frontend computes that one: trie.definition_key).

Note [Kernel key]: the key hashes a format version, the generated source, the NVRTC options
and the target arch. The NVRTC version is recorded with the cubin but kept out of the key,
so a store filled on a CPU machine (NVRTC from pip) serves GPU nodes whose NVRTC differs; a
cubin that fails to load there is treated as a miss and compiled locally.
"""
from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence

KERNEL_FORMAT = "fc-kernel-1"


def kernel_key(source: str, options: Sequence[str], arch: int) -> str:
    parts = [KERNEL_FORMAT, str(arch), json.dumps(list(options)), source]
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()
