// SPDX-License-Identifier: Apache-2.0
// The ColossalAI family (Adafactor, CAME, LAMB, GaLore-AdamW) allocates nothing on the heap after
// its first step (docs/performance.md's allocation rule, which Shampoo's and AdamW's steps meet in
// test_host_blas.cpp): steps 2 to 8 are counted one by one, with factored and unfactored
// parameters (sizes 1 and 3 among them), several parameter groups, a parameter whose gradient
// is absent on every other step (the step's lists change length), and GaLore's projector
// refreshes (update_proj_gap 3: steps 4 and 7 gather the gradient and take its SVD) with right
// and left projections, full-precision and 8-bit states. The counter is this executable's global
// operator new (tests/harness/heap_count.hpp; Kokkos View allocations count too).
//
// Each optimizer's counted steps also change its parameters (an optimizer that skipped its work
// would allocate nothing too).
#include <lather/optimizers/adafactor.hpp>
#include <lather/optimizers/came.hpp>
#include <lather/optimizers/galore.hpp>
#include <lather/optimizers/lamb.hpp>

#include <Kokkos_Core.hpp>

#include <doctest/doctest.h>

#include "exec_spaces.hpp"
#include "heap_count.hpp"
#include "test_utils.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <numeric>
#include <span>
#include <string>
#include <vector>

#if LATHER_TEST_COUNTS_STEPS  // (heap_count.hpp: host compilers, Kokkos 3.4)
namespace {

using lather::test::heap_allocations;

template <class ExecSpace>
struct Problem {
  using M = typename ExecSpace::memory_space;
  using P = lather::TensorRef<float, M>;
  using G = lather::TensorRef<const float, M>;
  // A matrix, a 4-D convolution weight (factored over its last two dimensions, projected by
  // GaLore as (16, 72): a left projection), a bias, a small matrix and a size-1 parameter.
  std::vector<std::vector<std::int64_t>> shapes{{64, 32}, {16, 8, 3, 3}, {32}, {5, 3}, {1}};
  std::vector<Kokkos::View<float*, M>> values, grad_values;
  std::vector<P> params;
  std::vector<G> grads, some_grads;  // some_grads: the bias has no gradient

  Problem() {
    for (std::size_t i = 0; i < shapes.size(); ++i) {
      const auto n = static_cast<std::size_t>(
          std::accumulate(shapes[i].begin(), shapes[i].end(), std::int64_t{1}, std::multiplies<>()));
      values.emplace_back("p", n);
      grad_values.emplace_back("g", n);
      auto hp = Kokkos::create_mirror_view(values.back());
      auto hg = Kokkos::create_mirror_view(grad_values.back());
      for (std::size_t k = 0; k < n; ++k) {
        hp(k) = 0.1f + 0.01f * static_cast<float>((k * 31 + i) % 17);
        hg(k) = 0.01f * static_cast<float>(static_cast<std::int64_t>((k * 7919 + 13 * i) % 101) - 50);
      }
      Kokkos::deep_copy(values.back(), hp);
      Kokkos::deep_copy(grad_values.back(), hg);
      params.emplace_back(values.back().data(), std::span<const std::int64_t>(shapes[i]));
      grads.emplace_back(grad_values.back().data(), std::span<const std::int64_t>(shapes[i]));
      some_grads.push_back(i == 2 ? G{} : grads.back());
    }
  }
  std::vector<double> snapshot() const {
    std::vector<double> out;
    for (const auto& v : values) {
      auto h = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), v);
      for (std::size_t k = 0; k < h.extent(0); ++k) out.push_back(static_cast<double>(h(k)));
    }
    return out;
  }
};

// Step 1 uncounted, then steps 2 to 8 each counted (odd steps without the bias's gradient when
// `gaps`); the parameters must have changed over the counted steps.
template <class ExecSpace, class Opt>
void check_steps(const std::string& what, Opt& opt, Problem<ExecSpace>& prob, bool gaps = true) {
  const ExecSpace space;
  opt.step(space, prob.grads);
  space.fence();
  const auto before = prob.snapshot();
  for (int t = 2; t <= 8; ++t) {
    const auto& g = gaps && t % 2 == 1 ? prob.some_grads : prob.grads;
    const auto n = heap_allocations([&] {
      opt.step(space, g);
      space.fence();
    });
    INFO(what, ": step ", t, std::string(gaps && t % 2 == 1 ? " (bias without gradient)" : ""), ": ", n,
         " heap allocations");
    CHECK(n == 0);
  }
  const auto after = prob.snapshot();
  double change = 0;
  for (std::size_t k = 0; k < after.size(); ++k) change = std::max(change, std::abs(after[k] - before[k]));
  INFO(what);
  CHECK(change > 0.0);
}

}  // namespace

