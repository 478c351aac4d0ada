// SPDX-License-Identifier: Apache-2.0
// LAMB against hand-computed trajectories (tests/reference/lamb_hand_computed.py: apex FusedLAMB's
// and ColossalAI's formulas written out in plain Python doubles), plus state dictionaries, bad
// input and the properties of the trust ratio, on every execution space.
#include <lather/optimizers/lamb.hpp>

#include <Kokkos_Core.hpp>

#include <doctest/doctest.h>

#include "exec_spaces.hpp"
#include "test_utils.hpp"

#include <cmath>
#include <limits>
#include <vector>

namespace {

using lather::test::all_close;
using lather::test::from_host;
using lather::test::to_host;

const std::vector<double> kW0{0.5, -0.25, 1.0, 0.125, -0.75, 0.375};
const std::vector<double> kB0{0.1, -0.2, 0.3};
const std::vector<std::vector<double>> kGW{{1.5, -2.0, 0.5, 0.25, 3.0, -1.0},
                                           {-0.5, 1.0, 2.0, -1.5, 0.0, 0.75},
                                           {0.25, 0.5, -0.25, 1.0, -2.0, 1.25}};
const std::vector<std::vector<double>> kGB{{0.5, -0.5, 2.0}, {1.0, 0.0, -1.0}, {-0.25, 0.75, 0.5}};

struct Expected {
  std::vector<double> w, b;
};
// Printed by tests/reference/lamb_hand_computed.py.
const std::vector<Expected> kApexDefaults{
    {{0.4941598486224348, -0.24417437196152053, 0.9941308286133419, 0.11918172919471116, -0.7557675213474814, 0.3807892952439056}, {0.097841914719009, -0.19783975876988832, 0.2978375879792011}},
    {{0.49106326783402954, -0.24299072227967333, 0.9848182102366145, 0.12636684202877685, -0.7629644202779883, 0.37973376247555324}, {0.09485864259219864, -0.19566790484009497, 0.29748372098587544}},
    {{0.48526634375348, -0.2448991707041098, 0.9758424600517567, 0.12674717900018376, -0.7609123336105378, 0.37084178613503893}, {0.09215753068761072, -0.19770628413321814, 0.2960252732263328}}};
const std::vector<Expected> kApexL2Plain{
    {{0.18377890050928614, 0.0662227660958935, 0.6837922327183311, -0.19118777107584217, -1.0662244327186405, 0.6912177663330556}, {-0.21620776728166888, 0.11620776728166887, -0.016222766095893515}},
    {{0.013705751827693458, 0.17940353183238145, 0.30797409933306213, 0.07394667327701432, -1.3509688284730572, 0.7291762866426273}, {-0.6263591167237521, 0.400937149129458, -0.12940353183238146}},
    {{-0.18698539623837418, 0.2097920439244082, 0.010120889204472294, 0.09958338208930609, -1.3887081154841627, 0.5296407980595941}, {-0.9177252550650905, 0.27987015129106885, -0.2979216443427115}}};
const std::vector<Expected> kApexNvlamb{
    {{0.49418154662149544, -0.2441815421709804, 0.9941815822253705, 0.11918163563036606, -0.7558184622795414, 0.38081844447749497}, {0.09783975805762704, -0.19783975805762705, 0.2978397431863722}},
    {{0.4911301513455439, -0.24302118687190152, 0.9849512578038048, 0.12639979382115846, -0.7631177865233274, 0.37980144608836225}, {0.09485384156683647, -0.19567007873923575, 0.29749483096564056}},
    {{0.48533684839757707, -0.244992982218041, 0.9760169158602441, 0.126805186126933, -0.7611609424701736, 0.3708554521758234}, {0.0921546046987799, -0.19772083853703515, 0.29605010776572926}}};
const std::vector<Expected> kColossalAI{
    {{0.49815782798914665, -0.24815927239190363, 0.9981549973416637, 0.12316020298461845, -0.751834920916316, 0.3768370632866103}, {0.09931709666770366, -0.1993168807693278, 0.2993166324887556}},
    {{0.49717196580665995, -0.24750367978459667, 0.9959770874923272, 0.12469190610820868, -0.7534763313713481, 0.37705427660944213}, {0.09861396324531196, -0.19882853813538426, 0.2991221376464618}},
    {{0.49578002052977066, -0.24729172087242163, 0.9939094639116852, 0.1248684140259191, -0.7537322220934308, 0.3756711579483771}, {0.09800113193554644, -0.19908267452036926, 0.2987671839644049}}};

template <class T, class ExecSpace>
struct Problem {
  using M = typename ExecSpace::memory_space;
  using P = lather::TensorRef<T, M>;
  Kokkos::View<T*, M> w{"w", 6}, b{"b", 3}, gw{"gw", 6}, gb{"gb", 3};
  std::vector<P> params{P(w.data(), {2, 3}), P(b.data(), {3})};
  std::vector<P> grads{P(gw.data(), {2, 3}), P(gb.data(), {3})};
  Problem() {
    from_host(params[0], kW0);
    from_host(params[1], kB0);
  }
  void set_grads(int t) {
    from_host(grads[0], kGW[static_cast<std::size_t>(t)]);
    from_host(grads[1], kGB[static_cast<std::size_t>(t)]);
  }
};

template <class T, class ExecSpace>
void check_trajectory(const lather::LambOptions& o, const std::vector<Expected>& expected, const char* what) {
  Problem<T, ExecSpace> pr;
  lather::Lamb<typename Problem<T, ExecSpace>::P, ExecSpace> opt(pr.params, o, {"w", "b"});
  // Double agrees with the plain-Python reference to rounding (the norms are summed in another
  // order); float carries its own rounding through three steps of ~1e-2 relative updates.
  const double rtol = std::is_same_v<T, double> ? 1e-13 : 2e-6, atol = std::is_same_v<T, double> ? 1e-15 : 1e-6;
  for (int t = 0; t < 3; ++t) {
    pr.set_grads(t);
    opt.step(ExecSpace(), pr.grads);
    INFO(what << ", step " << t + 1);
    CHECK(all_close(to_host(pr.params[0]), expected[static_cast<std::size_t>(t)].w, rtol, atol, "w"));
    CHECK(all_close(to_host(pr.params[1]), expected[static_cast<std::size_t>(t)].b, rtol, atol, "b"));
  }
  CHECK(opt.step_count(0) == 3);
}

template <class ExecSpace>
void hand_computed() {
  lather::LambOptions apex{.lr = 0.01};
  lather::LambOptions l2{.lr = 0.01, .weight_decay = 0.0, .bias_correction = false, .adam_w_mode = false,
                         .grad_averaging = false, .max_grad_norm = 0.0};
  lather::LambOptions nv{.lr = 0.01, .weight_decay = 0.0, .use_nvlamb = true};
  lather::LambOptions cai{.lr = 0.01, .max_grad_norm = 0.0, .formula = lather::LambFormula::colossalai};
  check_trajectory<double, ExecSpace>(apex, kApexDefaults, "apex defaults");
  check_trajectory<double, ExecSpace>(l2, kApexL2Plain, "apex L2 mode");
  check_trajectory<double, ExecSpace>(nv, kApexNvlamb, "apex nvlamb");
  check_trajectory<double, ExecSpace>(cai, kColossalAI, "colossalai");
  check_trajectory<float, ExecSpace>(apex, kApexDefaults, "apex defaults, float");
  check_trajectory<float, ExecSpace>(cai, kColossalAI, "colossalai, float");
}

}  // namespace

