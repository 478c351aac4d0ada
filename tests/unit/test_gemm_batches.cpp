// SPDX-License-Identifier: Apache-2.0
// impl::blas::GemmBatches (impl/backends/gemm_batches.hpp), the queue that runs the batched
// passes' products one batched BLAS call per shape: the grouping (shapes, transposes and leading
// dimensions each a group of their own, queue order kept within a group), the pointer arrays in
// the memory space (the right A, B, C of every product at the group's offsets), groups of products
// deeper than the depth ratio run one by one, the uploads
// (none when a step queues what the previous one did, one where a pointer changed), growth past
// the reserved room, copies with arrays of their own, and the products' values against a long-double triple loop: products of
// length k in precision u within 4 k u max|a| max|b| (the test_host_blas bound). On a device
// space with cuBLAS the groups of more than one product go to cublas{S,D}gemmBatched; elsewhere
// run() makes one call per product.
#include <lather/impl/backends/gemm_batches.hpp>
#include <lather/impl/kernels/matrix_functions.hpp>

#include <Kokkos_Core.hpp>

#include <doctest/doctest.h>

#include "exec_spaces.hpp"
#include "test_utils.hpp"

#include <cmath>
#include <cstdint>
#include <limits>
#include <set>
#include <tuple>
#include <utility>
#include <vector>

