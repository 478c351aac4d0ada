// SPDX-License-Identifier: Apache-2.0
/// \file
/// \brief Private. The few Fortran LAPACK routines lather calls, declared by hand (lather links
/// `LAPACK::LAPACK`; no LAPACK header is required), plus a guard that gives LAPACK the IEEE
/// non-stop floating-point environment it assumes.
///
/// The declarations follow reference LAPACK's `lapack.h` with `LAPACK_FORTRAN_STRLEN_END` (the
/// gfortran convention: hidden `size_t` lengths of the character arguments at the end) and a
/// 32-bit `int` as `lapack_int` (LP64 LAPACK, e.g. OpenBLAS, reference LAPACK, MKL's lp64
/// interface). An ILP64 LAPACK is not supported.
#ifndef LATHER_IMPL_BACKENDS_LAPACK_HPP
#define LATHER_IMPL_BACKENDS_LAPACK_HPP

#include <algorithm>
#include <cfenv>
#include <cstddef>
#include <type_traits>
#include <vector>

extern "C" {
/// Eigenvalues (ascending) and eigenvectors of a real symmetric matrix, divide and conquer.
void dsyevd_(const char* jobz, const char* uplo, const int* n, double* a, const int* lda, double* w,
             double* work, const int* lwork, int* iwork, const int* liwork, int* info, std::size_t jobz_len,
             std::size_t uplo_len);
/// Single-precision dsyevd_.
void ssyevd_(const char* jobz, const char* uplo, const int* n, float* a, const int* lda, float* w,
             float* work, const int* lwork, int* iwork, const int* liwork, int* info, std::size_t jobz_len,
             std::size_t uplo_len);
}

namespace lather::impl::lapack {

using lapack_int = int;

/// \brief While alive, the calling thread runs in IEEE non-stop mode (no floating-point traps,
/// status flags cleared); the previous environment, traps included, is restored on destruction
/// without raising the flags LAPACK set. LAPACK relies on IEEE special values internally
/// (ILAENV's IEEE check), so a caller that traps FE_INVALID or FE_DIVBYZERO must not see them.
class NonStopFloatingPoint {
 public:
  NonStopFloatingPoint() noexcept { m_saved = std::feholdexcept(&m_env) == 0; }
  ~NonStopFloatingPoint() {
    if (m_saved) std::fesetenv(&m_env);
  }
  NonStopFloatingPoint(const NonStopFloatingPoint&) = delete;
  NonStopFloatingPoint& operator=(const NonStopFloatingPoint&) = delete;

 private:
  std::fenv_t m_env{};
  bool m_saved = false;
};

namespace detail {
template <class T>
void call_syevd(const lapack_int* n, T* a, T* w, T* work, const lapack_int* lwork, lapack_int* iwork,
                const lapack_int* liwork, lapack_int* info) {
  const char jobz = 'V', uplo = 'L';
  if constexpr (std::is_same_v<T, double>) {
    dsyevd_(&jobz, &uplo, n, a, n, w, work, lwork, iwork, liwork, info, 1, 1);
  } else {
    ssyevd_(&jobz, &uplo, n, a, n, w, work, lwork, iwork, liwork, info, 1, 1);
  }
}
}  // namespace detail

/// Symmetric eigendecomposition in place: on return `a` (column-major, n x n, lower triangle
/// read) holds the eigenvectors as columns and `w` the eigenvalues in ascending order. Returns
/// LAPACK's `info` (0 on success; > 0: the algorithm failed to converge). Allocates its workspace.
/// Runs in IEEE non-stop mode (NonStopFloatingPoint).
template <class T>
lapack_int syevd(lapack_int n, T* a, T* w) {
  static_assert(std::is_same_v<T, double> || std::is_same_v<T, float>, "syevd: float or double");
  if (n == 0) return 0;
  const NonStopFloatingPoint guard;
  lapack_int info = 0;
  // Workspace query.
  T work_size{};
  lapack_int iwork_size = 0;
  const lapack_int query = -1;
  detail::call_syevd<T>(&n, a, w, &work_size, &query, &iwork_size, &query, &info);
  if (info != 0) return info;
  // The query's answer can round down when stored in a float: never ask for less than the
  // documented minimum (1 + 6n + 2n^2 and 3 + 5n for jobz = 'V').
  const lapack_int lwork_min = 1 + 6 * n + 2 * n * n;
  const lapack_int lwork =
      static_cast<lapack_int>(work_size) > lwork_min ? static_cast<lapack_int>(work_size) : lwork_min;
  const lapack_int liwork = iwork_size > 3 + 5 * n ? iwork_size : 3 + 5 * n;
  std::vector<T> work(static_cast<std::size_t>(lwork));
  std::vector<lapack_int> iwork(static_cast<std::size_t>(liwork));
  // OpenBLAS 0.3.21's SSE3 symv kernel (ssymv_L_PRESCOTT, reached through ssytrd) reads up to
  // 16 bytes past the end of the matrix. Harmless with glibc's heap, but it crashed under
  // AddressSanitizer, whose allocator can end a block at an unmapped page: work on a copy with
  // 64 bytes of slack (O(n^2), next to the O(n^3) decomposition).
  const auto nn = static_cast<std::size_t>(n) * static_cast<std::size_t>(n);
  std::vector<T> matrix(nn + 64 / sizeof(T));
  std::copy(a, a + nn, matrix.begin());
  detail::call_syevd<T>(&n, matrix.data(), w, work.data(), &lwork, iwork.data(), &liwork, &info);
  std::copy(matrix.begin(), matrix.begin() + static_cast<std::ptrdiff_t>(nn), a);
  return info;
}

}  // namespace lather::impl::lapack

#endif
