"""The segmenter: a fusion no single scheduler takes becomes a DAG of sub-fusions, each
one kernel (or, for an op no scheduler knows, one reference-evaluator step).

Note [Greedy segmentation]: start from the finest groups, one tensor op each. Repeatedly
merge two groups, a producer with its consumer first and then two siblings that read the
same tensor, if the merged group keeps the group graph acyclic and a scheduler accepts it
for these input sizes (its lowering and its plan both succeed: a plan can refuse what the
lowering allowed, e.g. a reduction whose epilogue runs over a different extent). Stop when
no pair merges. `segment_set` forces a boundary: its consumers never join its group.
Trials are cached by group, and planned against stand-ins (meta tensors for intermediates),
so segmenting needs no GPU and compiles nothing.

Note [Shared trials]: a trial (carve the group, build it, lower and plan it) was most of a
cold first step's planning (a tiny Llama-style model's: 1122 trials, 2.4 of 3.3 s of search),
and many trials are of the same segment: a layer stack's layers, a forward's groups again in
its backward, and the first call's check of the groups planned ahead. So the answer is kept
for the process under what decides it: the carved segment's records in its own numbering
(`FusionGraph.carve_key`, without carving), its inputs' stand-ins (dtype, sizes, strides,
offset, alignment, device; scalars by value), and the planning's context (the profile, the
schedulers, the knobs overridden, the FUSION_CACHE_* environment, torch's deterministic
switch). Equal keys mean the same definition planned for the same inputs in the same
context, so the search takes the same path and finds the same segments (tests/
test_shared_trials.py checks it on the tiny models' regions). FUSION_CACHE_SHARED_TRIALS=0
turns it off.
"""
from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from fusion_cache.frontend.options import env_flag
from fusion_cache.ir.subfusion import FusionGraph, SubFusion, stand_ins

from .aten import ATEN_OPS
from .aten import NAME as ATEN
from .base import SchedulerRefused
from .pointwise import NAME as POINTWISE
from .registry import plan_for, schedule
from .transpose import NAME as TRANSPOSE
from .tuning import overridden, switched_on

# cheap elementwise work is worth redoing; these are not. Random ops are: the definitions
# scheduled have every one seeded (Note [Random seeds]), so a redo draws the same numbers
_NOT_RECOMPUTED = {"sum", "prod", "max", "min", "var", "var_mean", "welford", "batch_norm",
                   "segment_set", "cat", "pad", "slice"} | ATEN_OPS
_REDUCTIONS = frozenset({"sum", "prod", "max", "min"})
# ops that only rename a tensor's elements (Note [Views go with their readers])
_VIEWS = frozenset({"reshape", "permute", "squeeze", "broadcast", "broadcast_in_dim", "expand"})


@dataclass(frozen=True)
class _Group:
    owned: frozenset[int]  # tensor ops this group is responsible for (a partition)
    ops: frozenset[int]  # what it computes: its own ops plus any it recomputes


@dataclass(frozen=True)
class SegmentDraft:
    ops: frozenset[int]  # record positions of the original's tensor ops
    sub: SubFusion
    scheduler: str | None  # None: no scheduler takes it; it runs on the reference
    # 'aten' (Note [ATen segments]): one torch call
    owned: frozenset[int] = frozenset()  # of `ops`, those it is responsible for (not redone)


def scheduler_taking(fd: Any, values: Sequence[Any], env: dict,
                     profile: Any) -> tuple[str | None, str]:  # fmt: skip
    """(the scheduler that runs `fd` on these inputs as one kernel, or None; why not)."""
    name, program, refusals = schedule(fd)
    if program is None:
        return None, "; ".join(str(r) for r in refusals)
    try:
        plan_for(name, program, values, env, profile)
    except SchedulerRefused as why:
        return None, f"{name}: {why}"
    return name, ""


# Note [Shared trials]: (context, segment key, inputs' stand-ins) -> the scheduler taking it
_TRIALS: dict[tuple, str | None] = {}
_MOST_TRIALS = 50_000  # about 2 kB a key: past it, the memo starts again


def trials_since(mark: int | None) -> Any:
    """Note [Searches apart]: None -> a mark of the memo as it is; a mark -> the trials made
    since (a forked child's, for its parent: the keys' contexts are the parent's too)."""
    if mark is None:
        return len(_TRIALS)
    items = list(_TRIALS.items())
    return items[mark:] if len(items) >= mark else items  # (cleared since: every one)


