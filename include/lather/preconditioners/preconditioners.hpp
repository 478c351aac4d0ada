// SPDX-License-Identifier: Apache-2.0
/// \file
/// \brief Shampoo's preconditioner policies (the reference's `preconditioner_config`): classic
/// root-inverse Shampoo (any RootInverseStrategy), `EigendecomposedShampoo`,
/// `EigenvalueCorrectedShampoo` (SOAP), `KLShampoo`, `SpectralDescent` (Muon) and `SignDescent`,
/// and `concepts::ShampooPreconditioner`. One `lather::Shampoo` template runs them all; the
/// policy is its third template parameter (docs/shampoo-family.md).
#ifndef LATHER_PRECONDITIONERS_PRECONDITIONERS_HPP
#define LATHER_PRECONDITIONERS_PRECONDITIONERS_HPP

#include <lather/concepts/root_inverse.hpp>
#include <lather/impl/option_check.hpp>
#include <lather/preconditioners/eigendecomposition.hpp>
#include <lather/root_inverse/eigen_root_inverse.hpp>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <vector>

namespace lather {

/// What a preconditioner policy computes per block.
enum class PreconditionerKind {
  root_inverse,          ///< P = Gbar x_k L_k^(-1/r_k)                       (RootInvShampoo)
  eigendecomposed,       ///< the same, the root rebuilt from stored (lambda, Q) (EigendecomposedShampoo)
  eigenvalue_corrected,  ///< Adam in the factors' eigenbasis                  (EigenvalueCorrectedShampoo, SOAP)
  spectral_descent,      ///< P = orth(Gbar), 2-D blocks                        (Muon)
  sign_descent,          ///< P = sign(Gbar) scale(Gbar)
};

/// \brief Eigendecomposed Shampoo: eigenvalues and eigenvectors of each factor (of A + eps I) are
/// stored on amortized steps, and the inverse root Q diag(f(lambda)) Q^T is rebuilt from them with
/// the perturbation or pseudo-inverse rule (notes sections 2.2, 5.1 and 5.4).
template <concepts::AmortizedEigendecomposition Amortized = EighEigendecomposition>
struct EigendecomposedShampoo {
  static constexpr PreconditionerKind kind = PreconditionerKind::eigendecomposed;
  static constexpr const char* name = "eigendecomposed";
  Amortized amortized{};
  /// The rank-deficient stability rule (PerturbationConfig / PseudoInverseConfig), as EigenRootInverse.
  bool perturb_before_computation = true;
  std::optional<PseudoInverse> pseudo_inverse = std::nullopt;

  void validate(const impl::OptionCheck& c) const {
    amortized.validate(c);
    if (pseudo_inverse) EigenRootInverse{true, pseudo_inverse}.validate();
  }
  [[nodiscard]] bool requires_zero_epsilon() const noexcept { return pseudo_inverse.has_value(); }
  [[nodiscard]] bool supports_root(double root) const noexcept { return std::isfinite(root) && root > 0; }
  /// Whether the eigendecomposition sees A + eps I (the stored eigenvalues then include the ridge).
  [[nodiscard]] bool ridge() const noexcept { return perturb_before_computation && !pseudo_inverse; }
};

/// \brief Eigenvalue-corrected Shampoo (SOAP-like): each factor's eigenbasis Q_k (of A + eps I,
/// columns by ascending eigenvalue) is refreshed on amortized steps; a second moment D of the raw
/// gradient rotated into the basis is updated every step, and the direction is
/// `Q [(Q^T Gbar Q) / ((D / bc2)^e + eps)] Q^T` with e = 1/2 unless overridden per block order.
/// `ignored_basis_change_dims` keeps the listed dimensions of blocks of that order unrotated.
template <concepts::AmortizedEigendecomposition Amortized = EighEigendecomposition>
struct EigenvalueCorrectedShampoo {
  static constexpr PreconditionerKind kind = PreconditionerKind::eigenvalue_corrected;
  static constexpr const char* name = "eigenvalue_corrected";
  Amortized amortized{};
  std::map<int, std::vector<int>> ignored_basis_change_dims{};  ///< keyed by block order
  std::map<int, double> inverse_exponent_override{};            ///< keyed by block order; default 1/2

