// SPDX-License-Identifier: Apache-2.0
// docs/state.md: parameter groups with their own options (decay on weights, none on biases),
// named parameters, and a learning-rate change between steps.
#include <lather/lather.hpp>

#include <Kokkos_Core.hpp>

#include <cstdio>
#include <span>
#include <vector>

int main(int argc, char** argv) {
  Kokkos::ScopeGuard guard(argc, argv);
  std::vector<float> w1(6, 1.0f), w2(4, 1.0f), b1(3, 1.0f), b2(2, 1.0f);
  std::vector<lather::TensorRef<float, Kokkos::HostSpace>> weights{
      lather::TensorRef<float, Kokkos::HostSpace>(w1.data(), {3, 2}),
      lather::TensorRef<float, Kokkos::HostSpace>(w2.data(), {2, 2})};
  std::vector<lather::TensorRef<float, Kokkos::HostSpace>> biases{
      lather::TensorRef<float, Kokkos::HostSpace>(b1.data(), {3}),
      lather::TensorRef<float, Kokkos::HostSpace>(b2.data(), {2})};

  // [groups]
  using P = lather::TensorRef<float, Kokkos::HostSpace>;
  std::vector<lather::ParamGroup<P, lather::AdamWOptions>> groups{
      {.params = std::span(weights), .options = {.lr = 1e-3, .weight_decay = 0.1}, .names = {"fc1.w", "fc2.w"}},
      {.params = std::span(biases), .options = {.lr = 1e-3, .weight_decay = 0.0}}};
  lather::AdamW<P> opt(groups);
  // [groups]

  // Zero gradients: AdamW then only applies its decoupled decay, lr * weight_decay per step.
  std::vector<float> z1(6, 0.0f), z2(4, 0.0f), z3(3, 0.0f), z4(2, 0.0f);
  std::vector<P> grads{P(z1.data(), {3, 2}), P(z2.data(), {2, 2}), P(z3.data(), {3}), P(z4.data(), {2})};
  opt.step(grads);
  opt.set_lr(0, 1e-2);  // group 0 only
  opt.step(grads);
  const float expected = (1.0f - 1e-3f * 0.1f) * (1.0f - 1e-2f * 0.1f);
  std::printf("%s: %.7f (expected %.7f); biases unchanged: %.1f\n", opt.param_name(0).c_str(), w1[0], expected, b1[0]);
  return (std::abs(w1[0] - expected) < 1e-6f && b1[0] == 1.0f) ? 0 : 1;
}
