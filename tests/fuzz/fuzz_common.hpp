// SPDX-License-Identifier: Apache-2.0
// Shared set-up of the libFuzzer targets: Kokkos initialized once, one thread, before fuzzing.
#ifndef LATHER_TESTS_FUZZ_COMMON_HPP
#define LATHER_TESTS_FUZZ_COMMON_HPP

#include <Kokkos_Core.hpp>

#include <cstdio>
#include <cstdlib>

namespace lather::fuzz {

/// Initializes Kokkos (one OpenMP thread; the targets run on Kokkos::Serial) for the process.
inline void init_kokkos() {
  setenv("OMP_NUM_THREADS", "1", 0);
  setenv("OMP_PROC_BIND", "false", 0);
  if (!Kokkos::is_initialized()) Kokkos::initialize();
}

/// Reports a broken invariant so that libFuzzer records the input as a crash.
[[noreturn]] inline void invariant_failed(const char* what) {
  std::fprintf(stderr, "lather fuzz: invariant broken: %s\n", what);
  std::abort();
}

}  // namespace lather::fuzz

#endif
