// SPDX-License-Identifier: Apache-2.0
/// \file
/// \brief Private. Queued matrix products `C = op(A) op(B)`, run grouped by shape: one batched
/// BLAS call per shape where the BLAS has one (cuBLAS' `cublas{S,D}gemmBatched`), else one call
/// per product (the caller's routine: the host BLAS, Kokkos Kernels).
///
/// Why: Shampoo's batched passes (set_batched_passes) queue a Gram product and a preconditioning
/// product per factor of every block. At block size 256 a ResNet-50 is about a thousand such
/// products of a handful of shapes; made one by one on an H100 they were 90% of a steady step
/// (the twentieth round's kernel profile, docs/performance-history.md, "The batched passes on an
/// H100"), each too small to fill the GPU. One call per shape launches them together.
///
/// Only groups of shallow products are batched: inner dimension k at most depth_ratio() (16)
/// times the larger of m and n. A batched call gives each product's output tiles to one thread
/// block apiece, so a long reduction into a small output (the Gram matrix of a 3-wide convolution
/// dimension: 3 x 3 from k = 196608 in ResNet-50 at block size 1024) runs serially on a few
/// multiprocessors, where cuBLAS' single call splits k. On an H100, batching every group made
/// ResNet-50's steady step 18.6 ms at block size 1024 and 8.3 ms at 256; leaving the deep groups to
/// one call each made them 8.9-9.4 and 6.2-6.4 ms, the other sets unchanged
/// (docs/performance-history.md, "Batched products, chunked products and norms on an H100").
///
/// The products of one run must be independent (no product reads another's output). Within a
/// shape group the products keep their queue order; the groups run in order of first appearance.
/// The pointer arrays a batched call reads live in the memory space and are uploaded only where
/// they changed since the same position of the previous step (begin_step()): steady steps queue
/// the same products, so they upload nothing (no host-to-device copy, which would wait for the
/// stream).
///
/// Deep Gram products of small outputs are split instead (set_split(); on by default where the
/// BLAS batches): X^T X of a k x m X with m <= 32 and k > max(16 m, 2048) becomes chunks of 2048
/// rows of X, batched by shape like shallow products into partial outputs, which one kernel adds
/// in chunk order into C's lower triangle. A batched call cannot split k and a single call for such
/// a product is slow (32 x 32 from k = 131072: 725 us on an H100, 370 GFLOP/s), so one call per
/// product was the slowest part of these groups: on an H100, 8 products of 32 x 32 from 32768 took
/// 1509 us one by one, 873 us batched and 131 us split, and ResNet-50's steady step went from
/// 6.30-6.32 to 5.86-5.91 ms at block size 256 and from 8.90-8.93 to 8.62-8.71 ms at 1024
/// (docs/performance.md, "On a GPU", twenty-fifth round). Larger outputs stay as they were: split,
/// 8 products of 128 x 128 from 32768 took 893 us, one by one 351 us.
///
/// Large Gram products are tiled where the BLAS batches (set_tiles(); default tiles of at least
/// 128 rows, at most 8 per side): a batched GEMM computes the whole d x d output of X^T X
/// although only its lower triangle is read, twice a SYRK's work, and cuBLAS has no batched
/// SYRK. With the output cut into nt x nt tiles of d / nt rows, only the nt (nt + 1) / 2 tiles on
/// and below the diagonal are computed, as products of column panels of X (3 of 4 tiles at nt =
/// 2, 10 of 16 at nt = 4, 36 of 64 at nt = 8), batched by shape with every other product of the
/// run. On an H200 this made the steady steps 6% (gpt2-block, 256 x 256 blocks) to 11%
/// (gpt2-block at block size 1024) shorter, resnet50's 1.5-2.5%, mlp's unchanged; of the
/// settings tried (tiles of at least 64, 128 or 256 rows, at most 4 or 8 per side) 128 and 8 was
/// the best or within 1% of it in every cell (docs/performance.md, "On a GPU", fifteenth session
/// of 2026-11-30).
#ifndef LATHER_IMPL_BACKENDS_GEMM_BATCHES_HPP
#define LATHER_IMPL_BACKENDS_GEMM_BATCHES_HPP

#include <lather/error.hpp>
#include <lather/impl/backends/blas.hpp>
#include <lather/impl/backends/device_event.hpp>
#include <lather/impl/label.hpp>

