// SPDX-License-Identifier: Apache-2.0
/// \file
/// \brief Private. Element-wise passes over many tensors in one kernel on any execution space
/// (the portable counterpart of kernels/host_chunks.hpp's host loop): each tensor's elements cut
/// into chunks, one team per chunk.
///
/// Why: on a GPU a kernel per parameter is a launch per parameter, and most parameters of a
/// model are small: on the H200 of the fourteenth round AdamW over resnet50's 161 parameters ran
/// 322 kernels a step (the NaN/Inf check and the update of each) and reached 14-52% of the
/// memory bandwidth (docs/performance.md). Here a step uploads one table (a job per tensor: its
/// element kernel, trivially copyable) and launches one kernel over all chunks.
#ifndef LATHER_IMPL_KERNELS_MULTI_TENSOR_HPP
#define LATHER_IMPL_KERNELS_MULTI_TENSOR_HPP

#include <lather/error.hpp>
#include <lather/impl/backends/device_event.hpp>

#include <Kokkos_Core.hpp>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

// GCC 11+ (host code, and nvcc's host passes) zeroes an object's padding; clang up to 16 (hipcc)
// cannot, so its tables copy any entry with padding on every launch (as before, never wrong).
#if defined(__has_builtin)
#if __has_builtin(__builtin_clear_padding)
#define LATHER_HAS_CLEAR_PADDING 1
#endif
#endif
#ifndef LATHER_HAS_CLEAR_PADDING
#define LATHER_HAS_CLEAR_PADDING 0
#endif

namespace lather::impl::kernels {

/// Elements per chunk (one team's share) of the multi-tensor loop: 16 per thread of a 256-thread
/// GPU team, and as long as the host chunk loop's chunks on host spaces.
inline constexpr std::int64_t multi_tensor_chunk_elements = 4096;

/// One tensor's entry: its job, its element count, the index of its first chunk, and a device
/// counter its chunks must find zero to run (none: they always run; read once per chunk). Why
/// the gate: a step can queue its updates behind the NaN/Inf count of its gradients without
/// waiting for the count on the host (impl::GradientIntake::queue_count); its address stays the
/// same from step to step, so it does not make the table change.
template <class Job>
struct MultiTensorEntry {
  Job job;
  std::int64_t size;
  std::int64_t first_chunk;
  const std::int64_t* gate;
};

/// \brief The team body: finds the chunk's entry (binary search over first_chunk) and runs the
/// job on the chunk's elements, spread over the team's threads.
template <class ExecSpace, class MemorySpace, class Job>
struct MultiTensorBody {
  using member_type = typename Kokkos::TeamPolicy<ExecSpace>::member_type;
  Kokkos::View<const MultiTensorEntry<Job>*, MemorySpace> entries;

  KOKKOS_FUNCTION void operator()(const member_type& team) const {
    const std::int64_t c = team.league_rank();
    const MultiTensorEntry<Job>& e = entries(chunk_entry(entries, c));
    if (e.gate != nullptr && *e.gate != 0) return;
    const std::int64_t begin = (c - e.first_chunk) * multi_tensor_chunk_elements;
    const std::int64_t end = begin + multi_tensor_chunk_elements < e.size ? begin + multi_tensor_chunk_elements : e.size;
    Kokkos::parallel_for(Kokkos::TeamThreadRange(team, begin, end), [&](const std::int64_t i) { e.job(i); });
  }
  /// The entry of chunk c: the last whose first chunk is <= c (binary search).
  template <class Entries>
  KOKKOS_INLINE_FUNCTION static std::int64_t chunk_entry(const Entries& entries, std::int64_t c) {
    std::int64_t lo = 0, hi = static_cast<std::int64_t>(entries.extent(0));
    while (hi - lo > 1) {
      const std::int64_t mid = lo + (hi - lo) / 2;
      if (entries(mid).first_chunk <= c) lo = mid;
      else hi = mid;
    }
    return lo;
  }
};

/// \brief The team body of ChunkedTeamTable: chunk c runs as job(team, begin, end, c) over its
/// tensor's elements [begin, end).
template <class ExecSpace, class MemorySpace, class Job>
struct ChunkedTeamBody {
  using member_type = typename Kokkos::TeamPolicy<ExecSpace>::member_type;
  Kokkos::View<const MultiTensorEntry<Job>*, MemorySpace> entries;

