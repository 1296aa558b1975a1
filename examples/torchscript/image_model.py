#!/usr/bin/python3
"""Writes a small convolutional network for 28x28 grayscale images (Fashion-MNIST), scripted for
starling's data-parallel peers:

    /usr/bin/python3 examples/torchscript/image_model.py OUT [--channels 8 --seed 0] [--norm]

writes OUT/cnn.pt: input float [B, 1, 28, 28] (starling also hands it flat rows [B, 784] and
reshapes them to the model's `input_shape`), output [B, 10] class scores. With --norm it writes
OUT/cnn_bn.pt instead: the same network with BatchNorm2d after each convolution and nn.Dropout
before the head, as most real models have them. A data-parallel peer trains it as PyTorch does
(train mode for steps, eval mode for evaluation and export); its running statistics travel with
the state and are averaged in state rounds.
"""

import argparse
import os

import torch
from torch import nn


class SmallCnn(nn.Module):
    def __init__(self, channels: int):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(1, channels, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(channels, 2 * channels, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
            nn.AdaptiveAvgPool2d(7))  # 7x7 already for 28x28 images; other sizes fit too
        self.head = nn.Linear(2 * channels * 7 * 7, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x).flatten(1))


class NormCnn(nn.Module):
    """SmallCnn with batch norm and dropout."""

    def __init__(self, channels: int, dropout: float):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(1, channels, 3, padding=1), nn.BatchNorm2d(channels), nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(channels, 2 * channels, 3, padding=1), nn.BatchNorm2d(2 * channels),
            nn.ReLU(), nn.MaxPool2d(2),
            nn.AdaptiveAvgPool2d(7))
        self.drop = nn.Dropout(dropout)
        self.head = nn.Linear(2 * channels * 7 * 7, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.drop(self.features(x).flatten(1)))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out")
    ap.add_argument("--channels", type=int, default=8)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--norm", action="store_true",
                    help="batch norm and dropout (writes cnn_bn.pt)")
    ap.add_argument("--dropout", type=float, default=0.25, help="dropout rate with --norm")
    args = ap.parse_args()
    if args.channels < 1:
        ap.error("--channels must be at least 1")
    if not 0.0 <= args.dropout < 1.0:
        ap.error("--dropout must lie in [0, 1)")
    torch.manual_seed(args.seed)
    os.makedirs(args.out, exist_ok=True)
    if args.norm:
        path = os.path.join(args.out, "cnn_bn.pt")
        torch.jit.script(NormCnn(args.channels, args.dropout)).save(path)
    else:
        path = os.path.join(args.out, "cnn.pt")
        torch.jit.script(SmallCnn(args.channels)).save(path)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
