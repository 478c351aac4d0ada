// SPDX-License-Identifier: Apache-2.0
/// \file
/// \brief Private. SYMM with side 'R' (C = alpha B A + beta C, A d x d symmetric of which one
/// triangle is read, B m x d, column-major) for 17 <= d <= 256 floats or doubles on AVX-512 CPUs:
/// the register tiles of tiled_syrk.hpp (3 vectors of rows of C by 8 columns), B's rows read
/// where they are, A's elements broadcast from its stored triangle. impl::blas::symm sends these
/// shapes here.
///
/// Why: a block's first-dimension preconditioning product is this SYMM (the column-major view
/// of a row-major block times the inverse root of its first dimension), and OpenBLAS 0.3.21
/// spends a tenth of it packing the triangle (ssymm_outcopy and sgemm_itcopy: 2.8% of a steady
/// gpt2-block step at block size 256, SkylakeX kernels): a (256 x 256) block by a 256 x 256
/// inverse root on the Zen 5 VM, 1 thread, took 152 us in cache (220 GFLOP/s; SGEMM 1024: 246)
/// and 153 us with the inverse root from memory; here 144 and 148 us. The broadcast operand is where a
/// symmetric matrix stored as one triangle costs nothing: element (p, j) is one scalar load
/// from either triangle position, and the 8 columns of a tile read 8 columns (or 8 elements of
/// one column) of the stored triangle, which stay in L1 over the steps of p. (The other side,
/// C = A B, would need A's columns as vectors: half of them are rows of the stored triangle,
/// strided; it stays with the BLAS.) Larger d: the tiles read a 48-row panel of B whose
/// columns no longer fit L1 (d = 512: 219 GFLOP/s against OpenBLAS' 232); they stay with the
/// BLAS.
///
/// Bits: C(i, j) is alpha times one chain of FMAs over p = 0, 1, ..., d - 1 (plus beta C; C is
/// not read where beta is 0) - independent of the tile the element falls in and of how the rows
/// are split over threads (blas::split::symm). Not necessarily the BLAS' bits (the same in most
/// shapes compared, whose k OpenBLAS' kernel also sums in order). The choice follows the CPU
/// alone, like tiled_syrk.hpp's.
#ifndef LATHER_IMPL_BACKENDS_TILED_SYMM_HPP
#define LATHER_IMPL_BACKENDS_TILED_SYMM_HPP

#include <lather/impl/backends/tiled_syrk.hpp>

#include <algorithm>
#include <cstdint>
#include <type_traits>

