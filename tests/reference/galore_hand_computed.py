#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Hand-computed GaLore-AdamW trajectories for tests/unit/test_galore.cpp (plain Python floats,
no numpy): galore_torch/adamw.py's step with GaLoreProjector's SVD, written out element by element
in the order lather computes it (products accumulated in double, in increasing index order).

The thin SVD is a one-sided Jacobi SVD with lather's sign convention (thin_svd_host: the largest
|entry| of each row of V^T positive, the first one on ties), converged to machine precision: it
agrees with LAPACK's gesdd to ~1e-15, which the test's tolerance allows for.

Gradients and initial parameters are small rationals computed from integer formulas that the C++
test evaluates identically (`grad_value`, `init_value`).

Run: python3 tests/reference/galore_hand_computed.py  (prints the C++ tables pasted in the test)
"""
import math


def grad_value(t, i, j, salt):
    # exact in binary: multiples of 1/8 plus a multiple of 1/16
    return (((7 * t + 3 * i + 5 * j + 2 * i * j + salt) % 13) - 6) / 8.0 + ((t * (i + 1) + j * salt) % 5) / 16.0


def init_value(i, j, salt):
    return (((3 * i + 5 * j + salt) % 7) - 3) / 10.0


def matrix(rows, cols, f):
    return [[f(i, j) for j in range(cols)] for i in range(rows)]


def transpose(a):
    return [list(r) for r in zip(*a)]


def jacobi_columns(a):
    """One-sided Jacobi on the columns of a (m x n, m >= n): returns (sigma, U, V) with a = U S V^T."""
    m, n = len(a), len(a[0])
    u = [row[:] for row in a]
    v = [[1.0 if i == j else 0.0 for j in range(n)] for i in range(n)]
    for _sweep in range(100):
        off = 0.0
        for p in range(n - 1):
            for q in range(p + 1, n):
                alpha = sum(u[i][p] * u[i][p] for i in range(m))
                beta = sum(u[i][q] * u[i][q] for i in range(m))
                gamma = sum(u[i][p] * u[i][q] for i in range(m))
                if gamma == 0.0:
                    continue
                off = max(off, abs(gamma) / math.sqrt(alpha * beta))
                zeta = (beta - alpha) / (2.0 * gamma)
                t = (1.0 if zeta >= 0 else -1.0) / (abs(zeta) + math.sqrt(1.0 + zeta * zeta))
                c = 1.0 / math.sqrt(1.0 + t * t)
                s = c * t
                for i in range(m):
                    up, uq = u[i][p], u[i][q]
                    u[i][p], u[i][q] = c * up - s * uq, s * up + c * uq
                for i in range(n):
                    vp, vq = v[i][p], v[i][q]
                    v[i][p], v[i][q] = c * vp - s * vq, s * vp + c * vq
        if off < 1e-17:
            break
    sigma = [math.sqrt(sum(u[i][k] * u[i][k] for i in range(m))) for k in range(n)]
    order = sorted(range(n), key=lambda k: -sigma[k])
    s_sorted = [sigma[k] for k in order]
    u_out = [[u[i][k] / sigma[k] for k in order] for i in range(m)]
    v_out = [[v[i][k] for k in order] for i in range(n)]
    return s_sorted, u_out, v_out


def thin_svd(a):
    """a (m x n) = U diag(s) Vt, k = min(m, n); sign: largest |Vt[l, :]| entry positive."""
    m, n = len(a), len(a[0])
    if m >= n:
        s, u, v = jacobi_columns(a)
    else:
        s, v, u = jacobi_columns(transpose(a))  # a^T = V S U^T
    k = min(m, n)
    vt = [[v[j][l] for j in range(n)] for l in range(k)]
    for l in range(k):
        pivot = 0
        for j in range(1, n):
            if abs(vt[l][j]) > abs(vt[l][pivot]):
                pivot = j
        if vt[l][pivot] < 0:
            vt[l] = [-x for x in vt[l]]
            for i in range(m):
                u[i][l] = -u[i][l]
    return u, s, vt


class Options:
    def __init__(self, lr, betas, eps, wd, correct_bias, rank, gap, scale, proj):
        self.lr, self.betas, self.eps, self.wd = lr, betas, eps, wd
        self.correct_bias, self.rank, self.gap, self.scale, self.proj = correct_bias, rank, gap, scale, proj


class Param:
    def __init__(self, shape, salt, opts):
        self.shape, self.salt, self.o = shape, salt, opts
        rows = shape[0]
        cols = shape[1] if len(shape) == 2 else 1
        self.rows, self.cols = rows, cols
        self.w = matrix(rows, cols, lambda i, j: init_value(i, j, salt))
        self.step = 0
        self.projected = len(shape) == 2 and opts.rank > 0
        if self.projected:
            tall = rows >= cols
            self.right = {"std": tall, "reverse_std": not tall, "right": True, "left": False}[opts.proj]
            self.r = min(opts.rank, rows, cols)
            lr_shape = (rows, self.r) if self.right else (self.r, cols)
        else:
            lr_shape = (rows, cols)
        self.m = matrix(lr_shape[0], lr_shape[1], lambda i, j: 0.0)
        self.v = matrix(lr_shape[0], lr_shape[1], lambda i, j: 0.0)
        self.p = None
        self.min_abs_r = float("inf")

    def grad(self, t):
        return matrix(self.rows, self.cols, lambda i, j: grad_value(t, i, j, self.salt))

    def do_step(self, t):
        o = self.o
        g = self.grad(t)
        rows, cols = self.rows, self.cols
        if self.projected:
            if self.step % o.gap == 0:
                u, s, vt = thin_svd(g)
                self.sigma = s
                if self.right:
                    self.p = [vt[k][:] for k in range(self.r)]  # r x n
                else:
                    self.p = [[u[i][k] for k in range(self.r)] for i in range(rows)]  # m x r
            r = self.r
            if self.right:
                R = [[0.0] * r for _ in range(rows)]
                for i in range(rows):
                    for k in range(r):
                        acc = 0.0
                        for j in range(cols):
                            acc += g[i][j] * self.p[k][j]
                        R[i][k] = acc
            else:
                R = [[0.0] * cols for _ in range(r)]
                for k in range(r):
                    for j in range(cols):
                        acc = 0.0
                        for i in range(rows):
                            acc += self.p[i][k] * g[i][j]
                        R[k][j] = acc
            for row in R:
                for x in row:
                    self.min_abs_r = min(self.min_abs_r, abs(x))
        else:
            R = g
        self.step += 1
        b1, b2 = o.betas
        N = [[0.0] * len(R[0]) for _ in R]
        for a in range(len(R)):
            for b in range(len(R[0])):
                x = R[a][b]
                m = self.m[a][b] * b1 + (1.0 - b1) * x
                v = self.v[a][b] * b2 + (1.0 - b2) * x * x
                self.m[a][b], self.v[a][b] = m, v
                N[a][b] = m / (math.sqrt(v) + o.eps)
        step_size = o.lr
        if o.correct_bias:
            bc1 = 1.0 - b1 ** self.step
            bc2 = 1.0 - b2 ** self.step
            step_size = step_size * math.sqrt(bc2) / bc1
        for i in range(rows):
            for j in range(cols):
                if self.projected:
                    acc = 0.0
                    if self.right:
                        for k in range(self.r):
                            acc += N[i][k] * self.p[k][j]
                    else:
                        for k in range(self.r):
                            acc += self.p[i][k] * N[k][j]
                    u = acc * o.scale
                else:
                    u = N[i][j]
                w = self.w[i][j]
                w = w + (-step_size) * u
                if o.wd > 0.0:
                    w = w + (-o.lr * o.wd) * w
                self.w[i][j] = w

    def flat(self):
        return [x for row in self.w for x in row]


def run(name, params, steps):
    print(f"// ---- {name}: parameter values after each step (row-major), steps 1..{steps}")
    for k, p in enumerate(params):
        print(f"// param {k}: shape {p.shape}, salt {p.salt}")
    traj = [[] for _ in params]
    for t in range(1, steps + 1):
        for k, p in enumerate(params):
            p.do_step(t)
            traj[k].append(p.flat())
    for k, p in enumerate(params):
        print(f"const std::vector<std::vector<double>> {name}_p{k} = {{")
        for vals in traj[k]:
            print("    {" + ", ".join(repr(x) for x in vals) + "},")
        print("};")
    for k, p in enumerate(params):
        if p.projected:
            print(f"// param {k}: smallest |R| entry {p.min_abs_r:.3e}; last singular values "
                  + ", ".join(f"{s:.6f}" for s in p.sigma))


if __name__ == "__main__":
    # Case A (5 steps, refresh at 1, 3, 5): one GaLore group (std projection, rank 2, weight
    # decay) with a right-projected (4, 3), a left-projected (3, 5) and a 1-D (3,) parameter,
    # and a rank-0 group (plain AdamW, correct_bias false) with a (2, 3) parameter.
    ga = Options(0.1, (0.9, 0.999), 1e-6, 0.05, True, 2, 2, 0.25, "std")
    gb = Options(0.05, (0.8, 0.99), 1e-8, 0.0, False, 0, 2, 0.25, "std")
    run("case_a", [Param((4, 3), 1, ga), Param((3, 5), 2, ga), Param((3,), 3, ga), Param((2, 3), 4, gb)], 5)
    # Case B (7 steps, gap 3: refresh at 1, 4, 7): rank >= min(m, n) (clipped) with explicit
    # right and left projections, and reverse_std with correct_bias false and weight decay.
    gr = Options(0.02, (0.9, 0.999), 1e-6, 0.0, True, 4, 3, 0.5, "right")
    gl = Options(0.02, (0.9, 0.999), 1e-6, 0.0, True, 4, 3, 1.0, "left")
    gv = Options(0.03, (0.85, 0.995), 1e-7, 0.1, False, 1, 3, 2.0, "reverse_std")
    run("case_b", [Param((3, 4), 5, gr), Param((4, 2), 6, gl), Param((2, 3), 7, gv)], 7)
