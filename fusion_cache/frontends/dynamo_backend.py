"""The torch.compile backend "fusion_cache": aten graphs -> fusion regions + eager rest.

Dynamo hands the backend an FX graph; AOTAutograd turns it into aten-level forward and
backward graphs, and both come to `fuse_graph`. It partitions the graph into the largest
connected regions of ops the lowering takes (CapabilityBasedPartitioner), lowers each
region into a FusionDefinition, called through a RegionCall that replays a launch sequence
(Note [Region call]), and leaves the rest (random ops, what has no lowering) to eager.

Knobs: mode="reduce-overhead" (or FUSION_CACHE_CUDA_GRAPHS=1) replays each compiled graph as
a CUDA graph (Note [CUDA-graph mode]); FUSION_CACHE_SINGLE_NODE=1 keeps regions of a single
op (by default a region needs two ops that are not views); FUSION_CACHE_DUMP=graph prints each partitioned graph with
the reason each op was left out, FUSION_CACHE_DUMP=python_definition each region's
definition; FUSION_CACHE_DISABLE_FALLBACK is honoured by fd.execute; FUSION_CACHE_AOT_CACHE=0
keeps the compiled graphs out of torch's AOTAutograd cache (Note [AOT cache]).
FUSION_CACHE_MIN_CUT, CASTS_BEFORE_VIEWS and COUNTERS_REGION (on by default), LONE_CONVOLUTIONS and
PAIRED_PIECES: Note [Unmeasured switches] in schedulers/tuning.py.
"""
from __future__ import annotations

import inspect
import itertools
import math
import threading
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.fx import GraphModule, Node
from torch.fx.node import _get_qualified_name
from torch.fx.passes.infra.partitioner import CapabilityBasedPartitioner, Partition
from torch.fx.passes.utils.fuser_utils import fuse_by_partitions

from fusion_cache.frontend.options import dump_enabled, env_flag
from fusion_cache.ir.output_layout import channels_last_order, strides_for
from fusion_cache.runtime.compile_ahead import compile_regions
from schedulers.tuning import switched_on

from . import recompute
from .aot_cache import aot_cache_wanted, cache_settings, serializable_compilers
from .aten_library import conv_layout_knob
from .cuda_graphs import compile_with_cuda_graphs, cuda_graphs_wanted
from .eager_views import fast_views
from .fx_casts import casts_before_views
from .fx_counters import counters_region, updates_in_place
from .fx_region import RegionCall, build_region, dense_order, spec_of
from .fx_support import FusionSupport, base_name, is_getitem, is_view
from .lowering import LoweringError

_PREFIX = "fusion_region_"
_CASTS = frozenset({"_to_copy", "convert_element_type", "to", "_autocast_to_reduced_precision"})


@dataclass
class GraphReport:
    """What fuse_graph did to one aten graph."""

    graph: str  # "forward", "backward" or "inference"
    index: int
    regions: int = 0
    ops_fused: int = 0
    ops_eager: int = 0  # ops that compute, left to eager
    views_eager: int = 0  # views left to eager (they cost no copy there)
    fusion_ids: list[int] = field(default_factory=list)
    eager_reasons: dict[str, str] = field(default_factory=dict)  # node name -> why
    fused_ops: dict[str, int] = field(default_factory=dict)  # aten op -> how many were fused
    eager_ops: dict[str, dict[str, int]] = field(default_factory=dict)  # op -> why -> count
    fuse_s: float = 0.0  # partitioning and lowering this graph, planning ahead included
    planned_ahead: int = 0  # regions planned at lowering, kernels compiled in the pool
    ahead_s: float = 0.0  # of fuse_s: planning them (the compiles run on)
    regions_list: list = field(default_factory=list, repr=False)  # its RegionCalls

    def as_dict(self) -> dict[str, Any]:
        return {
            "graph": self.graph, "index": self.index, "regions": self.regions,
            "ops_fused": self.ops_fused, "ops_eager": self.ops_eager,
            "views_eager": self.views_eager,
            "fusion_ids": list(self.fusion_ids), "eager_reasons": dict(self.eager_reasons),
            "fused_ops": dict(self.fused_ops),
            "eager_ops": {op: dict(why) for op, why in self.eager_ops.items()},
            "fuse_s": self.fuse_s, "planned_ahead": self.planned_ahead, "ahead_s": self.ahead_s,
            # first calls: recording the launch sequences (planning, compiling or loading)
            "record_s": sum(r.record_s for r in self.regions_list),
            "redefined": sum(r.redefined for r in self.regions_list),
        }  # fmt: skip