def add_trials(trials: list) -> None:
    """Trials a forked child of this process made."""
    if trials_shared():
        for key, answer in trials:
            _TRIALS.setdefault(key, answer)


def trials_shared() -> bool:
    return env_flag("FUSION_CACHE_SHARED_TRIALS", True)


def trial_context(profile: Any) -> tuple:
    """What a trial's answer depends on besides the segment and its inputs."""
    from .registry import SCHEDULERS

    schedulers = tuple((name, id(lower), id(plan)) for name, lower, plan in SCHEDULERS)
    env = tuple(sorted((k, v) for k, v in os.environ.items() if k.startswith("FUSION_CACHE_")))
    knobs = repr(sorted(overridden().items()))
    try:
        hash(profile)
    except TypeError:
        profile = repr(profile)
    import torch

    return (profile, schedulers, env, knobs, torch.are_deterministic_algorithms_enabled())


def stand_in_key(value: Any) -> Any:
    """What planning sees of an input: a tensor's layout, alignment and device; a scalar's or
    a vector's value."""
    import torch

    if isinstance(value, torch.Tensor):
        ptr = 0 if value.is_meta else value.data_ptr()
        return (value.dtype, tuple(value.shape), value.stride(), value.storage_offset(),
                ptr & 255, value.device.type)  # fmt: skip
    try:
        hash(value)
    except TypeError:
        return (type(value), repr(value))
    return (type(value), value)


def whole_fusion_refusal(fd: Any, values: Sequence[Any], env: dict, profile: Any) -> str | None:
    """Why no single scheduler runs the fusion on these inputs (None when one does)."""
    name, why = scheduler_taking(fd, values, env, profile)
    return None if name else why


