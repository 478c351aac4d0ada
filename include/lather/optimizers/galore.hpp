// SPDX-License-Identifier: Apache-2.0
/// \file
/// \brief GaLore-AdamW (Zhao et al. 2024, "GaLore: Memory-Efficient LLM Training by Gradient
/// Low-Rank Projection"), as `galore_torch/adamw.py` computes it, with optional 8-bit block-wise
/// quantized Adam states (bitsandbytes' format, as `galore_torch/adamw8bit.py` uses), on whole,
/// tensor-parallel or ZeRO-sharded parameters, equal to the single-device result however the
/// parameter is split (including a split of the projected dimension).
///
/// \code{.bib}
/// @inproceedings{zhao2024galore,
///   title={GaLore: Memory-Efficient LLM Training by Gradient Low-Rank Projection},
///   author={Zhao, Jiawei and Zhang, Zhenyu and Chen, Beidi and Wang, Zhangyang and Anandkumar, Anima and Tian, Yuandong},
///   booktitle={International Conference on Machine Learning}, year={2024}}
/// \endcode
#ifndef LATHER_OPTIMIZERS_GALORE_HPP
#define LATHER_OPTIMIZERS_GALORE_HPP

#include <lather/impl/backends/svd_host.hpp>
#include <lather/impl/kernels/diagonal.hpp>
#include <lather/impl/kernels/launch.hpp>
#include <lather/impl/label.hpp>
#include <lather/impl/math.hpp>
#include <lather/impl/quantization.hpp>
#include <lather/impl/sharded_optimizer.hpp>

#include <Kokkos_Core.hpp>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <string>
#include <utility>
#include <vector>

namespace lather {

/// Which side of a gradient GaLore projects (galore_torch's `proj_type`).
enum class GaLoreProjection : std::int64_t {
  /// "std": right (project dim 1, R = G P^T with P r x n) when m >= n, else left (project dim 0,
  /// R = P^T G with P m x r): the smaller dimension is projected. Decided from the global shape.
  standard = 0,
  /// "reverse_std": left when m >= n, else right.
  reverse_standard = 1,
  /// Always right: R = G P^T, P = the first r rows of V^T (r x n).
  right = 2,
  /// Always left: R = P^T G, P = the first r columns of U (m x r).
  left = 3,
};

/// \brief Options of GaLoreAdamW, named and defaulted as galore_torch's AdamW and its parameter
/// groups (`rank`, `update_proj_gap`, `scale`, `proj_type`), plus bitsandbytes' 8-bit switches.
struct GaLoreOptions {
  double lr = 1e-3;
  std::array<double, 2> betas = {0.9, 0.999};
  double eps = 1e-6;
  /// Decoupled decay applied after the update: W += -lr * weight_decay * W.
  double weight_decay = 0.0;
  /// Fold Adam's bias corrections into the step size: lr * sqrt(1 - b2^t) / (1 - b1^t).
  bool correct_bias = true;
  /// Projection rank (clipped to min(m, n)); 0: no projection, plain AdamW for this group (like
  /// galore_torch's groups without "rank").
  std::int64_t rank = 128;
  /// The projector is recomputed (SVD of the gradient) on steps 1, gap + 1, 2 gap + 1, ...
  std::int64_t update_proj_gap = 200;
  /// Multiplies the back-projected update of projected parameters.
  double scale = 0.25;
  GaLoreProjection proj_type = GaLoreProjection::standard;
  /// 8-bit block-wise Adam states (bitsandbytes' dynamic maps, a float absmax per block).
  bool quantize_states = false;
  /// Elements per quantization block: 256 in current bitsandbytes, 2048 in older releases.
  std::int64_t block_size = 256;
  /// States with fewer elements (global count) stay in full precision (bitsandbytes' rule).
  std::int64_t min_8bit_size = 4096;

