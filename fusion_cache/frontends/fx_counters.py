"""Counter updates of an aten graph: copy_(x, add(x, 1)) as one in-place op, and a graph's
counters together in one region.

Note [Counter updates]: batch norm in training counts its batches (num_batches_tracked += 1);
AOTAutograd, keeping input mutations (Note [Buffer updates in place], aten_ops.py), writes
it as copy_(count, add(count, 1)) at the graph's end, after every read of count. Where the
add has no other reader and count's dtype, the pair is one eager add_ at the copy's place
(`updates_in_place`): ResNet-18's forward, 20 kernels instead of 40. Each alone is no region
worth having (no result read outside it, and a region of one tiny kernel costs more than
eager's launch), but all of a graph's counters are one pointwise kernel over 0-d tensors,
each written in place: `counters_region` gathers them into one subgraph, called at the last
update's place. Moving an update there is safe where every other reader of its counter comes
before it (the graph's return aside, which still sees the updated value). On by default
since an interleaved A/B on the H100 (Note [Unmeasured switches]: ResNet-18 7.70 ms a step
against 8.19 with 20 eager add_, faster in each of 8 rounds); FUSION_CACHE_COUNTERS_REGION=0
keeps the eager add_.
"""
from __future__ import annotations

import torch
from torch.fx import Graph, GraphModule, Node

_aten = torch.ops.aten
# x.copy_(op(x, scalar)) -> op_(x, scalar): eager's one in-place kernel instead of two
_IN_PLACE = {_aten.add.Tensor: _aten.add_.Tensor, _aten.sub.Tensor: _aten.sub_.Tensor,
             _aten.mul.Tensor: _aten.mul_.Tensor}  # fmt: skip
_OUT_OF_PLACE = {v: k for k, v in _IN_PLACE.items()}
COUNTER = "fusion_cache_counter"  # node.meta key of an update updates_in_place made


def updates_in_place(gm: GraphModule) -> None:
    """Each counter update copy_(x, op(x, scalar)), the op read by nothing else and of x's
    dtype and shape, becomes op_(x, scalar) at the copy's place (after every read of x, as the
    copy was)."""
    graph = gm.graph
    for node in list(graph.nodes):
        if node.op != "call_function" or node.target is not _aten.copy_.default \
                or len(node.args) != 2 or node.kwargs:  # fmt: skip
            continue
        dst, src = node.args
        if not (isinstance(src, Node) and src.op == "call_function" and src.target in _IN_PLACE
                and len(src.users) == 1 and not src.kwargs and len(src.args) == 2
                and src.args[0] is dst and isinstance(src.args[1], (int, float))):  # fmt: skip
            continue
        want, got = dst.meta.get("val"), src.meta.get("val")
        if not (isinstance(want, torch.Tensor) and isinstance(got, torch.Tensor)
                and want.dtype == got.dtype and want.shape == got.shape):  # fmt: skip
            continue
        with graph.inserting_before(node):
            update = graph.call_function(_IN_PLACE[src.target], (dst, src.args[1]))
        update.meta = dict(node.meta)
        update.meta[COUNTER] = True
        node.replace_all_uses_with(update)
        graph.erase_node(node)
        graph.erase_node(src)


def counters_region(gm: GraphModule) -> tuple[list[Node], GraphModule] | None:
    """(the counter updates that can run together at the last one's place, in graph order;
    a subgraph of them: one placeholder per counter, op and copy_ for each, no output), or
    None where fewer than two can."""
    order = {n: i for i, n in enumerate(gm.graph.nodes)}
    updates = [n for n in gm.graph.nodes if n.op == "call_function" and n.meta.get(COUNTER)
               and n.target in _OUT_OF_PLACE and len(n.users) == 0]  # fmt: skip
    movable = []
    for u in updates:
        dst = u.args[0]
        others = [r for r in dst.users if r is not u and r.op != "output"]
        if dst.op == "placeholder" and all(order[r] < order[u] for r in others):
            movable.append(u)
    if len(movable) < 2:
        return None
    sub = Graph()
    for u in movable:
        dst = u.args[0]
        count = sub.placeholder(dst.name)
        count.meta = dict(dst.meta)
        value = sub.call_function(_OUT_OF_PLACE[u.target], (count, u.args[1]))
        value.meta = {"val": dst.meta.get("val")}
        sub.call_function(_aten.copy_.default, (count, value)).meta = {"val": dst.meta.get("val")}
    sub.output(())
    return movable, GraphModule(torch.nn.Module(), sub)
