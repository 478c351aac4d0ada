// SPDX-License-Identifier: Apache-2.0
/// \file
/// \brief `concepts::Tensor`, its diagnostic check, and `tensor_ref()`, which turns any tensor into
/// lather's common `TensorRef`.
#ifndef LATHER_CONCEPTS_TENSOR_HPP
#define LATHER_CONCEPTS_TENSOR_HPP

#include <lather/traits/kokkos_view.hpp>
#include <lather/traits/tensor_traits.hpp>

#include <concepts>
#include <cstdint>
#include <type_traits>

namespace lather {
namespace impl {
template <class T>
using traits_of = tensor_traits<std::remove_cvref_t<T>>;

template <class T>
concept has_tensor_traits = requires { sizeof(traits_of<T>); };
}  // namespace impl

namespace concepts {

/// \brief A type usable as a parameter or gradient: `lather::tensor_traits<T>` is specialized with
/// everything TensorRef needs. Use `lather::impl::check_valid_tensor_traits<T>()` for a diagnosis.
template <class T>
concept Tensor = impl::has_tensor_traits<T> &&
    requires(std::remove_cvref_t<T>& t) {
      typename impl::traits_of<T>::value_type;
      typename impl::traits_of<T>::element_type;
      typename impl::traits_of<T>::memory_space;
      { impl::traits_of<T>::rank } -> std::convertible_to<int>;
      { impl::traits_of<T>::runtime_rank(t) } -> std::convertible_to<int>;
      { impl::traits_of<T>::extent(t, 0) } -> std::convertible_to<std::int64_t>;
      { impl::traits_of<T>::stride(t, 0) } -> std::convertible_to<std::int64_t>;
      { impl::traits_of<T>::data(t) };
    };

/// A Tensor whose scalar is float or double (what the optimizers accept).
template <class T>
concept FloatingTensor =
    Tensor<T> && (std::is_same_v<typename impl::traits_of<T>::value_type, float> ||
                  std::is_same_v<typename impl::traits_of<T>::value_type, double>);

}  // namespace concepts

namespace impl {

/// One named static_assert per missing piece of `tensor_traits<T>`: a failed concept alone says
/// little about what to add.
template <class T>
constexpr bool check_valid_tensor_traits() {
  using U = std::remove_cvref_t<T>;
  static_assert(has_tensor_traits<U>,
                "lather: no lather::tensor_traits specialization for this type. Supported: "
                "Kokkos::View (LayoutLeft/Right/Stride), Eigen dense matrices and maps (include "
                "<lather/traits/eigen_matrix.hpp>), lather::TensorRef (raw pointer + shape); or "
                "specialize lather::tensor_traits.");
  if constexpr (has_tensor_traits<U>) {
    using Tr = tensor_traits<U>;
    static_assert(requires { typename Tr::value_type; },
                  "lather::tensor_traits<T> must define value_type (the scalar, without const)");
    static_assert(requires { typename Tr::element_type; },
                  "lather::tensor_traits<T> must define element_type (value_type, maybe const)");
    static_assert(requires { typename Tr::memory_space; },
                  "lather::tensor_traits<T> must define memory_space (a Kokkos memory space)");
    static_assert(requires { { Tr::rank } -> std::convertible_to<int>; },
                  "lather::tensor_traits<T> must define static constexpr int rank "
                  "(or lather::dynamic_rank)");
    static_assert(requires(U& t) { { Tr::runtime_rank(t) } -> std::convertible_to<int>; },
                  "lather::tensor_traits<T> must define static int runtime_rank(const T&)");
    static_assert(requires(U& t) { { Tr::extent(t, 0) } -> std::convertible_to<std::int64_t>; },
                  "lather::tensor_traits<T> must define static std::int64_t extent(const T&, int)");
    static_assert(requires(U& t) { { Tr::stride(t, 0) } -> std::convertible_to<std::int64_t>; },
                  "lather::tensor_traits<T> must define static std::int64_t stride(const T&, int) "
                  "(in elements)");
    static_assert(requires(U& t) { Tr::data(t); },
                  "lather::tensor_traits<T> must define static element_type* data(T&)");
  }
  return true;
}

}  // namespace impl

/// \brief The TensorRef viewing `t` (no copy). Works for every `concepts::Tensor`; the element
/// type is const when `t` is read-only.
template <class T>
[[nodiscard]] auto tensor_ref(T&& t) {
  static_assert(impl::check_valid_tensor_traits<T>());
  using Tr = impl::traits_of<T>;
  auto* ptr = Tr::data(t);
  using Elem = std::remove_pointer_t<decltype(ptr)>;
  using Ref = TensorRef<Elem, typename Tr::memory_space>;
  if constexpr (std::is_same_v<std::remove_cvref_t<T>, Ref>) {
    return t;
  } else {
    const int r = Tr::runtime_rank(t);
    std::int64_t shape[max_tensor_rank] = {};
    std::int64_t strides[max_tensor_rank] = {};
    for (int i = 0; i < r && i < max_tensor_rank; ++i) {
      shape[i] = Tr::extent(t, i);
      strides[i] = Tr::stride(t, i);
    }
    return Ref(ptr, std::span<const std::int64_t>(shape, r), std::span<const std::int64_t>(strides, r));
  }
}

/// The execution space a tensor type runs on by default (its memory space's).
template <concepts::Tensor T>
using default_execution_space_t =
    typename impl::traits_of<T>::memory_space::execution_space;

}  // namespace lather

#endif
