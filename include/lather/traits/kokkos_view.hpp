// SPDX-License-Identifier: Apache-2.0
/// \file
/// \brief tensor_traits for Kokkos::View of rank 0 to 8 with a strided layout.
#ifndef LATHER_TRAITS_KOKKOS_VIEW_HPP
#define LATHER_TRAITS_KOKKOS_VIEW_HPP

#include <lather/traits/tensor_traits.hpp>

#include <Kokkos_Core.hpp>

#include <type_traits>

namespace lather {
namespace impl {
template <class L>
inline constexpr bool is_strided_layout_v =
    std::is_same_v<L, Kokkos::LayoutLeft> || std::is_same_v<L, Kokkos::LayoutRight> ||
    std::is_same_v<L, Kokkos::LayoutStride>;
}  // namespace impl

/// Kokkos::View with LayoutLeft, LayoutRight or LayoutStride, in any memory space.
template <class V>
  requires(static_cast<bool>(Kokkos::is_view<V>::value) && impl::is_strided_layout_v<typename V::array_layout>)
struct tensor_traits<V> {
  using value_type = typename V::non_const_value_type;
  using element_type = typename V::value_type;
  using memory_space = typename V::memory_space;
  // View::rank is an enum in 3.4 and an integral constant in 4.x; both convert.
  static constexpr int rank = static_cast<int>(V::rank);
  static int runtime_rank(const V&) { return rank; }
  static std::int64_t extent(const V& v, int i) { return static_cast<std::int64_t>(v.extent(i)); }
  static std::int64_t stride(const V& v, int i) { return static_cast<std::int64_t>(v.stride(i)); }
  static element_type* data(const V& v) { return v.data(); }
};

}  // namespace lather

#endif