_reports: list[GraphReport] = []
_lock = threading.Lock()
_counter = itertools.count()


def last_report() -> dict[str, Any] | None:
    """The report of the most recently compiled aten graph, or None."""
    with _lock:
        return _reports[-1].as_dict() if _reports else None


def reports() -> list[dict[str, Any]]:
    """Reports of every aten graph compiled in this process (since reset_reports)."""
    with _lock:
        return [r.as_dict() for r in _reports]


def reset_reports() -> None:
    with _lock:
        _reports.clear()


def record_rebuilt(fields: dict[str, Any], regions: list, seconds: float) -> None:
    """The report of a graph rebuilt from torch's AOTAutograd cache (Note [Fused graph
    form]): what fuse_graph reported of it, with this process's regions and rebuild time."""
    kept = ("regions", "ops_fused", "ops_eager", "views_eager", "eager_reasons", "fused_ops",
            "eager_ops")  # fmt: skip
    report = GraphReport(fields["graph"], next(_counter), **{k: fields[k] for k in kept})
    report.fusion_ids = [r.fusion_id for r in regions]
    report.regions_list = list(regions)
    report.fuse_s = seconds
    with _lock:
        _reports.append(report)


def single_node_allowed() -> bool:
    return env_flag("FUSION_CACHE_SINGLE_NODE", False)


# ---- the backend ----------------------------------------------------------------------------


def fusion_cache_backend(gm: GraphModule, example_inputs: Sequence[Any], mode: str | None = None,
                         options: dict[str, Any] | None = None) -> Callable:  # fmt: skip
    """torch.compile backend: forward and backward aten graphs both go through fuse_graph.

    `mode="reduce-overhead"` (or `options={"cuda_graphs": True}`, or FUSION_CACHE_CUDA_GRAPHS=1)
    also captures each graph in a CUDA graph (Note [CUDA-graph mode] in cuda_graphs.py)."""
    from torch._dynamo.backends.common import aot_autograd

    if cuda_graphs_wanted(mode, options):
        captured = compile_with_cuda_graphs(gm, example_inputs, fuse_graph)
        if captured is not None:
            return captured
    # Note [Buffer updates in place] (aten_ops.py): copy_ of batch norm's running statistics
    # stays in the graph, and the regions write them in place
    keep = {"keep_inference_input_mutations": True}
    recompute_options = recompute.aot_options()  # Note [Recompute in the backward]
    # torch's AOT cache keys no partitioner nor decompositions: the backend's cache tag names
    # the switch that chose them (Note [AOT cache]; recompute.cache_safe)
    cached = aot_cache_wanted() and recompute.cache_safe(recompute_options)
    compilers = serializable_compilers() if cached else None
    if compilers is not None:  # Note [AOT cache]: a restart skips AOTAutograd
        with cache_settings():
            return aot_autograd(**compilers, **recompute_options, **keep)(gm, example_inputs)
    backend = aot_autograd(
        fw_compiler=_compiler("forward"),
        bw_compiler=_compiler("backward"),
        inference_compiler=_compiler("inference"),
        **recompute_options,
        **keep,
    )
    return backend(gm, example_inputs)


def _compiler(kind: str) -> Callable[[GraphModule, Sequence[Any]], Callable]:
    def compile_graph(gm: GraphModule, example_inputs: Sequence[Any]) -> Callable:
        from functorch.compile import make_boxed_func

        fuse_graph(gm, kind)
        return make_boxed_func(gm.forward)

    return compile_graph


# ---- partitioning ---------------------------------------------------------------------------


