// SPDX-License-Identifier: Apache-2.0
/// \file
/// \brief Private. SGD, Adagrad and RMSprop on contiguous host arrays with SSE2 vectors (and
/// AVX-512, or AVX on CPUs without it, for Adagrad's and RMSprop's square roots and divisions
/// where the CPU has them, kernels/host_simd.hpp): the jobs of the host chunk loop (impl/diagonal_optimizer.hpp,
/// kernels/host_chunks.hpp).
///
/// Why: as for Adam (kernels/adam_simd.hpp), GCC keeps errno semantics for `sqrt` unless
/// -fno-math-errno is given, so the scalar kernels' square root is a call per element and their
/// loops never vectorize: in the chunk loop Adagrad and RMSprop ran at 13 GB/s (bench_diagonal,
/// mlp, 2 threads). SGD with momentum has no square root, but its loop-invariant flags stayed as
/// branches in a scalar loop (13 GB/s too). The operations and their order are exactly SgdStep's,
/// AdagradStep's and RmspropStep's (kernels/diagonal.hpp, torch's); IEEE sqrt and division are
/// correctly rounded in both forms and x86-64 has no FMA contraction at the baseline, so the
/// results are the scalar kernels' bits (tested).
#ifndef LATHER_IMPL_KERNELS_DIAGONAL_HOST_JOBS_HPP
#define LATHER_IMPL_KERNELS_DIAGONAL_HOST_JOBS_HPP

#include <lather/impl/kernels/adam_simd.hpp>

#include <cmath>
#include <cstdint>
#include <type_traits>

namespace lather::impl::kernels {

#ifdef LATHER_HAS_ADAM_SIMD
namespace simd_detail {
/// The gradient a step uses, as the scalar kernels form it: negated with `maximize`, then plus
/// weight_decay * p (L2) when `wd_on`.
template <class S>
typename S::reg step_gradient(typename S::reg g, typename S::reg p, bool maximize, bool wd_on, typename S::reg wd) {
  if (maximize) g = S::neg(g);
  if (wd_on) g = S::add(g, S::mul(wd, p));
  return g;
}
}  // namespace simd_detail
#endif

/// One SGD step of contiguous host arrays: a job of the host chunk loop. `momentum_buffer` is
/// used only with `use_momentum`; `first_momentum_step` copies the direction into it (torch).
template <class T>
struct SgdHostJob {
  T* p;
  const T* g;
  T* momentum_buffer;
  T lr, weight_decay, momentum, one_minus_dampening;
  bool nesterov, maximize, use_momentum, first_momentum_step;

  void operator()(std::int64_t begin, std::int64_t end) const {
    // The momentum flags select the loop once per chunk: as branches inside it they cost a
    // third of the in-cache rate.
    if (!use_momentum) run<false, false, false>(begin, end);
    else if (first_momentum_step) nesterov ? run<true, true, true>(begin, end) : run<true, true, false>(begin, end);
    else nesterov ? run<true, false, true>(begin, end) : run<true, false, false>(begin, end);
  }

 private:
  template <bool Momentum, bool First, bool Nesterov>
  void run(std::int64_t begin, std::int64_t end) const {
    std::int64_t i = begin;
#ifdef LATHER_HAS_ADAM_SIMD
    if constexpr (std::is_same_v<T, float> || std::is_same_v<T, double>) {
      using S = simd_detail::Sse<T>;
      const auto wd = S::set1(weight_decay), mu = S::set1(momentum), omd = S::set1(one_minus_dampening),
                 neg_lr = S::set1(-lr);
      const bool wd_on = weight_decay != T(0);  // torch adds weight_decay * p only when nonzero
      for (; i + S::lanes <= end; i += S::lanes) {
        const auto pi = S::load(p + i);
        auto d = simd_detail::step_gradient<S>(S::load(g + i), pi, maximize, wd_on, wd);
        if constexpr (Momentum) {
          typename S::reg b;
          if constexpr (First) b = d;
          else b = S::add(S::mul(S::load(momentum_buffer + i), mu), S::mul(omd, d));
          S::store(momentum_buffer + i, b);
          if constexpr (Nesterov) d = S::add(d, S::mul(mu, b));
          else d = b;
        }
        S::store(p + i, S::add(pi, S::mul(neg_lr, d)));
      }
    }
#endif
    for (; i < end; ++i) {
      T d = maximize ? -g[i] : g[i];
      if (weight_decay != T(0)) d = d + weight_decay * p[i];
      if constexpr (Momentum) {
        const T b = First ? d : momentum_buffer[i] * momentum + one_minus_dampening * d;
        momentum_buffer[i] = b;
        d = Nesterov ? d + momentum * b : b;
      }
      p[i] = p[i] + (-lr) * d;
    }
  }
};

/// One Adagrad step of contiguous host arrays: a job of the host chunk loop.
template <class T>
struct AdagradHostJob {
  T* p;
  const T* g;
  T* sum;
  T clr, weight_decay, eps;
  bool maximize;

