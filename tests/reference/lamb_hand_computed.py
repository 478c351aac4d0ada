#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Hand-computed LAMB trajectories for tests/unit/test_lamb.cpp.

Plain Python floats (IEEE double), no numpy. Two parameters, W (2, 3) and b (3,), in one group,
three steps with fixed gradients. The update rules are written out from NVIDIA apex's
multi_tensor_lamb.cu (FusedLAMB) and ColossalAI's Lamb (= pytorch-lamb with the debias folded
into the step size). Run `python3 tests/reference/lamb_hand_computed.py` and paste the output.
"""
import math

W0 = [0.5, -0.25, 1.0, 0.125, -0.75, 0.375]
B0 = [0.1, -0.2, 0.3]
GW = [[1.5, -2.0, 0.5, 0.25, 3.0, -1.0],
      [-0.5, 1.0, 2.0, -1.5, 0.0, 0.75],
      [0.25, 0.5, -0.25, 1.0, -2.0, 1.25]]
GB = [[0.5, -0.5, 2.0], [1.0, 0.0, -1.0], [-0.25, 0.75, 0.5]]


def norm(x):
    return math.sqrt(sum(v * v for v in x))


def apex(lr=0.01, b1=0.9, b2=0.999, eps=1e-6, wd=0.01, bias_correction=True, adam_w_mode=True,
         grad_averaging=True, max_grad_norm=1.0, use_nvlamb=False, params=None, grads=None):
    """params: initial flat values per tensor; grads[t][k]: flat gradient of tensor k at step t+1."""
    params = params or [W0, B0]
    grads = grads or [[GW[t], GB[t]] for t in range(3)]
    ps = [list(p) for p in params]
    ms = [[0.0] * len(p) for p in params]
    vs = [[0.0] * len(p) for p in params]
    out = []
    for t in range(1, len(grads) + 1):
        gs = grads[t - 1]
        gnorm = math.sqrt(sum(v * v for g in gs for v in g))
        clip = gnorm / max_grad_norm if (max_grad_norm > 0 and gnorm > max_grad_norm) else 1.0
        bc1 = 1 - b1 ** t if bias_correction else 1.0
        bc2 = 1 - b2 ** t if bias_correction else 1.0
        beta3 = 1 - b1 if grad_averaging else 1.0
        for k in range(len(ps)):
            p, m, v, g = ps[k], ms[k], vs[k], gs[k]
            wnorm = norm(p)
            u = []
            for i in range(len(p)):
                sg = g[i] / clip
                if not adam_w_mode:
                    sg = sg + wd * p[i]
                m[i] = m[i] * b1 + beta3 * sg
                v[i] = v[i] * b2 + (1 - b2) * sg * sg
                d = (m[i] / bc1) / (math.sqrt(v[i] / bc2) + eps)
                if adam_w_mode:
                    d = d + wd * p[i]
                u.append(d)
            unorm = norm(u)
            ratio = lr
            if (use_nvlamb or wd != 0) and wnorm != 0 and unorm != 0:
                ratio = lr * (wnorm / unorm)
            for i in range(len(p)):
                p[i] = p[i] - ratio * u[i]
        out.append([list(p) for p in ps])
    return out


def colossalai(lr=0.01, b1=0.9, b2=0.999, eps=1e-6, wd=0.01, bias_correction=True):
    ps = [list(W0), list(B0)]
    ms = [[0.0] * 6, [0.0] * 3]
    vs = [[0.0] * 6, [0.0] * 3]
    out = []
    for t in range(1, 4):
        gs = [GW[t - 1], GB[t - 1]]
        s = lr
        if bias_correction:
            s = lr * math.sqrt(1 - b2 ** t) / (1 - b1 ** t)
        for k in range(2):
            p, m, v, g = ps[k], ms[k], vs[k], gs[k]
            wnorm = norm(p)
            u = []
            for i in range(len(p)):
                m[i] = m[i] * b1 + (1 - b1) * g[i]
                v[i] = v[i] * b2 + (1 - b2) * g[i] * g[i]
                u.append(m[i] / (math.sqrt(v[i]) + eps) + wd * p[i])
            unorm = norm(u)
            trust = wnorm / unorm if (wnorm > 0 and unorm > 0) else 1.0
            for i in range(len(p)):
                p[i] = p[i] - s * trust * u[i]
        out.append([list(ps[0]), list(ps[1])])
    return out


def show(name, traj):
    print(f"// {name}")
    for t, (w, b) in enumerate(traj, 1):
        print("{{" + ", ".join(repr(x) for x in w) + "}, {" + ", ".join(repr(x) for x in b) + "}},  // step %d" % t)


if __name__ == "__main__":
    show("apex defaults (lr 0.01, wd 0.01, clipping active)", apex())
    show("apex, L2 mode, no grad averaging, no bias correction, no clipping, wd 0",
         apex(wd=0.0, adam_w_mode=False, grad_averaging=False, bias_correction=False, max_grad_norm=0.0))
    show("apex, wd 0 with use_nvlamb", apex(wd=0.0, use_nvlamb=True))
    show("colossalai (debias in the step size, trust ratio always)", colossalai())
