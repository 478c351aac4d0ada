// SPDX-License-Identifier: Apache-2.0
// SGD, Adagrad, RMSprop, Adam and AdamW against (1) hand-computed scalar trajectories
// (tests/reference/diagonal_hand_computed.py) and (2) an independent element-wise double
// reference written from torch.optim's update rules, over parameters of rank 0 to 3, sizes 1,
// 2, 3 and 13, Kokkos layouts Right, Left and Stride, float and double, on every execution space.
#include <lather/optimizers/adagrad.hpp>
#include <lather/optimizers/adam.hpp>
#include <lather/optimizers/rmsprop.hpp>
#include <lather/optimizers/sgd.hpp>
#include <lather/impl/kernels/multi_tensor.hpp>

#include <Kokkos_Core.hpp>

#include <doctest/doctest.h>

#include "exec_spaces.hpp"
#include "launch_events.hpp"
#include "test_utils.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

namespace {

using lather::test::all_close;
using lather::test::tolerances;

const std::vector<double> kGrads = {1.0, 0.5, -0.25, 2.0, 0.0, -1.5, 0.75};

// ---- (1) hand-computed scalar trajectories ----------------------------------------------------

template <class Opt, class ExecSpace, class Options>
std::vector<double> scalar_trajectory(const Options& options) {
  using M = typename ExecSpace::memory_space;
  Kokkos::View<double, M> p("p");
  Kokkos::deep_copy(p, 1.0);
  std::vector<Kokkos::View<double, M>> params{p};
  Opt opt(params, options);
  Kokkos::View<double, M> g("g");
  std::vector<double> out;
  for (double gv : kGrads) {
    Kokkos::deep_copy(g, gv);
    opt.step(ExecSpace(), std::vector{g});
    double h = 0;
    Kokkos::deep_copy(h, p);
    out.push_back(h);
  }
  return out;
}

template <class ExecSpace>
void impl_test_hand_computed() {
  using M = typename ExecSpace::memory_space;
  using P = Kokkos::View<double, M>;
  auto check = [](const std::vector<double>& got, const std::vector<double>& want, const char* name) {
    // Same operations in the same order as the Python script: equal up to FMA contraction.
    all_close(got, want, 1e-14, 1e-16, name);
  };
  check(scalar_trajectory<lather::SGD<P, ExecSpace>, ExecSpace>(lather::SGDOptions{.lr = 0.1}),
        {0.9, 0.85, 0.875, 0.675, 0.675, 0.8250000000000001, 0.75}, "sgd_plain");
  check(scalar_trajectory<lather::SGD<P, ExecSpace>, ExecSpace>(
            lather::SGDOptions{.lr = 0.1, .momentum = 0.9, .dampening = 0.25, .weight_decay = 0.01}),
        {0.899, 0.76992575, 0.6719314806875, 0.43323268969573436, 0.2180788532858735,
         0.13677684137703433, 0.00725244802804631},
        "sgd_momentum_dampening_wd");
  check(scalar_trajectory<lather::SGD<P, ExecSpace>, ExecSpace>(
            lather::SGDOptions{.lr = 0.05, .momentum = 0.8, .weight_decay = 0.1, .nesterov = true}),
        {0.901, 0.812691, 0.780833581, 0.561570907571, 0.46422996498366104, 0.5194254248592209,
         0.43326388379587044},
        "sgd_nesterov_wd");
  check(scalar_trajectory<lather::Adagrad<P, ExecSpace>, ExecSpace>(lather::AdagradOptions{
            .lr = 0.5, .lr_decay = 0.1, .weight_decay = 0.05, .initial_accumulator_value = 0.1}),
        {0.5212412098267283, 0.3246361049193462, 0.40328221278404874, 0.07538306838285885,
         0.07481498483154435, 0.25278500122695874, 0.17072775475170882},
        "adagrad_lr_decay_wd_init");
  check(scalar_trajectory<lather::RMSprop<P, ExecSpace>, ExecSpace>(lather::RMSpropOptions{.lr = 0.01}),
        {0.9000000099999991, 0.855098688525563, 0.8771091061453651, 0.7900471860484168,
         0.7900471860484168, 0.8451058186952903, 0.8184396665000101},
        "rmsprop_plain");
  check(scalar_trajectory<lather::RMSprop<P, ExecSpace>, ExecSpace>(lather::RMSpropOptions{
            .lr = 0.01, .alpha = 0.9, .weight_decay = 0.1, .momentum = 0.5, .centered = true}),
        {0.9666666676767677, 0.9327271427303893, 0.9203522041344768, 0.8830540949481168,
         0.8630292156141128, 0.8707561217787351, 0.8639606834505568},
        "rmsprop_centered_momentum_wd");
  check(scalar_trajectory<lather::Adam<P, ExecSpace>, ExecSpace>(lather::AdamOptions{.lr = 0.1}),
        {0.900000001, 0.8067820382981611, 0.7504159014963296, 0.6770470281393891,
         0.6150336000839342, 0.5987607358952416, 0.5717101762403819},
        "adam_plain");
  check(scalar_trajectory<lather::Adam<P, ExecSpace>, ExecSpace>(lather::AdamOptions{
            .lr = 0.1, .betas = {0.8, 0.99}, .weight_decay = 0.1, .amsgrad = true}),
        {0.9000000009090909, 0.8073454792830334, 0.75039976494398, 0.6703139815971718,
         0.605742497194883, 0.5950036666374023, 0.5682259502571364},
        "adam_l2_amsgrad");
  check(scalar_trajectory<lather::AdamW<P, ExecSpace>, ExecSpace>(
            lather::AdamWOptions{.lr = 0.1, .weight_decay = 0.1}),
        {0.890000001, 0.7878820382881611, 0.723637081103448, 0.6430318369354731,
         0.5745880905106634, 0.5525693454168642, 0.5199930923078359},
        "adamw_decoupled");
}

// ---- (2) independent element-wise reference ----------------------------------------------------

// One element's state; each reference step is written from torch.optim's documented rules.
struct RefElem {
  double m = 0, v = 0, vmax = 0, buf = 0, ga = 0;
  bool has_buf = false;
};
using RefStep = std::function<void(double& p, double g, RefElem& s, long t)>;

RefStep ref_sgd(lather::SGDOptions o) {
  return [o](double& p, double g, RefElem& s, long) {
    double d = o.maximize ? -g : g;
    if (o.weight_decay != 0) d += o.weight_decay * p;
    if (o.momentum != 0) {
      s.buf = s.has_buf ? s.buf * o.momentum + (1 - o.dampening) * d : d;
      s.has_buf = true;
      d = o.nesterov ? d + o.momentum * s.buf : s.buf;
    }
    p -= o.lr * d;
  };
}
RefStep ref_adagrad(lather::AdagradOptions o) {
  return [o](double& p, double g, RefElem& s, long t) {
    if (t == 1) s.v = o.initial_accumulator_value;
    if (o.maximize) g = -g;
    if (o.weight_decay != 0) g += o.weight_decay * p;
    const double clr = o.lr / (1 + double(t - 1) * o.lr_decay);
    s.v += g * g;
    p -= clr * g / (std::sqrt(s.v) + o.eps);
  };
}
RefStep ref_rmsprop(lather::RMSpropOptions o) {
  return [o](double& p, double g, RefElem& s, long) {
    if (o.maximize) g = -g;
    if (o.weight_decay != 0) g += o.weight_decay * p;
    s.v = o.alpha * s.v + (1 - o.alpha) * g * g;
    double avg;
    if (o.centered) {
      s.ga = o.alpha * s.ga + (1 - o.alpha) * g;
      avg = std::sqrt(s.v - s.ga * s.ga) + o.eps;
    } else {
      avg = std::sqrt(s.v) + o.eps;
    }
    if (o.momentum > 0) {
      s.buf = o.momentum * s.buf + g / avg;
      p -= o.lr * s.buf;
    } else {
      p -= o.lr * g / avg;
    }
  };
}
template <class O>
RefStep ref_adam(O o, bool decoupled) {
  return [o, decoupled](double& p, double g, RefElem& s, long t) {
    if (o.maximize) g = -g;
    if (decoupled) p *= 1 - o.lr * o.weight_decay;
    else if (o.weight_decay != 0) g += o.weight_decay * p;
    s.m = o.betas[0] * s.m + (1 - o.betas[0]) * g;
    s.v = o.betas[1] * s.v + (1 - o.betas[1]) * g * g;
    s.vmax = std::max(s.vmax, s.v);
    const double vhat = (o.amsgrad ? s.vmax : s.v) / (1 - std::pow(o.betas[1], double(t)));
    p -= o.lr / (1 - std::pow(o.betas[0], double(t))) * s.m / (std::sqrt(vhat) + o.eps);
  };
}

// Parameters of several ranks, sizes and layouts, all viewed through TensorRef (the heterogeneous
// parameter type); gradients in a different layout from their parameter where the rank allows.
template <class T, class ExecSpace>
struct Problem {
  using M = typename ExecSpace::memory_space;
  Kokkos::View<T, M> p0{"p0"};
  Kokkos::View<T*, M> p1{"p1", 13};
  Kokkos::View<T**, Kokkos::LayoutLeft, M> p2{"p2", 3, 2};
  Kokkos::View<T***, Kokkos::LayoutRight, M> p3{"p3", 2, 3, 2};
  Kokkos::View<T**, Kokkos::LayoutRight, M> big{"big", 4, 6};
  Kokkos::View<T**, Kokkos::LayoutStride, M> p4;  // every other column of `big`: (4, 3) strided
  Kokkos::View<T*, M> p5{"p5", 1};
  Kokkos::View<T*, M> empty{"empty", 0};
  std::vector<lather::TensorRef<T, M>> params;

