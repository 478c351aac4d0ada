// SPDX-License-Identifier: Apache-2.0
/// \file
/// \brief Kernels of Shampoo's all-gather: packing this rank's updates (or updated parameters)
/// into its slice of the communication buffer, and adding (or copying) every rank's back.
#ifndef LATHER_IMPL_KERNELS_DISTRIBUTED_HPP
#define LATHER_IMPL_KERNELS_DISTRIBUTED_HPP

#include <lather/distributed/shampoo_distribution.hpp>
#include <lather/traits/tensor_traits.hpp>

#include <Kokkos_Core.hpp>

#include <cstdint>

namespace lather::impl::kernels {

/// buf[q] = C(source element i): the update in `delta` (flat order) or the parameter itself.
/// Run with the send index (q < 0, blocks of other ranks, are skipped by the runner).
template <class T, class C, class MemorySpace>
struct PackComm {
  TensorRef<T, MemorySpace> param;
  const T* delta;  // nullptr: pack the parameter (communicate_params)
  C* buf;
  KOKKOS_FUNCTION void apply(std::int64_t i, std::int64_t q) const {
    buf[q] = to_comm<C>(delta != nullptr ? delta[i] : param[i]);
  }
};

/// W[i] += T(buf[q]) (updates) or W[i] = T(buf[q]) (parameters), for every block of every rank.
template <class T, class C, class MemorySpace>
struct UnpackComm {
  TensorRef<T, MemorySpace> param;
  const C* buf;
  bool add;
  KOKKOS_FUNCTION void apply(std::int64_t i, std::int64_t q) const {
    const T v = from_comm<T>(buf[q]);
    T& w = param[i];
    if (add) w = w + v;
    else w = v;
  }
};

}  // namespace lather::impl::kernels

#endif
