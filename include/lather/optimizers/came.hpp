// SPDX-License-Identifier: Apache-2.0
/// \file
/// \brief CAME (Luo et al. 2023, "CAME: Confidence-guided Adaptive Memory Efficient
/// Optimization"), as the paper's code (yangluo7/CAME) computes it, on whole, tensor-parallel or
/// ZeRO-sharded parameters, equal to the single-device result.
///
/// ```bibtex
/// @inproceedings{luo2023came,
///   title     = {{CAME}: Confidence-guided Adaptive Memory Efficient Optimization},
///   author    = {Luo, Yang and Ren, Xiaozhe and Zheng, Zangwei and Jiang, Zhuo and Jiang, Xin and You, Yang},
///   booktitle = {Proceedings of the 61st Annual Meeting of the Association for Computational Linguistics},
///   year      = {2023}}
/// ```
#ifndef LATHER_OPTIMIZERS_CAME_HPP
#define LATHER_OPTIMIZERS_CAME_HPP

#include <lather/impl/factored_statistics.hpp>
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

/// \brief Options of CAME, named and defaulted as the paper's code (its `lr` has no default;
/// 2e-4 is the example of its README).
struct CAMEOptions {
  double lr = 2e-4;  ///< > 0
  /// eps[0] (> 0) is added to g² before the row/column means; eps[1] (> 0) to the instability
  /// (u - m)²; both keep all-zero rows finite.
  std::array<double, 2> eps = {1e-30, 1e-16};
  /// The normalised gradient is divided by max(1, rms(u) / clip_threshold) (> 0).
  double clip_threshold = 1.0;
  /// beta1 (first moment), beta2 (second-moment statistics), beta3 (instability statistics),
  /// each in [0, 1); none is bias-corrected.
  std::array<double, 3> betas = {0.9, 0.999, 0.9999};
  /// Decoupled weight decay p -= weight_decay * lr * p before the update (>= 0).
  double weight_decay = 0.0;

  template <class O, class F>
  static void visit_fields(O& o, F&& f) {
    f("lr", o.lr); f("eps", o.eps); f("clip_threshold", o.clip_threshold); f("betas", o.betas);
    f("weight_decay", o.weight_decay);
  }
};

namespace impl {

namespace kernels {
/// m = beta1 * m + (1 - beta1) * u, u the clipped normalised gradient.
template <class T, class M>
struct CameMoment {
  factored::Direction<T, M> dir;
  Kokkos::View<T*, M> m;
  T clip, beta1, one_minus_beta1;
  KOKKOS_FUNCTION void operator()(std::int64_t k) const {
    const T u = dir(k) / clip;
    m(k) = m(k) * beta1 + one_minus_beta1 * u;
  }
};

/// The instability (u - m)² + eps2, with the updated m (a factored-statistics quantity).
template <class T, class M>
struct CameResidual {
  factored::Direction<T, M> dir;
  Kokkos::View<const T*, M> m;
  T clip, eps2;
  KOKKOS_INLINE_FUNCTION double operator()(std::int64_t k) const {
    const T d = dir(k) / clip - m(k);
    return static_cast<double>(d * d + eps2);
  }
};

/// upd = m / sqrt(S) (factored: (rf'_i cf'_j) m; rank < 2: m itself, a copy); decoupled decay;
/// p -= lr * upd.
template <class T, class M>
struct CameApply {
  TensorRef<T, M> p;
  Kokkos::View<const T*, M> m;
  bool factored;
  factored::FlatIndex index;
  Kokkos::View<const T*, M> row_factor, col_factor;
  T lr, decay;  // decay = -weight_decay * lr
  KOKKOS_FUNCTION void operator()(std::int64_t k) const {
    T upd = factored ? (row_factor(index.row(k)) * col_factor(index.col(k))) * m(k) : m(k);
    upd = upd * lr;
    T pk = p[k];
    if (decay != T(0)) pk = pk + decay * pk;
    p[k] = pk - upd;
  }
};
}  // namespace kernels

struct CameAlgorithm {
  using options_type = CAMEOptions;
  static constexpr const char* name = "CAME";

  static void validate(const CAMEOptions& o, const OptionCheck& c) {
    c.greater_than("lr", o.lr, 0.0);
    c.greater_than("eps[0]", o.eps[0], 0.0);
    c.greater_than("eps[1]", o.eps[1], 0.0);
    c.greater_than("clip_threshold", o.clip_threshold, 0.0);
    // The paper's code accepts 1 too; beta2 = 1 or beta3 = 1 would freeze a statistic at 0 (0/0),
    // beta1 = 1 the first moment at 0.
    c.in_half_open("betas[0]", o.betas[0], 0.0, 1.0);
    c.in_half_open("betas[1]", o.betas[1], 0.0, 1.0);
    c.in_half_open("betas[2]", o.betas[2], 0.0, 1.0);
    c.at_least("weight_decay", o.weight_decay, 0.0);
  }