  void validate(const impl::OptionCheck& c) const {
    amortized.validate(c);
    for (const auto& [order, dims] : ignored_basis_change_dims) {
      c.require(order >= 0, impl::concat("ignored_basis_change_dims: order ", order, " must be >= 0"));
      for (int d : dims)
        c.require(d >= 0 && d < std::max(order, 1), impl::concat("ignored_basis_change_dims: dimension ", d,
                                                                 " does not exist in order-", order, " blocks"));
    }
    for (const auto& [order, e] : inverse_exponent_override) {
      c.require(order >= 0, impl::concat("inverse_exponent_override: order ", order, " must be >= 0"));
      c.greater_than("inverse_exponent_override[order]", e, 0.0);
    }
  }
  [[nodiscard]] double exponent(int order) const {
    const auto it = inverse_exponent_override.find(order);
    return it == inverse_exponent_override.end() ? 0.5 : it->second;
  }
  [[nodiscard]] bool ignored(int order, int dim) const {
    const auto it = ignored_basis_change_dims.find(order);
    return it != ignored_basis_change_dims.end() && std::find(it->second.begin(), it->second.end(), dim) != it->second.end();
  }
};

/// The reference's `DefaultSOAPConfig`: eigenvalue correction with one warm-started QR iteration.
using SOAP = EigenvalueCorrectedShampoo<QREigendecomposition>;

/// \brief KL-Shampoo (notes section 3.3): the factor update uses the gradient preconditioned on
/// the other dimensions, L_k <- beta2 L_k + w G~_(k) G~_(k)^T with G~ = G x_(j != k) P_j and P_j
/// the current inverse root of factor j. `Inner` is a root-inverse strategy
/// (RootInvKLShampoo) or an EigendecomposedShampoo (EigendecomposedKLShampoo).
template <class Inner = EigenRootInverse>
struct KLShampoo {
  static constexpr bool kl = true;
  static constexpr const char* name = "kl";
  Inner inner{};
};

/// Newton-Schulz orthogonalization (Muon): X = A / max(||A||_F, 1e-8), transposed so the Gram
/// matrix is on the smaller side, then `num_iterations` times B = X^T X, B = b B + c B^2,
/// X = a X + X B with (a, b, c) = `coefficients`.
struct NewtonSchulz {
  static constexpr const char* name = "newton_schulz";
  int num_iterations = 5;
  std::array<double, 3> coefficients = {3.4445, -4.7750, 2.0315};
  void validate(const impl::OptionCheck& c) const {
    c.require(num_iterations >= 0, impl::concat("invalid option 'orthogonalization.num_iterations' = ", num_iterations,
                                                " (must be >= 0)"));
    for (double x : coefficients)
      c.require(std::isfinite(x), "option 'orthogonalization.coefficients' must be finite");
  }
};

/// Exact orthogonalization through the SVD A = U S V^T: U V^T (times the nuclear norm sum(S)
/// with `scale_by_nuclear_norm`). Host LAPACK (gesvd).
struct SVDOrthogonalization {
  static constexpr const char* name = "svd";
  bool scale_by_nuclear_norm = false;
  void validate(const impl::OptionCheck&) const {}
};

/// scale_by_dims(d_in = columns, d_out = rows) for spectral descent.
using ScaleByDims = std::function<double(std::int64_t d_in, std::int64_t d_out)>;
/// sqrt(max(1, d_out / d_in)), Muon's scaling (the reference README's Example 6).
inline double sqrt_max1_dout_over_din(std::int64_t d_in, std::int64_t d_out) {
  return std::sqrt(std::max(1.0, static_cast<double>(d_out) / static_cast<double>(d_in)));
}

/// \brief Spectral descent: P = orth(Gbar) * scale_by_dims(d_in, d_out) per 2-D block. Blocks
/// must be 2-D (set `target_parameter_dimensionality` = 2); the amortized frequency is forced to 1.
template <class Orthogonalization = NewtonSchulz>
struct SpectralDescent {
  static constexpr PreconditionerKind kind = PreconditionerKind::spectral_descent;
  static constexpr const char* name = "spectral_descent";
  Orthogonalization orthogonalization{};
  ScaleByDims scale_by_dims{};  ///< empty: 1

  void validate(const impl::OptionCheck& c) const { orthogonalization.validate(c); }
  [[nodiscard]] double scale(std::int64_t d_in, std::int64_t d_out) const {
    return scale_by_dims ? scale_by_dims(d_in, d_out) : 1.0;
  }
};

/// Muon: spectral descent with Newton-Schulz.
using Muon = SpectralDescent<NewtonSchulz>;

/// What a sign-descent scale function sees of a block's filtered gradient.
struct SignDescentBlockStats {
  std::int64_t numel = 0;
  double l1_norm = 0;  ///< sum |Gbar|
  double l2_norm = 0;  ///< ||Gbar||_F
};

/// \brief Sign descent: P = sign(Gbar) * scale_fn(stats of Gbar) per block, sign(0) = 0. The
/// default scale is 1 (the reference's default `scale_fn`); e.g. `l1_norm / numel` gives the
/// magnitude-preserving scaled sign.
struct SignDescent {
  static constexpr PreconditionerKind kind = PreconditionerKind::sign_descent;
  static constexpr const char* name = "sign_descent";
  std::function<double(const SignDescentBlockStats&)> scale_fn{};  ///< empty: 1
  void validate(const impl::OptionCheck&) const {}
};

namespace impl {
template <class P>
constexpr bool is_kl() {
  if constexpr (requires { P::kl; }) return P::kl;
  else return false;
}
/// The policy that does the amortized work (KLShampoo's inner one, else P itself).
template <class P>
struct inner_preconditioner {
  using type = P;
};
template <class I>
struct inner_preconditioner<KLShampoo<I>> {
  using type = I;
};
template <class P>
using inner_preconditioner_t = typename inner_preconditioner<P>::type;
template <class P>
constexpr PreconditionerKind preconditioner_kind() {
  using I = inner_preconditioner_t<P>;
  if constexpr (requires { I::kind; }) return I::kind;
  else return PreconditionerKind::root_inverse;
}
}  // namespace impl

namespace concepts {
/// \brief A Shampoo preconditioner policy: a RootInverseStrategy (classic Shampoo), one of the
/// policies above, or KLShampoo of a root-inverse strategy or an EigendecomposedShampoo.
template <class P>
concept ShampooPreconditioner =
    RootInverseStrategy<impl::inner_preconditioner_t<P>> ||
    (requires { impl::inner_preconditioner_t<P>::kind; } &&
     (!impl::is_kl<P>() || impl::preconditioner_kind<P>() == PreconditionerKind::eigendecomposed));
}  // namespace concepts

}  // namespace lather

#endif
