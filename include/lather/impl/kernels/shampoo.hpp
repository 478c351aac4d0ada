// SPDX-License-Identifier: Apache-2.0
/// \file
/// \brief Private. Shampoo's device kernels: blocked indexing, gradient gather, Kronecker-factor
/// updates, mode-k products with the inverse factors, the element-wise filtering/grafting pass,
/// per-block norms and the final parameter update. All are named functors (device-clean).
#ifndef LATHER_IMPL_KERNELS_SHAMPOO_HPP
#define LATHER_IMPL_KERNELS_SHAMPOO_HPP

#include <lather/grafting/grafting.hpp>
#include <lather/impl/kernels/diagonal.hpp>
#include <lather/impl/kernels/host_simd.hpp>
#include <lather/impl/kernels/multi_tensor.hpp>
#include <lather/impl/math.hpp>
#include <lather/traits/tensor_traits.hpp>

#include <Kokkos_Core.hpp>

#include <cstdint>
#include <type_traits>
#include <vector>

// Host-only builds on x86-64: SSE2 for the host block norms (GPU builds keep the scalar form,
// which gives the same bits).
#if defined(__SSE2__) && !defined(KOKKOS_ENABLE_CUDA) && !defined(KOKKOS_ENABLE_HIP) && !defined(KOKKOS_ENABLE_SYCL)
#define LATHER_HAS_HOST_NORM_SIMD 1
#include <emmintrin.h>
#endif

namespace lather::impl::kernels {

/// Maps a parameter's row-major flat index to its position in lather's blocked order (each
/// block contiguous and row-major, blocks in row-major block order).
template <class MemorySpace>
struct BlockedIndex {
  int rank = 1;
  std::int64_t dims[max_tensor_rank] = {};    // merged shape
  std::int64_t grid[max_tensor_rank] = {};    // blocks per dimension
  std::int64_t block_size = 1;
  bool identity = false;  // one block: blocked order is the row-major order itself
  // The begins' device array, owned by the optimizer's parameter state (a pointer, not a View:
  // the index is part of trivially copyable multi-tensor jobs).
  Field<const std::int64_t> block_begin;

  KOKKOS_FUNCTION std::int64_t operator()(std::int64_t flat) const {
    if (identity) return flat;
    if (rank == 1) {
      const std::int64_t c = flat / block_size;
      const std::int64_t begin = block_begin(c);
      return begin < 0 ? -1 : begin + (flat - c * block_size);
    }
    std::int64_t m[max_tensor_rank];
    for (int j = rank - 1; j >= 0; --j) {
      m[j] = flat % dims[j];
      flat /= dims[j];
    }
    std::int64_t block = 0, local = 0;
    for (int j = 0; j < rank; ++j) {
      const std::int64_t c = m[j] / block_size;
      const std::int64_t start = c * block_size;
      const std::int64_t ext = (dims[j] - start < block_size) ? dims[j] - start : block_size;
      block = block * grid[j] + c;
      local = local * ext + (m[j] - start);
    }
    const std::int64_t begin = block_begin(block);
    return begin < 0 ? -1 : begin + local;
  }

