// SPDX-License-Identifier: Apache-2.0
// The root-inverse strategies of Shampoo (EigenRootInverse, CoupledNewtonRootInverse,
// CoupledHigherOrderRootInverse) on every execution space, in double and float.
//
// References are independent of the code under test: every test matrix is built in long double
// from a known spectrum, A = Q diag(lambda) Q^T with Q a product of random Householder
// reflections, so the exact inverse root Q diag(f(lambda)) Q^T is known; residuals X^p A_r - I are
// evaluated in long double. No eigensolver is involved on the reference side.
//
// The residual bound (stated once, used everywhere):
//
//   rho = max_ij |X^p A_r - I|  <=  tol + c * (p + 1) * n * u * kappa,   c = 2
//
// with u the unit roundoff of the precision the strategy computes in (2^-53 double, 2^-24 float),
// kappa = cond_2(A_r), and tol the strategy's stopping tolerance (0 for EigenRootInverse).
// Why: rho <= ||X^p A_r - I||_2. EigenRootInverse: syevd is backward stable, (lambda, Q) is exact
// for A_r + dA with ||dA|| <= c n u ||A_r|| (Q orthogonal to c n u), so X^p A_r - I =
// -(A_r + dA)^-1 dA contributes c n u kappa; forming X = Q diag(s) Q^T adds a relative error
// c n u to X, i.e. p c n u kappa to X^p A_r. The coupled iterations keep M = X^p A_r up to
// rounding (every iterate is a polynomial in A_r; the coupled form is stable, Higham, Functions
// of Matrices, sec. 7.3) and stop once max|M - I| <= tol, so rho <= tol + the same rounding
// terms. The analysis' constants are O(1) and typical errors grow like sqrt(n) u rather than n u;
// c = 2 leaves room for other seeds (--seed=N): the largest measured fraction of
// (p + 1) n u kappa is 0.41 (n = 1), the measured worst ratios are printed ("[root-inverse]"
// lines) and listed in docs/root-inverse.md. For fractional roots r = p/q the residual is
// X^p A_r^q - I, with kappa^q in place of kappa and q tol in place of tol.
//
// The forward error against the exact inverse root is checked with
//   max|X - X_exact| / max|X_exact| <= tol + (n + 2) * u * kappa
// (the relative condition number of A^(-1/r) is at most kappa / r <= kappa; the + 2: X is formed
// as the SYRK of Q diag(sqrt(s)), whose square root and scaling are two more roundings per term,
// visible at n = 1 where the rest of the bound is a single unit).
#include <lather/root_inverse/root_inverse.hpp>

#include <Kokkos_Core.hpp>

#include <doctest/doctest.h>

#include <cfenv>
#include <cmath>
#include <cstdio>
#include <iostream>
#include <limits>
#include <map>
#include <sstream>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "exec_spaces.hpp"
#include "test_utils.hpp"

namespace {

using lather::RootInverseStatus;
using ld = long double;
using doctest::Contains;

// ---- long double matrices -------------------------------------------------------------------------

struct Mat {
  std::size_t n = 0;
  std::vector<ld> v;
  explicit Mat(std::size_t size = 0) : n(size), v(size * size, 0.0L) {}
  ld& operator()(std::size_t i, std::size_t j) { return v[i * n + j]; }
  ld operator()(std::size_t i, std::size_t j) const { return v[i * n + j]; }
};

Mat identity(std::size_t n, ld diagonal = 1.0L) {
  Mat m(n);
  for (std::size_t i = 0; i < n; ++i) m(i, i) = diagonal;
  return m;
}

Mat multiply(const Mat& a, const Mat& b) {
  const std::size_t n = a.n;
  Mat c(n);
  for (std::size_t i = 0; i < n; ++i)
    for (std::size_t k = 0; k < n; ++k) {
      const ld aik = a(i, k);
      if (aik == 0.0L) continue;
      for (std::size_t j = 0; j < n; ++j) c(i, j) += aik * b(k, j);
    }
  return c;
}

Mat power(const Mat& a, long p) {
  Mat result = identity(a.n), base = a;
  for (; p > 0; p >>= 1) {
    if (p & 1) result = multiply(result, base);
    if (p > 1) base = multiply(base, base);
  }
  return result;
}

Mat plus_identity(Mat a, ld shift) {
  for (std::size_t i = 0; i < a.n; ++i) a(i, i) += shift;
  return a;
}

ld max_abs(const Mat& a) {
  ld m = 0;
  for (const ld x : a.v) m = std::max(m, std::fabs(x));
  return m;
}

ld max_abs_diff(const Mat& a, const Mat& b) {
  ld m = 0;
  for (std::size_t k = 0; k < a.v.size(); ++k) m = std::max(m, std::fabs(a.v[k] - b.v[k]));
  return m;
}

bool all_finite(const Mat& a) {
  for (const ld x : a.v)
    if (!std::isfinite(x)) return false;
  return true;
}

/// A random orthogonal matrix: the product of n Householder reflections I - 2 v v^T / (v^T v).
Mat random_orthogonal(std::size_t n, std::uint64_t stream) {
  Mat q = identity(n);
  for (std::size_t r = 0; r < n; ++r) {
    const auto v = lather::test::random_values(n, stream * 1000 + r);
    ld vv = 0;
    for (const double x : v) vv += static_cast<ld>(x) * x;
    if (vv == 0.0L) continue;
    for (std::size_t i = 0; i < n; ++i) {  // q <- q (I - 2 v v^T / vv)
      ld qv = 0;
      for (std::size_t k = 0; k < n; ++k) qv += q(i, k) * v[k];
      const ld scale = 2.0L * qv / vv;
      for (std::size_t k = 0; k < n; ++k) q(i, k) -= scale * v[k];
    }
  }
  return q;
}

/// Q diag(d) Q^T, exactly symmetric.
Mat from_spectrum(const Mat& q, const std::vector<ld>& d) {
  const std::size_t n = q.n;
  Mat a(n);
  for (std::size_t i = 0; i < n; ++i)
    for (std::size_t j = i; j < n; ++j) {
      ld s = 0;
      for (std::size_t k = 0; k < n; ++k) s += q(i, k) * d[k] * q(j, k);
      a(i, j) = s;
      a(j, i) = s;
    }
  return a;
}

/// Eigenvalues log-spaced from `top` down to top / kappa.
std::vector<ld> log_spectrum(std::size_t n, ld top, ld kappa) {
  std::vector<ld> d(n);
  for (std::size_t i = 0; i < n; ++i)
    d[i] = n == 1 ? top : top * std::pow(kappa, -static_cast<ld>(i) / static_cast<ld>(n - 1));
  return d;
}

std::vector<ld> inverse_root_of(const std::vector<ld>& d, ld root) {
  std::vector<ld> s(d.size());
  for (std::size_t i = 0; i < d.size(); ++i) s[i] = std::pow(d[i], -1.0L / root);
  return s;
}

// ---- running a strategy ---------------------------------------------------------------------------

struct Result {
  RootInverseStatus status = RootInverseStatus::failed;
  Mat x;  // the output
  Mat a;  // the input as the strategy saw it (rounded to T)
};

template <class ExecSpace, class T, class Strategy>
Result run(const Strategy& strategy, const Mat& a, double root, double epsilon) {
  using M = typename ExecSpace::memory_space;
  const std::size_t n = a.n;
  Kokkos::View<T**, Kokkos::LayoutRight, M> da("A", n, n), dx("X", n, n);
  auto ha = Kokkos::create_mirror_view(da);
  Result r;
  r.a = Mat(n);
  for (std::size_t i = 0; i < n; ++i)
    for (std::size_t j = 0; j < n; ++j) {
      ha(i, j) = static_cast<T>(a(i, j));
      r.a(i, j) = static_cast<ld>(ha(i, j));
    }
  Kokkos::deep_copy(da, ha);
  r.status =
      strategy.compute(ExecSpace(), Kokkos::View<const T**, Kokkos::LayoutRight, M>(da), root, epsilon, dx);
  auto hx = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), dx);
  r.x = Mat(n);
  for (std::size_t i = 0; i < n; ++i)
    for (std::size_t j = 0; j < n; ++j) r.x(i, j) = static_cast<ld>(hx(i, j));
  return r;
}

template <class T>
constexpr double unit_roundoff() {
  return std::numeric_limits<T>::epsilon() / 2;
}

/// max_ij |X^p A_r^q - I| in long double.
ld residual(const Mat& x, long p, const Mat& a_r, long q = 1) {
  const Mat r = multiply(power(x, p), q == 1 ? a_r : power(a_r, q));
  return max_abs_diff(r, identity(x.n));
}

