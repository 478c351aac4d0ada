// SPDX-License-Identifier: Apache-2.0
// Distributed checkpoints in one HDF5 file: DDP Shampoo saved at step 3 of 7 on this many ranks
// resumes bit for bit on the same ranks, in one process and with another distribution; the file
// holds every block once with the reference's keys; missing, truncated, foreign and mismatched
// files are clear errors that change nothing. Run by CTest at 1, 2 and 4 ranks; the file of the
// 2-rank run is read back by h5dump (test hdf5_checkpoint_h5dump) and resumed by the 1- and
// 4-rank runs.
#include <lather/io/hdf5_checkpoint.hpp>

#include "dist_shampoo_utils.hpp"
#include "exec_spaces.hpp"

#include <unistd.h>

#include <filesystem>
#include <fstream>

namespace {

using lather::test::all_ranks;
using lather::test::bitwise_equal;
using lather::test::Model;
using Mpi = lather::MpiCommunicator;
namespace fs = std::filesystem;

lather::ShampooOptions options() {
  auto o = lather::test::dist_options();
  o.momentum = 0.9;
  return o;
}

// A path every rank agrees on (rank 0's temporary directory and pid), for this rank count.
fs::path shared_path(const std::string& stem) {
  long pid = static_cast<long>(getpid());
  MPI_Bcast(&pid, 1, MPI_LONG, 0, MPI_COMM_WORLD);
  return fs::temp_directory_path() /
         (stem + "_np" + std::to_string(lather::test::world_size()) + "_" + std::to_string(pid) + ".h5");
}

}  // namespace

TEST_CASE_TEMPLATE_DEFINE("HDF5 distributed checkpoint of DDP Shampoo resumes bit for bit on any rank count",
                          ExecSpace, hdf5_resume) {
  using M = typename ExecSpace::memory_space;
  using P = lather::TensorRef<float, M>;
  using Dist = lather::Shampoo<P, ExecSpace, lather::EigenRootInverse, lather::AdamGrafting, lather::ShampooPrecision<>, Mpi>;
  using Serial = lather::Shampoo<P, ExecSpace, lather::EigenRootInverse, lather::AdamGrafting>;
  const auto o = options();
  lather::ShampooDistributedOptions d;
  d.mode = lather::ShampooDistributionMode::ddp;
  constexpr int k = 3, steps = 7;
  const fs::path file = shared_path(std::string("lather_ckpt_") + ExecSpace::name());
  Model<float, M> a(lather::test::model_shapes());
  Dist full(std::span<P>(a.params), o, Mpi(MPI_COMM_WORLD), d);
  std::vector<std::vector<double>> at_k;
  lather::StateDict consolidated;
  for (int t = 0; t < steps; ++t) {
    a.set_grads(t);
    full.step(ExecSpace(), a.grads);
    if (t + 1 == k) {
      lather::save_distributed_checkpoint(file, full.state_dict(), MPI_COMM_WORLD,
                                          {"w1", "b1", "w2", "conv", "scale", "w3"});
      consolidated = full.consolidated_state_dict();
      for (const auto& p : a.params) at_k.push_back(lather::test::to_host(p));
    }
  }
  // The file is the consolidated dictionary: every block once, one process's keys.
  const lather::StateDict read = lather::load_distributed_checkpoint(file, MPI_COMM_WORLD);
  CHECK(read == consolidated);
  CHECK(read.contains("state.5.block_0.shampoo.factor_matrices.0"));
  auto resume = [&](auto& opt, Model<float, M>& m) {
    for (std::size_t i = 0; i < m.params.size(); ++i) lather::test::from_host(m.params[i], at_k[i]);
    opt.load_state_dict(lather::load_distributed_checkpoint(file, MPI_COMM_WORLD));
    for (int t = k; t < steps; ++t) {
      m.set_grads(t);
      opt.step(ExecSpace(), m.grads);
    }
    return bitwise_equal(a.params, m.params);
  };
  {
    Model<float, M> b(lather::test::model_shapes());
    Dist opt(std::span<P>(b.params), o, Mpi(MPI_COMM_WORLD), d);
    CHECK(all_ranks(resume(opt, b)));
  }
  {
    Model<float, M> b(lather::test::model_shapes());
    Serial opt(std::span<P>(b.params), o);
    CHECK(all_ranks(resume(opt, b)));
  }
  {
    Model<float, M> b(lather::test::model_shapes());
    auto other = d;
    other.num_trainers_per_group = 1;
    Dist opt(std::span<P>(b.params), o, Mpi(MPI_COMM_WORLD), other);
    CHECK(all_ranks(resume(opt, b)));
  }
  // The file the 2-rank run wrote (CTest runs it first: fixture hdf5_file) resumes here on 1 or
  // 4 ranks: the same parameters bit for bit (the uninterrupted run is rank-count independent).
  if (lather::test::world_size() != 2 && std::string(ExecSpace::name()) == "Serial") {
    const fs::path other(LATHER_TEST_H5DUMP_FILE);
    INFO("checkpoint of the 2-rank run: " << other.string());
    REQUIRE(fs::exists(other));
    Model<float, M> b(lather::test::model_shapes());
    Dist opt(std::span<P>(b.params), o, Mpi(MPI_COMM_WORLD), d);
    for (std::size_t i = 0; i < b.params.size(); ++i) lather::test::from_host(b.params[i], at_k[i]);
    opt.load_state_dict(lather::load_distributed_checkpoint(other, MPI_COMM_WORLD));
    for (int t = k; t < steps; ++t) {
      b.set_grads(t);
      opt.step(ExecSpace(), b.grads);
    }
    CHECK(all_ranks(bitwise_equal(a.params, b.params)));
  }
  // A checkpoint of other options is refused by name and changes nothing.
  {
    Model<float, M> b(lather::test::model_shapes());
    auto other = o;
    other.epsilon = 1e-5;
    Dist opt(std::span<P>(b.params), other, Mpi(MPI_COMM_WORLD), d);
    const auto before = opt.consolidated_state_dict();
    CHECK_THROWS_WITH_AS(opt.load_state_dict(lather::load_distributed_checkpoint(file, MPI_COMM_WORLD)),
                         doctest::Contains("'epsilon'"), lather::invalid_argument);
    CHECK(opt.consolidated_state_dict() == before);
  }
  // Keep the 2-rank Serial file for h5dump (tests/CMakeLists.txt); remove the others.
  MPI_Barrier(MPI_COMM_WORLD);
  if (Mpi(MPI_COMM_WORLD).rank() == 0) {
    if (lather::test::world_size() == 2 && std::string(ExecSpace::name()) == "Serial")
      fs::copy_file(file, fs::path(LATHER_TEST_H5DUMP_FILE), fs::copy_options::overwrite_existing);
    fs::remove(file);
  }
  MPI_Barrier(MPI_COMM_WORLD);
}
TEST_CASE_TEMPLATE_APPLY(hdf5_resume, lather_test_exec_spaces);

