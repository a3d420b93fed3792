"""Bounds of two resize cases, on the GPU, under the benchmarks' timer (do_bench, dirty flush):

    python -m benchmarks.resize_bounds

The embedding gradient (50304 x 768 bf16 from 8192 tokens) beside a 77 MB memset, a copy of
its 90 MB and a pad of the gradient's rows to the table's (one kernel reading 12.6 MB and
writing 77 MB, what the op moves), and torch.compile; RoPE bf16 [8, 32, 2048, 128] with f32
and with bf16 cos/sin tables (whether the tables' L2 reads cost). Results:
benchmarks/results/resize-bounds-<device>.txt."""
from __future__ import annotations

import statistics
from collections.abc import Callable
from typing import Any

import torch

from benchmarks.cases import CASES
from benchmarks.resize_cases import define_rope, rope_inputs
from benchmarks.run import compiled_for, gbps, make_timer, measure_copy_ceiling
from fusion_cache import DataType, FusionDefinition

V, H, N = 50304, 768, 8192
ROPE = (8, 32, 2048, 128)


def median_ms(timer: Callable, fn: Callable[[], Any], n: int = 5) -> float:
    fn()
    torch.cuda.synchronize()
    return statistics.median(timer(fn) for _ in range(n))


def gradient_rows(timer: Callable) -> None:
    moved = N * 8 + N * H * 2 + V * H * 2
    grad = torch.randn(N, H, device="cuda").bfloat16()
    out = torch.empty(V, H, dtype=torch.bfloat16, device="cuda")
    src = torch.empty(moved // 2, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    with FusionDefinition() as pad:
        g = pad.define_tensor(shape=[-1, -1], contiguity=[True, True], dtype=DataType.BFloat16)
        pad.add_output(pad.ops.pad(g, [0, 0, 0, V - N]))
    case = next(c for c in CASES if c.name.startswith("embedding_bwd"))
    inputs = case.inputs("cuda")
    fd = case.build()
    rows = {"memset 77MB (write only)": (lambda: out.zero_(), V * H * 2),
            "copy of 90MB (45 read + 45 written)": (lambda: dst.copy_(src), moved),
            "pad fusion 12.6MB -> 77MB (same traffic)": (lambda: pad.execute([grad]), moved),
            "embedding_bwd fusion": (lambda: fd.execute(inputs), moved),
            "embedding_bwd torch.compile": (compiled_for(case, inputs), moved)}  # fmt: skip
    for _ in range(2):
        for name, (fn, nbytes) in rows.items():
            ms = median_ms(timer, fn)
            print(f"  {name:45s} {ms * 1e3:7.1f} us {gbps(nbytes, ms):6.0f} GB/s")


def rope_tables(timer: Callable) -> None:
    for tables in (torch.float32, torch.bfloat16):
        with FusionDefinition() as fd:
            define_rope(fd, torch.bfloat16, ROPE, tables)
        x, cos, sin = rope_inputs(ROPE, torch.bfloat16, "cuda")
        inputs = [x, cos.to(tables), sin.to(tables)]
        ms = median_ms(timer, lambda fd=fd, inputs=inputs: fd.execute(inputs))
        nbytes = 2 * x.numel() * x.element_size()
        print(f"  rope tables {tables}: {ms * 1e3:.1f} us {gbps(nbytes, ms):.0f} GB/s (x in + out)")


def main() -> int:
    timer = make_timer(quick=True)
    print(torch.cuda.get_device_name(), "ceiling", round(measure_copy_ceiling(timer)))
    gradient_rows(timer)
    rope_tables(timer)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
