// SPDX-License-Identifier: Apache-2.0
/// \file
/// \brief ParamGroup: parameters that share one set of options (torch's param_groups).
#ifndef LATHER_OPTIMIZERS_PARAM_GROUP_HPP
#define LATHER_OPTIMIZERS_PARAM_GROUP_HPP

#include <span>
#include <string>
#include <vector>

namespace lather {

/// \brief Parameters sharing one `Options`.
///
/// The optimizer references the parameters' memory (it does not copy them): they must outlive
/// it and keep their storage. `names` is optional; when given (one per parameter) error messages
/// and state inspection use them.
template <class Param, class Options>
struct ParamGroup {
  std::span<Param> params;
  Options options{};
  std::vector<std::string> names{};
};

}  // namespace lather

#endif
