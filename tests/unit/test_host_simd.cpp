// SPDX-License-Identifier: Apache-2.0
// The host loops' run-time AVX-512 and AVX forms (impl/kernels/host_simd.hpp) against the scalar
// kernels, bit for bit: Shampoo's grafting norm (host_block_sq_norm: 16 partial sums, element q
// into partial q % 16), filter loop (host_filter_wide) and update loop (host_update_row), Adam's update (adam_range) and the Adagrad and RMSprop chunk jobs, each
// with the wide path taken where the CPU has it, limited to AVX and forced off (the SSE2 / scalar
// form), at lengths around every vector and tail edge and from unaligned starts; the screen's
// NaN/Inf count (host_count_nonfinite) against a plain count; then whole
// Shampoo and AdamW trajectories on every execution space with the wide path on and off. Exact equality is the claim: IEEE division, square root, sums
// and products are correctly rounded at every width and nothing may be fused into an FMA.
#include <lather/impl/kernels/adam_simd.hpp>
#include <lather/impl/kernels/diagonal_host_jobs.hpp>
#include <lather/impl/kernels/host_chunks.hpp>
#include <lather/impl/kernels/host_simd.hpp>
#include <lather/impl/kernels/shampoo.hpp>
#include <lather/optimizers/adam.hpp>
#include <lather/optimizers/shampoo.hpp>

#include <Kokkos_Core.hpp>

#include <doctest/doctest.h>

#include "exec_spaces.hpp"
#include "test_utils.hpp"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <type_traits>
#include <vector>

namespace {

using lather::impl::kernels::simd_detail::ScopedBaselineSimd;
using lather::impl::kernels::simd_detail::ScopedSimdLimit;
using lather::impl::kernels::simd_detail::SimdLimit;
using lather::impl::kernels::simd_detail::use_avx;
using lather::impl::kernels::simd_detail::use_avx512;

std::vector<std::int64_t> lengths() {
  std::vector<std::int64_t> n;
  for (std::int64_t i = 0; i <= 49; ++i) n.push_back(i);
  for (const std::int64_t i : {63, 64, 65, 255, 256, 257, 4096 + 7}) n.push_back(i);
  return n;
}

// Values over many magnitudes (the partial sums' rounding then depends on the order).
template <class T>
std::vector<T> spread(std::int64_t n, std::uint64_t stream, bool positive) {
  const auto r = lather::test::random_values(static_cast<std::size_t>(n), stream);
  std::vector<T> x(r.size());
  for (std::size_t i = 0; i < r.size(); ++i) {
    const double mag = std::pow(10.0, static_cast<double>(static_cast<int>(i * 7 % 13)) - 6.0);
    x[i] = T(positive ? std::abs(r[i]) * mag : r[i] * mag);
  }
  if (positive && n > 3) x[3] = T(0);  // v = 0: the direction is x / eps
  return x;
}

// BlockNorms' terms summed in host_block_sq_norm's documented order, plainly.
template <class T>
double plain_sq_norm(const std::vector<T>& x, const std::vector<T>& v, const lather::GraftScalars<T>& g, bool has_state) {
  double s[16] = {};
  for (std::size_t q = 0; q < x.size(); ++q)
    s[q % 16] += lather::impl::kernels::BlockNorms<T, Kokkos::HostSpace, Kokkos::DefaultHostExecutionSpace>::term(
        x[q], has_state ? v[q] : T(0), g, has_state);
  const double low = ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7]));
  const double high = ((s[8] + s[9]) + (s[10] + s[11])) + ((s[12] + s[13]) + (s[14] + s[15]));
  return low + high;
}

