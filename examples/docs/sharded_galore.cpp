// SPDX-License-Identifier: Apache-2.0
// docs/galore.md: GaLore-AdamW on a row-parallel weight whose projected dimension is the split one
// (a (16, 8) weight projects dim 1; TP splits dim 1: ColossalAI's DistGaloreAwamW crashes here),
// with ZeRO over the data-parallel group on top, on a TP x DP mesh of MPI_COMM_WORLD; checks that
// every rank's shard equals single-device GaLore. Run with mpiexec -n K (the test uses 2 and 4).
#include <lather/comm/mpi_communicator.hpp>
#include <lather/optimizers/galore.hpp>

#include <Kokkos_Core.hpp>

#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <vector>

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int failures = 0;
  Kokkos::initialize(argc, argv);
  {
    using Space = Kokkos::DefaultExecutionSpace;
    using M = Space::memory_space;
    using P = lather::TensorRef<double, M>;
    const int world_rank = [] { int r = 0; MPI_Comm_rank(MPI_COMM_WORLD, &r); return r; }();
    const int world_size = [] { int n = 0; MPI_Comm_size(MPI_COMM_WORLD, &n); return n; }();
    const int tp_size = world_size % 2 == 0 ? 2 : 1;  // TP pairs; the rest is data-parallel
    // Full-rank values (sin(a i + b) alone would make a rank-2 matrix, whose extra singular
    // directions are rounding noise).
    const auto value = [](std::int64_t i, int step) {
      return std::sin(0.37 * static_cast<double>(i * (i % 7 + 1)) + 1.3 * step);
    };
    constexpr int rows = 16, cols = 8, steps = 5;
    const lather::GaLoreOptions options{.lr = 0.01, .weight_decay = 0.01, .rank = 4, .update_proj_gap = 2};

    // [usage]
    lather::MpiCommunicator world(MPI_COMM_WORLD);
    const int r = world.rank();
    lather::MpiCommunicator tp = world.split(r / tp_size, r % tp_size);  // consecutive ranks
    lather::MpiCommunicator dp = world.split(r % tp_size, r / tp_size);

    // (16, 8): GaLore projects dim 1 (R = G P^T, P 4 x 8). TP splits dim 1 (a row-parallel
    // layer's in_features), then ZeRO cuts each TP slice into padded chunks over DP.
    const auto shard = lather::Sharding::zero_chunk(
        lather::Sharding::tensor_parallel({rows, cols}, 1, tp.rank(), tp.size()), dp.rank(), dp.size());
    Kokkos::View<double*, M> w("w", shard.stored_numel()), gw("gw", shard.stored_numel());
    std::vector<P> params{P(w.data(), {shard.stored_numel()})}, grads{P(gw.data(), {shard.stored_numel()})};

    lather::GaLoreAdamW<P, Space, lather::MpiCommunicator> opt(
        std::span<P>(params), lather::Distribution<lather::MpiCommunicator>{std::move(tp), std::move(dp), {shard}},
        options);
    // [usage]

    // Global row-major index of this rank's k-th element: TP-local (16, 8 / tp) flat index
    // begin + k, columns offset by the TP slice.
    const std::int64_t local_cols = cols / tp_size;
    const auto global = [&](std::int64_t k) {
      const std::int64_t f = shard.begin() + k;
      return (f / local_cols) * cols + shard.tp_offset() + f % local_cols;
    };
    const auto fill = [&](const Kokkos::View<double*, M>& v, int step, bool whole) {
      auto h = Kokkos::create_mirror_view(v);
      for (std::int64_t k = 0; k < static_cast<std::int64_t>(v.extent(0)); ++k)
        h(k) = whole ? value(k, step) : k < shard.valid_numel() ? value(global(k), step) : 0.0;
      Kokkos::deep_copy(v, h);
    };
    fill(w, 0, false);
    Kokkos::View<double*, M> rw("rw", rows * cols), rgw("rgw", rows * cols);
    fill(rw, 0, true);
    std::vector<P> ref_params{P(rw.data(), {rows, cols})}, ref_grads{P(rgw.data(), {rows, cols})};
    lather::GaLoreAdamW<P, Space> ref(std::span<P>(ref_params), options);
    for (int t = 1; t <= steps; ++t) {
      fill(gw, t, false);
      fill(rgw, t, true);
      opt.step(grads);
      ref.step(ref_grads);
    }
    auto hw = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), w);
    auto hr = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), rw);
    double worst = 0, change = 0;
    for (std::int64_t k = 0; k < rows * cols; ++k) change = std::max(change, std::abs(hr(k) - value(k, 0)));
    for (std::int64_t k = 0; k < shard.valid_numel(); ++k) worst = std::max(worst, std::abs(hw(k) - hr(global(k))));
    worst /= change;
    if (!(worst <= 1e-12)) failures = 1;
    MPI_Allreduce(MPI_IN_PLACE, &failures, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    MPI_Allreduce(MPI_IN_PLACE, &worst, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    if (world_rank == 0)
      std::printf("%d ranks (TP %d on the projected dimension, ZeRO %d): largest difference from single-device "
                  "GaLore %.1e of the update%s\n",
                  world_size, tp_size, world_size / tp_size, worst, failures ? " FAILED" : "");
  }
  Kokkos::finalize();
  MPI_Finalize();
  return failures;
}
