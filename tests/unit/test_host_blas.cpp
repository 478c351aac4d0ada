// SPDX-License-Identifier: Apache-2.0
// The direct host BLAS path (impl/backends/blas.hpp): impl::kernels::gemm on every layout and
// transpose combination against a long-double triple loop, SYMM from one triangle, Shampoo's
// row-wise factor-combine and triangle-unpack kernels against their element-wise forms (bit for
// bit), the SYRK Gram product and the SYRK
// form of Q diag(s) Q^T against their definitions, the small SYRK and SYMM shapes lather runs in
// its own loops (every dimension up to a vector register) against theirs, the register tiles'
// SYRK (order 17 to 1024) and SYMM 'R' (order 17 to 256) against theirs and the tiles' side fetch
// (no bit changed), and the allocation rules: after the first
// call of a size, a host product and an EigenRootInverse root allocate nothing on the heap (this
// executable replaces the global operator new to count; host compilers only, as the benchmark).
//
// Tolerances: a product of length k in precision u has |error| <= k u sum_c |a_ic b_cj| (Higham
// 3.5); the test checks against 4 k u max|a| max|b| k-scaled, i.e. the bound with the sum
// replaced by k max|a| max|b| and a factor 4 of room for the BLAS' blocked order.
#include <lather/impl/backends/blas.hpp>
#include <lather/impl/backends/blas_split.hpp>
#include <lather/impl/kernels/matrix_functions.hpp>
#include <lather/impl/kernels/shampoo.hpp>
#include <lather/impl/kernels/shampoo_batched.hpp>
#include <lather/optimizers/adam.hpp>
#include <lather/optimizers/shampoo.hpp>
#include <lather/root_inverse/auto_root_inverse.hpp>
#include <lather/root_inverse/coupled_higher_order.hpp>
#include <lather/root_inverse/coupled_newton.hpp>
#include <lather/root_inverse/eigen_root_inverse.hpp>

#include <Kokkos_Core.hpp>

#include <doctest/doctest.h>

#include "exec_spaces.hpp"
#include "test_utils.hpp"

#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <new>
#include <optional>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

// The counting operator new of this executable (host compilers only: LATHER_TEST_COUNTS_HEAP).
#include "heap_count.hpp"

namespace {
#if LATHER_TEST_COUNTS_HEAP
using lather::test::heap_allocations;
#endif

using ld = long double;

template <class T, class Layout, class Space>
Kokkos::View<T**, Layout, Space> random_matrix(std::size_t r, std::size_t c, std::uint64_t stream) {
  Kokkos::View<T**, Layout, Space> m("m", r, c);
  auto h = Kokkos::create_mirror_view(m);
  const auto v = lather::test::random_values(r * c, stream);
  for (std::size_t i = 0; i < r; ++i)
    for (std::size_t j = 0; j < c; ++j) h(i, j) = static_cast<T>(v[i * c + j]);
  Kokkos::deep_copy(m, h);
  return m;
}

template <class T, class LA, class LB, class LC, class ExecSpace>
void check_gemm(const ExecSpace& space, bool ta, bool tb, std::size_t m, std::size_t n, std::size_t k) {
  using Space = typename ExecSpace::memory_space;
  const auto a = random_matrix<T, LA, Space>(ta ? k : m, ta ? m : k, 11 + m + 7 * k);
  const auto b = random_matrix<T, LB, Space>(tb ? n : k, tb ? k : n, 13 + n + 5 * k);
  auto c = random_matrix<T, LC, Space>(m, n, 17 + m * n);
  const auto ah = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), a);
  const auto bh = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), b);
  const auto c0 = Kokkos::create_mirror(Kokkos::HostSpace(), c);  // a copy even for host data
  Kokkos::deep_copy(c0, c);
  const T alpha = T(0.75), beta = T(-0.5);
  lather::impl::kernels::gemm(space, ta ? "T" : "N", tb ? "T" : "N", alpha, a, b, beta, c);
  space.fence();
  const auto ch = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), c);
  const ld u = std::numeric_limits<T>::epsilon();
  for (std::size_t i = 0; i < m; ++i)
    for (std::size_t j = 0; j < n; ++j) {
      ld s = 0;
      for (std::size_t l = 0; l < k; ++l)
        s += static_cast<ld>(ta ? ah(l, i) : ah(i, l)) * static_cast<ld>(tb ? bh(j, l) : bh(l, j));
      const ld want = static_cast<ld>(alpha) * s + static_cast<ld>(beta) * static_cast<ld>(c0(i, j));
      const ld tol = 4 * static_cast<ld>(k + 2) * u;  // |a|, |b|, |c| <= 1
      INFO("m=", m, " n=", n, " k=", k, " ta=", ta, " tb=", tb, " (", i, ",", j, ")");
      REQUIRE(std::fabs(static_cast<ld>(ch(i, j)) - want) <= tol);
    }
}

template <class T, class ExecSpace>
void check_all_layouts(const ExecSpace& space) {
  using L = Kokkos::LayoutLeft;
  using R = Kokkos::LayoutRight;
  // Sizes 1, 2, 3, 13, an empty inner dimension, and rectangular shapes.
  const std::size_t shapes[][3] = {{1, 1, 1}, {2, 3, 1}, {3, 2, 13}, {13, 13, 13}, {5, 4, 0}, {1, 7, 3}, {9, 1, 4}};
  for (const auto& s : shapes)
    for (int t = 0; t < 4; ++t) {
      const bool ta = t & 1, tb = t & 2;
      check_gemm<T, L, L, L>(space, ta, tb, s[0], s[1], s[2]);
      check_gemm<T, R, R, R>(space, ta, tb, s[0], s[1], s[2]);
      check_gemm<T, L, R, R>(space, ta, tb, s[0], s[1], s[2]);
      check_gemm<T, R, L, L>(space, ta, tb, s[0], s[1], s[2]);
      check_gemm<T, R, R, L>(space, ta, tb, s[0], s[1], s[2]);
    }
}
}  // namespace

TEST_CASE_TEMPLATE_DEFINE("host BLAS: impl::kernels::gemm equals the definition for every layout and transpose", ExecSpace, gemm_layouts) {
  const ExecSpace space;
  check_all_layouts<double>(space);
  check_all_layouts<float>(space);
}

TEST_CASE_TEMPLATE_APPLY(gemm_layouts, lather_test_exec_spaces);

TEST_CASE("host BLAS: a strided View is refused by the direct path (Kokkos Kernels takes it)") {
  Kokkos::View<double***, Kokkos::LayoutRight, Kokkos::HostSpace> cube("cube", 4, 3, 5);
  const auto slice = Kokkos::subview(cube, Kokkos::ALL, 1, Kokkos::ALL);  // strides (15, 1): a usable ld
  CHECK(lather::impl::blas::column_major(slice).ok);
  CHECK(lather::impl::blas::column_major(slice).transposed);
  CHECK(lather::impl::blas::column_major(slice).ld == 15);
  const auto col = Kokkos::subview(cube, Kokkos::ALL, Kokkos::ALL, 2);  // strides (15, 5): neither is 1
  CHECK_FALSE(lather::impl::blas::column_major(col).ok);
}

TEST_CASE("host BLAS: the SYRK Gram product fills one triangle with X X^T and X^T X") {
  for (const std::size_t n : {1u, 2u, 3u, 13u})
    for (const std::size_t k : {1u, 4u, 13u}) {
      const auto x = lather::test::random_values(n * k, 100 + n + k);  // column-major n x k
      std::vector<double> c(n * n, std::numeric_limits<double>::quiet_NaN()), ct(k * k, -7.0);
      lather::impl::blas::syrk<double>('U', 'N', static_cast<std::int64_t>(n), static_cast<std::int64_t>(k), 1.0,
                                       x.data(), static_cast<std::int64_t>(n), 0.0, c.data(),
                                       static_cast<std::int64_t>(n));
      // X^T X with the same storage read as k x n... i.e. the k x k Gram of the columns.
      lather::impl::blas::syrk<double>('U', 'T', static_cast<std::int64_t>(k), static_cast<std::int64_t>(n), 1.0,
                                       x.data(), static_cast<std::int64_t>(n), 0.0, ct.data(),
                                       static_cast<std::int64_t>(k));
      for (std::size_t j = 0; j < n; ++j)
        for (std::size_t i = 0; i <= j; ++i) {
          ld s = 0;
          for (std::size_t l = 0; l < k; ++l) s += static_cast<ld>(x[i + l * n]) * x[j + l * n];
          CHECK(std::fabs(c[i + j * n] - s) <= 4e-16L * (k + 2));
        }
      for (std::size_t j = 0; j < k; ++j)
        for (std::size_t i = 0; i <= j; ++i) {
          ld s = 0;
          for (std::size_t l = 0; l < n; ++l) s += static_cast<ld>(x[l + i * n]) * x[l + j * n];
          CHECK(std::fabs(ct[i + j * k] - s) <= 4e-16L * (n + 2));
        }
      // The strictly lower triangle is not written.
      for (std::size_t j = 0; j < n; ++j)
        for (std::size_t i = j + 1; i < n; ++i) CHECK(std::isnan(c[i + j * n]));
      // 'L' (Shampoo's factor updates: FactorCombine reads the lower triangle, contiguously):
      // the same values mirrored, the strictly upper triangle untouched.
      std::vector<double> cl(n * n, std::numeric_limits<double>::quiet_NaN());
      lather::impl::blas::syrk<double>('L', 'N', static_cast<std::int64_t>(n), static_cast<std::int64_t>(k), 1.0,
                                       x.data(), static_cast<std::int64_t>(n), 0.0, cl.data(),
                                       static_cast<std::int64_t>(n));
      for (std::size_t j = 0; j < n; ++j)
        for (std::size_t i = 0; i < n; ++i) {
          if (i < j) {
            CHECK(std::isnan(cl[i + j * n]));
            continue;
          }
          ld s = 0;
          for (std::size_t l = 0; l < k; ++l) s += static_cast<ld>(x[i + l * n]) * x[j + l * n];
          CHECK(std::fabs(cl[i + j * n] - s) <= 4e-16L * (k + 2));
        }
    }
}

TEST_CASE("host BLAS: SYMM reads one triangle and equals the product with the full symmetric matrix") {
  // Shampoo's preconditioning with a packed inverse factor: P's lower triangle only (the upper
  // one holds NaN here, so reading it would show), from the left (d x n) and from the right (m x d).
  for (const std::int64_t d : {1, 2, 3, 13})
    for (const std::int64_t other : {1, 4, 13}) {
      const auto pv = lather::test::random_values(static_cast<std::size_t>(d * d), 300 + d);
      std::vector<double> p(static_cast<std::size_t>(d * d), std::numeric_limits<double>::quiet_NaN());
      auto full = [&](std::int64_t i, std::int64_t j) {  // symmetric, from the lower triangle of pv
        return static_cast<ld>(i >= j ? pv[static_cast<std::size_t>(i + j * d)] : pv[static_cast<std::size_t>(j + i * d)]);
      };
      for (std::int64_t j = 0; j < d; ++j)
        for (std::int64_t i = j; i < d; ++i) p[static_cast<std::size_t>(i + j * d)] = pv[static_cast<std::size_t>(i + j * d)];
      const auto x = lather::test::random_values(static_cast<std::size_t>(d * other), 400 + d + other);
      std::vector<double> left(static_cast<std::size_t>(d * other), -3.0), right(static_cast<std::size_t>(d * other), -3.0);
      lather::impl::blas::symm<double>('L', 'L', d, other, 1.0, p.data(), d, x.data(), d, 0.0, left.data(), d);
      lather::impl::blas::symm<double>('R', 'L', other, d, 1.0, p.data(), d, x.data(), other, 0.0, right.data(), other);
      for (std::int64_t i = 0; i < d; ++i)
        for (std::int64_t j = 0; j < other; ++j) {
          ld l = 0, r = 0;  // left: (P X)(i, j), X d x other; right: (X P)(j, i), X other x d
          for (std::int64_t c = 0; c < d; ++c) {
            l += full(i, c) * static_cast<ld>(x[static_cast<std::size_t>(c + j * d)]);
            r += static_cast<ld>(x[static_cast<std::size_t>(j + c * other)]) * full(c, i);
          }
          INFO("d=", d, " other=", other, " (", i, ",", j, ")");
          CHECK(std::fabs(static_cast<ld>(left[static_cast<std::size_t>(i + j * d)]) - l) <= 4e-16L * (d + 2));
          CHECK(std::fabs(static_cast<ld>(right[static_cast<std::size_t>(j + i * other)]) - r) <= 4e-16L * (d + 2));
        }
    }
}