/// The stated residual bound: tol + c (p + 1) n u kappa with c = 2 (see the header comment).
double residual_bound(double tol, long p, std::size_t n, double u, double kappa) {
  return tol + 2.0 * static_cast<double>(p + 1) * static_cast<double>(n) * u * kappa;
}

// The worst measured residual ratios, printed at the end of each sweep for docs/root-inverse.md.
struct Measured {
  double residual = 0, ratio = 0, forward = 0;
};

std::string describe(RootInverseStatus s) { return lather::to_string(s); }

// ---- strategies under test ------------------------------------------------------------------------

lather::CoupledHigherOrderRootInverse higher_order(int order = 3) {
  return lather::CoupledHigherOrderRootInverse{.rel_epsilon = 0.0, .abs_epsilon = 0.0, .order = order};
}

// ---- (1) accuracy sweep: roots 2, 4, 6, 8; sizes 1, 2, 3, 13, 64, 256 ------------------------------

/// A random SPD matrix with cond_2 = kappa (eigenvalues log-spaced in [2 / kappa, 2]) and its
/// exact inverse roots, built once per (n, kappa) and shared by every strategy and space.
struct SweepCase {
  Mat q, a;
  std::vector<ld> d;
  std::map<long, Mat> exact;  // p -> A^(-1/p)
};

const SweepCase& sweep_case(std::size_t n, ld kappa) {
  static std::map<std::pair<std::size_t, double>, SweepCase> cache;
  const auto key = std::pair{n, static_cast<double>(kappa)};
  auto it = cache.find(key);
  if (it == cache.end()) {
    SweepCase c;
    c.q = random_orthogonal(n, 100 + n);
    c.d = log_spectrum(n, 2.0L, kappa);
    c.a = from_spectrum(c.q, c.d);
    for (const long p : {2L, 4L, 6L, 8L})
      c.exact[p] = from_spectrum(c.q, inverse_root_of(c.d, static_cast<ld>(p)));
    it = cache.emplace(key, std::move(c)).first;
  }
  return it->second;
}

/// Runs `strategy` on random SPD matrices with cond_2 = kappa (1e3 in double, 1e2 in float) and
/// checks the residual and forward bounds of the header comment. `tol` is the strategy's stopping
/// tolerance, `usable_only` accepts max_iterations_reached (float iterations whose tolerance is
/// below float's reach).
template <class ExecSpace, class T, class Strategy>
void sweep(const char* name, const Strategy& strategy, double tol, double u, bool usable_only) {
  const ld kappa = std::is_same_v<T, double> ? 1e3L : 1e2L;
  for (const std::size_t n : {1, 2, 3, 13, 64, 256}) {
    const SweepCase& c = sweep_case(n, kappa);
    const double k = n == 1 ? 1.0 : static_cast<double>(kappa);
    Measured worst;
    for (const long p : {2L, 4L, 6L, 8L}) {
      CAPTURE(name);
      CAPTURE(n);
      CAPTURE(p);
      const Result r = run<ExecSpace, T>(strategy, c.a, static_cast<double>(p), 0.0);
      CAPTURE(describe(r.status));
      if (usable_only) {
        CHECK(lather::is_usable(r.status));
      } else {
        CHECK(r.status == RootInverseStatus::success);
      }
      REQUIRE(all_finite(r.x));
      const double rho = static_cast<double>(residual(r.x, p, r.a));
      const double bound = residual_bound(tol, p, n, u, k);
      CHECK_MESSAGE(rho <= bound, "residual " << rho << " > bound " << bound);
      const Mat& exact = c.exact.at(p);
      const double forward = static_cast<double>(max_abs_diff(r.x, exact) / max_abs(exact));
      const double forward_bound = tol + static_cast<double>(n + 2) * u * k;
      CHECK_MESSAGE(forward <= forward_bound, "forward error " << forward << " > bound " << forward_bound);
      worst.residual = std::max(worst.residual, rho);
      worst.ratio = std::max(worst.ratio, rho / bound);
      worst.forward = std::max(worst.forward, forward);
    }
    std::printf(
        "[root-inverse] %-29s %-6s %-6s n=%3zu kappa=%.0e worst residual %.2e (%.3f of its bound), "
        "worst forward error %.2e\n",
        name, std::is_same_v<T, double> ? "double" : "float", ExecSpace::name(), n, k, worst.residual,
        worst.ratio, worst.forward);
  }
}

template <class ExecSpace>
void impl_test_sweep_eigen() {
  sweep<ExecSpace, double>("EigenRootInverse", lather::EigenRootInverse{}, 0.0, unit_roundoff<double>(),
                           false);
  sweep<ExecSpace, float>("EigenRootInverse", lather::EigenRootInverse{}, 0.0, unit_roundoff<float>(), false);
}

template <class ExecSpace>
void impl_test_sweep_newton() {
  const lather::CoupledNewtonRootInverse newton{};
  sweep<ExecSpace, double>("CoupledNewtonRootInverse", newton, newton.tolerance, unit_roundoff<double>(),
                           false);
  // float: the default tolerance 1e-6 is at float's rounding floor for large n, so the iteration
  // may end by its count (X is usable); the bound is the same formula with float's u.
  sweep<ExecSpace, float>("CoupledNewtonRootInverse", newton, newton.tolerance, unit_roundoff<float>(), true);
}

template <class ExecSpace>
void impl_test_sweep_higher_order() {
  const auto ho = higher_order();
  sweep<ExecSpace, double>("CoupledHigherOrderRootInverse", ho, ho.tolerance, unit_roundoff<double>(), false);
  sweep<ExecSpace, float>("CoupledHigherOrderRootInverse", ho, ho.tolerance, unit_roundoff<float>(), true);
}

// ---- (2) the reference's exact cases (matrix_functions_test) ------------------------------------

/// B = [[1,1,1],[1,2,-3],[1,-3,18]] and A = B^-2: A^(-1/2) = B and A^(-1) = B^2. B^-1 is the
/// integer matrix adj(B) (det B = 1), so A is exact in float and double.
Mat reference_b() {
  Mat b(3);
  const ld v[9] = {1, 1, 1, 1, 2, -3, 1, -3, 18};
  for (std::size_t k = 0; k < 9; ++k) b.v[k] = v[k];
  return b;
}
Mat reference_a() {
  Mat b_inv(3);
  const ld v[9] = {27, -21, -5, -21, 17, 4, -5, 4, 1};
  for (std::size_t k = 0; k < 9; ++k) b_inv.v[k] = v[k];
  return multiply(b_inv, b_inv);
}
// cond_2(A) = cond_2(B)^2 <= (||B||_F ||B^-1||_F)^2 = 351 * 1983.
constexpr double kReferenceKappa = 351.0 * 1983.0;

template <class ExecSpace, class T, class Strategy>
void check_exact(const char* name, const Strategy& strategy, const Mat& a, double root, const Mat& expected,
                 double tol, double u, double kappa) {
  CAPTURE(name);
  CAPTURE(root);
  const char* precision = std::is_same_v<T, double> ? "double" : "float";
  CAPTURE(precision);
  const Result r = run<ExecSpace, T>(strategy, a, root, 0.0);
  CAPTURE(describe(r.status));
  CHECK(r.status == RootInverseStatus::success);
  REQUIRE(all_finite(r.x));
  const double err = static_cast<double>(max_abs_diff(r.x, expected) / max_abs(expected));
  const double bound = tol + static_cast<double>(a.n) * u * kappa;
  CHECK_MESSAGE(err <= bound, "relative error " << err << " > " << bound);
}

