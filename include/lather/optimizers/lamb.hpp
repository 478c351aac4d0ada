// SPDX-License-Identifier: Apache-2.0
/// \file
/// \brief LAMB (You et al. 2019, "Large Batch Optimization for Deep Learning"), as NVIDIA apex's
/// FusedLAMB computes it, or as ColossalAI's Lamb / pytorch-lamb do (`LambFormula`); on whole,
/// tensor-parallel or ZeRO-sharded parameters, equal to the single-device result.
#ifndef LATHER_OPTIMIZERS_LAMB_HPP
#define LATHER_OPTIMIZERS_LAMB_HPP

#include <lather/impl/kernels/launch.hpp>
#include <lather/impl/label.hpp>
#include <lather/impl/math.hpp>
#include <lather/impl/sharded_optimizer.hpp>

#include <Kokkos_Core.hpp>

#include <array>
#include <cmath>
#include <cstdint>
#include <vector>

namespace lather {

/// Which published LAMB the optimizer computes.
enum class LambFormula : std::int64_t {
  /// apex FusedLAMB (`multi_tensor_lamb`): global gradient-norm clipping, m and v debiased
  /// separately, the trust ratio only where weight_decay != 0 (or use_nvlamb).
  apex = 0,
  /// ColossalAI's Lamb / DistributedLamb and cybertronai pytorch-lamb: no clipping, the debias
  /// folded into the step size (`lr * sqrt(1-b2^t) / (1-b1^t)`, which the trust ratio does not
  /// cancel), the trust ratio on every parameter; weight decay always inside the update.
  colossalai = 1,
};

/// \brief Options of LAMB, named and defaulted as apex's FusedLAMB.
struct LambOptions {
  double lr = 1e-3;
  std::array<double, 2> betas = {0.9, 0.999};
  double eps = 1e-6;
  double weight_decay = 0.01;
  /// Debias m and v by 1 - beta^t (apex: per moment; colossalai: folded into the step size).
  bool bias_correction = true;
  /// apex's adam_w_mode: weight decay added to the update (true) or to the gradient, L2 (false).
  bool adam_w_mode = true;
  /// apex's grad_averaging: m = b1*m + (1-b1)*g (true) or m = b1*m + g (false).
  bool grad_averaging = true;
  /// Clip by the global gradient norm over every parameter of every group: gradients are divided
  /// by max(1, norm / max_grad_norm). 0 turns clipping off. apex formula only.
  double max_grad_norm = 1.0;
  /// Apply the trust ratio to parameters without weight decay too (apex's use_nvlamb).
  bool use_nvlamb = false;
  LambFormula formula = LambFormula::apex;

  template <class O, class F>
  static void visit_fields(O& o, F&& f) {
    f("lr", o.lr); f("betas", o.betas); f("eps", o.eps); f("weight_decay", o.weight_decay);
    f("bias_correction", o.bias_correction); f("adam_w_mode", o.adam_w_mode); f("grad_averaging", o.grad_averaging);
    f("max_grad_norm", o.max_grad_norm); f("use_nvlamb", o.use_nvlamb); f("formula", o.formula);
  }
};

namespace impl {

namespace kernels {
/// Σx² (double) of a tensor's first `n` elements.
template <class T, class M>
struct TensorSumSquares {
  TensorRef<const T, M> x;
  KOKKOS_FUNCTION void operator()(std::int64_t i, double& s) const {
    const double v = static_cast<double>(x[i]);
    s += v * v;
  }
};

/// LAMB's per-element update u, from the moments (already updated) and the parameter.
template <class T>
struct LambDirection {
  T bc1, bc2, eps, decay;  // bc = 1 where there is no per-moment debias
  KOKKOS_INLINE_FUNCTION T operator()(T m, T v, T p) const {
    return (m / bc1) / (math::sqrt(v / bc2) + eps) + decay * p;
  }
};

/// Updates m and v from the clipped gradient and accumulates Σu² (double).
template <class T, class M>
struct LambMoments {
  TensorRef<const T, M> g, p;
  Kokkos::View<T*, M> m, v;
  T clip, l2, beta1, beta3, beta2, one_minus_beta2;
  LambDirection<T> dir;
  KOKKOS_FUNCTION void operator()(std::int64_t i, double& s) const {
    T sg = g[i] / clip;
    sg = sg + l2 * p[i];
    const T mi = m(i) * beta1 + beta3 * sg;
    const T vi = v(i) * beta2 + one_minus_beta2 * sg * sg;
    m(i) = mi;
    v(i) = vi;
    const double u = static_cast<double>(dir(mi, vi, p[i]));
    s += u * u;
  }
};

/// p -= ratio * u, u recomputed from the same values (bitwise the u whose norm was taken).
template <class T, class M>
struct LambApply {
  TensorRef<T, M> p;
  Kokkos::View<const T*, M> m, v;
  T ratio;
  LambDirection<T> dir;
  KOKKOS_FUNCTION void operator()(std::int64_t i) const { p[i] = p[i] - ratio * dir(m(i), v(i), p[i]); }
};
}  // namespace kernels

struct LambAlgorithm {
  using options_type = LambOptions;
  static constexpr const char* name = "LAMB";

