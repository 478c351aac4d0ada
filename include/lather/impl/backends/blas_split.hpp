// SPDX-License-Identifier: Apache-2.0
/// \file
/// \brief Private. Host BLAS-3 products split into parts that run side by side on an execution
/// space's threads, each part a single-threaded BLAS call (impl::blas::SingleThreaded).
///
/// Why not the BLAS' own threads: on a host space with several threads, Kokkos' workers and
/// OpenBLAS' workers take turns on the same cores. After every threaded OpenBLAS call its workers
/// spin in `sched_yield` for a while, taking time from the Kokkos kernels that follow (about a
/// fifth of mlp's steady step at block size 1024 on 2 threads, perf). Splitting the product over
/// the Kokkos threads leaves OpenBLAS' workers asleep and runs the same kernels.
///
/// Bits: the result of a product depends on how it is split, as it does on OpenBLAS' own thread
/// count (its blocking of the summed dimension follows the part's shape), so every caller that
/// must agree with another path uses these functions with the same space and the same shapes:
/// `parts()` is a function of the space's thread count and the shape alone.
#ifndef LATHER_IMPL_BACKENDS_BLAS_SPLIT_HPP
#define LATHER_IMPL_BACKENDS_BLAS_SPLIT_HPP

#include <Kokkos_Core.hpp>

#include <lather/impl/backends/blas.hpp>
#include <lather/impl/label.hpp>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <thread>

namespace lather::impl::blas::split {

/// Rows or columns per part at least (smaller products gain less from a second thread than a
/// launch costs); boundaries are multiples of `align`, the register block of the GEMM kernels.
inline constexpr std::int64_t min_part = 128;
inline constexpr std::int64_t align = 16;

/// Parts of at most `threads` for a product whose split dimension is `free`.
inline int parts_for(std::int64_t threads, std::int64_t free) {
  return static_cast<int>(std::max<std::int64_t>(1, std::min(threads, free / min_part)));
}

/// How many parts a product whose split dimension is `free` gets on `space` (nullptr: one, the
/// caller runs inside a thread of its own). One wherever the BLAS' threads cannot be set.
template <class ExecSpace>
int parts(const ExecSpace* space, std::int64_t free) {
#ifdef LATHER_HAS_BLAS_THREAD_CONTROL
  if constexpr (Kokkos::SpaceAccessibility<ExecSpace, Kokkos::HostSpace>::accessible) {
    if (space == nullptr || !SingleThreaded::available()) return 1;
    return parts_for(space->concurrency(), free);
  } else {
    (void)space, (void)free;
    return 1;
  }
#else
  (void)space, (void)free;
  return 1;
#endif
}

/// Boundary t of `n` parts of [0, total): equal shares, aligned.
inline std::int64_t boundary(std::int64_t total, int n, int t) {
  if (t >= n) return total;
  const std::int64_t b = (total * t / n) / align * align;
  return std::min(b, total);
}

/// \brief The threads of one parallel launch working for one of them (the lead): inside a team
/// of `size` threads, the lead runs a block's whole step and hands the other members ("helpers",
/// which wait in serve()) their parts of each product, as one launch would, without a launch per
/// product: with a passive OpenMP wait policy every launch wakes sleeping workers, about 100 us
/// each on this machine, against about 1 us for a launch with spinning workers. The helpers spin
/// (yielding after a while) until the lead calls finish(). The BLAS must be single-threaded
/// meanwhile (the caller holds a SingleThreaded guard).
class Crew {
 public:
  explicit Crew(int size) : m_size(size) {}
  Crew(const Crew&) = delete;
  Crew& operator=(const Crew&) = delete;
  [[nodiscard]] int size() const { return m_size; }
  [[nodiscard]] int parts(std::int64_t free) const { return parts_for(m_size, free); }

