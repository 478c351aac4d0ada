#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Writes the malformed replay cases used by tests/CMakeLists.txt (replay_error_* tests).

Each directory is a tiny valid case (one (2, 2) parameter, 2 steps of SGD-grafted Shampoo) with
one defect. Plain Python, no numpy: .npy files are written by hand (format version 1.0).
Run from this directory: python3 make_cases.py
"""
import json
import os
import struct


def npy(path, shape, values, descr="<f8", truncate=0):
    header = "{'descr': '%s', 'fortran_order': False, 'shape': (%s), }" % (
        descr, "".join("%d, " % d for d in shape) if len(shape) != 1 else "%d," % shape[0])
    pad = 64 - (10 + len(header) + 1) % 64
    header = header + " " * pad + "\n"
    fmt = "<%d%s" % (len(values), "d" if descr == "<f8" else "f")
    data = b"\x93NUMPY\x01\x00" + struct.pack("<H", len(header)) + header.encode() + struct.pack(fmt, *values)
    with open(path, "wb") as f:
        f.write(data[: len(data) - truncate])


def case(name, optimizer=None, grad_shape=(2, 2, 2), truncate=0, params_shape=(2, 2)):
    os.makedirs(name, exist_ok=True)
    opt = {"lr": 0.1, "epsilon": 1e-6, "grafting": {"type": "sgd"}}
    opt.update(optimizer or {})
    json.dump({"description": name, "optimizer": opt, "params": ["p0.npy"], "steps": 2, "grads": ["g0.npy"],
               "variants": ["float64_fp64scalars"]}, open(os.path.join(name, "case.json"), "w"), indent=1)
    npy(os.path.join(name, "p0.npy"), params_shape, [0.5] * 4)
    n = 1
    for d in grad_shape:
        n *= d
    npy(os.path.join(name, "g0.npy"), grad_shape, [0.1 * (i + 1) for i in range(n)], truncate=truncate)


case("valid")
case("unknown_option", {"learning_rate": 0.1})
case("bad_grafting", {"grafting": {"type": "lion"}})
case("wrong_grad_shape", grad_shape=(2, 4))
case("truncated_npy", truncate=8)
case("invalid_option_value", {"precondition_frequency": 0})
