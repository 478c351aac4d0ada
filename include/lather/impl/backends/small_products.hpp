// SPDX-License-Identifier: Apache-2.0
/// \file
/// \brief Private. SYRK and SYMM whose symmetric matrix has at most one vector register of rows
/// (16 floats, 8 doubles) and whose other dimension is long: the factor and the preconditioning
/// product of a block's short last dimension, as in the 3 x 3 convolutions' last dimension of 9
/// (a (256, 256, 9) block: a 9 x 9 factor summed over 65536 columns, 65536 columns multiplied by
/// its 9 x 9 inverse root). impl::blas::syrk and impl::blas::symm send these shapes here.
///
/// Why: OpenBLAS runs them at a fraction of its GEMM rate (on the Zen 5 VM, in cache: SYRK 'N'
/// with n = 9, k = 65536 at 20 GFLOP/s, SYMM 'L' with m = 9, n = 65536 at 51 GFLOP/s; 0.48 ms of
/// a resnet50 (256, 256, 9) block's 8.6 ms steady step), because its kernels block the short
/// dimension in register tiles it cannot fill. Here one column of the long dimension is one
/// register: the SYRK adds the column times each of its elements into one accumulator per column
/// of the result, the SYMM multiplies the inverse root's columns by the column's elements.
///
/// Where: CPUs with AVX-512 (the BLAS elsewhere; a plain loop of the same operations ran 1.4x
/// (SYRK) and 6x (SYMM) slower than OpenBLAS on the same shapes). The choice follows the CPU
/// alone, not the host loops' limit (host_simd.hpp's ScopedSimdLimit, for tests), like the
/// BLAS' own choice of kernels: every path of a process that forms these products gets the same
/// bits from the same function.
///
/// Bits and accuracy: products rounded, then added (explicit-rounding intrinsics: GCC does not
/// contract them into FMAs). The SYRK sums its columns in chunks of `chunk` (each chunk's sum
/// started from zero, then added to the total): rounding error bounded by about
/// (chunk + k / chunk) roundings instead of k, and S(i, j) and S(j, i) the same sum. The SYMM's
/// column c depends on column c of B alone, so splitting the columns over threads gives the same
/// bits.
#ifndef LATHER_IMPL_BACKENDS_SMALL_PRODUCTS_HPP
#define LATHER_IMPL_BACKENDS_SMALL_PRODUCTS_HPP

#include <lather/impl/kernels/host_simd.hpp>

#include <algorithm>
#include <cstdint>
#include <type_traits>

