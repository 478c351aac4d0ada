// SPDX-License-Identifier: Apache-2.0
/// \file
/// \brief Private. Dense n x n matrix kernels of the root-inverse strategies (element-wise
/// functors and reductions) and `MatrixOps`, which launches them and the matrix products on one
/// execution space instance.
///
/// Matrices are row-major (`Kokkos::LayoutRight`) n x n Views; the functors index them with one
/// flat index k = i*n + j. Reductions accumulate in double whatever the matrix scalar is, and map a
/// non-finite element to +infinity before comparing, so that a NaN never reaches an ordered
/// comparison (which would raise FE_INVALID) and never disappears inside a max.
#ifndef LATHER_IMPL_KERNELS_MATRIX_FUNCTIONS_HPP
#define LATHER_IMPL_KERNELS_MATRIX_FUNCTIONS_HPP

#include <lather/error.hpp>
#include <lather/impl/backends/blas.hpp>
#include <lather/impl/label.hpp>
#include <lather/impl/math.hpp>
#include <lather/impl/work_matrices.hpp>

#include <KokkosBlas3_gemm.hpp>
#include <Kokkos_Core.hpp>

#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <type_traits>
#include <utility>

namespace lather::impl::kernels {

using index_type = std::int64_t;

/// The functors, in their own namespace so that their short names cannot collide with other
/// kernels of lather::impl::kernels.
namespace matrix_functions {

// ---- element-wise ---------------------------------------------------------------------------------

/// `out = scale * in + shift * I` (in may have another scalar type; converted first).
template <class Out, class In>
struct ScaleShiftIdentity {
  using value_type = typename Out::non_const_value_type;
  Out out;
  In in;
  value_type scale, shift;
  index_type n;
  KOKKOS_FUNCTION void operator()(index_type k) const {
    const index_type i = k / n, j = k % n;
    const value_type a = scale * static_cast<value_type>(in(i, j));
    out(i, j) = i == j ? a + shift : a;
  }
};

/// `out = diagonal * I`.
template <class Out>
struct ScaledIdentity {
  using value_type = typename Out::non_const_value_type;
  Out out;
  value_type diagonal;
  index_type n;
  KOKKOS_FUNCTION void operator()(index_type k) const {
    const index_type i = k / n, j = k % n;
    out(i, j) = i == j ? diagonal : value_type(0);
  }
};

/// Every element set to `value` (used to mark a non-finite result with NaN or Inf).
template <class Out>
struct FillMatrix {
  using value_type = typename Out::non_const_value_type;
  Out out;
  value_type value;
  index_type n;
  KOKKOS_FUNCTION void operator()(index_type k) const { out(k / n, k % n) = value; }
};

/// The first Horner step of the higher-order iteration: `base = I - M` and
/// `mp = b_last * base + b_second_last * I` (the reference's
/// `base_matrix.mul(b[order-1]).add_(identity, alpha=b[order-2])`).
template <class Out, class In>
struct HornerStart {
  using value_type = typename Out::non_const_value_type;
  Out base, mp;
  In m;
  value_type b_last, b_second_last;
  index_type n;
  KOKKOS_FUNCTION void operator()(index_type k) const {
    const index_type i = k / n, j = k % n;
    const value_type b = (i == j ? value_type(1) : value_type(0)) - m(i, j);
    base(i, j) = b;
    const value_type v = b_last * b;
    mp(i, j) = i == j ? v + b_second_last : v;
  }
};

/// `out = static_cast<out scalar>(in)`.
template <class Out, class In>
struct CastCopy {
  using value_type = typename Out::non_const_value_type;
  Out out;
  In in;
  index_type n;
  KOKKOS_FUNCTION void operator()(index_type k) const {
    const index_type i = k / n, j = k % n;
    out(i, j) = static_cast<value_type>(in(i, j));
  }
};

// ---- reductions -----------------------------------------------------------------------------------

/// max_ij |M(i,j) - I(i,j)| (torch.dist(M, I, p=inf)); non-finite elements count as +infinity.
template <class In>
struct MaxAbsMinusIdentity {
  In m;
  index_type n;
  double infinity;
  KOKKOS_FUNCTION void operator()(index_type k, double& result) const {
    const index_type i = k / n, j = k % n;
    const double d = static_cast<double>(m(i, j)) - (i == j ? 1.0 : 0.0);
    const double v = math::isfinite(d) ? math::abs(d) : infinity;
    if (v > result) result = v;
  }
};

/// max_i sum_j |A(i,j)| (the induced infinity norm); a non-finite row sum counts as +infinity.
template <class In>
struct MaxAbsRowSum {
  In a;
  index_type n;
  double infinity;
  KOKKOS_FUNCTION void operator()(index_type i, double& result) const {
    double s = 0;
    for (index_type j = 0; j < n; ++j) s += math::abs(static_cast<double>(a(i, j)));
    const double v = math::isfinite(s) ? s : infinity;
    if (v > result) result = v;
  }
};

/// sum_ij A(i,j)^2 (squared Frobenius norm).
template <class In>
struct SumOfSquares {
  In a;
  index_type n;
  KOKKOS_FUNCTION void operator()(index_type k, double& sum) const {
    const double v = static_cast<double>(a(k / n, k % n));
    sum += v * v;
  }
};

/// sum_i A(i,i).
template <class In>
struct Trace {
  In a;
  KOKKOS_FUNCTION void operator()(index_type i, double& sum) const { sum += static_cast<double>(a(i, i)); }
};

/// Number of NaN or Inf elements.
template <class In>
struct CountNonFiniteMatrix {
  In a;
  index_type n;
  KOKKOS_FUNCTION void operator()(index_type k, std::int64_t& count) const {
    if (!math::isfinite(a(k / n, k % n))) ++count;
  }
};

}  // namespace matrix_functions

// ---- the matrix product ---------------------------------------------------------------------------

/// \brief `C = alpha * op(A) * op(B) + beta * C` with op given by `trans_a`/`trans_b` ("N" or
/// "T"): the one place lather calls a BLAS-3 product.
///
/// Uses the `KokkosBlas::gemm` overload without an execution-space argument (the one in every
/// Kokkos Kernels release; the instance overload is 4.1+ only). It runs on the default instance of
/// `CV::execution_space` (or synchronously in a host BLAS), so the helper fences `space` before
/// (A, B and C were written by kernels queued there) and that default instance after (later
/// kernels on `space` read C), unless `space` is a CUDA instance on that default instance's
/// stream (same_stream_as_gemm): the stream then orders the kernels and the product itself.
/// On an H200 dropping them made steady Shampoo steps 1.04-1.40x faster (docs/performance.md,
/// "On a GPU"). Switching to the instance overload removes both fences everywhere.
///
/// Host data used by a host execution space goes straight to the host BLAS (impl/backends/blas.hpp:
/// any contiguous layout, no label strings, no allocation); the rest through Kokkos Kernels.
/// The default instance of `Space`, one handle for the process: Kokkos 3.4's default constructors
/// of device spaces allocate (a HostSharedPtr's control block), which a step must not do per
/// product. Its state (stream, fences) is the default instance's current one.
template <class Space>
const Space& default_instance() {
  static const Space instance;
  return instance;
}

template <class ExecSpace, class CV>
bool same_stream_as_gemm([[maybe_unused]] const ExecSpace& space) {
#if defined(KOKKOS_ENABLE_CUDA)
  // Kokkos Kernels' cuBLAS product runs on the stream of CV's default instance (3.4: cuBLAS'
  // default stream, which is the Kokkos 3.4 default instance's; 4.x sets that instance's stream).
  if constexpr (std::is_same_v<ExecSpace, Kokkos::Cuda> &&
                std::is_same_v<typename CV::execution_space, Kokkos::Cuda>) {
    // Not a Kokkos::Cuda() per product: the suite counted its allocation once per product of a
    // steady step on an H200 (docs/performance.md, "On a GPU", fifteenth session).
    return space.cuda_stream() == default_instance<Kokkos::Cuda>().cuda_stream();
  }
#endif
  return false;  // host spaces (synchronous BLAS) and HIP (not measured on a GPU): fenced
}

template <class ExecSpace, class AV, class BV, class CV>
void gemm(const ExecSpace& space, const char* trans_a, const char* trans_b,
          typename CV::const_value_type alpha, const AV& a, const BV& b, typename CV::const_value_type beta,
          const CV& c) {
  const bool ordered = same_stream_as_gemm<ExecSpace, CV>(space);
  if (!ordered) space.fence();
  if constexpr (blas::host_blas_eligible<ExecSpace, AV, BV, CV>) {
    if (blas::gemm_views(trans_a[0], trans_b[0], alpha, a, b, beta, c)) return;
  }
  KokkosBlas::gemm(trans_a, trans_b, alpha, a, b, beta, c);
  if (!ordered) default_instance<typename CV::execution_space>().fence();
}

// ---- launcher -------------------------------------------------------------------------------------

/// \brief Launches the kernels above on one execution space instance for n x n matrices of
/// scalar `C` in `MemorySpace`. Work matrices are `Kokkos::Device<ExecSpace, MemorySpace>` Views,
/// so the products run on `ExecSpace` too. Reductions return to the host (they wait for `space`).
template <class ExecSpace, class C, class MemorySpace>
class MatrixOps {
 public:
  using matrix = Kokkos::View<C**, Kokkos::LayoutRight, Kokkos::Device<ExecSpace, MemorySpace>>;
  using policy = Kokkos::RangePolicy<ExecSpace, Kokkos::IndexType<index_type>>;