namespace {
// impl::blas::syrk ('N') and symm ('L') where the symmetric dimension fits one vector register:
// lather's own loops on AVX-512 CPUs (small_products.hpp), the BLAS elsewhere; either way the
// definition. Every n from 1 to 16 (floats) or 8 (doubles): each is its own instantiation.
// Tolerance: the file's 4 (k + 2) u (|a| <= 1; k the summed length), and at k = 65536 the chunked
// sum's own bound (chunk + k / chunk + 2) u sum_l |a_il a_jl|.
// `trans` 'T': A is k x n (lda >= k), C = alpha A^T A + beta C.
template <class T>
void check_small_syrk(std::int64_t n, std::int64_t k, std::int64_t lda, char uplo, T alpha, T beta, char trans = 'N') {
  namespace blas = lather::impl::blas;
  const bool tr = trans == 'T';
  const auto av = lather::test::random_values(static_cast<std::size_t>(lda * (tr ? n : k)), (tr ? 1500 : 500) + 31 * n + k);
  std::vector<T> a(av.begin(), av.end());
  const auto cv = lather::test::random_values(static_cast<std::size_t>((n + 2) * n), 600 + n);
  const std::int64_t ldc = n + 2;
  std::vector<T> c(cv.begin(), cv.end());
  const bool lower = uplo == 'L';
  // Where beta is 0 the BLAS does not read C: NaN there must not show. The other triangle and
  // the rows past n must stay as they were.
  for (std::int64_t j = 0; j < n; ++j)
    for (std::int64_t i = 0; i < n; ++i)
      if (beta == T(0) && (lower ? i >= j : i <= j)) c[static_cast<std::size_t>(i + j * ldc)] = std::numeric_limits<T>::quiet_NaN();
  const std::vector<T> c0 = c;
  blas::syrk<T>(uplo, trans, n, k, alpha, a.data(), lda, beta, c.data(), ldc);
  const ld u = std::numeric_limits<T>::epsilon();
  auto at = [&](std::int64_t row, std::int64_t l) {  // op(A)(row, l)
    return static_cast<ld>(a[static_cast<std::size_t>(tr ? l + row * lda : row + l * lda)]);
  };
  for (std::int64_t j = 0; j < n; ++j)
    for (std::int64_t i = 0; i < ldc; ++i) {
      const auto e = static_cast<std::size_t>(i + j * ldc);
      INFO("n=", n, " k=", k, " lda=", lda, " uplo=", uplo, " trans=", trans, " (", i, ",", j, ")");
      if (i >= n || (lower ? i < j : i > j)) {
        CHECK(std::memcmp(&c[e], &c0[e], sizeof(T)) == 0);
        continue;
      }
      ld s = 0, mag = 0;
      for (std::int64_t l = 0; l < k; ++l) {
        const ld t = at(i, l) * at(j, l);
        s += t;
        mag += std::fabs(t);
      }
      const ld want = static_cast<ld>(alpha) * s + (beta == T(0) ? 0 : static_cast<ld>(beta) * c0[e]);
      const ld tol = k > 4096 ? (256 + k / 256 + 4) * u * (mag + 1) : 4 * static_cast<ld>(k + 2) * u;
      CHECK(std::fabs(static_cast<ld>(c[e]) - want) <= tol);
    }
}

template <class T>
void check_small_symm(std::int64_t m, std::int64_t n, char uplo, std::int64_t ldb, std::int64_t ldc, T alpha, T beta) {
  namespace blas = lather::impl::blas;
  const bool lower = uplo == 'L';
  const auto pv = lather::test::random_values(static_cast<std::size_t>(m * m), 700 + m);
  std::vector<T> p(pv.begin(), pv.end());
  for (std::int64_t j = 0; j < m; ++j)  // the triangle not read holds NaN
    for (std::int64_t i = 0; i < m; ++i)
      if (lower ? i < j : i > j) p[static_cast<std::size_t>(i + j * m)] = std::numeric_limits<T>::quiet_NaN();
  auto full = [&](std::int64_t i, std::int64_t j) {
    return static_cast<ld>((lower == (i >= j)) ? p[static_cast<std::size_t>(i + j * m)] : p[static_cast<std::size_t>(j + i * m)]);
  };
  const auto bv = lather::test::random_values(static_cast<std::size_t>(ldb * n), 800 + m + n);
  const std::vector<T> b(bv.begin(), bv.end());
  const auto cv = lather::test::random_values(static_cast<std::size_t>(ldc * n), 900 + m + n);
  std::vector<T> c(cv.begin(), cv.end());
  if (beta == T(0))
    for (std::int64_t j = 0; j < n; ++j)
      for (std::int64_t i = 0; i < m; ++i) c[static_cast<std::size_t>(i + j * ldc)] = std::numeric_limits<T>::quiet_NaN();
  const std::vector<T> c0 = c;
  blas::symm<T>('L', uplo, m, n, alpha, p.data(), m, b.data(), ldb, beta, c.data(), ldc);
  const ld u = std::numeric_limits<T>::epsilon();
  for (std::int64_t j = 0; j < n; ++j)
    for (std::int64_t i = 0; i < ldc; ++i) {
      const auto e = static_cast<std::size_t>(i + j * ldc);
      INFO("m=", m, " n=", n, " uplo=", uplo, " ldb=", ldb, " ldc=", ldc, " (", i, ",", j, ")");
      if (i >= m) {  // the rows past m are not written
        CHECK(std::memcmp(&c[e], &c0[e], sizeof(T)) == 0);
        continue;
      }
      ld s = 0;
      for (std::int64_t l = 0; l < m; ++l) s += full(i, l) * static_cast<ld>(b[static_cast<std::size_t>(l + j * ldb)]);
      const ld want = static_cast<ld>(alpha) * s + (beta == T(0) ? 0 : static_cast<ld>(beta) * c0[e]);
      CHECK(std::fabs(static_cast<ld>(c[e]) - want) <= 4 * static_cast<ld>(m + 2) * u);
    }
  // lather's loops: columns are independent, so the product of the columns in two parts (as
  // split::symm makes it on two threads) gives the same bits. (Not the BLAS': OpenBLAS' results
  // at m = 17 depend on the split, which blas_split.hpp accounts for.)
  if (n >= 2 && lather::impl::blas::small::takes<T>(m)) {
    std::vector<T> parts = c0;
    const std::int64_t half = n / 2;
    blas::symm<T>('L', uplo, m, half, alpha, p.data(), m, b.data(), ldb, beta, parts.data(), ldc);
    blas::symm<T>('L', uplo, m, n - half, alpha, p.data(), m, b.data() + half * ldb, ldb, beta, parts.data() + half * ldc, ldc);
    INFO("m=", m, " n=", n, " uplo=", uplo, " ldb=", ldb, " ldc=", ldc);
    CHECK(std::memcmp(parts.data(), c.data(), c.size() * sizeof(T)) == 0);
  }
}

template <class T>
void check_small_products() {
  constexpr std::int64_t top = std::is_same_v<T, float> ? 16 : 8;
  for (std::int64_t n = 1; n <= top + 1; ++n) {  // top + 1: the BLAS again
    for (const std::int64_t k : {1, 5, 256, 257, 700})
      for (const char uplo : {'L', 'U'}) {
        check_small_syrk<T>(n, k, n, uplo, T(1), T(0));
        check_small_syrk<T>(n, k, n + 3, uplo, T(0.5), T(-0.75));
      }
    for (const std::int64_t cols : {1, 3, 4, 5, 513, 1030})
      for (const char uplo : {'L', 'U'}) {
        check_small_symm<T>(n, cols, uplo, n, n, T(1), T(0));
        check_small_symm<T>(n, cols, uplo, n + 1, n + 2, T(-0.5), T(0.25));
      }
  }
  // A long sum: a (256, 256, 9) block's last dimension.
  check_small_syrk<T>(9, 65536, 9, 'L', T(1), T(0.999));
}

// small::syrk_n_runs (split::syrk_lower_runs): a block's last dimension read in its parameter,
// rows of `run` columns a stride apart, gives the bits of syrk_n on the same columns side by
// side (the gathered block). Runs shorter, equal and longer than the sums' chunk of 256 columns
// and not dividing it, a single run, and the (256, 256, 9) block of a (512, 512, 9) convolution;
// the elements between the runs are NaN, so reading one would show.
template <class T>
void check_small_syrk_runs() {
  namespace blas = lather::impl::blas;
  constexpr std::int64_t top = std::is_same_v<T, float> ? 16 : 8;
  struct Case {
    std::int64_t n, rows, run, gap;  // gap: columns of n between two runs
  };
  const Case cases[] = {{1, 3, 5, 2}, {3, 4, 2, 2}, {9, 7, 100, 9}, {9, 3, 256, 1}, {top, 5, 300, 4},
                        {2, 1, 700, 0}, {5, 40, 13, 7}, {9, 256, 256, 256}};
  for (const auto& cs : cases) {
    if (!blas::small::takes<T>(cs.n)) continue;
    const std::int64_t n = cs.n, k = cs.rows * cs.run, stride = (cs.run + cs.gap) * n;
    const auto gv = lather::test::random_values(static_cast<std::size_t>(k * n), 4100 + k + n);
    std::vector<T> tensor(static_cast<std::size_t>(cs.rows * stride), std::numeric_limits<T>::quiet_NaN());
    std::vector<T> packed(static_cast<std::size_t>(k * n));
    for (std::int64_t r = 0; r < cs.rows; ++r)
      for (std::int64_t e = 0; e < cs.run * n; ++e) {
        const auto v = static_cast<T>(gv[static_cast<std::size_t>(r * cs.run * n + e)]);
        tensor[static_cast<std::size_t>(r * stride + e)] = v;
        packed[static_cast<std::size_t>(r * cs.run * n + e)] = v;
      }
    const auto cv = lather::test::random_values(static_cast<std::size_t>(n * n), 4200 + n);
    const std::vector<T> c0(cv.begin(), cv.end());
    std::vector<T> want = c0, got = c0;
    blas::small::syrk_n<T>('L', n, k, T(0.25), packed.data(), n, T(0.999), want.data(), n);
    blas::split::syrk_lower_runs<T>(n, k, T(0.25), tensor.data(), n, cs.run, stride, T(0.999), got.data(), n);
    INFO("n=", n, " rows=", cs.rows, " run=", cs.run, " gap=", cs.gap);
    CHECK(std::memcmp(want.data(), got.data(), want.size() * sizeof(T)) == 0);
  }
}
}  // namespace

TEST_CASE("host BLAS: SYRK 'N' and SYMM 'L' with a dimension of one vector register or less equal the definition") {
  check_small_products<float>();
  check_small_products<double>();
}

TEST_CASE("host BLAS: the short-dimension SYRK of columns in runs a stride apart has the bits of the runs side by side") {
  MESSAGE("short-dimension loops on this CPU: ", std::string(lather::impl::blas::small::takes<float>(9) ? "yes" : "no (the BLAS)"));
  check_small_syrk_runs<float>();
  check_small_syrk_runs<double>();
}

