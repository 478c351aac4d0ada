// SPDX-License-Identifier: Apache-2.0
/// \file
/// \brief Private. Run-time choice of AVX-512 or AVX for the host loops whose cost is division
/// and square root (Adam's update, Shampoo's grafting norm), and the few wide operations they use.
///
/// Why: x86-64's baseline is SSE2, and lather cannot change its users' flags. On CPUs whose
/// divider and square root are as wide as the vector (AMD Zen 4/5), a 16-lane AVX-512 loop does
/// these operations about 4x faster than 4-lane SSE2 (measured: a Shampoo grafting norm over
/// 65536 floats, 47.6 us SSE2, 24.4 us AVX, 12.3 us AVX-512 on a Zen 5 EPYC). CPUs with AVX but
/// no AVX-512 (Zen 2/3, most Intel client parts) get an 8-lane AVX form of the same loops
/// (measured on a Zen 3: the grafting norm went from 4% to 2.5% of a steady gpt2-block step at
/// block size 256, perf; an AdamW step over 15.8 M parameters on 1 thread from 21-27 to 18-19 ms).
/// The functions carry `target("avx512f")` or `target("avx")` and run only where the CPU and the
/// OS support that instruction set.
///
/// Bits: IEEE division, square root, addition and multiplication are correctly rounded at every
/// width, so the wide loops give the scalar kernels' bits as long as nothing is fused: with
/// AVX-512F enabled GCC contracts `a + b * c` into an FMA under its default -ffp-contract=fast,
/// so products and sums go through the explicit-rounding intrinsics, which it does not contract
/// (clang contracts neither form at its default -ffp-contract=on). AVX alone has no FMA, so the
/// AVX loops use the plain intrinsics. Tested bit for bit against the scalar kernels, with each
/// wide path allowed and forced off.
///
/// Each wide loop is its own function carrying the attribute, beside its SSE2 loop: one loop
/// template for both widths cannot be written, because GCC and clang refuse to inline the AVX-512
/// operations into a template compiled without AVX-512 ("target specific option mismatch"; tried).
#ifndef LATHER_IMPL_KERNELS_HOST_SIMD_HPP
#define LATHER_IMPL_KERNELS_HOST_SIMD_HPP

#include <Kokkos_Core.hpp>  // KOKKOS_ENABLE_* below

#include <algorithm>
#include <atomic>
#include <cstdint>

// Host-only builds on x86-64 with GCC or clang (GPU builds keep the portable kernels).
#if defined(__SSE2__) && defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__)) &&            \
    !defined(KOKKOS_ENABLE_CUDA) && !defined(KOKKOS_ENABLE_HIP) && !defined(KOKKOS_ENABLE_SYCL) &&   \
    !defined(LATHER_DISABLE_AVX512)
#define LATHER_HAS_AVX512_DISPATCH 1
#include <immintrin.h>
#endif

namespace lather::impl::kernels::simd_detail {

/// The widest instruction set the host loops may use: the CPU's own limit applies on top.
enum class SimdLimit : int { baseline = 0, avx = 1, avx512 = 2 };

/// The current limit (SimdLimit::avx512 unless a test lowered it).
inline std::atomic<int>& simd_limit() {
  static std::atomic<int> limit{static_cast<int>(SimdLimit::avx512)};
  return limit;
}

/// Whether the host loops take their AVX-512 form now.
inline bool use_avx512() {
#ifdef LATHER_HAS_AVX512_DISPATCH
  // Checks the CPU and the OS's saving of the AVX-512 registers (XCR0), once.
  static const bool supported = __builtin_cpu_supports("avx512f");
  return supported && simd_limit().load(std::memory_order_relaxed) >= static_cast<int>(SimdLimit::avx512);
#else
  return false;
#endif
}

/// Whether the host loops that have an AVX form may take it now (they prefer AVX-512 where both apply).
inline bool use_avx() {
#ifdef LATHER_HAS_AVX512_DISPATCH
  // Checks the CPU and the OS's saving of the AVX registers (XCR0), once.
  static const bool supported = __builtin_cpu_supports("avx");
  return supported && simd_limit().load(std::memory_order_relaxed) >= static_cast<int>(SimdLimit::avx);
#else
  return false;
#endif
}

/// While alive, the host loops use at most `limit` (never more than an enclosing limit): for tests.
class ScopedSimdLimit {
 public:
  explicit ScopedSimdLimit(SimdLimit limit) : m_previous(simd_limit().load()) {
    simd_limit().store(std::min(m_previous, static_cast<int>(limit)));
  }
  ~ScopedSimdLimit() { simd_limit().store(m_previous); }
  ScopedSimdLimit(const ScopedSimdLimit&) = delete;
  ScopedSimdLimit& operator=(const ScopedSimdLimit&) = delete;