  using lease_type = WorkMatrixCache::Lease<matrix>;

  /// Work matrices come from `lease` (a strategy's WorkMatrixCache) when given, else are allocated.
  MatrixOps(const ExecSpace& space, index_type n, lease_type* lease = nullptr)
      : m_space(space), m_n(n), m_lease(lease) {}

  [[nodiscard]] index_type n() const { return m_n; }

  /// An uninitialized n x n work matrix (the lease's next one when there is a lease).
  [[nodiscard]] matrix allocate(const char* label) const {
    if (m_lease != nullptr) return m_lease->next(label);
    return matrix(Kokkos::view_alloc(Kokkos::WithoutInitializing, std::string(label)), m_n, m_n);
  }

  /// `out = scale * in + shift * I`.
  template <class In>
  void scale_shift(const matrix& out, const In& in, double scale, double shift) const {
    Kokkos::parallel_for(LATHER_LABEL("lather::root_inverse::scale_shift"), elements(),
                         matrix_functions::ScaleShiftIdentity<matrix, In>{out, in, C(scale), C(shift), m_n});
  }
  /// `out = diagonal * I`.
  void scaled_identity(const matrix& out, double diagonal) const {
    Kokkos::parallel_for(LATHER_LABEL("lather::root_inverse::identity"), elements(),
                         matrix_functions::ScaledIdentity<matrix>{out, C(diagonal), m_n});
  }
  /// Every element of `out` set to `value`.
  template <class Out>
  void fill(const Out& out, typename Out::non_const_value_type value) const {
    Kokkos::parallel_for(LATHER_LABEL("lather::root_inverse::fill"), elements(),
                         matrix_functions::FillMatrix<Out>{out, value, m_n});
  }
  /// `base = I - m`, `mp = b_last * base + b_second_last * I`.
  void horner_start(const matrix& base, const matrix& mp, const matrix& m, C b_last, C b_second_last) const {
    Kokkos::parallel_for(
        LATHER_LABEL("lather::root_inverse::horner_start"), elements(),
        matrix_functions::HornerStart<matrix, matrix>{base, mp, m, b_last, b_second_last, m_n});
  }
  /// `out = in`, converted to `out`'s scalar.
  template <class Out, class In>
  void cast_copy(const Out& out, const In& in) const {
    Kokkos::parallel_for(LATHER_LABEL("lather::root_inverse::cast_copy"), elements(),
                         matrix_functions::CastCopy<Out, In>{out, in, m_n});
  }

