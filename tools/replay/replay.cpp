// SPDX-License-Identifier: Apache-2.0
// lather-replay: replays a recorded gradient stream (the conformance case format: case.json,
// initial parameters and gradients as .npy) through a lather optimizer and writes the parameter
// trajectories in the reference's layout; optionally compares them with an expected trajectory.
//
//   lather-replay CASE_DIR [--variant V] [--out DIR] [--compare DIR] [--rtol R] [--exec-space S]
//
// Users migrating from PyTorch record their own gradients in this format and prove equivalence.
// See docs/replay.md.
#include <lather/lather.hpp>
#include <lather/optimizers/shampoo.hpp>
#include <lather/root_inverse/root_inverse.hpp>

#include <Kokkos_Core.hpp>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>
#include <xtensor/xarray.hpp>
#include <xtensor/xnpy.hpp>
#include <xtensor/xview.hpp>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <optional>
#include <set>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

[[noreturn]] void fail(const std::string& msg) { throw std::runtime_error(msg); }

// ---- case.json ---------------------------------------------------------------------------------

struct Case {
  fs::path dir;
  json optimizer;
  std::vector<fs::path> params;
  json grads;  // list of files, or a template string
  int steps = 0;
  std::vector<std::string> variants;
};

void check_keys(const json& obj, const std::set<std::string>& allowed, const std::string& where) {
  if (!obj.is_object()) fail(where + " must be a JSON object");
  for (const auto& [key, value] : obj.items())
    if (!allowed.count(key)) {
      std::string list;
      for (const auto& a : allowed) list += (list.empty() ? "" : ", ") + a;
      fail(where + ": unknown key '" + key + "' (allowed: " + list + ")");
    }
}

Case read_case(const fs::path& dir) {
  const fs::path file = dir / "case.json";
  std::ifstream in(file);
  if (!in) fail("cannot open " + file.string() + ": is CASE_DIR a conformance case directory?");
  json j;
  try {
    j = json::parse(in);
  } catch (const json::parse_error& e) {
    fail(file.string() + ": invalid JSON: " + e.what());
  }
  Case c;
  c.dir = dir;
  for (const char* key : {"optimizer", "params", "steps", "grads"})
    if (!j.contains(key)) fail(file.string() + ": missing key '" + key + "'");
  c.optimizer = j.at("optimizer");
  if (!j.at("steps").is_number_integer() || j.at("steps").get<int>() < 0)
    fail(file.string() + ": 'steps' must be a non-negative integer");
  c.steps = j.at("steps").get<int>();
  for (const auto& p : j.at("params")) c.params.push_back(dir / p.get<std::string>());
  c.grads = j.at("grads");
  if (c.grads.is_array() && c.grads.size() != c.params.size())
    fail(file.string() + ": 'grads' lists " + std::to_string(c.grads.size()) + " files for " +
         std::to_string(c.params.size()) + " params");
  if (j.contains("variants"))
    for (const auto& v : j.at("variants")) c.variants.push_back(v.get<std::string>());
  else
    c.variants = {"float64"};
  return c;
}

template <class T>
xt::xarray<T> load(const fs::path& path) {
  if (!fs::exists(path)) fail("missing file " + path.string());
  try {
    std::ifstream in(path, std::ios::binary);
    // Accept float32 and float64 files whatever the variant: read with the file's own dtype.
    char header[10];
    in.read(header, 10);
    if (!in || std::string(header, 6) != "\x93NUMPY") fail(path.string() + ": not a .npy file");
    in.seekg(0);
    std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    const bool is_f4 = text.find("'<f4'") != std::string::npos && text.find("'<f4'") < 128;
    // The .npy header gives the shape; a file shorter (or longer) than header + data is corrupt.
    // (xtensor reads a truncated file without complaint, so this check is ours.)
    const auto major = static_cast<unsigned char>(text[6]);
    std::size_t header_end = 0;
    if (major == 1) {
      header_end = 10 + (static_cast<unsigned char>(text[8]) | (static_cast<unsigned char>(text[9]) << 8));
    } else if (major == 2 || major == 3) {
      if (text.size() < 12) fail(path.string() + ": truncated .npy header");
      header_end = 12 + (static_cast<std::size_t>(static_cast<unsigned char>(text[8])) |
                         (static_cast<std::size_t>(static_cast<unsigned char>(text[9])) << 8) |
                         (static_cast<std::size_t>(static_cast<unsigned char>(text[10])) << 16) |
                         (static_cast<std::size_t>(static_cast<unsigned char>(text[11])) << 24));
    } else {
      fail(path.string() + ": unsupported .npy format version " + std::to_string(major));
    }
    if (header_end > text.size()) fail(path.string() + ": truncated .npy header");
    std::istringstream s(text);
    xt::xarray<T> a = is_f4 ? xt::xarray<T>(xt::load_npy<float>(s)) : xt::xarray<T>(xt::load_npy<double>(s));
    const std::size_t want = header_end + a.size() * (is_f4 ? 4 : 8);
    if (text.size() != want)
      fail(path.string() + ": the file has " + std::to_string(text.size()) + " bytes but its header describes " +
           std::to_string(want) + " (truncated or corrupt .npy)");
    return a;
  } catch (const std::runtime_error& e) {
    const std::string what = e.what();
    if (what.rfind(path.string(), 0) == 0) throw;
    fail(path.string() + ": cannot read as a float32/float64 .npy array (" + what + ")");
  }
}