  Kokkos::View<T, M> g0{"g0"};
  Kokkos::View<T*, M> g1{"g1", 13};
  Kokkos::View<T**, Kokkos::LayoutRight, M> g2{"g2", 3, 2};
  Kokkos::View<T***, Kokkos::LayoutLeft, M> g3{"g3", 2, 3, 2};
  Kokkos::View<T**, Kokkos::LayoutLeft, M> g4{"g4", 4, 3};
  Kokkos::View<T*, M> g5{"g5", 1};
  Kokkos::View<T*, M> gempty{"gempty", 0};
  std::vector<lather::TensorRef<T, M>> grads_mut;
  std::vector<lather::TensorRef<const T, M>> grads;

  Problem() {
    // A genuinely strided view: columns 0, 2, 4 of big.
    Kokkos::LayoutStride ls(4, 6, 3, 2);
    p4 = Kokkos::View<T**, Kokkos::LayoutStride, M>(big.data(), ls);
    params = {lather::tensor_ref(p0), lather::tensor_ref(p1), lather::tensor_ref(p2),
              lather::tensor_ref(p3), lather::tensor_ref(p4), lather::tensor_ref(p5),
              lather::tensor_ref(empty)};
    grads_mut = {lather::tensor_ref(g0), lather::tensor_ref(g1), lather::tensor_ref(g2),
                 lather::tensor_ref(g3), lather::tensor_ref(g4), lather::tensor_ref(g5),
                 lather::tensor_ref(gempty)};
    grads.assign(grads_mut.begin(), grads_mut.end());
    for (std::size_t i = 0; i < params.size(); ++i)
      lather::test::from_host(params[i], lather::test::random_values(params[i].size(), 100 + i));
  }
  void set_grads(long t) {
    for (std::size_t i = 0; i < grads_mut.size(); ++i)
      lather::test::from_host(grads_mut[i],
                              lather::test::random_values(grads_mut[i].size(), 1000 * t + i, 2.0));
  }
};

template <template <class, class> class Opt, class T, class ExecSpace, class Options>
void check_against_reference(const Options& options, const RefStep& ref, const char* what,
                             int steps = 7) {
  CAPTURE(what);
  Problem<T, ExecSpace> pb;
  using P = lather::TensorRef<T, typename ExecSpace::memory_space>;
  Opt<P, ExecSpace> opt(pb.params, options);
  std::vector<std::vector<double>> ref_p;
  std::vector<std::vector<RefElem>> ref_s;
  for (const auto& p : pb.params) {
    ref_p.push_back(lather::test::to_host(p));
    ref_s.emplace_back(static_cast<std::size_t>(p.size()));
  }
  for (long t = 1; t <= steps; ++t) {
    pb.set_grads(t);
    opt.step(ExecSpace(), pb.grads);
    for (std::size_t i = 0; i < pb.params.size(); ++i) {
      const auto g = lather::test::to_host(pb.grads[i]);
      for (std::size_t e = 0; e < g.size(); ++e) ref(ref_p[i][e], g[e], ref_s[i][e], t);
      CAPTURE(t);
      CAPTURE(i);
      all_close(lather::test::to_host(pb.params[i]), ref_p[i], tolerances<T>::rtol,
                tolerances<T>::atol, what);
    }
  }
  // The strided parameter must not have touched the columns of `big` it does not own.
  auto big = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), pb.big);
  for (int r = 0; r < 4; ++r)
    for (int c = 1; c < 6; c += 2) CHECK(big(r, c) == T(0));
}

