"""What the forward saves for the backward: the partitioner and decompositions the backend
asks AOTAutograd for.

Note [Recompute in the backward]: AOTAutograd's default partitioner saves every tensor the
backward reads. A cross-entropy then saved its fp32 log-softmax, a [tokens, vocab] tensor
the forward writes and the backward reads back (Llama-style, 2048 x 32000: 262 MB each
way, about 90 us of an H100 each), where inductor saves the bf16 logits the forward has
anyway plus two numbers a row and redoes exp(x - max - log(sum)) inside the backward's own
kernel. The backend does as inductor does:
- the min-cut partitioner (`min_cut_rematerialization_partition`), which saves the
  smallest set of tensors from which the backward can redo cheap work (pointwise ops,
  views; reductions only where their output is not much smaller than their input);
- log-softmax and its gradient decomposed into amax, sub, exp, sum and log, which the
  min-cut may redo (as single ops it could only save their outputs);
- nll_loss_backward written from its target and the classes' count alone: torch's op reads
  the log-probabilities for their shape only, and as an argument they had to be saved.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

aten = torch.ops.aten


def aot_options() -> dict[str, Any]:
    """What the backend passes aot_autograd: the partitioner and decompositions of this note
    where its switch is on (Note [Unmeasured switches] in schedulers/tuning.py), else none."""
    from schedulers.tuning import switched_on

    if not switched_on("MIN_CUT"):
        return {}
    return {"partition_fn": partition_fn(), "decompositions": decompositions()}


def partition_fn() -> Callable:
    return _partition


def _partition(joint: torch.fx.GraphModule, joint_inputs: Any, **kwargs: Any) -> Any:
    """The min-cut, on the joint graph with its detaches dropped: a detach means nothing in
    a graph autograd no longer runs, and the min-cut may not redo one (log-softmax's
    backward reads its output through a detach, which made the output a saved tensor)."""
    from torch._functorch.partitioners import min_cut_rematerialization_partition

    for node in list(joint.graph.nodes):
        if node.op == "call_function" and node.target is aten.detach.default:
            node.replace_all_uses_with(node.args[0])
            joint.graph.erase_node(node)
    joint.recompile()
    return min_cut_rematerialization_partition(joint, joint_inputs, compiler="inductor",
                                               **kwargs)  # fmt: skip


def decompositions() -> dict:
    from torch._decomp import get_decompositions

    table = get_decompositions([aten._log_softmax, aten._log_softmax_backward_data])
    table[aten.nll_loss_backward.default] = _nll_loss_backward
    return table


def _nll_loss_backward(grad_output: torch.Tensor, self: torch.Tensor, target: torch.Tensor,
                       weight: torch.Tensor | None, reduction: int, ignore_index: int,
                       total_weight: torch.Tensor) -> Any:  # fmt: skip
    """d loss / d log-probabilities of [N, C] without weights: -grad (over the total weight
    for 'mean') at each row's target class, 0 elsewhere and on ignored rows; `self` is read
    for its shape, dtype and device only. Other forms stay torch's op (NotImplemented)."""
    if self.dim() != 2 or target.dim() != 1 or weight is not None or reduction not in (0, 1, 2):
        return NotImplemented
    classes = torch.arange(self.shape[1], device=self.device)
    hit = classes.unsqueeze(0) == target.unsqueeze(1)
    valid = (target != ignore_index).to(grad_output.dtype)
    scale = -(grad_output * valid)  # grad_output: 0-dim, or [N] for reduction 'none'
    if reduction == 1:
        scale = scale / total_weight
    zero = torch.zeros((), dtype=scale.dtype, device=self.device)
    return torch.where(hit, scale.unsqueeze(1), zero).to(self.dtype)
