// SPDX-License-Identifier: Apache-2.0
// DDP for the Shampoo family: eigendecomposed Shampoo, eigenvalue-corrected Shampoo (eigh) and
// SOAP (QR), Muon and sign descent are bitwise identical to one process with and without
// communicate_params, as the reference tests its DDP distributor for RootInv, Eigendecomposed,
// EigenvalueCorrected and SOAP; their consolidated state dictionaries equal one process's. Run
// by CTest at 1, 2, 3 and 4 ranks.
#include "dist_shampoo_utils.hpp"
#include "exec_spaces.hpp"

namespace {

using lather::test::all_ranks;
using lather::test::bitwise_equal;
using lather::test::Model;
using Mpi = lather::MpiCommunicator;

template <class ExecSpace, class Preconditioner, class Grafting = lather::NoGrafting>
void check(const lather::ShampooOptions& o, const std::vector<std::vector<std::int64_t>>& shapes, bool has_roots,
           Preconditioner pre = {}, Grafting graft = {}) {
  using M = typename ExecSpace::memory_space;
  using P = lather::TensorRef<float, M>;
  for (bool params : {false, true}) {
    lather::ShampooDistributedOptions d;
    d.mode = lather::ShampooDistributionMode::ddp;
    d.communicate_params = params;
    INFO("communicate_params " << params);
    Model<float, M> a(shapes), b(shapes);
    lather::Shampoo<P, ExecSpace, Preconditioner, Grafting> serial(std::span<P>(a.params), o, pre, graft);
    lather::Shampoo<P, ExecSpace, Preconditioner, Grafting, lather::ShampooPrecision<>, Mpi> dist(
        std::span<P>(b.params), o, Mpi(MPI_COMM_WORLD), d, pre, graft);
    bool same = true;
    std::int64_t serial_roots = 0, dist_roots = 0;  // eigenbasis refreshes run side by side
    for (int t = 0; t < 6; ++t) {
      a.set_grads(t);
      b.set_grads(t);
      serial.step(ExecSpace(), a.grads);
      dist.step(ExecSpace(), b.grads);
      serial_roots += serial.last_step_info().roots_side_by_side;
      dist_roots += dist.last_step_info().roots_side_by_side;
      same = same && bitwise_equal(a.params, b.params);
    }
    CHECK(all_ranks(same));
    // Each block's refresh on its owner only, side by side on several threads as in one process.
    CHECK(lather::test::sum_ranks(dist_roots) == serial_roots);
    CHECK((serial_roots > 0) == (has_roots && lather::test::roots_side_by_side_here<ExecSpace>()));
    CHECK(dist.consolidated_state_dict() == serial.state_dict());
  }
}

}  // namespace

TEST_CASE_TEMPLATE_DEFINE("DDP Shampoo family is bitwise identical to one process", ExecSpace, ddp_family) {
  const auto o = lather::test::dist_options();
  const auto shapes = lather::test::model_shapes();
  check<ExecSpace, lather::EigendecomposedShampoo<>>(o, shapes, true, {}, lather::AdamGrafting{});
  check<ExecSpace, lather::EigenvalueCorrectedShampoo<>>(o, shapes, true);
  check<ExecSpace, lather::SOAP>(o, shapes, true, {}, lather::AdamGrafting{});
  check<ExecSpace, lather::KLShampoo<>>(o, shapes, true);
  check<ExecSpace, lather::SignDescent>(o, shapes, false);
  // Muon orthogonalizes matrices: the matrices in one group, the rest never preconditioned.
  const std::vector<std::vector<std::int64_t>> matrices{{10, 6}, {13, 5}, {9, 9}, {4, 12}};
  auto m = o;
  m.max_preconditioner_dim = 8;
  check<ExecSpace, lather::Muon>(m, matrices, false);
}
TEST_CASE_TEMPLATE_APPLY(ddp_family, lather_test_exec_spaces);
