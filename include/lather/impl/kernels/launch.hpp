// SPDX-License-Identifier: Apache-2.0
/// \file
/// \brief Private. Launch policies for kernels whose functors are large.
///
/// Why: Kokkos (3.4 to 4.x, CUDA and, since 4.0, HIP) launches a functor of 512 bytes or more
/// through the device's constant memory, and such a launch first waits on the host for the
/// previous constant-memory kernel to finish (`cudaEventSynchronize` in
/// `CudaParallelLaunchKernelInvoker<..., ConstantMemory>`): the host can no longer queue work
/// ahead of the device. Functors holding two TensorRefs and a blocked index (Shampoo's gather,
/// 520-650 bytes with the policy) took that path. Kokkos' light-weight hint passes a functor of up
/// to 4 KB as a kernel argument instead, which costs no wait. `scripts/launch-check.sh` lists every
/// launch of a CUDA build that still takes the constant-memory path.
#ifndef LATHER_IMPL_KERNELS_LAUNCH_HPP
#define LATHER_IMPL_KERNELS_LAUNCH_HPP

#include <Kokkos_Core.hpp>

namespace lather::impl::kernels {

/// `policy` with Kokkos' light-weight hint: its functor goes to the device as a kernel argument
/// (up to 4 KB) on CUDA and HIP; nothing changes on host spaces.
template <class Policy>
[[nodiscard]] auto by_argument(const Policy& policy) {
  return Kokkos::Experimental::require(policy, Kokkos::Experimental::WorkItemProperty::HintLightWeight);
}

}  // namespace lather::impl::kernels

#endif
