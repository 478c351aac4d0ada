// SPDX-License-Identifier: Apache-2.0
/// \file
/// \brief The amortized eigendecompositions of eigendecomposed and eigenvalue-corrected Shampoo:
/// `EighEigendecomposition` (LAPACK syevd, with the adaptive skip of "Purifying Shampoo") and
/// `QREigendecomposition` (warm-started orthogonal iteration, SOAP's refresh). The reference's
/// `EighEigendecompositionConfig` and `QREigendecompositionConfig` (notes section 5.4).
///
/// Both run on the host (LAPACK and the host BLAS): the factor is copied to the host on amortized
/// steps only, and the basis back (docs/shampoo-family.md, "where it runs"). Their intermediate
/// matrices are per-thread scratch (impl::host_scratch): a refresh allocates nothing once its
/// thread has refreshed a factor of that size and the caller's q and lambda have held it.
#ifndef LATHER_PRECONDITIONERS_EIGENDECOMPOSITION_HPP
#define LATHER_PRECONDITIONERS_EIGENDECOMPOSITION_HPP

#include <lather/concepts/root_inverse.hpp>
#include <lather/impl/backends/dense_host.hpp>
#include <lather/impl/backends/lapack.hpp>
#include <lather/impl/host_scratch.hpp>
#include <lather/impl/option_check.hpp>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <numeric>
#include <type_traits>
#include <vector>

namespace lather {

namespace impl::eig {
/// Owner tags of the refreshes' scratch vectors (impl::host_scratch).
struct RayleighScratch {};
struct EighScratch {};
struct QrIterationScratch {};
/// B = Q^T A Q (all n x n column-major), into b (resized).
template <class C>
void rayleigh(const std::vector<C>& a, const std::vector<C>& q, std::size_t n, std::vector<C>& b) {
  auto& aq = host_scratch<C, RayleighScratch, 0>();
  aq.resize(n * n);
  b.resize(n * n);
  dense::gemm<C>("N", "N", n, n, n, C(1), a.data(), q.data(), C(0), aq.data());
  dense::gemm<C>("T", "N", n, n, n, C(1), q.data(), aq.data(), C(0), b.data());
}
/// The adaptive-skip criterion: ||B - diag(B)||_F <= tolerance ||B||_F.
template <class C>
bool nearly_diagonal(const std::vector<C>& b, std::size_t n, double tolerance) {
  double off = 0, all = 0;
  for (std::size_t j = 0; j < n; ++j)
    for (std::size_t i = 0; i < n; ++i) {
      const double v = static_cast<double>(b[i + j * n]);
      all += v * v;
      if (i != j) off += v * v;
    }
  return std::sqrt(off) <= tolerance * std::sqrt(all);
}
template <class C>
bool all_finite(const std::vector<C>& v) {
  return std::all_of(v.begin(), v.end(), [](C x) { return std::isfinite(x); });
}
}  // namespace impl::eig

/// \brief Eigenbasis by a symmetric eigendecomposition (LAPACK syevd), eigenvalues ascending.
/// With `tolerance` > 0 the previous basis is kept when it still nearly diagonalizes the factor
/// (||B - diag(B)||_F <= tolerance ||B||_F for B = Q^T A Q; the eigenvalues are then diag(B)).
struct EighEigendecomposition {
  static constexpr const char* name = "eigh";
  /// Adaptive-skip tolerance in [0, 1]; 0 recomputes on every amortized step.
  double tolerance = 0.0;
  /// For float data: when LAPACK fails, retry in double and cast back (the reference's default).
  bool retry_double_precision = true;
  /// Run in double even for float factors.
  bool compute_in_double = false;

  void validate(const impl::OptionCheck& c) const { c.in_closed("amortized.tolerance", tolerance, 0.0, 1.0); }

  /// \brief New basis and eigenvalues of `a` (A + ridge, symmetric, column-major n x n).
  /// \param q the previous basis on entry (identity at first), the new one on return
  /// \param lambda the eigenvalues, ascending (or diag(B) when the basis is kept)
  /// \return success, or failed (LAPACK failure after the retry, non-finite input or output);
  ///         on failure q and lambda are unspecified
  template <class C>
  RootInverseStatus refresh(const std::vector<C>& a, std::size_t n, std::vector<C>& q, std::vector<C>& lambda) const {
    if (!impl::eig::all_finite(a)) return RootInverseStatus::failed;
    lambda.assign(n, C(0));
    if (tolerance > 0) {
      auto& b = impl::host_scratch<C, impl::eig::EighScratch, 0>();
      impl::eig::rayleigh(a, q, n, b);
      if (impl::eig::nearly_diagonal(b, n, tolerance)) {
        for (std::size_t i = 0; i < n; ++i) lambda[i] = b[i + i * n];
        return impl::eig::all_finite(lambda) ? RootInverseStatus::success : RootInverseStatus::failed;
      }
    }
    auto& work = impl::host_scratch<C, impl::eig::EighScratch, 1>();
    work.assign(a.begin(), a.end());
    if (impl::lapack::syevd(static_cast<impl::lapack::lapack_int>(n), work.data(), lambda.data()) != 0) {
      if constexpr (std::is_same_v<C, float>) {
        if (!retry_double_precision) return RootInverseStatus::failed;
        auto& w64 = impl::host_scratch<double, impl::eig::EighScratch, 2>();
        auto& l64 = impl::host_scratch<double, impl::eig::EighScratch, 3>();
        w64.assign(a.begin(), a.end());
        l64.resize(n);
        if (impl::lapack::syevd(static_cast<impl::lapack::lapack_int>(n), w64.data(), l64.data()) != 0)
          return RootInverseStatus::failed;
        work.assign(w64.begin(), w64.end());
        lambda.assign(l64.begin(), l64.end());
      } else {
        return RootInverseStatus::failed;
      }
    }
    q.assign(work.begin(), work.end());
    return impl::eig::all_finite(q) && impl::eig::all_finite(lambda) ? RootInverseStatus::success
                                                                       : RootInverseStatus::failed;
  }
};

/// \brief Eigenbasis by warm-started QR (orthogonal) iteration, the reference's
/// `QREigendecompositionConfig` and SOAP's refresh: from the previous basis Q and B = Q^T A Q,
/// up to `max_iterations` times while B is not nearly diagonal (the eigh criterion with
/// `tolerance`): B = QR, B <- R Q_k, Q <- Q Q_k. Then diag(B) is sorted ascending (stable) and
/// Q's columns permuted to match. The eigenvalues are Rayleigh quotients of an unconverged basis.
struct QREigendecomposition {
  static constexpr const char* name = "qr";
  int max_iterations = 1;
  double tolerance = 0.0;
  bool compute_in_double = false;

