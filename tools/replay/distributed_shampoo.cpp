// SPDX-License-Identifier: Apache-2.0
// lather-replay --distributed ddp|sharded|hsdp: root-inverse Shampoo (eigh or coupled Newton,
// every grafting method) across the MPI ranks, on the default execution space. Every rank reads
// the whole case. DDP: every rank holds the whole parameters and gradients. Sharded / HSDP: each
// rank of a shard group holds whole row-blocks of each parameter (a flat range aligned with the
// blocks, as the reference's FSDP tests construct them), so the result is the single-process
// trajectory. Rank 0 returns the whole trajectories.
#include "replay.hpp"

#ifdef LATHER_REPLAY_WITH_MPI
#include <lather/comm/mpi_communicator.hpp>

#include <mpi.h>
#endif

namespace replay {
#ifdef LATHER_REPLAY_WITH_MPI
namespace {

using Comm = lather::MpiCommunicator;

lather::ShampooDistributedOptions options_of(const ShampooDistFlags& f) {
  lather::ShampooDistributedOptions d;
  if (f.mode == "ddp") d.mode = lather::ShampooDistributionMode::ddp;
  else if (f.mode == "sharded") d.mode = lather::ShampooDistributionMode::sharded;
  else if (f.mode == "hsdp") d.mode = lather::ShampooDistributionMode::hsdp;
  else fail("--distributed must be ddp, sharded or hsdp, got '" + f.mode + "'");
  if (f.dtype == "parameter") d.communication_dtype = lather::CommunicationDtype::parameter;
  else if (f.dtype == "float32") d.communication_dtype = lather::CommunicationDtype::float32;
  else if (f.dtype == "bfloat16") d.communication_dtype = lather::CommunicationDtype::bfloat16;
  else if (f.dtype == "float16") d.communication_dtype = lather::CommunicationDtype::float16;
  else fail("--comm-dtype must be parameter, float32, bfloat16 or float16, got '" + f.dtype + "'");
  d.num_trainers_per_group = f.trainers;
  d.communicate_params = f.communicate_params;
  return d;
}

// Rank s of a shard group of `size`: whole row-blocks of the merged shape's first dimension.
lather::ShampooShard block_aligned_shard(const std::vector<std::int64_t>& shape, const lather::ShampooOptions& o, int s,
                                         int size) {
  std::int64_t numel = 1;
  for (auto e : shape) numel *= e;
  lather::ShampooShard sh{shape, 0, 0};
  if (numel == 0) return sh;
  const lather::BlockLayout layout(shape, o.max_preconditioner_dim, o.target_parameter_dimensionality);
  const std::int64_t rows = layout.merged_shape.front(), rest = numel / rows;
  const std::int64_t b = o.max_preconditioner_dim == lather::unbounded ? rows : std::min(rows, o.max_preconditioner_dim);
  const std::int64_t row_blocks = (rows + b - 1) / b;
  const std::int64_t first = row_blocks * s / size, last = row_blocks * (s + 1) / size;
  sh.start = std::min(rows, first * b) * rest;
  sh.end = std::min(rows, last * b) * rest;
  return sh;
}

template <class T, class ExecSpace, class Make>
Result run_on_ranks(const Case& c, const lather::ShampooOptions& o, const ShampooDistFlags& f, Make&& make) {
  using M = typename ExecSpace::memory_space;
  using P = lather::TensorRef<T, M>;
  Comm world(MPI_COMM_WORLD);
  const int r = world.rank(), n = world.size();
  const bool sharded = f.mode != "ddp";
  const int shard_size = f.mode == "sharded" ? n : (f.shard_size > 0 ? f.shard_size : n);
  if (n % shard_size != 0)
    fail("--shard-size " + std::to_string(shard_size) + " does not divide the " + std::to_string(n) + " MPI ranks");
  const int s = r % shard_size, replica = r / shard_size;
  lather::ShampooDistributedOptions d = options_of(f);
  std::vector<std::vector<std::int64_t>> shapes;
  std::vector<Kokkos::View<T*, M>> storage, grad_storage;
  std::vector<P> params, grads;
  Result res;
  auto mine = [&](const std::vector<T>& whole, std::size_t i) {
    if (!sharded) return whole;
    return std::vector<T>(whole.begin() + d.shards[i].start, whole.begin() + d.shards[i].end);
  };
  for (const auto& file : c.params) {
    auto p0 = load<T>(file);
    shapes.emplace_back(p0.shape().begin(), p0.shape().end());
    const std::size_t i = shapes.size() - 1;
    std::vector<std::int64_t> local_shape = shapes.back();
    if (sharded) {
      d.shards.push_back(block_aligned_shard(shapes.back(), o, s, shard_size));
      local_shape = {d.shards.back().end - d.shards.back().start};
    }
    const auto local = mine(std::vector<T>(p0.begin(), p0.end()), i);
    storage.emplace_back("param", local.size());
    grad_storage.emplace_back("grad", local.size());
    auto h = Kokkos::create_mirror_view(storage.back());
    std::copy(local.begin(), local.end(), h.data());
    Kokkos::deep_copy(storage.back(), h);
    params.emplace_back(storage.back().data(), local_shape);
    grads.emplace_back(grad_storage.back().data(), local_shape);
    std::vector<std::size_t> tshape{static_cast<std::size_t>(c.steps + 1)};
    for (auto e : shapes.back()) tshape.push_back(static_cast<std::size_t>(e));
    xt::xarray<double> traj = xt::zeros<double>(tshape);
    std::copy(p0.begin(), p0.end(), traj.begin());
    res.trajectories.push_back(std::move(traj));
  }
  Gradients<T> stream(c, shapes);
  // DDP spreads blocks over the world; HSDP over the replicas of this shard; sharded needs none.
  Comm group = f.mode == "ddp" ? world.split(0, r) : world.split(s, r);
  auto opt = make(params, std::move(group), d);
  for (int t = 1; t <= c.steps; ++t) {
    for (std::size_t i = 0; i < params.size(); ++i) {
      const auto g = mine(stream.at(t, i), i);
      auto h = Kokkos::create_mirror_view(grad_storage[i]);
      std::copy(g.begin(), g.end(), h.data());
      Kokkos::deep_copy(grad_storage[i], h);
    }
    opt.step(ExecSpace(), grads);
    for (std::size_t i = 0; i < params.size(); ++i) {
      const auto h = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), storage[i]);
      const auto numel = static_cast<std::int64_t>(res.trajectories[i].size()) / (c.steps + 1);
      Kokkos::View<double*, Kokkos::HostSpace> whole("whole", static_cast<std::size_t>(numel));
      if (!sharded) {
        for (std::int64_t k = 0; k < numel; ++k) whole(static_cast<std::size_t>(k)) = static_cast<double>(h(k));
      } else {
        // Every shard once (replica 0 of each), summed over the world.
        if (replica == 0)
          for (std::size_t k = 0; k < h.extent(0); ++k)
            whole(static_cast<std::size_t>(d.shards[i].start) + k) = static_cast<double>(h(k));
        world.all_reduce_sum(Kokkos::DefaultHostExecutionSpace(), whole);
      }
      std::copy(whole.data(), whole.data() + numel, res.trajectories[i].begin() + numel * t);
    }
  }
  return res;
}