def fuse_graph(gm: GraphModule, kind: str = "forward") -> dict[str, Any]:
    """Replace the fusable regions of an aten graph by calls of RegionCalls, in place."""
    start = time.perf_counter()
    report = GraphReport(kind, next(_counter))
    if switched_on("CASTS_BEFORE_VIEWS"):  # Note [Unmeasured switches]
        casts_before_views(gm)  # Note [Casts before views]
    support = FusionSupport()
    updates_in_place(gm)  # Note [Counter updates]
    proposed = _propose(gm, support)
    labels: dict[Node, str] = {}
    kept = _keep_worthwhile(proposed, labels)
    for node, why in support.reasons.items():
        labels.setdefault(node, why)
    in_partition = {n for part in proposed for n in part.nodes}
    for node in gm.graph.nodes:
        if node.op == "call_function" and node not in labels and node not in in_partition:
            labels[node] = "view outside a region: an eager view costs no copy"
    listing = _listing(gm, kept) if dump_enabled("graph") else []

    if kept:
        fuse_by_partitions(gm, [dict.fromkeys(p.nodes) for p in kept], prefix=_PREFIX)
    ahead: list[tuple[Any, list]] = []  # (definition, example inputs) of each region
    for i, part in enumerate(kept):
        name = f"{_PREFIX}{i}"
        region = _lower_region(gm, name, ahead, kind)
        ops = [n for n in part.nodes if not is_getitem(n)]
        if isinstance(region, str):  # lowering failed: the submodule runs the ops in eager
            for n in ops:
                labels[n] = f"region {i} did not lower: {region}"
            continue
        _call_region(gm, name, region)
        report.regions_list.append(region)
        report.regions += 1
        report.ops_fused += len(ops)
        for n in ops:
            report.fused_ops[base_name(n)] = report.fused_ops.get(base_name(n), 0) + 1
        report.fusion_ids.append(region.fusion_id)
    if switched_on("COUNTERS_REGION"):  # Note [Unmeasured switches]
        _fuse_counters(gm, ahead, kind, report, labels)
    gm.recompile()
    ahead_start = time.perf_counter()
    report.planned_ahead = compile_regions(ahead)  # Note [Compiles ahead]
    report.ahead_s = time.perf_counter() - ahead_start

    for node, why in labels.items():
        if node.op == "call_function" and not is_getitem(node):
            if is_view(node):
                report.views_eager += 1
            else:
                report.ops_eager += 1
                reasons = report.eager_ops.setdefault(base_name(node) or str(node.target), {})
                reasons[why] = reasons.get(why, 0) + 1
            report.eager_reasons[node.name] = why
    if dump_enabled("graph"):
        _print_listing(report, listing, labels)
    if fast_views(gm):  # Note [Eager views]
        gm.recompile()
    report.fuse_s = time.perf_counter() - start
    with _lock:
        _reports.append(report)
    return report.as_dict()


def _fuse_counters(gm: GraphModule, ahead: list, kind: str, report: GraphReport,
                   labels: dict[Node, str]) -> None:  # fmt: skip
    """Note [Counter updates]: the graph's counters updated by one region, called at the last
    update's place; where it does not lower, the updates stay eager add_ and say why."""
    found = counters_region(gm)
    if found is None:
        return
    updates, sub = found
    # fuse_by_partitions sorted the graph into new nodes: the labels name the old ones
    names = {u.name for u in updates}
    for old in [n for n in labels if n.name in names]:
        del labels[old]
    name = f"{_PREFIX}counters"
    gm.add_submodule(name, sub)
    with gm.graph.inserting_after(updates[-1]):
        call = gm.graph.call_module(name, tuple(u.args[0] for u in updates))
    region = _lower_region(gm, name, ahead, kind)
    if isinstance(region, str):
        gm.graph.erase_node(call)
        gm.delete_submodule(name)
        for u in updates:
            labels[u] = f"counters' region did not lower: {region}"
        return
    _call_region(gm, name, region)
    for u in updates:
        report.fused_ops[base_name(u)] = report.fused_ops.get(base_name(u), 0) + 1
        gm.graph.erase_node(u)
    report.regions_list.append(region)
    report.regions += 1
    report.ops_fused += len(updates)
    report.fusion_ids.append(region.fusion_id)


