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
#include <lather/impl/backends/blas.hpp>
#include <lather/impl/backends/lapack.hpp>
#include <lather/impl/kernels/matrix_functions.hpp>
#include <lather/impl/option_check.hpp>

#include <Kokkos_Core.hpp>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
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

/// X = (Q diag(s)) Q^T, column-major n x n, into `x` (n x n), for scales s >= 0 (what
/// inverse_root_scales gives): one SYRK of Q diag(sqrt(s)) in the host BLAS, half the work of the
/// general product, then the lower triangle mirrored from the upper. `scaled` is scratch (n x n).
template <class E>
void matrix_from_eigenpairs_into(const E* q, const E* s, std::size_t n, E* scaled, E* x) {
  if (n == 0) return;
  for (std::size_t k = 0; k < n; ++k) {
    const E r = std::sqrt(s[k]);
    for (std::size_t i = 0; i < n; ++i) scaled[i + k * n] = q[i + k * n] * r;
  }
  const auto ni = static_cast<std::int64_t>(n);
  blas::syrk<E>('U', 'N', ni, ni, E(1), scaled, ni, E(0), x, ni);
  for (std::size_t j = 0; j < n; ++j)
    for (std::size_t i = j + 1; i < n; ++i) x[i + j * n] = x[j + i * n];
}

/// X = (Q diag(s)) Q^T, column-major n x n (a new vector; see matrix_from_eigenpairs_into).
template <class E>
std::vector<E> matrix_from_eigenpairs(const std::vector<E>& q, const std::vector<E>& s, std::size_t n) {
  std::vector<E> scaled(n * n), x(n * n);
  matrix_from_eigenpairs_into(q.data(), s.data(), n, scaled.data(), x.data());
  return x;
}

