// SPDX-License-Identifier: Apache-2.0
// docs/distributed-optimizers.md: LAMB on a tensor-parallel weight (rows split over the TP group)
// and a ZeRO-sharded bias, on a TP x DP mesh of MPI_COMM_WORLD; checks that every rank's shard
// equals the single-device result. Run with mpiexec -n K (the test uses 2 and 4).
#include <lather/comm/mpi_communicator.hpp>
#include <lather/optimizers/lamb.hpp>

#include <Kokkos_Core.hpp>

#include <mpi.h>

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

    // Whole values, known to every rank here only so the example can check itself.
    const auto value = [](int i, int step) { return std::sin(0.3 * i + step) + 0.1 * step; };
    constexpr int rows = 8, cols = 4, bias = 7, steps = 3;

    // [usage]
    lather::MpiCommunicator world(MPI_COMM_WORLD);
    const int r = world.rank();
    lather::MpiCommunicator tp = world.split(r / tp_size, r % tp_size);  // consecutive ranks
    lather::MpiCommunicator dp = world.split(r % tp_size, r / tp_size);

    // The weight (8, 4) is split by rows over TP (a column-parallel layer's out_features);
    // the bias (7,) is cut into padded ZeRO chunks over DP.
    const auto w_shard = lather::Sharding::tensor_parallel({rows, cols}, 0, tp.rank(), tp.size());
    const auto b_shard = lather::Sharding::zero_chunk(std::vector<std::int64_t>{bias}, dp.rank(), dp.size());
    Kokkos::View<double*, M> w("w", w_shard.stored_numel()), gw("gw", w_shard.stored_numel());
    Kokkos::View<double*, M> b("b", b_shard.stored_numel()), gb("gb", b_shard.stored_numel());
    std::vector<P> params{P(w.data(), w_shard.local_shape()), P(b.data(), {b_shard.stored_numel()})};
    std::vector<P> grads{P(gw.data(), w_shard.local_shape()), P(gb.data(), {b_shard.stored_numel()})};

    lather::Lamb<P, Space, lather::MpiCommunicator> opt(
        std::span<P>(params),
        lather::Distribution<lather::MpiCommunicator>{std::move(tp), std::move(dp), {w_shard, b_shard}},
        {.lr = 0.01, .weight_decay = 0.01});
    // [usage]

    // This rank's pieces: rows [offset, offset + rows/tp) of the weight, flat range of the bias.
    const auto fill = [&](const Kokkos::View<double*, M>& v, const lather::Sharding& s, int step, int salt) {
      auto h = Kokkos::create_mirror_view(v);
      const std::int64_t row0 = s.tp_offset();
      for (std::int64_t k = 0; k < s.stored_numel(); ++k) {
        const std::int64_t global = s.zero ? s.begin() + k : row0 * cols + k;
        h(k) = k < s.valid_numel() ? value(static_cast<int>(global) + salt, step) : 0.0;
      }
      Kokkos::deep_copy(v, h);
    };
    fill(w, w_shard, 0, 0);
    fill(b, b_shard, 0, 100);
    // The single-device reference on whole tensors.
    Kokkos::View<double*, M> rw("rw", rows * cols), rgw("rgw", rows * cols), rb("rb", bias), rgb("rgb", bias);
    const lather::Sharding whole_w = lather::Sharding::whole({rows, cols}), whole_b = lather::Sharding::whole({bias});
    fill(rw, whole_w, 0, 0);
    fill(rb, whole_b, 0, 100);
    std::vector<P> ref_params{P(rw.data(), {rows, cols}), P(rb.data(), {bias})};
    std::vector<P> ref_grads{P(rgw.data(), {rows, cols}), P(rgb.data(), {bias})};
    lather::Lamb<P, Space> ref(ref_params, {.lr = 0.01, .weight_decay = 0.01});
    for (int t = 1; t <= steps; ++t) {
      fill(gw, w_shard, t, 1000);
      fill(gb, b_shard, t, 2000);
      fill(rgw, whole_w, t, 1000);
      fill(rgb, whole_b, t, 2000);
      opt.step(grads);
      ref.step(ref_grads);
    }
    auto hw = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), w);
    auto hr = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), rw);
    double worst = 0;
    for (std::int64_t k = 0; k < w_shard.valid_numel(); ++k)
      worst = std::max(worst, std::abs(hw(k) - hr(w_shard.tp_offset() * cols + k)));
    auto hb = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), b);
    auto hrb = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), rb);
    for (std::int64_t k = 0; k < b_shard.valid_numel(); ++k)
      worst = std::max(worst, std::abs(hb(k) - hrb(b_shard.begin() + k)));
    if (!(worst <= 1e-14)) failures = 1;
    MPI_Allreduce(MPI_IN_PLACE, &failures, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    if (world_rank == 0)
      std::printf("%d ranks (TP %d): largest difference from single-device LAMB %.1e%s\n", world_size, tp_size,
                  worst, failures ? " FAILED" : "");
  }
  Kokkos::finalize();
  MPI_Finalize();
  return failures;
}