TEST_CASE_TEMPLATE_DEFINE("LAMB: hand-computed apex and ColossalAI trajectories", ExecSpace, lamb_hand) {
  hand_computed<ExecSpace>();
}
TEST_CASE_TEMPLATE_APPLY(lamb_hand, lather_test_exec_spaces);

TEST_CASE_TEMPLATE_DEFINE("LAMB: the trust ratio makes the step lr * ||w|| whatever the gradient scale", ExecSpace,
                          lamb_trust) {
  // apex with weight decay: ||Δw|| = lr ||w|| exactly (up to rounding) at every step, and scaling
  // every gradient by 1000 changes nothing (clipping off, eps negligible).
  using M = typename ExecSpace::memory_space;
  using P = lather::TensorRef<double, M>;
  for (const double scale : {1.0, 1000.0}) {
    Kokkos::View<double*, M> w("w", 13), g("g", 13);
    std::vector<P> ps{P(w.data(), {13})}, gs{P(g.data(), {13})};
    from_host(ps[0], lather::test::random_values(13, 1));
    lather::Lamb<P, ExecSpace> opt(ps, {.lr = 0.1, .eps = 0.0, .max_grad_norm = 0.0});
    for (int t = 0; t < 4; ++t) {
      const auto before = to_host(ps[0]);
      auto gv = lather::test::random_values(13, 100 + static_cast<std::uint64_t>(t));
      for (auto& x : gv) x *= scale;
      from_host(gs[0], gv);
      opt.step(ExecSpace(), gs);
      const auto after = to_host(ps[0]);
      double dn = 0, wn = 0;
      for (std::size_t k = 0; k < 13; ++k) {
        dn += (after[k] - before[k]) * (after[k] - before[k]);
        wn += before[k] * before[k];
      }
      CHECK(std::sqrt(dn) == doctest::Approx(0.1 * std::sqrt(wn)).epsilon(1e-12));
    }
  }
}
TEST_CASE_TEMPLATE_APPLY(lamb_trust, lather_test_exec_spaces);

