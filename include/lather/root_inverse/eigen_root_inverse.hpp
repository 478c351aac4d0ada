// SPDX-License-Identifier: Apache-2.0
/// \file
/// \brief `EigenRootInverse`: X = Q diag(lambda^(-1/r)) Q^T from a symmetric eigendecomposition
/// (the reference's default `EigenConfig` with `PerturbationConfig` or `PseudoInverseConfig`).
///
/// The eigendecomposition runs on the host with LAPACK (`dsyevd`/`ssyevd`), whatever the
/// execution space: device data is copied to the host and the result back (docs/root-inverse.md).
#ifndef LATHER_ROOT_INVERSE_EIGEN_ROOT_INVERSE_HPP
#define LATHER_ROOT_INVERSE_EIGEN_ROOT_INVERSE_HPP

#include <lather/concepts/root_inverse.hpp>
#include <lather/impl/backends/lapack.hpp>
#include <lather/impl/kernels/matrix_functions.hpp>
#include <lather/impl/option_check.hpp>

#include <Kokkos_Core.hpp>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <limits>
#include <optional>
#include <type_traits>
#include <vector>

namespace lather {

/// \brief Pseudo-inverse treatment of small eigenvalues (the reference's `PseudoInverseConfig`):
/// eigenvalues at or below `cut = max(rank_rtol * max(lambda_max, 0), rank_atol)` map to 0 instead
/// of lambda^(-1/r). Requires the optimizer's epsilon to be exactly 0.
struct PseudoInverse {
  /// Absolute rank tolerance, >= 0.
  double rank_atol = 0.0;
  /// Relative rank tolerance, >= 0; `std::nullopt` means n * machine epsilon of the precision the
  /// eigendecomposition ran in (torch.linalg.matrix_rank's default).
  std::optional<double> rank_rtol = 0.0;
};

namespace impl {
/// \brief The reference's eigenvalue rule (notes section 5.1) for eigenvalues `lambda` (ascending)
/// of A_r: s_k = lambda_k^(-1/root) after the perturbation shift, or the pseudo-inverse cut.
/// Returns false when a scale is infinite (a zero eigenvalue left with epsilon = 0). Shared by
/// EigenRootInverse and eigendecomposed Shampoo, which applies it to its stored eigenvalues.
template <class E>
bool inverse_root_scales(const std::vector<E>& lambda, double root, double epsilon, bool perturb_before_computation,
                         const std::optional<PseudoInverse>& pseudo_inverse, std::vector<E>& s) {
  const std::size_t n = lambda.size();
  const E exponent = static_cast<E>(-1.0 / root);
  s.assign(n, E(0));
  if (n == 0) return true;
  if (pseudo_inverse) {
    const double rtol = pseudo_inverse->rank_rtol ? *pseudo_inverse->rank_rtol
                                                  : static_cast<double>(n) * std::numeric_limits<E>::epsilon();
    const double cut = std::max(pseudo_inverse->rank_atol, rtol * std::max(static_cast<double>(lambda[n - 1]), 0.0));
    for (std::size_t k = 0; k < n; ++k)
      s[k] = static_cast<double>(lambda[k]) <= cut ? E(0) : std::pow(lambda[k], exponent);
  } else {
    // The reference computes the shift as a Python float and adds it in the tensor's precision.
    const double lambda_min = static_cast<double>(lambda[0]);  // ascending
    const double shift = perturb_before_computation ? -std::min(lambda_min - epsilon, 0.0)
                                                    : -std::min(lambda_min, 0.0) + epsilon;
    for (std::size_t k = 0; k < n; ++k) {
      const E l = lambda[k] + static_cast<E>(shift);
      // l == 0 (a singular A_r with eps = 0): the reference's 0^(-1/r) = inf, without the
      // division-by-zero trap.
      s[k] = l > E(0) ? std::pow(l, exponent) : std::numeric_limits<E>::infinity();
    }
  }
  return std::all_of(s.begin(), s.end(), [](E v) { return std::isfinite(v); });
}

/// X = (Q diag(s)) Q^T, column-major n x n, through the host BLAS.
template <class E>
std::vector<E> matrix_from_eigenpairs(const std::vector<E>& q, const std::vector<E>& s, std::size_t n) {
  std::vector<E> qs(n * n), x(n * n);
  for (std::size_t k = 0; k < n; ++k)
    for (std::size_t i = 0; i < n; ++i) qs[i + k * n] = q[i + k * n] * s[k];
  using host_matrix = Kokkos::View<E**, Kokkos::LayoutLeft, Kokkos::Device<Kokkos::DefaultHostExecutionSpace, Kokkos::HostSpace>,
                                   Kokkos::MemoryTraits<Kokkos::Unmanaged>>;
  using const_host_matrix = Kokkos::View<const E**, Kokkos::LayoutLeft,
                                         Kokkos::Device<Kokkos::DefaultHostExecutionSpace, Kokkos::HostSpace>,
                                         Kokkos::MemoryTraits<Kokkos::Unmanaged>>;
  if (n > 0)
    impl::kernels::gemm(Kokkos::DefaultHostExecutionSpace(), "N", "T", E(1), const_host_matrix(qs.data(), n, n),
                        const_host_matrix(q.data(), n, n), E(0), host_matrix(x.data(), n, n));
  return x;
}
}  // namespace impl

/// \brief Root inverse through a symmetric eigendecomposition, the reference's `EigenConfig`.
///
/// ```
/// A_r = A + eps I                  (perturb_before_computation, without pseudo_inverse)
///       A                          (otherwise)
/// (lambda, Q) = eigh(A_r)          LAPACK syevd on the host; float failures retried in double
/// perturbation, perturb_before_computation:  if lambda_min < eps: lambda <- lambda - lambda_min + eps
/// perturbation, !perturb_before_computation: lambda <- lambda - min(lambda_min, 0) + eps
/// pseudo_inverse (eps must be 0): lambda^(-1/r) for lambda > cut, 0 otherwise
/// X = Q diag(lambda^(-1/r)) Q^T
/// ```
/// Any finite root r > 0 is supported. A zero eigenvalue left after the perturbation rule (a
/// singular A with eps = 0) gives an infinite X: `non_finite`, X filled with +infinity, as the
/// reference's result is infinite there. A NaN or Inf in A, a LAPACK failure (after the double
/// retry when enabled) or a non-finite eigenvalue give `failed`.
///
/// Runs on the host: `compute` fences `space`, copies A to host memory when it is not
/// host-accessible, calls LAPACK and a host BLAS product, and copies X back (fencing `space`
/// again before it returns). Allocates its work arrays on every call (to be pooled later).
struct EigenRootInverse {
  /// Add eps I before the eigendecomposition (ignored with `pseudo_inverse`).
  bool perturb_before_computation = true;
  /// Pseudo-inverse instead of the perturbation rule; requires epsilon == 0.
  std::optional<PseudoInverse> pseudo_inverse = std::nullopt;
  /// For float data: when LAPACK fails (info != 0), retry in double and cast back.
  bool retry_double_precision = true;
  /// Run the eigendecomposition and the product in double even for float data.
  bool compute_in_double = false;