/// Per-thread work arrays of EigenRootInverse in the eigensolver's precision E: grown to the
/// largest n seen and kept, so repeated root computations neither allocate nor page-fault fresh
/// memory (which cost up to 2x a bare syevd at n >= 512 on this project's machine).
template <class E>
struct EigenWorkspace {
  std::vector<E> q, lambda, s_scales, scaled, x, a_copy;
  std::vector<E> result;  // EigenRootInverse's row-major output when E is the data's scalar
  static EigenWorkspace& get() {
    thread_local EigenWorkspace w;
    return w;
  }
  void reserve(std::size_t n) {
    for (auto* v : {&q, &scaled, &x, &a_copy})
      if (v->size() < n * n) v->resize(n * n);
    if (lambda.size() < n) lambda.resize(n);
    s_scales.reserve(n);
  }
};
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
/// again before it returns). Its work arrays are kept per thread (impl::EigenWorkspace), grown to the
/// largest matrix seen: after the first call of a size, a call allocates nothing on the host.
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
    if (pseudo_inverse) {  // the check object only then: compute() validates on every call, unallocating
      const impl::OptionCheck check("EigenRootInverse", "");
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
    check_arguments(a, x, root, epsilon);
    const auto n = static_cast<std::size_t>(a.extent(0));
    if (n == 0) return RootInverseStatus::success;

    const auto a_host = readable_on_host(space, a);
    const T* result = nullptr;
    const RootInverseStatus status = compute_into_workspace(a_host, n, root, epsilon, result);
    if (status == RootInverseStatus::success || status == RootInverseStatus::non_finite) write_back(space, result, x);
    return status;
  }

  /// \brief Grows the calling thread's work arrays (and LAPACK's) for matrices up to n x n of
  /// T, so that compute_on_host allocates nothing for them afterwards.
  template <class T>
  void reserve_on_host(std::size_t n) const {
    auto& result = impl::EigenWorkspace<T>::get().result;
    if (result.size() < n * n) result.resize(n * n);
    impl::lapack::lapack_int lwork = 0, liwork = 0, info = 0;
    const auto ni = static_cast<impl::lapack::lapack_int>(n);
    if (std::is_same_v<T, double> || compute_in_double) {
      impl::EigenWorkspace<double>::get().reserve(n);
      impl::lapack::syevd_reserve<double>(ni, lwork, liwork, info);
    } else {
      impl::EigenWorkspace<float>::get().reserve(n);
      impl::lapack::syevd_reserve<float>(ni, lwork, liwork, info);
    }
  }

  /// \brief compute() for host-accessible A and X, without an execution space: no fence and no
  /// Kokkos kernel, work arrays per thread, so several host threads may call it at once on
  /// different matrices (Shampoo's root steps on host spaces compute their blocks' roots side
  /// by side with it, each thread with a single-threaded BLAS). Same results as compute().
  template <class T, class MemorySpace>
    requires(bool(Kokkos::SpaceAccessibility<Kokkos::HostSpace, MemorySpace>::accessible))
  RootInverseStatus compute_on_host(const Kokkos::View<const T**, Kokkos::LayoutRight, MemorySpace>& a, double root,
                                    double epsilon, const Kokkos::View<T**, Kokkos::LayoutRight, MemorySpace>& x) const {
    check_arguments(a, x, root, epsilon);
    const auto n = static_cast<std::size_t>(a.extent(0));
    if (n == 0) return RootInverseStatus::success;
    const T* result = nullptr;
    const RootInverseStatus status = compute_into_workspace(a, n, root, epsilon, result);
    if (status == RootInverseStatus::success || status == RootInverseStatus::non_finite)
      for (std::size_t i = 0; i < n; ++i)
        for (std::size_t j = 0; j < n; ++j) x(i, j) = result[i * n + j];
    return status;
  }

 private:
  template <class T, class MemorySpace>
  void check_arguments(const Kokkos::View<const T**, Kokkos::LayoutRight, MemorySpace>& a,
                       const Kokkos::View<T**, Kokkos::LayoutRight, MemorySpace>& x, double root, double epsilon) const {
    static_assert(std::is_same_v<T, float> || std::is_same_v<T, double>,
                  "lather::EigenRootInverse: the matrix scalar must be float or double");
    validate();
    impl::check_root_inverse_arguments("EigenRootInverse", a, x, root, supports_root(root),
                                       "any finite root > 0", epsilon);
    LATHER_THROW_IF(pseudo_inverse && epsilon != 0.0, "lather::EigenRootInverse: epsilon = ", epsilon,
                    " must be 0 with 'pseudo_inverse' (the reference raises the same error)");
  }

  // The checked arguments' X into this thread's result buffer (row-major, reused from call to
  // call), `result` pointing at it.
  template <class HostA, class T>
  RootInverseStatus compute_into_workspace(const HostA& a_host, std::size_t n, double root, double epsilon,
                                           const T*& result) const {
    for (std::size_t i = 0; i < n; ++i)
      for (std::size_t j = 0; j < n; ++j)
        if (!std::isfinite(a_host(i, j))) return RootInverseStatus::failed;
    auto& buffer = impl::EigenWorkspace<T>::get().result;
    if (buffer.size() < n * n) buffer.resize(n * n);
    result = buffer.data();
    if (std::is_same_v<T, double> || compute_in_double) return from_matrix<double>(a_host, n, root, epsilon, buffer.data());
    return from_matrix<float>(a_host, n, root, epsilon, buffer.data());
  }

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
  static void write_back(const ExecSpace& space, const T* result,
                         const Kokkos::View<T**, Kokkos::LayoutRight, MemorySpace>& x) {
    const std::size_t n = x.extent(0);
    if constexpr (Kokkos::SpaceAccessibility<Kokkos::HostSpace, MemorySpace>::accessible) {
      for (std::size_t i = 0; i < n; ++i)
        for (std::size_t j = 0; j < n; ++j) x(i, j) = result[i * n + j];
    } else {
      Kokkos::View<const T**, Kokkos::LayoutRight, Kokkos::HostSpace, Kokkos::MemoryTraits<Kokkos::Unmanaged>>
          h(result, n, n);
      Kokkos::deep_copy(space, x, h);
      space.fence();  // `result` dies when the caller returns
    }
  }

  // A_r in precision C (column-major; A is symmetric), its eigendecomposition, the eigenvalue
  // rule and X, cast to T into `result` (row-major, n x n). Work arrays: EigenWorkspace<C>.
  template <class C, class HostA, class T>
  RootInverseStatus from_matrix(const HostA& a_host, std::size_t n, double root, double epsilon, T* result) const {
    const bool add_epsilon = perturb_before_computation && !pseudo_inverse;
    auto& w = impl::EigenWorkspace<C>::get();
    w.reserve(n);
    C* q = w.q.data();
    for (std::size_t j = 0; j < n; ++j)
      for (std::size_t i = 0; i < n; ++i) {
        const C v = static_cast<C>(a_host(i, j));
        q[i + j * n] = add_epsilon && i == j ? v + static_cast<C>(epsilon) : v;
      }
    const auto ni = static_cast<impl::lapack::lapack_int>(n);
    if constexpr (std::is_same_v<C, float>) {
      std::copy(q, q + n * n, w.a_copy.data());  // LAPACK overwrites q; kept for the double retry
      if (impl::lapack::syevd(ni, q, w.lambda.data()) != 0) {
        if (!retry_double_precision) return RootInverseStatus::failed;
        // The reference's fp64 retry: eigh(A_r.double()), eigenvectors cast back at the end.
        auto& w64 = impl::EigenWorkspace<double>::get();
        w64.reserve(n);
        std::copy(w.a_copy.data(), w.a_copy.data() + n * n, w64.q.data());
        if (impl::lapack::syevd(ni, w64.q.data(), w64.lambda.data()) != 0) return RootInverseStatus::failed;
        return from_eigenpairs(w64, n, root, epsilon, result);
      }
    } else {
      if (impl::lapack::syevd(ni, q, w.lambda.data()) != 0) return RootInverseStatus::failed;
    }
    return from_eigenpairs(w, n, root, epsilon, result);
  }

  // The eigenvalue rule and X = Q diag(s) Q^T (host BLAS), in the precision E of the eigensolver,
  // from the eigenpairs in w (q, lambda).
  template <class E, class T>
  RootInverseStatus from_eigenpairs(impl::EigenWorkspace<E>& w, std::size_t n, double root, double epsilon,
                                    T* result) const {
    // inverse_root_scales works on exactly-sized vectors: lambda and s are n long here.
    w.lambda.resize(n);
    for (const E l : w.lambda)
      if (!std::isfinite(l)) return RootInverseStatus::failed;
    if (!impl::inverse_root_scales(w.lambda, root, epsilon, perturb_before_computation, pseudo_inverse, w.s_scales)) {
      std::fill(result, result + n * n, std::numeric_limits<T>::infinity());
      return RootInverseStatus::non_finite;
    }
    impl::matrix_from_eigenpairs_into(w.q.data(), w.s_scales.data(), n, w.scaled.data(), w.x.data());
    bool finite = true;
    for (std::size_t i = 0; i < n; ++i)
      for (std::size_t j = 0; j < n; ++j) {
        const T v = static_cast<T>(w.x[i + j * n]);
        finite = finite && std::isfinite(v);
        result[i * n + j] = v;
      }
    return finite ? RootInverseStatus::success : RootInverseStatus::non_finite;
  }
};

}  // namespace lather

#endif