  /// The row-wise form used by the team kernels: a "row" runs over the last merged dimension.
  /// row_base does the divisions of the leading dimensions once per row; in_row then needs
  /// one 32-bit division per element (the flat form needs 2 rank of them, in 64 bits).
  struct RowBase {
    std::int64_t block = 0, local = 0;
  };
  [[nodiscard]] KOKKOS_FUNCTION std::int64_t last() const { return rank > 0 ? dims[rank - 1] : 1; }
  KOKKOS_FUNCTION RowBase row_base(std::int64_t row) const {
    std::int64_t m[max_tensor_rank];
    for (int j = rank - 2; j >= 0; --j) {
      m[j] = row % dims[j];
      row /= dims[j];
    }
    RowBase b;
    for (int j = 0; j + 1 < rank; ++j) {
      const std::int64_t c = m[j] / block_size;
      const std::int64_t start = c * block_size;
      const std::int64_t ext = (dims[j] - start < block_size) ? dims[j] - start : block_size;
      b.block = b.block * grid[j] + c;
      b.local = b.local * ext + (m[j] - start);
    }
    return b;
  }
  KOKKOS_FUNCTION std::int64_t in_row(const RowBase& b, std::int64_t col) const {
    const std::int64_t d = dims[rank - 1];
    // Dimensions and block sizes fit in 32 bits (merged dimensions of a tensor that fits in memory).
    const std::int64_t c = block_size >= d ? 0 : std::int64_t(std::uint32_t(col) / std::uint32_t(block_size));
    const std::int64_t start = c * block_size;
    const std::int64_t ext = (d - start < block_size) ? d - start : block_size;
    const std::int64_t begin = block_begin(b.block * grid[rank - 1] + c);
    return begin < 0 ? -1 : begin + b.local * ext + (col - start);
  }
};

/// Runs an element-wise blocked functor (apply(flat, blocked)) with the flat index: for one
/// block (identity) and 1-D tensors, where the index costs at most one division.
template <class Op, class MemorySpace>
struct FlatBlocked {
  Op op;
  BlockedIndex<MemorySpace> index;
  KOKKOS_FUNCTION void operator()(std::int64_t i) const {
    const std::int64_t q = index(i);
    if (q >= 0) op.apply(i, q);  // q < 0: a block another rank owns
  }
};

/// The same with one team per row of the last merged dimension, walked block by block: within a
/// block the row's elements are contiguous in blocked order too, so each segment is a plain
/// stride-1 loop (coalesced on GPUs, vectorizable on CPUs) with no index arithmetic per element.
/// The per-element form (a division and a block_begin lookup per element) made the gather and
/// the update a tenth of a gpt2-block step at block size 256.
template <class Op, class MemorySpace>
struct RowwiseBlocked {
  Op op;
  BlockedIndex<MemorySpace> index;
  template <class Member>
  KOKKOS_FUNCTION void operator()(const Member& team) const {
    const std::int64_t row = team.league_rank(), last = index.last();
    const auto base = index.row_base(row);
    const std::int64_t bs = index.block_size < last ? index.block_size : last;
    const std::int64_t segments = (last + bs - 1) / bs;
    for (std::int64_t c = 0; c < segments; ++c) {
      const std::int64_t start = c * bs;
      const std::int64_t ext = last - start < bs ? last - start : bs;
      const std::int64_t begin = index.block_begin(base.block * index.grid[index.rank - 1] + c);
      if (begin < 0) continue;  // a block another rank owns
      const std::int64_t flat = row * last + start, q = begin + base.local * ext;
      Kokkos::parallel_for(Kokkos::TeamThreadRange(team, ext), [&](std::int64_t j) { op.apply(flat + j, q + j); });
    }
  }
};

/// A symmetric d x d matrix stored in full (row-major) or as its row-major upper triangle
/// (DistributedShampoo's symmetric packing: element (i, j), i <= j, at i d - i (i - 1) / 2 + j - i).
template <class F>
struct SymmetricStorage {
  F* data = nullptr;
  std::int64_t d = 0;
  bool packed = false;
  /// Where a packed triangle lies (packed only): 0 contiguous, rows one after the other (the
  /// reference's packing); 1 the upper triangle of a row-major d x d matrix at `data` (rows d
  /// apart); 2 the lower triangle of one (rows d apart). A factor and its inverse root of a
  /// host BLAS block share one (d + 1) x d buffer this way (`paired`, ShampooFactorState): the
  /// factor's upper triangle at row 0, the inverse's lower triangle at row 1, the same
  /// d (d + 1) numbers as two packed triangles, each a triangle the BLAS reads and writes in
  /// place (SYRK into the factor with beta, SYMM from the inverse): no combine or unpack pass.
  std::int8_t tri = 0;
  KOKKOS_INLINE_FUNCTION std::int64_t index(std::int64_t i, std::int64_t j) const {
    if (!packed) return i * d + j;
    if (i > j) {
      const std::int64_t t = i;
      i = j;
      j = t;
    }
    if (tri == 1) return i * d + j;
    if (tri == 2) return j * d + i;
    return i * d - i * (i - 1) / 2 + (j - i);
  }
  KOKKOS_INLINE_FUNCTION F& operator()(std::int64_t i, std::int64_t j) const { return data[index(i, j)]; }
  /// Row i of the upper triangle, indexed by the column: upper_row(i)[j] = (i, j) for j >= i,
  /// contiguous (packed with tri 0 or 1 only).
  KOKKOS_INLINE_FUNCTION F* upper_row(std::int64_t i) const {
    return tri == 1 ? data + i * d : data + (i * d - i * (i - 1) / 2) - i;
  }
  KOKKOS_INLINE_FUNCTION SymmetricStorage<const F> as_const() const { return {data, d, packed, tri}; }
  /// Whether upper_row applies.
  KOKKOS_INLINE_FUNCTION bool upper_rows() const { return packed && tri != 2; }
  static constexpr std::int64_t size(std::int64_t d, bool packed) { return packed ? d * (d + 1) / 2 : d * d; }
};

/// Gb[blocked(i)] = g[i] (+ weight_decay * p[i] for L2 decay).
template <class T, class MemorySpace>
struct GatherGradient {
  TensorRef<const T, MemorySpace> grad;
  TensorRef<T, MemorySpace> param;
  Field<T> out;
  T l2_weight_decay;
  KOKKOS_FUNCTION void apply(std::int64_t i, std::int64_t q) const {
    T g = grad[i];
    if (l2_weight_decay != T(0)) g = g + l2_weight_decay * param[i];
    out(q) = g;
  }
};

/// Dimension k of a block X (outer, d, inner), row-major, moved to the front and back:
/// T[i, a * inner + b] = X[a, i, b] (`fold` false), or X[a, i, b] = T[i, a * inner + b] (`fold`
/// true). With T (d rows of outer * inner) a middle dimension's Gram matrix and mode product are
/// one BLAS call each, at the cost of one pass over the block. Indexed by the outer * d rows of
/// X, each moving `inner` contiguous elements: one integer division per row, not three per
/// element (which made the per-element form cost a tenth of a resnet50 step).
template <class T>
struct UnfoldMode {
  const T* from;
  T* to;
  std::int64_t outer, d, inner;
  bool fold;
  // How far apart the tensor's d inner elements of each outer index lie (0: d inner, the tensor
  // contiguous): a host block read where it lies in its parameter, its second dimension split.
  std::int64_t slab = 0;
  KOKKOS_FUNCTION void operator()(std::int64_t r) const {
    const std::int64_t a = r / d, i = r - a * d;
    const std::int64_t e = a * (slab > 0 ? slab : d * inner) + i * inner, u = i * (outer * inner) + a * inner;
    if (fold)
      for (std::int64_t b = 0; b < inner; ++b) to[e + b] = from[u + b];
    else
      for (std::int64_t b = 0; b < inner; ++b) to[u + b] = from[e + b];
  }
  /// Every row in the calling thread (host loops), without the division per row: resnet50's
  /// (256, 256, 9) blocks move rows of 9 elements.
  void all() const {
    const std::int64_t step = outer * inner, gap = slab > 0 ? slab - d * inner : 0;
    for (std::int64_t a = 0, e = 0; a < outer; ++a, e += gap) {
      for (std::int64_t i = 0, u = a * inner; i < d; ++i, e += inner, u += step) {
        if (fold)
          for (std::int64_t b = 0; b < inner; ++b) to[e + b] = from[u + b];
        else
          for (std::int64_t b = 0; b < inner; ++b) to[u + b] = from[e + b];
      }
    }
  }
};

/// L = beta2 * L + w * S from a precomputed Gram matrix S = G_(k) G_(k)^T, summed in the
/// gradient type as the reference does (a SYRK or GEMM result).
template <class T, class F, class GramView>
struct FactorCombine {
  GramView gram;
  SymmetricStorage<F> factor;
  F beta2, weight;
  bool scale;
  KOKKOS_FUNCTION void operator()(std::int64_t i, std::int64_t j) const {
    if (factor.packed && i > j) return;
    F& l = factor(i, j);
    // Only the Gram matrix's lower triangle is read (a host SYRK writes no other); with the
    // column-major Gram and j running fastest, gram(hi, lo) is read contiguously.
    const std::int64_t lo = i < j ? i : j, hi = i < j ? j : i;
    l = (scale ? l * beta2 : l) + weight * F(T(gram(hi, lo)));
  }
};

/// Row i of the upper triangle of a factor (contiguous when packed) updated as
/// L(i, j) = beta2 L(i, j) + w S(i, j), j >= i, with S(i, j) = F(entry[j]) (`entry`: row i of the
/// new statistics, in the gradient type). Shared by the two row forms below so that both round alike.
template <class F, class Entry>
KOKKOS_INLINE_FUNCTION void combine_factor_row(const SymmetricStorage<F>& factor, std::int64_t i, F beta2, F weight,
                                               bool scale, const Entry& entry) {
  const std::int64_t d = factor.d;
  if (factor.packed) {
    // The scalars as locals and the branch outside the loop: a store through l may alias the
    // members (a functor's beta2 is an F too), which kept the loop scalar with reloads. (A
    // factor is never stored as a lower triangle: upper_row applies.)
    F* l = factor.upper_row(i);
    const F b = beta2, w = weight;
    if (scale) {
      for (std::int64_t j = i; j < d; ++j) l[j] = l[j] * b + w * F(entry[j]);
    } else {
      for (std::int64_t j = i; j < d; ++j) l[j] = l[j] + w * F(entry[j]);
    }
  } else {
    F* l = factor.data;
    for (std::int64_t j = i; j < d; ++j) {
      const F w = weight * F(entry[j]);
      l[i * d + j] = (scale ? l[i * d + j] * beta2 : l[i * d + j]) + w;
      if (j != i) l[j * d + i] = (scale ? l[j * d + i] * beta2 : l[j * d + i]) + w;
    }
  }
}

/// FactorCombine by rows, for host spaces: iteration r does rows r and d - 1 - r (equal work per
/// iteration, d + 1 elements), each row i of the factor's upper triangle (contiguous when packed)
/// against column i of the column-major Gram matrix's lower triangle (contiguous), with the same
/// arithmetic as FactorCombine. The (i, j) form ran an MDRange with an index computation per element
/// and skipped half of its iterations (4% of a gpt2-block step at 256 in perf).
template <class T, class F>
struct FactorCombineRows {
  const T* gram;  // d x d, column-major, lower triangle
  SymmetricStorage<F> factor;
  F beta2, weight;
  bool scale;
  KOKKOS_FUNCTION void row(std::int64_t i) const {
    combine_factor_row(factor, i, beta2, weight, scale, gram + i * factor.d);
  }
  KOKKOS_FUNCTION void operator()(std::int64_t r) const {
    row(r);
    if (factor.d - 1 - r != r) row(factor.d - 1 - r);
  }
  static std::int64_t iterations(std::int64_t d) { return (d + 1) / 2; }
};

/// L = beta2 * L + w * x x^T for a one-dimensional block x: FactorCombineRows with the Gram
/// matrix's entries x_i x_j formed where they are used. A SYRK with k = 1 rounds each product
/// once, so the bits are FactorCombineRows' after SYRK; the d x d Gram matrix is neither written
/// nor read (resnet50's batch-norm blocks spent 33 ms of a step at block size 1024 in SYRK and
/// SYMM at 3.7 GFLOP/s, memory-bound).
template <class T, class F>
struct RankOneCombineRows {
  const T* x;  // d elements
  SymmetricStorage<F> factor;
  F beta2, weight;
  bool scale;
  struct Products {  // row i of x x^T: x_i x_j, rounded once in T
    T xi;
    const T* x;
    KOKKOS_INLINE_FUNCTION T operator[](std::int64_t j) const { return xi * x[j]; }
  };
  KOKKOS_FUNCTION void row(std::int64_t i) const {
    combine_factor_row(factor, i, beta2, weight, scale, Products{x[i], x});
  }
  KOKKOS_FUNCTION void operator()(std::int64_t r) const {
    row(r);
    if (factor.d - 1 - r != r) row(factor.d - 1 - r);
  }
  static std::int64_t iterations(std::int64_t d) { return (d + 1) / 2; }
};

/// The lower triangle of a column-major d x d matrix from packed symmetric storage: packed row i
/// (contiguous) into column i from the diagonal down (contiguous), rows r and d - 1 - r per
/// iteration. For a SYMM, which reads one triangle; the full unpack wrote the other triangle with
/// a stride of d.
template <class S, class T>
struct UnpackLower {
  SymmetricStorage<const S> in;  // packed
  T* out;
  KOKKOS_FUNCTION void row(std::int64_t i) const {
    const std::int64_t d = in.d;
    T* y = out + i * d;
    if (in.upper_rows()) {
      const S* x = in.upper_row(i);
      for (std::int64_t j = i; j < d; ++j) y[j] = T(x[j]);
    } else {
      for (std::int64_t j = i; j < d; ++j) y[j] = T(in(i, j));
    }
  }
  KOKKOS_FUNCTION void operator()(std::int64_t r) const {
    row(r);
    if (in.d - 1 - r != r) row(in.d - 1 - r);
  }
  static std::int64_t iterations(std::int64_t d) { return (d + 1) / 2; }
};

/// Full matrix (any layout) from (possibly packed) symmetric storage.
template <class S, class OutView>
struct Unpack {
  SymmetricStorage<const S> in;
  OutView out;
  KOKKOS_FUNCTION void operator()(std::int64_t i, std::int64_t j) const {
    // Packed storage is symmetric by construction: into a column-major matrix, write out(j, i)
    // so that the fastest index (j) writes contiguously (out(i, j) strode by d: 7.5% of a
    // gpt2-block step at 256). Full storage is copied as stored (the reference's P(c, i)).
    if constexpr (std::is_same_v<typename OutView::array_layout, Kokkos::LayoutLeft>) {
      if (in.packed) {
        out(j, i) = in(i, j);
        return;
      }
    }
    out(i, j) = in(i, j);
  }
};

/// Y[a, i, b] = sum_c X[a, c, b] * P(c, i): the mode-k product of one block with an inverse
/// factor (the reference's tensordot(X, P, dims=([0],[0])) with its axis rotation).
template <class T, class P>
struct ModeProduct {
  const T* x;
  T* y;
  std::int64_t d, inner;
  SymmetricStorage<const P> factor;
  KOKKOS_FUNCTION void operator()(std::int64_t e) const {
    const std::int64_t b = e % inner;
    const std::int64_t i = (e / inner) % d;
    const std::int64_t a = e / (inner * d);
    const T* xa = x + a * d * inner + b;
    P s = 0;
    for (std::int64_t c = 0; c < d; ++c) s += P(xa[c * inner]) * factor(c, i);
    y[e] = T(s);
  }
};

/// Y[a, i, b] = sum_c X[a, c, b] * Q(c, i) (`transpose` false: the rotation into an eigenbasis,
/// the reference's tensordot dims ([0], [0])) or sum_c X[a, c, b] * Q(i, c) (`transpose` true:
/// the rotation back, dims ([0], [1])), Q a full row-major d x d matrix.
template <class T, class P>
struct ModeProductGeneral {
  const T* x;
  T* y;
  std::int64_t d, inner;
  const P* q;
  bool transpose;
  KOKKOS_FUNCTION void operator()(std::int64_t e) const {
    const std::int64_t b = e % inner;
    const std::int64_t i = (e / inner) % d;
    const std::int64_t a = e / (inner * d);
    const T* xa = x + a * d * inner + b;
    P s = 0;
    if (transpose) {
      for (std::int64_t c = 0; c < d; ++c) s += P(xa[c * inner]) * q[i * d + c];
    } else {
      for (std::int64_t c = 0; c < d; ++c) s += P(xa[c * inner]) * q[c * d + i];
    }
    y[e] = T(s);
  }
};

/// Eigenvalue correction, per element: D = beta2 D + w R^2 (R the raw gradient in the eigenbasis;
/// the multiply by beta2 skipped when beta2 == 1, as for the factors).
template <class T>
struct CorrectedUpdate {
  const T* rotated;
  T* corrected;
  T beta2, weight;
  bool scale;
  KOKKOS_FUNCTION void operator()(std::int64_t e) const {
    const T r = rotated[e];
    corrected[e] = (scale ? beta2 * corrected[e] : corrected[e]) + weight * (r * r);
  }
};

/// Eigenvalue correction, per element: X = X / ((D / bc2)^exponent + eps) (a square root when the
/// exponent is 1/2, as Adam's).
template <class T>
struct CorrectedScale {
  T* x;
  const T* corrected;
  T bias_correction2, epsilon, exponent;
  bool divide, square_root;
  KOKKOS_FUNCTION void operator()(std::int64_t e) const {
    const T v = divide ? corrected[e] / bias_correction2 : corrected[e];
    const T root = square_root ? math::sqrt(v) : math::pow(v, exponent);
    x[e] = x[e] / (root + epsilon);
  }
};

/// Sign descent, per element: x = sign(x) * scale, sign(0) = 0.
template <class T>
struct SignScale {
  T* x;
  T scale;
  KOKKOS_FUNCTION void operator()(std::int64_t e) const {
    const T v = x[e];
    x[e] = (v > T(0) ? scale : (v < T(0) ? -scale : T(0)));
  }
};

/// out = in / divisor (Newton-Schulz's normalization) or in * factor (scaling, copies), per element.
template <class T>
struct Scale {
  const T* in;
  T* out;
  T value;
  bool divide;
  KOKKOS_FUNCTION void operator()(std::int64_t e) const { out[e] = divide ? in[e] / value : in[e] * value; }
};

/// Newton-Schulz's B = b B + c B^2, per element of the small Gram matrix.
template <class T>
struct Combine2 {
  T* b;
  const T* b2;
  T coef_b, coef_c;
  KOKKOS_FUNCTION void operator()(std::int64_t e) const { b[e] = coef_b * b[e] + coef_c * b2[e]; }
};

/// Sum of squares (and of absolute values) of a range, in double.
template <class T>
struct SumSquares {
  const T* x;
  KOKKOS_FUNCTION void operator()(std::int64_t e, double& acc) const { acc += double(x[e]) * double(x[e]); }
};
template <class T>
struct SumAbs {
  const T* x;
  KOKKOS_FUNCTION void operator()(std::int64_t e, double& acc) const { acc += math::abs(double(x[e])); }
};

/// Moves dimension k of a block to the end without a product (a dimension that is not
/// preconditioned): Y[a, b, i] = X[a, i, b]. Kept so the data flow matches the reference.
template <class T>
struct CopyBlock {
  const T* x;
  T* y;
  KOKKOS_FUNCTION void operator()(std::int64_t e) const { y[e] = x[e]; }
};

/// One symmetric storage into another (a factor and its backup): element e of the stored
/// numbers where both lay them out alike, else e = i d + j of d x d, elements below the diagonal
/// of packed storage skipped (the same numbers; see SymmetricStorage::tri).
template <class T>
struct CopyTriangle {
  SymmetricStorage<const T> from;
  SymmetricStorage<T> to;
  KOKKOS_FUNCTION void operator()(std::int64_t e) const {
    if (from.tri == to.tri) {
      to.data[e] = from.data[e];
      return;
    }
    const std::int64_t i = e / from.d, j = e - i * from.d;
    if (to.packed && i > j) return;
    to(i, j) = from(i, j);
  }
  /// Row i from the diagonal on, where both storages have contiguous upper rows.
  void row(std::int64_t i) const {
    const T* x = from.upper_row(i);
    T* y = to.upper_row(i);
    for (std::int64_t j = i; j < from.d; ++j) y[j] = x[j];
  }
};

/// CopyTriangle over (i, j) of the d x d form (an MDRange): storages laid out differently, the
/// elements below the diagonal of packed storage skipped. (The flat form over d * d, inlined
/// into Shampoo::restore_factors, made GCC 12 warn of an iteration past 2^63,
/// -Waggressive-loop-optimizations: a false positive on the flat range's trip count.)
template <class T>
struct CopyTriangle2D {
  SymmetricStorage<const T> from;
  SymmetricStorage<T> to;
  KOKKOS_FUNCTION void operator()(std::int64_t i, std::int64_t j) const {
    if (to.packed && i > j) return;
    to(i, j) = from(i, j);
  }
};

/// Per-element filtering and grafting state, in blocked order:
///   V = beta2g V + w G^2 (grafting state from the raw gradient)
///   Gbar = EMA of G with beta1 (beta3 variant), bias corrected
///   out = graft(Gbar) when grafting is used directly, else Gbar
template <class T, class MemorySpace>
struct FilterAndGraft {
  Field<const T> grad;
  Field<T> filtered;     // empty when beta1 == 0
  Field<T> graft_state;  // empty without a stateful grafting method
  Field<T> out;
  T beta1, one_minus_beta1, beta3, one_minus_beta3, bias_correction1;
  bool use_beta1, separate_beta3, use_bias_correction;
  GraftScalars<T> graft;
  bool graft_has_state, apply_graft;
  KOKKOS_FUNCTION void operator()(std::int64_t q) const { run(q, bias_correction1, graft); }
  /// The pass with this step's bias corrections passed in (the batched passes read them from
  /// device memory, StepValues, so that their job table stays the same from step to step).
  KOKKOS_FUNCTION void run(std::int64_t q, T bc1, const GraftScalars<T>& gs) const {
    const T g = grad(q);
    T v = 0;
    if (graft_has_state) {
      v = second_moment(graft_state(q), g, gs.beta2, gs.one_minus_beta2);
      graft_state(q) = v;
    }
    T gbar = g;
    if (use_beta1) {
      const T m_old = filtered(q);
      const T m = ema(m_old, g, beta1, one_minus_beta1);
      filtered(q) = m;
      gbar = separate_beta3 ? ema(m_old, g, beta3, one_minus_beta3) : m;
      if (use_bias_correction) gbar = gbar / bc1;
    }
    out(q) = apply_graft ? graft_direction(gbar, v, gs, graft_has_state) : gbar;
  }
};

/// One element's share of a block's squared norm of graft(x).
template <class T>
KOKKOS_INLINE_FUNCTION double block_norm_term(T x, T v, const GraftScalars<T>& graft, bool graft_has_state) {
  const T y = graft_direction(x, v, graft, graft_has_state);
  return double(y) * double(y);
}
/// The grafting factor of a block from its two squared norms: ||graft(Gbar)|| / (||P|| + 1e-16).
template <class T>
KOKKOS_INLINE_FUNCTION T graft_ratio(double graft_sq, double direction_sq) {
  return T(math::sqrt(graft_sq) / (math::sqrt(direction_sq) + 1e-16));
}

/// Per block: the squared Frobenius norm of graft(x) (or of x when `graft_has_state` is false)
/// into norms(block, column); one team per block (steps: HostBlockNorms, ChunkNorms).
template <class T, class MemorySpace, class ExecSpace>
struct BlockNorms {
  using member_type = typename Kokkos::TeamPolicy<ExecSpace>::member_type;
  Kokkos::View<const T*, MemorySpace> x, graft_state;
  Kokkos::View<const std::int64_t*, MemorySpace> block_begin;
  Kokkos::View<double**, MemorySpace> norms;
  int column;
  GraftScalars<T> graft;
  bool graft_has_state;
  KOKKOS_FUNCTION void operator()(const member_type& team) const {
    const std::int64_t b = team.league_rank();
    double sum = 0;
    Kokkos::parallel_reduce(
        Kokkos::TeamThreadRange(team, block_begin(b), block_begin(b + 1)),
        [&](std::int64_t q, double& acc) { acc += term(x(q), graft_has_state ? graft_state(q) : T(0), graft, graft_has_state); },
        sum);
    Kokkos::single(Kokkos::PerTeam(team), [&]() { norms(b, column) = sum; });
  }
  /// One element's share (also the fused host path's and the batched passes', which must give
  /// the same bits).
  KOKKOS_INLINE_FUNCTION static double term(T x, T v, const GraftScalars<T>& graft, bool graft_has_state) {
    return block_norm_term(x, v, graft, graft_has_state);
  }
};

/// Partial sums of host_block_sq_norm: element q goes into partial q % 16.
inline constexpr int host_norm_partials = 16;
/// The squared norm from host_block_sq_norm's 16 partial sums (its final combination, pairwise).
inline double host_sq_norm_of(const double* s) {
  const double a = ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7]));
  const double b = ((s[8] + s[9]) + (s[10] + s[11])) + ((s[12] + s[13]) + (s[14] + s[15]));
  return a + b;
}

