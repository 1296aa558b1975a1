"""A small GPT in PyTorch, cut into pipeline stages that starling trains as TorchScript files.

The architecture is the one of starling's built-in byte-level GPT (kernels/models/gpt.cpp): token
and position embeddings, pre-norm blocks (causal self-attention, GELU MLP), a final norm and a
bias-free projection to logits. A stage module holds an optional embedding, some blocks and an
optional head; starling applies the loss (cross-entropy) to the last stage's logits.

Stages must be deterministic (starling recomputes a stage's forward in backward): this model has
no dropout.
"""

import math
from typing import List

import torch
import torch.nn.functional as F
from torch import nn


class Embedding(nn.Module):
    def __init__(self, vocab: int, width: int, seq_len: int):
        super().__init__()
        self.tokens = nn.Embedding(vocab, width)
        self.positions = nn.Embedding(seq_len, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        pos = torch.arange(x.size(1), dtype=torch.long, device=x.device)
        return self.tokens(x) + self.positions(pos).unsqueeze(0)


class Block(nn.Module):
    def __init__(self, width: int, heads: int):
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(width)
        self.qkv = nn.Linear(width, 3 * width)
        self.proj = nn.Linear(width, width)
        self.ln2 = nn.LayerNorm(width)
        self.fc = nn.Linear(width, 4 * width)
        self.out = nn.Linear(4 * width, width)

    def attention(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.size(0), x.size(1), x.size(2)
        hd = d // self.heads
        qkv = self.qkv(x).reshape(b, t, 3, self.heads, hd).permute(2, 0, 3, 1, 4)
        q, k, v = qkv[0], qkv[1], qkv[2]
        scores = torch.matmul(q, k.transpose(-2, -1)) / math.sqrt(hd)
        future = torch.ones(t, t, dtype=torch.bool, device=x.device).triu(1)
        scores = scores.masked_fill(future, float("-inf"))
        weights = torch.softmax(scores, -1)
        return torch.matmul(weights, v).transpose(1, 2).reshape(b, t, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x + self.proj(self.attention(self.ln1(x)))
        return h + self.out(F.gelu(self.fc(self.ln2(h))))


class Head(nn.Module):
    def __init__(self, width: int, vocab: int):
        super().__init__()
        self.ln = nn.LayerNorm(width)
        self.logits = nn.Linear(width, vocab, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.logits(self.ln(x))


class Stage(nn.Module):
    """Blocks [begin, end) of the GPT, with the embedding when begin == 0 and the head when end ==
    layers. Parameter names: embed.*, blocks.<i>.* (i counted within the stage), head.*."""

    def __init__(self, vocab: int, width: int, heads: int, seq_len: int, layers: int,
                 begin: int, end: int):
        super().__init__()
        self.embed = Embedding(vocab, width, seq_len) if begin == 0 else nn.Identity()
        self.blocks = nn.ModuleList([Block(width, heads) for _ in range(begin, end)])
        self.head = Head(width, vocab) if end == layers else nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.embed(x)
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def even_ranges(layers: int, stages: int) -> List[List[int]]:
    """The split starling makes by default: earlier stages take the extra blocks."""
    out, at = [], 0
    for s in range(stages):
        n = layers // stages + (1 if s < layers % stages else 0)
        out.append([at, at + n])
        at += n
    return out


def make_stages(vocab: int, width: int, heads: int, seq_len: int, layers: int,
                ranges: List[List[int]], seed: int = 0) -> List[Stage]:
    """One Stage per range, initialized like GPT-2 from `seed` (the whole model at once, so the
    weights do not depend on the split)."""
    torch.manual_seed(seed)
    stages = [Stage(vocab, width, heads, seq_len, layers, a, b) for a, b in ranges]
    residual_std = 0.02 / math.sqrt(2.0 * layers)
    for st in stages:
        for name, p in st.named_parameters():
            if name.endswith("bias"):
                nn.init.zeros_(p)
            elif ".ln" in name or name.startswith("head.ln"):
                nn.init.ones_(p)
            elif name.endswith("proj.weight") or name.endswith("out.weight"):
                nn.init.normal_(p, 0.0, residual_std)
            else:
                nn.init.normal_(p, 0.0, 0.02)
    return stages


def held_out_loss(stages: List[torch.nn.Module], tokens: torch.Tensor, seq_len: int,
                  batch: int, batches: int) -> float:
    """Mean cross-entropy over the first `batches` batches of `batch` windows of seq_len + 1
    tokens (window i starts at i * seq_len): what starling reports as the held-out loss."""
    total = 0.0
    with torch.no_grad():
        for k in range(batches):
            rows = [tokens[(k * batch + i) * seq_len:(k * batch + i) * seq_len + seq_len + 1]
                    for i in range(batch)]
            w = torch.stack(rows).long()
            x = w[:, :-1]
            for st in stages:
                x = st(x)
            total += F.cross_entropy(x.reshape(-1, x.size(-1)), w[:, 1:].reshape(-1)).item()
    return total / batches
