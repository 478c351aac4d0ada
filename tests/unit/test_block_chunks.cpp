// SPDX-License-Identifier: Apache-2.0
// The per-parameter device kernels' chunked forms (impl/kernels/shampoo.hpp): BlockChunks' map
// (every chunk in its block, the chunks of a block covering it exactly, one chunk for an empty
// block), ChunkNorms with and without the partial sums against the one-team-per-block BlockNorms
// and a long-double sum of the same terms, and ChunkGraftScale against GraftScale bit for bit
// (the same ratio and product per element). Block sizes around the chunk of 4096 elements and
// the hard sizes (0, 1, 2, 3, 13). These kernels run where the fused host path cannot (KL,
// eigenvalue-corrected Shampoo and the other kinds on host spaces; every per-parameter step on a
// device), on every enabled execution space. In a Shampoo step: inverse factors in float for
// double parameters (per-parameter kernels, chunked norms, blocks of 1 to 3 chunks) against the
// same options in double throughout (the fused host path's or batched passes' norms).
#include <lather/impl/kernels/shampoo.hpp>
#include <lather/optimizers/shampoo.hpp>

#include <Kokkos_Core.hpp>

#include <doctest/doctest.h>

#include "exec_spaces.hpp"
#include "test_utils.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

namespace {

using lather::impl::kernels::multi_tensor_chunk_elements;

// Chunk c's block, first and end element, as BlockChunks::locate finds them on the space.
template <class M>
struct Locate {
  lather::impl::kernels::BlockChunks<M> map;
  Kokkos::View<std::int64_t* [3], M> located;
  KOKKOS_FUNCTION void operator()(std::int64_t c) const {
    std::int64_t b = 0, begin = 0, end = 0;
    map.locate(c, b, begin, end);
    located(c, 0) = b;
    located(c, 1) = begin;
    located(c, 2) = end;
  }
};

template <class T, class ExecSpace>
void impl_test_block_chunks(const std::vector<std::int64_t>& sizes) {
  using M = typename ExecSpace::memory_space;
  namespace K = lather::impl::kernels;
  const ExecSpace space;
  std::vector<std::int64_t> begins{0};
  for (const auto n : sizes) begins.push_back(begins.back() + n);
  const auto nb = static_cast<std::int64_t>(sizes.size());
  const std::int64_t total = begins.back();
  const std::vector<std::int64_t> chunk_begins = K::BlockChunks<M>::chunk_begins(begins);
  REQUIRE(chunk_begins.size() == begins.size());
  const std::int64_t chunks = chunk_begins.back();
  for (std::int64_t b = 0; b < nb; ++b) {
    const std::int64_t n = sizes[static_cast<std::size_t>(b)];
    CHECK(chunk_begins[static_cast<std::size_t>(b) + 1] - chunk_begins[static_cast<std::size_t>(b)] ==
          std::max<std::int64_t>(1, (n + multi_tensor_chunk_elements - 1) / multi_tensor_chunk_elements));
  }
  auto to_view = [](const char* label, const std::vector<std::int64_t>& v) {
    Kokkos::View<std::int64_t*, M> d(std::string(label), v.size());
    auto h = Kokkos::create_mirror_view(d);
    for (std::size_t i = 0; i < v.size(); ++i) h(i) = v[i];
    Kokkos::deep_copy(d, h);
    return d;
  };
  const auto block_begin = to_view("block_begin", begins), chunk_begin = to_view("chunk_begin", chunk_begins);
  const K::BlockChunks<M> map{block_begin, chunk_begin};

  // The map: chunk c's block and elements, read back.
  Kokkos::View<std::int64_t* [3], M> located("located", chunks);
  Kokkos::parallel_for(Kokkos::RangePolicy<ExecSpace, Kokkos::IndexType<std::int64_t>>(space, 0, chunks),
                       Locate<M>{map, located});
  const auto loc = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), located);
  std::int64_t c = 0;
  for (std::int64_t b = 0; b < nb; ++b) {
    const std::int64_t first = begins[static_cast<std::size_t>(b)], last = begins[static_cast<std::size_t>(b) + 1];
    std::int64_t next = first;
    do {  // block b's chunks in order, each up to a chunk long, together exactly [first, last)
      REQUIRE(c < chunks);
      CHECK(loc(c, 0) == b);
      CHECK(loc(c, 1) == next);
      CHECK(loc(c, 2) == std::min(next + multi_tensor_chunk_elements, last));
      next = loc(c, 2);
      ++c;
    } while (next < last);
  }
  CHECK(c == chunks);

  // Values: x in [-1, 1), a grafting state in (0, 1] (Adam's second moment), Adam's scalars.
  Kokkos::View<T*, M> x("x", std::max<std::int64_t>(total, 1)), v("v", std::max<std::int64_t>(total, 1));
  auto hx = Kokkos::create_mirror_view(x), hv = Kokkos::create_mirror_view(v);
  std::uint64_t bits = 0x9E3779B97F4A7C15ull;
  auto uniform = [&] {
    bits = bits * 6364136223846793005ull + 1442695040888963407ull;
    return static_cast<double>(bits >> 11) * 0x1.0p-53;
  };
  for (std::int64_t q = 0; q < total; ++q) {
    hx(q) = static_cast<T>(2 * uniform() - 1);
    hv(q) = static_cast<T>(1e-3 + uniform());
  }
  Kokkos::deep_copy(x, hx);
  Kokkos::deep_copy(v, hv);
  lather::GraftScalars<T> graft;
  graft.beta2 = T(0.999);
  graft.one_minus_beta2 = T(0.001);
  graft.bias_correction = T(0.25);
  graft.epsilon = T(1e-8);

  // Reference: the same terms (block_norm_term, in T) summed in long double.
  std::vector<long double> expected(static_cast<std::size_t>(2 * nb), 0.0L);
  for (std::int64_t b = 0; b < nb; ++b)
    for (std::int64_t q = begins[static_cast<std::size_t>(b)]; q < begins[static_cast<std::size_t>(b) + 1]; ++q) {
      expected[static_cast<std::size_t>(2 * b)] += K::block_norm_term(hx(q), hv(q), graft, true);
      expected[static_cast<std::size_t>(2 * b + 1)] += K::block_norm_term(hx(q), T(0), graft, false);
    }
  const bool direct = chunks == nb;
  Kokkos::View<double*, M> partials("partials", chunks);
  Kokkos::View<double**, M> norms("norms", nb, 2), reference("reference", nb, 2);
  auto chunked_norms = [&](int column, bool state) {
    Kokkos::parallel_for(Kokkos::TeamPolicy<ExecSpace>(space, static_cast<int>(chunks), Kokkos::AUTO),
                         K::ChunkNorms<T, M, ExecSpace>{map, x, state ? v : Kokkos::View<T*, M>(), partials, norms, column,
                                                        graft, state, direct});
    if (!direct)
      Kokkos::parallel_for(Kokkos::RangePolicy<ExecSpace, Kokkos::IndexType<std::int64_t>>(space, 0, nb),
                           K::ChunkNormSums<M>{chunk_begin, partials, norms, column});
  };
  chunked_norms(0, true);
  chunked_norms(1, false);
  for (int column = 0; column < 2; ++column)
    Kokkos::parallel_for(Kokkos::TeamPolicy<ExecSpace>(space, static_cast<int>(nb), Kokkos::AUTO),
                         K::BlockNorms<T, M, ExecSpace>{x, column == 0 ? v : Kokkos::View<T*, M>(), block_begin, reference,
                                                        column, graft, column == 0});
  const auto hn = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), norms);
  const auto hr = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), reference);
  // Double sums of at most 12289 nonnegative terms: relative error below n * 2^-53 < 2e-12.
  for (std::int64_t b = 0; b < nb; ++b)
    for (int column = 0; column < 2; ++column) {
      const long double e = expected[static_cast<std::size_t>(2 * b + column)];
      CAPTURE(b);
      CAPTURE(column);
      CHECK(std::abs(static_cast<long double>(hn(b, column)) - e) <= 2e-12L * e);
      CHECK(std::abs(static_cast<long double>(hr(b, column)) - e) <= 2e-12L * e);
      if (sizes[static_cast<std::size_t>(b)] == 0) CHECK(hn(b, column) == 0.0);
    }

  // The scale: the same bits as one team per block.
  Kokkos::View<T*, M> y("y", x.extent(0));
  Kokkos::deep_copy(y, x);
  Kokkos::parallel_for(Kokkos::TeamPolicy<ExecSpace>(space, static_cast<int>(chunks), Kokkos::AUTO),
                       K::ChunkGraftScale<T, M, ExecSpace>{map, y, norms});
  Kokkos::View<T*, M> z("z", x.extent(0));
  Kokkos::deep_copy(z, x);
  Kokkos::parallel_for(Kokkos::TeamPolicy<ExecSpace>(space, static_cast<int>(nb), Kokkos::AUTO),
                       K::GraftScale<T, M, ExecSpace>{z, block_begin, norms});
  const auto hy = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), y);
  const auto hz = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), z);
  std::int64_t differ = 0;
  for (std::int64_t q = 0; q < total; ++q) differ += hy(q) == hz(q) ? 0 : 1;
  CHECK(differ == 0);
  // And scaled at all: block 0's ratio applied to its first element.
  if (total > 0 && sizes[0] > 0) {
    const T ratio = K::graft_ratio<T>(hn(0, 0), hn(0, 1));
    CHECK(hy(0) == hx(0) * ratio);
  }
}

