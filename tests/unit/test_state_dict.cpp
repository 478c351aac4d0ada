// SPDX-License-Identifier: Apache-2.0
// State save/restore: a run restored from a mid-run state dictionary continues bit-identically,
// the dictionary exposes the documented entries, and state is inspectable per parameter.
#include <lather/optimizers/adagrad.hpp>
#include <lather/optimizers/adam.hpp>
#include <lather/optimizers/rmsprop.hpp>
#include <lather/optimizers/sgd.hpp>

#include <Kokkos_Core.hpp>

#include <doctest/doctest.h>

#include "exec_spaces.hpp"
#include "test_utils.hpp"

#include <vector>

namespace {

template <class T, class M>
struct TwoParams {
  Kokkos::View<T**, M> w{"w", 5, 3};
  Kokkos::View<T*, M> b{"b", 3};
  Kokkos::View<T**, M> gw{"gw", 5, 3};
  Kokkos::View<T*, M> gb{"gb", 3};
  std::vector<lather::TensorRef<T, M>> params;
  std::vector<lather::TensorRef<const T, M>> grads;
  TwoParams() {
    params = {lather::tensor_ref(w), lather::tensor_ref(b)};
    grads = {lather::tensor_ref(std::as_const(gw)), lather::tensor_ref(std::as_const(gb))};
    lather::test::from_host(params[0], lather::test::random_values(15, 1));
    lather::test::from_host(params[1], lather::test::random_values(3, 2));
  }
  void grads_for(int t) {
    lather::test::from_host(lather::tensor_ref(gw), lather::test::random_values(15, 100 + t));
    lather::test::from_host(lather::tensor_ref(gb), lather::test::random_values(3, 200 + t));
  }
  std::vector<double> values() const {
    auto a = lather::test::to_host(params[0]);
    auto c = lather::test::to_host(params[1]);
    a.insert(a.end(), c.begin(), c.end());
    return a;
  }
  void set_values(const std::vector<double>& v) {
    lather::test::from_host(params[0], std::vector<double>(v.begin(), v.begin() + 15));
    lather::test::from_host(params[1], std::vector<double>(v.begin() + 15, v.end()));
  }
};

// Run 8 steps straight; separately run 4, save, rebuild optimizer + parameters from the saved
// values, restore, run 4 more: the parameters must match bit for bit, and so must the states.
template <template <class, class> class Opt, class T, class ExecSpace, class Options>
void check_bit_identical_resume(const Options& options, const char* what) {
  CAPTURE(what);
  using M = typename ExecSpace::memory_space;
  using P = lather::TensorRef<T, M>;
  TwoParams<T, M> straight;
  Opt<P, ExecSpace> a(straight.params, options);
  for (int t = 1; t <= 8; ++t) {
    if (t == 5) a.set_lr(options.lr * 0.5);  // a scheduler step: the new lr is part of the state
    straight.grads_for(t);
    a.step(ExecSpace(), straight.grads);
  }

  TwoParams<T, M> first;
  lather::StateDict saved;
  std::vector<double> saved_values;
  {
    Opt<P, ExecSpace> b(first.params, options);
    for (int t = 1; t <= 4; ++t) {
      first.grads_for(t);
      b.step(ExecSpace(), first.grads);
    }
    b.set_lr(options.lr * 0.5);
    saved = b.state_dict();
    saved_values = first.values();
  }
  TwoParams<T, M> resumed;
  resumed.set_values(saved_values);
  Opt<P, ExecSpace> c(resumed.params, options);  // constructed with the original lr
  c.load_state_dict(saved);
  CHECK(c.options().lr == options.lr * 0.5);
  CHECK(c.step_count(0) == 4);
  for (int t = 5; t <= 8; ++t) {
    resumed.grads_for(t);
    c.step(ExecSpace(), resumed.grads);
  }
  CHECK(resumed.values() == straight.values());  // bitwise
  CHECK(c.state_dict() == a.state_dict());
}

template <class T, class ExecSpace>
void impl_test_resume() {
  check_bit_identical_resume<lather::SGD, T, ExecSpace>(
      lather::SGDOptions{.lr = 0.05, .momentum = 0.9, .weight_decay = 0.01, .nesterov = true}, "SGD");
  check_bit_identical_resume<lather::Adagrad, T, ExecSpace>(
      lather::AdagradOptions{.lr = 0.1, .lr_decay = 0.01, .initial_accumulator_value = 0.1}, "Adagrad");
  check_bit_identical_resume<lather::RMSprop, T, ExecSpace>(
      lather::RMSpropOptions{.lr = 0.01, .momentum = 0.5, .centered = true}, "RMSprop");
  check_bit_identical_resume<lather::Adam, T, ExecSpace>(
      lather::AdamOptions{.lr = 0.01, .weight_decay = 0.1, .amsgrad = true}, "Adam");
  check_bit_identical_resume<lather::AdamW, T, ExecSpace>(lather::AdamWOptions{.lr = 0.01}, "AdamW");
}

template <class ExecSpace>
void impl_test_contents() {
  using M = typename ExecSpace::memory_space;
  using P = lather::TensorRef<double, M>;
  TwoParams<double, M> pb;
  std::vector<lather::ParamGroup<P, lather::AdamOptions>> groups{
      {.params = std::span(pb.params).subspan(0, 1), .options = {.lr = 0.1}, .names = {"fc.weight"}},
      {.params = std::span(pb.params).subspan(1, 1), .options = {.lr = 0.2, .amsgrad = true}, .names = {"fc.bias"}}};
  lather::Adam<P, ExecSpace> opt(groups);
  CHECK(opt.num_groups() == 2);
  CHECK(opt.param_name(1) == "fc.bias");
  CHECK(opt.state(0, "max_exp_avg_sq").data() == nullptr);  // group 0 does not use amsgrad
  pb.grads_for(1);
  opt.step(ExecSpace(), pb.grads);
  const lather::StateDict d = opt.state_dict();
  CHECK(d.format == "lather.Adam.v1");
  CHECK(d.contains("state.0.step"));
  CHECK(d.contains("state.0.exp_avg"));
  CHECK_FALSE(d.contains("state.0.max_exp_avg_sq"));
  CHECK(d.contains("state.1.max_exp_avg_sq"));
  CHECK(d.at("state.0.exp_avg").shape == std::vector<std::int64_t>{5, 3});
  CHECK(d.at("param_groups.1.lr") == lather::StateTensor{{}, std::vector<double>{0.2}});
  CHECK(d.at("param_groups.0.betas").shape == std::vector<std::int64_t>{2});
  // After one Adam step from zero state, exp_avg = (1 - beta1) * g, read through state().
  auto m = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), opt.state(1, "exp_avg"));
  const auto g = lather::test::to_host(pb.grads[1]);
  for (int i = 0; i < 3; ++i) CHECK(m(i) == doctest::Approx((1 - 0.9) * g[i]).epsilon(1e-15));
  CHECK_THROWS_AS((void)opt.state(0, "momentum_buffer"), lather::invalid_argument);
}

}  // namespace

TEST_CASE_TEMPLATE_DEFINE("state dict: restored runs continue bit-identically (double)", ExecSpace, resume_double) {
  impl_test_resume<double, ExecSpace>();
}
TEST_CASE_TEMPLATE_APPLY(resume_double, lather_test_exec_spaces);

TEST_CASE_TEMPLATE_DEFINE("state dict: restored runs continue bit-identically (float)", ExecSpace, resume_float) {
  impl_test_resume<float, ExecSpace>();
}
TEST_CASE_TEMPLATE_APPLY(resume_float, lather_test_exec_spaces);

TEST_CASE_TEMPLATE_DEFINE("state dict: entries, groups and inspection", ExecSpace, contents) {
  impl_test_contents<ExecSpace>();
}
TEST_CASE_TEMPLATE_APPLY(contents, lather_test_exec_spaces);