  template <class O, class F>
  static void visit_fields(O& o, F&& f) {
    f("lr", o.lr); f("betas", o.betas); f("eps", o.eps); f("weight_decay", o.weight_decay);
    f("correct_bias", o.correct_bias); f("rank", o.rank); f("update_proj_gap", o.update_proj_gap);
    f("scale", o.scale); f("proj_type", o.proj_type); f("quantize_states", o.quantize_states);
    f("block_size", o.block_size); f("min_8bit_size", o.min_8bit_size);
  }
};

/// \brief How GaLoreAdamW treats one parameter on this rank (GaLoreAdamW::layout()).
struct GaLoreLayout {
  bool projected = false;  ///< low-rank Adam (else plain AdamW in full space)
  bool right = true;       ///< R = G P^T (else R = P^T G); meaningful when projected
  std::int64_t rows = 0, cols = 0;  ///< the global matrix view (shape[0], numel / shape[0])
  std::int64_t rank = 0;            ///< effective rank min(options.rank, rows, cols); 0 when not projected
  std::vector<std::int64_t> state_shape;      ///< this rank's Adam state (low-rank slice, or its elements)
  std::vector<std::int64_t> projector_shape;  ///< (rank, cols) or (rows, rank); empty when not projected
  bool quantized = false;       ///< 8-bit states
  /// The quantization blocks of every rank are the single-device blocks (agreed over the ranks at
  /// construction): the 8-bit result then equals the single-device one.
  bool blocks_aligned = true;
  bool reduced_over_tp = false; ///< the low-rank gradient is summed over the TP group every step
  bool reduced_over_dp = false; ///< ... over the DP group (ZeRO)
};

namespace impl {

/// Everything GaLore needs to know about one parameter on this rank: a pure function of the
/// options and the Sharding, the same in make_state and in GaLoreAdamW::layout().
struct GaLoreGeometry {
  GaLoreLayout layout;
  std::int64_t ml = 0, nl = 0;     // the TP-local matrix view
  std::int64_t row_off = 0;        // global row of TP-local row 0
  bool cols_contiguous = true;     // global column = col_off + local column
  std::int64_t col_off = 0;
  std::vector<std::int64_t> col_map;  // global column of each local column, when not contiguous
  std::int64_t begin = 0, end = 0;    // this rank's real elements: TP-local flat [begin, end)
  std::int64_t state_numel = 0;       // elements of the Adam state on this rank
  std::int64_t global_state_numel = 0;
  std::int64_t block_size = 1;
  std::int64_t blocks = 0;            // quantization blocks on this rank
};

/// Global row-major flat index of the TP-local flat index f of TP rank `tp_rank` of `s`.
inline std::int64_t galore_global_flat(const Sharding& s, int tp_rank, std::int64_t f) {
  // The local extents are computed in place (local_shape() would allocate, and a refresh step
  // calls this for every element it gathers).
  const int nd = s.rank();
  const std::int64_t off = s.tp_split() ? s.global_shape[static_cast<std::size_t>(s.tp_dim)] / s.tp_size * tp_rank : 0;
  std::int64_t g = 0, stride = 1;
  for (int d = nd - 1; d >= 0; --d) {
    const std::int64_t ge = s.global_shape[static_cast<std::size_t>(d)];
    const std::int64_t e = d == s.tp_dim ? ge / s.tp_size : ge;
    std::int64_t idx = e > 0 ? f % e : 0;
    f = e > 0 ? f / e : 0;
    if (d == s.tp_dim) idx += off;
    g += idx * stride;
    stride *= s.global_shape[static_cast<std::size_t>(d)];
  }
  return g;
}

/// Whether the blocks of `block` consecutive local state elements [0, n) are exactly blocks of the
/// global state [0, total): every local block starts at a multiple of `block` of the global index
/// and has the global block's length. `gidx` must be strictly increasing (it is for every layout
/// here), so a block whose first and last elements are `length - 1` apart is contiguous.
template <class F>
bool galore_blocks_aligned(std::int64_t n, std::int64_t total, std::int64_t block, F&& gidx) {
  for (std::int64_t lb = 0; lb < n; lb += block) {
    const std::int64_t le = std::min(lb + block, n), g0 = gidx(lb);
    if (g0 % block != 0) return false;
    if (le - lb != std::min(g0 + block, total) - g0) return false;
    if (gidx(le - 1) - g0 != le - 1 - lb) return false;
  }
  return true;
}

inline GaLoreGeometry galore_geometry(const GaLoreOptions& o, const Sharding& s) {
  GaLoreGeometry g;
  GaLoreLayout& L = g.layout;
  const int nd = s.rank();
  const std::int64_t numel = s.global_numel();
  L.rows = nd >= 1 ? s.global_shape[0] : 1;
  L.cols = nd >= 1 ? (L.rows > 0 ? numel / L.rows : 0) : 1;
  const auto local = s.local_shape();
  g.ml = nd >= 1 ? local[0] : 1;
  g.nl = g.ml > 0 ? s.local_numel() / g.ml : 0;
  g.begin = s.begin();
  g.end = s.end();
  g.block_size = o.block_size > 0 ? o.block_size : 1;
  L.projected = nd >= 2 && o.rank > 0 && L.rows > 0 && L.cols > 0;
  if (L.projected) {
    const bool tall = L.rows >= L.cols;
    switch (o.proj_type) {
      case GaLoreProjection::standard: L.right = tall; break;
      case GaLoreProjection::reverse_standard: L.right = !tall; break;
      case GaLoreProjection::right: L.right = true; break;
      case GaLoreProjection::left: L.right = false; break;
    }
    L.rank = std::min(o.rank, std::min(L.rows, L.cols));
    g.row_off = s.tp_split() && s.tp_dim == 0 ? s.tp_offset() : 0;
    // Global column of each TP-local column (a split of dim >= 1 of the matrix view).
    if (s.tp_split() && s.tp_dim >= 1) {
      std::vector<std::int64_t> map(static_cast<std::size_t>(g.nl));
      for (std::int64_t jl = 0; jl < g.nl; ++jl) map[static_cast<std::size_t>(jl)] = galore_global_flat(s, s.tp_rank, jl) % L.cols;
      g.col_off = g.nl > 0 ? map[0] : 0;
      for (std::int64_t jl = 0; jl < g.nl; ++jl)
        if (map[static_cast<std::size_t>(jl)] != g.col_off + jl) g.cols_contiguous = false;
      if (!g.cols_contiguous) g.col_map = std::move(map);
    }
    const std::int64_t r = L.rank;
    // The Adam state is the TP-local low-rank tensor: R's rows of this TP rank (right, rows
    // split) or its columns (left, columns split); all of R when TP splits the projected dim.
    L.state_shape = L.right ? std::vector<std::int64_t>{g.ml, r} : std::vector<std::int64_t>{r, g.nl};
    L.projector_shape = L.right ? std::vector<std::int64_t>{r, L.cols} : std::vector<std::int64_t>{L.rows, r};
    g.state_numel = g.ml * g.nl > 0 ? (L.right ? g.ml : g.nl) * r : 0;
    g.global_state_numel = (L.right ? L.rows : L.cols) * r;
    L.reduced_over_tp = s.tp_split() && (L.right ? s.tp_dim >= 1 : s.tp_dim == 0);
    L.reduced_over_dp = s.zero;
  } else {
    L.state_shape = s.zero ? std::vector<std::int64_t>{s.valid_numel()} : s.local_shape();
    g.state_numel = s.valid_numel();
    g.global_state_numel = numel;
  }
  L.quantized = o.quantize_states && g.global_state_numel >= o.min_8bit_size && g.global_state_numel > 0;
  if (L.quantized) {
    g.blocks = quant::num_blocks(g.state_numel, g.block_size);
    const std::int64_t B = g.block_size;
    if (L.projected) {
      const std::int64_t r = L.rank;
      if (L.right)
        L.blocks_aligned = galore_blocks_aligned(g.state_numel, g.global_state_numel, B,
                                                 [&](std::int64_t l) { return g.row_off * r + l; });
      else
        L.blocks_aligned = galore_blocks_aligned(g.state_numel, g.global_state_numel, B, [&](std::int64_t l) {
          const std::int64_t jl = l % g.nl;
          const std::int64_t j = g.cols_contiguous ? g.col_off + jl : g.col_map[static_cast<std::size_t>(jl)];
          return (l / g.nl) * L.cols + j;
        });
    } else if (s.tp_split() || s.zero) {
      L.blocks_aligned = galore_blocks_aligned(g.state_numel, g.global_state_numel, B, [&](std::int64_t l) {
        return galore_global_flat(s, s.tp_rank, g.begin + l);
      });
    }
  }
  return g;
}

namespace kernels {

/// Outputs per work item of the projection kernels: independent accumulators (instruction-level
/// parallelism, contiguous loads) without changing any output's summation order.
inline constexpr std::int64_t galore_block = 8;

/// Partial low-rank gradient of a right projection over this rank's elements:
/// out(il, k) = sum over this rank's columns jl of row il of G(il, jl) * P(k, col(jl)), in double,
/// in increasing column order: one sequential sum per output entry, the same on every back end.
/// Kept in double until the partial sums of the ranks are added, then rounded to T once. One
/// work item: row il, outputs k0 .. k0 + 7.
template <class T, class M>
struct GaLoreProjectRight {
  TensorRef<const T, M> grad;
  Kokkos::View<const T*, M> projector;
  Kokkos::View<const std::int64_t*, M> col_map;
  Kokkos::View<double*, M> out;
  std::int64_t r, n, nl, begin, end, col_off;
  bool cols_contiguous;
  KOKKOS_FUNCTION void operator()(std::int64_t item) const {
    constexpr std::int64_t B = galore_block;
    const std::int64_t kblocks = (r + B - 1) / B;
    const std::int64_t il = item / kblocks, k0 = item % kblocks * B, kn = r - k0 < B ? r - k0 : B;
    const std::int64_t row = il * nl;
    const std::int64_t jlo = begin > row ? begin - row : 0;
    const std::int64_t jhi = end - row < nl ? end - row : nl;
    const T* p[B];
    for (std::int64_t q = 0; q < B; ++q) p[q] = projector.data() + (k0 + (q < kn ? q : kn - 1)) * n;
    double acc[B] = {};
    for (std::int64_t jl = jlo; jl < jhi; ++jl) {
      const std::int64_t j = cols_contiguous ? col_off + jl : col_map(jl);
      const double g = static_cast<double>(grad[row + jl - begin]);
      for (std::int64_t q = 0; q < B; ++q) acc[q] += g * static_cast<double>(p[q][j]);
    }
    for (std::int64_t q = 0; q < kn; ++q) out(il * r + k0 + q) = acc[q];
  }
  static std::int64_t items(std::int64_t ml, std::int64_t rank) { return ml * ((rank + galore_block - 1) / galore_block); }
};

/// Partial low-rank gradient of a left projection: out(k, jl) = sum over this rank's rows il of
/// column jl of P(row_off + il, k) * G(il, jl), in double, in increasing row order. One work
/// item: row k of the output, columns j0 .. j0 + 7.
template <class T, class M>
struct GaLoreProjectLeft {
  TensorRef<const T, M> grad;
  Kokkos::View<const T*, M> projector;
  Kokkos::View<double*, M> out;
  std::int64_t r, ml, nl, begin, end, row_off;
  KOKKOS_FUNCTION void operator()(std::int64_t item) const {
    constexpr std::int64_t B = galore_block;
    const std::int64_t jblocks = (nl + B - 1) / B;
    const std::int64_t k = item / jblocks, j0 = item % jblocks * B, jn = nl - j0 < B ? nl - j0 : B;
    // Rows holding one of this rank's elements in columns [j0, j0 + jn).
    const std::int64_t ilo = begin / nl;
    std::int64_t ihi = (end + nl - 1) / nl;
    if (ihi > ml) ihi = ml;
    double acc[B] = {};
    for (std::int64_t il = ilo; il < ihi; ++il) {
      const double pk = static_cast<double>(projector((row_off + il) * r + k));
      const std::int64_t base = il * nl + j0;
      if (jn == B && base >= begin && base + B <= end) {
        for (std::int64_t q = 0; q < B; ++q) acc[q] += pk * static_cast<double>(grad[base + q - begin]);
      } else {
        for (std::int64_t q = 0; q < jn; ++q)
          if (base + q >= begin && base + q < end) acc[q] += pk * static_cast<double>(grad[base + q - begin]);
      }
    }
    for (std::int64_t q = 0; q < jn; ++q) out(k * nl + j0 + q) = acc[q];
  }
  static std::int64_t items(std::int64_t nl, std::int64_t rank) { return rank * ((nl + galore_block - 1) / galore_block); }
};

/// W += -step * (scale * project_back(N)) on this rank's elements, then W += -lr*wd * W:
/// right: project_back(N)(i, j) = sum_k N(il, k) P(k, j); left: sum_k P(i, k) N(k, jl); the sums
/// in double, in increasing k. One work item: TP-local row il0 + item / jblocks, columns
/// j0 .. j0 + 7 (elements outside this rank's range are skipped).
template <class T, class M>
struct GaLoreBackProject {
  TensorRef<T, M> param;
  Kokkos::View<const double*, M> lowrank;  // N (values of T)
  Kokkos::View<const T*, M> projector;
  Kokkos::View<const std::int64_t*, M> col_map;
  std::int64_t r, n, nl, begin, end, row_off, col_off;
  bool right, cols_contiguous, decay;
  T scale, neg_step, neg_decay;
  KOKKOS_FUNCTION void operator()(std::int64_t item) const {
    constexpr std::int64_t B = galore_block;
    const std::int64_t jblocks = (nl + B - 1) / B;
    const std::int64_t il = begin / nl + item / jblocks, j0 = item % jblocks * B, jn = nl - j0 < B ? nl - j0 : B;
    std::int64_t jq[B];  // local columns, the last one repeated past the row's end
    for (std::int64_t q = 0; q < B; ++q) jq[q] = j0 + (q < jn ? q : jn - 1);
    double acc[B] = {};
    if (right && cols_contiguous && jn == B) {  // contiguous loads: the q loop vectorizes
      const double* nrow = lowrank.data() + il * r;
      for (std::int64_t k = 0; k < r; ++k) {
        const double nk = nrow[k];
        const T* prow = projector.data() + k * n + col_off + j0;
        for (std::int64_t q = 0; q < B; ++q) acc[q] += nk * static_cast<double>(prow[q]);
      }
    } else if (right) {
      std::int64_t j[B];
      for (std::int64_t q = 0; q < B; ++q) j[q] = cols_contiguous ? col_off + jq[q] : col_map(jq[q]);
      const double* nrow = lowrank.data() + il * r;
      for (std::int64_t k = 0; k < r; ++k) {
        const double nk = nrow[k];
        const T* prow = projector.data() + k * n;
        for (std::int64_t q = 0; q < B; ++q) acc[q] += nk * static_cast<double>(prow[j[q]]);
      }
    } else if (jn == B) {
      const T* prow = projector.data() + (row_off + il) * r;
      for (std::int64_t k = 0; k < r; ++k) {
        const double pk = static_cast<double>(prow[k]);
        const double* nrow = lowrank.data() + k * nl + j0;
        for (std::int64_t q = 0; q < B; ++q) acc[q] += pk * nrow[q];
      }
    } else {
      const T* prow = projector.data() + (row_off + il) * r;
      for (std::int64_t k = 0; k < r; ++k) {
        const double pk = static_cast<double>(prow[k]);
        const double* nrow = lowrank.data() + k * nl;
        for (std::int64_t q = 0; q < B; ++q) acc[q] += pk * nrow[jq[q]];
      }
    }
    for (std::int64_t q = 0; q < jn; ++q) {
      const std::int64_t f = il * nl + j0 + q;
      if (f < begin || f >= end) continue;
      const T u = static_cast<T>(acc[q]) * scale;
      T p = param[f - begin];
      p = p + neg_step * u;
      if (decay) p = p + neg_decay * p;
      param[f - begin] = p;
    }
  }
  static std::int64_t items(std::int64_t begin, std::int64_t end, std::int64_t nl) {
    if (end <= begin) return 0;
    return ((end - 1) / nl - begin / nl + 1) * ((nl + galore_block - 1) / galore_block);
  }
};

/// Adam's input and output on the low-rank workspace (double): reads R (rounded to T), writes
/// N = m / (sqrt(v) + eps) in place (each element reads its own R before writing its N).
template <class T, class M>
struct GaLoreLowRankIO {
  Kokkos::View<double*, M> buf;
  KOKKOS_INLINE_FUNCTION T in(std::int64_t l) const { return static_cast<T>(buf(l)); }
  KOKKOS_INLINE_FUNCTION void out(std::int64_t l, T n) const { buf(l) = static_cast<double>(n); }
};

/// Adam's input and output in full space: reads the gradient, applies W += -step * N, then
/// W += -lr*wd * W.
template <class T, class M>
struct GaLoreFullIO {
  TensorRef<T, M> param;
  TensorRef<const T, M> grad;
  T neg_step, neg_decay;
  bool decay;
  KOKKOS_INLINE_FUNCTION T in(std::int64_t l) const { return grad[l]; }
  KOKKOS_INLINE_FUNCTION void out(std::int64_t l, T n) const {
    T p = param[l];
    p = p + neg_step * n;
    if (decay) p = p + neg_decay * p;
    param[l] = p;
  }
};

/// Full-precision Adam moments: m = b1 m + (1-b1) g, v = b2 v + (1-b2) g g, N = m / (sqrt(v) + eps).
template <class T, class M, class IO>
struct GaLoreAdam {
  IO io;
  Kokkos::View<T*, M> exp_avg, exp_avg_sq;
  T beta1, one_minus_beta1, beta2, one_minus_beta2, eps;
  KOKKOS_FUNCTION void operator()(std::int64_t l) const {
    const T g = io.in(l);
    const T m = ema(exp_avg(l), g, beta1, one_minus_beta1);
    const T v = second_moment(exp_avg_sq(l), g, beta2, one_minus_beta2);
    exp_avg(l) = m;
    exp_avg_sq(l) = v;
    io.out(l, m / (math::sqrt(v) + eps));
  }
};

/// 8-bit Adam moments, one team per block: dequantize (map[code] * absmax, as
/// quant::dequantize), the Adam update in T, N from the updated (unquantized) moments as
/// bitsandbytes' kernels do, then requantize with the block's new absmax (as quant::quantize:
/// absmax = float(max |x|), code = nearest entry to x / absmax). Signed map for m, unsigned for v.
template <class T, class M, class ExecSpace, class IO>
struct GaLoreAdam8bit {
  using member_type = typename Kokkos::TeamPolicy<ExecSpace>::member_type;
  IO io;
  Kokkos::View<std::uint8_t*, M> m_codes, v_codes;
  Kokkos::View<float*, M> m_absmax, v_absmax;
  Kokkos::View<const float[quant::map_size], M> signed_map, unsigned_map;
  std::int64_t n, block_size;
  T beta1, one_minus_beta1, beta2, one_minus_beta2, eps;

