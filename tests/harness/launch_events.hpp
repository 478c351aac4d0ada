// SPDX-License-Identifier: Apache-2.0
// The kernels launched and the profiling regions entered by one call, in order, through the
// Kokkos Tools callbacks: how the tests check where a step waits for the NaN/Inf screen
// ("region lather::<Optimizer>::read_screen") against the kernels it queues.
#ifndef LATHER_TESTS_LAUNCH_EVENTS_HPP
#define LATHER_TESTS_LAUNCH_EVENTS_HPP

#include <lather/concepts/tensor.hpp>

#include <Kokkos_Core.hpp>

#include "test_utils.hpp"

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace lather::test {

inline std::vector<std::string>& launch_events() {
  static std::vector<std::string> events;
  return events;
}
inline void record_kernel(const char* name, std::uint32_t, std::uint64_t* id) {
  launch_events().push_back(std::string("kernel ") + name);
  *id = 0;
}
inline void record_region(const char* name) { launch_events().push_back(std::string("region ") + name); }

/// "kernel <label>" per parallel_for and "region <name>" per profiling region entered by f().
template <class F>
std::vector<std::string> events_of(F&& f) {
  namespace T = Kokkos::Tools::Experimental;
  launch_events().clear();
  T::set_begin_parallel_for_callback(record_kernel);
  T::set_push_region_callback(record_region);
  f();
  T::set_begin_parallel_for_callback(nullptr);
  T::set_push_region_callback(nullptr);
  return launch_events();
}
/// The index of the first event `what`, -1 if none.
inline std::ptrdiff_t position(const std::vector<std::string>& events, const std::string& what) {
  const auto it = std::find(events.begin(), events.end(), what);
  return it == events.end() ? -1 : it - events.begin();
}

/// A weight (rows, cols) and a bias (n) with their gradients, random values; the gradients of
/// step t from seeds of t: the two-parameter model of the screen-order tests.
template <class T, class MemorySpace>
struct ScreenModel {
  using P = TensorRef<T, MemorySpace>;
  Kokkos::View<T**, Kokkos::LayoutRight, MemorySpace> w, gw;
  Kokkos::View<T*, MemorySpace> b, gb;
  std::vector<P> params, grads;
  ScreenModel(std::int64_t rows, std::int64_t cols, std::int64_t n)
      : w("w", rows, cols), gw("gw", rows, cols), b("b", n), gb("gb", n),
        params{tensor_ref(w), tensor_ref(b)}, grads{tensor_ref(gw), tensor_ref(gb)} {
    for (std::size_t i = 0; i < 2; ++i) from_host(params[i], random_values(params[i].size(), 3 + i));
  }
  void set_grads(int t) {
    for (std::size_t i = 0; i < 2; ++i) from_host(grads[i], random_values(grads[i].size(), 100 * t + i));
  }
};

}  // namespace lather::test

#endif
