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
#include <cstdint>
#include <limits>
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
/// Singular value decomposition of a general matrix, divide and conquer.
void dgesdd_(const char* jobz, const int* m, const int* n, double* a, const int* lda, double* s, double* u,
             const int* ldu, double* vt, const int* ldvt, double* work, const int* lwork, int* iwork,
             int* info, std::size_t jobz_len);
/// Single-precision dgesdd_.
void sgesdd_(const char* jobz, const int* m, const int* n, float* a, const int* lda, float* s, float* u,
             const int* ldu, float* vt, const int* ldvt, float* work, const int* lwork, int* iwork, int* info,
             std::size_t jobz_len);
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

template <class T>
struct SyevdWorkspace {
  std::vector<T> work, matrix;
  std::vector<lapack_int> iwork;
};
template <class T>
SyevdWorkspace<T>& syevd_workspace() {
  thread_local SyevdWorkspace<T> w;
  return w;
}

// gesdd's arrays, kept per thread like syevd's: GaLore's projector refreshes would otherwise
// allocate five arrays per SVD (a refresh step must not allocate after the first).
template <class T>
struct GesddWorkspace {
  std::vector<T> work, matrix, left, right;
  std::vector<lapack_int> iwork;
};
template <class T>
GesddWorkspace<T>& gesdd_workspace() {
  thread_local GesddWorkspace<T> w;
  return w;
}

template <class T>
void call_gesdd(const lapack_int* m, const lapack_int* n, T* a, T* s, T* u, const lapack_int* ldvt, T* vt,
                T* work, const lapack_int* lwork, lapack_int* iwork, lapack_int* info) {
  const char jobz = 'S';
  if constexpr (std::is_same_v<T, double>) {
    dgesdd_(&jobz, m, n, a, m, s, u, m, vt, ldvt, work, lwork, iwork, info, 1);
  } else {
    sgesdd_(&jobz, m, n, a, m, s, u, m, vt, ldvt, work, lwork, iwork, info, 1);
  }
}
}  // namespace detail

/// Symmetric eigendecomposition in place: on return `a` (column-major, n x n, lower triangle
/// read) holds the eigenvectors as columns and `w` the eigenvalues in ascending order. Returns
/// LAPACK's `info` (0 on success; > 0: the algorithm failed to converge). Its workspace is kept per
/// thread (grown to the largest n seen), so repeated calls do not allocate. Runs in IEEE non-stop
/// mode (NonStopFloatingPoint).
/// This thread's syevd work arrays grown for n x n matrices (syevd then allocates nothing for
/// them); lwork, liwork and info as LAPACK's workspace query gives them.
template <class T>
detail::SyevdWorkspace<T>& syevd_reserve(lapack_int n, lapack_int& lwork, lapack_int& liwork, lapack_int& info) {
  auto& ws = detail::syevd_workspace<T>();
  // Workspace query (A and W are not read).
  T work_size{}, dummy{};
  lapack_int iwork_size = 0;
  const lapack_int query = -1;
  detail::call_syevd<T>(&n, &dummy, &dummy, &work_size, &query, &iwork_size, &query, &info);
  if (info != 0) return ws;
  // The query's answer can round down when stored in a float: never ask for less than the
  // documented minimum (1 + 6n + 2n^2 and 3 + 5n for jobz = 'V').
  const lapack_int lwork_min = 1 + 6 * n + 2 * n * n;
  lwork = static_cast<lapack_int>(work_size) > lwork_min ? static_cast<lapack_int>(work_size) : lwork_min;
  liwork = iwork_size > 3 + 5 * n ? iwork_size : 3 + 5 * n;
  // Work arrays kept per thread and grown to the largest n seen: fresh multi-megabyte blocks on
  // every call page-fault (up to 2x the decomposition's own time at n >= 512 on this project's
  // machine), and a root step must not allocate after the first.
  if (ws.work.size() < static_cast<std::size_t>(lwork)) ws.work.resize(static_cast<std::size_t>(lwork));
  if (ws.iwork.size() < static_cast<std::size_t>(liwork)) ws.iwork.resize(static_cast<std::size_t>(liwork));
  // OpenBLAS 0.3.21's SSE3 symv kernel (ssymv_L_PRESCOTT, reached through ssytrd) reads up to
  // 16 bytes past the end of the matrix. Harmless with glibc's heap, but it crashed under
  // AddressSanitizer, whose allocator can end a block at an unmapped page: work on a copy with
  // 64 bytes of slack (O(n^2), next to the O(n^3) decomposition).
  const auto nn = static_cast<std::size_t>(n) * static_cast<std::size_t>(n);
  if (ws.matrix.size() < nn + 64 / sizeof(T)) ws.matrix.resize(nn + 64 / sizeof(T));
  return ws;
}