class _Segmenter:
    def __init__(self, fd: Any, values: Sequence[Any], env: dict, profile: Any) -> None:
        self.graph = FusionGraph(fd)
        self.profile = profile
        self.tried: dict[tuple, str | None] = {}
        self.inputs = {ref.index for ref in fd.input_refs()}
        self.stand_in = stand_ins(fd, values, env)
        self.forbidden: list[tuple[int, frozenset[int]]] = []
        self.views_to_readers = switched_on("VIEWS_TO_READERS")  # Note [Unmeasured switches]
        self.peer_reductions = switched_on("PEER_REDUCTIONS")
        self._made: dict[frozenset[int], frozenset[int]] = {}
        self._reads: dict[frozenset[int], frozenset[int]] = {}
        self.context = trial_context(profile) if trials_shared() else None
        self._stand_in_keys: dict[int, Any] = {}
        records = fd._records
        for pos in self.graph.ops:
            if records[pos].name == "segment_set":
                out = records[pos].outputs[0].index
                self.forbidden.append((pos, frozenset(self.graph.consumers.get(out, ()))))

    # ---- trials -----------------------------------------------------------------------------

    def scheduler_for(self, ops: frozenset[int], finals: frozenset[int],
                      shared: frozenset[int]) -> str | None:  # fmt: skip
        key = (ops, finals, shared)
        if key not in self.tried:
            self.tried[key] = self._try_shared(ops, set(finals), set(shared))
        return self.tried[key]

    def _try_shared(self, ops: frozenset[int], finals: set[int], shared: set[int]) -> str | None:
        """Note [Shared trials]: a trial of the same segment on the same inputs in the same
        context, anywhere in this process, answers for this one."""
        if self.context is None:
            return self._try(self.graph.carve(ops, finals, shared))
        segment_key, inputs = self.graph.carve_key(ops, finals, shared)
        key = (self.context, segment_key, tuple(self._stand_in_key(v) for v in inputs))
        if key not in _TRIALS:
            if len(_TRIALS) >= _MOST_TRIALS:
                _TRIALS.clear()
            _TRIALS[key] = self._try(self.graph.carve(ops, finals, shared))
        return _TRIALS[key]

    def _stand_in_key(self, v: int) -> Any:
        found = self._stand_in_keys.get(v)
        if found is None:
            found = self._stand_in_keys[v] = stand_in_key(self.stand_in[v])
        return found

    def _try(self, sub: SubFusion) -> str | None:
        from fusion_cache.ir.shape_eval import runtime_shapes

        values = [self.stand_in[v] for v in sub.inputs]
        try:  # a group whose stand-ins a size check rejects is no group to run
            fd = sub.build(scratch=True)
            return scheduler_taking(fd, values, runtime_shapes(fd, values), self.profile)[0]
        except (TypeError, ValueError):
            return None

    # ---- the group graph --------------------------------------------------------------------

    def made(self, ops: frozenset[int]) -> frozenset[int]:
        """The states `ops` produce (asked for the same groups over and over: cached)."""
        found = self._made.get(ops)
        if found is None:
            found = self._made[ops] = frozenset(self.graph.produced(ops))
        return found

    def reads(self, ops: frozenset[int]) -> frozenset[int]:
        """The states `ops` read and do not make themselves (cached as `made`)."""
        found = self._reads.get(ops)
        if found is None:
            inside = self.made(ops)
            found = frozenset(v for pos in ops for v in self.graph.needs[pos] if v not in inside)
            self._reads[ops] = found
        return found

    def outputs_of(self, groups: list[_Group], i: int, owned: frozenset[int],
                   ops: frozenset[int]) -> tuple[frozenset[int], frozenset[int]]:  # fmt: skip
        """(caller outputs, values other groups read) of a group owning `owned` and
        computing `ops`, among `groups` (group i's slot is the one being replaced)."""
        made = self.made(owned)
        finals = frozenset(made & self.graph.final)
        shared = set()
        for k, g in enumerate(groups):
            if k != i and g is not None:
                shared |= made & self.reads(g.ops)
        return finals, frozenset(shared)

    def accepts(self, groups: list, i: int, owned: frozenset[int], ops: frozenset[int]) -> bool:
        finals, shared = self.outputs_of(groups, i, owned, ops)
        return self.scheduler_for(ops, finals, shared) is not None

    def edges(self, groups: list[_Group]) -> dict[int, set[int]]:
        """Group i -> the groups that read something group i owns."""
        owner = {pos: i for i, g in enumerate(groups) for pos in g.owned}
        made = {v: owner[pos] for pos in owner for v in self.graph.produced((pos,))}
        out: dict[int, set[int]] = {i: set() for i in range(len(groups))}
        for i, g in enumerate(groups):
            for v in self.reads(g.ops):
                if v in made and made[v] != i:
                    out[made[v]].add(i)
        return out

    @staticmethod
    def _reaches(edges: dict[int, set[int]], src: int, dst: int, skip_direct: bool) -> bool:
        stack = [n for n in edges[src] if not (skip_direct and n == dst)]
        seen = set()
        while stack:
            n = stack.pop()
            if n == dst:
                return True
            if n not in seen:
                seen.add(n)
                stack.extend(edges[n])
        return False

    def allowed(self, ops: frozenset[int]) -> bool:
        return not any(pos in ops and readers & ops for pos, readers in self.forbidden)

    def can_merge(self, groups: list, edges: dict, a: int, b: int) -> bool:
        if not self.allowed(groups[a].ops | groups[b].ops):
            return False
        # another path between them would run through a third group: merging makes a cycle
        return not (self._reaches(edges, a, b, True) or self._reaches(edges, b, a, True))

    def merge_pass(self, groups: list[_Group]) -> list[_Group]:
        # Pairs refused in this pass stay refused until it ends: a merge elsewhere only adds
        # paths between groups (a cycle stays a cycle) and leaves what a pair's merged group
        # would compute and hand out unchanged; so each pair is tried once a pass, not once a
        # merge (the same plans; a 4-layer GPT's forward region of 176 ops: 2.2k trials, not
        # 12k, and 4.4 s of segmenting instead of 19.5)
        refused: set[tuple[frozenset[int], frozenset[int]]] = set()
        while True:
            edges = self.edges(groups)
            first = {i: min(g.owned) for i, g in enumerate(groups)}
            pairs = sorted((first[a], first[b], a, b) for a in edges for b in edges[a])
            pairs += sorted((first[a], first[b], a, b) for a, b in self.siblings(groups))
            if self.peer_reductions:  # Note [Unmeasured switches]
                pairs += sorted((first[a], first[b], a, b) for a, b in self.peers(groups))
            for _, _, a, b in pairs:
                key = (groups[a].ops, groups[b].ops)
                if key in refused:
                    continue
                if not self.can_merge(groups, edges, a, b):
                    refused.add(key)
                    continue
                merged = _Group(groups[a].owned | groups[b].owned, groups[a].ops | groups[b].ops)
                rest = [None if k == b else g for k, g in enumerate(groups)]
                if self.accepts(rest, a, merged.owned, merged.ops):
                    groups = [g for k, g in enumerate(groups) if k not in (a, b)] + [merged]
                    break
                refused.add(key)
            else:
                return groups

    def siblings(self, groups: list[_Group]) -> list[tuple[int, int]]:
        """Pairs of groups that read a common tensor: merged, it is read once."""
        readers: dict[int, set[int]] = {}
        for i, g in enumerate(groups):
            for v in self.reads(g.ops):
                readers.setdefault(v, set()).add(i)
        pairs = set()
        for rs in readers.values():
            ordered = sorted(rs)
            pairs.update((a, b) for k, a in enumerate(ordered) for b in ordered[k + 1:])
        return sorted(pairs)

    def peers(self, groups: list[_Group]) -> list[tuple[int, int]]:
        """Note [Peer reductions]: pairs of groups that each own a reduction of the same
        extents over the same dims, neither reading the other (a Llama-style backward's
        gradients of the key and value heads, each summed over the query heads it served:
        two kernels of one reduction plan, one kernel with two inputs). The merge is tried
        as any other: the group graph stays acyclic and a scheduler takes the pair whole."""
        records = self.graph.fd._records
        keyed: dict[tuple, list[int]] = {}
        for i, g in enumerate(groups):
            keys = set()
            for pos in g.owned:
                rec = records[pos]
                if rec.name not in _REDUCTIONS or rec.args[0].kind != "T":
                    continue
                src = self.stand_in.get(rec.args[0].index)
                if src is not None and hasattr(src, "shape"):
                    keys.add((tuple(src.shape), tuple(rec.kw("dims") or ())))
            for key in keys:
                keyed.setdefault(key, []).append(i)
        pairs = set()
        for members in keyed.values():
            pairs.update((a, b) for k, a in enumerate(members) for b in members[k + 1:])
        return sorted(pairs)

    # ---- recomputation ----------------------------------------------------------------------

    def chain(self, v: int) -> frozenset[int] | None:
        """The elementwise ops computing `v` from the fusion's inputs (None when a
        reduction or anything else that is not cheap to redo is on the way)."""
        ops: set[int] = set()
        stack = [v]
        records = self.graph.fd._records
        while stack:
            pos = self.graph.producer[stack.pop()]
            rec = records[pos]
            if rec.kind != "op":
                continue  # a fusion input
            if pos in ops:
                continue
            if rec.name in _NOT_RECOMPUTED or len(rec.outputs) != 1 or len(ops) >= 32:
                return None
            ops.add(pos)
            stack.extend(self.graph.needs[pos])
        return frozenset(ops)

    def view_chain(self, v: int) -> frozenset[int] | None:
        """Note [Views go with their readers]: the view ops that make `v` from the nearest
        tensor something else makes (an op's result or a fusion input); None where `v` is
        no view."""
        ops: set[int] = set()
        records = self.graph.fd._records
        while v not in self.inputs:
            pos = self.graph.producer[v]
            rec = records[pos]
            if rec.kind != "op" or rec.name not in _VIEWS or len(rec.outputs) != 1:
                break
            if len(self.graph.needs[pos]) != 1:  # a size read at run time: left as it was
                return None
            ops.add(pos)
            (v,) = self.graph.needs[pos]
        return frozenset(ops) or None

    def views_taken(self, groups: list[_Group], v: int) -> list[_Group] | None:
        """`groups` with the view ops making `v` taken by every group that reads a value
        they make (each the chain it reads); None where `v` is no view."""
        views = self.view_chain(v)
        if views is None:
            return None
        made = self.graph.produced(views)
        taken = list(groups)
        for k, g in enumerate(groups):
            inside = self.made(g.ops)
            reads = {u for pos in g.ops for u in self.graph.needs[pos]
                     if u in made and u not in inside}  # fmt: skip
            if not reads:
                continue
            ops = g.ops.union(*(self.view_chain(u) for u in reads))
            if not self.allowed(ops):
                return None
            taken[k] = _Group(g.owned, ops)
        return taken

    def views_pay(self, before: list[_Group], after: list[_Group]) -> bool:
        """Whether the groups of `after` write fewer bytes than those of `before` (a copy of a
        view no longer made) and every group whose ops or outputs changed is still accepted
        (the group that handed out the view now hands out the tensor it views)."""
        saved = 0
        for k, (old, new) in enumerate(zip(before, after)):
            was = self.outputs_of(before, k, old.owned, old.ops)
            outs = self.outputs_of(after, k, new.owned, new.ops)
            if old == new and outs == was:
                continue
            saved += sum(map(self.bytes_of, was[0] | was[1]))
            saved -= sum(map(self.bytes_of, outs[0] | outs[1]))
            if any(outs) and self.scheduler_for(new.ops, *outs) is None:
                return False  # (a group read by nobody now is dropped below)
        return saved > 0

    def bytes_of(self, v: int) -> int:
        t = self.stand_in.get(v)
        return t.numel() * t.element_size() if t is not None and hasattr(t, "numel") else 0

    def recompute_pass(self, groups: list[_Group]) -> list[_Group]:
        """Note [Views go with their readers]: a group that reads a view of a tensor (a
        reshape, permute, squeeze, broadcast or expand of it, or a chain of them) takes the
        view ops along and reads the tensor itself, where its scheduler accepts them and
        fewer bytes are written: a view costs nothing inside a kernel or on the way into a
        torch call, while handed from one group to another it is a copy (Llama-style
        backward: a reshape to [tokens, dim] read by the two GEMMs of a linear layer's
        gradient, a copy kernel of its own four times a layer; a transposed copy written
        beside the tensor for a GEMM). A group left with no value anyone reads is dropped
        below.

        Note [Recomputing producers]: a group that reads an intermediate made by
        elementwise ops from the fusion's inputs may compute it itself instead. It pays
        off when the inputs it must read in addition (small ones, such as per-row stats,
        count for nothing) weigh no more than writing plus reading the intermediate."""
        changed = True
        while changed:
            changed = False
            for i, g in enumerate(groups):
                inside = self.graph.produced(g.ops)
                reads = {v for pos in g.ops for v in self.graph.needs[pos] if v not in inside}
                for v in sorted(reads):
                    if v in self.inputs:
                        continue
                    taken = self.views_taken(groups, v) if self.views_to_readers else None
                    if taken is not None and self.views_pay(groups, taken):
                        groups, changed = taken, True
                        break
                    ops = self.chain(v)
                    if ops is None:
                        continue
                    extra = {u for pos in ops for u in self.graph.needs[pos]}
                    extra -= reads | self.graph.produced(ops)
                    cost = sum(b for u in extra if (b := self.bytes_of(u)) * 8 > self.bytes_of(v))
                    new_ops = g.ops | ops
                    if cost > 2 * self.bytes_of(v) or not self.allowed(new_ops):
                        continue
                    if self.accepts(groups, i, g.owned, new_ops):
                        groups[i] = _Group(g.owned, new_ops)
                        changed = True
                        break
                if changed:
                    break
            # a group whose every value is recomputed where it is needed has nothing to do
            groups = [g for i, g in enumerate(groups) if any(self.outputs_of(groups, i, g.owned, g.ops))]
        return groups

    def run(self) -> list[_Group]:
        groups = [_Group(frozenset((pos,)), frozenset((pos,))) for pos in self.graph.ops]
        groups = self.merge_pass(groups)
        before = None
        while before != groups:
            before = groups
            groups = self.merge_pass(self.recompute_pass(list(groups)))
        return groups

    def given(self, groups: Sequence[tuple[frozenset[int], frozenset[int]]]) -> list[_Group]:
        """Groups found by an earlier run, checked against this fusion: tensor ops only, each
        owned by one group at most, every value a group or the caller needs made by an owner
        or by the group itself. What passes computes the fusion whatever it came from."""
        ops = set(self.graph.ops)
        out, owner = [], {}
        for owned, computed in groups:
            if not owned or not owned <= computed or not computed <= ops:
                raise SchedulerRefused("a stored group does not fit this fusion's ops")
            for pos in owned:
                if owner.setdefault(pos, len(out)) != len(out):
                    raise SchedulerRefused(f"op {pos} is owned by two stored groups")
            out.append(_Group(frozenset(owned), frozenset(computed)))
        handed = set().union(*(self.made(g.owned) for g in out))
        for g in out:
            inside = self.made(g.ops)
            for pos in g.ops:
                missing = [v for v in self.graph.needs[pos]
                           if v not in inside and v not in handed and v not in self.inputs
                           and self.graph.producer.get(v) in ops]  # fmt: skip
                if missing:
                    raise SchedulerRefused(f"no stored group makes {missing} for op {pos}")
        if not self.graph.final <= handed | self.inputs:
            raise SchedulerRefused("the stored groups do not make every output")
        return out

    def order(self, groups: list[_Group]) -> list[_Group]:
        """Topological order; a group writing an input in place runs after its readers."""
        edges = self.edges(groups)
        records = self.graph.fd._records
        for r in self.graph.output_records:
            alias = r.kw("alias_input")
            if alias is None:
                continue
            writer = next((i for i, g in enumerate(groups)
                           if r.args[0].index in self.graph.produced(g.owned)), None)  # fmt: skip
            for i, g in enumerate(groups):
                if i != writer and writer is not None and any(
                        alias.index in self.graph.needs[pos] for pos in g.ops):
                    edges[i].add(writer)
        indegree = {i: 0 for i in edges}
        for i in edges:
            for j in edges[i]:
                indegree[j] += 1
        ready = sorted((min(groups[i].owned), i) for i, d in indegree.items() if d == 0)
        done = []
        while ready:
            _, i = ready.pop(0)
            done.append(groups[i])
            for j in edges[i]:
                indegree[j] -= 1
                if indegree[j] == 0:
                    ready.append((min(groups[j].owned), j))
                    ready.sort()
        if len(done) != len(groups):
            names = sorted(records[p].name for g in groups for p in g.ops)
            raise SchedulerRefused(f"segments would form a cycle ({names})")
        return done


