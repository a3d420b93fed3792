"""The CPUs this process may use, and the settings that name a number of workers."""
from __future__ import annotations

import os


def usable_cpus() -> int:
    """The CPUs this process may run on: its affinity where the platform tells it."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def env_count(name: str) -> int | None:
    """The whole number environment variable `name` holds; None where it is unset or empty. Any
    other value raises ValueError naming the variable: a typo must not quietly mean the default."""
    text = os.environ.get(name, "").strip()
    if not text:
        return None
    if not text.isdigit():
        raise ValueError(f"{name}={text!r}: expected a whole number from 0")
    return int(text)