  KOKKOS_FUNCTION void operator()(const member_type& team) const {
    const std::int64_t c = team.league_rank();
    const MultiTensorEntry<Job>& e = entries(MultiTensorBody<ExecSpace, MemorySpace, Job>::chunk_entry(entries, c));
    if (e.gate != nullptr && *e.gate != 0) return;
    const std::int64_t begin = (c - e.first_chunk) * multi_tensor_chunk_elements;
    const std::int64_t end = begin + multi_tensor_chunk_elements < e.size ? begin + multi_tensor_chunk_elements : e.size;
    e.job(team, begin, end, c);
  }
};

/// \brief A table of trivially copyable entries filled on the host and uploaded to `MemorySpace`
/// for each launch (the storage of MultiTensorTable and TeamTable). reserve() allocates, so
/// steps allocate nothing.
///
/// Uploads only what changed. The launches of a step take consecutive places in the memory
/// space's buffer (begin_step() starts again from the first), and a launch copies only the
/// entries that differ, byte for byte, from what that place holds: steady steps fill most tables
/// as the step before did (the same blocks, buffers and options), so they copy nothing but the
/// entries with per-step scalars. Why: on CUDA each copy from pageable memory is a driver call
/// that may wait for the stream, 15-25 of them a steady batched Shampoo step (0.26 ms of
/// resnet50's fenced step at block size 1024 on an H100, docs/performance-history.md, twenty-third
/// round), as GemmBatches already does for its pointer arrays. The copies that remain go through
/// pinned memory on CUDA and HIP (StagingRing: queued, no wait; HIP fenced each one before);
/// other devices fence after each. A place is compared with the
/// host's record of what it holds (`m_held`); host spaces keep a separate buffer too, so a table
/// skipped wrongly would run stale jobs in the host tests. A step with more launches than
/// reserve()'s `launches` x `n` entries hold starts over at the first place (correct, but those
/// launches copy again). Entries whose padding bytes differ copy again too (never wrong).
template <class ExecSpace, class MemorySpace, class Entry>
class UploadedTable {
  static_assert(std::is_trivially_copyable_v<Entry>, "lather: a table's job must be trivially copyable");

 public:
  // Move-only: a copy would share the memory space's buffer but not the record of what it holds.
  UploadedTable() = default;
  UploadedTable(const UploadedTable&) = delete;
  UploadedTable& operator=(const UploadedTable&) = delete;
  UploadedTable(UploadedTable&&) noexcept = default;
  UploadedTable& operator=(UploadedTable&&) noexcept = default;
  ~UploadedTable() = default;

  /// Room for `n` entries a launch and `launches` launches a step kept apart in the memory space
  /// (allocates; call it outside step()).
  void reserve(std::size_t n, std::size_t launches = 1) {
    const std::size_t places = n * std::max<std::size_t>(launches, 1);
    if (n <= m_host.extent(0) && places <= m_device.extent(0)) return;
    n = std::max(n, m_host.extent(0));
    const std::size_t capacity = std::max(places, m_device.extent(0));
    m_device = Kokkos::View<Entry*, MemorySpace>(Kokkos::view_alloc(Kokkos::WithoutInitializing, "lather::multi_tensor_jobs"), capacity);
    m_host = Kokkos::View<Entry*, Kokkos::HostSpace>(Kokkos::view_alloc(Kokkos::WithoutInitializing, "lather::multi_tensor_jobs_host"), n);
    m_held = Kokkos::View<Entry*, Kokkos::HostSpace>(Kokkos::view_alloc(Kokkos::WithoutInitializing, "lather::multi_tensor_jobs_held"), capacity);
    m_valid.assign(capacity, 0);  // the new buffer holds nothing yet
    m_cursor = 0;
    // Two steps of copies of every place in flight before a copy waits for an older one.
    if constexpr (staged) m_staging.reserve(2 * capacity * sizeof(Entry), 2 * std::max<std::size_t>(launches, 1) + 2);
  }
  /// Copies that waited for an earlier one's pinned bytes (CUDA and HIP; tests).
  [[nodiscard]] std::int64_t staging_waits() const noexcept { return m_staging.waits(); }
  [[nodiscard]] std::size_t size() const { return m_count; }
  [[nodiscard]] bool empty() const { return m_count == 0; }
  /// The next launch takes the first place again: a step that fills the tables as the previous
  /// one did finds its entries in place.
  void begin_step() noexcept { m_cursor = 0; }
  /// Host-to-memory-space copies so far (one per launch that changed anything).
  [[nodiscard]] std::int64_t uploads() const noexcept { return m_uploads; }
  /// Bytes the table holds: its entries in the memory space, the host's two copies, the record
  /// of which places are written and the pinned staging bytes (CUDA, HIP).
  [[nodiscard]] std::size_t bytes() const noexcept {
    return (m_device.span() + m_host.span() + m_held.span()) * sizeof(Entry) + m_valid.capacity() + m_staging.capacity();
  }

