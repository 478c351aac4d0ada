// SPDX-License-Identifier: Apache-2.0
/// \file
/// \brief Private. The factored second-moment machinery of Adafactor and CAME on whole,
/// tensor-parallel (TP) or ZeRO-sharded parameters, equal to the single-device math however the
/// parameter is split.
///
/// A parameter of rank >= 2 is factored over its last two dimensions; the leading dimensions are
/// batch dimensions with their own statistics (HuggingFace's convention). For an element-wise
/// quantity q (G² + eps1 for the second moment, CAME's (u - m)² + eps2 residual):
///
/// 1. every rank sums q over its valid (non-padding) elements per row and per column of the
///    TP-local tensor (partial sums: a ZeRO flat range may cut rows), deterministically: one
///    team per row touched, one thread per column touched, each summing in a fixed order in
///    double; no atomics;
/// 2. the partial sums are summed over exactly the groups that split the other dimension: row
///    sums over DP when ZeRO-sharded and over TP when the last dimension is TP-split; column
///    sums over DP when ZeRO-sharded and over TP when the second-to-last dimension is TP-split
///    (a TP split of a batch dimension needs neither). Every parameter's sums go into one buffer,
///    ordered [DP only | DP and TP | TP only | none], so one step issues one all-reduce per group
///    per round whatever the number of parameters;
/// 3. the means (sums / global extent) are folded into R (shape[:-1]) and C (shape[:-2] +
///    shape[-1:]) by an EMA; R and C have TP-local extents and are replicated over the DP group
///    (every DP rank applies the same EMA to the same reduced sums: (rows + columns) elements per
///    parameter, negligible next to the parameter's own shard);
/// 4. mean_i R per batch slice is summed over local rows (and over TP when the rows are split:
///    a second, tiny round), and the factors rf = 1/sqrt(R_i / mean R), cf = 1/sqrt(C_j) are
///    stored so that u = (rf_i cf_j) g, as HuggingFace's `_approx_sq_grad` computes it.
///
/// Statistics are accumulated in double whatever the parameter type; R, C and the factors are
/// stored in the parameter type (as the references keep them). Element-wise buffers (V for
/// unfactored parameters, exp_avg) are sharded like the parameter; padding elements are never
/// read or written.
///
/// The RMS of the update is Σu² over this rank's valid elements (counted only by the owner of a
/// piece replicated over a group, `owns_piece`), summed over both groups, divided by the
/// unpadded global element count.
#ifndef LATHER_IMPL_FACTORED_STATISTICS_HPP
#define LATHER_IMPL_FACTORED_STATISTICS_HPP

#include <lather/impl/label.hpp>
#include <lather/impl/math.hpp>
#include <lather/layout/sharding.hpp>
#include <lather/traits/tensor_traits.hpp>

#include <Kokkos_Core.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace lather::impl::factored {

/// The groups over which a buffer entry is summed.
enum class Groups : int { none = 0, dp = 1, tp = 2, both = 3 };
constexpr Groups operator|(Groups a, Groups b) { return static_cast<Groups>(static_cast<int>(a) | static_cast<int>(b)); }

// ---- geometry ----------------------------------------------------------------------------------

/// Where a parameter's factored dimensions are and which groups split them.
struct Geometry {
  bool factored = false;          ///< rank >= 2
  std::int64_t batches = 1;       ///< product of the TP-local leading dimensions
  std::int64_t rows = 1;          ///< TP-local shape[-2]
  std::int64_t cols = 1;          ///< TP-local shape[-1]
  std::int64_t global_rows = 1;   ///< global shape[-2] (divides the column sums)
  std::int64_t global_cols = 1;   ///< global shape[-1] (divides the row sums)
  std::int64_t begin = 0;         ///< TP-local flat range [begin, end) of the valid elements held
  std::int64_t end = 0;
  std::int64_t global_numel = 0;  ///< unpadded element count of the whole parameter
  Groups row_sums = Groups::none;   ///< groups summing partial row sums
  Groups col_sums = Groups::none;   ///< groups summing partial column sums
  Groups row_total = Groups::none;  ///< groups summing Σ_i R_i (TP when the rows are split)
  std::vector<std::int64_t> row_shape, col_shape;  ///< TP-local shapes of R and C

