// SPDX-License-Identifier: Apache-2.0
// Adafactor and CAME on one device: the recorded conformance cases (HuggingFace Adafactor, the
// CAME paper's code; tests/data/conformance/a01, a06), hand-computed first steps
// (tests/reference/factored_hand_computed.py), an independent element-wise double reference over
// every option and shapes of rank 0 to 4, options errors, NaN gradients, state dictionaries.
#include <lather/optimizers/adafactor.hpp>
#include <lather/optimizers/came.hpp>

#include <Kokkos_Core.hpp>

#include <doctest/doctest.h>
#include <nlohmann/json.hpp>
#include <xtensor/xarray.hpp>
#include <xtensor/xnpy.hpp>
#include <xtensor/xview.hpp>

#include "exec_spaces.hpp"
#include "test_utils.hpp"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <numeric>
#include <string>
#include <type_traits>
#include <vector>

namespace {

namespace fs = std::filesystem;
const fs::path kData = LATHER_TEST_DATA_DIR;

/// max|a - b| / max|b|: the conformance measure (relative to the largest expected value).
double diff_over_max(const std::vector<double>& a, const std::vector<double>& b) {
  double num = 0, den = 0;
  for (std::size_t k = 0; k < std::min(a.size(), b.size()); ++k) {
    num = std::max(num, std::abs(a[k] - b[k]));
    den = std::max(den, std::abs(b[k]));
  }
  return num / std::max(den, 1e-300);
}

// ---- conformance --------------------------------------------------------------------------------

struct Case {
  nlohmann::json json;
  std::vector<xt::xarray<double>> params0;
  std::vector<xt::xarray<double>> grads;  // (steps, *shape)
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
xt::xarray<T> load_expected(const std::string& name, const std::string& variant, const std::string& file) {
  return xt::load_npy<T>((kData / "conformance" / name / "out" / variant / file).string());
}

lather::AdafactorOptions adafactor_options(const nlohmann::json& o) {
  REQUIRE(o.at("name") == "adafactor");
  const auto eps = o.at("eps").get<std::vector<double>>();
  return {.lr = o.at("lr").is_null() ? 0.0 : o.at("lr").get<double>(),
          .eps = {eps[0], eps[1]},
          .clip_threshold = o.at("clip_threshold"),
          .decay_rate = o.at("decay_rate"),
          .beta1 = o.at("beta1").is_null() ? 0.0 : o.at("beta1").get<double>(),
          .weight_decay = o.at("weight_decay"),
          .scale_parameter = o.at("scale_parameter"),
          .relative_step = o.at("relative_step"),
          .warmup_init = o.at("warmup_init")};
}
lather::CAMEOptions came_options(const nlohmann::json& o) {
  REQUIRE(o.at("name") == "came");
  const auto eps = o.at("eps").get<std::vector<double>>();
  const auto b = o.at("betas").get<std::vector<double>>();
  return {.lr = o.at("lr"),
          .eps = {eps[0], eps[1]},
          .clip_threshold = o.at("clip_threshold"),
          .betas = {b[0], b[1], b[2]},
          .weight_decay = o.at("weight_decay")};
}

/// Replays a case and returns the largest max|diff| / max|expected| over parameters and steps;
/// also compares the final state with out/<variant>/final_state.
template <class T, class ExecSpace>
double replay(const std::string& name, const std::string& variant, double rtol) {
  CAPTURE(name);
  CAPTURE(variant);
  using M = typename ExecSpace::memory_space;
  using P = lather::TensorRef<T, M>;
  const Case c = load_case(name);
  std::vector<Kokkos::View<T*, M>> storage, grad_storage;
  std::vector<P> params, grads;
  for (const auto& p0 : c.params0) {
    std::vector<std::int64_t> shape(p0.shape().begin(), p0.shape().end());
    storage.emplace_back("p", p0.size());
    grad_storage.emplace_back("g", p0.size());
    params.emplace_back(storage.back().data(), shape);
    grads.emplace_back(grad_storage.back().data(), shape);
    lather::test::from_host(params.back(), std::vector<double>(p0.begin(), p0.end()));
  }
  double worst = 0;
  auto run = [&](auto& opt) {
    for (int t = 1; t <= c.steps; ++t) {
      for (std::size_t i = 0; i < grads.size(); ++i) {
        auto g = xt::view(c.grads[i], t - 1);
        std::vector<double> gv;
        for (double x : g) gv.push_back(static_cast<double>(static_cast<T>(x)));
        lather::test::from_host(grads[i], gv);
      }
      opt.step(ExecSpace(), grads);
      for (std::size_t i = 0; i < params.size(); ++i) {
        const auto all = load_expected<T>(name, variant, "params_" + std::to_string(i) + ".npy");
        auto row = xt::view(all, t);
        const std::vector<double> expect(row.begin(), row.end());
        const double d = diff_over_max(lather::test::to_host(params[i]), expect);
        CAPTURE(t);
        CAPTURE(i);
        CHECK(d <= rtol);
        worst = std::max(worst, d);
      }
    }
    // Final state, every buffer the reference recorded.
    std::ifstream in(kData / "conformance" / name / "out" / variant / "final_state" / "index.json");
    REQUIRE(in.good());
    const auto index = nlohmann::json::parse(in);
    for (const auto& [key, value] : index.items()) {
      CAPTURE(key);
      const auto dot = key.find('.');
      const std::size_t i = std::stoul(key.substr(1, dot - 1));
      std::string buffer = key.substr(dot + 1);
      if (buffer == "step") {
        CHECK(opt.step_count(i) == static_cast<std::int64_t>(value.template get<double>()));
        continue;
      }
      if (!buffer.ends_with(".npy")) continue;  // "RMS": HF's record of rms(p_{t-1}), not state here
      buffer = buffer.substr(0, buffer.size() - 4);
      const auto expect_x = load_expected<T>(name, variant, "final_state/" + key);
      const std::vector<double> expect(expect_x.begin(), expect_x.end());
      const lather::StateTensor st = opt.state(i, buffer);
      std::vector<double> got;
      std::visit([&](const auto& v) { got.assign(v.begin(), v.end()); }, st.values);
      REQUIRE(got.size() == expect.size());
      CHECK(value.template get<std::vector<std::int64_t>>() == st.shape);
      const double d = diff_over_max(got, expect);
      CHECK(d <= rtol);
      worst = std::max(worst, d);
    }
  };
  const std::string opt_name = c.json.at("optimizer").at("name");
  if (opt_name == "adafactor") {
    lather::Adafactor<P, ExecSpace> opt(params, adafactor_options(c.json.at("optimizer")));
    run(opt);
  } else {
    lather::CAME<P, ExecSpace> opt(params, came_options(c.json.at("optimizer")));
    run(opt);
  }
  MESSAGE(name << " " << variant << ": largest max|diff|/max|expected| " << worst);
  return worst;
}

}  // namespace

// a01 (HF Adafactor defaults) and a06 (CAME defaults), 30 steps of a 6x5 and a 5 parameter.
// double vs the all-double reference: 1e-10 (seen: 1.3e-16 to 3.5e-16, final state included);
// float vs the reference's float32 run: 1e-6 (seen: 7.0e-8 and 1.6e-7; the statistics and the
// RMS are accumulated in double here and in float32 pairwise sums by NumPy).
TEST_CASE_TEMPLATE_DEFINE("adafactor/came: recorded conformance cases", ExecSpace, factored_conformance) {
  for (const char* name : {"a01_adafactor_relstep_2d_1d", "a06_came_defaults_2d_1d"}) {
    replay<double, ExecSpace>(name, "float64_fp64scalars", 1e-10);
    replay<float, ExecSpace>(name, "float32", 1e-6);
  }
}
TEST_CASE_TEMPLATE_APPLY(factored_conformance, lather_test_exec_spaces);

// ---- hand-computed trajectories (tests/reference/factored_hand_computed.py) ---------------------

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
// Printed by tests/reference/factored_hand_computed.py.
const std::vector<Expected> kAdafactorDefaults{
    {{0.4910405916443342, -0.2449616624222074, 0.9959379623824898, 0.1237998602709103, -0.7560741044163541, 0.3815294660526301}, {0.09783975310053072, -0.19783975310053073, 0.2978397531005307}},
    {{0.49369478100512654, -0.24830318129418863, 0.9866357352193965, 0.13168346710547232, -0.7560741044163541, 0.3780757231357288}, {0.09524575638759929, -0.19783975310053073, 0.29925812479125574}},
    {{0.4919346954047026, -0.25037942761891524, 0.9881469411967257, 0.12635491184908068, -0.7497883912302903, 0.37235686452449934}, {0.09606847922872352, -0.20079487423536221, 0.29836375762429324}}};
const std::vector<Expected> kAdafactorBeta1Wd{
    {{0.4988131374968549, -0.2493507054084315, 0.999011952903092, 0.12480725561019641, -0.7501710279402676, 0.3754347553545791}, {0.09976237284105838, -0.19974077037206367, 0.299719167903069}},
    {{0.4979823689538082, -0.24908665528998813, 0.9971346713936186, 0.12541557146498616, -0.7502815324060383, 0.375458513867307}, {0.09928490124971573, -0.1995032484794265, 0.29960307096525174}},
    {{0.4970298868460679, -0.24904312502128456, 0.9955403642648125, 0.12542092775388952, -0.7497071511414971, 0.37488453531319804}, {0.09893591156694242, -0.1995825400408221, 0.2994022297967508}}};
const std::vector<Expected> kAdafactorFixedLr{
    {{0.46150420648348733, -0.22835182912066554, 0.9825466866591595, 0.11984337253443927, -0.7760985391141189, 0.40305508655894373}, {0.07500000000000001, -0.17500000000000002, 0.27499999999999997}},
    {{0.4735047549319012, -0.24601474930836276, 0.9429442344518486, 0.1582453768266109, -0.7760985391141189, 0.3872140028557372}, {0.038602878531769975, -0.17500000000000002, 0.29845739859462056}},
    {{0.4619887916513292, -0.26016682112590916, 0.9523733479578521, 0.12765974327522034, -0.7385115763860702, 0.3559101289002223}, {0.05119910474122719, -0.21332577766333774, 0.2827262240745605}}};
const std::vector<Expected> kAdafactorWarmup{
    {{0.4999991040591644, -0.24999949616624223, 0.9999995937962383, 0.12499987998602709, -0.7500006074104416, 0.3750006529466053}, {0.09999978397531006, -0.19999978397531007, 0.29999978397531}},
    {{0.49999963564219624, -0.250000165408143, 0.9999977307392195, 0.1250014589207047, -0.7500006074104416, 0.3749999612283888}, {0.09999926033223015, -0.19999978397531007, 0.30000007029815573}},
    {{0.4999991049346416, -0.25000079144565485, 0.9999981864036648, 0.12499985223491096, -0.74999871211883, 0.3749982368568763}, {0.0999995091404653, -0.20000067766445723, 0.2999997998232093}}};
const std::vector<Expected> kCameDefaults{
    {{0.3579896582143941, -0.15852631386534177, 0.924315521719452, 0.10163474970775851, -0.8854531642086491, 0.5244302532641573}, {0.099, -0.199, 0.299}},
    {{0.29888716051522213, -0.13844354658642108, 0.7729859835096946, 0.19767031977954475, -0.9943309483075763, 0.5535101391255622}, {0.09655089967915996, -0.1981, 0.2988747826766089}},
    {{0.21913720157598043, -0.15887331686099032, 0.660268288751015, 0.18827465799194817, -0.9561299187470913, 0.4979334304948957}, {0.09477270621099279, -0.19891386872762365, 0.2983359684820038}}};
const std::vector<Expected> kCameWd{
    {{0.39845787044816866, -0.18466533131470475, 0.9451495496501859, 0.1082503329697364, -0.8456266159146238, 0.4809464891213673}, {0.0959, -0.1958, 0.29569999999999996}},
    {{0.3638989459193291, -0.1763487283115877, 0.8382892202927187, 0.17499145516019243, -0.9106456568392244, 0.49492426557064656}, {0.0864110712974448, -0.1924042, 0.2953101646926946}},
    {{0.3183432297916283, -0.1952985177759013, 0.7711264574496042, 0.164576306853545, -0.8756644248861173, 0.45125171948698284}, {0.08051755704198786, -0.19614435629610075, 0.29322732042657784}}};
// ColossalAI's DistributedCAME (residual statistics aliasing the second-moment ones from step 2,
// the 1-D first moment scaled by lr in place), same input: step 1 agrees, then it departs; after
// 3 steps its cumulative change differs from the paper's by 0.55 (W) and 0.589 (b) relative.
const Expected kCameAliasedStep3{
    {0.3149304372837123, -0.15907030606993833, 0.8471778707674928, 0.12259886697125662, -0.8909239471321928, 0.5162375293822187},
    {0.09785387359686128, -0.20061478772762367, 0.2993465561171453}};

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

template <class Opt, class ExecSpace, class Options>
std::vector<Expected> hand_trajectory(const Options& o) {
  Problem<double, ExecSpace> pr;
  Opt opt(pr.params, o);
  std::vector<Expected> out;
  for (int t = 0; t < 3; ++t) {
    pr.set_grads(t);
    opt.step(ExecSpace(), pr.grads);
    out.push_back({to_host(pr.params[0]), to_host(pr.params[1])});
  }
  return out;
}

void check_trajectory(const std::vector<Expected>& got, const std::vector<Expected>& want, const char* what) {
  CAPTURE(what);
  for (std::size_t t = 0; t < want.size(); ++t) {
    CAPTURE(t);
    // The same operations in the same order as the script: equal up to FMA contraction and libm.
    all_close(got[t].w, want[t].w, 1e-13, 1e-16, what);
    all_close(got[t].b, want[t].b, 1e-13, 1e-16, what);
  }
}

template <class ExecSpace>
void impl_test_hand_computed() {
  using M = typename ExecSpace::memory_space;
  using P = lather::TensorRef<double, M>;
  using A = lather::Adafactor<P, ExecSpace>;
  using C = lather::CAME<P, ExecSpace>;
  check_trajectory(hand_trajectory<A, ExecSpace>(lather::AdafactorOptions{}), kAdafactorDefaults, "adafactor defaults");
  check_trajectory(hand_trajectory<A, ExecSpace>(lather::AdafactorOptions{.beta1 = 0.9, .weight_decay = 0.1}),
                   kAdafactorBeta1Wd, "adafactor beta1 + weight_decay");
  check_trajectory(hand_trajectory<A, ExecSpace>(lather::AdafactorOptions{.lr = 0.05, .clip_threshold = 0.5,
                                                                          .decay_rate = -0.5, .scale_parameter = false,
                                                                          .relative_step = false}),
                   kAdafactorFixedLr, "adafactor fixed lr, no parameter scale");
  check_trajectory(hand_trajectory<A, ExecSpace>(lather::AdafactorOptions{.warmup_init = true}), kAdafactorWarmup,
                   "adafactor warmup_init");
  const auto came = hand_trajectory<C, ExecSpace>(lather::CAMEOptions{.lr = 0.01});
  check_trajectory(came, kCameDefaults, "came defaults");
  check_trajectory(hand_trajectory<C, ExecSpace>(lather::CAMEOptions{
                       .lr = 0.01, .clip_threshold = 2.0, .betas = {0.8, 0.99, 0.999}, .weight_decay = 0.1}),
                   kCameWd, "came weight decay, other betas");
  // Not ColossalAI's aliased trajectory: by step 3 far from it.
  double d = 0;
  for (std::size_t k = 0; k < 6; ++k) d = std::max(d, std::abs(came[2].w[k] - kCameAliasedStep3.w[k]));
  CHECK(d > 1e-2);
}

}  // namespace