#include <Kokkos_Core.hpp>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <tuple>
#include <type_traits>
#include <vector>

#if defined(KOKKOS_ENABLE_CUDA) && __has_include(<KokkosKernels_config.h>)
#include <KokkosKernels_config.h>
#endif
#if defined(KOKKOS_ENABLE_CUDA) && defined(KOKKOSKERNELS_ENABLE_TPL_CUBLAS)
#include <cublas_v2.h>
#define LATHER_HAS_CUBLAS_BATCHED 1
#endif

namespace lather::impl::blas {

/// \brief Queue of products run by shape group (see the file comment).
/// \tparam ExecSpace where the products run
/// \tparam T float or double for the batched BLAS; any scalar runs one by one
/// \tparam MemorySpace where the operands and the pointer arrays live
template <class ExecSpace, class T, class MemorySpace>
class GemmBatches {
 public:
  /// One product C = op(A) op(B) (alpha 1, beta 0), column-major, BLAS conventions: op(A) is
  /// m x k, op(B) k x n, C m x n. `gram` marks a Gram product (B == A, only the lower triangle of
  /// C is read afterwards), which a caller's one-by-one routine may run as a SYRK.
  struct Product {
    char ta = 'N', tb = 'N';
    std::int64_t m = 0, n = 0, k = 0;
    const T* a = nullptr;
    std::int64_t lda = 1;
    const T* b = nullptr;
    std::int64_t ldb = 1;
    T* c = nullptr;
    std::int64_t ldc = 1;
    bool gram = false;
    /// A chunk of a split product's reduction (set by run(), not by callers): A's and B's leading
    /// dimensions may exceed the rows op(A) and op(B) read.
    bool chunk = false;
    /// A tile of a tiled Gram product's lower triangle (set by run(), not by callers): a plain
    /// product (gram false) whose A, B and C leading dimensions exceed the rows op(A), op(B)
    /// and C hold.
    bool tile = false;
  };
  /// Products of one shape: `count` products whose A, B, C pointers are at `first`, `first +
  /// count` and `first + 2 count` of pointer_table().
  struct Group {
    char ta = 'N', tb = 'N';
    std::int64_t m = 0, n = 0, k = 0, lda = 0, ldb = 0, ldc = 0;
    std::int64_t count = 0, first = 0;
    bool chunk = false;  // chunks of split products: one batched call also for a single product
    bool tile = false;   // tiles of Gram products: likewise
  };
  /// A split product's partial outputs (`chunks` m x m matrices, one after the other) to be added
  /// into its C. Public only because nvcc's kernel stubs name the kernel's types outside the class.
  struct Reduction {
    T* c = nullptr;
    std::int64_t ldc = 0, m = 0;
    const T* partial = nullptr;
    std::int64_t chunks = 0;
  };
  /// C's lower triangle = the sum of the partial outputs in chunk order; one team per product.
  struct AddPartials {
    Kokkos::View<const Reduction*, MemorySpace> jobs;
    template <class Member>
    KOKKOS_FUNCTION void operator()(const Member& team) const {
      const Reduction& r = jobs(team.league_rank());
      const std::int64_t mm = r.m * r.m;
      Kokkos::parallel_for(Kokkos::TeamThreadRange(team, mm), [&](std::int64_t e) {
        const std::int64_t i = e % r.m, j = e / r.m;
        if (i < j) return;
        T sum = 0;
        for (std::int64_t q = 0; q < r.chunks; ++q) sum += r.partial[q * mm + e];
        r.c[i + j * r.ldc] = sum;
      });
    }
  };
  using pointer_view = Kokkos::View<std::uintptr_t*, MemorySpace>;

  /// Whether run() makes one batched call per group here (else one call per product).
  static constexpr bool batched_blas =
#if defined(LATHER_HAS_CUBLAS_BATCHED)
      std::is_same_v<ExecSpace, Kokkos::Cuda> && (std::is_same_v<T, float> || std::is_same_v<T, double>);
#else
      false;
#endif