def _propose(gm: GraphModule, support: FusionSupport) -> list[Partition]:
    """Connected partitions of supported ops, without views at their edges."""
    view_names = sorted({_get_qualified_name(n.target) for n in gm.graph.nodes if is_view(n)})
    options: dict[str, Any] = {"allows_single_node_partition": True,
                               "non_compute_ops": view_names}  # fmt: skip
    if "skip_horizontal_fusion" in inspect.signature(CapabilityBasedPartitioner).parameters:
        options["skip_horizontal_fusion"] = True  # torch >= 2.9: merge along edges only
    partitioner = CapabilityBasedPartitioner(gm, support, **options)
    proposed = partitioner.propose_partitions()
    partitioner.remove_bookend_non_compute_ops(proposed)
    order = {n: i for i, n in enumerate(gm.graph.nodes)}
    pieces = [c for part in proposed for piece in _cut_after_library_ops(part, order)
              for c in _connected_parts(piece)]  # fmt: skip
    pieces = [_without_early_writes(p, support) for p in pieces]
    fused = {n for p in pieces for n in p.nodes}
    eager_writes = [n for n in gm.graph.nodes if _writes_in_place(n) and n not in fused]
    return [c for part in pieces for piece in _cut_at_eager_writes(part, eager_writes, order)
            for c in _connected_parts(piece)]  # fmt: skip


def _writes_in_place(node: Node) -> bool:
    schema = getattr(node.target, "_schema", None)
    return node.op == "call_function" and schema is not None and schema.is_mutable


def _cut_at_eager_writes(part: Partition, writes: list[Node],
                         order: dict[Node, int]) -> list[Partition]:  # fmt: skip
    """Note [Eager writes]: fuse_by_partitions calls a region where its last node was. An
    eager in-place write between a partition's first and last nodes, of a tensor the
    partition reads, would then run before the reads that came ahead of it in the graph
    (an eager counter update inside a region's span read the new value). Such a partition
    is cut at each such write: its halves run on either side of it, as the graph ordered."""
    if not part.nodes:
        return [part]
    nodes = set(part.nodes)
    first, last = min(order[n] for n in nodes), max(order[n] for n in nodes)
    cuts = sorted(order[w] for w in writes if first < order[w] < last
                  and isinstance(w.args[0], Node) and any(u in nodes for u in w.args[0].users))
    if not cuts:
        return [part]
    bounds = [first - 1, *cuts, last + 1]
    halves = [[n for n in part.nodes if lo < order[n] < hi] for lo, hi in itertools.pairwise(bounds)]
    return [Partition(nodes=h) for h in halves if h]


def _without_early_writes(part: Partition, support: FusionSupport) -> Partition:
    """Note [Buffer updates in place]: the graph's copy_ into an input comes after every read
    of the input; in a region it happens when the region runs. So a copy_ stays in its region
    only where every other reader of its input is in that region too (batch norm reads its
    running statistics in the region that updates them); otherwise it stays eager, last."""
    nodes = set(part.nodes)
    early = [n for n in nodes if base_name(n) == "copy_"
             and any(u is not n and u not in nodes for u in n.args[0].users)]  # fmt: skip
    if not early:
        return part
    for n in early:
        support.reasons[n] = "copy_ into an input another region or eager op reads"
    return Partition(nodes=[n for n in part.nodes if n not in early])


# the ops a region piece ends with (Note [Region cuts])
_CUT_AFTER = ("scaled_dot_product", "convolution")


def _ends_piece(node: Node) -> bool:
    cuts = ("convolution",) if switched_on("WHOLE_REGIONS") else _CUT_AFTER
    return node.op == "call_function" and any(op in base_name(node) for op in cuts)


