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

Note [Views as aliases]: beyond making each view cheaper, `fast_views` makes fewer of them,
as inductor's generated code does. A detach becomes its source: the graphs run under no_grad
inside AOTAutograd's function, which alone gives the outputs their autograd meaning, so a
detach there only made a second tensor of the same storage and layout (inductor lowers
aten.detach to its input: "AOT autograd handles this for us"); a transpose of a transpose
becomes its source likewise. And a view repeated on the same arguments (the rotary tables'
slice and view, made anew by each attention block of each layer, and saved for the backward
once per use) is made once: views are pure, so the first node's tensor serves every reader
of the others. A Llama-style training step (benchmarks.ab_steps' cProfile, H100 2026-11-27)
called Tensor.detach 103 times, view 26 and narrow 16; now 46 (AOTAutograd's own, of saved
views), 12 and 0. FUSION_CACHE_OLD_HOST_PATH=1 keeps them all (Note [Unmeasured switches]:
the A/B's baseline; docs/performance.md has its figures).
"""
from __future__ import annotations

import sys
from typing import Any

import torch
from torch.fx import GraphModule, Node

from schedulers.tuning import switched_on

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
    aliases = not switched_on("OLD_HOST_PATH")  # Note [Views as aliases]
    changed = 0
    for node in list(gm.graph.nodes):
        if node.op != "call_function" or node.kwargs:
            continue
        if aliases and _as_alias(gm, node):
            changed += 1
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
    if aliases:
        changed += _share_repeated_views(gm)
    return changed


def _as_alias(gm: GraphModule, node: Node) -> bool:
    """detach(x), and t(t(x)) where the inner t has no other reader: x itself (Note [Views as
    aliases]). The node is erased, its readers read x."""
    inner = None
    if node.target is _aten.detach.default and len(node.args) == 1:
        source = node.args[0]
    elif node.target is _aten.t.default and len(node.args) == 1:
        inner = node.args[0]
        if not (isinstance(inner, Node) and inner.op == "call_function" and len(inner.users) == 1
                and inner.target in (_aten.t.default, _T.t) and len(inner.args) == 1
                and not inner.kwargs):  # fmt: skip
            return False
        source = inner.args[0]
    else:
        return False
    if not isinstance(source, Node):
        return False
    node.replace_all_uses_with(source)
    gm.graph.erase_node(node)
    if inner is not None:  # the inner t of t(t(x)), read by nothing now
        gm.graph.erase_node(inner)
    return True


_VIEW_TARGETS = frozenset(METHODS.values()) | {_aten.slice.Tensor} | set(METHODS)


def _share_repeated_views(gm: GraphModule) -> int:
    """A view node of the same target and arguments as an earlier one: its readers read the
    earlier (Note [Views as aliases]); returns how many were dropped."""
    seen: dict[tuple, Node] = {}
    dropped = 0
    for node in list(gm.graph.nodes):
        if node.op != "call_function" or node.target not in _VIEW_TARGETS:
            continue
        try:
            key = (node.target, _hashable(node.args), _hashable(node.kwargs))
            hash(key)
        except TypeError:
            continue
        first = seen.setdefault(key, node)
        if first is not node:
            node.replace_all_uses_with(first)
            gm.graph.erase_node(node)
            dropped += 1
    return dropped


def _hashable(value: Any) -> Any:
    """Node arguments as a key: lists as tuples, dicts as sorted item tuples."""
    if isinstance(value, (list, tuple)):
        return tuple(_hashable(v) for v in value)
    if isinstance(value, dict):
        return tuple(sorted((k, _hashable(v)) for k, v in value.items()))
    return value


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
