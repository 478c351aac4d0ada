// SPDX-License-Identifier: Apache-2.0
/// \file
/// \brief Private. What every optimizer's step() does first with the gradients it is given:
/// convert them to TensorRefs, check their count and shapes against the parameters, and count
/// NaN/Inf values on the device, so that a bad gradient is refused before anything changes.
#ifndef LATHER_IMPL_GRADIENTS_HPP
#define LATHER_IMPL_GRADIENTS_HPP

#include <lather/concepts/tensor.hpp>
#include <lather/error.hpp>
#include <lather/impl/kernels/diagonal.hpp>

#include <Kokkos_Core.hpp>

#include <cstdint>
#include <functional>
#include <ranges>
#include <string>
#include <utility>
#include <vector>

namespace lather::impl {

template <class R>
std::vector<std::int64_t> shape_of(const R& r) {
  std::vector<std::int64_t> s(static_cast<std::size_t>(r.rank()));
  for (int k = 0; k < r.rank(); ++k) s[k] = r.extent(k);
  return s;
}
template <class R>
std::vector<std::int64_t> strides_of(const R& r) {
  std::vector<std::int64_t> s(static_cast<std::size_t>(r.rank()));
  for (int k = 0; k < r.rank(); ++k) s[k] = r.stride(k);
  return s;
}

/// \brief Gradient intake shared by the optimizers. `describe(i)` names parameter i in messages.
template <class T, class MemorySpace, class ExecSpace>
class GradientIntake {
 public:
  using grad_ref = TensorRef<const T, MemorySpace>;
  using param_ref = TensorRef<T, MemorySpace>;

  GradientIntake() = default;
  GradientIntake(std::string optimizer, std::size_t num_params)
      : m_optimizer(std::move(optimizer)),
        m_counts("lather::" + m_optimizer + "::nonfinite_counts", num_params),
        m_counts_host(Kokkos::create_mirror_view(m_counts)) {}

  /// A gradient without data stands for torch's `grad is None` (a zero-size parameter needs none).
  static bool has_gradient(const grad_ref& g, const param_ref& p) { return g.data() != nullptr || p.size() == 0; }

  /// TensorRefs of `grads` (re-tagged with the parameters' memory space, which the execution
  /// space can also access), after checking their count and shapes. Throws before any change.
  template <class Grads>
  std::vector<grad_ref> convert(const Grads& grads, const std::vector<param_ref>& params,
                                const std::function<std::string(std::size_t)>& describe) const {
    const std::size_t n = std::ranges::size(grads);
    LATHER_THROW_IF(n != params.size(), "lather::", m_optimizer, "::step: got ", n, " gradients for ",
                    params.size(), " parameters; pass one per parameter (an empty tensor for a parameter "
                    "without a gradient)");
    std::vector<grad_ref> g(n);
    for (std::size_t i = 0; i < n; ++i) {
      auto r = tensor_ref(grads[i]);
      g[i] = grad_ref(r.data(), shape_of(r), strides_of(r));
      if (!has_gradient(g[i], params[i])) continue;
      LATHER_THROW_IF(!g[i].same_shape(params[i]), "lather::", m_optimizer, "::step: ", describe(i),
                      " has shape ", params[i].shape_string(), " but its gradient has shape ", g[i].shape_string(),
                      "; pass gradients in parameter order with matching shapes");
    }
    return g;
  }

  /// Counts NaN/Inf values of every present gradient with one kernel per gradient and one copy
  /// of the counts (one fence of `space`); throws naming the first bad parameter.
  void check_finite(const ExecSpace& space, const std::vector<grad_ref>& g, const std::vector<param_ref>& params,
                    const std::function<std::string(std::size_t)>& describe, const char* hint) {
    Kokkos::deep_copy(space, m_counts, 0);
    for (std::size_t i = 0; i < g.size(); ++i) {
      if (!has_gradient(g[i], params[i]) || g[i].size() == 0) continue;
      Kokkos::parallel_for("lather::" + m_optimizer + "::check_finite",
                           Kokkos::RangePolicy<ExecSpace, Kokkos::IndexType<std::int64_t>>(space, 0, g[i].size()),
                           kernels::CountNonFinite<T, MemorySpace>{g[i], m_counts, i});
    }
    Kokkos::deep_copy(space, m_counts_host, m_counts);
    space.fence();
    for (std::size_t i = 0; i < g.size(); ++i)
      LATHER_THROW_IF(m_counts_host(i) != 0, "lather::", m_optimizer, "::step: the gradient of ", describe(i),
                      " has ", m_counts_host(i), " NaN or Inf value(s) out of ", g[i].size(),
                      "; nothing was changed. ", hint);
  }

 private:
  std::string m_optimizer;
  Kokkos::View<std::int64_t*, MemorySpace> m_counts;
  // `auto`-typed mirror: View::HostMirror is deprecated in Kokkos 5.
  decltype(Kokkos::create_mirror_view(std::declval<Kokkos::View<std::int64_t*, MemorySpace>>())) m_counts_host;
};

}  // namespace lather::impl

#endif
