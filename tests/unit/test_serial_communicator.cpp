// SPDX-License-Identifier: Apache-2.0
// SerialCommunicator: the one-rank default behaves as a group of one.
#include <lather/comm/serial_communicator.hpp>

#include <Kokkos_Core.hpp>

#include <doctest/doctest.h>

#include "exec_spaces.hpp"

template <class ExecSpace>
void impl_test_serial_communicator() {
  using M = typename ExecSpace::memory_space;
  lather::SerialCommunicator comm;
  CHECK(comm.rank() == 0);
  CHECK(comm.size() == 1);
  Kokkos::View<double*, M> v("v", 4), out("out", 4);
  Kokkos::deep_copy(v, 2.5);
  comm.all_reduce_sum(ExecSpace(), v);
  comm.broadcast(ExecSpace(), v, 0);
  CHECK_THROWS_AS(comm.broadcast(ExecSpace(), v, 1), lather::invalid_argument);
  comm.all_gather(ExecSpace(), v, out);
  ExecSpace().fence();
  auto h = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), out);
  for (int i = 0; i < 4; ++i) CHECK(h(i) == 2.5);
  Kokkos::View<double*, M> wrong("wrong", 3);
  CHECK_THROWS_AS(comm.all_gather(ExecSpace(), v, wrong), lather::invalid_argument);
  CHECK(comm.split(3, 0).size() == 1);
}

TEST_CASE_TEMPLATE_DEFINE("serial communicator: a group of one", ExecSpace, serial_comm) {
  impl_test_serial_communicator<ExecSpace>();
}
TEST_CASE_TEMPLATE_APPLY(serial_comm, lather_test_exec_spaces);