template <class T>
void check_sq_norm() {
  const lather::GraftScalars<T> g{T(0.999), T(0.001), T(0.3), T(1e-8)};
  for (const std::int64_t n : lengths()) {
    const auto x = spread<T>(n, 10 + static_cast<std::uint64_t>(n), false);
    const auto v = spread<T>(n, 5000 + static_cast<std::uint64_t>(n), true);
    for (const bool has_state : {false, true}) {
      CAPTURE(n);
      CAPTURE(has_state);
      const double expected = plain_sq_norm(x, v, g, has_state);
      const double wide = lather::impl::kernels::host_block_sq_norm(x.data(), v.data(), n, g, has_state);
      double baseline = 0, avx = 0;
      {
        const ScopedBaselineSimd off;
        CHECK_FALSE(use_avx512());
        CHECK_FALSE(use_avx());
        baseline = lather::impl::kernels::host_block_sq_norm(x.data(), v.data(), n, g, has_state);
      }
      {
        const ScopedSimdLimit at_most(SimdLimit::avx);
        CHECK_FALSE(use_avx512());
        avx = lather::impl::kernels::host_block_sq_norm(x.data(), v.data(), n, g, has_state);
      }
      CHECK(wide == expected);
      CHECK(avx == expected);
      CHECK(baseline == expected);
    }
  }
}

template <class T>
void check_adam_range() {
  using S = lather::impl::kernels::AdamScalars<T>;
  std::vector<S> forms;
  forms.push_back({T(0.9), T(0.1), T(0.999), T(0.001), T(0), T(1), T(1e-3), T(0.03), T(1e-8), false, false});
  forms.push_back({T(0.9), T(0.1), T(0.99), T(0.01), T(0.01), T(1), T(2e-3), T(0.5), T(1e-6), true, false});  // L2, maximize
  forms.push_back({T(0.8), T(0.2), T(0.999), T(0.001), T(0), T(0.99), T(1e-3), T(0.1), T(1e-8), false, true});  // decoupled
  for (std::size_t f = 0; f < forms.size(); ++f) {
    for (const std::int64_t n : lengths()) {
      for (const std::int64_t begin : {std::int64_t{0}, std::int64_t{3}}) {
        if (begin > n) continue;
        CAPTURE(f);
        CAPTURE(n);
        CAPTURE(begin);
        const auto p0 = spread<T>(n, 20 + static_cast<std::uint64_t>(n), false);
        const auto g = spread<T>(n, 30 + static_cast<std::uint64_t>(n), false);
        const auto m0 = spread<T>(n, 40 + static_cast<std::uint64_t>(n), false);
        const auto v0 = spread<T>(n, 50 + static_cast<std::uint64_t>(n), true);
        // 0: element by element, 1: adam_range, 2: adam_range without AVX-512 or AVX, 3: at most AVX
        auto run = [&](int mode) {
          std::vector<T> p = p0, m = m0, v = v0;
          if (mode == 0) {
            for (std::int64_t i = begin; i < n; ++i) lather::impl::kernels::adam_element(&p[i], &g[i], &m[i], &v[i], forms[f]);
          } else if (mode == 1) {
            lather::impl::kernels::adam_range(p.data(), g.data(), m.data(), v.data(), begin, n, forms[f]);
          } else if (mode == 3) {
            const ScopedSimdLimit at_most(SimdLimit::avx);
            lather::impl::kernels::adam_range(p.data(), g.data(), m.data(), v.data(), begin, n, forms[f]);
          } else {
            const ScopedBaselineSimd off;
            lather::impl::kernels::adam_range(p.data(), g.data(), m.data(), v.data(), begin, n, forms[f]);
          }
          p.insert(p.end(), m.begin(), m.end());
          p.insert(p.end(), v.begin(), v.end());
          return p;
        };
        const auto expected = run(0);
        CHECK(run(1) == expected);
        CHECK(run(2) == expected);
        CHECK(run(3) == expected);
      }
    }
  }
}

// f() in mode 1 (the widest form the CPU has), 2 (forced off: SSE2 / scalar) or 3 (at most AVX).
template <class F>
void in_simd_mode(int mode, const F& f) {
  if (mode == 2) {
    const ScopedBaselineSimd off;
    f();
  } else if (mode == 3) {
    const ScopedSimdLimit at_most(SimdLimit::avx);
    f();
  } else {
    f();
  }
}

