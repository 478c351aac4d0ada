// SPDX-License-Identifier: Apache-2.0
// docs/getting-started.md: a first optimizer over Kokkos Views.
#include <lather/lather.hpp>

#include <Kokkos_Core.hpp>

#include <cstdio>
#include <vector>

int main(int argc, char** argv) {
  Kokkos::ScopeGuard guard(argc, argv);
  Kokkos::View<double*> x("x", 3);  // minimize f(x) = 0.5 * ||x - 1||^2
  Kokkos::View<double*> grad("grad", 3);
  std::vector<Kokkos::View<double*>> params{x};
  lather::Adam opt(params, lather::AdamOptions{.lr = 0.1});
  for (int t = 0; t < 200; ++t) {
    Kokkos::parallel_for(3, KOKKOS_LAMBDA(int i) { grad(i) = x(i) - 1.0; });
    opt.step(std::vector{grad});
  }
  auto h = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), x);
  std::printf("x = (%.4f, %.4f, %.4f)\n", h(0), h(1), h(2));
  return std::abs(h(0) - 1.0) < 1e-2 ? 0 : 1;
}
