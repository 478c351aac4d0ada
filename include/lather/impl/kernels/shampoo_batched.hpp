// SPDX-License-Identifier: Apache-2.0
/// \file
/// \brief Private. The jobs of Shampoo's batched passes (Shampoo::set_batched_passes): each pass
/// of a step (gather, factor combine, filtering, norms, 1-D products, graft scale, update) as one
/// kernel over every block of every parameter, through the tables of kernels/multi_tensor.hpp.
///
/// Why: on a GPU the per-parameter kernels are launches per parameter and per block; resnet50 at
/// block size 256 ran 2967 kernels a steady step on the H200 of the fourteenth #7 round, at 1% of
/// its SGEMM rate (docs/performance-history.md, "Per-parameter kernels on an H200"). The
/// arithmetic of each element is the per-parameter kernels' (shared functions), so the two paths
/// differ only where the products' summation order does.
#ifndef LATHER_IMPL_KERNELS_SHAMPOO_BATCHED_HPP
#define LATHER_IMPL_KERNELS_SHAMPOO_BATCHED_HPP

#include <lather/impl/kernels/shampoo.hpp>

#include <Kokkos_Core.hpp>

#include <cstdint>

namespace lather::impl::kernels {

/// A parameter's scalars that change from step to step (bias corrections, and the learning rate
/// and decay under a schedule), read by the batched passes' jobs from one small table in device
/// memory rather than held in the jobs. Why: the job tables are copied to the device only where
/// they changed (UploadedTable), and jobs holding these scalars changed every step: the filter's
/// and the grafting norms' tables on every step of Adam grafting (3 copies a steady step), and
/// the update's table, one entry per block, on every step of a learning-rate schedule. With the
/// scalars here a steady step copies this table alone (one copy, or none when nothing changed).
template <class T>
struct StepValues {
  T lr, decay, bias_correction1, graft_bias_correction;
};

/// FilterAndGraft with the bias corrections read from `step`.
template <class T, class MemorySpace>
struct StepFilter {
  FilterAndGraft<T, MemorySpace> filter;  // its bias corrections are not read
  const StepValues<T>* step;
  KOKKOS_FUNCTION void operator()(std::int64_t q) const {
    GraftScalars<T> gs = filter.graft;
    gs.bias_correction = step->graft_bias_correction;
    filter.run(q, step->bias_correction1, gs);
  }
};

/// ApplyUpdate with the decay and learning rate read from `step` (an op of BlockMapped).
template <class T, class MemorySpace>
struct StepUpdate {
  ApplyUpdate<T, MemorySpace> update;  // its decay and learning rate are not read
  const StepValues<T>* step;
  KOKKOS_FUNCTION void apply(std::int64_t i, std::int64_t q) const { update.apply_with(i, q, step->decay, step->lr); }
};

/// Runs an element-wise blocked functor (apply(flat, blocked)) over one block: element q of the
/// block (blocked position begin + q) is the parameter's row-major element origin + sum_j l_j
/// stride_j, with l the block-local coordinates of q over the block's extents. One division per
/// dimension after the first, in 32 bits where the block fits (BlockedIndex's general form took
/// two 64-bit divisions per dimension and a lookup: a quarter of a batched gpt2-block step at
/// block size 256 on a CPU, in gather and update).
template <class Op>
struct BlockMapped {
  Op op;
  std::int64_t begin = 0, origin = 0;
  int rank = 0;
  bool small = true;  // every local index below 2^32
  std::int64_t ext[max_tensor_rank] = {}, stride[max_tensor_rank] = {};
  KOKKOS_FUNCTION void operator()(std::int64_t q) const {
    std::int64_t flat = origin;
    if (small) {
      std::uint32_t t = static_cast<std::uint32_t>(q);
      for (int j = rank - 1; j > 0; --j) {
        const auto e = static_cast<std::uint32_t>(ext[j]);
        const std::uint32_t next = t / e;
        flat += static_cast<std::int64_t>(t - next * e) * stride[j];
        t = next;
      }
      if (rank > 0) flat += static_cast<std::int64_t>(t) * stride[0];
    } else {
      std::int64_t t = q;
      for (int j = rank - 1; j > 0; --j) {
        const std::int64_t next = t / ext[j];
        flat += (t - next * ext[j]) * stride[j];
        t = next;
      }
      if (rank > 0) flat += t * stride[0];
    }
    op.apply(flat, begin + q);
  }
};

/// Row i and column j of element e = i d + j of a d x d matrix: one 32-bit division wherever
/// d < 2^16 (every index then fits 32 bits), which GPUs run in a few instructions against a
/// 64-bit division's emulated tens (the combine and unpack passes do one per element).
KOKKOS_INLINE_FUNCTION void square_index(std::int64_t e, std::int64_t d, std::int64_t& i, std::int64_t& j) {
  if (d < (std::int64_t{1} << 16)) {
    const auto ue = static_cast<std::uint32_t>(e), ud = static_cast<std::uint32_t>(d);
    const std::uint32_t ui = ue / ud;
    i = ui;
    j = ue - ui * ud;
  } else {
    i = e / d;
    j = e - i * d;
  }
}

/// L = beta2 L + w S for one factor, element e = i d + j of d x d: S from the lower triangle of a
/// column-major Gram matrix (FactorCombine's rounding) or, with `gram` null, S = x x^T of a
/// one-dimensional block (RankOneCombineRows' rounding: x_i x_j once in T). Packed storage skips
/// the lower triangle.
template <class T, class F>
struct CombineJob {
  const T* gram = nullptr;
  const T* x = nullptr;
  SymmetricStorage<F> factor;
  F beta2, weight;
  bool scale;
  KOKKOS_FUNCTION void operator()(std::int64_t e) const {
    const std::int64_t d = factor.d;
    std::int64_t i, j;
    square_index(e, d, i, j);
    if (factor.packed && i > j) return;
    const std::int64_t lo = i < j ? i : j, hi = i < j ? j : i;
    const T s = gram != nullptr ? gram[hi + lo * d] : T(x[i] * x[j]);
    F& l = factor(i, j);
    l = (scale ? l * beta2 : l) + weight * F(s);
  }
};

/// A packed symmetric matrix in full (d x d, the same in either layout), element e = i d + j.
template <class F, class T>
struct UnpackJob {
  SymmetricStorage<F> in;
  T* out;
  KOKKOS_FUNCTION void operator()(std::int64_t e) const {
    std::int64_t i, j;
    square_index(e, in.d, i, j);
    out[e] = T(in(i, j));
  }
};

/// y = P x for a one-dimensional block of dimension d, over one chunk of P's d^2 elements (a
/// ChunkedTeamTable job of size d^2): the rows whose first element i d lies in the chunk, each a
/// team reduction of P(i, j) x_j over j (P symmetric: row i read along j, so neighbouring
/// threads read neighbouring elements of full storage). Why not one team per block: a block of
/// d = 1024 read 4 MB at one GPU multiprocessor's bandwidth; on the H100 of the twentieth #7
/// round the one-team-per-block form was 3.6 ms of resnet50's 14.7 ms steady step at block
/// size 1024 (docs/performance-history.md, "The batched passes on an H100"). Chunks of 4096
/// elements spread such a block over 256 teams.
template <class T, class F>
struct MatVecChunkJob {
  SymmetricStorage<F> p;
  const T* x;
  T* y;
  template <class Member>
  KOKKOS_FUNCTION void operator()(const Member& team, std::int64_t begin, std::int64_t end, std::int64_t) const {
    const std::int64_t d = p.d;
    const std::int64_t first = (begin + d - 1) / d, last = (end + d - 1) / d;
    for (std::int64_t i = first; i < last; ++i) {
      T s = 0;
      Kokkos::parallel_reduce(
          Kokkos::TeamThreadRange(team, d), [&](std::int64_t j, T& acc) { acc += T(p(i, j)) * x[j]; }, s);
      Kokkos::single(Kokkos::PerTeam(team), [&]() { y[i] = s; });
    }
  }
};

/// The squared norm of graft(x) (of x when `has_state` is false) over one chunk of a block's
/// elements (BlockNorms' terms), into partials[chunk]; NormSumJob adds a block's partials. A
/// ChunkedTeamTable job: one team per chunk of 4096 elements, not per block (one team per block
/// read a block at one GPU multiprocessor's bandwidth). With `has_state`, the bias correction is
/// read from `step` (StepValues), not from `graft`.
template <class T>
struct NormChunkJob {
  const T* x;
  const T* v;
  double* partials;
  GraftScalars<T> graft;
  bool has_state;
  const StepValues<T>* step;
  template <class Member>
  KOKKOS_FUNCTION void operator()(const Member& team, std::int64_t begin, std::int64_t end, std::int64_t chunk) const {
    GraftScalars<T> gs = graft;
    if (has_state) gs.bias_correction = step->graft_bias_correction;
    double sum = 0;
    Kokkos::parallel_reduce(
        Kokkos::TeamThreadRange(team, begin, end),
        [&](std::int64_t q, double& acc) { acc += block_norm_term(x[q], has_state ? v[q] : T(0), gs, has_state); }, sum);
    Kokkos::single(Kokkos::PerTeam(team), [&]() { partials[chunk] = sum; });
  }
};

/// *out = partials[first] + ... + partials[first + count - 1], in that order (0 for no chunks:
/// an empty block); one thread of a TeamTable team per block.
struct NormSumJob {
  const double* partials;
  std::int64_t first, count;
  double* out;
  template <class Member>
  KOKKOS_FUNCTION void operator()(const Member& team) const {
    Kokkos::single(Kokkos::PerTeam(team), [&]() {
      double s = 0;
      for (std::int64_t k = 0; k < count; ++k) s += partials[first + k];
      *out = s;
    });
  }
};

/// x *= graft_ratio(norms[0], norms[1]) over one chunk of a block (GraftScale's arithmetic): the
/// ratio once per team, a ChunkedTeamTable job.
template <class T>
struct GraftScaleJob {
  T* x;
  const double* norms;
  template <class Member>
  KOKKOS_FUNCTION void operator()(const Member& team, std::int64_t begin, std::int64_t end, std::int64_t) const {
    const T ratio = graft_ratio<T>(norms[0], norms[1]);
    Kokkos::parallel_for(Kokkos::TeamThreadRange(team, begin, end), [&](std::int64_t q) { x[q] = x[q] * ratio; });
  }
};

}  // namespace lather::impl::kernels

#endif