// run(0), the scalar reference, against run(1), run(2) and run(3) (in_simd_mode's modes), bit
// for bit (memcmp of every element).
template <class T, class Run>
void check_modes_same_bits(const Run& run) {
  const std::vector<T> expected = run(0);
  for (const int mode : {1, 2, 3}) {
    CAPTURE(mode);
    const std::vector<T> got = run(mode);
    REQUIRE(got.size() == expected.size());
    bool same = true;
    for (std::size_t i = 0; i < expected.size(); ++i) same = same && std::memcmp(&got[i], &expected[i], sizeof(T)) == 0;
    CHECK(same);
  }
}

// Shampoo's filter loop (host_filter_wide: the wide part of the fused host path's filtering,
// the caller finishing the tail) against FilterAndGraft element by element, in every form the
// fused path vectorizes (grafting state or not, filtered gradient or not, a separate beta3, bias
// correction), with the wide path taken, limited to AVX and forced off, at lengths around every
// vector and tail edge and from unaligned starts. Bits compared (memcmp).
template <class T, bool State, bool Beta1, bool Beta3, bool Bias>
void check_filter_form() {
  for (const std::int64_t n : lengths()) {
    for (const std::int64_t begin : {std::int64_t{0}, std::int64_t{3}}) {
      if (begin > n) continue;
      CAPTURE(State);
      CAPTURE(Beta1);
      CAPTURE(Beta3);
      CAPTURE(Bias);
      CAPTURE(n);
      CAPTURE(begin);
      const auto g = spread<T>(n, 110 + static_cast<std::uint64_t>(n), false);
      const auto f0 = spread<T>(n, 120 + static_cast<std::uint64_t>(n), false);
      const auto v0 = spread<T>(n, 130 + static_cast<std::uint64_t>(n), true);
      const lather::impl::kernels::FilterScalars<T> k{T(0.999), T(0.001), T(0.9), T(0.1), T(0.8), T(0.2), T(0.271)};
      // 0: FilterAndGraft per element; 1: host_filter_wide and the functor for the rest;
      // 2: the same forced off; 3: at most AVX
      auto run = [&](int mode) {
        std::vector<T> f = f0, v = v0, out(static_cast<std::size_t>(n), T(-7));
        lather::GraftScalars<T> graft{};
        graft.beta2 = k.beta2;
        graft.one_minus_beta2 = k.one_minus_beta2;
        const lather::impl::kernels::FilterAndGraft<T, Kokkos::HostSpace> functor{
            g.data(), f.data(), v.data(), out.data(), k.beta1, k.one_minus_beta1, Beta3 ? k.beta3 : k.beta1,
            Beta3 ? k.one_minus_beta3 : k.one_minus_beta1, k.bias_correction1, Beta1, Beta3, Bias, graft, State, false};
        std::int64_t q = begin;
        if (mode != 0)
          in_simd_mode(mode, [&] {
            q += lather::impl::kernels::host_filter_wide<State, Beta1, Beta3, Bias>(
                g.data() + begin, f.data() + begin, v.data() + begin, out.data() + begin, n - begin, k);
          });
        for (; q < n; ++q) functor(q);
        f.insert(f.end(), v.begin(), v.end());
        f.insert(f.end(), out.begin(), out.end());
        return f;
      };
      check_modes_same_bits<T>(run);
    }
  }
}

template <class T>
void check_filter() {
  check_filter_form<T, true, true, false, true>();  // Adam grafting, beta1, bias correction (the default)
  check_filter_form<T, true, true, true, true>();
  check_filter_form<T, true, true, false, false>();
  check_filter_form<T, true, true, true, false>();
  check_filter_form<T, true, false, false, false>();  // beta1 = 0
  check_filter_form<T, false, true, false, true>();   // SGD or no grafting
  check_filter_form<T, false, true, true, false>();
  check_filter_form<T, false, false, false, false>();
}