template <class T, class ExecSpace>
void impl_test_reference_all() {
  using lather::AdagradOptions, lather::AdamOptions, lather::AdamWOptions, lather::RMSpropOptions,
      lather::SGDOptions;
  for (const SGDOptions& o :
       {SGDOptions{.lr = 0.1}, SGDOptions{.lr = 0.1, .weight_decay = 0.05},
        SGDOptions{.lr = 0.05, .momentum = 0.9}, SGDOptions{.lr = 0.05, .momentum = 0.9, .dampening = 0.3, .weight_decay = 0.01},
        SGDOptions{.lr = 0.05, .momentum = 0.9, .weight_decay = 0.01, .nesterov = true},
        SGDOptions{.lr = 0.05, .momentum = 0.5, .maximize = true}})
    check_against_reference<lather::SGD, T, ExecSpace>(o, ref_sgd(o), "SGD");
  for (const AdagradOptions& o :
       {AdagradOptions{}, AdagradOptions{.lr = 0.3, .lr_decay = 0.2, .weight_decay = 0.1, .initial_accumulator_value = 0.5},
        AdagradOptions{.lr = 0.1, .eps = 1e-3, .maximize = true}})
    check_against_reference<lather::Adagrad, T, ExecSpace>(o, ref_adagrad(o), "Adagrad");
  for (const RMSpropOptions& o :
       {RMSpropOptions{}, RMSpropOptions{.lr = 0.02, .alpha = 0.9, .weight_decay = 0.1},
        RMSpropOptions{.lr = 0.01, .momentum = 0.9}, RMSpropOptions{.lr = 0.01, .centered = true},
        RMSpropOptions{.lr = 0.01, .alpha = 0.95, .weight_decay = 0.01, .momentum = 0.7, .centered = true, .maximize = true}})
    check_against_reference<lather::RMSprop, T, ExecSpace>(o, ref_rmsprop(o), "RMSprop");
  for (const AdamOptions& o :
       {AdamOptions{}, AdamOptions{.lr = 0.05, .betas = {0.8, 0.99}, .weight_decay = 0.1},
        AdamOptions{.lr = 0.05, .amsgrad = true}, AdamOptions{.lr = 0.01, .eps = 1e-3, .maximize = true}})
    check_against_reference<lather::Adam, T, ExecSpace>(o, ref_adam(o, false), "Adam");
  for (const AdamWOptions& o :
       {AdamWOptions{}, AdamWOptions{.lr = 0.05, .weight_decay = 0.3},
        AdamWOptions{.lr = 0.05, .betas = {0.5, 0.9}, .weight_decay = 0.1, .amsgrad = true}})
    check_against_reference<lather::AdamW, T, ExecSpace>(o, ref_adam(o, true), "AdamW");
}

