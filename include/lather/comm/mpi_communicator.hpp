// SPDX-License-Identifier: Apache-2.0
/// \file
/// \brief MpiCommunicator: the Communicator over an MPI communicator. The only lather header
/// that includes <mpi.h>.
#ifndef LATHER_COMM_MPI_COMMUNICATOR_HPP
#define LATHER_COMM_MPI_COMMUNICATOR_HPP

#include <lather/concepts/communicator.hpp>
#include <lather/config.hpp>
#include <lather/error.hpp>

#ifndef LATHER_ENABLE_MPI
#error "lather/comm/mpi_communicator.hpp needs lather configured with LATHER_ENABLE_MPI=ON"
#endif

#include <Kokkos_Core.hpp>

#include <mpi.h>

#include <cstdint>
#include <string>
#include <type_traits>
#include <utility>

namespace lather {
namespace impl {

/// The MPI datatype of a scalar; unsupported types fail to compile with a named message.
template <class T>
MPI_Datatype mpi_datatype() {
  using U = std::remove_cv_t<T>;
  if constexpr (std::is_same_v<U, float>) return MPI_FLOAT;
  else if constexpr (std::is_same_v<U, double>) return MPI_DOUBLE;
  else if constexpr (std::is_same_v<U, int>) return MPI_INT;
  else if constexpr (std::is_same_v<U, std::int64_t>) return MPI_INT64_T;
  else if constexpr (std::is_same_v<U, std::uint64_t>) return MPI_UINT64_T;
  else if constexpr (std::is_same_v<U, std::int8_t>) return MPI_INT8_T;
  else if constexpr (std::is_same_v<U, std::uint8_t>) return MPI_UINT8_T;
  else if constexpr (std::is_same_v<U, std::uint16_t>) return MPI_UINT16_T;  // fp16/bf16 payloads
  else static_assert(sizeof(U) == 0, "lather::MpiCommunicator: no MPI datatype for this scalar type");
}

inline void check_mpi(int rc, const char* what) {
  if (rc == MPI_SUCCESS) return;
  char msg[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, msg, &len);
  throw_error<runtime_error>(std::source_location::current(), "lather::MpiCommunicator: ", what,
                             " failed: ", std::string(msg, static_cast<std::size_t>(len)));
}

/// Runs `f(host_view)` on memory MPI may touch: the view itself when the host can access it (or
/// MPI is GPU-aware), else a host mirror copied in before (`copy_in`) and back after (`copy_out`).
template <class ExecSpace, class View, class F>
void with_mpi_buffer(const ExecSpace& space, const View& v, bool copy_in, bool copy_out, F&& f) {
  constexpr bool direct =
#ifdef LATHER_ENABLE_GPU_AWARE_MPI
      true;
#else
      Kokkos::SpaceAccessibility<Kokkos::HostSpace, typename View::memory_space>::accessible;
#endif
  space.fence();  // MPI reads and writes outside Kokkos' stream ordering
  if constexpr (direct) {
    f(v);
  } else {
    // A plain host view of the same layout: create_mirror_view(view_alloc(HostSpace(),
    // WithoutInitializing), v) does not compile for device views with Kokkos 3.4.
    Kokkos::View<typename View::non_const_data_type, typename View::array_layout, Kokkos::HostSpace> h(
        Kokkos::view_alloc(Kokkos::WithoutInitializing, std::string("lather::MpiCommunicator::staging")),
        v.layout());
    if (copy_in) Kokkos::deep_copy(h, v);
    f(h);
    if constexpr (!std::is_const_v<typename View::value_type>) {
      if (copy_out) Kokkos::deep_copy(v, h);
    }
  }
}

}  // namespace impl

/// \brief Communicator over an `MPI_Comm`.
///
/// Constructed from a communicator it borrows (never frees); `split()` makes sub-groups it owns.
/// Move-only. Collectives fence the given execution space before MPI touches the buffer, and
/// stage device buffers through host memory unless LATHER_ENABLE_GPU_AWARE_MPI is on.
class MpiCommunicator {
 public:
  /// Borrows `comm` (e.g. MPI_COMM_WORLD); MPI must be initialized.
  explicit MpiCommunicator(MPI_Comm comm) : m_comm(comm), m_owned(false) {
    int initialized = 0;
    MPI_Initialized(&initialized);
    LATHER_THROW_IF(!initialized,
                    "lather::MpiCommunicator: MPI is not initialized; call MPI_Init first");
    impl::check_mpi(MPI_Comm_rank(m_comm, &m_rank), "MPI_Comm_rank");
    impl::check_mpi(MPI_Comm_size(m_comm, &m_size), "MPI_Comm_size");
  }
  MpiCommunicator(const MpiCommunicator&) = delete;
  MpiCommunicator& operator=(const MpiCommunicator&) = delete;
  MpiCommunicator(MpiCommunicator&& o) noexcept
      : m_comm(std::exchange(o.m_comm, MPI_COMM_NULL)), m_owned(std::exchange(o.m_owned, false)),
        m_rank(o.m_rank), m_size(o.m_size) {}
  MpiCommunicator& operator=(MpiCommunicator&& o) noexcept {
    if (this != &o) {
      release();
      m_comm = std::exchange(o.m_comm, MPI_COMM_NULL);
      m_owned = std::exchange(o.m_owned, false);
      m_rank = o.m_rank;
      m_size = o.m_size;
    }
    return *this;
  }
  ~MpiCommunicator() { release(); }