namespace {
// SYRK 'N' and 'T' of order min_dim to max_dim (tiled_syrk.hpp's register tiles on AVX-512
// CPUs, 'T' for floats through a transposition; the BLAS elsewhere): against the definition at
// the edges of the tiles (3 vectors of rows, 8 columns; a column's last tile 1 or 2 vectors),
// of the transposition's 16 x 16 blocks,
// of the chunks of k and of the range (one below and one above: the BLAS again), both
// triangles, larger leading dimensions, with NaN where C is unread; then the columns in uneven
// bands give the whole product's bits (what split::syrk_lower's parts rely on), and 'T' on the
// transposed A gives 'N''s.
template <class T>
void check_tiled_syrk() {
  namespace tiled = lather::impl::blas::tiled;
  constexpr std::int64_t lanes = std::is_same_v<T, float> ? 16 : 8, rows = 3 * lanes, ch = tiled::chunk<T>;
  const std::int64_t lo = tiled::min_dim<T>, hi = tiled::max_dim;
  for (const std::int64_t n : {lo - 1, lo, lo + 1, 2 * lanes - 1, 2 * lanes, 2 * lanes + 1, rows - 1, rows, rows + 1,
                               std::int64_t{100}, std::int64_t{256}, std::int64_t{257}, hi, hi + 1}) {
    std::vector<std::int64_t> ks = {1, 7, 8};
    if (n <= 257) ks.insert(ks.end(), {ch, ch + 1, 2 * ch + 5});
    for (const std::int64_t k : ks)
      for (const char uplo : {'L', 'U'}) {
        check_small_syrk<T>(n, k, n, uplo, T(1), T(0));
        check_small_syrk<T>(n, k, n + 3, uplo, T(0.5), T(-0.75));
        check_small_syrk<T>(n, k, k, uplo, T(1), T(0), 'T');
        check_small_syrk<T>(n, k, k + 5, uplo, T(0.5), T(-0.75), 'T');
      }
  }
  for (const std::int64_t n : {lo, std::int64_t{100}, std::int64_t{257}})
    for (const std::int64_t k : {std::int64_t{5}, ch + 3})
      for (const char uplo : {'L', 'U'}) {
        if (!tiled::takes<T>(n, k, T(1))) continue;
        const auto av = lather::test::random_values(static_cast<std::size_t>(n * k), 1300 + n + k);
        const std::vector<T> a(av.begin(), av.end());
        const auto cv = lather::test::random_values(static_cast<std::size_t>(n * n), 1400 + n);
        const std::vector<T> c0(cv.begin(), cv.end());
        std::vector<T> whole = c0, bands = c0;
        tiled::syrk_n<T>(uplo, n, k, T(0.5), a.data(), n, T(0.999), whole.data(), n);
        const std::int64_t cuts[] = {0, 3, 3, n / 2 + 1, n - 1, n};  // an empty band, bands of 1 and 3
        for (int b = 0; b + 1 < 6; ++b)
          tiled::syrk_columns<T>(uplo, n, k, T(0.5), a.data(), n, T(0.999), bands.data(), n, cuts[b], cuts[b + 1]);
        INFO("n=", n, " k=", k, " uplo=", uplo);
        CHECK(std::memcmp(whole.data(), bands.data(), whole.size() * sizeof(T)) == 0);
        if (!tiled::takes_transposed<T>(n, k, T(1))) continue;
        // 'T' on the transpose of the same A: the transposition adds no rounding, so the bits
        // of 'N', whole and in bands.
        std::vector<T> at(static_cast<std::size_t>(k * n));
        for (std::int64_t p = 0; p < k; ++p)
          for (std::int64_t i = 0; i < n; ++i) at[static_cast<std::size_t>(p + i * k)] = a[static_cast<std::size_t>(i + p * n)];
        std::vector<T> t_whole = c0, t_bands = c0;
        tiled::syrk_t<T>(uplo, n, k, T(0.5), at.data(), k, T(0.999), t_whole.data(), n);
        for (int b = 0; b + 1 < 6; ++b)
          tiled::syrk_columns_transposed<T>(uplo, n, k, T(0.5), at.data(), k, T(0.999), t_bands.data(), n, cuts[b], cuts[b + 1]);
        CHECK(std::memcmp(whole.data(), t_whole.data(), whole.size() * sizeof(T)) == 0);
        CHECK(std::memcmp(whole.data(), t_bands.data(), whole.size() * sizeof(T)) == 0);
      }
}
}  // namespace

TEST_CASE("host BLAS: SYRK 'N' and 'T' of order 17 to 1024 (register tiles on AVX-512) equal the definition, in any column bands") {
  MESSAGE("tiled SYRK on this CPU: ", std::string(lather::impl::blas::tiled::takes<float>(256, 256, 1.0f) ? "yes" : "no (the BLAS)"));
  check_tiled_syrk<float>();
  check_tiled_syrk<double>();
}

namespace {
// The SYRK of a row-major (outer, n, inner) tensor's middle mode read in place
// (tiled::syrk_columns_unfolded: the transposition gathers the unfolding): the bits of
// UnfoldMode followed by the SYRK 'T' (checked against the definition above), whole, in uneven
// column bands, both triangles, and through split::syrk_lower_unfolded on one and several threads;
// k = outer inner across chunks of k that end inside a group of `inner` (256 = 28 x 9 + 4), every
// run pattern a group of 16 steps can hold (inner 1 to 17, 49), the tiles' order range's edges
// (16: not taken, nothing written). Then one shape against the definition in long double.
template <class Where>
void check_unfolded_syrk(Where* where) {
  namespace blas = lather::impl::blas;
  namespace tiled = blas::tiled;
  struct Shape {
    std::int64_t outer, n, inner;
  };
  const Shape shapes[] = {{2, 17, 9},   {30, 17, 9},  {3, 33, 5},  {5, 33, 17}, {7, 100, 1},  {40, 100, 2},
                          {3, 64, 49},  {29, 48, 16}, {13, 49, 3}, {2, 16, 9},  {64, 128, 9}, {256, 256, 9},
                          {9, 257, 7},  {4, 100, 13}, {6, 40, 11}, {3, 1024, 4}};
  for (const auto& sh : shapes)
    for (const char uplo : {'L', 'U'}) {
      const std::int64_t n = sh.n, k = sh.outer * sh.inner;
      const auto xv = lather::test::random_values(static_cast<std::size_t>(k * n), 3100 + k + n);
      const std::vector<float> x(xv.begin(), xv.end());
      const auto cv = lather::test::random_values(static_cast<std::size_t>(n * n), 3200 + n);
      const std::vector<float> c0(cv.begin(), cv.end());
      std::vector<float> u(x.size());
      lather::impl::kernels::UnfoldMode<float>{x.data(), u.data(), sh.outer, n, sh.inner, false}.all();
      std::vector<float> want = c0, whole = c0, bands = c0, split = c0;
      INFO("outer=", sh.outer, " n=", n, " inner=", sh.inner, " uplo=", uplo);
      const bool took = blas::split::syrk_lower_unfolded<float>(where, n, sh.outer, sh.inner, 0.5f, x.data(), 0.999f,
                                                                split.data(), n);
      CHECK(took == tiled::takes_transposed<float>(n, k, 0.5f));
      if (!took) {
        CHECK(split == c0);  // nothing done
        continue;
      }
      tiled::syrk_t<float>(uplo, n, k, 0.5f, u.data(), k, 0.999f, want.data(), n);
      tiled::syrk_columns_unfolded<float>(uplo, n, sh.outer, sh.inner, 0.5f, x.data(), 0.999f, whole.data(), n, 0, n);
      const std::int64_t cuts[] = {0, 3, 3, n / 2 + 1, n - 1, n};  // an empty band, bands of 1 and 3
      for (int b = 0; b + 1 < 6; ++b)
        tiled::syrk_columns_unfolded<float>(uplo, n, sh.outer, sh.inner, 0.5f, x.data(), 0.999f, bands.data(), n, cuts[b],
                                            cuts[b + 1]);
      CHECK(std::memcmp(want.data(), whole.data(), want.size() * sizeof(float)) == 0);
      CHECK(std::memcmp(want.data(), bands.data(), want.size() * sizeof(float)) == 0);
      if (uplo == 'L') {
        std::vector<float> lower = c0;
        blas::split::syrk_lower<float>(where, 'T', n, k, 0.5f, u.data(), k, 0.999f, lower.data(), n);
        CHECK(std::memcmp(lower.data(), split.data(), lower.size() * sizeof(float)) == 0);
        // The same tensor as the block (outer, n, inner) of a wider one (outer, n + 5, inner),
        // 3 indices into its second dimension, NaN around it: read in place with the slab
        // stride (syrk_lower_unfolded's and UnfoldMode's `slab`), the same bits.
        const std::int64_t wide = n + 5, slab = wide * sh.inner;
        std::vector<float> big(static_cast<std::size_t>(sh.outer * slab), std::numeric_limits<float>::quiet_NaN());
        for (std::int64_t a = 0; a < sh.outer; ++a)
          std::copy_n(x.data() + a * n * sh.inner, n * sh.inner, big.data() + a * slab + 3 * sh.inner);
        const float* block = big.data() + 3 * sh.inner;
        std::vector<float> strided = c0, unfolded_strided(u.size());
        REQUIRE(blas::split::syrk_lower_unfolded<float>(where, n, sh.outer, sh.inner, 0.5f, block, 0.999f,
                                                        strided.data(), n, slab));
        CHECK(std::memcmp(strided.data(), split.data(), strided.size() * sizeof(float)) == 0);
        lather::impl::kernels::UnfoldMode<float>{block, unfolded_strided.data(), sh.outer, n, sh.inner, false, slab}.all();
        CHECK(unfolded_strided == u);
        std::vector<float> by_rows(u.size());
        const lather::impl::kernels::UnfoldMode<float> one{block, by_rows.data(), sh.outer, n, sh.inner, false, slab};
        for (std::int64_t r = 0; r < sh.outer * n; ++r) one(r);
        CHECK(by_rows == u);
      }
    }
  // Against the definition: C(i, j) = 0.5 sum_(a, b) x(a, i, b) x(a, j, b) + 0.999 C0(i, j).
  const std::int64_t outer = 30, n = 40, inner = 9, k = outer * inner;
  if (!tiled::takes_transposed<float>(n, k, 0.5f)) return;
  const auto xv = lather::test::random_values(static_cast<std::size_t>(k * n), 3300);
  const std::vector<float> x(xv.begin(), xv.end());
  const auto cv = lather::test::random_values(static_cast<std::size_t>(n * n), 3400);
  const std::vector<float> c0(cv.begin(), cv.end());
  std::vector<float> c = c0;
  REQUIRE(blas::split::syrk_lower_unfolded<float>(where, n, outer, inner, 0.5f, x.data(), 0.999f, c.data(), n));
  const ld u = std::numeric_limits<float>::epsilon();
  std::int64_t bad = 0;
  for (std::int64_t j = 0; j < n; ++j)
    for (std::int64_t i = j; i < n; ++i) {
      ld sum = 0;
      for (std::int64_t a = 0; a < outer; ++a)
        for (std::int64_t b = 0; b < inner; ++b)
          sum += static_cast<ld>(x[static_cast<std::size_t>((a * n + i) * inner + b)]) *
                 static_cast<ld>(x[static_cast<std::size_t>((a * n + j) * inner + b)]);
      const ld want = 0.5L * sum + static_cast<ld>(0.999f) * static_cast<ld>(c0[static_cast<std::size_t>(i + j * n)]);
      bad += !(std::fabs(static_cast<ld>(c[static_cast<std::size_t>(i + j * n)]) - want) <= 4 * static_cast<ld>(k + 2) * u);
    }
  CHECK(bad == 0);
}
}  // namespace

TEST_CASE("host BLAS: the SYRK of a middle mode read in place equals UnfoldMode then the SYRK 'T', bit for bit") {
  check_unfolded_syrk<lather::impl::blas::split::Crew>(nullptr);
}

