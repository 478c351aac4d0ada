// SPDX-License-Identifier: Apache-2.0
/// \file
/// \brief Adafactor (Shazeer & Stern 2018), as HuggingFace transformers' `Adafactor` computes it,
/// on whole, tensor-parallel or ZeRO-sharded parameters, equal to the single-device result.
///
/// ```bibtex
/// @inproceedings{shazeer2018adafactor,
///   title     = {Adafactor: Adaptive Learning Rates with Sublinear Memory Cost},
///   author    = {Shazeer, Noam and Stern, Mitchell},
///   booktitle = {Proceedings of the 35th International Conference on Machine Learning},
///   year      = {2018}}
/// ```
#ifndef LATHER_OPTIMIZERS_ADAFACTOR_HPP
#define LATHER_OPTIMIZERS_ADAFACTOR_HPP

#include <lather/impl/factored_statistics.hpp>
#include <lather/impl/kernels/launch.hpp>
#include <lather/impl/label.hpp>
#include <lather/impl/math.hpp>
#include <lather/impl/sharded_optimizer.hpp>

#include <Kokkos_Core.hpp>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

namespace lather {

/// \brief Options of Adafactor, named and defaulted as HuggingFace's `transformers.Adafactor`.
///
/// | HuggingFace | lather |
/// | --- | --- |
/// | `lr=None` | `lr = 0` (required with `relative_step`) |
/// | `beta1=None` | `beta1 = 0` (no first moment, no `exp_avg` buffer; numerically the same) |
struct AdafactorOptions {
  /// The step size when `relative_step` is false (> 0 then); must be 0 when `relative_step` is
  /// true (HuggingFace's lr=None: it raises when both are given). Then set_lr() other than 0 is
  /// an error too: the step size is the relative step.
  double lr = 0.0;
  /// eps[0] (> 0) is added to g² before the row/column means and keeps all-zero rows finite;
  /// eps[1] (>= 0) is the floor of the parameter scale.
  std::array<double, 2> eps = {1e-30, 1e-3};
  /// The update is divided by max(1, rms(u) / clip_threshold) (> 0).
  double clip_threshold = 1.0;
  /// beta2_t = 1 - t^decay_rate; must be <= 0 so that beta2_t stays in [0, 1) (0: no memory).
  double decay_rate = -0.8;
  /// EMA of the lr-scaled, clipped update when > 0 (in [0, 1)); 0: no first moment.
  double beta1 = 0.0;
  /// Decoupled weight decay p -= weight_decay * lr_t * p before the update (>= 0).
  double weight_decay = 0.0;
  /// lr_t = max(eps[1], rms(p_{t-1})) * rho_t (the RMS of the parameter before this step).
  bool scale_parameter = true;
  /// rho_t = min(1e-6 t if warmup_init else 1e-2, 1/sqrt(t)) instead of lr.
  bool relative_step = true;
  /// Linear warm-up of the relative step (requires relative_step).
  bool warmup_init = false;

  template <class O, class F>
  static void visit_fields(O& o, F&& f) {
    f("lr", o.lr); f("eps", o.eps); f("clip_threshold", o.clip_threshold); f("decay_rate", o.decay_rate);
    f("beta1", o.beta1); f("weight_decay", o.weight_decay); f("scale_parameter", o.scale_parameter);
    f("relative_step", o.relative_step); f("warmup_init", o.warmup_init);
  }
};

namespace impl {

namespace kernels {
/// u = lr_t * dir / clip; optional first moment; decoupled decay; p -= u (HuggingFace's order).
template <class T, class M>
struct AdafactorApply {
  TensorRef<T, M> p;
  factored::Direction<T, M> dir;
  Kokkos::View<T*, M> m;  // empty without a first moment
  bool use_m;
  T clip, lr, beta1, one_minus_beta1, decay;  // decay = -weight_decay * lr_t
  KOKKOS_FUNCTION void operator()(std::int64_t k) const {
    T u = dir(k) / clip;
    u = u * lr;
    if (use_m) {
      const T mk = m(k) * beta1 + one_minus_beta1 * u;
      m(k) = mk;
      u = mk;
    }
    T pk = p[k];
    if (decay != T(0)) pk = pk + decay * pk;
    p[k] = pk - u;
  }
};
}  // namespace kernels

struct AdafactorAlgorithm {
  using options_type = AdafactorOptions;
  static constexpr const char* name = "Adafactor";

