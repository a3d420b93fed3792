"""The interpreter of a definition's records with torch ops: the semantics every other stage
must reproduce. The reference evaluator runs it on real tensors (CPU inputs, fallback, the
tests' oracle); the shape analysis runs it on meta tensors for ops it does not shape itself.

Each op's rule lives in the module of its family (elementwise, reductions, normalization,
shape, resize, creation), registered with `@rule(name)`; `evaluate` walks the records. It
checks at run time what the definition left symbolic (sizes of non-broadcast dims that must
agree, squeezed dims that must be 1).
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from fusion_cache.frontend.records import Record, Ref

Env = dict[int, Any]
Rule = Callable[["Interpreter", Record], list]
RULES: dict[str, Rule] = {}  # op name -> rule; elementwise ops use ELEMENTWISE


def rule(*names: str) -> Callable[[Rule], Rule]:
    def register(fn: Rule) -> Rule:
        for name in names:
            RULES[name] = fn
        return fn

    return register


class Interpreter:
    def __init__(self, records: Sequence[Record], infos: list, device: torch.device) -> None:
        self.records, self.infos, self.device = records, infos, device
        self.env: Env = {}

    def get(self, v: Any) -> Any:
        if isinstance(v, Ref):
            return self.env[v.index]
        if isinstance(v, tuple):
            return tuple(self.get(x) for x in v)
        return v

    def sizes(self, value: Any) -> list[int]:
        """A shape argument (a Vector or a list of ints and scalars) as ints."""
        return [int(v) for v in self.get(value)]


def device_of(values: Sequence[Any]) -> torch.device:
    for v in values:
        if isinstance(v, torch.Tensor) and not (v.device.type == "cpu" and v.dim() == 0):
            return v.device
    return torch.device("cpu")


def evaluate(records: Sequence[Record], infos: list, input_refs: Sequence[Ref],
             values: Sequence[Any], device: torch.device | None = None) -> Env:  # fmt: skip
    """Run every record; returns the environment of state index -> value. `device`: where
    tensors made from scalars go (default: the inputs' device, else the CPU)."""
    run = Interpreter(records, infos, device_of(values) if device is None else device)
    for ref, v in zip(input_refs, values):
        run.env[ref.index] = v
    for r in records:
        if r.kind == "scalar" and not r.kw("is_input"):
            run.env[r.outputs[0].index] = r.kw("value")
        elif r.kind == "vector" and not r.kw("is_input"):
            run.env[r.outputs[0].index] = tuple(int(run.get(e)) for e in r.kw("elements"))
        elif r.kind == "op":
            impl = RULES.get(r.name) or RULES["<elementwise>"]
            for ref, value in zip(r.outputs, impl(run, r)):
                run.env[ref.index] = value
    return run.env