// Adam and AdamW on contiguous parameters take a vectorized host loop (kernels/adam_simd.hpp);
// strided ones the general kernel. Both must give the same bits: the same parameter values in
// both layouts, sizes around the vector width and the per-thread chunk, every option the fast
// path covers.
template <template <class, class> class Opt, class T, class ExecSpace, class Options>
void check_contiguous_equals_strided(const Options& o, std::int64_t n) {
  using M = typename ExecSpace::memory_space;
  using P = lather::TensorRef<T, M>;
  CAPTURE(n);
  Kokkos::View<T*, M> pc("pc", n), gc("gc", n), big("big", 2 * n), gbig("gbig", 2 * n);
  Kokkos::View<T*, Kokkos::LayoutStride, M> ps(big.data(), Kokkos::LayoutStride(n, 2)),
      gs(gbig.data(), Kokkos::LayoutStride(n, 2));
  const auto w0 = lather::test::random_values(static_cast<std::size_t>(n), 7);
  lather::test::from_host(lather::tensor_ref(pc), w0);
  lather::test::from_host(lather::tensor_ref(ps), w0);
  std::vector<P> contiguous{lather::tensor_ref(pc)}, strided{lather::tensor_ref(ps)};
  REQUIRE(contiguous[0].is_row_major_contiguous());
  if (n > 1) REQUIRE(!strided[0].is_row_major_contiguous());  // one element is contiguous in any layout
  Opt<P, ExecSpace> a(contiguous, o), b(strided, o);
  for (int t = 1; t <= 5; ++t) {
    const auto g = lather::test::random_values(static_cast<std::size_t>(n), 50 + t, 3.0);
    lather::test::from_host(lather::tensor_ref(gc), g);
    lather::test::from_host(lather::tensor_ref(gs), g);
    a.step(ExecSpace(), std::vector<P>{lather::tensor_ref(gc)});
    b.step(ExecSpace(), std::vector<P>{P(lather::tensor_ref(gs))});
    CAPTURE(t);
    const auto x = lather::test::to_host(contiguous[0]), y = lather::test::to_host(strided[0]);
    std::size_t differ = 0;
    for (std::size_t i = 0; i < x.size(); ++i) differ += x[i] != y[i] ? 1 : 0;
    CHECK(differ == 0);
  }
}

template <class T, class ExecSpace>
void impl_test_adam_fast_path() {
  using lather::AdamOptions, lather::AdamWOptions;
  for (const std::int64_t n : {1, 3, 4, 13, 4099, 70001})
    for (const AdamWOptions& o : {AdamWOptions{}, AdamWOptions{.lr = 0.05, .betas = {0.5, 0.9}, .weight_decay = 0.3},
                                  AdamWOptions{.lr = 0.01, .weight_decay = 0.0, .maximize = true}})
      check_contiguous_equals_strided<lather::AdamW, T, ExecSpace>(o, n);
  for (const std::int64_t n : {3, 4099})
    for (const AdamOptions& o : {AdamOptions{}, AdamOptions{.lr = 0.05, .eps = 1e-3, .weight_decay = 0.1, .maximize = true}})
      check_contiguous_equals_strided<lather::Adam, T, ExecSpace>(o, n);
}

