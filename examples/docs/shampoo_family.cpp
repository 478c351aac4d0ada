// SPDX-License-Identifier: Apache-2.0
// docs/shampoo-family.md: the least-squares fit of shampoo_least_squares.cpp with SOAP, with Muon
// (the weight in a spectral-descent group, the bias in a group that never preconditions) and with
// Schedule-Free averaging; the lines between the [name] markers are the snippets in the docs.
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
  using Space = Kokkos::DefaultHostExecutionSpace;
  const Space space;
  int failures = 0;
  auto report = [&](const char* name, float initial, float final_loss, float factor) {
    std::printf("%-22s loss %.3e -> %.3e in 300 steps\n", name, initial, final_loss);
    failures += final_loss < factor * initial ? 0 : 1;
  };
  {
    Fit fit;
    auto& [weight, bias, gw, gb, params, grads] = fit;
    const float initial = loss_of(problem, weight, bias);
    // [soap]
    // SOAP: Adam in the eigenbasis of the Shampoo factors, refreshed by one QR iteration every 10 steps.
    lather::Shampoo<lather::TensorRef<float>, Space, lather::SOAP> opt(
        params, {.lr = 1e-1, .betas = {0.9, 0.999}, .epsilon = 1e-8, .precondition_frequency = 10});
    for (int step = 0; step < 300; ++step) {
      problem.loss_and_grad(weight, bias, gw, gb);
      opt.step(space, grads);
    }
    // [soap]
    report("SOAP", initial, loss_of(problem, weight, bias), 1e-3f);
  }
  {
    Fit fit;
    auto& [weight, bias, gw, gb, params, grads] = fit;
    const float initial = loss_of(problem, weight, bias);
    // [muon]
    // Muon: the weight is orthogonalized by Newton-Schulz; the bias, a vector, goes in a group that
    // never preconditions (it takes Gbar, the bias-corrected momentum).
    using Muon = lather::Shampoo<lather::TensorRef<float>, Space, lather::Muon>;
    std::vector<lather::TensorRef<float>> matrices{lather::TensorRef<float>(weight.data(), {out, in})};
    std::vector<lather::TensorRef<float>> vectors{lather::TensorRef<float>(bias.data(), {out})};
    Muon opt(std::vector<Muon::group_type>{
                 {matrices, {.lr = 2e-2, .betas = {0.95, 0.999}, .max_preconditioner_dim = lather::unbounded}},
                 {vectors, {.lr = 2e-2, .betas = {0.95, 0.999}, .start_preconditioning_step = lather::never}}},
             lather::Muon{.scale_by_dims = lather::sqrt_max1_dout_over_din});
    for (int step = 0; step < 300; ++step) {
      problem.loss_and_grad(weight, bias, gw, gb);
      opt.step(space, grads);
    }
    // [muon]
    // Muon's fixed-size steps hover around the minimum instead of converging: a looser bar.
    report("Muon", initial, loss_of(problem, weight, bias), 2e-2f);
  }
  {
    Fit fit;
    auto& [weight, bias, gw, gb, params, grads] = fit;
    const float initial = loss_of(problem, weight, bias);
    // [schedule_free]
    // Schedule-Free averaging on top of Shampoo: train on y, evaluate the average x.
    lather::Shampoo<lather::TensorRef<float>, Space, lather::EigenRootInverse, lather::AdamGrafting> opt(
        params, {.lr = 2e-1, .betas = {0.0, 0.999}, .epsilon = 1e-12, .precondition_frequency = 10,
                 .iterate_averaging = lather::IterateAveraging::schedule_free, .train_interp_coeff = 0.9},
        {}, {.beta2 = 0.999, .epsilon = 1e-8});
    for (int step = 0; step < 300; ++step) {
      problem.loss_and_grad(weight, bias, gw, gb);
      opt.step(space, grads);
    }
    opt.eval();   // the parameters now hold x, the averaged iterate
    const float evaluated = loss_of(problem, weight, bias);
    opt.train();  // back to y before the next step()
    // [schedule_free]
    report("Schedule-Free Shampoo", initial, evaluated, 1e-3f);
  }
  return failures;
}
