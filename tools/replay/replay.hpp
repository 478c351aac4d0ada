// SPDX-License-Identifier: Apache-2.0
// lather-replay's shared parts: the case format, .npy reading, option helpers and the replay loop,
// used by replay.cpp (main, torch.optim and root-inverse Shampoo) and the Shampoo-family
// translation units (split so the many Shampoo instantiations build in parallel).
#ifndef LATHER_TOOLS_REPLAY_REPLAY_HPP
#define LATHER_TOOLS_REPLAY_REPLAY_HPP

#include <lather/lather.hpp>
#include <lather/optimizers/adafactor.hpp>
#include <lather/optimizers/came.hpp>
#include <lather/optimizers/galore.hpp>
#include <lather/optimizers/lamb.hpp>
#include <lather/optimizers/shampoo.hpp>
#include <lather/root_inverse/root_inverse.hpp>

#include <Kokkos_Core.hpp>

#include <nlohmann/json.hpp>
#include <xtensor/xarray.hpp>
#include <xtensor/xnpy.hpp>
#include <xtensor/xview.hpp>

#include <charconv>
#include <cmath>
#include <cstring>
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
#include <string_view>
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

/// Parses case.json's text (`file` names it in messages); paths are relative to `dir`.
inline Case parse_case(const std::string& text, const fs::path& dir, const std::string& file) {
  json j;
  try {
    j = json::parse(text);
  } catch (const json::exception& e) {  // parse_error, and out_of_range for numbers such as 1e309
    fail(file + ": invalid JSON: " + e.what());
  }
  if (!j.is_object()) fail(file + ": must be a JSON object");
  Case c;
  c.dir = dir;
  try {
    for (const char* key : {"optimizer", "params", "steps", "grads"})
      if (!j.contains(key)) fail(file + ": missing key '" + key + "'");
    c.optimizer = j.at("optimizer");
    if (!c.optimizer.is_object()) fail(file + ": 'optimizer' must be a JSON object");
    const json& steps = j.at("steps");
    if (!steps.is_number_integer() || (steps.is_number_unsigned() ? steps.get<std::uint64_t>() > 1000000000u
                                                                   : steps.get<std::int64_t>() < 0 ||
                                                                         steps.get<std::int64_t>() > 1000000000))
      fail(file + ": 'steps' must be a non-negative integer (at most 1e9)");
    c.steps = steps.get<int>();
    if (!j.at("params").is_array()) fail(file + ": 'params' must be a list of .npy file names");
    for (const auto& p : j.at("params")) c.params.push_back(dir / p.get<std::string>());
    c.grads = j.at("grads");
    if (c.grads.is_array() && c.grads.size() != c.params.size())
      fail(file + ": 'grads' lists " + std::to_string(c.grads.size()) + " files for " +
           std::to_string(c.params.size()) + " params");
    if (c.grads.is_array())
      for (const auto& g : c.grads)
        if (!g.is_string()) fail(file + ": 'grads' must list .npy file names");
    if (j.contains("variants")) {
      if (!j.at("variants").is_array()) fail(file + ": 'variants' must be a list of strings");
      for (const auto& v : j.at("variants")) c.variants.push_back(v.get<std::string>());
    }
    if (c.variants.empty()) c.variants = {"float64"};
  } catch (const json::exception& e) {
    fail(file + ": " + e.what());
  }
  return c;
}

inline Case read_case(const fs::path& dir) {
  const fs::path file = dir / "case.json";
  std::ifstream in(file);
  if (!in) fail("cannot open " + file.string() + ": is CASE_DIR a conformance case directory?");
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  return parse_case(text, dir, file.string());
}

// ---- .npy --------------------------------------------------------------------------------------
// A hand-checked reader for what the tool needs: version 1, 2 or 3 headers, little-endian float32
// or float64, C order. Every size is checked against the bytes present before anything is
// allocated (xtensor's reader trusts the header's shape; tests/fuzz/fuzz_npy.cpp).

