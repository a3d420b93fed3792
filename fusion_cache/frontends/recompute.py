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


def aot_options(graphs: bool = False) -> dict[str, Any]:
    """What the backend passes aot_autograd: the partitioner and decompositions of this note
    where its switch is on (Note [Unmeasured switches] in schedulers/tuning.py), else none.
    `graphs`: for the CUDA-graph mode, where the min-cut is on unless FUSION_CACHE_MIN_CUT=0
    (Note [Min-cut under CUDA graphs])."""
    from schedulers.tuning import switched_on

    if switched_on("MIN_CUT") or (graphs and min_cut_under_graphs()):
        return {"partition_fn": partition_fn(), "decompositions": decompositions()}
    if switched_on("SAVED_VIEWS_REDONE"):
        return {"partition_fn": _default_views_redone}
    return {}


# Note [Min-cut under CUDA graphs]: a replayed graph costs the host almost nothing, so the step
# is the GPU's, and the min-cut's smaller saved set (no f32 log-softmax written and read back)
# shows there. H100 80GB HBM3, 19:19 UTC, benchmarks.ab_steps, graph mode against graph mode
# with the min-cut, 4 rounds of 8 steps interleaved (results/ab-steps-graphs-mincut-*):
# Llama-style 2.60 against 2.94 ms (0.886, 3 of 4 rounds faster), GPT-2 5.26 against 5.39
# (0.979, 4 of 4). Without graphs the step is host-bound and the min-cut did not win (Note
# [Unmeasured switches]), so there it stays behind its switch. The graph mode does not use the
# AOT cache (Note [AOT cache]), so no cache key has to name this choice. On by default (main 9b28f13,
# 19:22 UTC, same A/B with FUSION_CACHE_MIN_CUT=0 as the other side): Llama-style 3.01 against
# 3.32 ms (4 of 4 rounds), GPT-2 5.51 against 5.51; tests/gpu/test_models_gpu.py 12 passed.
def min_cut_under_graphs() -> bool:
    """Note [Min-cut under CUDA graphs]: on unless FUSION_CACHE_MIN_CUT turns it off."""
    from fusion_cache.frontend.options import env_flag

    return env_flag("FUSION_CACHE_MIN_CUT", True)


def cache_safe(options: dict[str, Any]) -> bool:
    """Whether graphs compiled under these options may go in torch's AOTAutograd cache, whose
    key names no partitioner nor decompositions: none, Note [Saved views redone]'s
    partitioner, or the min-cut's with its decompositions, as aot_options gives them (each
    chosen by a switch, and the switches are in the backend's cache tag, knobs_tag in
    aot_cache.py)."""
    return (not options or options == {"partition_fn": _default_views_redone}
            or options == {"partition_fn": _partition, "decompositions": decompositions()})


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


# views whose arguments besides the source are constants (Note [Saved views redone]); not
# _unsafe_view, whose result is no view to autograd, so it was never detached
_REDONE_VIEWS = frozenset({aten.t.default, aten.transpose.int, aten.permute.default,
                           aten.view.default, aten.unsqueeze.default, aten.squeeze.dim,
                           aten.squeeze.dims, aten.expand.default, aten.slice.Tensor,
                           aten.select.int, aten.alias.default})  # fmt: skip


def _default_views_redone(joint: torch.fx.GraphModule, joint_inputs: Any, **kwargs: Any) -> Any:
    from torch._functorch.partitioners import default_partition

    from schedulers.tuning import switched_on

    if switched_on("SAME_VIEWS_ONCE"):
        same_views_once(joint.graph)
    redo_saved_views(joint)
    return default_partition(joint, joint_inputs, **kwargs)


def same_views_once(graph: torch.fx.Graph) -> int:
    """Note [Same views once]: a model that takes the same view of a tensor twice (the
    Llama-style model's RoPE slices its cos and sin tables once for the query heads and once
    for the key heads) gave a region one input per view, so the segmenter saw the query and
    key heads' RoPE read different tables and never tried them in one kernel; inductor's
    min-cut partitioner deduplicates the joint graph (fx_graph_cse), the default one does
    not. Here a view op with the same source and constant arguments as an earlier one is
    that one (views compute nothing, so this changes no value); the graph's outputs keep
    their own nodes, and a backward's view is not taken for a forward's (the forward would
    save it). Returns how many were merged."""
    outputs = {n for n in graph.nodes if n.op == "output"}
    returned = {a for o in outputs for a in o.all_input_nodes}
    forward, _ = _forward_part(graph)
    seen: dict[tuple, torch.fx.Node] = {}
    merged = 0
    for node in list(graph.nodes):
        if not _is_redone_view(node) or node in returned:
            continue
        try:
            key = (node in forward, node.target, node.args[0], *map(_frozen, node.args[1:]))
            hash(key)
        except TypeError:  # a symbolic size: left alone
            continue
        first = seen.setdefault(key, node)
        if first is not node:
            node.replace_all_uses_with(first)
            graph.erase_node(node)
            merged += 1
    return merged


def _frozen(value: Any) -> Any:
    return tuple(map(_frozen, value)) if isinstance(value, (list, tuple)) else value


def _forward_part(graph: torch.fx.Graph) -> tuple[set, Any]:
    """(the forward's nodes, its last node) as the default partitioner places them: every
    node but the tangents up to the last one tagged forward or a primal."""
    from torch._functorch._aot_autograd.utils import _is_fwd_seed_offset, _is_primal, _is_tangent

    last = None
    for node in graph.nodes:
        if node.meta.get("partitioner_tag") == "is_forward" or _is_primal(node) or (
                _is_fwd_seed_offset(node)):  # fmt: skip
            last = node
    forward = set()
    for node in graph.nodes:
        if not _is_tangent(node):
            forward.add(node)
        if node is last:
            break
    return forward, last


def _is_redone_view(node: Any) -> bool:
    return (node.op == "call_function" and node.target in _REDONE_VIEWS and not node.kwargs
            and isinstance(node.args[0], torch.fx.Node)
            and not any(isinstance(a, torch.fx.Node) for a in node.args[1:]))  # fmt: skip


def _base(node: Any) -> Any:
    while _is_redone_view(node):
        node = node.args[0]
    return node


def redo_saved_views(joint: torch.fx.GraphModule) -> int:
    """Note [Saved views redone]: give the backward's readers of each forward view chain of
    a graph input a copy of the chain after the forward's last node (an input's layout is
    the one traced; an intermediate's may differ where a region made it); returns how many
    views were copied."""
    forward, last = _forward_part(joint.graph)
    if last is None:
        return 0
    copies: dict[Any, Any] = {}
    anchor = [last]

    def copy_of(node: Any) -> Any:
        if not _is_redone_view(node):
            return node  # the chain's base: saved instead of the view
        if node not in copies:
            src = copy_of(node.args[0])
            with joint.graph.inserting_after(anchor[0]):
                made = joint.graph.call_function(node.target, (src, *node.args[1:]))
            made.meta = {k: v for k, v in node.meta.items() if k != "partitioner_tag"}
            copies[node] = anchor[0] = made
        return copies[node]

    for node in list(joint.graph.nodes):
        if node not in forward or not _is_redone_view(node) or _base(node).op != "placeholder":
            continue
        readers = [u for u in node.users if u not in forward]
        if readers:
            made = copy_of(node)
            for user in readers:
                user.replace_input_with(node, made)
    if copies:
        joint.graph.lint()
        joint.recompile()
    return len(copies)


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
