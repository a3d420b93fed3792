"""One fusion region of an aten FX graph: its FusionDefinition, and the module that runs it.

A region's definition depends on its inputs' dtypes, sizes and strides (they decide the
declared shape codes and contiguity), so `RegionCall` keeps one definition per input
signature. Definitions of identical regions are identical record sequences, so the trie
gives them the same fusion id, and the store and warm restarts apply to them as to any.
"""
from __future__ import annotations

import operator
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch.fx import GraphModule, Node

from fusion_cache.frontend.definition import FusionDefinition
from fusion_cache.frontend.dtypes import DataType, from_torch
from fusion_cache.ir.output_layout import preferred_order
from fusion_cache.runtime.aten_calls import reinterpret_tensor as _reinterpret
from fusion_cache.runtime.plans import input_key
from fusion_cache.runtime.sequence import Guard, LaunchSequence, sequence_for

from .aten_table import lower_op
from .fx_support import op_name
from .lowering import (
    LoweringContext,
    LoweringError,
    bind_schema,
    is_handle,
    is_tensor,
)


@dataclass(frozen=True)
class InputSpec:
    """What a region's definition declares for one input (a tensor or a Python scalar)."""

    dtype: Any  # torch.dtype, or the Python type of a scalar
    sizes: tuple[int, ...] = ()
    strides: tuple[int, ...] = ()
    cpu_scalar: bool = False
    is_tensor: bool = True


def spec_of(value: Any) -> InputSpec:
    if isinstance(value, torch.Tensor):
        return InputSpec(value.dtype, tuple(value.shape), tuple(value.stride()),
                         value.device.type == "cpu" and value.dim() == 0)  # fmt: skip
    if isinstance(value, (bool, int, float)):
        return InputSpec(type(value), is_tensor=False)
    raise LoweringError(f"region input of type {type(value).__name__} is not a tensor or scalar")


_SCALAR_DTYPES = {bool: DataType.Bool, int: DataType.Int, float: DataType.Double}


def _define_input(fd: FusionDefinition, spec: InputSpec) -> Any:
    if not spec.is_tensor:
        return fd.define_scalar(dtype=_SCALAR_DTYPES[spec.dtype])
    return fd.define_tensor(sizes=list(spec.sizes), strides=list(spec.strides),
                            dtype=from_torch(spec.dtype), is_cpu=spec.cpu_scalar)  # fmt: skip


class Constants(tuple):
    """(output position, value) of the region outputs the fusion does not return, in position
    order: Python values the lowering knows, and DerivedOutputs (Note [View outputs]).
    `hidden`: fusion outputs past the region's own, read only by derived outputs."""

    hidden = 0


@dataclass(frozen=True)
class DerivedOutput:
    """Note [View outputs]: an aten graph returns views (x.view(b * t, c) saved for a GEMM's
    backward, w.t() of a weight cast for autocast) that eager makes without a kernel. A fusion
    output is a tensor of its own, so such an output cost a copy kernel (GPT-2 training: two
    of the four launches around each linear layer's GEMM). The region returns instead the
    same torch views of the tensor they view: a fusion output (`output`, perhaps one added
    for this alone) or a region input (`input`), as inductor returns reinterpreted buffers.
    `steps`: (Tensor method, its arguments), in order."""

    source: int
    from_input: bool
    steps: tuple[tuple[Any, tuple], ...]

    def make(self, outs: Sequence[Any], args: Sequence[Any]) -> Any:
        t = args[self.source] if self.from_input else outs[self.source]
        for method, arguments in self.steps:
            t = method(t, *arguments)
        return t


_aten = torch.ops.aten
# view ops an output may be made by (Note [View outputs]): each as the Tensor method that
# replays it; view and _unsafe_view through reshape, which copies where a layout cannot be
# viewed (never with the contiguous fusion outputs they read here, but never wrong)
_VIEW_METHODS = {
    _aten.view.default: torch.Tensor.reshape,
    _aten._unsafe_view.default: torch.Tensor.reshape,
    _aten.reshape.default: torch.Tensor.reshape,
    _aten.permute.default: torch.Tensor.permute,
    _aten.t.default: torch.Tensor.t,
    _aten.transpose.int: torch.Tensor.transpose,
    _aten.unsqueeze.default: torch.Tensor.unsqueeze,
    _aten.squeeze.dim: torch.Tensor.squeeze,
    _aten.squeeze.dims: torch.Tensor.squeeze,
    _aten.expand.default: torch.Tensor.expand,
}


