// SPDX-License-Identifier: Apache-2.0
// docs/communicators.md: MpiCommunicator borrowing MPI_COMM_WORLD, a split into sub-groups, and a
// data-parallel gradient sum. Run with mpiexec -n K (the test uses 2).
#include <lather/comm/mpi_communicator.hpp>

#include <Kokkos_Core.hpp>

#include <mpi.h>

#include <cstdio>

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int failures = 0;
  Kokkos::initialize(argc, argv);
  {
    using Space = Kokkos::DefaultExecutionSpace;
    const Space space;
    int rank = 0, size = 1;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    Kokkos::View<float*, Space::memory_space> grads_flat("grads", 4);
    Kokkos::deep_copy(grads_flat, float(rank + 1));
    const int color = rank % 2, key = rank;

    // [usage]
    lather::MpiCommunicator world(MPI_COMM_WORLD);           // borrows; never frees it
    lather::MpiCommunicator node = world.split(color, key);  // owns the new communicator
    world.all_reduce_sum(space, grads_flat);                 // e.g. data-parallel gradient sums
    // [usage]

    auto h = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), grads_flat);
    const float expected = float(size * (size + 1) / 2);
    if (h(0) != expected || node.size() != (size + 1 - color) / 2) failures = 1;
    if (rank == 0)
      std::printf("sum over %d ranks: %.0f (expected %.0f); sub-group of rank 0: %d ranks\n", size, h(0), expected,
                  node.size());
  }
  Kokkos::finalize();
  MPI_Finalize();
  return failures;
}