  /// How much deeper (k) than wide (max(m, n)) a batched product may be by default (file comment).
  static constexpr std::int64_t default_depth_ratio = 16;
  /// Default split (file comment): outputs of at most 32 rows where the BLAS batches, else none
  /// (a host BLAS call splits a deep product over its threads itself); chunks of 2048.
  static constexpr std::int64_t default_split_max_output = batched_blas ? 32 : 0;
  static constexpr std::int64_t default_split_chunk = 2048;
  /// Default tiling of Gram products (set_tiles): tiles of at least this many rows where the BLAS
  /// batches, none elsewhere (a host SYRK computes one triangle already).
  static constexpr std::int64_t default_tile_min = batched_blas ? 128 : 0;
  static constexpr std::int64_t default_tile_max = 8;

  GemmBatches() = default;
  // A copy gets pointer arrays (and a cuBLAS handle) of its own: a shared array would hold the
  // other copy's pointers where this one's record says its own are.
  GemmBatches(const GemmBatches& other)
      : m_depth_ratio(other.m_depth_ratio), m_split_max_output(other.m_split_max_output),
        m_split_chunk(other.m_split_chunk), m_tile_min(other.m_tile_min), m_tile_max(other.m_tile_max) {
    reserve(static_cast<std::int64_t>(other.m_pointers.extent(0)) / 3);
  }
  GemmBatches& operator=(const GemmBatches& other) {
    if (this != &other) *this = GemmBatches(other);
    return *this;
  }
  GemmBatches(GemmBatches&&) noexcept = default;
  GemmBatches& operator=(GemmBatches&&) noexcept = default;
  ~GemmBatches() = default;

  /// Room for `products` queued products per step (pointer arrays); more grow them (with a fence).
  void reserve(std::int64_t products) {
    m_queue.reserve(static_cast<std::size_t>(products));
    m_split_queue.reserve(static_cast<std::size_t>(products));
    m_group_of.reserve(static_cast<std::size_t>(products));
    m_staged.reserve(static_cast<std::size_t>(3 * products));
    if (static_cast<std::int64_t>(m_pointers.extent(0)) < 3 * products) {
      if (m_pointers.extent(0) > 0) Kokkos::fence();  // batched calls of a step may still read the old arrays
      m_pointers = pointer_view(Kokkos::view_alloc(Kokkos::WithoutInitializing, LATHER_LABEL("lather::GemmBatches::pointers")),
                                static_cast<std::size_t>(3 * products));
      m_uploaded.assign(static_cast<std::size_t>(3 * products), 0);  // nothing valid on the device yet
    }
    // Two steps of every pointer array in flight before a copy waits (CUDA, HIP).
    if constexpr (staged) m_staging.reserve(2 * 3 * static_cast<std::size_t>(products) * sizeof(std::uintptr_t), 8);
  }
  /// The next run() writes its pointer arrays from the start again: a step that queues what the
  /// previous one did finds them in place. Drops what a failed step left queued.
  void begin_step() noexcept {
    m_cursor = 0;
    m_partial_cursor = 0;
    m_reduction_cursor = 0;
    m_queue.clear();
  }