def _cut_after_library_ops(part: Partition, order: dict[Node, int]) -> list[Partition]:
    """Note [Region cuts]: with GEMMs, attention and convolutions lowered, a partition holds
    a whole transformer stack or a whole ResNet, and the segmenter's search grows faster than
    the region (a tiny ResNet-18's forward and backward as two regions: 55 s of segmentation
    search, profiled, on this CPU). So a partition is cut after each attention op and each
    convolution (forward or backward): a layer's pieces are then the same definitions, so the
    layers share fusion ids, segmentations and kernels, and no region grows with depth. Such
    an op is a segment of its own in any case (Note [ATen segments]): the cut fuses nothing
    less, and costs one region call a piece.

    A node with a path to a cut goes as late as its consumers allow: its piece is the earliest
    of its consumers' (one earlier for a node that ends a piece), counted back from the
    partition's end; a node without (a weight's gradient, the loss after the last convolution)
    goes as early as its producers allow. Along every edge the piece number never falls, so pieces
    form no cycle (the partition is convex: no path leaves it and comes back). As late as possible, a residual block's last batch norm
    joins the add that reads it, where a run of nodes in graph order left it alone between its
    convolution and the shortcut's (ResNet-18: three batch norms and three convolutions in
    regions of one op, which stay eager). An item of a tuple stays with the op that made it.

    The switch WHOLE_REGIONS (Note [Unmeasured switches]) cuts after convolutions alone: a
    transformer's graph is one region, one call a step where a layer was one. H100, 2026-11-27,
    benchmarks.ab_steps, 4 interleaved rounds of 8 each, against the cuts: GPT-2 0.903 (21:42
    UTC, 3 of 4 rounds faster) then 1.006 (21:50, 0 of 4); Llama-style 0.987 (2 of 4) then
    0.993 (3 of 4); regions 14 -> 2 and 10 -> 2. The search pays: cold first steps 18.00 s
    against 8.71 (GPT-2) and 8.23 against 6.88 (Llama-style, 21:47 UTC, cold-first-whole-*).
    So it stays off."""
    nodes = sorted(part.nodes, key=order.__getitem__)
    if not any(_ends_piece(n) for n in nodes):
        return [part]
    members = set(nodes)

    def item(n: Node) -> bool:
        return is_getitem(n) and n.args[0] in members

    def consumers(n: Node) -> list[Node]:
        out = []
        for u in n.users:
            if u in members:
                out.extend(consumers(u) if item(u) else (u,))
        return out

    # the nodes with a path to a cut: placed as late as their consumers allow
    reaches = {n: False for n in nodes}
    piece: dict[Node, float] = {}
    for n in reversed(nodes):  # consumers come later in graph order
        if item(n):
            continue
        later = [piece[c] for c in consumers(n) if reaches[c]]
        reaches[n] = _ends_piece(n) or bool(later)
        if reaches[n]:
            piece[n] = min(later, default=0) - _ends_piece(n)
    # the rest (a weight's gradient, the loss after the last convolution): as early as their
    # producers allow; those without producers in the partition, at their earliest consumer
    for n in nodes:
        if item(n):
            piece[n] = piece[n.args[0]]
        elif not reaches[n]:
            feeds = [m.args[0] if item(m) else m for m in n.all_input_nodes if m in members]
            piece[n] = max((piece[m] + _ends_piece(m) for m in feeds), default=-math.inf)
    for n in reversed(nodes):
        if piece[n] == -math.inf:
            piece[n] = min((piece[c] for c in consumers(n)), default=0)
    for n in nodes:
        if item(n):
            piece[n] = piece[n.args[0]]
    if switched_on("LONE_CONVOLUTIONS"):  # Note [Unmeasured switches]
        _join_lone_cuts(nodes, piece, item, consumers)
    if switched_on("PAIRED_PIECES"):  # Note [Paired pieces]
        piece = {n: math.floor(p / 2) for n, p in piece.items()}
    runs: dict[int, list[Node]] = {}
    for n in nodes:
        runs.setdefault(piece[n], []).append(n)
    return [Partition(nodes=runs[k]) for k in sorted(runs)]


# Note [Paired pieces]: each piece of Note [Region cuts] is a region call of its own, and a
# region call has a fixed host cost (its guard, its sequence's frame, its outputs' tuple, the
# graph's getitems), paid once a piece: ResNet-18's step makes 37. With the switch, two
# neighbouring pieces are one region: piece numbers halved (rounded down), a map that never
# lowers a number, so no edge's piece falls and no cycle forms; a region then holds at most
# two library ops' pieces, so the segmenter's search stays bounded. Opt-in: an interleaved A/B
# on the H100 could not tell it from the default (Note [Unmeasured switches] has the figures).