// Shampoo's update loop (host_update_row: the fused host path's update, the grafting ratio
// applied as it reads the direction) against ApplyUpdate element by element on the direction
// scaled first (the per-parameter path's order), with and without decay, momentum and Nesterov,
// with the wide path taken, limited to AVX (no AVX form: the scalar loop) and forced off, at
// lengths around every vector and tail edge (and the prefetch distance) and from unaligned
// starts. Bits compared (memcmp) for the parameter and the momentum.
template <class T, bool Decay, bool Momentum, bool Nesterov>
void check_update_form() {
  auto sizes = lengths();
  for (const std::int64_t extra : {std::int64_t{255}, std::int64_t{256}, std::int64_t{257}, std::int64_t{300}, std::int64_t{1000}})
    sizes.push_back(extra);
  for (const std::int64_t n : sizes) {
    for (const std::int64_t begin : {std::int64_t{0}, std::int64_t{3}}) {
      if (begin > n) continue;
      CAPTURE(Decay);
      CAPTURE(Momentum);
      CAPTURE(Nesterov);
      CAPTURE(n);
      CAPTURE(begin);
      const auto w0 = spread<T>(n, 140 + static_cast<std::uint64_t>(n), false);
      const auto dir = spread<T>(n, 150 + static_cast<std::uint64_t>(n), false);
      const auto mom0 = spread<T>(n, 160 + static_cast<std::uint64_t>(n), false);
      const T scale = T(0.37), decay = Decay ? T(0.013) : T(0), momentum = T(0.9), omd = T(0.7), lr = T(0.031);
      // 0: ApplyUpdate per element on the scaled direction; 1: host_update_row; 2: the same
      // forced off; 3: at most AVX
      auto run = [&](int mode) {
        std::vector<T> w = w0, mom = mom0;
        if (mode == 0) {
          std::vector<T> scaled(static_cast<std::size_t>(n));
          for (std::int64_t q = 0; q < n; ++q) scaled[static_cast<std::size_t>(q)] = dir[static_cast<std::size_t>(q)] * scale;
          const lather::impl::kernels::ApplyUpdate<T, Kokkos::HostSpace> functor{
              lather::TensorRef<T, Kokkos::HostSpace>(w.data(), {n}),
              lather::impl::kernels::Field<const T>(scaled.data()),
              lather::impl::kernels::Field<T>(Momentum ? mom.data() : nullptr),
              decay, momentum, omd, lr, Momentum, Nesterov};
          for (std::int64_t q = begin; q < n; ++q) functor.apply(q, q);
        } else {
          const lather::impl::kernels::UpdateScalars<T> k{decay, momentum, omd, T(-lr), scale};
          in_simd_mode(mode, [&] {
            lather::impl::kernels::host_update_row<Decay, Momentum, Nesterov>(
                w.data() + begin, dir.data() + begin, Momentum ? mom.data() + begin : nullptr, n - begin, k);
          });
        }
        w.insert(w.end(), mom.begin(), mom.end());
        return w;
      };
      check_modes_same_bits<T>(run);
    }
  }
}

template <class T>
void check_update() {
  check_update_form<T, false, false, false>();  // the default: no decay, no momentum
  check_update_form<T, true, false, false>();
  check_update_form<T, false, true, false>();
  check_update_form<T, true, true, false>();
  check_update_form<T, false, true, true>();
  check_update_form<T, true, true, true>();
}

