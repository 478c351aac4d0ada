// SPDX-License-Identifier: Apache-2.0
// merge_small_dims and multi_dim_split against DistributedShampoo's documented results
// (distributed-shampoo-notes section 4 table, computed with the real functions).
#include <lather/layout/blocking.hpp>

#include <doctest/doctest.h>

#include <vector>

namespace {
using V = std::vector<std::int64_t>;
V merge(V shape, std::int64_t thr, std::int64_t target = 1) { return lather::merge_small_dims(shape, thr, target); }
}  // namespace

TEST_CASE("layout: merge_small_dims reproduces the reference table") {
  CHECK(merge({}, 1024) == V{1});
  CHECK(merge({64, 8}, 1024) == V{512});
  CHECK(merge({256}, 1024) == V{256});
  CHECK(merge({64, 3, 3, 3}, 1024) == V{64, 27});
  CHECK(merge({32, 3, 64, 64}, 8192) == V{96, 4096});
  CHECK(merge({32, 3, 64, 64}, 8192, 2) == V{96, 4096});
  CHECK(merge({32, 3, 64, 64}, 8192, 3) == V{32, 3, 4096});
  CHECK(merge({4096, 1024}, 1024) == V{4096, 1024});
  CHECK(merge({50257, 768}, 8192) == V{50257, 768});
  CHECK(merge({1, 1, 1}, 1024) == V{1});
  CHECK(merge({1, 5, 1}, 1024) == V{5});
  CHECK(merge({3, 0, 2}, 1024) == V{0});
  CHECK(merge({3, 0, 2}, 1024, lather::unbounded) == V{0});
  CHECK(merge({1, 4, 1, 2}, 1024, lather::unbounded) == V{1, 4, 1, 2});  // no squeezing
  CHECK(merge({7, 5}, 8) == V{7, 5});
  CHECK(merge({10, 13}, 4) == V{10, 13});
  CHECK(merge({2, 3, 4}, lather::unbounded) == V{24});
  CHECK(merge({2, 3, 4}, 12) == V{2, 12});
  CHECK_THROWS_AS(merge({2}, 0), lather::invalid_argument);
}

TEST_CASE("layout: multi_dim_split is row-major over the chunk grid") {
  const auto blocks = lather::multi_dim_split(V{10, 13}, 4);
  REQUIRE(blocks.size() == 12);  // 3 x 4 chunks
  CHECK(blocks[0].offset == V{0, 0});
  CHECK(blocks[0].extent == V{4, 4});
  CHECK(blocks[3].offset == V{0, 12});
  CHECK(blocks[3].extent == V{4, 1});
  CHECK(blocks[4].offset == V{4, 0});
  CHECK(blocks[11].extent == V{2, 1});
  std::int64_t total = 0;
  for (const auto& b : blocks) total += b.numel();
  CHECK(total == 130);
  const auto whole = lather::multi_dim_split(V{50257, 768}, 8192);
  REQUIRE(whole.size() == 7);
  CHECK(whole[6].extent == V{1105, 768});
  CHECK(lather::multi_dim_split(V{5}, lather::unbounded).size() == 1);
  const lather::BlockLayout layout(V{10, 1, 13}, 4, 1);
  CHECK(layout.merged_shape == V{10, 13});
  CHECK(layout.blocks.size() == 12);
  CHECK(layout.block_begin[1] == 16);
  CHECK(layout.numel() == 130);
}