  [[nodiscard]] std::int64_t valid() const { return end - begin; }
  [[nodiscard]] std::int64_t row_entries() const { return batches * rows; }
  [[nodiscard]] std::int64_t col_entries() const { return batches * cols; }

  static Geometry of(const Sharding& s) {
    Geometry g;
    const int nd = s.rank();
    const std::vector<std::int64_t> local = s.local_shape();
    g.begin = s.begin();
    g.end = s.end();
    g.global_numel = s.global_numel();
    g.factored = nd >= 2;
    if (!g.factored) return g;
    const auto d = static_cast<std::size_t>(nd);
    for (std::size_t k = 0; k + 2 < d; ++k) g.batches *= local[k];
    g.rows = local[d - 2];
    g.cols = local[d - 1];
    g.global_rows = s.global_shape[d - 2];
    g.global_cols = s.global_shape[d - 1];
    const bool cols_split = s.tp_split() && s.tp_dim == nd - 1;
    const bool rows_split = s.tp_split() && s.tp_dim == nd - 2;
    const Groups zero = s.zero ? Groups::dp : Groups::none;
    g.row_sums = zero | (cols_split ? Groups::tp : Groups::none);
    g.col_sums = zero | (rows_split ? Groups::tp : Groups::none);
    g.row_total = rows_split ? Groups::tp : Groups::none;
    g.row_shape.assign(local.begin(), local.end() - 1);
    g.col_shape.assign(local.begin(), local.end() - 2);
    g.col_shape.push_back(local[d - 1]);
    return g;
  }
};

/// Device-side map from this rank's local element index k (0 <= k < valid) to its entries of R
/// (batch * rows + row) and of C (batch * cols + col).
struct FlatIndex {
  std::int64_t begin = 0, rows = 1, cols = 1;
  KOKKOS_INLINE_FUNCTION std::int64_t row(std::int64_t k) const { return (begin + k) / cols; }
  KOKKOS_INLINE_FUNCTION std::int64_t col(std::int64_t k) const {
    const std::int64_t f = begin + k;
    return f / (rows * cols) * cols + f % cols;
  }
  static FlatIndex of(const Geometry& g) { return {g.begin, g.rows, g.cols}; }
};

// ---- per-parameter factored state -------------------------------------------------------------

/// One factored statistic: R and C (the state) and the factors derived from them (scratch).
template <class T, class M>
struct Statistics {
  Kokkos::View<T*, M> row, col;                ///< R (shape[:-1]) and C (shape[:-2] + shape[-1:])
  Kokkos::View<T*, M> row_factor, col_factor;  ///< 1/sqrt(R_i / mean R) and 1/sqrt(C_j); scratch

  static Statistics make(const Geometry& g, const std::string& label) {
    Statistics s;
    if (!g.factored) return s;
    const auto nr = static_cast<std::size_t>(g.row_entries()), nc = static_cast<std::size_t>(g.col_entries());
    s.row = Kokkos::View<T*, M>(label + "_row", nr);
    s.col = Kokkos::View<T*, M>(label + "_col", nc);
    s.row_factor = Kokkos::View<T*, M>(Kokkos::view_alloc(Kokkos::WithoutInitializing, label + "_row_factor"), nr);
    s.col_factor = Kokkos::View<T*, M>(Kokkos::view_alloc(Kokkos::WithoutInitializing, label + "_col_factor"), nc);
    return s;
  }
};

// ---- reduction rounds --------------------------------------------------------------------------

