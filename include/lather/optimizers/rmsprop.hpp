// SPDX-License-Identifier: Apache-2.0
/// \file
/// \brief RMSprop, plain or centered, with momentum (torch.optim.RMSprop).
#ifndef LATHER_OPTIMIZERS_RMSPROP_HPP
#define LATHER_OPTIMIZERS_RMSPROP_HPP

#include <lather/impl/diagonal_optimizer.hpp>
#include <lather/impl/kernels/diagonal.hpp>
#include <lather/impl/kernels/diagonal_host_jobs.hpp>
#include <lather/impl/kernels/host_chunks.hpp>
#include <lather/impl/label.hpp>

#include <array>
#include <cstdint>

namespace lather {

/// \brief Options of RMSprop, named and defaulted as torch.optim.RMSprop.
struct RMSpropOptions {
  double lr = 1e-2;
  double alpha = 0.99;
  double eps = 1e-8;
  double weight_decay = 0.0;
  double momentum = 0.0;
  bool centered = false;
  bool maximize = false;

  template <class O, class F>
  static void visit_fields(O& o, F&& f) {
    f("lr", o.lr); f("alpha", o.alpha); f("eps", o.eps); f("weight_decay", o.weight_decay);
    f("momentum", o.momentum); f("centered", o.centered); f("maximize", o.maximize);
  }
};

namespace impl {
struct RmspropAlgorithm {
  using options_type = RMSpropOptions;
  static constexpr const char* name = "RMSprop";
  static constexpr std::array<const char*, 3> field_names{"square_avg", "grad_avg", "momentum_buffer"};

  static void validate(const RMSpropOptions& o, const OptionCheck& c) {
    c.at_least("lr", o.lr, 0.0);
    c.at_least("eps", o.eps, 0.0);
    c.at_least("momentum", o.momentum, 0.0);
    c.at_least("weight_decay", o.weight_decay, 0.0);
    c.at_least("alpha", o.alpha, 0.0);
  }
  static bool uses_field(const RMSpropOptions& o, std::size_t f) {
    return f == 0 || (f == 1 && o.centered) || (f == 2 && o.momentum > 0);
  }
  template <class V>
  static bool initialize_field(const RMSpropOptions&, std::size_t, const V&) {
    return true;  // zero-initialized at allocation, as torch's zeros_like
  }

  template <class ExecSpace, class T, class M, class State>
  static void update(const ExecSpace& space, const RMSpropOptions& o, State& s,
                     const TensorRef<T, M>& p, const TensorRef<const T, M>& g) {
    launch_element_kernel(LATHER_LABEL("lather::RMSprop::step"), space, p, g,
                          [&](auto contiguous) { return step_kernel<decltype(contiguous)::value>(o, s, p, g); });
  }

#ifdef LATHER_HAS_HOST_CHUNKS
  /// The host chunk loop (DiagonalOptimizer::step): contiguous host data runs RmspropStep's
  /// operations, vectorized (kernels/diagonal_host_jobs.hpp), inside the loop over all
  /// parameters' chunks.
  template <class T, class M>
  using host_job_type = kernels::RmspropHostJob<T>;
  template <class ExecSpace, class T, class M, class State>
  static bool host_job(const RMSpropOptions& o, State& s, const TensorRef<T, M>& p,
                       const TensorRef<const T, M>& g, host_job_type<T, M>& job) {
    if (!joins_host_chunks<ExecSpace>(p, g)) return false;
    const auto k = step_kernel<true>(o, s, p, g);
    job = {p.data(), g.data(), s.fields[0].data(), k.centered ? s.fields[1].data() : nullptr,
           k.use_momentum ? s.fields[2].data() : nullptr, k.lr, k.alpha, k.one_minus_alpha, k.eps,
           k.weight_decay, k.momentum, k.centered, k.use_momentum, k.maximize};
    return true;
  }
#endif

  // The step's kernel, general or contiguous (the multi-tensor loop's job: DiagonalOptimizer).
  template <bool Contiguous, class T, class M, class State>
  static kernels::RmspropStep<T, M, Contiguous> step_kernel(const RMSpropOptions& o, State& s,
                                                            const TensorRef<T, M>& p,
                                                            const TensorRef<const T, M>& g) {
    return {p, g, s.fields[0], s.fields[1], s.fields[2], T(o.lr), T(o.alpha),
            T(1.0 - o.alpha), T(o.eps), T(o.weight_decay), T(o.momentum),
            o.centered, o.momentum > 0, o.maximize};
  }
};
}  // namespace impl

/// \brief RMSprop, torch.optim.RMSprop's algorithm: `v = alpha*v + (1-alpha)*g^2`; centered
/// subtracts the squared mean gradient; `p -= lr*g/(sqrt(v)+eps)` or through a momentum buffer.
template <concepts::FloatingTensor Param,
          concepts::ExecutionSpaceFor<Param> ExecSpace = default_execution_space_t<Param>>
class RMSprop : public impl::DiagonalOptimizer<Param, ExecSpace, impl::RmspropAlgorithm> {
  using base = impl::DiagonalOptimizer<Param, ExecSpace, impl::RmspropAlgorithm>;

 public:
  using base::base;
};

template <class P>
RMSprop(std::vector<P>&, RMSpropOptions = {}, std::vector<std::string> = {}) -> RMSprop<P>;
template <class P>
RMSprop(std::span<P>, RMSpropOptions = {}, std::vector<std::string> = {}) -> RMSprop<P>;
template <class P>
RMSprop(std::vector<ParamGroup<P, RMSpropOptions>>) -> RMSprop<P>;

}  // namespace lather

#endif
