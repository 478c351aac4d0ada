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

/// Tile edge of the transposing copies below. A tile goes through a padded buffer, so that both
/// the strided side and the contiguous side of the copy stream whole cache lines: at n a power of
/// two, the 32 lines of a tile's column are 4n bytes apart and fall into one L1 set, and a direct
/// transposing loop spent 5 ms of a 104 ms syevd at n = 1024, float, on this project's machine.
inline constexpr std::size_t transpose_tile = 32;

/// A (n x n, any host-readable 2-D accessor a(i, j)) into column-major `q` in precision C, with
/// `diagonal` added to the diagonal. Returns false, with q partly written, when A holds a NaN or
/// an infinity (anywhere, not only in the triangle LAPACK reads).
template <class C, class HostA>
bool load_column_major(const HostA& a, std::size_t n, C diagonal, C* q) {
  constexpr std::size_t t = transpose_tile;
  C buf[t][t + 1];
  bool finite = true;
  for (std::size_t ib = 0; ib < n; ib += t)
    for (std::size_t jb = 0; jb < n; jb += t) {
      const std::size_t ie = std::min(ib + t, n), je = std::min(jb + t, n);
      for (std::size_t i = ib; i < ie; ++i)
        for (std::size_t j = jb; j < je; ++j) {
          const auto v = a(i, j);
          finite &= static_cast<bool>(std::isfinite(v));  // no branch in the loop
          buf[j - jb][i - ib] = static_cast<C>(v);
        }
      for (std::size_t j = jb; j < je; ++j)
        for (std::size_t i = ib; i < ie; ++i) q[i + j * n] = buf[j - jb][i - ib];
    }
  if (diagonal != C(0))
    for (std::size_t i = 0; i < n; ++i) q[i + i * n] += diagonal;
  return finite;
}

/// The symmetric X whose upper triangle (i <= j) column-major `x` holds (what a SYRK with 'U'
/// writes), as T into row-major `out` with row stride `ld`. The column-major upper triangle is
/// the row-major lower one: each row's part left of the diagonal is a contiguous copy, only the
/// mirrored part goes through tiles. Returns false when an entry is not finite in T.
template <class E, class T>
bool store_symmetric_rows(const E* x, std::size_t n, T* out, std::size_t ld) {
  constexpr std::size_t t = transpose_tile;
  bool finite = true;
  for (std::size_t r = 0; r < n; ++r) {
    const E* row = x + r * n;  // X(r, c) = x[c + r n] for c <= r
    T* o = out + r * ld;
    for (std::size_t c = 0; c <= r; ++c) {
      const T v = static_cast<T>(row[c]);
      finite &= static_cast<bool>(std::isfinite(v));
      o[c] = v;
    }
  }
  E buf[t][t + 1];
  for (std::size_t rb = 0; rb < n; rb += t)
    for (std::size_t cb = rb; cb < n; cb += t) {  // tiles holding some c > r
      const std::size_t re = std::min(rb + t, n), ce = std::min(cb + t, n);
      for (std::size_t c = cb; c < ce; ++c)
        for (std::size_t r = rb; r < std::min(re, c); ++r) buf[r - rb][c - cb] = x[r + c * n];  // X(r, c), r < c
      for (std::size_t r = rb; r < re; ++r) {
        T* o = out + r * ld;
        for (std::size_t c = std::max(cb, r + 1); c < ce; ++c) {
          const T v = static_cast<T>(buf[r - rb][c - cb]);
          finite &= static_cast<bool>(std::isfinite(v));
          o[c] = v;
        }
      }
    }
  return finite;
}

/// Per-thread work arrays of EigenRootInverse in the eigensolver's precision E: grown to the
/// largest n seen and kept, so repeated root computations neither allocate nor page-fault fresh
/// memory (which cost up to 2x a bare syevd at n >= 512 on this project's machine). Two n x n
/// arrays: the eigenvectors (scaled in place for the SYRK) and the SYRK's output.
template <class E>
struct EigenWorkspace {
  std::vector<E> q, lambda, s_scales, x;
  std::vector<E> result;  // row-major X for compute() on memory the host cannot write
  std::vector<E> a_copy;  // A copied from memory the host cannot read
  static EigenWorkspace& get() {
    thread_local EigenWorkspace w;
    return w;
  }
  void reserve(std::size_t n) {
    for (auto* v : {&q, &x})
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

    const auto a_host = readable_on_host(space, a);  // fences `space`
    if constexpr (Kokkos::SpaceAccessibility<Kokkos::HostSpace, MemorySpace>::accessible) {
      return compute_host(a_host, n, root, epsilon, x.data(), static_cast<std::size_t>(x.stride(0)));
    } else {
      auto& buffer = impl::EigenWorkspace<T>::get().result;
      if (buffer.size() < n * n) buffer.resize(n * n);
      const RootInverseStatus status = compute_host(a_host, n, root, epsilon, buffer.data(), n);
      if (status == RootInverseStatus::success || status == RootInverseStatus::non_finite) {
        const Kokkos::View<const T**, Kokkos::LayoutRight, Kokkos::HostSpace, Kokkos::MemoryTraits<Kokkos::Unmanaged>>
            h(buffer.data(), n, n);
        Kokkos::deep_copy(space, x, h);
        space.fence();  // the buffer is this thread's and is reused by its next call
      }
      return status;
    }
  }

