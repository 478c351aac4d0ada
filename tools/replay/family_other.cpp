// SPDX-License-Identifier: Apache-2.0
// lather-replay: KL-Shampoo with a root inverse, spectral descent (Muon) and sign descent
// (optimizer.preconditioner types "root_inv_kl", "spectral_descent", "sign_descent").
#include "replay.hpp"

namespace replay {
namespace {

lather::ScaleByDims scale_by_dims(const json& pre) {
  const std::string s = pre.value("scale_by_dims", "none");
  if (s == "none") return {};
  if (s == "sqrt_max1_dout_over_din") return lather::sqrt_max1_dout_over_din;
  fail("optimizer.preconditioner: unknown 'scale_by_dims' '" + s + "' (none, sqrt_max1_dout_over_din)");
}

template <class T, class E>
Result other(const Case& c, const lather::ShampooOptions& s, const json& pre, const json& root, const json& graft) {
  const std::string type = pre.at("type");
  const std::set<std::string> graftings{"none", "adam"};
  if (type == "root_inv_kl") {
    check_keys(pre, {"type"}, "optimizer.preconditioner");
    const std::string r = root.value("type", "eigh");
    if (r == "eigh") {
      check_keys(root, {"type"}, "optimizer.root_inv");
      return run_shampoo<T, E>(c, s, lather::KLShampoo<lather::EigenRootInverse>{}, graft, graftings);
    }
    if (r == "coupled_newton") {
      check_keys(root, {"type", "max_iterations", "tolerance"}, "optimizer.root_inv");
      lather::KLShampoo<lather::CoupledNewtonRootInverse> kl;
      kl.inner.max_iterations = whole(root, "max_iterations", 100, "optimizer.root_inv");
      kl.inner.tolerance = number(root, "tolerance", 1e-6);
      return run_shampoo<T, E>(c, s, kl, graft, graftings);
    }
    fail("optimizer.root_inv: unknown type '" + r + "' (eigh, coupled_newton)");
  }
  if (type == "spectral_descent") {
    const std::string orth = pre.value("orthogonalization", "newton_schulz");
    if (orth == "newton_schulz") {
      check_keys(pre, {"type", "orthogonalization", "num_iterations", "coefficients", "scale_by_dims"},
                 "optimizer.preconditioner");
      lather::Muon muon{.scale_by_dims = scale_by_dims(pre)};
      muon.orthogonalization.num_iterations = whole(pre, "num_iterations", 5, "optimizer.preconditioner");
      if (pre.contains("coefficients")) {
        const auto& v = pre.at("coefficients");
        if (!v.is_array() || v.size() != 3 || !v[0].is_number() || !v[1].is_number() || !v[2].is_number()) fail("optimizer.preconditioner: 'coefficients' must be three numbers");
        muon.orthogonalization.coefficients = {v[0].get<double>(), v[1].get<double>(), v[2].get<double>()};
      }
      return run_shampoo<T, E>(c, s, muon, graft, graftings);
    }
    if (orth == "svd") {
      check_keys(pre, {"type", "orthogonalization", "scale_by_nuclear_norm", "scale_by_dims"}, "optimizer.preconditioner");
      lather::SpectralDescent<lather::SVDOrthogonalization> sd{.scale_by_dims = scale_by_dims(pre)};
      sd.orthogonalization.scale_by_nuclear_norm = flag(pre, "scale_by_nuclear_norm", false);
      return run_shampoo<T, E>(c, s, sd, graft, graftings);
    }
    fail("optimizer.preconditioner: unknown 'orthogonalization' '" + orth + "' (newton_schulz, svd)");
  }
  if (type == "sign_descent") {
    check_keys(pre, {"type"}, "optimizer.preconditioner");
    return run_shampoo<T, E>(c, s, lather::SignDescent{}, graft, graftings);
  }
  fail("optimizer.preconditioner: unknown type '" + type +
       "' (root_inv, root_inv_kl, eigenvalue_corrected, eigendecomposed, eigendecomposed_kl, spectral_descent, "
       "sign_descent)");
}

}  // namespace

Result run_other_family(const Case& c, const lather::ShampooOptions& s, const json& pre, const json& root,
                        const json& graft, bool single, const std::string& space) {
  return on_space(space, [&](auto e) {
    using E = decltype(e);
    return single ? other<float, E>(c, s, pre, root, graft) : other<double, E>(c, s, pre, root, graft);
  });
}

}  // namespace replay
