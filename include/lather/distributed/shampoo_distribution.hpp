// SPDX-License-Identifier: Apache-2.0
/// \file
/// \brief How Shampoo is spread over ranks (DistributedShampoo's distributors, notes section 6):
/// the options (`ShampooDistributedOptions`), block ownership by the greedy longest-processing-time
/// rule, the aligned all-gather buffer layout, FSDP's split-tensor-block recovery and the
/// communication dtypes (bf16 / fp16 conversions with round-to-nearest-even, usable in kernels).
/// Pure geometry and arithmetic: the collectives are the communicator's.
#ifndef LATHER_DISTRIBUTED_SHAMPOO_DISTRIBUTION_HPP
#define LATHER_DISTRIBUTED_SHAMPOO_DISTRIBUTION_HPP

#include <lather/error.hpp>

#include <Kokkos_Core.hpp>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <functional>
#include <numeric>
#include <queue>
#include <string>
#include <utility>
#include <variant>
#include <vector>

namespace lather {

/// How Shampoo's work and state are spread over ranks.
enum class ShampooDistributionMode {
  single,   ///< every rank computes everything (SingleDeviceDistributedConfig; the default)
  ddp,      ///< ZeRO-1: full gradients on every rank, blocks owned by ranks, one all-gather (DDPDistributedConfig)
  sharded,  ///< FSDP: each rank holds flat ranges of parameters and preconditions its pieces (FSDPDistributedConfig)
  hsdp,     ///< sharded inside a group, DDP across replicas (HSDPDistributedConfig)
};

/// The type updates (or parameters) travel in through the all-gather.
enum class CommunicationDtype {
  parameter,  ///< the parameters' own type (bitwise equal to one process for float and double)
  float32,    ///< DistributedShampoo's default (quantizes double parameters' updates)
  bfloat16,
  float16,
};

/// Bytes of one element of the communication dtype for parameters of `param_bytes` bytes.
[[nodiscard]] constexpr std::size_t communication_bytes(CommunicationDtype d, std::size_t param_bytes) noexcept {
  switch (d) {
    case CommunicationDtype::parameter: return param_bytes;
    case CommunicationDtype::float32: return 4;
    default: return 2;
  }
}

/// DistributedShampoo's default load-balancing cost: a block's size in bytes of the
/// communication dtype, rounded up to `alignment` (AlignedMemoryCostModel).
struct AlignedMemoryCostModel {
  std::int64_t alignment = 64;
};
/// PolynomialComputationalCostModel: cost = sum over the block's dimensions of
/// max(min_cost, c0 + c1 d + c2 d^2 + ...), coefficients lowest degree first (e.g. {0, 0, 0, 1}
/// for the d^3 of an eigendecomposition).
struct PolynomialComputationalCostModel {
  std::vector<double> coefficients{0.0, 0.0, 0.0, 1.0};
  double min_cost = 0.0;
};
using ShampooCostModel = std::variant<AlignedMemoryCostModel, PolynomialComputationalCostModel>;

/// FSDP metadata of one parameter (FSDPParameterMetadata): this rank holds the flat range
/// [start, end) of the row-major parameter of shape `global_shape`, as a 1-D tensor.
struct ShampooShard {
  std::vector<std::int64_t> global_shape;
  std::int64_t start = 0;
  std::int64_t end = 0;
};

/// \brief Options of Shampoo's distributed modes (DDPDistributedConfig, FSDPDistributedConfig,
/// HSDPDistributedConfig). docs/distributed-shampoo.md explains each.
struct ShampooDistributedOptions {
  ShampooDistributionMode mode = ShampooDistributionMode::single;
  CommunicationDtype communication_dtype = CommunicationDtype::parameter;
  /// Ranks per group that share the blocks; every group computes all blocks. -1: the whole
  /// communicator. Must divide the communicator's size.
  int num_trainers_per_group = -1;
  /// Gather the updated parameters instead of the updates (quantizes the weights themselves
  /// with bf16/fp16: the reference recommends fp16 only with false).
  bool communicate_params = false;
  ShampooCostModel cost_model = AlignedMemoryCostModel{};
  /// sharded / hsdp: one entry per parameter (all groups, in order).
  std::vector<ShampooShard> shards{};
};

namespace impl {

/// 64-byte-aligned size in bytes of `numel` elements of `bytes` each.
[[nodiscard]] constexpr std::int64_t aligned_bytes(std::int64_t numel, std::size_t bytes, std::int64_t alignment = 64) {
  const std::int64_t b = numel * static_cast<std::int64_t>(bytes);
  return (b + alignment - 1) / alignment * alignment;
}

/// The cost of a block of extents `extent` under `model` (elements of `bytes` bytes).
[[nodiscard]] inline double block_cost(const ShampooCostModel& model, const std::vector<std::int64_t>& extent,
                                       std::size_t bytes) {
  if (const auto* a = std::get_if<AlignedMemoryCostModel>(&model)) {
    std::int64_t n = 1;
    for (auto e : extent) n *= e;
    return static_cast<double>(aligned_bytes(n, bytes, a->alignment));
  }
  const auto& p = std::get<PolynomialComputationalCostModel>(model);
  double cost = 0;
  for (auto d : extent) {
    double v = 0, x = 1;
    for (double c : p.coefficients) {
      v += c * x;
      x *= static_cast<double>(d);
    }
    cost += std::max(p.min_cost, v);
  }
  return cost;
}

/// \brief DistributedShampoo's greedy longest-processing-time assignment: blocks sorted by cost,
/// descending (stable), each given to the rank with the smallest load so far (ties: lower rank).
/// Returns the owner of every block.
[[nodiscard]] inline std::vector<int> assign_blocks_lpt(const std::vector<double>& costs, int ranks) {
  LATHER_THROW_IF(ranks < 1, "lather::assign_blocks_lpt: need at least one rank, got ", ranks);
  std::vector<std::size_t> order(costs.size());
  std::iota(order.begin(), order.end(), std::size_t{0});
  std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) { return costs[a] > costs[b]; });
  using Load = std::pair<double, int>;
  std::priority_queue<Load, std::vector<Load>, std::greater<>> heap;
  for (int r = 0; r < ranks; ++r) heap.emplace(0.0, r);
  std::vector<int> owner(costs.size(), 0);
  for (std::size_t b : order) {
    auto [load, r] = heap.top();
    heap.pop();
    owner[b] = r;
    heap.emplace(load + costs[b], r);
  }
  return owner;
}