// The filter loop carrying the grafting norm (host_filter_norm_wide, the fused host path's form
// where a block's rows are a multiple of 16 elements): row by row, the partial sums carried from
// row to row, against host_filter_wide over the whole block and then host_block_sq_norm over its
// output and new state (the two passes it replaces). Filter outputs and norm compared bit for
// bit; host_filter_norm_fusable must say yes exactly where AVX-512 is used and the rows are
// multiples of 16 (for doubles two vectors: rows of 8 or 24 would start a row at partial 8), and
// no where the test limits the loops to AVX.
template <class T, bool State, bool Beta1, bool Beta3, bool Bias>
void check_filter_norm_form() {
  for (const std::int64_t row_len : {std::int64_t{8}, std::int64_t{16}, std::int64_t{24}, std::int64_t{48}, std::int64_t{256}}) {
    for (const std::int64_t rows : {std::int64_t{1}, std::int64_t{2}, std::int64_t{5}}) {
      const std::int64_t n = rows * row_len;
      CAPTURE(State);
      CAPTURE(Beta1);
      CAPTURE(Beta3);
      CAPTURE(Bias);
      CAPTURE(row_len);
      CAPTURE(rows);
      const bool fusable = lather::impl::kernels::host_filter_norm_fusable<T>(row_len, n);
      CHECK(fusable == (use_avx512() && row_len % 16 == 0 && n >= 16));
      {
        const ScopedSimdLimit at_most(SimdLimit::avx);
        CHECK_FALSE(lather::impl::kernels::host_filter_norm_fusable<T>(row_len, n));
      }
      if (!fusable) continue;
      const auto g = spread<T>(n, 210 + static_cast<std::uint64_t>(n), false);
      const auto f0 = spread<T>(n, 220 + static_cast<std::uint64_t>(n), false);
      const auto v0 = spread<T>(n, 230 + static_cast<std::uint64_t>(n), true);
      const lather::impl::kernels::FilterScalars<T> k{T(0.999), T(0.001), T(0.9), T(0.1), T(0.8), T(0.2), T(0.271)};
      const lather::GraftScalars<T> graft{T(0.999), T(0.001), T(0.3), T(1e-8)};
      // Two passes: the filter (the wide loop covers whole vectors), then the norm.
      std::vector<T> f1 = f0, v1 = v0, out1(static_cast<std::size_t>(n), T(-7));
      CHECK(lather::impl::kernels::host_filter_wide<State, Beta1, Beta3, Bias>(g.data(), f1.data(), v1.data(), out1.data(),
                                                                               n, k) == n);
      const double expected = lather::impl::kernels::host_block_sq_norm(out1.data(), v1.data(), n, graft, State);
      // One pass, row by row.
      std::vector<T> f2 = f0, v2 = v0, out2(static_cast<std::size_t>(n), T(-7));
      double s[lather::impl::kernels::host_norm_partials] = {};
      for (std::int64_t r = 0; r < rows; ++r) {
        const std::int64_t off = r * row_len;
        CHECK(lather::impl::kernels::host_filter_norm_wide<State, Beta1, Beta3, Bias>(
                  g.data() + off, f2.data() + off, v2.data() + off, out2.data() + off, row_len, k, graft, s) == row_len);
      }
      const double got = lather::impl::kernels::host_sq_norm_of(s);
      CHECK(std::memcmp(&got, &expected, sizeof(double)) == 0);
      CHECK(std::memcmp(f1.data(), f2.data(), f1.size() * sizeof(T)) == 0);
      CHECK(std::memcmp(v1.data(), v2.data(), v1.size() * sizeof(T)) == 0);
      CHECK(std::memcmp(out1.data(), out2.data(), out1.size() * sizeof(T)) == 0);
    }
  }
}

template <class T>
void check_filter_norm() {
  check_filter_norm_form<T, true, true, false, true>();  // Adam grafting, beta1, bias correction (the default)
  check_filter_norm_form<T, true, true, true, false>();
  check_filter_norm_form<T, true, false, false, false>();  // beta1 = 0
  check_filter_norm_form<T, false, true, false, true>();   // SGD grafting: the norm of the filtered gradient
}

