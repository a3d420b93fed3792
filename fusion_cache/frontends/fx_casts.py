"""Casts moved ahead of the views they read, in an aten FX graph, before it is partitioned.

Note [Casts before views]: autocast and `type_as` put a cast after a reshape (RoPE's
`stack(...).flatten(3).type_as(x)`, and in the backward the gradient of `x.float()` after
the stack's gradient): cat -> reshape -> cast. A reshape after a cat is where a generated
kernel stops (its output index no longer maps onto the cat's pieces), so the cast, stuck
behind the reshape, was a copy kernel of its own: a Llama-style layer ran two more kernels
forward and two backward for it. A cast is elementwise, so cast(view(x)) == view(cast(x)):
with the cast first it joins the kernel that makes x, and the view goes to its readers
(Note [Views go with their readers] in schedulers/segmenter.py).
"""
from __future__ import annotations

import torch
from torch.fx import GraphModule, Node

from .fx_support import base_name

_aten = torch.ops.aten
# views that keep every element (a select or slice would make the cast do less work after)
_VIEWS = frozenset({_aten.view.default, _aten._unsafe_view.default, _aten.reshape.default,
                    _aten.permute.default, _aten.t.default, _aten.transpose.int,
                    _aten.unsqueeze.default, _aten.squeeze.dim, _aten.squeeze.dims,
                    _aten.squeeze.default})  # fmt: skip


def _is_dtype_cast(node: Node) -> bool:
    """A cast that changes only the dtype (no device, layout or memory format)."""
    if node.op != "call_function" or len(node.args) != 1:
        return False
    name = base_name(node)
    if name == "convert_element_type":  # prims
        return True
    if name != "_to_copy" or "dtype" not in node.kwargs:
        return False
    src = node.args[0].meta.get("val") if isinstance(node.args[0], Node) else None
    rest = {k: v for k, v in node.kwargs.items() if k != "dtype"}
    return isinstance(src, torch.Tensor) and set(rest) <= {"layout", "device"} and \
        rest.get("layout", torch.strided) == torch.strided and \
        torch.device(rest.get("device", src.device)) == src.device  # fmt: skip


def casts_before_views(gm: GraphModule) -> int:
    """Note [Casts before views]: rewrite cast(view(x)) as view(cast(x)) where the view has
    no other reader, repeatedly through a chain of views; returns how many were moved."""
    moved = 0
    for node in list(gm.graph.nodes):
        if not _is_dtype_cast(node):
            continue
        cast: Node | None = node
        while cast is not None:
            view = cast.args[0]
            if not (isinstance(view, Node) and view.op == "call_function"
                    and view.target in _VIEWS and len(view.users) == 1 and not view.kwargs):
                break
            cast = _swap(gm, view, cast)
            moved += cast is not None
    if moved:
        gm.graph.lint()
        gm.recompile()
    return moved


def _swap(gm: GraphModule, view: Node, cast: Node) -> Node | None:
    """view(x) -> cast  becomes  cast(x) -> view; the new cast, or None (nothing changed)
    where the fake values cannot be made again."""
    src = view.args[0]
    val = src.meta.get("val") if isinstance(src, Node) else None
    fake_mode = getattr(val, "fake_mode", None)
    if fake_mode is None or not isinstance(cast.meta.get("val"), torch.Tensor):
        return None
    with fake_mode:
        new_cast_val = cast.target(val, *cast.args[1:], **cast.kwargs)
        viewed = view.target(new_cast_val, *view.args[1:])
        # the view's value as a tensor of its own (the same sizes and strides; offset 0, as
        # the cast's is): a fake view keeps its base's fake mode, which torch.fx's
        # GraphPickler cannot pickle, and a region's subgraph is pickled for torch's
        # AOTAutograd cache (Note [Fused graph form])
        new_view_val = viewed if viewed.storage_offset() else torch.empty_strided(
            viewed.shape, viewed.stride(), dtype=viewed.dtype, device=viewed.device)
    graph = gm.graph
    with graph.inserting_before(view):
        new_cast = graph.call_function(cast.target, (src, *cast.args[1:]), dict(cast.kwargs))
        new_cast.meta = {**cast.meta, "val": new_cast_val}
        new_view = graph.call_function(view.target, (new_cast, *view.args[1:]), {})
        new_view.meta = {**view.meta, "val": new_view_val}
    cast.replace_all_uses_with(new_view)
    graph.erase_node(cast)
    graph.erase_node(view)
    return new_cast
