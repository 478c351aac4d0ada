// SPDX-License-Identifier: Apache-2.0
// libFuzzer target: lather-replay's case.json reader and option parsing (tools/replay/replay.hpp
// parse_case, parse_optimizer), up to constructing the optimizer on a small parameter so that
// lather validates the options. Only the tool's errors (std::runtime_error) and
// lather::invalid_argument are expected; anything else is a failure.
#include "replay.hpp"

#include "fuzz_common.hpp"

#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>

namespace {

using E = Kokkos::Serial;
using P = lather::TensorRef<double, Kokkos::HostSpace>;

void construct(const replay::OptimizerConfig& cfg) {
  Kokkos::View<double**, Kokkos::HostSpace> w("w", 2, 3);
  std::vector<P> params{lather::tensor_ref(w)};
  if (cfg.name == "sgd") (void)lather::SGD<P, E>(params, cfg.sgd);
  else if (cfg.name == "adagrad") (void)lather::Adagrad<P, E>(params, cfg.adagrad);
  else if (cfg.name == "rmsprop") (void)lather::RMSprop<P, E>(params, cfg.rmsprop);
  else if (cfg.name == "adam") (void)lather::Adam<P, E>(params, cfg.adam);
  else if (cfg.name == "adamw") (void)lather::AdamW<P, E>(params, cfg.adamw);
  else if (cfg.preconditioner_type == "root_inv") {
    const std::string root = cfg.root_inv.value("type", "eigh");
    if (root == "coupled_newton") {
      lather::CoupledNewtonRootInverse r;
      r.max_iterations = replay::whole(cfg.root_inv, "max_iterations", 100, "optimizer.root_inv");
      r.tolerance = replay::number(cfg.root_inv, "tolerance", 1e-6);
      (void)lather::Shampoo<P, E, lather::CoupledNewtonRootInverse, lather::NoGrafting>(params, cfg.shampoo, r, {});
    } else {
      (void)lather::Shampoo<P, E, lather::EigenRootInverse, lather::NoGrafting>(params, cfg.shampoo, {}, {});
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  lather::fuzz::init_kokkos();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  try {
    const replay::Case c = replay::parse_case(text, "fuzz_case", "fuzz_case/case.json");
    construct(replay::parse_optimizer(c.optimizer));
  } catch (const std::runtime_error&) {
  } catch (const lather::invalid_argument&) {
  }
  return 0;
}