/// The buffer every round of a step uses: allocated once, grown when a step needs more (kept in
/// the optimizer's scratch so that step() does not allocate after the first step).
template <class M>
struct Workspace {
  Kokkos::View<double*, M> device;
  Kokkos::View<double*, Kokkos::HostSpace> host;
  void reserve(std::int64_t n) {
    if (static_cast<std::int64_t>(device.extent(0)) >= n) return;
    device = Kokkos::View<double*, M>(Kokkos::view_alloc(Kokkos::WithoutInitializing, "lather::factored::reductions"),
                                      static_cast<std::size_t>(n));
    host = Kokkos::View<double*, Kokkos::HostSpace>(
        Kokkos::view_alloc(Kokkos::WithoutInitializing, "lather::factored::reductions_host"), static_cast<std::size_t>(n));
  }
};

/// Zeroes a round's entries. (Kokkos::deep_copy(space, view, 0.0) would do, but Kokkos 3.4 builds
/// its fill kernel's label as a std::string on every call: a heap allocation per round.)
template <class M>
struct ZeroFill {
  Kokkos::View<double*, M> v;
  KOKKOS_FUNCTION void operator()(std::int64_t k) const { v(k) = 0.0; }
};

/// One round of sums: entries are added with the groups they are summed over, then laid out as
/// [DP only | both | TP only | none] so that one all-reduce per group covers every parameter.
/// Every rank must add the same entries in the same order (they depend only on the parameters'
/// shapes, sharding kinds and options, which the ranks agree on).
template <class M>
class Round {
 public:
  using view_type = Kokkos::View<double*, M>;

  /// Starts a new round: forgets the entries, keeps their capacity (a Round lives in the
  /// optimizer's scratch and is refilled every step without allocating).
  void clear() { m_entries.clear(); }
  std::size_t add(Groups g, std::int64_t n) {
    m_entries.push_back({g, n, 0});
    return m_entries.size() - 1;
  }
  /// Lays the entries out in `ws` and zeroes them on `space`.
  template <class ExecSpace>
  void start(const ExecSpace& space, Workspace<M>& ws) {
    const Groups order[4] = {Groups::dp, Groups::both, Groups::tp, Groups::none};
    std::int64_t pos = 0;
    for (int s = 0; s < 4; ++s) {
      m_segment[s] = pos;
      for (auto& e : m_entries)
        if (e.groups == order[s]) {
          e.offset = pos;
          pos += e.size;
        }
    }
    m_segment[4] = pos;
    ws.reserve(pos);
    m_view = ws.device;
    m_host = ws.host;
    if (pos > 0)
      Kokkos::parallel_for(LATHER_LABEL("lather::factored::zero_round"),
                           Kokkos::RangePolicy<ExecSpace, Kokkos::IndexType<std::int64_t>>(space, 0, pos),
                           ZeroFill<M>{m_view});
  }
  [[nodiscard]] std::int64_t offset(std::size_t entry) const { return m_entries[entry].offset; }
  [[nodiscard]] const view_type& view() const { return m_view; }
  /// The value of `entry` (after to_host()).
  [[nodiscard]] double host(std::size_t entry, std::int64_t k = 0) const { return m_host(m_entries[entry].offset + k); }

