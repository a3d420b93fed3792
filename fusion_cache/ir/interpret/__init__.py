"""The record interpreter (core.py) with every family's rules registered."""
from . import (  # noqa: F401
    aten,
    creation,
    elementwise,
    normalization,
    random,
    reductions,
    resize,
    shape,
)
from .core import Env, Interpreter, device_of, evaluate, rule

__all__ = ["Env", "Interpreter", "device_of", "evaluate", "rule"]