def _view_chain(out: Any) -> tuple[Node | None, tuple]:
    """(the node `out` views through view ops of static arguments, the replay steps), or
    (None, ()) where `out` is no such view."""
    steps = []
    node = out
    while isinstance(node, Node) and node.op == "call_function" and node.target in _VIEW_METHODS:
        rest = node.args[1:]
        if not isinstance(node.args[0], Node) or _has_node(rest) or node.kwargs:
            break
        steps.append((_VIEW_METHODS[node.target], tuple(rest)))
        node = node.args[0]
    if not steps or node is out:
        return None, ()
    return node, tuple(reversed(steps))


def _has_node(value: Any) -> bool:
    """Whether a node argument holds a Node (a symbolic size) anywhere."""
    found = False

    def visit(a: Any) -> Any:
        nonlocal found
        found = found or isinstance(a, Node) or not isinstance(a, (int, list, tuple, type(None)))
        return a

    torch.fx.node.map_aggregate(value, visit)
    return found
# a region holds what the partitioner joined: with GEMMs and attention lowered, a whole
# transformer's forward (GPT-2's six layers: about 1500 records), past the 1024 records nvFuser's
# frontend allows a definition by default
REGION_MAX_RECORDS = 1 << 16


def build_region(gm: GraphModule, specs: Sequence[InputSpec]) -> tuple[FusionDefinition,
                                                                          Constants]:  # fmt: skip
    """Lower the region's subgraph into a closed FusionDefinition; raises LoweringError.
    Outputs the lowering knows as Python values (an attention op's static sequence length,
    an undefined tensor's None) are not fusion outputs: they come back as constants."""
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    if len(placeholders) != len(specs):
        raise LoweringError(f"region has {len(placeholders)} inputs, got {len(specs)} specs")
    fd = FusionDefinition(max_length=REGION_MAX_RECORDS)
    with fd:
        ctx = LoweringContext(fd)
        env: dict[Node, Any] = {}
        for node, spec in zip(placeholders, specs):
            env[node] = _define_input(fd, spec)
            ctx.hint(env[node], spec.sizes if spec.is_tensor else None)
        constants: Constants = ()
        for node in gm.graph.nodes:
            if node.op == "call_function":
                env[node] = _lower_node(ctx, node, env)
            elif node.op == "output":
                constants = _add_outputs(fd, node, env)
            elif node.op != "placeholder":
                raise LoweringError(f"unexpected {node.op} node {node.name} in a region")
    return fd, constants


def _lower_node(ctx: LoweringContext, node: Node, env: dict[Node, Any]) -> Any:
    if node.target is operator.getitem:
        src, index = node.args
        value = env[src][index]
        if value is None and node.meta.get("val") is not None:
            raise LoweringError(f"{node.name}: output {index} of {src} is not lowered")
        return value
    name = op_name(node)
    args = torch.fx.node.map_arg(node.args, lambda n: env[n])
    kwargs = torch.fx.node.map_arg(node.kwargs, lambda n: env[n])
    try:
        bound = bind_schema(name, node.target._schema, args, kwargs)
        result = lower_op(ctx, name, bound)
        return _match_meta(ctx, result, node.meta.get("val"), node.name)
    except LoweringError as err:
        raise type(err)(f"{node.name} = {name}: {err}") from err
    except (TypeError, ValueError) as err:
        raise LoweringError(f"{node.name} = {name}: {type(err).__name__}: {err}") from err


def _match_meta(ctx: LoweringContext, result: Any, val: Any, where: str) -> Any:
    """Give each result the dtype torch's own kernel gives it, and check its rank."""
    if isinstance(result, tuple) and isinstance(val, (tuple, list)):
        return tuple(_match_meta(ctx, r, v, where) for r, v in zip(result, val))
    if not (is_tensor(result) and isinstance(val, torch.Tensor)):
        return result
    if result.ndim != val.dim():
        raise LoweringError(f"{where}: lowered to rank {result.ndim}, torch gives rank {val.dim()}")
    want = from_torch(val.dtype)
    if result.dtype is not want:
        result = ctx.ops.cast(result, want)
    ctx.hint(result, tuple(val.shape))
    return result


