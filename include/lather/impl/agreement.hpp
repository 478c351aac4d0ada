// SPDX-License-Identifier: Apache-2.0
/// \file
/// \brief Checks that every rank of a communicator holds the same signature (shapes, options):
/// two small all-reduces, and the same error on every rank instead of a hang or a silent
/// divergence later.
#ifndef LATHER_IMPL_AGREEMENT_HPP
#define LATHER_IMPL_AGREEMENT_HPP

#include <lather/error.hpp>

#include <Kokkos_Core.hpp>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <functional>
#include <string>
#include <vector>

namespace lather::impl {

/// Throws lather::invalid_argument on every rank when the ranks' `sig` differ, naming the first
/// differing entry with `describe(k)`. Collective over `comm`.
template <class Comm>
void check_ranks_agree(const Comm& comm, const std::vector<double>& sig,
                       const std::function<std::string(std::size_t)>& describe, const char* who) {
  const Kokkos::DefaultHostExecutionSpace host;
  const double ranks = static_cast<double>(comm.size());
  // Same length everywhere first (else the next all-reduce would mismatch).
  Kokkos::View<double*, Kokkos::HostSpace> len("lather::agreement_len", 2);
  len(0) = static_cast<double>(sig.size());
  len(1) = len(0) * len(0);
  comm.all_reduce_sum(host, len);
  LATHER_THROW_IF(len(0) * len(0) != len(1) * ranks, "lather::", who,
                  ": the ranks were constructed with different numbers of parameters, parameter ranks or options; "
                  "every rank must pass the same parameter list and options");
  Kokkos::View<double*, Kokkos::HostSpace> v("lather::agreement", 2 * sig.size());
  for (std::size_t k = 0; k < sig.size(); ++k) {
    v(2 * k) = sig[k];
    v(2 * k + 1) = sig[k] * sig[k];
  }
  comm.all_reduce_sum(host, v);
  for (std::size_t k = 0; k < sig.size(); ++k) {
    // All equal <=> (sum x)^2 == n sum x^2 (Cauchy-Schwarz), with a relative tolerance for the
    // rounding of the sums.
    const double lhs = v(2 * k) * v(2 * k), rhs = ranks * v(2 * k + 1);
    LATHER_THROW_IF(std::abs(lhs - rhs) > 1e-12 * std::max(1.0, std::abs(rhs)), "lather::", who,
                    ": the ranks disagree on ", describe(k),
                    "; every rank must construct the optimizer with the same shapes and options");
  }
}

}  // namespace lather::impl

#endif
