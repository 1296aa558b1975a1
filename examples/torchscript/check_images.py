#!/usr/bin/python3
"""Loads the image model starling exported after a dedloc run (`export: true`, a TorchScript
model with `input_shape`) back into PyTorch and recomputes the held-out loss starling reported.

    /usr/bin/python3 examples/torchscript/check_images.py RUN/export [DATA_DIR]

Reads RUN/export/export.json (starling's held-out loss and accuracy, the number of test images),
evaluates the exported TorchScript file and, separately, its state dict (torch.load) loaded into
the same scripted module, on the first test images of Fashion-MNIST in DATA_DIR (default
/usr/share/datasets/fashion-mnist; pixels / 255, as starling reads them). Prints the losses;
exits 1 when either differs from starling's by more than 1e-4. Runs trained on the generated
stand-in (no data set installed) cannot be checked this way.
"""

import gzip
import json
import os
import sys

import numpy as np
import torch
import torch.nn.functional as F


def read_idx(path: str, offset: int) -> np.ndarray:
    with gzip.open(path) if path.endswith(".gz") else open(path, "rb") as f:
        return np.frombuffer(f.read(), np.uint8, offset=offset)


def find(data_dir: str, name: str) -> str:
    for candidate in (name + ".gz", name):
        path = os.path.join(data_dir, candidate)
        if os.path.exists(path):
            return path
    raise SystemExit(f"{os.path.join(data_dir, name)}(.gz) not found")


def main() -> int:
    if len(sys.argv) not in (2, 3):
        print(__doc__)
        return 2
    export_dir = sys.argv[1]
    data_dir = sys.argv[2] if len(sys.argv) == 3 else "/usr/share/datasets/fashion-mnist"
    with open(os.path.join(export_dir, "export.json")) as f:
        ex = json.load(f)
    if "input_shape" not in ex:
        print("export.json has no input_shape: not an image model (check.py checks token models)")
        return 2
    n = ex["held_out_samples"]
    shape = [n] + ex["input_shape"]
    images = read_idx(find(data_dir, "t10k-images-idx3-ubyte"), 16)[: n * 784]
    labels = read_idx(find(data_dir, "t10k-labels-idx1-ubyte"), 8)[:n]
    x = torch.tensor(images, dtype=torch.float32).reshape(shape) / 255.0
    y = torch.tensor(labels, dtype=torch.long)
    scripted = [f for f in ex["files"] if not f.endswith(".state_dict.pt")]
    if len(scripted) != 1:
        print(f"expected one exported TorchScript file, found {scripted}")
        return 1
    path = os.path.join(export_dir, os.path.basename(scripted[0]))
    m = torch.jit.load(path)
    m.eval()
    with torch.no_grad():
        out = m(x)
    loss_ts = F.cross_entropy(out, y).item()
    accuracy = (out.argmax(1) == y).float().mean().item()
    fresh = torch.jit.load(path)
    fresh.load_state_dict(torch.load(path[:-3] + ".state_dict.pt"))
    fresh.eval()
    with torch.no_grad():
        loss_sd = F.cross_entropy(fresh(x), y).item()
    want = ex["held_out_loss"]
    print(f"held-out loss on {n} test images: starling {want:.6f}, exported TorchScript "
          f"{loss_ts:.6f} (accuracy {accuracy:.4f}, starling {ex['held_out_accuracy']:.4f}), "
          f"state dict {loss_sd:.6f}")
    ok = all(abs(v - want) < 1e-4 for v in (loss_ts, loss_sd))
    print("match" if ok else "MISMATCH")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
