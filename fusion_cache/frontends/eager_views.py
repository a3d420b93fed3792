"""The view ops a fused graph leaves between its regions, called as Tensor methods.

Note [Eager views]: views stay outside the regions (they cost the GPU nothing), and a
training step's graphs keep many: a linear layer's weight transposed for each region that
reads it, the same transposed back in the backward (`t(t(w_grad))`), detaches of saved
tensors, slices of the rotary tables. FX's code calls each as `torch.ops.aten.t.default(x)`:
an OpOverload's Python __call__, then torch's boxed call into the dispatcher, 1.6 to 3 us on
this project's CPU machine, where the Tensor method of the same op (`x.t()`) takes 0.4 to 1.5:
its arguments are parsed in C and the op is called unboxed. A Llama-style training step of
four layers makes about 190 of them. So after fusing, `fast_views` gives each such node the
Tensor method (the same ATen op, so the same view), a slice of static bounds `narrow` (the
same view where the bounds are clamped as slice clamps them), and drops a transpose of a
transpose or a detach of a detach for a detach of the source (the same layout and storage,
a tensor of its own as before). Ops with keyword arguments, and slices whose sizes are
symbolic, stay as they are. `aten_op_of` names the ATen op a rewritten node calls, for the
fused graph's form (Note [Fused graph form]), which is rebuilt with aten ops and rewritten
again.
"""
from __future__ import annotations

import sys
from typing import Any

import torch
from torch.fx import GraphModule, Node

_aten = torch.ops.aten
_T = torch.Tensor

# aten op -> the Tensor method that calls it, for nodes of positional arguments only
METHODS = {
    _aten.t.default: _T.t,
    _aten.view.default: _T.view,
    _aten.detach.default: _T.detach,
    _aten.permute.default: _T.permute,
    _aten.transpose.int: _T.transpose,
    _aten.unsqueeze.default: _T.unsqueeze,
    _aten.squeeze.default: _T.squeeze,
    _aten.squeeze.dim: _T.squeeze,
    _aten.squeeze.dims: _T.squeeze,
    _aten.expand.default: _T.expand,
    _aten.select.int: _T.select,
    _aten.narrow.default: _T.narrow,
    _aten.as_strided.default: _T.as_strided,
}
# how many positional arguments each takes at most (expand's `implicit` is not the method's)
_ARITY = {_aten.expand.default: 2}
_OPS = {method: op for op, method in METHODS.items() if op is not _aten.squeeze.dim
        and op is not _aten.squeeze.dims}  # fmt: skip


def aten_op_of(node: Node) -> Any:
    """The ATen op a call_function node calls: its target, or the op of its Tensor method."""
    op = _OPS.get(node.target)
    if node.target is _T.squeeze and len(node.args) > 1:
        op = _aten.squeeze.dims if isinstance(node.args[1], (list, tuple)) else _aten.squeeze.dim
    return node.target if op is None else op


def fast_views(gm: GraphModule) -> int:
    """Rewrite the graph's view ops outside regions (Note [Eager views]), in place; the
    caller recompiles. Returns how many nodes were rewritten or dropped."""
    changed = 0
    for node in list(gm.graph.nodes):
        if node.op != "call_function" or node.kwargs:
            continue
        if node.target in (_aten.t.default, _aten.detach.default) and _collapse(gm, node):
            changed += 1
            continue
        if node.target is _aten.slice.Tensor:
            changed += _slice_as_narrow(node)
            continue
        method = METHODS.get(node.target)
        if method is not None and len(node.args) <= _ARITY.get(node.target, len(node.args)):
            node.target = method
            changed += 1
    return changed


def _collapse(gm: GraphModule, node: Node) -> bool:
    """t(t(x)) or detach(detach(x)), the inner one read by nothing else: detach(x)."""
    inner = node.args[0] if node.args else None
    if not (isinstance(inner, Node) and inner.op == "call_function" and len(inner.users) == 1
            and inner.target in (node.target, METHODS[node.target]) and not inner.kwargs):  # fmt: skip
        return False
    node.target, node.args = _T.detach, (inner.args[0],)
    gm.graph.erase_node(inner)
    return True


def _slice_as_narrow(node: Node) -> int:
    """slice(x, dim, start, end) of step 1 and a static size: narrow with slice's clamped
    bounds."""
    x, dim, start, end, step = (*node.args, *(0, None, None, 1)[len(node.args) - 1 :])
    val = x.meta.get("val") if isinstance(x, Node) else None
    if step != 1 or not isinstance(val, torch.Tensor) or not isinstance(dim, int):
        return 0
    if not all(v is None or type(v) is int for v in (start, end)):
        return 0
    size = val.shape[dim]
    if type(size) is not int:
        return 0
    start = _clamp(0 if start is None else start, size)
    end = _clamp(sys.maxsize if end is None else end, size)
    node.target, node.args = _T.narrow, (x, dim, start, max(end - start, 0))
    return 1


def _clamp(index: int, size: int) -> int:
    if index < 0:
        index += size
    return min(max(index, 0), size)