def _add_outputs(fd: FusionDefinition, node: Node, env: dict[Node, Any]) -> Constants:
    outs = node.args[0] if isinstance(node.args[0], (tuple, list)) else (node.args[0],)
    inputs = set(fd.inputs())
    placeholders = {n: i for i, n in enumerate(n for n in node.graph.nodes
                                               if n.op == "placeholder")}  # fmt: skip
    constants: list[tuple[int, Any]] = []
    derived: list[tuple[int, Node, tuple]] = []
    returned: dict[int, int] = {}  # fusion value index -> its fusion output position
    for k, out in enumerate(outs):
        value = env[out] if isinstance(out, Node) else out
        if value is None or isinstance(value, (bool, int, float)):
            constants.append((k, value))
            continue
        if not is_handle(value):
            raise LoweringError(f"region output {out} lowered to {value!r}, not a fusion value")
        base, steps = _view_chain(out)
        if base is not None and (base in placeholders or _is_fusion_tensor(env.get(base),
                                                                           inputs)):  # fmt: skip
            derived.append((k, base, steps))  # Note [View outputs]
            continue
        if value.index in inputs:
            value = fd.ops.set(value)  # an input passed through: the output gets its own copy
        returned.setdefault(value.index, len(returned))
        fd.add_output(value, stride_order=_view_layout(out) or _preferred_layout(fd, value))
    n_real = len(returned)
    for k, base, steps in derived:
        if base in placeholders:
            constants.append((k, DerivedOutput(placeholders[base], True, steps)))
            continue
        value = env[base]
        if value.index not in returned:  # read by this output alone: a hidden fusion output
            returned[value.index] = len(returned)
            fd.add_output(value)
        constants.append((k, DerivedOutput(returned[value.index], False, steps)))
    result = Constants(sorted(constants, key=lambda c: c[0]))
    result.hidden = len(returned) - n_real
    return result


_TRANSPOSES = frozenset({"t", "transpose", "permute"})


def _view_layout(node: Any) -> list[int] | None:
    """The stride order torch gives a transposed view the region returns (a weight's t() the
    backward saves), where it is dense: the output is written in that layout, so the region
    that reads it sees the strides it was traced with and keeps its definition (and the
    kernels planned ahead for it, Note [Compiles ahead]) rather than being defined again."""
    val = node.meta.get("val") if isinstance(node, Node) else None
    if not isinstance(val, torch.Tensor) or val.dim() < 2 or op_name(node).split("::")[-1] \
            not in _TRANSPOSES:  # fmt: skip
        return None
    return None if val.is_contiguous() else dense_order(val)


def _preferred_layout(fd: FusionDefinition, value: Any) -> list[int] | None:
    """Channels-last for a 4-D or 5-D output of a region around channels-last convolutions
    (Note [Channels-last convolutions]), so the next region's convolution takes it as is."""
    order = preferred_order(fd, value.ndim) if is_tensor(value) else ()
    return list(order) or None


def dense_order(t: torch.Tensor) -> list[int] | None:
    """The stride order (Note [Output layouts]) of a tensor whose elements fill its storage
    span in some order of its dims; None for a view into a larger buffer (a split's piece)."""
    by_stride = sorted(range(t.dim()), key=lambda d: (t.stride(d), -d))
    dense = 1
    for d in by_stride:  # inner to outer: each stride is what the dims inside it fill
        if t.shape[d] != 1 and t.stride(d) != dense:
            return None
        dense *= t.shape[d]
    order = [0] * t.dim()
    for rank, d in enumerate(by_stride):
        order[d] = rank
    return order


def _is_fusion_tensor(value: Any, inputs: set) -> bool:
    return is_handle(value) and is_tensor(value) and value.index not in inputs