template <class ExecSpace, class T>
void exact_cases(double u) {
  Mat diag14(2);
  diag14(0, 0) = 1;
  diag14(1, 1) = 4;
  const lather::EigenRootInverse eigen{};
  const lather::EigenRootInverse eigen_after{.perturb_before_computation = false};
  const lather::EigenRootInverse pseudo{.pseudo_inverse = lather::PseudoInverse{}};
  const lather::CoupledNewtonRootInverse newton{};
  for (const double root : {1.0, 2.0, 4.0}) {
    Mat expected(2);
    expected(0, 0) = 1;
    expected(1, 1) = std::pow(4.0L, -1.0L / root);
    check_exact<ExecSpace, T>("eigen diag(1,4)", eigen, diag14, root, expected, 0, u, 4);
    check_exact<ExecSpace, T>("eigen (perturb after) diag(1,4)", eigen_after, diag14, root, expected, 0, u,
                              4);
    check_exact<ExecSpace, T>("pseudo-inverse diag(1,4)", pseudo, diag14, root, expected, 0, u, 4);
    check_exact<ExecSpace, T>("newton diag(1,4)", newton, diag14, root, expected, newton.tolerance, u, 4);
    for (int order = 2; order <= 6; ++order)
      check_exact<ExecSpace, T>("higher-order diag(1,4)", higher_order(order), diag14, root, expected, 1e-8,
                                u, 4);
  }
  // The 3x3 case, root 2 (X = B) and root 1 (X = B^2). kappa(A) ~ 7e5: in float the bound
  // n u kappa is ~0.1, the reference's own tolerance (atol 0.05, rtol 1e-2) in spirit.
  const Mat a = reference_a(), b = reference_b(), b2 = multiply(b, b);
  for (const auto& [root, expected] : {std::pair{2.0, b}, std::pair{1.0, b2}}) {
    check_exact<ExecSpace, T>("eigen 3x3", eigen, a, root, expected, 0, u, kReferenceKappa);
    check_exact<ExecSpace, T>("eigen (perturb after) 3x3", eigen_after, a, root, expected, 0, u,
                              kReferenceKappa);
    check_exact<ExecSpace, T>("pseudo-inverse 3x3", pseudo, a, root, expected, 0, u, kReferenceKappa);
    if constexpr (std::is_same_v<T, double>) {
      // The iterations need the conditioning double gives them (in float the reference's tests use
      // atol 0.05); the higher-order true-error check would fail in float.
      check_exact<ExecSpace, T>("newton 3x3", newton, a, root, expected, newton.tolerance, u,
                                kReferenceKappa);
      for (int order = 2; order <= 6; ++order)
        check_exact<ExecSpace, T>("higher-order 3x3", higher_order(order), a, root, expected, 1e-8, u,
                                  kReferenceKappa);
    }
  }
}

template <class ExecSpace>
void impl_test_exact_cases() {
  exact_cases<ExecSpace, double>(unit_roundoff<double>());
  exact_cases<ExecSpace, float>(unit_roundoff<float>());
  // Newton and higher order in float on the 3x3 case, computing in double (compute_in_double):
  // the result is float-rounded only.
  const Mat a = reference_a(), b = reference_b();
  check_exact<ExecSpace, float>("newton 3x3 compute_in_double",
                                lather::CoupledNewtonRootInverse{.compute_in_double = true}, a, 2.0, b, 1e-6,
                                unit_roundoff<double>(), kReferenceKappa);
  auto ho = higher_order();
  ho.compute_in_double = true;
  check_exact<ExecSpace, float>("higher-order 3x3 compute_in_double", ho, a, 2.0, b, 1e-6,
                                unit_roundoff<double>(), kReferenceKappa);
}

// ---- (3) repeated eigenvalues ------------------------------------------------------------------

template <class ExecSpace, class Strategy>
void repeated(const char* name, const Strategy& strategy, double tol) {
  CAPTURE(name);
  const double u = unit_roundoff<double>();
  const std::size_t n = 13;
  const std::vector<ld> duplicates = {1, 1, 2, 2, 2, 5, 5, 5, 5, 0.5L, 0.5L, 1, 2};
  const Mat q = random_orthogonal(n, 7);
  struct Case {
    const char* what;
    Mat a;
    std::vector<ld> d;
    Mat q;
  };
  const std::vector<Case> cases = {
      {"identity", identity(n), std::vector<ld>(n, 1.0L), identity(n)},
      {"2.5 I", identity(n, 2.5L), std::vector<ld>(n, 2.5L), identity(n)},
      {"diag with duplicates", from_spectrum(identity(n), duplicates), duplicates, identity(n)},
      {"rotated duplicates", from_spectrum(q, duplicates), duplicates, q},
  };
  for (const auto& c : cases) {
    CAPTURE(c.what);
    for (const long p : {2L, 4L}) {
      CAPTURE(p);
      const Result r = run<ExecSpace, double>(strategy, c.a, static_cast<double>(p), 0.0);
      CHECK(r.status == RootInverseStatus::success);
      REQUIRE(all_finite(r.x));
      const Mat exact = from_spectrum(c.q, inverse_root_of(c.d, static_cast<ld>(p)));
      CHECK(static_cast<double>(max_abs_diff(r.x, exact) / max_abs(exact)) <= tol + n * u * 10);
    }
  }
}

template <class ExecSpace>
void impl_test_repeated_eigenvalues() {
  repeated<ExecSpace>("eigen", lather::EigenRootInverse{}, 0.0);
  repeated<ExecSpace>("newton", lather::CoupledNewtonRootInverse{}, 1e-6);
  repeated<ExecSpace>("higher-order", higher_order(), 1e-8);
}

// ---- (4) rank-deficient inputs -----------------------------------------------------------------

/// A rank-7 13 x 13 PSD matrix with eigenvalues in [0.1, 1] and its range projector.
struct RankDeficient {
  std::size_t n = 13, rank = 7;
  Mat q = random_orthogonal(13, 11);
  std::vector<ld> d;
  Mat a, projector;
  RankDeficient() : d(13, 0.0L) {
    for (std::size_t i = 0; i < rank; ++i)
      d[i] = 1.0L - 0.9L * static_cast<ld>(i) / static_cast<ld>(rank - 1);
    a = from_spectrum(q, d);
    std::vector<ld> ones(n, 0.0L);
    for (std::size_t i = 0; i < rank; ++i) ones[i] = 1;
    projector = from_spectrum(q, ones);
  }
};