namespace npy {

struct Header {
  bool is_f4 = false;
  std::vector<std::size_t> shape;
  std::size_t data_offset = 0;
};

class HeaderParser {
 public:
  HeaderParser(std::string_view text, const std::string& name) : m_text(text), m_name(name) {}
  Header parse() {
    Header h;
    bool have_descr = false, have_order = false, have_shape = false;
    expect('{');
    for (;;) {
      skip_space();
      if (peek() == '}') break;
      const std::string key = quoted();
      expect(':');
      if (key == "descr") {
        const std::string d = quoted();
        if (d == "<f4") h.is_f4 = true;
        else if (d != "<f8") bad("unsupported dtype '" + d + "' (little-endian float32 '<f4' or float64 '<f8')");
        have_descr = true;
      } else if (key == "fortran_order") {
        skip_space();
        if (m_text.substr(m_pos, 5) == "False") m_pos += 5;
        else if (m_text.substr(m_pos, 4) == "True") bad("Fortran-order arrays are not supported (write C order)");
        else bad("'fortran_order' must be True or False");
        have_order = true;
      } else if (key == "shape") {
        expect('(');
        for (;;) {
          skip_space();
          if (peek() == ')') break;
          h.shape.push_back(integer());
          skip_space();
          if (peek() == ',') ++m_pos;
          else if (peek() != ')') bad("malformed 'shape'");
          if (h.shape.size() > 32) bad("'shape' has more than 32 dimensions");
        }
        ++m_pos;
        have_shape = true;
      } else {
        bad("unknown header key '" + key + "'");
      }
      skip_space();
      if (peek() == ',') ++m_pos;
      else if (peek() != '}') bad("malformed header dictionary");
    }
    if (!have_descr || !have_order || !have_shape) bad("the header lacks 'descr', 'fortran_order' or 'shape'");
    return h;
  }

 private:
  [[noreturn]] void bad(const std::string& what) const { fail(m_name + ": invalid .npy header: " + what); }
  char peek() const {
    if (m_pos >= m_text.size()) bad("it ends early");
    return m_text[m_pos];
  }
  void skip_space() {
    while (m_pos < m_text.size() && (m_text[m_pos] == ' ' || m_text[m_pos] == '\n' || m_text[m_pos] == '\t')) ++m_pos;
  }
  void expect(char c) {
    skip_space();
    if (peek() != c) bad(std::string("expected '") + c + "'");
    ++m_pos;
  }
  std::string quoted() {
    skip_space();
    const char q = peek();
    if (q != '\'' && q != '"') bad("expected a quoted string");
    const auto close = m_text.find(q, m_pos + 1);
    if (close == std::string_view::npos) bad("unterminated string");
    std::string s(m_text.substr(m_pos + 1, close - m_pos - 1));
    m_pos = close + 1;
    return s;
  }
  std::size_t integer() {
    std::size_t v = 0, digits = 0;
    while (m_pos < m_text.size() && m_text[m_pos] >= '0' && m_text[m_pos] <= '9') {
      const auto d = static_cast<std::size_t>(m_text[m_pos] - '0');
      if (v > (std::numeric_limits<std::size_t>::max() - d) / 10) bad("an extent in 'shape' is too large");
      v = v * 10 + d;
      ++m_pos;
      ++digits;
    }
    if (digits == 0) bad("'shape' must hold non-negative integers");
    return v;
  }
  std::string_view m_text;
  std::string m_name;
  std::size_t m_pos = 0;
};

}  // namespace npy

