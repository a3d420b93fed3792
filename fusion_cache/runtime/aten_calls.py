"""Prepared ATen calls: an ATen segment's views and torch call, resolved once per plan.

Note [Prepared ATen calls]: an ATen segment (Note [ATen segments] in schedulers/aten.py) runs a
few views and one torch call. Walking its records through the interpreter on every run cost
more host time than the torch call itself: the attention block's sdpfa segment normalizes the
bounds of three slices and rebuilds a reshape's size vector each time; the fusion as a whole
ran at 0.49x torch.compile on the H100, 0.81x with this and Note [Segmented replay] (in the
executor), the rest being the backend below. Everything but the
tensors' data is fixed by the plan's key (dtypes, shapes, strides, alignment, int inputs), so
the plan prepares the run once, on meta tensors of the inputs' shapes and strides:
- each operand the op reads through views becomes one `as_strided` of the input it views
  (sizes, strides and the storage offset past the input's own, as the views made them on
  meta), however many views led to it;
- constants, vectors and scalar arithmetic on sizes are evaluated once;
- the op's interpreter rule, the torch call itself, runs on an environment of those values
  and the run's inputs, so float and bool inputs (dropout_p, is_causal, scale), which the key
  does not fix, are read from each run;
- an sdpfa_fwd whose segment returns only the attention output (the logsumexp and seeds only
  sdpfa_bwd reads are not wanted) calls torch's sdpa dispatcher instead of flash attention,
  where that picks a faster backend (`sdpfa_output_only` in ir/interpret/aten.py): the
  attention block's device time was 30 us over torch.compile's for this alone.
- a segment that returns outputs of the op (the usual one) skips the interpreter's
  environment as well: the op's call (Note [ATen calls]), bound to its keyword arguments and
  constants once, is called on the operands directly (`direct`): a GEMM's is the torch
  function itself, an attention's one function of its tensors and flags. A segment returning
  something else (a view of the op's result) runs the op's rule on a filled environment (an
  Interpreter whose environment holds the values it reads, its infos and the plan's device).
Any op of ATEN_OPS goes through this, so a new ATen op needs its call and nothing here. A
segment this cannot prepare (a reshape that copies, scalar work on a float input) keeps the
interpreted run; all three compute the same function, and tests run them against each other.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

import torch

from fusion_cache.frontend.definition import _is_input_record
from fusion_cache.frontend.records import Record, Ref
from fusion_cache.frontend.values import TensorInfo
from fusion_cache.ir.interpret import evaluate
from fusion_cache.ir.interpret.aten import CALLS, sdpfa_output_only
from fusion_cache.ir.interpret.core import RULES, Interpreter, Rule, device_of
from schedulers.aten import ATEN_OPS

# an operand: (input position, sizes, strides, storage offset past the input's own), or the
# input itself (None after the position)
Operand = tuple[int, tuple[int, ...], tuple[int, ...], int] | tuple[int, None, None, None]


@dataclass(frozen=True)
class PreparedCall:
    record: Record  # the ATen op
    rule: Rule  # its interpreter rule: the torch call
    infos: list  # the definition's infos (rules read output dtypes from them)
    constants: tuple[tuple[int, Any], ...]  # state -> value, fixed by the plan
    inputs: tuple[tuple[int, int], ...]  # (input position, state) of scalars read each run
    operands: tuple[tuple[int, Operand], ...]  # state -> how to make it from the inputs
    outputs: tuple[int, ...]  # states returned, in output order
    # (input position, strides) of the tensors viewed through as_strided, and the run for
    # others: a replayed segment's input (another segment's result) carries no plan key
    strides: tuple[tuple[int, tuple[int, ...]], ...]
    interpreted: Callable[[Sequence[Any]], list[Any]]
    device: torch.device  # where the plan's inputs are (plans are per device)
    # the op's call (Note [ATen calls]), its arguments ((None, constant), or (input position,
    # None, a (Tensor method, arguments) view of it (view_recipe), or the (sizes, strides,
    # offset) of an as_strided view of it)) and which of its outputs the segment returns
    # (None: it returns its one output itself)
    direct: tuple[Callable, tuple, tuple[int, ...] | None] | None = None
    # the op is a matmul of two 2-D operands: torch.mm makes the same call with less on the
    # way (Note [GEMM entry])
    matrices: bool = False

    def __call__(self, values: Sequence[Any]) -> list[Any]:
        for pos, stride in self.strides:
            if values[pos].stride() != stride:
                return self.interpreted(values)
        if self.direct is not None:
            fn, specs, picks = self.direct
            args = []
            for pos, view in specs:
                if pos is None:
                    args.append(view)
                elif view is None:
                    args.append(values[pos])
                elif len(view) == 2:  # a view method (view_recipe)
                    args.append(view[0](values[pos], *view[1]))
                else:
                    args.append(reinterpret(values[pos], *view))
            out = fn(*args)
            return [out] if picks is None else [out[i] for i in picks]
        env = dict(self.constants)
        for pos, state in self.inputs:
            env[state] = values[pos]
        for state, (pos, size, stride, delta) in self.operands:
            t = values[pos]
            env[state] = t if size is None else t.as_strided(size, stride,
                                                              t.storage_offset() + delta)
        run = Interpreter((), self.infos, self.device)
        run.env = env
        for ref, value in zip(self.record.outputs, self.rule(run, self.record)):
            env[ref.index] = value
        return [env[s] for s in self.outputs]


def prepare_call(fd: Any, values: Sequence[Any]) -> PreparedCall | None:
    """The prepared run of ATen segment `fd` for inputs like `values` (Note [Prepared ATen
    calls]), or None where only the interpreter runs it."""
    try:
        return _prepare(fd, values)
    except Exception:  # noqa: BLE001 - the interpreted run raises the error that matters
        return None


def _prepare(fd: Any, values: Sequence[Any]) -> PreparedCall | None:
    infos = fd._infos
    run = Interpreter(fd._records, infos, torch.device("meta"))
    fixed: dict[int, Any] = {}  # states the plan fixes
    read: list[tuple[int, int]] = []  # scalar inputs read each run
    views: dict[int, tuple[int, torch.Tensor]] = {}  # tensor state -> (input position, meta)
    position = {ref.index: i for i, ref in enumerate(fd.input_refs())}
    op: Record | None = None
    for r in fd._records:
        out = r.outputs[0].index if r.outputs else None
        if _is_input_record(r):
            value = values[position[out]]
            if isinstance(value, torch.Tensor):
                meta = torch.empty_strided(value.shape, value.stride(), dtype=value.dtype,
                                           device="meta")  # fmt: skip
                views[out] = (position[out], meta)
                run.env[out] = meta
            else:
                run.env[out] = value
                if type(value) is int or isinstance(value, (list, tuple)):
                    fixed[out] = value  # ints and vectors are in the plan's key
                else:
                    read.append((position[out], out))
        elif r.kind == "scalar":
            run.env[out] = fixed[out] = r.kw("value")
        elif r.kind == "vector":
            if any(isinstance(e, Ref) and e.index not in fixed for e in r.kw("elements")):
                return None
            run.env[out] = fixed[out] = tuple(int(run.get(e)) for e in r.kw("elements"))
        elif r.kind == "op" and r.name in ATEN_OPS:
            op = r
        elif r.kind == "op":
            if any(isinstance(a, Ref) and a.kind != "T" and a.index not in fixed
                   for a in r.refs()):  # fmt: skip
                return None  # scalar work on a value the key does not fix
            results = (RULES.get(r.name) or RULES["<elementwise>"])(run, r)
            for ref, value in zip(r.outputs, results):
                run.env[ref.index] = value
                if not isinstance(infos[ref.index], TensorInfo):
                    fixed[ref.index] = value
                    continue
                src = _tensor_arg(r)
                if src is None or src not in views or not _same_storage(value, views[src][1]):
                    return None  # a tensor made anew (a copying reshape): not a view
                views[ref.index] = (views[src][0], value)
    if op is None:
        return None
    operands = []
    recipes: dict[int, tuple] = {}  # state -> a view method that makes it (Note above)
    for a in op.refs():
        if a.kind != "T" or a.index in dict(operands):
            continue
        pos, meta = views[a.index]
        root = run.env[fd.input_refs()[pos].index]
        if meta is root:
            operands.append((a.index, (pos, None, None, None)))
        else:
            operands.append((a.index, (pos, tuple(meta.shape), meta.stride(),
                                       meta.storage_offset() - root.storage_offset())))
            recipes[a.index] = view_recipe(root, meta)
    outputs = tuple(r.args[0].index for r in fd.output_records())
    rule = RULES[op.name]
    make, single = CALLS[op.name]
    call = make(op, infos)
    if op.name == "sdpfa_fwd" and set(outputs) == {op.outputs[0].index}:
        # the backend torch picks: nothing replays flash's seeds
        rule, call = _output_only_rule, sdpfa_output_only
    strides = tuple(sorted({(pos, values[pos].stride()) for _, (pos, size, _, _) in operands
                            if size is not None}))  # fmt: skip
    direct = _direct(op, call, single, outputs, dict(operands), fixed, dict(read), recipes)
    matrices = op.name == "matmul" and all(views[a.index][1].dim() == 2 for a in op.refs()
                                           if a.kind == "T")  # fmt: skip
    return PreparedCall(op, rule, infos, tuple(fixed.items()), tuple(read), tuple(operands),
                        outputs, strides, partial(interpret_segment, fd), device_of(values),
                        direct, matrices)  # fmt: skip


# Note [GEMM entry]: a region's GEMMs are matmuls of 2-D operands (the lowering views a
# linear layer's activations as rows). torch.matmul is a composite op: its entry checks the
# ranks and calls at::mm through the dispatcher a second time; inductor's generated code calls
# torch.mm itself. A replayed GEMM step of two 2-D operands calls torch.mm (AtenStep): the
# same kernel on the same operands, so the same result. H100, 2026-11-27: the Llama-style
# step's 87 GEMMs under cProfile (benchmarks.ab_steps --profile) 30 us each as torch.matmul,
# 24 as torch.mm (inductor's: 23); alone, back to back (benchmarks.aten_entry), 13.4 against
# 13.1 us: the entry's own cost is small, the rest of the in-step gap is not explained.


def _output_only_rule(run: Interpreter, r: Record) -> list:
    return sdpfa_output_only(*[run.get(a) for a in r.args])


def _direct(op: Record, call: Callable, single: bool, outputs: tuple[int, ...], operands: dict,
            fixed: dict, read: dict, recipes: dict) -> tuple | None:  # fmt: skip
    """The direct call of an ATen segment (Note [Prepared ATen calls]), or None where the
    segment returns something other than the op's outputs."""
    made = {ref.index: i for i, ref in enumerate(op.outputs)}
    if any(s not in made for s in outputs):
        return None
    if single:
        if outputs != (op.outputs[0].index,):
            return None
        picks = None
    else:
        picks = tuple(made[s] for s in outputs)
    position = {state: pos for pos, state in read.items()}
    specs = []
    for a in op.args:
        if isinstance(a, Ref) and a.kind == "T":
            if a.index not in operands:
                return None
            pos, size, stride, delta = operands[a.index]
            view = (size, stride, delta) if reinterpret_tensor is not None else recipes[a.index]
            specs.append((pos, None if size is None else view or (size, stride, delta)))
        elif isinstance(a, Ref) and a.index in fixed:
            specs.append((None, fixed[a.index]))
        elif isinstance(a, Ref) and a.index in position:  # a float or bool read each run
            specs.append((position[a.index], None))
        elif isinstance(a, Ref) or _holds_ref(a):
            return None
        else:
            specs.append((None, a))
    return call, tuple(specs), picks


