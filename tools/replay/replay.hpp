// SPDX-License-Identifier: Apache-2.0
// lather-replay's shared parts: the case format, .npy reading, option helpers and the replay loop,
// used by replay.cpp (main, torch.optim and root-inverse Shampoo) and the Shampoo-family
// translation units (split so the many Shampoo instantiations build in parallel).
#ifndef LATHER_TOOLS_REPLAY_REPLAY_HPP
#define LATHER_TOOLS_REPLAY_REPLAY_HPP

#include <lather/lather.hpp>
#include <lather/optimizers/shampoo.hpp>
#include <lather/root_inverse/root_inverse.hpp>

#include <Kokkos_Core.hpp>

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

namespace replay {

namespace fs = std::filesystem;
using json = nlohmann::json;

[[noreturn]] inline void fail(const std::string& msg) { throw std::runtime_error(msg); }

// ---- case.json ---------------------------------------------------------------------------------

struct Case {
  fs::path dir;
  json optimizer;
  std::vector<fs::path> params;
  json grads;  // list of files, or a template string
  int steps = 0;
  std::vector<std::string> variants;
};

inline void check_keys(const json& obj, const std::set<std::string>& allowed, const std::string& where) {
  if (!obj.is_object()) fail(where + " must be a JSON object");
  for (const auto& [key, value] : obj.items())
    if (!allowed.count(key)) {
      std::string list;
      for (const auto& a : allowed) list += (list.empty() ? "" : ", ") + a;
      fail(where + ": unknown key '" + key + "' (allowed: " + list + ")");
    }
}

inline Case read_case(const fs::path& dir) {
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

inline double number(const json& o, const char* key, double fallback) {
  if (!o.contains(key)) return fallback;
  if (!o.at(key).is_number()) fail(std::string("optimizer: '") + key + "' must be a number");
  return o.at(key).get<double>();
}
inline bool flag(const json& o, const char* key, bool fallback) {
  if (!o.contains(key)) return fallback;
  if (!o.at(key).is_boolean()) fail(std::string("optimizer: '") + key + "' must be true or false");
  return o.at(key).get<bool>();
}
inline std::int64_t int_or_inf(const json& o, const char* key, std::int64_t fallback) {
  if (!o.contains(key)) return fallback;
  const auto& v = o.at(key);
  if (v.is_string() && (v == "inf" || v == "Infinity")) return lather::unbounded;
  if (v.is_number_float() && std::isinf(v.get<double>())) return lather::unbounded;
  if (!v.is_number_integer()) fail(std::string("optimizer: '") + key + "' must be an integer or \"inf\"");
  return v.get<std::int64_t>();
}
inline std::array<double, 2> pair(const json& o, const char* key, std::array<double, 2> fallback) {
  if (!o.contains(key)) return fallback;
  const auto& v = o.at(key);
  if (!v.is_array() || v.size() != 2) fail(std::string("optimizer: '") + key + "' must be a list of two numbers");
  return {v[0].get<double>(), v[1].get<double>()};
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

/// Shampoo with one grafting method chosen at run time (`allowed`: the graftings compiled in).
template <class T, class ExecSpace, class Preconditioner>
Result run_shampoo(const Case& c, const lather::ShampooOptions& s, const Preconditioner& pre, const json& graft,
                   const std::set<std::string>& allowed = {"none", "sgd", "adagrad", "rmsprop", "adam"}) {
  using M = typename ExecSpace::memory_space;
  using P = lather::TensorRef<T, M>;
  using Prec = lather::ShampooPrecision<T, T>;  // the variant's dtype for factors too (see docs/replay.md)
  check_keys(graft, {"type", "beta2", "epsilon"}, "optimizer.grafting");
  const std::string type = graft.value("type", "none");
  const double eps = number(graft, "epsilon", 1e-10);
  if (!allowed.count(type) &&
      std::set<std::string>{"none", "sgd", "adagrad", "rmsprop", "adam"}.count(type))
    fail("optimizer.grafting: '" + type + "' with this preconditioner is not compiled into lather-replay (it "
         "supports grafting none and adam with the Shampoo family, to bound its build time; the library "
         "supports every combination)");
  if (type == "none")
    return run<T, ExecSpace>(c, [&](std::vector<P>& p) {
      return lather::Shampoo<P, ExecSpace, Preconditioner, lather::NoGrafting, Prec>(p, s, pre, {});
    });
  if (type == "adam")
    return run<T, ExecSpace>(c, [&](std::vector<P>& p) {
      return lather::Shampoo<P, ExecSpace, Preconditioner, lather::AdamGrafting, Prec>(
          p, s, pre, {.beta2 = number(graft, "beta2", 0.999), .epsilon = eps});
    });
  if constexpr (lather::concepts::RootInverseStrategy<Preconditioner>) {
    if (type == "sgd")
      return run<T, ExecSpace>(c, [&](std::vector<P>& p) {
        return lather::Shampoo<P, ExecSpace, Preconditioner, lather::SGDGrafting, Prec>(p, s, pre, {});
      });
    if (type == "adagrad")
      return run<T, ExecSpace>(c, [&](std::vector<P>& p) {
        return lather::Shampoo<P, ExecSpace, Preconditioner, lather::AdaGradGrafting, Prec>(p, s, pre, {.epsilon = eps});
      });
    if (type == "rmsprop")
      return run<T, ExecSpace>(c, [&](std::vector<P>& p) {
        return lather::Shampoo<P, ExecSpace, Preconditioner, lather::RMSpropGrafting, Prec>(
            p, s, pre, {.beta2 = number(graft, "beta2", 0.99), .epsilon = eps});
      });
  }
  fail("optimizer.grafting: unknown type '" + type + "' (none, sgd, adagrad, rmsprop, adam)");
}

/// Runs f(space) on the execution space named `name` (ExecSpace::name()).
template <class F>
Result on_space(const std::string& name, F&& f) {
  if (name == Kokkos::DefaultExecutionSpace::name()) return f(Kokkos::DefaultExecutionSpace());
#ifdef KOKKOS_ENABLE_SERIAL
  if (name == Kokkos::Serial::name()) return f(Kokkos::Serial());
#endif
#ifdef KOKKOS_ENABLE_OPENMP
  if (name == Kokkos::OpenMP::name()) return f(Kokkos::OpenMP());
#endif
  fail("execution space '" + name + "' is not enabled");
}

/// The Shampoo family (optimizer.preconditioner other than root_inv), in their own translation units.
Result run_eigen_family(const Case& c, const lather::ShampooOptions& s, const json& pre, const json& graft,
                        bool single, const std::string& space);
Result run_other_family(const Case& c, const lather::ShampooOptions& s, const json& pre, const json& root_inv,
                        const json& graft, bool single, const std::string& space);

}  // namespace replay

#endif
