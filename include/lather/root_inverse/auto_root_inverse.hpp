// SPDX-License-Identifier: Apache-2.0
/// \file
/// \brief `AutoRootInverse`: the faster of the eigendecomposition and coupled Newton for each
/// matrix size and execution space, with measured crossovers (docs/performance.md).
#ifndef LATHER_ROOT_INVERSE_AUTO_ROOT_INVERSE_HPP
#define LATHER_ROOT_INVERSE_AUTO_ROOT_INVERSE_HPP

#include <lather/concepts/root_inverse.hpp>
#include <lather/error.hpp>
#include <lather/root_inverse/coupled_newton.hpp>
#include <lather/root_inverse/eigen_root_inverse.hpp>

#include <Kokkos_Core.hpp>

#include <cstdint>
#include <limits>

namespace lather {

/// \brief Root inverse by whichever strategy is faster for the matrix at hand: `EigenRootInverse`
/// (host LAPACK) or `CoupledNewtonRootInverse` (matrix products on the execution space).
///
/// The choice depends on where the computation runs and on n:
/// - on a host execution space, coupled Newton is used for n >= `newton_min_dim_host`. On this
///   project's CPU the eigendecomposition is faster at every size measured (n = 128 to 1024, float
///   and double, 1 and 2 threads, docs/performance.md "Root inverses"), so the default never picks
///   Newton there;
/// - on a device execution space (CUDA, HIP), for n >= `newton_min_dim_device` (default 0, i.e.
///   always): Newton's products stay on the device, while the eigendecomposition copies each
///   factor to the host and back and runs LAPACK on the CPU. On an H200 with a 16-core host
///   (docs/performance-history.md, "Per-parameter kernels on an H200") Newton took 0.92x
///   (float) and 0.69x (double) the eigendecomposition's time at n = 128 and 0.04-0.13x from
///   n = 512 to 4096, so there is no crossover to set there; measure your own with `lather_bench_suite` (HIP is not measured).
/// Whatever the thresholds say, the eigendecomposition is used when Newton cannot honour the
/// request: a non-integer root, or `eigen.pseudo_inverse` (Newton has no pseudo-inverse rule).
/// With `fallback_to_eigen` (the default) it is also used when Newton was tried and did not
/// succeed: it ran out of iterations, or diverged to non-finite entries. On an H200 the first
/// root step of "mlp" at block size 1024 in float did: its (784, 784) factor has rank 512, rounding
/// leaves eigenvalues slightly below zero, and the iteration grows them until M overflows, where
/// the eigendecomposition (which shifts its eigenvalues, see EigenRootInverse) succeeds.
///
/// The two strategies agree to their tolerances (Newton stops at `newton.tolerance`; the
/// eigendecomposition is exact to rounding), not bit for bit: a run that changes the thresholds
/// changes its numbers slightly. Off by default in every Shampoo (EigenRootInverse is the default).
struct AutoRootInverse {
  /// Strategy options used when the eigendecomposition is chosen.
  EigenRootInverse eigen{};
  /// Strategy options used when coupled Newton is chosen.
  CoupledNewtonRootInverse newton{};
  /// Smallest n for coupled Newton on a host execution space (max: never).
  std::int64_t newton_min_dim_host = std::numeric_limits<std::int64_t>::max();
  /// Smallest n for coupled Newton on a device execution space (0: always).
  std::int64_t newton_min_dim_device = 0;
  /// When Newton was chosen and returns anything but `success`, compute the root again by the
  /// eigendecomposition and return its result and status (false: Newton's, as
  /// CoupledNewtonRootInverse would).
  bool fallback_to_eigen = true;

  /// Throws lather::invalid_argument naming the first invalid option.
  void validate() const {
    eigen.validate();
    newton.validate();
    LATHER_THROW_IF(newton_min_dim_host < 0, "lather::AutoRootInverse: invalid option 'newton_min_dim_host' = ",
                    newton_min_dim_host, " (must be >= 0)");
    LATHER_THROW_IF(newton_min_dim_device < 0, "lather::AutoRootInverse: invalid option 'newton_min_dim_device' = ",
                    newton_min_dim_device, " (must be >= 0)");
  }

  /// As the eigendecomposition: the optimizer's epsilon must be 0 with `eigen.pseudo_inverse`.
  [[nodiscard]] bool requires_zero_epsilon() const noexcept { return eigen.requires_zero_epsilon(); }

  /// Any finite root > 0 (non-integer roots always go to the eigendecomposition).
  [[nodiscard]] bool supports_root(double root) const noexcept { return eigen.supports_root(root); }

  /// True when compute() on ExecSpace uses coupled Newton for an n x n matrix and this root.
  template <class ExecSpace>
  [[nodiscard]] bool uses_newton(std::int64_t n, double root) const noexcept {
    if (eigen.pseudo_inverse || !newton.supports_root(root)) return false;
    constexpr bool host = Kokkos::SpaceAccessibility<ExecSpace, Kokkos::HostSpace>::accessible;
    return n >= (host ? newton_min_dim_host : newton_min_dim_device);
  }

  /// \brief X ~ (A [+ eps I])^(-1/root) by the chosen strategy (see uses_newton); the status,
  /// the synchronization and what is written are that strategy's (the eigendecomposition's after
  /// a fallback).
  template <class ExecSpace, class T, class MemorySpace>
  RootInverseStatus compute(const ExecSpace& space, const Kokkos::View<const T**, Kokkos::LayoutRight, MemorySpace>& a,
                            double root, double epsilon,
                            const Kokkos::View<T**, Kokkos::LayoutRight, MemorySpace>& x) const {
    validate();
    if (uses_newton<ExecSpace>(static_cast<std::int64_t>(a.extent(0)), root)) {
      const RootInverseStatus status = newton.compute(space, a, root, epsilon, x);
      if (status == RootInverseStatus::success || !fallback_to_eigen) return status;
    }
    return eigen.compute(space, a, root, epsilon, x);
  }
};

}  // namespace lather

#endif
