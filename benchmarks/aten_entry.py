"""Host time of one ATen call by its entry point: what a replayed ATen step pays per call.

    python -m benchmarks.aten_entry [--calls 200] [--rounds 7]

Per entry, `--calls` calls back to back at shapes where the GPU outruns the host, one
synchronize a round, the median of `--rounds` (us a call): a GEMM of two matrices through
torch.matmul, torch.mm and torch.mm into a buffer (inductor's extern call); the Llama-style
attention (benchmarks/model_defs.py: [8, 8, 256, 64] bf16, causal) through cuDNN's forward
and backward ops called as an op packet (as ir/interpret/aten.py calls them), as the
overload, and torch's scaled_dot_product_attention, on the eager layout (a transpose of
[b, t, h, d]) and on contiguous heads. Needs a GPU.
"""
from __future__ import annotations

import argparse
import sys
from collections.abc import Callable

import torch

from benchmarks.host_steps import issue_us


def warm_issue_us(fn: Callable[[], object], calls: int, rounds: int) -> float:
    """host_steps.issue_us after a few warm-up calls (cuDNN's first calls plan)."""
    for _ in range(3):
        fn()
    return issue_us(fn, "cuda", calls, rounds)


def entries() -> list[tuple[str, Callable[[], object]]]:
    bf16 = dict(device="cuda", dtype=torch.bfloat16)
    a, w = torch.randn(256, 512, **bf16), torch.randn(512, 512, **bf16)
    out = torch.empty(256, 512, **bf16)
    wt = w.t()
    found = [("gemm torch.matmul", lambda: torch.matmul(a, wt)),
             ("gemm torch.mm", lambda: torch.mm(a, wt)),
             ("gemm torch.mm out=", lambda: torch.mm(a, wt, out=out))]  # fmt: skip
    packet = torch.ops.aten._scaled_dot_product_cudnn_attention
    backward = torch.ops.aten._scaled_dot_product_cudnn_attention_backward
    for layout in ("eager", "contiguous"):
        if layout == "eager":
            q, k, v = (torch.randn(8, 256, 8, 64, **bf16).transpose(1, 2) for _ in range(3))
        else:
            q, k, v = (torch.randn(8, 8, 256, 64, **bf16) for _ in range(3))
        o, lse, _, _, _, _, seed, offset, _ = packet(q, k, v, None, True, 0.0, True, False)
        go = torch.randn_like(o)

        def bwd(op: Callable = backward, q=q, k=k, v=v, o=o, lse=lse, go=go, seed=seed,
                offset=offset) -> object:  # fmt: skip
            return op(go, q, k, v, o, lse, seed, offset, None, None, None, 256, 256, 0.0,
                      True, scale=None)  # fmt: skip

        found += [
            (f"attention {layout} packet", lambda q=q, k=k, v=v: packet(
                q, k, v, None, True, 0.0, True, False, scale=None)),
            (f"attention {layout} .default", lambda q=q, k=k, v=v: packet.default(
                q, k, v, None, True, 0.0, True, False, scale=None)),
            (f"attention {layout} no lse", lambda q=q, k=k, v=v: packet.default(
                q, k, v, None, False, 0.0, True, False, scale=None)),
            (f"attention {layout} F.sdpa", lambda q=q, k=k, v=v: (
                torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True))),
            (f"attention {layout} backward packet", bwd),
            (f"attention {layout} backward .default", lambda: bwd(backward.default)),
        ]  # fmt: skip
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.aten_entry", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args(argv)
    print(f"# {torch.cuda.get_device_name()}, torch {torch.__version__}: host us a call")
    with torch.no_grad():
        for name, fn in entries():
            try:
                print(f"{name:40s} {warm_issue_us(fn, args.calls, args.rounds):8.1f}", flush=True)
            except Exception as err:  # noqa: BLE001 - an entry this torch lacks: say so
                print(f"{name:40s} failed: {type(err).__name__}: {err}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