  KOKKOS_INLINE_FUNCTION T new_m(std::int64_t l, T am, T g) const {
    return ema(static_cast<T>(signed_map(m_codes(l))) * am, g, beta1, one_minus_beta1);
  }
  KOKKOS_INLINE_FUNCTION T new_v(std::int64_t l, T av, T g) const {
    return second_moment(static_cast<T>(unsigned_map(v_codes(l))) * av, g, beta2, one_minus_beta2);
  }
  KOKKOS_FUNCTION void operator()(const member_type& team) const {
    const std::int64_t b = team.league_rank();
    const std::int64_t lo = b * block_size, hi = lo + block_size < n ? lo + block_size : n;
    const T am = static_cast<T>(m_absmax(b)), av = static_cast<T>(v_absmax(b));
    T mmax = T(0), vmax = T(0);
    Kokkos::parallel_reduce(
        Kokkos::TeamThreadRange(team, lo, hi),
        [&](std::int64_t l, T& x) {
          const T a = math::abs(new_m(l, am, io.in(l)));
          if (x < a) x = a;
        },
        Kokkos::Max<T>(mmax));
    Kokkos::parallel_reduce(
        Kokkos::TeamThreadRange(team, lo, hi),
        [&](std::int64_t l, T& x) {
          const T a = new_v(l, av, io.in(l));
          if (x < a) x = a;
        },
        Kokkos::Max<T>(vmax));
    const float sm = static_cast<float>(mmax), sv = static_cast<float>(vmax);
    const float* smap = signed_map.data();
    const float* umap = unsigned_map.data();
    Kokkos::parallel_for(Kokkos::TeamThreadRange(team, lo, hi), [&](std::int64_t l) {
      const T g = io.in(l);
      const T m = new_m(l, am, g), v = new_v(l, av, g);
      io.out(l, m / (math::sqrt(v) + eps));
      m_codes(l) = quant::nearest_code(smap, sm == 0.0f ? T(0) : m / static_cast<T>(sm));
      v_codes(l) = quant::nearest_code(umap, sv == 0.0f ? T(0) : v / static_cast<T>(sv));
    });
    team.team_barrier();  // every element has read the old absmax
    Kokkos::single(Kokkos::PerTeam(team), [&]() {
      m_absmax(b) = sm;
      v_absmax(b) = sv;
    });
  }
};

/// Copies this rank's real gradient elements into a contiguous buffer.
template <class T, class M>
struct GaLorePack {
  TensorRef<const T, M> grad;
  Kokkos::View<T*, M> out;
  KOKKOS_FUNCTION void operator()(std::int64_t e) const { out(e) = grad[e]; }
};

}  // namespace kernels

struct GaLoreAlgorithm {
  using options_type = GaLoreOptions;
  static constexpr const char* name = "GaLoreAdamW";