TEST_CASE_TEMPLATE_DEFINE("adafactor/came: hand-computed trajectories", ExecSpace, factored_hand) {
  impl_test_hand_computed<ExecSpace>();
}
TEST_CASE_TEMPLATE_APPLY(factored_hand, lather_test_exec_spaces);

// ---- an independent element-wise double reference, every option, shapes of rank 0 to 4 ----------

namespace {

struct RefDims {
  bool factored = false;
  std::int64_t batches = 1, rows = 1, cols = 1;
};
RefDims ref_dims(const std::vector<std::int64_t>& shape) {
  RefDims d;
  d.factored = shape.size() >= 2;
  if (!d.factored) return d;
  for (std::size_t k = 0; k + 2 < shape.size(); ++k) d.batches *= shape[k];
  d.rows = shape[shape.size() - 2];
  d.cols = shape.back();
  return d;
}

// V̂ = R_i C_j / mean_i R per batch slice, from the row and column means of q (the paper's form;
// lather computes (rf cf) g: a different rounding, the same value).
struct RefFactor {
  std::vector<double> row, col;
  void update(const RefDims& d, const std::vector<double>& q, double beta) {
    if (row.empty()) {
      row.assign(static_cast<std::size_t>(d.batches * d.rows), 0.0);
      col.assign(static_cast<std::size_t>(d.batches * d.cols), 0.0);
    }
    for (std::int64_t b = 0; b < d.batches; ++b) {
      for (std::int64_t i = 0; i < d.rows; ++i) {
        double s = 0;
        for (std::int64_t j = 0; j < d.cols; ++j) s += q[static_cast<std::size_t>((b * d.rows + i) * d.cols + j)];
        auto& r = row[static_cast<std::size_t>(b * d.rows + i)];
        r = beta * r + (1 - beta) * (s / static_cast<double>(d.cols));
      }
      for (std::int64_t j = 0; j < d.cols; ++j) {
        double s = 0;
        for (std::int64_t i = 0; i < d.rows; ++i) s += q[static_cast<std::size_t>((b * d.rows + i) * d.cols + j)];
        auto& c = col[static_cast<std::size_t>(b * d.cols + j)];
        c = beta * c + (1 - beta) * (s / static_cast<double>(d.rows));
      }
    }
  }
  double vhat(const RefDims& d, std::int64_t f) const {
    const std::int64_t b = f / (d.rows * d.cols), i = f / d.cols % d.rows, j = f % d.cols;
    double mean = 0;
    for (std::int64_t k = 0; k < d.rows; ++k) mean += row[static_cast<std::size_t>(b * d.rows + k)];
    mean /= static_cast<double>(d.rows);
    return row[static_cast<std::size_t>(b * d.rows + i)] * col[static_cast<std::size_t>(b * d.cols + j)] / mean;
  }
};

double ref_rms(const std::vector<double>& x) {
  double s = 0;
  for (double v : x) s += v * v;
  return x.empty() ? 0.0 : std::sqrt(s / static_cast<double>(x.size()));
}

/// One parameter through `steps` steps of HuggingFace's Adafactor; the trajectory (after each step).
std::vector<std::vector<double>> ref_adafactor(const std::vector<std::int64_t>& shape, std::vector<double> p,
                                               const std::vector<std::vector<double>>& grads,
                                               const lather::AdafactorOptions& o) {
  const RefDims d = ref_dims(shape);
  const std::size_t n = p.size();
  RefFactor f;
  std::vector<double> v(n, 0.0), m(n, 0.0);
  std::vector<std::vector<double>> out;
  for (std::size_t s = 0; s < grads.size(); ++s) {
    const double t = static_cast<double>(s + 1);
    const auto& g = grads[s];
    const double rho = o.relative_step ? std::min(o.warmup_init ? 1e-6 * t : 1e-2, 1 / std::sqrt(t)) : o.lr;
    const double lr_t = (o.scale_parameter ? std::max(o.eps[1], ref_rms(p)) : 1.0) * rho;
    const double beta2 = 1 - std::pow(t, o.decay_rate);
    std::vector<double> q(n), u(n);
    for (std::size_t k = 0; k < n; ++k) q[k] = g[k] * g[k] + o.eps[0];
    if (d.factored) f.update(d, q, beta2);
    for (std::size_t k = 0; k < n; ++k) {
      if (!d.factored) v[k] = beta2 * v[k] + (1 - beta2) * q[k];
      u[k] = g[k] / std::sqrt(d.factored ? f.vhat(d, static_cast<std::int64_t>(k)) : v[k]);
    }
    const double clip = std::max(1.0, ref_rms(u) / o.clip_threshold);
    for (std::size_t k = 0; k < n; ++k) {
      double uk = lr_t * u[k] / clip;
      if (o.beta1 > 0) uk = m[k] = o.beta1 * m[k] + (1 - o.beta1) * uk;
      p[k] = p[k] - o.weight_decay * lr_t * p[k] - uk;
    }
    out.push_back(p);
  }
  return out;
}

/// One parameter through `steps` steps of the CAME paper's code.
std::vector<std::vector<double>> ref_came(const std::vector<std::int64_t>& shape, std::vector<double> p,
                                          const std::vector<std::vector<double>>& grads, const lather::CAMEOptions& o) {
  const RefDims d = ref_dims(shape);
  const std::size_t n = p.size();
  const auto [b1, b2, b3] = o.betas;
  RefFactor sq, res;
  std::vector<double> v(n, 0.0), m(n, 0.0);
  std::vector<std::vector<double>> out;
  for (const auto& g : grads) {
    std::vector<double> q(n), u(n);
    for (std::size_t k = 0; k < n; ++k) q[k] = g[k] * g[k] + o.eps[0];
    if (d.factored) sq.update(d, q, b2);
    for (std::size_t k = 0; k < n; ++k) {
      if (!d.factored) v[k] = b2 * v[k] + (1 - b2) * q[k];
      u[k] = g[k] / std::sqrt(d.factored ? sq.vhat(d, static_cast<std::int64_t>(k)) : v[k]);
    }
    const double clip = std::max(1.0, ref_rms(u) / o.clip_threshold);
    std::vector<double> r(n);
    for (std::size_t k = 0; k < n; ++k) {
      m[k] = b1 * m[k] + (1 - b1) * (u[k] / clip);
      r[k] = (u[k] / clip - m[k]) * (u[k] / clip - m[k]) + o.eps[1];
    }
    if (d.factored) res.update(d, r, b3);
    for (std::size_t k = 0; k < n; ++k) {
      const double upd = d.factored ? m[k] / std::sqrt(res.vhat(d, static_cast<std::int64_t>(k))) : m[k];
      p[k] = p[k] - o.weight_decay * o.lr * p[k] - o.lr * upd;
    }
    out.push_back(p);
  }
  return out;
}

const std::vector<std::vector<std::int64_t>> kShapes{{6, 5}, {1, 1}, {1, 5}, {5, 1}, {1},          {2},
                                                     {3},    {13},   {},     {2, 3, 4}, {2, 2, 3, 5}, {0, 3}};

/// Runs lather (value type T) over kShapes (the first one held by a LayoutLeft View, i.e. a
/// strided tensor) with seeded gradients for `steps` steps and returns, per parameter, the
/// largest max|ΔP - ΔP_ref| / max|ΔP_ref| over the steps (ΔP the cumulative change) for double,
/// max|P - P_ref| / max|P_ref| for float.
template <class T, class ExecSpace, class Opt, class Options, class Ref>
std::vector<double> against_reference(const Options& o, Ref&& ref, int steps) {
  using M = typename ExecSpace::memory_space;
  using P = lather::TensorRef<T, M>;
  Kokkos::View<T**, Kokkos::LayoutLeft, M> left("left", 6, 5), left_g("left_g", 6, 5);
  std::vector<Kokkos::View<T*, M>> storage, grad_storage;
  std::vector<P> params, grads;
  std::vector<std::vector<double>> p0;
  for (std::size_t i = 0; i < kShapes.size(); ++i) {
    const auto& shape = kShapes[i];
    const auto n = static_cast<std::size_t>(std::accumulate(shape.begin(), shape.end(), std::int64_t{1}, std::multiplies<>()));
    storage.emplace_back("p", n);
    grad_storage.emplace_back("g", n);
    if (i == 0) {
      params.push_back(lather::tensor_ref(left));
      grads.push_back(lather::tensor_ref(left_g));
    } else {
      params.emplace_back(storage.back().data(), shape);
      grads.emplace_back(grad_storage.back().data(), shape);
    }
    std::vector<double> v = lather::test::random_values(n, 100 + i);
    for (auto& x : v) x = static_cast<double>(static_cast<T>(x));
    from_host(params.back(), v);
    p0.push_back(v);
  }
  REQUIRE(!params[0].is_row_major_contiguous());
  std::vector<std::vector<std::vector<double>>> gs(kShapes.size());  // [param][step]
  for (std::size_t i = 0; i < kShapes.size(); ++i)
    for (int t = 0; t < steps; ++t) {
      std::vector<double> g = lather::test::random_values(p0[i].size(), 1000 * (i + 1) + static_cast<std::uint64_t>(t));
      for (auto& x : g) x = static_cast<double>(static_cast<T>(x));
      gs[i].push_back(g);
    }
  Opt opt(params, o);
  std::vector<double> worst(kShapes.size(), 0.0);
  std::vector<std::vector<std::vector<double>>> want(kShapes.size());
  for (std::size_t i = 0; i < kShapes.size(); ++i)
    if (!p0[i].empty()) want[i] = ref(kShapes[i], p0[i], gs[i], o);
  for (int t = 0; t < steps; ++t) {
    for (std::size_t i = 0; i < kShapes.size(); ++i) from_host(grads[i], gs[i][static_cast<std::size_t>(t)]);
    opt.step(ExecSpace(), grads);
    for (std::size_t i = 0; i < kShapes.size(); ++i) {
      if (p0[i].empty()) continue;
      const auto got = to_host(params[i]);
      const auto& want_t = want[i][static_cast<std::size_t>(t)];
      for (double x : got) REQUIRE(std::isfinite(x));
      if constexpr (std::is_same_v<T, double>) {
        std::vector<double> dgot(got.size()), dwant(got.size());
        for (std::size_t k = 0; k < got.size(); ++k) {
          dgot[k] = got[k] - p0[i][k];
          dwant[k] = want_t[k] - p0[i][k];
        }
        worst[i] = std::max(worst[i], diff_over_max(dgot, dwant));
      } else {
        // A float parameter cannot resolve changes below its ulp (warmup_init's 1e-6 steps):
        // the conformance measure on the parameter itself.
        worst[i] = std::max(worst[i], diff_over_max(got, want_t));
      }
    }
  }
  CHECK(opt.step_count(kShapes.size() - 1) == 0);  // the empty parameter is never stepped
  return worst;
}

template <class T, class ExecSpace>
void impl_test_reference(double tol) {
  using M = typename ExecSpace::memory_space;
  using P = lather::TensorRef<T, M>;
  const std::vector<lather::AdafactorOptions> adafactor{
      {},
      {.beta1 = 0.9, .weight_decay = 0.05},
      {.lr = 0.02, .clip_threshold = 0.5, .decay_rate = -0.6, .scale_parameter = false, .relative_step = false},
      {.clip_threshold = 2.0, .warmup_init = true},
      {.eps = {1e-20, 1e-2}, .decay_rate = 0.0, .beta1 = 0.5, .scale_parameter = true}};
  for (std::size_t v = 0; v < adafactor.size(); ++v) {
    CAPTURE(v);
    const auto worst = against_reference<T, ExecSpace, lather::Adafactor<P, ExecSpace>>(adafactor[v], ref_adafactor, 6);
    for (std::size_t i = 0; i < worst.size(); ++i) {
      CAPTURE(i);
      CHECK(worst[i] <= tol);
    }
    MESSAGE("adafactor variant " << v << " (" << std::string(sizeof(T) == 4 ? "float" : "double")
                                 << "): largest ΔP difference " << *std::max_element(worst.begin(), worst.end()));
  }
  const std::vector<lather::CAMEOptions> came{
      {.lr = 0.01},
      {.lr = 0.02, .eps = {1e-20, 1e-12}, .clip_threshold = 0.7, .betas = {0.8, 0.99, 0.995}, .weight_decay = 0.1},
      {.lr = 0.005, .betas = {0.0, 0.5, 0.0}}};
  for (std::size_t v = 0; v < came.size(); ++v) {
    CAPTURE(v);
    const auto worst = against_reference<T, ExecSpace, lather::CAME<P, ExecSpace>>(came[v], ref_came, 6);
    for (std::size_t i = 0; i < worst.size(); ++i) {
      CAPTURE(i);
      CHECK(worst[i] <= tol);
    }
    MESSAGE("came variant " << v << " (" << std::string(sizeof(T) == 4 ? "float" : "double") << "): largest ΔP difference "
                            << *std::max_element(worst.begin(), worst.end()));
  }
}

}  // namespace