namespace {
// The middle-mode product of a row-major (outer, d, inner) tensor in lather's 'R' tiles
// (tiled::symm_right_mode: B's rows gathered into the panels, each panel of C scattered back):
// the bits of UnfoldMode, symm_right and the fold, in place and not, both triangles, whole, in
// uneven row parts and split over the threads; rows (outer inner) either side of 512 and of the
// 96-row panels, groups of `inner` that cross the 16-row vectors in every way (inner 2 to 17,
// 49), orders at the range's edges (63 and 257: not taken, nothing written; 511 rows too). Then
// one shape against the definition in long double.
template <class Where>
void check_mode_symm(Where* where) {
  namespace blas = lather::impl::blas;
  namespace tiled = blas::tiled;
  struct Shape {
    std::int64_t outer, d, inner;
  };
  const Shape shapes[] = {{256, 64, 2},  {103, 100, 5}, {57, 129, 9},  {64, 64, 9},   {128, 128, 9}, {256, 256, 9},
                          {31, 256, 17}, {11, 70, 49},  {32, 80, 16},  {171, 65, 3},  {40, 96, 13},  {73, 63, 9},
                          {2, 257, 300}, {73, 100, 7},  {7, 100, 74}};
  for (const auto& sh : shapes)
    for (const char uplo : {'L', 'U'}) {
      const std::int64_t d = sh.d, m = sh.outer * sh.inner, n = m * d;
      INFO("outer=", sh.outer, " d=", d, " inner=", sh.inner, " uplo=", uplo);
      const auto av = lather::test::random_values(static_cast<std::size_t>(d * d), 3500 + d);
      std::vector<float> a(av.begin(), av.end());
      for (std::int64_t j = 0; j < d; ++j)  // the unread triangle NaN: never read
        for (std::int64_t i = 0; i < d; ++i)
          if (uplo == 'L' ? i < j : i > j) a[static_cast<std::size_t>(i + j * d)] = std::numeric_limits<float>::quiet_NaN();
      const auto xv = lather::test::random_values(static_cast<std::size_t>(n), 3600 + m + d);
      const std::vector<float> x(xv.begin(), xv.end());
      std::vector<float> split = x;
      const bool took = blas::split::symm_right_mode<float>(where, uplo, sh.outer, d, sh.inner, 0.5f, a.data(), d,
                                                            split.data(), split.data());
      CHECK(took == tiled::takes_symm_right_mode<float>(m, d, sh.inner, 0.5f));
      if (!took) {
        CHECK(split == x);  // nothing done
        continue;
      }
      std::vector<float> u(x.size()), c(x.size()), want(x.size());
      lather::impl::kernels::UnfoldMode<float>{x.data(), u.data(), sh.outer, d, sh.inner, false}.all();
      tiled::symm_right<float>(uplo, m, d, 0.5f, a.data(), d, u.data(), m, 0.0f, c.data(), m);
      lather::impl::kernels::UnfoldMode<float>{c.data(), want.data(), sh.outer, d, sh.inner, true}.all();
      std::vector<float> out(x.size(), -1.0f), parts = x;
      tiled::symm_right_mode<float>(uplo, 0, m, d, sh.inner, 0.5f, a.data(), d, x.data(), out.data());
      const std::int64_t cuts[] = {0, 5, 5, m / 2 + 1, m - 1, m};  // an empty part, parts of 1 and 5 rows
      for (int p = 0; p + 1 < 6; ++p)
        tiled::symm_right_mode<float>(uplo, cuts[p], cuts[p + 1], d, sh.inner, 0.5f, a.data(), d, parts.data(),
                                      parts.data());
      CHECK(std::memcmp(want.data(), out.data(), want.size() * sizeof(float)) == 0);
      CHECK(std::memcmp(want.data(), parts.data(), want.size() * sizeof(float)) == 0);
      CHECK(std::memcmp(want.data(), split.data(), want.size() * sizeof(float)) == 0);
    }
  // Against the definition: y(a, j, b) = 0.5 sum_p x(a, p, b) A(p, j).
  const std::int64_t outer = 60, d = 70, inner = 9, m = outer * inner;
  if (!tiled::takes_symm_right_mode<float>(m, d, inner, 0.5f)) return;
  const auto av = lather::test::random_values(static_cast<std::size_t>(d * d), 3700);
  const std::vector<float> a(av.begin(), av.end());  // the lower triangle read
  const auto xv = lather::test::random_values(static_cast<std::size_t>(m * d), 3800);
  const std::vector<float> x(xv.begin(), xv.end());
  std::vector<float> y(x.size());
  REQUIRE(blas::split::symm_right_mode<float>(where, 'L', outer, d, inner, 0.5f, a.data(), d, x.data(), y.data()));
  const ld u = std::numeric_limits<float>::epsilon();
  auto sym = [&](std::int64_t i, std::int64_t j) {
    return static_cast<ld>(i >= j ? a[static_cast<std::size_t>(i + j * d)] : a[static_cast<std::size_t>(j + i * d)]);
  };
  std::int64_t bad = 0;
  for (std::int64_t o = 0; o < outer; ++o)
    for (std::int64_t j = 0; j < d; ++j)
      for (std::int64_t b = 0; b < inner; ++b) {
        ld sum = 0;
        for (std::int64_t p = 0; p < d; ++p) sum += static_cast<ld>(x[static_cast<std::size_t>((o * d + p) * inner + b)]) * sym(p, j);
        bad += !(std::fabs(static_cast<ld>(y[static_cast<std::size_t>((o * d + j) * inner + b)]) - 0.5L * sum) <=
                 4 * static_cast<ld>(d + 2) * u);
      }
  CHECK(bad == 0);
}
}  // namespace

TEST_CASE("host BLAS: the middle-mode SYMM in the 'R' tiles equals UnfoldMode, SYMM 'R' and the fold, bit for bit") {
  check_mode_symm<lather::impl::blas::split::Crew>(nullptr);
}

namespace {
// SYMM, C (m x n) = alpha B A + beta C (side 'R', A n x n) or alpha A B + beta C (side 'L', A
// m x m), A symmetric from its `uplo` triangle: lather's register tiles (tiled_symm.hpp) on
// AVX-512 CPUs where takes_symm_right/left say so, the BLAS elsewhere. Against the definition in
// long double with the other triangle of A (and its rows past its order) NaN and never read,
// NaN in C where beta is 0 never shown, and C's rows past m untouched.
template <class T>
void check_symm(char side, std::int64_t m, std::int64_t n, char uplo, std::int64_t lda, std::int64_t ldb,
                std::int64_t ldc, T alpha, T beta) {
  namespace blas = lather::impl::blas;
  const bool lower = uplo == 'L', left = side == 'L';
  const std::int64_t d = left ? m : n;  // A's order
  const std::uint64_t seed = left ? 2200 : 1700;  // the 'R' checks keep their earlier data
  const auto av = lather::test::random_values(static_cast<std::size_t>(lda * d), seed + (left ? m : n));
  std::vector<T> a(av.begin(), av.end());
  for (std::int64_t j = 0; j < d; ++j)
    for (std::int64_t i = 0; i < lda; ++i)
      if (i >= d || (lower ? i < j : i > j)) a[static_cast<std::size_t>(i + j * lda)] = std::numeric_limits<T>::quiet_NaN();
  auto full = [&](std::int64_t i, std::int64_t j) {
    return static_cast<ld>((lower == (i >= j)) ? a[static_cast<std::size_t>(i + j * lda)] : a[static_cast<std::size_t>(j + i * lda)]);
  };
  const auto bv = lather::test::random_values(static_cast<std::size_t>(ldb * n), seed + 100 + m + n);
  const std::vector<T> b(bv.begin(), bv.end());
  const auto cv = lather::test::random_values(static_cast<std::size_t>(ldc * n), seed + 200 + m + n);
  std::vector<T> c(cv.begin(), cv.end());
  if (beta == T(0))
    for (std::int64_t j = 0; j < n; ++j)
      for (std::int64_t i = 0; i < m; ++i) c[static_cast<std::size_t>(i + j * ldc)] = std::numeric_limits<T>::quiet_NaN();
  const std::vector<T> c0 = c;
  blas::symm<T>(side, uplo, m, n, alpha, a.data(), lda, b.data(), ldb, beta, c.data(), ldc);
  const ld u = std::numeric_limits<T>::epsilon();
  std::int64_t bad = 0;
  for (std::int64_t j = 0; j < n; ++j)
    for (std::int64_t i = 0; i < ldc; ++i) {
      const auto e = static_cast<std::size_t>(i + j * ldc);
      if (i >= m) {
        bad += std::memcmp(&c[e], &c0[e], sizeof(T)) != 0;
        continue;
      }
      ld s = 0;
      for (std::int64_t l = 0; l < d; ++l)
        s += left ? full(i, l) * static_cast<ld>(b[static_cast<std::size_t>(l + j * ldb)])
                  : static_cast<ld>(b[static_cast<std::size_t>(i + l * ldb)]) * full(l, j);
      const ld want = static_cast<ld>(alpha) * s + (beta == T(0) ? 0 : static_cast<ld>(beta) * c0[e]);
      bad += !(std::fabs(static_cast<ld>(c[e]) - want) <= 4 * static_cast<ld>(d + 2) * u);
    }
  INFO("side=", side, " m=", m, " n=", n, " uplo=", uplo, " lda=", lda, " ldb=", ldb, " ldc=", ldc, " alpha=", alpha,
       " beta=", beta);
  CHECK(bad == 0);
}
template <class T>
void check_symm_right(std::int64_t m, std::int64_t d, char uplo, std::int64_t lda, std::int64_t ldb, std::int64_t ldc,
                      T alpha, T beta) {
  check_symm<T>('R', m, d, uplo, lda, ldb, ldc, alpha, beta);
}
template <class T>
void check_symm_left(std::int64_t m, std::int64_t n, char uplo, std::int64_t lda, std::int64_t ldb, std::int64_t ldc,
                     T alpha, T beta) {
  check_symm<T>('L', m, n, uplo, lda, ldb, ldc, alpha, beta);
}

template <class T>
void check_tiled_symm() {
  namespace tiled = lather::impl::blas::tiled;
  const std::int64_t lo = tiled::min_dim<T>, hi = tiled::symm_right_max_dim;
  // d: the range's edges (one below and one above: the BLAS), a group of 8 columns and one more,
  // a tile's rows, the strips' 16 x 16 blocks; m: a vector, a tile (48 floats, 24 doubles), a
  // panel (96) and one more, and either side of the rows from which floats copy A into strips
  // and B into panels (512).
  for (const std::int64_t d : {lo - 1, lo, lo + 1, std::int64_t{24}, std::int64_t{47}, std::int64_t{48}, std::int64_t{49},
                               std::int64_t{100}, std::int64_t{128}, std::int64_t{129}, hi - 1, hi, hi + 1})
    for (const std::int64_t m : {1, 7, 16, 17, 24, 48, 49, 96, 97, 200, 511, 512, 609})
      for (const char uplo : {'L', 'U'}) {
        check_symm_right<T>(m, d, uplo, d, m, m, T(1), T(0));
        check_symm_right<T>(m, d, uplo, d + 3, m + 1, m + 2, T(-0.5), T(0.25));
      }
  // A tall B (a (256, 256, 9) block's first dimensions: 2304 rows, 24 panels).
  for (const char uplo : {'L', 'U'}) check_symm_right<T>(2304, 256, uplo, 256, 2304, 2304, T(1), T(0));

  // Rows in uneven parts (as split::symm gives them to threads) give the whole product's bits.
  for (const std::int64_t d : {lo, std::int64_t{100}, hi})
    for (const std::int64_t m : {std::int64_t{100}, std::int64_t{256}, std::int64_t{1100}})
      for (const char uplo : {'L', 'U'}) {
        if (!tiled::takes_symm_right<T>(m, d, T(1))) continue;
        const auto av = lather::test::random_values(static_cast<std::size_t>(d * d), 2000 + d);
        const std::vector<T> a(av.begin(), av.end());
        const auto bv = lather::test::random_values(static_cast<std::size_t>(m * d), 2100 + m + d);
        const std::vector<T> b(bv.begin(), bv.end());
        std::vector<T> whole(static_cast<std::size_t>(m * d)), parts(whole.size());
        tiled::symm_right<T>(uplo, m, d, T(1), a.data(), d, b.data(), m, T(0), whole.data(), m);
        const std::int64_t cuts[] = {0, 5, 5, m / 2 + 1, m - 1, m};  // an empty part, parts of 1 and 5 rows
        for (int p = 0; p + 1 < 6; ++p)
          if (cuts[p + 1] > cuts[p])
            tiled::symm_right<T>(uplo, cuts[p + 1] - cuts[p], d, T(1), a.data(), d, b.data() + cuts[p], m, T(0),
                                 parts.data() + cuts[p], m);
        INFO("m=", m, " d=", d, " uplo=", uplo);
        CHECK(std::memcmp(whole.data(), parts.data(), whole.size() * sizeof(T)) == 0);
      }
}

template <class T>
void check_tiled_symm_left() {
  namespace tiled = lather::impl::blas::tiled;
  const std::int64_t lo = tiled::min_dim<T>, hi = tiled::symm_left_max_dim;
  // m: the range's edges (one below and one above: the BLAS), the packing's 16 x 16 blocks, a
  // tile's 48 rows, a panel's 96 (and 2 panels), each and one either side, and 256 (block size
  // 256); n: one column, a group of 8 columns, one either side, several groups and a narrow rest.
  for (const std::int64_t m : {lo - 1, lo, lo + 1, std::int64_t{31}, std::int64_t{32}, std::int64_t{33}, std::int64_t{47},
                               std::int64_t{48}, std::int64_t{49}, std::int64_t{95}, std::int64_t{96}, std::int64_t{97},
                               std::int64_t{144}, std::int64_t{191}, std::int64_t{192}, std::int64_t{193}, std::int64_t{256}, hi - 1, hi, hi + 1})
    for (const std::int64_t n : {1, 7, 8, 9, 16, 61})
      for (const char uplo : {'L', 'U'}) {
        check_symm_left<T>(m, n, uplo, m, m, m, T(1), T(0));
        check_symm_left<T>(m, n, uplo, m + 3, m + 1, m + 2, T(-0.5), T(0.25));
      }
  // Columns of C in uneven parts (as split::symm gives them to threads) give the whole product's bits.
  for (const std::int64_t m : {lo, std::int64_t{100}, std::int64_t{256}, hi})
    for (const std::int64_t n : {std::int64_t{37}, std::int64_t{256}})
      for (const char uplo : {'L', 'U'}) {
        if (!tiled::takes_symm_left<T>(m, n, T(1))) continue;
        const auto av = lather::test::random_values(static_cast<std::size_t>(m * m), 2500 + m);
        const std::vector<T> a(av.begin(), av.end());
        const auto bv = lather::test::random_values(static_cast<std::size_t>(m * n), 2600 + m + n);
        const std::vector<T> b(bv.begin(), bv.end());
        std::vector<T> whole(static_cast<std::size_t>(m * n)), parts(whole.size());
        tiled::symm_left<T>(uplo, m, n, T(1), a.data(), m, b.data(), m, T(0), whole.data(), m);
        const std::int64_t cuts[] = {0, 5, 5, n / 2 + 1, n - 1, n};  // an empty part, parts of 1 and 5 columns
        for (int p = 0; p + 1 < 6; ++p)
          if (cuts[p + 1] > cuts[p])
            tiled::symm_left<T>(uplo, m, cuts[p + 1] - cuts[p], T(1), a.data(), m, b.data() + cuts[p] * m, m, T(0),
                                parts.data() + cuts[p] * m, m);
        INFO("m=", m, " n=", n, " uplo=", uplo);
        CHECK(std::memcmp(whole.data(), parts.data(), whole.size() * sizeof(T)) == 0);
      }
}
}  // namespace

