// SPDX-License-Identifier: Apache-2.0
/// \file
/// \brief Private. A point in an execution space instance's queue that the host can wait for
/// (DeviceEvent), the host memory a device copies into without making the host wait for the copy
/// (pinned_host_space_t), and host-to-device copies the host does not wait for (StagingRing).
///
/// Why: a step that reads a few values back from the device (the NaN/Inf screen's counts,
/// impl::GradientIntake) needs to wait for those values only, not for every kernel queued after
/// them: the host can then return from step() while the device still runs the step, and queue
/// the trainer's next kernels behind it. Kokkos 3.4 to 5.x have no portable event; on CUDA and
/// HIP this is the runtime's event recorded on the instance's stream, elsewhere (host spaces,
/// SYCL, ...) a fence of the instance, which is what waiting for a value meant before.
///
/// Copies between device memory and pageable host memory (a `create_mirror_view`, a std::vector)
/// may be synchronous on CUDA and HIP: the CUDA runtime documents that a copy from pageable memory
/// "may synchronize with the stream" to stage it, and HIP gives no promise either, so the tables
/// of the batched kernels fenced after each upload on HIP. From pinned memory a copy is queued
/// like a kernel; the host then must not rewrite those bytes before the copy has run, which is
/// what StagingRing keeps track of. These copies call the runtime (`cudaMemcpyAsync`,
/// `hipMemcpyAsync` on the instance's stream), not `Kokkos::deep_copy(exec, ...)`: Kokkos 3.4's
/// HIP backend has no instance overload between HIPSpace and HIPHostPinnedSpace, and its generic
/// one fences the instance and then synchronizes the default stream.
#ifndef LATHER_IMPL_BACKENDS_DEVICE_EVENT_HPP
#define LATHER_IMPL_BACKENDS_DEVICE_EVENT_HPP

#include <lather/error.hpp>

#include <Kokkos_Core.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <utility>
#include <vector>

#if defined(KOKKOS_ENABLE_CUDA)
#include <cuda_runtime_api.h>
#endif
#if defined(KOKKOS_ENABLE_HIP)
#include <hip/hip_runtime_api.h>
#endif

namespace lather::impl {

/// \brief Host-side wait for a point of `ExecSpace`'s queue: record() marks the point (after
/// everything queued so far on that instance), wait() returns once the device has passed it.
/// This generic version fences the instance in wait() (host spaces run their kernels before
/// returning anyway); CUDA and HIP record a runtime event. Move-only.
template <class ExecSpace>
class DeviceEvent {
 public:
  static constexpr bool is_event = false;  // wait() fences the whole instance
  void create() noexcept {}
  void record(const ExecSpace&) noexcept {}
  void wait(const ExecSpace& space) { space.fence(); }
  /// Copies n bytes between memories `space` reaches through host pointers (host spaces).
  static void copy(const ExecSpace&, void* dst, const void* src, std::size_t n) {
    static_assert(Kokkos::SpaceAccessibility<ExecSpace, Kokkos::HostSpace>::accessible,
                  "lather: DeviceEvent::copy without a runtime event needs a host execution space");
    std::memcpy(dst, src, n);
  }
  /// For destructors: waits for the recorded point without reporting errors (here nothing is
  /// in flight that a host-space owner could free under a copy).
  void release() noexcept {}
};

/// The host memory space a copy from `ExecSpace`'s device memory should land in to stay
/// asynchronous (pinned on CUDA and HIP; HostSpace elsewhere).
template <class ExecSpace>
struct pinned_host_space {
  using type = Kokkos::HostSpace;
};
template <class ExecSpace>
using pinned_host_space_t = typename pinned_host_space<ExecSpace>::type;

namespace runtime_event {

// One runtime event (created once, outside steps: creating one may allocate), recorded on the
// instance's stream. `Api` maps the runtime's calls (CUDA and HIP name them alike).
template <class ExecSpace, class Api>
class Event {
 public:
  static constexpr bool is_event = true;
  Event() = default;
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;
  Event(Event&& o) noexcept
      : m_event(std::exchange(o.m_event, typename Api::event_type{})), m_recorded(std::exchange(o.m_recorded, false)) {}
  Event& operator=(Event&& o) noexcept {
    if (this != &o) {
      destroy();
      m_event = std::exchange(o.m_event, typename Api::event_type{});
      m_recorded = std::exchange(o.m_recorded, false);
    }
    return *this;
  }
  ~Event() { destroy(); }