// A chunk job (Adagrad, RMSprop) over [begin, n): whole range, whole range limited to AVX, whole
// range without AVX-512 or AVX, and one element per call (only the scalar tail runs), on copies
// of the same arrays.
template <class T, class MakeJob>
void check_job(const char* name, MakeJob make_job) {
  for (const std::int64_t n : lengths()) {
    for (const std::int64_t begin : {std::int64_t{0}, std::int64_t{3}}) {
      if (begin > n) continue;
      CAPTURE(name);
      CAPTURE(n);
      CAPTURE(begin);
      const auto p0 = spread<T>(n, 60 + static_cast<std::uint64_t>(n), false);
      const auto g = spread<T>(n, 70 + static_cast<std::uint64_t>(n), false);
      const auto s0 = spread<T>(n, 80 + static_cast<std::uint64_t>(n), true);
      // Centered RMSprop: |a| <= 0.1 sqrt(s) keeps s - a^2 >= 0 after the update (no NaN: the tests
      // trap invalid operations).
      auto a0 = spread<T>(n, 90 + static_cast<std::uint64_t>(n), false);
      for (std::size_t i = 0; i < a0.size(); ++i) a0[i] = (a0[i] < T(0) ? T(-0.1) : T(0.1)) * std::sqrt(s0[i]);
      const auto b0 = spread<T>(n, 95 + static_cast<std::uint64_t>(n), false);
      auto run = [&](int mode) {
        std::vector<T> p = p0, s = s0, a = a0, b = b0;
        const auto job = make_job(p.data(), g.data(), s.data(), a.data(), b.data());
        if (mode == 0) {
          for (std::int64_t i = begin; i < n; ++i) job(i, i + 1);
        } else if (mode == 1) {
          job(begin, n);
        } else if (mode == 3) {
          const ScopedSimdLimit at_most(SimdLimit::avx);
          job(begin, n);
        } else {
          const ScopedBaselineSimd off;
          job(begin, n);
        }
        for (const auto* x : {&s, &a, &b}) p.insert(p.end(), x->begin(), x->end());
        return p;
      };
      const auto expected = run(0);
      const auto wide = run(1), baseline = run(2), avx = run(3);
      // Bits, not values: -0.0 == 0.0 would hide a sign difference.
      REQUIRE(wide.size() == expected.size());
      bool same_wide = true, same_baseline = true, same_avx = true;
      for (std::size_t i = 0; i < expected.size(); ++i) {
        same_wide = same_wide && std::memcmp(&wide[i], &expected[i], sizeof(T)) == 0;
        same_baseline = same_baseline && std::memcmp(&baseline[i], &expected[i], sizeof(T)) == 0;
        same_avx = same_avx && std::memcmp(&avx[i], &expected[i], sizeof(T)) == 0;
      }
      CHECK(same_wide);
      CHECK(same_baseline);
      CHECK(same_avx);
    }
  }
}

template <class T>
void check_adagrad_rmsprop() {
  using lather::impl::kernels::AdagradHostJob;
  using lather::impl::kernels::RmspropHostJob;
  for (const bool maximize : {false, true}) {
    check_job<T>("Adagrad", [&](T* p, const T* g, T* s, T*, T*) {
      return AdagradHostJob<T>{p, g, s, T(0.01), maximize ? T(0.1) : T(0), T(1e-10), maximize};
    });
  }
  for (int form = 0; form < 4; ++form) {
    const bool centered = (form & 1) != 0, momentum = (form & 2) != 0;
    check_job<T>("RMSprop", [&](T* p, const T* g, T* s, T* a, T* b) {
      return RmspropHostJob<T>{p, g, s, a, b, T(0.01), T(0.99), T(0.01), T(1e-8), form == 3 ? T(0.01) : T(0),
                               T(0.9), centered, momentum, form == 2};
    });
  }
}

}  // namespace

TEST_CASE("host SIMD: the AVX-512 and AVX dispatch follows the CPU and the test limits") {
#ifdef LATHER_HAS_AVX512_DISPATCH
  const bool cpu = __builtin_cpu_supports("avx512f"), cpu_avx = __builtin_cpu_supports("avx");
  CHECK(use_avx512() == cpu);
  CHECK(use_avx() == cpu_avx);
  MESSAGE(std::string(cpu ? "AVX-512 loops exercised" : "AVX-512 loops not exercised (this CPU has no AVX-512F)"));
  MESSAGE(std::string(cpu_avx ? "AVX loops exercised" : "AVX loops not exercised (this CPU has no AVX)"));
#else
  CHECK_FALSE(use_avx512());
  CHECK_FALSE(use_avx());
  MESSAGE("AVX-512 / AVX dispatch not compiled in this build");
#endif
  {
    const ScopedBaselineSimd off;
    CHECK_FALSE(use_avx512());
    CHECK_FALSE(use_avx());
    {
      const ScopedSimdLimit wider(SimdLimit::avx512);  // a limit never widens an enclosing one
      CHECK_FALSE(use_avx512());
      CHECK_FALSE(use_avx());
    }
    CHECK_FALSE(use_avx512());
  }
  {
    const ScopedSimdLimit at_most(SimdLimit::avx);
    CHECK_FALSE(use_avx512());
#ifdef LATHER_HAS_AVX512_DISPATCH
    CHECK(use_avx() == cpu_avx);
#endif
  }
#ifdef LATHER_HAS_AVX512_DISPATCH
  CHECK(use_avx512() == cpu);
  CHECK(use_avx() == cpu_avx);
#endif
}

