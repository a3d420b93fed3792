"""The Store interface, and what every implementation shares (compile_once, bundles, warnings).

Two implementations: SqlStore (SQLite or PostgreSQL plus the diskcache tier; persistent) and
MemoryStore (dicts; what a process gets when the persistent store is unusable). They have the
same semantics, so the runtime never asks which one it holds.

Note [Degrade, never crash]
    An unusable store at open time becomes a MemoryStore after one warning (factory.py).
    An error in one operation on an open store (disk full, a lock held too long, the server
    gone) warns once per store, keeps that entry in memory, and returns as if it had
    worked; a failed read is a miss. Callers never see a store exception: the worst case is
    compiling again.
"""
from __future__ import annotations

import logging
import os
import warnings
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import TYPE_CHECKING

from .entries import (
    FusionEntry,
    KernelEntry,
    KernelMeta,
    PlanEntry,
    PruneReport,
    StoreWarning,
    VerifyReport,
)

if TYPE_CHECKING:
    from .bundle import BundleContents

log = logging.getLogger("fusion_cache.store")

CompileFn = Callable[[], tuple[bytes, KernelMeta]]


class Store(ABC):
    url: str
    persistent: bool

    def __init__(self) -> None:
        self._warned = False

    # Level 1: definitions -> fusion ids
    @abstractmethod
    def fusion_id_for(self, definition_key: str, records_json: str, python_definition: str) -> int:
        """Get or create the id of a definition: the same key gets the same id in every
        process sharing the store; ids are dense from 0 and never reused."""

    @abstractmethod
    def fusion_by_id(self, fid: int) -> FusionEntry | None: ...

    @abstractmethod
    def fusions(self) -> list[FusionEntry]: ...

    # Level 2: (fusion, signature, target) -> plan
    @abstractmethod
    def get_plan(self, fusion_id: int, signature_key: str, target: str) -> str | None: ...

    @abstractmethod
    def put_plan(self, fusion_id: int, signature_key: str, target: str, plan_json: str) -> None:
        """Idempotent; a different plan for the same key replaces the old one."""

    @abstractmethod
    def plans_for(self, fusion_id: int) -> list[PlanEntry]: ...

    # Level 3: kernel key -> cubin
    @abstractmethod
    def get_kernel(self, key: str) -> bytes | None:
        """The verified cubin, or None. A damaged entry is a miss and is removed."""

    @abstractmethod
    def kernel_bytes(self, key: str) -> bytes | None:
        """Like get_kernel without counting a hit (export, tools)."""

    @abstractmethod
    def put_kernel(self, key: str, cubin: bytes, meta: KernelMeta) -> None: ...

    @abstractmethod
    def kernel_meta(self, key: str) -> KernelEntry | None: ...

    @abstractmethod
    def kernels(self, fusion_id: int | None = None) -> list[KernelEntry]: ...

    @abstractmethod
    def link_kernel(self, fusion_id: int, key: str) -> None: ...

    @abstractmethod
    def links(self) -> list[tuple[int, str]]:
        """Every (fusion id, kernel key) link, whether or not the kernel is stored."""

    # Maintenance
    @abstractmethod
    def verify(self, repair: bool = False) -> VerifyReport: ...

    @abstractmethod
    def prune(
        self, max_age_days: float | None = None, max_bytes: int | None = None
    ) -> PruneReport: ...

    @abstractmethod
    def stats(self) -> dict: ...

    @abstractmethod
    def close(self) -> None: ...

    @abstractmethod
    def _kernel_lock(self, key: str, timeout_s: float) -> AbstractContextManager[bool | None]:
        """Exclusive per-key lock across the processes that share this store; yields True
        when held, False when it stayed held past timeout_s, None where there is none."""

    def compile_once(
        self, key: str, compile_fn: CompileFn, timeout_s: float = 600
    ) -> tuple[bytes, bool]:
        """(cubin, compiled_here): one process compiles a missing kernel, the others wait
        for it and load what it stored. A lock held past timeout_s is ignored (with a
        warning) rather than waited on: compiling twice beats hanging."""
        cubin = self.get_kernel(key)
        if cubin is not None:
            return cubin, False
        with self._kernel_lock(key, timeout_s) as held:
            if held:
                cubin = self.get_kernel(key)
                if cubin is not None:
                    return cubin, False
            elif held is False:
                self._warn_once(
                    "compile_once", TimeoutError(f"kernel lock held over {timeout_s:g} s"),
                    then="compiling here as well",
                )
            cubin, meta = compile_fn()  # compile errors are the caller's: let them through
            self.put_kernel(key, cubin, meta)
            return cubin, True

    def export_bundle(self, path: str | os.PathLike) -> int:
        """Write fusions, plans, kernels and links to a portable zip; returns entries written."""
        from .bundle import export_bundle

        return export_bundle(self, path)

    def import_bundle(self, path: str | os.PathLike) -> int:
        """Merge a bundle in, all or nothing (fusion ids remapped by definition key); returns
        entries taken. Raises BundleError for a bundle that fails a check (Note [Bundle
        trust] in bundle.py) or a store that fails while taking it."""
        from .bundle import import_bundle

        return import_bundle(self, path)

    @abstractmethod
    def import_entries(self, bundle: BundleContents) -> int:
        """Take a checked bundle in one transaction: every entry or none. Raises BundleError
        (a cubin fails its check) or BundleImportError (the store failed)."""

    def _warn_once(self, op: str, err: BaseException,
                   then: str = "keeping the affected entries in memory for this process and "
                               "continuing") -> None:  # fmt: skip
        if self._warned:
            log.debug("fusion-cache store %s: %s failed again: %r", self.url, op, err)
            return
        self._warned = True
        warnings.warn(
            f"fusion-cache store {self.url}: {op} failed ({type(err).__name__}: {err}); {then}",
            StoreWarning,
            stacklevel=4,
        )

    @contextmanager
    def writes_together(self) -> Iterator[None]:
        """Within it, a store may hold plans and links back and write them in one
        transaction at its end (Note [Writes together] in sql_store.py)."""
        yield

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.url!r})"


def iter_chunks(items: list, size: int) -> Iterator[list]:
    for i in range(0, len(items), size):
        yield items[i:i + size]
