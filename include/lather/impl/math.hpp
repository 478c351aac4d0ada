// SPDX-License-Identifier: Apache-2.0
/// \file
/// \brief Private. Device-callable math that compiles with Kokkos 3.4.1 through 5.x.
///
/// Kokkos 3.4 spells these `Kokkos::Experimental::sqrt`, 3.7 and later `Kokkos::sqrt`; neither
/// spelling works in both, so every kernel goes through this shim.
#ifndef LATHER_IMPL_MATH_HPP
#define LATHER_IMPL_MATH_HPP

#include <Kokkos_Core.hpp>

namespace lather::impl::math {

#if KOKKOS_VERSION >= 30700
#define LATHER_IMPL_KOKKOS_MATH ::Kokkos
#else
#define LATHER_IMPL_KOKKOS_MATH ::Kokkos::Experimental
#endif

template <class T>
KOKKOS_INLINE_FUNCTION T sqrt(T x) {
  return LATHER_IMPL_KOKKOS_MATH::sqrt(x);
}
template <class T>
KOKKOS_INLINE_FUNCTION T abs(T x) {
  return LATHER_IMPL_KOKKOS_MATH::fabs(x);
}
template <class T>
KOKKOS_INLINE_FUNCTION T pow(T x, T y) {
  return LATHER_IMPL_KOKKOS_MATH::pow(x, y);
}
template <class T>
KOKKOS_INLINE_FUNCTION bool isfinite(T x) {
  return LATHER_IMPL_KOKKOS_MATH::isfinite(x);
}
// Kokkos::max/min arrive in 3.7; these are trivial and keep NaN handling explicit (a NaN in `a`
// propagates, matching torch.maximum's use in amsgrad only for finite inputs).
template <class T>
KOKKOS_INLINE_FUNCTION T max(T a, T b) {
  return a < b ? b : a;
}
template <class T>
KOKKOS_INLINE_FUNCTION T min(T a, T b) {
  return b < a ? b : a;
}

#undef LATHER_IMPL_KOKKOS_MATH

}  // namespace lather::impl::math

#endif