/// One piece of a sharded parameter: elements [offset, offset + numel) of the rank's flat range,
/// a row-major tensor of `shape`.
struct ShardPiece {
  std::int64_t offset = 0;
  std::vector<std::int64_t> shape;
};

/// \brief FSDP's split-tensor-block recovery: the flat range [start, end) of a row-major tensor
/// of `shape` cut into pieces that are whole tensors (notes section 6.2), in flat order.
[[nodiscard]] inline std::vector<ShardPiece> recover_shard_pieces(const std::vector<std::int64_t>& shape,
                                                                  std::int64_t start, std::int64_t end) {
  std::vector<ShardPiece> out;
  if (start >= end) return out;
  if (shape.empty()) {  // a scalar held whole
    out.push_back({0, {}});
    return out;
  }
  const std::int64_t base = start;
  std::function<void(std::int64_t, std::int64_t, std::size_t)> cut = [&](std::int64_t s, std::int64_t e, std::size_t d) {
    if (s >= e) return;
    std::int64_t rest = 1;
    for (std::size_t j = d + 1; j < shape.size(); ++j) rest *= shape[j];
    if (rest == 0) return;
    const std::int64_t cs = (s + rest - 1) / rest * rest, ce = e / rest * rest;
    if (cs > ce) {  // inside one row of dimension d
      cut(s, e, d + 1);
      return;
    }
    cut(s, cs, d + 1);
    if (cs < ce) {
      ShardPiece p{cs - base, {(ce - cs) / rest}};
      for (std::size_t j = d + 1; j < shape.size(); ++j) p.shape.push_back(shape[j]);
      out.push_back(std::move(p));
    }
    cut(ce, e, d + 1);
  };
  cut(start, end, 0);
  return out;
}

// ---- communication dtypes: round-to-nearest-even conversions, callable in kernels -----------

struct bf16_bits {
  std::uint16_t bits;
};
struct fp16_bits {
  std::uint16_t bits;
};

