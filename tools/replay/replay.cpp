// SPDX-License-Identifier: Apache-2.0
// lather-replay: replays a recorded gradient stream (the conformance case format: case.json,
// initial parameters and gradients as .npy) through a lather optimizer and writes the parameter
// trajectories in the reference's layout; optionally compares them with an expected trajectory.
//
//   lather-replay CASE_DIR [--variant V] [--out DIR] [--compare DIR] [--rtol R] [--exec-space S]
//
// Users migrating from PyTorch record their own gradients in this format and prove equivalence.
// See docs/replay.md.
#include "replay.hpp"

#include <CLI/CLI.hpp>

#ifdef LATHER_REPLAY_WITH_MPI
#include <mpi.h>
#endif

namespace {

using namespace replay;
namespace fs = std::filesystem;
using json = nlohmann::json;

constexpr bool is_sharded_optimizer(const std::string& name) {
  return name == "adafactor" || name == "came" || name == "lamb" || name == "galore_adamw";
}

// MPI for the lifetime of main() when the command asks for a distributed run.
class MpiSession {
 public:
  MpiSession(int& argc, char**& argv, bool wanted) {
#ifdef LATHER_REPLAY_WITH_MPI
    if (wanted) {
      MPI_Init(&argc, &argv);
      MPI_Comm_rank(MPI_COMM_WORLD, &m_rank);
      MPI_Comm_size(MPI_COMM_WORLD, &m_size);
      m_active = true;
    }
#else
    static_cast<void>(argc);
    static_cast<void>(argv);
    static_cast<void>(wanted);
#endif
  }
  ~MpiSession() {
#ifdef LATHER_REPLAY_WITH_MPI
    if (m_active) MPI_Finalize();
#endif
  }
  MpiSession(const MpiSession&) = delete;
  MpiSession& operator=(const MpiSession&) = delete;
  [[nodiscard]] int rank() const { return m_rank; }
  [[nodiscard]] int size() const { return m_size; }
  /// Every rank leaves with rank 0's exit code.
  int agree(int code) const {
#ifdef LATHER_REPLAY_WITH_MPI
    if (m_active) MPI_Bcast(&code, 1, MPI_INT, 0, MPI_COMM_WORLD);
#endif
    return code;
  }
  /// An error on one rank would leave the others waiting in a collective.
  [[noreturn]] void abort(int code) const {
#ifdef LATHER_REPLAY_WITH_MPI
    if (m_active) MPI_Abort(MPI_COMM_WORLD, code);
#endif
    std::exit(code);
  }

