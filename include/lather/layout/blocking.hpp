// SPDX-License-Identifier: Apache-2.0
/// \file
/// \brief Shampoo's tensor layout: `merge_small_dims` and `multi_dim_split`, pure functions on
/// shapes with DistributedShampoo's exact rules, and `BlockLayout`, the blocks of one parameter.
#ifndef LATHER_LAYOUT_BLOCKING_HPP
#define LATHER_LAYOUT_BLOCKING_HPP

#include <lather/error.hpp>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <span>
#include <vector>

namespace lather {

/// "No limit" for `max_preconditioner_dim` and `target_parameter_dimensionality` (Python's
/// math.inf in DistributedShampoo).
inline constexpr std::int64_t unbounded = std::numeric_limits<std::int64_t>::max();

/// \brief DistributedShampoo's `merge_small_dims(shape, threshold, target)`.
///
/// 1. A shape containing 0 becomes (0,). 2. With an unbounded target the shape is returned as is.
/// 3. Size-1 dimensions are dropped ((1,) if nothing is left). 4. Walking from the last dimension
/// to the first, a dimension is merged into the accumulated one while more than `target`
/// dimensions would otherwise remain and the product stays <= `threshold`.
[[nodiscard]] inline std::vector<std::int64_t> merge_small_dims(std::span<const std::int64_t> shape,
                                                                std::int64_t threshold,
                                                                std::int64_t target = 1) {
  LATHER_THROW_IF(threshold < 1, "lather::merge_small_dims: threshold (max_preconditioner_dim) must be >= 1, got ",
                  threshold);
  LATHER_THROW_IF(target < 1, "lather::merge_small_dims: target_parameter_dimensionality must be >= 1, got ",
                  target);
  if (std::find(shape.begin(), shape.end(), 0) != shape.end()) return {0};
  if (target == unbounded) return {shape.begin(), shape.end()};
  std::vector<std::int64_t> squeezed;  // reversed, size-1 dims dropped
  for (auto it = shape.rbegin(); it != shape.rend(); ++it)
    if (*it != 1) squeezed.push_back(*it);
  if (squeezed.empty()) squeezed.push_back(1);
  std::vector<std::int64_t> merged{squeezed[0]};
  const auto n = static_cast<std::int64_t>(squeezed.size());
  for (std::int64_t i = 1; i < n; ++i) {
    const std::int64_t d = squeezed[static_cast<std::size_t>(i)];
    const std::int64_t remaining = n - i;
    // merged.back() * d <= threshold, without overflow
    const bool fits = merged.back() <= threshold / d;
    if (static_cast<std::int64_t>(merged.size()) + remaining > target && fits)
      merged.back() *= d;
    else
      merged.push_back(d);
  }
  std::reverse(merged.begin(), merged.end());
  return merged;
}

/// One block: its position and extents in the (merged) shape.
struct BlockSpec {
  std::vector<std::int64_t> offset;
  std::vector<std::int64_t> extent;
  [[nodiscard]] std::int64_t numel() const {
    std::int64_t n = 1;
    for (auto e : extent) n *= e;
    return n;
  }
};

/// \brief DistributedShampoo's `multi_dim_split`: every dimension cut into chunks of
/// `block_size` (the last one smaller), blocks in row-major order over the chunk grid.
[[nodiscard]] inline std::vector<BlockSpec> multi_dim_split(std::span<const std::int64_t> shape,
                                                            std::int64_t block_size) {
  LATHER_THROW_IF(block_size < 1, "lather::multi_dim_split: block size must be >= 1, got ", block_size);
  std::vector<BlockSpec> blocks{BlockSpec{}};
  for (std::size_t d = 0; d < shape.size(); ++d) {
    std::vector<BlockSpec> next;
    const std::int64_t n = shape[d];
    for (const auto& b : blocks) {
      if (n == 0) {  // torch.split of an empty dimension yields one empty chunk
        BlockSpec c = b;
        c.offset.push_back(0);
        c.extent.push_back(0);
        next.push_back(std::move(c));
        continue;
      }
      for (std::int64_t start = 0; start < n; start = (n - start > block_size) ? start + block_size : n) {
        BlockSpec c = b;
        c.offset.push_back(start);
        c.extent.push_back(std::min(block_size, n - start));
        next.push_back(std::move(c));
      }
    }
    blocks = std::move(next);
  }
  return blocks;
}

/// \brief The blocks of one parameter: its merged shape, the blocks in row-major order, and
/// where each block starts in lather's blocked element order (each block contiguous, row-major
/// inside the block, blocks one after another).
struct BlockLayout {
  std::vector<std::int64_t> shape;         ///< the parameter's shape
  std::vector<std::int64_t> merged_shape;  ///< after merge_small_dims
  std::vector<BlockSpec> blocks;
  std::vector<std::int64_t> block_begin;   ///< blocks.size() + 1 prefix offsets

  BlockLayout() = default;
  BlockLayout(std::span<const std::int64_t> param_shape, std::int64_t max_preconditioner_dim,
              std::int64_t target_parameter_dimensionality)
      : shape(param_shape.begin(), param_shape.end()),
        merged_shape(merge_small_dims(param_shape, max_preconditioner_dim, target_parameter_dimensionality)),
        blocks(multi_dim_split(merged_shape, max_preconditioner_dim)) {
    block_begin.push_back(0);
    for (const auto& b : blocks) block_begin.push_back(block_begin.back() + b.numel());
  }
  [[nodiscard]] std::int64_t numel() const { return block_begin.back(); }
};

}  // namespace lather

#endif
