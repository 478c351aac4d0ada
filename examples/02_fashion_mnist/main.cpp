// SPDX-License-Identifier: Apache-2.0
// lather-train: Fashion-MNIST with lather's optimizers. `lather-train --compare` is the README's
// main job: AdamW and Shampoo from the same seed and initialization, side by side.
//   lather-train --help
//   lather-train --optimizer shampoo --grafting adam --lr 1e-3 --epochs 10
//   mpiexec -n 2 lather-train --optimizer shampoo     (data-parallel: same curve as 1 rank)
#include "data.hpp"
#include "nn.hpp"
#include "options.hpp"
#include "results.hpp"
#include "train.hpp"

#include <lather/config.hpp>
#include <lather/lather.hpp>
#ifdef LATHER_ENABLE_MPI
#include <lather/comm/mpi_communicator.hpp>
#include <mpi.h>
#endif

#include <Kokkos_Core.hpp>

#include <cstdio>
#include <filesystem>
#include <fstream>

namespace {

using ExecSpace = Kokkos::DefaultExecutionSpace;

void make_parent(const std::string& path) {
  const auto parent = std::filesystem::path(path).parent_path();
  if (!parent.empty()) std::filesystem::create_directories(parent);
}

template <class Comm>
int run(const fmnist::TrainSettings& s, const Comm& comm) {
  const bool root = comm.rank() == 0;
  const auto train_host = fmnist::read_split(s.data_dir, "train");
  const auto test_host = fmnist::read_split(s.data_dir, "t10k");
  const auto [mean, stddev] = fmnist::pixel_moments(train_host);
  auto train = fmnist::upload<float, ExecSpace>(train_host, mean, stddev, s.train_limit);
  auto test = fmnist::upload<float, ExecSpace>(test_host, mean, stddev, s.test_limit);
  if (root)
    std::printf("lather %s, Kokkos %s (%d threads), %d rank(s); Fashion-MNIST %d train / %d test, model %s, "
                "batch %d, %d epochs, seed %llu\n",
                LATHER_VERSION_STRING, ExecSpace::name(), ExecSpace().concurrency(), comm.size(), train.size(),
                test.size(), s.model.c_str(), s.batch_size, s.epochs, static_cast<unsigned long long>(s.seed));
  fmnist::Trainer<float, ExecSpace, Comm> trainer(s, comm, train, test);
  std::vector<fmnist::RunResult> runs;
  for (const auto& o : s.optimizers) {
    runs.push_back(trainer.run(o, root ? stdout : nullptr));
    if (root) std::fflush(stdout);
  }
  if (!root) return 0;
  const auto table = fmnist::comparison_table(s, runs);
  std::printf("\n%s", table.c_str());
  if (!s.csv.empty()) {
    make_parent(s.csv);
    fmnist::write_csv(s.csv, s, runs);
    std::printf("\ncurves: %s\n", s.csv.c_str());
  }
  if (!s.table.empty()) {
    make_parent(s.table);
    std::ofstream(s.table) << table;
    std::printf("table: %s\n", s.table.c_str());
  }
  if (!s.plot.empty()) {
    make_parent(s.plot);
    const auto why = fmnist::plot_png(s.plot, runs);
    if (why.empty())
      std::printf("plot: %s\n", s.plot.c_str());
    else
      std::fprintf(stderr, "lather-train: no plot: %s\n", why.c_str());
  }
  for (const auto& r : runs)
    if (!r.failure.empty()) return 3;
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  int rank = 0;
#ifdef LATHER_ENABLE_MPI
  MPI_Init(&argc, &argv);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
#endif
  fmnist::TrainSettings s;
  int code = fmnist::parse_command_line(argc, argv, s, rank == 0);
  bool failed = false;
  if (code < 0) {
#if KOKKOS_VERSION >= 30700
    auto init = Kokkos::InitializationSettings();
    if (s.threads > 0) init.set_num_threads(s.threads);
#else
    Kokkos::InitArguments init;
    if (s.threads > 0) init.num_threads = s.threads;
#endif
    Kokkos::initialize(init);
    try {
#ifdef LATHER_ENABLE_MPI
      const lather::MpiCommunicator comm(MPI_COMM_WORLD);
#else
      const lather::SerialCommunicator comm;
#endif
      code = run(s, comm);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "lather-train: %s\n", e.what());
      code = 1;
      failed = true;
    }
    Kokkos::finalize();
  }
  (void)failed;
#ifdef LATHER_ENABLE_MPI
  // A rank that failed alone (e.g. a missing file) must not leave the others waiting.
  if (failed) MPI_Abort(MPI_COMM_WORLD, code);
  MPI_Finalize();
#endif
  return code;
}