 private:
  int m_rank = 0, m_size = 1;
  bool m_active = false;
};

template <class T, class ExecSpace>
Result run_case(const Case& c) {
  using M = typename ExecSpace::memory_space;
  using P = lather::TensorRef<T, M>;
  const OptimizerConfig cfg = parse_optimizer(c.optimizer);
  if (cfg.name == "sgd")
    return run<T, ExecSpace>(c, [&](std::vector<P>& p) { return lather::SGD<P, ExecSpace>(p, cfg.sgd); });
  if (cfg.name == "adagrad")
    return run<T, ExecSpace>(c, [&](std::vector<P>& p) { return lather::Adagrad<P, ExecSpace>(p, cfg.adagrad); });
  if (cfg.name == "rmsprop")
    return run<T, ExecSpace>(c, [&](std::vector<P>& p) { return lather::RMSprop<P, ExecSpace>(p, cfg.rmsprop); });
  if (cfg.name == "adam")
    return run<T, ExecSpace>(c, [&](std::vector<P>& p) { return lather::Adam<P, ExecSpace>(p, cfg.adam); });
  if (cfg.name == "adamw")
    return run<T, ExecSpace>(c, [&](std::vector<P>& p) { return lather::AdamW<P, ExecSpace>(p, cfg.adamw); });
  const lather::ShampooOptions& s = cfg.shampoo;
  const json& graft = cfg.grafting;
  const json& root = cfg.root_inv;
  const json& pre = cfg.preconditioner;
  const std::string& pre_type = cfg.preconditioner_type;
  constexpr bool single = std::is_same_v<T, float>;
  if (pre_type == "eigenvalue_corrected" || pre_type == "eigendecomposed" || pre_type == "eigendecomposed_kl")
    return run_eigen_family(c, s, pre, graft, single, ExecSpace::name());
  if (pre_type != "root_inv") return run_other_family(c, s, pre, root, graft, single, ExecSpace::name());
  check_keys(pre, {"type"}, "optimizer.preconditioner");
  const std::string type = root.value("type", "eigh");
  if (type == "eigh") {
    check_keys(root, {"type"}, "optimizer.root_inv");
    return run_shampoo<T, ExecSpace>(c, s, lather::EigenRootInverse{}, graft);
  }
  if (type == "coupled_newton") {
    check_keys(root, {"type", "max_iterations", "tolerance"}, "optimizer.root_inv");
    lather::CoupledNewtonRootInverse r;
    r.max_iterations = whole(root, "max_iterations", 100, "optimizer.root_inv");
    r.tolerance = number(root, "tolerance", 1e-6);
    return run_shampoo<T, ExecSpace>(c, s, r, graft);
  }
  fail("optimizer.root_inv: unknown type '" + type + "' (eigh, coupled_newton)");
}

void write_npy(const fs::path& path, const xt::xarray<double>& a, bool as_float) {
  if (as_float) xt::dump_npy(path.string(), xt::xarray<float>(xt::cast<float>(a)));
  else xt::dump_npy(path.string(), a);
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"lather-replay: replay a recorded gradient stream through a lather optimizer"};
  std::string case_dir, variant, out_dir, compare_dir, space = "default";
  double rtol = -1;
  app.add_option("CASE_DIR", case_dir, "conformance case directory (with case.json)")->required();
  app.add_option("--variant", variant, "float64_fp64scalars, float64 or float32 (default: the case's first)");
  app.add_option("--out", out_dir, "write params_<i>.npy here (default: no output files)");
  app.add_option("--compare", compare_dir, "compare with the params_<i>.npy in this directory "
                                           "(default: CASE_DIR/out/<variant> when it exists)");
  app.add_option("--rtol", rtol, "fail (exit 1) when the largest relative difference exceeds this");
  app.add_option("--exec-space", space, "default, serial or openmp (those enabled in Kokkos)");
  ShardFlags shard;
  auto* dist = app.add_option_group("distributed", "Under mpiexec: split Adafactor / CAME / LAMB / GaLore parameters");
  dist->add_option("--tp", shard.tp, "tensor-parallel group size (consecutive ranks)")->check(CLI::PositiveNumber);
  dist->add_option("--tp-dim", shard.tp_dim, "split dimension: row (dim 0) or col (last dim)")
      ->check(CLI::IsMember({"row", "col"}));
  dist->add_flag("--zero", shard.zero, "ZeRO: cut each (TP-local) parameter into padded chunks over the other ranks");
  ShampooDistFlags sd;
  auto* sdist = app.add_option_group("distributed Shampoo", "Under mpiexec: Shampoo's DDP, sharded (FSDP) and HSDP modes");
  sdist->add_option("--distributed", sd.mode, "ddp, sharded or hsdp")->check(CLI::IsMember({"ddp", "sharded", "hsdp"}));
  sdist->add_option("--comm-dtype", sd.dtype, "parameter (default), float32, bfloat16 or float16")
      ->check(CLI::IsMember({"parameter", "float32", "bfloat16", "float16"}));
  sdist->add_option("--trainers-per-group", sd.trainers, "num_trainers_per_group (-1: all ranks)");
  sdist->add_flag("--communicate-params", sd.communicate_params, "gather parameters instead of updates");
  sdist->add_option("--shard-size", sd.shard_size, "hsdp: ranks per shard group (consecutive; default all)")
      ->check(CLI::NonNegativeNumber);
  CLI11_PARSE(app, argc, argv);

