// SPDX-License-Identifier: Apache-2.0
// DDP Shampoo's optimizer step under mpiexec (scripts/bench-distributed.sh runs it on 1, 2 and 4
// ranks): the "mlp" and "gpt2-block" parameter sets of ../shared/reference/benchmark-shapes.md,
// float32, Adam grafting, max_preconditioner_dim 256. "steady": factor updates, grafting and
// preconditioning without root inverses (precondition_frequency 100, steps after the 100th);
// "amortized" (mlp only): every step also computes every inverse root. Each iteration is timed
// as the slowest rank's step (barrier, step, barrier; manual time = max over ranks). Counters:
// this rank's optimizer state (the largest over ranks) and the whole group's. Only rank 0 reports.
#include <lather/comm/mpi_communicator.hpp>
#include <lather/optimizers/shampoo.hpp>

#include <Kokkos_Core.hpp>
#include <Kokkos_Random.hpp>

#include <benchmark/benchmark.h>
#include <mpi.h>

#include <chrono>
#include <cstdint>
#include <string_view>
#include <vector>

namespace {

using ExecSpace = Kokkos::DefaultExecutionSpace;
using M = ExecSpace::memory_space;
using P = lather::TensorRef<float, M>;
using Dist = lather::Shampoo<P, ExecSpace, lather::EigenRootInverse, lather::AdamGrafting, lather::ShampooPrecision<>,
                             lather::MpiCommunicator>;

struct Model {
  std::vector<Kokkos::View<float*, M>> storage, grad_storage;
  std::vector<P> params, grads;
  explicit Model(const std::vector<std::vector<std::int64_t>>& shapes) {
    std::uint64_t seed = 1;
    for (const auto& s : shapes) {
      std::int64_t n = 1;
      for (auto e : s) n *= e;
      storage.emplace_back("p", n);
      grad_storage.emplace_back("g", n);
      Kokkos::Random_XorShift64_Pool<ExecSpace> pool(seed++);  // the same on every rank
      Kokkos::fill_random(storage.back(), pool, -0.05f, 0.05f);
      Kokkos::fill_random(grad_storage.back(), pool, -0.01f, 0.01f);
      params.emplace_back(storage.back().data(), s);
      grads.emplace_back(grad_storage.back().data(), s);
    }
  }
};

const std::vector<std::vector<std::int64_t>> mlp{{512, 784}, {512}, {256, 512}, {256}, {10, 256}, {10}};
const std::vector<std::vector<std::int64_t>> gpt2_block{{768},  {768},  {2304, 768}, {2304}, {768, 768},  {768},
                                                        {768},  {768},  {3072, 768}, {3072}, {768, 3072}, {768}};

void run(benchmark::State& state, const std::vector<std::vector<std::int64_t>>& shapes, std::int64_t frequency,
         lather::CommunicationDtype dtype) {
  Model model(shapes);
  lather::ShampooDistributedOptions d;
  d.mode = lather::ShampooDistributionMode::ddp;
  d.communication_dtype = dtype;
  Dist opt(std::span<P>(model.params),
           {.lr = 1e-3, .betas = {0.9, 0.999}, .epsilon = 1e-8, .max_preconditioner_dim = 256,
            .precondition_frequency = frequency},
           lather::MpiCommunicator(MPI_COMM_WORLD), d, {}, {.epsilon = 1e-8});
  const ExecSpace space;
  opt.step(space, model.grads);  // not timed (F = 1: step 1 computes the roots)
  if (frequency != 1) {
    // Steady steps precondition: move to step F - 1 (a state-dict round trip on every rank), take
    // step F (roots computed, preconditioning starts) untimed, then time steps F + 1, ...
    auto dict = opt.state_dict();
    dict.tensors["param_groups.0.step"] = lather::StateTensor{{}, std::vector<std::int64_t>{frequency - 1}};
    opt.load_state_dict(dict);
    opt.step(space, model.grads);
  }
  for (auto _ : state) {
    MPI_Barrier(MPI_COMM_WORLD);
    const auto start = std::chrono::steady_clock::now();
    opt.step(space, model.grads);
    space.fence();
    double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    MPI_Allreduce(MPI_IN_PLACE, &seconds, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    state.SetIterationTime(seconds);
  }
  double mine = static_cast<double>(opt.state_bytes()), largest = mine, total = mine;
  MPI_Allreduce(MPI_IN_PLACE, &largest, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  MPI_Allreduce(MPI_IN_PLACE, &total, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
  int ranks = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &ranks);
  state.counters["ranks"] = ranks;
  state.counters["rank_state_MB"] = largest / 1e6;
  state.counters["total_state_MB"] = total / 1e6;
  // Root computations this rank ran as host tasks on its last step (several threads per rank).
  state.counters["roots_side_by_side"] = static_cast<double>(opt.last_step_info().roots_side_by_side);
}

class NullReporter : public benchmark::BenchmarkReporter {
 public:
  bool ReportContext(const Context&) override { return true; }
  void ReportRuns(const std::vector<Run>&) override {}
};

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  {
    Kokkos::ScopeGuard guard(argc, argv);
    benchmark::Initialize(&argc, argv);
    // Fixed iteration counts: every rank must run the same number of collective steps.
    using D = lather::CommunicationDtype;
    benchmark::RegisterBenchmark("ddp_shampoo/mlp/steady", [](benchmark::State& s) { run(s, mlp, 100, D::parameter); })
        ->Iterations(20)->UseManualTime()->Unit(benchmark::kMillisecond);
    benchmark::RegisterBenchmark("ddp_shampoo/mlp/steady_bf16", [](benchmark::State& s) { run(s, mlp, 100, D::bfloat16); })
        ->Iterations(20)->UseManualTime()->Unit(benchmark::kMillisecond);
    benchmark::RegisterBenchmark("ddp_shampoo/mlp/amortized", [](benchmark::State& s) { run(s, mlp, 1, D::parameter); })
        ->Iterations(3)->UseManualTime()->Unit(benchmark::kMillisecond);
    benchmark::RegisterBenchmark("ddp_shampoo/gpt2-block/steady",
                                 [](benchmark::State& s) { run(s, gpt2_block, 100, D::parameter); })
        ->Iterations(3)->UseManualTime()->Unit(benchmark::kMillisecond);
    int rank = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    bool file_out = false;  // --benchmark_out=...: only rank 0 writes the file
    for (int k = 1; k < argc; ++k) file_out = file_out || std::string_view(argv[k]).starts_with("--benchmark_out=");
    NullReporter null;
    if (rank == 0) benchmark::RunSpecifiedBenchmarks();
    else if (file_out) benchmark::RunSpecifiedBenchmarks(&null, &null);
    else benchmark::RunSpecifiedBenchmarks(&null);
    benchmark::Shutdown();
  }
  MPI_Finalize();
  return 0;
}
