"""Frontends that build FusionDefinitions from PyTorch programs.

- `from_torchscript(graph_or_ir_text, example_inputs=None)`: TorchScript IR -> fusion.
- `register_backend()`: registers the torch.compile backend "fusion_cache" (see
  `dynamo_backend.py`); importing this package does not import torch._dynamo.
"""
from __future__ import annotations

from .lowering import LoweringError, UnsupportedOpError
from .torchscript import from_torchscript

BACKEND_NAME = "fusion_cache"


def register_backend() -> None:
    """Make `torch.compile(model, backend="fusion_cache")` work in this process.

    Installed with the `torch_dynamo_backends` entry point, torch finds the backend by
    itself on first use; this call is for checkouts installed without it. Registering at
    import time instead would break the entry point: torch loads it by importing
    `dynamo_backend` and then registers the name itself, refusing a duplicate.
    """
    import torch._dynamo

    from .dynamo_backend import fusion_cache_backend

    try:
        torch._dynamo.register_backend(compiler_fn=fusion_cache_backend, name=BACKEND_NAME)
    except AssertionError:  # "duplicate name": registered already (or by the entry point)
        pass


__all__ = [
    "BACKEND_NAME",
    "LoweringError",
    "UnsupportedOpError",
    "from_torchscript",
    "register_backend",
]