def _with_constants(outs: list, constants: Constants, args: Sequence[Any]) -> list:
    """The region's outputs: the fusion's own, with its constants and derived outputs put
    in their places and its hidden outputs dropped."""
    hidden = constants.hidden if constants.__class__ is Constants else 0
    result = outs[: len(outs) - hidden] if hidden else outs[:]  # outs is read below
    for k, value in constants:
        cls = value.__class__
        if cls is RecordedView:  # Note [Recorded views]
            t = args[value.source] if value.from_input else outs[value.source]
            if value.strides is None or t.stride() == value.strides:
                value = _reinterpret(t, value.size, value.stride, value.offset)
            else:
                value = value.derived.make(outs, args)
        elif cls is DerivedOutput:
            value = value.make(outs, args)
        result.insert(k, value)
    return result


# Note [Recorded views]: a derived output (Note [View outputs]) replayed through its Tensor
# methods costs a dispatcher call a view (2 to 4 us each on the H100's host; a Llama-style
# step returns about 60 of them). Its sizes, strides and storage offset past its source's
# are fixed by the source's layout: a region input's the guard checks, a fusion output's the
# sequence allocates (checked on each call all the same: an ATen segment's result, such as an
# attention output, is laid out by torch). So after the first call of a signature the view is
# made in one C call, torch's `_reinterpret_tensor` (the one inductor's generated code makes
# its views with), from the layout that call gave; a view chain that copied (a reshape of a
# layout it cannot view) keeps its methods. Without that call in this torch, the methods stay.


@dataclass(frozen=True)
class RecordedView:
    """A DerivedOutput's view as its first call made it (Note [Recorded views]): `strides`,
    the source's strides to check (None for a region input: the guard checks them; and for
    an output the sequence lays out itself)."""

    source: int
    from_input: bool
    size: tuple[int, ...]
    stride: tuple[int, ...]
    offset: int
    strides: tuple[int, ...] | None
    derived: DerivedOutput


def record_views(constants: Constants, outs: Sequence[Any], args: Sequence[Any],
                 made: Sequence[Any], pinned: frozenset[int] = frozenset()) -> Constants:  # fmt: skip
    """`constants` with each derived output that `made` (the region's outputs of the call on
    `outs` and `args`) shows to be a view of its source replaced by its RecordedView;
    `pinned`: the outputs whose layout the sequence fixes, no more checked than inputs are
    (Note [Operands laid out by their kernels] in fusion_cache/runtime/sequence.py)."""
    if _reinterpret is None or not any(v.__class__ is DerivedOutput for _, v in constants):
        return constants
    recorded = []
    for k, value in constants:
        if value.__class__ is DerivedOutput:
            src = args[value.source] if value.from_input else outs[value.source]
            view = made[k]
            if (isinstance(src, torch.Tensor) and isinstance(view, torch.Tensor)
                    and view.dtype == src.dtype and view.device == src.device
                    and _same_storage(view, src)):  # fmt: skip
                value = RecordedView(value.source, value.from_input, tuple(view.shape),
                                     view.stride(), view.storage_offset() - src.storage_offset(),
                                     None if value.from_input or value.source in pinned
                                     else src.stride(), value)  # fmt: skip
        recorded.append((k, value))
    result = Constants(recorded)
    result.hidden = constants.hidden
    return result