template <class ExecSpace>
void impl_test_rank_deficient() {
  const RankDeficient rd;
  const double u = unit_roundoff<double>();
  const ld eps = 1e-3L;
  const double kappa_r = static_cast<double>((1.0L + eps) / eps);
  // epsilon > 0: every strategy computes (A + eps I)^(-1/p). The higher-order strategy takes its
  // perturbation from abs_epsilon (the optimizer's epsilon is not used).
  auto ho = higher_order();
  ho.abs_epsilon = 1e-3;
  for (const long p : {2L, 4L}) {
    CAPTURE(p);
    std::vector<ld> shifted = rd.d;
    for (auto& x : shifted) x += eps;
    const Mat exact = from_spectrum(rd.q, inverse_root_of(shifted, static_cast<ld>(p)));
    const auto check = [&](const char* name, const Result& r, double tol) {
      CAPTURE(name);
      CAPTURE(describe(r.status));
      CHECK(r.status == RootInverseStatus::success);
      REQUIRE(all_finite(r.x));
      const double rho = static_cast<double>(residual(r.x, p, plus_identity(r.a, eps)));
      CHECK(rho <= residual_bound(tol, p, rd.n, u, kappa_r));
      CHECK(static_cast<double>(max_abs_diff(r.x, exact) / max_abs(exact)) <= tol + 13 * u * kappa_r);
    };
    check("eigen", run<ExecSpace, double>(lather::EigenRootInverse{}, rd.a, static_cast<double>(p), 1e-3),
          0.0);
    check("eigen (perturb after)",
          run<ExecSpace, double>(lather::EigenRootInverse{.perturb_before_computation = false}, rd.a,
                                 static_cast<double>(p), 1e-3),
          0.0);
    check("newton",
          run<ExecSpace, double>(lather::CoupledNewtonRootInverse{}, rd.a, static_cast<double>(p), 1e-3),
          1e-6);
    check("higher-order (abs_epsilon, optimizer epsilon 0)",
          run<ExecSpace, double>(ho, rd.a, static_cast<double>(p), 0.0), 1e-8);
  }

  // epsilon = 0 with the perturbation rule: an exactly zero eigenvalue gives an infinite X (the
  // reference's tests show inf entries), reported as non_finite, in both perturbation modes.
  Mat singular(3);
  singular(0, 0) = 2;
  singular(2, 2) = 3;
  for (const bool before : {true, false}) {
    CAPTURE(before);
    const Result r = run<ExecSpace, double>(lather::EigenRootInverse{.perturb_before_computation = before},
                                            singular, 2.0, 0.0);
    CHECK(r.status == RootInverseStatus::non_finite);
    CHECK_FALSE(all_finite(r.x));
    const Result rf = run<ExecSpace, float>(lather::EigenRootInverse{.perturb_before_computation = before},
                                            singular, 2.0, 0.0);
    CHECK(rf.status == RootInverseStatus::non_finite);
  }

  // Pseudo-inverse (epsilon = 0): finite, zero on the null space, and X^p A = the range projector.
  const lather::EigenRootInverse pseudo{.pseudo_inverse = lather::PseudoInverse{.rank_rtol = std::nullopt}};
  const double kappa_range = 10.0;  // eigenvalues in [0.1, 1] on the range
  for (const long p : {2L, 4L}) {
    CAPTURE(p);
    const Result r = run<ExecSpace, double>(pseudo, rd.a, static_cast<double>(p), 0.0);
    CHECK(r.status == RootInverseStatus::success);
    REQUIRE(all_finite(r.x));
    std::vector<ld> s(rd.n, 0.0L);
    for (std::size_t i = 0; i < rd.rank; ++i) s[i] = std::pow(rd.d[i], -1.0L / p);
    const Mat exact = from_spectrum(rd.q, s);
    CHECK(static_cast<double>(max_abs_diff(r.x, exact) / max_abs(exact)) <= 13 * u * kappa_range);
    const Mat xp_a = multiply(power(r.x, p), r.a);
    CHECK(static_cast<double>(max_abs_diff(xp_a, rd.projector)) <=
          residual_bound(0.0, p, rd.n, u, kappa_range));
    // pseudo-inverse in float, default tolerances would keep the rounding-level eigenvalues: with
    // rank_rtol = n * eps they are cut as well.
    const Result rf = run<ExecSpace, float>(pseudo, rd.a, static_cast<double>(p), 0.0);
    CHECK(rf.status == RootInverseStatus::success);
    CHECK(static_cast<double>(max_abs_diff(rf.x, exact) / max_abs(exact)) <=
          13 * unit_roundoff<float>() * kappa_range);
  }
  // The default PseudoInverse (atol 0, rtol 0) cuts exactly the eigenvalues <= 0.
  {
    Mat d(3);
    d(0, 0) = 4;
    d(2, 2) = 1;
    const Result r = run<ExecSpace, double>(
        lather::EigenRootInverse{.pseudo_inverse = lather::PseudoInverse{}}, d, 2.0, 0.0);
    CHECK(r.status == RootInverseStatus::success);
    Mat expected(3);
    expected(0, 0) = 0.5L;
    expected(2, 2) = 1;
    CHECK(static_cast<double>(max_abs_diff(r.x, expected)) <= 4 * u);
  }

  // Coupled Newton with epsilon = 0 on a singular matrix: M keeps a zero eigenvalue, so the
  // iteration runs to its limit (the reference warns and returns X): max_iterations_reached.
  for (const bool is_double : {true, false}) {
    CAPTURE(is_double);
    const RootInverseStatus s =
        is_double ? run<ExecSpace, double>(lather::CoupledNewtonRootInverse{}, singular, 2.0, 0.0).status
                  : run<ExecSpace, float>(lather::CoupledNewtonRootInverse{}, singular, 2.0, 0.0).status;
    CHECK(s == RootInverseStatus::max_iterations_reached);
  }
  // Higher order with eps' = 0 on a singular matrix: the true error is >= 1 > 0.1: failed. The
  // optimizer's epsilon (here 1) is not used, so it fails as well.
  CHECK(run<ExecSpace, double>(higher_order(), singular, 2.0, 0.0).status == RootInverseStatus::failed);
  CHECK(run<ExecSpace, double>(higher_order(), singular, 2.0, 1.0).status == RootInverseStatus::failed);
  // ...and rel_epsilon regularizes it: eps' = rel_epsilon * lambda_max = 0.01 * 3.
  auto ho_rel = higher_order();
  ho_rel.rel_epsilon = 0.01;
  {
    const Result r = run<ExecSpace, double>(ho_rel, singular, 2.0, 0.0);
    CHECK(r.status == RootInverseStatus::success);
    Mat expected(3);
    expected(0, 0) = 1 / std::sqrt(2.03L);
    expected(1, 1) = 1 / std::sqrt(0.03L);
    expected(2, 2) = 1 / std::sqrt(3.03L);
    CHECK(static_cast<double>(max_abs_diff(r.x, expected) / max_abs(expected)) <= 1e-8);
  }
}

// ---- (5) ill-conditioned inputs (cond 1e8, double) ---------------------------------------------

template <class ExecSpace, class Strategy>
void ill_conditioned(const char* name, const Strategy& strategy, double tol) {
  CAPTURE(name);
  const std::size_t n = 64;
  const ld kappa = 1e8L;
  const double u = unit_roundoff<double>();
  const Mat q = random_orthogonal(n, 5);
  const std::vector<ld> d = log_spectrum(n, 1.0L, kappa);
  const Mat a = from_spectrum(q, d);
  for (const long p : {2L, 4L, 8L}) {
    CAPTURE(p);
    const Result r = run<ExecSpace, double>(strategy, a, static_cast<double>(p), 0.0);
    CAPTURE(describe(r.status));
    CHECK(r.status == RootInverseStatus::success);
    REQUIRE(all_finite(r.x));
    const double rho = static_cast<double>(residual(r.x, p, r.a));
    const double bound = residual_bound(tol, p, n, u, static_cast<double>(kappa));
    CHECK_MESSAGE(rho <= bound, "residual " << rho << " > " << bound);
    std::printf(
        "[root-inverse] ill-conditioned %-29s %-6s p=%ld n=%zu kappa=1e8 residual %.2e (%.3f of its bound)\n",
        name, ExecSpace::name(), p, n, rho, rho / bound);
  }
}

template <class ExecSpace>
void impl_test_ill_conditioned() {
  ill_conditioned<ExecSpace>("EigenRootInverse", lather::EigenRootInverse{}, 0.0);
  ill_conditioned<ExecSpace>("CoupledNewtonRootInverse", lather::CoupledNewtonRootInverse{}, 1e-6);
  ill_conditioned<ExecSpace>("CoupledHigherOrderRootInverse", higher_order(), 1e-8);
}

// ---- (6) non-convergence, NaN input, the perturbation rules, precision ------------------------

template <class ExecSpace>
void impl_test_non_convergence() {
  const Mat q = random_orthogonal(13, 3);
  const Mat a = from_spectrum(q, log_spectrum(13, 1.0L, 1e3L));
  const Result r = run<ExecSpace, double>(lather::CoupledNewtonRootInverse{.max_iterations = 1}, a, 4.0, 0.0);
  CHECK(r.status == RootInverseStatus::max_iterations_reached);
  CHECK(all_finite(r.x));
  CHECK(lather::is_usable(r.status));
  const Result rf = run<ExecSpace, float>(lather::CoupledNewtonRootInverse{.max_iterations = 1}, a, 4.0, 0.0);
  CHECK(rf.status == RootInverseStatus::max_iterations_reached);
  // Higher order stopped after its first (Newton) step: still far from converged, so the
  // true-error check (> 0.1) rejects it.
  auto ho = higher_order();
  ho.max_iterations = 1;
  CHECK(run<ExecSpace, double>(ho, a, 4.0, 0.0).status == RootInverseStatus::failed);
  // A tolerance of 0 cannot be met: both iterations end by count (Newton) or stagnation (higher
  // order's early stop, which the reference treats as usable).
  const Result r0 = run<ExecSpace, double>(
      lather::CoupledNewtonRootInverse{.max_iterations = 30, .tolerance = 0.0}, a, 2.0, 0.0);
  CHECK(r0.status == RootInverseStatus::max_iterations_reached);
  auto ho0 = higher_order();
  ho0.tolerance = 0.0;
  const Result h0 = run<ExecSpace, double>(ho0, a, 2.0, 0.0);
  CHECK(h0.status == RootInverseStatus::success);
  CHECK(static_cast<double>(residual(h0.x, 2, h0.a)) <= 3 * 13 * unit_roundoff<double>() * 1e3);
}

template <class ExecSpace, class T>
void nan_input() {
  const ld nan = std::numeric_limits<ld>::quiet_NaN(), inf = std::numeric_limits<ld>::infinity();
  for (const ld bad : {nan, inf}) {
    Mat a = identity(5);
    a(1, 3) = bad;
    a(3, 1) = bad;
    const auto check = [](const char* name, const Result& r) {
      CAPTURE(name);
      CAPTURE(describe(r.status));
      CHECK((r.status == RootInverseStatus::failed || r.status == RootInverseStatus::non_finite));
      CHECK_FALSE(lather::is_usable(r.status));
    };
    Result r;
    CHECK_NOTHROW(r = run<ExecSpace, T>(lather::EigenRootInverse{}, a, 2.0, 1e-3));
    check("eigen", r);
    CHECK_NOTHROW(r = run<ExecSpace, T>(lather::CoupledNewtonRootInverse{}, a, 2.0, 1e-3));
    check("newton", r);
    CHECK(r.status == RootInverseStatus::non_finite);  // the reference returns a NaN X
    CHECK_FALSE(all_finite(r.x));
    CHECK_NOTHROW(r = run<ExecSpace, T>(higher_order(), a, 2.0, 1e-3));
    check("higher-order", r);
    CHECK(r.status == RootInverseStatus::failed);  // lambda_max is not finite: the reference raises
  }
}

