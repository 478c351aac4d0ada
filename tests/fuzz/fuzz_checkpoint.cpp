// SPDX-License-Identifier: Apache-2.0
// libFuzzer target: the checkpoint reader (include/lather/io/checkpoint.hpp). Every input is
// parsed twice: as a file (CRC checked) and without the CRC comparison, so that mutated contents
// reach the structure checks and then load_state_dict of a small Adam and a small Shampoo. A
// rejected load must leave the optimizer's state_dict() unchanged; anything but
// lather::invalid_argument (and lather::runtime_error from a step) is a failure.
//
// LATHER_FUZZ_WRITE_SEEDS=DIR fuzz_checkpoint writes the valid seed checkpoints of these two
// optimizers into DIR and exits (how tests/fuzz/corpus/fuzz_checkpoint/ was made).
#include <lather/io/checkpoint.hpp>
#include <lather/optimizers/adam.hpp>
#include <lather/optimizers/shampoo.hpp>

#include "fuzz_common.hpp"

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <span>
#include <string>
#include <vector>

namespace {

using E = Kokkos::Serial;
using P = lather::TensorRef<float, Kokkos::HostSpace>;
using Adam = lather::Adam<P, E>;
using Shampoo = lather::Shampoo<P, E, lather::EigenRootInverse, lather::AdamGrafting>;

struct Params {
  Kokkos::View<float**, Kokkos::HostSpace> w{"w", 3, 2}, gw{"gw", 3, 2};
  Kokkos::View<float*, Kokkos::HostSpace> b{"b", 2}, gb{"gb", 2};
  std::vector<P> params{lather::tensor_ref(w), lather::tensor_ref(b)};
  std::vector<P> grads{lather::tensor_ref(gw), lather::tensor_ref(gb)};
  Params() {
    for (int k = 0; k < 6; ++k) w.data()[k] = 0.1f * static_cast<float>(k) - 0.2f;
    b(0) = 0.5f;
    b(1) = -0.5f;
  }
  void grads_for(int t) {
    for (int k = 0; k < 6; ++k) gw.data()[k] = 0.01f * static_cast<float>(t * k % 7) - 0.03f;
    gb(0) = 0.02f * static_cast<float>(t);
    gb(1) = -0.01f;
  }
};

Adam make_adam(Params& p) { return Adam(p.params, lather::AdamOptions{.lr = 0.01, .amsgrad = true}); }
Shampoo make_shampoo(Params& p) {
  return Shampoo(p.params,
                 lather::ShampooOptions{.lr = 0.01, .betas = {0.9, 0.999}, .epsilon = 1e-6,
                                        .precondition_frequency = 1, .start_preconditioning_step = 1},
                 {}, {.epsilon = 1e-8});
}

// A rejected load changes nothing; an accepted one is followed by a step, which may refuse the
// restored state with lather's own errors but must not crash.
template <class Opt>
void try_load(Opt& opt, Params& p, const lather::StateDict& d) {
  const lather::StateDict before = opt.state_dict();
  try {
    opt.load_state_dict(d);
  } catch (const lather::invalid_argument&) {
    if (!(opt.state_dict() == before)) lather::fuzz::invariant_failed("a rejected load_state_dict changed the state");
    return;
  }
  p.grads_for(1);
  try {
    opt.step(E(), p.grads);
  } catch (const lather::invalid_argument&) {
  } catch (const lather::runtime_error&) {
  }
}

void write_seeds(const std::filesystem::path& dir) {
  std::filesystem::create_directories(dir);
  auto save = [&](const char* name, const lather::StateDict& d) { lather::save_checkpoint(dir / name, d); };
  Params pa, ps;
  auto adam = make_adam(pa);
  auto shampoo = make_shampoo(ps);
  save("adam_fresh.ckpt", adam.state_dict());
  save("shampoo_fresh.ckpt", shampoo.state_dict());
  for (int t = 1; t <= 2; ++t) {
    pa.grads_for(t);
    ps.grads_for(t);
    adam.step(E(), pa.grads);
    shampoo.step(E(), ps.grads);
  }
  save("adam_step2.ckpt", adam.state_dict());
  save("shampoo_step2.ckpt", shampoo.state_dict());
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  lather::fuzz::init_kokkos();
  if (const char* dir = std::getenv("LATHER_FUZZ_WRITE_SEEDS")) {
    write_seeds(dir);
    std::exit(0);
  }
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::span<const std::byte> bytes(reinterpret_cast<const std::byte*>(data), size);
  try {
    (void)lather::deserialize_state_dict(bytes, "fuzz.ckpt");
  } catch (const lather::invalid_argument&) {
  }
  lather::StateDict d;
  try {
    d = lather::impl::parse_checkpoint(bytes, "fuzz.ckpt", false);
  } catch (const lather::invalid_argument&) {
    return 0;
  }
  // What parses writes back to the same bytes, up to the CRC.
  const auto again = lather::serialize_state_dict(d);
  if (again.size() != size || !std::equal(again.begin(), again.end() - 4, bytes.begin()))
    lather::fuzz::invariant_failed("serialize(parse(x)) differs from x");
  Params pa, ps;
  auto adam = make_adam(pa);
  try_load(adam, pa, d);
  auto shampoo = make_shampoo(ps);
  try_load(shampoo, ps, d);
  return 0;
}