  template <class T, class M>
  struct State {
    factored::Geometry geo;
    factored::Statistics<T, M> sq;   ///< exp_avg_sq_row / exp_avg_sq_col (factored)
    factored::Statistics<T, M> res;  ///< exp_avg_res_row / exp_avg_res_col (factored): own buffers
    Kokkos::View<T*, M> exp_avg;     ///< sharded like the parameter
    Kokkos::View<T*, M> exp_avg_sq;  ///< unfactored second moment, sharded like the parameter
    std::vector<std::int64_t> shape;  ///< logical shape of the element-wise buffers

    template <class F>
    void visit(F&& f) {
      f("exp_avg", exp_avg, shape);
      if (geo.factored) {
        f("exp_avg_sq_row", sq.row, geo.row_shape);
        f("exp_avg_sq_col", sq.col, geo.col_shape);
        f("exp_avg_res_row", res.row, geo.row_shape);
        f("exp_avg_res_col", res.col, geo.col_shape);
      } else {
        f("exp_avg_sq", exp_avg_sq, shape);
      }
    }
  };
  /// What the step keeps between steps (ShardedOptimizer holds it): the reduction buffer and
  /// rounds, and the step's per-parameter lists, sized for every parameter at construction.
  template <class T, class M>
  struct Scratch {
    factored::StepBuffers<M> buffers;
    std::vector<factored::Item<factored::GradSquare<T, M>, T, M>> sq_items;
    std::vector<factored::Item<kernels::CameResidual<T, M>, T, M>> res_items;
    std::vector<std::size_t> update_sq;
    std::vector<factored::Direction<T, M>> dirs;
    std::vector<T> clip;
    void reserve(std::size_t n) {
      sq_items.reserve(n);
      res_items.reserve(n);
      update_sq.reserve(n);
      dirs.reserve(n);
      clip.reserve(n);
    }
  };

  template <class T, class M>
  static State<T, M> make_state(const CAMEOptions&, const Sharding& s, std::int64_t numel) {
    State<T, M> st;
    st.geo = factored::Geometry::of(s);
    st.sq = factored::Statistics<T, M>::make(st.geo, "lather::CAME::exp_avg_sq");
    st.res = factored::Statistics<T, M>::make(st.geo, "lather::CAME::exp_avg_res");
    const auto n = static_cast<std::size_t>(numel);
    st.exp_avg = Kokkos::View<T*, M>("lather::CAME::exp_avg", n);
    if (!st.geo.factored) st.exp_avg_sq = Kokkos::View<T*, M>("lather::CAME::exp_avg_sq", n);
    st.shape = s.zero ? std::vector<std::int64_t>{numel} : s.local_shape();
    return st;
  }