  void operator()(std::int64_t begin, std::int64_t end) const {
    std::int64_t i = begin;
#ifdef LATHER_HAS_AVX512_DISPATCH
    if constexpr (std::is_same_v<T, float> || std::is_same_v<T, double>) {
      if (end - i >= simd_detail::Avx512<T>::lanes && simd_detail::use_avx512()) i = run_avx512(i, end);
      else if (end - i >= simd_detail::Avx<T>::lanes && simd_detail::use_avx()) i = run_avx(i, end);
    }
#endif
#ifdef LATHER_HAS_ADAM_SIMD
    if constexpr (std::is_same_v<T, float> || std::is_same_v<T, double>) {
      using S = simd_detail::Sse<T>;
      const auto one = S::set1(T(1)), wd = S::set1(weight_decay), neg_clr = S::set1(-clr), e = S::set1(eps);
      const bool wd_on = weight_decay != T(0);  // torch adds weight_decay * p only when nonzero
      for (; i + S::lanes <= end; i += S::lanes) {
        const auto pi = S::load(p + i);
        const auto gi = simd_detail::step_gradient<S>(S::load(g + i), pi, maximize, wd_on, wd);
        const auto s = S::add(S::mul(S::load(sum + i), one), S::mul(S::mul(one, gi), gi));  // second_moment(sum, g, 1, 1)
        S::store(sum + i, s);
        S::store(p + i, S::add(pi, S::div(S::mul(neg_clr, gi), S::add(S::sqrt(s), e))));
      }
    }
#endif
    for (; i < end; ++i) {
      T gi = maximize ? -g[i] : g[i];
      if (weight_decay != T(0)) gi = gi + weight_decay * p[i];
      const T s = sum[i] * T(1) + T(1) * gi * gi;
      sum[i] = s;
      p[i] = p[i] + (-clr) * gi / (std::sqrt(s) + eps);
    }
  }

