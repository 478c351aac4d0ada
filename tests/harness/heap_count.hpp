// SPDX-License-Identifier: Apache-2.0
// A counting global operator new for the allocation tests (the rule "no heap allocation inside
// step() after the first step", docs/performance.md). Include it in exactly one translation unit
// of an executable: it replaces the global operator new of the whole program. Kokkos Views count
// too: each allocation creates its SharedAllocationRecord with `new`.
//
// Host compilers only (a GPU compiler would compile the replacement for the device as well);
// LATHER_TEST_COUNTS_HEAP says whether the counter is there. LATHER_TEST_COUNTS_STEPS says
// whether a count around a whole step means anything: Kokkos 3.5+ names every fence with a
// default std::string argument (kokkos/kokkos#3966), which allocates, so there a step's count
// would be Kokkos' own; steps are counted on the Kokkos this project's CI builds (3.4.1).
#ifndef LATHER_TEST_HEAP_COUNT_HPP
#define LATHER_TEST_HEAP_COUNT_HPP

#include <Kokkos_Core.hpp>

#if defined(__CUDACC__) || defined(__HIP__) || defined(__HIPCC__)
#define LATHER_TEST_COUNTS_HEAP 0
#else
#define LATHER_TEST_COUNTS_HEAP 1
#endif
#if LATHER_TEST_COUNTS_HEAP && KOKKOS_VERSION < 30500
#define LATHER_TEST_COUNTS_STEPS 1
#else
#define LATHER_TEST_COUNTS_STEPS 0
#endif

#if LATHER_TEST_COUNTS_HEAP
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <new>

namespace lather::test {
inline std::atomic<bool> g_counting{false};
inline std::atomic<std::int64_t> g_allocations{0};

/// Heap allocations (operator new, on any thread) made while f() runs.
template <class F>
std::int64_t heap_allocations(F&& f) {
  g_allocations = 0;
  g_counting = true;
  f();
  g_counting = false;
  return g_allocations.load();
}
}  // namespace lather::test

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"
#endif
void* operator new(std::size_t n) {
  if (lather::test::g_counting.load(std::memory_order_relaxed))
    lather::test::g_allocations.fetch_add(1, std::memory_order_relaxed);
  if (void* p = std::malloc(n == 0 ? 1 : n)) return p;
  throw std::bad_alloc();
}
void* operator new[](std::size_t n) { return ::operator new(n); }
void operator delete(void* p) noexcept { std::free(p); }
void operator delete[](void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t) noexcept { std::free(p); }
#endif

#endif
