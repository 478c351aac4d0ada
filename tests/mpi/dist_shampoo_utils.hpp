// SPDX-License-Identifier: Apache-2.0
// Shared set-up of the distributed Shampoo tests: a model of parameters whose blocks have many
// different sizes, seeded gradients identical on every rank, and bitwise comparisons.
#ifndef LATHER_TEST_DIST_SHAMPOO_UTILS_HPP
#define LATHER_TEST_DIST_SHAMPOO_UTILS_HPP

#include <lather/comm/mpi_communicator.hpp>
#include <lather/distributed/gradients.hpp>
#include <lather/optimizers/shampoo.hpp>
#include <lather/root_inverse/coupled_higher_order.hpp>
#include <lather/root_inverse/coupled_newton.hpp>

#include <Kokkos_Core.hpp>

#include <doctest/doctest.h>

#include "sharding_utils.hpp"
#include "test_utils.hpp"

#include <cstdint>
#include <cstring>
#include <numeric>
#include <vector>

namespace lather::test {

inline std::int64_t numel_of(const std::vector<std::int64_t>& s) {
  return std::accumulate(s.begin(), s.end(), std::int64_t{1}, std::multiplies<>());
}

/// Parameters with blocks of many sizes at max_preconditioner_dim 4: (10, 6) -> 3 x 2 blocks of
/// (4|2) x (4|2), (7,) -> (4,), (3,), (13, 5) -> 4 x 2 blocks, (3, 4, 5) merged to (12, 5) -> 3 x 2,
/// a scalar, and a (9, 9) matrix.
inline std::vector<std::vector<std::int64_t>> model_shapes() {
  return {{10, 6}, {7}, {13, 5}, {3, 4, 5}, {}, {9, 9}};
}

/// Parameters (and gradients) of a model as TensorRefs over owned Views.
template <class T, class M>
struct Model {
  std::vector<Kokkos::View<T*, M>> storage, grad_storage;
  std::vector<TensorRef<T, M>> params, grads;
  explicit Model(const std::vector<std::vector<std::int64_t>>& shapes) {
    for (std::size_t i = 0; i < shapes.size(); ++i) {
      const auto n = static_cast<std::size_t>(numel_of(shapes[i]));
      storage.emplace_back("p", n);
      grad_storage.emplace_back("g", n);
      params.emplace_back(storage.back().data(), std::span<const std::int64_t>(shapes[i]));
      grads.emplace_back(grad_storage.back().data(), std::span<const std::int64_t>(shapes[i]));
      from_host(params.back(), random_values(n, 100 + i));
    }
  }
  /// The same seeded gradients on every rank for step t.
  void set_grads(int t) {
    for (std::size_t i = 0; i < grads.size(); ++i)
      from_host(grads[i], random_values(static_cast<std::size_t>(grads[i].size()), 1000 * (t + 1) + i));
  }
};

/// The options of the distributed tests: blocks of at most 4, amortized every 2 steps from
/// step 2, decoupled weight decay.
inline ShampooOptions dist_options() {
  ShampooOptions o;
  o.lr = 0.05;
  o.betas = {0.9, 0.99};
  o.epsilon = 1e-6;
  o.max_preconditioner_dim = 4;
  o.precondition_frequency = 2;
  o.start_preconditioning_step = 2;
  o.weight_decay = 1e-3;
  return o;
}

/// Sum of a count over all ranks.
inline std::int64_t sum_ranks(std::int64_t v) {
  MPI_Allreduce(MPI_IN_PLACE, &v, 1, MPI_INT64_T, MPI_SUM, MPI_COMM_WORLD);
  return v;
}

/// Whether a host space runs root computations side by side (several threads; the tests'
/// OpenBLAS has thread control): then one process and every rank of a distributed run do.
template <class ExecSpace>
bool roots_side_by_side_here() {
  return Kokkos::SpaceAccessibility<Kokkos::HostSpace, typename ExecSpace::memory_space>::accessible &&
         Kokkos::Experimental::UniqueToken<ExecSpace>(ExecSpace()).size() > 1;
}

/// Bitwise equality of two parameter lists (the raw bytes of every element).
template <class T, class M>
bool bitwise_equal(const std::vector<TensorRef<T, M>>& a, const std::vector<TensorRef<T, M>>& b) {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i) {
    const auto x = to_host(a[i]), y = to_host(b[i]);
    // to_host widens to double exactly, so equal doubles <=> equal T bits (no NaN here).
    if (x.size() != y.size() || std::memcmp(x.data(), y.data(), x.size() * sizeof(double)) != 0) {
      std::size_t k = 0;
      while (k < x.size() && x[k] == y[k]) ++k;
      MESSAGE("parameter " << i << " differs first at element " << k << ": " << x[k] << " vs " << y[k]);
      return false;
    }
  }
  return true;
}

}  // namespace lather::test

#endif
