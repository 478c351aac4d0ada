// SPDX-License-Identifier: Apache-2.0
// Fashion-MNIST on an execution space: normalized images, labels, and the batch gather.
#ifndef LATHER_EXAMPLES_FMNIST_DATA_HPP
#define LATHER_EXAMPLES_FMNIST_DATA_HPP

#include "idx.hpp"

#include <Kokkos_Core.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <random>
#include <vector>

namespace fmnist {

/// One split on the device: images (count, 784) standardized with the training set's pixel mean
/// and standard deviation, labels (count).
template <class T, class ExecSpace>
struct Dataset {
  using memory_space = typename ExecSpace::memory_space;
  Kokkos::View<T**, Kokkos::LayoutRight, memory_space> images;
  Kokkos::View<int*, memory_space> labels;
  [[nodiscard]] int size() const { return static_cast<int>(labels.extent(0)); }
};

/// Mean and standard deviation of the pixels (scaled to [0, 1]) of a split.
inline std::pair<double, double> pixel_moments(const HostSplit& s) {
  double sum = 0, sq = 0;
  for (auto p : s.pixels) {
    const double v = p / 255.0;
    sum += v;
    sq += v * v;
  }
  const double n = static_cast<double>(s.pixels.size());
  const double mean = sum / n;
  return {mean, std::sqrt(std::max(sq / n - mean * mean, 1e-12))};
}

/// Uploads the first `limit` samples (all when limit <= 0) of a split, standardized.
template <class T, class ExecSpace>
Dataset<T, ExecSpace> upload(const HostSplit& s, double mean, double stddev, int limit = 0) {
  const std::size_t count = limit > 0 ? std::min<std::size_t>(s.count, std::size_t(limit)) : s.count;
  const std::size_t features = s.rows * s.cols;
  Dataset<T, ExecSpace> d;
  d.images = decltype(d.images)(Kokkos::view_alloc("fmnist::images", Kokkos::WithoutInitializing), count, features);
  d.labels = decltype(d.labels)(Kokkos::view_alloc("fmnist::labels", Kokkos::WithoutInitializing), count);
  Kokkos::View<T**, Kokkos::LayoutRight, Kokkos::HostSpace> hx("fmnist::host_images", count, features);
  Kokkos::View<int*, Kokkos::HostSpace> hy("fmnist::host_labels", count);
  for (std::size_t i = 0; i < count; ++i) {
    for (std::size_t j = 0; j < features; ++j)
      hx(i, j) = static_cast<T>((s.pixels[i * features + j] / 255.0 - mean) / stddev);
    hy(i) = s.labels[i];
  }
  Kokkos::deep_copy(d.images, hx);
  Kokkos::deep_copy(d.labels, hy);
  return d;
}

/// Copies rows index(begin .. begin + count) of the data set into x (count, 784) and y (count).
template <class T, class ExecSpace>
void gather(const Dataset<T, ExecSpace>& d, const Kokkos::View<const int*, typename ExecSpace::memory_space>& index,
            int begin, int count, const Kokkos::View<T**, Kokkos::LayoutRight, typename ExecSpace::memory_space>& x,
            const Kokkos::View<int*, typename ExecSpace::memory_space>& y) {
  const int features = static_cast<int>(d.images.extent(1));
  auto images = d.images;
  auto labels = d.labels;
  Kokkos::parallel_for(
      "fmnist::gather", Kokkos::MDRangePolicy<ExecSpace, Kokkos::Rank<2>>({0, 0}, {count, features}),
      KOKKOS_LAMBDA(int i, int j) {
        const int src = index(begin + i);
        x(i, j) = images(src, j);
        if (j == 0) y(i) = labels(src);
      });
}

/// The sample order of an epoch: a permutation drawn on the host from (seed, epoch), the same on
/// every rank and every execution space.
inline std::vector<int> epoch_order(int count, std::uint64_t seed, int epoch) {
  std::vector<int> order(static_cast<std::size_t>(count));
  std::iota(order.begin(), order.end(), 0);
  std::mt19937_64 gen(seed * 1000003ull + static_cast<std::uint64_t>(epoch));
  // Fisher-Yates with the generator's raw output: std::shuffle's algorithm is unspecified and
  // would give different orders on different standard libraries.
  for (std::size_t i = order.size(); i > 1; --i) {
    const std::size_t j = static_cast<std::size_t>(gen() % i);
    std::swap(order[i - 1], order[j]);
  }
  return order;
}

}  // namespace fmnist

#endif
