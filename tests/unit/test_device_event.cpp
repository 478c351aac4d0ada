// SPDX-License-Identifier: Apache-2.0
// impl::DeviceEvent and impl::pinned_host_space_t (impl/backends/device_event.hpp), what the
// NaN/Inf screen's counts are read back with: a copy into pinned host memory queued after a kernel
// (DeviceEvent::copy, the runtime's own asynchronous copy) and followed by a record() holds, after
// wait(), what the device held at that point, not what a kernel queued later wrote; wait() without
// a record() waits for everything queued; moves keep the recorded point (and the moved-from event
// destroys nothing twice). On CUDA and HIP this is a runtime event, elsewhere a fence.
// impl::StagingRing (the same header), how the batched kernels' tables reach the device on CUDA
// and HIP without a wait: with an event standing in for the device, a staged copy's bytes are
// never rewritten before its event was waited for, events are waited for oldest first, and a copy
// larger than the ring grows it, over 2000 copies of random sizes; on every space, copies through
// a ring too small for them, each read by a kernel queued after it, deliver every copy's bytes.
#include <lather/impl/backends/device_event.hpp>

#include <Kokkos_Core.hpp>

#include <doctest/doctest.h>

#include "exec_spaces.hpp"

#include <cstdint>
#include <cstring>
#include <random>
#include <utility>
#include <vector>

namespace {

// Writes `value` into every element of `out` (a functor, not a lambda: nvcc's extended lambdas
// have rules about their enclosing function). A million elements: long enough that a wait
// returning before the kernel ran would read zeros.
template <class View>
struct Fill {
  View out;
  std::int64_t value;
  KOKKOS_FUNCTION void operator()(std::int64_t i) const { out(i) = value; }
};
template <class ExecSpace, class View>
void fill(const ExecSpace& space, const View& out, std::int64_t value) {
  Kokkos::parallel_for("lather::test::device_event_fill",
                       Kokkos::RangePolicy<ExecSpace, Kokkos::IndexType<std::int64_t>>(
                           space, 0, static_cast<std::int64_t>(out.extent(0))),
                       Fill<View>{out, value});
}

template <class ExecSpace>
void device_event_case() {
  using memory_space = typename ExecSpace::memory_space;
  using host_space = lather::impl::pinned_host_space_t<ExecSpace>;
  const ExecSpace space;
  constexpr std::int64_t n = 1 << 20;
  Kokkos::View<std::int64_t*, memory_space> data("lather::test::device_event_data", n);
  Kokkos::View<std::int64_t*, memory_space> first("lather::test::device_event_first", 1);
  Kokkos::View<std::int64_t*, host_space> seen("lather::test::device_event_seen", 1);
  Kokkos::fence();

  lather::impl::DeviceEvent<ExecSpace> event;
  event.create();
  fill(space, data, 7);
  Kokkos::deep_copy(space, first, Kokkos::subview(data, std::pair<std::int64_t, std::int64_t>(n - 1, n)));
  lather::impl::DeviceEvent<ExecSpace>::copy(space, seen.data(), first.data(), sizeof(std::int64_t));
  event.record(space);
  fill(space, data, 11);  // queued after the recorded point: the copy must not see it
  fill(space, first, 13);
  event.wait(space);
  CHECK(seen(0) == 7);
  space.fence();
  const auto back = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), data);
  CHECK(back(0) == 11);
  CHECK(back(n - 1) == 11);

  // A moved event keeps its recorded point; the moved-from one fences when waited on.
  fill(space, first, 17);
  lather::impl::DeviceEvent<ExecSpace>::copy(space, seen.data(), first.data(), sizeof(std::int64_t));
  event.record(space);
  lather::impl::DeviceEvent<ExecSpace> moved(std::move(event));
  moved.wait(space);
  CHECK(seen(0) == 17);
  lather::impl::DeviceEvent<ExecSpace> fresh;  // never recorded: wait() fences the instance
  fill(space, first, 19);
  lather::impl::DeviceEvent<ExecSpace>::copy(space, seen.data(), first.data(), sizeof(std::int64_t));
  fresh.wait(space);
  CHECK(seen(0) == 19);
  moved = std::move(fresh);
  fill(space, first, 23);
  lather::impl::DeviceEvent<ExecSpace>::copy(space, seen.data(), first.data(), sizeof(std::int64_t));
  moved.wait(space);  // the moved-in event was never recorded: a fence
  CHECK(seen(0) == 23);
}

}  // namespace

TEST_CASE_TEMPLATE_DEFINE("DeviceEvent: a wait returns with the values copied before the record, not later ones",
                          ExecSpace, device_event) {
  device_event_case<ExecSpace>();
}
TEST_CASE_TEMPLATE_APPLY(device_event, lather_test_exec_spaces);

