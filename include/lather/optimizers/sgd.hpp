// SPDX-License-Identifier: Apache-2.0
/// \file
/// \brief SGD with momentum, dampening, Nesterov momentum and L2 weight decay (torch.optim.SGD).
#ifndef LATHER_OPTIMIZERS_SGD_HPP
#define LATHER_OPTIMIZERS_SGD_HPP

#include <lather/impl/diagonal_optimizer.hpp>
#include <lather/impl/kernels/diagonal.hpp>
#include <lather/impl/kernels/diagonal_host_jobs.hpp>
#include <lather/impl/kernels/host_chunks.hpp>
#include <lather/impl/label.hpp>

#include <array>
#include <cstdint>

namespace lather {

/// \brief Options of SGD, named and defaulted as torch.optim.SGD (`lr` has no default in torch;
/// here it is 1e-3 so that `{}` is valid).
struct SGDOptions {
  double lr = 1e-3;
  double momentum = 0.0;
  double dampening = 0.0;
  double weight_decay = 0.0;
  bool nesterov = false;
  bool maximize = false;

  template <class O, class F>
  static void visit_fields(O& o, F&& f) {
    f("lr", o.lr); f("momentum", o.momentum); f("dampening", o.dampening);
    f("weight_decay", o.weight_decay); f("nesterov", o.nesterov); f("maximize", o.maximize);
  }
};

namespace impl {
struct SgdAlgorithm {
  using options_type = SGDOptions;
  static constexpr const char* name = "SGD";
  static constexpr std::array<const char*, 1> field_names{"momentum_buffer"};

  static void validate(const SGDOptions& o, const OptionCheck& c) {
    c.at_least("lr", o.lr, 0.0);
    c.at_least("momentum", o.momentum, 0.0);
    c.at_least("dampening", o.dampening, 0.0);
    c.at_least("weight_decay", o.weight_decay, 0.0);
    c.require(!o.nesterov || (o.momentum > 0 && o.dampening == 0),
              "option 'nesterov' = true requires 'momentum' > 0 and 'dampening' = 0");
  }
  static bool uses_field(const SGDOptions& o, std::size_t) { return o.momentum != 0.0; }
  // The buffer holds no state until the first step with momentum copies the direction into it.
  template <class V>
  static bool initialize_field(const SGDOptions&, std::size_t, const V&) { return false; }

  template <class ExecSpace, class T, class M, class State>
  static void update(const ExecSpace& space, const SGDOptions& o, State& s,
                     const TensorRef<T, M>& p, const TensorRef<const T, M>& g) {
    launch_element_kernel(LATHER_LABEL("lather::SGD::step"), space, p, g,
                          [&](auto contiguous) { return step_kernel<decltype(contiguous)::value>(o, s, p, g); });
  }

#ifdef LATHER_HAS_HOST_CHUNKS
  /// The host chunk loop (DiagonalOptimizer::step): contiguous host data runs SgdStep's
  /// operations, vectorized (kernels/diagonal_host_jobs.hpp), inside the loop over all
  /// parameters' chunks.
  template <class T, class M>
  using host_job_type = kernels::SgdHostJob<T>;
  template <class ExecSpace, class T, class M, class State>
  static bool host_job(const SGDOptions& o, State& s, const TensorRef<T, M>& p, const TensorRef<const T, M>& g,
                       host_job_type<T, M>& job) {
    if (!joins_host_chunks<ExecSpace>(p, g)) return false;
    const auto k = step_kernel<true>(o, s, p, g);
    job = {p.data(), g.data(), k.use_momentum ? s.fields[0].data() : nullptr, k.lr, k.weight_decay, k.momentum,
           k.one_minus_dampening, k.nesterov, k.maximize, k.use_momentum, k.first_momentum_step};
    return true;
  }
#endif

  // The step's kernel, general or contiguous (the multi-tensor loop's job: DiagonalOptimizer); marks the momentum buffer as holding state (torch's first step copies
  // the direction into it).
  template <bool Contiguous, class T, class M, class State>
  static kernels::SgdStep<T, M, Contiguous> step_kernel(const SGDOptions& o, State& s, const TensorRef<T, M>& p,
                                                        const TensorRef<const T, M>& g) {
    const bool use_momentum = o.momentum != 0.0;
    kernels::SgdStep<T, M, Contiguous> k{p, g, s.fields[0], T(o.lr), T(o.weight_decay), T(o.momentum),
                                         T(1.0 - o.dampening), o.nesterov, o.maximize, use_momentum,
                                         use_momentum && !s.present[0]};
    if (use_momentum) s.present[0] = true;
    return k;
  }
};
}  // namespace impl

/// \brief Stochastic gradient descent, torch.optim.SGD's algorithm:
/// `d = g + wd*p; buf = mu*buf + (1-dampening)*d (buf = d at first); d = nesterov ? d + mu*buf :
/// buf; p -= lr*d`.
/// \tparam Param any concepts::FloatingTensor (a Kokkos::View, an Eigen matrix, a TensorRef)
/// \tparam ExecSpace where the kernels run (default: the parameters' memory space's)
template <concepts::FloatingTensor Param,
          concepts::ExecutionSpaceFor<Param> ExecSpace = default_execution_space_t<Param>>
class SGD : public impl::DiagonalOptimizer<Param, ExecSpace, impl::SgdAlgorithm> {
  using base = impl::DiagonalOptimizer<Param, ExecSpace, impl::SgdAlgorithm>;

 public:
  using base::base;
};

template <class P>
SGD(std::vector<P>&, SGDOptions = {}, std::vector<std::string> = {}) -> SGD<P>;
template <class P>
SGD(std::span<P>, SGDOptions = {}, std::vector<std::string> = {}) -> SGD<P>;
template <class P>
SGD(std::vector<ParamGroup<P, SGDOptions>>) -> SGD<P>;

}  // namespace lather

#endif
