"""The record interpreter (core.py) with every family's rules registered."""
from . import creation, elementwise, indexing, normalization, reductions, resize, shape  # noqa: F401
from .core import Env, Interpreter, device_of, evaluate, rule

__all__ = ["Env", "Interpreter", "device_of", "evaluate", "rule"]