  /// `c = alpha * a * b + beta * c`.
  void multiply(const matrix& a, const matrix& b, const matrix& c, C alpha = C(1), C beta = C(0)) const {
    gemm(m_space, "N", "N", alpha, a, b, beta, c);
  }

  /// `base^p` for p >= 1 by binary powering (most significant bit first: ceil(log2 p) squarings
  /// plus one product per further set bit). Returns the View holding the result: `base` itself for
  /// p = 1, otherwise `scratch1` or `scratch2` (both distinct from `base`).
  [[nodiscard]] matrix power(const matrix& base, long long p, const matrix& scratch1,
                             const matrix& scratch2) const {
    int top = 0;
    while ((p >> (top + 1)) != 0) ++top;
    matrix result = base;
    for (int bit = top - 1; bit >= 0; --bit) {
      matrix dest = result.data() == scratch1.data() ? scratch2 : scratch1;
      multiply(result, result, dest);
      result = dest;
      if (((p >> bit) & 1) != 0) {
        dest = result.data() == scratch1.data() ? scratch2 : scratch1;
        multiply(result, base, dest);
        result = dest;
      }
    }
    return result;
  }

  /// max_ij |m - I| (+infinity when any element is not finite).
  template <class In>
  [[nodiscard]] double max_abs_minus_identity(const In& m) const {
    double result = 0;
    Kokkos::parallel_reduce(LATHER_LABEL("lather::root_inverse::max_abs_minus_identity"), elements(),
                            matrix_functions::MaxAbsMinusIdentity<In>{m, m_n, infinity()},
                            Kokkos::Max<double>(result));
    return result;
  }
  /// max_i sum_j |a(i,j)| (+infinity when not finite).
  template <class In>
  [[nodiscard]] double max_abs_row_sum(const In& a) const {
    double result = 0;
    Kokkos::parallel_reduce(LATHER_LABEL("lather::root_inverse::max_abs_row_sum"), policy(m_space, 0, m_n),
                            matrix_functions::MaxAbsRowSum<In>{a, m_n, infinity()},
                            Kokkos::Max<double>(result));
    return result;
  }
  /// ||a||_F (accumulated in double).
  template <class In>
  [[nodiscard]] double frobenius_norm(const In& a) const {
    double sum = 0;
    Kokkos::parallel_reduce(LATHER_LABEL("lather::root_inverse::frobenius_norm"), elements(),
                            matrix_functions::SumOfSquares<In>{a, m_n}, sum);
    return std::sqrt(sum);
  }
  /// trace(a) (accumulated in double).
  template <class In>
  [[nodiscard]] double trace(const In& a) const {
    double sum = 0;
    Kokkos::parallel_reduce(LATHER_LABEL("lather::root_inverse::trace"), policy(m_space, 0, m_n),
                            matrix_functions::Trace<In>{a}, sum);
    return sum;
  }
  /// Number of NaN or Inf elements of `a`.
  template <class In>
  [[nodiscard]] std::int64_t count_non_finite(const In& a) const {
    std::int64_t count = 0;
    Kokkos::parallel_reduce(LATHER_LABEL("lather::root_inverse::count_non_finite"), elements(),
                            matrix_functions::CountNonFiniteMatrix<In>{a, m_n}, count);
    return count;
  }

