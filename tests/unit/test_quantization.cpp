// SPDX-License-Identifier: Apache-2.0
// Block-wise 8-bit quantization (impl/quantization.hpp) on every execution space, and the host
// thin SVD with its sign convention (impl/backends/svd_host.hpp).
#include <lather/impl/backends/lapack.hpp>
#include <lather/impl/backends/svd_host.hpp>
#include <lather/impl/quantization.hpp>

#include <Kokkos_Core.hpp>

#include <doctest/doctest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "exec_spaces.hpp"
#include "test_utils.hpp"

namespace quant = lather::impl::quant;

namespace {

using Map = std::array<float, 256>;

// ---- maps ------------------------------------------------------------------------------------------

TEST_CASE("quantization: dynamic maps match bitsandbytes' create_dynamic_map") {
  const Map s = quant::dynamic_map(true), u = quant::dynamic_map(false);
  CHECK(std::is_sorted(s.begin(), s.end()));
  CHECK(std::is_sorted(u.begin(), u.end()));
  // Strictly increasing: 256 distinct codes (bnb's zero padding never applies at 8 bits).
  CHECK(std::adjacent_find(s.begin(), s.end()) == s.end());
  CHECK(std::adjacent_find(u.begin(), u.end()) == u.end());
  CHECK(std::count(s.begin(), s.end(), 0.0f) == 1);
  CHECK(std::count(u.begin(), u.end(), 0.0f) == 1);
  CHECK(std::all_of(u.begin(), u.end(), [](float v) { return v >= 0.0f; }));
  // Signed: 127 negatives (index 0..126), 0 at 127, 127 positives, 1.0 last. The largest fraction
  // mean at i = 6 is (1 - 0.9/128) = 0.99296875; -1 is not an entry.
  CHECK(s[127] == 0.0f);
  CHECK(s[255] == 1.0f);
  CHECK(s[254] == 0.99296875f);
  CHECK(s[0] == -0.99296875f);
  CHECK(std::count(s.begin(), s.end(), -1.0f) == 0);
  // Smallest positive signed: i = 0, linspace(0.1, 1, 2) = {0.1, 1}, mean 0.55, times 1e-6.
  CHECK(s[128] == 5.5e-7f);
  CHECK(s[126] == -5.5e-7f);
  // Next: i = 1, linspace(0.1, 1, 3) = {0.1, 0.55, 1}, means 0.325 and 0.775, times 1e-5.
  CHECK(s[129] == 3.25e-6f);
  CHECK(s[130] == 7.75e-6f);
  // Unsigned: 0 first; i = 0 has linspace(0.1, 1, 3), means 0.325 and 0.775, times 1e-6; the
  // largest fraction mean at i = 6 is 1 - 0.9/256 = 0.996484375.
  CHECK(u[0] == 0.0f);
  CHECK(u[1] == 3.25e-7f);
  CHECK(u[2] == 7.75e-7f);
  CHECK(u[254] == 0.996484375f);
  CHECK(u[255] == 1.0f);
  // Widest gaps: signed i = 6 steps 0.9/64 (half 0.00703125), unsigned 0.9/128 (half 0.003515625);
  // to within float rounding of the entries.
  CHECK(quant::max_half_gap(s) == doctest::Approx(0.00703125).epsilon(1e-6));
  CHECK(quant::max_half_gap(u) == doctest::Approx(0.003515625).epsilon(1e-6));
  CHECK(quant::half_gap_at(s, 0.0) == doctest::Approx(5.5e-7 / 2).epsilon(1e-6));
  CHECK(quant::half_gap_at(s, -1.0) == doctest::Approx(1.0 - 0.99296875).epsilon(1e-6));  // below map[0]
  CHECK(quant::half_gap_at(u, 1.0) == 0.0);
  // nearest_code: ties go to the lower entry; below the range to 0.
  const double mid = (double(s[200]) + double(s[201])) / 2;
  CHECK(quant::nearest_code(s.data(), mid) == 200);
  CHECK(quant::nearest_code(s.data(), std::nextafter(mid, 2.0)) == 201);
  CHECK(quant::nearest_code(s.data(), -1.0) == 0);
  CHECK(quant::nearest_code(s.data(), 1.0) == 255);
  CHECK(quant::nearest_code(u.data(), 0.0f) == 0);
}

// ---- quantize / dequantize -------------------------------------------------------------------------

struct Quantized {
  std::vector<std::uint8_t> codes;
  std::vector<float> absmax;
  std::vector<double> out;  // dequantized
};

template <class T>
std::vector<T> round_to(const std::vector<double>& x) {
  std::vector<T> r(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) r[i] = static_cast<T>(x[i]);
  return r;
}

// Quantizes and dequantizes x (already representable in T) on ExecSpace; host copies of the result.
template <class ExecSpace, class T>
Quantized round_trip(const std::vector<T>& x, bool is_signed, std::int64_t block_size) {
  using M = typename ExecSpace::memory_space;
  const ExecSpace space;
  const auto n = static_cast<std::int64_t>(x.size());
  auto q = quant::make_blockwise_quantized(space, n, is_signed, block_size, "test::q");
  Kokkos::View<T*, M> values("test::values", x.size()), out("test::out", x.size());
  auto hv = Kokkos::create_mirror_view(values);
  for (std::size_t i = 0; i < x.size(); ++i) hv(i) = x[i];
  Kokkos::deep_copy(values, hv);
  quant::quantize(space, values.data(), q);
  quant::dequantize(space, q, out.data());
  space.fence();
  auto hc = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), q.codes);
  auto ha = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), q.absmax);
  auto ho = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), out);
  Quantized r;
  r.codes.assign(hc.data(), hc.data() + hc.extent(0));
  r.absmax.assign(ha.data(), ha.data() + ha.extent(0));
  for (std::size_t i = 0; i < x.size(); ++i) r.out.push_back(static_cast<double>(ho(i)));
  return r;
}

