// SPDX-License-Identifier: Apache-2.0
/// \file
/// \brief `CoupledHigherOrderRootInverse`: the coupled higher-order iteration for rational roots
/// (the reference's `CoupledHigherOrderConfig`), on the execution space through Kokkos Kernels gemm.
#ifndef LATHER_ROOT_INVERSE_COUPLED_HIGHER_ORDER_HPP
#define LATHER_ROOT_INVERSE_COUPLED_HIGHER_ORDER_HPP

#include <lather/concepts/root_inverse.hpp>
#include <lather/impl/kernels/matrix_functions.hpp>
#include <lather/impl/option_check.hpp>
#include <lather/impl/work_matrices.hpp>

#include <Kokkos_Core.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <optional>
#include <type_traits>
#include <utility>

namespace lather {

namespace impl {

/// A positive fraction p/q.
struct Rational {
  std::uint64_t p = 0, q = 1;
};

/// \brief The closest fraction to `x` with denominator <= `max_denominator` (Python's
/// `Fraction(x).limit_denominator(max_denominator)`, exactly: the continued fraction of the double
/// `x` and the final semiconvergent test). Exact integer arithmetic on x = num / 2^k; nullopt when
/// x is not finite, not > 0, below 2^-10 or at least 2^63 (then num / 2^k does not fit).
[[nodiscard]] inline std::optional<Rational> limit_denominator(double x, std::uint64_t max_denominator) {
  if (!(std::isfinite(x) && x > 0.0) || max_denominator == 0) return std::nullopt;
  int e = 0;
  const double f = std::frexp(x, &e);  // x = f * 2^e, f in [0.5, 1)
  std::uint64_t num = static_cast<std::uint64_t>(std::ldexp(f, 53));
  int k = 53 - e;  // x = num / 2^k
  if (k <= 0) {
    if (-k > 10) return std::nullopt;
    return Rational{num << -k, 1};
  }
  while (k > 0 && (num & 1U) == 0) {
    num >>= 1U;
    --k;
  }
  if (k > 62) return std::nullopt;
  const std::uint64_t den = std::uint64_t{1} << k;
  if (den <= max_denominator) return Rational{num, den};
  std::uint64_t p0 = 0, q0 = 1, p1 = 1, q1 = 0, n = num, d = den;
  while (d != 0) {
    const std::uint64_t a = n / d;
    if (q1 != 0 && a > (max_denominator - q0) / q1) break;  // q0 + a*q1 > max_denominator
    const std::uint64_t q2 = q0 + a * q1;
    if (q2 > max_denominator) break;
    const std::uint64_t p2 = p0 + a * p1;
    p0 = p1;
    q0 = q1;
    p1 = p2;
    q1 = q2;
    const std::uint64_t r = n - a * d;
    n = d;
    d = r;
  }
  if (d == 0) return Rational{p1, q1};
  const std::uint64_t step = (max_denominator - q0) / q1;
  // p1/q1 is at least as close as the semiconvergent iff 2*d*(q0 + step*q1) <= den.
  const std::uint64_t m = 2 * (q0 + step * q1);
  if (d <= den / m) return Rational{p1, q1};
  return Rational{p0 + step * p1, q0 + step * q1};
}

}  // namespace impl

/// \brief Coupled higher-order iteration (Lakic; Shampoo's `CoupledHigherOrderConfig`) for
/// X ~ (A + eps' I)^(-1/r), r = p/q rational.
///
/// ```
/// p/q = r limited to denominators <= 1000;  b_0 = 1,  b_i = prod_{j=1..i} (1 + (j-1)p) / (j p)
/// lambda_max = max_i sum_j |A_ij|                 (not finite: failed)
/// eps' = max(rel_epsilon * lambda_max, abs_epsilon);  A_r = A + eps' I   (the optimizer's eps is NOT used)
/// z = 1 / trace(A_r)  (trace <= 0: failed);  X = z^(1/p) I;  M = z A_r
/// one Newton step: Mp = (1 + 1/p) I - M/p;  X = X Mp;  M = Mp^p M;  err = max_ij |M - I|;  it = 1
/// (lather: err > divergence_bound: failed)
/// while err > tolerance and it < max_iterations:
///     B = I - M;  Mp = sum_{i<order} b_i B^i (Horner);  X = X Mp;  M = Mp^p M;  ++it
///     new = max_ij |M - I|;  (lather: new > divergence_bound: failed)
///     if new > 1.2 err or (new == err and err < 1e-3): early stop
///     err = new
/// true_err = max_ij |A_r X^p - I|;  true_err > 0.1: failed
/// if q > 1: X = X^q;   X not finite: non_finite
/// ```
/// Status: `success` (converged or stopped early, which the reference does not warn about),
/// `max_iterations_reached`, `failed` (the reference's ArithmeticError/ZeroDivisionError cases),
/// `non_finite` (X has NaN/Inf after powering to q; the reference raises ArithmeticError).
/// Divergence (err above divergence_bound, NaN included) is `failed` at once, the status the
/// true-error check gives it, before the products overflow.
///
/// Runs on `space` like CoupledNewtonRootInverse (gemm through Kokkos Kernels, one reduction per
/// iteration, `space` fenced before returning). Its eight n x n work matrices are kept in the
/// object as CoupledNewtonRootInverse's (`work_matrices`), and the series' coefficients are
/// recomputed where used: repeated calls allocate nothing.
struct CoupledHigherOrderRootInverse {
  /// Relative perturbation: adds rel_epsilon * lambda_max. Required (no default, as in the
  /// reference): NaN means "not set" and fails validation. Finite, >= 0.
  double rel_epsilon = std::numeric_limits<double>::quiet_NaN();
  /// Absolute perturbation; the larger of the two is added. Required, finite, >= 0.
  double abs_epsilon = std::numeric_limits<double>::quiet_NaN();
  /// Iteration limit (the first Newton step counts as one), >= 1.
  int max_iterations = 100;
  /// Stop when max_ij |M - I| <= tolerance; finite, >= 0.
  double tolerance = 1e-8;
  /// Order of the method, >= 2 (2 is Newton's method).
  int order = 3;
  /// Iterate in double even for float data.
  bool compute_in_double = false;
  /// Not an option: the work matrices kept between calls (see CoupledNewtonRootInverse).
  mutable impl::WorkMatrixCache work_matrices{};

