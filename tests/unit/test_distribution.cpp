// SPDX-License-Identifier: Apache-2.0
// Distributed Shampoo's geometry and arithmetic without MPI: the LPT block assignment and costs
// (hand-computed), FSDP's split-tensor-block recovery (hand-computed cases of notes section 6.2),
// and the bf16 / fp16 conversions against Eigen's round-to-nearest-even types on every half value,
// every tie between neighbouring halves and a million random floats.
#include <lather/distributed/shampoo_distribution.hpp>

#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <fenv.h>
#include <limits>
#include <random>
#include <vector>

#if __has_include(<Eigen/Core>)
#include <Eigen/Core>
#define LATHER_TEST_HAVE_EIGEN 1
#endif

namespace {
using V = std::vector<std::int64_t>;
struct Piece {
  std::int64_t offset;
  V shape;
  bool operator==(const Piece&) const = default;
};
std::vector<Piece> pieces(const V& shape, std::int64_t start, std::int64_t end) {
  std::vector<Piece> out;
  for (const auto& p : lather::impl::recover_shard_pieces(shape, start, end)) out.push_back({p.offset, p.shape});
  return out;
}
}  // namespace

TEST_CASE("distribution: LPT assignment and costs match the reference's rule by hand") {
  using lather::impl::assign_blocks_lpt;
  // Sorted: 192 (block 3), 128 (1), then the 64s in order (0, 2, 4); ties go to the lower rank.
  CHECK(assign_blocks_lpt({64, 128, 64, 192, 64}, 2) == std::vector<int>{1, 1, 0, 0, 1});
  CHECK(assign_blocks_lpt({64, 128, 64, 192, 64}, 1) == std::vector<int>{0, 0, 0, 0, 0});
  CHECK(assign_blocks_lpt({5, 5, 5}, 4) == std::vector<int>{0, 1, 2});
  CHECK(assign_blocks_lpt({}, 3).empty());
  CHECK_THROWS_AS((void)assign_blocks_lpt({1}, 0), lather::invalid_argument);
  CHECK(lather::impl::aligned_bytes(7, 4) == 64);
  CHECK(lather::impl::aligned_bytes(16, 4) == 64);
  CHECK(lather::impl::aligned_bytes(17, 4) == 128);
  CHECK(lather::impl::aligned_bytes(33, 2) == 128);
  CHECK(lather::impl::block_cost(lather::AlignedMemoryCostModel{}, {3, 5}, 4) == 64.0);
  // max(20, 1 + 3^2) + max(20, 1 + 5^2) = 20 + 26
  CHECK(lather::impl::block_cost(lather::PolynomialComputationalCostModel{{1, 0, 1}, 20}, {3, 5}, 4) == 46.0);
  CHECK(lather::communication_bytes(lather::CommunicationDtype::parameter, 8) == 8);
  CHECK(lather::communication_bytes(lather::CommunicationDtype::float32, 8) == 4);
  CHECK(lather::communication_bytes(lather::CommunicationDtype::bfloat16, 4) == 2);
}

TEST_CASE("distribution: split-tensor-block recovery cuts flat ranges into whole tensors") {
  // (4, 6), [3, 21): the rest of row 0, rows 1-2 whole, the start of row 3.
  CHECK(pieces({4, 6}, 3, 21) == std::vector<Piece>{{0, {3}}, {3, {2, 6}}, {15, {3}}});
  // Inside one row of every leading dimension: one 1-D piece.
  CHECK(pieces({2, 3, 4}, 5, 7) == std::vector<Piece>{{0, {2}}});
  // [4, 24) of (2, 3, 4): rows 1-2 of the first matrix, then the whole second one.
  CHECK(pieces({2, 3, 4}, 4, 24) == std::vector<Piece>{{0, {2, 4}}, {8, {1, 3, 4}}});
  // Rounded centre empty (start and end in neighbouring rows): left and right parts only.
  CHECK(pieces({2, 4}, 2, 6) == std::vector<Piece>{{0, {2}}, {2, {2}}});
  // Aligned: one piece of whole rows; the whole tensor.
  CHECK(pieces({8, 4}, 8, 16) == std::vector<Piece>{{0, {2, 4}}});
  CHECK(pieces({8, 4}, 0, 32) == std::vector<Piece>{{0, {8, 4}}});
  CHECK(pieces({7}, 2, 5) == std::vector<Piece>{{0, {3}}});
  CHECK(pieces({4, 6}, 5, 5).empty());
  CHECK(pieces({}, 0, 1) == std::vector<Piece>{{0, {}}});
  // The pieces tile the range exactly, in order, for every range of a 3-D tensor.
  const V shape{3, 4, 5};
  for (std::int64_t s = 0; s <= 60; ++s)
    for (std::int64_t e = s; e <= 60; ++e) {
      std::int64_t at = 0;
      for (const auto& p : pieces(shape, s, e)) {
        CHECK(p.offset == at);
        std::int64_t n = 1;
        for (auto x : p.shape) n *= x;
        at += n;
        // A piece is whole rows: its trailing dimensions are the tensor's.
        for (std::size_t k = 1; k < p.shape.size(); ++k) CHECK(p.shape[k] == shape[shape.size() - p.shape.size() + k]);
      }
      CHECK(at == e - s);
    }
}