// Random values over eight decades (to reach the map's small entries), with special blocks: the
// second block all zeros, the third's largest magnitude at +-scale exactly.
std::vector<double> test_data(std::size_t n, std::int64_t block_size, bool non_negative,
                              std::uint64_t stream) {
  std::vector<double> r = lather::test::random_values(n, stream),
                      e = lather::test::random_values(n, stream + 1);
  std::vector<double> x(n);
  for (std::size_t i = 0; i < n; ++i)
    x[i] = (non_negative ? std::abs(r[i]) : r[i]) * std::pow(10.0, -8.0 * std::abs(e[i]));
  const auto bs = static_cast<std::size_t>(block_size);
  for (std::size_t i = bs; i < std::min(n, 2 * bs); ++i) x[i] = 0.0;
  if (n > 2 * bs) x[2 * bs + (n - 2 * bs) / 2 % bs] = non_negative ? 3.0 : -3.0;
  return x;
}

template <class ExecSpace, class T>
void impl_test_round_trip(bool is_signed) {
  const Map map = quant::dynamic_map(is_signed);
  // Slack on top of absmax * half_gap_at: float rounding of y = x / absmax (which may move y
  // across a midpoint), of the distances compared in nearest_code and of map[c] * absmax; a few
  // float ulps of absmax. Double input is exact but for y's rounding.
  const double slack = 4.0 * std::numeric_limits<float>::epsilon();
  std::uint64_t stream = is_signed ? 100 : 200;
  for (const std::int64_t block_size : {std::int64_t{256}, std::int64_t{2048}}) {
    for (const std::size_t n : {1u, 2u, 3u, 13u, 255u, 256u, 257u, 1000u, 4096u + 7u}) {
      CAPTURE(n);
      CAPTURE(block_size);
      const std::vector<T> x = round_to<T>(test_data(n, block_size, !is_signed, stream += 2));
      const Quantized q = round_trip<ExecSpace, T>(x, is_signed, block_size);
      const auto nb = static_cast<std::size_t>(quant::num_blocks(static_cast<std::int64_t>(n), block_size));
      REQUIRE(q.absmax.size() == nb);
      const auto bs = static_cast<std::size_t>(block_size);
      for (std::size_t b = 0; b < nb; ++b) {
        T m = 0;
        for (std::size_t i = b * bs; i < std::min(n, (b + 1) * bs); ++i) m = std::max(m, std::abs(x[i]));
        CHECK(q.absmax[b] == static_cast<float>(m));  // exact for float input
      }
      std::size_t bad = 0;
      for (std::size_t i = 0; i < n && bad < 5; ++i) {
        const double a = q.absmax[i / bs], xi = static_cast<double>(x[i]);
        // The same code as a host evaluation in T: back ends agree bit for bit.
        const T y = a == 0.0 ? T(0) : x[i] / static_cast<T>(q.absmax[i / bs]);
        const std::uint8_t expected_code = quant::nearest_code(map.data(), y);
        const double err = std::abs(q.out[i] - xi);
        const double bound = a == 0.0 ? 0.0 : a * (quant::half_gap_at(map, xi / a) + slack);
        // Nearest: no other entry is closer (beyond the slack).
        double best = std::numeric_limits<double>::infinity();
        for (const float v : map) best = std::min(best, std::abs(double(v) * a - xi));
        if (q.codes[i] != expected_code || !(err <= bound) || !(err <= best + slack * a)) {
          ++bad;
          FAIL_CHECK("element " << i << ": x " << xi << " absmax " << a << " code " << int(q.codes[i])
                                << " (host " << int(expected_code) << ") dequantized " << q.out[i]
                                << " error " << err << " bound " << bound << " best " << best);
        }
      }
      // The zero block stays zero; the positive largest magnitude round-trips exactly.
      for (std::size_t i = bs; i < std::min(n, 2 * bs); ++i) CHECK(q.out[i] == 0.0);
      for (std::size_t b = 0; b < nb; ++b)
        for (std::size_t i = b * bs; i < std::min(n, (b + 1) * bs); ++i)
          if (static_cast<double>(x[i]) == double(q.absmax[b]) && q.absmax[b] != 0.0f)
            CHECK(q.out[i] == double(x[i]));
      // bnb's signed map has no -1: -absmax comes back as map[0] * absmax (the third block's -3).
      if (is_signed && n > 2 * bs) {
        const std::size_t i = 2 * bs + (n - 2 * bs) / 2 % bs;
        CHECK(x[i] == T(-3));
        CHECK(q.codes[i] == 0);
        CHECK(q.out[i] == double(T(map[0]) * T(3)));
      }
    }
  }
}

