// SPDX-License-Identifier: Apache-2.0
// Distributed Shampoo (DDP, sharded, HSDP) against single-process Shampoo. Every rank runs the
// single-process optimizer on the same seeded gradients next to the distributed one:
// - DDP with the parameters' own communication dtype is bitwise identical for every root-inverse
//   strategy, with and without communicate_params and sub-groups (the reference's own test);
// - bf16 / fp16 communication stays within the rounding of the updates (bound below);
// - sharded mode equals one process when the shards align with blocks, HSDP equals sharded;
// - state lives on the owner only; disagreements and partial gradients are errors on every rank;
// - a checkpoint resumes bit for bit on the same ranks and from the consolidated form on others.
// Run by CTest at 1, 2, 3 and 4 ranks.
#include "dist_shampoo_utils.hpp"
#include "exec_spaces.hpp"

#include <cmath>
#include <filesystem>
#include <limits>

namespace {

using lather::test::all_ranks;
using lather::test::bitwise_equal;
using lather::test::Model;

using Mpi = lather::MpiCommunicator;

template <class ExecSpace, class Preconditioner, class Grafting = lather::NoGrafting>
void check_ddp_bitwise(const lather::ShampooOptions& o, const lather::ShampooDistributedOptions& d,
                       Preconditioner pre = {}, Grafting graft = {}, int steps = 6) {
  using M = typename ExecSpace::memory_space;
  using P = lather::TensorRef<float, M>;
  using Serial = lather::Shampoo<P, ExecSpace, Preconditioner, Grafting>;
  using Dist = lather::Shampoo<P, ExecSpace, Preconditioner, Grafting, lather::ShampooPrecision<>, Mpi>;
  INFO("communicate_params " << d.communicate_params << ", num_trainers_per_group " << d.num_trainers_per_group);
  Model<float, M> a(lather::test::model_shapes()), b(lather::test::model_shapes());
  Serial serial(std::span<P>(a.params), o, pre, graft);
  Dist dist(std::span<P>(b.params), o, Mpi(MPI_COMM_WORLD), d, pre, graft);
  std::int64_t serial_roots = 0, dist_roots = 0;  // root computations run side by side
  for (int t = 0; t < steps; ++t) {
    a.set_grads(t);
    b.set_grads(t);
    serial.step(ExecSpace(), a.grads);
    dist.step(ExecSpace(), b.grads);
    serial_roots += serial.last_step_info().roots_side_by_side;
    dist_roots += dist.last_step_info().roots_side_by_side;
    const bool same = bitwise_equal(a.params, b.params);
    INFO("step " << t + 1);
    CHECK(same);
    CHECK(all_ranks(same));
  }
  // Each block lives on one rank of its group: the groups' state adds up to one process's.
  const int group = d.num_trainers_per_group == -1 ? lather::test::world_size() : d.num_trainers_per_group;
  // So do the root computations: on several threads each rank runs its own side by side too
  // (since the thirty-sixth session; before, one after the other outside one process).
  CHECK(lather::test::sum_ranks(dist_roots) == serial_roots * (lather::test::world_size() / group));
  if constexpr (std::is_same_v<Preconditioner, lather::EigenRootInverse>)
    CHECK((serial_roots > 0) == lather::test::roots_side_by_side_here<ExecSpace>());
  double bytes = static_cast<double>(dist.state_bytes());
  MPI_Allreduce(MPI_IN_PLACE, &bytes, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
  CHECK(bytes == doctest::Approx(static_cast<double>(serial.state_bytes()) * (lather::test::world_size() / group)));
  // The consolidated dictionary is the single process's.
  CHECK(dist.consolidated_state_dict() == serial.state_dict());
}

lather::ShampooOptions base_options() { return lather::test::dist_options(); }

std::vector<lather::ShampooDistributedOptions> ddp_variants() {
  std::vector<lather::ShampooDistributedOptions> v;
  const int n = lather::test::world_size();
  for (bool params : {false, true})
    for (int g : {-1, 1, 2}) {
      if (g > 0 && n % g != 0) continue;
      lather::ShampooDistributedOptions d;
      d.mode = lather::ShampooDistributionMode::ddp;
      d.communicate_params = params;
      d.num_trainers_per_group = g;
      v.push_back(d);
    }
  return v;
}

}  // namespace

TEST_CASE_TEMPLATE_DEFINE("DDP Shampoo is bitwise identical to one process for every root-inverse strategy",
                          ExecSpace, ddp_bitwise) {
  auto o = base_options();
  for (const auto& d : ddp_variants()) {
    check_ddp_bitwise<ExecSpace, lather::EigenRootInverse>(o, d, {}, lather::AdamGrafting{});
    check_ddp_bitwise<ExecSpace, lather::CoupledNewtonRootInverse>(o, d);
    check_ddp_bitwise<ExecSpace, lather::CoupledHigherOrderRootInverse>(
        o, d, lather::CoupledHigherOrderRootInverse{.rel_epsilon = 0.0, .abs_epsilon = 0.0, .order = 3});
  }
  // Momentum with Nesterov, and the AlignedMemory / polynomial cost models.
  auto m = o;
  m.momentum = 0.5;
  m.use_nesterov = true;
  lather::ShampooDistributedOptions d;
  d.mode = lather::ShampooDistributionMode::ddp;
  check_ddp_bitwise<ExecSpace, lather::EigenRootInverse>(m, d, {}, lather::AdamGrafting{});
  d.cost_model = lather::PolynomialComputationalCostModel{{0.0, 0.0, 0.0, 1.0}, 10.0};
  check_ddp_bitwise<ExecSpace, lather::EigenRootInverse>(m, d, {}, lather::AdamGrafting{});
  // Staggered amortized computations (every frequency-th block per step, over all ranks' blocks):
  // still bitwise one process, with and without communicate_params, a root step on every step.
  auto st = o;
  st.stagger_amortized_computations = true;
  st.precondition_frequency = 3;
  st.start_preconditioning_step = 3;
  for (bool params : {false, true}) {
    lather::ShampooDistributedOptions ds;
    ds.mode = lather::ShampooDistributionMode::ddp;
    ds.communicate_params = params;
    check_ddp_bitwise<ExecSpace, lather::EigenRootInverse>(st, ds, {}, lather::AdamGrafting{}, 9);
  }
  // Iterate averaging (Schedule-Free, GPA) through the all-gather, including train()/eval().
  for (auto avg : {lather::IterateAveraging::schedule_free, lather::IterateAveraging::generalized_primal_averaging}) {
    auto s = o;
    s.iterate_averaging = avg;
    for (bool params : {false, true}) {
      d.communicate_params = params;
      d.cost_model = lather::AlignedMemoryCostModel{};
      check_ddp_bitwise<ExecSpace, lather::EigenRootInverse>(s, d, {}, lather::AdamGrafting{});
    }
  }
}
TEST_CASE_TEMPLATE_APPLY(ddp_bitwise, lather_test_exec_spaces);

TEST_CASE_TEMPLATE_DEFINE("DDP Shampoo: train()/eval() are collective and equal one process", ExecSpace, ddp_eval) {
  using M = typename ExecSpace::memory_space;
  using P = lather::TensorRef<float, M>;
  auto o = base_options();
  o.iterate_averaging = lather::IterateAveraging::schedule_free;
  lather::ShampooDistributedOptions d;
  d.mode = lather::ShampooDistributionMode::ddp;
  Model<float, M> a(lather::test::model_shapes()), b(lather::test::model_shapes());
  lather::Shampoo<P, ExecSpace> serial(std::span<P>(a.params), o);
  lather::Shampoo<P, ExecSpace, lather::EigenRootInverse, lather::NoGrafting, lather::ShampooPrecision<>, Mpi> dist(
      std::span<P>(b.params), o, Mpi(MPI_COMM_WORLD), d);
  for (int t = 0; t < 3; ++t) {
    a.set_grads(t);
    b.set_grads(t);
    serial.step(ExecSpace(), a.grads);
    dist.step(ExecSpace(), b.grads);
  }
  serial.eval();
  dist.eval();
  CHECK(all_ranks(bitwise_equal(a.params, b.params)));
  serial.train();
  dist.train();
  CHECK(all_ranks(bitwise_equal(a.params, b.params)));
}
TEST_CASE_TEMPLATE_APPLY(ddp_eval, lather_test_exec_spaces);

TEST_CASE_TEMPLATE_DEFINE("DDP Shampoo with bf16 and fp16 communication stays within the rounding of the updates",
                          ExecSpace, ddp_quantized) {
  using M = typename ExecSpace::memory_space;
  using P = lather::TensorRef<float, M>;
  auto o = base_options();
  o.weight_decay = 0.0;  // the updates then do not depend on the parameters: the bound below is exact
  for (auto [dtype, unit] : {std::pair{lather::CommunicationDtype::bfloat16, std::ldexp(1.0, -8)},
                             std::pair{lather::CommunicationDtype::float16, std::ldexp(1.0, -11)}}) {
    lather::ShampooDistributedOptions d;
    d.mode = lather::ShampooDistributionMode::ddp;
    d.communication_dtype = dtype;
    Model<float, M> a(lather::test::model_shapes()), b(lather::test::model_shapes());
    lather::Shampoo<P, ExecSpace> serial(std::span<P>(a.params), o);
    lather::Shampoo<P, ExecSpace, lather::EigenRootInverse, lather::NoGrafting, lather::ShampooPrecision<>, Mpi> dist(
        std::span<P>(b.params), o, Mpi(MPI_COMM_WORLD), d);
    std::vector<std::vector<double>> sum_abs(a.params.size());
    for (std::size_t i = 0; i < a.params.size(); ++i) sum_abs[i].assign(static_cast<std::size_t>(a.params[i].size()), 0.0);
    for (int t = 0; t < 6; ++t) {
      std::vector<std::vector<double>> before;
      for (const auto& p : a.params) before.push_back(lather::test::to_host(p));
      a.set_grads(t);
      b.set_grads(t);
      serial.step(ExecSpace(), a.grads);
      dist.step(ExecSpace(), b.grads);
      for (std::size_t i = 0; i < a.params.size(); ++i) {
        const auto after = lather::test::to_host(a.params[i]);
        for (std::size_t k = 0; k < after.size(); ++k) sum_abs[i][k] += std::abs(after[k] - before[i][k]);
      }
    }
    // Each update is rounded once to the communication dtype (relative error <= unit / 2, the
    // bar is 2x that, as the reference's 2x-default tolerances), plus float rounding of the sums.
    bool ok = true;
    for (std::size_t i = 0; i < a.params.size(); ++i) {
      const auto x = lather::test::to_host(a.params[i]), y = lather::test::to_host(b.params[i]);
      for (std::size_t k = 0; k < x.size(); ++k) {
        const double bar = unit * sum_abs[i][k] + 1e-6 * std::max(1.0, std::abs(x[k]));
        if (std::abs(x[k] - y[k]) > bar) {
          ok = false;
          MESSAGE("dtype " << static_cast<int>(dtype) << " parameter " << i << " element " << k << ": |diff| "
                           << std::abs(x[k] - y[k]) << " > " << bar);
          break;
        }
      }
    }
    CHECK(all_ranks(ok));
    // And it does round: with more than one rank, some element differs from the exact run.
    CHECK_FALSE(bitwise_equal(a.params, b.params));
  }
}
TEST_CASE_TEMPLATE_APPLY(ddp_quantized, lather_test_exec_spaces);

TEST_CASE_TEMPLATE_DEFINE("DDP Shampoo: masked parameters, disagreements and failures are errors on every rank",
                          ExecSpace, ddp_errors) {
  using M = typename ExecSpace::memory_space;
  using P = lather::TensorRef<float, M>;
  using Dist = lather::Shampoo<P, ExecSpace, lather::EigenRootInverse, lather::NoGrafting, lather::ShampooPrecision<>, Mpi>;
  const int n = lather::test::world_size();
  Mpi world_check(MPI_COMM_WORLD);
  const int r = world_check.rank();
  auto o = base_options();
  lather::ShampooDistributedOptions d;
  d.mode = lather::ShampooDistributionMode::ddp;
  // A parameter without a gradient on every rank is masked: unchanged, the others step as in one process.
  {
    Model<float, M> a(lather::test::model_shapes()), b(lather::test::model_shapes());
    lather::Shampoo<P, ExecSpace> serial(std::span<P>(a.params), o);
    Dist dist(std::span<P>(b.params), o, Mpi(MPI_COMM_WORLD), d);
    for (int t = 0; t < 4; ++t) {
      a.set_grads(t);
      b.set_grads(t);
      auto ga = a.grads, gb = b.grads;
      ga[2] = P();
      gb[2] = P();
      serial.step(ExecSpace(), ga);
      dist.step(ExecSpace(), gb);
    }
    CHECK(all_ranks(bitwise_equal(a.params, b.params)));
    // A gradient on some ranks only: the same error everywhere, nothing changed.
    if (n > 1) {
      const auto before = dist.consolidated_state_dict();
      auto values = lather::test::to_host(b.params[0]);
      b.set_grads(9);
      auto gb = b.grads;
      if (r == 0) gb[1] = P();
      CHECK_THROWS_WITH_AS(dist.step(ExecSpace(), gb), doctest::Contains("has a gradient on"), lather::invalid_argument);
      CHECK(dist.consolidated_state_dict() == before);
      CHECK(lather::test::to_host(b.params[0]) == values);
      // A NaN on one rank under skip_parameter: every rank skips that parameter.
      dist.set_nonfinite_policy(lather::NonFinitePolicy::skip_parameter);
      b.set_grads(10);
      if (r == n - 1) lather::test::from_host(b.grads[0], std::vector<double>(60, std::nan("")));
      dist.step(ExecSpace(), b.grads);
      CHECK(lather::test::to_host(b.params[0]) == values);
      CHECK(dist.nonfinite_skips(0) == 1);
    }
  }
  if (n == 1) return;
  // Shapes and options must agree.
  {
    auto shapes = lather::test::model_shapes();
    if (r == 0) shapes[1] = {8};
    Model<float, M> b(shapes);
    CHECK_THROWS_WITH_AS(Dist(std::span<P>(b.params), o, Mpi(MPI_COMM_WORLD), d),
                         doctest::Contains("disagree on the shape of parameter 1"), lather::invalid_argument);
  }
  {
    Model<float, M> b(lather::test::model_shapes());
    auto other = o;
    if (r == n - 1) other.epsilon = 1e-5;
    CHECK_THROWS_WITH_AS(Dist(std::span<P>(b.params), other, Mpi(MPI_COMM_WORLD), d),
                         doctest::Contains("disagree on option 'epsilon'"), lather::invalid_argument);
    auto dd = d;
    if (r == 0) dd.communicate_params = true;
    CHECK_THROWS_WITH_AS(Dist(std::span<P>(b.params), o, Mpi(MPI_COMM_WORLD), dd),
                         doctest::Contains("disagree on option 'communicate_params'"), lather::invalid_argument);
  }
  // num_trainers_per_group must divide the size.
  if (n % 3 != 0) {
    Model<float, M> b(lather::test::model_shapes());
    auto dd = d;
    dd.num_trainers_per_group = 3;
    CHECK_THROWS_WITH_AS(Dist(std::span<P>(b.params), o, Mpi(MPI_COMM_WORLD), dd),
                         doctest::Contains("num_trainers_per_group"), lather::invalid_argument);
  }
  // A root computation failing on the rank that owns the block: every rank throws and nothing
  // changes (no rank waits in the all-gather).
  {
    Model<float, M> b(lather::test::model_shapes());
    auto fo = o;
    fo.num_tolerated_failed_amortized_computations = 0;
    Dist dist(std::span<P>(b.params), fo, Mpi(MPI_COMM_WORLD), d);
    b.set_grads(0);
    dist.step(ExecSpace(), b.grads);
    const auto before = dist.consolidated_state_dict();
    std::vector<std::vector<double>> values;
    for (const auto& p : b.params) values.push_back(lather::test::to_host(p));
    // An overflowing gradient makes the owner's factor of parameter 5 non-finite at the amortized step.
    b.set_grads(1);
    lather::test::from_host(b.grads[5], std::vector<double>(81, 1e30));
    CHECK_THROWS_AS(dist.step(ExecSpace(), b.grads), lather::runtime_error);
    CHECK(dist.consolidated_state_dict() == before);
    for (std::size_t i = 0; i < b.params.size(); ++i) CHECK(lather::test::to_host(b.params[i]) == values[i]);
    CHECK(dist.step_count() == 1);
  }
}
TEST_CASE_TEMPLATE_APPLY(ddp_errors, lather_test_exec_spaces);

TEST_CASE_TEMPLATE_DEFINE("DDP Shampoo checkpoints: bitwise resume on the same ranks, consolidated elsewhere",
                          ExecSpace, ddp_checkpoint) {
  using M = typename ExecSpace::memory_space;
  using P = lather::TensorRef<float, M>;
  using Dist = lather::Shampoo<P, ExecSpace, lather::EigenRootInverse, lather::AdamGrafting, lather::ShampooPrecision<>, Mpi>;
  using Serial = lather::Shampoo<P, ExecSpace, lather::EigenRootInverse, lather::AdamGrafting>;
  auto o = base_options();
  o.momentum = 0.9;
  lather::ShampooDistributedOptions d;
  d.mode = lather::ShampooDistributionMode::ddp;
  constexpr int k = 3, steps = 7;
  // Uninterrupted.
  Model<float, M> a(lather::test::model_shapes());
  Dist full(std::span<P>(a.params), o, Mpi(MPI_COMM_WORLD), d);
  lather::StateDict local, consolidated;
  std::vector<std::vector<double>> at_k;
  for (int t = 0; t < steps; ++t) {
    a.set_grads(t);
    full.step(ExecSpace(), a.grads);
    if (t + 1 == k) {
      local = full.state_dict();
      consolidated = full.consolidated_state_dict();
      for (const auto& p : a.params) at_k.push_back(lather::test::to_host(p));
    }
  }
  auto resume = [&](auto& opt, Model<float, M>& m, const lather::StateDict& sd) {
    for (std::size_t i = 0; i < m.params.size(); ++i) lather::test::from_host(m.params[i], at_k[i]);
    opt.load_state_dict(sd);
    for (int t = k; t < steps; ++t) {
      m.set_grads(t);
      opt.step(ExecSpace(), m.grads);
    }
    return bitwise_equal(a.params, m.params);
  };
  {  // same ranks, this rank's own dictionary (through a checkpoint file)
    Model<float, M> b(lather::test::model_shapes());
    Dist opt(std::span<P>(b.params), o, Mpi(MPI_COMM_WORLD), d);
    const auto file = std::filesystem::temp_directory_path() /
                      ("lather_dist_ckpt_" + std::to_string(lather::test::world_size()) + "_" +
                       std::to_string(Mpi(MPI_COMM_WORLD).rank()) + ".bin");
    lather::save_checkpoint(file, local);
    CHECK(all_ranks(resume(opt, b, lather::load_checkpoint(file))));
    std::filesystem::remove(file);
  }
  {  // the consolidated form in one process
    Model<float, M> b(lather::test::model_shapes());
    Serial opt(std::span<P>(b.params), o);
    CHECK(all_ranks(resume(opt, b, consolidated)));
  }
  {  // the consolidated form on another distribution (every rank its own group: one owner of all)
    Model<float, M> b(lather::test::model_shapes());
    auto other = d;
    other.num_trainers_per_group = 1;
    Dist opt(std::span<P>(b.params), o, Mpi(MPI_COMM_WORLD), other);
    CHECK(all_ranks(resume(opt, b, consolidated)));
  }
  // A rank's own dictionary lacks the other ranks' blocks: loading it elsewhere names what is missing.
  if (lather::test::world_size() > 1) {
    Model<float, M> b(lather::test::model_shapes());
    Serial opt(std::span<P>(b.params), o);
    const auto before = opt.state_dict();
    CHECK_THROWS_WITH_AS(opt.load_state_dict(local), doctest::Contains("missing entry"), lather::invalid_argument);
    CHECK(opt.state_dict() == before);
  }
}
TEST_CASE_TEMPLATE_APPLY(ddp_checkpoint, lather_test_exec_spaces);

TEST_CASE_TEMPLATE_DEFINE("sharded Shampoo equals one process when shards align with blocks; HSDP equals sharded",
                          ExecSpace, sharded) {
  using M = typename ExecSpace::memory_space;
  using P = lather::TensorRef<float, M>;
  const int n = lather::test::world_size();
  Mpi world(MPI_COMM_WORLD);
  const int r = world.rank();
  auto o = base_options();
  // Whole parameters: (4n, 4) -> blocks of 4 rows, (12n,) -> blocks of 4, (4n, 2, 2) merged to
  // (4n, 4) -> blocks of 4 rows; even flat ranges over 1, 2 or n ranks then hold whole blocks.
  const std::vector<std::vector<std::int64_t>> shapes{{4 * n, 4}, {12 * n}, {4 * n, 2, 2}};
  auto run = [&](int shard_size, lather::ShampooDistributionMode mode, bool compare_serial) {
    const int s = r % shard_size;  // rank in the shard group
    Model<float, M> whole(shapes);
    std::vector<Kokkos::View<float*, M>> lp, lg;
    std::vector<P> params, grads;
    lather::ShampooDistributedOptions d;
    d.mode = mode;
    for (const auto& shape : shapes) {
      const std::int64_t total = lather::test::numel_of(shape), chunk = total / shard_size;
      d.shards.push_back({shape, chunk * s, chunk * (s + 1)});
      lp.emplace_back("lp", static_cast<std::size_t>(chunk));
      lg.emplace_back("lg", static_cast<std::size_t>(chunk));
      params.emplace_back(lp.back().data(), std::vector<std::int64_t>{chunk});
      grads.emplace_back(lg.back().data(), std::vector<std::int64_t>{chunk});
    }
    auto slice = [&](const std::vector<double>& v, std::size_t i) {
      const auto c = static_cast<std::size_t>(d.shards[i].end - d.shards[i].start);
      return std::vector<double>(v.begin() + d.shards[i].start, v.begin() + d.shards[i].start + static_cast<std::ptrdiff_t>(c));
    };
    for (std::size_t i = 0; i < shapes.size(); ++i) lather::test::from_host(params[i], slice(lather::test::to_host(whole.params[i]), i));
    lather::Shampoo<P, ExecSpace> serial(std::span<P>(whole.params), o);
    // HSDP: DDP over the replicas of this shard (ranks with the same shard rank).
    Mpi replicas = world.split(s, r);
    lather::Shampoo<P, ExecSpace, lather::EigenRootInverse, lather::NoGrafting, lather::ShampooPrecision<>, Mpi> dist(
        std::span<P>(params), o, std::move(replicas), d);
    for (std::size_t i = 0; i < shapes.size(); ++i) CHECK(dist.num_pieces(i) >= 1);
    bool ok = true;
    std::int64_t serial_roots = 0, dist_roots = 0;  // root computations run side by side
    for (int t = 0; t < 5; ++t) {
      whole.set_grads(t);
      for (std::size_t i = 0; i < shapes.size(); ++i) lather::test::from_host(grads[i], slice(lather::test::to_host(whole.grads[i]), i));
      serial.step(ExecSpace(), whole.grads);
      dist.step(ExecSpace(), grads);
      serial_roots += serial.last_step_info().roots_side_by_side;
      dist_roots += dist.last_step_info().roots_side_by_side;
      if (!compare_serial) continue;
      for (std::size_t i = 0; i < shapes.size(); ++i) {
        const auto want = slice(lather::test::to_host(whole.params[i]), i), got = lather::test::to_host(params[i]);
        if (want != got) {
          ok = false;
          MESSAGE("step " << t + 1 << ": parameter " << i << " differs from one process");
        }
      }
    }
    CHECK(all_ranks(ok));
    // Every block's roots computed once over all ranks (sharded: by its shard's owner; HSDP: by
    // one replica of its shard), side by side on several threads.
    CHECK(lather::test::sum_ranks(dist_roots) == serial_roots);
    CHECK((serial_roots > 0) == lather::test::roots_side_by_side_here<ExecSpace>());
    return dist.state_bytes();
  };
  // FSDP over all n ranks: rank r holds rows [4r, 4r + 4) etc., whole blocks.
  const std::size_t sharded_bytes = run(n, lather::ShampooDistributionMode::sharded, true);
  // This rank's state holds its own pieces only: 1/n of the single process's.
  {
    Model<float, M> whole(shapes);
    lather::Shampoo<P, ExecSpace> serial(std::span<P>(whole.params), o);
    CHECK(sharded_bytes * static_cast<std::size_t>(n) == serial.state_bytes());
  }
  // HSDP: shards over pairs of ranks (or all), DDP across the replicas.
  if (n % 2 == 0) run(2, lather::ShampooDistributionMode::hsdp, true);
  run(n, lather::ShampooDistributionMode::hsdp, true);
}
TEST_CASE_TEMPLATE_APPLY(sharded, lather_test_exec_spaces);

TEST_CASE_TEMPLATE_DEFINE("GradientAverager averages gradients over the ranks in one all-reduce", ExecSpace, averager) {
  using M = typename ExecSpace::memory_space;
  using P = lather::TensorRef<double, M>;
  const int n = lather::test::world_size();
  const int r = Mpi(MPI_COMM_WORLD).rank();
  // A (3, 4) gradient seen through strides (every other column of a (3, 8) buffer), a vector and
  // an absent gradient; rank r holds (r + 1) * base, so the mean is (n + 1) / 2 * base.
  Kokkos::View<double*, M> wide("wide", 24), vec("vec", 5);
  const std::vector<std::int64_t> shape{3, 4}, strides{8, 2};
  std::vector<P> grads{P(wide.data(), shape, strides), P(vec.data(), {5}), P()};
  const auto base0 = lather::test::random_values(12, 7), base1 = lather::test::random_values(5, 8);
  auto scaled = [&](const std::vector<double>& b, double f) {
    std::vector<double> v(b);
    for (auto& x : v) x *= f;
    return v;
  };
  lather::test::from_host(grads[0], scaled(base0, r + 1));
  lather::test::from_host(grads[1], scaled(base1, r + 1));
  const auto untouched = lather::test::to_host(P(wide.data(), {24}));
  lather::GradientAverager<double, M> average;
  average(Mpi(MPI_COMM_WORLD), ExecSpace(), grads);
  const double mean = (n + 1) / 2.0;
  const auto g0 = lather::test::to_host(grads[0]), g1 = lather::test::to_host(grads[1]);
  for (std::size_t k = 0; k < g0.size(); ++k) CHECK(g0[k] == doctest::Approx(mean * base0[k]).epsilon(1e-14));
  for (std::size_t k = 0; k < g1.size(); ++k) CHECK(g1[k] == doctest::Approx(mean * base1[k]).epsilon(1e-14));
  // The elements between the strided ones are not touched.
  const auto all = lather::test::to_host(P(wide.data(), {24}));
  for (std::size_t k = 1; k < all.size(); k += 2) CHECK(all[k] == untouched[k]);
}
TEST_CASE_TEMPLATE_APPLY(averager, lather_test_exec_spaces);
