// SPDX-License-Identifier: Apache-2.0
// Distributed Adafactor and CAME equal their single-device runs however the parameters are split:
// tensor-parallel row, column and batch-dimension splits, ZeRO flat ranges that cut rows, leave
// padding or hold only padding, TP x ZeRO, replicated, 1-D and 3-D parameters side by side, a
// parameter without a gradient. Every rank computes the single-device reference from the same
// seeded full-rank gradients and compares the cumulative change of its shard, and its pieces of
// the row/column statistics. Run by CTest at 1, 2 and 4 ranks.
#include <lather/comm/mpi_communicator.hpp>
#include <lather/optimizers/adafactor.hpp>
#include <lather/optimizers/came.hpp>

#include <Kokkos_Core.hpp>

#include <doctest/doctest.h>

#include "exec_spaces.hpp"
#include "sharding_utils.hpp"
#include "test_utils.hpp"

#include <algorithm>
#include <cstdint>
#include <limits>
#include <numeric>
#include <string>
#include <type_traits>
#include <vector>

namespace {

using lather::test::all_ranks;
using lather::test::diff_over_max;
using lather::test::Layout;

struct ParamSpec {
  std::vector<std::int64_t> shape;
  Layout layout;
};
// A column-parallel weight (rows split), a row-parallel weight (columns split), its bias, 3-D
// parameters split along the row, the column and the batch dimension, replicated matrices whose
// ZeRO ranges cut rows and leave padding ((5, 3): 15 elements; (6, 5) over 4: chunks of 8), a
// (1, 5) and 1-D vectors of 7 (padding) and 5 (over 4 ranks: the last chunk is all padding).
std::vector<ParamSpec> specs(bool zero) {
  return {{{8, 12}, {0, zero}},   {{12, 8}, {1, zero}},   {{8}, {0, zero}},  {{4, 8, 4}, {1, zero}},
          {{2, 3, 8}, {2, zero}}, {{4, 3, 5}, {0, zero}}, {{5, 3}, {-1, zero}}, {{6, 5}, {-1, zero}},
          {{1, 5}, {-1, zero}},   {{7}, {-1, zero}},      {{5}, {-1, zero}}};
}
constexpr std::size_t kNoGradParam = 2;  // skipped at step kNoGradStep on every rank (and in the reference)
constexpr int kNoGradStep = 2;

std::int64_t numel(const std::vector<std::int64_t>& s) {
  return std::accumulate(s.begin(), s.end(), std::int64_t{1}, std::multiplies<>());
}

/// This rank's piece of a statistic of `global_stat_shape` (R: shape[:-1], C: shape[:-2] +
/// shape[-1:]) whose dimension `stat_dim` follows the parameter's TP split (-1: none).
std::vector<double> stat_piece(const std::vector<double>& global, std::vector<std::int64_t> global_stat_shape,
                               int stat_dim, const lather::Sharding& s) {
  lather::Sharding st = lather::Sharding::whole(std::move(global_stat_shape));
  if (stat_dim >= 0 && s.tp_split()) st = lather::Sharding::tensor_parallel(st.global_shape, stat_dim, s.tp_rank, s.tp_size);
  return lather::test::shard_of(global, st);
}

std::vector<double> values(const lather::StateTensor& t) {
  std::vector<double> v;
  std::visit([&](const auto& x) { v.assign(x.begin(), x.end()); }, t.values);
  return v;
}

template <template <class, class, class> class Opt, class T, class ExecSpace, class Options>
void run_mesh(int tp, int dp, bool zero, const Options& o, const std::string& what) {
  using M = typename ExecSpace::memory_space;
  using P = lather::TensorRef<T, M>;
  auto mesh = lather::test::make_mesh(tp, dp);
  if (!mesh) return;
  INFO(what << ": tp " << tp << " x dp " << dp << std::string(zero ? ", ZeRO" : "") << ", "
            << std::string(std::is_same_v<T, double> ? "double" : "float"));
  const auto sp = specs(zero);
  constexpr int steps = 5;
  std::vector<Kokkos::View<T*, M>> rp, rg, lp, lg;
  std::vector<P> ref_params, ref_grads, params, grads;
  std::vector<lather::Sharding> shardings;
  std::vector<std::vector<double>> initial;
  for (std::size_t i = 0; i < sp.size(); ++i) {
    const auto n = static_cast<std::size_t>(numel(sp[i].shape));
    rp.emplace_back("rp", n);
    rg.emplace_back("rg", n);
    ref_params.emplace_back(rp.back().data(), sp[i].shape);
    ref_grads.emplace_back(rg.back().data(), sp[i].shape);
    initial.push_back(lather::test::random_values(n, 10 + i));
    lather::test::from_host(ref_params.back(), initial.back());
    shardings.push_back(lather::test::sharding_for(sp[i].shape, sp[i].layout, *mesh));
    const lather::Sharding& s = shardings.back();
    const auto local = static_cast<std::size_t>(s.stored_numel());
    lp.emplace_back("lp", local);
    lg.emplace_back("lg", local);
    const std::vector<std::int64_t> local_shape = s.zero ? std::vector<std::int64_t>{s.stored_numel()} : s.local_shape();
    params.emplace_back(lp.back().data(), local_shape);
    grads.emplace_back(lg.back().data(), local_shape);
    lather::test::from_host(params.back(), lather::test::shard_of(initial.back(), s));
  }
  Opt<P, ExecSpace, lather::SerialCommunicator> ref(ref_params, o);
  Opt<P, ExecSpace, lather::MpiCommunicator> dist(
      std::span<P>(params), lather::Distribution<lather::MpiCommunicator>{std::move(mesh->tp), std::move(mesh->dp), shardings},
      o);
  for (int t = 0; t < steps; ++t) {
    std::vector<P> rg_t = ref_grads, g_t = grads;
    for (std::size_t i = 0; i < sp.size(); ++i) {
      const auto g = lather::test::random_values(static_cast<std::size_t>(numel(sp[i].shape)), 1000 * (t + 1) + i);
      lather::test::from_host(ref_grads[i], g);
      lather::test::from_host(grads[i], lather::test::shard_of(g, shardings[i]));
    }
    if (t == kNoGradStep) rg_t[kNoGradParam] = g_t[kNoGradParam] = P();
    ref.step(ExecSpace(), rg_t);
    dist.step(ExecSpace(), g_t);
  }
  CHECK(dist.step_count(kNoGradParam) == steps - 1);
  // Double: the statistics' partial sums and the RMS are added in another order, nothing else
  // differs. Float: those sums are double too, but a last-bit difference of a float statistic
  // or RMS can appear and is carried through the steps.
  const double tol = std::is_same_v<T, double> ? 1e-12 : 1e-5;
  bool ok = true;
  double worst = 0, worst_stat = 0;
  for (std::size_t i = 0; i < sp.size(); ++i) {
    const lather::Sharding& s = shardings[i];
    const auto ref_final = lather::test::shard_of(lather::test::to_host(ref_params[i]), s, false);
    const auto start = lather::test::shard_of(initial[i], s, false);
    auto got = lather::test::to_host(params[i]);
    got.resize(static_cast<std::size_t>(s.valid_numel()));
    std::vector<double> d_ref(start.size()), d_got(start.size());
    for (std::size_t k = 0; k < start.size(); ++k) {
      d_ref[k] = ref_final[k] - start[k];
      d_got[k] = got[k] - start[k];
    }
    const double err = s.valid_numel() > 0 ? diff_over_max(d_got, d_ref) : 0.0;
    INFO("parameter " << i << " " << s.describe() << ": max|Δ - Δref| / max|Δref| = " << err);
    CHECK(err <= tol);
    ok = ok && err <= tol;
    worst = std::max(worst, err);
    // Padding is never written.
    const auto all = lather::test::to_host(params[i]);
    for (std::size_t k = got.size(); k < all.size(); ++k) CHECK(all[k] == 0.0);
    // This rank's element-wise state is its piece; the statistics are the TP-local pieces of
    // the reference's.
    const std::vector<std::int64_t> elem_shape = s.zero ? std::vector<std::int64_t>{s.stored_numel()} : s.local_shape();
    const int nd = s.rank();
    if (nd >= 2) {
      const auto& g = s.global_shape;
      std::vector<std::int64_t> rshape(g.begin(), g.end() - 1), cshape(g.begin(), g.end() - 2);
      cshape.push_back(g.back());
      const int rdim = s.tp_dim < nd - 1 ? s.tp_dim : -1;
      const int cdim = s.tp_dim < nd - 2 ? s.tp_dim : (s.tp_dim == nd - 1 ? nd - 2 : -1);
      std::vector<std::string> stats{"exp_avg_sq"};
      if constexpr (std::is_same_v<Options, lather::CAMEOptions>) stats.push_back("exp_avg_res");
      for (const auto& stat : stats) {
        const auto r = dist.state(i, stat + "_row"), c = dist.state(i, stat + "_col");
        const auto lshape = s.local_shape();
        CHECK(r.shape == std::vector<std::int64_t>(lshape.begin(), lshape.end() - 1));
        const double er = diff_over_max(values(r), stat_piece(values(ref.state(i, stat + "_row")), rshape, rdim, s));
        const double ec = diff_over_max(values(c), stat_piece(values(ref.state(i, stat + "_col")), cshape, cdim, s));
        INFO(stat << " row/col statistics: " << er << " " << ec);
        CHECK(er <= tol);
        CHECK(ec <= tol);
        ok = ok && er <= tol && ec <= tol;
        worst_stat = std::max({worst_stat, er, ec});
      }
    } else {
      CHECK(dist.state(i, "exp_avg_sq").shape == elem_shape);
    }
    if constexpr (std::is_same_v<Options, lather::CAMEOptions>) {
      CHECK(dist.state(i, "exp_avg").shape == elem_shape);
    } else if (o.beta1 > 0) {
      CHECK(dist.state(i, "exp_avg").shape == elem_shape);
    }
  }
  CHECK(all_ranks(ok));
  // The largest difference over every rank, reported once.
  double w[2] = {worst, worst_stat};
  MPI_Allreduce(MPI_IN_PLACE, w, 2, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  int world_rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &world_rank);
  if (world_rank == 0)
    MESSAGE(what << ", tp " << tp << " x dp " << dp << std::string(zero ? " ZeRO" : "") << " ("
                 << std::string(std::is_same_v<T, double> ? "double" : "float") << "): cumulative change " << w[0]
                 << ", statistics " << w[1]);
}

template <template <class, class, class> class Opt, class ExecSpace, class Options>
void all_meshes(const Options& o, const std::string& what) {
  const int n = lather::test::world_size();
  for (int tp = 1; tp <= n; ++tp) {
    if (n % tp != 0) continue;
    const int dp = n / tp;
    run_mesh<Opt, double, ExecSpace>(tp, dp, false, o, what);
    if (dp > 1) run_mesh<Opt, double, ExecSpace>(tp, dp, true, o, what);
  }
}

template <class P, class E, class C>
using AdafactorT = lather::Adafactor<P, E, C>;
template <class P, class E, class C>
using CameT = lather::CAME<P, E, C>;

}  // namespace