namespace {

struct Shape {
  char ta, tb;
  std::int64_t m, n, k;
  std::int64_t pad = 0;  // A's leading dimension beyond the least it can be
};

// One product through Kokkos Kernels' gemm (a caller's one-by-one routine): op(A) and op(B) are
// the first rows of their leading dimensions (Kokkos Kernels' device gemm checks A's rows against
// C's; a chunk of a split product is a slice of a longer X), and so is C (a tile of a Gram
// product's output is a block of a larger C).
template <class T, class ExecSpace, class Product>
void gemm_one(const ExecSpace& space, const Product& q) {
  using M = typename ExecSpace::memory_space;
  using matrix = Kokkos::View<T**, Kokkos::LayoutLeft, Kokkos::Device<ExecSpace, M>, Kokkos::MemoryTraits<Kokkos::Unmanaged>>;
  const auto sub = [](const T* data, std::int64_t ld, std::int64_t rows, std::int64_t cols) {
    return Kokkos::subview(matrix(const_cast<T*>(data), static_cast<std::size_t>(ld), static_cast<std::size_t>(cols)),
                           Kokkos::make_pair(std::int64_t(0), rows), Kokkos::ALL);
  };
  const char ta[2] = {q.ta, '\0'}, tb[2] = {q.tb, '\0'};
  const auto ma = sub(q.a, q.lda, q.ta == 'N' ? q.m : q.k, q.ta == 'N' ? q.k : q.m);
  const auto mb = sub(q.b, q.ldb, q.tb == 'N' ? q.k : q.n, q.tb == 'N' ? q.n : q.k);
  lather::impl::kernels::gemm(space, ta, tb, T(1), ma, mb, T(0), sub(q.c, q.ldc, q.m, q.n));
}

template <class T, class ExecSpace>
void impl_test_gemm_batches() {
  using M = typename ExecSpace::memory_space;
  using Batches = lather::impl::blas::GemmBatches<ExecSpace, T, M>;
  // Shapes interleaved in the queue: two that differ only in a transpose, one only in A's
  // leading dimension, single products (sizes 1, 2, 3, 13, 17, 33, 40 among the dimensions).
  const std::vector<Shape> shapes{{'N', 'N', 13, 3, 2},  {'T', 'N', 13, 13, 40}, {'N', 'T', 13, 3, 2},
                                  {'N', 'N', 13, 3, 2},  {'T', 'N', 13, 13, 40}, {'N', 'N', 1, 1, 1},
                                  {'N', 'N', 13, 3, 2},  {'T', 'T', 40, 33, 17}, {'T', 'N', 13, 13, 40},
                                  {'N', 'T', 13, 3, 2},  {'N', 'N', 13, 3, 2, 1}};
  // Group of each product, in order of first appearance, and each group's size.
  const std::vector<std::size_t> group_of{0, 1, 2, 0, 1, 3, 0, 4, 1, 2, 5};
  const std::vector<std::int64_t> group_size{3, 3, 2, 1, 1, 1};
  const auto n_products = shapes.size();
  auto lda_of = [](const Shape& s) { return (s.ta == 'N' ? s.m : s.k) + s.pad; };
  auto ldb_of = [](const Shape& s) { return s.tb == 'N' ? s.k : s.n; };
  // Operands in one buffer each, so that the pointers are stable; a second C buffer for the
  // "changed pointer" step.
  std::vector<std::int64_t> a_at, b_at, c_at;
  std::int64_t a_total = 0, b_total = 0, c_total = 0;
  for (const auto& s : shapes) {
    a_at.push_back(a_total);
    b_at.push_back(b_total);
    c_at.push_back(c_total);
    a_total += lda_of(s) * (s.ta == 'N' ? s.k : s.m);
    b_total += s.k * s.n;
    c_total += s.m * s.n;
  }
  Kokkos::View<T*, M> a("a", static_cast<std::size_t>(a_total)), b("b", static_cast<std::size_t>(b_total)),
      c("c", static_cast<std::size_t>(c_total)), c2("c2", static_cast<std::size_t>(c_total));
  const auto ha = lather::test::random_values(static_cast<std::size_t>(a_total), 11);
  const auto hb = lather::test::random_values(static_cast<std::size_t>(b_total), 12);
  {
    auto ma = Kokkos::create_mirror_view(a);
    auto mb = Kokkos::create_mirror_view(b);
    for (std::size_t i = 0; i < ha.size(); ++i) ma(i) = static_cast<T>(ha[i]);
    for (std::size_t i = 0; i < hb.size(); ++i) mb(i) = static_cast<T>(hb[i]);
    Kokkos::deep_copy(a, ma);
    Kokkos::deep_copy(b, mb);
  }
  // The expected products from the values as rounded to T, in long double.
  auto expected = [&](std::size_t p) {
    const Shape& s = shapes[p];
    const std::int64_t lda = lda_of(s), ldb = ldb_of(s);
    std::vector<double> out(static_cast<std::size_t>(s.m * s.n));
    for (std::int64_t i = 0; i < s.m; ++i)
      for (std::int64_t j = 0; j < s.n; ++j) {
        long double sum = 0;
        for (std::int64_t l = 0; l < s.k; ++l) {
          const auto ai = static_cast<std::size_t>(a_at[p] + (s.ta == 'N' ? i + l * lda : l + i * lda));
          const auto bi = static_cast<std::size_t>(b_at[p] + (s.tb == 'N' ? l + j * ldb : j + l * ldb));
          sum += static_cast<long double>(static_cast<T>(ha[ai])) * static_cast<T>(hb[bi]);
        }
        out[static_cast<std::size_t>(i + j * s.m)] = static_cast<double>(sum);
      }
    return out;
  };
  auto product = [&](std::size_t p, const Kokkos::View<T*, M>& out) {
    const Shape& s = shapes[p];
    typename Batches::Product q;
    q.ta = s.ta;
    q.tb = s.tb;
    q.m = s.m;
    q.n = s.n;
    q.k = s.k;
    q.a = a.data() + a_at[p];
    q.lda = lda_of(s);
    q.b = b.data() + b_at[p];
    q.ldb = ldb_of(s);
    q.c = out.data() + c_at[p];
    q.ldc = s.m;
    return q;
  };
  const ExecSpace space;
  std::int64_t one_calls = 0;
  auto one = [&](const typename Batches::Product& q) {
    ++one_calls;
    gemm_one<T>(space, q);
  };
  auto check_values = [&](const Kokkos::View<T*, M>& out) {
    space.fence();
    auto h = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), out);
    for (std::size_t p = 0; p < n_products; ++p) {
      const auto want = expected(p);
      const double bound = 4.0 * static_cast<double>(shapes[p].k) * std::numeric_limits<T>::epsilon();
      double worst = 0;
      for (std::size_t e = 0; e < want.size(); ++e)
        worst = std::max(worst, std::abs(static_cast<double>(h(static_cast<std::size_t>(c_at[p]) + e)) - want[e]));
      CAPTURE(p);
      CHECK(worst <= bound);  // random_values are in [-1, 1]: max|a| max|b| <= 1
    }
  };

  // The pointer arrays: group g's A, B, C pointers at first, first + count, first + 2 count, in
  // queue order within the group.
  auto check_table = [&](const Batches& batches, const Kokkos::View<T*, M>& out) {
    const auto& groups = batches.groups();
    REQUIRE(groups.size() == group_size.size());
    auto table = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), batches.pointer_table());
    std::vector<std::int64_t> seen(groups.size(), 0);
    for (std::size_t p = 0; p < n_products; ++p) {
      const auto q = product(p, out);
      const auto& grp = groups[group_of[p]];
      CAPTURE(p);
      CHECK(grp.ta == q.ta);
      CHECK(grp.tb == q.tb);
      CHECK(grp.m == q.m);
      CHECK(grp.n == q.n);
      CHECK(grp.k == q.k);
      CHECK(grp.lda == q.lda);
      CHECK(grp.count == group_size[group_of[p]]);
      const auto j = static_cast<std::size_t>(grp.first + seen[group_of[p]]++);
      const auto cnt = static_cast<std::size_t>(grp.count);
      CHECK(table(j) == reinterpret_cast<std::uintptr_t>(q.a));
      CHECK(table(j + cnt) == reinterpret_cast<std::uintptr_t>(q.b));
      CHECK(table(j + 2 * cnt) == reinterpret_cast<std::uintptr_t>(q.c));
    }
  };
  std::int64_t batched_groups = 0;
  for (const auto n : group_size) batched_groups += n > 1 ? 1 : 0;
  // BLAS calls of one run: a call per group of more than one product where the BLAS batches
  // (the rest one by one), else one per product.
  const std::int64_t calls_expected =
      Batches::batched_blas ? batched_groups + static_cast<std::int64_t>(n_products) - 8 : static_cast<std::int64_t>(n_products);

  Batches batches;
  batches.reserve(4);  // less room than the 11 products: the first run grows the arrays
  auto step = [&](const Kokkos::View<T*, M>& moved_out, std::size_t moved) {
    batches.begin_step();
    for (std::size_t p = 0; p < n_products; ++p) batches.add(product(p, p == moved ? moved_out : c));
    CHECK(batches.size() == n_products);
    one_calls = 0;
    CHECK(batches.run(space, one) == calls_expected);  // groups, uploads what changed, runs
    CHECK(batches.empty());
    CHECK(one_calls == (Batches::batched_blas ? static_cast<std::int64_t>(n_products) - 8 : calls_expected));
  };
  // Step 1: grouped, the arrays uploaded once, the products right.
  step(c, n_products);
  CHECK(batches.uploads() == 1);
  CHECK(batches.groups().front().first == 0);
  check_table(batches, c);
  check_values(c);
  // Step 2, the same products: the arrays are in place, nothing is uploaded.
  Kokkos::deep_copy(c, T(0));
  step(c, n_products);
  CHECK(batches.uploads() == 1);
  check_table(batches, c);
  check_values(c);
  // A second run in the step: its arrays after the first's (the room grows: a fence, then a
  // new array whose every position is uploaded again).
  for (std::size_t p = 0; p < n_products; ++p) batches.add(product(p, c2));
  CHECK(batches.run(space, one) == calls_expected);
  CHECK(batches.uploads() == 2);
  CHECK(batches.groups().front().first == 3 * static_cast<std::int64_t>(n_products));
  check_table(batches, c2);
  check_values(c2);
  // Steps 3 to 5: C of one product moved (uploaded), moved back (uploaded), the same again (not).
  step(c, n_products);
  CHECK(batches.uploads() == 3);  // the grown array held nothing at the first run's positions
  Kokkos::deep_copy(c2, T(0));
  step(c2, 4);
  CHECK(batches.uploads() == 4);
  {
    auto h = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), c2);
    const auto want = expected(4);
    double worst = 0;
    for (std::size_t e = 0; e < want.size(); ++e)
      worst = std::max(worst, std::abs(static_cast<double>(h(static_cast<std::size_t>(c_at[4]) + e)) - want[e]));
    CHECK(worst <= 4.0 * static_cast<double>(shapes[4].k) * std::numeric_limits<T>::epsilon());
  }
  step(c, n_products);
  CHECK(batches.uploads() == 5);
  step(c, n_products);
  CHECK(batches.uploads() == 5);
  check_values(c);
  // A copy has arrays of its own: its uploads do not change what the original's record says.
  Batches copy = batches;
  CHECK(copy.pointer_table().data() != batches.pointer_table().data());
  copy.begin_step();
  for (std::size_t p = 0; p < n_products; ++p) copy.add(product(p, c2));
  CHECK(copy.run(space, one) == calls_expected);
  CHECK(copy.uploads() == 1);
  check_values(c2);
  step(c, n_products);
  CHECK(batches.uploads() == 5);
  check_table(batches, c);
  // Groups of products deeper than the depth ratio allows run one by one even where the BLAS
  // batches: with the ratio at 3, the (13, 13, 40) group (40 > 3 x 13) is three calls.
  {
    Batches shallow;
    CHECK(shallow.depth_ratio() == Batches::default_depth_ratio);
    shallow.set_depth_ratio(3);
    for (std::size_t p = 0; p < n_products; ++p) shallow.add(product(p, c2));
    std::int64_t limited_calls = 0, limited_one = 0;
    std::vector<std::int64_t> first_of(group_size.size(), -1);
    for (std::size_t p = 0; p < n_products; ++p)
      if (first_of[group_of[p]] < 0) first_of[group_of[p]] = static_cast<std::int64_t>(p);
    auto fits = [](const Shape& s, std::int64_t count, std::int64_t ratio) {
      return count > 1 && s.k <= ratio * std::max(s.m, s.n);
    };
    for (std::size_t g = 0; g < group_size.size(); ++g) {
      const bool batched =
          Batches::batched_blas && fits(shapes[static_cast<std::size_t>(first_of[g])], group_size[g], 3);
      limited_calls += batched ? 1 : group_size[g];
      limited_one += batched ? 0 : group_size[g];
    }
    CHECK(limited_calls == (Batches::batched_blas ? 8 : static_cast<std::int64_t>(n_products)));
    Kokkos::deep_copy(c2, T(0));
    one_calls = 0;
    CHECK(shallow.run(space, one) == limited_calls);
    CHECK(one_calls == limited_one);
    // The decision itself, on every space: the default ratio takes every group of more than one
    // product here; ratio 3 leaves out the (13, 13, 40) group only.
    const auto& groups = shallow.groups();
    REQUIRE(groups.size() == group_size.size());
    for (std::size_t g = 0; g < groups.size(); ++g) {
      const Shape& s = shapes[static_cast<std::size_t>(first_of[g])];
      CAPTURE(g);
      CHECK(shallow.fits_batch(groups[g]) == fits(s, group_size[g], 3));
      CHECK(batches.fits_batch(groups[g]) == (group_size[g] > 1));
    }
    CHECK(!shallow.fits_batch(groups[1]));
    CHECK(shallow.fits_batch(groups[0]));
    check_values(c2);
    Batches shallow_copy = shallow;  // a copy keeps the ratio
    CHECK(shallow_copy.depth_ratio() == 3);
  }
  // A failed step's queue is dropped by the next step's begin_step.
  batches.add(product(0, c));
  batches.begin_step();
  CHECK(batches.empty());
  CHECK(batches.run(space, one) == 0);
}

