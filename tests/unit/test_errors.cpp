// SPDX-License-Identifier: Apache-2.0
// Bad input gets an error that names the option or parameter, and nothing is modified:
// invalid options (at construction, set_options, set_lr, load_state_dict), gradient count and
// shape mismatches, empty groups, aliased parameters and corrupt state dictionaries.
#include <lather/optimizers/adagrad.hpp>
#include <lather/optimizers/adam.hpp>
#include <lather/optimizers/rmsprop.hpp>
#include <lather/optimizers/sgd.hpp>

#include <Kokkos_Core.hpp>

#include <doctest/doctest.h>

#include "exec_spaces.hpp"
#include "test_utils.hpp"

#include <cmath>
#include <limits>
#include <variant>
#include <vector>

namespace {

using doctest::Contains;
constexpr double nan = std::numeric_limits<double>::quiet_NaN();

template <template <class, class> class Opt, class ExecSpace, class Options>
void expect_invalid(const Options& o, const char* needle) {
  using M = typename ExecSpace::memory_space;
  using P = lather::TensorRef<double, M>;
  Kokkos::View<double*, M> w("w", 4);
  std::vector<P> params{lather::tensor_ref(w)};
  CAPTURE(needle);
  CHECK_THROWS_WITH_AS((Opt<P, ExecSpace>(params, o)), Contains(needle), lather::invalid_argument);
}

template <class ExecSpace>
void impl_test_invalid_options() {
  using namespace lather;
  expect_invalid<SGD, ExecSpace>(SGDOptions{.lr = -0.1}, "'lr' = -0.1");
  expect_invalid<SGD, ExecSpace>(SGDOptions{.lr = nan}, "'lr'");
  expect_invalid<SGD, ExecSpace>(SGDOptions{.momentum = -1}, "'momentum'");
  expect_invalid<SGD, ExecSpace>(SGDOptions{.weight_decay = -1}, "'weight_decay'");
  expect_invalid<SGD, ExecSpace>(SGDOptions{.nesterov = true}, "'nesterov'");
  expect_invalid<SGD, ExecSpace>(SGDOptions{.momentum = 0.9, .dampening = 0.1, .nesterov = true}, "'dampening' = 0");
  expect_invalid<Adagrad, ExecSpace>(AdagradOptions{.lr_decay = -1}, "'lr_decay'");
  expect_invalid<Adagrad, ExecSpace>(AdagradOptions{.initial_accumulator_value = -1}, "'initial_accumulator_value'");
  expect_invalid<Adagrad, ExecSpace>(AdagradOptions{.eps = -1e-10}, "'eps'");
  expect_invalid<RMSprop, ExecSpace>(RMSpropOptions{.alpha = -0.5}, "'alpha'");
  expect_invalid<RMSprop, ExecSpace>(RMSpropOptions{.momentum = -0.5}, "'momentum'");
  expect_invalid<Adam, ExecSpace>(AdamOptions{.betas = {1.0, 0.999}}, "'betas[0]' = 1 (must be in [0, 1))");
  expect_invalid<Adam, ExecSpace>(AdamOptions{.betas = {0.9, -0.1}}, "'betas[1]'");
  expect_invalid<Adam, ExecSpace>(AdamOptions{.eps = -1}, "'eps'");
  expect_invalid<AdamW, ExecSpace>(AdamWOptions{.weight_decay = -0.01}, "lather::AdamW: parameter group 0: invalid option 'weight_decay'");
}

template <class ExecSpace>
void impl_test_construction_errors() {
  using M = typename ExecSpace::memory_space;
  using P = lather::TensorRef<double, M>;
  Kokkos::View<double*, M> w("w", 4);
  std::vector<P> none;
  CHECK_THROWS_WITH_AS((lather::Adam<P, ExecSpace>(none)), Contains("group 0 is empty"), lather::invalid_argument);
  CHECK_THROWS_WITH_AS((lather::Adam<P, ExecSpace>(std::vector<lather::ParamGroup<P, lather::AdamOptions>>{})),
                       Contains("no parameter groups"), lather::invalid_argument);
  std::vector<P> twice{lather::tensor_ref(w), lather::tensor_ref(w)};
  CHECK_THROWS_WITH_AS((lather::Adam<P, ExecSpace>(twice, {}, {"a", "b"})),
                       Contains("parameter 1 ('b') and parameter 0 ('a') share memory"),
                       lather::invalid_argument);
  std::vector<P> one{lather::tensor_ref(w)};
  CHECK_THROWS_WITH_AS((lather::Adam<P, ExecSpace>(one, {}, {"a", "b"})), Contains("1 parameters but 2 names"),
                       lather::invalid_argument);
}

// A step that throws leaves parameters and state exactly as they were.
template <class ExecSpace>
void impl_test_step_errors() {
  using M = typename ExecSpace::memory_space;
  using P = lather::TensorRef<double, M>;
  Kokkos::View<double**, M> w("w", 3, 2);
  Kokkos::View<double*, M> b("b", 2);
  lather::test::from_host(lather::tensor_ref(w), lather::test::random_values(6, 1));
  lather::test::from_host(lather::tensor_ref(b), lather::test::random_values(2, 2));
  std::vector<P> params{lather::tensor_ref(w), lather::tensor_ref(b)};
  lather::Adam<P, ExecSpace> opt(params, {.lr = 0.1}, {"layer.weight", "layer.bias"});
  Kokkos::View<double**, M> gw("gw", 3, 2);
  Kokkos::View<double*, M> gb("gb", 2);
  Kokkos::deep_copy(gw, 0.5);
  Kokkos::deep_copy(gb, 0.5);
  opt.step(ExecSpace(), std::vector<P>{lather::tensor_ref(gw), lather::tensor_ref(gb)});

  const auto before_w = lather::test::to_host(params[0]);
  const auto before_b = lather::test::to_host(params[1]);
  const auto before_state = opt.state_dict();
  auto unchanged = [&] {
    CHECK(lather::test::to_host(params[0]) == before_w);
    CHECK(lather::test::to_host(params[1]) == before_b);
    CHECK(opt.state_dict() == before_state);
  };

  Kokkos::View<double**, M> wrong("wrong", 2, 3);  // transposed shape
  CHECK_THROWS_WITH_AS(opt.step(ExecSpace(), std::vector<P>{lather::tensor_ref(gw), lather::tensor_ref(wrong)}),
                       Contains("parameter 1 ('layer.bias') has shape (2,) but its gradient has shape (2, 3)"),
                       lather::invalid_argument);
  unchanged();
  CHECK_THROWS_WITH_AS(opt.step(ExecSpace(), std::vector<P>{lather::tensor_ref(gw)}),
                       Contains("got 1 gradients for 2 parameters"), lather::invalid_argument);
  unchanged();

  // A parameter without a gradient (an empty tensor) is skipped, the others step.
  opt.step(ExecSpace(), std::vector<P>{P(), lather::tensor_ref(gb)});
  CHECK(lather::test::to_host(params[0]) == before_w);
  CHECK(lather::test::to_host(params[1]) != before_b);
  CHECK(opt.step_count(0) == 1);
  CHECK(opt.step_count(1) == 2);

  // Invalid option changes are refused and leave the options as they were.
  CHECK_THROWS_WITH_AS(opt.set_lr(-1.0), Contains("'lr' = -1"), lather::invalid_argument);
  CHECK(opt.options().lr == 0.1);
  CHECK_THROWS_WITH_AS(opt.set_options(0, {.betas = {0.9, 1.5}}), Contains("'betas[1]'"), lather::invalid_argument);
  CHECK(opt.options().betas[1] == 0.999);
  CHECK_THROWS_AS(opt.set_lr(3, 0.1), lather::invalid_argument);
}

template <class ExecSpace>
void impl_test_corrupt_state_dicts() {
  using M = typename ExecSpace::memory_space;
  using P = lather::TensorRef<double, M>;
  Kokkos::View<double*, M> w("w", 3);
  std::vector<P> params{lather::tensor_ref(w)};
  lather::SGD<P, ExecSpace> opt(params, {.lr = 0.1, .momentum = 0.9});
  Kokkos::View<double*, M> g("g", 3);
  Kokkos::deep_copy(g, 1.0);
  opt.step(ExecSpace(), std::vector<P>{lather::tensor_ref(g)});
  const lather::StateDict good = opt.state_dict();
  REQUIRE(good.contains("state.0.momentum_buffer"));

  auto rejects = [&](lather::StateDict d, const char* needle) {
    CAPTURE(needle);
    CHECK_THROWS_WITH_AS(opt.load_state_dict(d), Contains(needle), lather::invalid_argument);
    CHECK(opt.state_dict() == good);
  };
  lather::StateDict d = good;
  d.format = "lather.Adam.v1";
  rejects(d, "is a 'lather.Adam.v1' state, expected 'lather.SGD.v1'");
  d = good;
  d.tensors.erase("state.0.step");
  rejects(d, "missing entry 'state.0.step'");
  d = good;
  d.tensors["state.0.momentum_buffer"].shape = {4};
  rejects(d, "'state.0.momentum_buffer' does not match the shape (3,)");
  d = good;
  d.tensors["state.0.momentum_buffer"].values = std::vector<float>{1, 2, 3};
  rejects(d, "'state.0.momentum_buffer' is float32 but parameter 0 is float64");
  d = good;
  d.tensors["state.0.exp_avg"] = lather::StateTensor{{3}, std::vector<double>{1, 2, 3}};
  rejects(d, "unknown entry 'state.0.exp_avg'");
  d = good;
  d.tensors["param_groups.0.lr"] = lather::StateTensor{{}, std::vector<double>{-3}};
  rejects(d, "invalid option 'lr' = -3");
  d = good;
  d.tensors["param_groups.0.nesterov"] = lather::StateTensor{{}, std::vector<double>{0.5}};
  rejects(d, "'param_groups.0.nesterov' is a flag");
  d = good;
  d.tensors["state.0.step"] = lather::StateTensor{{}, std::vector<std::int64_t>{-1}};
  rejects(d, "'state.0.step' must be a non-negative int64 scalar");
  d = good;
  d.tensors["param_groups.0.num_params"] = lather::StateTensor{{}, std::vector<std::int64_t>{2}};
  rejects(d, "parameter group 0 has a different number of parameters");
  // The good dictionary still loads.
  opt.load_state_dict(good);
  CHECK(opt.state_dict() == good);
}

}  // namespace