  /// Lead: f(t) for t in [0, n), part t by member t % size (part 0 in the calling thread);
  /// returns when all are done.
  template <class F>
  void run(int n, const F& f) {
    if (n <= 1 || m_size <= 1) {
      for (int t = 0; t < n; ++t) f(t);
      return;
    }
    m_job = [](const void* g, int t) { (*static_cast<const F*>(g))(t); };
    m_arg = &f;
    m_parts = n;
    m_pending.store(m_size - 1, std::memory_order_relaxed);
    m_generation.fetch_add(1, std::memory_order_release);
    for (int t = 0; t < n; t += m_size) f(t);
    for (int spins = 0; m_pending.load(std::memory_order_acquire) != 0; ++spins) pause(spins);
  }
  /// Helper `rank` (1 to size - 1): runs its parts until finish().
  void serve(int rank) {
    unsigned seen = 0;
    for (;;) {
      unsigned g = 0;
      for (int spins = 0; (g = m_generation.load(std::memory_order_acquire)) == seen; ++spins) {
        if (m_done.load(std::memory_order_acquire)) return;
        pause(spins);
      }
      seen = g;
      for (int t = rank; t < m_parts; t += m_size) m_job(m_arg, t);
      m_pending.fetch_sub(1, std::memory_order_release);
    }
  }
  /// Lead: releases the helpers (after its last run()).
  void finish() { m_done.store(true, std::memory_order_release); }