  // Per step: second-moment statistics (one round over the groups splitting each dimension, one
  // over TP for row-split parameters), one round of Σu² over both groups, the first moment, the
  // instability statistics (the same two rounds again), then the update.
  template <class Ctx>
  static void step(Ctx& ctx) {
    using T = typename Ctx::value_type;
    using M = typename Ctx::memory_space_type;
    using ExecSpace = typename Ctx::execution_space;
    using Range = Kokkos::RangePolicy<ExecSpace, Kokkos::IndexType<std::int64_t>>;
    const std::size_t n = ctx.active.size();
    if (n == 0) return;
    auto& scratch = ctx.scratch;
    const factored::Labels& labels = factored::labels_of<CameAlgorithm>();
    auto& sq_items = scratch.sq_items;
    sq_items.clear();
    for (std::size_t k = 0; k < n; ++k) {
      const std::size_t i = ctx.active[k];
      const CAMEOptions& o = *ctx.options[i];
      const auto& s = ctx.states[i];
      if (s.geo.factored)
        sq_items.push_back({&s.geo, s.sq, o.betas[1], factored::GradSquare<T, M>{ctx.grads[i], static_cast<T>(o.eps[0])}});
    }
    factored::update_statistics(ctx, scratch.buffers, sq_items, labels);

    factored::Round<M>& scalars = scratch.buffers.scalars;
    auto& update_sq = scratch.update_sq;
    scalars.clear();
    update_sq.resize(n);
    for (std::size_t k = 0; k < n; ++k) update_sq[k] = scalars.add(factored::Groups::both, 1);
    scalars.start(ctx.space, scratch.buffers.workspace);
    auto& dirs = scratch.dirs;
    dirs.resize(n);
    for (std::size_t k = 0; k < n; ++k) {
      const std::size_t i = ctx.active[k];
      const CAMEOptions& o = *ctx.options[i];
      auto& s = ctx.states[i];
      dirs[k] = factored::direction(ctx.grads[i], s.geo, s.sq, s.exp_avg_sq, o.betas[1], o.eps[0]);
      factored::sum_direction_squares(ctx, i, dirs[k], s.geo.valid(), scalars, update_sq[k], labels);
    }
    scalars.reduce(ctx);
    scalars.to_host(ctx.space);

    auto& clip = scratch.clip;
    auto& res_items = scratch.res_items;
    clip.resize(n);
    res_items.clear();
    for (std::size_t k = 0; k < n; ++k) {
      const std::size_t i = ctx.active[k];
      const CAMEOptions& o = *ctx.options[i];
      auto& s = ctx.states[i];
      clip[k] = static_cast<T>(
          std::max(1.0, factored::rms(scalars.host(update_sq[k]), s.geo.global_numel) / o.clip_threshold));
      Kokkos::parallel_for(LATHER_LABEL("lather::CAME::exp_avg"), Range(ctx.space, 0, s.geo.valid()),
                           kernels::CameMoment<T, M>{dirs[k], s.exp_avg, clip[k], static_cast<T>(o.betas[0]),
                                                     static_cast<T>(1.0 - o.betas[0])});
      if (s.geo.factored)
        res_items.push_back({&s.geo, s.res, o.betas[2],
                             kernels::CameResidual<T, M>{dirs[k], s.exp_avg, clip[k], static_cast<T>(o.eps[1])}});
    }
    factored::update_statistics(ctx, scratch.buffers, res_items, labels);

    for (std::size_t k = 0; k < n; ++k) {
      const std::size_t i = ctx.active[k];
      const CAMEOptions& o = *ctx.options[i];
      auto& s = ctx.states[i];
      Kokkos::parallel_for(LATHER_LABEL("lather::CAME::apply"), Range(ctx.space, 0, s.geo.valid()),
                           kernels::CameApply<T, M>{ctx.params[i], s.exp_avg, s.geo.factored,
                                                    factored::FlatIndex::of(s.geo), s.res.row_factor,
                                                    s.res.col_factor, static_cast<T>(o.lr),
                                                    static_cast<T>(-o.weight_decay * o.lr)});
    }
  }
};

}  // namespace impl

/// \brief CAME: Adafactor's factored second moment with a fixed beta2, update clipping, a first
/// moment m, and a confidence term: m is divided by the square root of a factored EMA of the
/// instability (u - m)² (rank < 2: the update is m itself). The paper's code, without
/// ColossalAI's state aliasing or its in-place scaling of m.
///
/// With a Distribution (TP and/or ZeRO shardings) every statistic, mean and RMS is that of the
/// whole tensor (see impl/factored_statistics.hpp): the result equals the single-device one up to
/// the summation order (statistics accumulated in double).
///
/// State per parameter: "exp_avg" (sharded like the parameter) and, when factored,
/// "exp_avg_sq_row", "exp_avg_sq_col", "exp_avg_res_row", "exp_avg_res_col" (TP-local shapes,
/// replicated over the DP group), else "exp_avg_sq".
///
/// Synchronization: step() fences `space` for the gradient check and once more (the per-parameter
/// Σu² are copied to the host); the communicator fences it before each collective.
template <concepts::FloatingTensor Param,
          concepts::ExecutionSpaceFor<Param> ExecSpace = default_execution_space_t<Param>,
          concepts::Communicator Comm = SerialCommunicator>
class CAME : public impl::ShardedOptimizer<Param, ExecSpace, Comm, impl::CameAlgorithm> {
  using base = impl::ShardedOptimizer<Param, ExecSpace, Comm, impl::CameAlgorithm>;

 public:
  using base::base;
};

template <class P>
CAME(std::vector<P>&, CAMEOptions = {}, std::vector<std::string> = {}) -> CAME<P>;
template <class P>
CAME(std::span<P>, CAMEOptions = {}, std::vector<std::string> = {}) -> CAME<P>;
template <class P>
CAME(std::vector<ParamGroup<P, CAMEOptions>>) -> CAME<P>;

}  // namespace lather

#endif