/// Host: the squared Frobenius norm of graft(x) (of x when `has_state` is false) over n
/// contiguous elements, as BlockNorms' terms summed in 16 interleaved double partial sums
/// (element q into partial q % 16, combined pairwise at the end). The fixed order gives the same
/// bits with and without SIMD, in any thread and on either host path; a single running sum was a
/// chain of dependent additions, and GCC's errno-keeping sqrt kept the loop scalar (a fifth of a
/// steady gpt2-block step at block size 256 in perf). 16 partials, not 8: with AVX-512 a float
/// vector's two halves then go to two accumulators instead of one after the other into the same
/// one, which halves the chain of dependent additions the loop waits on (1.6 ms of a steady
/// resnet50 step at block size 256, 1 thread, Zen 5; 0.089 -> 0.063 ns per element on a block
/// in the L3 and 0.082 -> 0.051 in the L2, run on 2026-12-01).
#ifdef LATHER_HAS_AVX512_DISPATCH
/// acc[0..1] + y^2 in doubles: partials 0-7 in acc[0], 8-15 in acc[1]. A float vector of 16
/// elements (starting at a multiple of 16) is one step: its first 8 elements into acc[0], its last
/// 8 into acc[1]; a double vector of 8 goes to acc[half], half = (its first element / 8) % 2.
template <class T>
LATHER_AVX512_FN void sq_norm_add_avx512(__m512d* acc, typename simd_detail::Avx512<T>::reg y, int half = 0) {
  using D = simd_detail::Avx512<double>;
  if constexpr (std::is_same_v<T, float>) {
    // (zero-masked forms: the unmasked ones, _mm512_castps512_ps256 included, trip GCC 12's
    // maybe-uninitialized warning)
    const __m512d lo =
        _mm512_maskz_cvtps_pd(0xFF, _mm256_castpd_ps(_mm512_maskz_extractf64x4_pd(0xF, _mm512_castps_pd(y), 0)));
    const __m512d hi =
        _mm512_maskz_cvtps_pd(0xFF, _mm256_castpd_ps(_mm512_maskz_extractf64x4_pd(0xF, _mm512_castps_pd(y), 1)));
    acc[0] = D::add(acc[0], D::mul(lo, lo));
    acc[1] = D::add(acc[1], D::mul(hi, hi));
  } else {
    acc[half] = D::add(acc[half], D::mul(y, y));
  }
}
/// host_block_sq_norm's vector loop with AVX-512 (host_simd.hpp): adds elements [0, returned) to
/// the 16 partial sums s, element q into s[q % 16] in order (two 8-lane accumulators; 16 elements
/// a step: one float vector, two double ones).
template <class T>
LATHER_AVX512_FN std::int64_t host_block_sq_norm_avx512(const T* x, const T* v, std::int64_t n,
                                                        const GraftScalars<T>& graft, bool has_state, double* s) {
  using D = simd_detail::Avx512<double>;
  using S = simd_detail::Avx512<T>;
  const auto bc = S::set1(graft.bias_correction), eps = S::set1(graft.epsilon);
  __m512d acc[2] = {D::set1(0.0), D::set1(0.0)};
  std::int64_t q = 0;
  for (; q + 16 <= n; q += 16) {
    for (int h = 0; h < 16 / S::lanes; ++h) {
      const std::int64_t e = q + h * S::lanes;
      auto y = S::load(x + e);
      if (has_state) y = S::div(y, S::add(S::sqrt(S::div(S::load(v + e), bc)), eps));  // graft_direction's operations
      sq_norm_add_avx512<T>(acc, y, h);
    }
  }
  D::store(s, acc[0]);
  D::store(s + 8, acc[1]);
  return q;
}

