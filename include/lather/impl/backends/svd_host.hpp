// SPDX-License-Identifier: Apache-2.0
/// \file
/// \brief Private. Thin SVD of a row-major host matrix through LAPACK's gesdd, with a
/// deterministic sign for every singular pair (for GaLore's projections).
#ifndef LATHER_IMPL_BACKENDS_SVD_HOST_HPP
#define LATHER_IMPL_BACKENDS_SVD_HOST_HPP

#include <lather/error.hpp>
#include <lather/impl/backends/lapack.hpp>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <type_traits>
#include <vector>

namespace lather::impl {

/// \brief a (row-major, m x n) = u diag(s) vt, k = min(m, n): u (row-major, m x k), s (k,
/// descending, >= 0), vt (row-major, k x n). The outputs are resized (keeping their capacity:
/// with outputs and LAPACK's arrays kept from a previous call of the size, nothing is allocated);
/// `a` is read only.
///
/// Sign convention: singular vectors are unique only up to a common sign flip of u[:, l] and
/// vt[l, :] (and up to rotation within a repeated singular value), and LAPACK builds, GPU solvers
/// or a slightly different matrix may pick the other sign. GaLore projects the optimizer states
/// onto these vectors, so every rank must get the same projector, and a flip between two updates
/// would negate the projected states. Each pair is therefore flipped so that the entry of largest
/// magnitude of vt[l, :] is positive (the first such entry on ties). With this, two calls on the
/// same bits with the same LAPACK give bitwise equal results; the sign no longer depends on the
/// solver for simple singular values.
///
/// A row-major m x n matrix is the column-major n x m matrix a^T = v s u^T, so gesdd on it gives
/// v as its column-major "u" (= row-major vt) and u^T as its "vt" (= row-major u): no transposes.
/// \throws lather::invalid_argument for a negative or above-int extent, lather::runtime_error
/// when gesdd fails (no convergence, NaN entries).
template <class T>
void thin_svd_host(std::int64_t m, std::int64_t n, const T* a_row_major, std::vector<T>& u_row_major,
                   std::vector<T>& s, std::vector<T>& vt_row_major) {
  static_assert(std::is_same_v<T, double> || std::is_same_v<T, float>, "thin_svd_host: float or double");
  constexpr std::int64_t int_max = std::numeric_limits<lapack::lapack_int>::max();
  LATHER_THROW_IF(m < 0 || n < 0 || m > int_max || n > int_max, "lather::impl::thin_svd_host: a ", m, " x ",
                  n, " matrix is outside the extents a 32-bit LAPACK accepts");
  const std::int64_t k = std::min(m, n);
  const auto um = static_cast<std::size_t>(m), un = static_cast<std::size_t>(n),
             uk = static_cast<std::size_t>(k);
  u_row_major.assign(um * uk, T(0));
  s.assign(uk, T(0));
  vt_row_major.assign(uk * un, T(0));
  if (k == 0) return;
  const lapack::lapack_int info =
      lapack::gesdd<T>(static_cast<lapack::lapack_int>(n), static_cast<lapack::lapack_int>(m), a_row_major,
                       s.data(), vt_row_major.data(), u_row_major.data());
  LATHER_THROW_RUNTIME_IF(info != 0, "lather: the SVD of a ", m, " x ", n, " matrix failed (LAPACK ",
                          std::is_same_v<T, double> ? "dgesdd" : "sgesdd", " info = ", info,
                          info > 0     ? ": no convergence"
                          : info == -4 ? ": the matrix has NaN entries"
                                       : "",
                          ")");
  for (std::size_t l = 0; l < uk; ++l) {
    T* row = vt_row_major.data() + l * un;
    std::size_t pivot = 0;
    for (std::size_t j = 1; j < un; ++j)
      if (std::abs(row[j]) > std::abs(row[pivot])) pivot = j;
    if (row[pivot] < T(0)) {
      for (std::size_t j = 0; j < un; ++j) row[j] = -row[j];
      for (std::size_t i = 0; i < um; ++i) u_row_major[i * uk + l] = -u_row_major[i * uk + l];
    }
  }
}

}  // namespace lather::impl

#endif
