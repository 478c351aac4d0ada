// SPDX-License-Identifier: Apache-2.0
// Must not compile: a float gradient for double parameters.
#include <lather/optimizers/adam.hpp>

#include <Kokkos_Core.hpp>

#include <vector>

int main() {
  std::vector<Kokkos::View<double*>> params{Kokkos::View<double*>("p", 3)};
  lather::Adam<Kokkos::View<double*>> opt(params);
  opt.step(std::vector{Kokkos::View<float*>("g", 3)});
}