/// The same with AVX (CPUs without AVX-512): four 4-lane double accumulators, element q into
/// s[q % 16] in order (16 elements a step: two float vectors of 8, four double ones of 4).
template <class T>
LATHER_AVX_FN std::int64_t host_block_sq_norm_avx(const T* x, const T* v, std::int64_t n, const GraftScalars<T>& graft,
                                                  bool has_state, double* s) {
  __m256d a[4] = {_mm256_setzero_pd(), _mm256_setzero_pd(), _mm256_setzero_pd(), _mm256_setzero_pd()};
  std::int64_t q = 0;
  if constexpr (std::is_same_v<T, float>) {
    const __m256 bc = _mm256_set1_ps(graft.bias_correction), eps = _mm256_set1_ps(graft.epsilon);
    for (; q + 16 <= n; q += 16) {
      for (int h = 0; h < 2; ++h) {
        __m256 y = _mm256_loadu_ps(x + q + 8 * h);
        if (has_state)
          y = _mm256_div_ps(y, _mm256_add_ps(_mm256_sqrt_ps(_mm256_div_ps(_mm256_loadu_ps(v + q + 8 * h), bc)), eps));
        const __m256d lo = _mm256_cvtps_pd(_mm256_castps256_ps128(y)), hi = _mm256_cvtps_pd(_mm256_extractf128_ps(y, 1));
        a[2 * h] = _mm256_add_pd(a[2 * h], _mm256_mul_pd(lo, lo));
        a[2 * h + 1] = _mm256_add_pd(a[2 * h + 1], _mm256_mul_pd(hi, hi));
      }
    }
  } else {
    const __m256d bc = _mm256_set1_pd(graft.bias_correction), eps = _mm256_set1_pd(graft.epsilon);
    for (; q + 16 <= n; q += 16) {
      for (int j = 0; j < 4; ++j) {
        __m256d y = _mm256_loadu_pd(x + q + 4 * j);
        if (has_state)
          y = _mm256_div_pd(y, _mm256_add_pd(_mm256_sqrt_pd(_mm256_div_pd(_mm256_loadu_pd(v + q + 4 * j), bc)), eps));
        a[j] = _mm256_add_pd(a[j], _mm256_mul_pd(y, y));
      }
    }
  }
  for (int j = 0; j < 4; ++j) _mm256_storeu_pd(s + 4 * j, a[j]);
  return q;
}
#endif

