#!/usr/bin/python3
"""Loads what starling exported after training (swarm or dedloc with `export: true`) back into
PyTorch and recomputes the held-out loss starling reported.

    /usr/bin/python3 examples/torchscript/check.py RUN/export build/torchscript-example

Reads RUN/export/export.json (starling's held-out loss, batches and window size), evaluates the
exported TorchScript files (stage0.pt, ... or whole.pt) and, separately, the exported state dicts
(torch.load) loaded into fresh model.py modules and into the prepared (untrained) TorchScript
files, on the first windows of val.bin. Prints the three losses; exits 1 when any differs from
starling's by more than 1e-4.
"""

import json
import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import model  # noqa: E402


def main() -> int:
    export_dir, prepared = sys.argv[1], sys.argv[2]
    with open(os.path.join(export_dir, "export.json")) as f:
        ex = json.load(f)
    with open(os.path.join(prepared, "model.json")) as f:
        arch = json.load(f)
    names = sorted(n[:-3] for n in os.listdir(export_dir)
                   if n.endswith(".pt") and not n.endswith(".state_dict.pt"))
    ranges = arch["ranges"] if names != ["whole"] else [[0, arch["layers"]]]
    if len(names) != len(ranges):
        print(f"expected {len(ranges)} exported stages, found {names}")
        return 1
    tokens = torch.from_numpy(np.fromfile(os.path.join(prepared, "val.bin"), dtype=np.uint16)
                              .astype(np.int64))
    batch, batches, seq_len = ex["microbatch"], ex["held_out_batches"], ex["seq_len"]
    scripted = [torch.jit.load(os.path.join(export_dir, n + ".pt")) for n in names]
    for m in scripted:
        m.eval()
    loss_ts = model.held_out_loss(scripted, tokens, seq_len, batch, batches)
    fresh = []
    for n, (a, b) in zip(names, ranges):
        m = model.Stage(arch["vocab"], arch["width"], arch["heads"], seq_len, arch["layers"], a, b)
        m.load_state_dict(torch.load(os.path.join(export_dir, n + ".state_dict.pt")))
        m.eval()
        fresh.append(m)
    loss_sd = model.held_out_loss(fresh, tokens, seq_len, batch, batches)
    untrained = []
    for n in names:
        m = torch.jit.load(os.path.join(prepared, n + ".pt"))
        m.load_state_dict(torch.load(os.path.join(export_dir, n + ".state_dict.pt")))
        m.eval()
        untrained.append(m)
    loss_load = model.held_out_loss(untrained, tokens, seq_len, batch, batches)
    want = ex["held_out_loss"]
    print(f"held-out loss: starling {want:.6f}, exported TorchScript {loss_ts:.6f}, "
          f"state dicts in model.py {loss_sd:.6f}, state dicts in the prepared TorchScript "
          f"{loss_load:.6f}")
    ok = all(abs(v - want) < 1e-4 for v in (loss_ts, loss_sd, loss_load))
    print("match" if ok else "MISMATCH")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