  static void validate(const AdafactorOptions& o, const OptionCheck& c) {
    if (o.relative_step) {
      c.require(o.lr == 0.0, concat("invalid option 'lr' = ", o.lr,
                                    " (must be 0 with relative_step = true, which sets the step size itself; "
                                    "HuggingFace refuses a manual lr with relative_step too: set relative_step = "
                                    "false to use lr)"));
    } else {
      c.greater_than("lr", o.lr, 0.0);
    }
    c.require(!o.warmup_init || o.relative_step,
              "option 'warmup_init' = true requires relative_step = true (the warm-up is of the relative step)");
    c.greater_than("eps[0]", o.eps[0], 0.0);
    c.at_least("eps[1]", o.eps[1], 0.0);
    c.greater_than("clip_threshold", o.clip_threshold, 0.0);
    c.require(std::islessequal(o.decay_rate, 0.0),
              concat("invalid option 'decay_rate' = ", o.decay_rate,
                     " (must be <= 0: beta2_t = 1 - t^decay_rate leaves [0, 1) otherwise)"));
    c.in_half_open("beta1", o.beta1, 0.0, 1.0);
    c.at_least("weight_decay", o.weight_decay, 0.0);
  }
  /// beta1 = 0 has no exp_avg buffer: turning the first moment on or off needs a new optimizer.
  static bool same_state_layout(const AdafactorOptions& a, const AdafactorOptions& b) {
    return (a.beta1 > 0.0) == (b.beta1 > 0.0);
  }

  template <class T, class M>
  struct State {
    factored::Geometry geo;
    factored::Statistics<T, M> sq;   ///< exp_avg_sq_row / exp_avg_sq_col (factored)
    Kokkos::View<T*, M> exp_avg_sq;  ///< unfactored second moment, sharded like the parameter
    Kokkos::View<T*, M> exp_avg;     ///< first moment (beta1 > 0), sharded like the parameter
    std::vector<std::int64_t> shape;  ///< logical shape of the element-wise buffers
    bool first_moment = false;

    template <class F>
    void visit(F&& f) {
      if (geo.factored) {
        f("exp_avg_sq_row", sq.row, geo.row_shape);
        f("exp_avg_sq_col", sq.col, geo.col_shape);
      } else {
        f("exp_avg_sq", exp_avg_sq, shape);
      }
      if (first_moment) f("exp_avg", exp_avg, shape);
    }
  };
  /// What the step keeps between steps (ShardedOptimizer holds it): the reduction buffer and
  /// rounds, and the step's per-parameter lists, sized for every parameter at construction.
  template <class T, class M>
  struct Scratch {
    factored::StepBuffers<M> buffers;
    std::vector<double> beta2;
    std::vector<factored::Item<factored::GradSquare<T, M>, T, M>> items;
    std::vector<std::size_t> param_sq, update_sq;
    std::vector<factored::Direction<T, M>> dirs;
    void reserve(std::size_t n) {
      beta2.reserve(n);
      items.reserve(n);
      param_sq.reserve(n);
      update_sq.reserve(n);
      dirs.reserve(n);
    }
  };

  template <class T, class M>
  static State<T, M> make_state(const AdafactorOptions& o, const Sharding& s, std::int64_t numel) {
    State<T, M> st;
    st.geo = factored::Geometry::of(s);
    st.sq = factored::Statistics<T, M>::make(st.geo, "lather::Adafactor::exp_avg_sq");
    const auto n = static_cast<std::size_t>(numel);
    if (!st.geo.factored) st.exp_avg_sq = Kokkos::View<T*, M>("lather::Adafactor::exp_avg_sq", n);
    st.first_moment = o.beta1 > 0.0;
    if (st.first_moment) st.exp_avg = Kokkos::View<T*, M>("lather::Adafactor::exp_avg", n);
    st.shape = s.zero ? std::vector<std::int64_t>{numel} : s.local_shape();
    return st;
  }

