"""A fused aten graph as plain values, and back: what torch's AOTAutograd cache keeps of one.

Note [Fused graph form]: a warm process that took its graphs from torch's cache (Note [AOT
cache]) had to unpickle each aten graph (a fake tensor for every node) and fuse it again:
partition, cut the regions out as submodules, lower each into a definition. Yet all that
decides a region is its definition's records, and the graph around the regions is a list of
aten calls. So the cache keeps the fused graph: its nodes in order (each an aten op, a
Python builtin or region i, with its arguments) and per region its definitions: the records
(the canonical JSON the trie and the store key them by), the input specs each was lowered
for (the traced ones, and those the first call brings where they differ: a backward's saved
views come as a forward region's row-major outputs), its constants; and its subgraph
pickled by torch.fx's GraphPickler, unpickled only if a call brings strides no definition
was kept for and the region must be lowered again. Rebuilding replays the records
(the fusion id comes from the store, as for any definition) and makes the outer graph's
nodes: no fake tensor, no partitioner, no lowering. No region object, plan or kernel is kept.

`describe` returns None for a graph it cannot hold (a node of another kind, an argument of
another type); the cache then keeps the aten graph and fuses it again on load.
"""
from __future__ import annotations

import operator
from collections.abc import Callable
from typing import Any

import torch
from torch.fx import GraphModule, Node

from fusion_cache.frontend.definition import FusionDefinition
from fusion_cache.frontend.records import records_from_json, records_to_json
from fusion_cache.frontend.replay import replay_records

from .eager_views import METHODS, aten_op_of, fast_views
from .fx_region import REGION_MAX_RECORDS, Constants, DerivedOutput, InputSpec, RegionCall

# bump when the form changes: an entry of another form is fused again; 2: every definition
# a region holds at describe time, not only the traced one
FORM = 2


class NodeName(str):
    """An argument that names an earlier node of the graph."""


_LITERALS = (type(None), bool, int, float, str, torch.dtype, torch.device, torch.layout,
             torch.memory_format)  # fmt: skip
_BUILTINS = {"getitem": operator.getitem}
_VIEW_OPS = frozenset(METHODS.values())


class Unsupported(ValueError):
    """A graph `describe` cannot hold."""


def describe(gm: GraphModule, report: dict[str, Any], dump: Callable[[GraphModule], bytes],
             ) -> dict[str, Any] | None:  # fmt: skip
    """The fused graph `gm` (fuse_graph's, with its report) as plain values, or None.
    `dump` pickles a region's subgraph."""
    try:
        regions: list[RegionCall] = []
        nodes = [_node(n, regions) for n in gm.graph.nodes]
        return {"form": FORM, "nodes": nodes, "regions": [_region(r, dump) for r in regions],
                "report": {k: v for k, v in report.items() if k != "fusion_ids"}}  # fmt: skip
    except Unsupported:
        return None


def _node(node: Node, regions: list[RegionCall]) -> tuple:
    if node.op == "placeholder":
        target: Any = ("name", node.target)
    elif node.op == "output":
        target = ("output",)
    elif node.op != "call_function":
        raise Unsupported(f"{node.op} node {node.name}")
    elif isinstance(node.target, RegionCall):
        regions.append(node.target)
        target = ("region", len(regions) - 1)
    elif isinstance(node.target, torch._ops.OpOverload) or node.target in _VIEW_OPS:
        op = aten_op_of(node)  # a view's Tensor method (Note [Eager views]): its aten op
        target = ("op", op._schema.name.replace("::", "."), op._overloadname)
    elif node.target is operator.getitem:
        target = ("builtin", "getitem")
    else:
        raise Unsupported(f"call of {node.target!r}")
    return (node.name, node.op, target, _plain(node.args), _plain(node.kwargs))


def _plain(value: Any) -> Any:
    """An argument with nodes named, in plain lists, tuples and dicts (FX's immutable ones
    and torch.Size are not kept); raises Unsupported for a value of another type."""
    if isinstance(value, Node):
        return NodeName(value.name)
    if isinstance(value, list):
        return [_plain(v) for v in value]
    if isinstance(value, tuple):
        return tuple(_plain(v) for v in value)
    if isinstance(value, dict):
        return {_plain(k): _plain(v) for k, v in value.items()}
    if type(value) not in _LITERALS:
        raise Unsupported(f"an argument of type {type(value).__name__}")
    return value


