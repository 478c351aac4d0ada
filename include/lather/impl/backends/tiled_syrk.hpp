// SPDX-License-Identifier: Apache-2.0
/// \file
/// \brief Private. SYRK with trans 'N' (C = alpha A A^T + beta C, A n x k column-major) for
/// 17 <= n <= 1024 floats (9 <= n <= 1024 doubles) on AVX-512 CPUs: register tiles of 3 vectors
/// of rows by 8 columns of C, reading A where it is (no packing), k in chunks of 1 KiB per
/// column. Floats with trans 'T' (C = alpha A^T A + beta C) too: each chunk of A transposed
/// into a per-thread buffer first (with A the middle-mode unfolding of a row-major (outer, n,
/// inner) tensor, syrk_columns_unfolded, the transposition gathers it from the tensor: the
/// unfolding's pass saved). impl::blas::syrk and blas::split::syrk_lower (syrk_lower_unfolded)
/// send these shapes here.
///
/// Why: a row-major block's factor of its last dimension is this SYRK (its column-major view
/// times its transpose), and OpenBLAS 0.3.21 runs it well below its GEMM rate at Shampoo's block
/// sizes: on the Zen 5 VM, 1 thread, in cache, n = k = 256: 151 GFLOP/s with the SkylakeX
/// kernels (GEMM 237), 94 with the Haswell ones; here 225-229 (both), reading A in place where
/// OpenBLAS packs it. Doubles gain more (OpenBLAS' DSYRK at n = k = 256: 57 GFLOP/s, here 113).
///
/// How: a tile's 24 accumulators hold its 48 (24 for doubles) rows by 8 columns of C, rows in
/// the lanes; every step of k loads the tile's rows of A's column and broadcasts the 8 elements
/// of the same column at the tile's columns: 11 loads for 24 FMAs, A streamed from L1/L2 with
/// the column stride.
/// Tiles cover the columns' part of the `uplo` triangle, a column's last tile only the 1 to 3
/// vectors of rows left; lanes outside the triangle or past n are masked (computed, never stored).
///
/// Bits: C(i, j) is alpha times the sum over each chunk of k (FMAs from p = 0 on, one
/// accumulator), plus beta C (the first chunk; 1 for the later ones) - independent of the tile
/// an element falls in, so any split of the columns (syrk_columns) gives the same bits as the
/// whole. Not the BLAS' bits. The choice follows the CPU alone (not host_simd.hpp's
/// ScopedSimdLimit), so every path of a process gets the same bits for the same product.
#ifndef LATHER_IMPL_BACKENDS_TILED_SYRK_HPP
#define LATHER_IMPL_BACKENDS_TILED_SYRK_HPP

#include <lather/impl/kernels/host_simd.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <type_traits>

namespace lather::impl::blas::tiled {

/// k is summed in chunks of this many columns (1 KiB of one column of A): a chunk of a
/// 1024-row A is 1 MiB, the L2 of the CPUs it was tuned on.
template <class T>
inline constexpr std::int64_t chunk = 1024 / static_cast<std::int64_t>(sizeof(T));

/// The sizes measured faster than OpenBLAS (SkylakeX and Haswell kernels): below, small_products
/// ('N') or the BLAS; from 17 floats on, since a column's last tile has only the vectors left,
/// 1.16-4.1x OpenBLAS ('N' and 'T', n = 17 to 31, k = 9 to 2304); above 1024, untested.
template <class T>
inline constexpr std::int64_t min_dim = std::is_same_v<T, float> ? 17 : 9;
inline constexpr std::int64_t max_dim = 1024;

/// Whether syrk with trans 'N' of order n and inner dimension k runs here (alpha 0 and k 0 scale
/// C only: the BLAS).
template <class T>
inline bool takes(std::int64_t n, std::int64_t k, T alpha) {
#ifdef LATHER_HAS_AVX512_DISPATCH
  static const bool cpu = __builtin_cpu_supports("avx512f");
  return (std::is_same_v<T, float> || std::is_same_v<T, double>) && cpu && n >= min_dim<T> && n <= max_dim &&
         k > 0 && alpha != T(0);
#else
  (void)n, (void)k, (void)alpha;
  return false;
#endif
}

/// Whether syrk with trans 'T' (A k x n) runs here: floats of the same sizes, each chunk of k
/// transposed into a per-thread buffer, then the 'N' tiles (1.05-1.16x OpenBLAS' SkylakeX SSYRK
/// 'T' at n <= 512, with the transposition). Doubles keep the BLAS (its DSYRK 'T' ran at 85-102
/// GFLOP/s, about these tiles' rate).
template <class T>
inline bool takes_transposed(std::int64_t n, std::int64_t k, T alpha) {
  return std::is_same_v<T, float> && takes<T>(n, k, alpha);
}

/// Memory the calling thread's tiles fetch on the side, one cache line every `side_steps` steps
/// of k, while they compute: rows of `row_bytes`, `stride` apart, range after range. A caller
/// names what its next memory-bound passes read (Shampoo: a block's parameter rows, which its
/// update pass reads and writes, then the gradient of the block it takes next), so that those
/// lines arrive during the SYRK, which leaves the memory idle, rather than during the pass,
/// which would wait on it. Per thread; nothing is fetched unless a caller set ranges
/// (SideFetchScope), and only prefetch hints are issued: no result changes. (The addresses as
/// integers instead of pointers made a steady gpt2-block step 2% slower: the tiles' code.)
struct SideFetch {
  struct Range {
    const char* first = nullptr;
    std::int64_t row_bytes = 0, stride = 0, rows = 0;
  };
  static constexpr int max_ranges = 4;
  Range range[max_ranges]{};
  int ranges = 0, current = 0;
  std::int64_t row = 0;
  const char* next = nullptr;  // the next line to fetch (nullptr: nothing left)
  const char* end = nullptr;   // the end of its row

