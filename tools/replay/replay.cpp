// SPDX-License-Identifier: Apache-2.0
// lather-replay: replays a recorded gradient stream (the conformance case format: case.json,
// initial parameters and gradients as .npy) through a lather optimizer and writes the parameter
// trajectories in the reference's layout; optionally compares them with an expected trajectory.
//
//   lather-replay CASE_DIR [--variant V] [--out DIR] [--compare DIR] [--rtol R] [--exec-space S]
//
// Users migrating from PyTorch record their own gradients in this format and prove equivalence.
// See docs/replay.md.
#include "replay.hpp"

#include <CLI/CLI.hpp>

namespace {

using namespace replay;
namespace fs = std::filesystem;
using json = nlohmann::json;

lather::ShampooOptions shampoo_options(const json& o) {
  check_keys(o, {"name", "lr", "betas", "beta3", "epsilon", "momentum", "dampening", "use_nesterov", "weight_decay",
                 "use_decoupled_weight_decay", "weight_decay_type", "max_preconditioner_dim", "precondition_frequency",
                 "start_preconditioning_step", "use_bias_correction", "grafting", "root_inv",
                 "inverse_exponent_override", "target_parameter_dimensionality", "preconditioner",
                 "num_tolerated_failed_amortized_computations", "inv_root_override", "exponent_multiplier",
                 "iterate_averaging"},
             "optimizer");
  if (!o.contains("lr")) fail("optimizer: 'lr' is required");
  lather::ShampooOptions s;
  s.lr = number(o, "lr", 0);
  s.betas = pair(o, "betas", s.betas);
  s.beta3 = number(o, "beta3", s.beta3);
  s.epsilon = number(o, "epsilon", s.epsilon);
  s.momentum = number(o, "momentum", 0.0);
  s.dampening = number(o, "dampening", 0.0);
  s.use_nesterov = flag(o, "use_nesterov", false);
  s.weight_decay = number(o, "weight_decay", 0.0);
  s.weight_decay_type = flag(o, "use_decoupled_weight_decay", true) ? lather::WeightDecayType::decoupled
                                                                     : lather::WeightDecayType::l2;
  if (o.contains("weight_decay_type")) {
    const std::string t = o.at("weight_decay_type");
    if (t == "L2") s.weight_decay_type = lather::WeightDecayType::l2;
    else if (t == "DECOUPLED") s.weight_decay_type = lather::WeightDecayType::decoupled;
    else if (t == "CORRECTED") s.weight_decay_type = lather::WeightDecayType::corrected;
    else if (t == "INDEPENDENT") s.weight_decay_type = lather::WeightDecayType::independent;
    else fail("optimizer: 'weight_decay_type' must be L2, DECOUPLED, CORRECTED or INDEPENDENT");
  }
  s.max_preconditioner_dim = int_or_inf(o, "max_preconditioner_dim", 1024);
  s.precondition_frequency = int_or_inf(o, "precondition_frequency", 1);
  s.start_preconditioning_step = int_or_inf(o, "start_preconditioning_step", -1);
  s.use_bias_correction = flag(o, "use_bias_correction", true);
  s.target_parameter_dimensionality = int_or_inf(o, "target_parameter_dimensionality", 1);
  s.num_tolerated_failed_amortized_computations =
      static_cast<int>(number(o, "num_tolerated_failed_amortized_computations", 3));
  s.exponent_multiplier = number(o, "exponent_multiplier", 1.0);
  if (o.contains("inv_root_override")) {
    const auto& v = o.at("inv_root_override");
    if (v.is_number_integer()) s.inv_root_override = {v.get<int>()};
    else for (const auto& r : v) s.inv_root_override.push_back(r.get<int>());
  }
  if (o.contains("inverse_exponent_override")) {
    for (const auto& [order, value] : o.at("inverse_exponent_override").items()) {
      lather::InverseExponentOverride ov;
      if (value.is_number()) {
        ov.all = value.get<double>();
      } else if (value.is_object()) {
        for (const auto& [dim, e] : value.items()) ov.per_dimension[std::stoi(dim)] = e.get<double>();
      } else {
        fail("optimizer: inverse_exponent_override values must be numbers or {dim: number} objects");
      }
      s.inverse_exponent_override[std::stoi(order)] = ov;
    }
  }
  if (o.contains("iterate_averaging")) {
    // DistributedShampoo's iterate_averaging_config: {"type": "classic_momentum" | "generalized_primal_averaging"
    // | "schedule_free", ...its config's fields}.
    const json& a = o.at("iterate_averaging");
    if (!a.is_object() || !a.contains("type") || !a.at("type").is_string())
      fail("optimizer.iterate_averaging must be an object with a string 'type'");
    const std::string type = a.at("type");
    if (type == "classic_momentum") {
      check_keys(a, {"type", "momentum", "dampening", "use_nesterov"}, "optimizer.iterate_averaging");
      s.momentum = number(a, "momentum", 0.5);
      s.dampening = number(a, "dampening", 0.0);
      s.use_nesterov = flag(a, "use_nesterov", false);
    } else if (type == "generalized_primal_averaging") {
      check_keys(a, {"type", "eval_interp_coeff", "train_interp_coeff"}, "optimizer.iterate_averaging");
      s.iterate_averaging = lather::IterateAveraging::generalized_primal_averaging;
      s.eval_interp_coeff = number(a, "eval_interp_coeff", 0.9);
      s.train_interp_coeff = number(a, "train_interp_coeff", 0.8);
    } else if (type == "schedule_free") {
      check_keys(a, {"type", "train_interp_coeff", "eval_coeff_lr_power"}, "optimizer.iterate_averaging");
      s.iterate_averaging = lather::IterateAveraging::schedule_free;
      s.train_interp_coeff = number(a, "train_interp_coeff", 0.8);
      s.eval_coeff_lr_power = number(a, "eval_coeff_lr_power", 2.0);
    } else {
      fail("optimizer.iterate_averaging: unknown type '" + type +
           "' (classic_momentum, generalized_primal_averaging, schedule_free)");
    }
  }
  return s;
}

template <class T, class ExecSpace>
Result run_case(const Case& c) {
  using M = typename ExecSpace::memory_space;
  using P = lather::TensorRef<T, M>;
  const json& o = c.optimizer;
  const std::string name = o.value("name", "shampoo");
  auto require_all = [&](std::set<std::string> keys) {
    keys.insert("name");
    check_keys(o, keys, "optimizer");
  };
  if (name == "sgd") {
    require_all({"lr", "momentum", "dampening", "weight_decay", "nesterov", "maximize"});
    if (!o.contains("lr")) fail("optimizer: 'lr' is required for sgd");
    lather::SGDOptions s{.lr = number(o, "lr", 0), .momentum = number(o, "momentum", 0), .dampening = number(o, "dampening", 0),
                         .weight_decay = number(o, "weight_decay", 0), .nesterov = flag(o, "nesterov", false),
                         .maximize = flag(o, "maximize", false)};
    return run<T, ExecSpace>(c, [&](std::vector<P>& p) { return lather::SGD<P, ExecSpace>(p, s); });
  }
  if (name == "adagrad") {
    require_all({"lr", "lr_decay", "weight_decay", "initial_accumulator_value", "eps", "maximize"});
    lather::AdagradOptions s{.lr = number(o, "lr", 1e-2), .lr_decay = number(o, "lr_decay", 0),
                             .weight_decay = number(o, "weight_decay", 0),
                             .initial_accumulator_value = number(o, "initial_accumulator_value", 0),
                             .eps = number(o, "eps", 1e-10), .maximize = flag(o, "maximize", false)};
    return run<T, ExecSpace>(c, [&](std::vector<P>& p) { return lather::Adagrad<P, ExecSpace>(p, s); });
  }
  if (name == "rmsprop") {
    require_all({"lr", "alpha", "eps", "weight_decay", "momentum", "centered", "maximize"});
    lather::RMSpropOptions s{.lr = number(o, "lr", 1e-2), .alpha = number(o, "alpha", 0.99), .eps = number(o, "eps", 1e-8),
                             .weight_decay = number(o, "weight_decay", 0), .momentum = number(o, "momentum", 0),
                             .centered = flag(o, "centered", false), .maximize = flag(o, "maximize", false)};
    return run<T, ExecSpace>(c, [&](std::vector<P>& p) { return lather::RMSprop<P, ExecSpace>(p, s); });
  }
  if (name == "adam" || name == "adamw") {
    require_all({"lr", "betas", "eps", "weight_decay", "amsgrad", "maximize"});
    const auto betas = pair(o, "betas", {0.9, 0.999});
    if (name == "adam") {
      lather::AdamOptions s{.lr = number(o, "lr", 1e-3), .betas = betas, .eps = number(o, "eps", 1e-8),
                            .weight_decay = number(o, "weight_decay", 0), .amsgrad = flag(o, "amsgrad", false),
                            .maximize = flag(o, "maximize", false)};
      return run<T, ExecSpace>(c, [&](std::vector<P>& p) { return lather::Adam<P, ExecSpace>(p, s); });
    }
    lather::AdamWOptions s{.lr = number(o, "lr", 1e-3), .betas = betas, .eps = number(o, "eps", 1e-8),
                           .weight_decay = number(o, "weight_decay", 1e-2), .amsgrad = flag(o, "amsgrad", false),
                           .maximize = flag(o, "maximize", false)};
    return run<T, ExecSpace>(c, [&](std::vector<P>& p) { return lather::AdamW<P, ExecSpace>(p, s); });
  }
  if (name != "shampoo")
    fail("optimizer: unknown name '" + name + "' (shampoo, sgd, adagrad, rmsprop, adam, adamw)");
  const lather::ShampooOptions s = shampoo_options(o);
  const json graft = o.value("grafting", json{{"type", "none"}});
  const json root = o.value("root_inv", json{{"type", "eigh"}});
  const json pre = o.value("preconditioner", json{{"type", "root_inv"}});
  if (!pre.is_object() || !pre.contains("type") || !pre.at("type").is_string())
    fail("optimizer.preconditioner must be an object with a string 'type'");
  const std::string pre_type = pre.at("type");
  if (pre_type != "root_inv" && o.contains("root_inv") && pre_type != "root_inv_kl")
    fail("optimizer: 'root_inv' is only allowed with preconditioner type root_inv or root_inv_kl");
  constexpr bool single = std::is_same_v<T, float>;
  if (pre_type == "eigenvalue_corrected" || pre_type == "eigendecomposed" || pre_type == "eigendecomposed_kl")
    return run_eigen_family(c, s, pre, graft, single, ExecSpace::name());
  if (pre_type != "root_inv") return run_other_family(c, s, pre, root, graft, single, ExecSpace::name());
  check_keys(pre, {"type"}, "optimizer.preconditioner");
  const std::string type = root.value("type", "eigh");
  if (type == "eigh") {
    check_keys(root, {"type"}, "optimizer.root_inv");
    return run_shampoo<T, ExecSpace>(c, s, lather::EigenRootInverse{}, graft);
  }
  if (type == "coupled_newton") {
    check_keys(root, {"type", "max_iterations", "tolerance"}, "optimizer.root_inv");
    lather::CoupledNewtonRootInverse r;
    r.max_iterations = static_cast<int>(number(root, "max_iterations", 100));
    r.tolerance = number(root, "tolerance", 1e-6);
    return run_shampoo<T, ExecSpace>(c, s, r, graft);
  }
  fail("optimizer.root_inv: unknown type '" + type + "' (eigh, coupled_newton)");
}

void write_npy(const fs::path& path, const xt::xarray<double>& a, bool as_float) {
  if (as_float) xt::dump_npy(path.string(), xt::xarray<float>(xt::cast<float>(a)));
  else xt::dump_npy(path.string(), a);
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"lather-replay: replay a recorded gradient stream through a lather optimizer"};
  std::string case_dir, variant, out_dir, compare_dir, space = "default";
  double rtol = -1;
  app.add_option("CASE_DIR", case_dir, "conformance case directory (with case.json)")->required();
  app.add_option("--variant", variant, "float64_fp64scalars, float64 or float32 (default: the case's first)");
  app.add_option("--out", out_dir, "write params_<i>.npy here (default: no output files)");
  app.add_option("--compare", compare_dir, "compare with the params_<i>.npy in this directory "
                                           "(default: CASE_DIR/out/<variant> when it exists)");
  app.add_option("--rtol", rtol, "fail (exit 1) when the largest relative difference exceeds this");
  app.add_option("--exec-space", space, "default, serial or openmp (those enabled in Kokkos)");
  CLI11_PARSE(app, argc, argv);

