"""Rules of the normalization ops: batch_norm."""
from __future__ import annotations

import torch

from fusion_cache.frontend.records import Record

from .core import Interpreter, rule


@rule('batch_norm')
def _batch_norm(run: Interpreter, r: Record) -> list:
    x, w, b, rm, rv, momentum, eps = (run.get(a) if a is not None else None for a in r.args)
    training = run.get(r.kw("training"))
    channels_last = r.kw("channels_last")
    if channels_last:  # channels are the last logical dim: move them to dim 1 for torch
        x = x.movedim(-1, 1)
    out, mean, invstd = torch.native_batch_norm(
        x, w, b, rm, rv, bool(training), float(momentum), float(eps)
    )
    if channels_last:
        out = out.movedim(1, -1)
    return [out, mean, invstd]
