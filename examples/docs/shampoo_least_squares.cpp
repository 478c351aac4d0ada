// SPDX-License-Identifier: Apache-2.0
// docs/shampoo.md: Shampoo with Adam grafting fits a 16 x 8 linear map and a bias by least
// squares; the lines between the [usage] markers are the snippet shown in the docs.
#include <lather/lather.hpp>

#include "least_squares.hpp"

#include <Kokkos_Core.hpp>

#include <cmath>
#include <cstdio>
#include <vector>

using namespace example;

int main(int argc, char** argv) {
  Kokkos::ScopeGuard guard(argc, argv);
  const Problem problem;
  std::vector<float> weight(out * in, 0.0f), bias(out, 0.0f), gw(out * in), gb(out);
  const float initial = loss_of(problem, weight, bias);

  // [usage]
  using Space = Kokkos::DefaultHostExecutionSpace;
  std::vector<lather::TensorRef<float>> params{lather::TensorRef<float>(weight.data(), {out, in}),
                                               lather::TensorRef<float>(bias.data(), {out})};
  std::vector<lather::TensorRef<float>> grads{lather::TensorRef<float>(gw.data(), {out, in}),
                                              lather::TensorRef<float>(gb.data(), {out})};
  lather::Shampoo<lather::TensorRef<float>, Space, lather::EigenRootInverse, lather::AdamGrafting> opt(
      params, {.lr = 1e-1, .betas = {0.9, 0.999}, .epsilon = 1e-12, .precondition_frequency = 10},
      lather::EigenRootInverse{}, lather::AdamGrafting{.beta2 = 0.999, .epsilon = 1e-8});
  const Space space;
  for (int step = 0; step < 300; ++step) {
    problem.loss_and_grad(weight, bias, gw, gb);  // your model's backward pass
    opt.step(space, grads);
  }
  // [usage]

  const float final_loss = loss_of(problem, weight, bias);
  std::printf("Shampoo (Adam grafting): loss %.3e -> %.3e in 300 steps\n", initial, final_loss);
  return final_loss < 1e-3f * initial ? 0 : 1;
}