 private:
  int m_previous;
};

/// While alive, the host loops keep their baseline (SSE2 or scalar) form: for tests.
class ScopedBaselineSimd : public ScopedSimdLimit {
 public:
  ScopedBaselineSimd() : ScopedSimdLimit(SimdLimit::baseline) {}
};

#ifdef LATHER_HAS_AVX512_DISPATCH
#define LATHER_AVX512_FN __attribute__((target("avx512f"))) inline
#define LATHER_AVX_FN __attribute__((target("avx"))) inline
/// AVX-512 registers for float (16 lanes) and double (8 lanes). The arithmetic is the
/// explicit-rounding forms (see the file comment: no FMA contraction), zero-masked with every lane
/// set: the unmasked ones start from an undefined register, which GCC 12 reports as maybe
/// uninitialized.
template <class T>
struct Avx512;
template <>
struct Avx512<float> {
  using reg = __m512;
  static constexpr int lanes = 16;
  LATHER_AVX512_FN static reg load(const float* x) { return _mm512_loadu_ps(x); }
  LATHER_AVX512_FN static void store(float* x, reg a) { _mm512_storeu_ps(x, a); }
  LATHER_AVX512_FN static reg set1(float a) { return _mm512_set1_ps(a); }
  LATHER_AVX512_FN static reg add(reg a, reg b) { return _mm512_maskz_add_round_ps(0xFFFF, a, b, _MM_FROUND_CUR_DIRECTION); }
  LATHER_AVX512_FN static reg mul(reg a, reg b) { return _mm512_maskz_mul_round_ps(0xFFFF, a, b, _MM_FROUND_CUR_DIRECTION); }
  LATHER_AVX512_FN static reg div(reg a, reg b) { return _mm512_maskz_div_round_ps(0xFFFF, a, b, _MM_FROUND_CUR_DIRECTION); }
  LATHER_AVX512_FN static reg sqrt(reg a) { return _mm512_maskz_sqrt_round_ps(0xFFFF, a, _MM_FROUND_CUR_DIRECTION); }
  LATHER_AVX512_FN static reg neg(reg a) {
    return _mm512_castsi512_ps(_mm512_xor_si512(_mm512_castps_si512(a), _mm512_set1_epi32(static_cast<int>(0x80000000u))));
  }
};
template <>
struct Avx512<double> {
  using reg = __m512d;
  static constexpr int lanes = 8;
  LATHER_AVX512_FN static reg load(const double* x) { return _mm512_loadu_pd(x); }
  LATHER_AVX512_FN static void store(double* x, reg a) { _mm512_storeu_pd(x, a); }
  LATHER_AVX512_FN static reg set1(double a) { return _mm512_set1_pd(a); }
  LATHER_AVX512_FN static reg add(reg a, reg b) { return _mm512_maskz_add_round_pd(0xFF, a, b, _MM_FROUND_CUR_DIRECTION); }
  LATHER_AVX512_FN static reg mul(reg a, reg b) { return _mm512_maskz_mul_round_pd(0xFF, a, b, _MM_FROUND_CUR_DIRECTION); }
  LATHER_AVX512_FN static reg div(reg a, reg b) { return _mm512_maskz_div_round_pd(0xFF, a, b, _MM_FROUND_CUR_DIRECTION); }
  LATHER_AVX512_FN static reg sqrt(reg a) { return _mm512_maskz_sqrt_round_pd(0xFF, a, _MM_FROUND_CUR_DIRECTION); }
  LATHER_AVX512_FN static reg neg(reg a) {
    return _mm512_castsi512_pd(
        _mm512_xor_si512(_mm512_castpd_si512(a), _mm512_set1_epi64(static_cast<long long>(0x8000000000000000ull))));
  }
};

/// AVX registers for float (8 lanes) and double (4 lanes): plain intrinsics (AVX has no FMA, so
/// nothing can be contracted).
template <class T>
struct Avx;
template <>
struct Avx<float> {
  using reg = __m256;
  static constexpr int lanes = 8;
  LATHER_AVX_FN static reg load(const float* x) { return _mm256_loadu_ps(x); }
  LATHER_AVX_FN static void store(float* x, reg a) { _mm256_storeu_ps(x, a); }
  LATHER_AVX_FN static reg set1(float a) { return _mm256_set1_ps(a); }
  LATHER_AVX_FN static reg add(reg a, reg b) { return _mm256_add_ps(a, b); }
  LATHER_AVX_FN static reg mul(reg a, reg b) { return _mm256_mul_ps(a, b); }
  LATHER_AVX_FN static reg div(reg a, reg b) { return _mm256_div_ps(a, b); }
  LATHER_AVX_FN static reg sqrt(reg a) { return _mm256_sqrt_ps(a); }
  LATHER_AVX_FN static reg neg(reg a) { return _mm256_xor_ps(a, _mm256_set1_ps(-0.0f)); }
};
template <>
struct Avx<double> {
  using reg = __m256d;
  static constexpr int lanes = 4;
  LATHER_AVX_FN static reg load(const double* x) { return _mm256_loadu_pd(x); }
  LATHER_AVX_FN static void store(double* x, reg a) { _mm256_storeu_pd(x, a); }
  LATHER_AVX_FN static reg set1(double a) { return _mm256_set1_pd(a); }
  LATHER_AVX_FN static reg add(reg a, reg b) { return _mm256_add_pd(a, b); }
  LATHER_AVX_FN static reg mul(reg a, reg b) { return _mm256_mul_pd(a, b); }
  LATHER_AVX_FN static reg div(reg a, reg b) { return _mm256_div_pd(a, b); }
  LATHER_AVX_FN static reg sqrt(reg a) { return _mm256_sqrt_pd(a); }
  LATHER_AVX_FN static reg neg(reg a) { return _mm256_xor_pd(a, _mm256_set1_pd(-0.0)); }
};
#endif

}  // namespace lather::impl::kernels::simd_detail

namespace lather::impl::kernels {

/// Asks the cache for the `count` elements at x ahead of writing them (a hint: no effect on the
/// results; nothing where the compiler has no prefetch builtin). For rows a stride apart, which
/// the hardware prefetcher does not follow across the gaps.
template <class T>
inline void prefetch_for_write(const T* x, std::int64_t count) {
#if defined(__GNUC__) || defined(__clang__)
  const char* const c = reinterpret_cast<const char*>(x);
  const std::int64_t bytes = count * static_cast<std::int64_t>(sizeof(T));
  for (std::int64_t b = 0; b < bytes; b += 64) __builtin_prefetch(c + b, 1, 3);
#else
  (void)x, (void)count;
#endif
}

}  // namespace lather::impl::kernels

#endif
