"""Records: one frozen value per frontend call, the unit of the FusionCache trie.

Note [Record identity]: a record is equal to another exactly when their canonical JSON
texts are equal. JSON keeps 1, 1.0 and true apart (Python's == does not), so a different
constant, dtype or flag always gives a different record and so a different fusion id.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any

from .dtypes import DataType


@dataclass(frozen=True)
class Ref:
    """A reference to a state of the definition: a tensor (T), scalar (S) or vector (V)."""

    kind: str
    index: int

    def __str__(self) -> str:
        return f"{self.kind}{self.index}"


def _encode(value: Any) -> Any:
    if isinstance(value, Ref):
        return {"$ref": f"{value.kind}{value.index}"}
    if isinstance(value, DataType):
        return {"$dtype": value.value}
    if isinstance(value, bool) or value is None or isinstance(value, (int, str)):
        return value
    if isinstance(value, float):
        if math.isnan(value) or math.isinf(value):
            return {"$float": repr(value)}
        return value
    if isinstance(value, complex):
        return {"$complex": [_encode(value.real), _encode(value.imag)]}
    if isinstance(value, (tuple, list)):
        return [_encode(v) for v in value]
    raise TypeError(f"cannot record a value of type {type(value).__name__}: {value!r}")


def _decode(value: Any) -> Any:
    if isinstance(value, list):
        return tuple(_decode(v) for v in value)
    if isinstance(value, dict):
        if "$ref" in value:
            text = value["$ref"]
            return Ref(text[0], int(text[1:]))
        if "$dtype" in value:
            return DataType(value["$dtype"])
        if "$float" in value:
            return float(value["$float"])
        if "$complex" in value:
            re, im = value["$complex"]
            return complex(_decode(re), _decode(im))
        raise ValueError(f"unknown encoded value {value!r}")
    return value


def freeze(value: Any) -> Any:
    """Lists become tuples, recursively, so records hash."""
    if type(value) is tuple:  # most records' arguments are frozen already: no copy
        for v in value:
            if isinstance(v, (list, tuple)):
                return tuple(freeze(v) for v in value)
        return value
    if isinstance(value, (list, tuple)):
        return tuple(freeze(v) for v in value)
    return value


@dataclass(frozen=True, eq=False)
class Record:
    """One step of a definition.

    kind: 'tensor', 'scalar', 'vector' (definitions), 'op' (fd.ops.<name>), 'output', 'end'.
    name: the op name for 'op' records; empty otherwise.
    args: positional arguments (Refs and literals); kwargs: ordered keyword arguments.
    outputs: the states this record creates.
    """

    kind: str
    name: str = ""
    args: tuple = ()
    kwargs: tuple[tuple[str, Any], ...] = ()
    outputs: tuple[Ref, ...] = ()
    _key: str = field(default="", repr=False, compare=False)  # made on first use

    def __post_init__(self) -> None:
        object.__setattr__(self, "args", freeze(self.args))
        object.__setattr__(self, "kwargs", tuple((k, freeze(v)) for k, v in self.kwargs))

    def kw(self, name: str, default: Any = None) -> Any:
        for key, value in self.kwargs:
            if key == name:
                return value
        return default

    def refs(self) -> list[Ref]:
        """Every state this record reads, in order."""
        found: list[Ref] = []

        def walk(v: Any) -> None:
            if isinstance(v, Ref):
                found.append(v)
            elif isinstance(v, tuple):
                for x in v:
                    walk(x)

        walk(self.args)
        walk(tuple(v for _, v in self.kwargs))
        return found

    def to_json(self) -> dict:
        return {
            "kind": self.kind,
            "name": self.name,
            "args": _encode(self.args),
            "kwargs": [[k, _encode(v)] for k, v in self.kwargs],
            "outputs": _encode(self.outputs),
        }

    @classmethod
    def from_json(cls, data: dict) -> Record:
        return cls(
            kind=data["kind"],
            name=data["name"],
            args=_decode(data["args"]),
            kwargs=tuple((k, _decode(v)) for k, v in data["kwargs"]),
            outputs=_decode(data["outputs"]),
        )

    @property
    def key(self) -> str:
        """The canonical JSON text (Note [Record identity]), made when first asked for: the
        records a segment's carving and the segmenter's trial groups make never enter the
        trie or the store (a tiny Llama's warm first step: 1847 of 4870 records keyed)."""
        key = self._key
        if not key:
            key = json.dumps(self.to_json(), separators=(",", ":"))
            object.__setattr__(self, "_key", key)
        return key

    def __eq__(self, other: object) -> bool:
        return self is other or (isinstance(other, Record) and self.key == other.key)

    def __hash__(self) -> int:
        return hash(self.key)


END = Record(kind="end")


def records_to_json(records: list[Record] | tuple[Record, ...]) -> str:
    # each record's key is its JSON text, made once when the record was: joined, they are the
    # list's text (a warm GPT-2's regions re-encoded every record of every definition for the
    # store's fusion ids: 1 s of a 7 s profiled first step, tiny and stubbed on the CPU)
    return "[" + ",".join(r.key for r in records) + "]"


def records_from_json(text: str) -> list[Record]:
    return [Record.from_json(d) for d in json.loads(text)]
