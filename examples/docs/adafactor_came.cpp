// SPDX-License-Identifier: Apache-2.0
// docs/adafactor.md and docs/came.md: Adafactor (HuggingFace's defaults: relative step, parameter
// scale) and CAME on one device, minimizing 0.5 ||W - T||^2 + 0.5 ||b - t||^2 for a (256, 128)
// weight and its bias (gradients W - T and b - t: full rank); checks that both losses fall and
// prints each optimizer's state bytes next to Adam's 2 x the parameters.
#include <lather/optimizers/adafactor.hpp>
#include <lather/optimizers/came.hpp>

#include <Kokkos_Core.hpp>

#include <cstdio>
#include <vector>

namespace {
using Space = Kokkos::DefaultExecutionSpace;
using M = Space::memory_space;
constexpr int rows = 256, cols = 128;

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

void fill(const Kokkos::View<float*, M>& v, int salt, float scale) {
  Kokkos::parallel_for(
      "fill", Kokkos::RangePolicy<Space>(0, static_cast<int>(v.extent(0))),
      KOKKOS_LAMBDA(int i) { v(i) = scale * static_cast<float>((i * 37 + salt) % 17 - 8) / 8.0f; });
}

// Runs `steps` steps of `opt` from the same start; returns the final loss over the first.
template <class Opt>
double train(Opt& opt, const Kokkos::View<float*, M>& w, const Kokkos::View<float*, M>& b,
             const Kokkos::View<float*, M>& gw, const Kokkos::View<float*, M>& gb, const std::vector<typename Opt::param_type>& grads,
             int steps) {
  const Kokkos::View<float*, M> tw("tw", w.extent(0)), tb("tb", b.extent(0));
  fill(tw, 1, 0.2f);
  fill(tb, 2, 0.2f);
  const double first = gradient(w, tw, gw) + gradient(b, tb, gb);
  double loss = first;
  for (int t = 0; t < steps; ++t) {
    opt.step(grads);
    loss = gradient(w, tw, gw) + gradient(b, tb, gb);
  }
  return loss / first;
}
}  // namespace

int main(int argc, char** argv) {
  Kokkos::ScopeGuard guard(argc, argv);
  using P = lather::TensorRef<float, M>;
  Kokkos::View<float*, M> w("w", rows * cols), b("b", rows), gw("gw", rows * cols), gb("gb", rows);
  const std::vector<P> grads{P(gw.data(), {rows, cols}), P(gb.data(), {rows})};
  std::vector<P> params{P(w.data(), {rows, cols}), P(b.data(), {rows})};
  const std::size_t adam_bytes = 2 * (rows * cols + rows) * sizeof(float);

  fill(w, 3, 0.05f);
  fill(b, 4, 0.05f);
  // [adafactor]
  // HuggingFace's defaults: relative step min(1e-2, 1/sqrt(t)) scaled by rms(W), no first moment.
  lather::Adafactor<P, Space> adafactor(params, lather::AdafactorOptions{});
  // ... fill gw and gb, then:
  adafactor.step(grads);
  // [adafactor]
  const double ada = train(adafactor, w, b, gw, gb, grads, 200);
  std::printf("Adafactor: loss x %.3f after 200 steps, state %zu bytes (Adam: %zu)\n", ada, adafactor.state_bytes(),
              adam_bytes);

  fill(w, 3, 0.05f);
  fill(b, 4, 0.05f);
  // [came]
  lather::CAME<P, Space> came(params, {.lr = 1e-3, .weight_decay = 0.0});
  // ... fill gw and gb, then:
  came.step(grads);
  // [came]
  const double cm = train(came, w, b, gw, gb, grads, 200);
  std::printf("CAME:      loss x %.3f after 200 steps, state %zu bytes (Adam: %zu)\n", cm, came.state_bytes(), adam_bytes);
  return ada < 0.5 && cm < 0.5 ? 0 : 1;
}
