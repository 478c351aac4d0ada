// SPDX-License-Identifier: Apache-2.0
/// \file
/// \brief Adam (L2 weight decay) and AdamW (decoupled weight decay), with amsgrad
/// (torch.optim.Adam, torch.optim.AdamW).
#ifndef LATHER_OPTIMIZERS_ADAM_HPP
#define LATHER_OPTIMIZERS_ADAM_HPP

#include <lather/impl/diagonal_optimizer.hpp>
#include <lather/impl/kernels/adam_simd.hpp>
#include <lather/impl/kernels/diagonal.hpp>
#include <lather/impl/kernels/host_chunks.hpp>
#include <lather/impl/label.hpp>

#include <array>
#include <cmath>
#include <type_traits>

namespace lather {

/// \brief Options of Adam, named and defaulted as torch.optim.Adam (weight decay is L2: added
/// to the gradient).
struct AdamOptions {
  double lr = 1e-3;
  std::array<double, 2> betas = {0.9, 0.999};
  double eps = 1e-8;
  double weight_decay = 0.0;
  bool amsgrad = false;
  bool maximize = false;

  template <class O, class F>
  static void visit_fields(O& o, F&& f) {
    f("lr", o.lr); f("betas", o.betas); f("eps", o.eps); f("weight_decay", o.weight_decay);
    f("amsgrad", o.amsgrad); f("maximize", o.maximize);
  }
};

/// \brief Options of AdamW, as torch.optim.AdamW: like Adam's, but weight decay is decoupled
/// (`p *= 1 - lr*weight_decay` before the update) and defaults to 1e-2.
struct AdamWOptions {
  double lr = 1e-3;
  std::array<double, 2> betas = {0.9, 0.999};
  double eps = 1e-8;
  double weight_decay = 1e-2;
  bool amsgrad = false;
  bool maximize = false;

  template <class O, class F>
  static void visit_fields(O& o, F&& f) {
    AdamOptions::visit_fields(o, f);
  }
};

namespace impl {
template <class Options, bool Decoupled>
struct AdamAlgorithm {
  using options_type = Options;
  static constexpr const char* name = Decoupled ? "AdamW" : "Adam";
  static constexpr std::array<const char*, 3> field_names{"exp_avg", "exp_avg_sq", "max_exp_avg_sq"};

  static void validate(const Options& o, const OptionCheck& c) {
    c.at_least("lr", o.lr, 0.0);
    c.at_least("eps", o.eps, 0.0);
    c.in_half_open("betas[0]", o.betas[0], 0.0, 1.0);
    c.in_half_open("betas[1]", o.betas[1], 0.0, 1.0);
    c.at_least("weight_decay", o.weight_decay, 0.0);
  }
  static bool uses_field(const Options& o, std::size_t f) { return f < 2 || o.amsgrad; }
  template <class V>
  static bool initialize_field(const Options&, std::size_t, const V&) {
    return true;  // zeros
  }

  template <class ExecSpace, class T, class M, class State>
  static void update(const ExecSpace& space, const Options& o, State& s,
                     const TensorRef<T, M>& p, const TensorRef<const T, M>& g) {
    launch_element_kernel(Decoupled ? LATHER_LABEL("lather::AdamW::step") : LATHER_LABEL("lather::Adam::step"), space,
                          p, g, [&](auto contiguous) { return step_kernel<decltype(contiguous)::value>(o, s, p, g); });
  }

