// SPDX-License-Identifier: Apache-2.0
// Distributed LAMB equals single-device LAMB, however the parameters are split: tensor-parallel
// row and column splits, ZeRO flat ranges with and without padding, TP x ZeRO, replicated and 1-D
// parameters side by side. Every rank computes the single-device reference from the same seeded
// gradients and compares its shard. Run by CTest at 1, 2 and 4 ranks.
#include <lather/comm/mpi_communicator.hpp>
#include <lather/optimizers/lamb.hpp>

#include <Kokkos_Core.hpp>

#include <doctest/doctest.h>

#include "exec_spaces.hpp"
#include "sharding_utils.hpp"
#include "test_utils.hpp"

#include <cstdint>
#include <limits>
#include <numeric>
#include <vector>

namespace {

using lather::test::all_ranks;
using lather::test::diff_over_max;
using lather::test::Layout;
using lather::test::Mesh;

struct ParamSpec {
  std::vector<std::int64_t> shape;
  Layout layout;
};
// Column-parallel weight (split rows), row-parallel weight (split columns), its bias, a replicated
// matrix and a 1-D vector; the element counts 15 and 7 leave ZeRO padding on 2 and 4 ranks.
std::vector<ParamSpec> specs(bool zero) {
  return {{{8, 12}, {0, zero}}, {{12, 8}, {1, zero}}, {{8}, {0, zero}}, {{5, 3}, {-1, zero}}, {{7}, {-1, zero}}};
}

std::int64_t numel(const std::vector<std::int64_t>& s) {
  return std::accumulate(s.begin(), s.end(), std::int64_t{1}, std::multiplies<>());
}

template <class T, class ExecSpace>
void run_mesh(int tp, int dp, bool zero, const lather::LambOptions& o) {
  using M = typename ExecSpace::memory_space;
  using P = lather::TensorRef<T, M>;
  auto mesh = lather::test::make_mesh(tp, dp);
  if (!mesh) return;
  INFO("tp " << tp << " x dp " << dp << (zero ? ", ZeRO" : "") << ", formula " << static_cast<int>(o.formula));
  const auto sp = specs(zero);
  constexpr int steps = 5;
  // Reference: whole parameters, single device.
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
    const std::vector<std::int64_t> local_shape =
        s.zero ? std::vector<std::int64_t>{s.stored_numel()} : s.local_shape();
    params.emplace_back(lp.back().data(), local_shape);
    grads.emplace_back(lg.back().data(), local_shape);
    lather::test::from_host(params.back(), lather::test::shard_of(initial.back(), s));
  }
  lather::Lamb<P, ExecSpace> ref(ref_params, o);
  lather::Lamb<P, ExecSpace, lather::MpiCommunicator> dist(
      std::span<P>(params), lather::Distribution<lather::MpiCommunicator>{std::move(mesh->tp), std::move(mesh->dp), shardings}, o);
  for (int t = 0; t < steps; ++t) {
    for (std::size_t i = 0; i < sp.size(); ++i) {
      const auto g = lather::test::random_values(static_cast<std::size_t>(numel(sp[i].shape)), 1000 * (t + 1) + i);
      lather::test::from_host(ref_grads[i], g);
      lather::test::from_host(grads[i], lather::test::shard_of(g, shardings[i]));
    }
    ref.step(ExecSpace(), ref_grads);
    dist.step(ExecSpace(), grads);
  }
  // Double: the norms' partial sums are added in another order, nothing else differs.
  const double tol = std::is_same_v<T, double> ? 1e-12 : 2e-5;
  bool ok = true;
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
    const double err = diff_over_max(d_got, d_ref);
    INFO("parameter " << i << " " << s.describe() << ": max|Δ - Δref| / max|Δref| = " << err);
    CHECK(err <= tol);
    ok = ok && err <= tol;
    // This rank's state holds its piece only.
    CHECK(dist.state(i, "exp_avg").shape == std::vector<std::int64_t>{s.stored_numel()});
  }
  CHECK(all_ranks(ok));
}

}  // namespace