  /// Groups whose products have k > `ratio` max(m, n) run one by one where the BLAS batches.
  void set_depth_ratio(std::int64_t ratio) noexcept { m_depth_ratio = ratio; }
  [[nodiscard]] std::int64_t depth_ratio() const noexcept { return m_depth_ratio; }
  /// Gram products (B == A, 'T','N' or 'N','T') with m <= `max_output` and k > max(depth_ratio m,
  /// `chunk`) run as chunks of that many rows of the reduction plus one adding kernel (file
  /// comment). `max_output` 0 turns it off. Where it is on, the one-by-one routine given to run()
  /// must read op(A) and op(B) with their leading dimensions (a chunk's lda exceeds its rows), as
  /// it runs the chunks where there is no batched BLAS.
  void set_split(std::int64_t max_output, std::int64_t chunk) {
    LATHER_THROW_IF(max_output < 0 || chunk < 1, "lather::GemmBatches::set_split: max_output = ", max_output,
                    " must be >= 0 (0: off) and chunk = ", chunk, " >= 1");
    m_split_max_output = max_output;
    m_split_chunk = chunk;
  }
  [[nodiscard]] std::int64_t split_max_output() const noexcept { return m_split_max_output; }
  [[nodiscard]] std::int64_t split_chunk() const noexcept { return m_split_chunk; }
  /// Whether the Gram product `p` is split (set_split), and the rows of its reduction per chunk.
  [[nodiscard]] bool splits(const Product& p) const noexcept {
    const std::int64_t kc = chunk_rows(p);
    return m_split_max_output > 0 && p.gram && p.m == p.n && p.m <= m_split_max_output && p.k > kc &&
           ((p.ta == 'T' && p.tb == 'N') || (p.ta == 'N' && p.tb == 'T')) && fits_int(p.m) && fits_int(kc) &&
           fits_int(p.lda) && fits_int(p.ldb);
  }
  [[nodiscard]] std::int64_t chunk_rows(const Product& p) const noexcept {
    // In double: ratio m of int64 sizes can overflow.
    const double deep = static_cast<double>(m_depth_ratio) * static_cast<double>(p.m);
    return deep >= static_cast<double>(p.k) ? p.k : std::max(static_cast<std::int64_t>(deep), m_split_chunk);
  }
  /// Gram products (B == A, 'T','N' or 'N','T', not split) of d >= 2 `min_tile` rows that are
  /// shallow enough to batch (k <= depth_ratio() d) computed as the tiles on and below the
  /// diagonal of an nt x nt tiling (file comment): nt the largest of 2..`max_tiles` that divides
  /// d into tiles of at least `min_tile` rows. A tile sums as many terms as its product: one
  /// product's tiles are at least 3 products in a batched call, where the product alone would be
  /// one. `min_tile` 0 turns it off. Where it is
  /// on, the one-by-one routine given to run() must read A, B and C with their leading dimensions
  /// (a tile's exceed its rows), as it runs the tiles where there is no batched BLAS.
  void set_tiles(std::int64_t min_tile, std::int64_t max_tiles) {
    LATHER_THROW_IF(min_tile < 0 || max_tiles < 2, "lather::GemmBatches::set_tiles: min_tile = ", min_tile,
                    " must be >= 0 (0: off) and max_tiles = ", max_tiles, " >= 2");
    m_tile_min = min_tile;
    m_tile_max = max_tiles;
  }
  [[nodiscard]] std::int64_t tile_min() const noexcept { return m_tile_min; }
  [[nodiscard]] std::int64_t tile_max() const noexcept { return m_tile_max; }
  /// The tiles per side set_tiles() cuts the Gram product `p` into; 0 where it is not tiled.
  [[nodiscard]] std::int64_t tiles(const Product& p) const noexcept {
    if (m_tile_min == 0 || !p.gram || p.chunk || p.tile || p.m != p.n || splits(p) ||
        !((p.ta == 'T' && p.tb == 'N') || (p.ta == 'N' && p.tb == 'T')) || !fits_int(p.k) || !fits_int(p.lda) ||
        !fits_int(p.ldb) || !fits_int(p.ldc))
      return 0;
    // In double: ratio m of int64 sizes can overflow.
    if (static_cast<double>(p.k) > static_cast<double>(m_depth_ratio) * static_cast<double>(p.m)) return 0;
    for (std::int64_t nt = std::min(m_tile_max, p.m / std::max<std::int64_t>(m_tile_min, 1)); nt >= 2; --nt)
      if (p.m % nt == 0 && fits_int(p.m / nt)) return nt;
    return 0;
  }
  /// Gram products the last run tiled.
  [[nodiscard]] std::int64_t tiled_products() const noexcept { return m_tiled_count; }
  /// Bytes held for runs (grown to the largest run, kept): the split products' partial outputs,
  /// their reduction jobs, the pointer arrays and their pinned staging (CUDA, HIP).
  [[nodiscard]] std::size_t workspace_bytes() const noexcept {
    return m_partials.span() * sizeof(T) + m_reduction_jobs.span() * sizeof(Reduction) +
           m_pointers.span() * sizeof(std::uintptr_t) + m_staging.capacity();
  }
  /// Whether group `grp` is one batched call where the BLAS batches (batched_blas): more than one
  /// product, shallow enough, and sizes the BLAS' int takes; chunks of split products always.
  [[nodiscard]] bool fits_batch(const Group& grp) const noexcept {
    if (grp.chunk || grp.tile) return true;  // splits() and tiles() checked their sizes
    // In double: ratio max(m, n) of int64 sizes can overflow.
    return grp.count > 1 &&
           static_cast<double>(grp.k) <=
               static_cast<double>(m_depth_ratio) * static_cast<double>(std::max(grp.m, grp.n)) &&
           fits_int(grp.m) && fits_int(grp.n) && fits_int(grp.k) && fits_int(grp.lda) && fits_int(grp.ldb) &&
           fits_int(grp.ldc) && fits_int(grp.count);
  }

