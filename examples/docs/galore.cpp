// SPDX-License-Identifier: Apache-2.0
// docs/galore.md: GaLore-AdamW on one device. A GaLore group (rank 32, 8-bit states) for a
// (256, 128) weight and a plain-AdamW group (rank 0) for its bias, minimizing
// 0.5 ||W - T||^2 + 0.5 ||b - t||^2 (gradients W - T and b - t: full rank); checks that the loss
// falls and prints the optimizer's state bytes next to AdamW's.
#include <lather/optimizers/galore.hpp>

#include <Kokkos_Core.hpp>

#include <cmath>
#include <cstdio>
#include <vector>

namespace {
using Space = Kokkos::DefaultExecutionSpace;
using M = Space::memory_space;

// g = x - target and the loss 0.5 ||x - target||^2.
double gradient(const Kokkos::View<float*, M>& x, const Kokkos::View<float*, M>& target,
                const Kokkos::View<float*, M>& g) {
  double loss = 0;
  Kokkos::parallel_reduce(
      "gradient", Kokkos::RangePolicy<Space>(0, static_cast<int>(x.extent(0))),
      KOKKOS_LAMBDA(int i, double& l) {
        g(i) = x(i) - target(i);
        l += 0.5 * static_cast<double>(g(i)) * static_cast<double>(g(i));
      },
      loss);
  return loss;
}

void fill(const Kokkos::View<float*, M>& v, int salt) {
  Kokkos::parallel_for(
      "fill", Kokkos::RangePolicy<Space>(0, static_cast<int>(v.extent(0))),
      KOKKOS_LAMBDA(int i) { v(i) = 0.1f * static_cast<float>((i * 37 + salt) % 17 - 8) / 8.0f; });
}
}  // namespace

int main(int argc, char** argv) {
  Kokkos::ScopeGuard guard(argc, argv);
  using P = lather::TensorRef<float, M>;
  constexpr int rows = 256, cols = 128;
  Kokkos::View<float*, M> target_w("tw", rows * cols), target_b("tb", rows);
  fill(target_w, 1);
  fill(target_b, 2);

  // [usage]
  Kokkos::View<float*, M> w("w", rows * cols), b("b", rows), gw("gw", rows * cols), gb("gb", rows);
  std::vector<P> matrices{P(w.data(), {rows, cols})}, vectors{P(b.data(), {rows})};
  std::vector<lather::ParamGroup<P, lather::GaLoreOptions>> groups{
      {matrices, {.lr = 1e-2, .weight_decay = 0.0, .rank = 32, .update_proj_gap = 50, .quantize_states = true}},
      {vectors, {.lr = 1e-2, .rank = 0}}};  // rank 0: plain AdamW (biases, norms)
  lather::GaLoreAdamW<P, Space> opt(groups);
  const std::vector<P> grads{P(gw.data(), {rows, cols}), P(gb.data(), {rows})};
  // ... fill gw and gb, then:
  opt.step(grads);
  // [usage]

  double first = gradient(w, target_w, gw) + gradient(b, target_b, gb), loss = first;
  for (int t = 0; t < 300; ++t) {
    loss = gradient(w, target_w, gw) + gradient(b, target_b, gb);
    opt.step(grads);
  }
  // AdamW would hold 2 floats per element: 2 * (256 * 128 + 256) * 4 bytes.
  const double adamw = 2.0 * (rows * cols + rows) * 4;
  std::printf("loss %.4f -> %.4f; state %zu bytes (AdamW %.0f: %.1f%%), 8-bit: %s\n", first, loss,
              opt.state_bytes(), adamw, 100.0 * static_cast<double>(opt.state_bytes()) / adamw,
              opt.layout(0).quantized ? "yes" : "no");
  return loss < 0.5 * first && opt.layout(0).quantized ? 0 : 1;
}