 private:
#ifdef LATHER_HAS_AVX512_DISPATCH
  // The SSE2 loop's operations with AVX-512 (impl/kernels/host_simd.hpp); returns where it stopped.
  LATHER_AVX512_FN std::int64_t run_avx512(std::int64_t i, std::int64_t end) const {
    using S = simd_detail::Avx512<T>;
    const auto one = S::set1(T(1)), wd = S::set1(weight_decay), neg_clr = S::set1(-clr), e = S::set1(eps);
    const bool wd_on = weight_decay != T(0);
    for (; i + S::lanes <= end; i += S::lanes) {
      const auto pi = S::load(p + i);
      auto gi = S::load(g + i);
      if (maximize) gi = S::neg(gi);
      if (wd_on) gi = S::add(gi, S::mul(wd, pi));
      const auto s = S::add(S::mul(S::load(sum + i), one), S::mul(S::mul(one, gi), gi));
      S::store(sum + i, s);
      S::store(p + i, S::add(pi, S::div(S::mul(neg_clr, gi), S::add(S::sqrt(s), e))));
    }
    return i;
  }
  // The same with AVX (CPUs without AVX-512).
  LATHER_AVX_FN std::int64_t run_avx(std::int64_t i, std::int64_t end) const {
    using S = simd_detail::Avx<T>;
    const auto one = S::set1(T(1)), wd = S::set1(weight_decay), neg_clr = S::set1(-clr), e = S::set1(eps);
    const bool wd_on = weight_decay != T(0);
    for (; i + S::lanes <= end; i += S::lanes) {
      const auto pi = S::load(p + i);
      auto gi = S::load(g + i);
      if (maximize) gi = S::neg(gi);
      if (wd_on) gi = S::add(gi, S::mul(wd, pi));
      const auto s = S::add(S::mul(S::load(sum + i), one), S::mul(S::mul(one, gi), gi));
      S::store(sum + i, s);
      S::store(p + i, S::add(pi, S::div(S::mul(neg_clr, gi), S::add(S::sqrt(s), e))));
    }
    return i;
  }
#endif
};

/// One RMSprop step of contiguous host arrays: a job of the host chunk loop. `grad_avg` and
/// `momentum_buffer` are used only with `centered` and `use_momentum`.
template <class T>
struct RmspropHostJob {
  T* p;
  const T* g;
  T* square_avg;
  T* grad_avg;
  T* momentum_buffer;
  T lr, alpha, one_minus_alpha, eps, weight_decay, momentum;
  bool centered, use_momentum, maximize;

  void operator()(std::int64_t begin, std::int64_t end) const {
    std::int64_t i = begin;
#ifdef LATHER_HAS_AVX512_DISPATCH
    if constexpr (std::is_same_v<T, float> || std::is_same_v<T, double>) {
      if (end - i >= simd_detail::Avx512<T>::lanes && simd_detail::use_avx512()) i = run_avx512(i, end);
      else if (end - i >= simd_detail::Avx<T>::lanes && simd_detail::use_avx()) i = run_avx(i, end);
    }
#endif
#ifdef LATHER_HAS_ADAM_SIMD
    if constexpr (std::is_same_v<T, float> || std::is_same_v<T, double>) {
      using S = simd_detail::Sse<T>;
      const auto a = S::set1(alpha), oma = S::set1(one_minus_alpha), e = S::set1(eps), wd = S::set1(weight_decay),
                 mu = S::set1(momentum), neg_lr = S::set1(-lr), minus_one = S::set1(T(-1));
      const bool wd_on = weight_decay != T(0);  // torch adds weight_decay * p only when nonzero
      for (; i + S::lanes <= end; i += S::lanes) {
        const auto pi = S::load(p + i);
        const auto gi = simd_detail::step_gradient<S>(S::load(g + i), pi, maximize, wd_on, wd);
        const auto sq = S::add(S::mul(S::load(square_avg + i), a), S::mul(S::mul(oma, gi), gi));
        S::store(square_avg + i, sq);
        typename S::reg avg;
        if (centered) {
          const auto ga = S::add(S::mul(S::load(grad_avg + i), a), S::mul(oma, gi));
          S::store(grad_avg + i, ga);
          avg = S::add(S::sqrt(S::add(sq, S::mul(S::mul(minus_one, ga), ga))), e);
        } else {
          avg = S::add(S::sqrt(sq), e);
        }
        if (use_momentum) {
          const auto b = S::add(S::mul(S::load(momentum_buffer + i), mu), S::div(gi, avg));
          S::store(momentum_buffer + i, b);
          S::store(p + i, S::add(pi, S::mul(neg_lr, b)));
        } else {
          S::store(p + i, S::add(pi, S::div(S::mul(neg_lr, gi), avg)));
        }
      }
    }
#endif
    for (; i < end; ++i) {
      T gi = maximize ? -g[i] : g[i];
      if (weight_decay != T(0)) gi = gi + weight_decay * p[i];
      const T sq = square_avg[i] * alpha + one_minus_alpha * gi * gi;
      square_avg[i] = sq;
      T avg;
      if (centered) {
        const T ga = grad_avg[i] * alpha + one_minus_alpha * gi;
        grad_avg[i] = ga;
        avg = std::sqrt(sq + T(-1) * ga * ga) + eps;
      } else {
        avg = std::sqrt(sq) + eps;
      }
      if (use_momentum) {
        const T b = momentum_buffer[i] * momentum + gi / avg;
        momentum_buffer[i] = b;
        p[i] = p[i] + (-lr) * b;
      } else {
        p[i] = p[i] + (-lr) * gi / avg;
      }
    }
  }