// The gradient of parameter i at step t (1-based), cast to T.
template <class T>
class Gradients {
 public:
  Gradients(const Case& c, const std::vector<std::vector<std::int64_t>>& shapes) : m_case(c), m_shapes(shapes) {
    if (c.grads.is_array()) {
      for (std::size_t i = 0; i < c.grads.size(); ++i) {
        auto g = load<T>(c.dir / c.grads[i].get<std::string>());
        std::vector<std::int64_t> want{c.steps};
        want.insert(want.end(), shapes[i].begin(), shapes[i].end());
        std::vector<std::int64_t> got(g.shape().begin(), g.shape().end());
        if (got != want)
          fail(c.grads[i].get<std::string>() + ": gradient stream has shape " + shape_str(got) + ", expected " +
               shape_str(want) + " (steps, *param.shape)");
        m_stacked.push_back(std::move(g));
      }
    } else if (!c.grads.is_string()) {
      fail("case.json: 'grads' must be a list of files or a template string like \"grads_{step}_{i}.npy\"");
    }
  }
  std::vector<T> at(int step, std::size_t i) const {
    if (!m_stacked.empty()) {
      auto row = xt::view(m_stacked[i], step - 1);
      return std::vector<T>(row.begin(), row.end());
    }
    std::string name = m_case.grads.get<std::string>();
    replace(name, "{step}", std::to_string(step));
    replace(name, "{i}", std::to_string(i));
    auto g = load<T>(m_case.dir / name);
    std::vector<std::int64_t> got(g.shape().begin(), g.shape().end());
    if (got != m_shapes[i]) fail(name + ": shape " + shape_str(got) + ", expected " + shape_str(m_shapes[i]));
    return std::vector<T>(g.begin(), g.end());
  }
  static std::string shape_str(const std::vector<std::int64_t>& s) {
    std::string r = "(";
    for (std::size_t k = 0; k < s.size(); ++k) r += (k ? ", " : "") + std::to_string(s[k]);
    return r + (s.size() == 1 ? ",)" : ")");
  }

 private:
  static void replace(std::string& s, const std::string& what, const std::string& with) {
    for (auto p = s.find(what); p != std::string::npos; p = s.find(what)) s.replace(p, what.size(), with);
  }
  const Case& m_case;
  std::vector<std::vector<std::int64_t>> m_shapes;
  std::vector<xt::xarray<T>> m_stacked;
};

// ---- options ---------------------------------------------------------------------------------

double number(const json& o, const char* key, double fallback) {
  if (!o.contains(key)) return fallback;
  if (!o.at(key).is_number()) fail(std::string("optimizer: '") + key + "' must be a number");
  return o.at(key).get<double>();
}
bool flag(const json& o, const char* key, bool fallback) {
  if (!o.contains(key)) return fallback;
  if (!o.at(key).is_boolean()) fail(std::string("optimizer: '") + key + "' must be true or false");
  return o.at(key).get<bool>();
}
std::int64_t int_or_inf(const json& o, const char* key, std::int64_t fallback) {
  if (!o.contains(key)) return fallback;
  const auto& v = o.at(key);
  if (v.is_string() && (v == "inf" || v == "Infinity")) return lather::unbounded;
  if (v.is_number_float() && std::isinf(v.get<double>())) return lather::unbounded;
  if (!v.is_number_integer()) fail(std::string("optimizer: '") + key + "' must be an integer or \"inf\"");
  return v.get<std::int64_t>();
}
std::array<double, 2> pair(const json& o, const char* key, std::array<double, 2> fallback) {
  if (!o.contains(key)) return fallback;
  const auto& v = o.at(key);
  if (!v.is_array() || v.size() != 2) fail(std::string("optimizer: '") + key + "' must be a list of two numbers");
  return {v[0].get<double>(), v[1].get<double>()};
}