  /// Sums over the DP group [DP only | both], then over the TP group [both | TP only]: after it
  /// every entry holds its sum over exactly its groups. Ranks call it together; a group of one
  /// or an empty range issues nothing.
  template <class Ctx>
  void reduce(const Ctx& ctx) const {
    if (ctx.dp.size() > 1 && m_segment[2] > m_segment[0])
      ctx.dp.all_reduce_sum(ctx.space, Kokkos::subview(m_view, std::make_pair(m_segment[0], m_segment[2])));
    if (ctx.tp.size() > 1 && m_segment[3] > m_segment[1])
      ctx.tp.all_reduce_sum(ctx.space, Kokkos::subview(m_view, std::make_pair(m_segment[1], m_segment[3])));
  }
  /// Copies the round to the host (fences `space`).
  template <class ExecSpace>
  void to_host(const ExecSpace& space) const {
    if (m_segment[4] == 0) return;
    const auto range = std::make_pair(std::int64_t{0}, m_segment[4]);
    Kokkos::deep_copy(space, Kokkos::subview(m_host, range), Kokkos::subview(m_view, range));
    space.fence();
  }
  /// Elements in the collectives of this round over the DP and the TP group.
  [[nodiscard]] std::int64_t dp_elements() const { return m_segment[2] - m_segment[0]; }
  [[nodiscard]] std::int64_t tp_elements() const { return m_segment[3] - m_segment[1]; }

 private:
  struct Entry {
    Groups groups;
    std::int64_t size;
    std::int64_t offset;
  };
  std::vector<Entry> m_entries;
  std::int64_t m_segment[5] = {0, 0, 0, 0, 0};
  view_type m_view;
  Kokkos::View<double*, Kokkos::HostSpace> m_host;
};

// ---- kernels -----------------------------------------------------------------------------------

/// q = g² + eps1 (the second moment's quantity), in the parameter type as the references form it.
template <class T, class M>
struct GradSquare {
  TensorRef<const T, M> g;
  T eps1;
  KOKKOS_INLINE_FUNCTION double operator()(std::int64_t k) const {
    const T x = g[k];
    return static_cast<double>(x * x + eps1);
  }
};

/// Partial row sums of q over this rank's elements: one team per row touched, columns summed by
/// the team in a fixed order (deterministic). out(offset + r) for r in [first_row, ...).
template <class Q, class M, class ExecSpace>
struct RowPartialSums {
  using member_type = typename Kokkos::TeamPolicy<ExecSpace>::member_type;
  Q q;
  Kokkos::View<double*, M> out;
  std::int64_t offset, first_row, begin, end, cols;
  KOKKOS_FUNCTION void operator()(const member_type& team) const {
    const std::int64_t r = first_row + team.league_rank();
    const std::int64_t f0 = math::max(begin, r * cols), f1 = math::min(end, (r + 1) * cols);
    double s = 0;
    Kokkos::parallel_reduce(
        Kokkos::TeamThreadRange(team, f0, f1), [&](const std::int64_t f, double& acc) { acc += q(f - begin); }, s);
    Kokkos::single(Kokkos::PerTeam(team), [&]() { out(offset + r) = s; });
  }
};

/// Partial column sums: one thread per (batch, column) touched, summing its rows in order.
template <class Q, class M>
struct ColPartialSums {
  Q q;
  Kokkos::View<double*, M> out;
  std::int64_t offset, first_batch, begin, end, rows, cols;
  KOKKOS_FUNCTION void operator()(std::int64_t idx) const {
    const std::int64_t b = first_batch + idx / cols, j = idx % cols;
    const std::int64_t base = b * rows * cols + j;  // flat index of (b, 0, j)
    const std::int64_t lo = begin <= base ? 0 : (begin - base + cols - 1) / cols;
    const std::int64_t hi = end <= base ? 0 : math::min(rows, (end - base + cols - 1) / cols);
    double s = 0;
    for (std::int64_t i = lo; i < hi; ++i) s += q(base + i * cols - begin);
    out(offset + b * cols + j) = s;
  }
};

/// R = R * beta + (1 - beta) * (row sum / global cols) and C likewise with the column sums /
/// global rows (torch's mul_(beta).add_(mean, alpha=1-beta)); one kernel over max(rows, cols).
template <class T, class M>
struct MeanEmas {
  Kokkos::View<T*, M> row, col;
  Kokkos::View<const double*, M> sums;
  std::int64_t row_offset, col_offset, row_entries, col_entries;
  double global_cols, global_rows;
  T beta, one_minus_beta;
  KOKKOS_FUNCTION void operator()(std::int64_t i) const {
    if (i < row_entries) row(i) = row(i) * beta + one_minus_beta * static_cast<T>(sums(row_offset + i) / global_cols);
    if (i < col_entries) col(i) = col(i) * beta + one_minus_beta * static_cast<T>(sums(col_offset + i) / global_rows);
  }
};