def segment(fd: Any, values: Sequence[Any], env: dict, profile: Any,
            groups: Sequence[tuple[frozenset[int], frozenset[int]]] | None = None,
            kinds: Sequence[str | None] | None = None) -> list[SegmentDraft]:  # fmt: skip
    """The segments of `fd` for these inputs, in run order (Note [Greedy segmentation]).
    `groups`: (owned, ops) of each segment as an earlier segmentation found them, checked
    and taken instead of searching again (Note [Stored segmentations] in the executor);
    `kinds`: the scheduler of each, where the search that found them ran in a fork of this
    process on these inputs (Note [Searches apart]), not tried again."""
    seg = _Segmenter(fd, values, env, profile)
    if not seg.graph.ops:
        raise SchedulerRefused("the fusion has no tensor ops to split")
    for r in seg.graph.output_records:
        if r.args[0].kind != "T":
            raise SchedulerRefused(f"output {r.args[0]} is a scalar; segments pass tensors only")
    found = None if groups is None else seg.given(groups)
    ordered = seg.order(seg.run() if found is None else found)
    if kinds is not None and (len(kinds) != len(ordered) or found != ordered):
        kinds = None  # not in the order they were found in: each tried here
    groups = ordered
    outs = [seg.outputs_of(groups, i, g.owned, g.ops) for i, g in enumerate(groups)]
    if kinds is None:
        kinds = [seg.scheduler_for(g.ops, *o) for g, o in zip(groups, outs)]
    # an ATen segment's results keep torch's strides where the reader takes any strides
    # (a pointwise kernel, another torch call); other readers get them contiguous
    from_aten = {v for g, kind in zip(groups, kinds) if kind == ATEN
                 for v in seg.graph.produced(g.owned)}  # fmt: skip
    drafts = []
    for g, (finals, shared), kind in zip(groups, outs, kinds):
        strided = from_aten if kind in (ATEN, POINTWISE, TRANSPOSE) else set()
        sub = seg.graph.carve(g.ops, set(finals), set(shared), strided)
        drafts.append(SegmentDraft(g.ops, sub, kind, g.owned))
    return drafts