template <class ExecSpace>
void impl_test_nan_input() {
  nan_input<ExecSpace, double>();
  nan_input<ExecSpace, float>();
}

template <class ExecSpace>
void impl_test_perturbation_rules() {
  // Indefinite A (eigenvalues -1 ... 3) with eps = 0.5: both rules give
  // lambda - lambda_min + eps (perturb before: eigh(A + eps I), then lambda_min + eps < eps shifts
  // back; perturb after: lambda - min(lambda_min, 0) + eps). PSD A: both give lambda + eps.
  const double u = unit_roundoff<double>();
  const std::size_t n = 13;
  const Mat q = random_orthogonal(n, 9);
  std::vector<ld> indefinite(n), psd(n);
  for (std::size_t i = 0; i < n; ++i) {
    indefinite[i] = -1.0L + 4.0L * static_cast<ld>(i) / static_cast<ld>(n - 1);
    psd[i] = 0.25L + static_cast<ld>(i) / static_cast<ld>(n - 1);
  }
  const ld eps = 0.5L;
  for (const bool before : {true, false}) {
    CAPTURE(before);
    const lather::EigenRootInverse eigen{.perturb_before_computation = before};
    for (const long p : {2L, 6L}) {
      CAPTURE(p);
      std::vector<ld> shifted(n);
      for (std::size_t i = 0; i < n; ++i) shifted[i] = indefinite[i] - indefinite[0] + eps;
      const Mat exact = from_spectrum(q, inverse_root_of(shifted, static_cast<ld>(p)));
      const Result r =
          run<ExecSpace, double>(eigen, from_spectrum(q, indefinite), static_cast<double>(p), 0.5);
      CHECK(r.status == RootInverseStatus::success);
      CHECK(static_cast<double>(max_abs_diff(r.x, exact) / max_abs(exact)) <= n * u * 10);
      std::vector<ld> psd_shifted(n);
      for (std::size_t i = 0; i < n; ++i) psd_shifted[i] = psd[i] + eps;
      const Mat exact_psd = from_spectrum(q, inverse_root_of(psd_shifted, static_cast<ld>(p)));
      const Result rp = run<ExecSpace, double>(eigen, from_spectrum(q, psd), static_cast<double>(p), 0.5);
      CHECK(rp.status == RootInverseStatus::success);
      CHECK(static_cast<double>(max_abs_diff(rp.x, exact_psd) / max_abs(exact_psd)) <= n * u * 10);
    }
  }
  // Perturb before, PSD with lambda_min >= 0: the eigenvalues of A + eps I are >= eps and are
  // used as they are (no second epsilon).
  Mat d(2);
  d(0, 0) = 1;
  const Result r = run<ExecSpace, double>(lather::EigenRootInverse{}, d, 2.0, 0.25);
  CHECK(static_cast<double>(std::fabs(r.x(0, 0) - 1 / std::sqrt(1.25L))) <= 4 * u);
  CHECK(static_cast<double>(std::fabs(r.x(1, 1) - 2.0L)) <= 4 * u);
}

template <class ExecSpace>
void impl_test_precision() {
  // Float data: computing in double (the path the fp64 retry takes) is more accurate than
  // computing in float. kappa = 1e4, n = 64.
  const std::size_t n = 64;
  const Mat q = random_orthogonal(n, 13);
  const std::vector<ld> d = log_spectrum(n, 1.0L, 1e4L);
  const Mat a = from_spectrum(q, d);
  const Mat exact = from_spectrum(q, inverse_root_of(d, 4.0L));
  const auto error = [&](const Result& r) {
    return static_cast<double>(max_abs_diff(r.x, exact) / max_abs(exact));
  };
  const Result in_float = run<ExecSpace, float>(lather::EigenRootInverse{}, a, 4.0, 0.0);
  const Result in_double =
      run<ExecSpace, float>(lather::EigenRootInverse{.compute_in_double = true}, a, 4.0, 0.0);
  CHECK(in_float.status == RootInverseStatus::success);
  CHECK(in_double.status == RootInverseStatus::success);
  CAPTURE(error(in_float));
  CAPTURE(error(in_double));
  // In double only the float rounding of A (relative u_float, amplified by kappa / p) and of X
  // remain; in float the eigensolver's n u_float kappa error comes on top.
  CHECK(error(in_double) < error(in_float));
  CHECK(error(in_double) <= (1e4 / 4 + 2) * unit_roundoff<float>());
  std::printf(
      "[root-inverse] float data, n=64 kappa=1e4 root 4: EigenRootInverse forward error %.2e in float, "
      "%.2e with compute_in_double\n",
      error(in_float), error(in_double));
  // The same holds for the iterations.
  const Result newton_double =
      run<ExecSpace, float>(lather::CoupledNewtonRootInverse{.compute_in_double = true}, a, 4.0, 0.0);
  CHECK(newton_double.status == RootInverseStatus::success);
  CHECK(error(newton_double) <= 1e-6 + (1e4 / 4 + 2) * unit_roundoff<float>());
}

// ---- (7) higher-order: orders 2..6, fractional roots ---------------------------------------------

template <class ExecSpace>
void impl_test_higher_order() {
  const double u = unit_roundoff<double>();
  const std::size_t n = 13;
  const Mat q = random_orthogonal(n, 17);
  const std::vector<ld> d = log_spectrum(n, 3.0L, 1e3L);
  const Mat a = from_spectrum(q, d);
  for (int order = 2; order <= 6; ++order) {
    CAPTURE(order);
    for (const long p : {2L, 4L, 6L, 8L}) {
      CAPTURE(p);
      const Result r = run<ExecSpace, double>(higher_order(order), a, static_cast<double>(p), 0.0);
      CHECK(r.status == RootInverseStatus::success);
      REQUIRE(all_finite(r.x));
      CHECK(static_cast<double>(residual(r.x, p, r.a)) <= residual_bound(1e-8, p, n, u, 1e3));
    }
  }
  // Fractional roots r = p/q: X = A^(-q/p), residual X^p A^q - I; also against EigenRootInverse's
  // definition (any real root) through the exact spectrum.
  for (const auto& [root, p, qq] :
       {std::tuple{1.5, 3L, 2L}, std::tuple{4.0 / 3.0, 4L, 3L}, std::tuple{2.5, 5L, 2L}}) {
    CAPTURE(root);
    const Mat exact = from_spectrum(q, inverse_root_of(d, static_cast<ld>(p) / static_cast<ld>(qq)));
    const Result r = run<ExecSpace, double>(higher_order(), a, root, 0.0);
    CHECK(r.status == RootInverseStatus::success);
    // X = X0^q with X0^p A = I + F, |F| <= tol: X^p A^q - I = (I + F)^q - I ~ q F, plus rounding
    // amplified by cond(A^q) = kappa^q.
    CHECK(static_cast<double>(residual(r.x, p, r.a, qq)) <=
          residual_bound(1e-8 * static_cast<double>(qq), p, n, u, std::pow(1e3, static_cast<double>(qq))));
    CHECK(static_cast<double>(max_abs_diff(r.x, exact) / max_abs(exact)) <= 1e-7);
    const Result e = run<ExecSpace, double>(lather::EigenRootInverse{}, a, root, 0.0);
    CHECK(e.status == RootInverseStatus::success);
    CHECK(static_cast<double>(max_abs_diff(e.x, exact) / max_abs(exact)) <= n * u * 1e3);
  }
  // Orders 2..6 in float (kappa 1e2).
  const Mat af = from_spectrum(q, log_spectrum(n, 3.0L, 1e2L));
  for (int order = 2; order <= 6; ++order) {
    CAPTURE(order);
    const Result r = run<ExecSpace, float>(higher_order(order), af, 4.0, 0.0);
    CHECK(lather::is_usable(r.status));
    CHECK(static_cast<double>(residual(r.x, 4, r.a)) <= 1e-8 + 5 * n * unit_roundoff<float>() * 1e2);
  }
}

// ---- (8) options, roots, shapes, helpers ---------------------------------------------------------

