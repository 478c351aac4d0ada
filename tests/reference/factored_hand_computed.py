#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Hand-computed Adafactor and CAME trajectories for tests/unit/test_adafactor_came.cpp.

Plain Python floats (IEEE double), no numpy. Two parameters in one group, W (2, 3) (factored:
row statistic of 2, column statistic of 3) and b (3,) (element-wise), three steps with fixed
gradients. The update rules are written out from HuggingFace transformers' Adafactor and the
CAME paper's code (yangluo7/CAME, came_pytorch/CAME.py), each operation in their order.

`came(aliased=True)` reproduces ColossalAI's DistributedCAME bugs (the instability statistics
alias the second-moment statistics from step 2 on; the 1-D first moment is scaled by lr in place)
to show how far such an implementation lands from the paper's; the test pastes the difference.

Run `python3 tests/reference/factored_hand_computed.py` and paste the output.
"""
import math

W0 = [0.5, -0.25, 1.0, 0.125, -0.75, 0.375]   # (2, 3), row-major
B0 = [0.1, -0.2, 0.3]
GW = [[1.5, -2.0, 0.5, 0.25, 3.0, -1.0],
      [-0.5, 1.0, 2.0, -1.5, 0.0, 0.75],
      [0.25, 0.5, -0.25, 1.0, -2.0, 1.25]]
GB = [[0.5, -0.5, 2.0], [1.0, 0.0, -1.0], [-0.25, 0.75, 0.5]]
ROWS, COLS = 2, 3


def rms(x):
    return math.sqrt(sum(v * v for v in x)) / math.sqrt(len(x))


def row_means(x):
    return [sum(x[i * COLS + j] for j in range(COLS)) / COLS for i in range(ROWS)]


def col_means(x):
    return [sum(x[i * COLS + j] for i in range(ROWS)) / ROWS for j in range(COLS)]


def approx(r, c, x):
    """(rsqrt(R_i / mean R) * rsqrt(C_j)) * x, HF's _approx_sq_grad then mul_."""
    mean = sum(r) / len(r)
    rf = [1.0 / math.sqrt(v / mean) for v in r]
    cf = [1.0 / math.sqrt(v) for v in c]
    return [(rf[i] * cf[j]) * x[i * COLS + j] for i in range(ROWS) for j in range(COLS)]


def ema(s, x, beta):
    return [a * beta + (1.0 - beta) * b for a, b in zip(s, x)]


def adafactor(lr=None, eps=(1e-30, 1e-3), clip=1.0, decay_rate=-0.8, beta1=None, wd=0.0,
              scale_parameter=True, relative_step=True, warmup_init=False):
    ps = [list(W0), list(B0)]
    st = [{"row": [0.0] * ROWS, "col": [0.0] * COLS, "m": [0.0] * 6},
          {"v": [0.0] * 3, "m": [0.0] * 3}]
    out = []
    for t in range(1, 4):
        for k, g in enumerate([GW[t - 1], GB[t - 1]]):
            p, s = ps[k], st[k]
            rho = lr
            if relative_step:
                rho = min(1e-6 * t if warmup_init else 1e-2, 1.0 / math.sqrt(t))
            scale = max(eps[1], rms(p)) if scale_parameter else 1.0
            lr_t = scale * rho
            beta2 = 1.0 - math.pow(t, decay_rate)
            upd = [x * x + eps[0] for x in g]
            if k == 0:
                s["row"] = ema(s["row"], row_means(upd), beta2)
                s["col"] = ema(s["col"], col_means(upd), beta2)
                u = approx(s["row"], s["col"], g)
            else:
                s["v"] = ema(s["v"], upd, beta2)
                u = [(1.0 / math.sqrt(v)) * x for v, x in zip(s["v"], g)]
            div = max(rms(u) / clip, 1.0)
            u = [x / div for x in u]
            u = [x * lr_t for x in u]
            if beta1 is not None:
                s["m"] = [a * beta1 + (1 - beta1) * b for a, b in zip(s["m"], u)]
                u = list(s["m"])
            if wd != 0:
                ps[k] = p = [x + (-wd * lr_t) * x for x in p]
            ps[k] = [x + (-y) for x, y in zip(p, u)]
        out.append([list(ps[0]), list(ps[1])])
    return out