 protected:
  void push(const Entry& e) {
    LATHER_THROW_RUNTIME_IF(m_count >= m_host.extent(0), "lather: internal error: multi-tensor table full (", m_count,
                    " jobs); reserve() room for every tensor first");
    Entry& slot = m_host(m_count);
    slot = e;
#if LATHER_HAS_CLEAR_PADDING
    __builtin_clear_padding(&slot);  // the caller's padding bytes are stack garbage: they would defeat the comparison
#endif
    ++m_count;
  }
  void reset() { m_count = 0; }
  /// The filled entries in `MemorySpace`, the changed ones' copy queued on `space`: on CUDA and
  /// HIP from pinned memory (StagingRing), elsewhere from `m_held` and fenced, so that a refill
  /// cannot overwrite bytes still being read. Launches are ordered on one `space`, so a place is
  /// rewritten only after the kernels that read it.
  Kokkos::View<const Entry*, MemorySpace> upload(const ExecSpace& space) {
    if (m_cursor + m_count > m_device.extent(0)) m_cursor = 0;
    const std::size_t at = m_cursor;
    std::size_t lo = m_count, hi = 0;
    for (std::size_t e = 0; e < m_count; ++e) {
      const std::size_t pos = at + e;
      if (m_valid[pos] != 0 && std::memcmp(&m_held(pos), &m_host(e), sizeof(Entry)) == 0) continue;
      std::memcpy(&m_held(pos), &m_host(e), sizeof(Entry));
      m_valid[pos] = 1;
      lo = std::min(lo, e);
      hi = e + 1;
    }
    if (lo < hi) {
      const std::pair<std::size_t, std::size_t> changed(at + lo, at + hi);
      const auto dst = Kokkos::subview(m_device, changed);
      const auto src = Kokkos::subview(m_held, changed);
      constexpr bool same_memory = std::is_same_v<typename decltype(m_device)::memory_space, Kokkos::HostSpace>;
      if constexpr (same_memory) {
        Kokkos::deep_copy(dst, src);  // host: a memcpy, done on return
      } else if constexpr (staged) {
        m_staging.copy(space, dst.data(), src.data(), (hi - lo) * sizeof(Entry));
      } else {
        Kokkos::deep_copy(space, dst, src);
        space.fence();
      }
      ++m_uploads;
    }
    m_cursor = at + m_count;
    return Kokkos::subview(m_device, std::pair<std::size_t, std::size_t>(at, at + m_count));
  }

 private:
  // Device memory filled through pinned staging (CUDA, HIP).
  static constexpr bool staged =
      DeviceEvent<ExecSpace>::is_event && !std::is_same_v<MemorySpace, Kokkos::HostSpace>;
  Kokkos::View<Entry*, MemorySpace> m_device;
  Kokkos::View<Entry*, Kokkos::HostSpace> m_host;  // this launch's entries, filled by push()
  Kokkos::View<Entry*, Kokkos::HostSpace> m_held;  // what each place of m_device holds
  std::vector<unsigned char> m_valid;              // whether m_held's place has been written
  std::size_t m_count = 0, m_cursor = 0;
  std::int64_t m_uploads = 0;
  StagingRing<ExecSpace> m_staging;  // CUDA, HIP: the copies' pinned bytes
};

/// \brief Values that kernels read through pointers their jobs hold (per-step scalars): add()
/// one entry per index, then upload() once, before the launches that read them. The entries keep
/// one place in the memory space, so entry k is at the same address on every upload and the jobs
/// pointing there stay the same from step to step; an upload copies only the entries that
/// changed (UploadedTable), none when nothing did.
template <class ExecSpace, class MemorySpace, class Entry>
class ValueTable : public UploadedTable<ExecSpace, MemorySpace, Entry> {
  using base = UploadedTable<ExecSpace, MemorySpace, Entry>;

 public:
  void clear() { base::reset(); }
  void add(const Entry& e) { base::push(e); }
  /// The entries in `MemorySpace` (entry k at the result + k), their copy queued on `space` as
  /// UploadedTable::upload's.
  const Entry* upload(const ExecSpace& space) {
    base::begin_step();  // one place: the same addresses on every upload
    return base::upload(space).data();
  }
};

/// \brief Tensors cut into chunks of multi_tensor_chunk_elements, one team per chunk, in one
/// kernel whose team body is `Body` (MultiTensorBody or ChunkedTeamBody): the storage and launch
/// of MultiTensorTable and ChunkedTeamTable.
template <class ExecSpace, class MemorySpace, class Job, class Body>
class ChunkTable : public UploadedTable<ExecSpace, MemorySpace, MultiTensorEntry<Job>> {
  using base = UploadedTable<ExecSpace, MemorySpace, MultiTensorEntry<Job>>;

 public:
  void clear() {
    base::reset();
    m_chunks = 0;
  }
  [[nodiscard]] std::int64_t chunks() const { return m_chunks; }
  /// Chunks of a tensor of `size` elements.
  [[nodiscard]] static std::int64_t chunks_of(std::int64_t size) {
    return size <= 0 ? 0 : (size + multi_tensor_chunk_elements - 1) / multi_tensor_chunk_elements;
  }

