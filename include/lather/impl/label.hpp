// SPDX-License-Identifier: Apache-2.0
/// \file
/// \brief Private. `LATHER_LABEL("...")`: a kernel or region label with static storage.
///
/// Kokkos takes labels as `const std::string&`; a string literal longer than the standard
/// library's small-string buffer (15 characters in libstdc++, and every lather label is longer)
/// becomes a heap allocation on every launch. Optimizer steps launch dozens of kernels per
/// parameter, and a step must not allocate after the first (docs/performance.md), so each label
/// is built once, on first use.
///
/// On host compilers with C++20 class-type template arguments the label is a variable template
/// specialization keyed by its text, built during static initialization: a label first used on a
/// root step (step `precondition_frequency` by default) would otherwise allocate there. Device
/// compilers keep the function-local static (built on first use). Either way a label is for a
/// kernel or region launch, hence after Kokkos::initialize, never during static initialization.
#ifndef LATHER_IMPL_LABEL_HPP
#define LATHER_IMPL_LABEL_HPP

#include <cstddef>
#include <string>

#if defined(__cpp_nontype_template_args) && __cpp_nontype_template_args >= 201911L && !defined(__CUDACC__) && \
    !defined(__HIP__) && !defined(__HIPCC__)
namespace lather::impl {
// A string literal as a template argument.
template <std::size_t N>
struct LabelText {
  char text[N]{};
  consteval LabelText(const char (&s)[N]) {  // NOLINT(google-explicit-constructor): takes a literal
    for (std::size_t i = 0; i < N; ++i) text[i] = s[i];
  }
};
template <LabelText L>
inline const std::string label_v{L.text};
}  // namespace lather::impl
#define LATHER_LABEL(literal) (::lather::impl::label_v<::lather::impl::LabelText{literal}>)
#else
#define LATHER_LABEL(literal)                  \
  ([]() -> const std::string& {                \
    static const std::string lather_label_(literal); \
    return lather_label_;                      \
  }())
#endif

#endif
