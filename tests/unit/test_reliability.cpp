// SPDX-License-Identifier: Apache-2.0
// Reliability (docs/reliability.md): NaN/Inf gradient policies (raise, skip a parameter, skip the
// step) for every optimizer, with what was skipped left exactly as before; gradients that alias
// each other or a parameter; checkpoints of another option set refused; bitwise determinism of
// repeated runs; bit-identical resume for the strategies not covered elsewhere; all-zero
// gradients; rank-deficient factors with epsilon = 0 (pseudo-inverse) against the closed form.
#include <lather/optimizers/adagrad.hpp>
#include <lather/optimizers/adam.hpp>
#include <lather/optimizers/rmsprop.hpp>
#include <lather/optimizers/sgd.hpp>
#include <lather/optimizers/shampoo.hpp>
#include <lather/preconditioners/preconditioners.hpp>
#include <lather/root_inverse/root_inverse.hpp>

#include <Kokkos_Core.hpp>

#include <doctest/doctest.h>

#include "exec_spaces.hpp"
#include "test_utils.hpp"

#include <cmath>
#include <limits>
#include <optional>
#include <variant>
#include <string>
#include <vector>

namespace {

using doctest::Contains;

// Three parameters, (6, 4), (4,) and (2, 3), random values; gradients per step from a seed.
template <class T, class ExecSpace>
struct Model {
  using M = typename ExecSpace::memory_space;
  using P = lather::TensorRef<T, M>;
  Kokkos::View<T**, Kokkos::LayoutRight, M> w{"w", 6, 4}, gw{"gw", 6, 4};
  Kokkos::View<T*, M> b{"b", 4}, gb{"gb", 4};
  Kokkos::View<T**, Kokkos::LayoutRight, M> v{"v", 2, 3}, gv{"gv", 2, 3};
  std::vector<P> params{lather::tensor_ref(w), lather::tensor_ref(b), lather::tensor_ref(v)};
  std::vector<P> grads{lather::tensor_ref(gw), lather::tensor_ref(gb), lather::tensor_ref(gv)};
  Model() {
    for (std::size_t i = 0; i < 3; ++i)
      lather::test::from_host(params[i], lather::test::random_values(params[i].size(), 10 + i));
  }
  void set_grads(int t) {
    for (std::size_t i = 0; i < 3; ++i)
      lather::test::from_host(grads[i], lather::test::random_values(grads[i].size(), 1000 * t + i));
  }
  void poison(std::size_t i, double bad) {
    auto h = lather::test::to_host(grads[i]);
    h[h.size() / 2] = bad;
    lather::test::from_host(grads[i], h);
  }
  std::vector<std::vector<double>> values() const {
    return {lather::test::to_host(params[0]), lather::test::to_host(params[1]), lather::test::to_host(params[2])};
  }
};

// Entries of a state dictionary that belong to parameter i ("state.<i>." prefix).
lather::StateDict entries_of(const lather::StateDict& d, std::size_t i) {
  lather::StateDict r;
  const std::string prefix = "state." + std::to_string(i) + ".";
  for (const auto& [name, t] : d.tensors)
    if (name.rfind(prefix, 0) == 0) r.tensors[name] = t;
  return r;
}

// For one optimizer type: 2 good steps, then a step whose gradient of parameter 1 holds `bad`.
//  - raise: throws naming the parameter; nothing changes;
//  - skip_parameter: equals a run where parameter 1 had no gradient that step (same values and
//    state, bitwise), parameter 1 and its state are as before, the skip is counted;
//  - skip_step: nothing changes (step counters included), the skip is counted;
// and training goes on normally afterwards.
template <class T, class ExecSpace, class MakeOpt>
void check_policies(MakeOpt make, const char* what) {
  CAPTURE(what);
  using P = typename Model<T, ExecSpace>::P;
  for (const double bad : {std::numeric_limits<double>::quiet_NaN(), std::numeric_limits<double>::infinity()}) {
    Model<T, ExecSpace> a, ref;
    auto opt = make(a.params);
    auto opt_ref = make(ref.params);
    CHECK(opt.nonfinite_policy() == lather::NonFinitePolicy::raise);
    for (int t = 1; t <= 2; ++t) {
      a.set_grads(t);
      ref.set_grads(t);
      opt.step(ExecSpace(), a.grads);
      opt_ref.step(ExecSpace(), ref.grads);
    }
    const auto before = opt.state_dict();
    const auto values_before = a.values();
    a.set_grads(3);
    a.poison(1, bad);
    CHECK_THROWS_WITH_AS(opt.step(ExecSpace(), a.grads), Contains("the gradient of parameter 1 has 1 NaN or Inf value"),
                         lather::invalid_argument);
    CHECK(opt.state_dict() == before);
    CHECK(a.values() == values_before);

    opt.set_nonfinite_policy(lather::NonFinitePolicy::skip_step);
    opt.step(ExecSpace(), a.grads);
    CHECK(opt.state_dict() == before);
    CHECK(a.values() == values_before);
    CHECK(opt.skipped_steps() == 1);
    CHECK(opt.nonfinite_skips(1) == 1);
    CHECK(opt.nonfinite_skips(0) == 0);

    opt.set_nonfinite_policy(lather::NonFinitePolicy::skip_parameter);
    opt.step(ExecSpace(), a.grads);
    CHECK(opt.skipped_steps() == 1);
    CHECK(opt.nonfinite_skips(1) == 2);
    CHECK(a.values()[1] == values_before[1]);
    CHECK(entries_of(opt.state_dict(), 1) == entries_of(before, 1));
    // The reference run: parameter 1 without a gradient on step 3.
    ref.set_grads(3);
    std::vector<P> masked = ref.grads;
    masked[1] = P();
    opt_ref.step(ExecSpace(), masked);
    CHECK(a.values() == ref.values());
    CHECK(opt.state_dict() == opt_ref.state_dict());
    // Training continues.
    for (int t = 4; t <= 5; ++t) {
      a.set_grads(t);
      ref.set_grads(t);
      opt.step(ExecSpace(), a.grads);
      opt_ref.step(ExecSpace(), ref.grads);
    }
    CHECK(a.values() == ref.values());
  }
}

template <class T, class ExecSpace>
void impl_test_policies() {
  using P = typename Model<T, ExecSpace>::P;
  check_policies<T, ExecSpace>([](std::vector<P>& p) { return lather::SGD<P, ExecSpace>(p, {.lr = 0.1, .momentum = 0.9}); },
                               "SGD");
  check_policies<T, ExecSpace>([](std::vector<P>& p) { return lather::Adagrad<P, ExecSpace>(p, {.lr = 0.1}); }, "Adagrad");
  check_policies<T, ExecSpace>([](std::vector<P>& p) { return lather::RMSprop<P, ExecSpace>(p, {.lr = 0.01, .centered = true}); },
                               "RMSprop");
  check_policies<T, ExecSpace>([](std::vector<P>& p) { return lather::Adam<P, ExecSpace>(p, {.lr = 0.01, .amsgrad = true}); },
                               "Adam");
  check_policies<T, ExecSpace>([](std::vector<P>& p) { return lather::AdamW<P, ExecSpace>(p, {.lr = 0.01}); }, "AdamW");
  // The same with the kernels devices run: from the second step the update is queued behind the
  // count, gated on it, and the counts are read afterwards (impl::DiagonalOptimizer::step), so
  // what the policy refuses must be skipped on the device and put back on the host.
  const auto portable = [](auto opt) {
    opt.set_portable_kernels(true);
    return opt;
  };
  check_policies<T, ExecSpace>(
      [&](std::vector<P>& p) { return portable(lather::SGD<P, ExecSpace>(p, {.lr = 0.1, .momentum = 0.9})); },
      "SGD, portable kernels");
  check_policies<T, ExecSpace>(
      [&](std::vector<P>& p) { return portable(lather::Adagrad<P, ExecSpace>(p, {.lr = 0.1})); }, "Adagrad, portable kernels");
  check_policies<T, ExecSpace>(
      [&](std::vector<P>& p) { return portable(lather::RMSprop<P, ExecSpace>(p, {.lr = 0.01, .centered = true})); },
      "RMSprop, portable kernels");
  check_policies<T, ExecSpace>(
      [&](std::vector<P>& p) { return portable(lather::Adam<P, ExecSpace>(p, {.lr = 0.01, .amsgrad = true})); },
      "Adam, portable kernels");
  check_policies<T, ExecSpace>([&](std::vector<P>& p) { return portable(lather::AdamW<P, ExecSpace>(p, {.lr = 0.01})); },
                               "AdamW, portable kernels");
  const lather::ShampooOptions o{.lr = 0.01, .betas = {0.9, 0.999}, .epsilon = 1e-6, .max_preconditioner_dim = 4,
                                 .precondition_frequency = 2, .momentum = 0.5};
  check_policies<T, ExecSpace>(
      [&](std::vector<P>& p) {
        return lather::Shampoo<P, ExecSpace, lather::EigenRootInverse, lather::AdamGrafting, lather::ShampooPrecision<T>>(
            p, o);
      },
      "Shampoo (Adam grafting)");
  // The batched passes (the device path): step 3 is a steady step, queued behind the count and
  // gated on it (Shampoo::step), so what the policy refuses must be skipped on the device.
  check_policies<T, ExecSpace>(
      [&](std::vector<P>& p) {
        lather::Shampoo<P, ExecSpace, lather::EigenRootInverse, lather::AdamGrafting, lather::ShampooPrecision<T>> s(p, o);
        s.set_batched_passes(true);
        return s;
      },
      "Shampoo (Adam grafting), batched passes");
  check_policies<T, ExecSpace>(
      [&](std::vector<P>& p) {
        return lather::Shampoo<P, ExecSpace, lather::SOAP, lather::NoGrafting, lather::ShampooPrecision<T>>(p, o);
      },
      "SOAP");
}

// A gradient overlapping another gradient or a parameter is refused before anything changes;
// disjoint slices of one buffer are fine.
template <class ExecSpace>
void impl_test_aliasing() {
  using M = typename ExecSpace::memory_space;
  using P = lather::TensorRef<double, M>;
  Kokkos::View<double*, M> w("w", 4), b("b", 4), buffer("buffer", 10);
  Kokkos::deep_copy(buffer, 0.5);
  std::vector<P> params{lather::tensor_ref(w), lather::tensor_ref(b)};
  lather::Adam<P, ExecSpace> adam(params, {.lr = 0.1}, {"w", "b"});
  lather::Shampoo<P, ExecSpace> shampoo(params, {.lr = 0.1}, {}, {}, {"w", "b"});
  const auto before_adam = adam.state_dict();
  const auto before_shampoo = shampoo.state_dict();
  auto slice = [&](int begin) { return P(buffer.data() + begin, {4}); };
  auto refuses = [&](const std::vector<P>& g, const char* needle) {
    CAPTURE(needle);
    CHECK_THROWS_WITH_AS(adam.step(ExecSpace(), g), Contains(needle), lather::invalid_argument);
    CHECK_THROWS_WITH_AS(shampoo.step(ExecSpace(), g), Contains(needle), lather::invalid_argument);
    CHECK(adam.state_dict() == before_adam);
    CHECK(shampoo.state_dict() == before_shampoo);
    CHECK(lather::test::to_host(params[0]) == std::vector<double>(4, 0.0));
  };
  refuses({slice(0), slice(0)}, "overlaps the memory of the gradient of parameter");
  refuses({slice(0), slice(3)}, "overlaps the memory of the gradient of parameter");
  refuses({lather::tensor_ref(w), slice(0)}, "the gradient of parameter 0 ('w') overlaps the memory of parameter 0 ('w')");
  refuses({slice(0), lather::tensor_ref(w)}, "the gradient of parameter 1 ('b') overlaps the memory of parameter 0 ('w')");
  adam.step(ExecSpace(), std::vector<P>{slice(0), slice(4)});  // disjoint: fine
  shampoo.step(ExecSpace(), std::vector<P>{slice(0), slice(4)});
  CHECK(adam.step_count(0) == 1);
  CHECK(shampoo.step_count() == 1);
}

// A dictionary saved with other options is refused naming the option; only the learning rate
// (and Shampoo's peak_lr) is restored. Another parameter list is refused too.
template <class ExecSpace>
void impl_test_option_mismatch() {
  using M = typename ExecSpace::memory_space;
  using P = lather::TensorRef<double, M>;
  Model<double, ExecSpace> a;
  a.set_grads(1);
  {
    lather::Adam<P, ExecSpace> saved_opt(a.params, {.lr = 0.01, .betas = {0.9, 0.999}});
    saved_opt.step(ExecSpace(), a.grads);
    const auto saved = saved_opt.state_dict();
    lather::Adam<P, ExecSpace> other(a.params, {.lr = 0.01, .betas = {0.8, 0.999}});
    const auto before = other.state_dict();
    CHECK_THROWS_WITH_AS(other.load_state_dict(saved),
                         Contains("saved with option 'betas' = (0.90000000000000002, "),
                         lather::invalid_argument);
    CHECK(other.state_dict() == before);
    lather::Adam<P, ExecSpace> amsgrad(a.params, {.lr = 0.01, .amsgrad = true});
    CHECK_THROWS_WITH_AS(amsgrad.load_state_dict(saved), Contains("option 'amsgrad' = false"), lather::invalid_argument);
    lather::Adam<P, ExecSpace> lr_only(a.params, {.lr = 0.5});
    lr_only.load_state_dict(saved);  // the learning rate is a scheduler's: restored
    CHECK(lr_only.options().lr == 0.01);
    std::vector<P> fewer{a.params[0], a.params[1]};
    lather::Adam<P, ExecSpace> other_params(fewer, {.lr = 0.01});
    CHECK_THROWS_WITH_AS(other_params.load_state_dict(saved), Contains("parameter group 0 has a different number of parameters in the dictionary (expected 2)"),
                         lather::invalid_argument);
  }
  using S = lather::Shampoo<P, ExecSpace, lather::EigenRootInverse, lather::AdamGrafting, lather::ShampooPrecision<double>>;
  const lather::ShampooOptions o{.lr = 0.01, .betas = {0.9, 0.999}, .epsilon = 1e-6, .max_preconditioner_dim = 4};
  S saved_opt(a.params, o);
  saved_opt.step(ExecSpace(), a.grads);
  const auto saved = saved_opt.state_dict();
  auto refuses = [&](const lather::ShampooOptions& other_options, lather::AdamGrafting graft, const char* needle) {
    CAPTURE(needle);
    S other(a.params, other_options, {}, graft);
    const auto before = other.state_dict();
    CHECK_THROWS_WITH_AS(other.load_state_dict(saved), Contains(needle), lather::invalid_argument);
    CHECK(other.state_dict() == before);
  };
  auto with = [&](auto change) {
    lather::ShampooOptions x = o;
    change(x);
    return x;
  };
  refuses(with([](auto& x) { x.epsilon = 1e-8; }), {}, "saved with option 'epsilon' = 9.9999999999999995e-07");
  refuses(with([](auto& x) { x.max_preconditioner_dim = 8; }), {}, "option 'max_preconditioner_dim' = 4");
  refuses(with([](auto& x) { x.use_bias_correction = false; }), {}, "option 'use_bias_correction' = 1");
  refuses(with([](auto& x) { x.inverse_exponent_override[2].all = 0.25; }), {},
          "option 'inverse_exponent_override' = () of shape");
  refuses(o, {.beta2 = 0.99}, "option 'grafting_beta2' = 0.99");
  S lr_only(a.params, with([](auto& x) { x.lr = 0.3; }));
  lr_only.load_state_dict(saved);
  CHECK(lr_only.options().lr == 0.01);
  CHECK(lr_only.state_dict() == saved);
}

// The same run twice gives bitwise-identical parameters and state (on OpenMP with the fixed
// thread count of the test environment).
template <class ExecSpace, class MakeOpt>
void check_deterministic(MakeOpt make, const char* what) {
  CAPTURE(what);
  Model<float, ExecSpace> a, b;
  auto x = make(a.params);
  auto y = make(b.params);
  for (int t = 1; t <= 6; ++t) {
    a.set_grads(t);
    b.set_grads(t);
    x.step(ExecSpace(), a.grads);
    y.step(ExecSpace(), b.grads);
  }
  CHECK(a.values() == b.values());
  CHECK(x.state_dict() == y.state_dict());
}

template <class ExecSpace>
void impl_test_determinism() {
  using P = typename Model<float, ExecSpace>::P;
  check_deterministic<ExecSpace>([](std::vector<P>& p) { return lather::AdamW<P, ExecSpace>(p, {.lr = 0.01}); }, "AdamW");
  const lather::ShampooOptions o{.lr = 0.01, .betas = {0.9, 0.999}, .epsilon = 1e-6, .max_preconditioner_dim = 4,
                                 .precondition_frequency = 2};
  check_deterministic<ExecSpace>(
      [&](std::vector<P>& p) { return lather::Shampoo<P, ExecSpace, lather::EigenRootInverse, lather::AdamGrafting>(p, o); },
      "Shampoo eigen + Adam grafting (norm reductions)");
  check_deterministic<ExecSpace>(
      [&](std::vector<P>& p) { return lather::Shampoo<P, ExecSpace, lather::CoupledNewtonRootInverse>(p, o); },
      "Shampoo coupled Newton");
  check_deterministic<ExecSpace>([&](std::vector<P>& p) { return lather::Shampoo<P, ExecSpace, lather::SOAP>(p, o); }, "SOAP");
  check_deterministic<ExecSpace>([&](std::vector<P>& p) { return lather::Shampoo<P, ExecSpace, lather::SignDescent>(p, o); },
                                 "sign descent");
}

// Resume, bit for bit, for the strategies the Shampoo and family tests do not resume.
template <class ExecSpace, class Pre, class Graft = lather::NoGrafting>
void check_resume(const Pre& pre, const lather::ShampooOptions& o, const char* what, std::size_t num_params = 3) {
  CAPTURE(what);
  using P = typename Model<double, ExecSpace>::P;
  using S = lather::Shampoo<P, ExecSpace, Pre, Graft, lather::ShampooPrecision<double>>;
  Model<double, ExecSpace> a, b;
  std::vector<P> pa(a.params.begin(), a.params.begin() + num_params), pb(b.params.begin(), b.params.begin() + num_params);
  auto grads = [&](Model<double, ExecSpace>& m) {
    return std::vector<P>(m.grads.begin(), m.grads.begin() + num_params);
  };
  S first(pa, o, pre);
  for (int t = 1; t <= 3; ++t) {
    a.set_grads(t);
    first.step(ExecSpace(), grads(a));
  }
  const auto saved = first.state_dict();
  for (std::size_t i = 0; i < num_params; ++i) lather::test::from_host(pb[i], lather::test::to_host(pa[i]));
  S second(pb, o, pre);
  second.load_state_dict(saved);
  for (int t = 4; t <= 8; ++t) {
    a.set_grads(t);
    b.set_grads(t);
    first.step(ExecSpace(), grads(a));
    second.step(ExecSpace(), grads(b));
  }
  for (std::size_t i = 0; i < num_params; ++i) CHECK(lather::test::to_host(pa[i]) == lather::test::to_host(pb[i]));
  CHECK(first.state_dict() == second.state_dict());
}

template <class ExecSpace>
void impl_test_resume() {
  const lather::ShampooOptions o{.lr = 0.01, .betas = {0.9, 0.999}, .epsilon = 1e-4, .max_preconditioner_dim = 4,
                                 .precondition_frequency = 2, .momentum = 0.5};
  check_resume<ExecSpace>(lather::CoupledNewtonRootInverse{}, o, "coupled Newton");
  check_resume<ExecSpace>(lather::CoupledHigherOrderRootInverse{.rel_epsilon = 0.0, .abs_epsilon = 0.0}, o,
                          "coupled higher order");
  check_resume<ExecSpace, lather::EigenRootInverse, lather::RMSpropGrafting>(lather::EigenRootInverse{}, o,
                                                                             "eigen + RMSprop grafting");
  lather::ShampooOptions pseudo = o;
  pseudo.epsilon = 0.0;
  check_resume<ExecSpace>(lather::EigenRootInverse{.pseudo_inverse = lather::PseudoInverse{}}, pseudo,
                          "pseudo-inverse");
  check_resume<ExecSpace>(lather::KLShampoo<lather::EigendecomposedShampoo<>>{}, o, "KL eigendecomposed");
  lather::ShampooOptions spectral = o;
  spectral.max_preconditioner_dim = lather::unbounded;
  check_resume<ExecSpace>(lather::SpectralDescent<lather::SVDOrthogonalization>{}, spectral, "SVD spectral descent", 1);
}

// All-zero gradients: every optimizer leaves the parameters exactly where they are (no weight
// decay) and its state finite: Shampoo's factors stay 0 and the roots of epsilon * I multiply
// a zero gradient.
template <class ExecSpace>
void impl_test_zero_gradients() {
  using P = typename Model<double, ExecSpace>::P;
  Model<double, ExecSpace> a;
  const auto start = a.values();
  for (auto& g : a.grads) lather::test::from_host(g, std::vector<double>(g.size(), 0.0));
  lather::Adam<P, ExecSpace> adam(a.params, {.lr = 0.1});
  const lather::ShampooOptions o{.lr = 0.1, .betas = {0.9, 0.999}, .epsilon = 1e-12, .max_preconditioner_dim = 4};
  lather::Shampoo<P, ExecSpace, lather::EigenRootInverse, lather::AdamGrafting> shampoo(a.params, o);
  lather::Shampoo<P, ExecSpace, lather::SOAP> soap(a.params, o);
  for (int t = 1; t <= 3; ++t) {
    adam.step(ExecSpace(), a.grads);
    shampoo.step(ExecSpace(), a.grads);
    soap.step(ExecSpace(), a.grads);
  }
  CHECK(a.values() == start);
  CHECK(shampoo.last_step_info().failed_root_computations == 0);
  auto all_finite = [](const lather::StateDict& d) {
    for (const auto& [name, t] : d.tensors) {
      bool finite = true;
      std::visit([&](const auto& v) {
        for (const auto x : v) finite = finite && std::isfinite(static_cast<double>(x));
      }, t.values);
      CAPTURE(name);
      CHECK(finite);
    }
  };
  all_finite(shampoo.state_dict());
  all_finite(soap.state_dict());
}

// Rank-deficient factors with epsilon = 0: the pseudo-inverse. The (5, 3) gradient merges into
// one order-1 block g of 15 values (merge_small_dims), whose factor L = g g^T has rank 1 and the
// single nonzero eigenvalue |g|^2, so the step-1 direction L^(+1/2) g is exactly g / |g| (no NaN
// or blow-up from the 14 zero eigenvalues); without the pseudo-inverse, epsilon = 0 is refused.
template <class ExecSpace>
void impl_test_rank_deficient() {
  using M = typename ExecSpace::memory_space;
  using P = lather::TensorRef<double, M>;
  Kokkos::View<double**, Kokkos::LayoutRight, M> w("w", 5, 3), g("g", 5, 3);
  std::vector<P> params{lather::tensor_ref(w)};
  const std::vector<double> u{1, -2, 0.5, 0, 3}, v{0.25, -1, 2};
  std::vector<double> gv(15);
  double norm = 0;
  for (int i = 0; i < 5; ++i)
    for (int j = 0; j < 3; ++j) {
      gv[3 * i + j] = u[i] * v[j];
      norm += gv[3 * i + j] * gv[3 * i + j];
    }
  norm = std::sqrt(norm);
  lather::test::from_host(params[0], std::vector<double>(15, 0.0));
  lather::test::from_host(lather::tensor_ref(g), gv);
  const lather::ShampooOptions o{.lr = 1.0, .betas = {0.0, 1.0}, .epsilon = 0.0, .use_bias_correction = false};
  using S = lather::Shampoo<P, ExecSpace, lather::EigenRootInverse, lather::NoGrafting, lather::ShampooPrecision<double>>;
  CHECK_THROWS_WITH_AS(S(params, o), Contains("'epsilon' = 0"), lather::invalid_argument);
  // rank_rtol = nullopt: eigenvalues below n * machine epsilon * lambda_max are rank-deficient
  // (torch.linalg.matrix_rank's rule); the reference's default 0 keeps round-off eigenvalues.
  S opt(params, o, lather::EigenRootInverse{.pseudo_inverse = lather::PseudoInverse{.rank_rtol = std::nullopt}});
  opt.step(ExecSpace(), std::vector<P>{lather::tensor_ref(g)});
  CHECK(opt.last_step_info().failed_root_computations == 0);
  const auto w1 = lather::test::to_host(params[0]);
  for (std::size_t e = 0; e < 15; ++e) CHECK(w1[e] == doctest::Approx(-gv[e] / norm).epsilon(1e-10).scale(1e-12));
}

// The option combinations, checked at construction with the option named.
template <class ExecSpace>
void impl_test_option_combinations() {
  using M = typename ExecSpace::memory_space;
  using P = lather::TensorRef<double, M>;
  Kokkos::View<double**, Kokkos::LayoutRight, M> w("w", 4, 3);
  std::vector<P> params{lather::tensor_ref(w)};
  using Newton = lather::Shampoo<P, ExecSpace, lather::CoupledNewtonRootInverse>;
  using Eigen = lather::Shampoo<P, ExecSpace, lather::EigenRootInverse>;
  CHECK_THROWS_WITH_AS(Eigen(params, {.precondition_frequency = 10, .start_preconditioning_step = 5}),
                       Contains("invalid option 'start_preconditioning_step' = 5 (must be -1, lather::never, or >= "
                                "precondition_frequency = 10)"),
                       lather::invalid_argument);
  CHECK_THROWS_WITH_AS(Eigen(params, {.epsilon = 1e-12}, {.pseudo_inverse = lather::PseudoInverse{}}),
                       Contains("invalid option 'epsilon' = 9.9999999999999998e-13 (must be 0 with the pseudo-inverse)"),
                       lather::invalid_argument);
  lather::ShampooOptions fractional;
  fractional.inverse_exponent_override[1].all = 0.3;  // root 1 / 0.3: not an integer ((4, 3) merges to (12,))
  CHECK_THROWS_WITH_AS(Newton(params, fractional), Contains("the root-inverse strategy cannot compute the root"),
                       lather::invalid_argument);
  lather::ShampooOptions quarter;
  quarter.inverse_exponent_override[1].all = 0.25;  // root 4: fine for Newton
  CHECK_NOTHROW(Newton(params, quarter));
  CHECK_THROWS_WITH_AS(Eigen(params, {.momentum = 0.9, .iterate_averaging = lather::IterateAveraging::schedule_free}),
                       Contains("exclude each other"), lather::invalid_argument);
  CHECK_THROWS_WITH_AS(Eigen(params, {.use_nesterov = true}), Contains("'use_nesterov' = true requires 'momentum' > 0"),
                       lather::invalid_argument);
  CHECK_THROWS_WITH_AS(lather::SGD<P>(params, {.lr = 0.1, .nesterov = true}), Contains("nesterov"),
                       lather::invalid_argument);
}

}  // namespace