// Gram products X^T X ('T','N', X k x m) and X X^T ('N','T', X m x k) with X's entries multiples
// of 1/2 in [-1, 1]: every product is a multiple of 1/4 and every partial sum of the sizes below
// (at most 5000 in magnitude, 20000 quarters < 2^24) is exact in float, so whatever the order of
// the sums (chunks, tiles, cuBLAS' blocking) the result is the exact Gram matrix.
struct GramShape {
  bool transpose_first;  // X^T X of a k x m X ('T','N'), else X X^T of an m x k X ('N','T')
  std::int64_t m, k, pad;  // pad: X's leading dimension beyond the least it can be
  bool gram = true;
  std::int64_t expect = 0;  // what the test expects run() to make of it (chunks, tiles per side)
};
template <class T, class ExecSpace>
struct GramProducts {
  using M = typename ExecSpace::memory_space;
  using Product = typename lather::impl::blas::GemmBatches<ExecSpace, T, M>::Product;
  std::vector<GramShape> grams;
  std::vector<std::int64_t> x_at, c_at;
  std::int64_t c_total = 0;
  std::vector<double> hx;
  Kokkos::View<T*, M> x;

  GramProducts(std::vector<GramShape> shapes, std::uint64_t seed) : grams(std::move(shapes)) {
    std::int64_t x_total = 0;
    for (const auto& g : grams) {
      x_at.push_back(x_total);
      c_at.push_back(c_total);
      x_total += ld(g) * (g.transpose_first ? g.m : g.k);
      c_total += g.m * g.m;
    }
    hx = lather::test::random_values(static_cast<std::size_t>(x_total), seed);
    for (auto& v : hx) v = std::round(2.0 * v) / 2.0;
    x = Kokkos::View<T*, M>("x", static_cast<std::size_t>(x_total));
    auto mx = Kokkos::create_mirror_view(x);
    for (std::size_t i = 0; i < hx.size(); ++i) mx(i) = static_cast<T>(hx[i]);
    Kokkos::deep_copy(x, mx);
  }
  static std::int64_t ld(const GramShape& g) { return (g.transpose_first ? g.k : g.m) + g.pad; }  // X's lda
  // Product p writing its m x m output at its place in `out`.
  Product product(std::size_t p, const Kokkos::View<T*, M>& out) const {
    const GramShape& g = grams[p];
    Product q;
    q.ta = g.transpose_first ? 'T' : 'N';
    q.tb = g.transpose_first ? 'N' : 'T';
    q.m = q.n = g.m;
    q.k = g.k;
    q.a = q.b = x.data() + x_at[p];
    q.lda = q.ldb = ld(g);
    q.c = out.data() + c_at[p];
    q.ldc = g.m;
    q.gram = g.gram;
    return q;
  }
  // Entry (i, j) of product p, exactly.
  double exact(std::size_t p, std::int64_t i, std::int64_t j) const {
    const GramShape& g = grams[p];
    const std::int64_t l_d = ld(g);
    long double sum = 0;
    for (std::int64_t l = 0; l < g.k; ++l) {
      const auto xi = static_cast<std::size_t>(x_at[p] + (g.transpose_first ? l + i * l_d : i + l * l_d));
      const auto xj = static_cast<std::size_t>(x_at[p] + (g.transpose_first ? l + j * l_d : j + l * l_d));
      sum += static_cast<long double>(hx[xi]) * hx[xj];
    }
    return static_cast<double>(sum);
  }
};

