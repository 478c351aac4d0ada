// SPDX-License-Identifier: Apache-2.0
/// \file
/// \brief Private. One allocation for many state matrices (impl::StateArena), on Linux hosts
/// backed by transparent huge pages.
///
/// Shampoo's factors and inverse roots are d x d matrices, one pair per block and dimension:
/// hundreds of separate allocations of 65-260 KiB at block size 256, none large enough for a
/// 2 MiB page. A steady step reads them in patterns that cross 4 KiB pages often (the SYMMs'
/// packing reads one triangle across its rows), and with the model's other state the step's
/// pages are far more than the TLB holds. Carved out of one allocation advised
/// MADV_HUGEPAGE before it is first written, they sit on 2 MiB pages: a steady step 1.5-2%
/// shorter at block size 256 (docs/performance.md, "Huge pages"), where the machine does not
/// stall on them. Whether to advise is the caller's (lather::huge_pages_enabled, off by default:
/// lather/memory.hpp says why).
#ifndef LATHER_IMPL_STATE_ARENA_HPP
#define LATHER_IMPL_STATE_ARENA_HPP

#include <Kokkos_Core.hpp>

#include <cstddef>
#include <cstdint>
#include <fstream>
#include <string>
#include <type_traits>
#include <utility>

#if defined(__linux__)
#include <sys/mman.h>
#endif

namespace lather::impl {

/// Whether the system offers transparent huge pages to madvise: not when
/// /sys/kernel/mm/transparent_hugepage/enabled says "[never]". Read once per process.
inline bool system_offers_huge_pages() {
#if defined(__linux__) && defined(MADV_HUGEPAGE)
  static const bool offered = [] {
    std::ifstream f("/sys/kernel/mm/transparent_hugepage/enabled");
    std::string line;
    return !(f && std::getline(f, line) && line.find("[never]") != std::string::npos);
  }();
  return offered;
#else
  return false;
#endif
}

/// Advises the 2 MiB pages that lie wholly inside [data, data + bytes) as huge-page backed
/// (MADV_HUGEPAGE; pages not yet touched are then faulted in as 2 MiB pages). Returns the bytes
/// advised (0: none, not Linux, the system has them off, or the kernel refused: nothing changes
/// then).
inline std::size_t advise_huge_pages(void* data, std::size_t bytes) {
#if defined(__linux__) && defined(MADV_HUGEPAGE)
  constexpr std::uintptr_t page = std::uintptr_t(2) << 20;
  if (!system_offers_huge_pages() || data == nullptr) return 0;
  const auto begin = (reinterpret_cast<std::uintptr_t>(data) + page - 1) & ~(page - 1);
  const auto end = (reinterpret_cast<std::uintptr_t>(data) + bytes) & ~(page - 1);
  if (end <= begin) return 0;
  return madvise(reinterpret_cast<void*>(begin), end - begin, MADV_HUGEPAGE) == 0 ? end - begin : 0;
#else
  (void)data, (void)bytes;
  return 0;
#endif
}

/// A zero-initialized View<T*, MemorySpace> of n elements (a state or work buffer); if `huge`,
/// in host memory, its whole 2 MiB pages advised as huge pages before the zeros are written.
/// `advised` (if given) grows by the bytes advised.
template <class View>
View huge_page_view(const std::string& label, std::size_t n, bool huge, std::size_t* advised = nullptr) {
  using T = typename View::value_type;
  View v(Kokkos::view_alloc(Kokkos::WithoutInitializing, label), n);
  if constexpr (std::is_same_v<typename View::memory_space, Kokkos::HostSpace>) {
    const std::size_t a = huge ? advise_huge_pages(v.data(), n * sizeof(T)) : 0;
    if (advised != nullptr) *advised += a;
  }
  Kokkos::deep_copy(v, T(0));
  return v;
}

/// Zero-initialized slices of one View<T*, MemorySpace>: reserve() every slice's length first,
/// then allocate(), then take() the slices in the same order. Each slice starts a multiple of
/// 256 bytes after the first, which is aligned as any Kokkos allocation (64 bytes on hosts): no
/// slice is aligned worse than a separate allocation would be. Slices are subviews: they keep
/// the allocation alive, and `span()` is their own length (state_bytes() counts no padding).
template <class T, class MemorySpace>
class StateArena {
 public:
  using view_type = Kokkos::View<T*, MemorySpace>;
  static constexpr std::size_t align = 256 / sizeof(T) > 0 ? 256 / sizeof(T) : 1;  // elements

  void reserve(std::size_t n) { m_size += round_up(n); }

  /// One allocation of every reserved slice; if `huge`, in host memory advised as huge-page
  /// backed before the zeros are written (the first touch places the pages).
  void allocate(const std::string& label, bool huge) {
    m_next = 0;
    if (m_size == 0) return;
    m_all = huge_page_view<view_type>(label, m_size, huge, &m_advised);
  }

  /// The next slice of n elements (n as reserved; 0 gives an empty view).
  view_type take(std::size_t n) {
    if (n == 0) return view_type();
    const std::size_t at = m_next;
    m_next += round_up(n);
    if (m_next > m_size) Kokkos::abort("lather::impl::StateArena: more taken than reserved");
    return view_type(m_all, std::make_pair(at, at + n));
  }

  [[nodiscard]] std::size_t advised_bytes() const { return m_advised; }

 private:
  static std::size_t round_up(std::size_t n) { return (n + align - 1) / align * align; }
  view_type m_all;
  std::size_t m_size = 0, m_next = 0, m_advised = 0;
};

}  // namespace lather::impl

#endif
