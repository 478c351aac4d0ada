// SPDX-License-Identifier: Apache-2.0
/// \file
/// \brief `Sharding`: which part of a parameter this rank holds. A tensor-parallel (TP) split of
/// one dimension over a TP group, and/or a ZeRO flat range [begin, end) (with padding) of the
/// TP-local tensor over a data-parallel group. Pure geometry, no communication: the distributed
/// optimizers (Adafactor, CAME, GaLore, LAMB) and Shampoo's sharded mode read it.
#ifndef LATHER_LAYOUT_SHARDING_HPP
#define LATHER_LAYOUT_SHARDING_HPP

#include <lather/error.hpp>

#include <algorithm>
#include <cstdint>
#include <functional>
#include <numeric>
#include <string>
#include <vector>

namespace lather {

/// \brief The part of one parameter a rank holds.
///
/// The global tensor (shape `global_shape`, row-major) is first split evenly along `tp_dim` over
/// `tp_size` ranks (Megatron / ColossalAI "Linear1D" layers: `tp_dim` 0 of a weight is a
/// column-parallel layer's split of out_features, 1 a row-parallel layer's split of in_features).
/// The TP-local tensor is then optionally flattened and cut into a contiguous range
/// [flat_begin, flat_end) (ZeRO; ColossalAI pads the flat tensor to a multiple of the data-parallel
/// size and gives rank r chunk r, so flat_end may exceed the TP-local element count: those
/// elements are padding).
///
/// The rank's parameter tensor holds either the TP-local tensor (no ZeRO; any shape with the
/// TP-local element count) or the flat range (ZeRO; 1-D, with or without its padding elements).
struct Sharding {
  std::vector<std::int64_t> global_shape;
  int tp_dim = -1;  ///< the dimension split over the TP group; -1: replicated over it
  int tp_rank = 0;
  int tp_size = 1;
  bool zero = false;            ///< a flat range of the TP-local tensor
  std::int64_t flat_begin = 0;  ///< ZeRO range over the TP-local tensor, row-major
  std::int64_t flat_end = 0;    ///< may exceed local_numel(): padding

  // ---- factories ---------------------------------------------------------------------------

  /// The whole tensor (single device, or replicated on every rank).
  [[nodiscard]] static Sharding whole(std::vector<std::int64_t> shape) {
    Sharding s;
    s.global_shape = std::move(shape);
    return s;
  }
  /// Even split of dimension `dim` over `tp_size` ranks; this is rank `tp_rank`'s slice.
  [[nodiscard]] static Sharding tensor_parallel(std::vector<std::int64_t> shape, int dim, int tp_rank, int tp_size) {
    Sharding s = whole(std::move(shape));
    s.tp_dim = dim;
    s.tp_rank = tp_rank;
    s.tp_size = tp_size;
    s.validate();
    return s;
  }
  /// ZeRO (ColossalAI's LowLevelZero geometry): the (TP-local) tensor flattened, padded to a
  /// multiple of `dp_size`, rank `dp_rank` holding chunk `dp_rank` of ceil(numel / dp_size).
  [[nodiscard]] static Sharding zero_chunk(Sharding tp_local, int dp_rank, int dp_size) {
    LATHER_THROW_IF(dp_size < 1 || dp_rank < 0 || dp_rank >= dp_size, "lather::Sharding::zero_chunk: dp_rank ",
                    dp_rank, " is not a rank of a group of ", dp_size);
    const std::int64_t n = tp_local.local_numel();
    const std::int64_t chunk = (n + dp_size - 1) / dp_size;
    tp_local.zero = true;
    tp_local.flat_begin = chunk * dp_rank;
    tp_local.flat_end = chunk * (dp_rank + 1);
    tp_local.validate();
    return tp_local;
  }
  /// ZeRO chunk of an unsplit tensor.
  [[nodiscard]] static Sharding zero_chunk(std::vector<std::int64_t> shape, int dp_rank, int dp_size) {
    return zero_chunk(whole(std::move(shape)), dp_rank, dp_size);
  }
  /// An arbitrary flat range [begin, end) of the (TP-local) tensor, e.g. an FSDP shard.
  [[nodiscard]] static Sharding flat_range(Sharding tp_local, std::int64_t begin, std::int64_t end) {
    tp_local.zero = true;
    tp_local.flat_begin = begin;
    tp_local.flat_end = end;
    tp_local.validate();
    return tp_local;
  }

  // ---- geometry ----------------------------------------------------------------------------