TEST_CASE("HDF5 distributed checkpoint: missing, truncated and foreign files are clear errors") {
  const fs::path dir = shared_path("lather_bad").parent_path();
  const fs::path missing = shared_path("lather_missing");
  CHECK_THROWS_WITH_AS((void)lather::load_distributed_checkpoint(missing, MPI_COMM_WORLD),
                       doctest::Contains("no such file"), lather::runtime_error);
  // Not HDF5 at all.
  const fs::path text = shared_path("lather_text");
  const fs::path good = shared_path("lather_good");
  if (Mpi(MPI_COMM_WORLD).rank() == 0) std::ofstream(text) << "not a checkpoint\n";
  MPI_Barrier(MPI_COMM_WORLD);
  CHECK_THROWS_WITH_AS((void)lather::load_distributed_checkpoint(text, MPI_COMM_WORLD),
                       doctest::Contains("not a readable HDF5 file"), lather::runtime_error);
  // A valid file cut short.
  lather::StateDict d;
  d.format = "lather.test";
  d.tensors["a.b"] = lather::StateTensor{{1000}, std::vector<double>(1000, 1.5)};
  d.tensors["c"] = lather::StateTensor{{}, std::vector<std::int64_t>{7}};
  lather::save_distributed_checkpoint(good, d, MPI_COMM_WORLD);
  CHECK(lather::load_distributed_checkpoint(good, MPI_COMM_WORLD) == d);
  const fs::path cut = shared_path("lather_cut");
  if (Mpi(MPI_COMM_WORLD).rank() == 0) {
    fs::copy_file(good, cut, fs::copy_options::overwrite_existing);
    fs::resize_file(cut, fs::file_size(good) / 2);
  }
  MPI_Barrier(MPI_COMM_WORLD);
  CHECK_THROWS_AS((void)lather::load_distributed_checkpoint(cut, MPI_COMM_WORLD), lather::runtime_error);
  // A save that cannot create its file leaves nothing half-written and says why.
  CHECK_THROWS_WITH_AS(lather::save_distributed_checkpoint(dir / "no_such_dir" / "x.h5", d, MPI_COMM_WORLD),
                       doctest::Contains("cannot create"), lather::runtime_error);
  MPI_Barrier(MPI_COMM_WORLD);
  if (Mpi(MPI_COMM_WORLD).rank() == 0)
    for (const auto& p : {text, good, cut}) fs::remove(p);
  MPI_Barrier(MPI_COMM_WORLD);
}