  /// Creates the runtime event (at construction of its owner, not in a step).
  void create() {
    if (m_event != typename Api::event_type{}) return;
    const auto rc = Api::create(&m_event);
    LATHER_THROW_RUNTIME_IF(rc != Api::success, "lather: ", Api::name, "EventCreateWithFlags failed: ",
                            Api::error_string(rc));
  }
  void record(const ExecSpace& space) {
    create();
    const auto rc = Api::record(m_event, Api::stream(space));
    LATHER_THROW_RUNTIME_IF(rc != Api::success, "lather: ", Api::name, "EventRecord failed: ", Api::error_string(rc));
    m_recorded = true;
  }
  /// Queues a copy of n bytes on the instance's stream (between device memory and pinned host
  /// memory it does not wait; the host must keep both sides as they are until it has run).
  static void copy(const ExecSpace& space, void* dst, const void* src, std::size_t n) {
    const auto rc = Api::copy(dst, src, n, Api::stream(space));
    LATHER_THROW_RUNTIME_IF(rc != Api::success, "lather: ", Api::name, "MemcpyAsync failed: ", Api::error_string(rc));
  }
  /// For destructors: waits for the recorded point, if any, ignoring errors (at exit the
  /// runtime may already be gone), so that memory a copy in flight reads or writes can be freed.
  void release() noexcept {
    if (m_recorded && m_event != typename Api::event_type{}) (void)Api::synchronize(m_event);
    m_recorded = false;
  }
  /// Waits for the recorded point; without one, for everything queued (a fence).
  void wait(const ExecSpace& space) {
    if (!m_recorded) {
      space.fence();
      return;
    }
    const auto rc = Api::synchronize(m_event);
    LATHER_THROW_RUNTIME_IF(rc != Api::success, "lather: ", Api::name, "EventSynchronize failed: ",
                            Api::error_string(rc));
  }

 private:
  void destroy() noexcept {
    // Errors ignored: at exit the runtime may already be gone, and a destructor cannot report.
    if (m_event != typename Api::event_type{}) (void)Api::destroy(m_event);
    m_event = typename Api::event_type{};
  }
  typename Api::event_type m_event{};
  bool m_recorded = false;
};

}  // namespace runtime_event

#if defined(KOKKOS_ENABLE_CUDA)
namespace runtime_event {
struct Cuda {
  using event_type = cudaEvent_t;
  static constexpr const char* name = "cuda";
  static constexpr cudaError_t success = cudaSuccess;
  static cudaError_t create(cudaEvent_t* e) { return cudaEventCreateWithFlags(e, cudaEventDisableTiming); }
  static cudaError_t record(cudaEvent_t e, cudaStream_t s) { return cudaEventRecord(e, s); }
  static cudaError_t synchronize(cudaEvent_t e) { return cudaEventSynchronize(e); }
  static cudaError_t destroy(cudaEvent_t e) { return cudaEventDestroy(e); }
  static cudaError_t copy(void* dst, const void* src, std::size_t n, cudaStream_t s) {
    return cudaMemcpyAsync(dst, src, n, cudaMemcpyDefault, s);
  }
  static const char* error_string(cudaError_t rc) { return cudaGetErrorString(rc); }
  static cudaStream_t stream(const Kokkos::Cuda& space) { return space.cuda_stream(); }
};
}  // namespace runtime_event
template <>
class DeviceEvent<Kokkos::Cuda> : public runtime_event::Event<Kokkos::Cuda, runtime_event::Cuda> {};
template <>
struct pinned_host_space<Kokkos::Cuda> {
  using type = Kokkos::CudaHostPinnedSpace;
};
#endif

#if defined(KOKKOS_ENABLE_HIP)
namespace runtime_event {
#if KOKKOS_VERSION >= 40000
using hip_space = Kokkos::HIP;  // out of Experimental since Kokkos 4.0
using hip_pinned_space = Kokkos::HIPHostPinnedSpace;
#else
using hip_space = Kokkos::Experimental::HIP;
using hip_pinned_space = Kokkos::Experimental::HIPHostPinnedSpace;
#endif
struct Hip {
  using event_type = hipEvent_t;
  static constexpr const char* name = "hip";
  static constexpr hipError_t success = hipSuccess;
  static hipError_t create(hipEvent_t* e) { return hipEventCreateWithFlags(e, hipEventDisableTiming); }
  static hipError_t record(hipEvent_t e, hipStream_t s) { return hipEventRecord(e, s); }
  static hipError_t synchronize(hipEvent_t e) { return hipEventSynchronize(e); }
  static hipError_t destroy(hipEvent_t e) { return hipEventDestroy(e); }
  static hipError_t copy(void* dst, const void* src, std::size_t n, hipStream_t s) {
    return hipMemcpyAsync(dst, src, n, hipMemcpyDefault, s);
  }
  static const char* error_string(hipError_t rc) { return hipGetErrorString(rc); }
  static hipStream_t stream(const hip_space& space) { return space.hip_stream(); }
};
}  // namespace runtime_event
template <>
class DeviceEvent<runtime_event::hip_space> : public runtime_event::Event<runtime_event::hip_space, runtime_event::Hip> {};
template <>
struct pinned_host_space<runtime_event::hip_space> {
  using type = runtime_event::hip_pinned_space;
};
#endif

/// \brief Host-to-device copies that the host does not wait for: copy() stages the bytes in a
/// ring of pinned host memory and queues their copy on the instance, followed by an event; a
/// later copy() that needs those bytes of the ring again (or the event, one per copy in flight)
/// waits for that event first. Sized by reserve() (allocates; outside steps) for a few steps of
/// copies, so steady steps do not wait; a copy larger than the ring grows it (waiting for every
/// copy in flight, then allocating). For CUDA and HIP (DeviceEvent::is_event); `Event` is a
/// parameter for the tests. Move-only.
template <class ExecSpace, class Event = DeviceEvent<ExecSpace>>
class StagingRing {
 public:
  using staging_space = pinned_host_space_t<ExecSpace>;