template <class T>
inline double host_block_sq_norm(const T* x, const T* v, std::int64_t n, const GraftScalars<T>& graft, bool has_state) {
  double s[host_norm_partials] = {};
  std::int64_t q = 0;
#ifdef LATHER_HAS_AVX512_DISPATCH
  if constexpr (std::is_same_v<T, float> || std::is_same_v<T, double>) {
    if (n >= 16 && simd_detail::use_avx512()) q = host_block_sq_norm_avx512(x, v, n, graft, has_state, s);
    else if (n >= 16 && simd_detail::use_avx()) q = host_block_sq_norm_avx(x, v, n, graft, has_state, s);
  }
#endif
#ifdef LATHER_HAS_HOST_NORM_SIMD
  if (q != 0) {
    // an AVX-512 or AVX loop ran; the rest is scalar
  } else if constexpr (std::is_same_v<T, float>) {
    // SSE2: eight 2-lane double accumulators, 16 elements (four float vectors of 4) a step.
    __m128d a[8];
    for (auto& r : a) r = _mm_setzero_pd();
    const __m128 bc = _mm_set1_ps(graft.bias_correction), eps = _mm_set1_ps(graft.epsilon);
    for (; q + 16 <= n; q += 16) {
      for (int j = 0; j < 4; ++j) {
        __m128 y = _mm_loadu_ps(x + q + 4 * j);
        if (has_state)  // x / (sqrt(v / bc) + eps), graft_direction's operations
          y = _mm_div_ps(y, _mm_add_ps(_mm_sqrt_ps(_mm_div_ps(_mm_loadu_ps(v + q + 4 * j), bc)), eps));
        const __m128d d0 = _mm_cvtps_pd(y), d1 = _mm_cvtps_pd(_mm_movehl_ps(y, y));
        a[2 * j] = _mm_add_pd(a[2 * j], _mm_mul_pd(d0, d0));
        a[2 * j + 1] = _mm_add_pd(a[2 * j + 1], _mm_mul_pd(d1, d1));
      }
    }
    for (int j = 0; j < 8; ++j) _mm_storeu_pd(s + 2 * j, a[j]);
  } else if constexpr (std::is_same_v<T, double>) {
    __m128d a[8];
    for (auto& r : a) r = _mm_setzero_pd();
    const __m128d bc = _mm_set1_pd(graft.bias_correction), eps = _mm_set1_pd(graft.epsilon);
    for (; q + 16 <= n; q += 16) {
      for (int j = 0; j < 8; ++j) {
        __m128d y = _mm_loadu_pd(x + q + 2 * j);
        if (has_state) y = _mm_div_pd(y, _mm_add_pd(_mm_sqrt_pd(_mm_div_pd(_mm_loadu_pd(v + q + 2 * j), bc)), eps));
        a[j] = _mm_add_pd(a[j], _mm_mul_pd(y, y));
      }
    }
    for (int j = 0; j < 8; ++j) _mm_storeu_pd(s + 2 * j, a[j]);
  }
#endif
  for (; q < n; ++q) {
    const T y = graft_direction(x[q], has_state ? v[q] : T(0), graft, has_state);
    s[q % host_norm_partials] += double(y) * double(y);
  }
  return host_sq_norm_of(s);
}

/// The scalars of the host filter loop (FilterAndGraft's, for the wide loops below).
template <class T>
struct FilterScalars {
  T beta2, one_minus_beta2, beta1, one_minus_beta1, beta3, one_minus_beta3, bias_correction1;
};

