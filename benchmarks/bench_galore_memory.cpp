// SPDX-License-Identifier: Apache-2.0
// GaLore's memory and step time (docs/galore.md), float32 parameters:
//
// - BM_StateBytes/<optimizer>[/rank]: optimizer-state bytes of one LLaMA-7B decoder layer's
//   matrices (q, k, v, o: 4096 x 4096; gate, up: 11008 x 4096; down: 4096 x 11008), measured with
//   state_bytes() on optimizers that really allocate (one matrix at a time, so the peak stays at
//   ~0.7 GB), for AdamW, GaLore fp32 and GaLore 8-bit at ranks 128, 256 and 1024. Counters:
//   state_bytes (per layer), bytes_per_param, vs_adamw (fraction of AdamW's state).
// - BM_Step/<optimizer>[/rank]: the time of one step on a quarter-scale layer (1024 x 1024 x 4,
//   2752 x 1024 x 2, 1024 x 2752; ranks 32, 64, 256: the same rank / dimension ratios), which two
//   CPU cores can run: a step without SVD (update_proj_gap larger than the run) and
//   BM_RefreshStep, a step with the SVD refresh (host LAPACK).
#include <lather/lather.hpp>

#include <Kokkos_Core.hpp>

#include <benchmark/benchmark.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

namespace {

using ExecSpace = Kokkos::DefaultExecutionSpace;
using M = ExecSpace::memory_space;
using P = lather::TensorRef<float, M>;

using Shape = std::vector<std::int64_t>;
const std::vector<Shape> kLayer = {{4096, 4096}, {4096, 4096}, {4096, 4096}, {4096, 4096},
                                   {11008, 4096}, {11008, 4096}, {4096, 11008}};
const std::vector<Shape> kQuarterLayer = {{1024, 1024}, {1024, 1024}, {1024, 1024}, {1024, 1024},
                                          {2752, 1024}, {2752, 1024}, {1024, 2752}};

std::int64_t numel(const Shape& s) { return s[0] * s[1]; }

// A full-rank gradient: a smooth pattern plus a diagonal. (A free function: nvcc refuses
// extended lambdas in constructors.)
void fill_gradient(const Kokkos::View<float*, M>& g, std::int64_t cols) {
  Kokkos::parallel_for(
      "fill", Kokkos::RangePolicy<ExecSpace, Kokkos::IndexType<std::int64_t>>(0, static_cast<std::int64_t>(g.extent(0))),
      KOKKOS_LAMBDA(std::int64_t e) {
        const std::int64_t i = e / cols, j = e % cols;
        g(e) = 1e-3f * static_cast<float>((i * 7 + j * 13) % 101 - 50) / 50.0f + (i == j ? 1e-3f : 0.0f);
      });
}

struct Matrices {
  std::vector<Kokkos::View<float*, M>> storage, grad_storage;
  std::vector<P> params, grads;
  std::int64_t numel = 0;
  explicit Matrices(const std::vector<Shape>& shapes) {
    for (const auto& s : shapes) {
      const std::int64_t n = ::numel(s);
      numel += n;
      storage.emplace_back("p", n);
      grad_storage.emplace_back("g", n);
      Kokkos::deep_copy(storage.back(), 0.01f);
      fill_gradient(grad_storage.back(), s[1]);
      params.emplace_back(storage.back().data(), s);
      grads.emplace_back(grad_storage.back().data(), s);
    }
    Kokkos::fence();
  }
};

enum class Kind { adamw, galore32, galore8 };

lather::GaLoreOptions galore_options(Kind kind, std::int64_t rank, std::int64_t gap) {
  return lather::GaLoreOptions{.lr = 1e-3, .weight_decay = 0.0, .rank = rank, .update_proj_gap = gap,
                               .quantize_states = kind == Kind::galore8};
}

std::size_t adamw_state_bytes(Matrices& m) {
  lather::AdamW<P, ExecSpace> opt(m.params, lather::AdamWOptions{});
  opt.step(ExecSpace(), m.grads);  // AdamW's buffers exist from the first step on
  std::size_t bytes = 0;
  for (std::size_t i = 0; i < m.params.size(); ++i)
    for (const char* name : {"exp_avg", "exp_avg_sq"}) bytes += opt.state(i, name).span() * sizeof(float);
  return bytes;
}

void BM_StateBytes(benchmark::State& state, Kind kind) {
  const std::int64_t rank = kind == Kind::adamw ? 0 : state.range(0);
  std::size_t bytes = 0, adamw = 0, workspace = 0;
  std::int64_t params = 0;
  for (auto _ : state) {
    bytes = adamw = workspace = 0;
    params = 0;
    for (const auto& s : kLayer) {
      Matrices m({s});
      params += m.numel;
      adamw += adamw_state_bytes(m);
      if (kind == Kind::adamw) continue;
      lather::GaLoreAdamW<P, ExecSpace> opt(std::span<P>(m.params), galore_options(kind, rank, 200));
      bytes += opt.state_bytes();
      workspace = std::max(workspace, opt.workspace_bytes());  // one optimizer over the layer shares one
    }
    if (kind == Kind::adamw) bytes = adamw;
  }
  state.counters["params"] = static_cast<double>(params);
  state.counters["state_bytes"] = static_cast<double>(bytes);
  state.counters["bytes_per_param"] = static_cast<double>(bytes) / static_cast<double>(params);
  state.counters["vs_adamw"] = static_cast<double>(bytes) / static_cast<double>(adamw);
  state.counters["workspace_bytes"] = static_cast<double>(workspace);
}

void BM_Step(benchmark::State& state, Kind kind, bool refresh) {
  const std::int64_t rank = kind == Kind::adamw ? 0 : state.range(0);
  Matrices m(kQuarterLayer);
  const ExecSpace space;
  const auto run = [&](auto& opt) {
    opt.step(space, m.grads);  // the first step takes the SVDs: outside the timing unless `refresh`
    space.fence();
    for (auto _ : state) {
      opt.step(space, m.grads);
      space.fence();
    }
  };
  if (kind == Kind::adamw) {
    lather::AdamW<P, ExecSpace> opt(m.params, lather::AdamWOptions{});
    run(opt);
  } else {
    // gap 1: every step refreshes the projector; a gap larger than the run: none does.
    lather::GaLoreAdamW<P, ExecSpace> opt(std::span<P>(m.params), galore_options(kind, rank, refresh ? 1 : 1000000));
    run(opt);
    state.counters["state_bytes"] = static_cast<double>(opt.state_bytes());
  }
  state.counters["params"] = static_cast<double>(m.numel);
}

}  // namespace

BENCHMARK_CAPTURE(BM_StateBytes, adamw, Kind::adamw)->Iterations(1)->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_StateBytes, galore_fp32, Kind::galore32)
    ->Arg(128)->Arg(256)->Arg(1024)->Iterations(1)->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_StateBytes, galore_8bit, Kind::galore8)
    ->Arg(128)->Arg(256)->Arg(1024)->Iterations(1)->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_Step, adamw, Kind::adamw, false)->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_Step, galore_fp32, Kind::galore32, false)
    ->Arg(32)->Arg(64)->Arg(256)->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_Step, galore_8bit, Kind::galore8, false)
    ->Arg(32)->Arg(64)->Arg(256)->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_Step, galore_fp32_refresh, Kind::galore32, true)
    ->Arg(64)->Iterations(2)->Unit(benchmark::kMillisecond);

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
