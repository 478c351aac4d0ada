// SPDX-License-Identifier: Apache-2.0
/// \file
/// \brief Private. Block-wise 8-bit quantization of optimizer states as in bitsandbytes (Dettmers
/// et al., "8-bit Optimizers via Block-wise Quantization", ICLR 2022): each block of `block_size`
/// consecutive elements stores its largest magnitude `absmax` as a float, and every element the
/// index (one byte) of the entry of a 256-value "dynamic" map nearest to x / absmax.
///
/// Round-trip error: with y = x / absmax and the nearest entry chosen,
/// |x - dequantize(quantize(x))| <= absmax * half_gap_at(map, y) <= absmax * max_half_gap(map),
/// up to the rounding of y and of map[c] * absmax in T (a few T ulps of absmax) and, for double
/// input, the rounding of absmax to float (half a float ulp of absmax).
///
/// Quirk kept from bitsandbytes: the signed map spans [-0.99296875, 1] (it has 1 but not -1), so
/// a block whose largest magnitude is negative gets that element back as -0.99296875 * absmax (an
/// error of exactly half the map's first gap), and quantizing the dequantized block again then
/// rescales it: dequantize(quantize(.)) is idempotent only for blocks whose dequantized largest
/// magnitude is absmax itself (always for the unsigned map, and when the signed block's largest
/// magnitude element is positive).
///
/// \code{.bib}
/// @inproceedings{dettmers2022optimizers,
///   title={8-bit Optimizers via Block-wise Quantization},
///   author={Dettmers, Tim and Lewis, Mike and Shleifer, Sam and Zettlemoyer, Luke},
///   booktitle={International Conference on Learning Representations}, year={2022}}
/// \endcode
#ifndef LATHER_IMPL_QUANTIZATION_HPP
#define LATHER_IMPL_QUANTIZATION_HPP

#include <lather/error.hpp>
#include <lather/impl/label.hpp>
#include <lather/impl/math.hpp>

#include <Kokkos_Core.hpp>

#include <algorithm>
#include <array>
#include <climits>
#include <cstdint>
#include <string>
#include <type_traits>

