// SPDX-License-Identifier: Apache-2.0
// A consumer of the installed (or add_subdirectory'd) lather: one Adam step on a Kokkos View.
#include <lather/lather.hpp>

#include <Kokkos_Core.hpp>

#include <cstdio>
#include <vector>

int main(int argc, char** argv) {
  Kokkos::ScopeGuard guard(argc, argv);
  int status = 0;
  {
    Kokkos::View<double*> w("w", 4);
    Kokkos::View<double*> g("g", 4);
    Kokkos::deep_copy(w, 1.0);
    Kokkos::deep_copy(g, 0.5);
    std::vector<Kokkos::View<double*>> params{w};
    lather::Adam opt(params, lather::AdamOptions{.lr = 0.1});
    opt.step(std::vector{g});
    Kokkos::fence();
    double h = 0;
    Kokkos::deep_copy(h, Kokkos::subview(w, 0));
    // The first Adam step moves each weight by lr against the gradient's sign.
    std::printf("lather %s: w[0] = %.6f\n", lather::version_string, h);
    status = (h > 0.899 && h < 0.901) ? 0 : 1;
  }
  return status;
}