// hipcc (clang) treats std::memcpy as host-only in a __host__ __device__ function; its
// __builtin_memcpy is allowed on both sides. nvcc and host compilers accept std::memcpy.
KOKKOS_INLINE_FUNCTION std::uint32_t float_bits(float f) {
  std::uint32_t u;
#if defined(__HIP__)
  __builtin_memcpy(&u, &f, sizeof u);
#else
  std::memcpy(&u, &f, sizeof u);
#endif
  return u;
}
KOKKOS_INLINE_FUNCTION float bits_float(std::uint32_t u) {
  float f;
#if defined(__HIP__)
  __builtin_memcpy(&f, &u, sizeof f);
#else
  std::memcpy(&f, &u, sizeof f);
#endif
  return f;
}

/// float -> bfloat16, round to nearest even (NaN stays a quiet NaN), as torch's .to(bfloat16).
KOKKOS_INLINE_FUNCTION std::uint16_t to_bf16(float f) {
  std::uint32_t u = float_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<std::uint16_t>((u >> 16) | 0x40u);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<std::uint16_t>(u >> 16);
}
KOKKOS_INLINE_FUNCTION float from_bf16(std::uint16_t h) { return bits_float(static_cast<std::uint32_t>(h) << 16); }

/// float -> IEEE half, round to nearest even (subnormals, overflow to Inf, NaN kept).
KOKKOS_INLINE_FUNCTION std::uint16_t to_fp16(float f) {
  const std::uint32_t x = float_bits(f);
  const std::uint32_t sign = (x >> 16) & 0x8000u, a = x & 0x7fffffffu;
  if (a >= 0x7f800000u) return static_cast<std::uint16_t>(sign | (a > 0x7f800000u ? 0x7e00u : 0x7c00u));
  if (a >= 0x477ff000u) return static_cast<std::uint16_t>(sign | 0x7c00u);  // >= 65520 rounds to Inf
  if (a <= 0x33000000u) return static_cast<std::uint16_t>(sign);            // <= 2^-25 rounds to 0
  const std::uint32_t e = a >> 23, m = a & 0x7fffffu;
  if (a < 0x38800000u) {  // a half subnormal: units of 2^-24
    const std::uint32_t mant = m | 0x800000u, shift = 126u - e;
    std::uint32_t r = mant >> shift;
    const std::uint32_t rem = mant & ((1u << shift) - 1u), half = 1u << (shift - 1u);
    if (rem > half || (rem == half && (r & 1u))) ++r;
    return static_cast<std::uint16_t>(sign | r);
  }
  std::uint32_t h = ((e - 112u) << 10) | (m >> 13);
  const std::uint32_t rem = m & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) ++h;  // a carry moves into the exponent, as it should
  return static_cast<std::uint16_t>(sign | h);
}
KOKKOS_INLINE_FUNCTION float from_fp16(std::uint16_t h) {
  const std::uint32_t sign = static_cast<std::uint32_t>(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
  if (e == 0) {
    const float v = static_cast<float>(m) * 5.9604644775390625e-8f;  // m * 2^-24, exact
    return bits_float(float_bits(v) | sign);
  }
  if (e == 31) return bits_float(sign | 0x7f800000u | (m << 13));
  return bits_float(sign | ((e + 112u) << 23) | (m << 13));
}

/// Conversions between a parameter type T and a communication element C (T itself, float,
/// bf16_bits, fp16_bits). Doubles go through float for the 16-bit types, as torch's .to() does.
template <class C, class T>
KOKKOS_INLINE_FUNCTION C to_comm(T v) {
  if constexpr (std::is_same_v<C, bf16_bits>) return C{to_bf16(static_cast<float>(v))};
  else if constexpr (std::is_same_v<C, fp16_bits>) return C{to_fp16(static_cast<float>(v))};
  else return static_cast<C>(v);
}
template <class T, class C>
KOKKOS_INLINE_FUNCTION T from_comm(C v) {
  if constexpr (std::is_same_v<C, bf16_bits>) return static_cast<T>(from_bf16(v.bits));
  else if constexpr (std::is_same_v<C, fp16_bits>) return static_cast<T>(from_fp16(v.bits));
  else return static_cast<T>(v);
}

}  // namespace impl
}  // namespace lather

#endif