  // The step's kernel, general or contiguous (the multi-tensor loop's job: DiagonalOptimizer).
  template <bool Contiguous, class T, class M, class State>
  static kernels::AdamStep<T, M, Contiguous> step_kernel(const Options& o, State& s, const TensorRef<T, M>& p,
                                                         const TensorRef<const T, M>& g) {
    // Scalars in double on the host, as torch computes them from Python floats.
    const double t = static_cast<double>(s.step);
    const double bias_correction1 = 1.0 - std::pow(o.betas[0], t);
    const double bias_correction2 = 1.0 - std::pow(o.betas[1], t);
    return {p, g, s.fields[0], s.fields[1], s.fields[2],
            T(o.betas[0]), T(1.0 - o.betas[0]), T(o.betas[1]), T(1.0 - o.betas[1]),
            T(Decoupled ? 0.0 : o.weight_decay), T(1.0 - o.lr * o.weight_decay),
            T(o.lr / bias_correction1), T(std::sqrt(bias_correction2)), T(o.eps),
            o.amsgrad, o.maximize, Decoupled && o.weight_decay != 0.0};
  }

#ifdef LATHER_HAS_HOST_CHUNKS
  /// The host chunk loop (DiagonalOptimizer::step runs every parameter's job in one parallel
  /// loop): contiguous float/double host data without amsgrad. Fills `job` and returns true, or
  /// returns false and the parameter goes through update(). The job's loop (kernels/adam_simd.hpp,
  /// vectorized where SSE2 is) does AdamStep's operations in its order: the same bits (tested).
  template <class T, class M>
  using host_job_type = kernels::AdamHostJob<T>;
  template <class ExecSpace, class T, class M, class State>
  static bool host_job(const Options& o, State& s, const TensorRef<T, M>& p, const TensorRef<const T, M>& g,
                       kernels::AdamHostJob<T>& job) {
    if constexpr ((std::is_same_v<T, float> || std::is_same_v<T, double>) &&
                  Kokkos::SpaceAccessibility<Kokkos::HostSpace, M>::accessible &&
                  Kokkos::SpaceAccessibility<ExecSpace, Kokkos::HostSpace>::accessible) {
      if (!p.is_row_major_contiguous() || !g.is_row_major_contiguous() || o.amsgrad) return false;
      job = {p.data(), g.data(), s.fields[0].data(), s.fields[1].data(), host_scalars<T>(o, s.step)};
      return true;
    } else {
      return false;
    }
  }
#endif

 private:
  template <class T>
  static kernels::AdamScalars<T> host_scalars(const Options& o, std::int64_t step) {
    // Scalars in double on the host, as torch computes them from Python floats.
    const double t = static_cast<double>(step);
    const double bias_correction1 = 1.0 - std::pow(o.betas[0], t);
    const double bias_correction2 = 1.0 - std::pow(o.betas[1], t);
    return {T(o.betas[0]), T(1.0 - o.betas[0]), T(o.betas[1]), T(1.0 - o.betas[1]),
            T(Decoupled ? 0.0 : o.weight_decay), T(1.0 - o.lr * o.weight_decay), T(o.lr / bias_correction1),
            T(std::sqrt(bias_correction2)), T(o.eps), o.maximize, Decoupled && o.weight_decay != 0.0};
  }
};
}  // namespace impl

/// \brief Adam, torch.optim.Adam's algorithm: `g += wd*p; m = b1*m + (1-b1)*g;
/// v = b2*v + (1-b2)*g^2; p -= lr/(1-b1^t) * m / (sqrt(v)/sqrt(1-b2^t) + eps)`.
template <concepts::FloatingTensor Param,
          concepts::ExecutionSpaceFor<Param> ExecSpace = default_execution_space_t<Param>>
class Adam : public impl::DiagonalOptimizer<Param, ExecSpace, impl::AdamAlgorithm<AdamOptions, false>> {
  using base = impl::DiagonalOptimizer<Param, ExecSpace, impl::AdamAlgorithm<AdamOptions, false>>;

 public:
  using base::base;
};

/// \brief AdamW, torch.optim.AdamW's algorithm: `p *= 1 - lr*wd`, then Adam without L2.
template <concepts::FloatingTensor Param,
          concepts::ExecutionSpaceFor<Param> ExecSpace = default_execution_space_t<Param>>
class AdamW : public impl::DiagonalOptimizer<Param, ExecSpace, impl::AdamAlgorithm<AdamWOptions, true>> {
  using base = impl::DiagonalOptimizer<Param, ExecSpace, impl::AdamAlgorithm<AdamWOptions, true>>;

 public:
  using base::base;
};

template <class P>
Adam(std::vector<P>&, AdamOptions = {}, std::vector<std::string> = {}) -> Adam<P>;
template <class P>
Adam(std::span<P>, AdamOptions = {}, std::vector<std::string> = {}) -> Adam<P>;
template <class P>
Adam(std::vector<ParamGroup<P, AdamOptions>>) -> Adam<P>;
template <class P>
AdamW(std::vector<P>&, AdamWOptions = {}, std::vector<std::string> = {}) -> AdamW<P>;
template <class P>
AdamW(std::span<P>, AdamWOptions = {}, std::vector<std::string> = {}) -> AdamW<P>;
template <class P>
AdamW(std::vector<ParamGroup<P, AdamWOptions>>) -> AdamW<P>;

}  // namespace lather

#endif