  static void validate(const GaLoreOptions& o, const OptionCheck& c) {
    c.at_least("lr", o.lr, 0.0);
    c.at_least("eps", o.eps, 0.0);
    c.in_half_open("betas[0]", o.betas[0], 0.0, 1.0);
    c.in_half_open("betas[1]", o.betas[1], 0.0, 1.0);
    c.at_least("weight_decay", o.weight_decay, 0.0);
    c.at_least("rank", static_cast<double>(o.rank), 0.0);
    c.at_least("update_proj_gap", static_cast<double>(o.update_proj_gap), 1.0);
    c.at_least("scale", o.scale, 0.0);
    c.require(std::isfinite(o.scale), concat("invalid option 'scale' = ", o.scale, " (must be finite)"));
    c.require(o.proj_type == GaLoreProjection::standard || o.proj_type == GaLoreProjection::reverse_standard ||
                  o.proj_type == GaLoreProjection::right || o.proj_type == GaLoreProjection::left,
              concat("invalid option 'proj_type' = ", static_cast<std::int64_t>(o.proj_type),
                     " (GaLoreProjection::standard, reverse_standard, right or left)"));
    c.at_least("block_size", static_cast<double>(o.block_size), 1.0);
    c.at_least("min_8bit_size", static_cast<double>(o.min_8bit_size), 0.0);
  }

  /// Options that size the state cannot change after construction.
  static bool same_state_layout(const GaLoreOptions& a, const GaLoreOptions& b) {
    return a.rank == b.rank && a.proj_type == b.proj_type && a.quantize_states == b.quantize_states &&
           a.block_size == b.block_size && a.min_8bit_size == b.min_8bit_size;
  }

  template <class T, class M>
  struct State {
    GaLoreGeometry geo;
    Kokkos::View<T*, M> exp_avg, exp_avg_sq;  // full precision (empty when quantized)
    Kokkos::View<std::uint8_t*, M> exp_avg_codes, exp_avg_sq_codes;
    Kokkos::View<float*, M> exp_avg_absmax, exp_avg_sq_absmax;
    Kokkos::View<float[quant::map_size], M> signed_map, unsigned_map;
    Kokkos::View<T*, M> projector;                 // full projector, row-major (empty when not projected)
    Kokkos::View<std::int64_t*, M> col_map;        // TP-local column -> global column, when not contiguous
    Kokkos::View<double*, M> lowrank;  // workspace: R, then N; one buffer shared by every parameter
    template <class F>
    void visit(F&& f) {
      const GaLoreLayout& L = geo.layout;
      if (L.quantized) {
        const std::vector<std::int64_t> blocks{geo.blocks};
        f("exp_avg_codes", exp_avg_codes, L.state_shape);
        f("exp_avg_absmax", exp_avg_absmax, blocks);
        f("exp_avg_sq_codes", exp_avg_sq_codes, L.state_shape);
        f("exp_avg_sq_absmax", exp_avg_sq_absmax, blocks);
      } else {
        f("exp_avg", exp_avg, L.state_shape);
        f("exp_avg_sq", exp_avg_sq, L.state_shape);
      }
      if (L.projected) f("projector", projector, L.projector_shape);
    }
  };

