// SPDX-License-Identifier: Apache-2.0
/// \file
/// \brief Private. Host dense linear algebra for the eigenbasis and orthogonalization
/// preconditioners: Householder QR (LAPACK geqrf + orgqr), the SVD (gesvd) and a column-major
/// product through the host BLAS. Matrices are column-major `std::vector`s; every routine runs in
/// IEEE non-stop mode (lapack::NonStopFloatingPoint). LAPACK's work arrays are per-thread scratch
/// (impl::host_scratch), and the outputs the caller's vectors, resized: neither allocates once it
/// has held the size.
#ifndef LATHER_IMPL_BACKENDS_DENSE_HOST_HPP
#define LATHER_IMPL_BACKENDS_DENSE_HOST_HPP

#include <lather/impl/backends/lapack.hpp>
#include <lather/impl/host_scratch.hpp>
#include <lather/impl/kernels/matrix_functions.hpp>

#include <Kokkos_Core.hpp>

#include <algorithm>
#include <cstddef>
#include <type_traits>
#include <vector>

extern "C" {
void dgeqrf_(const int* m, const int* n, double* a, const int* lda, double* tau, double* work, const int* lwork,
             int* info);
void sgeqrf_(const int* m, const int* n, float* a, const int* lda, float* tau, float* work, const int* lwork,
             int* info);
void dorgqr_(const int* m, const int* n, const int* k, double* a, const int* lda, const double* tau, double* work,
             const int* lwork, int* info);
void sorgqr_(const int* m, const int* n, const int* k, float* a, const int* lda, const float* tau, float* work,
             const int* lwork, int* info);
void dgesvd_(const char* jobu, const char* jobvt, const int* m, const int* n, double* a, const int* lda, double* s,
             double* u, const int* ldu, double* vt, const int* ldvt, double* work, const int* lwork, int* info,
             std::size_t jobu_len, std::size_t jobvt_len);
void sgesvd_(const char* jobu, const char* jobvt, const int* m, const int* n, float* a, const int* lda, float* s,
             float* u, const int* ldu, float* vt, const int* ldvt, float* work, const int* lwork, int* info,
             std::size_t jobu_len, std::size_t jobvt_len);
}

