"""Train a small attention + MLP model with torch.compile(backend="fusion_cache").

Prints the losses, the fusion regions of each compiled graph, the cache's counters
(fusions, kernel launches, reference runs) and the median step time against eager and
against torch.compile's default backend (after warm-up; CUDA is synchronized per step).

    python examples/train_with_backend.py [--steps 20] [--device cuda] [--dtype bfloat16]
"""
from __future__ import annotations

import argparse
import copy
import statistics
import time
import warnings

import torch
import torch.nn as nn
import torch.nn.functional as F

from fusion_cache import FusionCache
from fusion_cache.frontends import dynamo_backend, register_backend


class Block(nn.Module):
    def __init__(self, d: int, hidden: int) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d)
        self.norm2 = nn.LayerNorm(d)
        self.fc1 = nn.Linear(d, hidden)
        self.fc2 = nn.Linear(hidden, d)
        self.drop = nn.Dropout(0.1)
        self.scale = d**-0.5

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.qkv(self.norm1(x)).chunk(3, dim=-1)
        x = x + torch.softmax(q @ k.transpose(-2, -1) * self.scale, dim=-1) @ v
        return x + self.drop(self.fc2(F.gelu(self.fc1(self.norm2(x)))))


def make_model(d: int, hidden: int, layers: int) -> nn.Module:
    return nn.Sequential(*[Block(d, hidden) for _ in range(layers)], nn.Linear(d, 1))


def sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def train(model: nn.Module, batches: list[torch.Tensor], device: str, warmup: int,
          label: str, verbose: bool) -> tuple[list[float], float]:  # fmt: skip
    """Losses of every step and the median time of the steps after `warmup`."""
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    losses, times = [], []
    for step, x in enumerate(batches):
        sync(device)
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        loss = model(x).float().square().mean()
        loss.backward()
        opt.step()
        sync(device)
        if step >= warmup:
            times.append(time.perf_counter() - t0)
        losses.append(loss.item())
        if verbose:
            print(f"  {label} step {step:3d}  loss {losses[-1]:.6f}")
    return losses, statistics.median(times) if times else float("nan")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--dim", type=int, default=256)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--no-inductor", action="store_true", help="skip torch.compile's default")
    args = p.parse_args()
    device, dtype = args.device, getattr(torch, args.dtype)
    warnings.filterwarnings("ignore", message="fusion_cache: fusion .* reference evaluator")
    register_backend()

    torch.manual_seed(0)
    base = make_model(args.dim, 4 * args.dim, args.layers).to(device, dtype).eval()  # dropout off
    batches = [torch.randn(args.batch, args.seq, args.dim, device=device, dtype=dtype)
               for _ in range(args.steps)]  # fmt: skip
    print(f"device {device} ({torch.cuda.get_device_name() if device == 'cuda' else 'cpu'}), "
          f"dtype {args.dtype}, {args.steps} steps, median of the last "
          f"{args.steps - args.warmup}")  # fmt: skip

    runs = {"eager": copy.deepcopy(base)}
    runs["fusion_cache"] = torch.compile(copy.deepcopy(base), backend="fusion_cache")
    if not args.no_inductor:
        runs["inductor"] = torch.compile(copy.deepcopy(base))
    results = {}
    for label, model in runs.items():
        try:
            results[label] = train(model, batches, device, args.warmup, label,
                                   verbose=label == "fusion_cache")  # fmt: skip
        except Exception as err:  # inductor needs a C++ compiler on CPU, triton on GPU
            why = " | ".join(line for line in str(err).splitlines()[:6] if line.strip())
            print(f"  {label}: failed ({type(err).__name__}: {why})")
        if label == "fusion_cache":
            for r in dynamo_backend.reports():
                print(f"  {r['graph']:>9} graph #{r['index']}: {r['regions']} regions, "
                      f"{r['ops_fused']} ops fused, {r['ops_eager']} ops + {r['views_eager']} "
                      f"views in eager, fusion ids {r['fusion_ids']}")  # fmt: skip
            print(f"  fusion cache: {FusionCache.get().stats()}")

    eager_loss = results["eager"][0]
    for label, (losses, step_s) in results.items():
        drift = max(abs(a - b) for a, b in zip(losses, eager_loss))
        speed = results["eager"][1] / step_s
        print(f"{label:>13}: {step_s * 1e3:8.2f} ms/step  ({speed:4.2f}x eager)  "
              f"final loss {losses[-1]:.6f}  max |loss - eager| {drift:.2e}")  # fmt: skip


if __name__ == "__main__":
    main()