/// Σ_i R[b, i] over the local rows of each batch slice b, in order.
template <class T, class M>
struct RowTotals {
  Kokkos::View<const T*, M> row;
  Kokkos::View<double*, M> out;
  std::int64_t offset, rows;
  KOKKOS_FUNCTION void operator()(std::int64_t b) const {
    double s = 0;
    for (std::int64_t i = 0; i < rows; ++i) s += static_cast<double>(row(b * rows + i));
    out(offset + b) = s;
  }
};

/// rf = 1/sqrt(R / mean R) per batch slice (HuggingFace: (row / row.mean(-1)).rsqrt_()) and
/// cf = 1/sqrt(C) (col.rsqrt()); one kernel over max(rows, cols).
template <class T, class M>
struct Factors {
  Kokkos::View<const T*, M> row, col;
  Kokkos::View<T*, M> row_factor, col_factor;
  Kokkos::View<const double*, M> totals;
  std::int64_t offset, rows, row_entries, col_entries;
  double global_rows;
  KOKKOS_FUNCTION void operator()(std::int64_t i) const {
    if (i < row_entries) {
      const T mean = static_cast<T>(totals(offset + i / rows) / global_rows);
      row_factor(i) = T(1) / math::sqrt(row(i) / mean);
    }
    if (i < col_entries) col_factor(i) = T(1) / math::sqrt(col(i));
  }
};

/// The normalised gradient u = g / sqrt(V̂): (rf_i cf_j) g when factored, (1/sqrt(V)) g otherwise
/// (V updated by `update_second_moment` first).
template <class T, class M>
struct Direction {
  TensorRef<const T, M> g;
  bool factored = false;
  FlatIndex index{};
  Kokkos::View<const T*, M> row_factor, col_factor;  // factored
  Kokkos::View<T*, M> v;                             // unfactored
  T beta{}, one_minus_beta{}, eps1{};

  KOKKOS_INLINE_FUNCTION T operator()(std::int64_t k) const {
    if (factored) return (row_factor(index.row(k)) * col_factor(index.col(k))) * g[k];
    return (T(1) / math::sqrt(v(k))) * g[k];
  }
  /// V = V * beta + (1 - beta) * (g² + eps1) (unfactored only).
  KOKKOS_INLINE_FUNCTION void update_second_moment(std::int64_t k) const {
    const T x = g[k];
    v(k) = v(k) * beta + one_minus_beta * (x * x + eps1);
  }
};

/// Updates V (unfactored) and sums u² in double; `count` false on ranks that do not own the
/// piece (the kernel still updates V there).
template <class T, class M>
struct DirectionSquares {
  Direction<T, M> dir;
  bool count;
  KOKKOS_FUNCTION void operator()(std::int64_t k, double& s) const {
    if (!dir.factored) dir.update_second_moment(k);
    const double u = static_cast<double>(dir(k));
    if (count) s += u * u;
  }
};

/// Σx² (double) of a tensor's first elements.
template <class T, class M>
struct SumSquares {
  TensorRef<const T, M> x;
  KOKKOS_FUNCTION void operator()(std::int64_t k, double& s) const {
    const double v = static_cast<double>(x[k]);
    s += v * v;
  }
};