/// Parses a float32/float64 .npy file's bytes (`name` names it in messages), cast to T.
template <class T>
xt::xarray<T> parse_npy(std::string_view text, const std::string& name) {
  if (text.size() < 10 || text.substr(0, 6) != "\x93NUMPY") fail(name + ": not a .npy file");
  const auto byte = [&](std::size_t i) { return static_cast<std::size_t>(static_cast<unsigned char>(text[i])); };
  const std::size_t major = byte(6);
  std::size_t header_start = 0, header_len = 0;
  if (major == 1) {
    header_start = 10;
    header_len = byte(8) | (byte(9) << 8);
  } else if (major == 2 || major == 3) {
    if (text.size() < 12) fail(name + ": truncated .npy header");
    header_start = 12;
    header_len = byte(8) | (byte(9) << 8) | (byte(10) << 16) | (byte(11) << 24);
  } else {
    fail(name + ": unsupported .npy format version " + std::to_string(major));
  }
  if (header_len > text.size() - header_start) fail(name + ": truncated .npy header");
  const std::size_t header_end = header_start + header_len;
  const npy::Header h = npy::HeaderParser(text.substr(header_start, header_len), name).parse();
  // A file shorter (or longer) than header + data is corrupt; checked before allocating.
  const std::size_t element = h.is_f4 ? 4 : 8;
  const std::size_t data = text.size() - header_end;
  // An empty array (a zero extent) still gets strides from the other extents: their product must
  // stay addressable, or building the array overflows (found by fuzz_npy: shape (2^41, 0, ...)).
  std::size_t nonzero = 1;
  for (const auto e : h.shape) {
    if (e == 0) continue;
    if (nonzero > static_cast<std::size_t>(std::numeric_limits<std::ptrdiff_t>::max()) / element / e)
      fail(name + ": the shape in its header is too large to address (corrupt .npy)");
    nonzero *= e;
  }
  std::size_t numel = 1;
  bool fits = true;
  for (const auto e : h.shape) {
    if (e == 0) { numel = 0; fits = true; break; }
    if (!fits || numel > data / element / e) fits = false;
    else numel *= e;
  }
  if (!fits || numel * element != data)
    fail(name + ": the file has " + std::to_string(text.size()) + " bytes but its header describes " +
         (fits ? std::to_string(header_end + numel * element) : std::string("far more")) +
         " (truncated or corrupt .npy)");
  xt::xarray<T> a = xt::xarray<T>::from_shape(h.shape);
  const char* p = text.data() + header_end;
  for (std::size_t k = 0; k < numel; ++k) {
    if (h.is_f4) {
      float v;
      std::memcpy(&v, p + 4 * k, 4);
      a.data()[k] = static_cast<T>(v);
    } else {
      double v;
      std::memcpy(&v, p + 8 * k, 8);
      a.data()[k] = static_cast<T>(v);
    }
  }
  return a;
}

template <class T>
xt::xarray<T> load(const fs::path& path) {
  if (!fs::exists(path)) fail("missing file " + path.string());
  std::ifstream in(path, std::ios::binary);
  if (!in) fail("cannot open " + path.string());
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  return parse_npy<T>(text, path.string());
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
  if (!v.is_array() || v.size() != 2 || !v[0].is_number() || !v[1].is_number())
    fail(std::string("optimizer: '") + key + "' must be a list of two numbers");
  return {v[0].get<double>(), v[1].get<double>()};
}
/// A JSON number with an integral value that fits an int (5 and 5.0 are both 5).
inline int to_int(const json& v, const std::string& what) {
  if (!v.is_number()) fail(what + " must be an integer");
  if (v.is_number_float()) {
    const double d = v.get<double>();
    if (!(d >= std::numeric_limits<int>::min() && d <= std::numeric_limits<int>::max()) || d != std::floor(d))
      fail(what + " must be an integer in the range of int");
    return static_cast<int>(d);
  }
  if (v.is_number_unsigned() ? v.get<std::uint64_t>() > static_cast<std::uint64_t>(std::numeric_limits<int>::max())
                             : (v.get<std::int64_t>() < std::numeric_limits<int>::min() ||
                                v.get<std::int64_t>() > std::numeric_limits<int>::max()))
    fail(what + " must be an integer in the range of int");
  return static_cast<int>(v.get<std::int64_t>());
}
inline int whole(const json& o, const char* key, int fallback, const std::string& where = "optimizer") {
  if (!o.contains(key)) return fallback;
  return to_int(o.at(key), where + ": '" + key + "'");
}
/// A JSON object key that names an integer (a tensor order or dimension), e.g. "2".
inline int key_int(const std::string& key, const std::string& what) {
  int v = 0;
  const auto [end, ec] = std::from_chars(key.data(), key.data() + key.size(), v);
  if (ec != std::errc() || end != key.data() + key.size() || key.empty())
    fail(what + ": key '" + key + "' must be an integer");
  return v;
}

// ---- the optimizer section: case.json -> lather options ------------------------------------------