TEST_CASE_TEMPLATE_DEFINE("allocations: Adafactor, CAME, LAMB and GaLore steps allocate nothing after the first",
                          ExecSpace, family_allocations) {
  using Prob = Problem<ExecSpace>;
  using P = typename Prob::P;
  {
    Prob prob;
    lather::Adafactor<P, ExecSpace> opt(std::span<P>(prob.params), lather::AdafactorOptions{});
    check_steps("Adafactor (relative step)", opt, prob);
  }
  {
    // Two groups: a first moment, weight decay and a fixed lr on the matrices; the rest default.
    Prob prob;
    using Group = lather::ParamGroup<P, lather::AdafactorOptions>;
    std::vector<Group> groups{
        Group{std::span<P>(prob.params).subspan(0, 2),
              lather::AdafactorOptions{.lr = 1e-2, .beta1 = 0.9, .weight_decay = 1e-2, .relative_step = false}},
        Group{std::span<P>(prob.params).subspan(2), lather::AdafactorOptions{.scale_parameter = false}}};
    lather::Adafactor<P, ExecSpace> opt(std::move(groups));
    check_steps("Adafactor (two groups, beta1)", opt, prob);
  }
  {
    Prob prob;
    lather::CAME<P, ExecSpace> opt(std::span<P>(prob.params), lather::CAMEOptions{.lr = 1e-3, .weight_decay = 1e-2});
    check_steps("CAME", opt, prob);
  }
  for (const auto formula : {lather::LambFormula::apex, lather::LambFormula::colossalai}) {
    Prob prob;
    lather::LambOptions o{.lr = 1e-3, .weight_decay = 1e-2};
    o.formula = formula;
    o.max_grad_norm = formula == lather::LambFormula::apex ? 0.5 : 0.0;  // apex: the clipping path too
    lather::Lamb<P, ExecSpace> opt(std::span<P>(prob.params), o);
    check_steps(formula == lather::LambFormula::apex ? "LAMB (apex)" : "LAMB (colossalai)", opt, prob);
  }
  for (const bool quantized : {false, true}) {
    // Rank 4, projectors refreshed at steps 1, 4 and 7: (64, 32) right, (16, 72) left.
    Prob prob;
    lather::GaLoreOptions o{.lr = 1e-3, .weight_decay = 1e-2, .rank = 4, .update_proj_gap = 3};
    o.quantize_states = quantized;
    o.min_8bit_size = 0;
    o.block_size = 64;
    lather::GaLoreAdamW<P, ExecSpace> opt(std::span<P>(prob.params), o);
    REQUIRE(opt.layout(0).projected);
    REQUIRE(opt.layout(0).right);
    REQUIRE(opt.layout(1).projected);
    REQUIRE(!opt.layout(1).right);
    // No gaps: a projected parameter without a gradient at a refresh step would shift its refresh.
    check_steps(quantized ? "GaLore (8-bit states)" : "GaLore", opt, prob, false);
    // The refreshes keep their buffers: at least the (64, 32) gradient, its U (64 x 32), V^T
    // (32 x 32) and singular values. Released, they are rebuilt by the next refresh (step 10)
    // only: steady step 9 allocates nothing, refresh step 10 allocates, 11 to 13 nothing.
    CHECK(opt.refresh_buffer_bytes() >= (2048 + 2048 + 1024 + 32) * sizeof(float));
    opt.release_refresh_buffers();
    CHECK(opt.refresh_buffer_bytes() == 0);
    const ExecSpace space;
    const auto step = [&] {
      opt.step(space, prob.grads);
      space.fence();
    };
    CHECK(heap_allocations(step) == 0);
    CHECK(heap_allocations(step) > 0);
    for (int t = 11; t <= 13; ++t) CHECK(heap_allocations(step) == 0);
    CHECK(opt.refresh_buffer_bytes() >= (2048 + 2048 + 1024 + 32) * sizeof(float));
  }
  {
    // A strided (LayoutLeft) weight: its refreshes pack the gradient on the execution space
    // first, into a kept buffer.
    using M = typename ExecSpace::memory_space;
    using L = Kokkos::View<float**, Kokkos::LayoutLeft, M>;
    L w("test::w", 24, 10), g("test::g", 24, 10);
    Kokkos::deep_copy(w, 0.5f);
    auto h = Kokkos::create_mirror_view(g);
    for (int i = 0; i < 24; ++i)
      for (int j = 0; j < 10; ++j) h(i, j) = 0.01f * static_cast<float>((i * 7 + j * 13) % 23 - 11);
    Kokkos::deep_copy(g, h);
    std::vector<L> params{w}, grads{g};
    lather::GaLoreAdamW<L, ExecSpace> opt(std::span<L>(params), lather::GaLoreOptions{.rank = 3, .update_proj_gap = 3});
    REQUIRE(opt.layout(0).projected);
    const ExecSpace space;
    const auto step = [&] {
      opt.step(space, grads);
      space.fence();
    };
    step();
    for (int t = 2; t <= 8; ++t) {
      const auto n = heap_allocations(step);
      INFO("GaLore, LayoutLeft weight: step ", t, ": ", n, " heap allocations");
      CHECK(n == 0);
    }
  }
}
TEST_CASE_TEMPLATE_APPLY(family_allocations, lather_test_exec_spaces);
#endif