template <class ExecSpace>
void impl_test_options() {
  using lather::invalid_argument;
  CHECK(lather::to_string(RootInverseStatus::success) == std::string("success"));
  CHECK(lather::to_string(RootInverseStatus::max_iterations_reached) ==
        std::string("max_iterations_reached"));
  CHECK(lather::to_string(RootInverseStatus::failed) == std::string("failed"));
  CHECK(lather::to_string(RootInverseStatus::non_finite) == std::string("non_finite"));
  CHECK_FALSE(lather::is_usable(RootInverseStatus::failed));

  CHECK_THROWS_WITH_AS((lather::CoupledNewtonRootInverse{.max_iterations = 0}.validate()),
                       Contains("'max_iterations'"), invalid_argument);
  CHECK_THROWS_WITH_AS((lather::CoupledNewtonRootInverse{.tolerance = -1}.validate()),
                       Contains("'tolerance'"), lather::invalid_argument);
  CHECK_THROWS_WITH_AS((lather::CoupledHigherOrderRootInverse{}.validate()),
                       Contains("'rel_epsilon' is required"), invalid_argument);
  CHECK_THROWS_WITH_AS((lather::CoupledHigherOrderRootInverse{.rel_epsilon = 0}.validate()),
                       Contains("'abs_epsilon' is required"), invalid_argument);
  auto ho = higher_order();
  ho.order = 1;
  CHECK_THROWS_WITH_AS(ho.validate(), Contains("'order' = 1"), invalid_argument);
  ho = higher_order();
  ho.rel_epsilon = -1;
  CHECK_THROWS_WITH_AS(ho.validate(), Contains("'rel_epsilon' = -1"), invalid_argument);
  CHECK_THROWS_WITH_AS(
      (lather::EigenRootInverse{.pseudo_inverse = lather::PseudoInverse{.rank_atol = -1}}.validate()),
      Contains("'pseudo_inverse.rank_atol'"), invalid_argument);
  CHECK_THROWS_WITH_AS(
      (lather::EigenRootInverse{.pseudo_inverse = lather::PseudoInverse{.rank_rtol = -0.5}}.validate()),
      Contains("'pseudo_inverse.rank_rtol'"), invalid_argument);
  CHECK(lather::EigenRootInverse{.pseudo_inverse = lather::PseudoInverse{}}.requires_zero_epsilon());
  CHECK_FALSE(lather::EigenRootInverse{}.requires_zero_epsilon());

  // Roots.
  const double nan = std::numeric_limits<double>::quiet_NaN(), inf = std::numeric_limits<double>::infinity();
  const lather::CoupledNewtonRootInverse newton{};
  CHECK(newton.supports_root(1));
  CHECK(newton.supports_root(8));
  for (const double bad : {0.0, -2.0, 2.5, nan, inf}) CHECK_FALSE(newton.supports_root(bad));
  const lather::EigenRootInverse eigen{};
  CHECK(eigen.supports_root(2.5));
  for (const double bad : {0.0, -1.0, nan, inf}) CHECK_FALSE(eigen.supports_root(bad));
  CHECK(ho.supports_root(4.0 / 3.0));
  for (const double bad : {0.0, 1e-6, nan, inf, 1e7}) CHECK_FALSE(ho.supports_root(bad));

  // Python's Fraction(x).limit_denominator(1000), computed by CPython.
  const auto frac = [](double x) {
    const auto r = lather::impl::limit_denominator(x, 1000);
    REQUIRE(r.has_value());
    return std::pair{r->p, r->q};
  };
  using P = std::pair<std::uint64_t, std::uint64_t>;
  CHECK(frac(2.0) == P{2, 1});
  CHECK(frac(1.5) == P{3, 2});
  CHECK(frac(1.0 / 3.0) == P{1, 3});
  CHECK(frac(3.141592653589793) == P{355, 113});
  CHECK(frac(0.7071067811865476) == P{408, 577});
  CHECK(frac(4.0 / 3.0) == P{4, 3});
  CHECK(frac(0.001) == P{1, 1000});
  CHECK(frac(1000.5) == P{2001, 2});
  CHECK(frac(2.0001) == P{2, 1});
  CHECK(frac(0.0015) == P{1, 667});

  // Shapes, unsupported roots and the pseudo-inverse epsilon rule throw before doing anything.
  using M = typename ExecSpace::memory_space;
  Kokkos::View<double**, Kokkos::LayoutRight, M> a("A", 3, 3), x("X", 3, 3), wrong("W", 3, 2);
  const Kokkos::View<const double**, Kokkos::LayoutRight, M> ca(a);
  CHECK_THROWS_WITH_AS(newton.compute(ExecSpace(), ca, 2.5, 0.0, x), Contains("root 2.5 is not supported"),
                       invalid_argument);
  CHECK_THROWS_WITH_AS(eigen.compute(ExecSpace(), ca, 2.0, 0.0, wrong), Contains("X must have A's shape"),
                       invalid_argument);
  CHECK_THROWS_WITH_AS(eigen.compute(ExecSpace(), ca, 2.0, -1.0, x), Contains("epsilon = -1"),
                       invalid_argument);
  CHECK_THROWS_WITH_AS((lather::EigenRootInverse{.pseudo_inverse = lather::PseudoInverse{}}.compute(
                           ExecSpace(), ca, 2.0, 1e-12, x)),
                       Contains("must be 0 with 'pseudo_inverse'"), invalid_argument);
  CHECK_THROWS_WITH_AS(lather::CoupledHigherOrderRootInverse{}.compute(ExecSpace(), ca, 2.0, 0.0, x),
                       Contains("'rel_epsilon' is required"), invalid_argument);

  // n = 0 and n = 1.
  Kokkos::View<double**, Kokkos::LayoutRight, M> empty("E", 0, 0);
  CHECK(eigen.compute(ExecSpace(), Kokkos::View<const double**, Kokkos::LayoutRight, M>(empty), 2.0, 0.0,
                      empty) == RootInverseStatus::success);
  Mat one(1);
  one(0, 0) = 16;
  for (const auto& r :
       {run<ExecSpace, double>(eigen, one, 4.0, 0.0), run<ExecSpace, double>(newton, one, 4.0, 0.0),
        run<ExecSpace, double>(higher_order(), one, 4.0, 0.0)}) {
    CHECK(r.status == RootInverseStatus::success);
    CHECK(static_cast<double>(std::fabs(r.x(0, 0) - 0.5L)) <= 1e-9);
  }
}

}  // namespace

TEST_CASE_TEMPLATE_DEFINE("root inverse: EigenRootInverse accuracy sweep (roots 2-8, n 1-256)", ExecSpace,
                          sweep_eigen) {
  impl_test_sweep_eigen<ExecSpace>();
}
TEST_CASE_TEMPLATE_APPLY(sweep_eigen, lather_test_exec_spaces);

TEST_CASE_TEMPLATE_DEFINE("root inverse: CoupledNewtonRootInverse accuracy sweep (roots 2-8, n 1-256)",
                          ExecSpace, sweep_newton) {
  impl_test_sweep_newton<ExecSpace>();
}
TEST_CASE_TEMPLATE_APPLY(sweep_newton, lather_test_exec_spaces);

TEST_CASE_TEMPLATE_DEFINE("root inverse: CoupledHigherOrderRootInverse accuracy sweep (roots 2-8, n 1-256)",
                          ExecSpace, sweep_higher_order) {
  impl_test_sweep_higher_order<ExecSpace>();
}
TEST_CASE_TEMPLATE_APPLY(sweep_higher_order, lather_test_exec_spaces);

TEST_CASE_TEMPLATE_DEFINE("root inverse: the reference's exact cases (diag(1,4), the 3x3 matrix)", ExecSpace,
                          exact) {
  impl_test_exact_cases<ExecSpace>();
}
TEST_CASE_TEMPLATE_APPLY(exact, lather_test_exec_spaces);

TEST_CASE_TEMPLATE_DEFINE("root inverse: repeated eigenvalues", ExecSpace, repeated_eigenvalues) {
  impl_test_repeated_eigenvalues<ExecSpace>();
}
TEST_CASE_TEMPLATE_APPLY(repeated_eigenvalues, lather_test_exec_spaces);

TEST_CASE_TEMPLATE_DEFINE("root inverse: rank-deficient inputs, epsilon > 0 and = 0, pseudo-inverse",
                          ExecSpace, rank_deficient) {
  impl_test_rank_deficient<ExecSpace>();
}
TEST_CASE_TEMPLATE_APPLY(rank_deficient, lather_test_exec_spaces);

TEST_CASE_TEMPLATE_DEFINE("root inverse: ill-conditioned inputs (cond 1e8, double)", ExecSpace, ill) {
  impl_test_ill_conditioned<ExecSpace>();
}
TEST_CASE_TEMPLATE_APPLY(ill, lather_test_exec_spaces);

