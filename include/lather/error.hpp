// SPDX-License-Identifier: Apache-2.0
/// \file
/// \brief lather's host-side error types and the LATHER_THROW_IF family.
///
/// Error tiers (see docs/errors.md): compile-time misuse is a named static_assert; bad options and
/// shapes throw `lather::invalid_argument`; run-time numerical failures that cannot be tolerated
/// throw `lather::runtime_error`. Every throwing entry point checks before it modifies anything,
/// so a caught error leaves parameters and optimizer state as they were.
#ifndef LATHER_ERROR_HPP
#define LATHER_ERROR_HPP

#include <source_location>
#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>

namespace lather {

/// \brief Invalid option, shape, type or state given by the caller. Nothing was modified.
class invalid_argument : public std::invalid_argument {
 public:
  invalid_argument(const std::string& what, std::source_location where)
      : std::invalid_argument(what), m_where(where) {}
  /// Where in lather the check fired (for bug reports; the message says what to do).
  [[nodiscard]] const std::source_location& where() const noexcept { return m_where; }

 private:
  std::source_location m_where;
};

/// \brief A run-time failure the caller could not have checked in advance (e.g. a communicator
/// error). Nothing was modified unless the message says otherwise.
class runtime_error : public std::runtime_error {
 public:
  runtime_error(const std::string& what, std::source_location where)
      : std::runtime_error(what), m_where(where) {}
  [[nodiscard]] const std::source_location& where() const noexcept { return m_where; }

 private:
  std::source_location m_where;
};

namespace impl {

template <class... Args>
[[nodiscard]] std::string concat(Args&&... args) {
  std::ostringstream out;
  out.precision(17);
  (out << ... << std::forward<Args>(args));
  return out.str();
}

template <class Error, class... Args>
[[noreturn]] void throw_error(std::source_location where, Args&&... args) {
  throw Error(concat(std::forward<Args>(args)...), where);
}

}  // namespace impl
}  // namespace lather

/// Throws lather::invalid_argument with the concatenated message when `cond` holds.
#define LATHER_THROW_IF(cond, ...)                                                 \
  do {                                                                             \
    if (cond) {                                                                    \
      ::lather::impl::throw_error<::lather::invalid_argument>(                     \
          std::source_location::current(), __VA_ARGS__);                           \
    }                                                                              \
  } while (false)

/// Throws lather::runtime_error with the concatenated message when `cond` holds.
#define LATHER_THROW_RUNTIME_IF(cond, ...)                                         \
  do {                                                                             \
    if (cond) {                                                                    \
      ::lather::impl::throw_error<::lather::runtime_error>(                        \
          std::source_location::current(), __VA_ARGS__);                          \
    }                                                                              \
  } while (false)

#endif