  [[nodiscard]] int rank() const noexcept { return static_cast<int>(global_shape.size()); }
  [[nodiscard]] std::int64_t global_numel() const noexcept { return product(global_shape); }
  /// The TP-local shape (the global shape with `tp_dim` divided by `tp_size`).
  [[nodiscard]] std::vector<std::int64_t> local_shape() const {
    std::vector<std::int64_t> s = global_shape;
    if (tp_dim >= 0 && tp_dim < rank()) s[static_cast<std::size_t>(tp_dim)] /= tp_size;
    return s;
  }
  /// The TP-local element count. Computed in place, not from local_shape(): end() and
  /// valid_numel() call it on every step, which must not allocate.
  [[nodiscard]] std::int64_t local_numel() const {
    std::int64_t n = 1;
    for (std::size_t k = 0; k < global_shape.size(); ++k)
      n *= static_cast<int>(k) == tp_dim ? global_shape[k] / tp_size : global_shape[k];
    return n;
  }
  /// Offset of this rank's TP slice along tp_dim (0 when not split).
  [[nodiscard]] std::int64_t tp_offset() const {
    if (!tp_split()) return 0;
    return global_shape[static_cast<std::size_t>(tp_dim)] / tp_size * tp_rank;
  }
  [[nodiscard]] bool tp_split() const noexcept { return tp_dim >= 0 && tp_size > 1; }
  /// First TP-local flat index this rank holds.
  [[nodiscard]] std::int64_t begin() const { return zero ? flat_begin : 0; }
  /// One past the last real (non-padding) TP-local flat index this rank holds.
  [[nodiscard]] std::int64_t end() const {
    return zero ? std::clamp(flat_end, flat_begin, std::max(flat_begin, local_numel())) : local_numel();
  }
  /// Real elements this rank holds (padding excluded).
  [[nodiscard]] std::int64_t valid_numel() const { return end() - begin(); }
  /// Elements of a ZeRO chunk including padding (local_numel() without ZeRO).
  [[nodiscard]] std::int64_t stored_numel() const { return zero ? flat_end - flat_begin : local_numel(); }
  /// Whether a tensor of `numel` elements can hold this shard (with or without its padding).
  [[nodiscard]] bool accepts_numel(std::int64_t numel) const {
    return numel == stored_numel() || numel == valid_numel();
  }

  /// "(8, 12) split along dim 0 over 4 ranks (rank 1), ZeRO range [0, 24)".
  [[nodiscard]] std::string describe() const {
    std::string s = "(";
    for (std::size_t k = 0; k < global_shape.size(); ++k)
      s += (k ? ", " : "") + std::to_string(global_shape[k]);
    s += global_shape.size() == 1 ? ",)" : ")";
    if (tp_split())
      s += " split along dim " + std::to_string(tp_dim) + " over " + std::to_string(tp_size) + " ranks (rank " +
           std::to_string(tp_rank) + ")";
    if (zero) s += ", ZeRO range [" + std::to_string(flat_begin) + ", " + std::to_string(flat_end) + ")";
    return s;
  }

  /// Throws lather::invalid_argument naming what is inconsistent.
  void validate() const {
    for (auto e : global_shape)
      LATHER_THROW_IF(e < 0, "lather::Sharding: negative extent in global shape ", describe());
    LATHER_THROW_IF(tp_size < 1 || tp_rank < 0 || tp_rank >= tp_size, "lather::Sharding: tp_rank ", tp_rank,
                    " is not a rank of a tensor-parallel group of ", tp_size);
    LATHER_THROW_IF(tp_dim < -1 || tp_dim >= rank(), "lather::Sharding: tp_dim ", tp_dim,
                    " is not a dimension of the parameter of shape ", describe(), " (use -1 for no split)");
    LATHER_THROW_IF(tp_dim >= 0 && global_shape[static_cast<std::size_t>(tp_dim)] % tp_size != 0,
                    "lather::Sharding: dimension ", tp_dim, " of ", describe(), " does not divide evenly over ",
                    tp_size, " tensor-parallel ranks; pad the layer so it does");
    LATHER_THROW_IF(zero && (flat_begin < 0 || flat_end < flat_begin), "lather::Sharding: invalid ZeRO range [",
                    flat_begin, ", ", flat_end, ") of ", describe());
  }

  friend bool operator==(const Sharding&, const Sharding&) = default;

 private:
  static std::int64_t product(const std::vector<std::int64_t>& s) {
    return std::accumulate(s.begin(), s.end(), std::int64_t{1}, std::multiplies<>());
  }
};

}  // namespace lather

#endif