// dequantize(quantize(dequantize(q))) == dequantize(q) bit for bit, when each block's dequantized
// largest magnitude is absmax (unsigned map; signed blocks whose largest magnitude is positive).
template <class ExecSpace, class T>
void impl_test_idempotent(bool is_signed) {
  for (const std::int64_t block_size : {std::int64_t{256}, std::int64_t{2048}}) {
    for (const std::size_t n : {1u, 13u, 257u, 4096u + 7u}) {
      CAPTURE(n);
      CAPTURE(block_size);
      std::vector<double> xd = lather::test::random_values(n, 300 + n);
      const auto bs = static_cast<std::size_t>(block_size);
      for (std::size_t i = 0; i < n; ++i) {
        if (!is_signed) xd[i] = std::abs(xd[i]);
        if (i % bs == 0) xd[i] = 2.0;  // each block's largest magnitude, positive
      }
      const Quantized once = round_trip<ExecSpace, T>(round_to<T>(xd), is_signed, block_size);
      const Quantized twice = round_trip<ExecSpace, T>(round_to<T>(once.out), is_signed, block_size);
      CHECK(twice.codes == once.codes);
      CHECK(twice.absmax == once.absmax);
      CHECK(twice.out == once.out);
    }
  }
  if (is_signed) {
    // The documented exception: a negative largest magnitude shrinks absmax by 0.99296875.
    const std::vector<T> x{T(-2), T(0.5), T(1)};
    const Quantized once = round_trip<ExecSpace, T>(x, true, 256);
    const Quantized twice = round_trip<ExecSpace, T>(round_to<T>(once.out), true, 256);
    CHECK(twice.absmax[0] == static_cast<float>(once.out[0] < 0 ? -once.out[0] : once.out[0]));
    CHECK(twice.absmax[0] < once.absmax[0]);
  }
}