TEST_CASE_TEMPLATE_DEFINE("errors: invalid options name the option and the rule", ExecSpace, invalid_options) {
  impl_test_invalid_options<ExecSpace>();
}
TEST_CASE_TEMPLATE_APPLY(invalid_options, lather_test_exec_spaces);

TEST_CASE_TEMPLATE_DEFINE("errors: construction checks", ExecSpace, construction) {
  impl_test_construction_errors<ExecSpace>();
}
TEST_CASE_TEMPLATE_APPLY(construction, lather_test_exec_spaces);

TEST_CASE_TEMPLATE_DEFINE("errors: a failed step changes nothing", ExecSpace, step_errors) {
  impl_test_step_errors<ExecSpace>();
}
TEST_CASE_TEMPLATE_APPLY(step_errors, lather_test_exec_spaces);

TEST_CASE_TEMPLATE_DEFINE("errors: corrupt state dictionaries are refused whole", ExecSpace, corrupt_state) {
  impl_test_corrupt_state_dicts<ExecSpace>();
}
TEST_CASE_TEMPLATE_APPLY(corrupt_state, lather_test_exec_spaces);

namespace {
// A NaN or Inf gradient is refused before anything changes; with the check off it flows through.
template <class ExecSpace>
void impl_test_nonfinite_gradients() {
  using M = typename ExecSpace::memory_space;
  using P = lather::TensorRef<double, M>;
  Kokkos::View<double*, M> w("w", 5), b("b", 2);
  Kokkos::deep_copy(w, 1.0);
  Kokkos::deep_copy(b, 1.0);
  std::vector<P> params{lather::tensor_ref(w), lather::tensor_ref(b)};
  lather::SGD<P, ExecSpace> opt(params, {.lr = 0.1, .momentum = 0.9}, {"w", "b"});
  CHECK(opt.check_finite());
  Kokkos::View<double*, M> gw("gw", 5), gb("gb", 2);
  Kokkos::deep_copy(gw, 0.5);
  Kokkos::deep_copy(gb, 0.5);
  opt.step(ExecSpace(), std::vector<P>{lather::tensor_ref(gw), lather::tensor_ref(gb)});
  const auto before = opt.state_dict();
  const auto w_before = lather::test::to_host(params[0]);
  for (double bad : {std::numeric_limits<double>::quiet_NaN(), std::numeric_limits<double>::infinity(),
                     -std::numeric_limits<double>::infinity()}) {
    Kokkos::deep_copy(Kokkos::subview(gb, 1), bad);
    CHECK_THROWS_WITH_AS(opt.step(ExecSpace(), std::vector<P>{lather::tensor_ref(gw), lather::tensor_ref(gb)}),
                         Contains("the gradient of parameter 1 ('b') has 1 NaN or Inf value(s) out of 2; nothing was changed"),
                         lather::invalid_argument);
    CHECK(opt.state_dict() == before);
    CHECK(lather::test::to_host(params[0]) == w_before);
  }
  opt.set_check_finite(false);
  Kokkos::deep_copy(Kokkos::subview(gb, 1), std::numeric_limits<double>::infinity());
  opt.step(ExecSpace(), std::vector<P>{lather::tensor_ref(gw), lather::tensor_ref(gb)});
  CHECK(std::isinf(lather::test::to_host(params[1])[1]));
}
}  // namespace