  /// What the step keeps between steps (ShardedOptimizer holds it): the projector refresh's
  /// buffers (the gathered gradient on the way to the host, the full gradient, the SVD's
  /// factors, each parameter's new projector), sized by the first refresh (step 1) and reused by
  /// the next ones, so that no step after the first allocates.
  template <class T, class M>
  struct Scratch {
    using host_view = Kokkos::View<T*, Kokkos::HostSpace>;
    std::vector<std::vector<T>> fresh;  ///< per parameter: its new projector (row-major) this step
    std::vector<char> refreshed;        ///< per parameter: whether `fresh` holds this step's
    Kokkos::View<T*, M> packed;         ///< this rank's gradient elements packed (strided gradients only)
    host_view local, chunk, chunks, tp_all;  ///< the gathers over DP and TP (sharded parameters only)
    Kokkos::View<double*, Kokkos::HostSpace> range, ranges;
    std::vector<T> full, u, s, vt;
    void reserve(std::size_t n) {
      fresh.resize(n);
      refreshed.assign(n, 0);
    }
    [[nodiscard]] std::size_t bytes() const {
      std::size_t b = 0;
      for (const auto& p : fresh) b += p.capacity() * sizeof(T);
      for (const auto* v : {&full, &u, &s, &vt}) b += v->capacity() * sizeof(T);
      for (const auto* v : {&local, &chunk, &chunks, &tp_all}) b += v->span() * sizeof(T);
      b += packed.span() * sizeof(T) + (range.span() + ranges.span()) * sizeof(double);
      return b;
    }
    void release() {
      for (auto& p : fresh) std::vector<T>().swap(p);
      for (auto* v : {&full, &u, &s, &vt}) std::vector<T>().swap(*v);
      for (auto* v : {&local, &chunk, &chunks, &tp_all}) *v = host_view();
      packed = Kokkos::View<T*, M>();
      range = ranges = Kokkos::View<double*, Kokkos::HostSpace>();
    }
  };

  template <class T, class M>
  static State<T, M> make_state(const GaLoreOptions& o, const Sharding& s, std::int64_t) {
    State<T, M> st;
    st.geo = galore_geometry(o, s);
    const GaLoreGeometry& g = st.geo;
    const auto n = static_cast<std::size_t>(g.state_numel);
    if (g.layout.quantized) {
      const auto nb = static_cast<std::size_t>(g.blocks);
      st.exp_avg_codes = Kokkos::View<std::uint8_t*, M>("lather::GaLoreAdamW::exp_avg_codes", n);
      st.exp_avg_sq_codes = Kokkos::View<std::uint8_t*, M>("lather::GaLoreAdamW::exp_avg_sq_codes", n);
      st.exp_avg_absmax = Kokkos::View<float*, M>("lather::GaLoreAdamW::exp_avg_absmax", nb);
      st.exp_avg_sq_absmax = Kokkos::View<float*, M>("lather::GaLoreAdamW::exp_avg_sq_absmax", nb);
      st.signed_map = make_map<M>(true);
      st.unsigned_map = make_map<M>(false);
    } else {
      st.exp_avg = Kokkos::View<T*, M>("lather::GaLoreAdamW::exp_avg", n);
      st.exp_avg_sq = Kokkos::View<T*, M>("lather::GaLoreAdamW::exp_avg_sq", n);
    }
    if (g.layout.projected) {
      const auto& ps = g.layout.projector_shape;
      st.projector = Kokkos::View<T*, M>("lather::GaLoreAdamW::projector", static_cast<std::size_t>(ps[0] * ps[1]));
      if (!g.cols_contiguous) {
        st.col_map = Kokkos::View<std::int64_t*, M>("lather::GaLoreAdamW::col_map", g.col_map.size());
        Kokkos::View<const std::int64_t*, Kokkos::HostSpace, Kokkos::MemoryTraits<Kokkos::Unmanaged>> h(
            g.col_map.data(), g.col_map.size());
        Kokkos::deep_copy(st.col_map, h);
      }
    }
    return st;
  }

  /// The step, in three phases so that an SVD failure changes nothing: (1) at refresh steps,
  /// gather each projected parameter's full gradient and take its SVD (host, LAPACK); (2) store
  /// the new projectors; (3) per parameter: project this rank's elements, sum over the groups
  /// that split the contracted dimension, Adam on the low-rank slice, back-project this rank's
  /// elements (or plain AdamW in full space).
  template <class Ctx>
  static void step(Ctx& ctx) {
    using T = typename Ctx::value_type;
    share_workspace(ctx);
    const std::size_t count = ctx.active.size();
    auto& scratch = ctx.scratch;
    std::fill(scratch.refreshed.begin(), scratch.refreshed.end(), char{0});
    for (std::size_t k = 0; k < count; ++k) {
      const std::size_t i = ctx.active[k];
      const auto& geo = ctx.states[i].geo;
      if (geo.layout.projected && (ctx.steps[i] - 1) % ctx.options[i]->update_proj_gap == 0) {
        compute_projector(ctx, i, geo, scratch.fresh[i]);
        scratch.refreshed[i] = 1;
      }
    }
    for (std::size_t k = 0; k < count; ++k) {
      const std::size_t i = ctx.active[k];
      if (!scratch.refreshed[i]) continue;
      const std::vector<T>& p = scratch.fresh[i];
      Kokkos::View<const T*, Kokkos::HostSpace, Kokkos::MemoryTraits<Kokkos::Unmanaged>> h(p.data(), p.size());
      Kokkos::deep_copy(ctx.states[i].projector, h);
    }
    for (std::size_t k = 0; k < count; ++k) {
      const std::size_t i = ctx.active[k];
      if (ctx.states[i].geo.layout.projected) projected_step(ctx, i);
      else full_step(ctx, i);
    }
  }

 private:
  template <class MS>
  static Kokkos::View<float[quant::map_size], MS> make_map(bool is_signed) {
    Kokkos::View<float[quant::map_size], MS> map(
        std::string(is_signed ? "lather::GaLoreAdamW::signed_map" : "lather::GaLoreAdamW::unsigned_map"));
    auto host = Kokkos::create_mirror_view(map);
    const auto values = quant::dynamic_map(is_signed);
    for (int k = 0; k < quant::map_size; ++k) host(k) = values[static_cast<std::size_t>(k)];
    Kokkos::deep_copy(map, host);
    return map;
  }

  // Parameters are updated one after another, so one low-rank workspace (double, the largest
  // low-rank state's size) serves them all; allocated by the first step, shared by every state.
  template <class Ctx>
  static void share_workspace(Ctx& ctx) {
    using M = typename Ctx::memory_space_type;
    std::int64_t need = 0;
    bool missing = false;
    for (const auto& st : ctx.states)
      if (st.geo.layout.projected) {
        need = std::max(need, st.geo.state_numel);
        missing = missing || static_cast<std::int64_t>(st.lowrank.extent(0)) < st.geo.state_numel;
      }
    if (!missing) return;
    Kokkos::View<double*, M> w(Kokkos::view_alloc(Kokkos::WithoutInitializing, "lather::GaLoreAdamW::lowrank"),
                               static_cast<std::size_t>(need));
    for (auto& st : ctx.states)
      if (st.geo.layout.projected) st.lowrank = w;
  }

  template <class T>
  static T step_size(const GaLoreOptions& o, std::int64_t step) {
    double s = o.lr;
    if (o.correct_bias) {
      const auto t = static_cast<double>(step);
      const double bc1 = 1.0 - std::pow(o.betas[0], t), bc2 = 1.0 - std::pow(o.betas[1], t);
      s = s * std::sqrt(bc2) / bc1;
    }
    return static_cast<T>(s);
  }