  void add(const Product& p) { m_queue.push_back(p); }
  [[nodiscard]] bool empty() const noexcept { return m_queue.empty(); }
  [[nodiscard]] std::size_t size() const noexcept { return m_queue.size(); }

  /// Runs the queued products and empties the queue; returns the BLAS calls made. `one(product)`
  /// runs one product (groups the batched BLAS cannot take, and everything where there is none).
  template <class OneByOne>
  std::int64_t run(const ExecSpace& space, OneByOne&& one) {
    m_reduction_count = 0;  // also for a run with nothing queued (split_products(), tiled_products())
    m_tiled_count = 0;
    if (m_queue.empty()) return 0;
    std::int64_t calls = 0;
    split_deep(space);
    prepare(space);  // also where nothing batches: the same grouping and arrays everywhere (tested on the host)
    if constexpr (batched_blas) {
      for (const Group& grp : m_groups) {
        if (fits_batch(grp)) {
          launch_batched(space, grp);
          ++calls;
          continue;
        }
        for (const Product& p : m_queue)
          if (same_shape(grp, p)) {
            one(p);
            ++calls;
          }
      }
    } else {
      for (const Product& p : m_queue) {  // one by one, in queue order
        one(p);
        ++calls;
      }
    }
    m_queue.clear();
    if (m_reduction_count > 0) {
      add_partials(space);
      ++calls;
    }
    return calls;
  }

  /// The last run's groups and pointer arrays (for tests).
  [[nodiscard]] const std::vector<Group>& groups() const noexcept { return m_groups; }
  [[nodiscard]] const pointer_view& pointer_table() const noexcept { return m_pointers; }
  /// Host-to-memory-space copies of pointer arrays made so far (0 in steady steps).
  [[nodiscard]] std::int64_t uploads() const noexcept { return m_uploads; }
  /// Products the last run split, and host-to-memory-space copies of their adding jobs so far.
  [[nodiscard]] std::int64_t split_products() const noexcept { return m_reduction_count; }
  [[nodiscard]] std::int64_t reduction_uploads() const noexcept { return m_reduction_uploads; }

 private:
  // Groups the queue by shape and uploads the pointer arrays that changed (ordered on `space`).
  void prepare(const ExecSpace& space) {
    m_groups.clear();
    m_group_of.clear();
    for (const Product& p : m_queue) {
      std::size_t g = 0;
      while (g < m_groups.size() && !same_shape(m_groups[g], p)) ++g;
      if (g == m_groups.size()) m_groups.push_back({p.ta, p.tb, p.m, p.n, p.k, p.lda, p.ldb, p.ldc, 0, 0, p.chunk, p.tile});
      ++m_groups[g].count;
      m_group_of.push_back(g);
    }
    // Each group's A, B and C pointer arrays, one after the other, groups in order; within a
    // group the products in queue order.
    const auto total = static_cast<std::int64_t>(m_queue.size());
    if (m_cursor + 3 * total > static_cast<std::int64_t>(m_pointers.extent(0))) grow(space, m_cursor + 3 * total);
    std::int64_t at = m_cursor;
    for (Group& grp : m_groups) {
      grp.first = at;
      at += 3 * grp.count;
    }
    m_fill.assign(m_groups.size(), 0);
    m_staged.assign(static_cast<std::size_t>(3 * total), 0);
    for (std::size_t i = 0; i < m_queue.size(); ++i) {
      const std::size_t g = m_group_of[i];
      const Group& grp = m_groups[g];
      const auto j = static_cast<std::size_t>(m_fill[g]++);
      const auto base = static_cast<std::size_t>(grp.first - m_cursor), cnt = static_cast<std::size_t>(grp.count);
      m_staged[base + j] = reinterpret_cast<std::uintptr_t>(m_queue[i].a);
      m_staged[base + cnt + j] = reinterpret_cast<std::uintptr_t>(m_queue[i].b);
      m_staged[base + 2 * cnt + j] = reinterpret_cast<std::uintptr_t>(m_queue[i].c);
    }
    // Upload the span that differs from what the device holds at these positions.
    std::int64_t lo = -1, hi = -1;
    for (std::int64_t e = 0; e < 3 * total; ++e) {
      const auto pos = static_cast<std::size_t>(m_cursor + e);
      if (m_uploaded[pos] == m_staged[static_cast<std::size_t>(e)]) continue;
      m_uploaded[pos] = m_staged[static_cast<std::size_t>(e)];
      if (lo < 0) lo = m_cursor + e;
      hi = m_cursor + e + 1;
    }
    if (lo >= 0) {
      upload(space, m_pointers, m_uploaded, lo, hi);
      ++m_uploads;
    }
    m_cursor += 3 * total;
  }

