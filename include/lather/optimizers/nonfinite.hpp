// SPDX-License-Identifier: Apache-2.0
/// \file
/// \brief NonFinitePolicy: what step() does with a gradient that holds NaN or Inf values.
#ifndef LATHER_OPTIMIZERS_NONFINITE_HPP
#define LATHER_OPTIMIZERS_NONFINITE_HPP

namespace lather {

/// \brief What step() does when a gradient holds NaN or Inf values (docs/reliability.md).
///
/// In every case the bad gradient is found before it reaches a factor matrix, a state buffer or
/// a parameter, and whatever is skipped is exactly as before the step.
enum class NonFinitePolicy {
  raise,           ///< throw lather::invalid_argument naming the parameter; nothing changes (default)
  skip_parameter,  ///< treat that parameter as having no gradient this step (its state and
                   ///< values stay), step the others, and count the skip
  skip_step,       ///< skip the whole step (as a loss scaler does): nothing changes; count it
};

/// "raise", "skip_parameter" or "skip_step".
[[nodiscard]] constexpr const char* to_string(NonFinitePolicy p) noexcept {
  switch (p) {
    case NonFinitePolicy::raise: return "raise";
    case NonFinitePolicy::skip_parameter: return "skip_parameter";
    case NonFinitePolicy::skip_step: return "skip_step";
  }
  return "?";
}

}  // namespace lather

#endif
