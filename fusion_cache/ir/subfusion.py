"""Sub-fusions: the part of a definition one segment runs, as a definition of its own.

Note [Segment index space]: every definition numbers its states (tensors, scalars, vectors)
in creation order. A segment is a definition too, so it has its own numbering; its
`index_map` sends each of its inputs and outputs to the state of the original definition
it stands for. The original definition then acts as the argument manager: it feeds each
segment the values its map names and files the segment's outputs under theirs.

What a segment holds, for a group of the original's tensor ops:
- inputs: every tensor (or input scalar/vector) the group reads but does not compute, in
  the original's state order. An original input keeps its definition; an intermediate
  becomes a fresh dense tensor input (broadcast dims stay broadcast), in the layout its
  producer writes it in (`FusionGraph.order_of`).
- constants and scalar arithmetic (sizes, reshape vectors) are copied into every segment
  that reads them: they cost nothing and a kernel cannot hand a scalar to another kernel.
- outputs: the group's values that another group or the caller needs.
"""
from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from fusion_cache.frontend.definition import _CLOSED, FusionDefinition
from fusion_cache.frontend.layout import allocation_order
from fusion_cache.frontend.records import Record, Ref
from fusion_cache.frontend.replay import replay_records
from fusion_cache.frontend.values import TensorInfo

from .output_layout import output_stride_orders, preferred_order


class ScratchDefinition(FusionDefinition):
    """A definition built only to be analysed (the segmenter's trial groups): it never
    enters the trie or the store, so trying many groups leaves no trace."""

    def _advance(self, record: Record) -> None:
        return None

    def _finalize_definition(self) -> None:
        self._state = _CLOSED


@dataclass(frozen=True)
class SubFusion:
    records: tuple[Record, ...]  # in the segment's own index space
    index_map: dict  # segment state index -> original state index (inputs and outputs)
    inputs: tuple[int, ...]  # original states, in the segment's input order
    outputs: tuple[int, ...]  # original states the segment returns, in order
    aliased: tuple[int, ...]  # original states written into an input in place

    def build(self, scratch: bool = False) -> FusionDefinition:
        fd = ScratchDefinition() if scratch else FusionDefinition()
        fd._counted = False  # a segment: not among the user's fusions (num_fusions)
        with fd:
            replay_records(fd, self.records)
        return fd


def stand_ins(fd: FusionDefinition, values: Sequence[Any], env: dict) -> dict[int, Any]:
    """What a segment's planner sees for each state: the fusion's own input, or for a tensor
    an op computes a meta tensor of its run-time shape (fresh outputs are contiguous)."""
    import torch

    from fusion_cache.frontend.dtypes import to_torch

    out = dict(zip((ref.index for ref in fd.input_refs()), values))
    made = {o.index for r in fd._records if r.kind == "op" for o in r.outputs}
    for v, shape in env.items():
        if v in made and isinstance(shape, tuple) and isinstance(fd._infos[v], TensorInfo):
            out[v] = torch.empty(shape, dtype=to_torch(fd._infos[v].dtype), device="meta")
    return out


def is_tensor_op(fd: FusionDefinition, record: Record) -> bool:
    return record.kind == "op" and any(
        isinstance(fd._infos[o.index], TensorInfo) for o in record.outputs
    )


