// SPDX-License-Identifier: Apache-2.0
// The execution spaces every numerical test is instantiated for: all that Kokkos was built with.
#ifndef LATHER_TEST_EXEC_SPACES_HPP
#define LATHER_TEST_EXEC_SPACES_HPP

#include <Kokkos_Core.hpp>

#include <doctest/doctest.h>

#include <tuple>

namespace lather::test {
template <class... A, class... B>
auto tuple_cat_types(std::tuple<A...>, std::tuple<B...>) -> std::tuple<A..., B...>;
template <class A, class B>
using cat_t = decltype(tuple_cat_types(A{}, B{}));

// LATHER_TEST_DEVICE_SPACES_ONLY (set by the GPU compile check, scripts/gpu-compile-check.sh):
// in a build with a device space, instantiate the tests for the device spaces alone. The host
// spaces' instantiations are the host build's (which runs them); compiling them again with nvcc or
// hipcc proved nothing more and took about half of the GPU check's time.
#if defined(LATHER_TEST_DEVICE_SPACES_ONLY) && (defined(KOKKOS_ENABLE_CUDA) || defined(KOKKOS_ENABLE_HIP))
#define LATHER_TEST_HOST_SPACES 0
#else
#define LATHER_TEST_HOST_SPACES 1
#endif
#if defined(KOKKOS_ENABLE_SERIAL) && LATHER_TEST_HOST_SPACES
using serial_t = std::tuple<Kokkos::Serial>;
#else
using serial_t = std::tuple<>;
#endif
#if defined(KOKKOS_ENABLE_OPENMP) && LATHER_TEST_HOST_SPACES
using openmp_t = std::tuple<Kokkos::OpenMP>;
#else
using openmp_t = std::tuple<>;
#endif
#ifdef KOKKOS_ENABLE_CUDA
using cuda_t = std::tuple<Kokkos::Cuda>;
#else
using cuda_t = std::tuple<>;
#endif
#ifdef KOKKOS_ENABLE_HIP
#if KOKKOS_VERSION >= 40000
using hip_t = std::tuple<Kokkos::HIP>;
#else
using hip_t = std::tuple<Kokkos::Experimental::HIP>;
#endif
#else
using hip_t = std::tuple<>;
#endif
}  // namespace lather::test

using lather_test_exec_spaces =
    lather::test::cat_t<lather::test::cat_t<lather::test::serial_t, lather::test::openmp_t>,
                        lather::test::cat_t<lather::test::cuda_t, lather::test::hip_t>>;

#ifdef KOKKOS_ENABLE_SERIAL
TYPE_TO_STRING(Kokkos::Serial);
#endif
#ifdef KOKKOS_ENABLE_OPENMP
TYPE_TO_STRING(Kokkos::OpenMP);
#endif
#ifdef KOKKOS_ENABLE_CUDA
TYPE_TO_STRING(Kokkos::Cuda);
#endif

#endif
