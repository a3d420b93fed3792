"""Do L2 eviction marks that an earlier kernel left on a case's weights change the speed of
its fusion? The probe behind Note [Weights kept in L2] and benchmarks.order_effect.

    python -m benchmarks.l2_marks [CASE ...] [--knobs '{"load.weights": 0}']

Times the fusion, then after a Triton kernel has read the case's 1-D inputs (weights) with
plain loads, then after one that reads them with eviction_policy="evict_last" (as Triton's
layer norm does), then after plain loads again. Needs a CUDA GPU and Triton. With
`load.weights` 0 (no evict-last loads of our own) the H100 ran layer norm f32 256x262144 at
2248 GB/s, 2255 after the plain loads, 2476 after the evict-last ones and 2481 after more
plain loads: the marks outlive the kernel that set them. With the default, 2564 throughout
(benchmarks/results/l2-marks-*.txt).
"""

from __future__ import annotations

import argparse
import json
import sys

import torch

from benchmarks.cases import Case, named_on_gpu
from benchmarks.run import make_timer, seed_for

DEFAULT_CASES = ["layer_norm_f32_256x262144"]


def _touch_kernels():  # Triton only where this runs, on the GPU machine
    import triton
    import triton.language as tl

    @triton.jit
    def plain(p, out, n, BLOCK: tl.constexpr):
        i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        tl.store(out + tl.program_id(0), tl.sum(tl.load(p + i, mask=i < n).to(tl.float32)))

    @triton.jit
    def keep(p, out, n, BLOCK: tl.constexpr):
        i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        x = tl.load(p + i, mask=i < n, eviction_policy="evict_last")
        tl.store(out + tl.program_id(0), tl.sum(x.to(tl.float32)))

    def touch(kernel, tensors):
        for t in tensors:
            blocks = triton.cdiv(t.numel(), 1024)
            kernel[(blocks,)](t, torch.empty(blocks, device=t.device), t.numel(), BLOCK=1024)
        torch.cuda.synchronize()

    return plain, keep, touch


def probe(case: Case, knobs: dict) -> str:
    from schedulers.tuning import overriding

    plain, keep, touch = _touch_kernels()
    torch.manual_seed(seed_for(case.name))
    inputs = case.inputs("cuda")
    weights = [t for t in inputs if t.dim() == 1]
    fd = case.build()
    timer = make_timer(quick=False)

    def rate() -> str:
        ms = timer(lambda: fd.execute(inputs))
        return f"{case.bytes_moved / (ms * 1e-3) / 1e9:.0f}"

    with overriding(knobs):  # the plan is made (and kept) under the knobs
        fd.execute(inputs)
        torch.cuda.synchronize()
        steps = [f"{rate()} {rate()}"]
        for kernel in (plain, keep, plain):
            touch(kernel, weights)
            steps.append(f"{rate()} {rate()}")
    return (f"{case.name} {json.dumps(knobs)}: {steps[0]} GB/s; after plain loads of its "
            f"weights {steps[1]}; after evict_last loads {steps[2]}; after plain loads "
            f"again {steps[3]}")  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.l2_marks", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("cases", nargs="*", default=DEFAULT_CASES, metavar="CASE")
    parser.add_argument("--knobs", type=json.loads, default={},
                        help='tuning knobs of the fusion, as JSON: \'{"load.weights": 0}\'')
    args = parser.parse_args(argv)
    chosen = named_on_gpu("benchmarks.l2_marks", args.cases)
    if chosen is None:
        return 2
    print(torch.cuda.get_device_name())
    for case in chosen:
        print(probe(case, args.knobs), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
