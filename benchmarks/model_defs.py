"""The three models of `python -m benchmarks.models`, written here (nothing downloaded).

- GPT-2: learned positions, pre-LayerNorm blocks of causal self-attention through
  scaled_dot_product_attention and a GELU (tanh) MLP, the LM head tied to the embedding.
- Llama-style: RMSNorm, rotary embeddings applied to interleaved pairs (unbind/stack),
  SwiGLU, grouped-query attention (fewer key/value heads, repeated).
- ResNet-18 for CIFAR-sized images: a 3x3 stem, four stages of two basic blocks with
  BatchNorm (trained, so batch statistics and running averages), average pool, a linear head.

Each comes in a full configuration (the benchmark's) and a tiny one (the CPU test's).
`ModelCase` says how to build a model, a batch and the loss, and how the step is run
(bf16 autocast or bf16 weights).
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

# ---- GPT-2 ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class GPTConfig:
    vocab: int = 50304  # 50257 padded to a multiple of 64, as GPT-2 trainers do
    seq: int = 256
    dim: int = 768
    heads: int = 12
    layers: int = 6


class GPTAttention(nn.Module):
    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.heads = cfg.heads
        self.qkv = nn.Linear(cfg.dim, 3 * cfg.dim)
        self.proj = nn.Linear(cfg.dim, cfg.dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = self.qkv(x).split(c, dim=2)
        q, k, v = (y.view(b, t, self.heads, c // self.heads).transpose(1, 2) for y in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(y.transpose(1, 2).contiguous().view(b, t, c))


class GPTBlock(nn.Module):
    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(cfg.dim)
        self.attn = GPTAttention(cfg)
        self.ln2 = nn.LayerNorm(cfg.dim)
        self.fc = nn.Linear(cfg.dim, 4 * cfg.dim)
        self.out = nn.Linear(4 * cfg.dim, cfg.dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.out(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))


class GPT(nn.Module):
    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.wte = nn.Embedding(cfg.vocab, cfg.dim)
        self.wpe = nn.Embedding(cfg.seq, cfg.dim)
        self.blocks = nn.ModuleList(GPTBlock(cfg) for _ in range(cfg.layers))
        self.ln_f = nn.LayerNorm(cfg.dim)
        self.head = nn.Linear(cfg.dim, cfg.vocab, bias=False)
        self.head.weight = self.wte.weight  # tied
        for p in self.parameters():
            if p.dim() > 1:
                nn.init.normal_(p, std=0.02)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        pos = torch.arange(idx.shape[1], device=idx.device)
        x = self.wte(idx) + self.wpe(pos)
        for block in self.blocks:
            x = block(x)
        logits = self.head(self.ln_f(x))
        return F.cross_entropy(logits.view(-1, logits.shape[-1]).float(), targets.view(-1))


# ---- Llama-style ------------------------------------------------------------------------------


@dataclass(frozen=True)
class LlamaConfig:
    vocab: int = 32000
    seq: int = 256
    dim: int = 512
    heads: int = 8
    kv_heads: int = 2
    layers: int = 4
    hidden: int = 1408  # SwiGLU's 2/3 * 4 * dim, rounded up to a multiple of 64
    eps: float = 1e-5


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        wide = x.float()
        y = wide * torch.rsqrt(wide.pow(2).mean(-1, keepdim=True) + self.eps)
        return y.type_as(x) * self.weight


def rope_tables(head_dim: int, seq: int) -> tuple[torch.Tensor, torch.Tensor]:
    freqs = 1.0 / (10000.0 ** (torch.arange(0, head_dim, 2).float() / head_dim))
    angles = torch.outer(torch.arange(seq).float(), freqs)
    return angles.cos(), angles.sin()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate interleaved pairs (x[2i], x[2i+1]) of [b, t, heads, head_dim] by the tables."""
    b, t, h, d = x.shape
    x1, x2 = x.float().reshape(b, t, h, d // 2, 2).unbind(-1)
    cos, sin = cos[:t].view(1, t, 1, d // 2), sin[:t].view(1, t, 1, d // 2)
    out = torch.stack((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1)
    return out.flatten(3).type_as(x)


class LlamaAttention(nn.Module):
    def __init__(self, cfg: LlamaConfig) -> None:
        super().__init__()
        self.heads, self.kv_heads = cfg.heads, cfg.kv_heads
        self.head_dim = cfg.dim // cfg.heads
        self.wq = nn.Linear(cfg.dim, cfg.heads * self.head_dim, bias=False)
        self.wk = nn.Linear(cfg.dim, cfg.kv_heads * self.head_dim, bias=False)
        self.wv = nn.Linear(cfg.dim, cfg.kv_heads * self.head_dim, bias=False)
        self.wo = nn.Linear(cfg.heads * self.head_dim, cfg.dim, bias=False)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        q = self.wq(x).view(b, t, self.heads, self.head_dim)
        k = self.wk(x).view(b, t, self.kv_heads, self.head_dim)
        v = self.wv(x).view(b, t, self.kv_heads, self.head_dim)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        group = self.heads // self.kv_heads
        # grouped-query attention: each key/value head serves `group` query heads
        k = k[:, :, :, None].expand(b, t, self.kv_heads, group, self.head_dim).reshape(
            b, t, self.heads, self.head_dim)  # fmt: skip
        v = v[:, :, :, None].expand(b, t, self.kv_heads, group, self.head_dim).reshape(
            b, t, self.heads, self.head_dim)  # fmt: skip
        q, k, v = (y.transpose(1, 2) for y in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.wo(y.transpose(1, 2).reshape(b, t, -1))


class LlamaBlock(nn.Module):
    def __init__(self, cfg: LlamaConfig) -> None:
        super().__init__()
        self.attn_norm = RMSNorm(cfg.dim, cfg.eps)
        self.attn = LlamaAttention(cfg)
        self.mlp_norm = RMSNorm(cfg.dim, cfg.eps)
        self.w1 = nn.Linear(cfg.dim, cfg.hidden, bias=False)
        self.w3 = nn.Linear(cfg.dim, cfg.hidden, bias=False)
        self.w2 = nn.Linear(cfg.hidden, cfg.dim, bias=False)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.attn_norm(x), cos, sin)
        h = self.mlp_norm(x)
        return x + self.w2(F.silu(self.w1(h)) * self.w3(h))


class Llama(nn.Module):
    def __init__(self, cfg: LlamaConfig) -> None:
        super().__init__()
        self.embed = nn.Embedding(cfg.vocab, cfg.dim)
        self.blocks = nn.ModuleList(LlamaBlock(cfg) for _ in range(cfg.layers))
        self.norm = RMSNorm(cfg.dim, cfg.eps)
        self.head = nn.Linear(cfg.dim, cfg.vocab, bias=False)
        cos, sin = rope_tables(cfg.dim // cfg.heads, cfg.seq)
        self.register_buffer("cos", cos, persistent=False)
        self.register_buffer("sin", sin, persistent=False)
        for p in self.parameters():
            if p.dim() > 1:
                nn.init.normal_(p, std=0.02)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        x = self.embed(idx)
        for block in self.blocks:
            x = block(x, self.cos, self.sin)
        logits = self.head(self.norm(x))
        return F.cross_entropy(logits.view(-1, logits.shape[-1]).float(), targets.view(-1))


# ---- ResNet-18 (CIFAR) ------------------------------------------------------------------------


class BasicBlock(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.shortcut = nn.Sequential()
        if stride != 1 or cin != cout:
            self.shortcut = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False),
                                          nn.BatchNorm2d(cout))  # fmt: skip

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.relu(self.bn1(self.conv1(x)))
        return F.relu(self.bn2(self.conv2(y)) + self.shortcut(x))


class ResNet18(nn.Module):
    def __init__(self, width: int = 64, classes: int = 10, blocks: int = 2) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, width, 3, 1, 1, bias=False), nn.BatchNorm2d(width),
                                  nn.ReLU())  # fmt: skip
        layers, cin = [], width
        for stage in range(4):
            cout = width * 2**stage
            for i in range(blocks):
                layers.append(BasicBlock(cin, cout, 2 if stage and i == 0 else 1))
                cin = cout
        self.layers = nn.Sequential(*layers)
        self.fc = nn.Linear(cin, classes)

    def forward(self, x: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        y = self.layers(self.stem(x))
        logits = self.fc(torch.flatten(F.adaptive_avg_pool2d(y, 1), 1))
        return F.cross_entropy(logits, targets)


# ---- the cases --------------------------------------------------------------------------------


@dataclass(frozen=True)
class ModelCase:
    """How to build one model and its batches, and how its step runs."""

    name: str
    build: Callable[[], nn.Module]
    batch: Callable[[torch.Generator, str], tuple[torch.Tensor, ...]]  # (gen, device) -> inputs
    autocast: torch.dtype | None = None  # bf16 autocast around forward (GPT-2)
    weights: torch.dtype = torch.float32  # the parameters' dtype (Llama-style: bf16)
    lr: float = 0.01


def _tokens(vocab: int, batch: int, seq: int):
    def make(gen: torch.Generator, device: str) -> tuple[torch.Tensor, ...]:
        idx = torch.randint(0, vocab, (batch, seq + 1), generator=gen)
        return idx[:, :-1].contiguous().to(device), idx[:, 1:].contiguous().to(device)

    return make


def _images(batch: int, size: int, classes: int):
    def make(gen: torch.Generator, device: str) -> tuple[torch.Tensor, ...]:
        x = torch.randn(batch, 3, size, size, generator=gen)
        y = torch.randint(0, classes, (batch,), generator=gen)
        return x.to(device), y.to(device)

    return make


def model_cases(tiny: bool) -> list[ModelCase]:
    """The benchmark's three models; `tiny`: the same structure at sizes a CPU runs in a
    second (the CPU test's)."""
    if tiny:
        gpt = GPTConfig(vocab=96, seq=8, dim=32, heads=4, layers=2)
        llama = LlamaConfig(vocab=96, seq=8, dim=32, heads=4, kv_heads=2, layers=2, hidden=64)
        gpt_batch, resnet = _tokens(gpt.vocab, 2, gpt.seq), dict(width=8, blocks=1)
        llama_batch, images = _tokens(llama.vocab, 2, llama.seq), _images(8, 16, 10)
    else:
        gpt, llama = GPTConfig(), LlamaConfig()
        gpt_batch, resnet = _tokens(gpt.vocab, 8, gpt.seq), dict(width=64, blocks=2)
        llama_batch, images = _tokens(llama.vocab, 8, llama.seq), _images(64, 32, 10)
    return [
        ModelCase("gpt2", lambda: GPT(gpt), gpt_batch, autocast=torch.bfloat16),
        ModelCase("llama", lambda: Llama(llama), llama_batch, weights=torch.bfloat16),
        ModelCase("resnet18", lambda: ResNet18(**resnet), images),
    ]
