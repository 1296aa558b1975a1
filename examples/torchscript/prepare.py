#!/usr/bin/python3
"""Writes what the TorchScript example trains: the GPT of model.py scripted per stage, the whole
model scripted as one file (for the data-parallel peer), and byte-level token files.

    /usr/bin/python3 examples/torchscript/prepare.py OUT [--layers 4 --width 64 --heads 4
        --seq-len 64 --stages 2 --seed 0]

writes OUT/stage0.pt .. OUT/stage<S-1>.pt, OUT/whole.pt, OUT/train.bin and OUT/val.bin (uint16
tokens: the bytes of a text) and OUT/model.json (the architecture, for check.py). The text is the King James Bible when `bible` (Debian package
bible-kjv) is installed, otherwise a generated one.
"""

import argparse
import json
import os
import random
import shutil
import subprocess
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import model  # noqa: E402


def text_bytes(limit: int, seed: int) -> bytes:
    if shutil.which("bible"):
        out = subprocess.run(["bible", "-f", "Gen1:1-Rev22:21"], capture_output=True, check=False)
        if out.returncode == 0 and len(out.stdout) >= limit:
            return out.stdout[:limit]
    rng = random.Random(seed)
    words = ("the lord god and of to in that he shall unto for his they be is him not them it "
             "with all thou thy was which my me said but ye their have will").split()
    parts = []
    size = 0
    while size < limit:
        sentence = " ".join(rng.choice(words) for _ in range(rng.randint(4, 12))).capitalize()
        parts.append(sentence + ". ")
        size += len(parts[-1])
    return "".join(parts).encode()[:limit]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out")
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--width", type=int, default=64)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--seq-len", type=int, default=64)
    ap.add_argument("--stages", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--train-bytes", type=int, default=400_000)
    ap.add_argument("--val-bytes", type=int, default=40_000)
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    vocab = 256
    ranges = model.even_ranges(a.layers, a.stages)
    stages = model.make_stages(vocab, a.width, a.heads, a.seq_len, a.layers, ranges, a.seed)
    for k, st in enumerate(stages):
        torch.jit.script(st).save(os.path.join(a.out, f"stage{k}.pt"))
    whole = model.make_stages(vocab, a.width, a.heads, a.seq_len, a.layers, [[0, a.layers]],
                              a.seed)[0]
    torch.jit.script(whole).save(os.path.join(a.out, "whole.pt"))
    with open(os.path.join(a.out, "model.json"), "w") as f:
        json.dump({"vocab": vocab, "width": a.width, "heads": a.heads, "seq_len": a.seq_len,
                   "layers": a.layers, "ranges": ranges}, f)
    data = np.frombuffer(text_bytes(a.train_bytes + a.val_bytes, a.seed), dtype=np.uint8)
    data[:a.train_bytes].astype(np.uint16).tofile(os.path.join(a.out, "train.bin"))
    data[a.train_bytes:].astype(np.uint16).tofile(os.path.join(a.out, "val.bin"))
    print(f"wrote {a.stages} stage files ({ranges}), whole.pt, train.bin "
          f"({a.train_bytes} tokens), val.bin ({a.val_bytes} tokens) to {a.out}")


if __name__ == "__main__":
    main()