template <class ExecSpace>
void impl_test_arguments() {
  using M = typename ExecSpace::memory_space;
  const ExecSpace space;
  Kokkos::View<std::uint8_t*, M> codes("test::codes", 300);
  Kokkos::View<float*, M> absmax("test::absmax", 1);
  Kokkos::View<float*, M> values("test::values", 300);
  const auto map = quant::make_map(space, true);
  CHECK_THROWS_AS(quant::quantize(space, values.data(), codes, absmax, map, 256), lather::invalid_argument);
  CHECK_THROWS_AS(quant::quantize(space, values.data(), codes, absmax, map, 0), lather::invalid_argument);
  CHECK_THROWS_AS(quant::dequantize(space, codes, absmax, map, 256, values.data()), lather::invalid_argument);
  CHECK_NOTHROW(quant::quantize(space, values.data(), codes, absmax, map, 300));
  CHECK_NOTHROW(quant::dequantize(space, codes, absmax, map, 300, values.data()));
  space.fence();
  // A fresh state dequantizes to zeros.
  auto q = quant::make_blockwise_quantized(space, 5, false);
  Kokkos::View<double*, M> out("test::out", 5);
  Kokkos::deep_copy(out, 7.0);
  quant::dequantize(space, q, out.data());
  space.fence();
  auto h = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), out);
  for (int i = 0; i < 5; ++i) CHECK(h(i) == 0.0);
}

}  // namespace

TEST_CASE_TEMPLATE_DEFINE("quantization: round trip within half the map gap, float and double", ExecSpace,
                          quant_round_trip) {
  SUBCASE("signed, float") { impl_test_round_trip<ExecSpace, float>(true); }
  SUBCASE("signed, double") { impl_test_round_trip<ExecSpace, double>(true); }
  SUBCASE("unsigned, float") { impl_test_round_trip<ExecSpace, float>(false); }
  SUBCASE("unsigned, double") { impl_test_round_trip<ExecSpace, double>(false); }
}
TEST_CASE_TEMPLATE_APPLY(quant_round_trip, lather_test_exec_spaces);

TEST_CASE_TEMPLATE_DEFINE("quantization: dequantize . quantize is idempotent", ExecSpace, quant_idempotent) {
  impl_test_idempotent<ExecSpace, float>(true);
  impl_test_idempotent<ExecSpace, double>(true);
  impl_test_idempotent<ExecSpace, float>(false);
  impl_test_idempotent<ExecSpace, double>(false);
}
TEST_CASE_TEMPLATE_APPLY(quant_idempotent, lather_test_exec_spaces);

TEST_CASE_TEMPLATE_DEFINE("quantization: argument checks and fresh state", ExecSpace, quant_arguments) {
  impl_test_arguments<ExecSpace>();
}
TEST_CASE_TEMPLATE_APPLY(quant_arguments, lather_test_exec_spaces);

// ---- thin SVD ----------------------------------------------------------------------------------------

