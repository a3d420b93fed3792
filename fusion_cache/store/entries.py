"""Value types the store hands out: frozen, comparable, with short reprs.

Long text (sources, JSON, Python definitions) stays out of the reprs so that a list of
entries prints as one readable line each.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field

# The largest cubin the store takes from a file it did not just write (the blob tier, a
# bundle): real ones are kilobytes to a few megabytes.
MAX_CUBIN_BYTES = 256 << 20


class StoreWarning(UserWarning):
    """The store degraded (in-memory for the process, or for one entry) instead of failing."""


class StoreError(Exception):
    """A store could not be opened; open_store turns this into a MemoryStore and a warning."""


class NewerSchemaError(StoreError):
    """The database was migrated by a newer fusion-cache than this one."""


@dataclass(frozen=True)
class KernelMeta:
    """What produced a cubin; everything a user needs to reproduce or explain it."""

    kernel_name: str
    arch: int
    nvrtc_version: str
    options: tuple[str, ...]
    source: str = field(repr=False)
    scheduler: str = ""
    params_json: str = "{}"
    compile_ms: float = 0.0

    def to_json(self) -> dict:
        return {
            "kernel_name": self.kernel_name,
            "arch": self.arch,
            "nvrtc_version": self.nvrtc_version,
            "options": list(self.options),
            "source": self.source,
            "scheduler": self.scheduler,
            "params_json": self.params_json,
            "compile_ms": self.compile_ms,
        }

    @classmethod
    def from_json(cls, d: dict) -> KernelMeta:
        return cls(
            kernel_name=str(d["kernel_name"]),
            arch=int(d["arch"]),
            nvrtc_version=str(d["nvrtc_version"]),
            options=tuple(str(o) for o in d["options"]),
            source=str(d["source"]),
            scheduler=str(d.get("scheduler", "")),
            params_json=str(d.get("params_json", "{}")),
            compile_ms=float(d.get("compile_ms", 0.0)),
        )


def options_to_json(options: tuple[str, ...]) -> str:
    return json.dumps(list(options))


def options_from_json(text: str) -> tuple[str, ...]:
    return tuple(json.loads(text))


@dataclass(frozen=True)
class FusionEntry:
    id: int
    definition_key: str
    records_json: str = field(repr=False)
    python_definition: str = field(repr=False)
    created_at: float


@dataclass(frozen=True)
class PlanEntry:
    fusion_id: int
    signature_key: str
    target: str
    plan_json: str = field(repr=False)
    created_at: float = 0.0


@dataclass(frozen=True)
class KernelEntry:
    """A stored kernel's metadata (not its bytes): KernelMeta's fields plus bookkeeping."""

    key: str
    kernel_name: str
    arch: int
    nvrtc_version: str
    options: tuple[str, ...]
    source: str = field(repr=False)
    scheduler: str = ""
    params_json: str = "{}"
    compile_ms: float = 0.0
    sha256: str = ""
    size: int = 0
    hits: int = 0
    created_at: float = 0.0
    last_used: float = 0.0

    @property
    def meta(self) -> KernelMeta:
        return KernelMeta(
            kernel_name=self.kernel_name,
            arch=self.arch,
            nvrtc_version=self.nvrtc_version,
            options=self.options,
            source=self.source,
            scheduler=self.scheduler,
            params_json=self.params_json,
            compile_ms=self.compile_ms,
        )


@dataclass(frozen=True)
class BadEntry:
    """One problem verify() found: `where` is 'db', 'blobs' or 'schema'."""

    key: str
    where: str
    reason: str


@dataclass(frozen=True)
class VerifyReport:
    """checked: kernels looked at; repaired: repairs made and confirmed (never those only
    tried); unusable: why the persistent store that was asked for could not be opened, so
    that only this process's in-memory stand-in was checked (ok then says nothing about the
    store: the CLI refuses such a store unless told --allow-memory)."""

    checked: int
    bad: tuple[BadEntry, ...] = ()
    repaired: int = 0
    unusable: str | None = None

    @property
    def ok(self) -> bool:
        """No problem among what was checked."""
        return not self.bad


@dataclass(frozen=True)
class PruneReport:
    removed: int
    freed_bytes: int
    kept: int
    kept_bytes: int


def check_kernel_args(key: str, cubin: bytes, meta: KernelMeta) -> None:
    """Caller mistakes raise (they are bugs, not store trouble)."""
    if not isinstance(key, str) or not key:
        raise TypeError(f"kernel key must be a non-empty str, not {key!r}")
    if not isinstance(cubin, (bytes, bytearray, memoryview)):
        raise TypeError(f"cubin must be bytes, not {type(cubin).__name__}")
    if not isinstance(meta, KernelMeta):
        raise TypeError(f"meta must be a KernelMeta, not {type(meta).__name__}")


def kernel_entry(key: str, cubin: bytes, meta: KernelMeta, now: float) -> KernelEntry:
    return KernelEntry(
        key=key,
        kernel_name=meta.kernel_name,
        arch=meta.arch,
        nvrtc_version=meta.nvrtc_version,
        options=tuple(meta.options),
        source=meta.source,
        scheduler=meta.scheduler,
        params_json=meta.params_json,
        compile_ms=meta.compile_ms,
        sha256=hashlib.sha256(cubin).hexdigest(),
        size=len(cubin),
        hits=0,
        created_at=now,
        last_used=now,
    )


def choose_prunable(
    entries: list[KernelEntry],
    max_age_days: float | None,
    max_bytes: int | None,
    now: float,
) -> list[KernelEntry]:
    """Entries to drop, least recently used first: all older than max_age_days, then the
    oldest of the rest until the remainder fits in max_bytes. `entries` is sorted by
    last_used, oldest first."""
    doomed: list[KernelEntry] = []
    rest: list[KernelEntry] = []
    cutoff = None if max_age_days is None else now - max_age_days * 86400.0
    for e in entries:
        (doomed if cutoff is not None and e.last_used < cutoff else rest).append(e)
    if max_bytes is not None:
        total = sum(e.size for e in rest)
        for e in rest:
            if total <= max_bytes:
                break
            doomed.append(e)
            total -= e.size
    return doomed