TEST_CASE_TEMPLATE_DEFINE("reliability: invalid option combinations name the options", ExecSpace, combinations) {
  impl_test_option_combinations<ExecSpace>();
}
TEST_CASE_TEMPLATE_APPLY(combinations, lather_test_exec_spaces);

TEST_CASE_TEMPLATE_DEFINE("reliability: NaN/Inf policies raise, skip a parameter, skip the step (double)", ExecSpace,
                          policies_double) {
  impl_test_policies<double, ExecSpace>();
}
TEST_CASE_TEMPLATE_APPLY(policies_double, lather_test_exec_spaces);

TEST_CASE_TEMPLATE_DEFINE("reliability: NaN/Inf policies (float)", ExecSpace, policies_float) {
  impl_test_policies<float, ExecSpace>();
}
TEST_CASE_TEMPLATE_APPLY(policies_float, lather_test_exec_spaces);

TEST_CASE_TEMPLATE_DEFINE("reliability: gradients aliasing gradients or parameters are refused", ExecSpace, aliasing) {
  impl_test_aliasing<ExecSpace>();
}
TEST_CASE_TEMPLATE_APPLY(aliasing, lather_test_exec_spaces);

TEST_CASE_TEMPLATE_DEFINE("reliability: checkpoints of other options or parameters are refused", ExecSpace, mismatch) {
  impl_test_option_mismatch<ExecSpace>();
}
TEST_CASE_TEMPLATE_APPLY(mismatch, lather_test_exec_spaces);

