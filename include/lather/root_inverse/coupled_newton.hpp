// SPDX-License-Identifier: Apache-2.0
/// \file
/// \brief `CoupledNewtonRootInverse`: the coupled inverse Newton iteration for integer roots (the
/// reference's `CoupledNewtonConfig`), on the execution space through Kokkos Kernels gemm.
#ifndef LATHER_ROOT_INVERSE_COUPLED_NEWTON_HPP
#define LATHER_ROOT_INVERSE_COUPLED_NEWTON_HPP

#include <lather/concepts/root_inverse.hpp>
#include <lather/impl/kernels/matrix_functions.hpp>
#include <lather/impl/option_check.hpp>
#include <lather/impl/work_matrices.hpp>

#include <Kokkos_Core.hpp>

#include <cmath>
#include <limits>
#include <type_traits>
#include <utility>

namespace lather {

/// \brief Coupled inverse Newton iteration for X ~ (A + eps I)^(-1/p), p a positive integer.
///
/// ```
/// A_r = A + eps I;  alpha = -1/p;  z = (p + 1) / (2 ||A_r||_F)
/// X = z^(1/p) I;  M = z A_r;  err = max_ij |M - I|
/// while err > tolerance and it < max_iterations:
///     Mp = (1 - alpha) I + alpha M;  X = X Mp;  M = Mp^p M;  err = max_ij |M - I|;  ++it
/// ```
/// `Mp^p` by binary powering. Status: `success` when err <= tolerance, `max_iterations_reached`
/// when the loop ends by its count (X is still returned, as the reference only warns), `non_finite`
/// when A has NaN/Inf (the reference iterates on NaN and returns NaN; X is filled with NaN), when
/// A_r = 0 (z is infinite; X filled with +infinity), when the iteration diverges (err above
/// `divergence_bound` after an iteration: A_r not positive definite; X filled with NaN, before
/// anything overflows) or X overflows, and `failed` when ||A_r||_F overflows double.
///
/// Runs on `space`: element-wise kernels and reductions are queued there, the products go through
/// `KokkosBlas::gemm` on `ExecSpace`. Every iteration waits for one reduction (the error), and
/// `compute` fences `space` before it returns. Its six n x n work matrices are kept in the object
/// (`work_matrices`, grown to the largest n seen), so repeated calls allocate nothing; a copy of
/// the object starts without them.
struct CoupledNewtonRootInverse {
  /// Iteration limit, >= 1.
  int max_iterations = 100;
  /// Stop when max_ij |M - I| <= tolerance; finite, >= 0.
  double tolerance = 1e-6;
  /// Iterate in double even for float data.
  bool compute_in_double = false;
  /// Not an option: the work matrices kept between calls (impl/work_matrices.hpp; copies start
  /// empty, a call that finds them in use on another thread allocates its own).
  mutable impl::WorkMatrixCache work_matrices{};

  /// The largest root accepted.
  static constexpr double max_root = 2147483647.0;
  /// \brief After an iteration, max_ij |M - I| above this means divergence (status `non_finite`).
  ///
  /// Why 2: z puts M's first eigenvalues in (0, (p + 1) / 2] for a positive definite A_r, and one
  /// iteration m -> m (1 + (1 - m) / p)^p maps (0, p + 1) into (0, 1], so a converging M - I has
  /// spectral norm (which bounds every entry) at most 1 from the first iteration on. An entry
  /// above 2 needs an eigenvalue below -1 (or above 3), which grows by at least (1 + 2/p)^p > 2
  /// per iteration and never comes back: such an iteration can only end in overflow or NaN.
  static constexpr double divergence_bound = 2.0;

  /// Throws lather::invalid_argument naming the first invalid option.
  void validate() const {
    // compute() validates on every call: the valid case builds no message (allocates nothing).
    if (max_iterations >= 1 && tolerance >= 0.0 && std::isfinite(tolerance)) return;
    const impl::OptionCheck check("CoupledNewtonRootInverse", "");
    check.at_least("max_iterations", max_iterations, 1);
    check.at_least("tolerance", tolerance, 0.0);
    check.require(std::isfinite(tolerance),
                  impl::concat("invalid option 'tolerance' = ", tolerance, " (must be finite)"));
  }

  /// Positive integers up to 2^31 - 1 only (the iteration raises matrices to the power p).
  [[nodiscard]] bool supports_root(double root) const noexcept {
    return std::isfinite(root) && root >= 1.0 && root <= max_root && std::floor(root) == root;
  }

