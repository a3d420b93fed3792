"""`fusion-cache warmup SCRIPT.py [--target h100]`: run a script of definitions and
`precompile` calls so a store is filled ahead of time, on a machine with or without a GPU.
The script, the target and the store are checked before anything runs."""
from __future__ import annotations

import argparse
import os
import runpy
import sys
import time
from pathlib import Path

from .common import (
    OK,
    PROBLEMS,
    USAGE,
    CliError,
    add_persist_options,
    open_store,
    persisting,
    say,
)
from .output import Status


def register(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    about = "run a script of definitions and precompile calls, filling the store"
    p = sub.add_parser("warmup", parents=[common], help=about, description=about)
    p.add_argument("script", help="a Python script that defines fusions and calls fd.precompile")
    p.add_argument("--target", default=None,
                   help="GPU to compile for (h100, h200, a100, ...; default: this machine's GPU, "
                        "or FUSION_CACHE_TARGET)")  # fmt: skip
    add_persist_options(p)
    p.set_defaults(func=cmd_warmup)


@persisting
def cmd_warmup(args: argparse.Namespace) -> int:
    if not Path(args.script).is_file():
        raise CliError(f"no such script: {args.script}", USAGE)
    target = check_target(args.target)
    open_store(args, persist=True)
    return run_warmup(args.script, target)


def check_target(target: str | None) -> str | None:
    """The profile name to compile for, or None for this machine's GPU; a CliError naming
    the known profiles for an unknown name, or when there is neither a name nor a GPU."""
    from schedulers.device import KNOWN_PROFILES, TARGET_ENV, current_profile, profile_by_name

    known = ", ".join(sorted(KNOWN_PROFILES))
    named = target or os.environ.get(TARGET_ENV)
    if named:
        try:
            profile_by_name(named)
        except ValueError:
            where = "--target" if target else TARGET_ENV
            raise CliError(f"{where}: unknown GPU {named!r}; known: {known}", USAGE) from None
        return named
    try:
        current_profile()
    except Exception as err:  # no driver, no device: the same answer (--debug: which)
        raise CliError(f"no GPU on this machine: name the GPU to compile for with --target "
                       f"({known})", USAGE) from err  # fmt: skip
    return None


def run_warmup(script: str, target: str | None) -> int:
    from fusion_cache.frontend.trie import FusionCache
    from fusion_cache.runtime.precompile import LISTENERS
    from schedulers.device import TARGET_ENV

    cache = FusionCache.get()
    calls = kernels = 0
    start = time.perf_counter()

    def counted(refs: list) -> None:
        nonlocal calls, kernels
        calls += 1
        kernels += len(refs)
        stats = cache.stats()
        status.update(f"warmup: {calls} precompile calls, {kernels} kernels "
                      f"({stats['kernels_compiled']} compiled, {stats['kernels_loaded']} from the store) "
                      f"{time.perf_counter() - start:.1f}s")  # fmt: skip

    saved_env, saved_argv = os.environ.get(TARGET_ENV), sys.argv
    if target:
        os.environ[TARGET_ENV] = target
    sys.argv = [script]
    LISTENERS.append(counted)
    try:
        with Status() as status:
            runpy.run_path(script, run_name="__main__")
    except SystemExit as done:
        if done.code not in (None, 0):
            raise CliError(f"{script} exited with {done.code}", PROBLEMS) from None
    except Exception as err:
        raise CliError(f"{script} failed: {type(err).__name__}: {err} (--debug shows where)",
                       PROBLEMS) from err  # fmt: skip
    finally:
        LISTENERS.remove(counted)
        sys.argv = saved_argv
        if saved_env is None:
            os.environ.pop(TARGET_ENV, None)
        else:
            os.environ[TARGET_ENV] = saved_env
    stats = cache.stats()
    say(f"warmup done: {calls} precompile calls, {stats['num_fusions']} fusions, "
        f"{stats['kernels_compiled']} kernels compiled, {stats['kernels_loaded']} already stored; "
        f"store {cache.store.url}")  # fmt: skip
    return OK