# Note [Operand views]: where this torch has it, an operand viewed from an input is made by
# `_reinterpret_tensor` (the C call inductor's generated code makes its views with: no
# dispatcher, no argument parsing; half a view method's host time) from the sizes, strides
# and offset the plan prepared; the run checks the input's strides first, so the layout is
# the prepared one. Not an autograd view, which the runs, under no_grad, do not need.
try:
    from torch._C._dynamo.guards import _reinterpret_tensor as reinterpret_tensor
except ImportError:  # not in this torch (a private API): view methods and as_strided
    reinterpret_tensor = None


def _as_strided(t: torch.Tensor, size: tuple, stride: tuple, delta: int) -> torch.Tensor:
    return t.as_strided(size, stride, t.storage_offset() + delta)


# an operand's view of (sizes, strides, offset past the input's own)
reinterpret: Callable[..., torch.Tensor] = reinterpret_tensor or _as_strided


def view_recipe(root: torch.Tensor, view: torch.Tensor) -> tuple | None:
    """(Tensor method, its arguments) that makes `view` from `root` (meta tensors of the
    prepared layout): a transpose, a permutation, or a view of a contiguous tensor, at the
    same storage offset; None where only as_strided does. A method parses fewer arguments
    than as_strided's sizes, strides and offset (read from the tensor each run), and 70 to 75
    of a GPT-2 or Llama training step's ATen calls view an operand. Runs check the operand's
    strides first (PreparedCall.strides), so the method need only agree on this layout."""
    if view.storage_offset() != root.storage_offset():
        return None
    if view.dim() == root.dim():
        pairs = list(zip(root.shape, root.stride()))
        perm: list[int] = []
        for pair in zip(view.shape, view.stride()):
            found = next((d for d, p in enumerate(pairs) if p == pair and d not in perm), None)
            if found is None:
                break
            perm.append(found)
        else:
            if perm == list(range(root.dim())):
                return None  # the same layout (as_strided keeps it exact)
            if perm == [1, 0]:
                return (torch.Tensor.t, ())
            return (torch.Tensor.permute, (tuple(perm),))
    if root.is_contiguous() and view.is_contiguous() and view.numel() == root.numel():
        return (torch.Tensor.view, (tuple(view.shape),))
    return None


def _holds_ref(value: Any) -> bool:
    return isinstance(value, (tuple, list)) and any(isinstance(v, Ref) or _holds_ref(v)
                                                    for v in value)  # fmt: skip


def interpret_segment(fd: Any, values: Sequence[Any]) -> list[Any]:
    """The segment's records through the interpreter: what a prepared call computes, for
    segments it cannot prepare and inputs it was not prepared for."""
    env = evaluate(fd._records, fd._infos, fd.input_refs(), values)
    inputs = {v.untyped_storage().data_ptr() for v in values
              if isinstance(v, torch.Tensor) and v.numel()}  # fmt: skip
    out = []
    for r in fd.output_records():
        value = env[r.args[0].index]
        shared = value.numel() and value.untyped_storage().data_ptr() in inputs
        out.append(value.clone() if shared else value)  # never an alias of an input
    return out


def _tensor_arg(r: Record) -> int | None:
    """The one tensor a view record reads."""
    tensors = {a.index for a in r.refs() if a.kind == "T"}
    return tensors.pop() if len(tensors) == 1 else None


def _same_storage(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.untyped_storage()._cdata == b.untyped_storage()._cdata