TEST_CASE_TEMPLATE_DEFINE("distributed Adafactor equals single-device Adafactor on every mesh", ExecSpace,
                          dist_adafactor) {
  const int n = lather::test::world_size();
  all_meshes<AdafactorT, ExecSpace>(lather::AdafactorOptions{}, "HF defaults");
  all_meshes<AdafactorT, ExecSpace>(lather::AdafactorOptions{.beta1 = 0.9, .weight_decay = 0.05}, "beta1, weight decay");
  all_meshes<AdafactorT, ExecSpace>(
      lather::AdafactorOptions{.lr = 0.05, .clip_threshold = 0.5, .scale_parameter = false, .relative_step = false},
      "fixed lr, clipping");
  run_mesh<AdafactorT, float, ExecSpace>(n, 1, false, lather::AdafactorOptions{.beta1 = 0.9}, "float TP");
  run_mesh<AdafactorT, float, ExecSpace>(1, n, true, lather::AdafactorOptions{.beta1 = 0.9}, "float ZeRO");
}
TEST_CASE_TEMPLATE_APPLY(dist_adafactor, lather_test_exec_spaces);

TEST_CASE_TEMPLATE_DEFINE("distributed CAME equals single-device CAME on every mesh", ExecSpace, dist_came) {
  const int n = lather::test::world_size();
  all_meshes<CameT, ExecSpace>(lather::CAMEOptions{.lr = 0.01}, "defaults");
  all_meshes<CameT, ExecSpace>(lather::CAMEOptions{.lr = 0.01, .clip_threshold = 0.5, .weight_decay = 0.1},
                               "weight decay, clipping");
  run_mesh<CameT, float, ExecSpace>(n, 1, false, lather::CAMEOptions{.lr = 0.01}, "float TP");
  run_mesh<CameT, float, ExecSpace>(1, n, true, lather::CAMEOptions{.lr = 0.01}, "float ZeRO");
}
TEST_CASE_TEMPLATE_APPLY(dist_came, lather_test_exec_spaces);