#ifdef LATHER_HAS_AVX512_DISPATCH
/// FilterAndGraft's vectorizable forms (State: the grafting's second moment; Beta1: the filtered
/// gradient; Beta3: a separate beta3; Bias: bias correction) with AVX-512 over elements
/// [0, returned), the rest left to the caller's loop. Same operations in the same order as
/// second_moment and ema, rounded alike (host_simd.hpp). Why: the bias correction is a division,
/// 4 lanes wide in the SSE2 loop (perf: the filter was 2% of a steady gpt2-block step at block
/// size 256 on a Zen 5, its divisions the hot instructions).
///
/// Norm: also adds graft(out) of every element to the 16 partial sums `s` (the grafting's
/// second moment as just stored; out itself where !State) exactly as host_block_sq_norm_avx512
/// would over out and state afterwards, element q into s[q % 16] in order: a caller going over a
/// block's rows in order, each a multiple of 16 elements long, gets that function's bits
/// (host_filter_norm_fusable). Why: the norm's two divisions and square root per element were a
/// pass of their own over the block (1.5% of a steady gpt2-block step at block size 256); here
/// they overlap the filter's wait for its state from memory.
template <bool State, bool Beta1, bool Beta3, bool Bias, bool Norm = false, class T>
LATHER_AVX512_FN std::int64_t host_filter_avx512(const T* g, T* filtered, T* state, T* out, std::int64_t n,
                                                 const FilterScalars<T>& k, const GraftScalars<T>* graft = nullptr,
                                                 double* s = nullptr) {
  using S = simd_detail::Avx512<T>;
  using D = simd_detail::Avx512<double>;
  const auto beta2 = S::set1(k.beta2), omb2 = S::set1(k.one_minus_beta2), beta1 = S::set1(k.beta1),
             omb1 = S::set1(k.one_minus_beta1), beta3 = S::set1(k.beta3), omb3 = S::set1(k.one_minus_beta3),
             bc1 = S::set1(k.bias_correction1);
  const auto bc = S::set1(Norm ? graft->bias_correction : T(1)), eps = S::set1(Norm ? graft->epsilon : T(0));
  __m512d acc[2] = {Norm ? D::load(s) : D::set1(0.0), Norm ? D::load(s + 8) : D::set1(0.0)};
  std::int64_t q = 0;
  for (; q + S::lanes <= n; q += S::lanes) {
    const auto gq = S::load(g + q);
    [[maybe_unused]] typename S::reg v;
    if constexpr (State) {
      v = S::add(S::mul(S::load(state + q), beta2), S::mul(S::mul(omb2, gq), gq));
      S::store(state + q, v);
    }
    auto gbar = gq;
    if constexpr (Beta1) {
      const auto m_old = S::load(filtered + q);
      const auto m = S::add(S::mul(m_old, beta1), S::mul(omb1, gq));
      S::store(filtered + q, m);
      gbar = Beta3 ? S::add(S::mul(m_old, beta3), S::mul(omb3, gq)) : m;
      if constexpr (Bias) gbar = S::div(gbar, bc1);
    }
    S::store(out + q, gbar);
    if constexpr (Norm) {
      auto y = gbar;
      if constexpr (State) y = S::div(y, S::add(S::sqrt(S::div(v, bc)), eps));  // graft_direction's operations
      sq_norm_add_avx512<T>(acc, y, static_cast<int>(q / 8 % 2));  // doubles: the vector's half of 16
    }
  }
  if constexpr (Norm) {
    D::store(s, acc[0]);
    D::store(s + 8, acc[1]);
  }
  return q;
}
/// The same with AVX (no FMA, so nothing is contracted).
template <bool State, bool Beta1, bool Beta3, bool Bias, class T>
LATHER_AVX_FN std::int64_t host_filter_avx(const T* g, T* filtered, T* state, T* out, std::int64_t n,
                                           const FilterScalars<T>& k) {
  using S = simd_detail::Avx<T>;
  const auto beta2 = S::set1(k.beta2), omb2 = S::set1(k.one_minus_beta2), beta1 = S::set1(k.beta1),
             omb1 = S::set1(k.one_minus_beta1), beta3 = S::set1(k.beta3), omb3 = S::set1(k.one_minus_beta3),
             bc1 = S::set1(k.bias_correction1);
  std::int64_t q = 0;
  for (; q + S::lanes <= n; q += S::lanes) {
    const auto gq = S::load(g + q);
    if constexpr (State) S::store(state + q, S::add(S::mul(S::load(state + q), beta2), S::mul(S::mul(omb2, gq), gq)));
    auto gbar = gq;
    if constexpr (Beta1) {
      const auto m_old = S::load(filtered + q);
      const auto m = S::add(S::mul(m_old, beta1), S::mul(omb1, gq));
      S::store(filtered + q, m);
      gbar = Beta3 ? S::add(S::mul(m_old, beta3), S::mul(omb3, gq)) : m;
      if constexpr (Bias) gbar = S::div(gbar, bc1);
    }
    S::store(out + q, gbar);
  }
  return q;
}
#endif

/// The elements [0, returned) of the host filter loop in its widest form available (0: none, the
/// caller's loop does all).
template <bool State, bool Beta1, bool Beta3, bool Bias, class T>
inline std::int64_t host_filter_wide(const T* g, T* filtered, T* state, T* out, std::int64_t n,
                                     const FilterScalars<T>& k) {
#ifdef LATHER_HAS_AVX512_DISPATCH
  if constexpr (std::is_same_v<T, float> || std::is_same_v<T, double>) {
    if (n >= 16 && simd_detail::use_avx512()) return host_filter_avx512<State, Beta1, Beta3, Bias>(g, filtered, state, out, n, k);
    if (n >= 8 && simd_detail::use_avx()) return host_filter_avx<State, Beta1, Beta3, Bias>(g, filtered, state, out, n, k);
  }
#endif
  (void)g, (void)filtered, (void)state, (void)out, (void)n, (void)k;
  return 0;
}

/// Whether a block's filter, run row by row in order with rows of `row_len` of its n elements,
/// can carry its grafting norm (host_filter_norm_wide, host_block_sq_norm's bits): only with
/// AVX-512, with rows a multiple of 16 elements (host_block_sq_norm's step: no scalar tail inside
/// a row, and each row starts at partial 0).
template <class T>
inline bool host_filter_norm_fusable(std::int64_t row_len, std::int64_t n) {
#ifdef LATHER_HAS_AVX512_DISPATCH
  if constexpr (std::is_same_v<T, float> || std::is_same_v<T, double>)
    return n >= 16 && row_len > 0 && row_len % host_norm_partials == 0 && simd_detail::use_avx512();
#endif
  (void)row_len, (void)n;
  return false;
}
/// host_filter_wide with the grafting norm's terms of elements [0, returned) added to the 16
/// partial sums `s` (host_filter_avx512's Norm form); only where host_filter_norm_fusable said
/// so, which leaves no tail (the caller's loop would filter one, outside the norm).
template <bool State, bool Beta1, bool Beta3, bool Bias, class T>
inline std::int64_t host_filter_norm_wide(const T* g, T* filtered, T* state, T* out, std::int64_t n,
                                          const FilterScalars<T>& k, const GraftScalars<T>& graft, double* s) {
#ifdef LATHER_HAS_AVX512_DISPATCH
  if constexpr (std::is_same_v<T, float> || std::is_same_v<T, double>)
    return host_filter_avx512<State, Beta1, Beta3, Bias, true>(g, filtered, state, out, n, k, &graft, s);
#endif
  (void)g, (void)filtered, (void)state, (void)out, (void)n, (void)k, (void)graft, (void)s;
  return 0;
}
/// The scalars of the host update loop (ApplyUpdate's, for the wide loop below): `scale` the
/// grafting ratio the fused path applies as it reads the direction.
template <class T>
struct UpdateScalars {
  T decay, momentum, one_minus_dampening, neg_lr, scale;
};

#ifdef LATHER_HAS_AVX512_DISPATCH
/// Elements ahead of the one updated that host_update_avx512 fetches (for writing): 1 KiB of
/// floats. The parameter comes from L3 or memory (a block of resnet50 is larger than L2), and
/// the loop waits on each line otherwise.
inline constexpr std::int64_t update_fetch_bytes = 1024;
/// ApplyUpdate's operations on the parameter w (and momentum mom) from the direction dir times
/// k.scale, with AVX-512 over elements [0, returned), the rest left to the caller's loop: the
/// same operations in the same order as ApplyUpdate::apply_with (the fused path's update_row),
/// rounded alike (no contraction), so the same bits. Why: the plain loop compiled to 4-lane SSE
/// (the library's baseline), waiting on the parameter's lines: 5 ms of a 200 ms steady resnet50
/// step at block size 256 on one thread, Zen 5 VM.
template <bool Decay, bool Momentum, bool Nesterov, class T>
LATHER_AVX512_FN std::int64_t host_update_avx512(T* w, const T* dir, T* mom, std::int64_t n, const UpdateScalars<T>& k) {
  using S = simd_detail::Avx512<T>;
  const auto scale = S::set1(k.scale), decay = S::set1(k.decay), momentum = S::set1(k.momentum),
             omd = S::set1(k.one_minus_dampening), neg_lr = S::set1(k.neg_lr);
  constexpr std::int64_t ahead = update_fetch_bytes / static_cast<std::int64_t>(sizeof(T));
  std::int64_t q = 0;
  for (; q + S::lanes <= n; q += S::lanes) {
    if (q + ahead < n) {
      _mm_prefetch(reinterpret_cast<const char*>(w + q + ahead), _MM_HINT_ET0);
      if constexpr (Momentum) _mm_prefetch(reinterpret_cast<const char*>(mom + q + ahead), _MM_HINT_ET0);
    }
    const auto wq = S::load(w + q);
    auto p = S::mul(S::load(dir + q), scale);
    if constexpr (Decay) p = S::add(p, S::mul(decay, wq));
    if constexpr (Momentum) {
      const auto m = S::add(S::mul(S::load(mom + q), momentum), S::mul(omd, p));
      S::store(mom + q, m);
      p = Nesterov ? S::add(S::mul(p, omd), S::mul(momentum, m)) : m;
    }
    S::store(w + q, S::add(wq, S::mul(neg_lr, p)));
  }
  return q;
}
#endif