TEST_CASE("host SIMD: the grafting norm gives the plain sum's bits with AVX-512, AVX and SSE2") {
  check_sq_norm<float>();
  check_sq_norm<double>();
}

TEST_CASE("host SIMD: Shampoo's filter loop gives FilterAndGraft's bits with AVX-512, AVX and SSE2") {
  check_filter<float>();
  check_filter<double>();
}

TEST_CASE("host SIMD: Shampoo's update loop gives ApplyUpdate's bits with AVX-512 and without") {
  check_update<float>();
  check_update<double>();
}

TEST_CASE("host SIMD: the filter loop carrying the grafting norm gives the two passes' bits") {
  check_filter_norm<float>();
  check_filter_norm<double>();
}

TEST_CASE("host SIMD: Adam's host loop gives the scalar kernel's bits with AVX-512, AVX and SSE2") {
  check_adam_range<float>();
  check_adam_range<double>();
}

TEST_CASE("host SIMD: the Adagrad and RMSprop chunk jobs give the scalar loop's bits with AVX-512, AVX and SSE2") {
  check_adagrad_rmsprop<float>();
  check_adagrad_rmsprop<double>();
}

// The NaN/Inf count of the screen before every step (host_count_nonfinite) with AVX-512 and
// forced off, against a plain count: NaN, +-Inf, the largest finite values, subnormals and
// zeros at positions around every vector and step edge, lengths 0 to 49 and up to 4103, from
// unaligned starts; and counts past a 32-bit lane's worth would need 2^31 steps (not tested).
template <class T>
void check_count_nonfinite() {
  const T specials[] = {std::numeric_limits<T>::quiet_NaN(), std::numeric_limits<T>::infinity(),
                        -std::numeric_limits<T>::infinity(), std::numeric_limits<T>::max(),
                        -std::numeric_limits<T>::max(), std::numeric_limits<T>::denorm_min(), T(0), T(-0.0),
                        std::numeric_limits<T>::signaling_NaN(), -std::numeric_limits<T>::quiet_NaN()};
  for (const std::int64_t n : lengths())
    for (const std::int64_t offset : {0, 1, 3}) {
      std::vector<T> buffer(static_cast<std::size_t>(n + offset));
      const auto r = lather::test::random_values(buffer.size(), 50 + static_cast<std::uint64_t>(n));
      for (std::size_t i = 0; i < buffer.size(); ++i) buffer[i] = T(r[i]);
      // Specials every 5th element in a pattern that moves with n.
      for (std::int64_t i = 0; i < n; i += 5)
        buffer[static_cast<std::size_t>(offset + i)] = specials[static_cast<std::size_t>((i + n) % 10)];
      const T* x = buffer.data() + offset;
      // Expected from the bits (all exponent bits set): this binary traps invalid operations, and
      // a comparison or classification of the signaling NaN would raise one.
      std::int64_t want = 0;
      for (std::int64_t i = 0; i < n; ++i) {
        using U = std::conditional_t<sizeof(T) == 4, std::uint32_t, std::uint64_t>;
        U bits;
        std::memcpy(&bits, x + i, sizeof bits);
        const U exponent = sizeof(T) == 4 ? U(0x7f800000u) : U(0x7ff0000000000000ull);
        want += (bits & exponent) == exponent ? 1 : 0;
      }
      INFO("n=", n, " offset=", offset);
      CHECK(lather::impl::kernels::host_count_nonfinite(x, n) == want);
      const ScopedBaselineSimd off;
      CHECK(lather::impl::kernels::host_count_nonfinite(x, n) == want);
    }
  // Long: every value non-finite (each lane's sum at its largest for this length).
  std::vector<T> all(70000, std::numeric_limits<T>::infinity());
  CHECK(lather::impl::kernels::host_count_nonfinite(all.data(), static_cast<std::int64_t>(all.size())) == 70000);
}

