// SPDX-License-Identifier: Apache-2.0
// The one test main: MPI (when the executable is an MPI test), then Kokkos, then doctest.
// Prints the library version, the Kokkos configuration and the seed; traps invalid floating-point
// operations so NaN-producing code fails loudly. Options: --seed=N (default 20261122).
#define DOCTEST_CONFIG_IMPLEMENT
#include <lather/version.hpp>

#include <Kokkos_Core.hpp>

#include <doctest/doctest.h>

#include "test_utils.hpp"

#ifdef LATHER_TEST_WITH_MPI
#include <mpi.h>
#endif

#if defined(__linux__) && defined(__GLIBC__)
#include <fenv.h>
#endif

#include <cstdlib>
#include <cstring>
#include <iostream>
#include <string>

int main(int argc, char** argv) {
  int rank = 0;
#ifdef LATHER_TEST_WITH_MPI
  MPI_Init(&argc, &argv);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
#endif
  int result = 0;
  {
    Kokkos::ScopeGuard kokkos(argc, argv);
    for (int i = 1; i < argc; ++i)
      if (std::strncmp(argv[i], "--seed=", 7) == 0) lather::test::seed() = std::strtoull(argv[i] + 7, nullptr, 10);
    if (rank == 0) {
      std::cout << "lather " << lather::version_string << ", Kokkos " << KOKKOS_VERSION
                << ", seed " << lather::test::seed() << " (--seed=N to change)\n";
      Kokkos::print_configuration(std::cout, false);
    }
#if defined(__linux__) && defined(__GLIBC__)
    // After Kokkos initialized (its threads inherit the environment of later-created threads
    // only); lather code must not produce NaN from finite input.
    feenableexcept(FE_INVALID | FE_DIVBYZERO);
#endif
    doctest::Context context;
    context.applyCommandLine(argc, argv);
    // Non-root ranks report failures only, so an MPI run prints one summary.
    if (rank != 0) context.setOption("minimal", true);
    result = context.run();
#if defined(__linux__) && defined(__GLIBC__)
    fedisableexcept(FE_INVALID | FE_DIVBYZERO);
#endif
  }
#ifdef LATHER_TEST_WITH_MPI
  int any = result != 0;
  MPI_Allreduce(MPI_IN_PLACE, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  result = any;
  MPI_Finalize();
#endif
  return result;
}