  /// Throws lather::invalid_argument naming the first invalid option.
  void validate() const {
    const impl::OptionCheck check("EigenRootInverse", "");
    if (pseudo_inverse) {
      check.at_least("pseudo_inverse.rank_atol", pseudo_inverse->rank_atol, 0.0);
      check.require(std::isfinite(pseudo_inverse->rank_atol),
                    impl::concat("invalid option 'pseudo_inverse.rank_atol' = ", pseudo_inverse->rank_atol,
                                 " (must be finite)"));
      if (pseudo_inverse->rank_rtol) {
        check.at_least("pseudo_inverse.rank_rtol", *pseudo_inverse->rank_rtol, 0.0);
        check.require(std::isfinite(*pseudo_inverse->rank_rtol),
                      impl::concat("invalid option 'pseudo_inverse.rank_rtol' = ", *pseudo_inverse->rank_rtol,
                                   " (must be finite)"));
      }
    }
  }

  /// True with `pseudo_inverse`: the optimizer's epsilon must then be exactly 0 (the reference
  /// raises otherwise; the optimizer checks this rule, `compute` throws on it).
  [[nodiscard]] bool requires_zero_epsilon() const noexcept { return pseudo_inverse.has_value(); }

  /// Any finite root > 0.
  [[nodiscard]] bool supports_root(double root) const noexcept { return std::isfinite(root) && root > 0; }

