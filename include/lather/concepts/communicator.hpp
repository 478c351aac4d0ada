// SPDX-License-Identifier: Apache-2.0
/// \file
/// \brief `concepts::Communicator`: the collectives the distributed optimizers need.
#ifndef LATHER_CONCEPTS_COMMUNICATOR_HPP
#define LATHER_CONCEPTS_COMMUNICATOR_HPP

#include <Kokkos_Core.hpp>

#include <concepts>

namespace lather::concepts {

/// \brief A communicator over a group of ranks.
///
/// Buffers are contiguous rank-1 Kokkos Views; every collective takes the execution space whose
/// queued work produced (or will consume) the buffer first, and fences only that instance.
/// - `rank()`, `size()`: this rank and the group size.
/// - `all_reduce_sum(space, view)`: in place, element-wise sum over the group.
/// - `broadcast(space, view, root)`: root's values to every rank.
/// - `all_gather(space, in, out)`: `out` (size x in.extent(0)) holds every rank's `in`, rank-major.
/// - `barrier()`.
/// - `split(color, key)`: the sub-group of ranks with the same color, ordered by key.
template <class C>
concept Communicator =
    std::movable<C> &&
    requires(const C& c, Kokkos::DefaultHostExecutionSpace space,
             Kokkos::View<double*, Kokkos::HostSpace> v, Kokkos::View<const double*, Kokkos::HostSpace> cv) {
      { c.rank() } -> std::convertible_to<int>;
      { c.size() } -> std::convertible_to<int>;
      c.barrier();
      c.all_reduce_sum(space, v);
      c.broadcast(space, v, 0);
      c.all_gather(space, cv, v);
      { c.split(0, 0) } -> std::same_as<C>;
    };

}  // namespace lather::concepts

#endif