  Kokkos::ScopeGuard guard(argc, argv);
  try {
    const Case c = read_case(case_dir);
    if (variant.empty()) variant = c.variants.front();
    if (variant != "float64_fp64scalars" && variant != "float64" && variant != "float32")
      fail("--variant must be float64_fp64scalars, float64 or float32, got '" + variant + "'");
    const bool single = variant == "float32";
    Result r;
    auto dispatch = [&](auto exec) {
      using E = decltype(exec);
      r = single ? run_case<float, E>(c) : run_case<double, E>(c);
    };
    if (space == "default") dispatch(Kokkos::DefaultExecutionSpace());
#ifdef KOKKOS_ENABLE_SERIAL
    else if (space == "serial") dispatch(Kokkos::Serial());
#endif
#ifdef KOKKOS_ENABLE_OPENMP
    else if (space == "openmp") dispatch(Kokkos::OpenMP());
#endif
    else fail("--exec-space '" + space + "' is not enabled in this Kokkos build");

    if (!out_dir.empty()) {
      fs::create_directories(out_dir);
      for (std::size_t i = 0; i < r.trajectories.size(); ++i)
        write_npy(fs::path(out_dir) / ("params_" + std::to_string(i) + ".npy"), r.trajectories[i], single);
      std::printf("wrote %zu trajectories to %s\n", r.trajectories.size(), out_dir.c_str());
    }
    fs::path expected_dir = compare_dir.empty() ? fs::path(case_dir) / "out" / variant : fs::path(compare_dir);
    if (!fs::exists(expected_dir)) {
      if (!compare_dir.empty()) fail("--compare directory " + compare_dir + " does not exist");
      std::printf("no expected trajectory at %s: nothing compared\n", expected_dir.c_str());
      return 0;
    }
    double worst = 0;
    for (std::size_t i = 0; i < r.trajectories.size(); ++i) {
      const auto expected = load<double>(expected_dir / ("params_" + std::to_string(i) + ".npy"));
      if (expected.shape() != r.trajectories[i].shape()) fail("expected params_" + std::to_string(i) + ".npy has a different shape");
      // Relative to the trajectory's scale, so entries near zero do not dominate.
      const double scale = std::max(1e-30, xt::amax(xt::abs(expected))());
      const double diff = xt::amax(xt::abs(expected - r.trajectories[i]))() / scale;
      std::printf("param %zu: largest difference / max|expected| = %.3e\n", i, diff);
      worst = std::max(worst, diff);
    }
    std::printf("%s %s: largest relative difference %.3e\n", c.dir.filename().c_str(), variant.c_str(), worst);
    if (rtol >= 0 && !(worst <= rtol)) {
      std::printf("FAILED: above --rtol %.1e\n", rtol);
      return 1;
    }
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "lather-replay: %s\n", e.what());
    return 2;
  }
}