  const MpiSession mpi(argc, argv, shard.distributed() || sd.distributed());
  Kokkos::ScopeGuard guard(argc, argv);
  const int code = [&]() -> int {
  try {
    const Case c = read_case(case_dir);
    if (variant.empty()) variant = c.variants.front();
    if (variant != "float64_fp64scalars" && variant != "float64" && variant != "float32")
      fail("--variant must be float64_fp64scalars, float64 or float32, got '" + variant + "'");
    const bool single = variant == "float32";
    Result r;
    const OptimizerConfig cfg = parse_optimizer(c.optimizer);
    if (shard.distributed() && !is_sharded_optimizer(cfg.name))
      fail("--tp / --zero apply to adafactor, came, lamb and galore_adamw, not '" + cfg.name + "'");
    auto dispatch = [&](auto exec) {
      using E = decltype(exec);
      r = single ? run_case<float, E>(c) : run_case<double, E>(c);
    };
    if (sd.distributed()) {
      if (shard.distributed()) fail("--distributed (Shampoo) and --tp / --zero exclude each other");
      if (space != "default") fail("--distributed runs on the default execution space; drop --exec-space");
      r = run_shampoo_distributed(c, cfg, single, sd);
    } else if (is_sharded_optimizer(cfg.name)) {
      // on_space() takes Kokkos' names (ExecSpace::name()).
      const std::string kokkos_name = space == "default"  ? Kokkos::DefaultExecutionSpace::name()
                                      : space == "serial" ? "Serial"
                                      : space == "openmp" ? "OpenMP"
                                                          : space;
      r = run_sharded(c, cfg, single, kokkos_name, shard);
    } else if (space == "default") dispatch(Kokkos::DefaultExecutionSpace());
#ifdef KOKKOS_ENABLE_SERIAL
    else if (space == "serial") dispatch(Kokkos::Serial());
#endif
#ifdef KOKKOS_ENABLE_OPENMP
    else if (space == "openmp") dispatch(Kokkos::OpenMP());
#endif
    else fail("--exec-space '" + space + "' is not enabled in this Kokkos build");

    if (mpi.rank() != 0) return 0;  // every rank holds the whole trajectories; rank 0 reports
    if (!out_dir.empty()) {
      fs::create_directories(out_dir);
      for (std::size_t i = 0; i < r.trajectories.size(); ++i)
        write_npy(fs::path(out_dir) / ("params_" + std::to_string(i) + ".npy"), r.trajectories[i], single);
      std::printf("wrote %zu trajectories to %s\n", r.trajectories.size(), out_dir.c_str());
    }
    fs::path expected_dir = compare_dir.empty() ? fs::path(case_dir) / "out" / variant : fs::path(compare_dir);
    if (!fs::exists(expected_dir)) {
      if (!compare_dir.empty()) fail("--compare directory " + compare_dir + " does not exist");
      std::printf("no expected trajectory at %s: nothing compared\n", expected_dir.c_str());
      return 0;
    }
    double worst = 0;
    for (std::size_t i = 0; i < r.trajectories.size(); ++i) {
      const auto expected = load<double>(expected_dir / ("params_" + std::to_string(i) + ".npy"));
      if (expected.shape() != r.trajectories[i].shape()) fail("expected params_" + std::to_string(i) + ".npy has a different shape");
      // Relative to the trajectory's scale, so entries near zero do not dominate.
      const double scale = std::max(1e-30, xt::amax(xt::abs(expected))());
      const double diff = xt::amax(xt::abs(expected - r.trajectories[i]))() / scale;
      std::printf("param %zu: largest difference / max|expected| = %.3e\n", i, diff);
      worst = std::max(worst, diff);
    }
    std::printf("%s %s: largest relative difference %.3e\n", c.dir.filename().c_str(), variant.c_str(), worst);
    if (rtol >= 0 && !(worst <= rtol)) {
      std::printf("FAILED: above --rtol %.1e\n", rtol);
      return 1;
    }
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "lather-replay: %s\n", e.what());
    if (mpi.size() > 1) mpi.abort(2);
    return 2;
  }
  }();
  return mpi.agree(code);
}