def came(lr=0.01, eps=(1e-30, 1e-16), clip=1.0, betas=(0.9, 0.999, 0.9999), wd=0.0, aliased=False):
    b1, b2, b3 = betas
    ps = [list(W0), list(B0)]
    st = [{"row": [0.0] * ROWS, "col": [0.0] * COLS, "rrow": [0.0] * ROWS, "rcol": [0.0] * COLS,
           "m": [0.0] * 6},
          {"v": [0.0] * 3, "m": [0.0] * 3}]
    out = []
    for t in range(1, 4):
        for k, g in enumerate([GW[t - 1], GB[t - 1]]):
            p, s = ps[k], st[k]
            if aliased and t >= 2 and k == 0:
                # ColossalAI: state["exp_avg_res_row"] = state["exp_avg_sq_row"] (same tensor)
                s["rrow"], s["rcol"] = s["row"], s["col"]
            upd = [x * x + eps[0] for x in g]
            if k == 0:
                new_row = ema(s["row"], row_means(upd), b2)
                new_col = ema(s["col"], col_means(upd), b2)
                if aliased and t >= 2:
                    s["row"][:], s["col"][:] = new_row, new_col  # in place: the alias sees it
                else:
                    s["row"], s["col"] = new_row, new_col
                u = approx(s["row"], s["col"], g)
            else:
                s["v"] = ema(s["v"], upd, b2)
                u = [(1.0 / math.sqrt(v)) * x for v, x in zip(s["v"], g)]
            div = max(rms(u) / clip, 1.0)
            u = [x / div for x in u]
            s["m"] = [a * b1 + (1 - b1) * b for a, b in zip(s["m"], u)]
            if k == 0:
                res = [(a - b) ** 2 + eps[1] for a, b in zip(u, s["m"])]
                new_rrow = ema(s["rrow"], row_means(res), b3)
                new_rcol = ema(s["rcol"], col_means(res), b3)
                if aliased and t >= 2:
                    s["rrow"][:], s["rcol"][:] = new_rrow, new_rcol
                else:
                    s["rrow"], s["rcol"] = new_rrow, new_rcol
                update = approx(s["rrow"], s["rcol"], s["m"])
            else:
                update = list(s["m"])
                if aliased:
                    s["m"] = [x * lr for x in s["m"]]  # ColossalAI: update = exp_avg; update.mul_(lr)
            if wd != 0:
                ps[k] = p = [x + (-wd * lr) * x for x in p]
            ps[k] = [x + (-(y * lr)) for x, y in zip(p, update)]
        out.append([list(ps[0]), list(ps[1])])
    return out


def show(name, traj):
    print(f"// {name}")
    for t, (w, b) in enumerate(traj, 1):
        print("{{" + ", ".join(repr(x) for x in w) + "}, {" + ", ".join(repr(x) for x in b) + "}},  // step %d" % t)


def rel_change_diff(a, b):
    """max |dP_a - dP_b| / max |dP_b| per parameter after the last step (cumulative change)."""
    out = []
    for k, p0 in enumerate([W0, B0]):
        da = [x - y for x, y in zip(a[-1][k], p0)]
        db = [x - y for x, y in zip(b[-1][k], p0)]
        out.append(max(abs(x - y) for x, y in zip(da, db)) / max(abs(y) for y in db))
    return out


if __name__ == "__main__":
    show("adafactor: HF defaults (relative step, parameter scale, no first moment)", adafactor())
    show("adafactor: beta1 0.9, weight_decay 0.1", adafactor(beta1=0.9, wd=0.1))
    show("adafactor: relative_step false, lr 0.05, scale_parameter false, clip 0.5, decay_rate -0.5",
         adafactor(lr=0.05, relative_step=False, scale_parameter=False, clip=0.5, decay_rate=-0.5))
    show("adafactor: warmup_init", adafactor(warmup_init=True))
    show("came: defaults, lr 0.01", came())
    show("came: weight_decay 0.1, betas (0.8, 0.99, 0.999), clip 2", came(wd=0.1, betas=(0.8, 0.99, 0.999), clip=2.0))
    ref, bad = came(), came(aliased=True)
    d = rel_change_diff(bad, ref)
    print("// came with ColossalAI's aliasing + 1-D in-place lr: cumulative change after 3 steps differs by "
          "%.3g (W) and %.3g (b) relative" % (d[0], d[1]))
    show("came aliased (ColossalAI DistributedCAME)", bad)