// One optimizer runs the element updates of all its contiguous parameters in one loop over
// 4096-element chunks: on host spaces the vectorized host loop (impl/kernels/host_chunks.hpp)
// and, for what it does not cover (amsgrad), the portable multi-tensor kernel
// (impl/kernels/multi_tensor.hpp), which devices run for all; `portable` sends every contiguous
// parameter to the portable kernel on host spaces too. Each parameter must end with the bits it
// gets alone in the general kernel (a strided copy): sizes at and around chunk edges, a strided
// parameter (a kernel of its own) and an amsgrad group in the same optimizer, a parameter
// without a gradient on one step, and two groups with different options.
template <template <class, class> class Opt, class T, class ExecSpace, class Options>
void check_chunk_loop_equals_single(const Options& first, const Options& second, bool portable) {
  CAPTURE(portable);
  using M = typename ExecSpace::memory_space;
  using P = lather::TensorRef<T, M>;
  using Strided = Kokkos::View<T*, Kokkos::LayoutStride, M>;
  const std::vector<std::int64_t> sizes{1, 13, 4096, 4097, 3 * 4096 + 5, 70001, 2};
  const std::size_t n = sizes.size(), strided_one = 1, second_group = 5;  // w5, w6 in group 1
  std::vector<Kokkos::View<T*, M>> buffers;                                 // all storage
  const auto view = [&](std::int64_t len) { return buffers.emplace_back("x", len); };
  std::vector<P> together, grads_together, alone, grads_alone;
  for (std::size_t i = 0; i < n; ++i) {
    const auto w0 = lather::test::random_values(static_cast<std::size_t>(sizes[i]), 100 + i);
    const auto wide = view(2 * sizes[i]), gwide = view(2 * sizes[i]);
    const P a = lather::tensor_ref(Strided(wide.data(), Kokkos::LayoutStride(sizes[i], 2)));
    const P ga = lather::tensor_ref(Strided(gwide.data(), Kokkos::LayoutStride(sizes[i], 2)));
    const P t = i == strided_one ? P(lather::tensor_ref(Strided(view(2 * sizes[i]).data(), Kokkos::LayoutStride(sizes[i], 2))))
                                 : lather::tensor_ref(view(sizes[i]));
    lather::test::from_host(a, w0);
    lather::test::from_host(t, w0);
    alone.push_back(a);
    grads_alone.push_back(ga);
    together.push_back(t);
    grads_together.push_back(lather::tensor_ref(view(sizes[i])));
  }
  using Group = lather::ParamGroup<P, Options>;
  Opt<P, ExecSpace> opt(std::vector<Group>{
      Group{std::span<P>(together.data(), second_group), first, {}},
      Group{std::span<P>(together.data() + second_group, n - second_group), second, {}}});
  opt.set_portable_kernels(portable);
  REQUIRE(opt.portable_kernels() == portable);
  std::vector<std::unique_ptr<Opt<P, ExecSpace>>> singles;
  for (std::size_t i = 0; i < n; ++i)
    singles.push_back(std::make_unique<Opt<P, ExecSpace>>(std::span<P>(&alone[i], 1), i < second_group ? first : second));
  for (int step = 1; step <= 4; ++step) {
    CAPTURE(step);
    std::vector<P> g = grads_together;
    for (std::size_t i = 0; i < n; ++i) {
      const auto values = lather::test::random_values(static_cast<std::size_t>(sizes[i]), 1000 * step + i, 2.0);
      lather::test::from_host(grads_together[i], values);
      lather::test::from_host(grads_alone[i], values);
      if (step == 3 && i == 4) {
        g[i] = P();  // no gradient this step
        continue;
      }
      singles[i]->step(ExecSpace(), std::vector<P>{grads_alone[i]});
    }
    opt.step(ExecSpace(), g);
    for (std::size_t i = 0; i < n; ++i) {
      CAPTURE(i);
      const auto x = lather::test::to_host(together[i]), y = lather::test::to_host(alone[i]);
      std::size_t differ = 0;
      for (std::size_t k = 0; k < x.size(); ++k) differ += x[k] != y[k] ? 1 : 0;
      CHECK(differ == 0);
    }
  }
}

template <class T, class ExecSpace>
void impl_test_adam_chunk_loop(bool portable) {
  using lather::AdamOptions, lather::AdamWOptions;
  check_chunk_loop_equals_single<lather::AdamW, T, ExecSpace>(
      AdamWOptions{.lr = 0.05, .betas = {0.5, 0.9}, .weight_decay = 0.3},
      AdamWOptions{.lr = 0.01, .weight_decay = 0.0, .maximize = true}, portable);
  check_chunk_loop_equals_single<lather::AdamW, T, ExecSpace>(AdamWOptions{},
                                                              AdamWOptions{.lr = 0.02, .amsgrad = true}, portable);
  check_chunk_loop_equals_single<lather::Adam, T, ExecSpace>(
      AdamOptions{.lr = 0.05, .eps = 1e-3, .weight_decay = 0.1}, AdamOptions{.lr = 0.01, .maximize = true}, portable);
}

template <class T, class ExecSpace>
void impl_test_other_chunk_loops(bool portable) {
  using lather::SGDOptions, lather::AdagradOptions, lather::RMSpropOptions;
  // Momentum's first step copies the direction (the no-gradient step 3 of one parameter delays
  // its buffer's second update), Nesterov, dampening, weight decay and maximize.
  check_chunk_loop_equals_single<lather::SGD, T, ExecSpace>(
      SGDOptions{.lr = 0.05, .momentum = 0.9, .weight_decay = 0.1, .nesterov = true},
      SGDOptions{.lr = 0.02, .momentum = 0.5, .dampening = 0.3, .maximize = true}, portable);
  check_chunk_loop_equals_single<lather::SGD, T, ExecSpace>(SGDOptions{.lr = 0.1}, SGDOptions{.lr = 0.01}, portable);
  check_chunk_loop_equals_single<lather::Adagrad, T, ExecSpace>(
      AdagradOptions{.lr = 0.05, .lr_decay = 0.1, .weight_decay = 0.2, .initial_accumulator_value = 0.5},
      AdagradOptions{.lr = 0.01, .eps = 1e-3, .maximize = true}, portable);
  check_chunk_loop_equals_single<lather::RMSprop, T, ExecSpace>(
      RMSpropOptions{.lr = 0.01, .alpha = 0.9, .weight_decay = 0.1, .momentum = 0.8, .centered = true},
      RMSpropOptions{.lr = 0.02, .eps = 1e-4, .maximize = true}, portable);
  check_chunk_loop_equals_single<lather::RMSprop, T, ExecSpace>(
      RMSpropOptions{.lr = 0.01, .centered = true}, RMSpropOptions{.lr = 0.02, .alpha = 0.5, .momentum = 0.9}, portable);
}


