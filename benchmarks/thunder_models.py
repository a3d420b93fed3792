"""Lightning Thunder's nvFuser executor on fusion-cache (issue 26, item 5), on the GPU.

    python -m benchmarks.thunder_models [--steps 20] [--json out.json] [--only gpt2,rope]

`fusion_cache.install_as_nvfuser()` runs before `import thunder`, so Thunder's nvFuser
executor builds every fusion through fusion-cache. Per model: the result of `thunder.jit`
against eager (forward, and the gradients where the model trains), how many fusions Thunder
made, how many of their runs went to the reference evaluator (the goal is none: every
region on generated kernels or ATen segments), and the step time beside eager and
torch.compile, measured in the same run on the same card.

Without a GPU or without Thunder, it says what is missing and exits 2; `--check` then checks
only the route (`import nvfuser` is fusion-cache at the API level Thunder wants), which is
what a CPU machine can check.
"""
from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
import torch.nn as nn
import torch.nn.functional as F

# ---- the models ------------------------------------------------------------------------------


class PointwiseChain(nn.Module):
    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        z = torch.sigmoid(x * y + 1.0) * torch.tanh(x - y)
        return torch.where(z > 0, z * 2.0, z.exp() - 1.0)


class Softmax(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.softmax(x, dim=-1)


class LayerNorm(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(x)


class GeluMLP(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.up = nn.Linear(width, 4 * width)
        self.down = nn.Linear(4 * width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(F.gelu(self.up(x), approximate="tanh"))


def rope_tables(seq: int, dim: int, device: Any, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    inv = 1.0 / (10000 ** (torch.arange(0, dim, 2, device=device, dtype=torch.float32) / dim))
    angles = torch.outer(torch.arange(seq, device=device, dtype=torch.float32), inv)
    angles = torch.cat([angles, angles], dim=-1)
    return angles.cos().to(dtype), angles.sin().to(dtype)


class Rope(nn.Module):
    """Rotary embedding of q and k, as Llama applies it (slices, a negation, a cat)."""

    def forward(self, q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor,
                sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
        def rotate(x: torch.Tensor) -> torch.Tensor:
            half = x.shape[-1] // 2
            return torch.cat([-x[..., half:], x[..., :half]], dim=-1)

        return q * cos + rotate(q) * sin, k * cos + rotate(k) * sin


@dataclass
class GPTConfig:
    vocab: int = 8192
    seq: int = 256
    layers: int = 4
    heads: int = 8
    width: int = 512
    dropout: float = 0.1


class Block(nn.Module):
    def __init__(self, c: GPTConfig) -> None:
        super().__init__()
        self.c = c
        self.ln1, self.ln2 = nn.LayerNorm(c.width), nn.LayerNorm(c.width)
        self.qkv = nn.Linear(c.width, 3 * c.width)
        self.proj = nn.Linear(c.width, c.width)
        self.mlp = GeluMLP(c.width)
        self.drop = nn.Dropout(c.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, w = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(w, dim=2)
        q, k, v = (z.view(b, t, self.c.heads, w // self.c.heads).transpose(1, 2) for z in (q, k, v))
        p = self.c.dropout if self.training else 0.0
        att = F.scaled_dot_product_attention(q, k, v, dropout_p=p, is_causal=True)
        x = x + self.drop(self.proj(att.transpose(1, 2).reshape(b, t, w)))
        return x + self.drop(self.mlp(self.ln2(x)))


class GPT2(nn.Module):
    """A small GPT-2: token and position embeddings, pre-norm blocks with causal attention
    and dropout, a tied head, cross-entropy."""

    def __init__(self, c: GPTConfig) -> None:
        super().__init__()
        self.tok = nn.Embedding(c.vocab, c.width)
        self.pos = nn.Embedding(c.seq, c.width)
        self.drop = nn.Dropout(c.dropout)
        self.blocks = nn.ModuleList(Block(c) for _ in range(c.layers))
        self.ln = nn.LayerNorm(c.width)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        pos = torch.arange(idx.shape[1], device=idx.device)
        x = self.drop(self.tok(idx) + self.pos(pos))
        for block in self.blocks:
            x = block(x)
        logits = self.ln(x) @ self.tok.weight.t()
        return F.cross_entropy(logits.view(-1, logits.shape[-1]).float(), targets.view(-1))


@dataclass(frozen=True)
class Case:
    name: str
    make: Callable[[Any, torch.dtype], tuple[nn.Module, tuple]]  # (module, inputs)
    backward: bool
    atol: float
    rtol: float
    dtype: torch.dtype = torch.bfloat16


def _rand(*shape: int, device: Any, dtype: torch.dtype, grad: bool = False) -> torch.Tensor:
    return torch.randn(*shape, device=device, dtype=dtype).requires_grad_(grad)


def _cases() -> list[Case]:
    def pointwise(dev, dt):
        return PointwiseChain(), (_rand(4096, 4096, device=dev, dtype=dt),
                                  _rand(4096, 4096, device=dev, dtype=dt))  # fmt: skip

    def softmax(dev, dt):
        return Softmax(), (_rand(4096, 8192, device=dev, dtype=dt),)

    def layer_norm(dev, dt):
        return LayerNorm(4096).to(dev, dt), (_rand(8192, 4096, device=dev, dtype=dt, grad=True),)

    def mlp(dev, dt):
        return GeluMLP(1024).to(dev, dt), (_rand(8, 512, 1024, device=dev, dtype=dt, grad=True),)

    def rope(dev, dt):
        cos, sin = rope_tables(2048, 128, dev, dt)
        return Rope(), (_rand(4, 32, 2048, 128, device=dev, dtype=dt),
                        _rand(4, 32, 2048, 128, device=dev, dtype=dt), cos, sin)  # fmt: skip

    def gpt2(dev, dt):
        c = GPTConfig()
        idx = torch.randint(0, c.vocab, (8, c.seq), device=dev)
        return GPT2(c).to(dev, dt), (idx, torch.randint(0, c.vocab, (8, c.seq), device=dev))

    return [
        Case("pointwise", pointwise, False, 1.6e-2, 1.6e-2),
        Case("softmax", softmax, False, 1e-2, 1.6e-2),
        Case("layer_norm", layer_norm, True, 6e-2, 1.6e-2),
        Case("gelu_mlp", mlp, True, 6e-2, 2e-2),
        Case("rope", rope, False, 1.6e-2, 1.6e-2),
        Case("gpt2", gpt2, True, 5e-2, 2e-2),
    ]


# ---- running -----------------------------------------------------------------------------------


@dataclass
class Result:
    name: str
    matches_eager: bool = False
    max_error: float = math.nan
    fusions: int = 0
    reference_runs: int = 0
    kernel_launches: int = 0
    eager_ms: float = math.nan
    thunder_ms: float = math.nan
    compile_ms: float = math.nan
    first_step_s: float = math.nan
    error: str = ""
    notes: list[str] = field(default_factory=list)


def _step(fn: Callable, module: nn.Module, inputs: tuple, backward: bool) -> Any:
    out = fn(*inputs)
    if backward:
        loss = out if out.dim() == 0 else out.float().square().mean()
        loss.backward()
    return out


def _time_ms(run: Callable[[], Any], steps: int) -> float:
    for _ in range(3):
        run()
    torch.cuda.synchronize()
    times = []
    for _ in range(steps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        run()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def _outputs_and_grads(fn: Callable, module: nn.Module, inputs: tuple, backward: bool) -> list:
    module.zero_grad(set_to_none=True)
    for x in inputs:
        if isinstance(x, torch.Tensor) and x.grad is not None:
            x.grad = None
    out = _step(fn, module, inputs, backward)
    outs = list(out) if isinstance(out, (tuple, list)) else [out]
    got = [o.detach().float().clone() for o in outs]
    if backward:
        got += [p.grad.float().clone() for p in module.parameters() if p.grad is not None]
        got += [x.grad.float().clone() for x in inputs
                if isinstance(x, torch.Tensor) and x.grad is not None]  # fmt: skip
    return got


def run_case(case: Case, thunder: Any, steps: int) -> Result:
    from fusion_cache import FusionCache

    res = Result(case.name)
    torch.manual_seed(0)
    module, inputs = case.make("cuda", case.dtype)
    backward = case.backward
    try:
        # correctness: dropout off, so eager and Thunder compute the same function
        module.eval()
        jitted = thunder.jit(module)
        want = _outputs_and_grads(module, module, inputs, backward)
        stats0 = dict(FusionCache.get().stats())
        t0 = time.perf_counter()
        got = _outputs_and_grads(jitted, module, inputs, backward)
        torch.cuda.synchronize()
        res.first_step_s = time.perf_counter() - t0
        errors = [(g - w).abs().max().item() / (w.abs().max().item() + 1e-6) for g, w in zip(got, want)]
        res.max_error = max(errors, default=0.0)
        res.matches_eager = len(got) == len(want) and all(
            torch.allclose(g, w, atol=case.atol * max(1.0, w.abs().max().item()), rtol=case.rtol)
            for g, w in zip(got, want))  # fmt: skip
        # timing: training mode (dropout on where the model has it)
        module.train()
        jitted = thunder.jit(module)
        res.eager_ms = _time_ms(lambda: _step(module, module, inputs, backward), steps)
        res.thunder_ms = _time_ms(lambda: _step(jitted, module, inputs, backward), steps)
        stats1 = dict(FusionCache.get().stats())
        res.fusions = stats1["num_fusions"] - stats0["num_fusions"]
        res.reference_runs = stats1["reference_runs"] - stats0["reference_runs"]
        res.kernel_launches = stats1["kernel_launches"] - stats0["kernel_launches"]
        compiled = torch.compile(module)
        res.compile_ms = _time_ms(lambda: _step(compiled, module, inputs, backward), steps)
    except Exception as err:  # one model's failure is a row of the report, not the end of it
        res.error = f"{type(err).__name__}: {str(err)[:300]}"
    return res


def check_route() -> list[str]:
    """What the route in looks like from Thunder's side; problems found (empty: none)."""
    import fusion_cache

    fusion_cache.install_as_nvfuser()
    import nvfuser
    from nvfuser.pytorch_utils import torch_dtype_to_nvfuser_dtype

    problems = []
    v = nvfuser.version()
    if not ("0.2.23" <= v < "0.2.28"):
        problems.append(f"nvfuser.version() {v} is outside Thunder 0.2.6's legacy range")
    # Thunder 0.2.6 reads these at import (Float4_e2m1fn_x2 only from API level 0.2.28 on)
    for name in ("Float8_e4m3fn", "Float8_e5m2", "UInt64"):
        if not hasattr(nvfuser.DataType, name):
            problems.append(f"DataType.{name} (read by Thunder at import) is missing")
    if torch_dtype_to_nvfuser_dtype(torch.bfloat16) is not nvfuser.DataType.BFloat16:
        problems.append("pytorch_utils maps bfloat16 wrongly")
    return problems


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=20, help="timed steps per model and runner")
    ap.add_argument("--only", default="", help="comma-separated model names")
    ap.add_argument("--json", default="", help="write the results here")
    ap.add_argument("--check", action="store_true", help="check the route in only (no GPU needed)")
    args = ap.parse_args(argv)

    problems = check_route()  # before `import thunder`: it reads nvfuser at import
    for p in problems:
        print(f"route: {p}")
    if args.check:
        print("route: ok" if not problems else f"route: {len(problems)} problems")
        return 1 if problems else 0
    if not torch.cuda.is_available():
        print("thunder_models: needs a CUDA GPU (use --check on a CPU machine)")
        return 2
    try:
        import thunder
        from thunder.executors.nvfuserex import nvfuserex
    except Exception as err:
        print(f"thunder_models: Thunder does not import here ({type(err).__name__}: {err}); "
              "pip install 'fusion-cache[thunder]' beside a torch older than 2.13")  # fmt: skip
        return 2
    if nvfuserex is None:
        print("thunder_models: Thunder did not register its nvFuser executor on fusion-cache")
        return 1
    wanted = {n for n in args.only.split(",") if n}
    results = [run_case(c, thunder, args.steps) for c in _cases() if not wanted or c.name in wanted]
    print(f"{torch.cuda.get_device_name()} · torch {torch.__version__} · thunder "
          f"{getattr(thunder, '__version__', '?')}")  # fmt: skip
    head = f"{'model':<12}{'eager?':>8}{'err':>10}{'fusions':>9}{'ref runs':>10}{'kernels':>9}"
    head += f"{'eager ms':>10}{'thunder':>10}{'compile':>10}{'x eager':>9}"
    print(head)
    for r in results:
        speed = r.eager_ms / r.thunder_ms if r.thunder_ms == r.thunder_ms and r.thunder_ms else math.nan
        print(f"{r.name:<12}{str(r.matches_eager):>8}{r.max_error:>10.2e}{r.fusions:>9}"
              f"{r.reference_runs:>10}{r.kernel_launches:>9}{r.eager_ms:>10.3f}"
              f"{r.thunder_ms:>10.3f}{r.compile_ms:>10.3f}{speed:>9.2f}")  # fmt: skip
        if r.error:
            print(f"  {r.name}: {r.error}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "results": [asdict(r) for r in results]},
                      f, indent=1)  # fmt: skip
    ok = all(r.matches_eager and not r.reference_runs and not r.error for r in results)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