  /// \brief X ~ (A + eps I)^(-1/root) by the iteration above; see RootInverseStatus.
  /// \param space execution space instance the work is queued on (fenced before returning)
  /// \param a symmetric n x n matrix
  /// \param root a positive integer p
  /// \param epsilon the optimizer's epsilon, >= 0
  /// \param x n x n output (written for every status except `failed`)
  template <class ExecSpace, class T, class MemorySpace>
  RootInverseStatus compute(const ExecSpace& space,
                            const Kokkos::View<const T**, Kokkos::LayoutRight, MemorySpace>& a, double root,
                            double epsilon,
                            const Kokkos::View<T**, Kokkos::LayoutRight, MemorySpace>& x) const {
    static_assert(std::is_same_v<T, float> || std::is_same_v<T, double>,
                  "lather::CoupledNewtonRootInverse: the matrix scalar must be float or double");
    static_assert(Kokkos::SpaceAccessibility<ExecSpace, MemorySpace>::accessible,
                  "lather::CoupledNewtonRootInverse: the execution space cannot access the matrices' memory");
    validate();
    impl::check_root_inverse_arguments("CoupledNewtonRootInverse", a, x, root, supports_root(root),
                                       "a positive integer up to 2^31 - 1", epsilon);
    if (a.extent(0) == 0) return RootInverseStatus::success;
    const RootInverseStatus status = std::is_same_v<T, double> || compute_in_double
                                         ? run<double>(space, a, static_cast<long long>(root), epsilon, x)
                                         : run<float>(space, a, static_cast<long long>(root), epsilon, x);
    space.fence();  // the work matrices are free for the next call
    return status;
  }

 private:
  template <class C, class ExecSpace, class T, class MemorySpace>
  RootInverseStatus run(const ExecSpace& space,
                        const Kokkos::View<const T**, Kokkos::LayoutRight, MemorySpace>& a, long long p,
                        double epsilon, const Kokkos::View<T**, Kokkos::LayoutRight, MemorySpace>& x) const {
    using ops_type = impl::kernels::MatrixOps<ExecSpace, C, MemorySpace>;
    const auto n = static_cast<impl::kernels::index_type>(a.extent(0));
    typename ops_type::lease_type lease(&work_matrices, n);  // held until this call returns
    const ops_type ops(space, n, &lease);
    if (ops.count_non_finite(a) > 0) {
      ops.fill(x, std::numeric_limits<T>::quiet_NaN());
      return RootInverseStatus::non_finite;
    }
    auto m = ops.allocate("lather::CoupledNewtonRootInverse::M");
    ops.scale_shift(m, a, 1.0, epsilon);  // A_r
    const double norm = ops.frobenius_norm(m);
    if (!std::isfinite(norm)) return RootInverseStatus::failed;
    if (norm == 0.0) {
      ops.fill(x, std::numeric_limits<T>::infinity());
      return RootInverseStatus::non_finite;
    }
    const double z = static_cast<double>(p + 1) / (2.0 * norm);
    const double alpha = -1.0 / static_cast<double>(p);
    auto xw = ops.allocate("lather::CoupledNewtonRootInverse::X");
    auto mp = ops.allocate("lather::CoupledNewtonRootInverse::Mp");
    auto scratch1 = ops.allocate("lather::CoupledNewtonRootInverse::scratch1");
    auto scratch2 = ops.allocate("lather::CoupledNewtonRootInverse::scratch2");
    auto product = ops.allocate("lather::CoupledNewtonRootInverse::product");
    ops.scaled_identity(xw, std::pow(z, -alpha));
    ops.scale_shift(m, m, z, 0.0);
    double error = ops.max_abs_minus_identity(m);
    int iteration = 0;
    while (error > tolerance && iteration < max_iterations) {
      ++iteration;
      ops.scale_shift(mp, m, alpha, 1.0 - alpha);
      ops.multiply(xw, mp, product);
      std::swap(xw, product);
      const auto mp_power = ops.power(mp, p, scratch1, scratch2);
      ops.multiply(mp_power, m, product);
      std::swap(m, product);
      error = ops.max_abs_minus_identity(m);
      // Diverging (an eigenvalue of A_r at or below zero: rounding leaves them in rank-deficient
      // float factors) or overflowed (the error maps NaN/Inf to +infinity). The reference goes on
      // until M holds NaN and returns a NaN X; lather stops at once, before the products overflow
      // (their inf - inf would raise FE_INVALID and trap under feenableexcept, and wastes the
      // iterations AutoRootInverse's fallback needs). See divergence_bound.
      if (!(error <= divergence_bound)) {
        ops.fill(x, std::numeric_limits<T>::quiet_NaN());
        return RootInverseStatus::non_finite;
      }
    }
    ops.cast_copy(x, xw);
    if (ops.count_non_finite(x) > 0) return RootInverseStatus::non_finite;
    return error <= tolerance ? RootInverseStatus::success : RootInverseStatus::max_iterations_reached;
  }
};

}  // namespace lather

#endif