/// The elements [0, returned) of the host update loop in its widest form available (0: none,
/// the caller's loop does all).
template <bool Decay, bool Momentum, bool Nesterov, class T>
inline std::int64_t host_update_wide(T* w, const T* dir, T* mom, std::int64_t n, const UpdateScalars<T>& k) {
#ifdef LATHER_HAS_AVX512_DISPATCH
  if constexpr (std::is_same_v<T, float> || std::is_same_v<T, double>)
    if (n >= simd_detail::Avx512<T>::lanes && simd_detail::use_avx512())
      return host_update_avx512<Decay, Momentum, Nesterov>(w, dir, mom, n, k);
#endif
  (void)w, (void)dir, (void)mom, (void)n, (void)k;
  return 0;
}

/// The fused host path's update of n contiguous elements: ApplyUpdate::apply_with on the
/// direction dir times k.scale (dir[c] * scale is the multiplication the grafting's scaling pass
/// makes on the other paths; a scale of 1 multiplies exactly), widest loop first, the same bits.
template <bool Decay, bool Momentum, bool Nesterov, class T>
inline void host_update_row(T* __restrict w, const T* __restrict dir, T* __restrict mom, std::int64_t n,
                            const UpdateScalars<T>& k) {
  for (std::int64_t c = host_update_wide<Decay, Momentum, Nesterov>(w, dir, mom, n, k); c < n; ++c) {
    T p = dir[c] * k.scale;
    if constexpr (Decay) p = p + k.decay * w[c];
    if constexpr (Momentum) {
      const T m = mom[c] * k.momentum + k.one_minus_dampening * p;
      mom[c] = m;
      p = Nesterov ? p * k.one_minus_dampening + k.momentum * m : m;
    }
    const T delta = k.neg_lr * p;
    w[c] = w[c] + delta;
  }
}

/// BlockNorms on a host space: one block per iteration with host_block_sq_norm (host functor).
template <class T, class MemorySpace>
struct HostBlockNorms : BlockNorms<T, MemorySpace, Kokkos::DefaultHostExecutionSpace> {
  using BlockNorms<T, MemorySpace, Kokkos::DefaultHostExecutionSpace>::operator();
  void operator()(std::int64_t b) const {
    const std::int64_t begin = this->block_begin(b), n = this->block_begin(b + 1) - begin;
    this->norms(b, this->column) =
        host_block_sq_norm(this->x.data() + begin, this->graft_has_state ? this->graft_state.data() + begin : nullptr, n,
                           this->graft, this->graft_has_state);
  }
};

/// P *= ||graft(Gbar)|| / (||P|| + 1e-16) per block.
template <class T, class MemorySpace, class ExecSpace>
struct GraftScale {
  /// The factor from the two squared norms (shared with the fused host path).
  KOKKOS_INLINE_FUNCTION static T ratio_of(double graft_sq, double direction_sq) { return graft_ratio<T>(graft_sq, direction_sq); }
  using member_type = typename Kokkos::TeamPolicy<ExecSpace>::member_type;
  Kokkos::View<T*, MemorySpace> direction;
  Kokkos::View<const std::int64_t*, MemorySpace> block_begin;
  Kokkos::View<const double**, MemorySpace> norms;
  // One team per block (the tests' reference for ChunkGraftScale, which the steps run): the
  // ratio once per block, then a plain scale (not two square roots for every element).
  KOKKOS_FUNCTION void operator()(const member_type& team) const {
    const std::int64_t b = team.league_rank();
    const T ratio = ratio_of(norms(b, 0), norms(b, 1));
    Kokkos::parallel_for(Kokkos::TeamThreadRange(team, block_begin(b), block_begin(b + 1)),
                         [&](std::int64_t q) { direction(q) = direction(q) * ratio; });
  }
};

/// \brief A parameter's blocks cut into chunks of multi_tensor_chunk_elements for the
/// per-parameter device kernels (ChunkNorms, ChunkNormSums, ChunkGraftScale): block b's chunks
/// are [chunk_begin(b), chunk_begin(b + 1)), at least one per block.
///
/// Why: BlockNorms and GraftScale run one team per block, and a team runs on one GPU
/// multiprocessor, so a block of a million elements was read at one multiprocessor's share of
/// the bandwidth: in the batched passes' form they were 80% of a steady resnet50 step at block
/// size 1024 on an H100, and the per-parameter kernels (KL-Shampoo, eigenvalue correction,
/// iterate averaging, DDP and sharded Shampoo on a device) took 218 of that set's 238 ms
/// (docs/performance.md, "On a GPU"). The map is fixed at construction, so no table travels to
/// the device per launch.
template <class MemorySpace>
struct BlockChunks {
  Kokkos::View<const std::int64_t*, MemorySpace> block_begin;  // elements: block b is [block_begin(b), block_begin(b + 1))
  Kokkos::View<const std::int64_t*, MemorySpace> chunk_begin;  // chunks, the same extent

  /// Chunks of a block of n elements (one for an empty block, so that every block has a team
  /// that writes its norm).
  static constexpr std::int64_t chunks_of(std::int64_t n) {
    return n <= multi_tensor_chunk_elements ? 1 : (n + multi_tensor_chunk_elements - 1) / multi_tensor_chunk_elements;
  }
  /// The chunk map of blocks with element offsets `begins` (blocks + 1 entries, the last the end).
  static std::vector<std::int64_t> chunk_begins(const std::vector<std::int64_t>& begins) {
    std::vector<std::int64_t> chunks{0};
    for (std::size_t b = 0; b + 1 < begins.size(); ++b) chunks.push_back(chunks.back() + chunks_of(begins[b + 1] - begins[b]));
    return chunks;
  }
  /// Chunk c's block b (the last whose first chunk is <= c, binary search) and its elements [begin, end).
  KOKKOS_INLINE_FUNCTION void locate(std::int64_t c, std::int64_t& b, std::int64_t& begin, std::int64_t& end) const {
    std::int64_t lo = 0, hi = static_cast<std::int64_t>(chunk_begin.extent(0)) - 1;
    while (hi - lo > 1) {
      const std::int64_t mid = lo + (hi - lo) / 2;
      if (chunk_begin(mid) <= c) lo = mid;
      else hi = mid;
    }
    b = lo;
    begin = block_begin(b) + (c - chunk_begin(b)) * multi_tensor_chunk_elements;
    end = begin + multi_tensor_chunk_elements < block_begin(b + 1) ? begin + multi_tensor_chunk_elements : block_begin(b + 1);
  }
};

/// BlockNorms per chunk: one team per chunk sums its elements' terms, into partials(c), or, where
/// every block is one chunk (`direct`), into norms(b, column) (one kernel, as BlockNorms); else
/// ChunkNormSums adds each block's partials after.
template <class T, class MemorySpace, class ExecSpace>
struct ChunkNorms {
  using member_type = typename Kokkos::TeamPolicy<ExecSpace>::member_type;
  BlockChunks<MemorySpace> chunks;
  Kokkos::View<const T*, MemorySpace> x, graft_state;
  Kokkos::View<double*, MemorySpace> partials;
  Kokkos::View<double**, MemorySpace> norms;
  int column;
  GraftScalars<T> graft;
  bool graft_has_state, direct;
  KOKKOS_FUNCTION void operator()(const member_type& team) const {
    const std::int64_t c = team.league_rank();
    std::int64_t b = 0, begin = 0, end = 0;
    chunks.locate(c, b, begin, end);
    double sum = 0;
    Kokkos::parallel_reduce(
        Kokkos::TeamThreadRange(team, begin, end),
        [&](std::int64_t q, double& acc) {
          acc += block_norm_term(x(q), graft_has_state ? graft_state(q) : T(0), graft, graft_has_state);
        },
        sum);
    Kokkos::single(Kokkos::PerTeam(team), [&]() {
      if (direct) norms(b, column) = sum;
      else partials(c) = sum;
    });
  }
};

