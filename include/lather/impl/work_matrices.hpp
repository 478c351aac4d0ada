// SPDX-License-Identifier: Apache-2.0
/// \file
/// \brief Private. Work matrices a root-inverse strategy keeps from one call to the next.
///
/// Why: the coupled iterations need six (Newton) or eight (higher order) n x n work matrices per
/// root. Allocated per call, a root step of resnet50 at block size 256 made 4602 Kokkos
/// allocations on an H200 (767 factors; docs/performance.md), where a steady step makes none.
/// The cache keeps one buffer per work matrix, grown to the largest n seen, and hands out n x n
/// Views over them (unmanaged: a View built on a pointer), so after the first root step of a
/// model the strategies allocate nothing.
///
/// The buffers are Kokkos allocations and must go before Kokkos::finalize: a finalize hook
/// empties every cache still alive (a strategy object may outlive Kokkos, e.g. a static one).
#ifndef LATHER_IMPL_WORK_MATRICES_HPP
#define LATHER_IMPL_WORK_MATRICES_HPP

#include <Kokkos_Core.hpp>

#include <algorithm>
#include <any>
#include <cstdint>
#include <mutex>
#include <string>
#include <typeindex>
#include <utility>
#include <vector>

namespace lather::impl {

/// \brief A strategy object's work-matrix buffers (see the file comment). Copies start empty:
/// the buffers are a cache of one object, not one of its options. One call at a time uses them;
/// a call that finds them in use (the same object computing on another thread) allocates its
/// own matrices, as without the cache.
class WorkMatrixCache {
 public:
  WorkMatrixCache() = default;
  WorkMatrixCache(const WorkMatrixCache&) noexcept {}
  WorkMatrixCache& operator=(const WorkMatrixCache&) noexcept { return *this; }
  ~WorkMatrixCache() {
    std::lock_guard<std::mutex> lock(registry().mutex);
    auto& all = registry().caches;
    all.erase(std::remove(all.begin(), all.end(), this), all.end());
    m_slots.clear();  // before Kokkos::finalize when this dies first; already empty after it
  }

  /// Total elements held (all buffers), for tests and state accounting.
  [[nodiscard]] std::size_t elements() {
    std::lock_guard<std::mutex> lock(m_mutex);
    return m_elements;
  }

  /// \brief The work matrices of one call: n x n Views of type `Matrix` (a rank-2 LayoutRight
  /// View), the k-th from the k-th buffer of the cache.
  template <class Matrix>
  class Lease {
   public:
    using buffer_type = Kokkos::View<typename Matrix::non_const_value_type*, typename Matrix::device_type>;

    /// Takes the cache's buffers when no other call holds them (`cache` may be null: no cache).
    Lease(WorkMatrixCache* cache, std::int64_t n) : m_n(n) {
      if (cache == nullptr) return;
      m_lock = std::unique_lock<std::mutex>(cache->m_mutex, std::try_to_lock);
      if (!m_lock.owns_lock()) return;
      m_cache = cache;
      m_buffers = &cache->slot<buffer_type>();
    }

    /// The next work matrix (uninitialized): a View over a kept buffer, or a fresh allocation
    /// named `label` without the cache (a C string: nothing is built when the cache serves).
    Matrix next(const char* label) {
      if (m_buffers == nullptr) return Matrix(Kokkos::view_alloc(Kokkos::WithoutInitializing, std::string(label)), m_n, m_n);
      if (m_used == m_buffers->size()) m_buffers->emplace_back();
      buffer_type& b = (*m_buffers)[m_used++];
      const auto need = static_cast<std::size_t>(m_n * m_n);
      if (b.extent(0) < need) {
        m_cache->m_elements += need - b.extent(0);
        b = buffer_type(Kokkos::view_alloc(Kokkos::WithoutInitializing, "lather::root_inverse::work_matrix"), need);
        m_cache->enroll();
      }
      return Matrix(b.data(), m_n, m_n);
    }

   private:
    std::int64_t m_n;
    std::unique_lock<std::mutex> m_lock;
    WorkMatrixCache* m_cache = nullptr;
    std::vector<buffer_type>* m_buffers = nullptr;
    std::size_t m_used = 0;
  };

 private:
  struct Registry {
    std::mutex mutex;
    std::vector<WorkMatrixCache*> caches;  // those holding buffers
    bool hook_pushed = false;
  };
  static Registry& registry() {
    static Registry* r = new Registry;  // never destroyed: caches in static objects may die after it would
    return *r;
  }

  // The buffers of one buffer type (the cache holds a vector of them per type it has seen).
  template <class Buffer>
  std::vector<Buffer>& slot() {
    const std::type_index type(typeid(Buffer));
    for (auto& [t, buffers] : m_slots)
      if (t == type) return *std::any_cast<std::vector<Buffer>>(&buffers);
    m_slots.emplace_back(type, std::vector<Buffer>());
    return *std::any_cast<std::vector<Buffer>>(&m_slots.back().second);
  }

  // Called with m_mutex held, after an allocation: lists this cache for the finalize hook.
  void enroll() {
    std::lock_guard<std::mutex> lock(registry().mutex);
    Registry& r = registry();
    if (std::find(r.caches.begin(), r.caches.end(), this) == r.caches.end()) r.caches.push_back(this);
    if (r.hook_pushed) return;
    r.hook_pushed = true;
    Kokkos::push_finalize_hook([] {
      Registry& reg = registry();
      std::lock_guard<std::mutex> hook_lock(reg.mutex);
      for (WorkMatrixCache* c : reg.caches) {
        std::lock_guard<std::mutex> cache_lock(c->m_mutex);
        c->m_slots.clear();
        c->m_elements = 0;
      }
      reg.caches.clear();
      reg.hook_pushed = false;  // a later Kokkos::initialize gets a hook of its own
    });
  }

  std::mutex m_mutex;
  std::vector<std::pair<std::type_index, std::any>> m_slots;
  std::size_t m_elements = 0;
};

}  // namespace lather::impl

#endif