template <class T, class ExecSpace, class Root>
Result with_grafting(const Case& c, const lather::ShampooOptions& s, const Root& root, const json& graft,
                     const ShampooDistFlags& f) {
  using M = typename ExecSpace::memory_space;
  using P = lather::TensorRef<T, M>;
  using Prec = lather::ShampooPrecision<T, T>;  // as the single-process replay (docs/replay.md)
  check_keys(graft, {"type", "beta2", "epsilon"}, "optimizer.grafting");
  const std::string type = graft.value("type", "none");
  const double eps = number(graft, "epsilon", 1e-10);
  const auto go = [&](auto grafting) {
    using G = decltype(grafting);
    return run_on_ranks<T, ExecSpace>(c, s, f, [&](std::vector<P>& p, Comm comm, lather::ShampooDistributedOptions d) {
      return lather::Shampoo<P, ExecSpace, Root, G, Prec, Comm>(std::span<P>(p), s, std::move(comm), std::move(d), root,
                                                                grafting);
    });
  };
  if (type == "none") return go(lather::NoGrafting{});
  if (type == "sgd") return go(lather::SGDGrafting{});
  if (type == "adagrad") return go(lather::AdaGradGrafting{.epsilon = eps});
  if (type == "rmsprop") return go(lather::RMSpropGrafting{.beta2 = number(graft, "beta2", 0.99), .epsilon = eps});
  if (type == "adam") return go(lather::AdamGrafting{.beta2 = number(graft, "beta2", 0.999), .epsilon = eps});
  fail("optimizer.grafting: unknown type '" + type + "' (none, sgd, adagrad, rmsprop, adam)");
}

template <class T>
Result dispatch(const Case& c, const OptimizerConfig& cfg, const ShampooDistFlags& f) {
  using E = Kokkos::DefaultExecutionSpace;
  const json& root = cfg.root_inv;
  const std::string type = root.value("type", "eigh");
  if (type == "eigh") {
    check_keys(root, {"type"}, "optimizer.root_inv");
    return with_grafting<T, E>(c, cfg.shampoo, lather::EigenRootInverse{}, cfg.grafting, f);
  }
  if (type == "coupled_newton") {
    check_keys(root, {"type", "max_iterations", "tolerance"}, "optimizer.root_inv");
    lather::CoupledNewtonRootInverse rn;
    rn.max_iterations = whole(root, "max_iterations", 100, "optimizer.root_inv");
    rn.tolerance = number(root, "tolerance", 1e-6);
    return with_grafting<T, E>(c, cfg.shampoo, rn, cfg.grafting, f);
  }
  fail("optimizer.root_inv: unknown type '" + type + "' (eigh, coupled_newton)");
}

}  // namespace
#endif

Result run_shampoo_distributed(const Case& c, const OptimizerConfig& cfg, bool single, const ShampooDistFlags& f) {
#ifdef LATHER_REPLAY_WITH_MPI
  if (cfg.name != "shampoo" || (cfg.preconditioner_type != "root_inv" && !cfg.preconditioner_type.empty()))
    fail("--distributed replays root-inverse Shampoo (optimizer.root_inv eigh or coupled_newton); this case is '" +
         cfg.name + (cfg.name == "shampoo" ? "' with preconditioner '" + cfg.preconditioner_type : std::string()) +
         "' (the library distributes every variant; the tool compiles only these, to bound its build time)");
  return single ? dispatch<float>(c, cfg, f) : dispatch<double>(c, cfg, f);
#else
  (void)c, (void)cfg, (void)single, (void)f;
  fail("--distributed needs lather-replay built with MPI (LATHER_ENABLE_MPI=ON)");
#endif
}

}  // namespace replay