TEST_CASE_TEMPLATE_DEFINE("root inverse: non-convergence is reported, X stays usable", ExecSpace,
                          non_convergence) {
  impl_test_non_convergence<ExecSpace>();
}
TEST_CASE_TEMPLATE_APPLY(non_convergence, lather_test_exec_spaces);

TEST_CASE_TEMPLATE_DEFINE("root inverse: NaN and Inf input give failed or non_finite, never a throw",
                          ExecSpace, nan_in) {
  impl_test_nan_input<ExecSpace>();
}
TEST_CASE_TEMPLATE_APPLY(nan_in, lather_test_exec_spaces);

TEST_CASE_TEMPLATE_DEFINE("root inverse: EigenRootInverse perturbation rules", ExecSpace, perturbation) {
  impl_test_perturbation_rules<ExecSpace>();
}
TEST_CASE_TEMPLATE_APPLY(perturbation, lather_test_exec_spaces);

TEST_CASE_TEMPLATE_DEFINE("root inverse: float data computed in double is more accurate", ExecSpace,
                          precision) {
  impl_test_precision<ExecSpace>();
}
TEST_CASE_TEMPLATE_APPLY(precision, lather_test_exec_spaces);

TEST_CASE_TEMPLATE_DEFINE("root inverse: higher-order orders 2-6 and fractional roots", ExecSpace,
                          higher_order_cases) {
  impl_test_higher_order<ExecSpace>();
}
TEST_CASE_TEMPLATE_APPLY(higher_order_cases, lather_test_exec_spaces);

// The higher-order iteration stops as soon as it diverges (divergence_bound), before anything
// overflows: status failed (what the true-error check gave before), X not written, and no
// FE_OVERFLOW or FE_INVALID in this thread (the products run here), so a trainer that traps
// FE_INVALID (as this harness does) is not killed by SIGFPE. Matrices of 13 with negative
// eigenvalues (as rounding leaves them in a rank-deficient float factor): six by 1e-5 up to 3x
// the largest (the Newton test's), six by 0.1 up to 0.6, one at -2; orders 2, 3, 5 and 8; roots
// 2 to 64 and the fraction 2.5; float and double. Shown to fail with the bound infinite (the
// former rule: early stop on 1.2x growth, then the true-error check, whose products of the grown
// X overflowed): FE_OVERFLOW or FE_INVALID raised, 33 failed checks per space.
TEST_CASE_TEMPLATE_DEFINE("root inverse: the higher-order iteration stops at divergence, before overflow", ExecSpace,
                          higher_order_divergence) {
  const Mat q = random_orthogonal(13, 3);
  std::vector<Mat> diverging;
  for (const ld below : {1e-5L, 1e-3L, 0.1L, 0.5L}) {
    std::vector<ld> d = log_spectrum(13, 1.0L, 1e3L);
    for (std::size_t i = 7; i < 13; ++i) d[i] = -below * static_cast<ld>(i - 6);
    diverging.push_back(from_spectrum(q, d));
  }
  std::vector<ld> one_below = log_spectrum(13, 1.0L, 1e3L);
  one_below.back() = -2.0L;
  diverging.push_back(from_spectrum(q, one_below));
  for (std::size_t k = 0; k < diverging.size(); ++k) {
    for (const int order : {2, 3, 5, 8}) {
      for (const double root : {2.0, 2.5, 4.0, 8.0, 16.0, 64.0}) {
        CAPTURE(k);
        CAPTURE(order);
        CAPTURE(root);
        const auto ho = higher_order(order);
        Result f, dbl;
        const int raised_f = lather::test::raised_fp_exceptions([&] { f = run<ExecSpace, float>(ho, diverging[k], root, 0.0); });
        const int raised_d =
            lather::test::raised_fp_exceptions([&] { dbl = run<ExecSpace, double>(ho, diverging[k], root, 0.0); });
        CHECK(f.status == RootInverseStatus::failed);
        CHECK(dbl.status == RootInverseStatus::failed);
        CHECK((raised_f & (FE_OVERFLOW | FE_INVALID)) == 0);
        CHECK((raised_d & (FE_OVERFLOW | FE_INVALID)) == 0);
        for (const Result* r : {&f, &dbl})  // X not written (run() passes a zero-filled X)
          for (std::size_t i = 0; i < 13; ++i)
            for (std::size_t j = 0; j < 13; ++j) CHECK(r->x(i, j) == 0.0L);
      }
    }
  }
  // Positive definite matrices as ill-conditioned as float allows (1e6), and repeated
  // eigenvalues, still converge: the bound does not cut a converging iteration short.
  const Mat hard = from_spectrum(q, log_spectrum(13, 1.0L, 1e6L));
  const Mat repeated = from_spectrum(q, std::vector<ld>(13, 3.0L));
  for (const int order : {2, 3, 5, 8}) {
    for (const double root : {2.0, 2.5, 4.0, 8.0}) {
      CAPTURE(order);
      CAPTURE(root);
      CHECK(run<ExecSpace, double>(higher_order(order), hard, root, 0.0).status == RootInverseStatus::success);
      CHECK(run<ExecSpace, double>(higher_order(order), repeated, root, 0.0).status == RootInverseStatus::success);
    }
  }
}
TEST_CASE_TEMPLATE_APPLY(higher_order_divergence, lather_test_exec_spaces);

TEST_CASE_TEMPLATE_DEFINE("root inverse: options, roots, shapes and statuses", ExecSpace, options) {
  impl_test_options<ExecSpace>();
}
TEST_CASE_TEMPLATE_APPLY(options, lather_test_exec_spaces);

// ---- AutoRootInverse ------------------------------------------------------------------------------