 private:
#ifdef LATHER_HAS_AVX512_DISPATCH
  // The SSE2 loop's operations with AVX-512 (impl/kernels/host_simd.hpp); returns where it stopped.
  LATHER_AVX512_FN std::int64_t run_avx512(std::int64_t i, std::int64_t end) const {
    using S = simd_detail::Avx512<T>;
    const auto a = S::set1(alpha), oma = S::set1(one_minus_alpha), e = S::set1(eps), wd = S::set1(weight_decay),
               mu = S::set1(momentum), neg_lr = S::set1(-lr), minus_one = S::set1(T(-1));
    const bool wd_on = weight_decay != T(0);
    for (; i + S::lanes <= end; i += S::lanes) {
      const auto pi = S::load(p + i);
      auto gi = S::load(g + i);
      if (maximize) gi = S::neg(gi);
      if (wd_on) gi = S::add(gi, S::mul(wd, pi));
      const auto sq = S::add(S::mul(S::load(square_avg + i), a), S::mul(S::mul(oma, gi), gi));
      S::store(square_avg + i, sq);
      typename S::reg avg;
      if (centered) {
        const auto ga = S::add(S::mul(S::load(grad_avg + i), a), S::mul(oma, gi));
        S::store(grad_avg + i, ga);
        avg = S::add(S::sqrt(S::add(sq, S::mul(S::mul(minus_one, ga), ga))), e);
      } else {
        avg = S::add(S::sqrt(sq), e);
      }
      if (use_momentum) {
        const auto b = S::add(S::mul(S::load(momentum_buffer + i), mu), S::div(gi, avg));
        S::store(momentum_buffer + i, b);
        S::store(p + i, S::add(pi, S::mul(neg_lr, b)));
      } else {
        S::store(p + i, S::add(pi, S::div(S::mul(neg_lr, gi), avg)));
      }
    }
    return i;
  }
  // The same with AVX (CPUs without AVX-512).
  LATHER_AVX_FN std::int64_t run_avx(std::int64_t i, std::int64_t end) const {
    using S = simd_detail::Avx<T>;
    const auto a = S::set1(alpha), oma = S::set1(one_minus_alpha), e = S::set1(eps), wd = S::set1(weight_decay),
               mu = S::set1(momentum), neg_lr = S::set1(-lr), minus_one = S::set1(T(-1));
    const bool wd_on = weight_decay != T(0);
    for (; i + S::lanes <= end; i += S::lanes) {
      const auto pi = S::load(p + i);
      auto gi = S::load(g + i);
      if (maximize) gi = S::neg(gi);
      if (wd_on) gi = S::add(gi, S::mul(wd, pi));
      const auto sq = S::add(S::mul(S::load(square_avg + i), a), S::mul(S::mul(oma, gi), gi));
      S::store(square_avg + i, sq);
      typename S::reg avg;
      if (centered) {
        const auto ga = S::add(S::mul(S::load(grad_avg + i), a), S::mul(oma, gi));
        S::store(grad_avg + i, ga);
        avg = S::add(S::sqrt(S::add(sq, S::mul(S::mul(minus_one, ga), ga))), e);
      } else {
        avg = S::add(S::sqrt(sq), e);
      }
      if (use_momentum) {
        const auto b = S::add(S::mul(S::load(momentum_buffer + i), mu), S::div(gi, avg));
        S::store(momentum_buffer + i, b);
        S::store(p + i, S::add(pi, S::mul(neg_lr, b)));
      } else {
        S::store(p + i, S::add(pi, S::div(S::mul(neg_lr, gi), avg)));
      }
    }
    return i;
  }
#endif
};

}  // namespace lather::impl::kernels

#endif
