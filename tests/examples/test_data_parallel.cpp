// SPDX-License-Identifier: Apache-2.0
// lather-train's data-parallel mode (run by CTest at 1, 2 and 4 ranks): each rank takes a slice
// of every global batch and the gradients are all-reduced, so the trained parameters and the loss
// curve equal one process's on the same global batches, up to the summation order of the
// all-reduce (double precision: 1e-11 relative after a few steps).
#include "data.hpp"
#include "train.hpp"

#include <lather/comm/mpi_communicator.hpp>
#include <lather/comm/serial_communicator.hpp>

#include <exec_spaces.hpp>
#include <test_utils.hpp>

#include <doctest/doctest.h>
#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <vector>

namespace {

template <class ExecSpace>
fmnist::Dataset<double, ExecSpace> synthetic(int count, std::uint64_t stream) {
  fmnist::Dataset<double, ExecSpace> d;
  d.images = decltype(d.images)("images", count, 784);
  d.labels = decltype(d.labels)("labels", count);
  auto hx = Kokkos::create_mirror_view(d.images);
  auto hy = Kokkos::create_mirror_view(d.labels);
  const auto r = lather::test::random_values(std::size_t(count) * 784, stream);
  for (int i = 0; i < count; ++i) {
    for (int j = 0; j < 784; ++j) hx(i, j) = r[std::size_t(i) * 784 + j];
    hy(i) = (7 * i + 3) % 10;
  }
  Kokkos::deep_copy(d.images, hx);
  Kokkos::deep_copy(d.labels, hy);
  return d;
}

double max_rel_diff(const std::vector<double>& a, const std::vector<double>& b) {
  double diff = 0, scale = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    diff = std::max(diff, std::abs(a[i] - b[i]));
    scale = std::max(scale, std::abs(b[i]));
  }
  return diff / scale;
}

}  // namespace

TEST_CASE_TEMPLATE_DEFINE("fashion-mnist trainer: data-parallel training equals one process", ExecSpace, dp) {
  const lather::MpiCommunicator comm(MPI_COMM_WORLD);
  const lather::SerialCommunicator serial;
  const auto train = synthetic<ExecSpace>(80, 31);
  const auto test = synthetic<ExecSpace>(30, 32);
  fmnist::TrainSettings s;
  s.model = "mlp";
  s.mlp_hidden = {16, 8};
  s.epochs = 2;
  s.batch_size = 26;  // uneven slices over 4 ranks (7, 6, 7, 6)
  s.progress = false;

  fmnist::OptimizerSettings adamw;
  adamw.name = "adamw";
  adamw.lr = 1e-2;
  fmnist::OptimizerSettings shampoo = adamw;
  shampoo.name = "shampoo";
  shampoo.precondition_frequency = 2;
  shampoo.max_preconditioner_dim = 8;  // blocked factors
  fmnist::OptimizerSettings sgd = adamw;
  sgd.name = "sgd";
  sgd.lr = 0.05;
  sgd.nesterov = true;

  for (const auto& o : {adamw, shampoo, sgd}) {
    CAPTURE(o.describe());
    fmnist::Trainer<double, ExecSpace, lather::MpiCommunicator> dist(s, comm, train, test);
    fmnist::Trainer<double, ExecSpace, lather::SerialCommunicator> single(s, serial, train, test);
    std::vector<double> pd, ps;
    const auto rd = dist.run(o, nullptr, &pd);
    const auto rs = single.run(o, nullptr, &ps);
    REQUIRE(rd.failure.empty());
    REQUIRE(rs.failure.empty());
    REQUIRE(rd.epochs.size() == rs.epochs.size());
    REQUIRE(pd.size() == ps.size());
    // Every rank's parameters equal the single process's.
    CHECK(max_rel_diff(pd, ps) < 1e-11);
    for (std::size_t e = 0; e < rs.epochs.size(); ++e) {
      CHECK(rd.epochs[e].train_loss == doctest::Approx(rs.epochs[e].train_loss).epsilon(1e-11));
      CHECK(rd.epochs[e].test_loss == doctest::Approx(rs.epochs[e].test_loss).epsilon(1e-11));
      CHECK(rd.epochs[e].test_accuracy == rs.epochs[e].test_accuracy);
      CHECK(rd.epochs[e].train_accuracy == rs.epochs[e].train_accuracy);
    }
    CHECK(rs.epochs.back().train_loss != rs.epochs[1].train_loss);
  }
}
TEST_CASE_TEMPLATE_APPLY(dp, lather_test_exec_spaces);
