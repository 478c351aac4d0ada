// SPDX-License-Identifier: Apache-2.0
/// \file
/// \brief Private. `LATHER_LABEL("...")`: a kernel or region label with static storage.
///
/// Kokkos takes labels as `const std::string&`; a string literal longer than the standard
/// library's small-string buffer (15 characters in libstdc++, and every lather label is longer)
/// becomes a heap allocation on every launch. Optimizer steps launch dozens of kernels per
/// parameter, and a step must not allocate after the first (docs/performance.md), so each label
/// is built once, on first use.
#ifndef LATHER_IMPL_LABEL_HPP
#define LATHER_IMPL_LABEL_HPP

#include <string>

#define LATHER_LABEL(literal)                  \
  ([]() -> const std::string& {                \
    static const std::string lather_label_(literal); \
    return lather_label_;                      \
  }())

#endif
