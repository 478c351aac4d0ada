// SPDX-License-Identifier: Apache-2.0
/// \file
/// \brief Private. SYMM (C = alpha B A + beta C, side 'R', or alpha A B + beta C, side 'L'; A
/// symmetric of which one triangle is read; column-major) in the register tiles of
/// tiled_syrk.hpp (3 vectors of rows of C by 8 columns) on AVX-512 CPUs, for the orders
/// takes_symm_right() and takes_symm_left() name. impl::blas::symm sends these shapes here.
///
/// Why: a block's preconditioning products are these SYMMs (the column-major view of a
/// row-major block times the inverse root of its first dimension, 'R'; the inverse root of its
/// last dimension times the block, 'L'), and OpenBLAS 0.3.21 spends a tenth of them packing the
/// triangle (ssymm_outcopy, ssymm_iutcopy: 4.6% of a steady gpt2-block step at block size 256,
/// SkylakeX kernels, three to four times as long as its general copies).
///
/// How: what the tiles read as vectors lies in columns ldb apart, and at ldb = 256 floats (1
/// KiB) a 96-row panel's lines fall into a quarter of the L1's sets (at 1024 floats, into one)
/// and are read again from L2 for every group of columns. 'L' needs a copy anyway (its vectors
/// are rows of A, half of them rows of the stored triangle): A's rows go into a contiguous panel
/// of 96 rows in 16 x 16 blocks (the mirrored ones transposed in registers), and the broadcasts
/// are B's 8 columns (contiguous in p). 'R' takes B's rows as the vectors and A's elements as
/// the broadcasts, from the stored triangle (A(p, j) is one scalar load from either triangle
/// position); for floats with m >= 512 rows (the (256, 256, 9) and (128, 128, 9) blocks of 3x3
/// convolutions: 2304 and 1152) A is first copied into strips of 8 columns (p-major) and, above
/// d = 128, B's rows into panels. Measured on the Zen 5 VM, 1 thread, against OpenBLAS' SkylakeX
/// kernels (docs/performance-history.md, seventeenth session): 'L' 256 by 256 x 256 149 -> 140
/// us in cache, 167-169 -> 149-153 with B from memory, 1024 by 1024 x 1024 8.78 -> 8.51 ms; 'R'
/// B from memory, m = 2304, d = 256: 1394-1421 -> 1320-1335 us (the tiles in place: 1444-1531),
/// m = 1152, d = 128: 203-210 -> 161-175 (in place: 190-194). Against OpenBLAS' Haswell (AVX2)
/// kernels, in cache: 'L' 1.9-2x as fast at orders 256-1024, 'R' 1.8x at 256.
///
/// symm_right_mode: the product along a row-major (outer, d, inner) tensor's middle mode (B's
/// row r the elements (r / inner, ., r % inner)) with the same tiles, in place: each panel of
/// 96 rows is gathered from the tensor by masked loads of the runs of `inner` consecutive rows
/// (the copy the tall 'R' products make anyway), its C goes into a panel of the thread's buffer
/// and is scattered back by masked stores; without it the block is unfolded before the product
/// and folded after it, two passes over it (eighteenth session: a (256, 256, 9) block 1468 ->
/// 1356 us; docs/performance-history.md).
///
/// Bits: C(i, j) is alpha times one chain of FMAs over p = 0, 1, ..., d - 1 (plus beta C; C is
/// not read where beta is 0) - independent of the tile the element falls in, of the copies, and
/// of how rows ('R') or columns ('L') are split over threads (blas::split::symm). Not
/// necessarily the BLAS' bits (the same in every shape compared at the orders up to 256, whose k
/// OpenBLAS' kernel also sums in order). The choice follows the CPU alone, like tiled_syrk.hpp's.
/// Each thread's first call may allocate the thread's buffer (transposed_buffer(), shared with
/// the SYRK 'T'; about 1 MiB), no later one.
#ifndef LATHER_IMPL_BACKENDS_TILED_SYMM_HPP
#define LATHER_IMPL_BACKENDS_TILED_SYMM_HPP

#include <lather/impl/backends/tiled_syrk.hpp>

#include <algorithm>
#include <cstdint>
#include <type_traits>

