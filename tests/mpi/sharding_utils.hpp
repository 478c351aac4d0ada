// SPDX-License-Identifier: Apache-2.0
// Helpers of the distributed-optimizer tests: a (TP x DP) mesh of MPI_COMM_WORLD, the Sharding a
// layout gives this rank, and the shard of a global row-major array (what this rank holds).
//
// Every test computes the single-device reference on every rank (the same seeded gradients) and
// compares this rank's shard of it with what the distributed optimizer left in its parameters.
#ifndef LATHER_TEST_SHARDING_UTILS_HPP
#define LATHER_TEST_SHARDING_UTILS_HPP

#include <lather/comm/mpi_communicator.hpp>
#include <lather/layout/sharding.hpp>

#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <optional>
#include <string>
#include <vector>

namespace lather::test {

inline int world_size() {
  int n = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  return n;
}

/// The TP and DP groups of a tp x dp mesh over MPI_COMM_WORLD (consecutive world ranks form a TP
/// group), or nothing when the world does not have tp * dp ranks.
struct Mesh {
  MpiCommunicator tp;
  MpiCommunicator dp;
};
inline std::optional<Mesh> make_mesh(int tp, int dp) {
  MpiCommunicator world(MPI_COMM_WORLD);
  if (world.size() != tp * dp) return std::nullopt;
  const int r = world.rank();
  MpiCommunicator tpc = world.split(r / tp, r % tp);
  MpiCommunicator dpc = world.split(r % tp, r / tp);
  return Mesh{std::move(tpc), std::move(dpc)};
}

/// How a test splits one parameter: the TP dimension (-1: none) and whether ZeRO shards it.
struct Layout {
  int tp_dim = -1;
  bool zero = false;
};

/// This rank's Sharding of a parameter of `shape` under `layout` on `mesh` (a TP split of a
/// dimension that does not divide evenly throws, as Sharding::tensor_parallel does).
inline Sharding sharding_for(const std::vector<std::int64_t>& shape, Layout layout, const Mesh& mesh) {
  Sharding s = Sharding::whole(shape);
  if (layout.tp_dim >= 0 && mesh.tp.size() > 1) s = Sharding::tensor_parallel(shape, layout.tp_dim, mesh.tp.rank(), mesh.tp.size());
  if (layout.zero && mesh.dp.size() > 1) s = Sharding::zero_chunk(s, mesh.dp.rank(), mesh.dp.size());
  return s;
}

/// Global row-major flat index of TP-local flat index f.
inline std::int64_t global_index(const Sharding& s, std::int64_t f) {
  const auto local = s.local_shape();
  const int nd = s.rank();
  std::int64_t g = 0, stride = 1;
  for (int d = nd - 1; d >= 0; --d) {
    const std::int64_t e = local[static_cast<std::size_t>(d)];
    std::int64_t idx = e > 0 ? f % e : 0;
    f = e > 0 ? f / e : 0;
    if (d == s.tp_dim) idx += s.tp_offset();
    g += idx * stride;
    stride *= s.global_shape[static_cast<std::size_t>(d)];
  }
  return g;
}

/// The elements of the global row-major array `global` this rank holds (padding as `pad`).
template <class T>
std::vector<T> shard_of(const std::vector<T>& global, const Sharding& s, bool with_padding = true, T pad = T(0)) {
  const std::int64_t n = with_padding ? s.stored_numel() : s.valid_numel();
  std::vector<T> out(static_cast<std::size_t>(n), pad);
  for (std::int64_t k = 0; k < s.valid_numel(); ++k)
    out[static_cast<std::size_t>(k)] = global[static_cast<std::size_t>(global_index(s, s.begin() + k))];
  return out;
}

/// max|a - b| / max|b| over the first min(size) elements (relative to the largest value, unlike
/// test_utils.hpp's element-wise max_rel_diff).
inline double diff_over_max(const std::vector<double>& a, const std::vector<double>& b) {
  double num = 0, den = 0;
  const std::size_t n = std::min(a.size(), b.size());
  for (std::size_t k = 0; k < n; ++k) {
    num = std::max(num, std::abs(a[k] - b[k]));
    den = std::max(den, std::abs(b[k]));
  }
  return num / std::max(den, 1e-300);
}

/// Whether every rank passed (a collective; use before REQUIRE so that no rank hangs).
inline bool all_ranks(bool ok) {
  int v = ok ? 1 : 0;
  MPI_Allreduce(MPI_IN_PLACE, &v, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  return v == 1;
}

}  // namespace lather::test

#endif