TEST_CASE_TEMPLATE_DEFINE("LAMB: a zero parameter takes an lr-sized step; a missing gradient is skipped", ExecSpace,
                          lamb_edges) {
  using M = typename ExecSpace::memory_space;
  using P = lather::TensorRef<double, M>;
  Kokkos::View<double*, M> w("w", 2), b("b", 1), gw("gw", 2);
  std::vector<P> ps{P(w.data(), {2}), P(b.data(), {1})};
  std::vector<P> gs{P(gw.data(), {2}), P()};
  from_host(gs[0], {3.0, -4.0});
  lather::Lamb<P, ExecSpace> opt(ps, {.lr = 0.5, .eps = 0.0, .weight_decay = 0.01, .max_grad_norm = 0.0});
  opt.step(ExecSpace(), gs);
  // ||w|| = 0: ratio = lr; bias-corrected m/sqrt(v) = sign(g) at step 1.
  CHECK(all_close(to_host(ps[0]), {-0.5, 0.5}, 1e-15, 1e-15, "w"));
  CHECK(to_host(ps[1]) == std::vector<double>{0.0});
  CHECK(opt.step_count(1) == 0);
  // The global gradient norm spans every parameter of every group: here 5 > 1 clips by 5.
  Kokkos::View<double*, M> w2("w2", 2), g2("g2", 2);
  std::vector<P> p2{P(w2.data(), {2})}, g2s{P(g2.data(), {2})};
  from_host(p2[0], {1.0, 1.0});
  from_host(g2s[0], {3.0, 4.0});
  lather::Lamb<P, ExecSpace> clipped(p2, {.lr = 0.1, .eps = 1.0, .weight_decay = 0.0});
  clipped.step(ExecSpace(), g2s);
  // m̂ = g/5, v̂ = (g/5)^2, u = m̂/(|m̂| + 1), no trust ratio (wd 0): Δ = -0.1 * (0.6/1.6, 0.8/1.8).
  CHECK(all_close(to_host(p2[0]), {1.0 - 0.1 * 0.6 / 1.6, 1.0 - 0.1 * 0.8 / 1.8}, 1e-15, 1e-15, "clipped"));
}
TEST_CASE_TEMPLATE_APPLY(lamb_edges, lather_test_exec_spaces);

