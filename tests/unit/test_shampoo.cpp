// SPDX-License-Identifier: Apache-2.0
// Shampoo: the reference's golden values (distributed-shampoo-notes section 12), equivalence with
// the grafted optimizers when preconditioning never starts, the polar factor at step 1, layout
// independence, bit-identical resume, and failures that leave everything unchanged.
#include <lather/optimizers/adagrad.hpp>
#include <lather/optimizers/adam.hpp>
#include <lather/optimizers/rmsprop.hpp>
#include <lather/optimizers/sgd.hpp>
#include <lather/optimizers/shampoo.hpp>
#include <lather/root_inverse/root_inverse.hpp>
#ifdef LATHER_ENABLE_EIGEN
#include <Eigen/Dense>
#endif

#include <Kokkos_Core.hpp>

#include <doctest/doctest.h>

#include "exec_spaces.hpp"
#include "test_utils.hpp"

#include <cmath>
#include <limits>
#include <vector>

namespace {

using doctest::Contains;

// The section-12 setup: one (4, 3) parameter, W0[i][j] = 0.1 (i - j) + 0.05,
// G_t[i][j] = sin(1 + i + 2 j + 3 t), max_preconditioner_dim 4, F = 1, S = -1.
std::vector<double> golden_w0() {
  std::vector<double> w(12);
  for (int i = 0; i < 4; ++i)
    for (int j = 0; j < 3; ++j) w[3 * i + j] = 0.1 * (i - j) + 0.05;
  return w;
}
std::vector<double> golden_grad(int t) {
  std::vector<double> g(12);
  for (int i = 0; i < 4; ++i)
    for (int j = 0; j < 3; ++j) g[3 * i + j] = std::sin(1.0 + i + 2.0 * j + 3.0 * t);
  return g;
}

template <class T, class ExecSpace, class Grafting, class Precision>
std::vector<std::vector<double>> golden_run(const lather::ShampooOptions& o, const Grafting& graft) {
  using M = typename ExecSpace::memory_space;
  using P = lather::TensorRef<T, M>;
  Kokkos::View<T**, Kokkos::LayoutRight, M> w("w", 4, 3), g("g", 4, 3);
  std::vector<P> params{lather::tensor_ref(w)};
  lather::test::from_host(params[0], golden_w0());
  lather::Shampoo<P, ExecSpace, lather::EigenRootInverse, Grafting, Precision> opt(params, o, {}, graft);
  std::vector<std::vector<double>> out;
  for (int t = 1; t <= 3; ++t) {
    lather::test::from_host(lather::tensor_ref(g), golden_grad(t));
    opt.step(ExecSpace(), std::vector<P>{lather::tensor_ref(g)});
    out.push_back(lather::test::to_host(params[0]));
  }
  return out;
}

template <class ExecSpace>
void impl_test_golden() {
  const std::vector<std::vector<double>> g1 = {
      {0.1424966, -0.0150557, -0.2714389, 0.2904934, -0.0676151, -0.0927446, 0.3091834, -0.0120858, 0.1252946,
       0.2732304, 0.1923266, 0.2740627},
      {0.1461344, -0.0325512, -0.260374, 0.2757061, -0.0709657, -0.0753099, 0.2894284, 0.0017429, 0.1331155,
       0.2664409, 0.2104829, 0.2650334},
      {0.1712212, -0.0138792, -0.30086, 0.3235697, -0.1026341, -0.0969574, 0.3159255, -0.0511958, 0.150255,
       0.2469809, 0.1848078, 0.305156}};
  const std::vector<std::vector<double>> g2 = {
      {0.0877753, -0.035757, -0.1996299, 0.2074075, 0.0020126, -0.0674678, 0.2742593, 0.0839016, 0.080754,
       0.3188073, 0.2265611, 0.2007008},
      {0.0885147, -0.0391817, -0.197519, 0.2045722, 0.0013441, -0.0640761, 0.270456, 0.0866039, 0.0823081,
       0.3175328, 0.2301497, 0.1989885},
      {0.0944825, -0.0347732, -0.2071559, 0.2159581, -0.0061633, -0.0692136, 0.276792, 0.0740828, 0.0863934,
       0.3129935, 0.2241268, 0.2085406}};
  const lather::ShampooOptions o1{.lr = 0.1, .betas = {0.9, 0.999}, .epsilon = 1e-3, .weight_decay = 0.01,
                                  .max_preconditioner_dim = 4};
  const lather::ShampooOptions o2{.lr = 0.1, .epsilon = 1e-3, .max_preconditioner_dim = 4};
  const lather::AdamGrafting adam{.beta2 = 0.999, .epsilon = 1e-8};
  // The golden values are printed to 7 decimals from a float32 run; the notes' float64
  // reference agrees to 1.1e-6 (G1) and 1.2e-7 (G2). Allow the printing (5e-8) plus those.
  auto check = [](const auto& got, const auto& want, double atol, const char* what) {
    for (std::size_t t = 0; t < want.size(); ++t) {
      CAPTURE(t);
      lather::test::all_close(got[t], want[t], 0.0, atol, what);
    }
  };
  check(golden_run<double, ExecSpace, lather::AdamGrafting, lather::ShampooPrecision<double>>(o1, adam), g1, 1.2e-6,
        "G1 double");
  check(golden_run<double, ExecSpace, lather::NoGrafting, lather::ShampooPrecision<double>>(o2, {}), g2, 2e-7,
        "G2 double");
  // float32 parameters and factors, as the reference run itself: float rounding on top.
  check(golden_run<float, ExecSpace, lather::AdamGrafting, lather::ShampooPrecision<float>>(o1, adam), g1, 3e-6,
        "G1 float");
  check(golden_run<float, ExecSpace, lather::NoGrafting, lather::ShampooPrecision<float>>(o2, {}), g2, 1e-6,
        "G2 float");
}

// With start_preconditioning_step = never, Shampoo is its grafting method.
template <class ExecSpace, class Grafting, class Reference>
void equals_grafted(const lather::ShampooOptions& o, const Grafting& graft, Reference& ref,
                    std::vector<lather::TensorRef<double, typename ExecSpace::memory_space>>& ref_params,
                    const char* what) {
  using M = typename ExecSpace::memory_space;
  using P = lather::TensorRef<double, M>;
  CAPTURE(what);
  Kokkos::View<double**, M> w("w", 5, 3), g("g", 5, 3);
  Kokkos::View<double*, M> b("b", 3), gb("gb", 3);
  std::vector<P> params{lather::tensor_ref(w), lather::tensor_ref(b)};
  for (std::size_t i = 0; i < 2; ++i) {
    const auto init = lather::test::random_values(params[i].size(), 10 + i);
    lather::test::from_host(params[i], init);
    lather::test::from_host(ref_params[i], init);
  }
  lather::Shampoo<P, ExecSpace, lather::EigenRootInverse, Grafting, lather::ShampooPrecision<double>> opt(params, o, {},
                                                                                                          graft);
  for (int t = 1; t <= 6; ++t) {
    lather::test::from_host(lather::tensor_ref(g), lather::test::random_values(15, 100 + t));
    lather::test::from_host(lather::tensor_ref(gb), lather::test::random_values(3, 200 + t));
    const std::vector<P> grads{lather::tensor_ref(g), lather::tensor_ref(gb)};
    opt.step(ExecSpace(), grads);
    ref.step(ExecSpace(), grads);
    CHECK(opt.last_step_info().grafted);
    CHECK_FALSE(opt.last_step_info().amortized);
    for (std::size_t i = 0; i < 2; ++i)  // same formulas, different operation order: ulps only
      lather::test::all_close(lather::test::to_host(params[i]), lather::test::to_host(ref_params[i]), 1e-13, 1e-15,
                              what);
  }
}

template <class ExecSpace>
void impl_test_grafting_equivalence() {
  using M = typename ExecSpace::memory_space;
  using P = lather::TensorRef<double, M>;
  Kokkos::View<double**, M> rw("rw", 5, 3);
  Kokkos::View<double*, M> rb("rb", 3);
  std::vector<P> rp{lather::tensor_ref(rw), lather::tensor_ref(rb)};
  const std::int64_t never = lather::never;
  {
    lather::Adagrad<P, ExecSpace> ref(rp, {.lr = 0.1, .eps = 1e-10});
    equals_grafted<ExecSpace>({.lr = 0.1, .betas = {0.0, 1.0}, .start_preconditioning_step = never},
                              lather::AdaGradGrafting{.epsilon = 1e-10}, ref, rp, "AdaGrad");
  }
  {
    lather::Adam<P, ExecSpace> ref(rp, {.lr = 0.05, .betas = {0.9, 0.999}, .eps = 1e-8, .weight_decay = 0.3});
    equals_grafted<ExecSpace>({.lr = 0.05, .betas = {0.9, 0.999}, .weight_decay = 0.3,
                               .weight_decay_type = lather::WeightDecayType::l2, .start_preconditioning_step = never},
                              lather::AdamGrafting{.beta2 = 0.999, .epsilon = 1e-8}, ref, rp, "Adam with L2");
  }
  {
    lather::AdamW<P, ExecSpace> ref(rp, {.lr = 0.05, .betas = {0.9, 0.999}, .eps = 1e-8, .weight_decay = 0.3});
    equals_grafted<ExecSpace>({.lr = 0.05, .betas = {0.9, 0.999}, .weight_decay = 0.3, .start_preconditioning_step = never},
                              lather::AdamGrafting{.beta2 = 0.999, .epsilon = 1e-8}, ref, rp, "AdamW");
  }
  {
    lather::RMSprop<P, ExecSpace> ref(rp, {.lr = 0.01, .alpha = 0.99, .eps = 1e-8});
    equals_grafted<ExecSpace>({.lr = 0.01, .betas = {0.0, 1.0}, .start_preconditioning_step = never,
                               .use_bias_correction = false},
                              lather::RMSpropGrafting{.beta2 = 0.99, .epsilon = 1e-8}, ref, rp, "RMSprop");
  }
  {
    lather::SGD<P, ExecSpace> ref(rp, {.lr = 0.1, .momentum = 0.9});
    // The reference's momentum buffer starts at zero (torch SGD's at the first direction), so
    // compare without momentum for SGD: plain SGD.
    lather::SGD<P, ExecSpace> plain(rp, {.lr = 0.1});
    equals_grafted<ExecSpace>({.lr = 0.1, .betas = {0.0, 1.0}, .start_preconditioning_step = never},
                              lather::SGDGrafting{}, plain, rp, "SGD");
    (void)ref;
  }
}

#ifdef LATHER_ENABLE_EIGEN
// Step 1 with betas (0.9, 1.0): Gbar = G and P = (G G^T)^(-1/4) G (G^T G)^(-1/4) = U V^T.
template <class ExecSpace>
void impl_test_polar_factor() {
  using M = typename ExecSpace::memory_space;
  using P = lather::TensorRef<double, M>;
  Kokkos::View<double**, Kokkos::LayoutRight, M> w("w", 6, 4), g("g", 6, 4);
  std::vector<P> params{lather::tensor_ref(w)};
  const auto gv = lather::test::random_values(24, 77);
  lather::test::from_host(lather::tensor_ref(g), gv);
  lather::Shampoo<P, ExecSpace, lather::EigenRootInverse, lather::NoGrafting, lather::ShampooPrecision<double>> opt(
      params, {.lr = 1.0, .epsilon = 1e-14, .max_preconditioner_dim = 8});
  opt.step(ExecSpace(), std::vector<P>{lather::tensor_ref(g)});
  Eigen::Matrix<double, 6, 4, Eigen::RowMajor> gm;
  for (int i = 0; i < 24; ++i) gm.data()[i] = gv[i];
  Eigen::JacobiSVD<Eigen::MatrixXd> svd(gm, Eigen::ComputeThinU | Eigen::ComputeThinV);
  const Eigen::MatrixXd polar = svd.matrixU() * svd.matrixV().transpose();
  const auto got = lather::test::to_host(params[0]);  // W1 = 0 - 1.0 * P
  std::vector<double> want(24);
  for (int i = 0; i < 6; ++i)
    for (int j = 0; j < 4; ++j) want[4 * i + j] = -polar(i, j);
  // A rank-4 6x6 left factor: its null space gets eps^(-1/4) = 3e3 gain, but G has no component
  // there, so the error is set by eigh's accuracy on the range (~1e-12 relative).
  lather::test::all_close(got, want, 0.0, 1e-8, "polar factor");
}
#endif

// A parameter in LayoutLeft, LayoutRight or strided gives the same trajectory, and blocking
// (max_preconditioner_dim smaller than the dimensions) with momentum and Nesterov runs.
template <class ExecSpace>
void impl_test_layouts_and_blocking() {
  using M = typename ExecSpace::memory_space;
  auto run = [](auto w) {
    using V = decltype(w);
    using P = lather::TensorRef<double, M>;
    Kokkos::View<double**, Kokkos::LayoutRight, M> g("g", 7, 5);
    std::vector<P> params{lather::tensor_ref(w)};
    lather::test::from_host(params[0], lather::test::random_values(35, 5));
    lather::Shampoo<P, ExecSpace, lather::EigenRootInverse, lather::AdamGrafting, lather::ShampooPrecision<double>> opt(
        params, {.lr = 0.01, .betas = {0.9, 0.999}, .epsilon = 1e-8, .max_preconditioner_dim = 3,
                 .momentum = 0.5, .use_nesterov = true},
        {}, {.epsilon = 1e-8});
    CHECK(opt.num_blocks(0) == 6);  // (7, 5) in blocks of 3: rows 3, 3, 1 by columns 3, 2
    for (int t = 1; t <= 5; ++t) {
      lather::test::from_host(lather::tensor_ref(g), lather::test::random_values(35, 300 + t));
      opt.step(ExecSpace(), std::vector<P>{lather::tensor_ref(g)});
    }
    (void)sizeof(V);
    return lather::test::to_host(params[0]);
  };
  const auto right = run(Kokkos::View<double**, Kokkos::LayoutRight, M>("w", 7, 5));
  const auto left = run(Kokkos::View<double**, Kokkos::LayoutLeft, M>("w", 7, 5));
  Kokkos::View<double**, Kokkos::LayoutRight, M> big("big", 7, 10);
  const auto strided = run(Kokkos::View<double**, Kokkos::LayoutStride, M>(big.data(), Kokkos::LayoutStride(7, 10, 5, 2)));
  CHECK(right == left);
  CHECK(right == strided);
}

// Save mid-run, restore into a fresh optimizer: bit-identical continuation.
template <class ExecSpace>
void impl_test_resume() {
  using M = typename ExecSpace::memory_space;
  using P = lather::TensorRef<float, M>;
  using Opt = lather::Shampoo<P, ExecSpace, lather::EigenRootInverse, lather::AdamGrafting>;
  const lather::ShampooOptions o{.lr = 0.01, .betas = {0.9, 0.999}, .epsilon = 1e-6, .max_preconditioner_dim = 4,
                                 .precondition_frequency = 2, .start_preconditioning_step = 2, .momentum = 0.3};
  auto grads_for = [](int t, Kokkos::View<float**, M> g, Kokkos::View<float*, M> gb) {
    lather::test::from_host(lather::tensor_ref(g), lather::test::random_values(30, 400 + t));
    lather::test::from_host(lather::tensor_ref(gb), lather::test::random_values(6, 500 + t));
  };
  auto make = [](Kokkos::View<float**, M>& w, Kokkos::View<float*, M>& b) {
    std::vector<P> p{lather::tensor_ref(w), lather::tensor_ref(b)};
    lather::test::from_host(p[0], lather::test::random_values(30, 1));
    lather::test::from_host(p[1], lather::test::random_values(6, 2));
    return p;
  };
  Kokkos::View<float**, M> g("g", 5, 6);
  Kokkos::View<float*, M> gb("gb", 6);
  Kokkos::View<float**, M> w1("w1", 5, 6), w2("w2", 5, 6);
  Kokkos::View<float*, M> b1("b1", 6), b2("b2", 6);
  auto p1 = make(w1, b1);
  Opt a(p1, o, {}, {.epsilon = 1e-8});
  lather::StateDict saved;
  std::vector<double> saved_w, saved_b;
  for (int t = 1; t <= 7; ++t) {
    if (t == 4) {
      saved = a.state_dict();
      saved_w = lather::test::to_host(p1[0]);
      saved_b = lather::test::to_host(p1[1]);
    }
    grads_for(t, g, gb);
    a.step(ExecSpace(), std::vector<P>{lather::tensor_ref(g), lather::tensor_ref(gb)});
  }
  auto p2 = make(w2, b2);
  lather::test::from_host(p2[0], saved_w);
  lather::test::from_host(p2[1], saved_b);
  Opt c(p2, o, {}, {.epsilon = 1e-8});
  c.load_state_dict(saved);
  CHECK(c.step_count() == 3);
  for (int t = 4; t <= 7; ++t) {
    grads_for(t, g, gb);
    c.step(ExecSpace(), std::vector<P>{lather::tensor_ref(g), lather::tensor_ref(gb)});
  }
  CHECK(lather::test::to_host(p2[0]) == lather::test::to_host(p1[0]));
  CHECK(lather::test::to_host(p2[1]) == lather::test::to_host(p1[1]));
  CHECK(c.state_dict() == a.state_dict());
  // A corrupt dictionary is refused whole.
  lather::StateDict bad = saved;
  bad.tensors.at("state.0.block_0.shampoo.factor_matrices.0").shape = {3, 3};
  const auto before = c.state_dict();
  CHECK_THROWS_WITH_AS(c.load_state_dict(bad), Contains("factor_matrices.0' must be a 4x4 matrix"),
                       lather::invalid_argument);
  CHECK(c.state_dict() == before);
}

// Errors: options, NaN gradients, an overflowing factor; nothing changes when a step throws.
template <class ExecSpace>
void impl_test_errors() {
  using M = typename ExecSpace::memory_space;
  using P = lather::TensorRef<float, M>;
  Kokkos::View<float**, M> w("w", 3, 2), g("g", 3, 2);
  std::vector<P> params{lather::tensor_ref(w)};
  using Opt = lather::Shampoo<P, ExecSpace>;
  CHECK_THROWS_WITH_AS(Opt(params, {.precondition_frequency = 2, .start_preconditioning_step = 0}),
                       Contains("'start_preconditioning_step' = 0"), lather::invalid_argument);
  CHECK_THROWS_WITH_AS(Opt(params, {.epsilon = 0.0}), Contains("'epsilon' = 0"), lather::invalid_argument);
  CHECK_THROWS_WITH_AS(Opt(params, {.betas = {0.9, 1.5}}), Contains("'betas[1]'"), lather::invalid_argument);
  CHECK_THROWS_WITH_AS(Opt(params, {.max_preconditioner_dim = 0}), Contains("max_preconditioner_dim"),
                       lather::invalid_argument);
  CHECK_THROWS_WITH_AS(Opt(params, {.inverse_exponent_override = {{2, {.per_dimension = {{5, 0.25}}}}}}),
                       Contains("dimension 5 does not exist"), lather::invalid_argument);
  // Coupled Newton needs integer roots.
  using Newton = lather::Shampoo<P, ExecSpace, lather::CoupledNewtonRootInverse>;
  CHECK_THROWS_WITH_AS(Newton(params, {.inverse_exponent_override = {{1, {.all = 0.3}}}}),  // (3, 2) merges to (6,)
                       Contains("cannot compute the root"), lather::invalid_argument);

  Opt opt(params, {.lr = 0.1, .epsilon = 1e-6}, {}, {}, {"layer.w"});
  lather::test::from_host(lather::tensor_ref(g), {1, 2, 3, 4, 5, 6});
  opt.step(ExecSpace(), std::vector<P>{lather::tensor_ref(g)});
  const auto state = opt.state_dict();
  const auto w_before = lather::test::to_host(params[0]);
  lather::test::from_host(lather::tensor_ref(g), {1, 2, std::numeric_limits<double>::quiet_NaN(), 4, 5, 6});
  CHECK_THROWS_WITH_AS(opt.step(ExecSpace(), std::vector<P>{lather::tensor_ref(g)}),
                       Contains("the gradient of parameter 0 ('layer.w') has 1 NaN or Inf"), lather::invalid_argument);
  CHECK(opt.state_dict() == state);
  // Huge finite float gradients overflow the factor (G G^T > FLT_MAX): the step raises, naming
  // the block and factor, and restores the factors and the step counter.
  lather::test::from_host(lather::tensor_ref(g), {3e19, 1, 1, 1, 1, 1});
  CHECK_THROWS_WITH_AS(opt.step(ExecSpace(), std::vector<P>{lather::tensor_ref(g)}),
                       Contains("the factor matrix 0 of block 0 of parameter 0 ('layer.w') has"),
                       lather::runtime_error);
  CHECK(opt.state_dict() == state);
  CHECK(lather::test::to_host(params[0]) == w_before);
  CHECK(opt.step_count() == 1);
}

}  // namespace