// Split deep Gram products (set_split): X^T X and X X^T of small outputs from long reductions run
// as chunks of the reduction into partial outputs that one kernel adds. Forced on here with chunk
// 2048 on every space (the default is on only where the BLAS batches); the one-by-one routine
// reads A with its leading dimension, as set_split asks. X's entries are multiples of 1/2 in
// [-1, 1], so that every product is a multiple of 1/4 and every partial sum (at most 5000 in
// magnitude, 20000 quarters < 2^24) is exact in float: whatever the order of the sums (chunks,
// cuBLAS' blocking), a right split gives the exact Gram matrix, and a chunk missed, repeated or
// misplaced shows as a difference.
template <class T, class ExecSpace>
void impl_test_gemm_batches_split() {
  using M = typename ExecSpace::memory_space;
  using Batches = lather::impl::blas::GemmBatches<ExecSpace, T, M>;
  // Split: 3 x 3 from 5000 (chunks 2048, 2048, 904), twice (a group of chunks of two products),
  // once with a padded X; 13 x 13 from 4096 (exactly two chunks) as X X^T with padding; 1 x 1 from
  // 2049 (2048 + 1); 32 x 32 from 2049 (the largest output split). Not split: 33 x 33 from 6000
  // (too wide), 13 x 13 from 2048 (not deeper than a chunk), 2 x 2 from 5000 not a Gram product.
  // `expect`: the chunks run() should make of each with max output 32, chunk 2048.
  const GramProducts<T, ExecSpace> set({{true, 3, 5000, 0, true, 3},  {false, 13, 4096, 2, true, 2}, {true, 3, 5000, 0, true, 3},
                                        {true, 33, 6000, 0, true, 1}, {true, 1, 2049, 0, true, 2},   {true, 13, 2048, 0, true, 1},
                                        {true, 3, 5000, 5, true, 3},  {true, 2, 5000, 0, false, 1},  {true, 32, 2049, 0, true, 2}},
                                       21);
  const auto& grams = set.grams;
  Kokkos::View<T*, M> c("c", static_cast<std::size_t>(set.c_total)), c_plain("c_plain", static_cast<std::size_t>(set.c_total));
  auto product = [&](std::size_t p, const Kokkos::View<T*, M>& out) { return set.product(p, out); };
  const ExecSpace space;
  std::int64_t one_calls = 0;
  auto one = [&](const typename Batches::Product& q) {
    ++one_calls;
    gemm_one<T>(space, q);
  };
  // The lower triangles against the exact sums (file comment above: no rounding anywhere).
  auto check_values = [&](const Kokkos::View<T*, M>& out) {
    space.fence();
    auto h = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), out);
    for (std::size_t p = 0; p < grams.size(); ++p) {
      const GramShape& g = grams[p];
      double worst = 0;
      for (std::int64_t j = 0; j < g.m; ++j)
        for (std::int64_t i = j; i < g.m; ++i)
          worst = std::max(worst, std::abs(static_cast<double>(h(static_cast<std::size_t>(set.c_at[p] + i + j * g.m))) -
                                           set.exact(p, i, j)));
      CAPTURE(p);
      CHECK(worst == 0.0);
    }
  };

  Batches batches;
  CHECK(batches.split_max_output() == (Batches::batched_blas ? 32 : 0));
  CHECK(batches.split_chunk() == 2048);
  batches.set_split(32, 2048);
  // The decision per product.
  std::int64_t split_count = 0, pieces = 0;
  for (std::size_t p = 0; p < grams.size(); ++p) {
    CAPTURE(p);
    CHECK(batches.splits(product(p, c)) == (grams[p].expect > 1));
    split_count += grams[p].expect > 1 ? 1 : 0;
    pieces += grams[p].expect;
  }
  CHECK(batches.chunk_rows(product(0, c)) == 2048);
  CHECK(batches.chunk_rows(product(5, c)) == 2048);
  // Invalid settings name the option and change nothing.
  CHECK_THROWS_WITH_AS(batches.set_split(-1, 2048), doctest::Contains("max_output = -1"), lather::invalid_argument);
  CHECK_THROWS_WITH_AS(batches.set_split(32, 0), doctest::Contains("chunk = 0"), lather::invalid_argument);
  CHECK(batches.split_max_output() == 32);
  CHECK(batches.split_chunk() == 2048);
  // Chunk groups after the split, as prepare() forms them (the unsplit products keep theirs).
  // 3 x 3 from 5000: chunks of 2048 (6 of them, three products' first two) and of 904 (3), the
  // padded product's apart (its lda); the others one group per chunk shape.
  auto step = [&](bool second_run) {
    if (!second_run) batches.begin_step();
    for (std::size_t p = 0; p < grams.size(); ++p) batches.add(product(p, c));
    one_calls = 0;
    const std::int64_t calls = batches.run(space, one);
    CHECK(batches.split_products() == split_count);
    std::int64_t chunk_groups = 0, plain_groups = 0, chunk_products = 0;
    for (const auto& grp : batches.groups()) {
      chunk_groups += grp.chunk ? 1 : 0;
      plain_groups += grp.chunk ? 0 : 1;
      chunk_products += grp.chunk ? grp.count : 0;
      if (grp.chunk) CHECK(batches.fits_batch(grp));
    }
    CHECK(chunk_products == pieces - (static_cast<std::int64_t>(grams.size()) - split_count));
    // 3x3 (2048, lda 5000), 3x3 (904, lda 5000), 3x3 (2048, lda 5005), 3x3 (904, lda 5005),
    // 13x13 (2048, lda 15), 1x1 (2048), 1x1 (1), 32x32 (2048), 32x32 (1).
    CHECK(chunk_groups == 9);
    CHECK(plain_groups == 3);
    // One call per group where the BLAS batches (the unsplit single products one by one), else
    // one per product; plus the adding kernel.
    const std::int64_t expected = Batches::batched_blas ? chunk_groups + plain_groups + 1
                                                        : chunk_products + plain_groups + 1;
    CHECK(calls == expected);
    CHECK(one_calls == (Batches::batched_blas ? plain_groups : chunk_products + plain_groups));
  };
  step(false);
  CHECK(batches.reduction_uploads() == 1);
  const auto uploads = batches.uploads();
  check_values(c);
  // A steady step: the same chunks, partial outputs and jobs at the same places; nothing uploaded.
  Kokkos::deep_copy(c, T(0));
  step(false);
  CHECK(batches.reduction_uploads() == 1);
  CHECK(batches.uploads() == uploads);
  check_values(c);
  // A second run in the step: its partial outputs and jobs after the first run's (new places,
  // uploaded once), then steady again over two steps.
  step(true);
  CHECK(batches.reduction_uploads() == 2);
  check_values(c);
  for (int again = 0; again < 2; ++again) {
    Kokkos::deep_copy(c, T(0));
    step(false);
    step(true);
  }
  CHECK(batches.reduction_uploads() == 3);  // the table grew at the first second run: re-uploaded once
  check_values(c);
  // A copy keeps the setting and has buffers of its own.
  Batches copy = batches;
  CHECK(copy.split_max_output() == 32);
  CHECK(copy.split_chunk() == 2048);
  copy.begin_step();
  for (std::size_t p = 0; p < grams.size(); ++p) copy.add(product(p, c_plain));
  copy.run(space, one);
  CHECK(copy.split_products() == split_count);
  check_values(c_plain);
  // Off: nothing split, the same values within the bound.
  Batches plain;
  plain.set_split(0, 2048);
  for (std::size_t p = 0; p < grams.size(); ++p) CHECK(!plain.splits(product(p, c_plain)));
  Kokkos::deep_copy(c_plain, T(0));
  for (std::size_t p = 0; p < grams.size(); ++p) plain.add(product(p, c_plain));
  plain.run(space, one);
  CHECK(plain.split_products() == 0);
  CHECK(plain.reduction_uploads() == 0);
  check_values(c_plain);
}