namespace lather::impl::blas::small {

/// Columns summed per chunk of the SYRK (about the square root of the longest sums it meets:
/// 65536 columns of a (256, 256, 9) block).
inline constexpr std::int64_t chunk = 256;

/// The largest symmetric dimension these loops take: one vector register of T.
template <class T>
inline constexpr std::int64_t max_dim = std::is_same_v<T, float> ? 16 : 8;

/// Whether syrk (trans 'N') or symm (side 'L') whose symmetric dimension is n runs here.
template <class T>
inline bool takes(std::int64_t n) {
#ifdef LATHER_HAS_AVX512_DISPATCH
  static const bool cpu = __builtin_cpu_supports("avx512f");
  return (std::is_same_v<T, float> || std::is_same_v<T, double>) && cpu && n >= 1 && n <= max_dim<T>;
#else
  (void)n;
  return false;
#endif
}

namespace detail {

#ifdef LATHER_HAS_AVX512_DISPATCH
template <class T>
struct Masked;
template <>
struct Masked<float> {
  using mask = __mmask16;
  LATHER_AVX512_FN static __m512 load(mask m, const float* x) { return _mm512_maskz_loadu_ps(m, x); }
  LATHER_AVX512_FN static void store(float* x, mask m, __m512 a) { _mm512_mask_storeu_ps(x, m, a); }
};
template <>
struct Masked<double> {
  using mask = __mmask8;
  LATHER_AVX512_FN static __m512d load(mask m, const double* x) { return _mm512_maskz_loadu_pd(m, x); }
  LATHER_AVX512_FN static void store(double* x, mask m, __m512d a) { _mm512_mask_storeu_pd(x, m, a); }
};

// S (D x D, column-major, full) = sum over the k columns a_c of a_c a_c^T: register j adds a_c
// times a_c[j], chunk by chunk. The columns come in runs of `run` columns lda apart, the runs
// run_stride apart (column c at a + (c / run) run_stride + (c % run) lda; run >= k: one run):
// the order of the sums does not depend on the runs. The lanes past D load zeros and are never
// stored.
template <class T, int D>
LATHER_AVX512_FN void gram_avx512(std::int64_t k, const T* a, std::int64_t lda, std::int64_t run,
                                  std::int64_t run_stride, T* s) {
  using V = kernels::simd_detail::Avx512<T>;
  using M = Masked<T>;
  const auto m = static_cast<typename M::mask>((1u << D) - 1u);
  typename V::reg total[D], part[D];
  for (int j = 0; j < D; ++j) total[j] = V::set1(T(0));
  const T* run_start = a;
  const T* col = a;
  std::int64_t left = run;  // columns left in the current run
  for (std::int64_t c0 = 0; c0 < k; c0 += chunk) {
    for (int j = 0; j < D; ++j) part[j] = V::set1(T(0));
    const std::int64_t c1 = std::min(k, c0 + chunk);
    for (std::int64_t c = c0; c < c1; ++c) {
      const auto v = M::load(m, col);
      for (int j = 0; j < D; ++j) part[j] = V::add(part[j], V::mul(v, V::set1(col[j])));
      col += lda;
      if (--left == 0) {
        run_start += run_stride;
        col = run_start;
        left = run;
      }
    }
    for (int j = 0; j < D; ++j) total[j] = V::add(total[j], part[j]);
  }
  for (int j = 0; j < D; ++j) M::store(s + j * D, m, total[j]);
}

// Y (D x n, column-major, ld D) = P B: column c of Y is sum_j P(:, j) b_c[j], the terms added
// from j = 0 on; four columns at a time (four independent chains of additions). p: P full,
// column-major, ld D.
template <class T, int D>
LATHER_AVX512_FN void symm_avx512(std::int64_t n, const T* p, const T* b, std::int64_t ldb, T* y) {
  using V = kernels::simd_detail::Avx512<T>;
  using M = Masked<T>;
  const auto m = static_cast<typename M::mask>((1u << D) - 1u);
  typename V::reg pc[D];
  for (int j = 0; j < D; ++j) pc[j] = M::load(m, p + j * D);
  constexpr int group = 4;
  std::int64_t c = 0;
  for (; c + group <= n; c += group) {
    typename V::reg out[group];
    for (int q = 0; q < group; ++q) out[q] = V::mul(pc[0], V::set1(b[(c + q) * ldb]));
    for (int j = 1; j < D; ++j)
      for (int q = 0; q < group; ++q) out[q] = V::add(out[q], V::mul(pc[j], V::set1(b[(c + q) * ldb + j])));
    for (int q = 0; q < group; ++q) M::store(y + (c + q) * D, m, out[q]);
  }
  for (; c < n; ++c) {
    auto out = V::mul(pc[0], V::set1(b[c * ldb]));
    for (int j = 1; j < D; ++j) out = V::add(out, V::mul(pc[j], V::set1(b[c * ldb + j])));
    M::store(y + c * D, m, out);
  }
}
#endif

// Never called where takes() is false: without AVX-512 dispatch they are empty.
template <class T, int D>
void gram(std::int64_t k, const T* a, std::int64_t lda, std::int64_t run, std::int64_t run_stride, T* s) {
#ifdef LATHER_HAS_AVX512_DISPATCH
  gram_avx512<T, D>(k, a, lda, run, run_stride, s);
#else
  (void)k, (void)a, (void)lda, (void)run, (void)run_stride, (void)s;
#endif
}
template <class T, int D>
void symm_columns(std::int64_t n, const T* p, const T* b, std::int64_t ldb, T* y) {
#ifdef LATHER_HAS_AVX512_DISPATCH
  symm_avx512<T, D>(n, p, b, ldb, y);
#else
  (void)n, (void)p, (void)b, (void)ldb, (void)y;
#endif
}

// f(std::integral_constant<int, D>) for the run-time n in [D, max_dim<T>].
template <class T, int D, class F>
void with_dim(std::int64_t n, const F& f) {
  if (n == D) f(std::integral_constant<int, D>{});
  else if constexpr (D < max_dim<T>) with_dim<T, D + 1>(n, f);
}

}  // namespace detail

/// syrk_n with A's k columns in runs of `run` columns lda apart, the runs `run_stride` apart
/// (column c at a + (c / run) run_stride + (c % run) lda): the last dimension of a block read
/// where it lies in its parameter (a (256, 256, 9) block of a (512, 512, 9) convolution: runs of
/// 256 columns of 9, 512 x 9 apart), with the same bits as syrk_n on the columns side by side.
template <class T>
void syrk_n_runs(char uplo, std::int64_t n, std::int64_t k, T alpha, const T* a, std::int64_t lda, std::int64_t run,
                 std::int64_t run_stride, T beta, T* c, std::int64_t ldc) {
  T s[max_dim<T> * max_dim<T>] = {};
  if (k > 0 && alpha != T(0))
    detail::with_dim<T, 1>(n, [&](auto d) { detail::gram<T, decltype(d)::value>(k, a, lda, run, run_stride, s); });
  const bool lower = uplo == 'L' || uplo == 'l';
  for (std::int64_t j = 0; j < n; ++j)
    for (std::int64_t i = lower ? j : 0; i < (lower ? n : j + 1); ++i) {
      T& out = c[i + j * ldc];
      const T sum = alpha * s[i + j * n];
      out = beta == T(0) ? sum : sum + beta * out;
    }
}

/// The `uplo` triangle of C (n x n, column-major, ldc) = alpha A A^T + beta C, A n x k column-major
/// (lda >= n): the BLAS' SYRK with trans 'N' for takes<T>(n). C is not read where beta is 0.
template <class T>
void syrk_n(char uplo, std::int64_t n, std::int64_t k, T alpha, const T* a, std::int64_t lda, T beta, T* c,
            std::int64_t ldc) {
  syrk_n_runs<T>(uplo, n, k, alpha, a, lda, std::max<std::int64_t>(k, 1), 0, beta, c, ldc);
}

/// C (m x n, column-major, ldc) = alpha A B + beta C, A (m x m) symmetric of which the `uplo`
/// triangle is read, B m x n (ldb): the BLAS' SYMM with side 'L' for takes<T>(m). C is not read
/// where beta is 0. Each column of C depends on its column of B alone: splitting the columns
/// over threads gives the same bits.
template <class T>
void symm_left(char uplo, std::int64_t m, std::int64_t n, T alpha, const T* a, std::int64_t lda, const T* b,
               std::int64_t ldb, T beta, T* c, std::int64_t ldc) {
  T p[max_dim<T> * max_dim<T>];
  const bool lower = uplo == 'L' || uplo == 'l';
  for (std::int64_t j = 0; j < m; ++j)
    for (std::int64_t i = 0; i < m; ++i) p[i + j * m] = (lower == (i >= j)) ? a[i + j * lda] : a[j + i * lda];
  // Straight into C where nothing is to be combined, else through a buffer of columns.
  const bool direct = alpha == T(1) && beta == T(0) && ldc == m;
  constexpr std::int64_t batch = 512;
  T buffer[batch * max_dim<T>];
  for (std::int64_t c0 = 0; c0 < n; c0 += batch) {
    const std::int64_t cols = std::min(batch, n - c0);
    T* y = direct ? c + c0 * ldc : buffer;
    detail::with_dim<T, 1>(m, [&](auto d) { detail::symm_columns<T, decltype(d)::value>(cols, p, b + c0 * ldb, ldb, y); });
    if (direct) continue;
    for (std::int64_t q = 0; q < cols; ++q)
      for (std::int64_t i = 0; i < m; ++i) {
        T& out = c[i + (c0 + q) * ldc];
        const T v = alpha * y[i + q * m];
        out = beta == T(0) ? v : v + beta * out;
      }
  }
}

}  // namespace lather::impl::blas::small

#endif