namespace lather::impl::quant {

/// The number of map entries: one byte per element.
inline constexpr int map_size = 256;
/// bitsandbytes' block size for optimizer states since 0.44 (2048 before).
inline constexpr std::int64_t default_block_size = 256;

/// \brief bitsandbytes' `create_dynamic_map(signed, max_exponent_bits=7, total_bits=8)`, sorted
/// ascending.
///
/// For i = 0..6: fraction_items = 2^i + 1 (signed) or 2^(i+1) + 1 (unsigned; bnb uses
/// non_sign_bits = total_bits - 1 in both cases, so the unsigned map spends the sign bit on twice
/// the fractions), boundaries = linspace(0.1, 1, fraction_items), and the means of adjacent
/// boundaries times 10^(i-6) are entries (and their negatives when signed); then 0 and 1. Both
/// maps have exactly 256 entries (127 + 127 + 2 and 254 + 2), so bnb's zero padding never applies.
///
/// Computed in double and rounded once to float. bnb computes in float32 through torch.linspace,
/// whose rounding depends on the torch version and its vectorized path: about a third of the
/// entries can differ from these in the last one or two float ulps.
inline std::array<float, map_size> dynamic_map(bool is_signed) {
  // 10^(i-6) as correctly rounded literals (Python's 10 ** -6 is the same double).
  constexpr double scale[7] = {1e-6, 1e-5, 1e-4, 1e-3, 1e-2, 1e-1, 1.0};
  std::array<float, map_size> map{};
  int count = 0;
  for (int i = 0; i < 7; ++i) {
    const int items = is_signed ? (1 << i) + 1 : (1 << (i + 1)) + 1;
    for (int k = 0; k + 1 < items; ++k) {
      const double lo = 0.1 + 0.9 * k / (items - 1), hi = 0.1 + 0.9 * (k + 1) / (items - 1);
      const double value = scale[i] * ((lo + hi) / 2.0);
      map[static_cast<std::size_t>(count++)] = static_cast<float>(value);
      if (is_signed) map[static_cast<std::size_t>(count++)] = static_cast<float>(-value);
    }
  }
  map[static_cast<std::size_t>(count++)] = 0.0f;
  map[static_cast<std::size_t>(count)] = 1.0f;
  std::sort(map.begin(), map.end());
  return map;
}

/// Largest (map[k+1] - map[k]) / 2 over adjacent entries: the bound on |y - nearest(y)| for every
/// y in [map[0], map[255]], hence on the round-trip error divided by absmax.
inline float max_half_gap(const std::array<float, map_size>& map) {
  float gap = 0.0f;
  for (std::size_t k = 0; k + 1 < map.size(); ++k) gap = std::max(gap, (map[k + 1] - map[k]) / 2.0f);
  return gap;
}

/// The largest |y' - nearest(y')| over the map interval that holds y: (map[k+1] - map[k]) / 2
/// for map[k] <= y <= map[k+1]; outside the map's range, the distance to the end entry (the
/// signed map's y = -1 is 0.00703125 below its first entry). In double, exact for float entries.
inline double half_gap_at(const std::array<float, map_size>& map, double y) {
  if (y <= double(map.front())) return double(map.front()) - y;
  if (y >= double(map.back())) return y - double(map.back());
  const auto upper =
      std::upper_bound(map.begin(), map.end(), y, [](double v, float e) { return v < double(e); });
  return (double(*upper) - double(*(upper - 1))) / 2.0;
}

/// \brief Index of the entry of the sorted `map` (256 floats) nearest to y.
///
/// Binary search for the last entry <= y, then the nearer of it and its successor with the
/// distances computed in T; a tie (as computed) goes to the lower entry, as do y below map[0]
/// (index 0) and NaN. Deterministic: the same y and map give the same index on every back end.
template <class T>
KOKKOS_INLINE_FUNCTION std::uint8_t nearest_code(const float* map, T y) {
  int lo = 0, hi = map_size;  // map[lo] <= y (or lo == 0) and map[hi] > y (or hi == 256)
  while (hi - lo > 1) {
    const int mid = (lo + hi) / 2;
    if (T(map[mid]) <= y)
      lo = mid;
    else
      hi = mid;
  }
  if (lo + 1 < map_size && T(map[lo + 1]) - y < y - T(map[lo])) ++lo;
  return static_cast<std::uint8_t>(lo);
}

/// Number of blocks of `block_size` covering n elements (the last may be partial).
inline std::int64_t num_blocks(std::int64_t n, std::int64_t block_size) {
  return (n + block_size - 1) / block_size;
}

namespace detail {
template <class T, class MemorySpace, class ExecSpace>
struct QuantizeBlocks {
  using member_type = typename Kokkos::TeamPolicy<ExecSpace>::member_type;
  const T* values;
  std::int64_t n, block_size;
  Kokkos::View<std::uint8_t*, MemorySpace> codes;
  Kokkos::View<float*, MemorySpace> absmax;
  Kokkos::View<const float[map_size], MemorySpace> map;
  KOKKOS_FUNCTION void operator()(const member_type& team) const {
    const std::int64_t b = team.league_rank();
    const std::int64_t begin = b * block_size, end = begin + block_size < n ? begin + block_size : n;
    // A maximum is exact in any order: the same absmax on every back end and team size.
    T block_max = T(0);
    Kokkos::parallel_reduce(
        Kokkos::TeamThreadRange(team, begin, end),
        [&](std::int64_t i, T& m) {
          const T a = math::abs(values[i]);
          if (m < a) m = a;
        },
        Kokkos::Max<T>(block_max));
    const float scale = static_cast<float>(block_max);
    Kokkos::single(Kokkos::PerTeam(team), [&]() { absmax(b) = scale; });
    const float* table = map.data();
    Kokkos::parallel_for(Kokkos::TeamThreadRange(team, begin, end), [&](std::int64_t i) {
      // Divide (not multiply by the reciprocal, as bnb does): |x| == absmax gives exactly +-1.
      const T y = scale == 0.0f ? T(0) : values[i] / T(scale);
      codes(i) = nearest_code(table, y);
    });
  }
};

template <class T, class MemorySpace>
struct DequantizeElements {
  Kokkos::View<const std::uint8_t*, MemorySpace> codes;
  Kokkos::View<const float*, MemorySpace> absmax;
  Kokkos::View<const float[map_size], MemorySpace> map;
  std::int64_t block_size;
  T* out;
  KOKKOS_FUNCTION void operator()(std::int64_t i) const {
    // Exact in double (a product of two floats); one rounding in float.
    out[i] = T(map(codes(i))) * T(absmax(i / block_size));
  }
};

template <class ExecSpace, class MemorySpace>
void check_arguments(const char* what, std::int64_t n, std::int64_t absmax_extent, std::int64_t block_size) {
  static_assert(Kokkos::SpaceAccessibility<ExecSpace, MemorySpace>::accessible,
                "lather::impl::quant: the execution space cannot access the views' memory space");
  LATHER_THROW_IF(block_size <= 0, "lather::impl::quant::", what, ": block_size must be positive, got ",
                  block_size);
  const std::int64_t blocks = num_blocks(n, block_size);
  LATHER_THROW_IF(absmax_extent < blocks, "lather::impl::quant::", what, ": absmax has ", absmax_extent,
                  " entries, ", n, " elements in blocks of ", block_size, " need ", blocks);
  LATHER_THROW_IF(blocks > INT_MAX, "lather::impl::quant::", what, ": ", blocks,
                  " blocks exceed a league size (int)");
}
}  // namespace detail

/// \brief Block-wise quantization of n = codes.extent(0) values.
///
/// absmax(b) = float(max |x| over block b); codes(i) = nearest_code(map, x_i / absmax(b)), 0's code
/// for an all-zero block. One team per block; the result does not depend on the back end or the
/// team size. Asynchronous on `space` (no fence).
/// \pre `values` points to codes.extent(0) finite values accessible from `space`, with
/// max |x| <= FLT_MAX per block; absmax.extent(0) >= num_blocks(n, block_size); map is sorted.
/// \throws lather::invalid_argument for a non-positive block size or a short absmax.
template <class ExecSpace, class T, class MemorySpace>
void quantize(const ExecSpace& space, const T* values, const Kokkos::View<std::uint8_t*, MemorySpace>& codes,
              const Kokkos::View<float*, MemorySpace>& absmax,
              const std::type_identity_t<Kokkos::View<const float[map_size], MemorySpace>>& map,
              std::int64_t block_size = default_block_size) {
  static_assert(std::is_same_v<T, float> || std::is_same_v<T, double>,
                "lather::impl::quant: float or double");
  const auto n = static_cast<std::int64_t>(codes.extent(0));
  detail::check_arguments<ExecSpace, MemorySpace>("quantize", n, static_cast<std::int64_t>(absmax.extent(0)),
                                                  block_size);
  if (n == 0) return;
  Kokkos::parallel_for(
      LATHER_LABEL("lather::quant::quantize"),
      Kokkos::TeamPolicy<ExecSpace>(space, static_cast<int>(num_blocks(n, block_size)), Kokkos::AUTO),
      detail::QuantizeBlocks<T, MemorySpace, ExecSpace>{values, n, block_size, codes, absmax, map});
}

/// A rank-1 View of (const) std::uint8_t: the codes dequantize reads.
template <class V>
concept CodesView = Kokkos::is_view<V>::value && V::rank == 1 &&
                    std::is_same_v<typename V::non_const_value_type, std::uint8_t>;

/// \brief out[i] = map(codes(i)) * absmax(i / block_size) for i < codes.extent(0), in T.
/// Asynchronous on `space` (no fence). absmax and map are in the memory space of `codes`, whose
/// layout must convert to the default one.
/// \pre `out` holds codes.extent(0) elements accessible from `space`.
/// \throws lather::invalid_argument for a non-positive block size or a short absmax.
template <class ExecSpace, class T, CodesView Codes>
void dequantize(
    const ExecSpace& space, const Codes& codes,
    const std::type_identity_t<Kokkos::View<const float*, typename Codes::memory_space>>& absmax,
    const std::type_identity_t<Kokkos::View<const float[map_size], typename Codes::memory_space>>& map,
    std::int64_t block_size, T* out) {
  static_assert(std::is_same_v<T, float> || std::is_same_v<T, double>,
                "lather::impl::quant: float or double");
  using MemorySpace = typename Codes::memory_space;
  const auto n = static_cast<std::int64_t>(codes.extent(0));
  detail::check_arguments<ExecSpace, MemorySpace>("dequantize", n,
                                                  static_cast<std::int64_t>(absmax.extent(0)), block_size);
  if (n == 0) return;
  Kokkos::parallel_for(LATHER_LABEL("lather::quant::dequantize"),
                       Kokkos::RangePolicy<ExecSpace, Kokkos::IndexType<std::int64_t>>(space, 0, n),
                       detail::DequantizeElements<T, MemorySpace>{codes, absmax, map, block_size, out});
}

/// A 256-entry map in `space`'s memory: dynamic_map(is_signed) copied there. Fences `space`
/// (the host staging copy dies on return).
template <class ExecSpace>
Kokkos::View<float[map_size], typename ExecSpace::memory_space> make_map(
    const ExecSpace& space, bool is_signed, const std::string& label = "lather::quant::map") {
  Kokkos::View<float[map_size], typename ExecSpace::memory_space> map(
      Kokkos::view_alloc(space, Kokkos::WithoutInitializing, label));
  auto host = Kokkos::create_mirror_view(Kokkos::HostSpace(), map);
  const auto values = dynamic_map(is_signed);
  for (int k = 0; k < map_size; ++k) host(k) = values[static_cast<std::size_t>(k)];
  Kokkos::deep_copy(space, map, host);
  space.fence();
  return map;
}

/// \brief One quantized tensor: codes, per-block absmax, its map and block size.
/// A fresh one (make_blockwise_quantized) has zero codes and absmax, so it dequantizes to zeros.
template <class MemorySpace>
struct BlockwiseQuantized {
  using memory_space = MemorySpace;
  Kokkos::View<std::uint8_t*, MemorySpace> codes;
  Kokkos::View<float*, MemorySpace> absmax;
  Kokkos::View<float[map_size], MemorySpace> map;
  std::int64_t block_size = default_block_size;
  [[nodiscard]] std::int64_t size() const { return static_cast<std::int64_t>(codes.extent(0)); }
};

/// Allocates (zero-filled, on `space`) a BlockwiseQuantized of n elements with the signed or
/// unsigned dynamic map. Fences `space` (make_map).
/// \throws lather::invalid_argument for n < 0 or block_size <= 0.
template <class ExecSpace>
BlockwiseQuantized<typename ExecSpace::memory_space> make_blockwise_quantized(
    const ExecSpace& space, std::int64_t n, bool is_signed, std::int64_t block_size = default_block_size,
    const std::string& label = "lather::quant") {
  LATHER_THROW_IF(n < 0, "lather::impl::quant: negative size ", n);
  LATHER_THROW_IF(block_size <= 0, "lather::impl::quant: block_size must be positive, got ", block_size);
  using M = typename ExecSpace::memory_space;
  BlockwiseQuantized<M> q;
  q.codes = Kokkos::View<std::uint8_t*, M>(Kokkos::view_alloc(space, label + "::codes"),
                                           static_cast<std::size_t>(n));
  q.absmax = Kokkos::View<float*, M>(Kokkos::view_alloc(space, label + "::absmax"),
                                     static_cast<std::size_t>(num_blocks(n, block_size)));
  q.map = make_map(space, is_signed, label + "::map");
  q.block_size = block_size;
  return q;
}

/// quantize(space, values, q.codes, q.absmax, q.map, q.block_size).
template <class ExecSpace, class T, class MemorySpace>
void quantize(const ExecSpace& space, const T* values, const BlockwiseQuantized<MemorySpace>& q) {
  quantize(space, values, q.codes, q.absmax, q.map, q.block_size);
}

/// dequantize(space, q.codes, q.absmax, q.map, q.block_size, out).
template <class ExecSpace, class T, class MemorySpace>
void dequantize(const ExecSpace& space, const BlockwiseQuantized<MemorySpace>& q, T* out) {
  dequantize(space, q.codes, q.absmax, q.map, q.block_size, out);
}

}  // namespace lather::impl::quant

#endif