// Tiled Gram products (set_tiles): X^T X and X X^T computed as their tiles on and below the
// diagonal, batched by tile shape. Forced on here with tiles of at least 2 rows, at most 4 per
// side, on every space (the default is on only where the BLAS batches: tiles of 128 rows or more,
// at most 8 per side).
// Exact sums as in the split test (X's entries multiples of 1/2), so a tile missed, repeated or
// misplaced shows as a difference; C is filled with a sentinel first, which the tiles above the
// diagonal must keep (they are not computed) and every other entry must lose.
template <class T, class ExecSpace>
void impl_test_gemm_batches_tiles() {
  using M = typename ExecSpace::memory_space;
  using Batches = lather::impl::blas::GemmBatches<ExecSpace, T, M>;
  // Tiled: 8 x 8 from 24 (4 x 4 tiles of 2 rows; twice, one group of 20 tiles), 12 x 12 from 40
  // as X X^T with a padded X (4 x 4 tiles of 3), 6 x 6 from 30 (3 x 3 tiles of 2: 4 does not
  // divide 6). Not tiled: 8 x 8 from 200 (deeper than the depth ratio, 16 x 8, lets a product
  // batch), 3 x 3 (a tile would have 1 row), 5 x 5 (no divisor), an 8 x 8 that is not a Gram
  // product; 8 x 8 from 128 (the deepest that batches) is tiled. `expect`: the tiles per side
  // run() should make of each with tiles of at least 2 rows, at most 4 per side.
  const GramProducts<T, ExecSpace> set({{true, 8, 24, 0, true, 4},  {false, 12, 40, 3, true, 4}, {true, 6, 30, 0, true, 3},
                                        {true, 8, 200, 0, true, 0}, {true, 3, 10, 0, true, 0},   {true, 8, 24, 0, false, 0},
                                        {true, 5, 20, 0, true, 0},  {true, 8, 24, 0, true, 4},   {true, 8, 128, 0, true, 4}},
                                       31);
  const auto& grams = set.grams;
  Kokkos::View<T*, M> c("c", static_cast<std::size_t>(set.c_total));
  auto product = [&](std::size_t p) { return set.product(p, c); };
  const ExecSpace space;
  std::int64_t one_calls = 0;
  auto one = [&](const typename Batches::Product& q) {
    ++one_calls;
    gemm_one<T>(space, q);
  };
  constexpr double sentinel = 7.25;
  auto check_values = [&](bool tiled) {
    space.fence();
    auto h = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), c);
    for (std::size_t p = 0; p < grams.size(); ++p) {
      const GramShape& g = grams[p];
      const std::int64_t t = g.expect > 0 && tiled ? g.m / g.expect : g.m;
      std::int64_t wrong = 0, kept = 0, expected_kept = 0;
      for (std::int64_t j = 0; j < g.m; ++j)
        for (std::int64_t i = 0; i < g.m; ++i) {
          const double got = static_cast<double>(h(static_cast<std::size_t>(set.c_at[p] + i + j * g.m)));
          if (i / t < j / t) {  // a tile above the diagonal: not computed
            ++expected_kept;
            kept += got == sentinel ? 1 : 0;
            continue;
          }
          wrong += got == set.exact(p, i, j) ? 0 : 1;
        }
      CAPTURE(p);
      CHECK(wrong == 0);
      CHECK(kept == expected_kept);
    }
  };

  Batches batches;
  CHECK(batches.tile_min() == (Batches::batched_blas ? 128 : 0));
  CHECK(batches.tile_max() == 8);
  batches.set_tiles(2, 4);
  CHECK_THROWS_WITH_AS(batches.set_tiles(-1, 4), doctest::Contains("min_tile = -1"), lather::invalid_argument);
  CHECK_THROWS_WITH_AS(batches.set_tiles(2, 1), doctest::Contains("max_tiles = 1"), lather::invalid_argument);
  CHECK(batches.tile_min() == 2);  // unchanged by the refused calls
  CHECK(batches.tile_max() == 4);
  std::int64_t tiled = 0, tiles = 0, plain = 0;
  for (std::size_t p = 0; p < grams.size(); ++p) {
    CAPTURE(p);
    CHECK(batches.tiles(product(p)) == grams[p].expect);
    tiled += grams[p].expect > 0 ? 1 : 0;
    tiles += grams[p].expect * (grams[p].expect + 1) / 2;
    plain += grams[p].expect > 0 ? 0 : 1;
  }
  auto step = [&] {
    batches.begin_step();
    for (std::size_t p = 0; p < grams.size(); ++p) batches.add(product(p));
    one_calls = 0;
    const std::int64_t calls = batches.run(space, one);
    CHECK(batches.tiled_products() == tiled);
    CHECK(batches.split_products() == 0);
    std::int64_t tile_groups = 0, tile_products = 0, plain_groups = 0;
    for (const auto& grp : batches.groups()) {
      tile_groups += grp.tile ? 1 : 0;
      tile_products += grp.tile ? grp.count : 0;
      plain_groups += grp.tile ? 0 : 1;
      if (grp.tile) CHECK(batches.fits_batch(grp));
    }
    CHECK(tile_products == tiles);
    // 2 x 2 from 24 (products 0 and 7), 3 x 3 from 40 (lda 15), 2 x 2 from 30, 2 x 2 from 128;
    // the untiled four are shapes of their own.
    CHECK(tile_groups == 4);
    CHECK(plain_groups == plain);
    CHECK(calls == (Batches::batched_blas ? tile_groups + plain_groups : tile_products + plain_groups));
    CHECK(one_calls == (Batches::batched_blas ? plain_groups : tile_products + plain_groups));
  };
  Kokkos::deep_copy(c, T(sentinel));
  step();
  const auto uploads = batches.uploads();
  check_values(true);
  // A steady step: the same tiles at the same places; nothing uploaded.
  Kokkos::deep_copy(c, T(sentinel));
  step();
  CHECK(batches.uploads() == uploads);
  check_values(true);
  // A copy keeps the setting.
  Batches copy = batches;
  CHECK(copy.tile_min() == 2);
  CHECK(copy.tile_max() == 4);
  // Off: nothing tiled, every entry computed.
  batches.set_tiles(0, 4);
  for (std::size_t p = 0; p < grams.size(); ++p) CHECK(batches.tiles(product(p)) == 0);
  Kokkos::deep_copy(c, T(sentinel));
  batches.begin_step();
  for (std::size_t p = 0; p < grams.size(); ++p) batches.add(product(p));
  batches.run(space, one);
  CHECK(batches.tiled_products() == 0);
  check_values(false);
}

}  // namespace

TEST_CASE_TEMPLATE_DEFINE("GemmBatches: Gram products of large outputs computed as their lower-triangle tiles",
                          ExecSpace, gemm_batches_tiles) {
  impl_test_gemm_batches_tiles<float, ExecSpace>();
  impl_test_gemm_batches_tiles<double, ExecSpace>();
}
TEST_CASE_TEMPLATE_APPLY(gemm_batches_tiles, lather_test_exec_spaces);

TEST_CASE_TEMPLATE_DEFINE("GemmBatches: deep Gram products of small outputs split into batched chunks and added",
                          ExecSpace, gemm_batches_split) {
  impl_test_gemm_batches_split<float, ExecSpace>();
  impl_test_gemm_batches_split<double, ExecSpace>();
}
TEST_CASE_TEMPLATE_APPLY(gemm_batches_split, lather_test_exec_spaces);

TEST_CASE_TEMPLATE_DEFINE("GemmBatches: products grouped by shape, pointer arrays uploaded only where they changed",
                          ExecSpace, gemm_batches) {
  impl_test_gemm_batches<float, ExecSpace>();
  impl_test_gemm_batches<double, ExecSpace>();
}
TEST_CASE_TEMPLATE_APPLY(gemm_batches, lather_test_exec_spaces);
