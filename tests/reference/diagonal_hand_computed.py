#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Hand-computed trajectories of the diagonal optimizers for tests/unit/test_diagonal_optimizers.cpp.

Plain Python floats (IEEE double), one scalar parameter, the update rules written out from the
torch.optim (1.13) documentation and source, each operation in torch's order. No numpy, no torch:
run `python3 tests/reference/diagonal_hand_computed.py` and paste the printed arrays.
"""
import math

GRADS = [1.0, 0.5, -0.25, 2.0, 0.0, -1.5, 0.75]
P0 = 1.0


def sgd(lr, momentum=0.0, dampening=0.0, wd=0.0, nesterov=False):
    p, buf, out = P0, None, []
    for g in GRADS:
        d = g
        if wd:
            d = d + wd * p
        if momentum:
            buf = d if buf is None else buf * momentum + (1 - dampening) * d
            d = d + momentum * buf if nesterov else buf
        p = p + (-lr) * d
        out.append(p)
    return out


def adagrad(lr, lr_decay=0.0, wd=0.0, init=0.0, eps=1e-10):
    p, s, out = P0, init, []
    for t, g in enumerate(GRADS, start=1):
        if wd:
            g = g + wd * p
        clr = lr / (1 + (t - 1) * lr_decay)
        s = s * 1.0 + 1.0 * g * g
        p = p + (-clr) * g / (math.sqrt(s) + eps)
        out.append(p)
    return out


def rmsprop(lr, alpha=0.99, eps=1e-8, wd=0.0, momentum=0.0, centered=False):
    p, v, ga, buf, out = P0, 0.0, 0.0, 0.0, []
    for g in GRADS:
        if wd:
            g = g + wd * p
        v = v * alpha + (1 - alpha) * g * g
        if centered:
            ga = ga * alpha + (1 - alpha) * g
            avg = math.sqrt(v + (-1) * ga * ga) + eps
        else:
            avg = math.sqrt(v) + eps
        if momentum > 0:
            buf = buf * momentum + g / avg
            p = p + (-lr) * buf
        else:
            p = p + (-lr) * g / avg
        out.append(p)
    return out


def adam(lr, b1=0.9, b2=0.999, eps=1e-8, wd=0.0, amsgrad=False, decoupled=False):
    p, m, v, vmax, out = P0, 0.0, 0.0, 0.0, []
    for t, g in enumerate(GRADS, start=1):
        if decoupled:
            p = p * (1 - lr * wd)
        elif wd:
            g = g + wd * p
        m = m * b1 + (1 - b1) * g
        v = v * b2 + (1 - b2) * g * g
        bc1 = 1 - b1 ** t
        bc2 = 1 - b2 ** t
        if amsgrad:
            vmax = max(vmax, v)
            den = math.sqrt(vmax) / math.sqrt(bc2) + eps
        else:
            den = math.sqrt(v) / math.sqrt(bc2) + eps
        p = p + (-(lr / bc1)) * m / den
        out.append(p)
    return out


CASES = {
    "sgd_plain": sgd(0.1),
    "sgd_momentum_dampening_wd": sgd(0.1, momentum=0.9, dampening=0.25, wd=0.01),
    "sgd_nesterov_wd": sgd(0.05, momentum=0.8, wd=0.1, nesterov=True),
    "adagrad_lr_decay_wd_init": adagrad(0.5, lr_decay=0.1, wd=0.05, init=0.1),
    "rmsprop_plain": rmsprop(0.01),
    "rmsprop_centered_momentum_wd": rmsprop(0.01, alpha=0.9, momentum=0.5, centered=True, wd=0.1),
    "adam_plain": adam(0.1),
    "adam_l2_amsgrad": adam(0.1, b1=0.8, b2=0.99, wd=0.1, amsgrad=True),
    "adamw_decoupled": adam(0.1, wd=0.1, decoupled=True),
}

if __name__ == "__main__":
    for name, traj in CASES.items():
        print(f"{name}: {{" + ", ".join(repr(x) for x in traj) + "}")