  /// \brief Grows the calling thread's work arrays (and LAPACK's) for matrices up to n x n of
  /// T, so that compute_on_host allocates nothing for them afterwards.
  template <class T>
  void reserve_on_host(std::size_t n) const {
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
    return compute_host(a, n, root, epsilon, x.data(), static_cast<std::size_t>(x.stride(0)));
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

  // The checked arguments' X (row-major, row stride ld) into `out`, host memory; `out` is
  // written only when the status is success or non_finite.
  template <class HostA, class T>
  RootInverseStatus compute_host(const HostA& a_host, std::size_t n, double root, double epsilon, T* out,
                                 std::size_t ld) const {
    if (std::is_same_v<T, double> || compute_in_double) return from_matrix<double>(a_host, n, root, epsilon, out, ld);
    return from_matrix<float>(a_host, n, root, epsilon, out, ld);
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
      // Into this thread's kept buffer (a View each call was an allocation per factor and root
      // step on a GPU: 767 for resnet50 at 256 on the H200).
      auto& buffer = impl::EigenWorkspace<T>::get().a_copy;
      const std::size_t n = a.extent(0);
      if (buffer.size() < n * n) buffer.resize(n * n);
      const Kokkos::View<T**, Kokkos::LayoutRight, Kokkos::HostSpace, Kokkos::MemoryTraits<Kokkos::Unmanaged>> h(
          buffer.data(), n, n);
      Kokkos::deep_copy(space, h, a);
      space.fence();
      return Kokkos::View<const T**, Kokkos::LayoutRight, Kokkos::HostSpace, Kokkos::MemoryTraits<Kokkos::Unmanaged>>(h);
    }
  }

  // A_r in precision C (column-major; A is symmetric), its eigendecomposition, the eigenvalue
  // rule and X, cast to T into `out` (row-major, row stride ld). Work arrays: EigenWorkspace<C>.
  template <class C, class HostA, class T>
  RootInverseStatus from_matrix(const HostA& a_host, std::size_t n, double root, double epsilon, T* out,
                                std::size_t ld) const {
    const C diagonal = perturb_before_computation && !pseudo_inverse ? static_cast<C>(epsilon) : C(0);
    auto& w = impl::EigenWorkspace<C>::get();
    w.reserve(n);
    if (!impl::load_column_major(a_host, n, diagonal, w.q.data())) return RootInverseStatus::failed;
    const auto ni = static_cast<impl::lapack::lapack_int>(n);
    if (impl::lapack::syevd(ni, w.q.data(), w.lambda.data()) != 0) {
      if (std::is_same_v<C, double> || !retry_double_precision) return RootInverseStatus::failed;
      // The reference's fp64 retry: eigh(A_r.double()), eigenvectors cast back at the end. A_r
      // is formed again from A (LAPACK overwrote q), its diagonal summed in C as above.
      auto& w64 = impl::EigenWorkspace<double>::get();
      w64.reserve(n);
      (void)impl::load_column_major(a_host, n, 0.0, w64.q.data());
      for (std::size_t i = 0; i < n; ++i)
        w64.q[i + i * n] = static_cast<double>(static_cast<C>(a_host(i, i)) + diagonal);
      if (impl::lapack::syevd(ni, w64.q.data(), w64.lambda.data()) != 0) return RootInverseStatus::failed;
      return from_eigenpairs(w64, n, root, epsilon, out, ld);
    }
    return from_eigenpairs(w, n, root, epsilon, out, ld);
  }

  // The eigenvalue rule and X = Q diag(s) Q^T (host BLAS), in the precision E of the eigensolver,
  // from the eigenpairs in w (q, lambda); q is scaled in place.
  template <class E, class T>
  RootInverseStatus from_eigenpairs(impl::EigenWorkspace<E>& w, std::size_t n, double root, double epsilon, T* out,
                                    std::size_t ld) const {
    // inverse_root_scales works on exactly-sized vectors: lambda and s are n long here.
    w.lambda.resize(n);
    for (const E l : w.lambda)
      if (!std::isfinite(l)) return RootInverseStatus::failed;
    if (!impl::inverse_root_scales(w.lambda, root, epsilon, perturb_before_computation, pseudo_inverse, w.s_scales)) {
      for (std::size_t i = 0; i < n; ++i) std::fill(out + i * ld, out + i * ld + n, std::numeric_limits<T>::infinity());
      return RootInverseStatus::non_finite;
    }
    // X = (Q diag(sqrt s)) (Q diag(sqrt s))^T: one SYRK, half a general product (s >= 0 here).
    E* q = w.q.data();
    for (std::size_t k = 0; k < n; ++k) {
      const E r = std::sqrt(w.s_scales[k]);
      for (std::size_t i = 0; i < n; ++i) q[i + k * n] *= r;
    }
    const auto ni = static_cast<std::int64_t>(n);
    impl::blas::syrk<E>('U', 'N', ni, ni, E(1), q, ni, E(0), w.x.data(), ni);
    return impl::store_symmetric_rows(w.x.data(), n, out, ld) ? RootInverseStatus::success
                                                               : RootInverseStatus::non_finite;
  }
};

}  // namespace lather

#endif