  // Per step: the factored statistics (one round over the groups that split each dimension, a
  // second over TP only for row-split parameters), then one round of scalars [Σp², Σu²] per
  // parameter over both groups, then the update.
  template <class Ctx>
  static void step(Ctx& ctx) {
    using T = typename Ctx::value_type;
    using M = typename Ctx::memory_space_type;
    using ExecSpace = typename Ctx::execution_space;
    using Range = Kokkos::RangePolicy<ExecSpace, Kokkos::IndexType<std::int64_t>>;
    const std::size_t n = ctx.active.size();
    if (n == 0) return;
    auto& scratch = ctx.scratch;
    const factored::Labels& labels = factored::labels_of<AdafactorAlgorithm>();
    auto& beta2 = scratch.beta2;
    auto& items = scratch.items;
    beta2.resize(n);
    items.clear();
    for (std::size_t k = 0; k < n; ++k) {
      const std::size_t i = ctx.active[k];
      const AdafactorOptions& o = *ctx.options[i];
      beta2[k] = 1.0 - std::pow(static_cast<double>(ctx.steps[i]), o.decay_rate);
      const auto& s = ctx.states[i];
      if (s.geo.factored)
        items.push_back({&s.geo, s.sq, beta2[k], factored::GradSquare<T, M>{ctx.grads[i], static_cast<T>(o.eps[0])}});
    }
    factored::update_statistics(ctx, scratch.buffers, items, labels);

    factored::Round<M>& scalars = scratch.buffers.scalars;
    auto& param_sq = scratch.param_sq;
    auto& update_sq = scratch.update_sq;
    scalars.clear();
    param_sq.resize(n);
    update_sq.resize(n);
    for (std::size_t k = 0; k < n; ++k) {
      param_sq[k] = scalars.add(factored::Groups::both, 1);
      update_sq[k] = scalars.add(factored::Groups::both, 1);
    }
    scalars.start(ctx.space, scratch.buffers.workspace);
    auto& dirs = scratch.dirs;
    dirs.resize(n);
    for (std::size_t k = 0; k < n; ++k) {
      const std::size_t i = ctx.active[k];
      const AdafactorOptions& o = *ctx.options[i];
      auto& s = ctx.states[i];
      dirs[k] = factored::direction(ctx.grads[i], s.geo, s.sq, s.exp_avg_sq, beta2[k], o.eps[0]);
      if (o.scale_parameter)
        factored::sum_squares(ctx, i, TensorRef<const T, M>(ctx.params[i]), s.geo.valid(), scalars, param_sq[k],
                              labels);
      factored::sum_direction_squares(ctx, i, dirs[k], s.geo.valid(), scalars, update_sq[k], labels);
    }
    scalars.reduce(ctx);
    scalars.to_host(ctx.space);

    for (std::size_t k = 0; k < n; ++k) {
      const std::size_t i = ctx.active[k];
      const AdafactorOptions& o = *ctx.options[i];
      auto& s = ctx.states[i];
      const double lr_t = step_size(o, ctx.steps[i], factored::rms(scalars.host(param_sq[k]), s.geo.global_numel));
      const double clip = std::max(1.0, factored::rms(scalars.host(update_sq[k]), s.geo.global_numel) / o.clip_threshold);
      // by_argument: the parameter's TensorRef, the direction and the first moment pass 512
      // bytes, where CUDA and HIP would launch through constant memory and wait (launch.hpp).
      Kokkos::parallel_for(LATHER_LABEL("lather::Adafactor::apply"),
                           ::lather::impl::kernels::by_argument(Range(ctx.space, 0, s.geo.valid())),
                           kernels::AdafactorApply<T, M>{ctx.params[i], dirs[k], s.exp_avg, s.first_moment,
                                                         static_cast<T>(clip), static_cast<T>(lr_t),
                                                         static_cast<T>(o.beta1), static_cast<T>(1.0 - o.beta1),
                                                         static_cast<T>(-o.weight_decay * lr_t)});
    }
  }

  /// lr_t = param_scale * rho_t (HuggingFace's `_get_lr`), `rms_p` the RMS of the parameter
  /// before this step.
  static double step_size(const AdafactorOptions& o, std::int64_t step, double rms_p) {
    const auto t = static_cast<double>(step);
    double rho = o.lr;
    if (o.relative_step) rho = std::min(o.warmup_init ? 1e-6 * t : 1e-2, 1.0 / std::sqrt(t));
    const double scale = o.scale_parameter ? std::max(o.eps[1], rms_p) : 1.0;
    return scale * rho;
  }
};

}  // namespace impl

/// \brief Adafactor: a factored second moment (row and column statistics of the last two
/// dimensions; element-wise for rank < 2), a relative, parameter-scaled step size, update
/// clipping by RMS, an optional first moment and decoupled weight decay: HuggingFace's
/// `transformers.Adafactor`.
///
/// With a Distribution (TP and/or ZeRO shardings) the row and column statistics, the means and
/// the RMS are those of the whole tensor (see impl/factored_statistics.hpp): the result equals
/// the single-device one up to the summation order (statistics accumulated in double).
///
/// State per parameter: "exp_avg_sq_row" (shape[:-1]) and "exp_avg_sq_col" (shape[:-2] +
/// shape[-1:]) when factored, else "exp_avg_sq"; "exp_avg" when beta1 > 0. Row and column
/// statistics have TP-local shapes and are replicated over the DP group; element-wise buffers
/// hold this rank's shard.
///
/// Synchronization: step() fences `space` for the gradient check and once more (the per-parameter
/// scalars Σp², Σu² are copied to the host); the communicator fences it before each collective.
template <concepts::FloatingTensor Param,
          concepts::ExecutionSpaceFor<Param> ExecSpace = default_execution_space_t<Param>,
          concepts::Communicator Comm = SerialCommunicator>
class Adafactor : public impl::ShardedOptimizer<Param, ExecSpace, Comm, impl::AdafactorAlgorithm> {
  using base = impl::ShardedOptimizer<Param, ExecSpace, Comm, impl::AdafactorAlgorithm>;

 public:
  using base::base;
};

template <class P>
Adafactor(std::vector<P>&, AdafactorOptions = {}, std::vector<std::string> = {}) -> Adafactor<P>;
template <class P>
Adafactor(std::span<P>, AdafactorOptions = {}, std::vector<std::string> = {}) -> Adafactor<P>;
template <class P>
Adafactor(std::vector<ParamGroup<P, AdafactorOptions>>) -> Adafactor<P>;

}  // namespace lather

#endif