namespace {

using Dense = std::vector<double>;  // row-major

// I - 2 v v^T / |v|^2: an exactly-defined orthogonal matrix (to rounding).
Dense householder(std::size_t n, std::uint64_t stream) {
  const Dense v = lather::test::random_values(n, stream);
  double vv = 0;
  for (const double x : v) vv += x * x;
  Dense q(n * n);
  for (std::size_t i = 0; i < n; ++i)
    for (std::size_t j = 0; j < n; ++j) q[i * n + j] = (i == j ? 1.0 : 0.0) - 2.0 * v[i] * v[j] / vv;
  return q;
}

// A = Q1[:, :k] diag(sigma) Q2[:k, :] with Householder Q1 (m x m), Q2 (n x n).
Dense with_singular_values(std::size_t m, std::size_t n, const std::vector<double>& sigma,
                           std::uint64_t stream) {
  const Dense q1 = householder(m, stream), q2 = householder(n, stream + 1);
  Dense a(m * n, 0.0);
  for (std::size_t i = 0; i < m; ++i)
    for (std::size_t j = 0; j < n; ++j)
      for (std::size_t l = 0; l < sigma.size(); ++l) a[i * n + j] += q1[i * m + l] * sigma[l] * q2[l * n + j];
  return a;
}

template <class T>
struct Svd {
  std::vector<T> u, s, vt;
};

template <class T>
Svd<T> svd(std::size_t m, std::size_t n, const std::vector<T>& a) {
  Svd<T> r;
  lather::impl::thin_svd_host<T>(static_cast<std::int64_t>(m), static_cast<std::int64_t>(n), a.data(), r.u,
                                 r.s, r.vt);
  return r;
}

// Orthogonality, reconstruction (relative to max|A|), ordering, sign convention, determinism.
// Backward-stable SVD: errors are c * max(m, n) * eps; for 64 x 64, 64 * 1.1e-16 ~ 7e-15 in
// double (1e-12 leaves room for c) and 64 * 6e-8 ~ 4e-6 in float (1e-5).
template <class T>
void check_svd(std::size_t m, std::size_t n, const Dense& a_double) {
  CAPTURE(m);
  CAPTURE(n);
  const double tol = std::is_same_v<T, double> ? 1e-12 : 1e-5;
  const std::vector<T> a = round_to<T>(a_double);
  const std::vector<T> a_before = a;
  const Svd<T> r = svd<T>(m, n, a);
  CHECK(a == a_before);  // read only
  const std::size_t k = std::min(m, n);
  REQUIRE(r.u.size() == m * k);
  REQUIRE(r.s.size() == k);
  REQUIRE(r.vt.size() == k * n);
  double utu = 0, vvt = 0, rec = 0, amax = 0;
  for (std::size_t p = 0; p < k; ++p)
    for (std::size_t q = 0; q < k; ++q) {
      double x = 0, y = 0;
      for (std::size_t i = 0; i < m; ++i) x += double(r.u[i * k + p]) * double(r.u[i * k + q]);
      for (std::size_t j = 0; j < n; ++j) y += double(r.vt[p * n + j]) * double(r.vt[q * n + j]);
      utu = std::max(utu, std::abs(x - (p == q ? 1.0 : 0.0)));
      vvt = std::max(vvt, std::abs(y - (p == q ? 1.0 : 0.0)));
    }
  for (std::size_t i = 0; i < m; ++i)
    for (std::size_t j = 0; j < n; ++j) {
      double x = 0;
      for (std::size_t l = 0; l < k; ++l)
        x += double(r.u[i * k + l]) * double(r.s[l]) * double(r.vt[l * n + j]);
      rec = std::max(rec, std::abs(x - double(a[i * n + j])));
      amax = std::max(amax, std::abs(double(a[i * n + j])));
    }
  CHECK(utu <= tol);
  CHECK(vvt <= tol);
  CHECK(rec <= tol * std::max(amax, 1e-300));
  for (std::size_t l = 0; l < k; ++l) {
    CHECK(r.s[l] >= T(0));
    if (l > 0) CHECK(r.s[l] <= r.s[l - 1]);
    const T* row = r.vt.data() + l * n;
    const std::size_t pivot = static_cast<std::size_t>(
        std::max_element(row, row + n, [](T x, T y) { return std::abs(x) < std::abs(y); }) - row);
    CHECK(row[pivot] > T(0));
  }
  const Svd<T> again = svd<T>(m, n, a);
  CHECK(again.u == r.u);
  CHECK(again.s == r.s);
  CHECK(again.vt == r.vt);
}

template <class T>
void impl_test_svd() {
  const std::pair<std::size_t, std::size_t> sizes[] = {{1, 1}, {2, 3}, {3, 2}, {13, 5}, {5, 13}, {64, 64}};
  std::uint64_t stream = 500;
  for (const auto& [m, n] : sizes) check_svd<T>(m, n, lather::test::random_values(m * n, stream++));
  // Rank 1 and 2.
  for (const auto& [m, n] : {std::pair<std::size_t, std::size_t>{13, 5}, {5, 13}, {16, 16}}) {
    check_svd<T>(m, n, with_singular_values(m, n, {3.0}, stream += 2));
    check_svd<T>(m, n, with_singular_values(m, n, {3.0, 0.5}, stream += 2));
  }
  // Repeated singular values: twice an orthogonal matrix.
  {
    Dense q = householder(8, stream++);
    for (double& x : q) x *= 2.0;
    check_svd<T>(8, 8, q);
    const Svd<T> r = svd<T>(8, 8, round_to<T>(q));
    for (const T sv : r.s)
      CHECK(double(sv) == doctest::Approx(2.0).epsilon(std::is_same_v<T, double> ? 1e-14 : 1e-6));
  }
  // Ill-conditioned: singular values 1 .. 1e-12.
  {
    std::vector<double> sigma;
    for (int l = 0; l <= 12; ++l) sigma.push_back(std::pow(10.0, -l));
    check_svd<T>(13, 13, with_singular_values(13, 13, sigma, stream += 2));
    check_svd<T>(20, 13, with_singular_values(20, 13, sigma, stream += 2));
  }
  // 1 x 1: the sign goes to u.
  {
    const Svd<T> r = svd<T>(1, 1, {T(-3)});
    CHECK(r.s == std::vector<T>{T(3)});
    CHECK(r.vt == std::vector<T>{T(1)});
    CHECK(r.u == std::vector<T>{T(-1)});
  }
  // Empty.
  {
    const Svd<T> r = svd<T>(0, 3, {});
    CHECK(r.u.empty());
    CHECK(r.s.empty());
    CHECK(r.vt.empty());
  }
}

}  // namespace