TEST_CASE_TEMPLATE_DEFINE("errors: NaN and Inf gradients are refused before anything changes", ExecSpace, nonfinite) {
  impl_test_nonfinite_gradients<ExecSpace>();
}
TEST_CASE_TEMPLATE_APPLY(nonfinite, lather_test_exec_spaces);

namespace {
// The exact count over large gradients: on host spaces the check cuts all gradients into 4096-element
// chunks in one loop and tests the exponent bits in vectors (impl/kernels/host_chunks.hpp). NaN,
// Inf and -Inf at chunk and vector edges, in the last (partial) vector, in a strided gradient and
// in a 1-element one; the largest finite value and subnormals count as finite.
template <class T, class ExecSpace>
void check_nonfinite_counts() {
  using M = typename ExecSpace::memory_space;
  using P = lather::TensorRef<T, M>;
  using lim = std::numeric_limits<T>;
  const std::int64_t n0 = 3 * 4096 + 7, n1 = 9001, n2 = 1;
  Kokkos::View<T*, M> w0("w0", n0), w1("w1", n1), w2("w2", n2), g0("g0", n0), g2("g2", n2), gbig("gbig", 2 * n1);
  Kokkos::View<T*, Kokkos::LayoutStride, M> g1(gbig.data(), Kokkos::LayoutStride(n1, 2));
  for (auto& v : {w0, w1, w2, g0, g2, gbig}) Kokkos::deep_copy(v, T(0.25));
  std::vector<P> params{lather::tensor_ref(w0), lather::tensor_ref(w1), lather::tensor_ref(w2)};
  lather::AdamW<P, ExecSpace> opt(params, {}, {"w0", "w1", "w2"});
  const auto grads = [&] { return std::vector<P>{lather::tensor_ref(g0), P(lather::tensor_ref(g1)), lather::tensor_ref(g2)}; };
  const auto set = [](const auto& v, std::int64_t i, T x) { Kokkos::deep_copy(Kokkos::subview(v, i), x); };
  // Finite extremes everywhere a bad value goes below: no count.
  for (std::int64_t i : std::initializer_list<std::int64_t>{0, 3, 4095, 4096, 8191, 12288, n0 - 1}) set(g0, i, i % 2 ? lim::max() : -lim::denorm_min());
  set(gbig, 2 * (n1 - 1), lim::lowest());  // g1's last element (g1 is every second one of gbig)
  opt.step(ExecSpace(), grads());
  const auto before = opt.state_dict();
  const auto w0_before = lather::test::to_host(params[0]);
  set(g0, 4095, lim::quiet_NaN());
  set(g0, 4096, lim::infinity());
  set(g0, n0 - 1, -lim::infinity());
  set(g0, n0 - 5, lim::quiet_NaN());
  CHECK_THROWS_WITH_AS(opt.step(ExecSpace(), grads()),
                       Contains("the gradient of parameter 0 ('w0') has 4 NaN or Inf value(s) out of 12295; nothing was changed"),
                       lather::invalid_argument);
  for (std::int64_t i : std::initializer_list<std::int64_t>{4095, 4096, n0 - 5, n0 - 1}) set(g0, i, T(0.25));
  set(gbig, 2 * (n1 - 1), lim::infinity());
  set(gbig, 2 * 4097, -lim::quiet_NaN());
  set(gbig, 2 * 4000 + 1, lim::quiet_NaN());  // between g1's elements: not counted
  CHECK_THROWS_WITH_AS(opt.step(ExecSpace(), grads()),
                       Contains("the gradient of parameter 1 ('w1') has 2 NaN or Inf value(s) out of 9001"),
                       lather::invalid_argument);
  set(gbig, 2 * (n1 - 1), T(0.25));
  set(gbig, 2 * 4097, T(0.25));
  set(g2, 0, -lim::infinity());
  CHECK_THROWS_WITH_AS(opt.step(ExecSpace(), grads()),
                       Contains("the gradient of parameter 2 ('w2') has 1 NaN or Inf value(s) out of 1"),
                       lather::invalid_argument);
  CHECK(opt.state_dict() == before);
  CHECK(lather::test::to_host(params[0]) == w0_before);
  set(g2, 0, T(0.25));
  opt.step(ExecSpace(), grads());  // all finite again
  CHECK(std::get<std::vector<std::int64_t>>(opt.state_dict().tensors.at("state.0.step").values)[0] == 2);
}
}  // namespace

TEST_CASE_TEMPLATE_DEFINE("errors: NaN and Inf are counted exactly in large and strided gradients", ExecSpace,
                          nonfinite_counts) {
  check_nonfinite_counts<float, ExecSpace>();
  check_nonfinite_counts<double, ExecSpace>();
}
TEST_CASE_TEMPLATE_APPLY(nonfinite_counts, lather_test_exec_spaces);