// The multi-tensor loop itself (impl/kernels/multi_tensor.hpp), with the NaN/Inf count's job
// (what devices run to screen gradients; host spaces screen with the host chunk loop): counts
// per tensor at chunk edges and in a strided tensor, an empty tensor adding nothing, a refill
// of the same table, and a clear error when more jobs come than were reserved.
template <class ExecSpace>
void impl_test_multi_tensor_table() {
  using M = typename ExecSpace::memory_space;
  using R = lather::TensorRef<const double, M>;
  using Job = lather::impl::kernels::CountNonFinite<double, M>;
  constexpr std::int64_t chunk = lather::impl::kernels::multi_tensor_chunk_elements;
  const std::vector<std::int64_t> sizes{1, chunk, chunk + 1, 0, 3 * chunk + 7, 13};
  const double nan = std::nan(""), inf = HUGE_VAL;
  // Bad elements per tensor: first and last elements, both sides of chunk edges.
  const std::vector<std::vector<std::int64_t>> bad{
      {0}, {0, chunk - 1}, {chunk - 1, chunk}, {}, {chunk, 2 * chunk - 1, 2 * chunk, 3 * chunk + 6}, {}};
  std::vector<Kokkos::View<double*, M>> data;
  std::vector<R> refs;
  for (std::size_t k = 0; k < sizes.size(); ++k) {
    std::vector<double> v(static_cast<std::size_t>(sizes[k]), 1.0);
    for (std::size_t b = 0; b < bad[k].size(); ++b) v[static_cast<std::size_t>(bad[k][b])] = b % 2 ? inf : nan;
    data.emplace_back("t", sizes[k]);
    lather::test::from_host(lather::TensorRef<double, M>(lather::tensor_ref(data.back())), v);
    refs.push_back(R(lather::tensor_ref(data.back())));
  }
  // A strided tensor: every other element of a 2 x 13 buffer, one NaN.
  Kokkos::View<double*, M> wide("wide", 26);
  std::vector<double> w(26, 2.0);
  w[24] = nan;
  w[25] = nan;  // between the strided elements: not counted
  lather::test::from_host(lather::TensorRef<double, M>(lather::tensor_ref(wide)), w);
  refs.push_back(R(lather::tensor_ref(Kokkos::View<double*, Kokkos::LayoutStride, M>(wide.data(), Kokkos::LayoutStride(13, 2)))));
  const std::size_t n = refs.size();
  Kokkos::View<std::int64_t*, M> counts("counts", n);

  lather::impl::kernels::MultiTensorTable<ExecSpace, M, Job> table;
  table.reserve(n);
  const std::string label = "test::multi_tensor";
  for (int round = 0; round < 2; ++round) {  // the second round refills the same table
    CAPTURE(round);
    Kokkos::deep_copy(counts, 0);
    table.clear();
    CHECK(table.empty());
    for (std::size_t k = 0; k < n; ++k) table.add(Job{refs[k], counts.data(), k}, refs[k].size());
    CHECK(table.size() == n - 1);  // the empty tensor adds no job
    CHECK(table.chunks() == 1 + 1 + 2 + 4 + 1 + 1);
    table.launch(label, ExecSpace());
    ExecSpace().fence();
    const auto host = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), counts);
    for (std::size_t k = 0; k + 1 < n; ++k) {
      CAPTURE(k);
      CHECK(host(k) == static_cast<std::int64_t>(bad[k].size()));
    }
    CHECK(host(n - 1) == 1);
  }
  table.add(Job{refs[0], counts.data(), 0}, 1);  // the n-th job: the last one reserved
  CHECK(table.size() == n);
  CHECK_THROWS_WITH_AS(table.add(Job{refs[0], counts.data(), 0}, 1), doctest::Contains("reserve() room"),
                       lather::runtime_error);
  // An empty table launches nothing.
  table.clear();
  table.launch(label, ExecSpace());
  CHECK(table.chunks() == 0);
}

}  // namespace

