// SPDX-License-Identifier: Apache-2.0
/// \file
/// \brief Private. Element-wise passes over all parameters at once on host spaces: the elements
/// of every parameter cut into fixed-size chunks, one parallel loop over all chunks.
///
/// Why: a loop per parameter is a fork and join per parameter. With OpenMP's passive waiting
/// (which lather's tests and benchmarks use next to OpenBLAS) each join puts the workers to sleep
/// and each fork wakes them, and small parameters leave threads idle: resnet50's 161 parameters
/// made two parallel regions each per AdamW step (the NaN/Inf check and the update), and perf put
/// a tenth of a 2-thread step in futex waits and wake-ups. Chunks also keep each thread on a
/// contiguous range (streaming). The chunk size is a trade-off: large enough that each chunk
/// streams (4096 floats = 16 KiB per array), small enough to balance small models.
#ifndef LATHER_IMPL_KERNELS_HOST_CHUNKS_HPP
#define LATHER_IMPL_KERNELS_HOST_CHUNKS_HPP

#include <lather/impl/kernels/host_simd.hpp>
#include <lather/impl/math.hpp>

#include <Kokkos_Core.hpp>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>
#include <type_traits>
#include <vector>

// Host-only builds (as kernels/adam_simd.hpp): GPU builds keep one kernel per parameter on every
// space, so device code never meets these host functors. SSE2 where x86-64 has it.
#if !defined(KOKKOS_ENABLE_CUDA) && !defined(KOKKOS_ENABLE_HIP) && !defined(KOKKOS_ENABLE_SYCL)
#define LATHER_HAS_HOST_CHUNKS 1
#if defined(__SSE2__)
#define LATHER_HAS_HOST_CHUNKS_SIMD 1
#include <emmintrin.h>
#endif
#endif

namespace lather::impl::kernels {

/// Elements per chunk of the host chunk loops.
inline constexpr std::int64_t host_chunk_elements = 4096;

/// \brief Chunks of several items (parameters): item k has `size` elements, cut into chunks of
/// host_chunk_elements. Built again each step with add(); its storage is kept, so after the first
/// step (same number of items) it allocates nothing.
class HostChunkTable {
 public:
  void clear() {
    m_items.clear();
    m_end.clear();
  }
  /// Adds item `item` (an index the caller chooses) with `size` elements; empty items add no chunk.
  void add(std::size_t item, std::int64_t size) {
    if (size <= 0) return;
    const std::int64_t before = m_end.empty() ? 0 : m_end.back();
    m_items.push_back({item, size});
    m_end.push_back(before + (size + host_chunk_elements - 1) / host_chunk_elements);
  }
  /// Room for `n` entries, so that later steps with up to n entries allocate nothing.
  void reserve(std::size_t n) {
    m_items.reserve(n);
    m_end.reserve(n);
  }
  [[nodiscard]] std::int64_t chunks() const { return m_end.empty() ? 0 : m_end.back(); }
  [[nodiscard]] std::size_t entries() const { return m_items.size(); }
  /// The caller's index of entry e (in the order of add()).
  [[nodiscard]] std::size_t item(std::size_t e) const { return m_items[e].item; }

  /// Chunk c: its entry and its element range [begin, end) within that item.
  struct Range {
    std::size_t entry;
    std::int64_t begin, end;
  };
  [[nodiscard]] Range locate(std::int64_t c) const {
    const auto e = static_cast<std::size_t>(std::upper_bound(m_end.begin(), m_end.end(), c) - m_end.begin());
    const std::int64_t first = e == 0 ? 0 : m_end[e - 1];
    const std::int64_t begin = (c - first) * host_chunk_elements;
    return {e, begin, std::min(begin + host_chunk_elements, m_items[e].size)};
  }