/// norms(b, column) = the sum of block b's partials in chunk order (deterministic), per block.
template <class MemorySpace>
struct ChunkNormSums {
  Kokkos::View<const std::int64_t*, MemorySpace> chunk_begin;
  Kokkos::View<const double*, MemorySpace> partials;
  Kokkos::View<double**, MemorySpace> norms;
  int column;
  KOKKOS_FUNCTION void operator()(std::int64_t b) const {
    double s = 0;
    for (std::int64_t c = chunk_begin(b); c < chunk_begin(b + 1); ++c) s += partials(c);
    norms(b, column) = s;
  }
};

/// GraftScale per chunk: the block's ratio once per team, then the chunk scaled.
template <class T, class MemorySpace, class ExecSpace>
struct ChunkGraftScale {
  using member_type = typename Kokkos::TeamPolicy<ExecSpace>::member_type;
  BlockChunks<MemorySpace> chunks;
  Kokkos::View<T*, MemorySpace> direction;
  Kokkos::View<const double**, MemorySpace> norms;
  KOKKOS_FUNCTION void operator()(const member_type& team) const {
    std::int64_t b = 0, begin = 0, end = 0;
    chunks.locate(team.league_rank(), b, begin, end);
    const T ratio = graft_ratio<T>(norms(b, 0), norms(b, 1));
    Kokkos::parallel_for(Kokkos::TeamThreadRange(team, begin, end), [&](std::int64_t q) { direction(q) = direction(q) * ratio; });
  }
};

/// The end of the step, per parameter element: decoupled decay, momentum, W += -lr * P.
template <class T, class MemorySpace>
struct ApplyUpdate {
  TensorRef<T, MemorySpace> param;
  Field<const T> direction;
  Field<T> momentum_buffer;  // empty without momentum
  T decay, momentum, one_minus_dampening, lr;
  bool use_momentum, nesterov;
  T* delta_out = nullptr;  // DDP: the update goes to delta_out[i] (all-gathered), W is not written
  KOKKOS_FUNCTION void apply(std::int64_t i, std::int64_t q) const { apply_with(i, q, decay, lr); }
  /// The update with this step's decay and learning rate passed in (the batched passes read them
  /// from device memory, StepValues: a learning-rate schedule leaves their job table unchanged).
  KOKKOS_FUNCTION void apply_with(std::int64_t i, std::int64_t q, T decay_t, T lr_t) const {
    T& w = param[i];
    T p = direction(q);
    if (decay_t != T(0)) p = p + decay_t * w;
    if (use_momentum) {
      const T m = momentum_buffer(q) * momentum + one_minus_dampening * p;
      momentum_buffer(q) = m;
      p = nesterov ? p * one_minus_dampening + momentum * m : m;
    }
    // The update is rounded to T before it is added, on one process as after an all-gather.
    const T delta = (-lr_t) * p;
    if (delta_out != nullptr) delta_out[i] = delta;
    else w = w + delta;
  }
};

/// The end of the step with generalized primal averaging or Schedule-Free (notes section 3,
/// steps 11-15), per element: Z <- Z (1 - lr alpha); P = -lr P;
/// W += (1 - mu_x)(Z - W) + (1 - mu_x mu_y) P; Z <- Z + P.
template <class T, class MemorySpace>
struct ApplyAveragedUpdate {
  TensorRef<T, MemorySpace> param;
  Kokkos::View<const T*, MemorySpace> direction;
  Kokkos::View<T*, MemorySpace> weight_buffer;
  T z_decay, lr, one_minus_mu_x, one_minus_mu_x_mu_y;
  bool decay;
  T* delta_out = nullptr;  // DDP: as in ApplyUpdate
  KOKKOS_FUNCTION void apply(std::int64_t i, std::int64_t q) const {
    T& w = param[i];
    T z = weight_buffer(q);
    if (decay) z = z * z_decay;
    const T p = (-lr) * direction(q);
    const T delta = one_minus_mu_x * (z - w) + one_minus_mu_x_mu_y * p;
    weight_buffer(q) = z + p;
    if (delta_out != nullptr) delta_out[i] = delta;
    else w = w + delta;
  }
};

/// Iterate averaging's train/eval switch, per element: W += coefficient (Z - W).
template <class T, class MemorySpace>
struct Interpolate {
  TensorRef<T, MemorySpace> param;
  Kokkos::View<const T*, MemorySpace> weight_buffer;
  T coefficient;
  T* delta_out = nullptr;  // DDP: as in ApplyUpdate
  KOKKOS_FUNCTION void apply(std::int64_t i, std::int64_t q) const {
    T& w = param[i];
    const T delta = coefficient * (weight_buffer(q) - w);
    if (delta_out != nullptr) delta_out[i] = delta;
    else w = w + delta;
  }
};

/// Copies the parameter into a blocked buffer (the weight buffer's initial value).
template <class T, class MemorySpace>
struct GatherParam {
  TensorRef<T, MemorySpace> param;
  Kokkos::View<T*, MemorySpace> out;
  KOKKOS_FUNCTION void apply(std::int64_t i, std::int64_t q) const { out(q) = param[i]; }
};

/// Counts non-finite entries of a matrix.
template <class F, class MemorySpace>
struct CountNonFiniteMatrix {
  Kokkos::View<const F**, Kokkos::LayoutRight, MemorySpace> a;
  KOKKOS_FUNCTION void operator()(std::int64_t i, std::int64_t j, std::int64_t& n) const {
    if (!math::isfinite(a(i, j))) ++n;
  }
};

/// Full matrix out = stored / divisor (the bias-corrected factor for the root computation).
template <class F, class MemorySpace>
struct UnpackScaled {
  SymmetricStorage<const F> in;
  Kokkos::View<F**, Kokkos::LayoutRight, MemorySpace> out;
  F divisor;
  bool divide;
  KOKKOS_FUNCTION void operator()(std::int64_t i, std::int64_t j) const {
    out(i, j) = divide ? in(i, j) / divisor : in(i, j);
  }
};

/// A stand-in factor for the first step's sizing of the root steps' work (Shampoo::
/// reserve_root_steps): dense, symmetric, diagonally dominant (well conditioned: iterations
/// converge), so that a root computation on it takes the paths a real factor takes.
template <class F, class MemorySpace>
struct StandInFactor {
  Kokkos::View<F**, Kokkos::LayoutRight, MemorySpace> out;
  KOKKOS_FUNCTION void operator()(std::int64_t i, std::int64_t j) const {
    const auto n = static_cast<double>(out.extent(0));
    out(i, j) = static_cast<F>(i == j ? 2.0 * n : 1.0 / (1.0 + static_cast<double>(i + j)));
  }
};

/// Stores a full matrix (a root result) into (possibly packed) storage of another type. Packed
/// storage keeps the upper triangle, as the reference's pack_upper_triangular.
template <class In, class Out, class MemorySpace>
struct PackCopy {
  Kokkos::View<const In**, Kokkos::LayoutRight, MemorySpace> in;
  SymmetricStorage<Out> out;
  KOKKOS_FUNCTION void operator()(std::int64_t i, std::int64_t j) const {
    if (out.packed && i > j) return;
    out(i, j) = Out(in(i, j));
  }
};

/// One symmetric storage into another of another type (a pending root result, stored as its
/// factor is, into the inverse factor's storage: packed, paired or full). Packed storage is
/// written in its upper triangle only; a full source is copied element for element, so a
/// root's full result keeps its lower triangle as computed.
template <class In, class Out>
struct SymmetricCopy {
  SymmetricStorage<const In> in;
  SymmetricStorage<Out> out;
  KOKKOS_FUNCTION void operator()(std::int64_t i, std::int64_t j) const {
    if (out.packed && i > j) return;
    out(i, j) = Out(in(i, j));
  }
};

/// Identity into (possibly packed) storage: the inverse factors' initial value.
template <class F>
struct SetIdentity {
  SymmetricStorage<F> a;
  KOKKOS_FUNCTION void operator()(std::int64_t i, std::int64_t j) const {
    if (a.packed && i > j) return;
    a(i, j) = i == j ? F(1) : F(0);
  }
};

}  // namespace lather::impl::kernels

#endif