namespace lather::impl::blas::tiled {

/// The largest symmetric order the tiles take, per side: where they were measured faster than
/// OpenBLAS' SYMM (SkylakeX kernels, 1 thread; the other dimension 16 to 2304): 'R' to 256
/// (floats at 384 and 512: 0.98-0.99x from m = 1024 rows on; A's strips would outgrow the
/// buffer), 'L' (floats) to max_dim (1024; 1.02-1.8x). Below min_dim<T> (tiled_syrk.hpp's):
/// OpenBLAS or small_products.hpp.
inline constexpr std::int64_t symm_right_max_dim = 256;
inline constexpr std::int64_t symm_left_max_dim = max_dim;

/// Whether symm with side 'R', C m x d (A d x d), runs here (alpha 0 scales C only: the BLAS).
template <class T>
inline bool takes_symm_right(std::int64_t m, std::int64_t d, T alpha) {
#ifdef LATHER_HAS_AVX512_DISPATCH
  static const bool cpu = __builtin_cpu_supports("avx512f");
  return (std::is_same_v<T, float> || std::is_same_v<T, double>)&&cpu && d >= min_dim<T> &&
         d <= symm_right_max_dim && m > 0 && alpha != T(0);
#else
  (void)m, (void)d, (void)alpha;
  return false;
#endif
}

/// Whether symm with side 'L', C m x n (A m x m), runs here: floats, m from min_dim<float> to
/// symm_left_max_dim (alpha 0 scales C only: the BLAS).
template <class T>
inline bool takes_symm_left(std::int64_t m, std::int64_t n, T alpha) {
#ifdef LATHER_HAS_AVX512_DISPATCH
  static const bool cpu = __builtin_cpu_supports("avx512f");
  return std::is_same_v<T, float> && cpu && m >= min_dim<T> && m <= symm_left_max_dim && n > 0 && alpha != T(0);
#else
  (void)m, (void)n, (void)alpha;
  return false;
#endif
}

namespace detail {

#ifdef LATHER_HAS_AVX512_DISPATCH
// Rows of C per panel: the panel (96 x 256 floats, 96 KiB) stays in L2 while the tiles go over
// every group of columns (48 and 144 to 256 rows measured: equal or slower; 'R' reading B in
// place at m = 2304, d = 256: 1770 us unblocked, 1325 in blocks of 96, 1356 of 192, 1361 of 384).
inline constexpr std::int64_t symm_block_rows = 96;
// 'R', floats: from this many rows of C on, A is copied into strips and (above
// symm_copy_min_dim) B's rows into panels. Below, both are read where they are: in a step the
// inverse root comes from memory, and a copy made before the products waits on it where the
// tiles' own reads overlap it with their FMAs (the copies at m = 256 made steady gpt2-block
// steps at block size 256 0.5-1% slower, though faster in cache).
inline constexpr std::int64_t symm_strip_rows = 512;
// 'R': B's rows are read in place up to this order, copied above it: a panel of 96 rows of up to
// 128 floats (48 KiB) stays in L1 wherever its columns lie, and the copy would cost more than it
// saves (floats, m = 2304: d = 64 250.8 GFLOP/s in place, 229.7 copied; d = 128 253.0 and 242.0;
// d = 129 237.5 in place, 238.6 copied).
inline constexpr std::int64_t symm_copy_min_dim = 128;
// Where A's strips lie in transposed_buffer(): after the largest panel ('L': 96 x max_dim).
inline constexpr std::int64_t symm_strips_offset = symm_block_rows * max_dim;

// Steps p in [p0, p1) of a tile: the tile's rows of the panel's column p (at bp + p ldb) times
// A(p, j0 + q) (or B(p, j0 + q) for 'L'), into the accumulators. `Strided` false: the broadcast
// at ap[q + (p - p0) step] (8 neighbours); true: at ap[q step + (p - p0)] (one element of 8
// columns, each column's pointer in a register of its own: a run-time q * step per element
// spilled the 8 offsets to the stack, a load more per broadcast: 215 instead of 232 GFLOP/s).
// `First`: the panel's rows come from memory ('R' reading B in place, the first group of
// columns): prefetched ahead.
template <class T, int NC, int RV, bool Strided, bool First = false>
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

// C's tile at rows [i0, i0 + RV vectors) (lanes `in`) and columns [j0, j0 + NC) = alpha acc +
// beta C (C not read where beta is 0).
template <class T, int NC, int RV>
__attribute__((always_inline)) LATHER_AVX512_FN void symm_store(T alpha, T beta,
                                                                const typename Lanes<T>::reg (&acc)[RV][NC],
                                                                const typename Lanes<T>::mask (&in)[RV], T* c,
                                                                std::int64_t ldc, std::int64_t i0, std::int64_t j0) {
  using W = Lanes<T>;
  constexpr int L = W::width;
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

// The tile of rows [i0, i0 + RV vectors) (those below r1 only) and columns [j0, j0 + NC) of
// C = alpha B A + beta C, B's rows from r0 on in the panel (ldp). A's elements from its strips
// where there are any, else from its `upper` or lower triangle (column-major, lda): A(p, j) lies
// at a[p + j lda] on the stored side of the diagonal, at a[j + p lda] on the other: for the steps
// before the tile's columns a column of 8 elements (or 8 columns of one element), after them
// the other, and between them element by element.
template <class T, int NC, int RV, bool First, bool Strips>
LATHER_AVX512_FN void symm_tile(bool upper, std::int64_t r0, std::int64_t r1, std::int64_t d, T alpha, const T* a,
                                std::int64_t lda, const T* strip, const T* panel, std::int64_t ldp, T beta, T* c,
                                std::int64_t ldc, std::int64_t i0, std::int64_t j0) {
  using W = Lanes<T>;
  typename W::reg acc[RV][NC];
  typename W::mask in[RV];
  tile_start<T, NC, RV>(r1, i0, acc, in);
  const T* const bp = panel + (i0 - r0);
  if constexpr (Strips) {
    symm_steps<T, NC, RV, false, First>(0, d, bp, ldp, strip, tile_columns, in, acc);
    symm_store<T, NC, RV>(alpha, beta, acc, in, c, ldc, i0, j0);
    return;
  }
  const std::int64_t before = std::min(j0, d), after = std::min(j0 + NC, d);
  // p < j: the upper triangle holds A(p, j) at a[p + j lda] (column j), the lower at a[j + p lda].
  if (upper)
    symm_steps<T, NC, RV, true, First>(0, before, bp, ldp, a + j0 * lda, lda, in, acc);
  else
    symm_steps<T, NC, RV, false, First>(0, before, bp, ldp, a + j0, lda, in, acc);
  for (std::int64_t p = before; p < after; ++p) {
    T column[NC];
#pragma GCC unroll 8
    for (int q = 0; q < NC; ++q) {
      const std::int64_t j = j0 + q;
      column[q] = (upper == (p <= j)) ? a[p + j * lda] : a[j + p * lda];
    }
    symm_steps<T, NC, RV, false, First>(p, p + 1, bp, ldp, column, 0, in, acc);
  }
  // p > j: the lower triangle at a[p + j lda], the upper at a[j + p lda].
  if (upper)
    symm_steps<T, NC, RV, false, First>(after, d, bp, ldp, a + j0 + after * lda, lda, in, acc);
  else
    symm_steps<T, NC, RV, true, First>(after, d, bp, ldp, a + after + j0 * lda, lda, in, acc);
  symm_store<T, NC, RV>(alpha, beta, acc, in, c, ldc, i0, j0);
}

// Columns [j0, j0 + NC) of rows [r0, r1) of C: tiles of 3 vectors of rows, the last one only the
// vectors left.
template <class T, int NC, bool First, bool Strips>
LATHER_AVX512_FN void symm_column(bool upper, std::int64_t r0, std::int64_t r1, std::int64_t d, T alpha,
                                  const T* a, std::int64_t lda, const T* strips, const T* panel, std::int64_t ldp,
                                  T beta, T* c, std::int64_t ldc, std::int64_t j0) {
  constexpr std::int64_t L = Lanes<T>::width, rows = L * row_vectors;
  const T* const strip = strips == nullptr ? nullptr : strips + j0 * d;
  std::int64_t i0 = r0;
  for (; r1 - i0 > rows; i0 += rows)
    symm_tile<T, NC, row_vectors, First, Strips>(upper, r0, r1, d, alpha, a, lda, strip, panel, ldp, beta, c, ldc, i0, j0);
  if (r1 - i0 > 2 * L)
    symm_tile<T, NC, row_vectors, First, Strips>(upper, r0, r1, d, alpha, a, lda, strip, panel, ldp, beta, c, ldc, i0, j0);
  else if (r1 - i0 > L)
    symm_tile<T, NC, 2, First, Strips>(upper, r0, r1, d, alpha, a, lda, strip, panel, ldp, beta, c, ldc, i0, j0);
  else
    symm_tile<T, NC, 1, First, Strips>(upper, r0, r1, d, alpha, a, lda, strip, panel, ldp, beta, c, ldc, i0, j0);
}

// symm_column for the last, narrower group of nc < tile_columns columns.
template <class T, int NC>
LATHER_AVX512_FN void symm_narrow(int nc, bool upper, std::int64_t r0, std::int64_t r1, std::int64_t d,
                                  T alpha, const T* a, std::int64_t lda, const T* strips, const T* panel,
                                  std::int64_t ldp, T beta, T* c, std::int64_t ldc, std::int64_t j0) {
  if constexpr (NC > 1) {
    if (nc < NC) {
      symm_narrow<T, NC - 1>(nc, upper, r0, r1, d, alpha, a, lda, strips, panel, ldp, beta, c, ldc, j0);
      return;
    }
  }
  if (strips != nullptr)
    symm_column<T, NC, false, true>(upper, r0, r1, d, alpha, a, lda, strips, panel, ldp, beta, c, ldc, j0);
  else
    symm_column<T, NC, false, false>(upper, r0, r1, d, alpha, a, lda, strips, panel, ldp, beta, c, ldc, j0);
}

// The copy fetches B's column p + 16 while it copies column p (B from memory, m = 256, d = 256:
// 167.8 us without, 160.7 fetching 8 columns ahead, 158.9 16 ahead).
inline constexpr std::int64_t symm_copy_ahead = 16;
// panel(r, p) = B(r0 + r, p) for r < r1 - r0, p < d (column-major, ldp).
template <class T>
LATHER_AVX512_FN void symm_copy_rows(std::int64_t d, const T* b, std::int64_t ldb, std::int64_t r0, std::int64_t r1,
                                     T* panel, std::int64_t ldp) {
  using W = Lanes<T>;
  constexpr int L = W::width;
  const std::int64_t n = r1 - r0;
  for (std::int64_t p = 0; p < d; ++p) {
    const T* src = b + r0 + p * ldb;
    T* dst = panel + p * ldp;
    for (std::int64_t i = 0; i < n; i += 64 / static_cast<std::int64_t>(sizeof(T)))
      _mm_prefetch(reinterpret_cast<const char*>(src + symm_copy_ahead * ldb + i), _MM_HINT_T0);
    for (std::int64_t i = 0; i < n; i += L) {
      const std::int64_t r = n - i;
      const auto in = r >= L ? static_cast<typename W::mask>(~0u) : static_cast<typename W::mask>((1u << r) - 1u);
      W::store(dst + i, in, W::load(in, src + i));
    }
  }
}

// strips[j0 d + 8 p + q] = A(p, j0 + q) for the groups of 8 columns j0 = 0, 8, ... (a narrower
// last group keeps the width 8): the broadcasts of each group's tiles in the order they take
// them, from A's stored triangle in 16 x 16 blocks (columns transposed, rows copied, the
// diagonal blocks blended).
LATHER_AVX512_FN void symm_pack_strips(bool upper, std::int64_t d, const float* a, std::int64_t lda, float* strips) {
  for (std::int64_t j0 = 0; j0 < d; j0 += 16) {
    const auto nj = static_cast<int>(std::min<std::int64_t>(16, d - j0));
    const auto cols = static_cast<__mmask16>(nj == 16 ? 0xFFFFu : (1u << nj) - 1u);
    float* const low = strips + j0 * d;  // group j0 / 8: lanes 0-7
    float* const high = low + 8 * d - 8;  // group j0 / 8 + 1: lanes 8-15
    for (std::int64_t p0 = 0; p0 < d; p0 += 16) {
      const auto np = static_cast<int>(std::min<std::int64_t>(16, d - p0));
      __m512 r[16];
      if (upper ? p0 > j0 : p0 < j0) {
        // A(p, j) at a[j + p lda]: row p of the block is contiguous.
#pragma GCC unroll 16
        for (int q = 0; q < 16; ++q) r[q] = q < np ? _mm512_maskz_loadu_ps(cols, a + j0 + (p0 + q) * lda) : _mm512_setzero_ps();
      } else {
        // A(p, j) at a[p + j lda]: columns, transposed.
        const auto steps = static_cast<__mmask16>(np == 16 ? 0xFFFFu : (1u << np) - 1u);
#pragma GCC unroll 16
        for (int c = 0; c < 16; ++c) r[c] = c < nj ? _mm512_maskz_loadu_ps(steps, a + p0 + (j0 + c) * lda) : _mm512_setzero_ps();
        transpose16(r);
        if (p0 == j0) {
          // Row q of the diagonal block: lanes c on the mirror side (c < q upper, c > q lower)
          // from row q's contiguous storage.
#pragma GCC unroll 16
          for (int q = 0; q < 16; ++q) {
            if (q >= np) continue;
            const auto mirror = static_cast<__mmask16>(upper ? (1u << q) - 1u : ~((2u << q) - 1u));
            r[q] = _mm512_mask_loadu_ps(r[q], static_cast<__mmask16>(mirror & cols), a + j0 + (p0 + q) * lda);
          }
        }
      }
#pragma GCC unroll 16
      for (int q = 0; q < 16; ++q) {
        if (q >= np) continue;
        _mm512_mask_storeu_ps(low + 8 * (p0 + q), static_cast<__mmask16>(cols & 0x00FFu), r[q]);
        if (nj > 8) _mm512_mask_storeu_ps(high + 8 * (p0 + q), static_cast<__mmask16>(cols & 0xFF00u), r[q]);
      }
    }
  }
}

template <class T>
LATHER_AVX512_FN void symm_right_avx512(bool upper, std::int64_t m, std::int64_t d, T alpha, const T* a,
                                        std::int64_t lda, const T* b, std::int64_t ldb, T beta, T* c,
                                        std::int64_t ldc) {
  T* const panel = reinterpret_cast<T*>(transposed_buffer());
  const T* strips = nullptr;
  bool copy = false;
  if constexpr (std::is_same_v<T, float>) {
    if (m >= symm_strip_rows) {
      float* const s = transposed_buffer() + symm_strips_offset;
      symm_pack_strips(upper, d, a, lda, s);
      strips = s;
      copy = d > symm_copy_min_dim;
    }
  }
  for (std::int64_t r0 = 0; r0 < m; r0 += symm_block_rows) {
    const std::int64_t r1 = std::min(m, r0 + symm_block_rows);
    const T* rows = b + r0;
    std::int64_t ldr = ldb;
    if (copy) {
      symm_copy_rows<T>(d, b, ldb, r0, r1, panel, symm_block_rows);
      rows = panel;
      ldr = symm_block_rows;
    }
    for (std::int64_t j = 0; j < d; j += tile_columns) {
      const auto nc = static_cast<int>(std::min<std::int64_t>(tile_columns, d - j));
      if (nc < tile_columns)
        symm_narrow<T, tile_columns>(nc, upper, r0, r1, d, alpha, a, lda, strips, rows, ldr, beta, c, ldc, j);
      else if (strips != nullptr && j == 0 && !copy)
        symm_column<T, tile_columns, true, true>(upper, r0, r1, d, alpha, a, lda, strips, rows, ldr, beta, c, ldc, j);
      else if (strips != nullptr)
        symm_column<T, tile_columns, false, true>(upper, r0, r1, d, alpha, a, lda, strips, rows, ldr, beta, c, ldc, j);
      else if (j == 0)
        symm_column<T, tile_columns, true, false>(upper, r0, r1, d, alpha, a, lda, strips, rows, ldr, beta, c, ldc, j);
      else
        symm_column<T, tile_columns, false, false>(upper, r0, r1, d, alpha, a, lda, strips, rows, ldr, beta, c, ldc, j);
    }
  }
}

// symm_right_mode's scratch for a panel of C (96 x 256 floats) in transposed_buffer(), after A's
// strips (256 x 256 at most).
inline constexpr std::int64_t symm_mode_offset = symm_strips_offset + symm_right_max_dim * symm_right_max_dim;
static_assert(symm_mode_offset + symm_block_rows * symm_right_max_dim <= (max_dim + 32) * chunk<float>,
              "the C panel must fit in transposed_buffer()");

// Rows [r0, r1) of the middle-mode matrix of a row-major (outer, d, inner) tensor (row r = g inner
// + e at element g d inner + e, column p inner further on) as runs of consecutive rows within
// one g, per vector of 16 rows from r0: mask[v][j] the lanes of run j, offset[v][j] where lane
// 0 of that run's load or store would lie (lane l of the run at offset + l + p inner).
struct ModeRuns {
  static constexpr int vectors = static_cast<int>(symm_block_rows / 16);
  __mmask16 mask[vectors][16];
  std::int64_t offset[vectors][16];
  int runs[vectors];
  int count = 0;  // vectors
  ModeRuns(std::int64_t r0, std::int64_t r1, std::int64_t d, std::int64_t inner) {
    for (std::int64_t v0 = r0; v0 < r1; v0 += 16, ++count) {
      const auto nl = static_cast<int>(std::min<std::int64_t>(16, r1 - v0));
      int n = 0;
      for (int l = 0; l < nl;) {
        const std::int64_t r = v0 + l, g = r / inner, e = r - g * inner;
        const auto len = static_cast<int>(std::min<std::int64_t>(nl - l, inner - e));
        mask[count][n] = static_cast<__mmask16>(((1u << len) - 1u) << l);
        offset[count][n++] = g * d * inner + e - l;
        l += len;
      }
      runs[count] = n;
    }
  }
};

// The copy fetches the rows' elements this many columns ahead.
inline constexpr std::int64_t symm_mode_ahead = 16;
// panel(r - r0, p) = B(r, p) for the rows of `runs`, B the middle-mode matrix of x (ModeRuns).
LATHER_AVX512_FN void symm_copy_mode_rows(std::int64_t d, std::int64_t inner, const float* x, const ModeRuns& runs,
                                          float* panel, std::int64_t ldp) {
  for (std::int64_t p = 0; p < d; ++p) {
    const float* const xp = x + p * inner;
    for (int v = 0; v < runs.count; ++v) {
      __m512 r = _mm512_setzero_ps();
      __mmask16 all = 0;
      for (int j = 0; j < runs.runs[v]; ++j) {
        r = _mm512_mask_loadu_ps(r, runs.mask[v][j], xp + runs.offset[v][j]);
        all = static_cast<__mmask16>(all | runs.mask[v][j]);
        _mm_prefetch(reinterpret_cast<const char*>(xp + symm_mode_ahead * inner + runs.offset[v][j]), _MM_HINT_T0);
      }
      _mm512_mask_storeu_ps(panel + p * ldp + 16 * v, all, r);
    }
  }
}

// y's elements of B(r, j) = panel(r - r0, j) for the rows of `runs` (ModeRuns), j < d.
LATHER_AVX512_FN void symm_store_mode_rows(std::int64_t d, std::int64_t inner, const float* panel, std::int64_t ldp,
                                           const ModeRuns& runs, float* y) {
  for (std::int64_t j = 0; j < d; ++j) {
    float* const yj = y + j * inner;
    for (int v = 0; v < runs.count; ++v) {
      const __m512 r = _mm512_loadu_ps(panel + j * ldp + 16 * v);
      for (int k = 0; k < runs.runs[v]; ++k) _mm512_mask_storeu_ps(yj + runs.offset[v][k], runs.mask[v][k], r);
    }
  }
}

// Rows [m0, m1) of symm_right_mode: per panel of 96 rows, B's rows gathered from x, the strips'
// tiles into the C panel, the C panel scattered to y (rows read before any of them is written:
// y may be x).
LATHER_AVX512_FN void symm_right_mode_avx512(bool upper, std::int64_t m0, std::int64_t m1, std::int64_t d,
                                             std::int64_t inner, float alpha, const float* a, std::int64_t lda,
                                             const float* x, float* y) {
  float* const panel = transposed_buffer();
  float* const strips = panel + symm_strips_offset;
  float* const cp = panel + symm_mode_offset;
  symm_pack_strips(upper, d, a, lda, strips);
  for (std::int64_t r0 = m0; r0 < m1; r0 += symm_block_rows) {
    const std::int64_t r1 = std::min(m1, r0 + symm_block_rows), rows = r1 - r0;
    const ModeRuns runs(r0, r1, d, inner);
    symm_copy_mode_rows(d, inner, x, runs, panel, symm_block_rows);
    for (std::int64_t j = 0; j < d; j += tile_columns) {
      const auto nc = static_cast<int>(std::min<std::int64_t>(tile_columns, d - j));
      if (nc < tile_columns)
        symm_narrow<float, tile_columns>(nc, upper, 0, rows, d, alpha, a, lda, strips, panel, symm_block_rows, 0.0f, cp,
                                         symm_block_rows, j);
      else
        symm_column<float, tile_columns, false, true>(upper, 0, rows, d, alpha, a, lda, strips, panel, symm_block_rows,
                                                      0.0f, cp, symm_block_rows, j);
    }
    symm_store_mode_rows(d, inner, cp, symm_block_rows, runs, y);
  }
}

// Side 'L' (C = alpha A B + beta C, C m x n): the tiles' vectors are rows of A, which a stored
// triangle holds as columns on one side of the diagonal only. So rows [r0, r1) of A are first
// copied into a panel (column-major, ld symm_block_rows, every column p < m), in 16 x 16 blocks:
// blocks on the stored side copied, the others transposed from their mirror (transpose16), the
// diagonal ones blended from both; then every group of 8 columns of C runs its tiles over the
// panel with B's 8 columns as the broadcasts (contiguous in p). In the packing, an element of
// the unread triangle is only ever loaded and discarded (a blend), never computed with.
LATHER_AVX512_FN void symm_pack_rows(bool upper, std::int64_t m, const float* a, std::int64_t lda, std::int64_t r0,
                                     std::int64_t r1, float* panel, std::int64_t ldp) {
  for (std::int64_t i0 = r0; i0 < r1; i0 += 16) {
    const auto ni = static_cast<int>(std::min<std::int64_t>(16, r1 - i0));
    const auto rows = static_cast<__mmask16>(ni == 16 ? 0xFFFFu : (1u << ni) - 1u);
    float* const out = panel + (i0 - r0);
    for (std::int64_t p0 = 0; p0 < m; p0 += 16) {
      const auto np = static_cast<int>(std::min<std::int64_t>(16, m - p0));
      if (upper ? i0 < p0 : i0 > p0) {
        // A(i, p) for these rows and columns lies in the stored triangle at a[i + p lda].
#pragma GCC unroll 16
        for (int q = 0; q < 16; ++q)
          if (q < np)
            _mm512_mask_storeu_ps(out + (p0 + q) * ldp, rows, _mm512_maskz_loadu_ps(rows, a + i0 + (p0 + q) * lda));
        continue;
      }
      // A(i0 + c, p0 + q) = A(p0 + q, i0 + c): column i0 + c of the storage, rows p0 + q.
      const auto steps = static_cast<__mmask16>(np == 16 ? 0xFFFFu : (1u << np) - 1u);
      __m512 r[16];
#pragma GCC unroll 16
      for (int c = 0; c < 16; ++c) r[c] = c < ni ? _mm512_maskz_loadu_ps(steps, a + p0 + (i0 + c) * lda) : _mm512_setzero_ps();
      transpose16(r);
      if (i0 == p0) {
        // The diagonal block: lanes c on the stored side of column q (c <= q upper, c >= q
        // lower) from the column itself.
#pragma GCC unroll 16
        for (int q = 0; q < 16; ++q) {
          if (q >= np) continue;
          const auto own = static_cast<__mmask16>(upper ? (2u << q) - 1u : ~((1u << q) - 1u));
          r[q] = _mm512_mask_loadu_ps(r[q], static_cast<__mmask16>(own & rows), a + i0 + (p0 + q) * lda);
        }
      }
#pragma GCC unroll 16
      for (int q = 0; q < 16; ++q)
        if (q < np) _mm512_mask_storeu_ps(out + (p0 + q) * ldp, rows, r[q]);
    }
  }
}

// The tile of rows [i0, i0 + RV vectors) (those below r1 only) and columns [j0, j0 + NC) of
// C = alpha A B + beta C, from the panel of A's rows [r0, r1).
template <int NC, int RV>
LATHER_AVX512_FN void symm_left_tile(std::int64_t r0, std::int64_t r1, std::int64_t m, float alpha,
                                     const float* panel, std::int64_t ldp, const float* b, std::int64_t ldb,
                                     float beta, float* c, std::int64_t ldc, std::int64_t i0, std::int64_t j0) {
  typename Lanes<float>::reg acc[RV][NC];
  typename Lanes<float>::mask in[RV];
  tile_start<float, NC, RV>(r1, i0, acc, in);
  symm_steps<float, NC, RV, true>(0, m, panel + (i0 - r0), ldp, b + j0 * ldb, ldb, in, acc);
  symm_store<float, NC, RV>(alpha, beta, acc, in, c, ldc, i0, j0);
}

// Columns [j0, j0 + NC) of rows [r0, r1) of C: tiles of 3 vectors of rows, the last one only the
// vectors left.
template <int NC>
LATHER_AVX512_FN void symm_left_column(std::int64_t r0, std::int64_t r1, std::int64_t m, float alpha,
                                       const float* panel, std::int64_t ldp, const float* b, std::int64_t ldb,
                                       float beta, float* c, std::int64_t ldc, std::int64_t j0) {
  constexpr std::int64_t L = 16, rows = L * row_vectors;
  std::int64_t i0 = r0;
  for (; r1 - i0 > rows; i0 += rows)
    symm_left_tile<NC, row_vectors>(r0, r1, m, alpha, panel, ldp, b, ldb, beta, c, ldc, i0, j0);
  if (r1 - i0 > 2 * L)
    symm_left_tile<NC, row_vectors>(r0, r1, m, alpha, panel, ldp, b, ldb, beta, c, ldc, i0, j0);
  else if (r1 - i0 > L)
    symm_left_tile<NC, 2>(r0, r1, m, alpha, panel, ldp, b, ldb, beta, c, ldc, i0, j0);
  else
    symm_left_tile<NC, 1>(r0, r1, m, alpha, panel, ldp, b, ldb, beta, c, ldc, i0, j0);
}

template <int NC>
LATHER_AVX512_FN void symm_left_narrow(int nc, std::int64_t r0, std::int64_t r1, std::int64_t m, float alpha,
                                       const float* panel, std::int64_t ldp, const float* b, std::int64_t ldb,
                                       float beta, float* c, std::int64_t ldc, std::int64_t j0) {
  if constexpr (NC > 1) {
    if (nc < NC) {
      symm_left_narrow<NC - 1>(nc, r0, r1, m, alpha, panel, ldp, b, ldb, beta, c, ldc, j0);
      return;
    }
  }
  symm_left_column<NC>(r0, r1, m, alpha, panel, ldp, b, ldb, beta, c, ldc, j0);
}

LATHER_AVX512_FN void symm_left_avx512(bool upper, std::int64_t m, std::int64_t n, float alpha, const float* a,
                                       std::int64_t lda, const float* b, std::int64_t ldb, float beta, float* c,
                                       std::int64_t ldc) {
  float* const panel = transposed_buffer();
  for (std::int64_t r0 = 0; r0 < m; r0 += symm_block_rows) {
    const std::int64_t r1 = std::min(m, r0 + symm_block_rows);
    symm_pack_rows(upper, m, a, lda, r0, r1, panel, symm_block_rows);
    for (std::int64_t j = 0; j < n; j += tile_columns) {
      const auto nc = static_cast<int>(std::min<std::int64_t>(tile_columns, n - j));
      if (nc < tile_columns)
        symm_left_narrow<tile_columns>(nc, r0, r1, m, alpha, panel, symm_block_rows, b, ldb, beta, c, ldc, j);
      else
        symm_left_column<tile_columns>(r0, r1, m, alpha, panel, symm_block_rows, b, ldb, beta, c, ldc, j);
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

/// C (m x n, column-major, ldc >= m) = alpha A B + beta C, A (m x m) symmetric of which the
/// `uplo` triangle is read (lda >= m), B m x n (ldb >= m): the BLAS' SYMM with side 'L' where
/// takes_symm_left<T>(m, n, alpha). C is not read where beta is 0. Never called where
/// takes_symm_left() is false.
template <class T>
void symm_left(char uplo, std::int64_t m, std::int64_t n, T alpha, const T* a, std::int64_t lda, const T* b,
               std::int64_t ldb, T beta, T* c, std::int64_t ldc) {
#ifdef LATHER_HAS_AVX512_DISPATCH
  if constexpr (std::is_same_v<T, float>)
    detail::symm_left_avx512(uplo == 'U' || uplo == 'u', m, n, alpha, a, lda, b, ldb, beta, c, ldc);
#else
  (void)uplo, (void)m, (void)n, (void)alpha, (void)a, (void)lda, (void)b, (void)ldb, (void)beta, (void)c, (void)ldc;
#endif
}

/// The smallest order symm_right_mode takes: below it the gathered copy costs what the two passes
/// do (1 thread, Zen 5 VM, against UnfoldMode, symm_right and the fold; the tensor in L3 or
/// memory): (256, 256, 9) 1468 -> 1356 us, (128, 128, 9) 222 -> 195, (103, 100, 5) 71 -> 63,
/// (64, 64, 9) 30.9 -> 30.4, (20, 40, 49) 18.8 -> 19.3.
inline constexpr std::int64_t symm_mode_min_dim = 64;

/// Whether symm_right_mode runs here: floats where the 'R' tiles copy A into strips (m = outer
/// inner >= 512 rows) of order symm_mode_min_dim to 256, a mode with something after it (inner
/// >= 2; inner 1 is a plain SYMM 'L').
template <class T>
inline bool takes_symm_right_mode(std::int64_t m, std::int64_t d, std::int64_t inner, T alpha) {
#ifdef LATHER_HAS_AVX512_DISPATCH
  return std::is_same_v<T, float> && inner >= 2 && d >= symm_mode_min_dim && m >= detail::symm_strip_rows &&
         takes_symm_right<T>(m, d, alpha);
#else
  (void)m, (void)d, (void)inner, (void)alpha;
  return false;
#endif
}

/// The mode product of a row-major (outer, d, inner) tensor x along its middle mode, rows [m0,
/// m1) of the m = outer inner rows: y's B(r, j) = alpha sum_p B(r, p) A(p, j), B(r, p) the element
/// (r / inner, p, r % inner), A (d x d) symmetric of which the `uplo` triangle is read (lda >= d).
/// The same bits as impl::kernels::UnfoldMode, symm_right (beta 0) and the fold back: the
/// unfolding and the fold are the 'R' tiles' copy of B's rows into panels and a scatter of each
/// panel of C, in cache, instead of two passes over the tensor. y may be x (each panel's rows
/// are read before they are written; other rows are not touched). Where takes_symm_right_mode.
template <class T>
void symm_right_mode(char uplo, std::int64_t m0, std::int64_t m1, std::int64_t d, std::int64_t inner, T alpha,
                     const T* a, std::int64_t lda, const T* x, T* y) {
#ifdef LATHER_HAS_AVX512_DISPATCH
  if constexpr (std::is_same_v<T, float>)
    detail::symm_right_mode_avx512(uplo == 'U' || uplo == 'u', m0, m1, d, inner, alpha, a, lda, x, y);
#else
  (void)uplo, (void)m0, (void)m1, (void)d, (void)inner, (void)alpha, (void)a, (void)lda, (void)x, (void)y;
#endif
}

}  // namespace lather::impl::blas::tiled

#endif