TEST_CASE_TEMPLATE_DEFINE("shampoo: golden values of the reference (section 12)", ExecSpace, shampoo_golden) {
  impl_test_golden<ExecSpace>();
}
TEST_CASE_TEMPLATE_APPLY(shampoo_golden, lather_test_exec_spaces);

TEST_CASE_TEMPLATE_DEFINE("shampoo: never preconditioning equals the grafted optimizer", ExecSpace, shampoo_graft_eq) {
  impl_test_grafting_equivalence<ExecSpace>();
}
TEST_CASE_TEMPLATE_APPLY(shampoo_graft_eq, lather_test_exec_spaces);

#ifdef LATHER_ENABLE_EIGEN
TEST_CASE_TEMPLATE_DEFINE("shampoo: step 1 with beta2 = 1 is the polar factor", ExecSpace, shampoo_polar) {
  impl_test_polar_factor<ExecSpace>();
}
TEST_CASE_TEMPLATE_APPLY(shampoo_polar, lather_test_exec_spaces);
#endif

TEST_CASE_TEMPLATE_DEFINE("shampoo: layouts, blocking, momentum", ExecSpace, shampoo_layouts) {
  impl_test_layouts_and_blocking<ExecSpace>();
}
TEST_CASE_TEMPLATE_APPLY(shampoo_layouts, lather_test_exec_spaces);

TEST_CASE_TEMPLATE_DEFINE("shampoo: restored runs continue bit-identically", ExecSpace, shampoo_resume) {
  impl_test_resume<ExecSpace>();
}
TEST_CASE_TEMPLATE_APPLY(shampoo_resume, lather_test_exec_spaces);

TEST_CASE_TEMPLATE_DEFINE("shampoo: errors leave everything unchanged", ExecSpace, shampoo_errors) {
  impl_test_errors<ExecSpace>();
}
TEST_CASE_TEMPLATE_APPLY(shampoo_errors, lather_test_exec_spaces);
