// SPDX-License-Identifier: Apache-2.0
/// \file
/// \brief Private. Adam/AdamW on contiguous host arrays with SSE2 vectors (x86-64's baseline).
///
/// Why: GCC keeps C's errno semantics for `sqrt` unless -fno-math-errno is given, so the scalar
/// kernel's square root is a call per element and the loop never vectorizes: AdamW ran at about
/// a quarter of the memory bandwidth (docs/performance.md). lather cannot change its users'
/// flags, so the host loop is written with SSE2 intrinsics. The operations and their order are
/// exactly AdamStep's (kernels/diagonal.hpp: torch's), IEEE sqrt and division are correctly
/// rounded in both forms and x86-64 has no FMA contraction at the baseline, so the results are
/// bit-identical to the scalar kernel's (tested). Where the CPU has AVX-512 or AVX, the same
/// operations run 16 or 8 floats wide (kernels/host_simd.hpp; AVX: AdamW about a quarter faster
/// on a Zen 3, 1 thread, 15.8 M parameters).
#ifndef LATHER_IMPL_KERNELS_ADAM_SIMD_HPP
#define LATHER_IMPL_KERNELS_ADAM_SIMD_HPP

#include <cmath>
#include <cstdint>
#include <type_traits>

#include <Kokkos_Core.hpp>

#include <lather/impl/kernels/host_simd.hpp>

// Host-only builds on x86-64 (GPU builds keep the portable kernel for every space).
#if defined(__SSE2__) && !defined(KOKKOS_ENABLE_CUDA) && !defined(KOKKOS_ENABLE_HIP) && !defined(KOKKOS_ENABLE_SYCL)
#define LATHER_HAS_ADAM_SIMD 1
#include <emmintrin.h>
#endif