def _same_storage(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.untyped_storage()._cdata == b.untyped_storage()._cdata


class RegionCall:
    """Runs one region; the graph calls it in place of the region's submodule.

    Note [Region call]: a region is called once per step with inputs of the same signature,
    so its first call with a signature records a launch sequence (Note [Launch sequence] in
    fusion_cache/runtime/sequence.py) and later calls replay it after a guard on their
    shapes, strides, dtypes and alignment, with no trip through execute(). The guard of the
    last sequence run is tried first; a miss looks the signature up, and a new signature
    defines the region again (the definition's shape codes and contiguity come from sizes
    and strides) and records a sequence for it. Devices are not guarded: torch.compile's
    guards fix the graph inputs' devices, and each op's outputs follow its inputs.

    A plain callable rather than a Module: the graph calls it as a function, without
    Module.__call__'s hook checks on every step.
    """

    def __init__(self, name: str, gm: GraphModule | Callable[[], GraphModule],
                 fd: FusionDefinition, specs: tuple[InputSpec, ...], constants: Constants = (),
                 returns_tuple: bool | None = None) -> None:  # fmt: skip
        """`gm`: the region's subgraph, or what loads it when first needed (a region rebuilt
        from torch's AOTAutograd cache, Note [AOT cache], given `returns_tuple`)."""
        self.__name__ = self.__qualname__ = name  # FX's code generator names calls by these
        self.__module__ = __name__
        self._region_graph = gm if isinstance(gm, GraphModule) else None
        self._load_graph = None if isinstance(gm, GraphModule) else gm
        self._definitions: dict[tuple, tuple[FusionDefinition, Constants]] = {
            specs: (fd, constants)}
        self.fusion_id = fd.id()
        if returns_tuple is None:
            # the submodule returned a tuple or a single value: the caller indexes accordingly
            output = next(n for n in self.region_graph.graph.nodes if n.op == "output")
            returns_tuple = isinstance(output.args[0], (tuple, list))
        self._returns_tuple = returns_tuple
        self._sequences: dict[tuple, tuple[Guard, LaunchSequence, Constants]] = {}
        self._last: tuple[Guard, LaunchSequence, Constants] | None = None
        self.record_s = 0.0  # spent recording sequences (planning, compiling, loading)
        # definitions built again for strides (or sizes) other than the traced ones: a region
        # planned ahead for the traced ones (Note [Compiles ahead]) is planned again
        self.redefined = 0

    def __call__(self, *args: Any) -> Any:
        last = self._last
        if last is not None and last[0].matches(args):
            outs = last[1].run(args)
            if last[2]:
                outs = _with_constants(outs, last[2], args)
        else:
            outs = self._record_or_find(args)
        return tuple(outs) if self._returns_tuple else outs[0]

    def _record_or_find(self, args: Sequence[Any]) -> list:
        key = input_key(args)
        entry = self._sequences.get(key)
        if entry is not None:
            self._last = entry
            outs = entry[1].run(args)
        else:
            start = time.perf_counter()
            fd, constants = self.definition_for(args)
            seq, outs = sequence_for(fd, args)
            made = _with_constants(outs, constants, args) if constants else outs
            constants = record_views(constants, outs, args, made, seq.pinned_outputs())
            self._last = self._sequences[key] = (Guard(args), seq, constants)
            self.record_s += time.perf_counter() - start
            return made
        return _with_constants(outs, entry[2], args) if entry[2] else outs

    def definition_for(self, args: Sequence[Any], counted: bool = True,
                       ) -> tuple[FusionDefinition, Constants]:  # fmt: skip
        """`counted`: a first call's (redefined counts it), not one defined ahead."""
        key = tuple(spec_of(a) for a in args)
        found = self._definitions.get(key)
        if found is None:  # strides (or sizes) differ from the traced ones: define again
            found = self._definitions[key] = build_region(self.region_graph, key)
            self.redefined += counted
        return found

    @property
    def region_graph(self) -> GraphModule:
        if self._region_graph is None:
            self._region_graph = self._load_graph()  # type: ignore[misc]
            self._load_graph = None
        return self._region_graph

    @property
    def traced(self) -> tuple[tuple[InputSpec, ...], FusionDefinition, Constants]:
        """The specs the region was lowered for, its definition and constants for them."""
        specs, (fd, constants) = next(iter(self._definitions.items()))
        return specs, fd, constants

    @property
    def definitions(self) -> list[tuple[tuple[InputSpec, ...], FusionDefinition, Constants]]:
        """Every definition built so far (the traced one first), with its specs and constants."""
        return [(specs, fd, constants) for specs, (fd, constants) in self._definitions.items()]

    def define(self, specs: tuple[InputSpec, ...], fd: FusionDefinition,
               constants: Constants) -> None:  # fmt: skip
        """Take a definition built elsewhere for `specs` (one a fused form kept, Note [Fused
        graph form]), so a call with them needs no subgraph."""
        self._definitions.setdefault(specs, (fd, constants))

    @property
    def returns_tuple(self) -> bool:
        return self._returns_tuple

    @property
    def sequences(self) -> list[LaunchSequence]:
        return [entry[1] for entry in self._sequences.values()]

    def __repr__(self) -> str:
        return f"RegionCall({self.__name__}, fusion {self.fusion_id})"
