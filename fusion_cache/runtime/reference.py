"""The reference evaluator's run: a fusion computed with torch ops (the interpreter in
fusion_cache/ir/interpret), outputs laid out as execute returns them. It runs CPU inputs and
serves as the fallback when no kernel can be made."""
from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch

from fusion_cache.frontend.dtypes import to_torch
from fusion_cache.ir.aliases import has_aliases, view_outputs
from fusion_cache.ir.interpret import Env, evaluate
from fusion_cache.ir.output_layout import output_stride_orders, strides_for

if TYPE_CHECKING:
    from fusion_cache.frontend.definition import FusionDefinition


def run_reference(fd: FusionDefinition, values: Sequence[Any], device: Any = None) -> list[Any]:
    """`device`: where tensors made from scalars alone go (default: the inputs' device)."""
    env = evaluate(fd._records, fd._infos, fd.input_refs(), values, device)
    return collect_outputs(fd, env, values)


def collect_outputs(fd: FusionDefinition, env: Env, values: Sequence[Any]) -> list[Any]:
    """Apply aliases and output stride orders; return the non-aliased outputs in order."""
    input_storages = {
        v.untyped_storage().data_ptr() for v in values if isinstance(v, torch.Tensor) and v.numel()
    }
    results = []
    for r, order in zip(fd.output_records(), output_stride_orders(fd)):
        value = env[r.args[0].index]
        alias = r.kw("alias_input")
        if alias is not None:
            env[alias.index].copy_(value)
            continue
        if not isinstance(value, torch.Tensor):
            results.append(torch.tensor(value, dtype=to_torch(fd._infos[r.args[0].index].dtype)))
            continue
        if order:
            results.append(_with_stride_order(value, order))
        elif value.numel() and value.untyped_storage().data_ptr() in input_storages:
            results.append(value.clone(memory_format=torch.contiguous_format))
        else:
            results.append(value.contiguous())
    if has_aliases(fd):
        results = view_outputs(fd, values, results)  # Note [Outputs that alias inputs]
    return results


def _with_stride_order(value: torch.Tensor, order: Sequence[int]) -> torch.Tensor:
    strides = strides_for(value.shape, order)
    out = torch.empty_strided(value.shape, strides, dtype=value.dtype, device=value.device)
    out.copy_(value)
    return out



