// SPDX-License-Identifier: Apache-2.0
// Diagonal optimizers' step time on the "mlp" parameter set of docs/benchmarks.md (float32):
// (512,784), (512,), (256,512), (256,), (10,256), (10,). These kernels are memory-bound, so
// the counter that matters is bytes moved per second (parameter, gradient and state reads and
// writes), reported as "bytes_per_second".
#include <lather/lather.hpp>

#include <Kokkos_Core.hpp>

#include <benchmark/benchmark.h>

#include <vector>

namespace {

using ExecSpace = Kokkos::DefaultExecutionSpace;
using M = ExecSpace::memory_space;
using P = lather::TensorRef<float, M>;

struct MlpParams {
  std::vector<Kokkos::View<float*, M>> storage, grad_storage;
  std::vector<P> params, grads;
  std::int64_t numel = 0;
  MlpParams() {
    const std::vector<std::vector<std::int64_t>> shapes = {{512, 784}, {512}, {256, 512}, {256}, {10, 256}, {10}};
    for (const auto& s : shapes) {
      std::int64_t n = 1;
      for (auto e : s) n *= e;
      numel += n;
      storage.emplace_back("p", n);
      grad_storage.emplace_back("g", n);
      Kokkos::deep_copy(storage.back(), 0.5f);
      Kokkos::deep_copy(grad_storage.back(), 0.01f);
      params.emplace_back(storage.back().data(), s);
      grads.emplace_back(grad_storage.back().data(), s);
    }
  }
};

// `streams`: how many float arrays one step reads or writes per element (param r+w, grad r,
// each state buffer r+w).
template <class Opt, class Options>
void run(benchmark::State& state, const Options& options, int streams, bool check_finite = true) {
  MlpParams mlp;
  Opt opt(mlp.params, options);
  opt.set_check_finite(check_finite);
  const ExecSpace space;
  for (auto _ : state) {
    opt.step(space, mlp.grads);
    space.fence();
  }
  state.SetBytesProcessed(state.iterations() * mlp.numel * streams * static_cast<std::int64_t>(sizeof(float)));
  state.counters["params"] = static_cast<double>(mlp.numel);
  state.counters["state_bytes"] = static_cast<double>(mlp.numel * (streams - 3) / 2 * sizeof(float));
}

void BM_SGD(benchmark::State& s) { run<lather::SGD<P, ExecSpace>>(s, lather::SGDOptions{.lr = 0.01}, 3); }
void BM_SGD_momentum(benchmark::State& s) {
  run<lather::SGD<P, ExecSpace>>(s, lather::SGDOptions{.lr = 0.01, .momentum = 0.9}, 5);
}
void BM_Adagrad(benchmark::State& s) { run<lather::Adagrad<P, ExecSpace>>(s, lather::AdagradOptions{}, 5); }
void BM_RMSprop(benchmark::State& s) { run<lather::RMSprop<P, ExecSpace>>(s, lather::RMSpropOptions{}, 5); }
void BM_Adam(benchmark::State& s) { run<lather::Adam<P, ExecSpace>>(s, lather::AdamOptions{}, 7); }
void BM_AdamW(benchmark::State& s) { run<lather::AdamW<P, ExecSpace>>(s, lather::AdamWOptions{}, 7); }
// The same steps without the NaN/Inf gradient check (set_check_finite(false)): its cost.
void BM_SGD_nocheck(benchmark::State& s) { run<lather::SGD<P, ExecSpace>>(s, lather::SGDOptions{.lr = 0.01}, 3, false); }
void BM_Adam_nocheck(benchmark::State& s) { run<lather::Adam<P, ExecSpace>>(s, lather::AdamOptions{}, 7, false); }

}  // namespace

BENCHMARK(BM_SGD)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_SGD_momentum)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_Adagrad)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_RMSprop)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_Adam)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_AdamW)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_SGD_nocheck)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_Adam_nocheck)->Unit(benchmark::kMicrosecond);

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