#ifdef LATHER_TEST_HAVE_EIGEN
TEST_CASE("distribution: bf16 and fp16 conversions round to nearest even like Eigen's types") {
  using lather::impl::from_bf16;
  using lather::impl::from_fp16;
  using lather::impl::to_bf16;
  using lather::impl::to_fp16;
  // The probes include signalling NaNs: the harness's FE_INVALID trap stays off in this case.
  const int traps = fegetexcept();
  fedisableexcept(FE_ALL_EXCEPT);
  auto bits = [](float f) {
    std::uint32_t u;
    std::memcpy(&u, &f, 4);
    return u;
  };
  int bad = 0;
  std::vector<float> probes;
  for (std::uint32_t h = 0; h < 65536; ++h) {
    const auto hb = static_cast<std::uint16_t>(h);
    const float want = static_cast<float>(Eigen::numext::bit_cast<Eigen::half>(hb));
    const float got = from_fp16(hb);
    if (std::isnan(want) ? !std::isnan(got) : bits(want) != bits(got)) ++bad;
    const float bwant = static_cast<float>(Eigen::numext::bit_cast<Eigen::bfloat16>(hb));
    const float bgot = from_bf16(hb);
    if (std::isnan(bwant) ? !std::isnan(bgot) : bits(bwant) != bits(bgot)) ++bad;
    if (!std::isnan(want)) probes.push_back(want);
    if (!std::isnan(bwant)) probes.push_back(bwant);
  }
  CHECK(bad == 0);
  // Ties between neighbouring halves / bfloat16s and their neighbours.
  const std::size_t exact = probes.size();
  for (std::size_t k = 0; k < exact; ++k) {
    const float f = probes[k];
    probes.push_back(std::nextafter(f, std::numeric_limits<float>::infinity()));
    probes.push_back(std::nextafter(f, -std::numeric_limits<float>::infinity()));
    if (k + 1 < exact && std::isfinite(f) && std::isfinite(probes[k + 1])) probes.push_back((f + probes[k + 1]) / 2);
  }
  std::mt19937 rng(7);
  for (int k = 0; k < 1000000; ++k) {
    const auto u = static_cast<std::uint32_t>(rng());
    float f;
    std::memcpy(&f, &u, 4);
    probes.push_back(f);
  }
  for (float f : {0.0f, -0.0f, 65504.0f, 65519.99f, 65520.0f, 1e-8f, 2.9802322e-8f, 2.9802326e-8f,
                  std::numeric_limits<float>::infinity(), std::numeric_limits<float>::denorm_min(),
                  std::numeric_limits<float>::max(), std::numeric_limits<float>::quiet_NaN()})
    probes.push_back(f);
  int bad_fp16 = 0, bad_bf16 = 0;
  for (float f : probes) {
    const std::uint16_t want = Eigen::numext::bit_cast<std::uint16_t>(Eigen::half(f));
    const std::uint16_t got = to_fp16(f);
    const bool nan = std::isnan(f);
    if (nan ? !std::isnan(from_fp16(got)) : want != got) {
      if (bad_fp16++ < 5) MESSAGE("fp16 of " << f << ": got " << got << ", Eigen " << want);
    }
    const std::uint16_t bwant = Eigen::numext::bit_cast<std::uint16_t>(Eigen::bfloat16(f));
    const std::uint16_t bgot = to_bf16(f);
    if (nan ? !std::isnan(from_bf16(bgot)) : bwant != bgot) {
      if (bad_bf16++ < 5) MESSAGE("bf16 of " << f << ": got " << bgot << ", Eigen " << bwant);
    }
  }
  INFO(probes.size() << " values");
  CHECK(bad_fp16 == 0);
  CHECK(bad_bf16 == 0);
  feenableexcept(traps);
}
#endif