namespace {
bool same_bits(const Result& a, const Result& b) {
  if (a.status != b.status) return false;
  for (std::size_t k = 0; k < a.x.v.size(); ++k)
    if (a.x.v[k] != b.x.v[k]) return false;
  return true;
}

template <class ExecSpace>
void impl_test_auto() {
  const lather::EigenRootInverse eigen{};
  const lather::CoupledNewtonRootInverse newton{};
  // Defaults on the host: always the eigendecomposition (measured faster at every size here).
  constexpr bool host = Kokkos::SpaceAccessibility<ExecSpace, Kokkos::HostSpace>::accessible;
  const lather::AutoRootInverse by_default{};
  for (const std::size_t n : {1, 2, 3, 13, 64}) {
    const SweepCase& c = sweep_case(n, 1e2L);
    CAPTURE(n);
    CHECK(by_default.uses_newton<ExecSpace>(static_cast<std::int64_t>(n), 4.0) == !host);
    const auto& expected = host ? run<ExecSpace, double>(eigen, c.a, 4.0, 0.0) : run<ExecSpace, double>(newton, c.a, 4.0, 0.0);
    CHECK(same_bits(run<ExecSpace, double>(by_default, c.a, 4.0, 0.0), expected));
  }
  // A crossover at 8 on this space: Newton from n = 8 on, bit for bit; below it the eigendecomposition.
  lather::AutoRootInverse at8{};
  at8.newton_min_dim_host = at8.newton_min_dim_device = 8;
  for (const std::size_t n : {3, 7, 8, 13}) {
    const SweepCase& c = sweep_case(n, 1e2L);
    CAPTURE(n);
    for (const double root : {2.0, 4.0}) {
      const Result got = run<ExecSpace, float>(at8, c.a, root, 1e-6);
      const Result want =
          n >= 8 ? run<ExecSpace, float>(newton, c.a, root, 1e-6) : run<ExecSpace, float>(eigen, c.a, root, 1e-6);
      CHECK(same_bits(got, want));
    }
    // A non-integer root and the pseudo-inverse rule are the eigendecomposition's alone.
    CHECK(same_bits(run<ExecSpace, double>(at8, c.a, 2.5, 1e-6), run<ExecSpace, double>(eigen, c.a, 2.5, 1e-6)));
    lather::AutoRootInverse pseudo = at8;
    pseudo.eigen.pseudo_inverse = lather::PseudoInverse{};
    CHECK_FALSE(pseudo.uses_newton<ExecSpace>(static_cast<std::int64_t>(n), 2.0));
    CHECK(same_bits(run<ExecSpace, double>(pseudo, c.a, 2.0, 0.0),
                    run<ExecSpace, double>(pseudo.eigen, c.a, 2.0, 0.0)));
  }
  CHECK(at8.supports_root(2.5));
  CHECK_FALSE(at8.supports_root(-1.0));

  // fallback_to_eigen (the default): where Newton is chosen and does not succeed, the result and
  // status are the eigendecomposition's, bit for bit; without it, Newton's.
  lather::AutoRootInverse always{};
  always.newton_min_dim_host = always.newton_min_dim_device = 0;
  CHECK(always.fallback_to_eigen);
  const Mat q = random_orthogonal(13, 3);
  {
    // Out of iterations (max_iterations_reached): one iteration cannot converge on this matrix.
    const Mat a = from_spectrum(q, log_spectrum(13, 1.0L, 1e3L));
    lather::AutoRootInverse short_newton = always;
    short_newton.newton.max_iterations = 1;
    const Result newton_only = run<ExecSpace, double>(short_newton.newton, a, 4.0, 0.0);
    REQUIRE(newton_only.status == RootInverseStatus::max_iterations_reached);
    const Result by_eigen = run<ExecSpace, double>(eigen, a, 4.0, 0.0);
    REQUIRE(by_eigen.status == RootInverseStatus::success);
    CHECK(same_bits(run<ExecSpace, double>(short_newton, a, 4.0, 0.0), by_eigen));
    short_newton.fallback_to_eigen = false;
    CHECK(same_bits(run<ExecSpace, double>(short_newton, a, 4.0, 0.0), newton_only));
    // Converging Newton is kept (no second computation changes its bits).
    CHECK(same_bits(run<ExecSpace, double>(always, a, 4.0, 0.0), run<ExecSpace, double>(newton, a, 4.0, 0.0)));
  }
  {
    // Divergence (non_finite): an eigenvalue slightly below zero, what rounding leaves in a
    // rank-deficient float factor (the H200 run's mlp factor of rank 512 in 784). Newton grows it
    // until M overflows; the eigendecomposition shifts the spectrum and succeeds.
    std::vector<ld> d = log_spectrum(13, 1.0L, 1e3L);
    d.back() = -1e-3L;
    const Mat a = from_spectrum(q, d);
    const Result newton_only = run<ExecSpace, float>(newton, a, 4.0, 1e-6);
    REQUIRE(newton_only.status == RootInverseStatus::non_finite);
    const Result by_eigen = run<ExecSpace, float>(eigen, a, 4.0, 1e-6);
    REQUIRE(by_eigen.status == RootInverseStatus::success);
    CHECK(all_finite(by_eigen.x));
    CHECK(same_bits(run<ExecSpace, float>(always, a, 4.0, 1e-6), by_eigen));
    lather::AutoRootInverse no_fallback = always;
    no_fallback.fallback_to_eigen = false;
    CHECK(run<ExecSpace, float>(no_fallback, a, 4.0, 1e-6).status == RootInverseStatus::non_finite);
  }
  {
    // Newton stops as soon as it diverges (divergence_bound), before anything overflows: no
    // FE_OVERFLOW or FE_INVALID in this thread (the products run here), so a trainer that traps
    // FE_INVALID (as this harness does) gets the fallback instead of SIGFPE. Six eigenvalues
    // below zero (rank 7 of 13, as rounding leaves a rank-deficient float factor), by 1e-5 of the
    // largest (clear of float's rounding, which could lift them above zero) up to 3x the largest;
    // roots 2, 4 and 8; float and double. Shown to fail when the bound is infinite (the former
    // rule, stop on overflow): FE_OVERFLOW and FE_INVALID raised.
    for (const ld below : {1e-5L, 1e-3L, 0.5L}) {
      std::vector<ld> d = log_spectrum(13, 1.0L, 1e3L);
      for (std::size_t i = 7; i < 13; ++i) d[i] = -below * static_cast<ld>(i - 6);
      const Mat a = from_spectrum(q, d);
      for (const double root : {2.0, 4.0, 8.0}) {
        CAPTURE(static_cast<double>(below));
        CAPTURE(root);
        Result f, dbl;
        const int raised_f = lather::test::raised_fp_exceptions([&] { f = run<ExecSpace, float>(newton, a, root, 0.0); });
        const int raised_d = lather::test::raised_fp_exceptions([&] { dbl = run<ExecSpace, double>(newton, a, root, 0.0); });
        CHECK(f.status == RootInverseStatus::non_finite);
        CHECK(dbl.status == RootInverseStatus::non_finite);
        CHECK((raised_f & (FE_OVERFLOW | FE_INVALID)) == 0);
        CHECK((raised_d & (FE_OVERFLOW | FE_INVALID)) == 0);
        // The fallback's result is the eigendecomposition's, bit for bit.
        Result by_auto;
        const int raised_auto =
            lather::test::raised_fp_exceptions([&] { by_auto = run<ExecSpace, float>(always, a, root, 1e-6); });
        CHECK((raised_auto & FE_INVALID) == 0);
        CHECK(same_bits(by_auto, run<ExecSpace, float>(eigen, a, root, 1e-6)));
      }
    }
    // A positive definite matrix as ill-conditioned as float allows (1e6) still converges: the
    // bound does not cut a converging iteration short.
    const Mat hard = from_spectrum(q, log_spectrum(13, 1.0L, 1e6L));
    for (const double root : {2.0, 4.0, 8.0}) {
      CAPTURE(root);
      CHECK(run<ExecSpace, double>(newton, hard, root, 0.0).status == RootInverseStatus::success);
    }
  }
  CHECK_THROWS_WITH_AS((lather::AutoRootInverse{.newton_min_dim_host = -1}.validate()),
                       Contains("'newton_min_dim_host'"), lather::invalid_argument);
  CHECK_THROWS_WITH_AS((lather::AutoRootInverse{.newton = {.tolerance = -1.0}}.validate()),
                       Contains("'tolerance'"), lather::invalid_argument);
}

// The coupled strategies keep their work matrices between calls (impl/work_matrices.hpp): a
// reused object must give a fresh object's bits whatever it computed before (a larger matrix, a
// smaller one, the other precision, a failed call), its buffers must grow to the largest n and
// stay there, and a copy must start without them.
template <class ExecSpace, class Strategy>
void check_work_matrix_reuse(const char* name, const Strategy& kept, std::size_t matrices_per_call) {
  CAPTURE(name);
  const Mat q64 = random_orthogonal(64, 7), q13 = random_orthogonal(13, 8);
  const Mat a64 = from_spectrum(q64, log_spectrum(64, 2.0L, 1e2L)), a13 = from_spectrum(q13, log_spectrum(13, 2.0L, 1e2L));
  Mat bad = a13;
  bad(3, 4) = std::numeric_limits<ld>::quiet_NaN();
  REQUIRE(kept.work_matrices.elements() == 0);
  const Result first = run<ExecSpace, double>(kept, a64, 4.0, 1e-6);
  REQUIRE(lather::is_usable(first.status));
  const std::size_t grown = kept.work_matrices.elements();
  CHECK(grown == matrices_per_call * 64 * 64);
  // Smaller, the other precision, a NaN input, then the first matrix again: each as a fresh object.
  const Strategy& s = kept;
  CHECK(same_bits(run<ExecSpace, double>(s, a13, 4.0, 1e-6), run<ExecSpace, double>(Strategy(s), a13, 4.0, 1e-6)));
  CHECK(same_bits(run<ExecSpace, float>(s, a13, 4.0, 1e-6), run<ExecSpace, float>(Strategy(s), a13, 4.0, 1e-6)));
  CHECK(run<ExecSpace, double>(s, bad, 4.0, 1e-6).status != RootInverseStatus::success);
  CHECK(same_bits(run<ExecSpace, double>(s, a64, 4.0, 1e-6), first));
  // The double buffers stay at 64 x 64; float ones of 13 x 13 were added.
  CHECK(kept.work_matrices.elements() == grown + matrices_per_call * 13 * 13);
  const Strategy copy = kept;
  CHECK(copy.work_matrices.elements() == 0);
}

template <class ExecSpace>
void impl_test_work_matrix_reuse() {
  check_work_matrix_reuse<ExecSpace>("newton", lather::CoupledNewtonRootInverse{}, 6);
  check_work_matrix_reuse<ExecSpace>("higher-order", higher_order(), 8);
}
}  // namespace

TEST_CASE_TEMPLATE_DEFINE("root inverse: coupled iterations reuse their work matrices and give a fresh object's bits",
                          ExecSpace, work_matrices) {
  impl_test_work_matrix_reuse<ExecSpace>();
}
TEST_CASE_TEMPLATE_APPLY(work_matrices, lather_test_exec_spaces);

TEST_CASE_TEMPLATE_DEFINE("root inverse: AutoRootInverse picks by size and space, and equals the strategy it picks",
                          ExecSpace, auto_strategy) {
  impl_test_auto<ExecSpace>();
}
TEST_CASE_TEMPLATE_APPLY(auto_strategy, lather_test_exec_spaces);