 private:
  struct Item {
    std::size_t item;
    std::int64_t size;
  };
  std::vector<Item> m_items;
  std::vector<std::int64_t> m_end;  // m_end[e]: one past entry e's last chunk
};

/// \brief Runs `f(entry, begin, end)` for every chunk of `table` in one parallel loop on the host
/// space `space` (static schedule: each thread gets a contiguous run of chunks). `label` is a
/// LATHER_LABEL or another string kept alive: a label built per launch allocates. Returns when
/// the loop is done (the host backends lather supports, Serial and OpenMP, run parallel_for
/// synchronously), so `f` and what it refers to may go away afterwards.
template <class ExecSpace, class F>
void for_host_chunks(const std::string& label, const ExecSpace& space, const HostChunkTable& table, const F& f) {
  struct Body {
    const HostChunkTable* table;
    const F* f;
    void operator()(std::int64_t c) const {
      const auto r = table->locate(c);
      (*f)(r.entry, r.begin, r.end);
    }
  };
  Kokkos::parallel_for(label, Kokkos::RangePolicy<ExecSpace, Kokkos::IndexType<std::int64_t>>(space, 0, table.chunks()),
                       Body{&table, &f});
}

/// True when parameters in MemorySpace stepped on ExecSpace can join a host chunk loop.
template <class ExecSpace, class MemorySpace>
inline constexpr bool host_chunks_apply =
    Kokkos::SpaceAccessibility<Kokkos::HostSpace, MemorySpace>::accessible &&
    Kokkos::SpaceAccessibility<ExecSpace, Kokkos::HostSpace>::accessible;

#ifdef LATHER_HAS_AVX512_DISPATCH
/// host_count_nonfinite's vector loop with AVX-512: adds the NaN/Inf values among x[0, returned)
/// to `count`, 64 bytes a vector, four vectors a step (four independent sums). Why: the SSE2
/// loop ran at about 2 cycles per 4 floats (33 GB/s in cache and from memory alike, Zen 5), so
/// the screen before every step cost a steady mlp step at block size 256 on 2 threads 1.7% of
/// its samples (perf).
template <class T>
LATHER_AVX512_FN std::int64_t host_count_nonfinite_avx512(const T* x, std::int64_t n, std::int64_t& count) {
  constexpr std::int64_t lanes = 64 / static_cast<std::int64_t>(sizeof(T)), step = 4 * lanes;
  const __m512i exponent = std::is_same_v<T, float> ? _mm512_set1_epi32(0x7f800000)
                                                    : _mm512_set1_epi64(static_cast<long long>(0x7ff0000000000000ull));
  // 32-bit lanes count at most 2^31 - 1 each: blocks of fewer steps than that.
  constexpr std::int64_t max_block = (std::int64_t{1} << 30) * step;
  std::int64_t q = 0;
  while (q + step <= n) {
    __m512i acc[4] = {_mm512_setzero_si512(), _mm512_setzero_si512(), _mm512_setzero_si512(), _mm512_setzero_si512()};
    const std::int64_t stop = std::min(n, q + max_block);
    for (; q + step <= stop; q += step)
      for (int v = 0; v < 4; ++v) {
        const __m512i bits = _mm512_loadu_si512(static_cast<const void*>(x + q + v * lanes));
        const __m512i e = _mm512_and_si512(bits, exponent);
        if constexpr (std::is_same_v<T, float>)
          acc[v] = _mm512_mask_add_epi32(acc[v], _mm512_cmpeq_epi32_mask(e, exponent), acc[v], _mm512_set1_epi32(1));
        else
          acc[v] = _mm512_mask_add_epi64(acc[v], _mm512_cmpeq_epi64_mask(e, exponent), acc[v], _mm512_set1_epi64(1));
      }
    for (int v = 0; v < 4; ++v) {
      if constexpr (std::is_same_v<T, float>) {
        alignas(64) std::uint32_t sums[16];
        _mm512_store_si512(static_cast<void*>(sums), acc[v]);
        for (const auto c : sums) count += c;
      } else {
        alignas(64) std::uint64_t sums[8];
        _mm512_store_si512(static_cast<void*>(sums), acc[v]);
        for (const auto c : sums) count += static_cast<std::int64_t>(c);
      }
    }
  }
  return q;
}
#endif

/// Number of NaN and Inf values among x[0, n) (contiguous). An IEEE value is NaN or Inf exactly
/// when its exponent bits are all ones; the test on the bits vectorizes (math::isfinite, a libm
/// classification per element, did not) and no compiler flag (-ffinite-math-only) can fold it away.
/// AVX-512 where the CPU has it, then SSE2, then one by one (an integer count: the same result).
template <class T>
inline std::int64_t host_count_nonfinite(const T* x, std::int64_t n) {
  std::int64_t count = 0, q = 0;
  if constexpr (std::is_same_v<T, float> || std::is_same_v<T, double>) {
    using U = std::conditional_t<std::is_same_v<T, float>, std::uint32_t, std::uint64_t>;
    constexpr U exponent = std::is_same_v<T, float> ? U(0x7f800000u) : U(0x7ff0000000000000ull);
#ifdef LATHER_HAS_AVX512_DISPATCH
    if (simd_detail::use_avx512()) q = host_count_nonfinite_avx512(x, n, count);
#endif
#ifdef LATHER_HAS_HOST_CHUNKS_SIMD
    // 32-bit lanes: a float's bits, or a double's high word (lanes 1 and 3; the low words'
    // lanes are masked with 0 and always compare equal, so only the high lanes are summed).
    constexpr int per_vector = 16 / static_cast<int>(sizeof(T));
    const __m128i mask = std::is_same_v<T, float> ? _mm_set1_epi32(0x7f800000) : _mm_set_epi32(0x7ff00000, 0, 0x7ff00000, 0);
    // Blocks of at most 2^31 - 1 vectors keep the 32-bit lane sums from wrapping.
    while (q + per_vector <= n) {
      __m128i acc = _mm_setzero_si128();
      const std::int64_t stop = std::min(n, q + std::int64_t{per_vector} * 0x7fffffff);
      for (; q + per_vector <= stop; q += per_vector) {
        __m128i bits = _mm_loadu_si128(reinterpret_cast<const __m128i*>(x + q));
        acc = _mm_sub_epi32(acc, _mm_cmpeq_epi32(_mm_and_si128(bits, mask), mask));
      }
      alignas(16) std::uint32_t lanes[4];
      _mm_store_si128(reinterpret_cast<__m128i*>(lanes), acc);
      if constexpr (std::is_same_v<T, float>) count += std::int64_t{lanes[0]} + lanes[1] + lanes[2] + lanes[3];
      else count += std::int64_t{lanes[1]} + lanes[3];
    }
#endif
    for (; q < n; ++q) {
      U bits;
      std::memcpy(&bits, x + q, sizeof bits);
      count += (bits & exponent) == exponent;
    }
  } else {
    for (; q < n; ++q) count += !math::isfinite(x[q]);
  }
  return count;
}

}  // namespace lather::impl::kernels

#endif