// Adam-grafted Shampoo whose inverse factors are float for double parameters (the per-parameter
// kernels: chunked norms and scale) against double throughout. The float roots move the
// direction by about float's epsilon relative, and grafting rescales it by norms of the same
// accuracy: agreement to 2e-5 of the largest update over 4 steps. A block norm missing a chunk
// (or a chunk scaled with another block's ratio) moves that block's update by tens of percent.
template <class ExecSpace>
void impl_test_chunked_norms_in_shampoo() {
  using M = typename ExecSpace::memory_space;
  using P = lather::TensorRef<double, M>;
  // (100, 90): one block of 9000 elements (3 chunks); (300, 50) at block size 128: two blocks of
  // 6400 (2 chunks) and one of 2200; (100,): one chunk.
  const std::vector<std::pair<int, int>> shapes{{100, 90}, {300, 50}, {100, 1}};
  auto run = [&]<class Precision>(Precision) {
    std::vector<Kokkos::View<double**, Kokkos::LayoutRight, M>> w, g;
    std::vector<P> params, grads;
    for (std::size_t i = 0; i < shapes.size(); ++i) {
      const auto [r, c] = shapes[i];
      w.emplace_back("w", r, c);
      g.emplace_back("g", r, c);
      params.push_back(lather::tensor_ref(w.back()));
      grads.push_back(lather::tensor_ref(g.back()));
      lather::test::from_host(params.back(), lather::test::random_values(static_cast<std::size_t>(r * c), 70 + static_cast<int>(i)));
    }
    const lather::ShampooOptions o{.lr = 0.01, .betas = {0.9, 0.999}, .epsilon = 1e-2, .max_preconditioner_dim = 128,
                                   .precondition_frequency = 1, .start_preconditioning_step = 1};
    lather::Shampoo<P, ExecSpace, lather::EigenRootInverse, lather::AdamGrafting, Precision> opt(params, o, {}, {});
    std::vector<std::vector<double>> before;
    for (const auto& p : params) before.push_back(lather::test::to_host(p));
    for (int t = 1; t <= 4; ++t) {
      for (std::size_t i = 0; i < shapes.size(); ++i)
        lather::test::from_host(grads[i], lather::test::random_values(static_cast<std::size_t>(shapes[i].first * shapes[i].second),
                                                                      200 + 10 * t + static_cast<int>(i)));
      opt.step(ExecSpace(), grads);
      CHECK(opt.last_step_info().grafted == false);
    }
    std::vector<std::vector<double>> moved;
    for (std::size_t i = 0; i < params.size(); ++i) {
      auto now = lather::test::to_host(params[i]);
      for (std::size_t k = 0; k < now.size(); ++k) now[k] -= before[i][k];
      moved.push_back(std::move(now));
    }
    return moved;
  };
  const auto mixed = run(lather::ShampooPrecision<double, float>{});
  const auto full = run(lather::ShampooPrecision<double>{});
  for (std::size_t i = 0; i < shapes.size(); ++i) {
    CAPTURE(i);
    double largest = 0, diff = 0;
    for (std::size_t k = 0; k < full[i].size(); ++k) {
      largest = std::max(largest, std::abs(full[i][k]));
      diff = std::max(diff, std::abs(mixed[i][k] - full[i][k]));
    }
    CHECK(largest > 1e-3);  // four steps of lr 0.01 moved the parameters
    CHECK(diff <= 2e-5 * largest);
  }
}

}  // namespace

