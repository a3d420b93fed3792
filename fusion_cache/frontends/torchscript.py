"""TorchScript IR -> FusionDefinition.

`from_torchscript(graph_or_ir_text, example_inputs=None)` takes IR text (as printed by
`print(graph)` or written by hand), a `torch._C.Graph`, or a scripted function, and lowers
its aten ops into a closed FusionDefinition whose inputs are the graph's inputs, in order.
The graph is copied first: inlining and constant propagation fold the Python-level checks
that `torch.nn.functional` leaves in scripted code (training flags, argument checks).
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from fusion_cache.frontend.definition import FusionDefinition
from fusion_cache.frontend.dtypes import DataType, from_torch

from .aten_table import lower_op
from .lowering import (
    Args,
    LoweringContext,
    LoweringError,
    UnsupportedOpError,
    is_handle,
)

_PASSTHROUGH_PRIMS = ("prim::ListConstruct", "prim::TupleConstruct")
_SCALAR_INPUT_TYPES = {"FloatType": DataType.Double, "IntType": DataType.Int,
                       "BoolType": DataType.Bool}  # fmt: skip


def from_torchscript(
    graph_or_ir: Any, example_inputs: Sequence[Any] | None = None
) -> FusionDefinition:
    """Lower a TorchScript graph into a FusionDefinition (defined and closed).

    Tensor inputs need a dtype and rank: from `example_inputs` (one per graph input) when
    given, else from the IR's types (`Float(2, 3, strides=[3, 1], ...)`). Sizes become
    symbolic (-1) except size-1 dims, which become broadcast dims (Note [Frontend shapes]).
    An op outside the supported set raises UnsupportedOpError (a NotImplementedError and a
    ValueError) naming the op and its source line.
    """
    graph = prepare_graph(graph_or_ir)
    inputs = [v for v in graph.inputs() if not _is_module_self(v)]
    if example_inputs is not None and len(example_inputs) != len(inputs):
        raise ValueError(
            f"from_torchscript: the graph has {len(inputs)} inputs "
            f"({', '.join('%' + v.debugName() for v in inputs)}), got {len(example_inputs)} "
            "example_inputs"
        )
    fd = FusionDefinition()
    with fd:
        ctx = LoweringContext(fd)
        env: dict[Any, Any] = {}
        for i, value in enumerate(inputs):
            example = None if example_inputs is None else example_inputs[i]
            env[value] = _define_input(fd, value, example)
        for node in graph.nodes():
            _lower_node(ctx, node, env)
        outputs = _flatten([env[v] for v in graph.outputs()])
        for k, out in enumerate(outputs):
            if not is_handle(out):
                raise LoweringError(f"from_torchscript: output {k} is not a tensor or scalar "
                                    f"of the fusion: {out!r}")  # fmt: skip
            if out.index in fd.inputs():
                out = fd.ops.set(out)  # an input returned as is: give the output its own copy
            fd.add_output(out)
    return fd


def prepare_graph(graph_or_ir: Any) -> torch._C.Graph:
    """A private copy of the graph, inlined, with constants folded and dead code removed."""
    if isinstance(graph_or_ir, str):
        graph = torch._C.parse_ir(graph_or_ir)
    elif isinstance(graph_or_ir, torch._C.Graph):
        graph = graph_or_ir.copy()
    elif hasattr(graph_or_ir, "graph") and isinstance(graph_or_ir.graph, torch._C.Graph):
        graph = graph_or_ir.graph.copy()  # a ScriptFunction or ScriptModule
    else:
        raise TypeError(
            "from_torchscript: expected TorchScript IR text, a torch._C.Graph or a scripted "
            f"function, got {type(graph_or_ir).__name__}"
        )
    torch._C._jit_pass_inline(graph)
    torch._C._jit_pass_constant_propagation(graph)
    torch._C._jit_pass_remove_mutation(graph)  # x.add_(y) -> x = x.add(y) where it is safe
    torch._C._jit_pass_dce(graph)
    return graph


def _is_module_self(value: Any) -> bool:
    # a scripted module's `self`: usable only while no op reads its attributes
    return value.type().kind() == "ClassType" and not value.uses()


def _define_input(fd: FusionDefinition, value: Any, example: Any) -> Any:
    name = "%" + value.debugName()
    t = value.type()
    kind = t.kind()
    if kind in _SCALAR_INPUT_TYPES:
        return fd.define_scalar(dtype=_SCALAR_INPUT_TYPES[kind])
    if kind != "TensorType":
        raise UnsupportedOpError(f"from_torchscript: input {name} has type {t}; tensors, "
                                 "floats, ints and bools are supported")  # fmt: skip
    if example is not None:
        if not isinstance(example, torch.Tensor):
            raise TypeError(f"from_torchscript: example input for {name} must be a tensor, "
                            f"got {type(example).__name__}")  # fmt: skip
        return fd.from_pytorch(example)
    if t.scalarType() is None or t.dim() is None:
        raise ValueError(
            f"from_torchscript: input {name} has type {t}, without a dtype and rank; pass "
            "example_inputs (or give the IR a complete type such as Float(2, 3))"
        )
    dtype = from_torch(t.dtype())
    sizes, strides = t.sizes(), t.strides()
    if sizes is not None and None not in sizes and strides is not None and None not in strides:
        return fd.define_tensor(sizes=list(sizes), strides=list(strides), dtype=dtype)
    shape = [1 if s == 1 else -1 for s in (sizes or [None] * t.dim())]
    return fd.define_tensor(shape=shape, contiguity=True, dtype=dtype)


def _lower_node(ctx: LoweringContext, node: Any, env: dict[Any, Any]) -> None:
    kind = node.kind()
    outs = list(node.outputs())
    try:
        if kind == "prim::Constant":
            env[outs[0]] = _constant(node)
            return
        values = [env[v] for v in node.inputs()]
        if kind == "prim::ListConstruct":
            env[outs[0]] = list(values)
            return
        if kind == "prim::TupleConstruct":
            env[outs[0]] = tuple(values)
            return
        if kind in ("prim::ListUnpack", "prim::TupleUnpack"):
            result: Any = tuple(values[0])
        elif kind == "aten::__getitem__" and isinstance(values[0], (list, tuple)):
            result = values[0][values[1]]
        else:
            result = lower_op(ctx, kind, _bind(node, kind, values))
    except LoweringError as err:
        raise type(err)(_where(node, str(err))) from err
    except (TypeError, ValueError) as err:
        raise LoweringError(_where(node, f"{kind}: {err}")) from err
    if len(outs) == 1:
        env[outs[0]] = result
        return
    if not isinstance(result, tuple) or len(result) != len(outs):
        raise LoweringError(_where(node, f"{kind}: lowered to {result!r}, the node has "
                                         f"{len(outs)} outputs"))  # fmt: skip
    for out, value in zip(outs, result):
        env[out] = value


def _bind(node: Any, kind: str, values: list[Any]) -> Args:
    schema = node.schema()
    if schema == "(no schema)":
        return Args(kind, [], values)
    parsed = torch._C.parse_schema(schema)
    return Args(kind, [a.name for a in parsed.arguments], values)


def _constant(node: Any) -> Any:
    value = node.output().toIValue()
    if isinstance(value, torch.Tensor):
        raise UnsupportedOpError("tensor constants are not lowered; pass the tensor as an input")
    plain = (bool, int, float, str, list, tuple, torch.device)
    if value is not None and not isinstance(value, plain):
        raise UnsupportedOpError(f"a constant of type {type(value).__name__}")
    return value


def _where(node: Any, message: str) -> str:
    """The message, the node's IR line and its source range (file and line when scripted)."""
    ir_line = str(node).strip()
    source = node.sourceRange().rstrip()
    text = f"from_torchscript: {message}\n  IR: {ir_line}"
    return f"{text}\n{source}" if source else text


def _flatten(values: list[Any]) -> list[Any]:
    out: list[Any] = []
    for v in values:
        if isinstance(v, (list, tuple)):
            out.extend(_flatten(list(v)))
        else:
            out.append(v)
    return out