  /// Roots are approximated by fractions with denominators up to this.
  static constexpr std::uint64_t max_denominator = 1000;
  /// Smallest and largest root accepted.
  static constexpr double min_root = 1.0 / 1024.0, max_root = 1048576.0;
  /// \brief After an iteration, max_ij |M - I| above this (or NaN) means divergence: status
  /// `failed`, X not written.
  ///
  /// Why 2 (as CoupledNewtonRootInverse::divergence_bound): z = 1 / trace puts M's eigenvalues in
  /// (0, 1] for a positive definite A_r; the Newton step keeps them there, and so does each
  /// higher-order step m -> m f(m)^p, since the truncated series f(m) = sum_{i<order} b_i (1 - m)^i
  /// has positive terms and stays below m^(-1/p). So a converging M - I has spectral norm (which
  /// bounds every entry) at most 1. An entry above 2 needs an eigenvalue below -1, which f
  /// multiplies by more than (1 + 2/p)^p > 2 per step: an iteration that can only end in
  /// overflow. The reference stops there on its error growth rule (1.2x) and then fails the
  /// true-error check, whose products of the grown X overflow first (inf - inf raises
  /// FE_INVALID, a SIGFPE in a trainer that traps it); lather returns `failed` before them.
  static constexpr double divergence_bound = 2.0;