// Double: the reference forms V̂ = R C / mean R and divides, lather multiplies 1/sqrt factors;
// the results agree to rounding (1e-12 on the cumulative change). Float against the double
// reference on the parameter (the conformance measure): 1e-6.
TEST_CASE_TEMPLATE_DEFINE("adafactor/came: every option and shapes of rank 0 to 4 against a double reference",
                          ExecSpace, factored_reference) {
  impl_test_reference<double, ExecSpace>(1e-12);
  impl_test_reference<float, ExecSpace>(1e-6);
}
TEST_CASE_TEMPLATE_APPLY(factored_reference, lather_test_exec_spaces);

// ---- edge cases, errors, state ------------------------------------------------------------------

namespace {

std::vector<double> state_values(const lather::StateTensor& t) {
  std::vector<double> v;
  std::visit([&](const auto& x) { v.assign(x.begin(), x.end()); }, t.values);
  return v;
}

template <class ExecSpace>
void impl_test_zero_gradients() {
  using M = typename ExecSpace::memory_space;
  using P = lather::TensorRef<double, M>;
  auto run = [](auto& opt, auto& pr) {
    for (int t = 0; t < 3; ++t) {
      from_host(pr.grads[0], std::vector<double>(6, 0.0));
      from_host(pr.grads[1], std::vector<double>(3, 0.0));
      opt.step(ExecSpace(), pr.grads);
    }
    // u = 0 everywhere (eps1 keeps the statistics positive): the parameters do not move.
    CHECK(to_host(pr.params[0]) == kW0);
    CHECK(to_host(pr.params[1]) == kB0);
    for (std::size_t i = 0; i < 2; ++i) {
      const auto sd = opt.state_dict();
      for (const auto& [name, t] : sd.tensors)
        for (double x : state_values(t)) CHECK_MESSAGE(std::isfinite(x), name);
    }
  };
  {
    Problem<double, ExecSpace> pr;
    lather::Adafactor<P, ExecSpace> opt(pr.params, {.beta1 = 0.9});
    run(opt, pr);
    // R = C = eps1 (the EMA of eps1 alone), exactly.
    for (double x : state_values(opt.state(0, "exp_avg_sq_row"))) CHECK(x == doctest::Approx(1e-30).epsilon(1e-12));
  }
  {
    Problem<double, ExecSpace> pr;
    lather::CAME<P, ExecSpace> opt(pr.params, {.lr = 0.01});
    run(opt, pr);
  }
}

// A NaN gradient changes nothing (raise), or only skips its parameter (skip_parameter).
template <class ExecSpace>
void impl_test_nonfinite() {
  using M = typename ExecSpace::memory_space;
  using P = lather::TensorRef<double, M>;
  auto check = [](auto& opt, auto& pr) {
    pr.set_grads(0);
    opt.step(ExecSpace(), pr.grads);
    const auto before = opt.state_dict();
    const auto w = to_host(pr.params[0]), b = to_host(pr.params[1]);
    pr.set_grads(1);
    std::vector<double> bad = kGW[1];
    bad[4] = std::numeric_limits<double>::quiet_NaN();
    from_host(pr.grads[0], bad);
    CHECK_THROWS_WITH_AS(opt.step(ExecSpace(), pr.grads), doctest::Contains("NaN or Inf"), lather::invalid_argument);
    CHECK(opt.state_dict() == before);
    CHECK(to_host(pr.params[0]) == w);
    CHECK(to_host(pr.params[1]) == b);
    opt.set_nonfinite_policy(lather::NonFinitePolicy::skip_parameter);
    opt.step(ExecSpace(), pr.grads);
    CHECK(to_host(pr.params[0]) == w);
    CHECK(to_host(pr.params[1]) != b);
    CHECK(opt.step_count(0) == 1);
    CHECK(opt.step_count(1) == 2);
    CHECK(opt.nonfinite_skips(0) == 1);
  };
  {
    Problem<double, ExecSpace> pr;
    lather::Adafactor<P, ExecSpace> opt(pr.params, {.beta1 = 0.9, .weight_decay = 0.1});
    check(opt, pr);
  }
  {
    Problem<double, ExecSpace> pr;
    lather::CAME<P, ExecSpace> opt(pr.params, {.lr = 0.01});
    check(opt, pr);
  }
}

// Saving after 2 steps and continuing from the loaded state gives bitwise the same trajectory.
template <class T, class ExecSpace, class Opt, class Options>
void state_round_trip(const Options& o) {
  Problem<T, ExecSpace> a;
  Opt opt_a(a.params, o);
  for (int t = 0; t < 2; ++t) {
    a.set_grads(t);
    opt_a.step(ExecSpace(), a.grads);
  }
  const lather::StateDict saved = opt_a.state_dict();
  Problem<T, ExecSpace> b;
  from_host(b.params[0], to_host(a.params[0]));
  from_host(b.params[1], to_host(a.params[1]));
  Opt opt_b(b.params, o);
  opt_b.load_state_dict(saved);
  CHECK(opt_b.state_dict() == saved);
  for (int t = 2; t < 3; ++t) {
    a.set_grads(t);
    b.set_grads(t);
    opt_a.step(ExecSpace(), a.grads);
    opt_b.step(ExecSpace(), b.grads);
  }
  CHECK(to_host(a.params[0]) == to_host(b.params[0]));
  CHECK(to_host(a.params[1]) == to_host(b.params[1]));
  CHECK(opt_a.state_dict() == opt_b.state_dict());
}

template <class ExecSpace>
void impl_test_state() {
  using M = typename ExecSpace::memory_space;
  using P = lather::TensorRef<double, M>;
  using PF = lather::TensorRef<float, M>;
  state_round_trip<double, ExecSpace, lather::Adafactor<P, ExecSpace>>(lather::AdafactorOptions{.beta1 = 0.9});
  state_round_trip<float, ExecSpace, lather::Adafactor<PF, ExecSpace>>(lather::AdafactorOptions{});
  state_round_trip<double, ExecSpace, lather::CAME<P, ExecSpace>>(lather::CAMEOptions{.lr = 0.01});
  state_round_trip<float, ExecSpace, lather::CAME<PF, ExecSpace>>(lather::CAMEOptions{.lr = 0.01});

  // The buffers, their names and logical shapes.
  Problem<double, ExecSpace> pr;
  lather::CAME<P, ExecSpace> came(pr.params, {.lr = 0.01});
  lather::Adafactor<P, ExecSpace> ada(pr.params, {.beta1 = 0.5});
  for (const char* n : {"exp_avg", "exp_avg_sq_row", "exp_avg_sq_col", "exp_avg_res_row", "exp_avg_res_col"})
    CHECK_NOTHROW((void)came.state(0, n));
  CHECK(came.state(0, "exp_avg_res_row").shape == std::vector<std::int64_t>{2});
  CHECK(came.state(0, "exp_avg_res_col").shape == std::vector<std::int64_t>{3});
  CHECK(came.state(0, "exp_avg").shape == std::vector<std::int64_t>{2, 3});
  CHECK(came.state(1, "exp_avg_sq").shape == std::vector<std::int64_t>{3});
  CHECK_THROWS_WITH_AS((void)came.state(1, "exp_avg_sq_row"), doctest::Contains("has no state buffer 'exp_avg_sq_row'"),
                       lather::invalid_argument);
  CHECK(ada.state(0, "exp_avg_sq_row").shape == std::vector<std::int64_t>{2});
  CHECK(ada.state(0, "exp_avg").shape == std::vector<std::int64_t>{2, 3});
  // R, C and the element-wise buffers: 2 + 3 + 6 (exp_avg) + 3 + 3 (bias) doubles.
  CHECK(ada.state_bytes() == (2 + 3 + 6 + 3 + 3) * sizeof(double));
  // The two statistics of CAME are separate buffers (ColossalAI aliases them from step 2).
  pr.set_grads(0);
  came.step(ExecSpace(), pr.grads);
  pr.set_grads(1);
  came.step(ExecSpace(), pr.grads);
  CHECK(state_values(came.state(0, "exp_avg_sq_row")) != state_values(came.state(0, "exp_avg_res_row")));

  // A dictionary of other shapes is refused and changes nothing.
  Kokkos::View<double*, M> w32("w32", 6), b4("b4", 4), w6("w6", 6);
  std::vector<P> transposed{P(w32.data(), {3, 2}), P(pr.b.data(), {3})};
  lather::CAME<P, ExecSpace> other(transposed, {.lr = 0.01});
  const auto before = other.state_dict();
  CHECK_THROWS_WITH_AS(other.load_state_dict(came.state_dict()), doctest::Contains("has a different shape"),
                       lather::invalid_argument);
  CHECK(other.state_dict() == before);
  std::vector<P> flat{P(w6.data(), {6}), P(b4.data(), {4})};
  lather::CAME<P, ExecSpace> flat_opt(flat, {.lr = 0.01});
  CHECK_THROWS_WITH_AS(flat_opt.load_state_dict(came.state_dict()), doctest::Contains("load_state_dict"),
                       lather::invalid_argument);
  // Another optimizer's dictionary.
  CHECK_THROWS_WITH_AS(ada.load_state_dict(came.state_dict()), doctest::Contains("expected 'lather.Adafactor.v1'"),
                       lather::invalid_argument);
}

}  // namespace

