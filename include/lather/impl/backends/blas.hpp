// SPDX-License-Identifier: Apache-2.0
/// \file
/// \brief Private. The host BLAS routines lather calls directly (GEMM, SYRK, SYMM, SPMV), declared by hand
/// like the LAPACK ones (lather links `LAPACK::LAPACK`, which brings the BLAS), and the dispatch
/// that sends host-resident products to them instead of through `KokkosBlas::gemm`.
///
/// Why not always `KokkosBlas::gemm`: on the host it builds profiling label strings on every call
/// (heap allocations in every optimizer step), it sends `LayoutRight` operands to Kokkos Kernels'
/// own unblocked kernel instead of the vendor BLAS (coupled Newton was 4-8x slower than it needed
/// to be), and Kokkos Kernels has no SYRK, so `G G^T` cost a full product. Device data keeps
/// going through Kokkos Kernels (cuBLAS / rocBLAS where enabled).
#ifndef LATHER_IMPL_BACKENDS_BLAS_HPP
#define LATHER_IMPL_BACKENDS_BLAS_HPP

#include <Kokkos_Core.hpp>

#include <lather/impl/backends/small_products.hpp>
#include <lather/impl/backends/tiled_symm.hpp>
#include <lather/impl/backends/tiled_syrk.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <type_traits>

extern "C" {
void sgemm_(const char* ta, const char* tb, const int* m, const int* n, const int* k, const float* alpha,
            const float* a, const int* lda, const float* b, const int* ldb, const float* beta, float* c,
            const int* ldc, std::size_t ta_len, std::size_t tb_len);
void dgemm_(const char* ta, const char* tb, const int* m, const int* n, const int* k, const double* alpha,
            const double* a, const int* lda, const double* b, const int* ldb, const double* beta, double* c,
            const int* ldc, std::size_t ta_len, std::size_t tb_len);
void ssyrk_(const char* uplo, const char* trans, const int* n, const int* k, const float* alpha, const float* a,
            const int* lda, const float* beta, float* c, const int* ldc, std::size_t uplo_len, std::size_t trans_len);
void dsyrk_(const char* uplo, const char* trans, const int* n, const int* k, const double* alpha, const double* a,
            const int* lda, const double* beta, double* c, const int* ldc, std::size_t uplo_len,
            std::size_t trans_len);
void ssymm_(const char* side, const char* uplo, const int* m, const int* n, const float* alpha, const float* a,
            const int* lda, const float* b, const int* ldb, const float* beta, float* c, const int* ldc,
            std::size_t side_len, std::size_t uplo_len);
void dsymm_(const char* side, const char* uplo, const int* m, const int* n, const double* alpha, const double* a,
            const int* lda, const double* b, const int* ldb, const double* beta, double* c, const int* ldc,
            std::size_t side_len, std::size_t uplo_len);
void sspmv_(const char* uplo, const int* n, const float* alpha, const float* ap, const float* x, const int* incx,
            const float* beta, float* y, const int* incy, std::size_t uplo_len);
void dspmv_(const char* uplo, const int* n, const double* alpha, const double* ap, const double* x, const int* incx,
            const double* beta, double* y, const int* incy, std::size_t uplo_len);
}

// OpenBLAS' thread control, found at run time: weak, so that lather links against any BLAS
// (the symbols are null where the BLAS is not OpenBLAS). Host-only builds with GCC/Clang.
#if defined(__GNUC__) && !defined(KOKKOS_ENABLE_CUDA) && !defined(KOKKOS_ENABLE_HIP) && !defined(KOKKOS_ENABLE_SYCL)
#define LATHER_HAS_BLAS_THREAD_CONTROL 1
extern "C" {
int openblas_get_num_threads(void) __attribute__((weak));
void openblas_set_num_threads(int) __attribute__((weak));
}
#endif