  static void validate(const LambOptions& o, const OptionCheck& c) {
    c.at_least("lr", o.lr, 0.0);
    c.at_least("eps", o.eps, 0.0);
    c.in_half_open("betas[0]", o.betas[0], 0.0, 1.0);
    c.in_half_open("betas[1]", o.betas[1], 0.0, 1.0);
    c.at_least("weight_decay", o.weight_decay, 0.0);
    c.at_least("max_grad_norm", o.max_grad_norm, 0.0);
    c.require(o.formula == LambFormula::apex || o.formula == LambFormula::colossalai,
              concat("invalid option 'formula' = ", static_cast<std::int64_t>(o.formula),
                     " (LambFormula::apex or LambFormula::colossalai)"));
    c.require(o.formula == LambFormula::apex || o.max_grad_norm == 0.0,
              "option 'max_grad_norm' must be 0 with LambFormula::colossalai (ColossalAI's Lamb does not clip)");
  }

  template <class T, class M>
  struct State {
    Kokkos::View<T*, M> exp_avg, exp_avg_sq;
    std::vector<std::int64_t> shape;
    template <class F>
    void visit(F&& f) {
      f("exp_avg", exp_avg, shape);
      f("exp_avg_sq", exp_avg_sq, shape);
    }
  };
  /// What the step keeps between steps (ShardedOptimizer holds it, sized for every parameter at
  /// construction): the host buffers of the two rounds of norms and the per-tensor directions.
  template <class T, class M>
  struct Scratch {
    Kokkos::View<double*, Kokkos::HostSpace> norms1, norms2;
    std::vector<kernels::LambDirection<T>> dirs;
    void reserve(std::size_t n) {
      norms1 = Kokkos::View<double*, Kokkos::HostSpace>("lather::LAMB::norms1", n + 1);
      norms2 = Kokkos::View<double*, Kokkos::HostSpace>("lather::LAMB::norms2", n);
      dirs.reserve(n);
    }
  };

  template <class T, class M>
  static State<T, M> make_state(const LambOptions&, const Sharding&, std::int64_t numel) {
    const auto n = static_cast<std::size_t>(numel);
    return {Kokkos::View<T*, M>("lather::LAMB::exp_avg", n), Kokkos::View<T*, M>("lather::LAMB::exp_avg_sq", n),
            {numel}};
  }