TEST_CASE("host BLAS: SYMM 'R' of order 17 to 256 (floats; 9 to 512 doubles; register tiles on AVX-512) equals the definition, in any row parts") {
  MESSAGE("tiled SYMM on this CPU: ", std::string(lather::impl::blas::tiled::takes_symm_right<float>(256, 256, 1.0f) ? "yes" : "no (the BLAS)"));
  check_tiled_symm<float>();
  check_tiled_symm<double>();
}

TEST_CASE("host BLAS: SYMM 'L' of order 17 to 1024 (register tiles on AVX-512, floats) equals the definition, in any column parts") {
  MESSAGE("tiled SYMM 'L' on this CPU: ", std::string(lather::impl::blas::tiled::takes_symm_left<float>(256, 256, 1.0f) ? "yes" : "no (the BLAS)"));
  check_tiled_symm_left<float>();
  check_tiled_symm_left<double>();  // the BLAS: the same checks
}

TEST_CASE("host BLAS: the tiles' side fetch walks its ranges to the end and changes no bit of the SYRK") {
  namespace tiled = lather::impl::blas::tiled;
  using I = std::int64_t;
  // The walk itself (what the tiles do with next/end): strided rows, an unaligned start, an empty
  // range ignored, a fifth range ignored (max_ranges 4).
  std::vector<char> memory((1 << 16) + 64);
  const char* const base = memory.data() + (64 - reinterpret_cast<std::uintptr_t>(memory.data()) % 64) % 64;  // a line's start
  {
    tiled::SideFetchScope scope;
    scope.add(base + 100, 200, 1000, 3);  // 3 rows of 200 bytes, 1000 apart, from byte 100
    scope.add(nullptr, 64);
    scope.add(base + 8192, 64, 0, 0);
    scope.add(base + 8192, 130);  // one run over 3 lines
    scope.add(base + 16384, 64);
    scope.add(base + 20000, 64);
    scope.add(base + 30000, 64);  // the fifth: dropped
    std::vector<I> lines;  // line offsets in `memory`, in fetch order
    auto& side = tiled::side_fetch();
    while (side.next != nullptr) {  // as tile() walks it
      lines.push_back(static_cast<I>(side.next - base));
      side.next += 64;
      if (side.next >= side.end) side.advance();
    }
    // Row r covers bytes [100 + 1000 r, 300 + 1000 r): lines from the one holding its first byte.
    std::vector<I> expected;
    for (I r = 0; r < 3; ++r)
      for (I l = (100 + 1000 * r) / 64 * 64; l < 300 + 1000 * r; l += 64) expected.push_back(l);
    for (const I l : {8192, 8256, 8320, 16384, 19968, 20032}) expected.push_back(l);  // 20000 straddles two lines
    CHECK(lines == expected);
  }
  CHECK(tiled::side_fetch().next == nullptr);  // the scope cleared it
  CHECK(tiled::side_fetch().ranges == 0);

  // The tiles with a side fetch under way: the same bits as without, and the fetch moves on.
  for (const char trans : {'N', 'T'})
    for (const I n : {17, 256}) {
      const I k = 300;
      const auto v = lather::test::random_values(static_cast<std::size_t>(n * k), 900 + static_cast<std::uint64_t>(n));
      const std::vector<float> a(v.begin(), v.end());
      std::vector<float> plain(static_cast<std::size_t>(n * n), 0.0f), fetched = plain;
      lather::impl::blas::syrk<float>('L', trans, n, k, 1.5f, a.data(), trans == 'N' ? n : k, 0.0f, plain.data(), n);
      {
        tiled::SideFetchScope scope;
        scope.add(base, 1024, 4096, 15);  // 15 rows of 1 KiB: 240 lines
        const char* const first = tiled::side_fetch().next;
        lather::impl::blas::syrk<float>('L', trans, n, k, 1.5f, a.data(), trans == 'N' ? n : k, 0.0f, fetched.data(), n);
        if (tiled::takes<float>(n, k, 1.5f))  // tiles ran: one line every side_steps steps of k
          CHECK((tiled::side_fetch().next == nullptr || tiled::side_fetch().next > first));
      }
      CHECK(std::memcmp(plain.data(), fetched.data(), plain.size() * sizeof(float)) == 0);
    }
}