TEST_CASE_TEMPLATE_DEFINE("Shampoo with float inverse factors for double parameters (chunked norms) agrees with double",
                          ExecSpace, chunked_norms_in_shampoo) {
  impl_test_chunked_norms_in_shampoo<ExecSpace>();
}
TEST_CASE_TEMPLATE_APPLY(chunked_norms_in_shampoo, lather_test_exec_spaces);

TEST_CASE_TEMPLATE_DEFINE("Per-parameter block norms and graft scale per chunk match one team per block", ExecSpace,
                          block_chunks) {
  // Blocks of several chunks and not (the partial sums), the hard sizes, an empty block.
  const std::vector<std::int64_t> mixed{1, 2, 3, 13, 4095, 4096, 4097, 0, 8192, 12289, 7};
  // Every block one chunk (direct: one kernel, no partial sums).
  const std::vector<std::int64_t> small{1, 2, 3, 13, 4096, 256};
  impl_test_block_chunks<float, ExecSpace>(mixed);
  impl_test_block_chunks<double, ExecSpace>(mixed);
  impl_test_block_chunks<float, ExecSpace>(small);
  impl_test_block_chunks<double, ExecSpace>(std::vector<std::int64_t>{13});
}
TEST_CASE_TEMPLATE_APPLY(block_chunks, lather_test_exec_spaces);
