// SPDX-License-Identifier: Apache-2.0
// docs/root-inverse.md: a root-inverse strategy used on its own: X = A^(-1/4) of a symmetric
// positive definite matrix with coupled Newton, checked through X^4 A = I.
#include <lather/lather.hpp>

#include <Kokkos_Core.hpp>

#include <cmath>
#include <cstdio>

int main(int argc, char** argv) {
  Kokkos::ScopeGuard guard(argc, argv);
  {
    using Space = Kokkos::DefaultExecutionSpace;
    const Space space;
    constexpr int n = 5;
    Kokkos::View<double**, Kokkos::LayoutRight, Space::memory_space> a_storage("A", n, n), X("X", n, n);
    auto h = Kokkos::create_mirror_view(a_storage);
    for (int i = 0; i < n; ++i)
      for (int j = 0; j < n; ++j) h(i, j) = (i == j ? 4.0 : 0.0) + 1.0 / (1.0 + i + j);  // SPD
    Kokkos::deep_copy(a_storage, h);
    const Kokkos::View<const double**, Kokkos::LayoutRight, Space::memory_space> A = a_storage;  // read-only input

    // [usage]
    const lather::CoupledNewtonRootInverse newton{.max_iterations = 50};
    const lather::RootInverseStatus s = newton.compute(space, A, /*root=*/4.0, /*epsilon=*/1e-12, X);
    if (lather::is_usable(s)) { /* copy X */ }
    // [usage]

    if (!lather::is_usable(s)) return 1;
    // Residual max |X^4 (A + eps I) - I|.
    auto hx = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), X);
    double p[n][n], q[n][n], worst = 0;
    for (int i = 0; i < n; ++i)
      for (int j = 0; j < n; ++j) p[i][j] = (i == j) ? 1.0 : 0.0;
    for (int k = 0; k < 4; ++k) {
      for (int i = 0; i < n; ++i)
        for (int j = 0; j < n; ++j) {
          q[i][j] = 0;
          for (int l = 0; l < n; ++l) q[i][j] += p[i][l] * hx(l, j);
        }
      for (int i = 0; i < n; ++i)
        for (int j = 0; j < n; ++j) p[i][j] = q[i][j];
    }
    for (int i = 0; i < n; ++i)
      for (int j = 0; j < n; ++j) {
        double r = -(i == j ? 1.0 : 0.0);
        for (int l = 0; l < n; ++l) r += p[i][l] * (h(l, j) + (l == j ? 1e-12 : 0.0));
        worst = std::max(worst, std::abs(r));
      }
    std::printf("coupled Newton A^(-1/4): max |X^4 A - I| = %.2e\n", worst);
    if (worst > 1e-6) return 1;
  }
  return 0;
}
