"""Which aten-level FX nodes a fusion region may take, and why the others stay in eager.

`reject_reason(node)` returns None for a node the lowering takes, else a short reason; the
partitioner asks it through `FusionSupport`, and the graph dump prints the reasons.
"""
from __future__ import annotations

import functools
import operator
import os
from typing import Any

import torch
from torch.fx import Node
from torch.fx.passes.operator_support import OperatorSupportBase

from fusion_cache.frontend.dtypes import DataType, from_torch
from fusion_cache.frontend.ops import Operators

from .aten_table import has_lowering

# ops that only change how a tensor is viewed: they do not make a region worth launching
VIEW_OPS = frozenset(
    "view _unsafe_view _reshape_alias reshape permute t transpose expand expand_as "
    "unsqueeze squeeze alias detach clone contiguous split split_with_sizes unbind select "
    "slice narrow chunk".split()
)
# random or stateful: never fused
_RANDOM = frozenset("native_dropout dropout bernoulli rand_like randn_like".split())
_BATCH_NORM_STATS = ("_native_batch_norm_legit_no_training", "native_batch_norm")


def eager_ops() -> frozenset[str]:
    """FUSION_CACHE_EAGER_OPS: aten ops (comma list, "convolution,convolution_backward") left
    to eager whatever their lowering, to compare a model's steps with and without them."""
    return frozenset(n.strip() for n in os.environ.get("FUSION_CACHE_EAGER_OPS", "").split(",")
                     if n.strip())  # fmt: skip


def op_name(node: Node) -> str:
    """The qualified name ("aten::add") of a call_function node's OpOverload, else ''."""
    target = node.target
    schema = getattr(target, "_schema", None)
    return schema.name if schema is not None else ""


def base_name(node: Node) -> str:
    return op_name(node).split("::")[-1]


def is_getitem(node: Node) -> bool:
    return node.op == "call_function" and node.target is operator.getitem


def is_view(node: Node) -> bool:
    return node.op == "call_function" and base_name(node) in VIEW_OPS


def reject_reason(node: Node) -> str | None:
    if node.op != "call_function":
        return f"{node.op} node"
    if is_getitem(node):
        src = node.args[0]
        if not isinstance(src, Node):
            return "getitem of a non-node"
        why = reject_reason(src)
        return None if why is None else f"takes an item of an op left to eager ({why})"
    name = op_name(node)
    if not name:
        return f"not an aten op ({getattr(node.target, '__name__', node.target)})"
    if name.split("::")[-1] in _RANDOM:
        return "random op"
    if name.split("::")[-1] in eager_ops():
        return "left to eager by FUSION_CACHE_EAGER_OPS"
    if not has_lowering(name):
        return f"no lowering for {name}"
    return _check_values(node) or _check_op(node) or _check_needs(node)


def _check_values(node: Node) -> str | None:
    vals: list[Any] = [node.meta.get("val")]
    vals += [a.meta.get("val") for a in node.all_input_nodes]
    devices = set()
    for v in _flat(vals):
        if isinstance(v, (torch.SymInt, torch.SymFloat, torch.SymBool)):
            return "symbolic sizes (dynamic shapes are not lowered)"
        if not isinstance(v, torch.Tensor):
            continue
        if v.layout != torch.strided:
            return f"{v.layout} tensor"
        if any(isinstance(s, torch.SymInt) for s in v.shape):
            return "symbolic sizes (dynamic shapes are not lowered)"
        try:
            from_torch(v.dtype)
        except TypeError:
            return f"dtype {v.dtype}"
        if not (v.device.type == "cpu" and v.dim() == 0):
            devices.add(v.device.type)
    if len(devices) > 1:
        return f"mixes devices {sorted(devices)}"
    if node.meta.get("val") is None:
        return "no example value (meta['val']) to type the op"
    return None


def _check_op(node: Node) -> str | None:
    name = base_name(node)
    kwargs = node.kwargs
    if name == "_to_copy":
        dev = kwargs.get("device")
        val = node.args[0].meta.get("val") if isinstance(node.args[0], Node) else None
        if dev is not None and val is not None and torch.device(dev).type != val.device.type:
            return "copies between devices"
        if kwargs.get("layout") not in (None, torch.strided):
            return "changes layout"
    if name in _BATCH_NORM_STATS:
        if name == "native_batch_norm" and _arg(node, 5, "training", False):
            return "batch norm in training mode (running statistics are updated in place)"
        if any(not (is_getitem(u) and u.args[1] == 0) for u in node.users):
            return "uses batch norm's saved statistics (empty in eval mode)"
    if name == "copy_" and not (isinstance(node.args[0], Node) and node.args[0].op == "placeholder"):
        return "copy_ into a value the graph computes (Note [Buffer updates in place])"
    if name in ("batch_norm",) and _arg(node, 5, "training", False):
        return "batch norm in training mode"
    if name in ("max", "min") and len(node.args) > 1 and not isinstance(node.args[1], Node):
        return "max/min along a dim returns indices"
    return None