namespace {
// lead(crew) in the first thread of one team of all of the space's threads, the others serving
// as the crew's helpers (as Shampoo's wide blocks run).
template <class ExecSpace, class F>
void with_crew(const ExecSpace& space, const F& lead) {
  using Policy = Kokkos::TeamPolicy<ExecSpace>;
  lather::impl::blas::split::Crew* crew = nullptr;
  const auto body = [&](const typename Policy::member_type& m) {
    if (m.team_rank() != 0) {
      crew->serve(m.team_rank());
      return;
    }
    lead(crew);
    crew->finish();
  };
  const int size = std::min(space.concurrency(), Policy(space, 1, 1).team_size_max(body, Kokkos::ParallelForTag()));
  lather::impl::blas::split::Crew team(size);
  crew = &team;
  lather::impl::blas::SingleThreaded single;
  Kokkos::parallel_for(Policy(space, 1, size), body);
  space.fence();
}

// Bit for bit, NaN included.
template <class T>
bool same_bits(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0;
}

// The split products (impl/backends/blas_split.hpp) on `space` against long-double definitions,
// with alpha, beta and a prior C, at sizes below, at and above the split thresholds (parts of at
// least 128, boundaries at multiples of 16) and with one dimension 1 or 3. NaN marks what must not
// be read (SYMM's upper triangle) or written (SYRK's upper triangle). Through a crew (one team)
// they give the launch's bits: the same parts.
template <class T, class ExecSpace>
void check_split_products(const ExecSpace& space) {
  namespace split = lather::impl::blas::split;
  using I = std::int64_t;
  const ld u = std::numeric_limits<T>::epsilon();
  const T alpha = T(0.75), beta = T(-0.5);
  const T nan = std::numeric_limits<T>::quiet_NaN();
  auto values = [](I count, std::uint64_t stream) {
    const auto v = lather::test::random_values(static_cast<std::size_t>(count), stream);
    return std::vector<T>(v.begin(), v.end());
  };
  auto at = [](const std::vector<T>& v, I i) { return static_cast<ld>(v[static_cast<std::size_t>(i)]); };
  for (const I n : {13, 255, 256, 257, 300, 517})
    for (const I k : {1, 3, 130})
      for (const char trans : {'N', 'T'}) {
        const bool tr = trans == 'T';
        const I lda = tr ? k : n;
        const auto a = values(n * k, 500 + static_cast<std::uint64_t>(n + k));  // n x k ('N') or k x n ('T')
        auto c = values(n * n, 600 + static_cast<std::uint64_t>(n));
        for (I j = 0; j < n; ++j)
          for (I i = 0; i < j; ++i) c[static_cast<std::size_t>(i + j * n)] = nan;
        const auto c0 = c;
        auto by_crew = c;
        split::syrk_lower<T>(&space, trans, n, k, alpha, a.data(), lda, beta, c.data(), n);
        with_crew(space, [&](split::Crew* crew) {
          split::syrk_lower<T>(crew, trans, n, k, alpha, a.data(), lda, beta, by_crew.data(), n);
        });
        CHECK(same_bits(c, by_crew));
        if (tr ? lather::impl::blas::tiled::takes_transposed<T>(n, k, alpha) : lather::impl::blas::tiled::takes<T>(n, k, alpha)) {
          // lather's tiles compute an element alike in any band: the split's bits are the whole's.
          auto plain = c0;
          lather::impl::blas::syrk<T>('L', trans, n, k, alpha, a.data(), lda, beta, plain.data(), n);
          CHECK(same_bits(c, plain));
        }
        for (I j = 0; j < n; ++j)
          for (I i = 0; i < n; ++i) {
            INFO("syrk n=", n, " k=", k, " trans=", trans, " (", i, ",", j, ")");
            if (i < j) {
              REQUIRE(std::isnan(c[static_cast<std::size_t>(i + j * n)]));
              continue;
            }
            ld sum = 0;
            for (I l = 0; l < k; ++l) sum += tr ? at(a, l + i * lda) * at(a, l + j * lda) : at(a, i + l * lda) * at(a, j + l * lda);
            const ld want = static_cast<ld>(alpha) * sum + static_cast<ld>(beta) * at(c0, i + j * n);
            REQUIRE(std::fabs(at(c, i + j * n) - want) <= 4 * static_cast<ld>(k + 2) * u);
          }
      }
  for (const I d : {13, 300})
    for (const I other : {1, 255, 300, 517})
      for (const char side : {'L', 'R'}) {
        const bool left = side == 'L';
        const I m = left ? d : other, n = left ? other : d;
        auto pmat = values(d * d, 700 + static_cast<std::uint64_t>(d));
        auto full = [&](I i, I j) { return i >= j ? at(pmat, i + j * d) : at(pmat, j + i * d); };
        for (I j = 0; j < d; ++j)
          for (I i = 0; i < j; ++i) pmat[static_cast<std::size_t>(i + j * d)] = nan;
        const auto b = values(m * n, 800 + static_cast<std::uint64_t>(m + n));
        auto c = values(m * n, 900 + static_cast<std::uint64_t>(m * n));
        const auto c0 = c;
        auto by_crew = c;
        split::symm<T>(&space, side, 'L', m, n, alpha, pmat.data(), d, b.data(), m, beta, c.data(), m);
        with_crew(space, [&](split::Crew* crew) {
          split::symm<T>(crew, side, 'L', m, n, alpha, pmat.data(), d, b.data(), m, beta, by_crew.data(), m);
        });
        CHECK(same_bits(c, by_crew));
        for (I i = 0; i < m; ++i)
          for (I j = 0; j < n; ++j) {
            ld sum = 0;
            for (I l = 0; l < d; ++l) sum += left ? full(i, l) * at(b, l + j * m) : at(b, i + l * m) * full(l, j);
            const ld want = static_cast<ld>(alpha) * sum + static_cast<ld>(beta) * at(c0, i + j * m);
            INFO("symm d=", d, " other=", other, " side=", side, " (", i, ",", j, ")");
            REQUIRE(std::fabs(at(c, i + j * m) - want) <= 4 * static_cast<ld>(d + 2) * u);
          }
      }
  const I shapes[][3] = {{3, 300, 300}, {300, 3, 3}, {517, 256, 13}, {256, 517, 1}, {13, 13, 13}};
  for (const auto& sh : shapes)
    for (int t = 0; t < 4; ++t) {
      const I m = sh[0], n = sh[1], k = sh[2];
      const char ta = (t & 1) ? 'T' : 'N', tb = (t & 2) ? 'T' : 'N';
      const I lda = ta == 'N' ? m : k, ldb = tb == 'N' ? k : n;
      const auto a = values(m * k, 1000 + static_cast<std::uint64_t>(m + k));
      const auto b = values(k * n, 1100 + static_cast<std::uint64_t>(k + n));
      auto c = values(m * n, 1200 + static_cast<std::uint64_t>(m * n));
      const auto c0 = c;
      auto by_crew = c;
      split::gemm<T>(&space, ta, tb, m, n, k, alpha, a.data(), lda, b.data(), ldb, beta, c.data(), m);
      with_crew(space, [&](split::Crew* crew) {
        split::gemm<T>(crew, ta, tb, m, n, k, alpha, a.data(), lda, b.data(), ldb, beta, by_crew.data(), m);
      });
      CHECK(same_bits(c, by_crew));
      for (I i = 0; i < m; ++i)
        for (I j = 0; j < n; ++j) {
          ld sum = 0;
          for (I l = 0; l < k; ++l)
            sum += (ta == 'N' ? at(a, i + l * lda) : at(a, l + i * lda)) * (tb == 'N' ? at(b, l + j * ldb) : at(b, j + l * ldb));
          const ld want = static_cast<ld>(alpha) * sum + static_cast<ld>(beta) * at(c0, i + j * m);
          INFO("gemm m=", m, " n=", n, " k=", k, " ta=", ta, " tb=", tb, " (", i, ",", j, ")");
          REQUIRE(std::fabs(at(c, i + j * m) - want) <= 4 * static_cast<ld>(k + 2) * u);
        }
    }
}
}  // namespace

namespace {
template <class ExecSpace>
void split_products_on(const ExecSpace& space) {
  namespace split = lather::impl::blas::split;
  // How many parts: one without a space or below two parts of 128, else up to the thread count.
  const bool control = lather::impl::blas::SingleThreaded::available();
  const std::int64_t threads = space.concurrency();
  CHECK(split::parts<ExecSpace>(nullptr, 4096) == 1);
  CHECK(split::parts(&space, 255) == 1);
  CHECK(split::parts(&space, 256) == (control ? std::min<std::int64_t>(threads, 2) : 1));
  CHECK(split::parts(&space, 4096) == (control ? std::min<std::int64_t>(threads, 32) : 1));
  MESSAGE("split products on this space: up to ", split::parts(&space, 4096), " parts");
  with_crew(space, [&](split::Crew* crew) {
    CHECK(crew->size() == threads);
    CHECK(crew->parts(4096) == std::min<std::int64_t>(threads, 32));
    CHECK(crew->parts(255) == 1);
    // Every part runs exactly once, part 0 in the lead's thread, and run() returns after all.
    for (int n = 1; n <= 4; ++n) {
      std::vector<std::atomic<int>> ran(static_cast<std::size_t>(n));
      crew->run(n, [&](int t) { ran[static_cast<std::size_t>(t)].fetch_add(1); });
      for (const auto& r : ran) CHECK(r.load() == 1);
    }
  });
  // Boundaries: aligned, increasing, covering.
  for (const std::int64_t total : {256, 300, 517, 4096})
    for (int n = 1; n <= 4; ++n) {
      CHECK(split::boundary(total, n, 0) == 0);
      CHECK(split::boundary(total, n, n) == total);
      for (int t = 1; t < n; ++t) {
        CHECK(split::boundary(total, n, t) % split::align == 0);
        CHECK(split::boundary(total, n, t) > split::boundary(total, n, t - 1));
      }
    }
  check_split_products<double>(space);
  check_split_products<float>(space);
  check_unfolded_syrk(&space);  // the middle mode's SYRK in bands over the threads
  check_mode_symm(&space);      // and its SYMM in row parts
  // One part is the plain call, bit for bit.
  const auto x = lather::test::random_values(300 * 40, 77);
  std::vector<double> one(300 * 300, 0.0), plain(300 * 300, 0.0);
  lather::impl::blas::split::syrk_lower<double, ExecSpace>(nullptr, 'N', 300, 40, 1.0, x.data(), 300, 0.0, one.data(), 300);
  lather::impl::blas::syrk<double>('L', 'N', 300, 40, 1.0, x.data(), 300, 0.0, plain.data(), 300);
  CHECK(one == plain);
}
}  // namespace

TEST_CASE_TEMPLATE_DEFINE("host BLAS: products split over the space's threads equal the definition", ExecSpace, split_products) {
  // Host spaces only: the parts are host BLAS calls on host data (a device space never splits).
  if constexpr (Kokkos::SpaceAccessibility<ExecSpace, Kokkos::HostSpace>::accessible) split_products_on(ExecSpace());
}

TEST_CASE_TEMPLATE_APPLY(split_products, lather_test_exec_spaces);

TEST_CASE("Shampoo batched kernels: square_index splits e = i d + j in 32 bits below d = 2^16 and in 64 above") {
  // The combine and unpack jobs' index (kernels/shampoo_batched.hpp): the last element of a
  // 65535 x 65535 matrix is just below 2^32; from d = 65536 on, e itself needs 64 bits.
  for (const std::int64_t d : {1, 2, 3, 13, 256, 1024, 65535, 65536, 100000, 3000000})
    for (const std::int64_t e : {std::int64_t{0}, d - 1, d, d * d / 2 + 7 % d, d * d - d, d * d - 1}) {
      if (e < 0 || e >= d * d) continue;
      std::int64_t i = -1, j = -1;
      lather::impl::kernels::square_index(e, d, i, j);
      INFO("d=", d, " e=", e);
      CHECK(i == e / d);
      CHECK(j == e % d);
    }
}

TEST_CASE("Shampoo kernels: row-wise factor combine and triangle unpack equal the element-wise forms, bit for bit") {
  using namespace lather::impl::kernels;
  using GramView = Kokkos::View<float**, Kokkos::LayoutLeft, Kokkos::HostSpace, Kokkos::MemoryTraits<Kokkos::Unmanaged>>;
  for (const std::int64_t d : {1, 2, 3, 4, 13, 64})
    for (const bool packed : {true, false})
      for (const bool scale : {true, false}) {
        INFO("d=", d, " packed=", packed, " scale=", scale);
        const auto n = static_cast<std::size_t>(SymmetricStorage<float>::size(d, packed));
        // A Gram matrix whose upper triangle is NaN (a SYRK 'L' writes only the lower one).
        const auto gv = lather::test::random_values(static_cast<std::size_t>(d * d), 500 + d);
        std::vector<float> gram(static_cast<std::size_t>(d * d), std::numeric_limits<float>::quiet_NaN());
        for (std::int64_t j = 0; j < d; ++j)
          for (std::int64_t i = j; i < d; ++i) gram[static_cast<std::size_t>(i + j * d)] = static_cast<float>(gv[static_cast<std::size_t>(i + j * d)]);
        const auto fv = lather::test::random_values(n, 600 + d);
        std::vector<float> a(fv.begin(), fv.end()), b(fv.begin(), fv.end());
        if (!packed)  // a full factor is symmetric
          for (std::int64_t i = 0; i < d; ++i)
            for (std::int64_t j = 0; j < i; ++j) a[static_cast<std::size_t>(i * d + j)] = b[static_cast<std::size_t>(i * d + j)] = a[static_cast<std::size_t>(j * d + i)];
        const FactorCombine<float, float, GramView> element{GramView(gram.data(), static_cast<std::size_t>(d), static_cast<std::size_t>(d)),
                                                            {a.data(), d, packed}, 0.95f, 0.05f, scale};
        for (std::int64_t i = 0; i < d; ++i)
          for (std::int64_t j = 0; j < d; ++j) element(i, j);
        const FactorCombineRows<float, float> rows{gram.data(), {b.data(), d, packed}, 0.95f, 0.05f, scale};
        for (std::int64_t r = 0; r < rows.iterations(d); ++r) rows(r);
        CHECK(a == b);
        for (const float v : b) CHECK(std::isfinite(v));  // every entry written, no NaN read
        if (!packed) continue;
        // The packed factor's lower triangle, column-major, against the full unpack.
        std::vector<double> full(static_cast<std::size_t>(d * d)), lower(static_cast<std::size_t>(d * d), -1.0);
        using Out = Kokkos::View<double**, Kokkos::LayoutLeft, Kokkos::HostSpace, Kokkos::MemoryTraits<Kokkos::Unmanaged>>;
        const Unpack<float, Out> unpack{{b.data(), d, true}, Out(full.data(), static_cast<std::size_t>(d), static_cast<std::size_t>(d))};
        for (std::int64_t i = 0; i < d; ++i)
          for (std::int64_t j = 0; j < d; ++j) unpack(i, j);
        const UnpackLower<float, double> tri{{b.data(), d, true}, lower.data()};
        for (std::int64_t r = 0; r < tri.iterations(d); ++r) tri(r);
        for (std::int64_t j = 0; j < d; ++j)
          for (std::int64_t i = 0; i < d; ++i) {
            const auto e = static_cast<std::size_t>(i + j * d);
            if (i >= j) CHECK(lower[e] == full[e]);
            else CHECK(lower[e] == -1.0);  // the strictly upper triangle is not written
          }
      }
}

