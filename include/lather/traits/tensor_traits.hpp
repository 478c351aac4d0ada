// SPDX-License-Identifier: Apache-2.0
/// \file
/// \brief The tensor customization point and lather's own strided tensor handle, TensorRef.
///
/// Any type becomes a parameter or gradient by specializing `lather::tensor_traits` (as ArborX's
/// AccessTraits): a strided description (data pointer, extents, strides in elements), which
/// covers Kokkos Views of every strided layout, Eigen matrices and maps, raw pointers and
/// run-time-rank tensors with one representation. Kernels only ever see `TensorRef`.
#ifndef LATHER_TRAITS_TENSOR_TRAITS_HPP
#define LATHER_TRAITS_TENSOR_TRAITS_HPP

#include <lather/error.hpp>

#include <Kokkos_Core.hpp>

#include <array>
#include <cstdint>
#include <initializer_list>
#include <span>
#include <string>
#include <type_traits>

namespace lather {

/// Largest tensor rank lather handles (Kokkos' own limit).
inline constexpr int max_tensor_rank = 8;
/// `tensor_traits<T>::rank` for types whose rank is known only at run time.
inline constexpr int dynamic_rank = -1;

/// \brief Customization point: specialize for a type to make it usable as a parameter or gradient.
///
/// A specialization provides
/// - `value_type`: the scalar type without const (float or double),
/// - `element_type`: `value_type`, or `const value_type` for read-only tensors,
/// - `memory_space`: the Kokkos memory space holding the data,
/// - `static constexpr int rank`: the rank, or `lather::dynamic_rank`,
/// - `static int runtime_rank(const T&)`, `static std::int64_t extent(const T&, int)`,
///   `static std::int64_t stride(const T&, int)` (in elements) and
///   `static element_type* data(T&)` (and/or a `const T&` overload).
template <class T>
struct tensor_traits;

/// \brief A non-owning strided tensor: a pointer, a run-time rank, extents and strides.
///
/// It is lather's common representation of every tensor type (and the adaptor for a raw pointer
/// plus shape). It is trivially copyable and captured by value in kernels. Element order is
/// row-major over the logical shape, whatever the strides: optimizer state is stored in that
/// order, so saved state does not depend on the parameter's layout.
/// \tparam T scalar, possibly const
/// \tparam MemorySpace Kokkos memory space of the data
template <class T, class MemorySpace = Kokkos::HostSpace>
class TensorRef {
 public:
  using element_type = T;
  using value_type = std::remove_const_t<T>;
  using memory_space = MemorySpace;

  TensorRef() = default;

  /// A row-major contiguous tensor of the given shape at `data`.
  TensorRef(T* data, std::span<const std::int64_t> shape) : m_data(data) {
    set_shape(shape);
    std::int64_t s = 1;
    for (int i = m_rank - 1; i >= 0; --i) {
      m_strides[i] = s;
      s *= m_extents[i];
    }
    finish();
  }
  TensorRef(T* data, std::initializer_list<std::int64_t> shape)
      : TensorRef(data, std::span<const std::int64_t>(shape.begin(), shape.size())) {}

  /// A strided tensor (strides in elements, one per dimension).
  TensorRef(T* data, std::span<const std::int64_t> shape, std::span<const std::int64_t> strides)
      : m_data(data) {
    set_shape(shape);
    LATHER_THROW_IF(strides.size() != shape.size(), "lather::TensorRef: got ", strides.size(),
                    " strides for a rank-", shape.size(), " shape; give one stride per dimension");
    for (int i = 0; i < m_rank; ++i) {
      LATHER_THROW_IF(strides[i] < 0, "lather::TensorRef: stride ", i, " is negative (",
                      strides[i], "); negative strides are not supported");
      m_strides[i] = strides[i];
    }
    finish();
  }

  /// A TensorRef of const elements from one of mutable elements.
  template <class U>
    requires(std::is_same_v<const U, T> && !std::is_same_v<U, T>)
  TensorRef(const TensorRef<U, MemorySpace>& other)  // NOLINT(google-explicit-constructor)
      : m_data(other.data()), m_rank(other.rank()), m_size(other.size()),
        m_contiguous(other.is_row_major_contiguous()) {
    for (int i = 0; i < max_tensor_rank; ++i) {
      m_extents[i] = i < m_rank ? other.extent(i) : 1;
      m_strides[i] = i < m_rank ? other.stride(i) : 0;
    }
  }