  /// Throws lather::invalid_argument naming the first invalid option.
  void validate() const {
    // compute() validates on every call: the valid case builds no message (allocates nothing).
    const auto finite_at_least_zero = [](double v) { return std::isfinite(v) && v >= 0.0; };
    if (finite_at_least_zero(rel_epsilon) && finite_at_least_zero(abs_epsilon) && max_iterations >= 1 &&
        finite_at_least_zero(tolerance) && order >= 2)
      return;
    const impl::OptionCheck check("CoupledHigherOrderRootInverse", "");
    check.require(!std::isnan(rel_epsilon),
                  "option 'rel_epsilon' is required (it has no default, as in the reference)");
    check.require(!std::isnan(abs_epsilon),
                  "option 'abs_epsilon' is required (it has no default, as in the reference)");
    check.at_least("rel_epsilon", rel_epsilon, 0.0);
    check.require(std::isfinite(rel_epsilon),
                  impl::concat("invalid option 'rel_epsilon' = ", rel_epsilon, " (must be finite)"));
    check.at_least("abs_epsilon", abs_epsilon, 0.0);
    check.require(std::isfinite(abs_epsilon),
                  impl::concat("invalid option 'abs_epsilon' = ", abs_epsilon, " (must be finite)"));
    check.at_least("max_iterations", max_iterations, 1);
    check.at_least("tolerance", tolerance, 0.0);
    check.require(std::isfinite(tolerance),
                  impl::concat("invalid option 'tolerance' = ", tolerance, " (must be finite)"));
    check.at_least("order", order, 2);
  }

  /// Finite roots in [2^-10, 2^20] (used as the fraction p/q of rational_root).
  [[nodiscard]] bool supports_root(double root) const noexcept {
    return std::isfinite(root) && root >= min_root && root <= max_root && rational_root(root).has_value();
  }

  /// The fraction p/q the iteration uses for `root`: the closest with q <= 1000.
  [[nodiscard]] static std::optional<impl::Rational> rational_root(double root) noexcept {
    const auto r = impl::limit_denominator(root, max_denominator);
    if (!r || r->p == 0) return std::nullopt;
    return r;
  }

  /// \brief X ~ (A + eps' I)^(-q/p) by the iteration above; see RootInverseStatus.
  /// \param space execution space instance the work is queued on (fenced before returning)
  /// \param a symmetric n x n matrix
  /// \param root r > 0, used as the fraction p/q (rational_root)
  /// \param epsilon the optimizer's epsilon: checked (finite, >= 0) but NOT used, as in the
  ///        reference; the perturbation comes from rel_epsilon and abs_epsilon
  /// \param x n x n output (written when the status is success, max_iterations_reached or
  ///        non_finite)
  template <class ExecSpace, class T, class MemorySpace>
  RootInverseStatus compute(const ExecSpace& space,
                            const Kokkos::View<const T**, Kokkos::LayoutRight, MemorySpace>& a, double root,
                            double epsilon,
                            const Kokkos::View<T**, Kokkos::LayoutRight, MemorySpace>& x) const {
    static_assert(std::is_same_v<T, float> || std::is_same_v<T, double>,
                  "lather::CoupledHigherOrderRootInverse: the matrix scalar must be float or double");
    static_assert(
        Kokkos::SpaceAccessibility<ExecSpace, MemorySpace>::accessible,
        "lather::CoupledHigherOrderRootInverse: the execution space cannot access the matrices' memory");
    validate();
    impl::check_root_inverse_arguments("CoupledHigherOrderRootInverse", a, x, root, supports_root(root),
                                       "a finite root in [2^-10, 2^20]", epsilon);
    if (a.extent(0) == 0) return RootInverseStatus::success;
    const impl::Rational r = *rational_root(root);
    const RootInverseStatus status = std::is_same_v<T, double> || compute_in_double
                                         ? run<double>(space, a, r, x)
                                         : run<float>(space, a, r, x);
    space.fence();  // the work matrices are free for the next call
    return status;
  }

