// SPDX-License-Identifier: Apache-2.0
// Negative test for scripts/gpu-compile-check.sh: device code (a KOKKOS_LAMBDA run on the device
// execution space) calls a function that is NOT marked KOKKOS_FUNCTION. A CUDA or HIP compile of
// this file must FAIL; if it compiles, the GPU compile check would not catch a missing
// KOKKOS_FUNCTION in lather's kernels, and the check itself is broken.
//
// With -DLATHER_GPU_COMPILE_CONTROL the function is marked KOKKOS_INLINE_FUNCTION and the file
// must compile: that proves the failure above is the host/device diagnostic and nothing else.
#include <Kokkos_Core.hpp>

#ifdef LATHER_GPU_COMPILE_CONTROL
KOKKOS_INLINE_FUNCTION
#endif
double host_only_scale(double x) { return 2.0 * x + 1.0; }

int main(int argc, char* argv[]) {
  Kokkos::ScopeGuard guard(argc, argv);
  Kokkos::View<double*> v("v", 16);
  Kokkos::parallel_for(
      "host_call_in_device", Kokkos::RangePolicy<Kokkos::DefaultExecutionSpace>(0, 16),
      KOKKOS_LAMBDA(const int i) { v(i) = host_only_scale(static_cast<double>(i)); });
  Kokkos::fence();
  return 0;
}
