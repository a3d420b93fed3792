"""ATen segments at run time (Note [ATen segments] in schedulers/aten.py): a plan that holds
no kernels, and a run that makes the op's torch call on the segment's inputs.

Note [ATen segment calls]: a training step makes a hundred of these calls (every GEMM and
attention, forward and backward), so a call is kept to what eager's own call of the op
costs plus a few dict writes: the first run turns the segment's records into a list of
(rule, record) steps with its constants filled in, and later runs walk that list on the
inputs; no pass over the definition's records, no input and output lookups.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from fusion_cache.ir.interpret import evaluate
from fusion_cache.ir.interpret.core import RULES, Interpreter, device_of
from schedulers.aten import AtenProgram
from schedulers.base import LaunchSpec

if TYPE_CHECKING:
    from fusion_cache.frontend.definition import FusionDefinition


@dataclass
class AtenPlan:
    spec: LaunchSpec  # outputs and description; no kernels
    program: AtenProgram
    refs: list = field(default_factory=list)  # kernels compiled for it: none
    # Note [ATen segment calls]: (input states, constants, (rule, record) steps, output
    # states), made on the first run; None where a record needs the general walk
    steps: Any = field(default=None, repr=False, compare=False)

    def describe(self) -> str:
        return f"ATen {self.program.describe().removeprefix('aten: ')}"


_GENERAL = "general"  # a plan whose records the step list does not cover


def _steps_of(fd: FusionDefinition, values: Sequence[Any]) -> Any:
    """(input states, constants, steps, output states, device) of the segment's records, or
    _GENERAL where one is a vector made at run time (the general walk, `evaluate`, handles
    it). The device is the first run's: the plan's key holds the inputs' devices."""
    inputs = tuple(ref.index for ref in fd.input_refs())  # in the order of the values
    consts, steps = {}, []
    for r in fd._records:  # as evaluate walks them
        if r.outputs and r.outputs[0].index in inputs:
            continue
        if r.kind == "scalar":
            consts[r.outputs[0].index] = r.kw("value")
        elif r.kind == "vector":
            return _GENERAL
        elif r.kind == "op":
            steps.append((RULES.get(r.name) or RULES["<elementwise>"], r))
    outputs = tuple(r.args[0].index for r in fd.output_records())
    return inputs, consts, tuple(steps), outputs, device_of(values)


def run_aten(fd: FusionDefinition, plan: AtenPlan, values: Sequence[Any]) -> list[Any]:
    """The segment's records on its inputs: views and the one op, each the torch call its
    interpreter rule makes, on the inputs' device. Results keep torch's strides (flash
    attention's output is a transposed view): a segment that needs them contiguous gets
    them so (Segment.dense_inputs)."""
    steps = plan.steps
    if steps is None:
        steps = plan.steps = _steps_of(fd, values)
    if steps is _GENERAL:
        env = evaluate(fd._records, fd._infos, fd.input_refs(), values)
        outs = [env[r.args[0].index] for r in fd.output_records()]
    else:
        inputs, consts, ops, outputs, device = steps
        run = Interpreter(fd._records, fd._infos, device)
        env = run.env
        env.update(consts)
        env.update(zip(inputs, values))
        for impl, r in ops:
            for ref, value in zip(r.outputs, impl(run, r)):
                env[ref.index] = value
        outs = [env[s] for s in outputs]
    # never an alias of an input: only a result that is a view (flash attention's output is
    # one) may share an input's storage; a fresh result needs no look
    for o in outs:
        if isinstance(o, torch.Tensor) and o._base is not None:
            return _unaliased(outs, values)
    return outs


def _unaliased(outs: list, values: Sequence[Any]) -> list:
    storages = {v.untyped_storage().data_ptr() for v in values
                if isinstance(v, torch.Tensor) and v.numel()}  # fmt: skip
    return [o.clone() if isinstance(o, torch.Tensor) and o.numel()
            and o.untyped_storage().data_ptr() in storages else o for o in outs]  # fmt: skip
