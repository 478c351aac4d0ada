// SPDX-License-Identifier: Apache-2.0
/// \file
/// \brief tensor_traits for host Eigen dense objects with direct access: Matrix, Array, Map, Ref.
///
/// Vectors (one dimension fixed to 1 at compile time) are rank 1; everything else is rank 2 with
/// the logical shape (rows, cols), whatever the storage order.
#ifndef LATHER_TRAITS_EIGEN_MATRIX_HPP
#define LATHER_TRAITS_EIGEN_MATRIX_HPP

#include <lather/config.hpp>
#include <lather/traits/tensor_traits.hpp>

#ifndef LATHER_ENABLE_EIGEN
#error "lather/traits/eigen_matrix.hpp needs lather configured with LATHER_ENABLE_EIGEN=ON"
#endif

#include <Kokkos_Core.hpp>

#include <Eigen/Core>

#include <type_traits>

namespace lather {

template <class M>
  requires(std::is_base_of_v<Eigen::DenseBase<M>, M> &&
           (static_cast<unsigned>(M::Flags) & Eigen::DirectAccessBit) != 0)
struct tensor_traits<M> {
  using value_type = typename M::Scalar;
  using memory_space = Kokkos::HostSpace;
  static constexpr bool is_vector = M::IsVectorAtCompileTime;
  static constexpr bool row_major = (static_cast<unsigned>(M::Flags) & Eigen::RowMajorBit) != 0;
  static constexpr int rank = is_vector ? 1 : 2;
  // Writable only through a non-const object of a writable expression type.
  using element_type =
      std::conditional_t<(static_cast<unsigned>(M::Flags) & Eigen::LvalueBit) != 0, value_type,
                         const value_type>;

  static int runtime_rank(const M&) { return rank; }
  static std::int64_t extent(const M& m, int i) {
    if constexpr (is_vector) return static_cast<std::int64_t>(m.size());
    return static_cast<std::int64_t>(i == 0 ? m.rows() : m.cols());
  }
  static std::int64_t stride(const M& m, int i) {
    if constexpr (is_vector) return static_cast<std::int64_t>(m.innerStride());
    const bool inner = row_major ? (i == 1) : (i == 0);
    return static_cast<std::int64_t>(inner ? m.innerStride() : m.outerStride());
  }
  static element_type* data(M& m) { return m.data(); }
  static const value_type* data(const M& m) { return m.data(); }
};

}  // namespace lather

#endif
