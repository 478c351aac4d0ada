// SPDX-License-Identifier: Apache-2.0
// Sharded Adafactor, CAME, LAMB and GaLore-AdamW allocate nothing on the heap after their first
// step, on every mesh of the world (tensor-parallel row and column splits, ZeRO flat ranges with
// padding, TP x ZeRO, a replicated matrix and a 1-D vector side by side): the presence check and
// the reductions over the groups reuse buffers made at construction or by the first step, and
// GaLore's refresh steps (update_proj_gap 3: steps 4 and 7) gather the gradient into kept
// buffers. Counted per rank with this executable's global operator new
// (tests/harness/heap_count.hpp); MPI's own allocations (malloc) are not lather's and are not
// counted. Run by CTest at 1, 2 and 4 ranks.
#include <lather/comm/mpi_communicator.hpp>
#include <lather/optimizers/adafactor.hpp>
#include <lather/optimizers/came.hpp>
#include <lather/optimizers/galore.hpp>
#include <lather/optimizers/lamb.hpp>

#include <Kokkos_Core.hpp>

#include <doctest/doctest.h>

#include "exec_spaces.hpp"
#include "heap_count.hpp"
#include "sharding_utils.hpp"
#include "test_utils.hpp"

#include <cstdint>
#include <functional>
#include <numeric>
#include <span>
#include <string>
#include <vector>

#if LATHER_TEST_COUNTS_STEPS  // (heap_count.hpp: host compilers, Kokkos 3.4)
namespace {

using lather::test::all_ranks;
using lather::test::heap_allocations;
using lather::test::Layout;

struct ParamSpec {
  std::vector<std::int64_t> shape;
  Layout layout;
};
// Column-parallel weight (split rows), row-parallel weight (split columns), its bias, a replicated
// matrix and a 1-D vector; 15 and 7 elements leave ZeRO padding on 2 and 4 ranks.
std::vector<ParamSpec> specs(bool zero) {
  return {{{8, 12}, {0, zero}}, {{12, 8}, {1, zero}}, {{8}, {0, zero}}, {{5, 3}, {-1, zero}}, {{7}, {-1, zero}}};
}

// Builds the optimizer `make(params, distribution)` on a tp x dp mesh and counts its steps 2 to 8
// on this rank; every rank must count none.
template <class ExecSpace, class Make>
void check_mesh(const std::string& what, int tp, int dp, bool zero, Make&& make) {
  using M = typename ExecSpace::memory_space;
  using P = lather::TensorRef<float, M>;
  using G = lather::TensorRef<const float, M>;
  auto mesh = lather::test::make_mesh(tp, dp);
  if (!mesh) return;
  const auto sp = specs(zero);
  std::vector<Kokkos::View<float*, M>> values, grad_values;
  std::vector<P> params;
  std::vector<G> grads;
  std::vector<lather::Sharding> shardings;
  std::vector<std::vector<std::int64_t>> local_shapes;
  local_shapes.reserve(sp.size());
  for (std::size_t i = 0; i < sp.size(); ++i) {
    shardings.push_back(lather::test::sharding_for(sp[i].shape, sp[i].layout, *mesh));
    const lather::Sharding& s = shardings.back();
    const auto n = static_cast<std::size_t>(s.stored_numel());
    values.emplace_back("p", n);
    grad_values.emplace_back("g", n);
    local_shapes.push_back(s.zero ? std::vector<std::int64_t>{s.stored_numel()} : s.local_shape());
    params.emplace_back(values.back().data(), std::span<const std::int64_t>(local_shapes.back()));
    grads.emplace_back(grad_values.back().data(), std::span<const std::int64_t>(local_shapes.back()));
    const auto global = static_cast<std::size_t>(std::accumulate(sp[i].shape.begin(), sp[i].shape.end(),
                                                                 std::int64_t{1}, std::multiplies<>()));
    lather::test::from_host(params.back(), lather::test::shard_of(lather::test::random_values(global, 10 + i), s));
    lather::test::from_host(P(grad_values.back().data(), std::span<const std::int64_t>(local_shapes.back())),
                            lather::test::shard_of(lather::test::random_values(global, 20 + i), s));
  }
  auto opt = make(std::span<P>(params),
                  lather::Distribution<lather::MpiCommunicator>{std::move(mesh->tp), std::move(mesh->dp), shardings});
  const ExecSpace space;
  const auto step = [&] {
    opt.step(space, grads);
    space.fence();
  };
  step();
  bool none = true;
  for (int t = 2; t <= 8; ++t) {
    const auto n = heap_allocations(step);
    INFO(what, " on tp ", tp, " x dp ", dp, std::string(zero ? " (ZeRO)" : ""), ": step ", t, ": ", n,
         " heap allocations");
    CHECK(n == 0);
    none = none && n == 0;
  }
  CHECK(all_ranks(none));
}

template <class ExecSpace, class Make>
void check_every_mesh(const std::string& what, Make&& make) {
  const int n = lather::test::world_size();
  for (int tp = 1; tp <= n; ++tp) {
    if (n % tp != 0) continue;
    const int dp = n / tp;
    check_mesh<ExecSpace>(what, tp, dp, false, make);
    if (dp > 1) check_mesh<ExecSpace>(what, tp, dp, true, make);
  }
}

}  // namespace

TEST_CASE_TEMPLATE_DEFINE("distributed allocations: sharded family steps allocate nothing after the first",
                          ExecSpace, dist_family_allocations) {
  using M = typename ExecSpace::memory_space;
  using P = lather::TensorRef<float, M>;
  using D = lather::Distribution<lather::MpiCommunicator>;
  check_every_mesh<ExecSpace>("Adafactor", [](std::span<P> p, D d) {
    return lather::Adafactor<P, ExecSpace, lather::MpiCommunicator>(p, std::move(d), lather::AdafactorOptions{.beta1 = 0.9});
  });
  check_every_mesh<ExecSpace>("CAME", [](std::span<P> p, D d) {
    return lather::CAME<P, ExecSpace, lather::MpiCommunicator>(p, std::move(d), lather::CAMEOptions{.lr = 1e-3});
  });
  check_every_mesh<ExecSpace>("LAMB", [](std::span<P> p, D d) {
    return lather::Lamb<P, ExecSpace, lather::MpiCommunicator>(p, std::move(d), lather::LambOptions{.lr = 1e-2});
  });
  check_every_mesh<ExecSpace>("GaLore", [](std::span<P> p, D d) {
    return lather::GaLoreAdamW<P, ExecSpace, lather::MpiCommunicator>(
        p, std::move(d), lather::GaLoreOptions{.lr = 1e-3, .rank = 2, .update_proj_gap = 3});
  });
}
TEST_CASE_TEMPLATE_APPLY(dist_family_allocations, lather_test_exec_spaces);
#endif