namespace lather::impl::kernels {

/// The scalars of one Adam/AdamW step (AdamStep's, without amsgrad).
template <class T>
struct AdamScalars {
  T beta1, one_minus_beta1, beta2, one_minus_beta2;
  T l2_weight_decay, decoupled_factor, step_size, bias_correction2_sqrt, eps;
  bool maximize, decoupled;
};

/// One element, in AdamStep's order.
template <class T>
inline void adam_element(T* p, const T* g, T* m, T* v, const AdamScalars<T>& s) {
  T pi = *p;
  if (s.decoupled) pi = pi * s.decoupled_factor;
  T gi = s.maximize ? -*g : *g;
  if (s.l2_weight_decay != T(0)) gi = gi + s.l2_weight_decay * pi;
  const T mi = *m * s.beta1 + s.one_minus_beta1 * gi;
  const T vi = *v * s.beta2 + s.one_minus_beta2 * gi * gi;
  *m = mi;
  *v = vi;
  *p = pi + (-s.step_size) * mi / (std::sqrt(vi) / s.bias_correction2_sqrt + s.eps);
}

#ifdef LATHER_HAS_ADAM_SIMD
namespace simd_detail {
// The few SSE2 operations the loop needs, for float (4 lanes) and double (2 lanes).
template <class T>
struct Sse;
template <>
struct Sse<float> {
  using reg = __m128;
  static constexpr int lanes = 4;
  static reg load(const float* x) { return _mm_loadu_ps(x); }
  static void store(float* x, reg a) { _mm_storeu_ps(x, a); }
  static reg set1(float a) { return _mm_set1_ps(a); }
  static reg add(reg a, reg b) { return _mm_add_ps(a, b); }
  static reg mul(reg a, reg b) { return _mm_mul_ps(a, b); }
  static reg div(reg a, reg b) { return _mm_div_ps(a, b); }
  static reg sqrt(reg a) { return _mm_sqrt_ps(a); }
  static reg neg(reg a) { return _mm_xor_ps(a, _mm_set1_ps(-0.0f)); }
};
template <>
struct Sse<double> {
  using reg = __m128d;
  static constexpr int lanes = 2;
  static reg load(const double* x) { return _mm_loadu_pd(x); }
  static void store(double* x, reg a) { _mm_storeu_pd(x, a); }
  static reg set1(double a) { return _mm_set1_pd(a); }
  static reg add(reg a, reg b) { return _mm_add_pd(a, b); }
  static reg mul(reg a, reg b) { return _mm_mul_pd(a, b); }
  static reg div(reg a, reg b) { return _mm_div_pd(a, b); }
  static reg sqrt(reg a) { return _mm_sqrt_pd(a); }
  static reg neg(reg a) { return _mm_xor_pd(a, _mm_set1_pd(-0.0)); }
};
}  // namespace simd_detail
#endif

#ifdef LATHER_HAS_AVX512_DISPATCH
/// adam_range's vector loop with AVX-512 (host_simd.hpp); returns the first element not done.
template <class T>
LATHER_AVX512_FN std::int64_t adam_range_avx512(T* p, const T* g, T* m, T* v, std::int64_t i, std::int64_t end,
                                                const AdamScalars<T>& s) {
  using S = simd_detail::Avx512<T>;
  const auto b1 = S::set1(s.beta1), omb1 = S::set1(s.one_minus_beta1), b2 = S::set1(s.beta2),
             omb2 = S::set1(s.one_minus_beta2), l2 = S::set1(s.l2_weight_decay), df = S::set1(s.decoupled_factor),
             neg_step = S::set1(-s.step_size), bc2 = S::set1(s.bias_correction2_sqrt), eps = S::set1(s.eps);
  const bool l2_on = s.l2_weight_decay != T(0);
  for (; i + S::lanes <= end; i += S::lanes) {
    auto pi = S::load(p + i);
    if (s.decoupled) pi = S::mul(pi, df);
    auto gi = S::load(g + i);
    if (s.maximize) gi = S::neg(gi);
    if (l2_on) gi = S::add(gi, S::mul(l2, pi));
    const auto mi = S::add(S::mul(S::load(m + i), b1), S::mul(omb1, gi));
    const auto vi = S::add(S::mul(S::load(v + i), b2), S::mul(S::mul(omb2, gi), gi));
    S::store(m + i, mi);
    S::store(v + i, vi);
    const auto den = S::add(S::div(S::sqrt(vi), bc2), eps);
    S::store(p + i, S::add(pi, S::div(S::mul(neg_step, mi), den)));
  }
  return i;
}

/// The same with AVX (CPUs without AVX-512).
template <class T>
LATHER_AVX_FN std::int64_t adam_range_avx(T* p, const T* g, T* m, T* v, std::int64_t i, std::int64_t end,
                                          const AdamScalars<T>& s) {
  using S = simd_detail::Avx<T>;
  const auto b1 = S::set1(s.beta1), omb1 = S::set1(s.one_minus_beta1), b2 = S::set1(s.beta2),
             omb2 = S::set1(s.one_minus_beta2), l2 = S::set1(s.l2_weight_decay), df = S::set1(s.decoupled_factor),
             neg_step = S::set1(-s.step_size), bc2 = S::set1(s.bias_correction2_sqrt), eps = S::set1(s.eps);
  const bool l2_on = s.l2_weight_decay != T(0);
  for (; i + S::lanes <= end; i += S::lanes) {
    auto pi = S::load(p + i);
    if (s.decoupled) pi = S::mul(pi, df);
    auto gi = S::load(g + i);
    if (s.maximize) gi = S::neg(gi);
    if (l2_on) gi = S::add(gi, S::mul(l2, pi));
    const auto mi = S::add(S::mul(S::load(m + i), b1), S::mul(omb1, gi));
    const auto vi = S::add(S::mul(S::load(v + i), b2), S::mul(S::mul(omb2, gi), gi));
    S::store(m + i, mi);
    S::store(v + i, vi);
    const auto den = S::add(S::div(S::sqrt(vi), bc2), eps);
    S::store(p + i, S::add(pi, S::div(S::mul(neg_step, mi), den)));
  }
  return i;
}
#endif

/// Elements [begin, end) of contiguous arrays: AVX-512 where the CPU has it, else AVX, then SSE2,
/// then scalar for the rest (the same operations in the same order in each).
template <class T>
inline void adam_range(T* p, const T* g, T* m, T* v, std::int64_t begin, std::int64_t end, const AdamScalars<T>& s) {
  std::int64_t i = begin;
#ifdef LATHER_HAS_AVX512_DISPATCH
  if constexpr (std::is_same_v<T, float> || std::is_same_v<T, double>) {
    if (end - i >= simd_detail::Avx512<T>::lanes && simd_detail::use_avx512()) i = adam_range_avx512(p, g, m, v, i, end, s);
    else if (end - i >= simd_detail::Avx<T>::lanes && simd_detail::use_avx()) i = adam_range_avx(p, g, m, v, i, end, s);
  }
#endif
#ifdef LATHER_HAS_ADAM_SIMD
  if constexpr (std::is_same_v<T, float> || std::is_same_v<T, double>) {
    using S = simd_detail::Sse<T>;
    const auto b1 = S::set1(s.beta1), omb1 = S::set1(s.one_minus_beta1), b2 = S::set1(s.beta2),
               omb2 = S::set1(s.one_minus_beta2), l2 = S::set1(s.l2_weight_decay), df = S::set1(s.decoupled_factor),
               neg_step = S::set1(-s.step_size), bc2 = S::set1(s.bias_correction2_sqrt), eps = S::set1(s.eps);
    const bool l2_on = s.l2_weight_decay != T(0);
    for (; i + S::lanes <= end; i += S::lanes) {
      auto pi = S::load(p + i);
      if (s.decoupled) pi = S::mul(pi, df);
      auto gi = S::load(g + i);
      if (s.maximize) gi = S::neg(gi);
      if (l2_on) gi = S::add(gi, S::mul(l2, pi));
      const auto mi = S::add(S::mul(S::load(m + i), b1), S::mul(omb1, gi));
      const auto vi = S::add(S::mul(S::load(v + i), b2), S::mul(S::mul(omb2, gi), gi));
      S::store(m + i, mi);
      S::store(v + i, vi);
      const auto den = S::add(S::div(S::sqrt(vi), bc2), eps);
      S::store(p + i, S::add(pi, S::div(S::mul(neg_step, mi), den)));
    }
  }
#endif
  for (; i < end; ++i) adam_element(p + i, g + i, m + i, v + i, s);
}

/// One parameter's part of a host chunk loop (DiagonalOptimizer: all parameters' chunks in one
/// parallel loop).
template <class T>
struct AdamHostJob {
  T* p;
  const T* g;
  T* m;
  T* v;
  AdamScalars<T> s;
  void operator()(std::int64_t begin, std::int64_t end) const { adam_range(p, g, m, v, begin, end, s); }
};

}  // namespace lather::impl::kernels

#endif