TEST_CASE_TEMPLATE_DEFINE("reliability: repeated runs are bitwise identical", ExecSpace, determinism) {
  impl_test_determinism<ExecSpace>();
}
TEST_CASE_TEMPLATE_APPLY(determinism, lather_test_exec_spaces);

TEST_CASE_TEMPLATE_DEFINE("reliability: resume is bit-identical for every root-inverse strategy", ExecSpace, resume) {
  impl_test_resume<ExecSpace>();
}
TEST_CASE_TEMPLATE_APPLY(resume, lather_test_exec_spaces);

#if defined(KOKKOS_ENABLE_SERIAL) && defined(KOKKOS_ENABLE_OPENMP)
namespace {
// One thread (Serial) and the OpenMP pool give bitwise-identical results where no reduction
// decides the numbers: the element-wise optimizers and classic Shampoo without grafting (factor
// products through the same single-threaded BLAS). Grafting norms, Newton-Schulz's and sign
// descent's norms are parallel reductions: their last bits follow the thread count
// (docs/reliability.md).
template <class ExecSpace>
std::vector<std::vector<double>> run_without_reductions(int which) {
  using P = typename Model<double, ExecSpace>::P;
  Model<double, ExecSpace> m;
  lather::AdamW<P, ExecSpace> adamw(m.params, {.lr = 0.01});
  const lather::ShampooOptions o{.lr = 0.01, .betas = {0.9, 0.999}, .epsilon = 1e-6, .max_preconditioner_dim = 4,
                                 .precondition_frequency = 2};
  lather::Shampoo<P, ExecSpace, lather::EigenRootInverse, lather::NoGrafting, lather::ShampooPrecision<double>> shampoo(
      m.params, o);
  for (int t = 1; t <= 5; ++t) {
    m.set_grads(t);
    if (which == 0) adamw.step(ExecSpace(), m.grads);
    else shampoo.step(ExecSpace(), m.grads);
  }
  return m.values();
}
}  // namespace

TEST_CASE("reliability: Serial and OpenMP agree bitwise where no reduction is involved") {
  CHECK(run_without_reductions<Kokkos::Serial>(0) == run_without_reductions<Kokkos::OpenMP>(0));
  CHECK(run_without_reductions<Kokkos::Serial>(1) == run_without_reductions<Kokkos::OpenMP>(1));
}
#endif

TEST_CASE_TEMPLATE_DEFINE("reliability: all-zero gradients change nothing", ExecSpace, zero_gradients) {
  impl_test_zero_gradients<ExecSpace>();
}
TEST_CASE_TEMPLATE_APPLY(zero_gradients, lather_test_exec_spaces);

TEST_CASE_TEMPLATE_DEFINE("reliability: rank-deficient factors with epsilon = 0 (pseudo-inverse)", ExecSpace,
                          rank_deficient) {
  impl_test_rank_deficient<ExecSpace>();
}
TEST_CASE_TEMPLATE_APPLY(rank_deficient, lather_test_exec_spaces);
