// SPDX-License-Identifier: Apache-2.0
/// \file
/// \brief SerialCommunicator: the single-rank default; every collective is a no-op or a copy.
#ifndef LATHER_COMM_SERIAL_COMMUNICATOR_HPP
#define LATHER_COMM_SERIAL_COMMUNICATOR_HPP

#include <lather/concepts/communicator.hpp>
#include <lather/error.hpp>

#include <Kokkos_Core.hpp>

namespace lather {

/// \brief A group of one rank. Selected by default, so single-process code pays nothing.
class SerialCommunicator {
 public:
  [[nodiscard]] int rank() const noexcept { return 0; }
  [[nodiscard]] int size() const noexcept { return 1; }
  void barrier() const noexcept {}

  /// No-op: the sum over one rank is the value itself. Does not fence.
  template <class ExecSpace, class View>
  void all_reduce_sum(const ExecSpace&, const View&) const noexcept {}

  /// No-op. Does not fence.
  template <class ExecSpace, class View>
  void broadcast(const ExecSpace&, const View&, int root) const {
    LATHER_THROW_IF(root != 0, "lather::SerialCommunicator::broadcast: root ", root,
                    " is not a rank of a one-rank group (use 0)");
  }

  /// Copies `in` into `out` on `space` (asynchronously with respect to the host).
  template <class ExecSpace, class InView, class OutView>
  void all_gather(const ExecSpace& space, const InView& in, const OutView& out) const {
    LATHER_THROW_IF(out.extent(0) != in.extent(0),
                    "lather::SerialCommunicator::all_gather: output has ", out.extent(0),
                    " elements, expected ", in.extent(0), " (size() x input size)");
    Kokkos::deep_copy(space, out, in);
  }

  /// A one-rank group splits into itself.
  [[nodiscard]] SerialCommunicator split(int /*color*/, int /*key*/) const noexcept { return {}; }
};

static_assert(concepts::Communicator<SerialCommunicator>);

}  // namespace lather

#endif