 private:
  static void pause(int spins) {
    if (spins < 4096) {
#if defined(__x86_64__) || defined(__i386__)
      __builtin_ia32_pause();
#endif
    } else {
      std::this_thread::yield();  // oversubscribed cores: let the lead run
    }
  }
  int m_size;
  void (*m_job)(const void*, int) = nullptr;
  const void* m_arg = nullptr;
  int m_parts = 0;
  std::atomic<int> m_pending{0};
  std::atomic<unsigned> m_generation{0};
  std::atomic<bool> m_done{false};
};

/// Where the parts of a product run: a launch on a space, a crew, or nowhere (one part).
template <class ExecSpace>
struct OnSpace {
  const ExecSpace* space;
  [[nodiscard]] int parts(std::int64_t free) const { return split::parts(space, free); }
  template <class F>
  void run(int n, const F& f) const {
    SingleThreaded single;
    space->fence();
    Kokkos::parallel_for(LATHER_LABEL("lather::blas_split"),
                         Kokkos::RangePolicy<ExecSpace, Kokkos::Schedule<Kokkos::Static>, Kokkos::IndexType<int>>(*space, 0, n),
                         f);
    space->fence();  // before the guard gives the BLAS its threads back
  }
};
struct OnCrew {
  Crew* crew;
  [[nodiscard]] int parts(std::int64_t free) const { return crew == nullptr ? 1 : crew->parts(free); }
  template <class F>
  void run(int n, const F& f) const {
    crew->run(n, f);
  }
};
template <class ExecSpace>
OnSpace<ExecSpace> on(const ExecSpace* space) {
  return {space};
}
inline OnCrew on(Crew* crew) { return {crew}; }

/// The lower triangle of C (n x n) = alpha op(A) op(A)^T + beta C (`trans` as blas::syrk), split
/// into 2p column bands of equal width, each a SYRK on its diagonal block and a GEMM for the rows
/// below it; part t takes bands t and 2p - 1 - t (folded), so every part runs two SYRKs of the
/// same size and GEMMs of n - w rows in all: equal work of the same kinds. (Bands of equal
/// triangle area, one per part, gave the last part a SYRK alone and the first a GEMM: on mlp's
/// (512, 784) block at size 1024 the GEMM part waited for the slower SYRK one.) `where`: a space
/// (one launch), a crew, or nullptr.
template <class T, class Where>
void syrk_lower(Where* where, char trans, std::int64_t n, std::int64_t k, T alpha, const T* a, std::int64_t lda, T beta,
                T* c, std::int64_t ldc) {
  const auto w = on(where);
  const int p = w.parts(n);
  if (p <= 1) {
    blas::syrk<T>('L', trans, n, k, alpha, a, lda, beta, c, ldc);
    return;
  }
  const std::int64_t bands = 2 * static_cast<std::int64_t>(p);
  const std::int64_t width = ((n + bands - 1) / bands + align - 1) / align * align;
  const bool tr = trans == 'T';
  // lather's own SYRK computes each element alike in any band of columns: a band is its columns
  // down to row n, and the split gives the whole product's bits.
  const bool tiles = tr ? tiled::takes_transposed<T>(n, k, alpha) : tiled::takes<T>(n, k, alpha);
  auto band = [=](std::int64_t b) {
    const std::int64_t j0 = std::min(n, b * width), j1 = std::min(n, (b + 1) * width);
    if (j1 <= j0) return;
    if (tiles) {
      if (tr) tiled::syrk_columns_transposed<T>('L', n, k, alpha, a, lda, beta, c, ldc, j0, j1);
      else tiled::syrk_columns<T>('L', n, k, alpha, a, lda, beta, c, ldc, j0, j1);
      return;
    }
    const T* a0 = tr ? a + j0 * lda : a + j0;  // the band's columns (rows) of op(A)^T
    const T* a1 = tr ? a + j1 * lda : a + j1;
    blas::syrk<T>('L', trans, j1 - j0, k, alpha, a0, lda, beta, c + j0 + j0 * ldc, ldc);
    if (n > j1)
      blas::gemm<T>(tr ? 'T' : 'N', tr ? 'N' : 'T', n - j1, j1 - j0, k, alpha, a1, lda, a0, lda, beta, c + j1 + j0 * ldc,
                    ldc);
  };
  w.run(p, [=](int t) {
    band(t);
    band(bands - 1 - t);
  });
}

/// syrk_lower with trans 'N' whose k columns (lda apart) come in runs of `run` columns, the runs
/// `run_stride` apart (small::syrk_n_runs: a block's last dimension read where it lies in its
/// parameter). Only where small::takes<T>(n) (the caller checks; one part: n is below any
/// split's width).
template <class T>
void syrk_lower_runs(std::int64_t n, std::int64_t k, T alpha, const T* a, std::int64_t lda, std::int64_t run,
                     std::int64_t run_stride, T beta, T* c, std::int64_t ldc) {
  small::syrk_n_runs<T>('L', n, k, alpha, a, lda, run, run_stride, beta, c, ldc);
}

/// syrk_lower with trans 'T' on the mode unfolding of x, a row-major (outer, n, inner) tensor (A
/// k x n, k = outer inner, as impl::kernels::UnfoldMode writes it transposed), read from x where
/// it is, in the same bands: where lather's own SYRK takes the shape (tiled::takes_transposed);
/// returns false otherwise, having done nothing (the caller unfolds and calls syrk_lower).
/// `slab`: how far apart x's n inner elements of each outer index lie (0: n inner).
template <class T, class Where>
bool syrk_lower_unfolded(Where* where, std::int64_t n, std::int64_t outer, std::int64_t inner, T alpha, const T* x,
                         T beta, T* c, std::int64_t ldc, std::int64_t slab = 0) {
  const std::int64_t k = outer * inner;
  if (!tiled::takes_transposed<T>(n, k, alpha)) return false;
  const auto w = on(where);
  const int p = w.parts(n);
  if (p <= 1) {
    tiled::syrk_columns_unfolded<T>('L', n, outer, inner, alpha, x, beta, c, ldc, 0, n, slab);
    return true;
  }
  const std::int64_t bands = 2 * static_cast<std::int64_t>(p);
  const std::int64_t width = ((n + bands - 1) / bands + align - 1) / align * align;
  auto band = [=](std::int64_t b) {
    const std::int64_t j0 = std::min(n, b * width), j1 = std::min(n, (b + 1) * width);
    if (j1 > j0) tiled::syrk_columns_unfolded<T>('L', n, outer, inner, alpha, x, beta, c, ldc, j0, j1, slab);
  };
  w.run(p, [=](int t) {
    band(t);
    band(bands - 1 - t);
  });
  return true;
}

/// tiled::symm_right_mode over all m = outer inner rows, split into row parts as symm's 'R'
/// (the same bits in any split; y may be x): where tiled::takes_symm_right_mode; returns false
/// otherwise, having done nothing.
template <class T, class Where>
bool symm_right_mode(Where* where, char uplo, std::int64_t outer, std::int64_t d, std::int64_t inner, T alpha,
                     const T* a, std::int64_t lda, const T* x, T* y) {
  const std::int64_t m = outer * inner;
  if (!tiled::takes_symm_right_mode<T>(m, d, inner, alpha)) return false;
  const auto w = on(where);
  const int p = w.parts(m);
  if (p <= 1) {
    tiled::symm_right_mode<T>(uplo, 0, m, d, inner, alpha, a, lda, x, y);
    return true;
  }
  w.run(p, [=](int t) {
    tiled::symm_right_mode<T>(uplo, boundary(m, p, t), boundary(m, p, t + 1), d, inner, alpha, a, lda, x, y);
  });
  return true;
}

/// C (m x n) = alpha A B + beta C (`side` 'L') or alpha B A + beta C (`side` 'R'), A symmetric
/// (blas::symm), split along the dimension that A does not span: columns for 'L', rows for 'R'.
template <class T, class Where>
void symm(Where* where, char side, char uplo, std::int64_t m, std::int64_t n, T alpha, const T* a, std::int64_t lda,
          const T* b, std::int64_t ldb, T beta, T* c, std::int64_t ldc) {
  const auto w = on(where);
  const bool left = side == 'L';
  const int p = w.parts(left ? n : m);
  if (p <= 1) {
    blas::symm<T>(side, uplo, m, n, alpha, a, lda, b, ldb, beta, c, ldc);
    return;
  }
  w.run(p, [=](int t) {
    if (left) {
      const std::int64_t j0 = boundary(n, p, t), j1 = boundary(n, p, t + 1);
      blas::symm<T>(side, uplo, m, j1 - j0, alpha, a, lda, b + j0 * ldb, ldb, beta, c + j0 * ldc, ldc);
    } else {
      const std::int64_t i0 = boundary(m, p, t), i1 = boundary(m, p, t + 1);
      blas::symm<T>(side, uplo, i1 - i0, n, alpha, a, lda, b + i0, ldb, beta, c + i0, ldc);
    }
  });
}

/// C (m x n) = alpha op(A) op(B) + beta C (blas::gemm), split along the larger of C's dimensions.
template <class T, class Where>
void gemm(Where* where, char ta, char tb, std::int64_t m, std::int64_t n, std::int64_t k, T alpha, const T* a,
          std::int64_t lda, const T* b, std::int64_t ldb, T beta, T* c, std::int64_t ldc) {
  const auto w = on(where);
  const bool by_columns = n >= m;
  const int p = w.parts(by_columns ? n : m);
  if (p <= 1) {
    blas::gemm<T>(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
    return;
  }
  w.run(p, [=](int t) {
    if (by_columns) {
      const std::int64_t j0 = boundary(n, p, t), j1 = boundary(n, p, t + 1);
      blas::gemm<T>(ta, tb, m, j1 - j0, k, alpha, a, lda, tb == 'N' ? b + j0 * ldb : b + j0, ldb, beta, c + j0 * ldc, ldc);
    } else {
      const std::int64_t i0 = boundary(m, p, t), i1 = boundary(m, p, t + 1);
      blas::gemm<T>(ta, tb, i1 - i0, n, k, alpha, ta == 'N' ? a + i0 : a + i0 * lda, lda, b, ldb, beta, c + i0, ldc);
    }
  });
}

}  // namespace lather::impl::blas::split

#endif
