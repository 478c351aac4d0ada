// SPDX-License-Identifier: Apache-2.0
/// \file
/// \brief Execution-space concepts.
#ifndef LATHER_CONCEPTS_EXECUTION_HPP
#define LATHER_CONCEPTS_EXECUTION_HPP

#include <lather/concepts/tensor.hpp>

#include <Kokkos_Core.hpp>

namespace lather::concepts {

/// A Kokkos execution space type (Serial, OpenMP, Cuda, HIP, ...).
template <class E>
concept ExecutionSpace = static_cast<bool>(Kokkos::is_execution_space<E>::value);

/// An execution space that can access the memory of tensor type `T`.
template <class E, class T>
concept ExecutionSpaceFor =
    ExecutionSpace<E> && Tensor<T> &&
    static_cast<bool>(Kokkos::SpaceAccessibility<E, typename impl::traits_of<T>::memory_space>::accessible);

}  // namespace lather::concepts

#endif