TEST_CASE("host BLAS: Q diag(s) Q^T through SYRK is symmetric and equals the definition, zeros in s included") {
  const std::size_t n = 13;
  const auto q = lather::test::random_values(n * n, 7);
  std::vector<double> s(n);
  for (std::size_t k = 0; k < n; ++k) s[k] = k % 4 == 0 ? 0.0 : 0.1 * static_cast<double>(k + 1);  // rank-deficient
  const auto x = lather::impl::matrix_from_eigenpairs(q, s, n);
  for (std::size_t i = 0; i < n; ++i)
    for (std::size_t j = 0; j < n; ++j) {
      ld want = 0, magnitude = 0;
      for (std::size_t k = 0; k < n; ++k) {
        const ld t = static_cast<ld>(q[i + k * n]) * s[k] * q[j + k * n];
        want += t;
        magnitude += std::fabs(t);
      }
      CHECK(x[i + j * n] == x[j + i * n]);
      // n + 2 roundings (the sqrt, the two scalings, the sum) of at most u each, relative to sum |t|.
      CHECK(std::fabs(x[i + j * n] - want) <= 4 * (n + 2) * 1.12e-16L * magnitude);
    }
}

namespace {
// EigenRootInverse's X against the same steps written plainly: A_r's lower triangle copied
// column by column, LAPACK's syevd, the eigenvalue rule and impl::matrix_from_eigenpairs (the
// SYRK and an element-wise mirror). The root inverse copies through 32 x 32 tiles (both ways)
// and writes X straight into host memory; the arithmetic is the same, so the results must agree
// bit for bit. The upper triangle of A is different junk: only the lower one may be read.
template <class ExecSpace, class T>
void check_eigen_root_against_plain_steps(bool compute_in_double) {
  using Space = typename ExecSpace::memory_space;
  using C = std::conditional_t<std::is_same_v<T, double>, double, float>;
  const ExecSpace space;
  for (const std::size_t n : {1, 2, 3, 13, 31, 32, 33, 64, 65, 100}) {
    CAPTURE(n);
    const auto b = random_matrix<T, Kokkos::LayoutRight, Space>(n, n, 90 + n);
    Kokkos::View<T**, Kokkos::LayoutRight, Space> a("a", n, n);
    lather::impl::kernels::gemm(space, "N", "T", T(1) / static_cast<T>(n), b, b, T(0), a);
    auto ah = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), a);
    for (std::size_t i = 0; i < n; ++i)
      for (std::size_t j = i + 1; j < n; ++j) ah(i, j) = static_cast<T>(3 * i + j) - T(50);
    Kokkos::deep_copy(a, ah);
    const double eps = 1e-4;
    lather::EigenRootInverse strategy;
    strategy.compute_in_double = compute_in_double;

    // The plain steps, in the eigensolver's precision E.
    auto plain = [&]<class E>(E) {
      std::vector<E> q(n * n, E(0)), lambda(n), s;
      for (std::size_t j = 0; j < n; ++j)
        for (std::size_t i = j; i < n; ++i) q[i + j * n] = static_cast<E>(ah(i, j));
      for (std::size_t i = 0; i < n; ++i) q[i + i * n] += static_cast<E>(eps);
      REQUIRE(lather::impl::lapack::syevd(static_cast<lather::impl::lapack::lapack_int>(n), q.data(),
                                          lambda.data()) == 0);
      REQUIRE(lather::impl::inverse_root_scales(lambda, 4.0, eps, true, std::nullopt, s));
      const auto x = lather::impl::matrix_from_eigenpairs(q, s, n);
      std::vector<T> want(n * n);
      for (std::size_t i = 0; i < n; ++i)
        for (std::size_t j = 0; j < n; ++j) want[i * n + j] = static_cast<T>(x[i + j * n]);
      return want;
    };
    const auto want = compute_in_double ? plain(double{}) : plain(C{});

    Kokkos::View<T**, Kokkos::LayoutRight, Space> x("x", n, n);
    REQUIRE(strategy.compute(space, Kokkos::View<const T**, Kokkos::LayoutRight, Space>(a), 4.0, eps, x) ==
            lather::RootInverseStatus::success);
    const auto xh = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), x);
    std::size_t differ = 0;
    for (std::size_t i = 0; i < n; ++i)
      for (std::size_t j = 0; j < n; ++j) differ += xh(i, j) != want[i * n + j];
    CHECK(differ == 0);
    if constexpr (Kokkos::SpaceAccessibility<Kokkos::HostSpace, Space>::accessible) {
      Kokkos::View<T**, Kokkos::LayoutRight, Space> y("y", n, n);
      REQUIRE(strategy.compute_on_host(Kokkos::View<const T**, Kokkos::LayoutRight, Space>(a), 4.0, eps, y) ==
              lather::RootInverseStatus::success);
      differ = 0;
      for (std::size_t i = 0; i < n; ++i)
        for (std::size_t j = 0; j < n; ++j) differ += y(i, j) != want[i * n + j];
      CHECK(differ == 0);
    }
  }
}
}  // namespace

TEST_CASE_TEMPLATE_DEFINE("host BLAS: EigenRootInverse equals its plain steps bit for bit across tile edges, reading one triangle", ExecSpace, eigen_plain_steps) {
  check_eigen_root_against_plain_steps<ExecSpace, float>(false);
  check_eigen_root_against_plain_steps<ExecSpace, float>(true);
  check_eigen_root_against_plain_steps<ExecSpace, double>(false);
}
TEST_CASE_TEMPLATE_APPLY(eigen_plain_steps, lather_test_exec_spaces);

TEST_CASE_TEMPLATE_DEFINE("host BLAS: reused workspaces give the same roots, bit for bit, whatever ran before", ExecSpace, workspace_reuse) {
  using Space = typename ExecSpace::memory_space;
  const ExecSpace space;
  // SPD A = B B^T / n + 0.1 I for sizes 13, then 3, then 13 again: the second 13 runs on
  // workspaces that held a larger and then a smaller problem.
  auto spd = [&](std::size_t n) {
    const auto b = random_matrix<double, Kokkos::LayoutRight, Space>(n, n, 40 + n);
    Kokkos::View<double**, Kokkos::LayoutRight, Space> a("a", n, n);
    lather::impl::kernels::gemm(space, "N", "T", 1.0 / static_cast<double>(n), b, b, 0.0, a);
    auto h = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), a);
    for (std::size_t i = 0; i < n; ++i) h(i, i) += 0.1;
    Kokkos::deep_copy(a, h);
    return a;
  };
  const lather::EigenRootInverse strategy;
  auto root = [&](const Kokkos::View<double**, Kokkos::LayoutRight, Space>& a) {
    Kokkos::View<double**, Kokkos::LayoutRight, Space> x("x", a.extent(0), a.extent(0));
    REQUIRE(strategy.compute(space, Kokkos::View<const double**, Kokkos::LayoutRight, Space>(a), 4.0, 0.0, x) ==
            lather::RootInverseStatus::success);
    return Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), x);
  };
  const auto a13 = spd(13), a3 = spd(3);
  const auto first = root(a13);
  (void)root(a3);
  const auto again = root(a13);
  for (std::size_t i = 0; i < 13; ++i)
    for (std::size_t j = 0; j < 13; ++j) CHECK(first(i, j) == again(i, j));
}

TEST_CASE_TEMPLATE_APPLY(workspace_reuse, lather_test_exec_spaces);

// Kokkos 3.5+ names every fence with a default std::string argument (kokkos/kokkos#3966), which
// allocates; lather's own code then still allocates nothing, but a count of the whole call cannot
// show it. Counted on the Kokkos this project's CI builds (3.4.1).
#if LATHER_TEST_COUNTS_HEAP && KOKKOS_VERSION < 30500
TEST_CASE_TEMPLATE_DEFINE("host BLAS: no heap allocation in a host product or a repeated EigenRootInverse root", ExecSpace, no_allocation) {
  using Space = typename ExecSpace::memory_space;
  if constexpr (Kokkos::SpaceAccessibility<Kokkos::HostSpace, Space>::accessible) {
    const ExecSpace space;
    const auto a = random_matrix<float, Kokkos::LayoutRight, Space>(64, 64, 1);
    auto c = random_matrix<float, Kokkos::LayoutRight, Space>(64, 64, 2);
    lather::impl::kernels::gemm(space, "N", "T", 1.0f, a, a, 0.0f, c);  // OpenBLAS' own first-call set-up
    CHECK(heap_allocations([&] { lather::impl::kernels::gemm(space, "N", "T", 1.0f, a, a, 0.0f, c); }) == 0);

    Kokkos::View<float**, Kokkos::LayoutRight, Space> spd("spd", 64, 64), x("x", 64, 64);
    lather::impl::kernels::gemm(space, "N", "T", 1.0f / 64, a, a, 0.0f, spd);
    auto h = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), spd);
    for (int i = 0; i < 64; ++i) h(i, i) += 0.1f;
    Kokkos::deep_copy(spd, h);
    const Kokkos::View<const float**, Kokkos::LayoutRight, Space> cspd = spd;
    const lather::EigenRootInverse strategy;
    REQUIRE(strategy.compute(space, cspd, 2.0, 1e-6, x) == lather::RootInverseStatus::success);
    std::int64_t n = -1;
    n = heap_allocations([&] { (void)strategy.compute(space, cspd, 2.0, 1e-6, x); });
    CHECK(n == 0);
    // A smaller matrix after a larger one reuses the same buffers.
    const auto small = Kokkos::subview(cspd, std::make_pair(0, 13), std::make_pair(0, 13));
    Kokkos::View<float**, Kokkos::LayoutRight, Space> x13("x13", 13, 13);
    const Kokkos::View<float**, Kokkos::LayoutRight, Space> s13("s13", 13, 13);
    Kokkos::deep_copy(s13, small);
    const Kokkos::View<const float**, Kokkos::LayoutRight, Space> cs13 = s13;
    n = heap_allocations([&] { (void)strategy.compute(space, cs13, 2.0, 1e-6, x13); });
    CHECK(n == 0);

    // Coupled Newton, alone and chosen by AutoRootInverse: its work matrices are kept in the
    // object after the first call of the largest size (impl/work_matrices.hpp).
    const lather::CoupledNewtonRootInverse newton{.max_iterations = 200};
    REQUIRE(lather::is_usable(newton.compute(space, cspd, 2.0, 1e-6, x)));
    CHECK(heap_allocations([&] { (void)newton.compute(space, cspd, 2.0, 1e-6, x); }) == 0);
    CHECK(heap_allocations([&] { (void)newton.compute(space, cs13, 2.0, 1e-6, x13); }) == 0);
    const lather::AutoRootInverse by_newton{.newton = {.max_iterations = 200}, .newton_min_dim_host = 0};
    REQUIRE(by_newton.uses_newton<ExecSpace>(64, 2.0));
    REQUIRE(lather::is_usable(by_newton.compute(space, cspd, 2.0, 1e-6, x)));
    CHECK(heap_allocations([&] { (void)by_newton.compute(space, cspd, 2.0, 1e-6, x); }) == 0);

    // The coupled higher-order iteration likewise (its series' coefficients are recomputed where
    // used, not a table per call): an integer and a fractional root (X^q powered at the end).
    const lather::CoupledHigherOrderRootInverse higher{.rel_epsilon = 0.0, .abs_epsilon = 1e-6};
    for (const double root : {2.0, 2.5}) {
      CAPTURE(root);
      REQUIRE(lather::is_usable(higher.compute(space, cspd, root, 1e-6, x)));
      CHECK(heap_allocations([&] { (void)higher.compute(space, cspd, root, 1e-6, x); }) == 0);
      CHECK(heap_allocations([&] { (void)higher.compute(space, cs13, root, 1e-6, x13); }) == 0);
    }
  }
}
TEST_CASE_TEMPLATE_APPLY(no_allocation, lather_test_exec_spaces);