namespace lather::impl::dense {

using lapack::lapack_int;

/// Owner tags of this file's scratch vectors (impl::host_scratch).
struct QrScratch {};
struct SvdScratch {};

/// C (m x n) = alpha op(A) op(B) + beta C, column-major, leading dimensions = row counts of the
/// stored matrices; the host BLAS through Kokkos Kernels.
template <class T>
void gemm(const char* ta, const char* tb, std::size_t m, std::size_t n, std::size_t k, T alpha, const T* a,
          const T* b, T beta, T* c) {
  using matrix = Kokkos::View<T**, Kokkos::LayoutLeft, Kokkos::Device<Kokkos::DefaultHostExecutionSpace, Kokkos::HostSpace>,
                              Kokkos::MemoryTraits<Kokkos::Unmanaged>>;
  using const_matrix = Kokkos::View<const T**, Kokkos::LayoutLeft,
                                    Kokkos::Device<Kokkos::DefaultHostExecutionSpace, Kokkos::HostSpace>,
                                    Kokkos::MemoryTraits<Kokkos::Unmanaged>>;
  const bool at = ta[0] == 'T', bt = tb[0] == 'T';
  const_matrix av(a, at ? k : m, at ? m : k), bv(b, bt ? n : k, bt ? k : n);
  impl::kernels::gemm(Kokkos::DefaultHostExecutionSpace(), ta, tb, alpha, av, bv, beta, matrix(c, m, n));
}

/// In place: a (n x n, column-major) becomes Q and r receives R (n x n, upper triangle, zeros
/// below) of a = QR (LAPACK's sign convention, as torch.linalg.qr). Returns LAPACK's info.
template <class T>
lapack_int qr(lapack_int n, std::vector<T>& a, std::vector<T>& r) {
  static_assert(std::is_same_v<T, double> || std::is_same_v<T, float>);
  if (n == 0) return 0;
  const lapack::NonStopFloatingPoint guard;
  auto& tau = host_scratch<T, QrScratch, 0>();
  auto& work = host_scratch<T, QrScratch, 1>();
  tau.resize(static_cast<std::size_t>(n));
  lapack_int info = 0, query = -1;
  T size{};
  if constexpr (std::is_same_v<T, double>) dgeqrf_(&n, &n, a.data(), &n, tau.data(), &size, &query, &info);
  else sgeqrf_(&n, &n, a.data(), &n, tau.data(), &size, &query, &info);
  if (info != 0) return info;
  lapack_int lwork = std::max<lapack_int>(static_cast<lapack_int>(size), n);
  work.resize(static_cast<std::size_t>(lwork));
  if constexpr (std::is_same_v<T, double>) dgeqrf_(&n, &n, a.data(), &n, tau.data(), work.data(), &lwork, &info);
  else sgeqrf_(&n, &n, a.data(), &n, tau.data(), work.data(), &lwork, &info);
  if (info != 0) return info;
  const auto un = static_cast<std::size_t>(n);
  r.assign(un * un, T(0));
  for (std::size_t j = 0; j < un; ++j)
    for (std::size_t i = 0; i <= j; ++i) r[i + j * un] = a[i + j * un];
  if constexpr (std::is_same_v<T, double>) dorgqr_(&n, &n, &n, a.data(), &n, tau.data(), &size, &query, &info);
  else sorgqr_(&n, &n, &n, a.data(), &n, tau.data(), &size, &query, &info);
  if (info != 0) return info;
  lwork = std::max<lapack_int>(static_cast<lapack_int>(size), n);
  work.assign(static_cast<std::size_t>(lwork), T(0));
  if constexpr (std::is_same_v<T, double>) dorgqr_(&n, &n, &n, a.data(), &n, tau.data(), work.data(), &lwork, &info);
  else sorgqr_(&n, &n, &n, a.data(), &n, tau.data(), work.data(), &lwork, &info);
  return info;
}

/// Thin SVD of a (m x n, column-major, destroyed): s (min(m, n)) descending, u (m x k), vt (k x n),
/// k = min(m, n). Returns LAPACK's info (> 0: not converged).
template <class T>
lapack_int svd(lapack_int m, lapack_int n, std::vector<T>& a, std::vector<T>& s, std::vector<T>& u,
               std::vector<T>& vt) {
  static_assert(std::is_same_v<T, double> || std::is_same_v<T, float>);
  const lapack_int k = std::min(m, n);
  s.assign(static_cast<std::size_t>(k), T(0));
  u.assign(static_cast<std::size_t>(m) * static_cast<std::size_t>(k), T(0));
  vt.assign(static_cast<std::size_t>(k) * static_cast<std::size_t>(n), T(0));
  if (k == 0) return 0;
  const lapack::NonStopFloatingPoint guard;
  const char job = 'S';
  lapack_int info = 0, query = -1;
  T size{};
  if constexpr (std::is_same_v<T, double>)
    dgesvd_(&job, &job, &m, &n, a.data(), &m, s.data(), u.data(), &m, vt.data(), &k, &size, &query, &info, 1, 1);
  else
    sgesvd_(&job, &job, &m, &n, a.data(), &m, s.data(), u.data(), &m, vt.data(), &k, &size, &query, &info, 1, 1);
  if (info != 0) return info;
  // The documented minimum, in case the float answer of the query rounded down.
  const lapack_int lwork = std::max<lapack_int>(static_cast<lapack_int>(size), std::max(3 * k + std::max(m, n), 5 * k));
  auto& work = host_scratch<T, SvdScratch, 0>();
  work.resize(static_cast<std::size_t>(lwork));
  if constexpr (std::is_same_v<T, double>)
    dgesvd_(&job, &job, &m, &n, a.data(), &m, s.data(), u.data(), &m, vt.data(), &k, work.data(), &lwork, &info, 1, 1);
  else
    sgesvd_(&job, &job, &m, &n, a.data(), &m, s.data(), u.data(), &m, vt.data(), &k, work.data(), &lwork, &info, 1, 1);
  return info;
}

}  // namespace lather::impl::dense

#endif