  // Three collectives per step at most, each one all-reduce over the DP and TP groups for all
  // tensors together: [Σg² (clipping), Σw² per tensor] and [Σu² per tensor].
  template <class Ctx>
  static void step(Ctx& ctx) {
    using T = typename Ctx::value_type;
    using ExecSpace = typename Ctx::execution_space;
    using Policy = Kokkos::RangePolicy<ExecSpace, Kokkos::IndexType<std::int64_t>>;
    const std::size_t n = ctx.active.size();
    if (n == 0) return;
    // Round 1: the global gradient norm and each tensor's parameter norm (before the update).
    // The rounds' buffers are the scratch's, cut to this step's tensors (every rank has the same).
    Kokkos::View<double*, Kokkos::HostSpace> r1 = Kokkos::subview(ctx.scratch.norms1, std::make_pair(std::size_t{0}, n + 1));
    Kokkos::View<double*, Kokkos::HostSpace> r2 = Kokkos::subview(ctx.scratch.norms2, std::make_pair(std::size_t{0}, n));
    for (std::size_t k = 0; k <= n; ++k) r1(k) = 0.0;
    for (std::size_t k = 0; k < n; ++k) r2(k) = 0.0;
    for (std::size_t k = 0; k < n; ++k) {
      const std::size_t i = ctx.active[k];
      const std::int64_t valid = ctx.shardings[i].valid_numel();
      if (!owner(ctx, i)) continue;  // a replicated piece is counted by one rank of its group
      double g2 = 0, w2 = 0;
      Kokkos::parallel_reduce(LATHER_LABEL("lather::LAMB::grad_norm"), Policy(ctx.space, 0, valid),
                              kernels::TensorSumSquares<T, typename Ctx::memory_space_type>{ctx.grads[i]}, g2);
      Kokkos::parallel_reduce(LATHER_LABEL("lather::LAMB::param_norm"), Policy(ctx.space, 0, valid),
                              kernels::TensorSumSquares<T, typename Ctx::memory_space_type>{TensorRef<const T, typename Ctx::memory_space_type>(ctx.params[i])}, w2);
      r1(0) += g2;
      r1(k + 1) = w2;
    }
    ctx.all_reduce_host(r1);
    const double global_grad_norm = std::sqrt(r1(0));
    // Round 2: moments and Σu².
    auto& dirs = ctx.scratch.dirs;
    dirs.resize(n);
    for (std::size_t k = 0; k < n; ++k) {
      const std::size_t i = ctx.active[k];
      const LambOptions& o = *ctx.options[i];
      const auto t = static_cast<double>(ctx.steps[i]);
      const bool apex = o.formula == LambFormula::apex;
      const double bc1 = apex && o.bias_correction ? 1.0 - std::pow(o.betas[0], t) : 1.0;
      const double bc2 = apex && o.bias_correction ? 1.0 - std::pow(o.betas[1], t) : 1.0;
      const double clip = apex && o.max_grad_norm > 0 && global_grad_norm > o.max_grad_norm
                              ? global_grad_norm / o.max_grad_norm
                              : 1.0;
      const bool l2 = apex && !o.adam_w_mode;
      dirs[k] = {T(bc1), T(bc2), T(o.eps), T(l2 ? 0.0 : o.weight_decay)};
      auto& s = ctx.states[i];
      const double beta3 = !apex || o.grad_averaging ? 1.0 - o.betas[0] : 1.0;
      kernels::LambMoments<T, typename Ctx::memory_space_type> f{
          ctx.grads[i], ctx.params[i], s.exp_avg, s.exp_avg_sq, T(clip), T(l2 ? o.weight_decay : 0.0),
          T(o.betas[0]), T(beta3), T(o.betas[1]), T(1.0 - o.betas[1]), dirs[k]};
      double u2 = 0;
      // by_argument: two TensorRefs and the moments pass 512 bytes in double (launch.hpp).
      Kokkos::parallel_reduce(LATHER_LABEL("lather::LAMB::moments"),
                              ::lather::impl::kernels::by_argument(Policy(ctx.space, 0, ctx.shardings[i].valid_numel())),
                              f, u2);
      r2(k) = owner(ctx, i) ? u2 : 0.0;
    }
    ctx.all_reduce_host(r2);
    // Apply.
    for (std::size_t k = 0; k < n; ++k) {
      const std::size_t i = ctx.active[k];
      const LambOptions& o = *ctx.options[i];
      const double w_norm = std::sqrt(r1(k + 1)), u_norm = std::sqrt(r2(k));
      double ratio = o.lr;
      if (o.formula == LambFormula::apex) {
        if ((o.use_nvlamb || o.weight_decay != 0.0) && w_norm != 0.0 && u_norm != 0.0) ratio = o.lr * (w_norm / u_norm);
      } else {
        const auto t = static_cast<double>(ctx.steps[i]);
        const double s = o.bias_correction ? o.lr * std::sqrt(1.0 - std::pow(o.betas[1], t)) / (1.0 - std::pow(o.betas[0], t))
                                           : o.lr;
        ratio = s * (w_norm > 0 && u_norm > 0 ? w_norm / u_norm : 1.0);
      }
      auto& s = ctx.states[i];
      Kokkos::parallel_for(LATHER_LABEL("lather::LAMB::apply"), Policy(ctx.space, 0, ctx.shardings[i].valid_numel()),
                           kernels::LambApply<T, typename Ctx::memory_space_type>{ctx.params[i], s.exp_avg,
                                                                                  s.exp_avg_sq, T(ratio), dirs[k]});
    }
  }

 private:
  template <class Ctx>
  static bool owner(const Ctx& ctx, std::size_t i) {
    return ctx.owns_piece(i);
  }
};

}  // namespace impl

/// \brief LAMB: Adam moments, then a per-tensor trust ratio ||w|| / ||u|| scaling the step.
///
/// With a Distribution (TP and/or ZeRO shardings) every norm is the norm of the whole tensor:
/// partial sums of squares are all-reduced over the groups that split it, all tensors in one
/// buffer (two all-reduces per group per step), so the result equals the single-device one up
/// to the summation order (double accumulation).
template <concepts::FloatingTensor Param,
          concepts::ExecutionSpaceFor<Param> ExecSpace = default_execution_space_t<Param>,
          concepts::Communicator Comm = SerialCommunicator>
class Lamb : public impl::ShardedOptimizer<Param, ExecSpace, Comm, impl::LambAlgorithm> {
  using base = impl::ShardedOptimizer<Param, ExecSpace, Comm, impl::LambAlgorithm>;

 public:
  using base::base;
};

template <class P>
Lamb(std::vector<P>&, LambOptions = {}, std::vector<std::string> = {}) -> Lamb<P>;
template <class P>
Lamb(std::span<P>, LambOptions = {}, std::vector<std::string> = {}) -> Lamb<P>;
template <class P>
Lamb(std::vector<ParamGroup<P, LambOptions>>) -> Lamb<P>;

}  // namespace lather

#endif