  // Copies held[lo, hi) to the same positions of `table` in the memory space, ordered on `space`.
  // As impl::kernels::UploadedTable: on CUDA and HIP through pinned memory (StagingRing, queued);
  // elsewhere wait, so that later changes to `held` cannot race the copy.
  template <class E>
  void upload(const ExecSpace& space, const Kokkos::View<E*, MemorySpace>& table, const std::vector<E>& held,
              std::int64_t lo, std::int64_t hi) {
    using host_view = Kokkos::View<const E*, Kokkos::HostSpace, Kokkos::MemoryTraits<Kokkos::Unmanaged>>;
    const host_view src(held.data() + lo, static_cast<std::size_t>(hi - lo));
    const auto dst = Kokkos::subview(table, Kokkos::make_pair(lo, hi));
    if constexpr (std::is_same_v<MemorySpace, Kokkos::HostSpace>) {
      Kokkos::deep_copy(dst, src);
    } else if constexpr (staged) {
      m_staging.copy(space, dst.data(), src.data(), static_cast<std::size_t>(hi - lo) * sizeof(E));
    } else {
      Kokkos::deep_copy(space, dst, src);
      space.fence();
    }
  }

  static bool same_shape(const Group& g, const Product& p) noexcept {
    return g.ta == p.ta && g.tb == p.tb && g.m == p.m && g.n == p.n && g.k == p.k && g.lda == p.lda &&
           g.ldb == p.ldb && g.ldc == p.ldc && g.chunk == p.chunk && g.tile == p.tile;
  }

  // Replaces the queue's split products by their chunks, writing partial outputs at this step's
  // next positions of m_partials (so that steady steps keep the same pointers), and records their
  // Reductions; and tiled Gram products by their tiles. Earlier runs' chunks and adds of the step
  // are ordered before on `space`.
  void split_deep(const ExecSpace& space) {
    m_reduction_count = 0;
    m_tiled_count = 0;
    if (m_split_max_output == 0 && m_tile_min == 0) return;
    std::int64_t need = 0, pieces = 0;
    for (const Product& p : m_queue) {
      if (splits(p)) {
        const std::int64_t chunks = (p.k + chunk_rows(p) - 1) / chunk_rows(p);
        need += chunks * p.m * p.m;
        pieces += chunks;
      } else if (const std::int64_t nt = tiles(p); nt > 0) {
        pieces += nt * (nt + 1) / 2;
      }
    }
    if (pieces == 0) return;
    if (m_partial_cursor + need > static_cast<std::int64_t>(m_partials.extent(0))) {
      space.fence();  // earlier chunks and adds may still use the old partials
      m_partials = Kokkos::View<T*, MemorySpace>(
          Kokkos::view_alloc(Kokkos::WithoutInitializing, LATHER_LABEL("lather::GemmBatches::partials")),
          static_cast<std::size_t>(std::max(m_partial_cursor + need, 2 * static_cast<std::int64_t>(m_partials.extent(0)))));
    }
    // Both queues the same room, so that swapping them allocates in no later step.
    const std::size_t room = std::max(m_queue.size() + static_cast<std::size_t>(pieces), m_queue.capacity());
    m_queue.reserve(room);
    m_split_queue.reserve(room);
    m_split_queue.clear();
    m_reductions.clear();
    for (const Product& p : m_queue) {
      if (const std::int64_t nt = tiles(p); nt > 0) {
        // Tile (r, c), r >= c, of C: rows r t.. of op(A) = X^T ('T','N': X's columns r t..; 'N','T':
        // X's rows r t..) times columns c t.. of op(B).
        const std::int64_t t = p.m / nt;
        for (std::int64_t c = 0; c < nt; ++c)
          for (std::int64_t r = c; r < nt; ++r) {
            Product q = p;
            q.m = q.n = t;
            q.a = p.a + (p.ta == 'T' ? r * t * p.lda : r * t);
            q.b = p.b + (p.ta == 'T' ? c * t * p.ldb : c * t);
            q.c = p.c + r * t + c * t * p.ldc;
            q.gram = false;
            q.tile = true;
            m_split_queue.push_back(q);
          }
        ++m_tiled_count;
        continue;
      }
      if (!splits(p)) {
        m_split_queue.push_back(p);
        continue;
      }
      const std::int64_t kc = chunk_rows(p), chunks = (p.k + kc - 1) / kc;
      T* const partial = m_partials.data() + m_partial_cursor;
      m_reductions.push_back({p.c, p.ldc, p.m, partial, chunks});
      for (std::int64_t i = 0; i < chunks; ++i) {
        Product q = p;
        q.k = std::min(kc, p.k - i * kc);
        // Rows i kc.. of X (k x m, 'T','N') or its columns i kc.. (m x k, 'N','T').
        q.a = p.a + (p.ta == 'T' ? i * kc : i * kc * p.lda);
        q.b = p.b + (p.ta == 'T' ? i * kc : i * kc * p.ldb);
        q.c = partial + i * p.m * p.m;
        q.ldc = p.m;
        q.chunk = true;
        m_split_queue.push_back(q);
      }
      m_partial_cursor += chunks * p.m * p.m;
    }
    m_reduction_count = static_cast<std::int64_t>(m_reductions.size());
    std::swap(m_queue, m_split_queue);
  }