/// The Direction of a parameter: factored from `stats`' factors, or element-wise from `v`.
template <class T, class M>
Direction<T, M> direction(const TensorRef<const T, M>& g, const Geometry& geo, const Statistics<T, M>& stats,
                          const Kokkos::View<T*, M>& v, double beta, double eps1) {
  Direction<T, M> d;
  d.g = g;
  d.factored = geo.factored;
  d.index = FlatIndex::of(geo);
  d.row_factor = stats.row_factor;
  d.col_factor = stats.col_factor;
  d.v = v;
  d.beta = static_cast<T>(beta);
  d.one_minus_beta = static_cast<T>(1.0 - beta);
  d.eps1 = static_cast<T>(eps1);
  return d;
}

// ---- the factored update -----------------------------------------------------------------------

/// The kernel labels of one optimizer's factored statistics ("lather::<name>::row_sums", ...),
/// built once: Kokkos takes labels as std::string, and these are longer than the small-string
/// buffer, so building them per launch would allocate on every step.
struct Labels {
  std::string row_sums, col_sums, statistics_ema, row_totals, factors, update_squares, param_squares;
  explicit Labels(const std::string& name)
      : row_sums("lather::" + name + "::row_sums"),
        col_sums("lather::" + name + "::col_sums"),
        statistics_ema("lather::" + name + "::statistics_ema"),
        row_totals("lather::" + name + "::row_totals"),
        factors("lather::" + name + "::factors"),
        update_squares("lather::" + name + "::update_squares"),
        param_squares("lather::" + name + "::param_squares") {}
};

/// The Labels of an Algorithm (its `name`), built on its first step, not on every one.
template <class Algorithm>
const Labels& labels_of() {
  static const Labels l(Algorithm::name);
  return l;
}

/// What a step of the factored optimizers keeps from one step to the next: the reduction buffer
/// and the rounds laid out in it (their entry lists keep their capacity).
template <class M>
struct StepBuffers {
  Workspace<M> workspace;
  Round<M> sums, totals, scalars;
};

/// One parameter's factored statistic to update with quantity `q`: R, C <- EMA with `beta`.
/// `geo` points into the parameter's state (a copy would copy its shape vectors every step).
template <class Q, class T, class M>
struct Item {
  const Geometry* geo = nullptr;
  Statistics<T, M> stats;
  double beta;
  Q q;
  std::size_t sums_row = 0, sums_col = 0, total = 0;  // Round entries
};