TEST_CASE("host SIMD: the NaN/Inf count gives the plain count with AVX-512 and SSE2") {
  check_count_nonfinite<float>();
  check_count_nonfinite<double>();
}

// Whole trajectories: a Shampoo with Adam grafting (blocks of 32: full, partial and 1-D blocks;
// root steps every 2 steps) and an AdamW over sizes below, at and above a vector, on each space.
template <class ExecSpace>
void impl_test_trajectories() {
  using M = typename ExecSpace::memory_space;
  using P = lather::TensorRef<float, M>;
  auto shampoo = [] {
    Kokkos::View<float**, Kokkos::LayoutRight, M> w("w", 70, 45), g("g", 70, 45);
    Kokkos::View<float*, M> b("b", 33), gb("gb", 33);
    std::vector<P> params{lather::tensor_ref(w), lather::tensor_ref(b)}, grads{lather::tensor_ref(g), lather::tensor_ref(gb)};
    for (std::size_t i = 0; i < params.size(); ++i)
      lather::test::from_host(params[i], lather::test::random_values(static_cast<std::size_t>(params[i].size()), 70 + i));
    lather::Shampoo<P, ExecSpace, lather::EigenRootInverse, lather::AdamGrafting> opt(
        params, {.lr = 0.01, .betas = {0.9, 0.99}, .epsilon = 1e-6, .max_preconditioner_dim = 32, .precondition_frequency = 2},
        {}, lather::AdamGrafting{.epsilon = 1e-8});
    for (int t = 1; t <= 6; ++t) {
      for (std::size_t i = 0; i < grads.size(); ++i)
        lather::test::from_host(grads[i], lather::test::random_values(static_cast<std::size_t>(grads[i].size()), 100 * t + i));
      opt.step(ExecSpace(), grads);
    }
    auto out = lather::test::to_host(params[0]);
    const auto tail = lather::test::to_host(params[1]);
    out.insert(out.end(), tail.begin(), tail.end());
    return out;
  };
  auto adamw = [] {
    std::vector<Kokkos::View<float*, M>> w, g;
    std::vector<P> params, grads;
    for (const int n : {1, 17, 5000}) {
      w.emplace_back("w", n);
      g.emplace_back("g", n);
      params.push_back(lather::tensor_ref(w.back()));
      grads.push_back(lather::tensor_ref(g.back()));
      lather::test::from_host(params.back(), lather::test::random_values(static_cast<std::size_t>(n), 200 + n));
    }
    lather::AdamW<P, ExecSpace> opt(params, lather::AdamWOptions{.lr = 0.01, .weight_decay = 0.1});
    for (int t = 1; t <= 4; ++t) {
      for (std::size_t i = 0; i < grads.size(); ++i)
        lather::test::from_host(grads[i], lather::test::random_values(static_cast<std::size_t>(grads[i].size()), 300 * t + i));
      opt.step(ExecSpace(), grads);
    }
    std::vector<double> out;
    for (const auto& p : params) {
      const auto h = lather::test::to_host(p);
      out.insert(out.end(), h.begin(), h.end());
    }
    return out;
  };
  const auto shampoo_wide = shampoo(), adamw_wide = adamw();
  const ScopedBaselineSimd off;
  CHECK(shampoo() == shampoo_wide);
  CHECK(adamw() == adamw_wide);
}

TEST_CASE_TEMPLATE_DEFINE("host SIMD: Shampoo and AdamW trajectories are the same bits with and without AVX-512", ExecSpace,
                          trajectories) {
  impl_test_trajectories<ExecSpace>();
}
TEST_CASE_TEMPLATE_APPLY(trajectories, lather_test_exec_spaces);