def _join_lone_cuts(nodes: list[Node], piece: dict[Node, float], item: Callable[[Node], bool],
                    consumers: Callable[[Node], list[Node]]) -> None:  # fmt: skip
    """Note [Lone convolutions]: a convolution that shares its piece with none of its producers
    (ResNet-18's shortcut convolution, whose input's other reader ends the piece before; the
    stem's, which reads the model's input) would be a region of one op, left to eager. It
    joins the piece of its latest producer in the partition, beside that piece's own
    convolution, or with none there, its earliest consumer's. Either keeps every edge's piece
    number from falling: the producer's piece is at most its own, the consumers' at least."""
    members = set(nodes)
    for n in nodes:
        if item(n) or not _ends_piece(n):
            continue
        feeds = [m.args[0] if item(m) else m for m in n.all_input_nodes if m in members]
        if any(piece[m] == piece[n] for m in feeds):
            continue
        later = [piece[c] for c in consumers(n)]
        if feeds:
            piece[n] = max(piece[m] for m in feeds)
        elif later:
            piece[n] = min(later)
        else:
            continue
        for u in n.users:  # its items go with it
            if item(u):
                piece[u] = piece[n]


def _connected_parts(part: Partition) -> list[Partition]:
    """Split a partition into its connected pieces: a region is one dataflow, and a piece
    of an acyclic partition cannot close a cycle through the graph outside it."""
    nodes = list(part.nodes)
    members, seen, pieces = set(nodes), set(), []
    order = {n: i for i, n in enumerate(nodes)}
    for start in nodes:
        if start in seen:
            continue
        piece, stack = [], [start]
        seen.add(start)
        while stack:
            n = stack.pop()
            piece.append(n)
            for m in (*n.all_input_nodes, *n.users):
                if m in members and m not in seen:
                    seen.add(m)
                    stack.append(m)
        pieces.append(Partition(nodes=sorted(piece, key=order.__getitem__)))
    return pieces


def _keep_worthwhile(partitions: list[Partition], labels: dict[Node, str]) -> list[Partition]:
    """Regions worth a fusion: at least one op that is not a view or a cast, and two ops
    unless single-node."""
    least = 1 if single_node_allowed() else 2
    kept = []
    for part in partitions:
        compute = [n for n in part.nodes if not is_getitem(n) and not is_view(n)]
        if not part.nodes:
            continue
        if not compute:
            why = "only views: eager views cost no copy"
        elif not _read_outside(part):
            # only in-place writes (a counter's copy_): torch 2.11's fuse_by_partitions finds
            # no output to place the region's call after ("last_output_node is None")
            why = "no result read outside the region (in-place writes only)"
        elif all(base_name(n) in _CASTS for n in compute):
            why = "only casts: eager's copy kernel does the same in one launch"
        elif len(compute) < least and not _converts_layout(compute):
            why = (f"region of {len(compute)} op (FUSION_CACHE_SINGLE_NODE=1 fuses single "
                   "ops)")  # fmt: skip
        else:
            kept.append(part)
            continue
        for n in part.nodes:
            labels[n] = why
    return kept


def _read_outside(part: Partition) -> bool:
    """Whether any result of the partition is read by a node outside it (or returned)."""
    nodes = set(part.nodes)
    return any(u not in nodes for n in nodes for u in n.users)


def _converts_layout(ops: list[Node]) -> bool:
    """A convolution alone is worth a region where convolutions run channels-last (Note
    [Channels-last convolutions]): it takes the model's input or a shortcut's activation in
    that layout once, where eager's call would convert around it."""
    return len(ops) == 1 and base_name(ops[0]) in ("convolution", "convolution_backward") \
        and conv_layout_knob() == "channels_last"


def _call_region(gm: GraphModule, name: str, region: RegionCall) -> None:
    """The graph calls `region` as a function where it called submodule `name`."""
    graph = gm.graph
    call = next(n for n in graph.nodes if n.op == "call_module" and n.target == name)
    with graph.inserting_before(call):
        node = graph.call_function(region, call.args, call.kwargs)
    node.meta = dict(call.meta)
    call.replace_all_uses_with(node)
    graph.erase_node(call)
    gm.delete_submodule(name)