namespace lather::impl::blas {

/// \brief While alive, OpenBLAS runs single-threaded (its previous thread count is restored on
/// destruction): for products that lather itself runs side by side on several threads.
/// `active()` is false where the BLAS offers no such control (not OpenBLAS, or a GPU build), and
/// then nothing is changed. The setting is process-wide for the guard's lifetime.
class SingleThreaded {
 public:
  SingleThreaded() {
#ifdef LATHER_HAS_BLAS_THREAD_CONTROL
    if (openblas_get_num_threads != nullptr && openblas_set_num_threads != nullptr) {
      m_previous = openblas_get_num_threads();
      if (m_previous > 1) openblas_set_num_threads(1);
      m_active = true;
    }
#endif
  }
  ~SingleThreaded() {
#ifdef LATHER_HAS_BLAS_THREAD_CONTROL
    if (m_active && m_previous > 1) openblas_set_num_threads(m_previous);
#endif
  }
  SingleThreaded(const SingleThreaded&) = delete;
  SingleThreaded& operator=(const SingleThreaded&) = delete;
  [[nodiscard]] bool active() const { return m_active; }
  /// Whether the BLAS lets its thread count be set (what active() will say).
  [[nodiscard]] static bool available() {
#ifdef LATHER_HAS_BLAS_THREAD_CONTROL
    return openblas_get_num_threads != nullptr && openblas_set_num_threads != nullptr;
#else
    return false;
#endif
  }

