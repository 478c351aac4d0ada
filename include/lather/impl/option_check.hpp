// SPDX-License-Identifier: Apache-2.0
/// \file
/// \brief Private. Uniform, named option validation: every message says which optimizer, which
/// parameter group, which option, its value and the allowed values.
#ifndef LATHER_IMPL_OPTION_CHECK_HPP
#define LATHER_IMPL_OPTION_CHECK_HPP

#include <lather/error.hpp>

#include <cmath>
#include <string>

namespace lather::impl {

class OptionCheck {
 public:
  /// `where` is e.g. "parameter group 2"; empty for options outside groups.
  OptionCheck(std::string optimizer, std::string where)
      : m_optimizer(std::move(optimizer)), m_where(std::move(where)) {}

  // NaN fails every rule. std::isgreaterequal & co. are quiet comparisons: they do not raise
  // FE_INVALID on NaN, so validation is safe under trapping floating-point environments.
  void at_least(const char* name, double x, double lo) const {
    fail_unless(std::isgreaterequal(x, lo), name, x, concat("must be >= ", lo));
  }
  void greater_than(const char* name, double x, double lo) const {
    fail_unless(std::isgreater(x, lo), name, x, concat("must be > ", lo));
  }
  /// x in [lo, hi)
  void in_half_open(const char* name, double x, double lo, double hi) const {
    fail_unless(std::isgreaterequal(x, lo) && std::isless(x, hi), name, x,
                concat("must be in [", lo, ", ", hi, ")"));
  }
  /// x in [lo, hi]
  void in_closed(const char* name, double x, double lo, double hi) const {
    fail_unless(std::isgreaterequal(x, lo) && std::islessequal(x, hi), name, x,
                concat("must be in [", lo, ", ", hi, "]"));
  }
  /// A rule that involves several options.
  void require(bool ok, const std::string& message) const {
    LATHER_THROW_IF(!ok, prefix(), message);
  }

 private:
  [[nodiscard]] std::string prefix() const {
    return concat("lather::", m_optimizer, ": ", m_where.empty() ? "" : m_where + ": ");
  }
  void fail_unless(bool ok, const char* name, double x, const std::string& rule) const {
    LATHER_THROW_IF(!ok, prefix(), "invalid option '", name, "' = ", x, " (", rule, ")");
  }

  std::string m_optimizer;
  std::string m_where;
};

}  // namespace lather::impl

#endif