template <class T>
lapack_int syevd(lapack_int n, T* a, T* w) {
  static_assert(std::is_same_v<T, double> || std::is_same_v<T, float>, "syevd: float or double");
  if (n == 0) return 0;
  const NonStopFloatingPoint guard;
  lapack_int info = 0, lwork = 0, liwork = 0;
  auto& ws = syevd_reserve<T>(n, lwork, liwork, info);
  if (info != 0) return info;
  const auto nn = static_cast<std::size_t>(n) * static_cast<std::size_t>(n);
  std::copy(a, a + nn, ws.matrix.begin());
  detail::call_syevd<T>(&n, ws.matrix.data(), w, ws.work.data(), &lwork, ws.iwork.data(), &liwork, &info);
  std::copy(ws.matrix.begin(), ws.matrix.begin() + static_cast<std::ptrdiff_t>(nn), a);
  return info;
}

/// Frees the calling thread's gesdd arrays (see gesdd); the next call allocates them again.
template <class T>
void release_gesdd_workspace() {
  detail::gesdd_workspace<T>() = detail::GesddWorkspace<T>{};
}

/// Thin SVD (jobz = 'S'), k = min(m, n): a (column-major, m x n) = u diag(s) vt with s (k)
/// descending, u (column-major, m x k) and vt (column-major, k x n). `a` is only read (LAPACK
/// destroys a padded copy). Returns LAPACK's `info` (0 on success; > 0: not converged; -4: a has a
/// NaN entry; -12: the workspace would exceed a 32-bit LAPACK's range). Its arrays are kept per
/// thread (grown to the largest sizes seen), so repeated calls of a size do not allocate. Runs in
/// IEEE non-stop mode.
template <class T>
lapack_int gesdd(lapack_int m, lapack_int n, const T* a, T* s, T* u, T* vt) {
  static_assert(std::is_same_v<T, double> || std::is_same_v<T, float>, "gesdd: float or double");
  const lapack_int k = std::min(m, n);
  if (k <= 0) return 0;
  const NonStopFloatingPoint guard;
  lapack_int info = 0;
  auto& ws = detail::gesdd_workspace<T>();
  // Work on copies with 64 bytes of slack, as syevd does: OpenBLAS' level-2 kernels can read a
  // few bytes past a matrix's end (seen under AddressSanitizer in symv). O(mn), next to O(mnk).
  const std::size_t slack = 64 / sizeof(T), um = static_cast<std::size_t>(m),
                    un = static_cast<std::size_t>(n), uk = static_cast<std::size_t>(k);
  const auto grow = [](auto& v, std::size_t size) {
    if (v.size() < size) v.resize(size);
  };
  grow(ws.iwork, 8 * uk);
  grow(ws.matrix, um * un + slack);
  grow(ws.left, um * uk + slack);
  grow(ws.right, uk * un + slack);
  std::copy(a, a + um * un, ws.matrix.begin());
  // Workspace query (reads nothing but the sizes).
  T work_size{};
  const lapack_int query = -1;
  detail::call_gesdd<T>(&m, &n, ws.matrix.data(), s, ws.left.data(), &k, ws.right.data(), &work_size, &query,
                        ws.iwork.data(), &info);
  if (info != 0) return info;
  // Never less than the documented minimum for jobz = 'S' (LAPACK 3.7+: k(6 + 4k) + max(m, n);
  // older: 3k + max(max(m, n), 4k^2 + 4k)), in case the float answer of the query rounded down.
  const std::int64_t mn = k, mx = std::max(m, n);
  const std::int64_t lwork_min =
      std::max(mn * (6 + 4 * mn) + mx, 3 * mn + std::max(mx, 4 * mn * mn + 4 * mn));
  const std::int64_t lwork_wide = std::max(static_cast<std::int64_t>(work_size), lwork_min);
  if (lwork_wide > std::numeric_limits<lapack_int>::max()) return -12;
  const auto lwork = static_cast<lapack_int>(lwork_wide);
  grow(ws.work, static_cast<std::size_t>(lwork));
  detail::call_gesdd<T>(&m, &n, ws.matrix.data(), s, ws.left.data(), &k, ws.right.data(), ws.work.data(), &lwork,
                        ws.iwork.data(), &info);
  std::copy(ws.left.begin(), ws.left.begin() + static_cast<std::ptrdiff_t>(um * uk), u);
  std::copy(ws.right.begin(), ws.right.begin() + static_cast<std::ptrdiff_t>(uk * un), vt);
  return info;
}

}  // namespace lather::impl::lapack

#endif
