// SPDX-License-Identifier: Apache-2.0
// Must not compile: parameters must be writable.
#include <lather/optimizers/sgd.hpp>

#include <Kokkos_Core.hpp>

#include <vector>

int main() {
  std::vector<Kokkos::View<const double*>> params;
  lather::SGD<Kokkos::View<const double*>> opt(params);
  (void)opt;
}