 private:
  template <class C, class ExecSpace, class T, class MemorySpace>
  RootInverseStatus run(const ExecSpace& space,
                        const Kokkos::View<const T**, Kokkos::LayoutRight, MemorySpace>& a, impl::Rational r,
                        const Kokkos::View<T**, Kokkos::LayoutRight, MemorySpace>& x) const {
    using ops_type = impl::kernels::MatrixOps<ExecSpace, C, MemorySpace>;
    const auto n = static_cast<impl::kernels::index_type>(a.extent(0));
    typename ops_type::lease_type lease(&work_matrices, n);  // held until this call returns
    const ops_type ops(space, n, &lease);
    const auto p = static_cast<long long>(r.p), q = static_cast<long long>(r.q);
    const double pd = static_cast<double>(p);

    // Coefficient b_i of the series of (1 - x)^(-1/p), rounded to C like the reference's b tensor.
    // Recomputed where needed (order^2 / 2 scalar steps, the same double operations in the same
    // order, so the same bits as a table) instead of a heap-allocated table per call: a root step
    // allocates nothing after the first (the work matrices are kept as well).
    const auto b = [pd](int i) {
      double numerator = 1, denominator = 1;
      for (int j = 1; j <= i; ++j) {
        numerator *= 1.0 + (j - 1) * pd;
        denominator *= j * pd;
      }
      return i == 0 ? C(1) : static_cast<C>(numerator / denominator);
    };

    // The only largest-eigenvalue estimate is the infinity norm (no power iteration).
    const double lambda_max = ops.max_abs_row_sum(a);
    if (!std::isfinite(lambda_max)) return RootInverseStatus::failed;  // NaN/Inf in A included
    const double epsilon = std::max(rel_epsilon * lambda_max, abs_epsilon);
    auto a_r = ops.allocate("lather::CoupledHigherOrderRootInverse::A_r");
    ops.scale_shift(a_r, a, 1.0, epsilon);
    const double trace = ops.trace(a_r);
    // The reference computes 1/trace as a Python float (ZeroDivisionError at 0) and z^(1/p) of a
    // negative z is complex there: both raise.
    if (!(std::isfinite(trace) && trace > 0.0)) return RootInverseStatus::failed;
    const double z = 1.0 / trace;
    const double s = -1.0 / pd;

    auto m = ops.allocate("lather::CoupledHigherOrderRootInverse::M");
    auto xw = ops.allocate("lather::CoupledHigherOrderRootInverse::X");
    auto mp = ops.allocate("lather::CoupledHigherOrderRootInverse::Mp");
    auto base = ops.allocate("lather::CoupledHigherOrderRootInverse::B");
    auto scratch1 = ops.allocate("lather::CoupledHigherOrderRootInverse::scratch1");
    auto scratch2 = ops.allocate("lather::CoupledHigherOrderRootInverse::scratch2");
    auto product = ops.allocate("lather::CoupledHigherOrderRootInverse::product");
    ops.scaled_identity(xw, std::pow(z, -s));
    ops.scale_shift(m, a_r, z, 0.0);

    // One plain Newton step (guarantees convergence of the higher-order steps).
    ops.scale_shift(mp, m, s, 1.0 - s);
    ops.multiply(xw, mp, product);
    std::swap(xw, product);
    ops.multiply(ops.power(mp, p, scratch1, scratch2), m, product);
    std::swap(m, product);
    double error = ops.max_abs_minus_identity(m);
    if (!(error <= divergence_bound)) return RootInverseStatus::failed;
    int iteration = 1;

    bool early_stop = false;
    while (std::isfinite(error) && error > tolerance && iteration < max_iterations) {
      ++iteration;
      ops.horner_start(base, mp, m, b(order - 1), b(order - 2));
      for (int i = order - 3; i >= 0; --i) {  // Mp = b_i I + Mp B
        ops.scaled_identity(product, static_cast<double>(b(i)));
        ops.multiply(mp, base, product, C(1), C(1));
        std::swap(mp, product);
      }
      ops.multiply(xw, mp, product);
      std::swap(xw, product);
      ops.multiply(ops.power(mp, p, scratch1, scratch2), m, product);
      std::swap(m, product);
      const double new_error = ops.max_abs_minus_identity(m);  // NaN/Inf -> +infinity
      if (!(new_error <= divergence_bound)) return RootInverseStatus::failed;
      if (new_error > error * 1.2 || (new_error == error && error < 1e-3)) {
        early_stop = true;
        break;
      }
      error = new_error;
    }
    const RootInverseStatus status = early_stop || !(error > tolerance)
                                         ? RootInverseStatus::success
                                         : RootInverseStatus::max_iterations_reached;

    // True error before powering for fractions; +infinity when anything is not finite.
    ops.multiply(a_r, ops.power(xw, p, scratch1, scratch2), product);
    const double true_error = ops.max_abs_minus_identity(product);
    if (!(true_error <= 0.1)) return RootInverseStatus::failed;

    const auto result = q > 1 ? ops.power(xw, q, scratch1, scratch2) : xw;
    ops.cast_copy(x, result);
    if (ops.count_non_finite(x) > 0) return RootInverseStatus::non_finite;
    return status;
  }
};

}  // namespace lather

#endif