namespace {
// Parameters of every kind a model has: a matrix over the block size (several blocks; its 256 x
// 256 factor is past the size where Kokkos 3.4 copies host memory in parallel, which allocated),
// a vector, a 4-D convolution weight (merged dimensions, a middle-dimension product) and a
// scalar-like (1,) bias; float, as the benchmarks.
template <class Space>
std::vector<Kokkos::View<float*, Space>> step_params(std::vector<std::vector<std::int64_t>>& shapes) {
  shapes = {{300, 13}, {16, 16}, {13}, {4, 3, 3, 3}, {1}};
  std::vector<Kokkos::View<float*, Space>> v;
  for (std::size_t i = 0; i < shapes.size(); ++i) {
    std::int64_t n = 1;
    for (const auto e : shapes[i]) n *= e;
    Kokkos::View<float*, Space> x("p", static_cast<std::size_t>(n));
    auto h = Kokkos::create_mirror_view(x);
    const auto r = lather::test::random_values(static_cast<std::size_t>(n), 300 + i);
    for (std::int64_t k = 0; k < n; ++k) h(k) = static_cast<float>(r[static_cast<std::size_t>(k)]);
    Kokkos::deep_copy(x, h);
    v.push_back(x);
  }
  return v;
}

// Steps 2 to 6 of an optimizer (precondition_frequency = start_preconditioning_step = 3: steps 2
// and 4-5 steady, 3 the first root step, 6 the next), each counted on its own; `after(t)` checks
// whatever else the caller wants after step t.
template <class Step, class After = void (*)(int)>
void check_steps_allocate_nothing(const char* what, Step&& step, After&& after = [](int) {}) {
  for (int t = 2; t <= 6; ++t) {
    const auto n = heap_allocations(step);
    INFO(std::string(what), ": step ", t, " (", std::string(t % 3 == 0 ? "roots computed" : "steady"), "): ", n,
         " heap allocations");
    CHECK(n == 0);
    after(t);
  }
}
}  // namespace

TEST_CASE_TEMPLATE_DEFINE("allocations: a Shampoo step (steady and root) and an AdamW step allocate nothing after the first",
                          ExecSpace, step_allocations) {
  using Space = typename ExecSpace::memory_space;
  if constexpr (Kokkos::SpaceAccessibility<Kokkos::HostSpace, Space>::accessible) {
    const ExecSpace space;
    std::vector<std::vector<std::int64_t>> shapes;
    auto flat = step_params<Space>(shapes);
    std::vector<lather::TensorRef<float, Space>> params;
    for (std::size_t i = 0; i < flat.size(); ++i)
      params.emplace_back(flat[i].data(), std::span<const std::int64_t>(shapes[i]));
    auto grads_flat = step_params<Space>(shapes);
    std::vector<lather::TensorRef<const float, Space>> grads;
    for (std::size_t i = 0; i < grads_flat.size(); ++i)
      grads.emplace_back(grads_flat[i].data(), std::span<const std::int64_t>(shapes[i]));

    lather::ShampooOptions o;
    o.lr = 1e-3;
    o.max_preconditioner_dim = 256;  // (300, 13) -> 2 blocks
    o.epsilon = 1e-6;                // float factors of rank 13 per step: eps 1e-12 is lost in rounding
    o.precondition_frequency = 3;
    o.start_preconditioning_step = 3;
    o.weight_decay = 1e-4;
    lather::Shampoo<lather::TensorRef<float, Space>, ExecSpace, lather::EigenRootInverse, lather::AdamGrafting> shampoo(
        std::span<lather::TensorRef<float, Space>>(params), o, {}, lather::AdamGrafting{.beta2 = 0.999, .epsilon = 1e-8});
    // Steps 1-2 graft, 3 is the first root step, 4-5 steady, 6 the next root step: every step
    // after the first is counted, the first root step included (with the default
    // start_preconditioning_step it is step precondition_frequency, long after the first).
    shampoo.step(space, grads);
    check_steps_allocate_nothing("EigenRootInverse", [&] { shampoo.step(space, grads); });
    CHECK(shampoo.state_dict().tensors.size() > 0);  // (state still readable after the counted steps)
    // The batched passes (the device path): a steady step is queued behind the NaN/Inf count and
    // reads the counts at the end (gated); a root step reads them first.
    lather::Shampoo<lather::TensorRef<float, Space>, ExecSpace, lather::EigenRootInverse, lather::AdamGrafting> batched(
        std::span<lather::TensorRef<float, Space>>(params), o, {}, lather::AdamGrafting{.beta2 = 0.999, .epsilon = 1e-8});
    batched.set_batched_passes(true);
    batched.step(space, grads);
    check_steps_allocate_nothing("batched passes", [&] { batched.step(space, grads); }, [&](int t) {
      CHECK(batched.last_step_info().amortized == (t % 3 == 0));
    });

    // Roots by coupled Newton (AutoRootInverse with Newton at every size, the device default).
    // Epsilon above the float rounding of these rank-13 factors (about 1e-5 of their norm), so
    // that Newton converges; the case below it follows.
    lather::ShampooOptions on = o;
    on.epsilon = 1e-2;
    lather::Shampoo<lather::TensorRef<float, Space>, ExecSpace, lather::AutoRootInverse, lather::AdamGrafting> by_newton(
        std::span<lather::TensorRef<float, Space>>(params), on,
        lather::AutoRootInverse{.newton = {.max_iterations = 200}, .newton_min_dim_host = 0},
        lather::AdamGrafting{.beta2 = 0.999, .epsilon = 1e-8});
    by_newton.step(space, grads);
    check_steps_allocate_nothing("coupled Newton", [&] { by_newton.step(space, grads); });
    CHECK(by_newton.last_step_info().amortized);
    // Epsilon 1e-6: Newton diverges on the eigenvalues rounded under zero and stops before
    // anything overflows (CoupledNewtonRootInverse::divergence_bound), so the harness's
    // FE_INVALID trap stays quiet, and AutoRootInverse falls back to the eigendecomposition:
    // the root steps succeed and allocate nothing after the first.
    lather::Shampoo<lather::TensorRef<float, Space>, ExecSpace, lather::AutoRootInverse, lather::AdamGrafting> falls_back(
        std::span<lather::TensorRef<float, Space>>(params), o,
        lather::AutoRootInverse{.newton = {.max_iterations = 200}, .newton_min_dim_host = 0},
        lather::AdamGrafting{.beta2 = 0.999, .epsilon = 1e-8});
    falls_back.step(space, grads);
    check_steps_allocate_nothing("Newton falling back", [&] { falls_back.step(space, grads); });
    CHECK(falls_back.last_step_info().amortized);
    CHECK(falls_back.last_step_info().root_computations_not_converged == 0);

    lather::AdamW<lather::TensorRef<float, Space>, ExecSpace> adamw(std::span<lather::TensorRef<float, Space>>(params),
                                                                    lather::AdamWOptions{.lr = 1e-3});
    adamw.step(space, grads);
    CHECK(heap_allocations([&] { adamw.step(space, grads); }) == 0);
    // The kernels devices run, the update gated on the screen's counts (DiagonalOptimizer::step).
    lather::AdamW<lather::TensorRef<float, Space>, ExecSpace> gated(std::span<lather::TensorRef<float, Space>>(params),
                                                                    lather::AdamWOptions{.lr = 1e-3});
    gated.set_portable_kernels(true);
    gated.step(space, grads);
    CHECK(heap_allocations([&] { gated.step(space, grads); }) == 0);
  }
}
TEST_CASE_TEMPLATE_APPLY(step_allocations, lather_test_exec_spaces);
#endif


namespace {
// The heap allocations of steps 2 to 6 of one Shampoo preconditioner policy (element t - 2 for
// step t): 3 is the first root step, 6 the next, the others steady.
template <class ExecSpace, class Policy>
std::vector<std::int64_t> policy_step_allocations(const Policy& policy, bool matrices_only) {
  using Space = typename ExecSpace::memory_space;
  const ExecSpace space;
  std::vector<std::vector<std::int64_t>> shapes;
  auto flat = step_params<Space>(shapes);
  auto grads_flat = step_params<Space>(shapes);
  if (matrices_only) {  // spectral descent: 2-D blocks only
    shapes = {shapes[0], shapes[1]};
    flat.resize(2);
    grads_flat.resize(2);
  }
  std::vector<lather::TensorRef<float, Space>> params;
  for (std::size_t i = 0; i < flat.size(); ++i) params.emplace_back(flat[i].data(), std::span<const std::int64_t>(shapes[i]));
  std::vector<lather::TensorRef<const float, Space>> grads;
  for (std::size_t i = 0; i < grads_flat.size(); ++i)
    grads.emplace_back(grads_flat[i].data(), std::span<const std::int64_t>(shapes[i]));
  lather::ShampooOptions o;
  o.lr = 1e-3;
  o.max_preconditioner_dim = 256;
  o.epsilon = 1e-6;
  o.precondition_frequency = 3;
  o.start_preconditioning_step = 3;
  lather::Shampoo<lather::TensorRef<float, Space>, ExecSpace, Policy, lather::AdamGrafting> opt(
      std::span<lather::TensorRef<float, Space>>(params), o, policy, lather::AdamGrafting{.beta2 = 0.999, .epsilon = 1e-8});
  opt.step(space, grads);
  std::vector<std::int64_t> n;
  for (int t = 2; t <= 6; ++t) n.push_back(heap_allocations([&] { opt.step(space, grads); }));
  return n;
}
}  // namespace

TEST_CASE_TEMPLATE_DEFINE("allocations: every Shampoo preconditioner policy's steps allocate nothing after the first",
                          ExecSpace, policy_allocations) {
  using Space = typename ExecSpace::memory_space;
  if constexpr (Kokkos::SpaceAccessibility<Kokkos::HostSpace, Space>::accessible) {
    const auto check = [](const char* what, const std::vector<std::int64_t>& n) {
      for (std::size_t j = 0; j < n.size(); ++j) {
        INFO(std::string(what), ": step ", j + 2, " (", std::string((j + 2) % 3 == 0 ? "roots computed" : "steady"),
             "): ", n[j], " heap allocations");
        CHECK(n[j] == 0);
      }
    };
    check("eigendecomposed, eigh", policy_step_allocations<ExecSpace>(lather::EigendecomposedShampoo<>{}, false));
    check("eigendecomposed, QR", policy_step_allocations<ExecSpace>(lather::EigendecomposedShampoo<lather::QREigendecomposition>{}, false));
    check("eigenvalue-corrected, eigh", policy_step_allocations<ExecSpace>(lather::EigenvalueCorrectedShampoo<>{}, false));
    check("eigenvalue-corrected, eigh with adaptive skip",
          policy_step_allocations<ExecSpace>(lather::EigenvalueCorrectedShampoo<>{.amortized = {.tolerance = 0.5}}, false));
    check("SOAP (QR)", policy_step_allocations<ExecSpace>(lather::SOAP{}, false));
    check("KL, root inverse", policy_step_allocations<ExecSpace>(lather::KLShampoo<>{}, false));
    check("KL, eigendecomposed", policy_step_allocations<ExecSpace>(lather::KLShampoo<lather::EigendecomposedShampoo<>>{}, false));
    check("Muon", policy_step_allocations<ExecSpace>(lather::Muon{}, true));
    check("spectral descent, SVD", policy_step_allocations<ExecSpace>(lather::SpectralDescent<lather::SVDOrthogonalization>{}, true));
    check("sign descent", policy_step_allocations<ExecSpace>(lather::SignDescent{}, false));
  }
}
TEST_CASE_TEMPLATE_APPLY(policy_allocations, lather_test_exec_spaces);
