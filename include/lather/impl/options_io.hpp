// SPDX-License-Identifier: Apache-2.0
/// \file
/// \brief Private. Options structs in state dictionaries: every field an `Options::visit_fields`
/// visits (double, bool, std::int64_t, an enum, std::array<double, N>) is written as a float64
/// or int64 entry "param_groups.<g>.<name>" and read back with checks. A dictionary saved with
/// other options is refused (only `lr`, a scheduler's, is restored): shared by every optimizer
/// built on impl::DiagonalOptimizer and impl::ShardedOptimizer.
#ifndef LATHER_IMPL_OPTIONS_IO_HPP
#define LATHER_IMPL_OPTIONS_IO_HPP

#include <lather/error.hpp>
#include <lather/io/state_dict.hpp>

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <type_traits>
#include <variant>
#include <vector>

namespace lather::impl::options_io {

template <class S>
bool holds_scalar(const StateTensor& t) {
  return t.shape.empty() && std::holds_alternative<std::vector<S>>(t.values) &&
         std::get<std::vector<S>>(t.values).size() == 1;
}

inline std::string to_string(double v) { return concat(v); }
inline std::string to_string(bool v) { return v ? "true" : "false"; }
inline std::string to_string(std::int64_t v) { return std::to_string(v); }
template <class E>
  requires std::is_enum_v<E>
std::string to_string(E v) {
  return std::to_string(static_cast<std::int64_t>(v));
}
template <std::size_t N>
std::string to_string(const std::array<double, N>& v) {
  std::string s = "(";
  for (std::size_t k = 0; k < N; ++k) s += (k ? ", " : "") + concat(v[k]);
  return s + ")";
}

inline StateTensor to_tensor(double v) { return {{}, std::vector<double>{v}}; }
inline StateTensor to_tensor(bool v) { return {{}, std::vector<double>{v ? 1.0 : 0.0}}; }
inline StateTensor to_tensor(std::int64_t v) { return {{}, std::vector<std::int64_t>{v}}; }
template <class E>
  requires std::is_enum_v<E>
StateTensor to_tensor(E v) {
  return {{}, std::vector<std::int64_t>{static_cast<std::int64_t>(v)}};
}
template <std::size_t N>
StateTensor to_tensor(const std::array<double, N>& v) {
  return {{static_cast<std::int64_t>(N)}, std::vector<double>(v.begin(), v.end())};
}

inline void from_tensor(const StateTensor& t, const char* algo, const std::string& name, double& v) {
  LATHER_THROW_IF(!holds_scalar<double>(t), "lather::", algo, "::load_state_dict: '", name,
                  "' must be a float64 scalar");
  v = std::get<std::vector<double>>(t.values)[0];
}
inline void from_tensor(const StateTensor& t, const char* algo, const std::string& name, bool& v) {
  double x = 0;
  from_tensor(t, algo, name, x);
  LATHER_THROW_IF(x != 0.0 && x != 1.0, "lather::", algo, "::load_state_dict: '", name,
                  "' is a flag and must be 0 or 1, got ", x);
  v = x != 0.0;
}
inline void from_tensor(const StateTensor& t, const char* algo, const std::string& name, std::int64_t& v) {
  LATHER_THROW_IF(!holds_scalar<std::int64_t>(t), "lather::", algo, "::load_state_dict: '", name,
                  "' must be an int64 scalar");
  v = std::get<std::vector<std::int64_t>>(t.values)[0];
}
// Enum values are range-checked by the algorithm's validate() after reading.
template <class E>
  requires std::is_enum_v<E>
void from_tensor(const StateTensor& t, const char* algo, const std::string& name, E& v) {
  std::int64_t x = 0;
  from_tensor(t, algo, name, x);
  v = static_cast<E>(x);
}
template <std::size_t N>
void from_tensor(const StateTensor& t, const char* algo, const std::string& name, std::array<double, N>& v) {
  LATHER_THROW_IF(t.shape != std::vector<std::int64_t>{static_cast<std::int64_t>(N)} ||
                      !std::holds_alternative<std::vector<double>>(t.values) || t.stored_size() != N,
                  "lather::", algo, "::load_state_dict: '", name, "' must be a float64 tensor of shape (", N, ",)");
  const auto& x = std::get<std::vector<double>>(t.values);
  for (std::size_t k = 0; k < N; ++k) v[k] = x[k];
}

/// Writes every option of `o` under `key` ("param_groups.<g>.").
template <class Options>
void write(StateDict& d, const std::string& key, Options o) {
  Options::visit_fields(o, [&](const char* name, auto& v) { d.tensors[key + name] = to_tensor(v); });
}

/// Whether `suffix` names an option of Options.
template <class Options>
bool is_option(std::string_view suffix) {
  Options o{};
  bool found = false;
  Options::visit_fields(o, [&](const char* n, auto&) { found = found || suffix == n; });
  return found;
}

/// Reads the options saved under `key` for a group whose current options are `current`, and
/// refuses a dictionary saved with different options (every field except `lr`, which is
/// returned as saved). Returns the options to adopt; counts the entries read in `entries`.
/// Nothing is modified; throws lather::invalid_argument naming the option.
template <class Options, class Find>
Options read_checked(const Find& entry, const std::string& key, const Options& current, const char* algo,
                     std::size_t group, std::size_t& entries) {
  Options read = current;
  Options::visit_fields(read, [&](const char* name, auto& v) {
    from_tensor(entry(key + name), algo, key + name, v);
    ++entries;
  });
  Options saved = read;
  saved.lr = current.lr;
  Options cur = current;
  Options::visit_fields(cur, [&](const char* name, auto& v) {
    Options::visit_fields(saved, [&](const char* other, auto& w) {
      if constexpr (std::is_same_v<decltype(v), decltype(w)>) {
        if (std::string_view(name) == other && !(v == w))
          throw_error<invalid_argument>(
              std::source_location::current(), "lather::", algo, "::load_state_dict: the dictionary was saved with option '",
              name, "' = ", to_string(w), " in parameter group ", group, ", this optimizer has ", to_string(v),
              "; construct it with the checkpoint's options (only 'lr' is restored) and change options after "
              "loading; nothing was changed");
      }
    });
  });
  return read;
}

}  // namespace lather::impl::options_io

#endif