def _lower_region(gm: GraphModule, name: str, ahead: list, kind: str = "forward",
                  ) -> RegionCall | str:  # fmt: skip
    """The RegionCall for submodule `name`, or why its definition could not be built; its
    definition and example inputs go to `ahead` (Note [Compiles ahead])."""
    sub = getattr(gm, name)
    call = next(n for n in gm.graph.nodes if n.op == "call_module" and n.target == name)
    vals = [a.meta.get("val") if isinstance(a, Node) else a for a in call.args]
    if not any(isinstance(v, torch.Tensor) and not (v.device.type == "cpu" and v.dim() == 0)
               for v in vals):  # fmt: skip
        # a fusion runs where its tensors are: without one it could not tell the device
        return "no tensor input to tell the region's device"
    try:
        specs = tuple(spec_of(v) for v in vals)
        fd, constants = build_region(sub, specs)
    except (LoweringError, NotImplementedError) as err:
        return str(err)
    except Exception as err:  # a bug in a lowering: the region runs in eager, loudly
        warnings.warn(f"fusion_cache: {name} stays in eager after an unexpected "
                      f"{type(err).__name__} while lowering it: {err}", stacklevel=2)  # fmt: skip
        return f"{type(err).__name__}: {err}"
    if not fd.output_records():
        return "every output is a constant: nothing to run"
    region = RegionCall(name, sub, fd, specs, constants)
    saved = _first_call_inputs(call, vals, kind)
    if saved is not None:  # plan ahead what the first call will get, defined now
        try:
            ahead.append((region.definition_for(saved, counted=False)[0], saved))
        except Exception:  # noqa: BLE001 - the first call defines it again, and says why
            pass
    else:
        ahead.append((fd, vals))
    return region


def _first_call_inputs(call: Node, vals: list, kind: str) -> list | None:
    """A region's inputs as its first call gets them, where they differ from the traced ones;
    None where nothing differs.
    - A tensor the forward saved that was traced as a view into a larger buffer (a split's
      q, k, v) reaches the backward as a forward region's output, which a region writes
      row-major.
    - Around channels-last convolutions (Note [Channels-last convolutions]) a 4-D or 5-D
      activation comes channels-last: one a region or a convolution made, or in the backward
      one the forward saved (not a forward input, primals_*, such as a weight)."""
    out, changed = list(vals), False
    channels_last = conv_layout_knob() == "channels_last"
    for i, (arg, val) in enumerate(zip(call.args, vals)):
        if not (isinstance(arg, Node) and isinstance(val, torch.Tensor)):
            continue
        if kind == "backward" and arg.op == "placeholder" and val.dim() > 1 \
                and dense_order(val) is None:  # fmt: skip
            out[i], changed = val.new_empty(val.shape), True
        elif channels_last and val.dim() in (4, 5) and _activation_at_run(arg, kind):
            strides = strides_for(val.shape, channels_last_order(val.dim()))
            if list(val.stride()) != strides:
                out[i], changed = val.new_empty_strided(val.shape, strides), True
    return out if changed else None


def _activation_at_run(arg: Node, kind: str) -> bool:
    if arg.op != "placeholder":
        return True
    return kind == "backward" and not arg.name.startswith(("primals", "tangents"))


# ---- FUSION_CACHE_DUMP=graph ----------------------------------------------------------------


def _listing(gm: GraphModule, kept: list[Partition]) -> list[tuple[Node, str, int | None]]:
    """(node, text, region index) for every op, taken before the graph is rewritten."""
    region_of = {n: i for i, part in enumerate(kept) for n in part.nodes}
    rows = []
    for node in gm.graph.nodes:
        if node.op != "call_function":
            continue
        args = ", ".join(str(a) for a in node.args)
        target = f"{base_name(node)}" if not is_getitem(node) else "getitem"
        rows.append((node, f"%{node.name} = {target}({args})", region_of.get(node)))
    return rows


def _print_listing(report: GraphReport, rows: list, labels: dict[Node, str]) -> None:
    print(f"fusion_cache: {report.graph} graph #{report.index}: {report.regions} regions, "
          f"{report.ops_fused} ops fused, {report.ops_eager} ops and {report.views_eager} views "
          "left to eager "
          f"(fusion ids {report.fusion_ids})")  # fmt: skip
    for node, text, region in rows:
        where = f"[region {region}]" if node not in labels and region is not None else (
            f"[eager: {labels.get(node, 'not in a region')}]"
        )
        print(f"  {text:<70} {where}")