class FusionGraph:
    """Who produces and who needs each state of a definition, at the level of its tensor
    ops (the units the segmenter groups); scalar work is folded into its readers."""

    def __init__(self, fd: FusionDefinition) -> None:
        self.fd = fd
        records = fd._records
        self.producer = {o.index: pos for pos, r in enumerate(records) for o in r.outputs}
        self.ops = [pos for pos, r in enumerate(records) if is_tensor_op(fd, r)]
        self.output_records = [r for r in records if r.kind == "output"]
        # per tensor op: the tensors/input states it needs and the scalar records it copies
        self.needs: dict[int, set[int]] = {}
        self.copies: dict[int, set[int]] = {}
        for pos in self.ops:
            self.needs[pos], self.copies[pos] = self._closure(records[pos].refs())
        self.consumers: dict[int, set[int]] = {}
        for pos, needed in self.needs.items():
            for v in needed:
                self.consumers.setdefault(v, set()).add(pos)
        self.final = {r.args[0].index for r in self.output_records}
        # the stride order each returned value is written in (Note [Output layouts])
        self.final_orders: dict[int, tuple[int, ...]] = {}
        self._texts: dict[Any, str] = {}  # carve_key's record texts, made once
        self._refs: dict[int, list[Ref]] = {}
        for r, order in zip(self.output_records, output_stride_orders(fd)):
            if r.kw("alias_input") is None:
                self.final_orders.setdefault(r.args[0].index, order)

    def order_of(self, v: int) -> tuple[int, ...]:
        """The stride order value `v` passes between segments in: a returned value's own,
        else the fusion's preferred one (channels-last around channels-last convolutions,
        Note [Channels-last convolutions]), else row-major (())."""
        if v in self.final_orders:
            return self.final_orders[v]
        return preferred_order(self.fd, getattr(self.fd._infos[v], "ndim", 0))

    def _closure(self, refs: Iterable[Ref]) -> tuple[set[int], set[int]]:
        needs: set[int] = set()
        copies: set[int] = set()
        stack = list(refs)
        records = self.fd._records
        while stack:
            ref = stack.pop()
            pos = self.producer[ref.index]
            rec = records[pos]
            copied = (rec.kind in ("scalar", "vector") and not rec.kw("is_input")) or (
                rec.kind == "op" and not is_tensor_op(self.fd, rec))
            if not copied:
                needs.add(ref.index)
            elif pos not in copies:
                copies.add(pos)
                stack.extend(rec.refs())
        return needs, copies

    def produced(self, group: Iterable[int]) -> set[int]:
        return {o.index for pos in group for o in self.fd._records[pos].outputs}

    def _parts(self, group: frozenset[int], finals: set[int] | None,
               shared: set[int] | None) -> tuple[list[int], list[int], list[Record], list[int]]:  # fmt: skip
        """What the segment of `group` holds (carve's arguments): its inputs, the records it
        copies (scalar work and the group's ops), its caller outputs and the values it hands
        other segments besides them, each in the segment's order."""
        made = self.produced(group)
        if finals is None:
            finals = made & self.final
        if shared is None:
            shared = {v for v in made if self.consumers.get(v, set()) - group}
        inputs = {v for pos in group for v in self.needs[pos] if v not in made}
        copies = set().union(*(self.copies[pos] for pos in group))
        final_records = [r for r in self.output_records if r.args[0].index in finals]
        for r in final_records:  # an in-place output needs its target among the inputs
            alias = r.kw("alias_input")
            if alias is not None:
                inputs.add(alias.index)
        returned = {r.args[0].index for r in final_records if r.kw("alias_input") is None}
        return sorted(inputs), sorted(copies | group), final_records, sorted(shared - returned)

    def _input_record(self, v: int, strided: Iterable[int] = ()) -> Record:
        """The record defining input `v` in a segment (its output numbered later): an input of
        the original keeps its definition; an intermediate is a fresh tensor input."""
        src = self.fd._records[self.producer[v]]
        if src.kind != "op":
            return Record(src.kind, src.name, src.args, src.kwargs, src.outputs[:1])
        info = self.fd._infos[v]
        dense = v not in strided
        order = self.order_of(v) if dense else ()
        contiguity = tuple(None if info.shape[d] == 1 else dense
                           for d in allocation_order(order, len(info.shape)))  # fmt: skip
        kwargs = (("shape", info.shape), ("contiguity", contiguity), ("dtype", info.dtype),
                  ("is_cpu", False), ("stride_order", order))  # fmt: skip
        return Record("tensor", kwargs=kwargs, outputs=(Ref("T", v),))

    def carve(self, group: Iterable[int], finals: set[int] | None = None,
              shared: set[int] | None = None, strided: set[int] = frozenset()
              ) -> SubFusion:  # fmt: skip
        """The segment computing `group`'s ops. It returns the caller's outputs among
        `finals` and hands other segments the values in `shared`; by default, everything
        the group computes that anything outside it needs. Intermediates in `strided` come
        with any strides (an ATen segment's results, Note [ATen segments]); others are
        contiguous."""
        records = self.fd._records
        inputs, body, final_records, handed = self._parts(frozenset(group), finals, shared)
        renumber: dict[int, int] = {}

        def ref(r: Ref) -> Ref:
            return Ref(r.kind, renumber[r.index])

        def remap(v: Any) -> Any:
            if isinstance(v, Ref):
                return ref(v)
            if isinstance(v, tuple):
                return tuple(remap(x) for x in v)
            return v

        def fresh(outs: tuple[Ref, ...]) -> tuple[Ref, ...]:
            new = []
            for o in outs:
                renumber[o.index] = len(renumber)
                new.append(Ref(o.kind, renumber[o.index]))
            return tuple(new)

        out: list[Record] = []
        for v in inputs:
            r = self._input_record(v, strided)
            out.append(Record(r.kind, r.name, r.args, r.kwargs, fresh(r.outputs)))
        for pos in body:
            r = records[pos]
            out.append(Record(r.kind, r.name, remap(r.args),
                              tuple((k, remap(x)) for k, x in r.kwargs), fresh(r.outputs)))  # fmt: skip
        returned, aliased = [], []
        for r in final_records:
            v = r.args[0].index
            out.append(Record("output", "", remap(r.args), tuple((k, remap(x)) for k, x in r.kwargs)))
            (returned if r.kw("alias_input") is None else aliased).append(v)
        for v in handed:
            out.append(Record("output", "", (ref(Ref("T", v)),),
                              (("alias_input", None), ("stride_order", self.order_of(v)))))  # fmt: skip
            returned.append(v)
        index_map = {renumber[v]: v for v in inputs}
        index_map.update({renumber[v]: v for v in returned + aliased})
        return SubFusion(tuple(out), index_map, tuple(inputs), tuple(returned), tuple(aliased))

    def carve_key(self, group: frozenset[int], finals: set[int],
                  shared: set[int]) -> tuple[tuple, list[int]]:  # fmt: skip
        """Note [Shared trials] (schedulers/segmenter.py): (a value equal for two groups exactly
        when `carve` makes equal records of them, in the segment's own numbering; the
        segment's inputs), without making the records. Each record counts as its text with
        the state numbers left out (made once per record) and the segment's numbers of the
        states it reads."""
        inputs, body, final_records, handed = self._parts(group, finals, shared)
        renumber = {v: n for n, v in enumerate(inputs)}
        key: list[Any] = [self._input_text(v) for v in inputs]
        for pos in body:
            rec = self.fd._records[pos]
            key.append((self._shape_text(rec, pos),
                        tuple(renumber[r.index] for r in self._reads(rec, pos))))  # fmt: skip
            for o in rec.outputs:
                renumber[o.index] = len(renumber)
        for r in final_records:
            key.append((self._shape_text(r, id(r)),
                        tuple(renumber[x.index] for x in r.refs())))  # fmt: skip
        key.extend((renumber[v], self.order_of(v)) for v in handed)
        return tuple(key), inputs

    def _input_text(self, v: int) -> str:
        """The canonical text of input `v`'s record in a segment, numbered 0."""
        text = self._texts.get(("input", v))
        if text is None:
            r = self._input_record(v)
            text = Record(r.kind, r.name, r.args, r.kwargs, (Ref(r.outputs[0].kind, 0),)).key
            self._texts[("input", v)] = text
        return text

    def _shape_text(self, record: Record, slot: Any) -> str:
        """The record's canonical text (Note [Record identity]) with the numbers of the states
        it reads and makes left out, their kinds kept."""
        text = self._texts.get(slot)
        if text is None:
            text = self._texts[slot] = _STATE_NUMBER.sub(r'"$ref":"\1"', record.key)
        return text

    def _reads(self, record: Record, pos: int) -> list[Ref]:
        found = self._refs.get(pos)
        if found is None:
            found = self._refs[pos] = record.refs()
        return found


# a state reference in a record's text: {"$ref":"T12"} (Note [Record identity])
_STATE_NUMBER = re.compile(r'"\$ref":"([A-Za-z]+)\d+"')
