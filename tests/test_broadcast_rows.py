"""Note [Broadcast rows] (codegen/pointwise_cuda.py, knob pointwise.rows): pointwise threads
that take several rows of the outermost dim at one inner position, loading inputs dead along
it once. Planned for h100 (NVRTC compiles them) and run on the host by g++
(tests/host_kernels.py) against torch: RoPE forward and backward (paired and not), a plain
broadcast add, and sizes the rows do not divide (then the plan keeps one row a thread)."""
from __future__ import annotations

import pytest
import torch
from host_kernels import HAVE_GXX, run_plan_on_host
from resize_patterns import PATTERNS, define

from fusion_cache import DataType, FusionDefinition
from fusion_cache.runtime.executor import executor_for
from schedulers.tuning import overriding

needs_gxx = pytest.mark.skipif(not HAVE_GXX, reason="no g++ to run kernels on the host")


def _close(got, want, dtype):
    t = {torch.bfloat16: 3e-2, torch.float32: 1e-5}[dtype]
    torch.testing.assert_close(got, want, rtol=t, atol=t)


def _description(fd) -> str:
    return executor_for(fd).last_plan.spec.description


@needs_gxx
@pytest.mark.parametrize("pair", [True, False], ids=["paired", "unpaired"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("name", ["rope_fwd", "rope_bwd"])
def test_rope_with_rows_a_thread_matches_torch(name, dtype, pair):
    pattern = PATTERNS[name]
    with overriding({"pointwise.rows": 2, "pointwise.pair": pair}):
        fd = define(pattern, dtype)
        for shape, rows in [((2, 3, 5, 16), True), ((1, 3, 7, 32), False)]:  # 6 and 3 rows
            inputs = pattern.make(dtype, "cpu", shape)
            (got,) = run_plan_on_host(fd, inputs)
            assert (" rows=2" in _description(fd)) == rows, _description(fd)
            _close(got, pattern.reference(*inputs), dtype)


@needs_gxx
@pytest.mark.parametrize("rows", [2, 4])
def test_broadcast_add_with_rows_a_thread(rows):
    """A [6, 5, 8] + b [5, 8] (b dead along the outer dim), and b read through a broadcast
    scalar column as well."""
    with FusionDefinition() as fd:
        a = fd.define_tensor(shape=[-1, -1, -1], contiguity=[True] * 3, dtype=DataType.Float)
        b = fd.define_tensor(shape=[-1, -1], contiguity=[True] * 2, dtype=DataType.Float)
        c = fd.define_tensor(shape=[-1], contiguity=[True], dtype=DataType.Float)
        bb = fd.ops.broadcast_in_dim(b, [8, 5, 8], [1, 2])
        cc = fd.ops.broadcast_in_dim(c, [8, 5, 8], [1])
        fd.add_output(fd.ops.mul(fd.ops.add(a, bb), cc))
    g = torch.Generator().manual_seed(4)
    x, y, z = (torch.randn(s, generator=g) for s in [(8, 5, 8), (5, 8), (5,)])
    with overriding({"pointwise.rows": rows}):
        (got,) = run_plan_on_host(fd, [x, y, z])
    assert f" rows={rows}" in _description(fd)
    _close(got, (x + y) * z[:, None], torch.float32)


def test_rope_at_benchmark_size_loads_tables_once_for_the_rows():
    pattern = PATTERNS["rope_fwd"]
    with overriding({"pointwise.rows": 4}):
        fd = define(pattern, torch.bfloat16)
        (ref,) = fd.precompile(pattern.make(torch.bfloat16, "meta", (8, 32, 2048, 128)),
                               target="h100")  # fmt: skip
    assert " rows=4" in _description(fd)
    body = ref.source.split("end prelude")[1]
    assert body.count("if (uu == 0)") == 4  # cos and sin, a load a half
