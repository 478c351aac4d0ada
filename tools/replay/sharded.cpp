// SPDX-License-Identifier: Apache-2.0
// lather-replay: Adafactor, CAME, LAMB and GaLore-AdamW, single-process or across MPI ranks with
// tensor-parallel and ZeRO shardings given as flags (--tp, --tp-dim, --zero). Every rank reads the
// whole case, holds only its shards, and rebuilds the whole parameters after every step, so rank 0
// writes the same files as a single-process run and a distributed run is checked against the
// same recorded trajectory.
#include "replay.hpp"

#include <numeric>

#ifdef LATHER_REPLAY_WITH_MPI
#include <lather/comm/mpi_communicator.hpp>

#include <mpi.h>
#endif

namespace replay {
namespace {

template <class T, class ExecSpace, class Comm, class Make>
Result run_on_shards(const Case& c, const ShardFlags& flags, Comm tp, Comm dp, Comm world, Make&& make) {
  using M = typename ExecSpace::memory_space;
  using P = lather::TensorRef<T, M>;
  std::vector<std::vector<std::int64_t>> shapes;
  std::vector<lather::Sharding> shardings;
  std::vector<Kokkos::View<T*, M>> storage, grad_storage;
  std::vector<P> params, grads;
  Result r;
  const auto shard = [&](const auto& whole, const lather::Sharding& s) {
    // This rank's elements of a row-major whole tensor (padding zero).
    using V = typename std::decay_t<decltype(whole)>::value_type;
    std::vector<V> out(static_cast<std::size_t>(s.stored_numel()), V(0));
    const auto local = s.local_shape();
    for (std::int64_t k = 0; k < s.valid_numel(); ++k) {
      std::int64_t f = s.begin() + k, g = 0, stride = 1;
      for (int d = s.rank() - 1; d >= 0; --d) {
        const std::int64_t e = local[static_cast<std::size_t>(d)];
        std::int64_t idx = f % e;
        f /= e;
        if (d == s.tp_dim) idx += s.tp_offset();
        g += idx * stride;
        stride *= s.global_shape[static_cast<std::size_t>(d)];
      }
      out[static_cast<std::size_t>(k)] = whole[static_cast<std::size_t>(g)];
    }
    return out;
  };
  for (const auto& file : c.params) {
    auto p0 = load<T>(file);
    shapes.emplace_back(p0.shape().begin(), p0.shape().end());
    const auto& shape = shapes.back();
    lather::Sharding s = lather::Sharding::whole(shape);
    const std::int64_t numel = static_cast<std::int64_t>(p0.size());
    if (tp.size() > 1 && !shape.empty()) {
      const int dim = flags.tp_dim == "row" ? 0 : static_cast<int>(shape.size()) - 1;
      if (shape[static_cast<std::size_t>(dim)] % tp.size() == 0)
        s = lather::Sharding::tensor_parallel(shape, dim, tp.rank(), tp.size());
    }
    if (flags.zero && numel > 0) s = lather::Sharding::zero_chunk(s, dp.rank(), dp.size());
    shardings.push_back(s);
    const std::vector<std::int64_t> local_shape = s.zero ? std::vector<std::int64_t>{s.stored_numel()} : s.local_shape();
    storage.emplace_back("param", static_cast<std::size_t>(s.stored_numel()));
    grad_storage.emplace_back("grad", static_cast<std::size_t>(s.stored_numel()));
    auto h = Kokkos::create_mirror_view(storage.back());
    const auto mine = shard(std::vector<T>(p0.begin(), p0.end()), s);
    std::copy(mine.begin(), mine.end(), h.data());
    Kokkos::deep_copy(storage.back(), h);
    params.emplace_back(storage.back().data(), local_shape);
    grads.emplace_back(grad_storage.back().data(), local_shape);
    std::vector<std::size_t> tshape{static_cast<std::size_t>(c.steps + 1)};
    for (auto e : shape) tshape.push_back(static_cast<std::size_t>(e));
    xt::xarray<double> traj = xt::zeros<double>(tshape);
    std::copy(p0.begin(), p0.end(), traj.begin());
    r.trajectories.push_back(std::move(traj));
  }
  Gradients<T> stream(c, shapes);
  lather::Distribution<Comm> dist{std::move(tp), std::move(dp), shardings};
  const int tp_rank = dist.tp.rank(), dp_rank = dist.dp.rank();
  auto opt = make(params, std::move(dist));
  for (int t = 1; t <= c.steps; ++t) {
    for (std::size_t i = 0; i < params.size(); ++i) {
      const auto mine = shard(stream.at(t, i), shardings[i]);
      auto h = Kokkos::create_mirror_view(grad_storage[i]);
      std::copy(mine.begin(), mine.end(), h.data());
      Kokkos::deep_copy(grad_storage[i], h);
    }
    opt.step(ExecSpace(), grads);
    // Rebuild the whole parameters: each piece counted once (by rank 0 of a group it is
    // replicated over), summed over the world.
    for (std::size_t i = 0; i < params.size(); ++i) {
      const lather::Sharding& s = shardings[i];
      const std::int64_t numel = s.global_numel();
      Kokkos::View<double*, Kokkos::HostSpace> whole("whole", static_cast<std::size_t>(numel));
      auto h = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), storage[i]);
      const bool owner = (s.tp_split() || tp_rank == 0) && (s.zero || dp_rank == 0);
      if (owner) {
        std::vector<std::int64_t> index(static_cast<std::size_t>(numel));
        std::iota(index.begin(), index.end(), std::int64_t{0});
        const auto where = shard(index, s);  // the global index of each local element
        for (std::int64_t k = 0; k < s.valid_numel(); ++k)
          whole(static_cast<std::size_t>(where[static_cast<std::size_t>(k)])) = static_cast<double>(h(k));
      }
      world.all_reduce_sum(Kokkos::DefaultHostExecutionSpace(), whole);
      std::copy(whole.data(), whole.data() + numel, r.trajectories[i].begin() + numel * t);
    }
  }
  return r;
}