TEST_CASE_TEMPLATE_DEFINE("distributed Adafactor/CAME: disagreements are errors on every rank, never hangs",
                          ExecSpace, dist_factored_errors) {
  using M = typename ExecSpace::memory_space;
  using P = lather::TensorRef<double, M>;
  const int n = lather::test::world_size();
  if (n == 1) return;
  lather::MpiCommunicator world(MPI_COMM_WORLD);
  const int r = world.rank();
  using A = lather::Adafactor<P, ExecSpace, lather::MpiCommunicator>;
  using C = lather::CAME<P, ExecSpace, lather::MpiCommunicator>;
  // Rank 0 believes the weight is (4, 5), the others (5, 4).
  {
    const std::vector<std::int64_t> shape = r == 0 ? std::vector<std::int64_t>{4, 5} : std::vector<std::int64_t>{5, 4};
    const auto s = lather::Sharding::zero_chunk(shape, r, n);
    Kokkos::View<double*, M> w("w", static_cast<std::size_t>(s.stored_numel()));
    std::vector<P> ps{P(w.data(), {s.stored_numel()})};
    lather::Distribution<lather::MpiCommunicator> dist{lather::MpiCommunicator(MPI_COMM_SELF), world.split(0, r), {s}};
    CHECK_THROWS_WITH_AS(A(std::span<P>(ps), std::move(dist)), doctest::Contains("disagree on the global shape of parameter 0"),
                         lather::invalid_argument);
  }
  // Options that differ across ranks.
  {
    const auto s = lather::Sharding::zero_chunk(std::vector<std::int64_t>{4, 6}, r, n);
    Kokkos::View<double*, M> w("w", static_cast<std::size_t>(s.stored_numel()));
    std::vector<P> ps{P(w.data(), {s.stored_numel()})};
    lather::Distribution<lather::MpiCommunicator> dist{lather::MpiCommunicator(MPI_COMM_SELF), world.split(0, r), {s}};
    CHECK_THROWS_WITH_AS(C(std::span<P>(ps), std::move(dist), {.lr = r == 0 ? 1e-3 : 2e-3}),
                         doctest::Contains("disagree on option 'lr' of parameter 0"), lather::invalid_argument);
  }
  // A gradient on some ranks only: an error everywhere, nothing changed; a NaN in one rank's
  // shard skips the parameter on every rank.
  {
    const auto s = lather::Sharding::zero_chunk(std::vector<std::int64_t>{4, 6}, r, n);
    Kokkos::View<double*, M> w("w", static_cast<std::size_t>(s.stored_numel())), g("g", w.extent(0));
    Kokkos::deep_copy(w, 1.0);
    Kokkos::deep_copy(g, 0.5);
    std::vector<P> ps{P(w.data(), {s.stored_numel()})};
    std::vector<P> gs{r == 0 ? P() : P(g.data(), {s.stored_numel()})};
    A opt(std::span<P>(ps), lather::Distribution<lather::MpiCommunicator>{lather::MpiCommunicator(MPI_COMM_SELF),
                                                                          world.split(0, r), {s}});
    const auto before = opt.state_dict();
    CHECK_THROWS_WITH_AS(opt.step(ExecSpace(), gs), doctest::Contains("has a gradient on"), lather::invalid_argument);
    CHECK(opt.state_dict() == before);
    opt.set_nonfinite_policy(lather::NonFinitePolicy::skip_parameter);
    std::vector<P> all{P(g.data(), {s.stored_numel()})};
    if (r == n - 1) Kokkos::deep_copy(Kokkos::subview(g, 0), std::numeric_limits<double>::quiet_NaN());
    opt.step(ExecSpace(), all);
    CHECK(opt.step_count(0) == 0);
    CHECK(opt.nonfinite_skips(0) == 1);
    CHECK(opt.state_dict() == before);
  }
}
TEST_CASE_TEMPLATE_APPLY(dist_factored_errors, lather_test_exec_spaces);