  // Adam on `io` over the state's n elements, full precision or 8-bit.
  template <class Ctx, class IO>
  static void adam(Ctx& ctx, std::size_t i, const IO& io) {
    using T = typename Ctx::value_type;
    using M = typename Ctx::memory_space_type;
    using ExecSpace = typename Ctx::execution_space;
    auto& st = ctx.states[i];
    const GaLoreOptions& o = *ctx.options[i];
    const std::int64_t n = st.geo.state_numel;
    if (n == 0) return;
    const T b1 = static_cast<T>(o.betas[0]), b2 = static_cast<T>(o.betas[1]);
    const T omb1 = static_cast<T>(1.0 - o.betas[0]), omb2 = static_cast<T>(1.0 - o.betas[1]);
    const T eps = static_cast<T>(o.eps);
    if (st.geo.layout.quantized) {
      kernels::GaLoreAdam8bit<T, M, ExecSpace, IO> f{io, st.exp_avg_codes, st.exp_avg_sq_codes, st.exp_avg_absmax,
                                                     st.exp_avg_sq_absmax, st.signed_map, st.unsigned_map,
                                                     n, st.geo.block_size, b1, omb1, b2, omb2, eps};
      // by_argument: six state Views and the I/O's tensors pass 512 bytes, where CUDA and HIP
      // would launch through constant memory and wait (launch.hpp).
      Kokkos::parallel_for(LATHER_LABEL("lather::GaLoreAdamW::adam8bit"),
                           ::lather::impl::kernels::by_argument(
                               Kokkos::TeamPolicy<ExecSpace>(ctx.space, static_cast<int>(st.geo.blocks), Kokkos::AUTO)),
                           f);
    } else {
      Kokkos::parallel_for(LATHER_LABEL("lather::GaLoreAdamW::adam"),
                           Kokkos::RangePolicy<ExecSpace, Kokkos::IndexType<std::int64_t>>(ctx.space, 0, n),
                           kernels::GaLoreAdam<T, M, IO>{io, st.exp_avg, st.exp_avg_sq, b1, omb1, b2, omb2, eps});
    }
  }

  template <class Ctx>
  static void full_step(Ctx& ctx, std::size_t i) {
    using T = typename Ctx::value_type;
    using M = typename Ctx::memory_space_type;
    const GaLoreOptions& o = *ctx.options[i];
    adam(ctx, i,
         kernels::GaLoreFullIO<T, M>{ctx.params[i], ctx.grads[i], -step_size<T>(o, ctx.steps[i]),
                                     static_cast<T>(-o.lr * o.weight_decay), o.weight_decay > 0.0});
  }

  template <class Ctx>
  static void projected_step(Ctx& ctx, std::size_t i) {
    using T = typename Ctx::value_type;
    using M = typename Ctx::memory_space_type;
    using ExecSpace = typename Ctx::execution_space;
    using Policy = Kokkos::RangePolicy<ExecSpace, Kokkos::IndexType<std::int64_t>>;
    auto& st = ctx.states[i];
    const GaLoreGeometry& g = st.geo;
    const GaLoreLayout& L = g.layout;
    const GaLoreOptions& o = *ctx.options[i];
    const std::int64_t n = g.state_numel, r = L.rank;
    // 1. This rank's partial low-rank gradient (zero where it holds no elements).
    if (n > 0) {
      using Right = kernels::GaLoreProjectRight<T, M>;
      using Left = kernels::GaLoreProjectLeft<T, M>;
      if (L.right)
        Kokkos::parallel_for(LATHER_LABEL("lather::GaLoreAdamW::project_right"), Policy(ctx.space, 0, Right::items(g.ml, r)),
                             Right{ctx.grads[i], st.projector, st.col_map, st.lowrank, r, L.cols, g.nl, g.begin, g.end,
                                   g.col_off, g.cols_contiguous});
      else
        Kokkos::parallel_for(LATHER_LABEL("lather::GaLoreAdamW::project_left"), Policy(ctx.space, 0, Left::items(g.nl, r)),
                             Left{ctx.grads[i], st.projector, st.lowrank, r, g.ml, g.nl, g.begin, g.end, g.row_off});
    }
    // 2. Sum over the groups that split the contracted dimension: this rank's slice of R.
    if (L.reduced_over_dp && ctx.dp.size() > 1) ctx.dp.all_reduce_sum(ctx.space, st.lowrank);
    if (L.reduced_over_tp && ctx.tp.size() > 1) ctx.tp.all_reduce_sum(ctx.space, st.lowrank);
    // 3. Adam on the slice: the workspace now holds N = m / (sqrt(v) + eps).
    adam(ctx, i, kernels::GaLoreLowRankIO<T, M>{st.lowrank});
    // 4. Back-projection of this rank's elements, then decoupled weight decay.
    using Back = kernels::GaLoreBackProject<T, M>;
    const std::int64_t items = Back::items(g.begin, g.end, g.nl);
    if (items > 0)
      Kokkos::parallel_for(LATHER_LABEL("lather::GaLoreAdamW::project_back"), Policy(ctx.space, 0, items),
                           Back{ctx.params[i], st.lowrank, st.projector, st.col_map, r, L.cols, g.nl, g.begin, g.end,
                                g.row_off, g.col_off, L.right, g.cols_contiguous, o.weight_decay > 0.0,
                                static_cast<T>(o.scale), -step_size<T>(o, ctx.steps[i]),
                                static_cast<T>(-o.lr * o.weight_decay)});
  }

  // `v` cut to its first n elements, reallocated first when it is shorter (the refresh buffers
  // grow to the largest parameter's sizes on the first refresh, then stay).
  template <class View>
  static View first(View& v, std::size_t n, const char* label) {
    if (v.extent(0) < n || !v.is_allocated())
      v = View(Kokkos::view_alloc(Kokkos::WithoutInitializing, std::string(label)), std::max<std::size_t>(n, 1));
    return Kokkos::subview(v, std::make_pair(std::size_t{0}, n));
  }

