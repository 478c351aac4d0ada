// SPDX-License-Identifier: Apache-2.0
// Step time of Shampoo's preconditioner policies (docs/shampoo-family.md) on the "gpt2-block"
// parameter set of docs/performance.md at block size 256, float32, Adam grafting: classic
// root-inverse Shampoo (EigenRootInverse, the reference line), eigendecomposed Shampoo (eigh),
// eigenvalue-corrected Shampoo (eigh), SOAP (one QR iteration) and KL-Shampoo (EigenRootInverse).
// Amortized computations every 2 steps from step 2, so that steady steps (preconditioned, no
// refresh) and root steps (the amortized refresh) alternate: `<policy>/steady` times the steady
// steps only, `<policy>/root` the root steps only (manual time, one step per iteration; the other
// kind runs untimed in between). The suite (bench_suite.cpp) times classic Shampoo in detail; this
// driver is for the policies' cost against it. Kokkos' default execution space (the host's here;
// on a GPU build the device's, whose rotations are the portable kernels).
//   OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 ./benchmarks/lather_bench_shampoo_family
#include <lather/grafting/grafting.hpp>
#include <lather/optimizers/shampoo.hpp>
#include <lather/preconditioners/eigendecomposition.hpp>
#include <lather/preconditioners/preconditioners.hpp>
#include <lather/root_inverse/eigen_root_inverse.hpp>

#include <Kokkos_Core.hpp>

#include <benchmark/benchmark.h>

#include <chrono>
#include <cstdint>
#include <random>
#include <span>
#include <string>
#include <vector>

namespace {

using ExecSpace = Kokkos::DefaultExecutionSpace;
using M = ExecSpace::memory_space;
using P = lather::TensorRef<float, M>;

struct Gpt2Block {
  std::vector<std::vector<std::int64_t>> shapes{{2304, 768}, {2304}, {768, 768},  {768}, {3072, 768}, {3072},
                                                {768, 3072}, {768},  {768},       {768}, {768},       {768}};
  std::vector<Kokkos::View<float*, M>> storage, grad_storage;
  std::vector<P> params;
  std::vector<lather::TensorRef<const float, M>> grads;
  Gpt2Block() {
    std::mt19937 rng(1);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    for (const auto& s : shapes) {
      std::int64_t n = 1;
      for (auto e : s) n *= e;
      storage.emplace_back("p", n);
      grad_storage.emplace_back("g", n);
      const auto ph = Kokkos::create_mirror_view(storage.back());
      const auto gh = Kokkos::create_mirror_view(grad_storage.back());
      for (std::int64_t i = 0; i < n; ++i) {
        ph(i) = 0.01f * normal(rng);
        gh(i) = normal(rng);
      }
      Kokkos::deep_copy(storage.back(), ph);
      Kokkos::deep_copy(grad_storage.back(), gh);
      params.emplace_back(storage.back().data(), std::span<const std::int64_t>(s));
      grads.emplace_back(grad_storage.back().data(), std::span<const std::int64_t>(s));
    }
  }
};

template <class Policy>
void bench_policy(benchmark::State& state, Policy policy, bool root) {
  Gpt2Block set;
  lather::ShampooOptions o;
  o.lr = 1e-4;
  o.max_preconditioner_dim = 256;
  o.precondition_frequency = 2;
  o.start_preconditioning_step = 2;
  o.epsilon = 1e-6;
  lather::Shampoo<P, ExecSpace, Policy, lather::AdamGrafting> opt(std::span<P>(set.params), o, policy,
                                                                  lather::AdamGrafting{.beta2 = 0.999, .epsilon = 1e-8});
  const ExecSpace space;
  for (int t = 0; t < 3; ++t) opt.step(space, set.grads);  // step 1 grafts, 2 refreshes, 3 is steady
  for (auto _ : state) {
    // The step before the timed one is of the other kind; step t + 1 is a root step for odd t.
    opt.step(space, set.grads);
    if (opt.last_step_info().amortized == root) opt.step(space, set.grads);
    space.fence();
    const auto start = std::chrono::steady_clock::now();
    opt.step(space, set.grads);
    space.fence();
    state.SetIterationTime(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
    if (opt.last_step_info().amortized != root) state.SkipWithError("timed the wrong kind of step");
  }
  state.counters["state_MB"] = static_cast<double>(opt.state_bytes()) * 1e-6;
  state.counters["workspace_MB"] = static_cast<double>(opt.workspace_bytes()) * 1e-6;
}

template <class Policy>
void register_policy(const char* name, Policy policy) {
  for (const bool root : {false, true}) {
    benchmark::RegisterBenchmark((std::string("shampoo_family/") + name + "/gpt2-block/256/" + (root ? "root" : "steady")).c_str(),
                                 [policy, root](benchmark::State& s) { bench_policy(s, policy, root); })
        ->UseManualTime()
        ->Unit(benchmark::kMillisecond)
        ->Iterations(3);
  }
}

}  // namespace

int main(int argc, char** argv) {
  Kokkos::ScopeGuard kokkos(argc, argv);
  register_policy("root_inverse", lather::EigenRootInverse{});
  register_policy("eigendecomposed", lather::EigendecomposedShampoo<>{});
  register_policy("eigenvalue_corrected", lather::EigenvalueCorrectedShampoo<>{});
  register_policy("soap", lather::SOAP{});
  register_policy("kl_root_inverse", lather::KLShampoo<>{});
  benchmark::Initialize(&argc, argv);
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
