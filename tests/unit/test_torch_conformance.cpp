// SPDX-License-Identifier: Apache-2.0
// Replays the torch.optim conformance cases (tests/data/conformance/t*, recorded from PyTorch
// 1.13 by the reference harness, see tests/data/conformance/README.md) through lather's
// optimizers and compares every step of every parameter with the recorded trajectory.
#include <lather/optimizers/adagrad.hpp>
#include <lather/optimizers/adam.hpp>
#include <lather/optimizers/rmsprop.hpp>
#include <lather/optimizers/sgd.hpp>

#include <Kokkos_Core.hpp>

#include <doctest/doctest.h>
#include <nlohmann/json.hpp>
#include <xtensor/xarray.hpp>
#include <xtensor/xnpy.hpp>
#include <xtensor/xview.hpp>

#include "exec_spaces.hpp"
#include "test_utils.hpp"

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

namespace {

namespace fs = std::filesystem;
const fs::path kData = LATHER_TEST_DATA_DIR;

struct Case {
  nlohmann::json json;
  std::vector<xt::xarray<double>> params0;  // initial values
  std::vector<xt::xarray<double>> grads;    // (steps, *shape)
  int steps = 0;
};

Case load_case(const std::string& name) {
  Case c;
  const fs::path dir = kData / "conformance" / name;
  std::ifstream in(dir / "case.json");
  REQUIRE(in.good());
  c.json = nlohmann::json::parse(in);
  c.steps = c.json.at("steps").get<int>();
  for (const auto& p : c.json.at("params")) c.params0.push_back(xt::load_npy<double>((dir / p.get<std::string>()).string()));
  for (const auto& g : c.json.at("grads")) c.grads.push_back(xt::load_npy<double>((dir / g.get<std::string>()).string()));
  return c;
}

template <class T>
xt::xarray<T> expected_trajectory(const std::string& name, const std::string& variant, std::size_t i) {
  return xt::load_npy<T>((kData / "conformance" / name / "out" / variant / ("params_" + std::to_string(i) + ".npy")).string());
}

// Builds the optimizer named in case.json with its torch options.
template <class T, class ExecSpace, class P, class F>
void with_optimizer(const nlohmann::json& o, std::vector<P>& params, F&& run) {
  const std::string name = o.at("name");
  if (name == "sgd") {
    lather::SGD<P, ExecSpace> opt(params, {.lr = o.at("lr"), .momentum = o.at("momentum"), .dampening = o.at("dampening"),
                                           .weight_decay = o.at("weight_decay"), .nesterov = o.at("nesterov"),
                                           .maximize = o.at("maximize")});
    run(opt);
  } else if (name == "adam" || name == "adamw") {
    const auto b = o.at("betas").get<std::vector<double>>();
    REQUIRE_FALSE(o.at("amsgrad").is_null());
    if (name == "adam") {
      lather::Adam<P, ExecSpace> opt(params, {.lr = o.at("lr"), .betas = {b[0], b[1]}, .eps = o.at("eps"),
                                              .weight_decay = o.at("weight_decay"), .amsgrad = o.at("amsgrad"),
                                              .maximize = o.at("maximize")});
      run(opt);
    } else {
      lather::AdamW<P, ExecSpace> opt(params, {.lr = o.at("lr"), .betas = {b[0], b[1]}, .eps = o.at("eps"),
                                               .weight_decay = o.at("weight_decay"), .amsgrad = o.at("amsgrad"),
                                               .maximize = o.at("maximize")});
      run(opt);
    }
  } else {
    FAIL("case optimizer '" << name << "' not handled by this test");
  }
}

template <class T, class ExecSpace>
void replay(const std::string& name, const std::string& variant, double rtol, double atol) {
  CAPTURE(name);
  CAPTURE(variant);
  using M = typename ExecSpace::memory_space;
  using P = lather::TensorRef<T, M>;
  const Case c = load_case(name);
  std::vector<Kokkos::View<T*, M>> storage, grad_storage;
  std::vector<P> params, grads;
  for (std::size_t i = 0; i < c.params0.size(); ++i) {
    const auto& p0 = c.params0[i];
    std::vector<std::int64_t> shape(p0.shape().begin(), p0.shape().end());
    storage.emplace_back("p", p0.size());
    grad_storage.emplace_back("g", p0.size());
    params.emplace_back(storage.back().data(), shape);
    grads.emplace_back(grad_storage.back().data(), shape);
    lather::test::from_host(params.back(), std::vector<double>(p0.begin(), p0.end()));
  }
  double worst = 0;
  with_optimizer<T, ExecSpace>(c.json.at("optimizer"), params, [&](auto& opt) {
    for (int t = 1; t <= c.steps; ++t) {
      for (std::size_t i = 0; i < grads.size(); ++i) {
        auto g = xt::view(c.grads[i], t - 1);
        // Gradients are cast to the variant dtype first, as the recorder did.
        std::vector<double> gv;
        for (double x : g) gv.push_back(static_cast<double>(static_cast<T>(x)));
        lather::test::from_host(grads[i], gv);
      }
      opt.step(ExecSpace(), grads);
      for (std::size_t i = 0; i < params.size(); ++i) {
        const auto expect_all = expected_trajectory<T>(name, variant, i);
        auto row = xt::view(expect_all, t);
        std::vector<double> expect(row.begin(), row.end());
        const auto got = lather::test::to_host(params[i]);
        CAPTURE(t);
        CAPTURE(i);
        lather::test::all_close(got, expect, rtol, atol, name);
        worst = std::max(worst, lather::test::max_rel_diff(got, expect, 1e-3));
      }
    }
  });
  MESSAGE(name << " " << variant << ": largest relative difference " << worst);
}

}  // namespace

// Double against torch's double run: same operations in the same order, so only FMA
// contraction and libm differences remain (seen: at most 5.3e-15 relative); 1e-13 leaves headroom
// over 30 steps. Float against torch's float run: torch vectorizes (AVX2) and may round each
// operation differently, which a few float ulps (1e-7) grow over 20-30 steps (seen: 3.8e-6 on
// SGD, 9.3e-7 on Adam); 1e-5 relative bounds it.
TEST_CASE_TEMPLATE_DEFINE("torch conformance: SGD and Adam trajectories", ExecSpace, torch_conformance) {
  for (const char* name : {"t01_sgd_plain", "t08_adam_plain"}) {
    replay<double, ExecSpace>(name, "float64_fp64scalars", 1e-13, 1e-15);
    replay<float, ExecSpace>(name, "float32", 1e-5, 1e-7);
  }
}
TEST_CASE_TEMPLATE_APPLY(torch_conformance, lather_test_exec_spaces);