TEST_CASE_TEMPLATE_DEFINE("LAMB: state dictionaries continue bitwise; bad input changes nothing", ExecSpace, lamb_state) {
  using Pr = Problem<double, ExecSpace>;
  Pr a, b;
  lather::Lamb<typename Pr::P, ExecSpace> oa(a.params, {.lr = 0.01}), ob(b.params, {.lr = 0.01});
  a.set_grads(0);
  oa.step(ExecSpace(), a.grads);
  const lather::StateDict d = oa.state_dict();
  CHECK(d.format == "lather.LAMB.v1");
  CHECK(d.at("state.0.exp_avg").shape == std::vector<std::int64_t>{6});
  // b: the parameters and the state of a after one step.
  from_host(b.params[0], to_host(a.params[0]));
  from_host(b.params[1], to_host(a.params[1]));
  ob.load_state_dict(d);
  CHECK(ob.state_dict() == d);
  for (int t = 1; t < 3; ++t) {
    a.set_grads(t);
    b.set_grads(t);
    oa.step(ExecSpace(), a.grads);
    ob.step(ExecSpace(), b.grads);
  }
  CHECK(to_host(a.params[0]) == to_host(b.params[0]));
  CHECK(to_host(a.params[1]) == to_host(b.params[1]));
  CHECK(oa.state_dict() == ob.state_dict());

  // Options of another run are refused by name; lr is restored.
  lather::Lamb<typename Pr::P, ExecSpace> other(b.params, {.lr = 0.5, .weight_decay = 0.1});
  CHECK_THROWS_WITH_AS(other.load_state_dict(d), doctest::Contains("option 'weight_decay'"), lather::invalid_argument);
  lather::Lamb<typename Pr::P, ExecSpace> lr_only(b.params, {.lr = 0.5});
  lr_only.load_state_dict(d);
  CHECK(lr_only.options().lr == 0.01);
  lather::StateDict bad = d;
  bad.tensors["state.0.exp_avg"].shape = {2, 3};
  CHECK_THROWS_WITH_AS(ob.load_state_dict(bad), doctest::Contains("different shape"), lather::invalid_argument);
  bad = d;
  bad.tensors["state.1.extra"] = lather::StateTensor{{}, std::vector<double>{1.0}};
  CHECK_THROWS_WITH_AS(ob.load_state_dict(bad), doctest::Contains("unknown entry 'state.1.extra'"),
                       lather::invalid_argument);
  CHECK(ob.state_dict() == oa.state_dict());

  // A NaN gradient: an error naming the parameter, nothing changed.
  const auto before = oa.state_dict();
  const auto w_before = to_host(a.params[0]);
  auto g = kGW[0];
  g[4] = std::numeric_limits<double>::quiet_NaN();
  from_host(a.grads[0], g);
  CHECK_THROWS_WITH_AS(oa.step(ExecSpace(), a.grads), doctest::Contains("parameter 0"), lather::invalid_argument);
  CHECK(oa.state_dict() == before);
  CHECK(to_host(a.params[0]) == w_before);
  // A wrong shape.
  Kokkos::View<double*, typename Pr::M> g5("g5", 5);
  std::vector<typename Pr::P> wrong{typename Pr::P(g5.data(), {5}), a.grads[1]};
  CHECK_THROWS_WITH_AS(oa.step(ExecSpace(), wrong), doctest::Contains("has shape (2, 3)"), lather::invalid_argument);
  CHECK(oa.state_dict() == before);
}
TEST_CASE_TEMPLATE_APPLY(lamb_state, lather_test_exec_spaces);

TEST_CASE("LAMB: invalid options are named") {
  using P = lather::TensorRef<double, Kokkos::HostSpace>;
  std::vector<double> w(3);
  std::vector<P> ps{P(w.data(), {3})};
  using L = lather::Lamb<P, Kokkos::DefaultHostExecutionSpace>;
  CHECK_THROWS_WITH_AS(L(ps, {.lr = -1.0}), doctest::Contains("invalid option 'lr' = -1"), lather::invalid_argument);
  CHECK_THROWS_WITH_AS(L(ps, {.betas = {1.0, 0.9}}), doctest::Contains("'betas[0]'"), lather::invalid_argument);
  CHECK_THROWS_WITH_AS(L(ps, {.max_grad_norm = -1.0}), doctest::Contains("'max_grad_norm'"), lather::invalid_argument);
  CHECK_THROWS_WITH_AS(L(ps, {.formula = lather::LambFormula::colossalai}),
                       doctest::Contains("'max_grad_norm' must be 0 with LambFormula::colossalai"),
                       lather::invalid_argument);
  CHECK_THROWS_WITH_AS(L(ps, {.formula = static_cast<lather::LambFormula>(7)}), doctest::Contains("'formula' = 7"),
                       lather::invalid_argument);
  L ok(ps);
  CHECK_THROWS_WITH_AS(ok.set_lr(std::numeric_limits<double>::quiet_NaN()), doctest::Contains("'lr'"),
                       lather::invalid_argument);
  CHECK(ok.options().lr == 1e-3);
  // A sharding that does not fit the tensor.
  lather::Distribution<lather::SerialCommunicator> dist{{}, {}, {lather::Sharding::whole({4})}};
  CHECK_THROWS_WITH_AS(L(std::span<P>(ps), dist), doctest::Contains("has 3 elements but its sharding (4,)"),
                       lather::invalid_argument);
}