TEST_CASE_TEMPLATE_DEFINE("distributed LAMB equals single-device LAMB on every mesh", ExecSpace, dist_lamb) {
  const int n = lather::test::world_size();
  const lather::LambOptions apex{.lr = 0.01};  // clipping active: the global gradient norm is ~9
  const lather::LambOptions cai{.lr = 0.01, .max_grad_norm = 0.0, .formula = lather::LambFormula::colossalai};
  for (const auto& o : {apex, cai}) {
    for (int tp = 1; tp <= n; ++tp) {
      if (n % tp != 0) continue;
      const int dp = n / tp;
      run_mesh<double, ExecSpace>(tp, dp, false, o);
      if (dp > 1) run_mesh<double, ExecSpace>(tp, dp, true, o);
    }
  }
  run_mesh<float, ExecSpace>(n, 1, false, apex);
  run_mesh<float, ExecSpace>(1, n, true, apex);
}
TEST_CASE_TEMPLATE_APPLY(dist_lamb, lather_test_exec_spaces);

TEST_CASE_TEMPLATE_DEFINE("distributed LAMB: disagreements are errors on every rank, never hangs", ExecSpace,
                          dist_lamb_errors) {
  using M = typename ExecSpace::memory_space;
  using P = lather::TensorRef<double, M>;
  const int n = lather::test::world_size();
  if (n == 1) return;
  lather::MpiCommunicator world(MPI_COMM_WORLD);
  const int r = world.rank();
  // Rank 0 believes the parameter has 9 elements, the others 8.
  {
    const std::vector<std::int64_t> shape{r == 0 ? 9 : 8};
    const auto s = lather::Sharding::zero_chunk(shape, r, n);
    Kokkos::View<double*, M> w("w", static_cast<std::size_t>(s.stored_numel()));
    std::vector<P> ps{P(w.data(), {s.stored_numel()})};
    using L = lather::Lamb<P, ExecSpace, lather::MpiCommunicator>;
    lather::Distribution<lather::MpiCommunicator> dist{lather::MpiCommunicator(MPI_COMM_SELF), world.split(0, r), {s}};
    CHECK_THROWS_WITH_AS(L(std::span<P>(ps), std::move(dist)), doctest::Contains("disagree on the global shape of parameter 0"),
                         lather::invalid_argument);
  }
  // Options that differ across ranks.
  {
    const auto s = lather::Sharding::zero_chunk(std::vector<std::int64_t>{8}, r, n);
    Kokkos::View<double*, M> w("w", static_cast<std::size_t>(s.stored_numel()));
    std::vector<P> ps{P(w.data(), {s.stored_numel()})};
    using L = lather::Lamb<P, ExecSpace, lather::MpiCommunicator>;
    lather::Distribution<lather::MpiCommunicator> dist{lather::MpiCommunicator(MPI_COMM_SELF), world.split(0, r), {s}};
    CHECK_THROWS_WITH_AS(L(std::span<P>(ps), std::move(dist), {.weight_decay = r == 0 ? 0.0 : 0.01}),
                         doctest::Contains("disagree on option 'weight_decay' of parameter 0"), lather::invalid_argument);
  }
  // A gradient present on some ranks only: an error everywhere, nothing changed.
  {
    const auto s = lather::Sharding::zero_chunk(std::vector<std::int64_t>{8}, r, n);
    Kokkos::View<double*, M> w("w", static_cast<std::size_t>(s.stored_numel())), g("g", w.extent(0));
    Kokkos::deep_copy(w, 1.0);
    Kokkos::deep_copy(g, 0.5);
    std::vector<P> ps{P(w.data(), {s.stored_numel()})};
    std::vector<P> gs{r == 0 ? P() : P(g.data(), {s.stored_numel()})};
    lather::Lamb<P, ExecSpace, lather::MpiCommunicator> opt(
        std::span<P>(ps), lather::Distribution<lather::MpiCommunicator>{lather::MpiCommunicator(MPI_COMM_SELF), world.split(0, r), {s}});
    const auto before = opt.state_dict();
    CHECK_THROWS_WITH_AS(opt.step(ExecSpace(), gs), doctest::Contains("has a gradient on"), lather::invalid_argument);
    CHECK(opt.state_dict() == before);
    // A NaN on one rank's shard: every rank skips the parameter under skip_parameter.
    opt.set_nonfinite_policy(lather::NonFinitePolicy::skip_parameter);
    std::vector<P> all{P(g.data(), {s.stored_numel()})};
    if (r == n - 1) Kokkos::deep_copy(Kokkos::subview(g, 0), std::numeric_limits<double>::quiet_NaN());
    opt.step(ExecSpace(), all);
    CHECK(opt.step_count(0) == 0);
    CHECK(opt.nonfinite_skips(0) == 1);
    CHECK(lather::test::to_host(ps[0]) == std::vector<double>(w.extent(0), 1.0));
  }
}
TEST_CASE_TEMPLATE_APPLY(dist_lamb_errors, lather_test_exec_spaces);
