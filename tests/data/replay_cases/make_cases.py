#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Writes the replay cases of the distributed optimizers that have no recorded PyTorch trajectory.

* lamb_apex: LAMB (apex FusedLAMB semantics) on a (8, 6) weight and a (6,) bias, 5 steps; the
  expected trajectory out/float64_fp64scalars/ is computed by tests/reference/lamb_hand_computed.py
  (plain Python doubles), so lather-replay checks LAMB by name, on one process and across ranks.
* galore_small: GaLore-AdamW (rank 2, projection refreshed every 2 steps) on (8, 6) and (6, 8)
  weights and a (6,) bias, 6 steps, no expected trajectory: CTest replays it on one process with
  --out and across ranks with --compare against that output.

Plain Python, no numpy: .npy files are written by hand. Run from this directory: python3 make_cases.py
"""
import json
import math
import os
import struct
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "reference"))
import lamb_hand_computed  # noqa: E402


def npy(path, shape, values):
    header = "{'descr': '<f8', 'fortran_order': False, 'shape': (%s), }" % (
        "".join("%d, " % d for d in shape) if len(shape) != 1 else "%d," % shape[0])
    header = header + " " * (64 - (10 + len(header) + 1) % 64) + "\n"
    with open(path, "wb") as f:
        f.write(b"\x93NUMPY\x01\x00" + struct.pack("<H", len(header)) + header.encode() +
                struct.pack("<%dd" % len(values), *values))


def numel(shape):
    n = 1
    for d in shape:
        n *= d
    return n


def values(n, salt):
    # Deterministic full-rank data, exactly representable inputs are not needed.
    return [math.sin(0.7 * i + 1.3 * salt) + 0.25 * math.cos(1.9 * i * salt + 0.1) for i in range(n)]


def case(name, optimizer, shapes, steps, expected=None):
    os.makedirs(name, exist_ok=True)
    json.dump({"description": name, "optimizer": optimizer, "params": ["p%d.npy" % k for k in range(len(shapes))],
               "steps": steps, "grads": ["g%d.npy" % k for k in range(len(shapes))],
               "variants": ["float64_fp64scalars"]}, open(os.path.join(name, "case.json"), "w"), indent=1)
    params = [values(numel(s), 1 + k) for k, s in enumerate(shapes)]
    grads = [[values(numel(s), 10 * (t + 1) + k) for k, s in enumerate(shapes)] for t in range(steps)]
    for k, s in enumerate(shapes):
        npy(os.path.join(name, "p%d.npy" % k), s, params[k])
        npy(os.path.join(name, "g%d.npy" % k), [steps] + list(s), [x for t in range(steps) for x in grads[t][k]])
    if expected:
        traj = expected(params, grads)
        out = os.path.join(name, "out", "float64_fp64scalars")
        os.makedirs(out, exist_ok=True)
        for k, s in enumerate(shapes):
            npy(os.path.join(out, "params_%d.npy" % k), [steps + 1] + list(s),
                params[k] + [x for t in range(steps) for x in traj[t][k]])


case("lamb_apex", {"name": "lamb", "lr": 0.01, "betas": [0.9, 0.999], "eps": 1e-6, "weight_decay": 0.01,
                   "bias_correction": True, "adam_w_mode": True, "grad_averaging": True, "max_grad_norm": 1.0,
                   "use_nvlamb": False, "formula": "apex"},
     [(8, 6), (6,)], 5, lambda p, g: lamb_hand_computed.apex(lr=0.01, params=p, grads=g))
case("galore_small", {"name": "galore_adamw", "lr": 0.01, "betas": [0.9, 0.999], "eps": 1e-6,
                      "weight_decay": 0.01, "correct_bias": True, "rank": 2, "update_proj_gap": 2, "scale": 0.25,
                      "proj_type": "std", "quantize_states": False, "block_size": 256, "min_8bit_size": 4096},
     [(8, 6), (6, 8), (6,)], 6)
