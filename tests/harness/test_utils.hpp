// SPDX-License-Identifier: Apache-2.0
// Shared test helpers: the seed, per-type tolerances, host<->device copies of TensorRef data and
// a comparison that reports the first bad element.
#ifndef LATHER_TEST_UTILS_HPP
#define LATHER_TEST_UTILS_HPP

#include <lather/traits/tensor_traits.hpp>

#include <Kokkos_Core.hpp>

#include <doctest/doctest.h>

#include <cfenv>
#include <cmath>
#include <cstdint>
#include <random>
#include <sstream>
#include <string>
#include <vector>

namespace lather::test {

inline std::uint64_t& seed() {
  static std::uint64_t s = 20261122;
  return s;
}

/// Random values in [-1, 1) from a generator seeded by the global seed and `stream`.
inline std::vector<double> random_values(std::size_t n, std::uint64_t stream, double scale = 1.0) {
  std::mt19937_64 gen(seed() * 6364136223846793005ULL + stream);
  std::uniform_real_distribution<double> dist(-1.0, 1.0);
  std::vector<double> v(n);
  for (auto& x : v) x = scale * dist(gen);
  return v;
}

/// Tolerances for comparing a lather result in T against an independent double reference that
/// does the same operations in the same order: double agrees to a few ulps (1e-13 leaves room for
/// the compiler contracting a*b+c into an FMA); float carries its own rounding through every step.
template <class T>
struct tolerances;
template <>
struct tolerances<double> {
  static constexpr double rtol = 1e-13, atol = 1e-15;
};
template <>
struct tolerances<float> {
  static constexpr double rtol = 2e-5, atol = 2e-6;
};

/// Row-major host copy of the elements of a TensorRef (fences through deep_copy).
template <class T, class M>
std::vector<double> to_host(const TensorRef<T, M>& t) {
  using V = std::remove_const_t<T>;
  Kokkos::View<V*, M> flat("lather::test::flat", static_cast<std::size_t>(t.size()));
  const TensorRef<T, M> src = t;
  Kokkos::parallel_for(
      "lather::test::gather",
      Kokkos::RangePolicy<typename M::execution_space, Kokkos::IndexType<std::int64_t>>(0, t.size()),
      KOKKOS_LAMBDA(std::int64_t i) { flat(i) = src[i]; });
  auto h = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), flat);
  std::vector<double> out(h.extent(0));
  for (std::size_t i = 0; i < out.size(); ++i) out[i] = static_cast<double>(h(i));
  return out;
}

/// Writes row-major `values` into the elements of a TensorRef (fences).
template <class T, class M>
void from_host(const TensorRef<T, M>& t, const std::vector<double>& values) {
  REQUIRE(static_cast<std::int64_t>(values.size()) == t.size());
  Kokkos::View<T*, Kokkos::HostSpace> h("lather::test::host", values.size());
  for (std::size_t i = 0; i < values.size(); ++i) h(i) = static_cast<T>(values[i]);
  auto d = Kokkos::create_mirror_view_and_copy(M(), h);
  const TensorRef<T, M> dst = t;
  Kokkos::parallel_for(
      "lather::test::scatter",
      Kokkos::RangePolicy<typename M::execution_space, Kokkos::IndexType<std::int64_t>>(0, t.size()),
      KOKKOS_LAMBDA(std::int64_t i) { dst[i] = d(i); });
  Kokkos::fence();
}

/// CHECKs |a - b| <= atol + rtol*|b| element-wise, reporting the first failing index.
inline bool all_close(const std::vector<double>& actual, const std::vector<double>& expected,
                      double rtol, double atol, const std::string& what) {
  if (actual.size() != expected.size()) {
    FAIL_CHECK(what << ": size " << actual.size() << " != expected " << expected.size());
    return false;
  }
  for (std::size_t i = 0; i < actual.size(); ++i) {
    const double err = std::abs(actual[i] - expected[i]);
    if (!(err <= atol + rtol * std::abs(expected[i]))) {
      std::ostringstream s;
      s.precision(17);
      s << what << ": element " << i << " is " << actual[i] << ", expected " << expected[i]
        << " (|diff| " << err << " > atol " << atol << " + rtol " << rtol << " * |expected|)";
      FAIL_CHECK(s.str());
      return false;
    }
  }
  return true;
}

/// Largest relative difference max|a-b|/max(|b|, floor).
inline double max_rel_diff(const std::vector<double>& a, const std::vector<double>& b,
                           double floor = 1e-30) {
  double m = 0;
  for (std::size_t i = 0; i < a.size() && i < b.size(); ++i)
    m = std::max(m, std::abs(a[i] - b[i]) / std::max(std::abs(b[i]), floor));
  return m;
}

/// The floating-point exceptions (FE_* bits) `f` raises in the calling thread. The harness's traps
/// are off meanwhile (feholdexcept: non-stop mode, flags cleared), and the environment, traps and
/// flags included, is restored afterwards.
template <class F>
int raised_fp_exceptions(F&& f) {
  std::fenv_t env;
  std::feholdexcept(&env);
  f();
  const int raised = std::fetestexcept(FE_ALL_EXCEPT);
  std::fesetenv(&env);
  return raised;
}

}  // namespace lather::test

#endif