/// Updates R and C of every item from its quantity (partial sums, one round of all-reduces over
/// the groups that split each dimension, EMA), then the factors (Σ R per batch slice, a second
/// round over TP for row-split parameters). Ranks call it together with the same items.
template <class Ctx, class Q, class T, class M>
void update_statistics(const Ctx& ctx, StepBuffers<M>& buffers, std::vector<Item<Q, T, M>>& items,
                       const Labels& labels) {
  using ExecSpace = typename Ctx::execution_space;
  using Range = Kokkos::RangePolicy<ExecSpace, Kokkos::IndexType<std::int64_t>>;
  if (items.empty()) return;
  Workspace<M>& ws = buffers.workspace;
  Round<M>& sums = buffers.sums;
  sums.clear();
  for (auto& it : items) {
    it.sums_row = sums.add(it.geo->row_sums, it.geo->row_entries());
    it.sums_col = sums.add(it.geo->col_sums, it.geo->col_entries());
  }
  sums.start(ctx.space, ws);
  for (auto& it : items) {
    const Geometry& g = *it.geo;
    if (g.valid() <= 0) continue;
    const std::int64_t r0 = g.begin / g.cols, r1 = (g.end + g.cols - 1) / g.cols;
    Kokkos::parallel_for(
        labels.row_sums,
        Kokkos::TeamPolicy<ExecSpace>(ctx.space, static_cast<int>(r1 - r0), Kokkos::AUTO),
        RowPartialSums<Q, M, ExecSpace>{it.q, sums.view(), sums.offset(it.sums_row), r0, g.begin, g.end, g.cols});
    const std::int64_t slice = g.rows * g.cols;
    const std::int64_t b0 = g.begin / slice, b1 = (g.end + slice - 1) / slice;
    Kokkos::parallel_for(labels.col_sums, Range(ctx.space, 0, (b1 - b0) * g.cols),
                         ColPartialSums<Q, M>{it.q, sums.view(), sums.offset(it.sums_col), b0, g.begin, g.end, g.rows,
                                              g.cols});
  }
  sums.reduce(ctx);
  for (auto& it : items) {
    const Geometry& g = *it.geo;
    Kokkos::parallel_for(labels.statistics_ema,
                         Range(ctx.space, 0, std::max(g.row_entries(), g.col_entries())),
                         MeanEmas<T, M>{it.stats.row, it.stats.col, sums.view(), sums.offset(it.sums_row),
                                        sums.offset(it.sums_col), g.row_entries(), g.col_entries(),
                                        static_cast<double>(g.global_cols), static_cast<double>(g.global_rows),
                                        static_cast<T>(it.beta), static_cast<T>(1.0 - it.beta)});
  }
  Round<M>& totals = buffers.totals;  // reuses the buffer: ordered after the EMA kernels on the same space
  totals.clear();
  for (auto& it : items) it.total = totals.add(it.geo->row_total, it.geo->batches);
  totals.start(ctx.space, ws);
  for (auto& it : items)
    Kokkos::parallel_for(labels.row_totals, Range(ctx.space, 0, it.geo->batches),
                         RowTotals<T, M>{it.stats.row, totals.view(), totals.offset(it.total), it.geo->rows});
  totals.reduce(ctx);
  for (auto& it : items) {
    const Geometry& g = *it.geo;
    Kokkos::parallel_for(labels.factors, Range(ctx.space, 0, std::max(g.row_entries(), g.col_entries())),
                         Factors<T, M>{it.stats.row, it.stats.col, it.stats.row_factor, it.stats.col_factor,
                                       totals.view(), totals.offset(it.total), g.rows, g.row_entries(),
                                       g.col_entries(), static_cast<double>(g.global_rows)});
  }
}

/// Updates V (unfactored parameters) and writes Σu² over this rank's valid elements of parameter
/// `i` into `entry` of `round` (0 on a rank that does not own the piece, so that the sum over
/// both groups counts every element once). Asynchronous on ctx.space.
template <class Ctx, class T, class M>
void sum_direction_squares(const Ctx& ctx, std::size_t i, const Direction<T, M>& dir, std::int64_t valid,
                           const Round<M>& round, std::size_t entry, const Labels& labels) {
  using Range = Kokkos::RangePolicy<typename Ctx::execution_space, Kokkos::IndexType<std::int64_t>>;
  Kokkos::parallel_reduce(labels.update_squares, Range(ctx.space, 0, valid),
                          DirectionSquares<T, M>{dir, ctx.owns_piece(i)},
                          Kokkos::subview(round.view(), round.offset(entry)));
}

/// Writes Σx² over this rank's valid elements of parameter `i` (owner-counted) into `entry`.
template <class Ctx, class T, class M>
void sum_squares(const Ctx& ctx, std::size_t i, const TensorRef<const T, M>& x, std::int64_t valid,
                 const Round<M>& round, std::size_t entry, const Labels& labels) {
  using Range = Kokkos::RangePolicy<typename Ctx::execution_space, Kokkos::IndexType<std::int64_t>>;
  if (!ctx.owns_piece(i)) return;  // the entry stays 0
  Kokkos::parallel_reduce(labels.param_squares, Range(ctx.space, 0, valid), SumSquares<T, M>{x},
                          Kokkos::subview(round.view(), round.offset(entry)));
}

/// rms = sqrt(Σx²) / sqrt(n), as `x.norm(2) / numel ** 0.5`.
inline double rms(double sum_squares, std::int64_t n) {
  return n > 0 ? std::sqrt(sum_squares) / std::sqrt(static_cast<double>(n)) : 0.0;
}

}  // namespace lather::impl::factored

#endif
