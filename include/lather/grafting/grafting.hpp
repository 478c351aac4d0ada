// SPDX-License-Identifier: Apache-2.0
/// \file
/// \brief Shampoo's grafting policies: NoGrafting, SGDGrafting, AdaGradGrafting,
/// RMSpropGrafting, AdamGrafting (DistributedShampoo's `*PreconditionerConfig` used as
/// `grafting_config`), and `concepts::GraftingPolicy`.
///
/// A grafting method keeps a diagonal second moment V of the raw gradient (AdaGrad: V += G^2;
/// RMSprop/Adam: V = beta2 V + (1 - beta2) G^2) and defines graft(x) = x / (sqrt(V / bc) + eps)
/// (bc = 1 - beta2^t for Adam, else 1; SGD: graft(x) = x). Shampoo uses graft(Gbar) directly
/// before preconditioning starts and, afterwards, rescales each block's direction to the
/// Frobenius norm of graft(Gbar). The element operations are the diagonal optimizers' own
/// (impl/kernels/diagonal.hpp).
#ifndef LATHER_GRAFTING_GRAFTING_HPP
#define LATHER_GRAFTING_GRAFTING_HPP

#include <lather/impl/kernels/diagonal.hpp>
#include <lather/impl/option_check.hpp>

#include <Kokkos_Core.hpp>

#include <cmath>
#include <concepts>
#include <cstdint>

namespace lather {

/// Per-step scalars a grafting kernel needs (computed on the host in double).
template <class T>
struct GraftScalars {
  T beta2 = 1, one_minus_beta2 = 1;  // second-moment update
  T bias_correction = 1;             // 1 - beta2^t for Adam, else 1
  T epsilon = 0;
};

/// No grafting: Shampoo's own direction is used; before preconditioning starts it is Gbar.
struct NoGrafting {
  static constexpr const char* name = "none";
  static constexpr bool enabled = false;
  static constexpr bool has_state = false;
  void validate(const impl::OptionCheck&) const {}
  template <class T>
  GraftScalars<T> scalars(std::int64_t) const { return {}; }
};

/// SGD grafting: graft(x) = x (the direction takes Gbar's norm).
struct SGDGrafting {
  static constexpr const char* name = "sgd";
  static constexpr bool enabled = true;
  static constexpr bool has_state = false;
  void validate(const impl::OptionCheck&) const {}
  template <class T>
  GraftScalars<T> scalars(std::int64_t) const { return {}; }
};

/// AdaGrad grafting: V += G^2, graft(x) = x / (sqrt(V) + epsilon). No bias correction.
struct AdaGradGrafting {
  static constexpr const char* name = "adagrad";
  static constexpr bool enabled = true;
  static constexpr bool has_state = true;
  double epsilon = 1e-10;
  void validate(const impl::OptionCheck& c) const { c.greater_than("grafting.epsilon", epsilon, 0.0); }
  template <class T>
  GraftScalars<T> scalars(std::int64_t) const { return {T(1), T(1), T(1), T(epsilon)}; }
};

/// RMSprop grafting: V = beta2 V + (1 - beta2) G^2, graft(x) = x / (sqrt(V) + epsilon).
struct RMSpropGrafting {
  static constexpr const char* name = "rmsprop";
  static constexpr bool enabled = true;
  static constexpr bool has_state = true;
  double beta2 = 0.99;
  double epsilon = 1e-10;
  void validate(const impl::OptionCheck& c) const {
    c.in_half_open("grafting.beta2", beta2, 0.0, 1.0);
    c.greater_than("grafting.epsilon", epsilon, 0.0);
  }
  template <class T>
  GraftScalars<T> scalars(std::int64_t) const { return {T(beta2), T(1.0 - beta2), T(1), T(epsilon)}; }
};

/// Adam grafting: RMSprop's V with bias correction 1 - beta2^t. (beta1 is Shampoo's betas[0].)
struct AdamGrafting {
  static constexpr const char* name = "adam";
  static constexpr bool enabled = true;
  static constexpr bool has_state = true;
  double beta2 = 0.999;
  double epsilon = 1e-10;
  void validate(const impl::OptionCheck& c) const {
    c.in_half_open("grafting.beta2", beta2, 0.0, 1.0);
    c.greater_than("grafting.epsilon", epsilon, 0.0);
  }
  template <class T>
  GraftScalars<T> scalars(std::int64_t t) const {
    return {T(beta2), T(1.0 - beta2), T(1.0 - std::pow(beta2, static_cast<double>(t))), T(epsilon)};
  }
};

namespace concepts {
/// A grafting policy: a value type with its options, `enabled`, `has_state`, `validate` and the
/// per-step `scalars<T>(t)` its kernels use.
template <class G>
concept GraftingPolicy = std::copyable<G> && requires(const G& g, const impl::OptionCheck& c) {
  { G::name } -> std::convertible_to<const char*>;
  { G::enabled } -> std::convertible_to<bool>;
  { G::has_state } -> std::convertible_to<bool>;
  g.validate(c);
  { g.template scalars<double>(std::int64_t{1}) } -> std::same_as<GraftScalars<double>>;
};
}  // namespace concepts

namespace impl::kernels {
/// graft(x) for the state v: x when there is no state (SGD), else x / (sqrt(v / bc) + eps), in
/// DistributedShampoo's order (divide, root, add).
template <class T>
KOKKOS_INLINE_FUNCTION T graft_direction(T x, T v, const GraftScalars<T>& s, bool has_state) {
  return has_state ? x / (math::sqrt(v / s.bias_correction) + s.epsilon) : x;
}
}  // namespace impl::kernels

static_assert(concepts::GraftingPolicy<NoGrafting> && concepts::GraftingPolicy<SGDGrafting> &&
              concepts::GraftingPolicy<AdaGradGrafting> && concepts::GraftingPolicy<RMSpropGrafting> &&
              concepts::GraftingPolicy<AdamGrafting>);

}  // namespace lather

#endif