  // One kernel adds every split product's partial outputs; its job table is uploaded only where
  // it differs from what the memory space holds at this step's positions (as the pointer arrays).
  void add_partials(const ExecSpace& space) {
    const std::int64_t n = m_reduction_count, at = m_reduction_cursor;
    if (at + n > static_cast<std::int64_t>(m_reduction_jobs.extent(0))) {
      space.fence();  // earlier adds may still read the old table
      m_reduction_jobs = Kokkos::View<Reduction*, MemorySpace>(
          Kokkos::view_alloc(Kokkos::WithoutInitializing, LATHER_LABEL("lather::GemmBatches::reductions")),
          static_cast<std::size_t>(std::max(at + n, 2 * static_cast<std::int64_t>(m_reduction_jobs.extent(0)))));
      m_reductions_uploaded.assign(m_reduction_jobs.extent(0), Reduction{});
    }
    std::int64_t lo = -1, hi = -1;
    for (std::int64_t e = 0; e < n; ++e) {
      const Reduction &r = m_reductions[static_cast<std::size_t>(e)];
      Reduction& held = m_reductions_uploaded[static_cast<std::size_t>(at + e)];
      if (r.c == held.c && r.ldc == held.ldc && r.m == held.m && r.partial == held.partial && r.chunks == held.chunks)
        continue;
      held = r;
      if (lo < 0) lo = at + e;
      hi = at + e + 1;
    }
    if (lo >= 0) {
      upload(space, m_reduction_jobs, m_reductions_uploaded, lo, hi);
      ++m_reduction_uploads;
    }
    Kokkos::parallel_for(LATHER_LABEL("lather::GemmBatches::add_partials"),
                         Kokkos::TeamPolicy<ExecSpace>(space, static_cast<int>(n), Kokkos::AUTO),
                         AddPartials{Kokkos::subview(m_reduction_jobs, Kokkos::make_pair(at, at + n))});
    m_reduction_cursor += n;
  }

