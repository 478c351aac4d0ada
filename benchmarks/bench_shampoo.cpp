// SPDX-License-Identifier: Apache-2.0
// Shampoo's step time on the "mlp" parameter set of docs/benchmarks.md (float32): (512,784),
// (512,), (256,512), (256,), (10,256), (10,), default options (max_preconditioner_dim 1024, so
// each matrix has two factors), Adam grafting. Reported separately: a plain step (factor updates
// and preconditioning, no root inverses: precondition_frequency larger than the run) and the
// amortized step (every step computes every inverse root), whose cost is spread over
// precondition_frequency steps in practice. Counters: optimizer state bytes.
#include <lather/lather.hpp>
#include <lather/optimizers/shampoo.hpp>
#include <lather/root_inverse/root_inverse.hpp>

#include <Kokkos_Core.hpp>
#include <Kokkos_Random.hpp>

#include <benchmark/benchmark.h>

#include <cstdint>
#include <vector>

namespace {

using ExecSpace = Kokkos::DefaultExecutionSpace;
using M = ExecSpace::memory_space;
using P = lather::TensorRef<float, M>;

struct Mlp {
  std::vector<Kokkos::View<float*, M>> storage, grad_storage;
  std::vector<P> params, grads;
  Mlp() {
    const std::vector<std::vector<std::int64_t>> shapes = {{512, 784}, {512}, {256, 512}, {256}, {10, 256}, {10}};
    std::uint64_t seed = 1;
    for (const auto& s : shapes) {
      std::int64_t n = 1;
      for (auto e : s) n *= e;
      storage.emplace_back("p", n);
      grad_storage.emplace_back("g", n);
      Kokkos::Random_XorShift64_Pool<ExecSpace> pool(seed++);
      Kokkos::fill_random(storage.back(), pool, -0.05f, 0.05f);
      Kokkos::fill_random(grad_storage.back(), pool, -0.01f, 0.01f);
      params.emplace_back(storage.back().data(), s);
      grads.emplace_back(grad_storage.back().data(), s);
    }
  }
};

template <class RootInverse>
void run(benchmark::State& state, std::int64_t frequency, const RootInverse& root, double epsilon = 1e-8) {
  Mlp mlp;
  lather::Shampoo<P, ExecSpace, RootInverse, lather::AdamGrafting> opt(
      mlp.params, {.lr = 1e-3, .betas = {0.9, 0.999}, .epsilon = epsilon, .precondition_frequency = frequency}, root,
      {.epsilon = 1e-8});
  const ExecSpace space;
  opt.step(space, mlp.grads);  // step 1 computes the roots (t == start step); not timed
  for (auto _ : state) {
    opt.step(space, mlp.grads);
    space.fence();
  }
  double bytes = 0;
  for (const auto& [name, t] : opt.state_dict().tensors) bytes += static_cast<double>(t.stored_size() * 4);
  state.counters["state_bytes"] = bytes;
}

void BM_Shampoo_step(benchmark::State& s) { run(s, 1 << 30, lather::EigenRootInverse{}); }
void BM_Shampoo_amortized_eigen(benchmark::State& s) { run(s, 1, lather::EigenRootInverse{}); }
// The benchmark's gradients repeat, so the factors are rank-deficient; in float, coupled Newton
// needs a larger epsilon than the default 1e-8 to stay finite there (the reference behaves alike).
void BM_Shampoo_amortized_newton(benchmark::State& s) { run(s, 1, lather::CoupledNewtonRootInverse{}, 1e-3); }

}  // namespace

BENCHMARK(BM_Shampoo_step)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_Shampoo_amortized_eigen)->Unit(benchmark::kMillisecond)->Iterations(5);
BENCHMARK(BM_Shampoo_amortized_newton)->Unit(benchmark::kMillisecond)->Iterations(5);

int main(int argc, char** argv) {
  Kokkos::ScopeGuard guard(argc, argv);
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::AddCustomContext("lather", lather::version_string);
  benchmark::AddCustomContext("kokkos_execution_space", ExecSpace::name());
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
