// SPDX-License-Identifier: Apache-2.0
// docs/reliability.md: a NaN in one gradient with NonFinitePolicy::skip_parameter leaves that
// parameter (and its state) as it was, steps the others, and counts the skip.
#include <lather/lather.hpp>

#include <Kokkos_Core.hpp>

#include <cmath>
#include <cstdio>
#include <limits>
#include <vector>

int main(int argc, char** argv) {
  Kokkos::ScopeGuard guard(argc, argv);
  using P = lather::TensorRef<double, Kokkos::HostSpace>;
  std::vector<double> w(4, 1.0), b(2, 1.0), gw(4, 0.5), gb(2, 0.5);
  std::vector<P> params{P(w.data(), {2, 2}), P(b.data(), {2})};
  std::vector<P> grads{P(gw.data(), {2, 2}), P(gb.data(), {2})};
  lather::Adam<P> opt(params, {.lr = 0.1}, {"fc.weight", "fc.bias"});
  gb[1] = std::numeric_limits<double>::quiet_NaN();  // a bad batch for the bias

  // [policy]
  opt.set_nonfinite_policy(lather::NonFinitePolicy::skip_parameter);
  opt.step(grads);  // the NaN in grads[1] leaves parameter 1 and its state as they were
  std::printf("skipped %lld step(s) of '%s'\n", static_cast<long long>(opt.nonfinite_skips(1)),
              opt.param_name(1).c_str());
  // [policy]

  std::printf("weight %.4f (stepped), bias %.4f (unchanged), bias steps %lld\n", w[0], b[0],
              static_cast<long long>(opt.step_count(1)));
  const bool ok = w[0] < 1.0 && b[0] == 1.0 && b[1] == 1.0 && opt.nonfinite_skips(1) == 1 && opt.step_count(1) == 0 &&
                  opt.step_count(0) == 1;
  return ok ? 0 : 1;
}