template <class T, class ExecSpace, class Comm>
Result dispatch(const Case& c, const OptimizerConfig& cfg, const ShardFlags& flags, Comm tp, Comm dp, Comm world) {
  using M = typename ExecSpace::memory_space;
  using P = lather::TensorRef<T, M>;
  using D = lather::Distribution<Comm>;
  const auto go = [&](auto make) {
    return run_on_shards<T, ExecSpace, Comm>(c, flags, std::move(tp), std::move(dp), std::move(world), make);
  };
  if (cfg.name == "adafactor")
    return go([&](std::vector<P>& p, D d) {
      return lather::Adafactor<P, ExecSpace, Comm>(std::span<P>(p), std::move(d), cfg.adafactor);
    });
  if (cfg.name == "came")
    return go([&](std::vector<P>& p, D d) { return lather::CAME<P, ExecSpace, Comm>(std::span<P>(p), std::move(d), cfg.came); });
  if (cfg.name == "lamb")
    return go([&](std::vector<P>& p, D d) { return lather::Lamb<P, ExecSpace, Comm>(std::span<P>(p), std::move(d), cfg.lamb); });
  if (cfg.name == "galore_adamw")
    return go([&](std::vector<P>& p, D d) {
      return lather::GaLoreAdamW<P, ExecSpace, Comm>(std::span<P>(p), std::move(d), cfg.galore);
    });
  fail("optimizer '" + cfg.name + "' is not one of the distributed optimizers (adafactor, came, lamb, galore_adamw)");
}

template <class T, class ExecSpace>
Result on_ranks(const Case& c, const OptimizerConfig& cfg, const ShardFlags& flags) {
  if (!flags.distributed())
    return dispatch<T, ExecSpace>(c, cfg, flags, lather::SerialCommunicator{}, lather::SerialCommunicator{},
                                  lather::SerialCommunicator{});
#ifdef LATHER_REPLAY_WITH_MPI
  lather::MpiCommunicator world(MPI_COMM_WORLD);
  if (world.size() % flags.tp != 0)
    fail("--tp " + std::to_string(flags.tp) + " does not divide the " + std::to_string(world.size()) + " MPI ranks");
  const int r = world.rank();
  lather::MpiCommunicator tp = world.split(r / flags.tp, r % flags.tp);
  lather::MpiCommunicator dp = world.split(r % flags.tp, r / flags.tp);
  return dispatch<T, ExecSpace>(c, cfg, flags, std::move(tp), std::move(dp), std::move(world));
#else
  fail("--tp and --zero need lather-replay built with MPI (LATHER_ENABLE_MPI=ON)");
#endif
}

}  // namespace

Result run_sharded(const Case& c, const OptimizerConfig& cfg, bool single, const std::string& space,
                   const ShardFlags& flags) {
  return on_space(space, [&](auto exec) {
    using E = decltype(exec);
    return single ? on_ranks<float, E>(c, cfg, flags) : on_ranks<double, E>(c, cfg, flags);
  });
}

}  // namespace replay
