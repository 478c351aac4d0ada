// SPDX-License-Identifier: Apache-2.0
// MpiCommunicator collectives on every execution space, run by CTest at 1, 2 and 4 ranks, plus a
// data-parallel step: gradients averaged with all_reduce_sum give every rank the parameters that
// one process computes from the global mean gradient.
#include <lather/comm/mpi_communicator.hpp>
#include <lather/comm/serial_communicator.hpp>
#include <lather/optimizers/adam.hpp>

#include <Kokkos_Core.hpp>

#include <doctest/doctest.h>

#include "exec_spaces.hpp"
#include "test_utils.hpp"

#include <mpi.h>

#include <cstdint>
#include <vector>

namespace {

template <class T, class ExecSpace>
void impl_test_collectives() {
  using M = typename ExecSpace::memory_space;
  lather::MpiCommunicator comm(MPI_COMM_WORLD);
  int world_rank = 0, world_size = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &world_rank);
  MPI_Comm_size(MPI_COMM_WORLD, &world_size);
  REQUIRE(comm.rank() == world_rank);
  REQUIRE(comm.size() == world_size);
  const int r = comm.rank(), n = comm.size();
  const ExecSpace space;

  // all_reduce_sum: v[i] = r + 1 + i  ->  n(n+1)/2 + n*i
  Kokkos::View<T*, M> v("v", 7);
  Kokkos::parallel_for(Kokkos::RangePolicy<ExecSpace>(space, 0, 7), KOKKOS_LAMBDA(int i) { v(i) = T(r + 1 + i); });
  comm.all_reduce_sum(space, v);
  auto hv = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), v);
  for (int i = 0; i < 7; ++i) CHECK(hv(i) == T(n * (n + 1) / 2 + n * i));

  // broadcast from the last rank
  Kokkos::View<T*, M> b("b", 3);
  Kokkos::deep_copy(b, T(r));
  comm.broadcast(space, b, n - 1);
  auto hb = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), b);
  for (int i = 0; i < 3; ++i) CHECK(hb(i) == T(n - 1));
  CHECK_THROWS_AS(comm.broadcast(space, b, n), lather::invalid_argument);

  // all_gather into one buffer, rank-major
  Kokkos::View<T*, M> in("in", 3);
  Kokkos::View<T*, M> out("out", 3 * static_cast<std::size_t>(n));
  Kokkos::parallel_for(Kokkos::RangePolicy<ExecSpace>(space, 0, 3), KOKKOS_LAMBDA(int k) { in(k) = T(10 * r + k); });
  comm.all_gather(space, Kokkos::View<const T*, M>(in), out);
  auto ho = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), out);
  for (int q = 0; q < n; ++q)
    for (int k = 0; k < 3; ++k) CHECK(ho(3 * q + k) == T(10 * q + k));
  Kokkos::View<T*, M> too_small("too_small", 2);
  CHECK_THROWS_AS(comm.all_gather(space, in, too_small), lather::invalid_argument);

  // sub-groups: even and odd ranks, ordered by descending world rank
  lather::MpiCommunicator sub = comm.split(r % 2, -r);
  const int sub_size = (n + 1 - r % 2) / 2;
  CHECK(sub.size() == sub_size);
  Kokkos::View<T*, M> one("one", 1);
  Kokkos::deep_copy(one, T(1));
  sub.all_reduce_sum(space, one);
  T h1 = 0;
  Kokkos::deep_copy(h1, Kokkos::subview(one, 0));
  CHECK(h1 == T(sub_size));
  // Rank order by key: the highest world rank of the color is sub-rank 0.
  const int highest_same_color = (n - 1) - (((n - 1) % 2) != (r % 2) ? 1 : 0);
  CHECK(sub.rank() == (highest_same_color - r) / 2);
  lather::MpiCommunicator moved = std::move(sub);
  CHECK(moved.size() == sub_size);
  comm.barrier();
}

// Data-parallel Adam: each rank owns a slice of the batch; averaging the gradients with
// all_reduce_sum makes every rank's step equal to the single-process step on the mean gradient.
template <class ExecSpace>
void impl_test_data_parallel_step() {
  using M = typename ExecSpace::memory_space;
  using P = lather::TensorRef<double, M>;
  lather::MpiCommunicator comm(MPI_COMM_WORLD);
  const int r = comm.rank(), n = comm.size();
  Kokkos::View<double*, M> w("w", 10), w_ref("w_ref", 10);
  const auto init = lather::test::random_values(10, 1);
  lather::test::from_host(lather::tensor_ref(w), init);
  lather::test::from_host(lather::tensor_ref(w_ref), init);
  std::vector<P> params{lather::tensor_ref(w)}, ref_params{lather::tensor_ref(w_ref)};
  lather::Adam<P, ExecSpace> dist(params, {.lr = 0.05});
  lather::Adam<P, ExecSpace> single(ref_params, {.lr = 0.05});
  Kokkos::View<double*, M> g("g", 10), g_mean("g_mean", 10);
  for (int t = 0; t < 5; ++t) {
    // Per-rank gradient: a different sample per rank; the mean is computed on the host as well.
    std::vector<double> mean(10, 0.0);
    for (int q = 0; q < n; ++q) {
      const auto gq = lather::test::random_values(10, 1000 * t + q);
      for (int i = 0; i < 10; ++i) mean[i] += gq[i];
      if (q == r) lather::test::from_host(lather::tensor_ref(g), gq);
    }
    for (auto& x : mean) x /= n;
    comm.all_reduce_sum(ExecSpace(), g);
    const double inv_n = 1.0 / n;
    Kokkos::parallel_for(Kokkos::RangePolicy<ExecSpace>(0, 10), KOKKOS_LAMBDA(int i) { g(i) *= inv_n; });
    dist.step(ExecSpace(), std::vector<P>{lather::tensor_ref(g)});
    lather::test::from_host(lather::tensor_ref(g_mean), mean);
    single.step(ExecSpace(), std::vector<P>{lather::tensor_ref(g_mean)});
  }
  // Summation order differs between MPI's reduction and the host loop: a few ulps.
  lather::test::all_close(lather::test::to_host(params[0]), lather::test::to_host(ref_params[0]), 1e-12, 1e-14,
                          "data-parallel Adam vs single process");
  // And every rank holds exactly the same parameters.
  Kokkos::View<double*, M> all("all", 10 * static_cast<std::size_t>(n));
  comm.all_gather(ExecSpace(), w, all);
  auto ha = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), all);
  for (int q = 1; q < n; ++q)
    for (int i = 0; i < 10; ++i) CHECK(ha(10 * q + i) == ha(i));
}

}  // namespace

TEST_CASE_TEMPLATE_DEFINE("mpi communicator: collectives (double)", ExecSpace, mpi_double) {
  impl_test_collectives<double, ExecSpace>();
}
TEST_CASE_TEMPLATE_APPLY(mpi_double, lather_test_exec_spaces);

TEST_CASE_TEMPLATE_DEFINE("mpi communicator: collectives (float, int64)", ExecSpace, mpi_other) {
  impl_test_collectives<float, ExecSpace>();
  impl_test_collectives<std::int64_t, ExecSpace>();
}
TEST_CASE_TEMPLATE_APPLY(mpi_other, lather_test_exec_spaces);

TEST_CASE_TEMPLATE_DEFINE("mpi communicator: data-parallel Adam equals single process", ExecSpace, mpi_ddp) {
  impl_test_data_parallel_step<ExecSpace>();
}
TEST_CASE_TEMPLATE_APPLY(mpi_ddp, lather_test_exec_spaces);