  void validate(const impl::OptionCheck& c) const {
    c.require(max_iterations >= 1, impl::concat("invalid option 'amortized.max_iterations' = ", max_iterations,
                                                " (must be >= 1)"));
    c.in_closed("amortized.tolerance", tolerance, 0.0, 1.0);
  }

  template <class C>
  RootInverseStatus refresh(const std::vector<C>& a, std::size_t n, std::vector<C>& q, std::vector<C>& lambda) const {
    if (!impl::eig::all_finite(a)) return RootInverseStatus::failed;
    using impl::eig::QrIterationScratch;
    auto& b = impl::host_scratch<C, QrIterationScratch, 0>();
    auto& r = impl::host_scratch<C, QrIterationScratch, 1>();
    auto& qk = impl::host_scratch<C, QrIterationScratch, 2>();
    auto& next = impl::host_scratch<C, QrIterationScratch, 3>();
    impl::eig::rayleigh(a, q, n, b);
    next.resize(n * n);
    for (int it = 0; it < max_iterations && !impl::eig::nearly_diagonal(b, n, tolerance); ++it) {
      qk.assign(b.begin(), b.end());
      if (impl::dense::qr(static_cast<impl::lapack::lapack_int>(n), qk, r) != 0) return RootInverseStatus::failed;
      impl::dense::gemm<C>("N", "N", n, n, n, C(1), r.data(), qk.data(), C(0), b.data());
      impl::dense::gemm<C>("N", "N", n, n, n, C(1), q.data(), qk.data(), C(0), next.data());
      // Copied, not swapped: q is the caller's, and its buffer stays its own.
      std::copy(next.begin(), next.end(), q.begin());
    }
    auto& order = impl::host_scratch<std::size_t, QrIterationScratch, 4>();
    order.resize(n);
    std::iota(order.begin(), order.end(), std::size_t{0});
    // std::stable_sort takes a temporary buffer from the heap; an insertion sort does not, and
    // keeps equal diagonals in their order as well (n is at most a block size; diag(B) of a warm
    // start is nearly sorted, so it runs close to n steps).
    for (std::size_t i = 1; i < n; ++i) {
      const std::size_t v = order[i];
      const C key = b[v + v * n];
      std::size_t j = i;
      for (; j > 0 && key < b[order[j - 1] + order[j - 1] * n]; --j) order[j] = order[j - 1];
      order[j] = v;
    }
    lambda.assign(n, C(0));
    auto& sorted = next;  // free after the iterations
    for (std::size_t k = 0; k < n; ++k) {
      lambda[k] = b[order[k] + order[k] * n];
      std::copy_n(q.begin() + static_cast<std::ptrdiff_t>(order[k] * n), n,
                  sorted.begin() + static_cast<std::ptrdiff_t>(k * n));
    }
    std::copy(sorted.begin(), sorted.end(), q.begin());
    return impl::eig::all_finite(q) && impl::eig::all_finite(lambda) ? RootInverseStatus::success
                                                                       : RootInverseStatus::failed;
  }
};

namespace concepts {
/// An amortized eigendecomposition: options with `validate` and a host `refresh` in float and double.
template <class A>
concept AmortizedEigendecomposition =
    requires(const A& a, const impl::OptionCheck& c, const std::vector<double>& md, std::vector<double>& vd,
             const std::vector<float>& mf, std::vector<float>& vf) {
      { A::name } -> std::convertible_to<const char*>;
      { a.compute_in_double } -> std::convertible_to<bool>;
      a.validate(c);
      { a.refresh(md, std::size_t{1}, vd, vd) } -> std::same_as<RootInverseStatus>;
      { a.refresh(mf, std::size_t{1}, vf, vf) } -> std::same_as<RootInverseStatus>;
    };
}  // namespace concepts

}  // namespace lather

#endif