 private:
  [[nodiscard]] policy elements() const { return policy(m_space, 0, m_n * m_n); }
  static constexpr double infinity() { return std::numeric_limits<double>::infinity(); }

  ExecSpace m_space;
  index_type m_n;
  lease_type* m_lease;
};

}  // namespace lather::impl::kernels

namespace lather::impl {

/// \brief The argument checks shared by the root-inverse strategies: A square, X the same shape,
/// the root supported (`root_rule` says which roots are), epsilon finite and >= 0.
template <class AV, class XV>
void check_root_inverse_arguments(const char* strategy, const AV& a, const XV& x, double root,
                                  bool root_supported, const char* root_rule, double epsilon) {
  LATHER_THROW_IF(a.extent(0) != a.extent(1), "lather::", strategy, ": A must be square, got ", a.extent(0),
                  " x ", a.extent(1));
  LATHER_THROW_IF(x.extent(0) != a.extent(0) || x.extent(1) != a.extent(1), "lather::", strategy,
                  ": X must have A's shape ", a.extent(0), " x ", a.extent(1), ", got ", x.extent(0), " x ",
                  x.extent(1));
  LATHER_THROW_IF(!root_supported, "lather::", strategy, ": root ", root, " is not supported (", root_rule,
                  ")");
  LATHER_THROW_IF(!(std::isfinite(epsilon) && std::isgreaterequal(epsilon, 0.0)), "lather::", strategy,
                  ": epsilon = ", epsilon, " must be finite and >= 0");
}

}  // namespace lather::impl

#endif