def _region(region: RegionCall, dump: Callable[[GraphModule], bytes]) -> dict[str, Any]:
    return {
        "name": region.__name__,
        # the traced definition first, then those built at lowering for the strides the
        # first call brings (dynamo_backend._first_call_inputs): a rebuilt region then
        # unpickles its subgraph only for strides no process has seen
        "definitions": [_definition(*d) for d in region.definitions],
        "returns_tuple": region.returns_tuple,
        "graph": dump(region.region_graph),
    }  # fmt: skip


def _definition(specs: tuple, fd: FusionDefinition, constants: Any) -> dict[str, Any]:
    return {
        "records": records_to_json(fd.records),
        "specs": [(s.dtype, s.sizes, s.strides, s.cpu_scalar, s.is_tensor) for s in specs],
        "constants": [_constant(k, v) for k, v in constants],
        "hidden": getattr(constants, "hidden", 0),
    }  # fmt: skip


def _constant(k: int, value: Any) -> tuple:
    if isinstance(value, DerivedOutput):
        steps = tuple((method.__name__, _plain(args)) for method, args in value.steps)
        if any(getattr(torch.Tensor, name, None) is not m
               for (name, _), (m, _) in zip(steps, value.steps)):  # fmt: skip
            raise Unsupported("a derived output's step is no Tensor method")
        return (k, "derived", (value.source, value.from_input, steps))
    return (k, "value", _plain(value))


# ---- back -------------------------------------------------------------------------------------


def rebuild(form: dict[str, Any], load: Callable[[bytes], GraphModule],
            ) -> tuple[GraphModule, list[RegionCall], dict[str, Any]]:  # fmt: skip
    """The fused GraphModule a form describes, its RegionCalls, and fuse_graph's report of
    it; `load` unpickles a region's subgraph (when a call needs it)."""
    if form.get("form") != FORM:
        raise ValueError(f"a fused graph of form {form.get('form')}, not {FORM}")
    regions = [_rebuilt_region(r, load) for r in form["regions"]]
    graph = torch.fx.Graph()
    env: dict[str, Node] = {}

    def live(value: Any) -> Any:
        if isinstance(value, NodeName):
            return env[value]
        if isinstance(value, (tuple, list)):
            return type(value)(live(v) for v in value)
        if isinstance(value, dict):
            return {k: live(v) for k, v in value.items()}
        return value

    for name, op, target, args, kwargs in form["nodes"]:
        if op == "placeholder":
            node = graph.create_node(op, target[1], name=name)
        elif op == "output":
            node = graph.create_node(op, "output", live(args), name=name)
        else:
            node = graph.create_node(op, _target(target, regions), live(args), live(kwargs),
                                     name=name)  # fmt: skip
        env[name] = node
    gm = GraphModule(torch.nn.Module(), graph)
    if fast_views(gm):  # Note [Eager views]
        gm.recompile()
    return gm, regions, form["report"]


def _target(target: tuple, regions: list[RegionCall]) -> Any:
    kind = target[0]
    if kind == "region":
        return regions[target[1]]
    if kind == "builtin":
        return _BUILTINS[target[1]]
    if kind == "op":
        namespace, name = target[1].split(".", 1)
        return getattr(getattr(getattr(torch.ops, namespace), name), target[2])
    raise ValueError(f"unknown node target {target!r}")


def _rebuilt_region(region: dict[str, Any], load: Callable[[bytes], GraphModule]) -> RegionCall:
    traced, *more = [_rebuilt_definition(d) for d in region["definitions"]]
    data = region["graph"]
    call = RegionCall(region["name"], lambda: load(data), *traced,
                      returns_tuple=region["returns_tuple"])  # fmt: skip
    for fd, specs, constants in more:
        call.define(specs, fd, constants)
    return call


def _rebuilt_definition(kept: dict[str, Any]) -> tuple[FusionDefinition, tuple, Constants]:
    fd = FusionDefinition(max_length=REGION_MAX_RECORDS)
    with fd:
        replay_records(fd, records_from_json(kept["records"]))
    specs = tuple(InputSpec(*s) for s in kept["specs"])
    constants = Constants(
        (k, DerivedOutput(p[0], p[1], tuple((getattr(torch.Tensor, m), a) for m, a in p[2])))
        if kind == "derived" else (k, p)
        for k, kind, p in kept["constants"])  # fmt: skip
    constants.hidden = kept["hidden"]
    return fd, specs, constants