  StagingRing() = default;
  StagingRing(const StagingRing&) = delete;
  StagingRing& operator=(const StagingRing&) = delete;
  StagingRing(StagingRing&& o) noexcept { take(o); }
  StagingRing& operator=(StagingRing&& o) noexcept {
    if (this != &o) {
      release_all();
      take(o);
    }
    return *this;
  }
  // Copies in flight still read the pinned buffer: they finish before it is freed.
  ~StagingRing() { release_all(); }

  /// Room for `bytes` in flight and `copies` copies in flight (at least 2).
  void reserve(std::size_t bytes, std::size_t copies) {
    copies = std::max<std::size_t>(copies, 2);
    if (bytes <= m_buffer.extent(0) && copies <= m_events.size()) return;
    wait_all(ExecSpace());
    if (bytes > m_buffer.extent(0)) {
      m_buffer = Kokkos::View<unsigned char*, staging_space>(
          Kokkos::view_alloc(Kokkos::WithoutInitializing, "lather::staging_ring"), bytes);
    }
    if (copies > m_events.size()) {
      m_events.resize(copies);
      for (Event& e : m_events) e.create();
      m_segments.assign(copies, Segment{});
    }
    m_front = m_count = m_next = 0;
  }

  /// Queues the copy of `n` bytes from host memory `src` to `dst` (memory `space` reaches) on
  /// `space`; `src` may change as soon as this returns.
  void copy(const ExecSpace& space, void* dst, const void* src, std::size_t n) {
    if (n == 0) return;
    if (n > m_buffer.extent(0) || m_events.empty())
      reserve(std::max<std::size_t>(2 * n, 2 * m_buffer.extent(0)), std::max<std::size_t>(m_events.size(), 4));
    const std::size_t at = place(space, n);
    unsigned char* staged = m_buffer.data() + at;
    std::memcpy(staged, src, n);
    Event::copy(space, dst, staged, n);
    const std::size_t slot = (m_front + m_count) % m_segments.size();
    m_segments[slot] = Segment{at, at + n};
    m_events[slot].record(space);
    ++m_count;
    m_next = at + n;
    m_last = staged;
  }

  /// Waits for every copy in flight.
  void wait_all(const ExecSpace& space) {
    while (m_count > 0) pop(space);
    m_next = 0;
  }
  /// Times a copy waited for an earlier one (tests: steady steps should not).
  [[nodiscard]] std::int64_t waits() const noexcept { return m_waits; }
  /// Where the last copy was staged (tests).
  [[nodiscard]] const unsigned char* last_staged() const noexcept { return m_last; }
  [[nodiscard]] std::size_t capacity() const noexcept { return m_buffer.extent(0); }

 private:
  struct Segment {
    std::size_t begin = 0, end = 0;
  };
  void release_all() noexcept {
    for (std::size_t k = 0; k < m_count; ++k) m_events[(m_front + k) % m_segments.size()].release();
    m_front = m_count = m_next = 0;
  }
  void take(StagingRing& o) noexcept {
    m_buffer = std::move(o.m_buffer);
    m_events = std::move(o.m_events);
    m_segments = std::move(o.m_segments);
    m_front = std::exchange(o.m_front, 0);
    m_count = std::exchange(o.m_count, 0);
    m_next = std::exchange(o.m_next, 0);
    m_waits = std::exchange(o.m_waits, 0);
    m_last = std::exchange(o.m_last, nullptr);
  }
  // The first place of n bytes after the last copy (or at the start, where they do not fit
  // before the end) that no copy in flight reads, waiting for the oldest copies until there is
  // one and an event is free. Copies in flight lie in ring order from the oldest, so the ones in
  // the way are the oldest (or, at a wrap, the newest ones are reached only after the oldest).
  std::size_t place(const ExecSpace& space, std::size_t n) {
    for (;;) {
      const std::size_t at = m_next + n <= m_buffer.extent(0) ? m_next : 0;
      bool busy = m_count == m_segments.size();
      for (std::size_t k = 0; k < m_count && !busy; ++k) {
        const Segment& s = m_segments[(m_front + k) % m_segments.size()];
        busy = at < s.end && s.begin < at + n;
      }
      if (!busy) return at;
      pop(space);
      ++m_waits;
    }
  }
  void pop(const ExecSpace& space) {
    m_events[m_front].wait(space);
    m_front = (m_front + 1) % m_segments.size();
    --m_count;
  }

  Kokkos::View<unsigned char*, staging_space> m_buffer;
  std::vector<Event> m_events;      // m_events[k] follows the copy of m_segments[k]
  std::vector<Segment> m_segments;  // a circular queue of the copies in flight, oldest at m_front
  std::size_t m_front = 0, m_count = 0, m_next = 0;
  std::int64_t m_waits = 0;
  const unsigned char* m_last = nullptr;
};

}  // namespace lather::impl

#endif