  // More room: kernels queued on `space` may still read the old arrays, so wait for them first.
  void grow(const ExecSpace& space, std::int64_t entries) {
    space.fence();
    pointer_view bigger(Kokkos::view_alloc(Kokkos::WithoutInitializing, LATHER_LABEL("lather::GemmBatches::pointers")),
                        static_cast<std::size_t>(std::max(entries, 2 * static_cast<std::int64_t>(m_pointers.extent(0)))));
    m_pointers = bigger;
    m_uploaded.assign(m_pointers.extent(0), 0);
  }

#if defined(LATHER_HAS_CUBLAS_BATCHED)
  struct HandleDeleter {
    void operator()(cublasHandle_t* h) const noexcept {
      if (h != nullptr) cublasDestroy(*h);
      delete h;
    }
  };
  void launch_batched(const ExecSpace& space, const Group& grp) {
    if (!m_handle) {
      auto* h = new cublasHandle_t(nullptr);
      const cublasStatus_t created = cublasCreate(h);
      if (created != CUBLAS_STATUS_SUCCESS) {
        delete h;
        LATHER_THROW_RUNTIME_IF(true, "lather::GemmBatches: cublasCreate failed (status ", static_cast<int>(created),
                                "); is a CUDA device available to this process?");
      }
      m_handle.reset(h, HandleDeleter{});
    }
    const cublasHandle_t h = *m_handle;
    LATHER_THROW_RUNTIME_IF(cublasSetStream(h, space.cuda_stream()) != CUBLAS_STATUS_SUCCESS,
                            "lather::GemmBatches: cublasSetStream failed");
    const auto op = [](char t) { return t == 'N' ? CUBLAS_OP_N : CUBLAS_OP_T; };
    const std::uintptr_t* base = m_pointers.data() + grp.first;
    const T* const* a = reinterpret_cast<const T* const*>(base);
    const T* const* b = reinterpret_cast<const T* const*>(base + grp.count);
    T* const* c = reinterpret_cast<T* const*>(base + 2 * grp.count);
    const T one = 1, zero = 0;
    cublasStatus_t s;
    if constexpr (std::is_same_v<T, float>)
      s = cublasSgemmBatched(h, op(grp.ta), op(grp.tb), static_cast<int>(grp.m), static_cast<int>(grp.n),
                             static_cast<int>(grp.k), &one, a, static_cast<int>(grp.lda), b, static_cast<int>(grp.ldb),
                             &zero, c, static_cast<int>(grp.ldc), static_cast<int>(grp.count));
    else
      s = cublasDgemmBatched(h, op(grp.ta), op(grp.tb), static_cast<int>(grp.m), static_cast<int>(grp.n),
                             static_cast<int>(grp.k), &one, a, static_cast<int>(grp.lda), b, static_cast<int>(grp.ldb),
                             &zero, c, static_cast<int>(grp.ldc), static_cast<int>(grp.count));
    LATHER_THROW_RUNTIME_IF(s != CUBLAS_STATUS_SUCCESS, "lather::GemmBatches: cublas", std::is_same_v<T, float> ? "S" : "D",
                            "gemmBatched failed (status ", static_cast<int>(s), ") for ", grp.count, " products of ",
                            grp.m, " x ", grp.n, " x ", grp.k);
  }
  // Created at the first batched launch; a copy creates its own (copy constructor), a move takes it.
  std::shared_ptr<cublasHandle_t> m_handle;
#else
  void launch_batched(const ExecSpace&, const Group&) {}
#endif

  std::vector<Product> m_queue;
  std::vector<Group> m_groups;
  std::vector<std::size_t> m_group_of;
  std::vector<std::int64_t> m_fill;
  std::vector<std::uintptr_t> m_staged, m_uploaded;  // this run's arrays; what the memory space holds
  pointer_view m_pointers;
  std::int64_t m_cursor = 0, m_uploads = 0;
  std::int64_t m_depth_ratio = default_depth_ratio;
  std::int64_t m_split_max_output = default_split_max_output, m_split_chunk = default_split_chunk;
  std::int64_t m_tile_min = default_tile_min, m_tile_max = default_tile_max, m_tiled_count = 0;
  std::vector<Product> m_split_queue;
  std::vector<Reduction> m_reductions, m_reductions_uploaded;  // this run's; what the memory space holds
  Kokkos::View<T*, MemorySpace> m_partials;
  Kokkos::View<Reduction*, MemorySpace> m_reduction_jobs;
  std::int64_t m_partial_cursor = 0, m_reduction_cursor = 0, m_reduction_count = 0, m_reduction_uploads = 0;
  // Device memory filled through pinned staging (CUDA, HIP); a copy of this object gets its own.
  static constexpr bool staged =
      DeviceEvent<ExecSpace>::is_event && !std::is_same_v<MemorySpace, Kokkos::HostSpace>;
  StagingRing<ExecSpace> m_staging;
};

}  // namespace lather::impl::blas

#endif
