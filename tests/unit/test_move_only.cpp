// SPDX-License-Identifier: Apache-2.0
// Optimizers are move-only: a copy would share the Kokkos Views holding the state (Views copy as
// handles) and update the same parameters while its host-side counters diverged. A moved-to
// optimizer, by construction or by assignment, continues the run bit for bit; that also checks that
// no part of the state (host chunk tables, block tasks, workspaces) points into the moved-from object.
#include <lather/optimizers/adafactor.hpp>
#include <lather/optimizers/adam.hpp>
#include <lather/optimizers/came.hpp>
#include <lather/optimizers/galore.hpp>
#include <lather/optimizers/lamb.hpp>
#include <lather/optimizers/shampoo.hpp>

#include <Kokkos_Core.hpp>

#include <doctest/doctest.h>

#include "exec_spaces.hpp"
#include "test_utils.hpp"

#include <cstdint>
#include <string>
#include <type_traits>
#include <vector>

namespace {

template <class Opt>
constexpr bool move_only = !std::is_copy_constructible_v<Opt> && !std::is_copy_assignable_v<Opt> &&
                           std::is_move_constructible_v<Opt> && std::is_move_assignable_v<Opt>;

// A (13, 300) matrix: over block size 256 on one side, so Shampoo has several blocks of unequal
// shape; a (13,) vector; a (1, 1) matrix.
template <class T, class M>
struct Params {
  Kokkos::View<T**, M> w{"w", 13, 300};
  Kokkos::View<T*, M> b{"b", 13};
  Kokkos::View<T**, M> s{"s", 1, 1};
  Kokkos::View<T**, M> gw{"gw", 13, 300};
  Kokkos::View<T*, M> gb{"gb", 13};
  Kokkos::View<T**, M> gs{"gs", 1, 1};
  std::vector<lather::TensorRef<T, M>> params;
  std::vector<lather::TensorRef<const T, M>> grads;
  explicit Params(std::uint64_t seed) {
    params = {lather::tensor_ref(w), lather::tensor_ref(b), lather::tensor_ref(s)};
    grads = {lather::tensor_ref(std::as_const(gw)), lather::tensor_ref(std::as_const(gb)),
             lather::tensor_ref(std::as_const(gs))};
    for (std::size_t i = 0; i < params.size(); ++i)
      lather::test::from_host(params[i], lather::test::random_values(params[i].size(), seed + i));
  }
  void grads_for(int t) {
    const std::uint64_t k = 100 * static_cast<std::uint64_t>(t);
    lather::test::from_host(lather::tensor_ref(gw), lather::test::random_values(gw.size(), k));
    lather::test::from_host(lather::tensor_ref(gb), lather::test::random_values(gb.size(), k + 1));
    lather::test::from_host(lather::tensor_ref(gs), lather::test::random_values(gs.size(), k + 2));
  }
  std::vector<double> values() const {
    std::vector<double> all;
    for (const auto& p : params) {
      const auto v = lather::test::to_host(p);
      all.insert(all.end(), v.begin(), v.end());
    }
    return all;
  }
};

// Eight steps straight against: three steps, move-construct, two steps, move-assign over an
// optimizer of other parameters (which had taken a step of its own), three steps. `make(params)`
// builds the optimizer. Parameters and state dictionaries must agree bit for bit.
template <class T, class ExecSpace, class Make>
void check_moves_continue(Make make, const std::string& what) {
  CAPTURE(what);
  using M = typename ExecSpace::memory_space;
  Params<T, M> straight(1);
  auto a = make(straight.params);
  for (int t = 1; t <= 8; ++t) {
    straight.grads_for(t);
    a.step(ExecSpace(), straight.grads);
  }

  Params<T, M> moved(1);
  auto b = make(moved.params);
  for (int t = 1; t <= 3; ++t) {
    moved.grads_for(t);
    b.step(ExecSpace(), moved.grads);
  }
  auto c = std::move(b);
  for (int t = 4; t <= 5; ++t) {
    moved.grads_for(t);
    c.step(ExecSpace(), moved.grads);
  }
  Params<T, M> other(7);
  auto d = make(other.params);
  other.grads_for(9);
  d.step(ExecSpace(), other.grads);
  const auto other_before = other.values();
  d = std::move(c);
  for (int t = 6; t <= 8; ++t) {
    moved.grads_for(t);
    d.step(ExecSpace(), moved.grads);
  }
  CHECK(moved.values() == straight.values());  // bitwise
  CHECK(d.state_dict() == a.state_dict());
  CHECK(other.values() == other_before);  // the assigned-over optimizer's parameters are left alone
}

// docs/state.md's way to duplicate an optimizer: a twin over its own parameters loads the
// state dictionary; both then step alike, and stepping one leaves the other's state alone.
template <class T, class ExecSpace>
void check_twin_by_state_dict() {
  using M = typename ExecSpace::memory_space;
  using P = lather::TensorRef<T, M>;
  Params<T, M> first(1);
  lather::AdamW<P, ExecSpace> opt(first.params, {.lr = 0.01, .weight_decay = 0.1});
  for (int t = 1; t <= 3; ++t) {
    first.grads_for(t);
    opt.step(ExecSpace(), first.grads);
  }
  Params<T, M> second(1);
  for (std::size_t i = 0; i < second.params.size(); ++i)
    lather::test::from_host(second.params[i], lather::test::to_host(first.params[i]));
  lather::AdamW<P, ExecSpace> twin(second.params, opt.options());
  twin.load_state_dict(opt.state_dict());
  const lather::StateDict before = opt.state_dict();
  second.grads_for(4);
  twin.step(ExecSpace(), second.grads);
  CHECK(opt.state_dict() == before);  // the twin's step changed nothing of the original
  CHECK(twin.step_count(0) == 4);
  first.grads_for(4);
  opt.step(ExecSpace(), first.grads);
  CHECK(first.values() == second.values());
  CHECK(opt.state_dict() == twin.state_dict());
}

template <class T, class ExecSpace>
void impl_test_moves() {
  using M = typename ExecSpace::memory_space;
  using P = lather::TensorRef<T, M>;
  static_assert(move_only<lather::AdamW<P, ExecSpace>>);
  static_assert(move_only<lather::Adafactor<P, ExecSpace>>);
  static_assert(move_only<lather::CAME<P, ExecSpace>>);
  static_assert(move_only<lather::Lamb<P, ExecSpace>>);
  static_assert(move_only<lather::GaLoreAdamW<P, ExecSpace>>);
  using S = lather::Shampoo<P, ExecSpace, lather::EigenRootInverse, lather::AdamGrafting, lather::ShampooPrecision<T>>;
  static_assert(move_only<S>);

  check_moves_continue<T, ExecSpace>(
      [](std::vector<P>& p) { return lather::AdamW<P, ExecSpace>(p, {.lr = 0.01, .weight_decay = 0.1}); }, "AdamW");
  check_moves_continue<T, ExecSpace>(
      [](std::vector<P>& p) { return lather::Adafactor<P, ExecSpace>(p, {.beta1 = 0.9}); }, "Adafactor");
  check_moves_continue<T, ExecSpace>([](std::vector<P>& p) { return lather::CAME<P, ExecSpace>(p, {.lr = 0.01}); },
                                     "CAME");
  check_moves_continue<T, ExecSpace>([](std::vector<P>& p) { return lather::Lamb<P, ExecSpace>(p, {.lr = 0.01}); },
                                     "Lamb");
  // Rank 4, projector recomputed every 3 steps: the moved-to optimizer recomputes it (step 7).
  check_moves_continue<T, ExecSpace>(
      [](std::vector<P>& p) {
        return lather::GaLoreAdamW<P, ExecSpace>(p, {.lr = 0.01, .rank = 4, .update_proj_gap = 3});
      },
      "GaLoreAdamW");
  // Root inverses every 2 steps (recomputed after each move), blocks of 256 and 44 columns.
  const lather::ShampooOptions so{.lr = 0.01, .epsilon = 1e-8, .max_preconditioner_dim = 256,
                                  .precondition_frequency = 2, .start_preconditioning_step = 2};
  check_moves_continue<T, ExecSpace>(
      [&](std::vector<P>& p) { return S(p, so, {}, lather::AdamGrafting{.beta2 = 0.999, .epsilon = 1e-8}); },
      "Shampoo");
  check_moves_continue<T, ExecSpace>(
      [&](std::vector<P>& p) {
        S s(p, so, {}, lather::AdamGrafting{.beta2 = 0.999, .epsilon = 1e-8});
        s.set_batched_passes(true);
        return s;
      },
      "Shampoo, batched passes");
  check_twin_by_state_dict<T, ExecSpace>();
}

}  // namespace

TEST_CASE_TEMPLATE_DEFINE("optimizers are move-only and moves continue bit for bit (float)", ExecSpace, moves_float) {
  impl_test_moves<float, ExecSpace>();
}
TEST_CASE_TEMPLATE_APPLY(moves_float, lather_test_exec_spaces);

TEST_CASE_TEMPLATE_DEFINE("optimizers are move-only and moves continue bit for bit (double)", ExecSpace, moves_double) {
  impl_test_moves<double, ExecSpace>();
}
TEST_CASE_TEMPLATE_APPLY(moves_double, lather_test_exec_spaces);