  // The full gradient (row-major, global shape) from every rank's elements: an all-gather of
  // the ZeRO ranges over the DP group (ranges first, then the elements padded to the longest
  // range), then of the TP-local tensors over the TP group. Every rank gets the same bits. The
  // result is the scratch's `full`; every buffer is the scratch's.
  template <class Ctx>
  static const std::vector<typename Ctx::value_type>& gather_full(const Ctx& ctx, std::size_t i) {
    using T = typename Ctx::value_type;
    using M = typename Ctx::memory_space_type;
    using ExecSpace = typename Ctx::execution_space;
    using Host = Kokkos::DefaultHostExecutionSpace;
    using UHV = Kokkos::View<T*, Kokkos::HostSpace, Kokkos::MemoryTraits<Kokkos::Unmanaged>>;
    auto& scratch = ctx.scratch;
    const Sharding& s = ctx.shardings[i];
    const std::int64_t valid = s.valid_numel(), ln = s.local_numel();
    const auto uvalid = static_cast<std::size_t>(valid), uln = static_cast<std::size_t>(ln);
    const bool over_dp = s.zero && ctx.dp.size() > 1, over_tp = s.tp_split() && ctx.tp.size() > 1;
    std::vector<T>& full = scratch.full;
    full.assign(static_cast<std::size_t>(s.global_numel()), T(0));
    // The TP-local tensor: `full` itself when no TP gather follows (then ln == global numel).
    T* local = full.data();
    if (over_tp) {
      local = first(scratch.local, uln, "lather::GaLoreAdamW::tp_local").data();
      std::fill(local, local + uln, T(0));
    }
    // This rank's valid elements to `dst` on the host: straight from a contiguous gradient, else
    // packed on the device first.
    const auto copy_mine = [&](T* dst) {
      if (valid == 0) return;
      const UHV host(dst, uvalid);
      if (ctx.grads[i].is_row_major_contiguous()) {
        ctx.space.fence();
        Kokkos::deep_copy(host, Kokkos::View<const T*, M, Kokkos::MemoryTraits<Kokkos::Unmanaged>>(ctx.grads[i].data(), uvalid));
        return;
      }
      const Kokkos::View<T*, M> packed = first(scratch.packed, uvalid, "lather::GaLoreAdamW::packed");
      Kokkos::parallel_for(LATHER_LABEL("lather::GaLoreAdamW::pack"),
                           Kokkos::RangePolicy<ExecSpace, Kokkos::IndexType<std::int64_t>>(ctx.space, 0, valid),
                           kernels::GaLorePack<T, M>{ctx.grads[i], packed});
      ctx.space.fence();
      Kokkos::deep_copy(host, packed);
    };
    if (over_dp) {
      const auto dp = static_cast<std::size_t>(ctx.dp.size());
      using DV = Kokkos::View<double*, Kokkos::HostSpace>;
      const DV range = first(scratch.range, 2, "lather::GaLoreAdamW::range");
      const DV ranges = first(scratch.ranges, 2 * dp, "lather::GaLoreAdamW::ranges");
      range(0) = static_cast<double>(s.begin());
      range(1) = static_cast<double>(s.end());
      ctx.dp.all_gather(Host(), Kokkos::View<const double*, Kokkos::HostSpace>(range), ranges);
      std::int64_t longest = 0;
      for (std::size_t q = 0; q < dp; ++q)
        longest = std::max(longest, static_cast<std::int64_t>(ranges(2 * q + 1) - ranges(2 * q)));
      const auto ulongest = static_cast<std::size_t>(longest);
      const Kokkos::View<T*, Kokkos::HostSpace> chunk = first(scratch.chunk, ulongest, "lather::GaLoreAdamW::chunk");
      const Kokkos::View<T*, Kokkos::HostSpace> all = first(scratch.chunks, dp * ulongest, "lather::GaLoreAdamW::chunks");
      for (std::size_t e = uvalid; e < ulongest; ++e) chunk(e) = T(0);
      copy_mine(chunk.data());
      ctx.dp.all_gather(Host(), Kokkos::View<const T*, Kokkos::HostSpace>(chunk), all);
      for (std::size_t q = 0; q < dp; ++q) {
        const auto b = static_cast<std::int64_t>(ranges(2 * q)), e = static_cast<std::int64_t>(ranges(2 * q + 1));
        for (std::int64_t t = 0; t < e - b; ++t) local[b + t] = all(q * ulongest + static_cast<std::size_t>(t));
      }
    } else {
      copy_mine(local + s.begin());
    }
    if (over_tp) {
      const auto tp = static_cast<std::size_t>(ctx.tp.size());
      const Kokkos::View<T*, Kokkos::HostSpace> all = first(scratch.tp_all, tp * uln, "lather::GaLoreAdamW::tp_all");
      ctx.tp.all_gather(Host(), Kokkos::View<const T*, Kokkos::HostSpace>(UHV(local, uln)), all);
      for (std::size_t q = 0; q < tp; ++q)
        for (std::int64_t f = 0; f < ln; ++f)
          full[static_cast<std::size_t>(galore_global_flat(s, static_cast<int>(q), f))] = all(q * uln + static_cast<std::size_t>(f));
    }
    return full;
  }

  // The new projector of parameter i (row-major, the projector's shape): the first `rank` right
  // singular vectors (rows of V^T) or left singular vectors (columns of U) of the full gradient,
  // in T, with thin_svd_host's sign convention. Identical on every rank.
  template <class Ctx>
  static void compute_projector(const Ctx& ctx, std::size_t i, const GaLoreGeometry& g,
                                std::vector<typename Ctx::value_type>& p) {
    using T = typename Ctx::value_type;
    const std::vector<T>& full = gather_full(ctx, i);
    const GaLoreLayout& L = g.layout;
    const std::int64_t m = L.rows, n = L.cols, r = L.rank, k = std::min(m, n);
    std::vector<T>&u = ctx.scratch.u, &s = ctx.scratch.s, &vt = ctx.scratch.vt;
    thin_svd_host<T>(m, n, full.data(), u, s, vt);
    if (L.right) {
      p.assign(vt.begin(), vt.begin() + r * n);
    } else {
      p.resize(static_cast<std::size_t>(m * r));
      for (std::int64_t row = 0; row < m; ++row)
        for (std::int64_t c = 0; c < r; ++c)
          p[static_cast<std::size_t>(row * r + c)] = u[static_cast<std::size_t>(row * k + c)];
    }
  }
};

}  // namespace impl

/// \brief GaLore-AdamW: Adam in a low-rank subspace of each matrix parameter's gradient,
/// refreshed by an SVD every `update_proj_gap` steps, optionally with 8-bit states.
///
/// Per step t (per parameter; galore_torch/adamw.py): for a projected parameter (2-D, or more
/// dims seen as the matrix (shape[0], numel / shape[0]), in a group with rank > 0):
/// - when (t - 1) % update_proj_gap == 0: SVD of the gradient (in the parameter's precision;
///   host LAPACK) and P = the first r right (r x n) or left (m x r) singular vectors;
/// - R = G P^T (right) or P^T G (left); m = b1 m + (1-b1) R; v = b2 v + (1-b2) R^2;
///   N = m / (sqrt(v) + eps); step = lr * sqrt(1 - b2^t) / (1 - b1^t) (lr without correct_bias);
/// - W += -step * scale * (N P) (right) or (P N) (left); then W += -lr * weight_decay * W.
/// Other parameters (0-/1-D, or groups with rank 0) get the same Adam in full space, without
/// `scale`. Products accumulate in double, in a fixed order (deterministic on every back end).
///
/// With a Distribution (TP split of either dimension and/or ZeRO ranges) the result equals the
/// single-device one up to the summation order of the low-rank gradient: at refresh steps every
/// rank gathers the full gradient and takes the same SVD; every step each rank projects only its
/// own elements, the partial low-rank gradients are summed over the groups that split the
/// contracted dimension, Adam runs on this rank's slice of R and each rank back-projects its own
/// elements. See docs/galore.md for the memory, the communication and the 8-bit block condition.
template <concepts::FloatingTensor Param,
          concepts::ExecutionSpaceFor<Param> ExecSpace = default_execution_space_t<Param>,
          concepts::Communicator Comm = SerialCommunicator>
class GaLoreAdamW : public impl::ShardedOptimizer<Param, ExecSpace, Comm, impl::GaLoreAlgorithm> {
  using base = impl::ShardedOptimizer<Param, ExecSpace, Comm, impl::GaLoreAlgorithm>;
  struct Groups {};

 public:
  using typename base::distribution_type;
  using typename base::group_type;
  using typename base::value_type;