  /// Appends a range (ignored: null, empty, or beyond max_ranges).
  void add(const void* first, std::int64_t row_bytes, std::int64_t stride, std::int64_t rows) {
    if (first == nullptr || row_bytes <= 0 || rows <= 0 || ranges == max_ranges) return;
    range[ranges++] = {static_cast<const char*>(first), row_bytes, stride, rows};
    if (next == nullptr) {
      current = ranges - 1;
      row = 0;
      open();
    }
  }
  /// The next row, or the next range's first; next = nullptr after the last.
  void advance() {
    if (++row >= range[current].rows) {
      row = 0;
      if (++current >= ranges) {
        next = end = nullptr;
        return;
      }
    }
    open();
  }
  void clear() { *this = SideFetch{}; }

 private:
  void open() {
    const Range& r = range[current];
    const char* const start = r.first + row * r.stride;
    next = reinterpret_cast<const char*>(reinterpret_cast<std::uintptr_t>(start) & ~std::uintptr_t(63));  // its first line
    end = start + r.row_bytes;
  }
};
/// The calling thread's SideFetch (constant-initialized: no guard on the tiles' path).
inline SideFetch& side_fetch() {
  thread_local SideFetch s;
  return s;
}
/// Sets the calling thread's side fetch for a scope; what the tiles did not reach is dropped.
class SideFetchScope {
 public:
  SideFetchScope() { side_fetch().clear(); }
  ~SideFetchScope() { side_fetch().clear(); }
  SideFetchScope(const SideFetchScope&) = delete;
  SideFetchScope& operator=(const SideFetchScope&) = delete;
  void add(const void* first, std::int64_t row_bytes, std::int64_t stride = 0, std::int64_t rows = 1) {
    side_fetch().add(first, row_bytes, stride, rows);
  }
};

namespace detail {

/// Rows per vector register, vector registers of rows and columns per tile.
inline constexpr int row_vectors = 3;
inline constexpr int tile_columns = 8;

#ifdef LATHER_HAS_AVX512_DISPATCH
template <class T>
struct Lanes;
template <>
struct Lanes<float> {
  using reg = __m512;
  using mask = __mmask16;
  static constexpr int width = 16;
  LATHER_AVX512_FN static reg zero() { return _mm512_setzero_ps(); }
  LATHER_AVX512_FN static reg set1(float x) { return _mm512_set1_ps(x); }
  LATHER_AVX512_FN static reg load(mask m, const float* p) { return _mm512_maskz_loadu_ps(m, p); }
  LATHER_AVX512_FN static void store(float* p, mask m, reg a) { _mm512_mask_storeu_ps(p, m, a); }
  LATHER_AVX512_FN static reg fma(reg a, reg b, reg c) { return _mm512_fmadd_ps(a, b, c); }
  // Explicit rounding: GCC would contract a plain mul and add into an FMA in some tiles only.
  LATHER_AVX512_FN static reg mul(reg a, reg b) { return _mm512_maskz_mul_round_ps(0xFFFF, a, b, _MM_FROUND_CUR_DIRECTION); }
  LATHER_AVX512_FN static reg add(reg a, reg b) { return _mm512_maskz_add_round_ps(0xFFFF, a, b, _MM_FROUND_CUR_DIRECTION); }
  // Lanes l with l >= rel (lower) or l <= rel (upper): rows r0 + l on the triangle's side of
  // column r0 + rel.
  LATHER_AVX512_FN static mask side(bool lower, std::int64_t rel) {
    const __m512i lane = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    const __m512i r = _mm512_set1_epi32(static_cast<int>(std::clamp<std::int64_t>(rel, -1, width)));
    return lower ? _mm512_cmpge_epi32_mask(lane, r) : _mm512_cmple_epi32_mask(lane, r);
  }
};
template <>
struct Lanes<double> {
  using reg = __m512d;
  using mask = __mmask8;
  static constexpr int width = 8;
  LATHER_AVX512_FN static reg zero() { return _mm512_setzero_pd(); }
  LATHER_AVX512_FN static reg set1(double x) { return _mm512_set1_pd(x); }
  LATHER_AVX512_FN static reg load(mask m, const double* p) { return _mm512_maskz_loadu_pd(m, p); }
  LATHER_AVX512_FN static void store(double* p, mask m, reg a) { _mm512_mask_storeu_pd(p, m, a); }
  LATHER_AVX512_FN static reg fma(reg a, reg b, reg c) { return _mm512_fmadd_pd(a, b, c); }
  LATHER_AVX512_FN static reg mul(reg a, reg b) { return _mm512_maskz_mul_round_pd(0xFF, a, b, _MM_FROUND_CUR_DIRECTION); }
  LATHER_AVX512_FN static reg add(reg a, reg b) { return _mm512_maskz_add_round_pd(0xFF, a, b, _MM_FROUND_CUR_DIRECTION); }
  LATHER_AVX512_FN static mask side(bool lower, std::int64_t rel) {
    const __m512i lane = _mm512_setr_epi64(0, 1, 2, 3, 4, 5, 6, 7);
    const __m512i r = _mm512_set1_epi64(std::clamp<std::int64_t>(rel, -1, width));
    return lower ? _mm512_cmpge_epi64_mask(lane, r) : _mm512_cmple_epi64_mask(lane, r);
  }
};

// Columns of A ahead that a first pass over A prefetches (a step of k is about 12 cycles: 32
// cover a memory latency). A gradient block arrives from memory: without the prefetches a
// (256 x 256) SYRK with A and C cold took 120-133 us, with them 98-111 (OpenBLAS 123-132).
inline constexpr std::int64_t prefetch_columns = 32;
// A side line every this many steps of k (a power of two): one line per ~50 cycles, about
// 6 GB/s at 4.5 GHz, so that a (256 x 256) block's two SYRKs fetch about 1 MiB.
inline constexpr int side_steps = 4;

// One step p of k for tile(): the tile's rows of A's column p (at ap) times its columns' elements
// (at bp), into the accumulators. Always inlined, so that they stay in registers.
template <class T, int NC, bool First, int RV>
__attribute__((always_inline)) LATHER_AVX512_FN void tile_step(const T* ap, const T* bp, std::int64_t ahead,
                                                               const typename Lanes<T>::mask (&in)[RV],
                                                               typename Lanes<T>::reg (&acc)[RV][NC]) {
  using W = Lanes<T>;
  constexpr int L = W::width;
  if constexpr (First) {
#pragma GCC unroll 8
    for (int v = 0; v < RV; ++v) _mm_prefetch(reinterpret_cast<const char*>(ap + ahead + L * v), _MM_HINT_T0);
  }
  typename W::reg x[RV];
#pragma GCC unroll 8
  for (int v = 0; v < RV; ++v) x[v] = W::load(in[v], ap + L * v);
#pragma GCC unroll 8
  for (int q = 0; q < NC; ++q) {
    const auto b = W::set1(bp[q]);
#pragma GCC unroll 8
    for (int v = 0; v < RV; ++v) acc[v][q] = W::fma(x[v], b, acc[v][q]);
  }
}

// A tile's start: its accumulators zeroed, and the masks of its RV vectors of rows from i0 (the
// lanes of rows below `rows`). Shared by the SYRK and the SYMM tiles (tiled_symm.hpp).
template <class T, int NC, int RV>
__attribute__((always_inline)) LATHER_AVX512_FN void tile_start(std::int64_t rows, std::int64_t i0,
                                                                typename Lanes<T>::reg (&acc)[RV][NC],
                                                                typename Lanes<T>::mask (&in)[RV]) {
  using W = Lanes<T>;
  constexpr int L = W::width;
#pragma GCC unroll 8
  for (int v = 0; v < RV; ++v)
#pragma GCC unroll 8
    for (int q = 0; q < NC; ++q) acc[v][q] = W::zero();
#pragma GCC unroll 8
  for (int v = 0; v < RV; ++v) {
    const std::int64_t r = rows - (i0 + L * v);
    in[v] = r >= L ? static_cast<typename W::mask>(~0u)
                   : static_cast<typename W::mask>(r <= 0 ? 0u : (1u << r) - 1u);
  }
}

// The tile of rows [i0, i0 + RV vectors) (those below `rows` only) and columns [j0, j0 + NC) of
// C, summing k columns of A. Fully unrolled so the accumulators stay in registers (an array
// indexed at run time would live on the stack). C's lines are prefetched first (read at the
// end); `First`: the first pass over these rows of A, which prefetches them too.
template <class T, int NC, bool First, int RV = row_vectors>
LATHER_AVX512_FN void tile(bool lower, std::int64_t rows, std::int64_t k, T alpha, const T* a, std::int64_t lda,
                           T beta, T* c, std::int64_t ldc, std::int64_t i0, std::int64_t j0) {
  using W = Lanes<T>;
  constexpr int L = W::width;
  typename W::reg acc[RV][NC];
  typename W::mask in[RV];
  tile_start<T, NC, RV>(rows, i0, acc, in);
#pragma GCC unroll 8
  for (int q = 0; q < NC; ++q)
#pragma GCC unroll 8
    for (int v = 0; v < RV; ++v)
      if (in[v] != 0) _mm_prefetch(reinterpret_cast<const char*>(c + i0 + L * v + (j0 + q) * ldc), _MM_HINT_T0);
  const T* ap = a + i0;
  const T* bp = a + j0;
  const std::int64_t ahead = prefetch_columns * lda;
  // Steps in groups of side_steps, a side line before each group while any is left (the test
  // once per group: per step it cost 0.3% of a gpt2-block step with nothing to fetch).
  SideFetch& side = side_fetch();
  std::int64_t p = 0;
  if (side.next != nullptr) {
    const char* sn = side.next;
    const char* se = side.end;
    for (; p + side_steps <= k && sn != nullptr; p += side_steps) {
      _mm_prefetch(sn, _MM_HINT_T1);
      sn += 64;
      if (sn >= se) {
        side.next = sn;
        side.advance();
        sn = side.next;
        se = side.end;
      }
#pragma GCC unroll 4
      for (int s = 0; s < side_steps; ++s, ap += lda, bp += lda) tile_step<T, NC, First, RV>(ap, bp, ahead, in, acc);
    }
    side.next = sn;
  }
  for (; p < k; ++p, ap += lda, bp += lda) tile_step<T, NC, First, RV>(ap, bp, ahead, in, acc);
  const auto va = W::set1(alpha), vb = W::set1(beta);
#pragma GCC unroll 8
  for (int q = 0; q < NC; ++q) {
#pragma GCC unroll 8
    for (int v = 0; v < RV; ++v) {
      const std::int64_t r0 = i0 + L * v;
      const auto m = static_cast<typename W::mask>(in[v] & W::side(lower, j0 + q - r0));
      T* cp = c + r0 + (j0 + q) * ldc;
      auto r = W::mul(va, acc[v][q]);
      if (beta != T(0)) r = W::add(W::mul(vb, W::load(m, cp)), r);
      W::store(cp, m, r);
    }
  }
}

// Columns [j0, j0 + NC) of the triangle: lower from the vector holding row j0 down to n, upper
// from row 0 to the last column. `First`: the call's first group of columns.
template <class T, int NC, bool First>
LATHER_AVX512_FN void column_tiles(bool lower, std::int64_t n, std::int64_t k, T alpha, const T* a, std::int64_t lda,
                                   T beta, T* c, std::int64_t ldc, std::int64_t j0) {
  constexpr std::int64_t L = Lanes<T>::width, rows = L * row_vectors;
  // The last tile of the column takes only the vectors left (1 or 2): a fixed 3 would compute
  // up to 2 vectors of rows past the end (n = 256: 19% more FMAs than the triangle, 6% with
  // the narrower last tiles; n = 64: 85%, 23%).
  const std::int64_t end = lower ? n : std::min(n, j0 + NC);
  std::int64_t i0 = lower ? j0 / L * L : 0;
  for (; end - i0 > rows; i0 += rows) tile<T, NC, First>(lower, end, k, alpha, a, lda, beta, c, ldc, i0, j0);
  if (end - i0 > 2 * L) tile<T, NC, First>(lower, end, k, alpha, a, lda, beta, c, ldc, i0, j0);
  else if (end - i0 > L) tile<T, NC, First, 2>(lower, end, k, alpha, a, lda, beta, c, ldc, i0, j0);
  else tile<T, NC, First, 1>(lower, end, k, alpha, a, lda, beta, c, ldc, i0, j0);
}

// column_tiles for the last, narrower group of nc < tile_columns columns.
template <class T, int NC>
LATHER_AVX512_FN void narrow_tiles(int nc, bool lower, std::int64_t n, std::int64_t k, T alpha, const T* a,
                                   std::int64_t lda, T beta, T* c, std::int64_t ldc, std::int64_t j0) {
  if constexpr (NC > 1) {
    if (nc < NC) {
      narrow_tiles<T, NC - 1>(nc, lower, n, k, alpha, a, lda, beta, c, ldc, j0);
      return;
    }
  }
  column_tiles<T, NC, false>(lower, n, k, alpha, a, lda, beta, c, ldc, j0);
}

template <class T>
LATHER_AVX512_FN void syrk_columns_avx512(bool lower, std::int64_t n, std::int64_t k, T alpha, const T* a,
                                          std::int64_t lda, T beta, T* c, std::int64_t ldc, std::int64_t j0,
                                          std::int64_t j1) {
  for (std::int64_t p0 = 0; p0 < k; p0 += chunk<T>) {
    const std::int64_t kk = std::min(chunk<T>, k - p0);
    const T b = p0 == 0 ? beta : T(1);
    const T* ap = a + p0 * lda;
    for (std::int64_t j = j0; j < j1; j += tile_columns) {
      const auto nc = static_cast<int>(std::min<std::int64_t>(tile_columns, j1 - j));
      if (nc < tile_columns) narrow_tiles<T, tile_columns>(nc, lower, n, kk, alpha, ap, lda, b, c, ldc, j);
      else if (j == j0) column_tiles<T, tile_columns, true>(lower, n, kk, alpha, ap, lda, b, c, ldc, j);
      else column_tiles<T, tile_columns, false>(lower, n, kk, alpha, ap, lda, b, c, ldc, j);
    }
  }
}

// The buffer a thread transposes chunks of A into: max_dim (+ padding) rows by one chunk,
// allocated at the thread's first SYRK 'T' at its largest size, so that no later call allocates.
// Zeroed when allocated, so that its pages are touched in order there rather than in the
// transposition's order: a buffer first touched by the transposition made a (256 x 256) 'T'
// SYRK 93 instead of 86.5 us in cache, in every later call (page placement; Zen 5 VM).
inline float* transposed_buffer() {
  thread_local std::unique_ptr<float[]> buffer;
  if (!buffer) buffer.reset(new float[static_cast<std::size_t>((max_dim + 32) * chunk<float>)]());
  return buffer.get();
}
// The buffer's leading dimension for order n: whole vectors plus one, so that its columns do
// not sit 4 KiB apart (a multiple of 1024 floats: the transposition's stores and the tiles'
// loads then collide in the L1's sets; n = 256 took 13.3 instead of 4.8 us to transpose).
inline std::int64_t transposed_ld(std::int64_t n) { return (n + 15) / 16 * 16 + 16; }

// The shuffles with a full mask and a source operand: their unmasked forms start from an
// undefined register, which GCC 12 reports as maybe uninitialized in target("avx512f") code.
LATHER_AVX512_FN __m512 unpack_low(__m512 a, __m512 b) { return _mm512_mask_unpacklo_ps(a, 0xFFFF, a, b); }
LATHER_AVX512_FN __m512 unpack_high(__m512 a, __m512 b) { return _mm512_mask_unpackhi_ps(a, 0xFFFF, a, b); }
template <int Imm>
LATHER_AVX512_FN __m512 shuffle_lanes(__m512 a, __m512 b) { return _mm512_mask_shuffle_ps(a, 0xFFFF, a, b, Imm); }
template <int Imm>
LATHER_AVX512_FN __m512 shuffle_quads(__m512 a, __m512 b) { return _mm512_mask_shuffle_f32x4(a, 0xFFFF, a, b, Imm); }

// 16 x 16 floats transposed in registers: r[c] holds column c of a block on entry, row c on exit.
LATHER_AVX512_FN void transpose16(__m512 r[16]) {
  __m512 t[16];
#pragma GCC unroll 8
  for (int i = 0; i < 8; ++i) {
    t[2 * i] = unpack_low(r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = unpack_high(r[2 * i], r[2 * i + 1]);
  }
#pragma GCC unroll 4
  for (int i = 0; i < 4; ++i) {
    r[4 * i] = shuffle_lanes<0x44>(t[4 * i], t[4 * i + 2]);
    r[4 * i + 1] = shuffle_lanes<0xEE>(t[4 * i], t[4 * i + 2]);
    r[4 * i + 2] = shuffle_lanes<0x44>(t[4 * i + 1], t[4 * i + 3]);
    r[4 * i + 3] = shuffle_lanes<0xEE>(t[4 * i + 1], t[4 * i + 3]);
  }
#pragma GCC unroll 4
  for (int j = 0; j < 4; ++j) {
    t[j] = shuffle_quads<0x88>(r[j], r[4 + j]);
    t[4 + j] = shuffle_quads<0xDD>(r[j], r[4 + j]);
    t[8 + j] = shuffle_quads<0x88>(r[8 + j], r[12 + j]);
    t[12 + j] = shuffle_quads<0xDD>(r[8 + j], r[12 + j]);
  }
#pragma GCC unroll 4
  for (int j = 0; j < 4; ++j) {
    r[j] = shuffle_quads<0x88>(t[j], t[8 + j]);
    r[8 + j] = shuffle_quads<0xDD>(t[j], t[8 + j]);
    r[4 + j] = shuffle_quads<0x88>(t[4 + j], t[12 + j]);
    r[12 + j] = shuffle_quads<0xDD>(t[4 + j], t[12 + j]);
  }
}

// Blocks ahead whose lines transpose_rows prefetches in each of its 16 rows: A's 16 rows are 16
// streams lda apart, which the hardware's prefetchers did not keep ahead of (Zen 5 VM, 1 thread,
// a 2304 x 256 A: 89.5 -> 62 us with A in the L3, 130 -> 82.5 from memory; 4 blocks ahead the
// same).
inline constexpr std::int64_t transpose_ahead = 2;

// b(i, p) = a(p, i) for rows i in [r0, r1) (r0 a multiple of 16) and p in [0, kk): a is k x n
// column-major (lda), b n x kk (ldb), in 16 x 16 blocks, the edges masked. (The prefetches may
// reach past kk or past A: hints, which never fault.)
LATHER_AVX512_FN void transpose_rows(std::int64_t kk, const float* a, std::int64_t lda, std::int64_t r0, std::int64_t r1,
                                     float* b, std::int64_t ldb) {
  for (std::int64_t i0 = r0; i0 < r1; i0 += 16) {
    const auto ni = static_cast<int>(std::min<std::int64_t>(16, r1 - i0));
    const auto rows = static_cast<__mmask16>(ni == 16 ? 0xFFFFu : (1u << ni) - 1u);
    for (std::int64_t p0 = 0; p0 < kk; p0 += 16) {
      const auto np = static_cast<int>(std::min<std::int64_t>(16, kk - p0));
      const auto steps = static_cast<__mmask16>(np == 16 ? 0xFFFFu : (1u << np) - 1u);
#pragma GCC unroll 16
      for (int c = 0; c < 16; ++c)
        if (c < ni) _mm_prefetch(reinterpret_cast<const char*>(a + p0 + 16 * transpose_ahead + (i0 + c) * lda), _MM_HINT_T0);
      __m512 r[16];
#pragma GCC unroll 16
      for (int c = 0; c < 16; ++c) r[c] = c < ni ? _mm512_maskz_loadu_ps(steps, a + p0 + (i0 + c) * lda) : _mm512_setzero_ps();
      transpose16(r);
#pragma GCC unroll 16
      for (int q = 0; q < 16; ++q)
        if (q < np) _mm512_mask_storeu_ps(b + i0 + (p0 + q) * ldb, rows, r[q]);
    }
  }
}

// syrk_columns_avx512 of op(A) = A^T (A k x n): each chunk of k transposed (the rows the
// columns' tiles read), then its tiles.
LATHER_AVX512_FN void syrk_columns_transposed_avx512(bool lower, std::int64_t n, std::int64_t k, float alpha,
                                                     const float* a, std::int64_t lda, float beta, float* c,
                                                     std::int64_t ldc, std::int64_t j0, std::int64_t j1) {
  float* const buffer = transposed_buffer();
  const std::int64_t ldb = transposed_ld(n);
  const std::int64_t r0 = lower ? j0 / 16 * 16 : 0, r1 = lower ? n : std::min(n, j1);
  for (std::int64_t p0 = 0; p0 < k; p0 += chunk<float>) {
    const std::int64_t kk = std::min(chunk<float>, k - p0);
    transpose_rows(kk, a + p0, lda, r0, r1, buffer, ldb);
    syrk_columns_avx512<float>(lower, n, kk, alpha, buffer, ldb, p0 == 0 ? beta : 1.0f, c, ldc, j0, j1);
  }
}

// transpose_rows for the mode unfolding of x, a row-major (outer, n, inner) tensor whose slabs
// (its n inner elements of one outer index) lie `slab` apart: A(p, i) = x[(p / inner) slab +
// i inner + p % inner] (A k x n, k = outer inner, the unfolding impl::kernels::UnfoldMode writes
// as A^T) for p in [p0, p0 + kk), rows i in [r0, r1) (r0 a multiple of 16), into b(i, p - p0).
// Each group of 16 steps of k is at most 16 runs of consecutive p within one slab x[g slab ...]
// (3 for inner = 9), every run one masked load per row at a shifted address; the same 16 x 16
// transposition then. Groups of p outermost: each slab's rows are read in order.
LATHER_AVX512_FN void transpose_unfolded_rows(std::int64_t kk, std::int64_t p0, std::int64_t k_end, const float* x,
                                              std::int64_t inner, std::int64_t slab, std::int64_t r0, std::int64_t r1,
                                              float* b, std::int64_t ldb) {
  __mmask16 mask[16];
  std::int64_t offset[16];
  for (std::int64_t q0 = 0; q0 < kk; q0 += 16) {
    const auto np = static_cast<int>(std::min<std::int64_t>(16, kk - q0));
    int runs = 0;
    for (int l = 0; l < np;) {
      const std::int64_t p = p0 + q0 + l, g = p / inner, e = p - g * inner;
      const auto len = static_cast<int>(std::min<std::int64_t>(np - l, inner - e));
      mask[runs] = static_cast<__mmask16>(((1u << len) - 1u) << l);
      offset[runs++] = g * slab + e - l;  // lane l of the run reads x[g slab + e + i inner]
      l += len;
    }
    // The slabs of the group of p transpose_ahead groups on (its first and last p's: every
    // slab between), whose rows this group's row blocks prefetch as they go.
    const std::int64_t pa = p0 + q0 + 16 * transpose_ahead;
    const std::int64_t ga = pa / inner, gb = std::min(pa + 15, k_end - 1) / inner;
    for (std::int64_t i0 = r0; i0 < r1; i0 += 16) {
      const auto ni = static_cast<int>(std::min<std::int64_t>(16, r1 - i0));
      const auto rows = static_cast<__mmask16>(ni == 16 ? 0xFFFFu : (1u << ni) - 1u);
      const float* const xi = x + i0 * inner;
      if (pa < k_end)
        for (std::int64_t g = ga; g <= gb; ++g)
          for (std::int64_t o = 0; o < ni * inner + 16; o += 16)
            _mm_prefetch(reinterpret_cast<const char*>(xi + g * slab + o), _MM_HINT_T0);
      __m512 r[16];
#pragma GCC unroll 16
      for (int c = 0; c < 16; ++c) {
        r[c] = _mm512_setzero_ps();
        if (c < ni)
          for (int j = 0; j < runs; ++j) r[c] = _mm512_mask_loadu_ps(r[c], mask[j], xi + offset[j] + c * inner);
      }
      transpose16(r);
#pragma GCC unroll 16
      for (int q = 0; q < 16; ++q)
        if (q < np) _mm512_mask_storeu_ps(b + i0 + (q0 + q) * ldb, rows, r[q]);
    }
  }
}

// syrk_columns_transposed_avx512 of A^T A with A the mode unfolding of x (transpose_unfolded_rows):
// the unfolding's copy and the transposition's in one pass.
LATHER_AVX512_FN void syrk_columns_unfolded_avx512(bool lower, std::int64_t n, std::int64_t outer, std::int64_t inner,
                                                   float alpha, const float* x, std::int64_t slab, float beta, float* c,
                                                   std::int64_t ldc, std::int64_t j0, std::int64_t j1) {
  float* const buffer = transposed_buffer();
  const std::int64_t ldb = transposed_ld(n), k = outer * inner;
  const std::int64_t r0 = lower ? j0 / 16 * 16 : 0, r1 = lower ? n : std::min(n, j1);
  for (std::int64_t p0 = 0; p0 < k; p0 += chunk<float>) {
    const std::int64_t kk = std::min(chunk<float>, k - p0);
    transpose_unfolded_rows(kk, p0, k, x, inner, slab, r0, r1, buffer, ldb);
    syrk_columns_avx512<float>(lower, n, kk, alpha, buffer, ldb, p0 == 0 ? beta : 1.0f, c, ldc, j0, j1);
  }
}
#endif

}  // namespace detail

/// Columns [j0, j1) of the `uplo` triangle of C (n x n, column-major, ldc >= n) = alpha A A^T +
/// beta C, A n x k column-major (lda >= n): the BLAS' SYRK with trans 'N' where takes<T>(n, k,
/// alpha), a band of it otherwise. C is not read where beta is 0; the other triangle and the
/// other columns are not touched. Never called where takes() is false.
template <class T>
void syrk_columns(char uplo, std::int64_t n, std::int64_t k, T alpha, const T* a, std::int64_t lda, T beta, T* c,
                  std::int64_t ldc, std::int64_t j0, std::int64_t j1) {
#ifdef LATHER_HAS_AVX512_DISPATCH
  detail::syrk_columns_avx512<T>(uplo == 'L' || uplo == 'l', n, k, alpha, a, lda, beta, c, ldc, j0, j1);
#else
  (void)uplo, (void)n, (void)k, (void)alpha, (void)a, (void)lda, (void)beta, (void)c, (void)ldc, (void)j0, (void)j1;
#endif
}

/// syrk_columns with trans 'T': C = alpha A^T A + beta C, A k x n column-major (lda >= k), where
/// takes_transposed<T>(n, k, alpha). The same bits as syrk_columns on A^T. The thread's first call
/// allocates its transposition buffer (about 1 MiB), no later one.
template <class T>
void syrk_columns_transposed(char uplo, std::int64_t n, std::int64_t k, T alpha, const T* a, std::int64_t lda, T beta,
                             T* c, std::int64_t ldc, std::int64_t j0, std::int64_t j1) {
#ifdef LATHER_HAS_AVX512_DISPATCH
  if constexpr (std::is_same_v<T, float>)
    detail::syrk_columns_transposed_avx512(uplo == 'L' || uplo == 'l', n, k, alpha, a, lda, beta, c, ldc, j0, j1);
#else
  (void)uplo, (void)n, (void)k, (void)alpha, (void)a, (void)lda, (void)beta, (void)c, (void)ldc, (void)j0, (void)j1;
#endif
}

/// syrk_columns_transposed with A (k x n, k = outer inner) the mode unfolding of x, a row-major
/// (outer, n, inner) tensor: C = alpha X_(1) X_(1)^T + beta C, X_(1) the n x k matrix of x's
/// middle mode (impl::kernels::UnfoldMode's layout), read from x where it is. Where
/// takes_transposed<T>(n, outer inner, alpha); the same bits as UnfoldMode followed by
/// syrk_columns_transposed (the same buffer, filled in one pass instead of two). `slab`: how far
/// apart x's n inner elements of each outer index lie (0: n inner, x contiguous; more for a
/// block read in its parameter, whose second dimension is split).
template <class T>
void syrk_columns_unfolded(char uplo, std::int64_t n, std::int64_t outer, std::int64_t inner, T alpha, const T* x,
                           T beta, T* c, std::int64_t ldc, std::int64_t j0, std::int64_t j1, std::int64_t slab = 0) {
#ifdef LATHER_HAS_AVX512_DISPATCH
  if constexpr (std::is_same_v<T, float>)
    detail::syrk_columns_unfolded_avx512(uplo == 'L' || uplo == 'l', n, outer, inner, alpha, x,
                                         slab > 0 ? slab : n * inner, beta, c, ldc, j0, j1);
#else
  (void)uplo, (void)n, (void)outer, (void)inner, (void)alpha, (void)x, (void)beta, (void)c, (void)ldc, (void)j0, (void)j1,
      (void)slab;
#endif
}

/// The whole `uplo` triangle of C = alpha A^T A + beta C: syrk_columns_transposed over [0, n).
template <class T>
void syrk_t(char uplo, std::int64_t n, std::int64_t k, T alpha, const T* a, std::int64_t lda, T beta, T* c,
            std::int64_t ldc) {
  syrk_columns_transposed<T>(uplo, n, k, alpha, a, lda, beta, c, ldc, 0, n);
}

/// The whole `uplo` triangle: syrk_columns over [0, n).
template <class T>
void syrk_n(char uplo, std::int64_t n, std::int64_t k, T alpha, const T* a, std::int64_t lda, T beta, T* c,
            std::int64_t ldc) {
  syrk_columns<T>(uplo, n, k, alpha, a, lda, beta, c, ldc, 0, n);
}

}  // namespace lather::impl::blas::tiled

#endif