lather::ShampooOptions shampoo_options(const json& o) {
  check_keys(o, {"name", "lr", "betas", "beta3", "epsilon", "momentum", "dampening", "use_nesterov", "weight_decay",
                 "use_decoupled_weight_decay", "weight_decay_type", "max_preconditioner_dim", "precondition_frequency",
                 "start_preconditioning_step", "use_bias_correction", "grafting", "root_inv",
                 "inverse_exponent_override", "target_parameter_dimensionality", "preconditioner",
                 "num_tolerated_failed_amortized_computations", "inv_root_override", "exponent_multiplier"},
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
  if (o.contains("preconditioner")) {
    const auto& p = o.at("preconditioner");
    if (!p.is_object() || !p.contains("type") || p.at("type") != "root_inv")
      fail("optimizer: preconditioner type " + (p.is_object() && p.contains("type") ? p.at("type").dump() : "?") +
           " is not implemented in this lather version (only \"root_inv\")");
  }
  return s;
}

// ---- running -----------------------------------------------------------------------------------

struct Result {
  std::vector<xt::xarray<double>> trajectories;  // (steps + 1, *shape) per parameter
};

template <class T, class ExecSpace, class MakeOpt>
Result run(const Case& c, MakeOpt&& make) {
  using M = typename ExecSpace::memory_space;
  using P = lather::TensorRef<T, M>;
  std::vector<std::vector<std::int64_t>> shapes;
  std::vector<Kokkos::View<T*, M>> storage, grad_storage;
  std::vector<P> params, grads;
  Result r;
  for (const auto& file : c.params) {
    auto p0 = load<T>(file);
    shapes.emplace_back(p0.shape().begin(), p0.shape().end());
    storage.emplace_back("param", p0.size());
    grad_storage.emplace_back("grad", p0.size());
    auto h = Kokkos::create_mirror_view(storage.back());
    std::copy(p0.begin(), p0.end(), h.data());
    Kokkos::deep_copy(storage.back(), h);
    params.emplace_back(storage.back().data(), shapes.back());
    grads.emplace_back(grad_storage.back().data(), shapes.back());
    std::vector<std::size_t> tshape{static_cast<std::size_t>(c.steps + 1)};
    for (auto e : shapes.back()) tshape.push_back(static_cast<std::size_t>(e));
    xt::xarray<double> traj = xt::zeros<double>(tshape);
    std::copy(p0.begin(), p0.end(), traj.begin());
    r.trajectories.push_back(std::move(traj));
  }
  Gradients<T> stream(c, shapes);
  auto opt = make(params);
  for (int t = 1; t <= c.steps; ++t) {
    for (std::size_t i = 0; i < params.size(); ++i) {
      const auto g = stream.at(t, i);
      auto h = Kokkos::create_mirror_view(grad_storage[i]);
      std::copy(g.begin(), g.end(), h.data());
      Kokkos::deep_copy(grad_storage[i], h);
    }
    opt.step(ExecSpace(), grads);
    for (std::size_t i = 0; i < params.size(); ++i) {
      auto h = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), storage[i]);
      const std::size_t n = h.extent(0);
      std::copy(h.data(), h.data() + n, r.trajectories[i].begin() + static_cast<std::ptrdiff_t>(n) * t);
    }
  }
  return r;
}

template <class T, class ExecSpace, class RootInverse>
Result run_shampoo_root(const Case& c, const lather::ShampooOptions& s, const RootInverse& root, const json& graft) {
  using M = typename ExecSpace::memory_space;
  using P = lather::TensorRef<T, M>;
  using Prec = lather::ShampooPrecision<T, T>;  // the variant's dtype for factors too (see docs/replay.md)
  check_keys(graft, {"type", "beta2", "epsilon"}, "optimizer.grafting");
  const std::string type = graft.value("type", "none");
  const double eps = number(graft, "epsilon", 1e-10);
  if (type == "none")
    return run<T, ExecSpace>(c, [&](std::vector<P>& p) {
      return lather::Shampoo<P, ExecSpace, RootInverse, lather::NoGrafting, Prec>(p, s, root, {});
    });
  if (type == "sgd")
    return run<T, ExecSpace>(c, [&](std::vector<P>& p) {
      return lather::Shampoo<P, ExecSpace, RootInverse, lather::SGDGrafting, Prec>(p, s, root, {});
    });
  if (type == "adagrad")
    return run<T, ExecSpace>(c, [&](std::vector<P>& p) {
      return lather::Shampoo<P, ExecSpace, RootInverse, lather::AdaGradGrafting, Prec>(p, s, root, {.epsilon = eps});
    });
  if (type == "rmsprop")
    return run<T, ExecSpace>(c, [&](std::vector<P>& p) {
      return lather::Shampoo<P, ExecSpace, RootInverse, lather::RMSpropGrafting, Prec>(
          p, s, root, {.beta2 = number(graft, "beta2", 0.99), .epsilon = eps});
    });
  if (type == "adam")
    return run<T, ExecSpace>(c, [&](std::vector<P>& p) {
      return lather::Shampoo<P, ExecSpace, RootInverse, lather::AdamGrafting, Prec>(
          p, s, root, {.beta2 = number(graft, "beta2", 0.999), .epsilon = eps});
    });
  fail("optimizer.grafting: unknown type '" + type + "' (none, sgd, adagrad, rmsprop, adam)");
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
  const std::string type = root.value("type", "eigh");
  if (type == "eigh") {
    check_keys(root, {"type"}, "optimizer.root_inv");
    return run_shampoo_root<T, ExecSpace>(c, s, lather::EigenRootInverse{}, graft);
  }
  if (type == "coupled_newton") {
    check_keys(root, {"type", "max_iterations", "tolerance"}, "optimizer.root_inv");
    lather::CoupledNewtonRootInverse r;
    r.max_iterations = static_cast<int>(number(root, "max_iterations", 100));
    r.tolerance = number(root, "tolerance", 1e-6);
    return run_shampoo_root<T, ExecSpace>(c, s, r, graft);
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