  /// Adds a tensor of `size` elements (an empty one adds nothing; at most reserve()'s n jobs),
  /// whose chunks run only where `*gate` is zero when a gate is given (MultiTensorEntry);
  /// returns the index of its first chunk, which is chunks() before the call.
  std::int64_t add(const Job& job, std::int64_t size, const std::int64_t* gate = nullptr) {
    const std::int64_t first = m_chunks;
    if (size <= 0) return first;
    base::push(MultiTensorEntry<Job>{job, size, m_chunks, gate});
    m_chunks += chunks_of(size);
    return first;
  }

  /// \brief Copies the table to `MemorySpace` and queues one kernel on `space`, a team per
  /// chunk. `label` must outlive the call (a LATHER_LABEL or a member: a label built per launch
  /// allocates). Asynchronous with respect to the host (see UploadedTable::upload for the
  /// table's copy).
  void launch(const std::string& label, const ExecSpace& space) {
    if (base::empty()) return;
    LATHER_THROW_IF(m_chunks > std::numeric_limits<int>::max(), "lather: ", m_chunks,
                    " chunks exceed a Kokkos league; split the parameters over several optimizers");
    const auto device = base::upload(space);
    Kokkos::parallel_for(label, Kokkos::TeamPolicy<ExecSpace>(space, static_cast<int>(m_chunks), Kokkos::AUTO),
                         Body{device});
  }

 private:
  std::int64_t m_chunks = 0;
};

/// \brief The jobs of one multi-tensor loop: add() one per tensor, then launch() (one kernel
/// that runs every job on every element of its tensor).
///
/// `Job` must be trivially copyable (it is copied byte for byte into device memory) and callable
/// as `job(i)` for an element index i in [0, size).
template <class ExecSpace, class MemorySpace, class Job>
class MultiTensorTable : public ChunkTable<ExecSpace, MemorySpace, Job, MultiTensorBody<ExecSpace, MemorySpace, Job>> {};

/// \brief The team body of TeamTable: entry e runs as `job(team)` in team e.
template <class ExecSpace, class MemorySpace, class Job>
struct TeamTableBody {
  using member_type = typename Kokkos::TeamPolicy<ExecSpace>::member_type;
  Kokkos::View<const Job*, MemorySpace> jobs;
  KOKKOS_FUNCTION void operator()(const member_type& team) const { jobs(team.league_rank())(team); }
};

/// \brief Chunks of many tensors, one team each, where the job wants the team (a reduction over
/// its chunk into a partial per chunk, or a value computed once per team): add() one job per
/// tensor, then launch() one kernel. Cut like MultiTensorTable; `Job` is trivially copyable and
/// callable as `job(team, begin, end, chunk)` with a TeamPolicy member of `ExecSpace`, the
/// chunk's elements [begin, end) of its tensor and the chunk's index among all chunks of the
/// table (add() returns a tensor's first).
///
/// Why not one team per tensor (TeamTable): a team runs on one GPU multiprocessor, so a tensor of
/// a million elements was read at one multiprocessor's share of the memory bandwidth. On an H100
/// the batched grafting norms and graft scale, one team per block, were 80% of a steady resnet50
/// step at block size 1024 (docs/performance.md, "On a GPU").
template <class ExecSpace, class MemorySpace, class Job>
class ChunkedTeamTable : public ChunkTable<ExecSpace, MemorySpace, Job, ChunkedTeamBody<ExecSpace, MemorySpace, Job>> {};

/// \brief Jobs that each take one team (a reduction or a small product per block): add() one per
/// block, then launch() one kernel with a team per job. `Job` is trivially copyable and callable
/// as `job(team)` with a TeamPolicy member of `ExecSpace`.
template <class ExecSpace, class MemorySpace, class Job>
class TeamTable : public UploadedTable<ExecSpace, MemorySpace, Job> {
  using base = UploadedTable<ExecSpace, MemorySpace, Job>;

 public:
  void clear() { base::reset(); }
  void add(const Job& job) { base::push(job); }
  /// One kernel, a team per job; asynchronous as MultiTensorTable::launch.
  void launch(const std::string& label, const ExecSpace& space) {
    if (base::empty()) return;
    LATHER_THROW_IF(base::size() > static_cast<std::size_t>(std::numeric_limits<int>::max()), "lather: ", base::size(),
                    " blocks exceed a Kokkos league; split the parameters over several optimizers");
    const auto device = base::upload(space);
    Kokkos::parallel_for(label, Kokkos::TeamPolicy<ExecSpace>(space, static_cast<int>(base::size()), Kokkos::AUTO),
                         TeamTableBody<ExecSpace, MemorySpace, Job>{device});
  }
};

}  // namespace lather::impl::kernels

#endif
