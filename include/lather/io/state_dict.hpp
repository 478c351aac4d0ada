// SPDX-License-Identifier: Apache-2.0
/// \file
/// \brief StateDict: an optimizer's state as named host tensors, for inspection, checkpointing
/// and bit-identical restore.
#ifndef LATHER_IO_STATE_DICT_HPP
#define LATHER_IO_STATE_DICT_HPP

#include <lather/error.hpp>

#include <cstdint>
#include <map>
#include <numeric>
#include <string>
#include <variant>
#include <vector>

namespace lather {

/// \brief One named tensor of a StateDict: a shape and row-major host values of one dtype.
struct StateTensor {
  std::vector<std::int64_t> shape;
  std::variant<std::vector<float>, std::vector<double>, std::vector<std::int64_t>> values;

  /// "float32", "float64" or "int64".
  [[nodiscard]] const char* dtype() const noexcept {
    switch (values.index()) {
      case 0: return "float32";
      case 1: return "float64";
      default: return "int64";
    }
  }
  [[nodiscard]] std::int64_t numel() const {
    return std::accumulate(shape.begin(), shape.end(), std::int64_t{1}, std::multiplies<>());
  }
  [[nodiscard]] std::size_t stored_size() const {
    return std::visit([](const auto& v) { return v.size(); }, values);
  }
  /// Exact equality of shape, dtype and every value (bitwise for non-NaN values).
  friend bool operator==(const StateTensor&, const StateTensor&) = default;
};

/// \brief An optimizer's complete state: `format` names the optimizer (e.g. "lather.Adam.v1"),
/// `tensors` maps names such as "state.3.exp_avg", "state.3.step" and "param_groups.0.lr" to
/// values. Saving copies state to the host; loading checks every entry before changing anything.
struct StateDict {
  std::string format;
  std::map<std::string, StateTensor> tensors;

  [[nodiscard]] bool contains(const std::string& name) const { return tensors.count(name) != 0; }
  /// The entry `name`; throws lather::invalid_argument naming it when absent.
  [[nodiscard]] const StateTensor& at(const std::string& name) const {
    auto it = tensors.find(name);
    LATHER_THROW_IF(it == tensors.end(), "lather::StateDict: no entry '", name, "' in a '", format,
                    "' state dictionary");
    return it->second;
  }
  friend bool operator==(const StateDict&, const StateDict&) = default;
};

}  // namespace lather

#endif