// A table's launches copy only what differs from what their place in the memory space holds
// (UploadedTable): the kernels must see every change and the counter must show skipped copies.
// Three tensors with 1, 2 and 3 NaNs; a job's slot says which counter it adds to, so a stale
// table shows up as counts in the wrong places. Host spaces keep a separate buffer, as devices do.
template <class ExecSpace>
void impl_test_table_uploads() {
  using M = typename ExecSpace::memory_space;
  using Job = lather::impl::kernels::CountNonFinite<double, M>;
  std::vector<Kokkos::View<double*, M>> data;
  for (int k = 0; k < 3; ++k) {
    std::vector<double> v(static_cast<std::size_t>(5 + k), 1.0);
    for (int b = 0; b <= k; ++b) v[static_cast<std::size_t>(2 * b)] = std::nan("");
    data.emplace_back("t", v.size());
    lather::test::from_host(lather::TensorRef<double, M>(lather::tensor_ref(data.back())), v);
  }
  Kokkos::View<std::int64_t*, M> counts("counts", 3);
  const std::string label = "test::table_uploads";
  // Launches `table` with tensor k counted into slot[k] (tensors 0..slot.size()-1); the counts.
  auto launch = [&](auto& table, const std::vector<std::size_t>& slot) {
    Kokkos::deep_copy(counts, 0);
    table.clear();
    for (std::size_t k = 0; k < slot.size(); ++k)
      table.add(Job{lather::TensorRef<const double, M>(lather::tensor_ref(data[k])), counts.data(), slot[k]},
                static_cast<std::int64_t>(data[k].extent(0)));
    table.launch(label, ExecSpace());
    ExecSpace().fence();
    const auto h = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), counts);
    return std::vector<std::int64_t>{h(0), h(1), h(2)};
  };
  using V = std::vector<std::int64_t>;
  const std::vector<std::size_t> a{0, 1, 2}, b{2, 1, 0}, a_changed{0, 2, 1};
  lather::impl::kernels::MultiTensorTable<ExecSpace, M, Job> table;
  table.reserve(3, 2);  // two launches a step kept apart
  CHECK(table.uploads() == 0);
  // Step 1: two different launches, each copied.
  table.begin_step();
  CHECK(launch(table, a) == V{1, 2, 3});
  CHECK(table.uploads() == 1);
  CHECK(launch(table, b) == V{3, 2, 1});
  CHECK(table.uploads() == 2);
  // Step 2: the same launches find their entries in place.
  table.begin_step();
  CHECK(launch(table, a) == V{1, 2, 3});
  CHECK(launch(table, b) == V{3, 2, 1});
  CHECK(table.uploads() == 2);
  // Step 3: one launch changes two entries: copied, and the kernel sees them.
  table.begin_step();
  CHECK(launch(table, a_changed) == V{1, 3, 2});
  CHECK(table.uploads() == 3);
  CHECK(launch(table, b) == V{3, 2, 1});
  CHECK(table.uploads() == 3);
  // Step 4: back to the first launch: its place held the change, so it is copied again.
  table.begin_step();
  CHECK(launch(table, a) == V{1, 2, 3});
  CHECK(table.uploads() == 4);
  // Fewer entries at a place that holds them: nothing to copy, and only those run.
  table.begin_step();
  CHECK(launch(table, {0, 1}) == V{1, 2, 0});
  CHECK(table.uploads() == 4);
  // Without begin_step() launches take the next places: b lands on places 2-4, which held other
  // entries (copied); a does not fit after it and starts over at place 0, whose third entry b
  // has just overwritten (copied). The results stay right.
  CHECK(launch(table, b) == V{3, 2, 1});
  CHECK(table.uploads() == 5);
  CHECK(launch(table, a) == V{1, 2, 3});
  CHECK(table.uploads() == 6);
  // One place a step and two different launches: every launch copies, every result is right.
  lather::impl::kernels::MultiTensorTable<ExecSpace, M, Job> narrow;
  narrow.reserve(3);
  for (int step = 0; step < 3; ++step) {
    narrow.begin_step();
    CHECK(launch(narrow, a) == V{1, 2, 3});
    CHECK(launch(narrow, b) == V{3, 2, 1});
  }
  CHECK(narrow.uploads() == 6);
  // A moved table keeps its record of what the memory space holds.
  auto moved = std::move(narrow);
  moved.begin_step();
  CHECK(launch(moved, a) == V{1, 2, 3});
  CHECK(moved.uploads() == 7);
  moved.begin_step();
  CHECK(launch(moved, a) == V{1, 2, 3});
  CHECK(moved.uploads() == 7);
  static_assert(!std::is_copy_constructible_v<decltype(moved)>, "a copy would share the buffer, not the record");
}

TEST_CASE_TEMPLATE_DEFINE("multi-tensor tables copy only what changed", ExecSpace, table_uploads) {
  impl_test_table_uploads<ExecSpace>();
}
TEST_CASE_TEMPLATE_APPLY(table_uploads, lather_test_exec_spaces);

TEST_CASE_TEMPLATE_DEFINE("multi-tensor loop: one kernel over many tensors' chunks", ExecSpace, multi_tensor) {
  impl_test_multi_tensor_table<ExecSpace>();
}
TEST_CASE_TEMPLATE_APPLY(multi_tensor, lather_test_exec_spaces);

TEST_CASE_TEMPLATE_DEFINE("diagonal optimizers: hand-computed scalar trajectories", ExecSpace, hand_computed) {
  impl_test_hand_computed<ExecSpace>();
}
TEST_CASE_TEMPLATE_APPLY(hand_computed, lather_test_exec_spaces);

TEST_CASE_TEMPLATE_DEFINE("diagonal optimizers: double, against the element-wise reference", ExecSpace, ref_double) {
  impl_test_reference_all<double, ExecSpace>();
}
TEST_CASE_TEMPLATE_APPLY(ref_double, lather_test_exec_spaces);

TEST_CASE_TEMPLATE_DEFINE("diagonal optimizers: float, against the element-wise reference", ExecSpace, ref_float) {
  impl_test_reference_all<float, ExecSpace>();
}
TEST_CASE_TEMPLATE_APPLY(ref_float, lather_test_exec_spaces);

TEST_CASE_TEMPLATE_DEFINE("Adam/AdamW: the contiguous host path gives the general kernel's bits", ExecSpace, adam_fast) {
  impl_test_adam_fast_path<float, ExecSpace>();
  impl_test_adam_fast_path<double, ExecSpace>();
}
TEST_CASE_TEMPLATE_APPLY(adam_fast, lather_test_exec_spaces);