TEST_CASE_TEMPLATE("svd: thin_svd_host is orthogonal, exact, ordered, sign-fixed and deterministic", T, float,
                   double) {
  impl_test_svd<T>();
}

TEST_CASE_TEMPLATE("svd: lapack::gesdd on a column-major matrix", T, float, double) {
  // a = [[3, 0], [0, -2], [0, 0]] column-major: s = {3, 2}.
  std::vector<T> a{3, 0, 0, 0, -2, 0}, s(2), u(6), vt(4);
  CHECK(lather::impl::lapack::gesdd<T>(3, 2, a.data(), s.data(), u.data(), vt.data()) == 0);
  CHECK(double(s[0]) == doctest::Approx(3.0));
  CHECK(double(s[1]) == doctest::Approx(2.0));
  // u(0,0) * vt(0,0) * 3 = a(0,0) and u(1,1) * vt(1,1) * 2 = a(1,1), whatever the signs.
  CHECK(double(u[0] * vt[0]) == doctest::Approx(1.0));
  CHECK(double(u[4] * vt[3]) == doctest::Approx(-1.0));
}

TEST_CASE("svd: a failing gesdd throws lather::runtime_error naming the size") {
  std::vector<double> a(6, 1.0), u, s, vt;
  a[4] = std::numeric_limits<double>::quiet_NaN();
  try {
    lather::impl::thin_svd_host<double>(2, 3, a.data(), u, s, vt);
    FAIL("no exception");
  } catch (const lather::runtime_error& e) {
    CHECK(std::string(e.what()).find("2 x 3") != std::string::npos);
  }
  CHECK_THROWS_AS(lather::impl::thin_svd_host<double>(-1, 3, a.data(), u, s, vt), lather::invalid_argument);
}
