// SPDX-License-Identifier: Apache-2.0
// lather-replay: eigenvalue-corrected (SOAP), eigendecomposed and eigendecomposed KL-Shampoo
// (optimizer.preconditioner types "eigenvalue_corrected", "eigendecomposed", "eigendecomposed_kl").
#include "replay.hpp"

namespace replay {
namespace {

template <class A>
A amortized_from(const json& pre);
template <>
lather::EighEigendecomposition amortized_from(const json& pre) {
  if (pre.contains("max_iterations")) fail("optimizer.preconditioner: 'max_iterations' needs \"amortized\": \"qr\"");
  return {.tolerance = number(pre, "tolerance", 0.0)};
}
template <>
lather::QREigendecomposition amortized_from(const json& pre) {
  const double it = number(pre, "max_iterations", 1);
  if (it != std::floor(it)) fail("optimizer.preconditioner: 'max_iterations' must be an integer");
  return {.max_iterations = static_cast<int>(it), .tolerance = number(pre, "tolerance", 0.0)};
}

template <class T, class E, class A>
Result with_amortized(const Case& c, const lather::ShampooOptions& s, const json& pre, const json& graft) {
  const std::string type = pre.at("type");
  const std::set<std::string> graftings{"none", "adam"};
  if (type == "eigenvalue_corrected") {
    check_keys(pre, {"type", "amortized", "max_iterations", "tolerance", "ignored_basis_change_dims",
                     "inverse_exponent_override"},
               "optimizer.preconditioner");
    lather::EigenvalueCorrectedShampoo<A> ec{.amortized = amortized_from<A>(pre)};
    if (pre.contains("ignored_basis_change_dims"))
      for (const auto& [order, dims] : pre.at("ignored_basis_change_dims").items())
        ec.ignored_basis_change_dims[key_int(order, "optimizer.preconditioner")] = dims.template get<std::vector<int>>();
    if (pre.contains("inverse_exponent_override"))
      for (const auto& [order, e] : pre.at("inverse_exponent_override").items())
        ec.inverse_exponent_override[key_int(order, "optimizer.preconditioner")] = e.template get<double>();
    return run_shampoo<T, E>(c, s, ec, graft, graftings);
  }
  check_keys(pre, {"type", "amortized", "max_iterations", "tolerance"}, "optimizer.preconditioner");
  lather::EigendecomposedShampoo<A> eig{.amortized = amortized_from<A>(pre)};
  if (type == "eigendecomposed") return run_shampoo<T, E>(c, s, eig, graft, graftings);
  return run_shampoo<T, E>(c, s, lather::KLShampoo<lather::EigendecomposedShampoo<A>>{eig}, graft, graftings);
}

template <class T, class E>
Result eigen(const Case& c, const lather::ShampooOptions& s, const json& pre, const json& graft) {
  const std::string amortized = pre.value("amortized", "eigh");
  if (amortized == "eigh") return with_amortized<T, E, lather::EighEigendecomposition>(c, s, pre, graft);
  if (amortized == "qr") return with_amortized<T, E, lather::QREigendecomposition>(c, s, pre, graft);
  fail("optimizer.preconditioner: unknown 'amortized' '" + amortized + "' (eigh, qr)");
}

}  // namespace

Result run_eigen_family(const Case& c, const lather::ShampooOptions& s, const json& pre, const json& graft, bool single,
                        const std::string& space) {
  return on_space(space, [&](auto e) {
    using E = decltype(e);
    return single ? eigen<float, E>(c, s, pre, graft) : eigen<double, E>(c, s, pre, graft);
  });
}

}  // namespace replay