namespace {

// The device stand-in: record() tags the event with the copy it follows; wait() marks that copy
// done and checks that every older copy was waited for before it (oldest first).
struct FakeEvent {
  static inline int next_tag = 0;
  static inline std::vector<char> done;
  static inline bool out_of_order = false;
  int tag = -1;
  void create() noexcept {}
  void record(const Kokkos::DefaultHostExecutionSpace&) noexcept { tag = next_tag; }
  void wait(const Kokkos::DefaultHostExecutionSpace&) noexcept {
    if (tag < 0) return;
    for (int t = 0; t < tag; ++t) out_of_order = out_of_order || done[static_cast<std::size_t>(t)] == 0;
    done[static_cast<std::size_t>(tag)] = 1;
  }
  void release() noexcept {
    if (tag >= 0) done[static_cast<std::size_t>(tag)] = 1;
  }
  static void copy(const Kokkos::DefaultHostExecutionSpace&, void* dst, const void* src, std::size_t n) {
    std::memcpy(dst, src, n);
  }
};

struct Staged {
  const unsigned char* at;
  std::vector<unsigned char> bytes;
};

// Copies a pattern of n bytes whose values depend on the copy's number.
std::vector<unsigned char> pattern(int copy, std::size_t n) {
  std::vector<unsigned char> v(n);
  for (std::size_t b = 0; b < n; ++b) v[b] = static_cast<unsigned char>(copy * 31 + static_cast<int>(b) * 7 + 1);
  return v;
}

// Reads every copy's bytes in a kernel queued after it: adds them into acc(0).
template <class View, class Acc>
struct SumInto {
  View from;
  Acc acc;
  KOKKOS_FUNCTION void operator()(std::int64_t) const {
    std::int64_t s = 0;
    for (std::size_t k = 0; k < from.extent(0); ++k) s += from(k);
    acc(0) += s;
  }
};

}  // namespace

TEST_CASE("StagingRing: staged bytes stay until their copy's event is waited for; oldest first; growth") {
  using space_t = Kokkos::DefaultHostExecutionSpace;
  lather::impl::StagingRing<space_t, FakeEvent> ring;
  constexpr int copies = 2000;
  FakeEvent::done.assign(copies, 0);
  FakeEvent::out_of_order = false;
  ring.reserve(256, 4);
  std::mt19937 rng(7);
  std::vector<Staged> staged;
  std::vector<unsigned char> dst(1 << 14);
  bool intact = true, delivered = true;
  std::size_t grown = 0;
  for (int c = 0; c < copies; ++c) {
    // Mostly small copies, some filling most of the ring, a few larger than it.
    const std::size_t n = c == 999 || c == 1499 ? ring.capacity() + 1 + rng() % 64 : 1 + rng() % (c % 7 == 0 ? 200 : 48);
    const std::size_t before = ring.capacity();
    const std::vector<unsigned char> src = pattern(c, n);
    FakeEvent::next_tag = c;
    ring.copy(space_t(), dst.data(), src.data(), n);
    grown += ring.capacity() > before ? 1 : 0;
    delivered = delivered && std::memcmp(dst.data(), src.data(), n) == 0;
    staged.push_back({ring.last_staged(), src});
    // Every copy not waited for yet still has its bytes where they were staged.
    for (int t = 0; t < c; ++t) {
      if (FakeEvent::done[static_cast<std::size_t>(t)] != 0) continue;
      const Staged& s = staged[static_cast<std::size_t>(t)];
      intact = intact && std::memcmp(s.at, s.bytes.data(), s.bytes.size()) == 0;
    }
  }
  CHECK(intact);
  CHECK(delivered);
  CHECK_FALSE(FakeEvent::out_of_order);
  CHECK(grown == 2);  // the two copies larger than the ring grew it
  CHECK(ring.capacity() >= 256);
  CHECK(ring.waits() > 0);  // the ring was reused: older copies were waited for
  ring.wait_all(space_t());
  for (int c = 0; c < copies; ++c) CHECK(FakeEvent::done[static_cast<std::size_t>(c)] != 0);
}

TEST_CASE_TEMPLATE_DEFINE("StagingRing: copies through a small ring, each read by a later kernel, all arrive", ExecSpace,
                          staging_ring) {
  using memory_space = typename ExecSpace::memory_space;
  const ExecSpace space;
  using slot_view = Kokkos::View<std::int32_t*, memory_space>;
  constexpr int slots = 3, width = 8, copies = 300;
  std::vector<slot_view> slot;
  for (int k = 0; k < slots; ++k) slot.emplace_back("lather::test::staging_slot", width);
  Kokkos::View<std::int64_t*, memory_space> acc("lather::test::staging_acc", 1);
  Kokkos::fence();
  lather::impl::StagingRing<ExecSpace> ring;
  ring.reserve(3 * width * sizeof(std::int32_t), 2);  // room for 3 copies, 2 in flight
  std::int64_t expected = 0;
  std::vector<std::int32_t> host(width);
  for (int c = 0; c < copies; ++c) {
    for (int k = 0; k < width; ++k) {
      host[static_cast<std::size_t>(k)] = c * 1000 + k;
      expected += c * 1000 + k;
    }
    const slot_view& to = slot[static_cast<std::size_t>(c % slots)];
    ring.copy(space, to.data(), host.data(), width * sizeof(std::int32_t));
    // The host rewrites its source at once; the kernel reads the slot after the copy.
    Kokkos::parallel_for("lather::test::staging_sum", Kokkos::RangePolicy<ExecSpace, Kokkos::IndexType<std::int64_t>>(space, 0, 1),
                         SumInto<slot_view, Kokkos::View<std::int64_t*, memory_space>>{to, acc});
  }
  space.fence();
  const auto got = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), acc);
  CHECK(got(0) == expected);
  CHECK(ring.waits() > 0);
}
TEST_CASE_TEMPLATE_APPLY(staging_ring, lather_test_exec_spaces);