TEST_CASE_TEMPLATE_DEFINE("adafactor/came: zero gradients stay finite and leave the parameters", ExecSpace,
                          factored_zero) {
  impl_test_zero_gradients<ExecSpace>();
}
TEST_CASE_TEMPLATE_APPLY(factored_zero, lather_test_exec_spaces);

TEST_CASE_TEMPLATE_DEFINE("adafactor/came: NaN gradients change nothing or skip the parameter", ExecSpace,
                          factored_nonfinite) {
  impl_test_nonfinite<ExecSpace>();
}
TEST_CASE_TEMPLATE_APPLY(factored_nonfinite, lather_test_exec_spaces);

TEST_CASE_TEMPLATE_DEFINE("adafactor/came: state buffers, dictionaries continue bitwise, other shapes refused",
                          ExecSpace, factored_state) {
  impl_test_state<ExecSpace>();
}
TEST_CASE_TEMPLATE_APPLY(factored_state, lather_test_exec_spaces);

TEST_CASE("adafactor/came: invalid options are named") {
  using doctest::Contains;
  using P = lather::TensorRef<double, Kokkos::HostSpace>;
  std::vector<double> w(6);
  std::vector<P> params{P(w.data(), {2, 3})};
  using A = lather::Adafactor<P, Kokkos::DefaultHostExecutionSpace>;
  using C = lather::CAME<P, Kokkos::DefaultHostExecutionSpace>;
  auto ada = [&](lather::AdafactorOptions o) { A opt(params, o); };
  auto came = [&](lather::CAMEOptions o) { C opt(params, o); };
  using E = lather::invalid_argument;
  CHECK_THROWS_WITH_AS(ada({.lr = 1e-3}), Contains("invalid option 'lr' = 0.001 (must be 0 with relative_step = true"), E);
  CHECK_THROWS_WITH_AS(ada({.relative_step = false}), Contains("invalid option 'lr' = 0 (must be > 0)"), E);
  CHECK_THROWS_WITH_AS(ada({.lr = 0.1, .relative_step = false, .warmup_init = true}),
                       Contains("'warmup_init' = true requires relative_step = true"), E);
  CHECK_THROWS_WITH_AS(ada({.eps = {0.0, 1e-3}}), Contains("invalid option 'eps[0]' = 0 (must be > 0)"), E);
  CHECK_THROWS_WITH_AS(ada({.eps = {1e-30, -1.0}}), Contains("invalid option 'eps[1]' = -1"), E);
  CHECK_THROWS_WITH_AS(ada({.clip_threshold = 0.0}), Contains("invalid option 'clip_threshold' = 0"), E);
  CHECK_THROWS_WITH_AS(ada({.decay_rate = 0.5}), Contains("invalid option 'decay_rate' = 0.5 (must be <= 0"), E);
  CHECK_THROWS_WITH_AS(ada({.decay_rate = std::numeric_limits<double>::quiet_NaN()}), Contains("'decay_rate'"), E);
  CHECK_THROWS_WITH_AS(ada({.beta1 = 1.0}), Contains("invalid option 'beta1' = 1 (must be in [0, 1))"), E);
  CHECK_THROWS_WITH_AS(ada({.weight_decay = -0.1}), Contains("invalid option 'weight_decay' = -0.1"), E);
  CHECK_NOTHROW(ada({.decay_rate = 0.0, .beta1 = 0.0}));
  CHECK_THROWS_WITH_AS(came({.lr = 0.0}), Contains("invalid option 'lr' = 0 (must be > 0)"), E);
  CHECK_THROWS_WITH_AS(came({.eps = {1e-30, 0.0}}), Contains("invalid option 'eps[1]' = 0 (must be > 0)"), E);
  CHECK_THROWS_WITH_AS(came({.betas = {0.9, 1.0, 0.9999}}), Contains("invalid option 'betas[1]' = 1"), E);
  CHECK_THROWS_WITH_AS(came({.betas = {0.9, 0.999, -0.1}}), Contains("invalid option 'betas[2]' = -0.1"), E);
  CHECK_THROWS_WITH_AS(came({.clip_threshold = -1.0}), Contains("invalid option 'clip_threshold' = -1"), E);
  CHECK_THROWS_WITH_AS(came({.weight_decay = -1.0}), Contains("invalid option 'weight_decay' = -1"), E);

  // A relative-step Adafactor has no learning rate to set; turning the first moment on needs a
  // new optimizer (it adds a buffer).
  A opt(params, lather::AdafactorOptions{});
  CHECK_THROWS_WITH_AS(opt.set_lr(0.1), Contains("must be 0 with relative_step = true"), E);
  CHECK_NOTHROW(opt.set_options(0, {.clip_threshold = 2.0}));
  CHECK_THROWS_WITH_AS(opt.set_options(0, {.beta1 = 0.9}), Contains("change the shape of the optimizer state"), E);
  A fixed(params, {.lr = 0.01, .relative_step = false});
  CHECK_NOTHROW(fixed.set_lr(0.001));
  CHECK(fixed.options().lr == 0.001);
}
