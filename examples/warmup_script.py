"""A warmup script: `fusion-cache warmup examples/warmup_script.py --target h100` fills the
store with the kernels of examples/five_fusions.py, on a machine with or without a GPU.
Inputs are meta tensors: only their dtypes, shapes and strides matter."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from five_fusions import define_all, example_inputs  # noqa: E402

for i, fd in enumerate(define_all()):
    fd.precompile(example_inputs(i, "meta"))  # target: warmup's --target, else this GPU
