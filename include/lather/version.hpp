// SPDX-License-Identifier: Apache-2.0
#ifndef LATHER_VERSION_HPP
#define LATHER_VERSION_HPP

#include <lather/config.hpp>

/// Integer version, comparable with `#if LATHER_VERSION >= 100` (major * 10000 + minor * 100 + patch).
#define LATHER_VERSION \
  (LATHER_VERSION_MAJOR * 10000 + LATHER_VERSION_MINOR * 100 + LATHER_VERSION_PATCH)

namespace lather {
/// \brief The version lather was configured as, e.g. "0.1.0".
inline constexpr const char* version_string = LATHER_VERSION_STRING;
}  // namespace lather

#endif
