"""One training step of a tiny benchmark model through the backend on the CPU, launches
stubbed: what the segmenter and plan-store tests run their searches on."""
from __future__ import annotations

from benchmarks import models
from benchmarks.host_region import stub_launches
from benchmarks.model_defs import model_cases


def train_tiny_step(name: str) -> None:
    case = next(c for c in model_cases(tiny=True) if c.name == name)
    with stub_launches():
        model = models.initial_model(case, "cpu")
        fn = models.compiled("fusion_cache", model)
        models.train(fn, list(model.parameters()), case, models.batches_for(case, 1, "cpu"),
                     "cpu")  # fmt: skip