inline lather::ShampooOptions shampoo_options(const json& o) {
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
    const json& t = o.at("weight_decay_type");
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
  s.num_tolerated_failed_amortized_computations = whole(o, "num_tolerated_failed_amortized_computations", 3);
  s.exponent_multiplier = number(o, "exponent_multiplier", 1.0);
  if (o.contains("inv_root_override")) {
    const auto& v = o.at("inv_root_override");
    if (v.is_array()) {
      for (const auto& r : v) s.inv_root_override.push_back(to_int(r, "optimizer: 'inv_root_override' entries"));
    } else {
      s.inv_root_override = {to_int(v, "optimizer: 'inv_root_override'")};
    }
  }
  if (o.contains("inverse_exponent_override")) {
    const json& overrides = o.at("inverse_exponent_override");
    if (!overrides.is_object()) fail("optimizer: 'inverse_exponent_override' must be an object {order: exponent}");
    for (const auto& [order, value] : overrides.items()) {
      lather::InverseExponentOverride ov;
      if (value.is_number()) {
        ov.all = value.get<double>();
      } else if (value.is_object()) {
        for (const auto& [dim, e] : value.items()) {
          if (!e.is_number()) fail("optimizer: inverse_exponent_override values must be numbers");
          ov.per_dimension[key_int(dim, "optimizer.inverse_exponent_override")] = e.get<double>();
        }
      } else {
        fail("optimizer: inverse_exponent_override values must be numbers or {dim: number} objects");
      }
      s.inverse_exponent_override[key_int(order, "optimizer.inverse_exponent_override")] = ov;
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

/// case.json's optimizer section as lather options: `name` says which of them applies. The
/// Shampoo family's preconditioner details are read where they are instantiated (family_*.cpp).
struct OptimizerConfig {
  std::string name;
  lather::SGDOptions sgd;
  lather::AdagradOptions adagrad;
  lather::RMSpropOptions rmsprop;
  lather::AdamOptions adam;
  lather::AdamWOptions adamw;
  lather::ShampooOptions shampoo;
  lather::AdafactorOptions adafactor;
  lather::CAMEOptions came;
  lather::GaLoreOptions galore;
  lather::LambOptions lamb;
  json grafting, root_inv, preconditioner;
  std::string preconditioner_type;
};

inline OptimizerConfig parse_optimizer(const json& o) {
  if (!o.is_object()) fail("optimizer must be a JSON object");
  OptimizerConfig cfg;
  try {
    const json& name = o.contains("name") ? o.at("name") : json("shampoo");
    if (!name.is_string()) fail("optimizer: 'name' must be a string");
    cfg.name = name.get<std::string>();
    auto require_all = [&](std::set<std::string> keys) {
      keys.insert("name");
      check_keys(o, keys, "optimizer");
    };
    if (cfg.name == "sgd") {
      require_all({"lr", "momentum", "dampening", "weight_decay", "nesterov", "maximize"});
      if (!o.contains("lr")) fail("optimizer: 'lr' is required for sgd");
      cfg.sgd = {.lr = number(o, "lr", 0), .momentum = number(o, "momentum", 0), .dampening = number(o, "dampening", 0),
                 .weight_decay = number(o, "weight_decay", 0), .nesterov = flag(o, "nesterov", false),
                 .maximize = flag(o, "maximize", false)};
    } else if (cfg.name == "adagrad") {
      require_all({"lr", "lr_decay", "weight_decay", "initial_accumulator_value", "eps", "maximize"});
      cfg.adagrad = {.lr = number(o, "lr", 1e-2), .lr_decay = number(o, "lr_decay", 0),
                     .weight_decay = number(o, "weight_decay", 0),
                     .initial_accumulator_value = number(o, "initial_accumulator_value", 0),
                     .eps = number(o, "eps", 1e-10), .maximize = flag(o, "maximize", false)};
    } else if (cfg.name == "rmsprop") {
      require_all({"lr", "alpha", "eps", "weight_decay", "momentum", "centered", "maximize"});
      cfg.rmsprop = {.lr = number(o, "lr", 1e-2), .alpha = number(o, "alpha", 0.99), .eps = number(o, "eps", 1e-8),
                     .weight_decay = number(o, "weight_decay", 0), .momentum = number(o, "momentum", 0),
                     .centered = flag(o, "centered", false), .maximize = flag(o, "maximize", false)};
    } else if (cfg.name == "adam" || cfg.name == "adamw") {
      require_all({"lr", "betas", "eps", "weight_decay", "amsgrad", "maximize"});
      const auto betas = pair(o, "betas", {0.9, 0.999});
      cfg.adam = {.lr = number(o, "lr", 1e-3), .betas = betas, .eps = number(o, "eps", 1e-8),
                  .weight_decay = number(o, "weight_decay", 0), .amsgrad = flag(o, "amsgrad", false),
                  .maximize = flag(o, "maximize", false)};
      cfg.adamw = {.lr = number(o, "lr", 1e-3), .betas = betas, .eps = number(o, "eps", 1e-8),
                   .weight_decay = number(o, "weight_decay", 1e-2), .amsgrad = flag(o, "amsgrad", false),
                   .maximize = flag(o, "maximize", false)};
    } else if (cfg.name == "adafactor") {
      // HuggingFace's names; null lr / beta1 are HF's None.
      require_all({"lr", "eps", "clip_threshold", "decay_rate", "beta1", "weight_decay", "scale_parameter",
                   "relative_step", "warmup_init"});
      auto& a = cfg.adafactor;
      a.lr = o.contains("lr") && !o.at("lr").is_null() ? number(o, "lr", 0) : 0.0;
      a.eps = pair(o, "eps", a.eps);
      a.clip_threshold = number(o, "clip_threshold", a.clip_threshold);
      a.decay_rate = number(o, "decay_rate", a.decay_rate);
      a.beta1 = o.contains("beta1") && !o.at("beta1").is_null() ? number(o, "beta1", 0) : 0.0;
      a.weight_decay = number(o, "weight_decay", a.weight_decay);
      a.scale_parameter = flag(o, "scale_parameter", a.scale_parameter);
      a.relative_step = flag(o, "relative_step", a.relative_step);
      a.warmup_init = flag(o, "warmup_init", a.warmup_init);
    } else if (cfg.name == "came") {
      require_all({"lr", "eps", "clip_threshold", "betas", "weight_decay"});
      auto& a = cfg.came;
      a.lr = number(o, "lr", a.lr);
      a.eps = pair(o, "eps", a.eps);
      a.clip_threshold = number(o, "clip_threshold", a.clip_threshold);
      if (o.contains("betas")) {
        const auto& v = o.at("betas");
        if (!v.is_array() || v.size() != 3 || !v[0].is_number() || !v[1].is_number() || !v[2].is_number())
          fail("optimizer: 'betas' must be a list of three numbers for came");
        a.betas = {v[0].get<double>(), v[1].get<double>(), v[2].get<double>()};
      }
      a.weight_decay = number(o, "weight_decay", a.weight_decay);
    } else if (cfg.name == "lamb") {
      require_all({"lr", "betas", "eps", "weight_decay", "bias_correction", "adam_w_mode", "grad_averaging",
                   "max_grad_norm", "use_nvlamb", "formula"});
      auto& a = cfg.lamb;
      a.lr = number(o, "lr", a.lr);
      a.betas = pair(o, "betas", a.betas);
      a.eps = number(o, "eps", a.eps);
      a.weight_decay = number(o, "weight_decay", a.weight_decay);
      a.bias_correction = flag(o, "bias_correction", a.bias_correction);
      a.adam_w_mode = flag(o, "adam_w_mode", a.adam_w_mode);
      a.grad_averaging = flag(o, "grad_averaging", a.grad_averaging);
      a.max_grad_norm = number(o, "max_grad_norm", a.max_grad_norm);
      a.use_nvlamb = flag(o, "use_nvlamb", a.use_nvlamb);
      const std::string formula = o.contains("formula") && o.at("formula").is_string() ? o.at("formula").get<std::string>()
                                  : o.contains("formula") ? std::string("?") : std::string("apex");
      if (formula == "apex") a.formula = lather::LambFormula::apex;
      else if (formula == "colossalai") a.formula = lather::LambFormula::colossalai;
      else fail("optimizer: 'formula' must be \"apex\" or \"colossalai\"");
    } else if (cfg.name == "galore_adamw") {
      require_all({"lr", "betas", "eps", "weight_decay", "correct_bias", "rank", "update_proj_gap", "scale",
                   "proj_type", "quantize_states", "block_size", "min_8bit_size"});
      auto& a = cfg.galore;
      a.lr = number(o, "lr", a.lr);
      a.betas = pair(o, "betas", a.betas);
      a.eps = number(o, "eps", a.eps);
      a.weight_decay = number(o, "weight_decay", a.weight_decay);
      a.correct_bias = flag(o, "correct_bias", a.correct_bias);
      a.rank = whole(o, "rank", static_cast<int>(a.rank));
      a.update_proj_gap = whole(o, "update_proj_gap", static_cast<int>(a.update_proj_gap));
      a.scale = number(o, "scale", a.scale);
      const std::string proj = o.contains("proj_type") && o.at("proj_type").is_string()
                                   ? o.at("proj_type").get<std::string>()
                                   : o.contains("proj_type") ? std::string("?") : std::string("std");
      if (proj == "std") a.proj_type = lather::GaLoreProjection::standard;
      else if (proj == "reverse_std") a.proj_type = lather::GaLoreProjection::reverse_standard;
      else if (proj == "left") a.proj_type = lather::GaLoreProjection::left;
      else if (proj == "right") a.proj_type = lather::GaLoreProjection::right;
      else fail("optimizer: 'proj_type' must be \"std\", \"reverse_std\", \"left\" or \"right\"");
      a.quantize_states = flag(o, "quantize_states", a.quantize_states);
      a.block_size = whole(o, "block_size", static_cast<int>(a.block_size));
      a.min_8bit_size = whole(o, "min_8bit_size", static_cast<int>(a.min_8bit_size));
    } else if (cfg.name == "shampoo") {
      cfg.shampoo = shampoo_options(o);
      cfg.grafting = o.value("grafting", json{{"type", "none"}});
      cfg.root_inv = o.value("root_inv", json{{"type", "eigh"}});
      cfg.preconditioner = o.value("preconditioner", json{{"type", "root_inv"}});
      const json& pre = cfg.preconditioner;
      if (!pre.is_object() || !pre.contains("type") || !pre.at("type").is_string())
        fail("optimizer.preconditioner must be an object with a string 'type'");
      cfg.preconditioner_type = pre.at("type").get<std::string>();
      if (cfg.preconditioner_type != "root_inv" && o.contains("root_inv") && cfg.preconditioner_type != "root_inv_kl")
        fail("optimizer: 'root_inv' is only allowed with preconditioner type root_inv or root_inv_kl");
      check_keys(cfg.grafting, {"type", "beta2", "epsilon"}, "optimizer.grafting");
      check_keys(cfg.root_inv, {"type", "max_iterations", "tolerance"}, "optimizer.root_inv");
      for (const json* sub : {&cfg.grafting, &cfg.root_inv})
        if (sub->contains("type") && !sub->at("type").is_string()) fail("optimizer: 'type' must be a string");
    } else {
      fail("optimizer: unknown name '" + cfg.name +
           "' (shampoo, sgd, adagrad, rmsprop, adam, adamw, adafactor, came, lamb, galore_adamw)");
    }
  } catch (const json::exception& e) {
    fail(std::string("optimizer: ") + e.what());
  }
  return cfg;
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

/// How lather-replay splits the parameters of the distributed optimizers (Adafactor, CAME, LAMB,
/// GaLore) under mpiexec: a TP group of `tp` consecutive ranks splits every parameter along
/// `tp_dim` ("row": dim 0, "col": the last dim) where it divides evenly; `zero` cuts each
/// (TP-local) parameter into ZeRO chunks over the remaining ranks.
struct ShardFlags {
  int tp = 1;
  std::string tp_dim = "row";
  bool zero = false;
  [[nodiscard]] bool distributed() const { return tp > 1 || zero; }
};
/// Adafactor, CAME, LAMB and GaLore-AdamW (in their own translation unit), single-process or, with
/// `flags.distributed()`, on MPI_COMM_WORLD; every rank returns the whole trajectories.
Result run_sharded(const Case& c, const OptimizerConfig& cfg, bool single, const std::string& space,
                   const ShardFlags& flags);

/// lather-replay --distributed: Shampoo's DDP, sharded and HSDP modes under mpiexec (flags as
/// ShampooDistributedOptions; docs/replay.md).
struct ShampooDistFlags {
  std::string mode;                 ///< ddp, sharded, hsdp; empty: not distributed
  std::string dtype = "parameter";  ///< parameter, float32, bfloat16, float16
  int trainers = -1;                ///< num_trainers_per_group
  bool communicate_params = false;
  int shard_size = 0;               ///< hsdp: ranks per shard group (0: all ranks)
  [[nodiscard]] bool distributed() const { return !mode.empty(); }
};
/// Root-inverse Shampoo (eigh, coupled_newton; every grafting) across MPI_COMM_WORLD on the default
/// execution space, in its own translation unit; rank 0 gets the whole trajectories.
Result run_shampoo_distributed(const Case& c, const OptimizerConfig& cfg, bool single, const ShampooDistFlags& flags);

/// The Shampoo family (optimizer.preconditioner other than root_inv), in their own translation units.
Result run_eigen_family(const Case& c, const lather::ShampooOptions& s, const json& pre, const json& graft,
                        bool single, const std::string& space);
Result run_other_family(const Case& c, const lather::ShampooOptions& s, const json& pre, const json& root_inv,
                        const json& graft, bool single, const std::string& space);

}  // namespace replay

#endif