  /// \brief X ~ (A [+ eps I])^(-1/root) by the rule above; see RootInverseStatus.
  /// \param space where A was produced and X is consumed; fenced (this strategy runs on the host)
  /// \param a symmetric n x n matrix (only its lower triangle, i >= j, is read)
  /// \param root r > 0
  /// \param epsilon the optimizer's epsilon, >= 0 (exactly 0 with `pseudo_inverse`)
  /// \param x n x n output; written only when the status is success or non_finite
  template <class ExecSpace, class T, class MemorySpace>
  RootInverseStatus compute(const ExecSpace& space,
                            const Kokkos::View<const T**, Kokkos::LayoutRight, MemorySpace>& a, double root,
                            double epsilon,
                            const Kokkos::View<T**, Kokkos::LayoutRight, MemorySpace>& x) const {
    static_assert(std::is_same_v<T, float> || std::is_same_v<T, double>,
                  "lather::EigenRootInverse: the matrix scalar must be float or double");
    validate();
    impl::check_root_inverse_arguments("EigenRootInverse", a, x, root, supports_root(root),
                                       "any finite root > 0", epsilon);
    LATHER_THROW_IF(pseudo_inverse && epsilon != 0.0, "lather::EigenRootInverse: epsilon = ", epsilon,
                    " must be 0 with 'pseudo_inverse' (the reference raises the same error)");
    const auto n = static_cast<std::size_t>(a.extent(0));
    if (n == 0) return RootInverseStatus::success;

    const auto a_host = readable_on_host(space, a);
    for (std::size_t i = 0; i < n; ++i)
      for (std::size_t j = 0; j < n; ++j)
        if (!std::isfinite(a_host(i, j))) return RootInverseStatus::failed;

    std::vector<T> result(n * n);
    RootInverseStatus status = RootInverseStatus::failed;
    if (std::is_same_v<T, double> || compute_in_double) {
      status = from_matrix<double>(a_host, n, root, epsilon, result);
    } else {
      status = from_matrix<float>(a_host, n, root, epsilon, result);
    }
    if (status == RootInverseStatus::success || status == RootInverseStatus::non_finite)
      write_back(space, result, x);
    return status;
  }

 private:
  // A readable on the host after `space` finished writing it: A itself when host-accessible,
  // otherwise a host copy.
  template <class ExecSpace, class T, class MemorySpace>
  static auto readable_on_host(const ExecSpace& space,
                               const Kokkos::View<const T**, Kokkos::LayoutRight, MemorySpace>& a) {
    if constexpr (Kokkos::SpaceAccessibility<Kokkos::HostSpace, MemorySpace>::accessible) {
      space.fence();
      return a;
    } else {
      Kokkos::View<T**, Kokkos::LayoutRight, Kokkos::HostSpace> h(
          Kokkos::view_alloc(Kokkos::WithoutInitializing, "lather::EigenRootInverse::a_host"), a.extent(0),
          a.extent(1));
      Kokkos::deep_copy(space, h, a);
      space.fence();
      return h;
    }
  }

