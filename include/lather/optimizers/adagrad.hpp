// SPDX-License-Identifier: Apache-2.0
/// \file
/// \brief Adagrad (torch.optim.Adagrad).
#ifndef LATHER_OPTIMIZERS_ADAGRAD_HPP
#define LATHER_OPTIMIZERS_ADAGRAD_HPP

#include <lather/impl/diagonal_optimizer.hpp>
#include <lather/impl/kernels/diagonal.hpp>
#include <lather/impl/kernels/diagonal_host_jobs.hpp>
#include <lather/impl/kernels/host_chunks.hpp>
#include <lather/impl/label.hpp>

#include <array>
#include <cstdint>

namespace lather {

/// \brief Options of Adagrad, named and defaulted as torch.optim.Adagrad.
struct AdagradOptions {
  double lr = 1e-2;
  double lr_decay = 0.0;
  double weight_decay = 0.0;
  double initial_accumulator_value = 0.0;
  double eps = 1e-10;
  bool maximize = false;

  template <class O, class F>
  static void visit_fields(O& o, F&& f) {
    f("lr", o.lr); f("lr_decay", o.lr_decay); f("weight_decay", o.weight_decay);
    f("initial_accumulator_value", o.initial_accumulator_value); f("eps", o.eps);
    f("maximize", o.maximize);
  }
};

namespace impl {
struct AdagradAlgorithm {
  using options_type = AdagradOptions;
  static constexpr const char* name = "Adagrad";
  static constexpr std::array<const char*, 1> field_names{"sum"};

  static void validate(const AdagradOptions& o, const OptionCheck& c) {
    c.at_least("lr", o.lr, 0.0);
    c.at_least("lr_decay", o.lr_decay, 0.0);
    c.at_least("weight_decay", o.weight_decay, 0.0);
    c.at_least("initial_accumulator_value", o.initial_accumulator_value, 0.0);
    c.at_least("eps", o.eps, 0.0);
  }
  static bool uses_field(const AdagradOptions&, std::size_t) { return true; }
  template <class V>
  static bool initialize_field(const AdagradOptions& o, std::size_t, const V& v) {
    Kokkos::deep_copy(v, typename V::value_type(o.initial_accumulator_value));
    return true;
  }

  template <class ExecSpace, class T, class M, class State>
  static void update(const ExecSpace& space, const AdagradOptions& o, State& s,
                     const TensorRef<T, M>& p, const TensorRef<const T, M>& g) {
    launch_element_kernel(LATHER_LABEL("lather::Adagrad::step"), space, p, g,
                          [&](auto contiguous) { return step_kernel<decltype(contiguous)::value>(o, s, p, g); });
  }

#ifdef LATHER_HAS_HOST_CHUNKS
  /// The host chunk loop (DiagonalOptimizer::step): contiguous host data runs AdagradStep's
  /// operations, vectorized (kernels/diagonal_host_jobs.hpp), inside the loop over all
  /// parameters' chunks.
  template <class T, class M>
  using host_job_type = kernels::AdagradHostJob<T>;
  template <class ExecSpace, class T, class M, class State>
  static bool host_job(const AdagradOptions& o, State& s, const TensorRef<T, M>& p,
                       const TensorRef<const T, M>& g, host_job_type<T, M>& job) {
    if (!joins_host_chunks<ExecSpace>(p, g)) return false;
    const auto k = step_kernel<true>(o, s, p, g);
    job = {p.data(), g.data(), s.fields[0].data(), k.clr, k.weight_decay, k.eps, k.maximize};
    return true;
  }
#endif

  // The step's kernel, general or contiguous (the multi-tensor loop's job: DiagonalOptimizer).
  template <bool Contiguous, class T, class M, class State>
  static kernels::AdagradStep<T, M, Contiguous> step_kernel(const AdagradOptions& o, State& s,
                                                            const TensorRef<T, M>& p,
                                                            const TensorRef<const T, M>& g) {
    const double clr = o.lr / (1.0 + static_cast<double>(s.step - 1) * o.lr_decay);
    return {p, g, s.fields[0], T(clr), T(o.weight_decay), T(o.eps), o.maximize};
  }
};
}  // namespace impl

/// \brief Adagrad, torch.optim.Adagrad's algorithm:
/// `clr = lr/(1+(t-1)*lr_decay); sum += g*g; p -= clr*g/(sqrt(sum)+eps)` (g includes wd*p).
template <concepts::FloatingTensor Param,
          concepts::ExecutionSpaceFor<Param> ExecSpace = default_execution_space_t<Param>>
class Adagrad : public impl::DiagonalOptimizer<Param, ExecSpace, impl::AdagradAlgorithm> {
  using base = impl::DiagonalOptimizer<Param, ExecSpace, impl::AdagradAlgorithm>;

 public:
  using base::base;
};

template <class P>
Adagrad(std::vector<P>&, AdagradOptions = {}, std::vector<std::string> = {}) -> Adagrad<P>;
template <class P>
Adagrad(std::span<P>, AdagradOptions = {}, std::vector<std::string> = {}) -> Adagrad<P>;
template <class P>
Adagrad(std::vector<ParamGroup<P, AdagradOptions>>) -> Adagrad<P>;

}  // namespace lather

#endif