# aten ops whose lowering emits fd.ops that not every build has (the ATen ops) or whose
# schedulers not every build runs (the resize family, iota): they join a region only where
# the frontend has the ops and, on CUDA, a scheduler takes them, so that no region fails to
# lower and no region of a CUDA graph lands on the reference evaluator
_FLASH = ("_scaled_dot_product_flash_attention", "_scaled_dot_product_flash_attention_for_cpu")
_NEEDS = {
    "arange": ("iota",), "nll_loss_forward": ("iota",), "nll_loss_backward": ("iota",),
    "slice": ("slice",), "narrow": ("slice",), "select": ("slice",), "unbind": ("slice",),
    "split": ("slice",), "split_with_sizes": ("slice",), "cat": ("cat",), "stack": ("cat",),
    "constant_pad_nd": ("pad", "slice"), "slice_backward": ("pad",), "select_backward": ("pad",),
    "mm": ("matmul",), "bmm": ("matmul",), "matmul": ("matmul",), "addmm": ("matmul",),
    "linear": ("linear",), "embedding": ("embedding_fwd",),
    "embedding_dense_backward": ("index_put_accumulate",),
    **{name: ("sdpfa_fwd",) for name in _FLASH},
    **{f"{name}_backward": ("sdpfa_bwd",) for name in _FLASH},
    "_scaled_dot_product_cudnn_attention": ("sdpa_cudnn_fwd",),
    "_scaled_dot_product_cudnn_attention_backward": ("sdpa_cudnn_bwd",),
    "_scaled_dot_product_efficient_attention": ("sdpa_efficient_fwd",),
    "_scaled_dot_product_efficient_attention_backward": ("sdpa_efficient_bwd",),
    "convolution": ("convolution",), "convolution_backward": ("convolution_backward",),
}  # fmt: skip


def _check_needs(node: Node) -> str | None:
    needs = _NEEDS.get(base_name(node), ())
    if not needs:
        return None
    vals = [v for v in _flat([node.meta.get("val")]) if isinstance(v, torch.Tensor)]
    cuda = any(v.is_cuda for v in vals)  # CPU regions run on the reference evaluator anyway
    for op in needs:
        if not hasattr(Operators, op):
            return f"this build's frontend has no fd.ops.{op}"
        if cuda and not gpu_schedules(op):
            return (f"needs fd.ops.{op}, which no GPU scheduler of this build runs (the region "
                    "would run on the reference evaluator)")  # fmt: skip
    return None


@functools.cache
def gpu_schedules(op: str) -> bool:
    """Whether a scheduler takes a small fusion around fd.ops.`op` (as one kernel, or as an
    ATen segment's torch call)."""
    try:
        return _probe(op)
    except (AttributeError, TypeError, ValueError):  # no such op, or not with these operands
        return False


def _probe(op: str) -> bool:
    from fusion_cache.ir.subfusion import ScratchDefinition
    from schedulers.registry import schedule

    fd = ScratchDefinition()
    with fd:
        x = fd.define_tensor(shape=[-1, -1], dtype=DataType.Float)
        if op == "iota":
            y = fd.ops.add(x, fd.ops.cast(fd.ops.iota(8, 0, 1, DataType.Int), DataType.Float))
        elif op == "slice":
            y = fd.ops.mul(fd.ops.slice(x, [0, 1], [4, 5]), 2.0)
        elif op == "pad":
            y = fd.ops.mul(fd.ops.pad(x, [1, 2]), 2.0)
        elif op == "cat":
            y = fd.ops.mul(fd.ops.cat([x, fd.ops.exp(x)], 0), 2.0)
        elif op in ("matmul", "linear"):
            y = fd.ops.matmul(x, x) if op == "matmul" else fd.ops.linear(x, x)
        elif op == "embedding_fwd":
            y = fd.ops.embedding_fwd(fd.define_tensor(shape=[-1], dtype=DataType.Int), x)
        elif op == "index_put_accumulate":
            index = fd.define_tensor(shape=[-1], dtype=DataType.Int)
            y = fd.ops.index_put_accumulate(fd.ops.full([8, 8], 0.0, DataType.Float), index, x)
        elif op in ("sdpfa_fwd", "sdpfa_bwd"):  # the backward is planned as the forward
            q = fd.define_tensor(shape=[-1, -1, -1, -1], dtype=DataType.BFloat16)
            y = fd.ops.sdpfa_fwd(q, q, q, 0.0, True, None)[0]
        elif op in ("sdpa_cudnn_fwd", "sdpa_cudnn_bwd"):
            q = fd.define_tensor(shape=[-1, -1, -1, -1], dtype=DataType.BFloat16)
            y = fd.ops.sdpa_cudnn_fwd(q, q, q, 0.0, True, None)[0]
        elif op in ("sdpa_efficient_fwd", "sdpa_efficient_bwd"):
            q = fd.define_tensor(shape=[-1, -1, -1, -1], dtype=DataType.BFloat16)
            y = fd.ops.sdpa_efficient_fwd(q, q, q, None, 0.0, True, None)[0]
        elif op in ("convolution", "convolution_backward"):
            img = fd.define_tensor(shape=[-1, -1, -1, -1], dtype=DataType.Float)
            if op == "convolution":
                y = fd.ops.convolution(img, img, None, 1, 1)
            else:
                y = fd.ops.convolution_backward(img, img, img, 1, 1)[0]
        else:
            raise ValueError(f"gpu_schedules: no probe for {op!r}")
        fd.add_output(y)
    return schedule(fd)[0] is not None


def _arg(node: Node, index: int, name: str, default: Any) -> Any:
    if len(node.args) > index:
        return node.args[index]
    return node.kwargs.get(name, default)


def _flat(values: Any) -> list[Any]:
    out: list[Any] = []
    for v in values:
        if isinstance(v, (list, tuple)):
            out.extend(_flat(v))
        else:
            out.append(v)
    return out


class FusionSupport(OperatorSupportBase):
    """The partitioner's view of `reject_reason`, with the reasons kept for the dump."""

    def __init__(self) -> None:
        self.reasons: dict[Node, str] = {}

    def is_node_supported(self, submodules: Any, node: Node) -> bool:
        why = reject_reason(node)
        if why is not None:
            self.reasons[node] = why
        return why is None