  // Row-major `result` into X (directly when host-accessible, else through one copy).
  template <class ExecSpace, class T, class MemorySpace>
  static void write_back(const ExecSpace& space, const std::vector<T>& result,
                         const Kokkos::View<T**, Kokkos::LayoutRight, MemorySpace>& x) {
    const std::size_t n = x.extent(0);
    if constexpr (Kokkos::SpaceAccessibility<Kokkos::HostSpace, MemorySpace>::accessible) {
      for (std::size_t i = 0; i < n; ++i)
        for (std::size_t j = 0; j < n; ++j) x(i, j) = result[i * n + j];
    } else {
      Kokkos::View<const T**, Kokkos::LayoutRight, Kokkos::HostSpace, Kokkos::MemoryTraits<Kokkos::Unmanaged>>
          h(result.data(), n, n);
      Kokkos::deep_copy(space, x, h);
      space.fence();  // `result` dies when the caller returns
    }
  }

  // A_r in precision C (column-major; A is symmetric), its eigendecomposition, the eigenvalue
  // rule and X, cast to T into `result` (row-major).
  template <class C, class HostA, class T>
  RootInverseStatus from_matrix(const HostA& a_host, std::size_t n, double root, double epsilon,
                                std::vector<T>& result) const {
    const bool add_epsilon = perturb_before_computation && !pseudo_inverse;
    std::vector<C> q(n * n);
    for (std::size_t j = 0; j < n; ++j)
      for (std::size_t i = 0; i < n; ++i) {
        const C v = static_cast<C>(a_host(i, j));
        q[i + j * n] = add_epsilon && i == j ? v + static_cast<C>(epsilon) : v;
      }
    std::vector<C> lambda(n);
    if constexpr (std::is_same_v<C, float>) {
      const std::vector<float> a_r = q;  // LAPACK overwrites q; kept for the double retry
      if (impl::lapack::syevd(static_cast<impl::lapack::lapack_int>(n), q.data(), lambda.data()) != 0) {
        if (!retry_double_precision) return RootInverseStatus::failed;
        // The reference's fp64 retry: eigh(A_r.double()), eigenvectors cast back at the end.
        std::vector<double> q64(a_r.begin(), a_r.end());
        std::vector<double> lambda64(n);
        if (impl::lapack::syevd(static_cast<impl::lapack::lapack_int>(n), q64.data(), lambda64.data()) != 0)
          return RootInverseStatus::failed;
        return from_eigenpairs(q64, lambda64, n, root, epsilon, result);
      }
    } else {
      if (impl::lapack::syevd(static_cast<impl::lapack::lapack_int>(n), q.data(), lambda.data()) != 0)
        return RootInverseStatus::failed;
    }
    return from_eigenpairs(q, lambda, n, root, epsilon, result);
  }

  // The eigenvalue rule and X = Q diag(s) Q^T (host BLAS), in the precision E of the eigensolver.
  template <class E, class T>
  RootInverseStatus from_eigenpairs(const std::vector<E>& q, const std::vector<E>& lambda, std::size_t n,
                                    double root, double epsilon, std::vector<T>& result) const {
    for (const E l : lambda)
      if (!std::isfinite(l)) return RootInverseStatus::failed;
    std::vector<E> s;
    if (!impl::inverse_root_scales(lambda, root, epsilon, perturb_before_computation, pseudo_inverse, s)) {
      std::fill(result.begin(), result.end(), std::numeric_limits<T>::infinity());
      return RootInverseStatus::non_finite;
    }
    const std::vector<E> x = impl::matrix_from_eigenpairs(q, s, n);
    bool finite = true;
    for (std::size_t i = 0; i < n; ++i)
      for (std::size_t j = 0; j < n; ++j) {
        const T v = static_cast<T>(x[i + j * n]);
        finite = finite && std::isfinite(v);
        result[i * n + j] = v;
      }
    return finite ? RootInverseStatus::success : RootInverseStatus::non_finite;
  }
};

}  // namespace lather

#endif
