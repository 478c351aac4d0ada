// SPDX-License-Identifier: Apache-2.0
/// \file
/// \brief `RootInverseStatus` and `concepts::RootInverseStrategy`: how Shampoo's amortized
/// computation asks for X ~ (A + eps I)^(-1/r) of a symmetric n x n factor matrix A.
///
/// The strategies are in `lather/root_inverse/` (docs/root-inverse.md).
#ifndef LATHER_CONCEPTS_ROOT_INVERSE_HPP
#define LATHER_CONCEPTS_ROOT_INVERSE_HPP

#include <Kokkos_Core.hpp>

#include <concepts>

namespace lather {

/// \brief Outcome of one root-inverse computation.
///
/// `success` and `max_iterations_reached` mean the output X is usable (the reference
/// implementation only logs a warning when an iteration hits its iteration limit and uses X
/// anyway). `failed` means the reference would have raised inside the matrix function (eigensolver
/// failure after the double-precision retry, higher-order error above its 0.1 threshold, a
/// non-finite input); `non_finite` means the result contains NaN or Inf. With either of the last
/// two, the contents of X are unspecified and must not be used.
enum class RootInverseStatus { success, max_iterations_reached, failed, non_finite };

/// \brief The enumerator's name, e.g. "max_iterations_reached".
[[nodiscard]] constexpr const char* to_string(RootInverseStatus status) noexcept {
  switch (status) {
    case RootInverseStatus::success:
      return "success";
    case RootInverseStatus::max_iterations_reached:
      return "max_iterations_reached";
    case RootInverseStatus::failed:
      return "failed";
    case RootInverseStatus::non_finite:
      return "non_finite";
  }
  return "unknown";
}

/// \brief True when X may be used: `success` or `max_iterations_reached`.
[[nodiscard]] constexpr bool is_usable(RootInverseStatus status) noexcept {
  return status == RootInverseStatus::success || status == RootInverseStatus::max_iterations_reached;
}

namespace concepts {

/// \brief A root-inverse strategy (policy) of Shampoo.
///
/// - `s.compute(space, A, root, epsilon, X) -> RootInverseStatus`: a const member function
///   template over the execution space, the scalar (float or double) and the memory space, with
///   `A` a `Kokkos::View<const T**, Kokkos::LayoutRight, MemorySpace>` (symmetric, n x n), `root`
///   r > 0, `epsilon` the optimizer's epsilon and `X` a `Kokkos::View<T**, Kokkos::LayoutRight,
///   MemorySpace>` (n x n, output). X approximates (A [+ eps I])^(-1/r) per the strategy's rule.
///   Bad options, shapes or an unsupported root throw `lather::invalid_argument`; numerical
///   trouble (NaN input included) is reported through the status, never thrown.
/// - `s.supports_root(root) -> bool`: whether `compute` accepts this root.
/// - `s.validate()`: throws `lather::invalid_argument` naming the first invalid option.
template <class S>
concept RootInverseStrategy =
    requires(const S& s, double root, Kokkos::DefaultHostExecutionSpace space,
             Kokkos::View<const double**, Kokkos::LayoutRight, Kokkos::HostSpace> a_double,
             Kokkos::View<double**, Kokkos::LayoutRight, Kokkos::HostSpace> x_double,
             Kokkos::View<const float**, Kokkos::LayoutRight, Kokkos::HostSpace> a_float,
             Kokkos::View<float**, Kokkos::LayoutRight, Kokkos::HostSpace> x_float) {
  { s.compute(space, a_double, root, 0.0, x_double) } -> std::same_as<RootInverseStatus>;
  { s.compute(space, a_float, root, 0.0, x_float) } -> std::same_as<RootInverseStatus>;
  { s.supports_root(root) } -> std::convertible_to<bool>;
  s.validate();
};

}  // namespace concepts
}  // namespace lather

#endif