TEST_CASE_TEMPLATE_DEFINE("Adam/AdamW: all parameters in one chunk loop give each parameter's own bits", ExecSpace,
                          adam_chunks) {
  for (const bool portable : {false, true}) {
    impl_test_adam_chunk_loop<float, ExecSpace>(portable);
    impl_test_adam_chunk_loop<double, ExecSpace>(portable);
  }
}
TEST_CASE_TEMPLATE_APPLY(adam_chunks, lather_test_exec_spaces);

TEST_CASE_TEMPLATE_DEFINE("SGD/Adagrad/RMSprop: all parameters in one chunk loop give each parameter's own bits",
                          ExecSpace, other_chunks) {
  for (const bool portable : {false, true}) {
    impl_test_other_chunk_loops<float, ExecSpace>(portable);
    impl_test_other_chunk_loops<double, ExecSpace>(portable);
  }
}
TEST_CASE_TEMPLATE_APPLY(other_chunks, lather_test_exec_spaces);

// ---- where a step reads the NaN/Inf screen back ------------------------------------------------

namespace {

using lather::test::events_of;
using lather::test::position;

// With the kernels devices run (set_portable_kernels(true)), where a step reads the screen's
// counts back ("region ...::read_screen", a wait on a device) against its update kernel: the
// update is queued first, gated on the counts on the device, and the counts are read once, at
// the end (AdamW's buffers are allocated with the optimizer, so from the first step); the gated
// run ends with the bits of a run without the check. A step that allocates a buffer (SGD's
// momentum turned on by set_options) and a non-contiguous parameter (a kernel of its own, not
// gated) make the step read first, before anything is queued.
template <class T, class ExecSpace>
void impl_test_screen_order() {
  using M = typename ExecSpace::memory_space;
  using P = lather::TensorRef<T, M>;
  const std::string read = "region lather::AdamW::read_screen", update = "kernel lather::AdamW::step";
  auto make = [](std::vector<P>& params, bool check) {
    lather::AdamW<P, ExecSpace> opt(params, {.lr = 0.01, .weight_decay = 0.1});
    opt.set_portable_kernels(true);
    opt.set_check_finite(check);
    return opt;
  };
  using Run = lather::test::ScreenModel<T, M>;
  Run gated(5, 3, 7), plain(5, 3, 7);
  auto opt = make(gated.params, true);
  auto opt_plain = make(plain.params, false);
  for (int t = 1; t <= 4; ++t) {
    CAPTURE(t);
    gated.set_grads(t);
    plain.set_grads(t);
    const auto e = events_of([&] { opt.step(ExecSpace(), gated.grads); });
    REQUIRE(position(e, read) >= 0);
    REQUIRE(position(e, update) >= 0);
    CHECK(std::count(e.begin(), e.end(), read) == 1);
    CHECK(position(e, update) < position(e, read));
    opt_plain.step(ExecSpace(), plain.grads);
    for (std::size_t i = 0; i < 2; ++i)
      CHECK(lather::test::to_host(gated.params[i]) == lather::test::to_host(plain.params[i]));
  }
  CHECK(opt.state_dict() == opt_plain.state_dict());

  // A strided parameter: every other element of a buffer.
  Kokkos::View<T*, M> buffer("buffer", 14), gbuffer("gbuffer", 14);
  Kokkos::View<T*, Kokkos::LayoutStride, M> strided(buffer.data(), Kokkos::LayoutStride(7, 2)),
      gstrided(gbuffer.data(), Kokkos::LayoutStride(7, 2));
  Run mixed(5, 3, 7);
  std::vector<P> params{mixed.params[0], lather::tensor_ref(strided)}, grads{mixed.grads[0], lather::tensor_ref(gstrided)};
  auto opt_mixed = make(params, true);
  for (int t = 1; t <= 2; ++t) {
    CAPTURE(t);
    mixed.set_grads(t);
    const auto e = events_of([&] { opt_mixed.step(ExecSpace(), grads); });
    REQUIRE(position(e, read) >= 0);
    REQUIRE(position(e, update) >= 0);
    CHECK(position(e, read) < position(e, update));
  }

  // SGD: no buffer without momentum; momentum turned on allocates one on the next step.
  Run sgd_run(5, 3, 7);
  lather::SGD<P, ExecSpace> sgd(sgd_run.params, {.lr = 0.1});
  sgd.set_portable_kernels(true);
  const std::string sgd_read = "region lather::SGD::read_screen", sgd_update = "kernel lather::SGD::step";
  for (int t = 1; t <= 4; ++t) {
    CAPTURE(t);
    if (t == 2) sgd.set_options(0, {.lr = 0.1, .momentum = 0.9});
    sgd_run.set_grads(t);
    const auto e = events_of([&] { sgd.step(ExecSpace(), sgd_run.grads); });
    REQUIRE(position(e, sgd_read) >= 0);
    REQUIRE(position(e, sgd_update) >= 0);
    if (t == 2) CHECK(position(e, sgd_read) < position(e, sgd_update));
    else CHECK(position(e, sgd_update) < position(e, sgd_read));
  }
}

}  // namespace

TEST_CASE_TEMPLATE_DEFINE("diagonal optimizers: the update is queued before the screen is read", ExecSpace,
                          screen_order) {
  impl_test_screen_order<float, ExecSpace>();
  impl_test_screen_order<double, ExecSpace>();
}
TEST_CASE_TEMPLATE_APPLY(screen_order, lather_test_exec_spaces);