 private:
  int m_previous = 1;
  bool m_active = false;
};


/// float or double: what the Fortran BLAS takes.
template <class T>
inline constexpr bool is_blas_scalar = std::is_same_v<T, float> || std::is_same_v<T, double>;

/// Every dimension and leading dimension must fit the LP64 BLAS' 32-bit int.
inline bool fits_int(std::int64_t v) { return v >= 0 && v <= std::numeric_limits<int>::max(); }

/// C (m x n) = alpha op(A) op(B) + beta C, column-major with leading dimensions; the host BLAS.
template <class T>
void gemm(char ta, char tb, std::int64_t m, std::int64_t n, std::int64_t k, T alpha, const T* a, std::int64_t lda,
          const T* b, std::int64_t ldb, T beta, T* c, std::int64_t ldc) {
  static_assert(is_blas_scalar<T>);
  if (m == 0 || n == 0) return;
  const int im = static_cast<int>(m), in = static_cast<int>(n), ik = static_cast<int>(k);
  const int ia = static_cast<int>(lda), ib = static_cast<int>(ldb), ic = static_cast<int>(ldc);
  if constexpr (std::is_same_v<T, double>) dgemm_(&ta, &tb, &im, &in, &ik, &alpha, a, &ia, b, &ib, &beta, c, &ic, 1, 1);
  else sgemm_(&ta, &tb, &im, &in, &ik, &alpha, a, &ia, b, &ib, &beta, c, &ic, 1, 1);
}

/// The `uplo` triangle of C (n x n) = alpha op(A) op(A)^T + beta C, op(A) n x k (`trans` 'N': A
/// is n x k; 'T': A is k x n), column-major; the other triangle is not touched. 'N' on AVX-512
/// CPUs runs lather's own loops: n at most a vector register (16 floats, 8 doubles) in
/// small_products.hpp (OpenBLAS runs that shape at a sixth of its GEMM rate), n from there to
/// 1024 in tiled_syrk.hpp (1.0-4.1x OpenBLAS' SkylakeX SSYRK, 1.3-4.2x its Haswell one); floats
/// with 'T' there too, through a transposition.
template <class T>
void syrk(char uplo, char trans, std::int64_t n, std::int64_t k, T alpha, const T* a, std::int64_t lda, T beta, T* c,
          std::int64_t ldc) {
  static_assert(is_blas_scalar<T>);
  if (n == 0) return;
  if ((trans == 'N' || trans == 'n') && small::takes<T>(n)) {
    small::syrk_n<T>(uplo, n, k, alpha, a, lda, beta, c, ldc);
    return;
  }
  if ((trans == 'N' || trans == 'n') && tiled::takes<T>(n, k, alpha)) {
    tiled::syrk_n<T>(uplo, n, k, alpha, a, lda, beta, c, ldc);
    return;
  }
  if ((trans == 'T' || trans == 't') && tiled::takes_transposed<T>(n, k, alpha)) {
    tiled::syrk_t<T>(uplo, n, k, alpha, a, lda, beta, c, ldc);
    return;
  }
  const int in = static_cast<int>(n), ik = static_cast<int>(k), ia = static_cast<int>(lda), ic = static_cast<int>(ldc);
  if constexpr (std::is_same_v<T, double>) dsyrk_(&uplo, &trans, &in, &ik, &alpha, a, &ia, &beta, c, &ic, 1, 1);
  else ssyrk_(&uplo, &trans, &in, &ik, &alpha, a, &ia, &beta, c, &ic, 1, 1);
}

/// C (m x n) = alpha A B + beta C (`side` 'L', A m x m) or alpha B A + beta C (`side` 'R', A n x n),
/// A symmetric of which only the `uplo` triangle is read; column-major. Lets a packed symmetric
/// matrix be unpacked into one triangle only (contiguous) instead of both. Side 'L' with m at
/// most a vector register runs lather's own loop (small_products.hpp); on AVX-512 CPUs side 'R'
/// with n from 17 (floats; 9 doubles) to 256, and side 'L' with m from 17 to 256 (floats), lather's
/// register tiles (tiled_symm.hpp).
template <class T>
void symm(char side, char uplo, std::int64_t m, std::int64_t n, T alpha, const T* a, std::int64_t lda, const T* b,
          std::int64_t ldb, T beta, T* c, std::int64_t ldc) {
  static_assert(is_blas_scalar<T>);
  if (m == 0 || n == 0) return;
  if ((side == 'L' || side == 'l') && small::takes<T>(m)) {
    small::symm_left<T>(uplo, m, n, alpha, a, lda, b, ldb, beta, c, ldc);
    return;
  }
  if ((side == 'L' || side == 'l') && tiled::takes_symm_left<T>(m, n, alpha)) {
    tiled::symm_left<T>(uplo, m, n, alpha, a, lda, b, ldb, beta, c, ldc);
    return;
  }
  if ((side == 'R' || side == 'r') && tiled::takes_symm_right<T>(m, n, alpha)) {
    tiled::symm_right<T>(uplo, m, n, alpha, a, lda, b, ldb, beta, c, ldc);
    return;
  }
  const int im = static_cast<int>(m), in = static_cast<int>(n);
  const int ia = static_cast<int>(lda), ib = static_cast<int>(ldb), ic = static_cast<int>(ldc);
  if constexpr (std::is_same_v<T, double>) dsymm_(&side, &uplo, &im, &in, &alpha, a, &ia, b, &ib, &beta, c, &ic, 1, 1);
  else ssymm_(&side, &uplo, &im, &in, &alpha, a, &ia, b, &ib, &beta, c, &ic, 1, 1);
}

/// y = alpha A x + beta y, A (n x n) symmetric in `uplo`-packed column-major storage (`ap`, n (n + 1) / 2
/// elements; 'L' packs the lower triangle column by column, which is the row-major upper triangle
/// DistributedShampoo packs); contiguous vectors. Reads the packed matrix once: what a
/// one-dimensional block's preconditioning needs (a SYMM with one row unpacked and copied the whole
/// matrix for a matrix-vector product). Multi-threaded OpenBLAS sums per-thread partial vectors,
/// so callers that must agree with a single-threaded call hold impl::blas::SingleThreaded.
template <class T>
void spmv(char uplo, std::int64_t n, T alpha, const T* ap, const T* x, T beta, T* y) {
  static_assert(is_blas_scalar<T>);
  if (n == 0) return;
  const int in = static_cast<int>(n), one = 1;
  if constexpr (std::is_same_v<T, double>) dspmv_(&uplo, &in, &alpha, ap, x, &one, &beta, y, &one, 1);
  else sspmv_(&uplo, &in, &alpha, ap, x, &one, &beta, y, &one, 1);
}

/// \brief A rank-2 View seen as column-major storage: `data` with leading dimension `ld` holds
/// the matrix itself (`transposed` false: a LayoutLeft-like View) or its transpose (`transposed`
/// true: a LayoutRight-like View). `ok` is false for strides the BLAS cannot take.
template <class T>
struct ColumnMajor {
  T* data = nullptr;
  std::int64_t ld = 1;
  bool transposed = false;
  bool ok = false;
};

template <class V>
ColumnMajor<typename V::value_type> column_major(const V& v) {
  ColumnMajor<typename V::value_type> r;
  r.data = v.data();
  const auto rows = static_cast<std::int64_t>(v.extent(0)), cols = static_cast<std::int64_t>(v.extent(1));
  const auto s0 = static_cast<std::int64_t>(v.stride(0)), s1 = static_cast<std::int64_t>(v.stride(1));
  if (rows == 0 || cols == 0) {  // nothing is read or written; BLAS only checks ld >= max(1, rows)
    r.ld = std::max<std::int64_t>(1, rows);
    r.ok = fits_int(rows) && fits_int(cols);
    return r;
  }
  // A single row or column has one meaningful stride; its leading dimension only has to be
  // large enough for BLAS' argument check.
  if (s0 == 1 || rows <= 1) {
    r.ld = cols <= 1 ? std::max<std::int64_t>(1, rows) : s1;
    r.ok = r.ld >= std::max<std::int64_t>(1, rows);
  }
  if (!r.ok && (s1 == 1 || cols <= 1)) {
    r.transposed = true;
    r.ld = rows <= 1 ? std::max<std::int64_t>(1, cols) : s0;
    r.ok = r.ld >= std::max<std::int64_t>(1, cols);
  }
  r.ok = r.ok && fits_int(r.ld) && fits_int(rows) && fits_int(cols);
  return r;
}

/// True when the product of these Views may run in the host BLAS: host-resident float/double
/// data used by a host execution space (device data goes through Kokkos Kernels).
template <class ExecSpace, class AV, class BV, class CV>
inline constexpr bool host_blas_eligible =
    is_blas_scalar<typename CV::non_const_value_type> &&
    std::is_same_v<typename AV::non_const_value_type, typename CV::non_const_value_type> &&
    std::is_same_v<typename BV::non_const_value_type, typename CV::non_const_value_type> &&
    Kokkos::SpaceAccessibility<ExecSpace, Kokkos::HostSpace>::accessible &&
    Kokkos::SpaceAccessibility<Kokkos::HostSpace, typename AV::memory_space>::accessible &&
    Kokkos::SpaceAccessibility<Kokkos::HostSpace, typename BV::memory_space>::accessible &&
    Kokkos::SpaceAccessibility<Kokkos::HostSpace, typename CV::memory_space>::accessible;

/// \brief C = alpha op(A) op(B) + beta C on rank-2 host Views of any contiguous-stride layout,
/// in the host BLAS. Returns false (nothing done) when a stride or size does not suit it.
template <class AV, class BV, class CV>
bool gemm_views(char ta, char tb, typename CV::non_const_value_type alpha, const AV& a, const BV& b,
                typename CV::non_const_value_type beta, const CV& c) {
  using T = typename CV::non_const_value_type;
  const auto ca = column_major(a), cb = column_major(b);
  const auto cc = column_major(c);
  if (!ca.ok || !cb.ok || !cc.ok) return false;
  const bool at = ta == 'T' || ta == 't' || ta == 'C' || ta == 'c';
  const bool bt = tb == 'T' || tb == 't' || tb == 'C' || tb == 'c';
  const auto m = static_cast<std::int64_t>(c.extent(0)), n = static_cast<std::int64_t>(c.extent(1));
  const auto k = static_cast<std::int64_t>(at ? a.extent(0) : a.extent(1));
  if (!fits_int(k)) return false;
  // op(A) in terms of A's column-major storage: transposing storage flips the op.
  const char oa = (at != ca.transposed) ? 'T' : 'N', ob = (bt != cb.transposed) ? 'T' : 'N';
  if (!cc.transposed) {
    gemm<T>(oa, ob, m, n, k, alpha, ca.data, ca.ld, cb.data, cb.ld, beta, cc.data, cc.ld);
  } else {
    // Row-major C: its storage is C^T = op(B)^T op(A)^T.
    gemm<T>(ob == 'T' ? 'N' : 'T', oa == 'T' ? 'N' : 'T', n, m, k, alpha, cb.data, cb.ld, ca.data, ca.ld, beta,
            cc.data, cc.ld);
  }
  return true;
}

}  // namespace lather::impl::blas

#endif