  KOKKOS_INLINE_FUNCTION T* data() const { return m_data; }
  KOKKOS_INLINE_FUNCTION int rank() const { return m_rank; }
  KOKKOS_INLINE_FUNCTION std::int64_t extent(int i) const { return m_extents[i]; }
  KOKKOS_INLINE_FUNCTION std::int64_t stride(int i) const { return m_strides[i]; }
  /// Number of elements (1 for rank 0).
  KOKKOS_INLINE_FUNCTION std::int64_t size() const { return m_size; }
  /// True when the strides are exactly row-major packed (so flat index == memory offset).
  KOKKOS_INLINE_FUNCTION bool is_row_major_contiguous() const { return m_contiguous; }

  /// Memory offset of the element with row-major flat index `flat`.
  KOKKOS_INLINE_FUNCTION std::int64_t offset(std::int64_t flat) const {
    if (m_contiguous) return flat;
    std::int64_t off = 0;
    for (int i = m_rank - 1; i >= 0; --i) {
      const std::int64_t idx = flat % m_extents[i];
      flat /= m_extents[i];
      off += idx * m_strides[i];
    }
    return off;
  }
  /// Element with row-major flat index `flat`.
  KOKKOS_INLINE_FUNCTION T& operator[](std::int64_t flat) const { return m_data[offset(flat)]; }

  /// The shape as a string, e.g. "(3, 4)", for error messages.
  [[nodiscard]] std::string shape_string() const {
    std::string s = "(";
    for (int i = 0; i < m_rank; ++i) {
      if (i > 0) s += ", ";
      s += std::to_string(m_extents[i]);
    }
    if (m_rank == 1) s += ",";
    return s + ")";
  }
  /// True when both have the same rank and extents.
  template <class U, class M>
  [[nodiscard]] bool same_shape(const TensorRef<U, M>& o) const {
    if (m_rank != o.rank()) return false;
    for (int i = 0; i < m_rank; ++i)
      if (m_extents[i] != o.extent(i)) return false;
    return true;
  }

 private:
  void set_shape(std::span<const std::int64_t> shape) {
    LATHER_THROW_IF(shape.size() > static_cast<std::size_t>(max_tensor_rank),
                    "lather::TensorRef: rank ", shape.size(), " exceeds the maximum of ",
                    max_tensor_rank);
    m_rank = static_cast<int>(shape.size());
    for (int i = 0; i < max_tensor_rank; ++i) {
      m_extents[i] = 1;
      m_strides[i] = 0;
    }
    for (int i = 0; i < m_rank; ++i) {
      LATHER_THROW_IF(shape[i] < 0, "lather::TensorRef: extent ", i, " is negative (", shape[i],
                      ")");
      m_extents[i] = shape[i];
    }
  }
  void finish() {
    m_size = 1;
    for (int i = 0; i < m_rank; ++i) m_size *= m_extents[i];
    m_contiguous = true;
    std::int64_t s = 1;
    for (int i = m_rank - 1; i >= 0; --i) {
      // A dimension of extent 1 can have any stride without breaking contiguity.
      if (m_extents[i] != 1 && m_strides[i] != s) m_contiguous = false;
      s *= m_extents[i];
    }
  }

  T* m_data = nullptr;
  int m_rank = 0;
  std::int64_t m_extents[max_tensor_rank] = {1, 1, 1, 1, 1, 1, 1, 1};
  std::int64_t m_strides[max_tensor_rank] = {0, 0, 0, 0, 0, 0, 0, 0};
  std::int64_t m_size = 1;
  bool m_contiguous = true;
};

static_assert(std::is_trivially_copyable_v<TensorRef<double>>,
              "lather::TensorRef must be trivially copyable to be captured by kernels");

template <class T, class MemorySpace>
struct tensor_traits<TensorRef<T, MemorySpace>> {
  using value_type = std::remove_const_t<T>;
  using element_type = T;
  using memory_space = MemorySpace;
  static constexpr int rank = dynamic_rank;
  static int runtime_rank(const TensorRef<T, MemorySpace>& t) { return t.rank(); }
  static std::int64_t extent(const TensorRef<T, MemorySpace>& t, int i) { return t.extent(i); }
  static std::int64_t stride(const TensorRef<T, MemorySpace>& t, int i) { return t.stride(i); }
  static T* data(const TensorRef<T, MemorySpace>& t) { return t.data(); }
};

}  // namespace lather

#endif
