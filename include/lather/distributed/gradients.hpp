// SPDX-License-Identifier: Apache-2.0
/// \file
/// \brief `GradientAverager`: data-parallel gradient averaging for users without their own DDP
/// wrapper (distributed Shampoo's DDP mode expects every rank to hold the averaged gradients).
/// All gradients travel in one all-reduce through one flat buffer, kept between calls.
#ifndef LATHER_DISTRIBUTED_GRADIENTS_HPP
#define LATHER_DISTRIBUTED_GRADIENTS_HPP

#include <lather/concepts/communicator.hpp>
#include <lather/concepts/tensor.hpp>
#include <lather/error.hpp>
#include <lather/impl/label.hpp>
#include <lather/traits/tensor_traits.hpp>

#include <Kokkos_Core.hpp>

#include <cstdint>
#include <ranges>
#include <string>
#include <vector>

namespace lather {
namespace impl::kernels {
// At namespace scope: nvcc's generated stubs must name a kernel's functor type (a private nested
// type fails to compile for CUDA).
template <class T, class MemorySpace>
struct GradientPack {
  TensorRef<T, MemorySpace> g;
  Kokkos::View<T*, MemorySpace> flat;
  std::int64_t at;
  KOKKOS_FUNCTION void operator()(std::int64_t i) const { flat(at + i) = g[i]; }
};
template <class T, class MemorySpace>
struct GradientUnpack {
  TensorRef<T, MemorySpace> g;
  Kokkos::View<T*, MemorySpace> flat;
  std::int64_t at;
  T scale;
  KOKKOS_FUNCTION void operator()(std::int64_t i) const { g[i] = flat(at + i) * scale; }
};
}  // namespace impl::kernels

/// \brief Averages gradients over the ranks of a communicator: g <- (sum over ranks of g) / size,
/// for every gradient with data (an empty tensor is skipped: every rank must pass the same list,
/// with the same shapes and the same empty entries). Strided gradients are fine.
template <class T, class MemorySpace>
class GradientAverager {
 public:
  /// Collective over `comm`; fences `space`. One all-reduce of all gradients together.
  template <concepts::Communicator Comm, class ExecSpace, std::ranges::random_access_range Grads>
  void operator()(const Comm& comm, const ExecSpace& space, const Grads& grads) {
    std::vector<TensorRef<T, MemorySpace>> g;
    std::int64_t total = 0;
    for (const auto& x : grads) {
      const TensorRef<T, MemorySpace> r = tensor_ref(x);
      if (r.data() == nullptr || r.size() == 0) continue;
      g.push_back(r);
      total += r.size();
    }
    if (comm.size() == 1 || total == 0) return;
    if (static_cast<std::int64_t>(m_flat.extent(0)) < total)
      m_flat = Kokkos::View<T*, MemorySpace>(Kokkos::view_alloc(Kokkos::WithoutInitializing, std::string("lather::GradientAverager")),
                                             static_cast<std::size_t>(total));
    using Range = Kokkos::RangePolicy<ExecSpace, Kokkos::IndexType<std::int64_t>>;
    const auto flat = m_flat;
    std::int64_t at = 0;
    for (const auto& t : g) {
      Kokkos::parallel_for(LATHER_LABEL("lather::GradientAverager::pack"), Range(space, 0, t.size()), impl::kernels::GradientPack<T, MemorySpace>{t, flat, at});
      at += t.size();
    }
    const auto used = Kokkos::subview(flat, std::make_pair(std::int64_t{0}, total));
    comm.all_reduce_sum(space, used);
    const T scale = T(1) / static_cast<T>(comm.size());
    at = 0;
    for (const auto& t : g) {
      Kokkos::parallel_for(LATHER_LABEL("lather::GradientAverager::unpack"), Range(space, 0, t.size()), impl::kernels::GradientUnpack<T, MemorySpace>{t, flat, at, scale});
      at += t.size();
    }
    space.fence();
  }

 private:
  Kokkos::View<T*, MemorySpace> m_flat;
};

}  // namespace lather

#endif
