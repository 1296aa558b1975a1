#!/usr/bin/python3
"""Writes a small convolutional network for 28x28 grayscale images (Fashion-MNIST), scripted for
starling's data-parallel peers:

    /usr/bin/python3 examples/torchscript/image_model.py OUT [--channels 8 --seed 0]

writes OUT/cnn.pt: input float [B, 1, 28, 28] (starling also hands it flat rows [B, 784] and
reshapes them to the model's `input_shape`), output [B, 10] class scores. No dropout and no
batch statistics: starling checks that two forward passes on the same input agree.
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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out")
    ap.add_argument("--channels", type=int, default=8)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    if args.channels < 1:
        ap.error("--channels must be at least 1")
    torch.manual_seed(args.seed)
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, "cnn.pt")
    torch.jit.script(SmallCnn(args.channels)).save(path)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