  [[nodiscard]] int rank() const noexcept { return m_rank; }
  [[nodiscard]] int size() const noexcept { return m_size; }
  /// The underlying communicator (still owned by this object when it came from split()).
  [[nodiscard]] MPI_Comm comm() const noexcept { return m_comm; }

  void barrier() const { impl::check_mpi(MPI_Barrier(m_comm), "MPI_Barrier"); }

  /// In-place element-wise sum over the group. Fences `space`; blocking.
  template <class ExecSpace, class View>
  void all_reduce_sum(const ExecSpace& space, const View& v) const {
    check_contiguous(v, "all_reduce_sum");
    using T = typename View::non_const_value_type;
    impl::with_mpi_buffer(space, v, true, true, [&](const auto& b) {
      impl::check_mpi(MPI_Allreduce(MPI_IN_PLACE, b.data(), static_cast<int>(b.extent(0)),
                                    impl::mpi_datatype<T>(), MPI_SUM, m_comm),
                      "MPI_Allreduce");
    });
  }

  /// Root's values to every rank. Fences `space`; blocking.
  template <class ExecSpace, class View>
  void broadcast(const ExecSpace& space, const View& v, int root) const {
    check_contiguous(v, "broadcast");
    LATHER_THROW_IF(root < 0 || root >= m_size, "lather::MpiCommunicator::broadcast: root ", root,
                    " is not a rank of this group of ", m_size);
    using T = typename View::non_const_value_type;
    impl::with_mpi_buffer(space, v, m_rank == root, m_rank != root, [&](const auto& b) {
      impl::check_mpi(MPI_Bcast(b.data(), static_cast<int>(b.extent(0)), impl::mpi_datatype<T>(),
                                root, m_comm),
                      "MPI_Bcast");
    });
  }

  /// Every rank's `in` into `out` (size() x in.extent(0) elements, rank-major). Fences `space`.
  template <class ExecSpace, class InView, class OutView>
  void all_gather(const ExecSpace& space, const InView& in, const OutView& out) const {
    check_contiguous(in, "all_gather");
    check_contiguous(out, "all_gather");
    LATHER_THROW_IF(out.extent(0) != in.extent(0) * static_cast<std::size_t>(m_size),
                    "lather::MpiCommunicator::all_gather: output has ", out.extent(0),
                    " elements, expected ", in.extent(0) * static_cast<std::size_t>(m_size),
                    " (size() x input size)");
    using T = typename OutView::non_const_value_type;
    static_assert(std::is_same_v<T, typename InView::non_const_value_type>,
                  "lather::MpiCommunicator::all_gather: input and output value types differ");
    impl::with_mpi_buffer(space, in, true, false, [&](const auto& bin) {
      impl::with_mpi_buffer(space, out, false, true, [&](const auto& bout) {
        impl::check_mpi(MPI_Allgather(bin.data(), static_cast<int>(bin.extent(0)),
                                      impl::mpi_datatype<T>(), bout.data(),
                                      static_cast<int>(bin.extent(0)), impl::mpi_datatype<T>(),
                                      m_comm),
                        "MPI_Allgather");
      });
    });
  }

  /// The sub-group of ranks that pass the same color, ordered by key (MPI_Comm_split).
  [[nodiscard]] MpiCommunicator split(int color, int key) const {
    MPI_Comm sub = MPI_COMM_NULL;
    impl::check_mpi(MPI_Comm_split(m_comm, color, key, &sub), "MPI_Comm_split");
    MpiCommunicator c(sub);
    c.m_owned = true;
    return c;
  }

 private:
  template <class View>
  static void check_contiguous(const View& v, const char* what) {
    static_assert(View::rank == 1, "lather::MpiCommunicator: buffers are rank-1 views");
    LATHER_THROW_IF(!v.span_is_contiguous(), "lather::MpiCommunicator::", what,
                    ": the buffer must be contiguous");
  }
  void release() noexcept {
    int finalized = 0;
    MPI_Finalized(&finalized);  // freeing after MPI_Finalize is an error; MPI reclaims it then
    if (m_owned && m_comm != MPI_COMM_NULL && !finalized) MPI_Comm_free(&m_comm);
    m_owned = false;
  }

  MPI_Comm m_comm = MPI_COMM_NULL;
  bool m_owned = false;
  int m_rank = 0;
  int m_size = 1;
};

static_assert(concepts::Communicator<MpiCommunicator>);

}  // namespace lather

#endif
