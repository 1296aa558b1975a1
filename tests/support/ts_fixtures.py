#!/usr/bin/python3
"""TorchScript fixtures for starling's tests, written at test time into OUT.

The GPT of examples/torchscript/model.py (the architecture of starling's built-in GPT) with
vocab 32, width 16, 2 heads, seq_len 8, 4 layers:
  gpt_s0.pt, gpt_s1.pt   stages of blocks [0, 2) and [2, 4)
  gpt_whole.pt           the whole model as one file
and modules that loading must refuse or accept:
  dropout.pt             stage 0 with a plain nn.Dropout (starling seeds it: accepted)
  bn_dropout.pt          a layer after gpt_s1.pt with BatchNorm1d over the 8 positions and
                         nn.Dropout, as users' models have them
  drifting.pt            a layer after gpt_s1.pt whose output depends on a buffer its forward
                         changes (nondeterministic for another reason than dropout: refused)
  wide.pt                blocks of width 24 (do not fit after gpt_s0.pt's width 16)
  small_vocab.pt         stage 0 with an embedding of 16 tokens (vocab 32 does not fit)
  ce_loss.pt             a scripted mean cross-entropy (the same as the built-in loss)
  counting.pt            a layer after gpt_s1.pt counting its training-mode forwards in a buffer
                         (as BatchNorm's running statistics change): loading's checks must not
                         reach the stage's copy
"""

import os
import sys

import torch
import torch.nn.functional as F
from torch import nn

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "examples", "torchscript"))
import model  # noqa: E402

V, D, H, T, L = 32, 16, 2, 8, 4


class WithDropout(nn.Module):
    def __init__(self):
        super().__init__()
        self.stage = model.Stage(V, D, H, T, L, 0, 2)
        self.drop = nn.Dropout(0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.drop(self.stage(x))


class BnDropout(nn.Module):
    def __init__(self):
        super().__init__()
        self.norm = nn.BatchNorm1d(T)
        self.drop = nn.Dropout(0.3)
        self.scale = nn.Parameter(torch.ones(V))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.drop(self.norm(x)) * self.scale


class Drifting(nn.Module):
    def __init__(self):
        super().__init__()
        self.scale = nn.Parameter(torch.ones(V))
        self.register_buffer("calls", torch.zeros(1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls.add_(1)
        return x * self.scale + self.calls


class CrossEntropy(nn.Module):
    def forward(self, output: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(output.reshape(-1, output.size(-1)), targets.reshape(-1))


class Counting(nn.Module):
    def __init__(self):
        super().__init__()
        self.scale = nn.Parameter(torch.ones(V))
        self.register_buffer("calls", torch.zeros(1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.training:
            self.calls.add_(1)
        return x * self.scale


def main() -> None:
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    save = lambda m, name: torch.jit.script(m).save(os.path.join(out, name))  # noqa: E731
    s0, s1 = model.make_stages(V, D, H, T, L, [[0, 2], [2, 4]], seed=3)
    # Biases and norms away from their initialization, so that the comparison covers them.
    with torch.no_grad():
        for st in (s0, s1):
            for p in st.parameters():
                p.add_(0.05 * torch.randn_like(p))
    save(s0, "gpt_s0.pt")
    save(s1, "gpt_s1.pt")
    whole = model.Stage(V, D, H, T, L, 0, 4)
    sd = {}
    for k, v in s0.state_dict().items():
        sd[k] = v
    for k, v in s1.state_dict().items():
        if k.startswith("blocks."):
            i, rest = k[len("blocks."):].split(".", 1)
            k = f"blocks.{int(i) + 2}.{rest}"
        sd[k] = v
    whole.load_state_dict(sd)
    save(whole, "gpt_whole.pt")
    save(WithDropout(), "dropout.pt")
    save(model.Stage(V, 24, H, T, L, 2, 4), "wide.pt")
    save(model.Stage(16, D, H, T, L, 0, 2), "small_vocab.pt")
    save(CrossEntropy(), "ce_loss.pt")
    save(Counting(), "counting.pt")
    save(BnDropout(), "bn_dropout.pt")
    save(Drifting(), "drifting.pt")


if __name__ == "__main__":
    main()