namespace lather::impl::blas::tiled {

/// The shapes measured faster than OpenBLAS' SYMM (SkylakeX kernels, 1 thread, A from memory,
/// B in cache): symmetric dimensions d from min_dim<T> (tiled_syrk.hpp's; below, OpenBLAS or
/// small_products.hpp) to 256; for floats with d above 128 only up to m = 1024 rows of C, where
/// OpenBLAS' packing is spread over enough rows (d = 256: 231 against 221 GFLOP/s at m = 256,
/// alike at 768 and 1024, 228 against 236 at 2304; d = 128: 1.0-1.14x at every m measured;
/// doubles 1.09-1.2x at every m measured, up to 2304).
inline constexpr std::int64_t symm_max_dim = 256;
inline constexpr std::int64_t symm_max_rows = 1024;

/// Whether symm with side 'R', C m x d, runs here (alpha 0 scales C only: the BLAS).
template <class T>
inline bool takes_symm_right(std::int64_t m, std::int64_t d, T alpha) {
#ifdef LATHER_HAS_AVX512_DISPATCH
  static const bool cpu = __builtin_cpu_supports("avx512f");
  return (std::is_same_v<T, float> || std::is_same_v<T, double>)&&cpu && d >= min_dim<T> &&
         d <= symm_max_dim && (std::is_same_v<T, double> || d <= 128 || m <= symm_max_rows) && m > 0 &&
         alpha != T(0);
#else
  (void)m, (void)d, (void)alpha;
  return false;
#endif
}

namespace detail {

#ifdef LATHER_HAS_AVX512_DISPATCH
// Rows of C per block of tiles: the block's rows of B (96 x 256 floats, 96 KiB) stay in L1/L2
// while the tiles go over every group of columns; the whole of a tall B would be read again from
// memory for each group (m = 2304, d = 256: 1770 us unblocked, 1325 in blocks of 96, 1356 of
// 192, 1361 of 384).
inline constexpr std::int64_t symm_block_rows = 96;

// Steps p in [p0, p1) of a tile: the tile's rows of B's column p (at bp + p ldb) times
// A(p, j0 + q), into the accumulators. `Strided` false: A(p, j0 + q) at ap[q + (p - p0) step]
// (8 neighbours of one column); true: at ap[q step + (p - p0)] (one element of 8 columns, each
// column's pointer in a register of its own: a run-time q * step per element spilled the 8
// offsets to the stack, a load more per broadcast: 215 instead of 232 GFLOP/s). `First`: B's rows come from
// memory (the block's first group of columns): prefetched ahead.
template <class T, int NC, int RV, bool First, bool Strided>
__attribute__((always_inline)) LATHER_AVX512_FN void symm_steps(std::int64_t p0, std::int64_t p1, const T* bp,
                                                                std::int64_t ldb, const T* ap,
                                                                std::int64_t step,
                                                                const typename Lanes<T>::mask (&in)[RV],
                                                                typename Lanes<T>::reg (&acc)[RV][NC]) {
  using W = Lanes<T>;
  constexpr int L = W::width;
  const std::int64_t ahead = prefetch_columns * ldb;
  bp += p0 * ldb;
  const T* col[NC];
#pragma GCC unroll 8
  for (int q = 0; q < NC; ++q) col[q] = Strided ? ap + q * step : ap + q;
  const std::int64_t advance = Strided ? 1 : step;
  for (std::int64_t p = p0; p < p1; ++p, bp += ldb) {
    if constexpr (First) {
#pragma GCC unroll 8
      for (int v = 0; v < RV; ++v)
        _mm_prefetch(reinterpret_cast<const char*>(bp + ahead + L * v), _MM_HINT_T0);
    }
    typename W::reg x[RV];
#pragma GCC unroll 8
    for (int v = 0; v < RV; ++v) x[v] = W::load(in[v], bp + L * v);
#pragma GCC unroll 8
    for (int q = 0; q < NC; ++q) {
      const auto a = W::set1(*col[q]);
      col[q] += advance;
#pragma GCC unroll 8
      for (int v = 0; v < RV; ++v) acc[v][q] = W::fma(x[v], a, acc[v][q]);
    }
  }
}

// The tile of rows [i0, i0 + RV vectors) (those below `rows` only) and columns [j0, j0 + NC) of
// C = alpha B A + beta C, A's `upper` or lower triangle stored (column-major, lda). A(p, j) lies
// at a[p + j lda] on the stored side of the diagonal, at a[j + p lda] on the other: for the steps
// before the tile's columns a column of 8 elements (or 8 columns of one element), after them
// the other, and between them element by element.
template <class T, int NC, int RV, bool First>
LATHER_AVX512_FN void symm_tile(bool upper, std::int64_t rows, std::int64_t d, T alpha, const T* a,
                                std::int64_t lda, const T* b, std::int64_t ldb, T beta, T* c,
                                std::int64_t ldc, std::int64_t i0, std::int64_t j0) {
  using W = Lanes<T>;
  constexpr int L = W::width;
  typename W::reg acc[RV][NC];
  typename W::mask in[RV];
  tile_start<T, NC, RV>(rows, i0, acc, in);
  const T* const bp = b + i0;
  const std::int64_t before = std::min(j0, d), after = std::min(j0 + NC, d);
  // p < j: the upper triangle holds A(p, j) at a[p + j lda] (column j), the lower at a[j + p lda].
  if (upper)
    symm_steps<T, NC, RV, First, true>(0, before, bp, ldb, a + j0 * lda, lda, in, acc);
  else
    symm_steps<T, NC, RV, First, false>(0, before, bp, ldb, a + j0, lda, in, acc);
  for (std::int64_t p = before; p < after; ++p) {
    T column[NC];
#pragma GCC unroll 8
    for (int q = 0; q < NC; ++q) {
      const std::int64_t j = j0 + q;
      column[q] = (upper == (p <= j)) ? a[p + j * lda] : a[j + p * lda];
    }
    symm_steps<T, NC, RV, First, false>(p, p + 1, bp, ldb, column, 0, in, acc);
  }
  // p > j: the lower triangle at a[p + j lda], the upper at a[j + p lda].
  if (upper)
    symm_steps<T, NC, RV, First, false>(after, d, bp, ldb, a + j0 + after * lda, lda, in, acc);
  else
    symm_steps<T, NC, RV, First, true>(after, d, bp, ldb, a + after + j0 * lda, lda, in, acc);
  const auto va = W::set1(alpha), vb = W::set1(beta);
#pragma GCC unroll 8
  for (int q = 0; q < NC; ++q) {
#pragma GCC unroll 8
    for (int v = 0; v < RV; ++v) {
      T* cp = c + i0 + L * v + (j0 + q) * ldc;
      auto r = W::mul(va, acc[v][q]);
      if (beta != T(0)) r = W::add(W::mul(vb, W::load(in[v], cp)), r);
      W::store(cp, in[v], r);
    }
  }
}

// Columns [j0, j0 + NC) of rows [r0, r1) of C: tiles of 3 vectors of rows, the last one only the
// vectors left.
template <class T, int NC, bool First>
LATHER_AVX512_FN void symm_column(bool upper, std::int64_t r0, std::int64_t r1, std::int64_t d, T alpha,
                                  const T* a, std::int64_t lda, const T* b, std::int64_t ldb, T beta, T* c,
                                  std::int64_t ldc, std::int64_t j0) {
  constexpr std::int64_t L = Lanes<T>::width, rows = L * row_vectors;
  std::int64_t i0 = r0;
  for (; r1 - i0 > rows; i0 += rows)
    symm_tile<T, NC, row_vectors, First>(upper, r1, d, alpha, a, lda, b, ldb, beta, c, ldc, i0, j0);
  if (r1 - i0 > 2 * L)
    symm_tile<T, NC, row_vectors, First>(upper, r1, d, alpha, a, lda, b, ldb, beta, c, ldc, i0, j0);
  else if (r1 - i0 > L)
    symm_tile<T, NC, 2, First>(upper, r1, d, alpha, a, lda, b, ldb, beta, c, ldc, i0, j0);
  else
    symm_tile<T, NC, 1, First>(upper, r1, d, alpha, a, lda, b, ldb, beta, c, ldc, i0, j0);
}

// symm_column for the last, narrower group of nc < tile_columns columns.
template <class T, int NC>
LATHER_AVX512_FN void symm_narrow(int nc, bool upper, std::int64_t r0, std::int64_t r1, std::int64_t d,
                                  T alpha, const T* a, std::int64_t lda, const T* b, std::int64_t ldb, T beta,
                                  T* c, std::int64_t ldc, std::int64_t j0) {
  if constexpr (NC > 1) {
    if (nc < NC) {
      symm_narrow<T, NC - 1>(nc, upper, r0, r1, d, alpha, a, lda, b, ldb, beta, c, ldc, j0);
      return;
    }
  }
  symm_column<T, NC, false>(upper, r0, r1, d, alpha, a, lda, b, ldb, beta, c, ldc, j0);
}

template <class T>
LATHER_AVX512_FN void symm_right_avx512(bool upper, std::int64_t m, std::int64_t d, T alpha, const T* a,
                                        std::int64_t lda, const T* b, std::int64_t ldb, T beta, T* c,
                                        std::int64_t ldc) {
  for (std::int64_t r0 = 0; r0 < m; r0 += symm_block_rows) {
    const std::int64_t r1 = std::min(m, r0 + symm_block_rows);
    for (std::int64_t j = 0; j < d; j += tile_columns) {
      const auto nc = static_cast<int>(std::min<std::int64_t>(tile_columns, d - j));
      if (nc < tile_columns)
        symm_narrow<T, tile_columns>(nc, upper, r0, r1, d, alpha, a, lda, b, ldb, beta, c, ldc, j);
      else if (j == 0)
        symm_column<T, tile_columns, true>(upper, r0, r1, d, alpha, a, lda, b, ldb, beta, c, ldc, j);
      else
        symm_column<T, tile_columns, false>(upper, r0, r1, d, alpha, a, lda, b, ldb, beta, c, ldc, j);
    }
  }
}
#endif

}  // namespace detail

/// C (m x d, column-major, ldc >= m) = alpha B A + beta C, A (d x d) symmetric of which the
/// `uplo` triangle is read (lda >= d), B m x d (ldb >= m): the BLAS' SYMM with side 'R' where
/// takes_symm_right<T>(m, d, alpha). C is not read where beta is 0. Never called where
/// takes_symm_right() is false.
template <class T>
void symm_right(char uplo, std::int64_t m, std::int64_t d, T alpha, const T* a, std::int64_t lda, const T* b,
                std::int64_t ldb, T beta, T* c, std::int64_t ldc) {
#ifdef LATHER_HAS_AVX512_DISPATCH
  detail::symm_right_avx512<T>(uplo == 'U' || uplo == 'u', m, d, alpha, a, lda, b, ldb, beta, c, ldc);
#else
  (void)uplo, (void)m, (void)d, (void)alpha, (void)a, (void)lda, (void)b, (void)ldb, (void)beta, (void)c,
      (void)ldc;
#endif
}

}  // namespace lather::impl::blas::tiled

#endif