  /// One group of whole parameters on this rank (single device).
  explicit GaLoreAdamW(std::span<Param> params, GaLoreOptions options = {}, std::vector<std::string> names = {})
      : base(params, options, std::move(names)) {
    finish(std::vector<std::size_t>(params.size(), 0));
  }
  /// One group of sharded parameters.
  GaLoreAdamW(std::span<Param> params, distribution_type dist, GaLoreOptions options = {},
              std::vector<std::string> names = {})
      : base(params, std::move(dist), options, std::move(names)) {
    finish(std::vector<std::size_t>(params.size(), 0));
  }
  /// Several parameter groups, each with its own options; `dist` says how they are sharded.
  explicit GaLoreAdamW(std::vector<group_type> groups, distribution_type dist = {})
      : GaLoreAdamW(Groups{}, group_of(groups), std::move(groups), std::move(dist)) {}

  /// How parameter `i` is treated on this rank: projected or not, the side, the effective rank,
  /// the shapes of its state and projector, 8-bit or not, and which groups sum its low-rank
  /// gradient.
  [[nodiscard]] const GaLoreLayout& layout(std::size_t i) const {
    static_cast<void>(this->param(i));  // range check
    return m_geometry[i].layout;
  }
  /// Bytes of step workspace this rank holds besides state_bytes() from the first step on: one
  /// low-rank gradient buffer in double (the ranks' partial sums are added before rounding) of
  /// the largest projected parameter's low-rank size, shared by all parameters. The projector
  /// refreshes' buffers come on top: refresh_buffer_bytes().
  [[nodiscard]] std::size_t workspace_bytes() const {
    std::size_t b = 0;
    for (const auto& g : m_geometry)
      if (g.layout.projected) b = std::max(b, static_cast<std::size_t>(g.state_numel) * sizeof(double));
    return b;
  }
  /// \brief Bytes the projector refreshes keep from one refresh to the next (0 before the first
  /// step): on the host, the largest projected parameter's full gradient (m n), its SVD factors
  /// (m k + k + k n, k = min(m, n)) and each parameter's new projector, plus, for sharded
  /// parameters, the gathers' buffers (about 2 m n more with a TP split, m n / tp with ZeRO
  /// alone), and, for gradients that are not contiguous, this rank's elements packed on the
  /// parameters' memory space (the only device memory among them). Kept so that refresh
  /// steps, like every other step after the first, allocate nothing; release_refresh_buffers()
  /// gives them back. Not counted: the SVD's LAPACK arrays, kept per calling thread (about
  /// 4 k^2 + m n + m k + k n elements; impl::lapack::gesdd).
  [[nodiscard]] std::size_t refresh_buffer_bytes() const { return this->scratch().bytes(); }
  /// Frees the refresh buffers (refresh_buffer_bytes()) and the calling thread's LAPACK SVD
  /// arrays, e.g. when host memory is short between refreshes; the next refresh allocates them
  /// again. The state is untouched.
  void release_refresh_buffers() {
    this->scratch().release();
    impl::lapack::release_gesdd_workspace<value_type>();
  }

 private:
  GaLoreAdamW(Groups, std::vector<std::size_t> owner, std::vector<group_type>&& groups, distribution_type&& dist)
      : base(std::move(groups), std::move(dist)) {
    finish(owner);
  }
  static std::vector<std::size_t> group_of(const std::vector<group_type>& groups) {
    std::vector<std::size_t> g;
    for (std::size_t k = 0; k < groups.size(); ++k) g.insert(g.end(), groups[k].params.size(), k);
    return g;
  }

  // Records each parameter's geometry, agrees over every rank on whether the 8-bit blocks are
  // the single-device ones, and checks, with the DP group, that the ZeRO ranges of every
  // ZeRO-sharded projected parameter tile its TP-local tensor (a refresh step gathers them).
  void finish(const std::vector<std::size_t>& owner) {
    for (std::size_t i = 0; i < this->num_params(); ++i)
      m_geometry.push_back(impl::galore_geometry(this->options(owner[i]), this->sharding(i)));
    if (this->distributed()) {
      Kokkos::View<double*, Kokkos::HostSpace> unaligned("lather::GaLoreAdamW::unaligned", this->num_params());
      for (std::size_t i = 0; i < this->num_params(); ++i) unaligned(i) = m_geometry[i].layout.blocks_aligned ? 0.0 : 1.0;
      if (this->dp_communicator().size() > 1)
        this->dp_communicator().all_reduce_sum(Kokkos::DefaultHostExecutionSpace(), unaligned);
      if (this->tp_communicator().size() > 1)
        this->tp_communicator().all_reduce_sum(Kokkos::DefaultHostExecutionSpace(), unaligned);
      for (std::size_t i = 0; i < this->num_params(); ++i) m_geometry[i].layout.blocks_aligned = unaligned(i) == 0.0;
    }
    std::vector<std::size_t> zero;
    for (std::size_t i = 0; i < this->num_params(); ++i)
      if (m_geometry[i].layout.projected && this->sharding(i).zero) zero.push_back(i);
    if (zero.empty()) return;
    const Comm& dp = this->dp_communicator();
    const auto size = static_cast<std::size_t>(dp.size());
    Kokkos::View<double*, Kokkos::HostSpace> mine("lather::GaLoreAdamW::ranges", 2 * zero.size()),
        all("lather::GaLoreAdamW::all_ranges", 2 * zero.size() * size);
    for (std::size_t k = 0; k < zero.size(); ++k) {
      mine(2 * k) = static_cast<double>(this->sharding(zero[k]).begin());
      mine(2 * k + 1) = static_cast<double>(this->sharding(zero[k]).end());
    }
    if (size > 1) dp.all_gather(Kokkos::DefaultHostExecutionSpace(), Kokkos::View<const double*, Kokkos::HostSpace>(mine), all);
    else Kokkos::deep_copy(all, mine);
    for (std::size_t k = 0; k < zero.size(); ++k) {
      const std::int64_t n = this->sharding(zero[k]).local_numel();
      std::vector<std::pair<std::int64_t, std::int64_t>> r;
      for (std::size_t q = 0; q < size; ++q)
        r.emplace_back(static_cast<std::int64_t>(all(q * 2 * zero.size() + 2 * k)),
                       static_cast<std::int64_t>(all(q * 2 * zero.size() + 2 * k + 1)));
      std::sort(r.begin(), r.end());
      std::int64_t covered = 0;
      bool ok = true;
      for (const auto& [b, e] : r) {
        if (e == b) continue;
        ok = ok && b == covered;
        covered = e;
      }
      ok = ok && covered == n;
      LATHER_THROW_IF(!ok, "lather::GaLoreAdamW: the ZeRO ranges of ", this->sharding(zero[k]).describe(),
                      " over the ", size, " data-parallel ranks do not cover its ", n,
                      " elements exactly once; every element must be held by exactly one rank of the DP group");
    }
  }

  std::vector<impl::GaLoreGeometry> m_geometry;
};

template <class P>
GaLoreAdamW(std::vector<P>&, GaLoreOptions = {}, std::vector<std::string> = {}) -> GaLoreAdamW<P>;
template <class P>
GaLoreAdamW(std::span<P>, GaLoreOptions = {}, std::vector<std::string> = {}) -> GaLoreAdamW<P>;
template <class P>
GaLoreAdamW(std::vector<ParamGroup<P, GaLoreOptions>>) -> GaLoreAdamW<P>;

}  // namespace lather

#endif
