// SPDX-License-Identifier: Apache-2.0
/// \file
/// \brief Private. What every optimizer's step() does first with the gradients it is given:
/// convert them to TensorRefs, check their count and shapes against the parameters, and count
/// NaN/Inf values on the device, so that a bad gradient is refused before anything changes.
#ifndef LATHER_IMPL_GRADIENTS_HPP
#define LATHER_IMPL_GRADIENTS_HPP

#include <lather/concepts/tensor.hpp>
#include <lather/error.hpp>
#include <lather/impl/backends/device_event.hpp>
#include <lather/impl/kernels/diagonal.hpp>
#include <lather/impl/kernels/host_chunks.hpp>
#include <lather/impl/kernels/multi_tensor.hpp>
#include <lather/impl/label.hpp>
#include <lather/optimizers/nonfinite.hpp>

#include <Kokkos_Core.hpp>

#include <algorithm>
#include <array>
#include <cstdint>
#include <functional>
#include <ranges>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace lather::impl {

template <class R>
std::vector<std::int64_t> shape_of(const R& r) {
  std::vector<std::int64_t> s(static_cast<std::size_t>(r.rank()));
  for (int k = 0; k < r.rank(); ++k) s[k] = r.extent(k);
  return s;
}
template <class R>
std::vector<std::int64_t> strides_of(const R& r) {
  std::vector<std::int64_t> s(static_cast<std::size_t>(r.rank()));
  for (int k = 0; k < r.rank(); ++k) s[k] = r.stride(k);
  return s;
}

/// Bytes [first, last) a tensor's elements can touch (empty for a tensor without data).
template <class R>
std::pair<std::uintptr_t, std::uintptr_t> byte_range(const R& r) {
  if (r.data() == nullptr || r.size() == 0) return {0, 0};
  std::int64_t last = 0;
  for (int k = 0; k < r.rank(); ++k) last += (r.extent(k) - 1) * (r.stride(k) < 0 ? -r.stride(k) : r.stride(k));
  const auto first = reinterpret_cast<std::uintptr_t>(r.data());
  using E = std::remove_cv_t<std::remove_pointer_t<decltype(r.data())>>;
  return {first, first + static_cast<std::uintptr_t>(last + 1) * sizeof(E)};
}

/// \brief Gradient intake shared by the optimizers. `describe(i)` names parameter i in messages.
template <class T, class MemorySpace, class ExecSpace>
class GradientIntake {
 public:
  using grad_ref = TensorRef<const T, MemorySpace>;
  using param_ref = TensorRef<T, MemorySpace>;

  GradientIntake() = default;
  GradientIntake(std::string optimizer, std::size_t num_params)
      : m_optimizer(std::move(optimizer)),
        m_check_label("lather::" + m_optimizer + "::check_finite"),
        m_read_label("lather::" + m_optimizer + "::read_screen"),
        m_counts("lather::" + m_optimizer + "::nonfinite_counts", num_params + 1),
        m_counts_host(make_counts_host(m_counts)),
        m_skips(num_params, 0) {
    m_count_jobs.reserve(num_params);
    m_counts_ready.create();
  }
  GradientIntake(const GradientIntake&) = delete;
  GradientIntake& operator=(const GradientIntake&) = delete;
  GradientIntake(GradientIntake&&) noexcept = default;
  GradientIntake& operator=(GradientIntake&&) noexcept = default;
  // A step that threw between queue_count() and read_counts() may leave the counts' copy in
  // flight (CUDA, HIP): it finishes before the pinned counts are freed.
  ~GradientIntake() { m_counts_ready.release(); }

  /// A gradient without data stands for torch's `grad is None` (a zero-size parameter needs none).
  static bool has_gradient(const grad_ref& g, const param_ref& p) { return g.data() != nullptr || p.size() == 0; }

  /// TensorRefs of `grads` (re-tagged with the parameters' memory space, which the execution
  /// space can also access), after checking their count and shapes. Throws before any change.
  /// The result lives in this object (reused from step to step: no allocation after the first)
  /// and stays valid until the next call.
  template <class Grads>
  std::vector<grad_ref>& convert(const Grads& grads, const std::vector<param_ref>& params,
                                 const std::function<std::string(std::size_t)>& describe) {
    const std::size_t n = std::ranges::size(grads);
    LATHER_THROW_IF(n != params.size(), "lather::", m_optimizer, "::step: got ", n, " gradients for ",
                    params.size(), " parameters; pass one per parameter (an empty tensor for a parameter "
                    "without a gradient)");
    std::vector<grad_ref>& g = m_converted;
    g.resize(n);
    for (std::size_t i = 0; i < n; ++i) {
      auto r = tensor_ref(grads[i]);
      LATHER_THROW_IF(r.rank() > max_tensor_rank, "lather::", m_optimizer, "::step: the gradient of ", describe(i),
                      " has rank ", r.rank(), ", more than the supported ", max_tensor_rank);
      std::array<std::int64_t, max_tensor_rank> shape{}, strides{};
      for (int k = 0; k < r.rank(); ++k) {
        shape[static_cast<std::size_t>(k)] = r.extent(k);
        strides[static_cast<std::size_t>(k)] = r.stride(k);
      }
      const auto rank = static_cast<std::size_t>(r.rank());
      g[i] = grad_ref(r.data(), std::span<const std::int64_t>(shape.data(), rank),
                      std::span<const std::int64_t>(strides.data(), rank));
      if (!has_gradient(g[i], params[i])) continue;
      LATHER_THROW_IF(!g[i].same_shape(params[i]), "lather::", m_optimizer, "::step: ", describe(i),
                      " has shape ", params[i].shape_string(), " but its gradient has shape ", g[i].shape_string(),
                      "; pass gradients in parameter order with matching shapes");
    }
    check_aliasing(g, params, describe);
    return g;
  }

  /// \brief Screens every present gradient for NaN/Inf values (see check_finite) and applies
  /// `policy`: raise throws; skip_parameter replaces each bad gradient in `g` by "no gradient";
  /// skip_step returns true (the caller changes nothing). Skips are counted.
  /// `combine` (distributed optimizers) turns this rank's counts into the group's before the
  /// policy is applied, so every rank takes the same decision.
  bool screen(const ExecSpace& space, std::vector<grad_ref>& g, const std::vector<param_ref>& params,
              const std::function<std::string(std::size_t)>& describe, const char* hint, NonFinitePolicy policy,
              const std::function<void(std::vector<std::int64_t>&)>& combine = {}) {
    count_nonfinite(space, g, params, m_with_kernels);
    if (combine) {
      std::vector<std::int64_t>& counts = m_combined;
      counts.resize(g.size());
      for (std::size_t i = 0; i < g.size(); ++i) counts[i] = m_counts_host(i);
      combine(counts);
      for (std::size_t i = 0; i < g.size(); ++i) m_counts_host(i) = counts[i];
    }
    return judge(g, describe, hint, policy);
  }

  /// \brief The screen in two halves, for a step whose state-changing kernels are gated on the
  /// counts (DiagonalOptimizer::step): queue_count() queues the count kernels and no wait;
  /// gate(i, policy) is the device counter that parameter i's kernels must find zero to run;
  /// read_counts() waits for the counts once the step's kernels are queued, and judge() then
  /// applies the policy as screen() does (after the caller has put back its host bookkeeping of
  /// what the gated kernels skipped).
  ///
  /// Why: screen() waits for the counts before the step can queue anything, so on a GPU the
  /// device idles through the copy back, the host's decision and the next launches, every step
  /// (a round trip of tens of microseconds against AdamW's 0.22 ms step on gpt2-block on an H100,
  /// docs/performance.md). Gated, the step's kernels are queued behind the count without a wait
  /// and the host waits once, at the end.
  ///
  /// On CUDA and HIP the counts' copy back is queued here too, into pinned host memory, behind a
  /// runtime event (backends/device_event.hpp): read_counts() then waits for the counts only, and
  /// step() returns while the device still runs the kernels queued after them.
  void queue_count(const ExecSpace& space, const std::vector<grad_ref>& g, const std::vector<param_ref>& params) {
    count_kernels(space, g, params);
    if constexpr (DeviceEvent<ExecSpace>::is_event) {
      // Pinned: queued, no wait (the runtime's copy: see backends/device_event.hpp for why).
      DeviceEvent<ExecSpace>::copy(space, m_counts_host.data(), m_counts.data(), m_counts.extent(0) * sizeof(std::int64_t));
      m_counts_ready.record(space);
    }
  }
  /// The device counter parameter i's kernels read: its own count when only it is skipped
  /// (NonFinitePolicy::skip_parameter), the total otherwise (raise and skip_step change nothing).
  [[nodiscard]] const std::int64_t* gate(std::size_t i, NonFinitePolicy policy) const {
    return m_counts.data() + (policy == NonFinitePolicy::skip_parameter ? i : m_counts.extent(0) - 1);
  }
  /// Waits for the counts queued by queue_count(): on CUDA and HIP for their copy back only (an
  /// event), elsewhere copies them back and fences `space`.
  void read_counts(const ExecSpace& space) {
    Kokkos::Profiling::pushRegion(m_read_label);
    if constexpr (DeviceEvent<ExecSpace>::is_event) {
      m_counts_ready.wait(space);
    } else {
      Kokkos::deep_copy(space, m_counts_host, m_counts);
      space.fence();
    }
    Kokkos::Profiling::popRegion();
  }
  /// NaN/Inf values counted in parameter i's gradient (after read_counts() or screen()).
  [[nodiscard]] std::int64_t count(std::size_t i) const { return m_counts_host(i); }
  /// Whether any gradient had NaN/Inf values (after read_counts()).
  [[nodiscard]] bool any_counted() const { return m_counts_host(m_counts_host.extent(0) - 1) != 0; }

  /// Applies `policy` to the counts read (see screen()): throws for raise, counts the skips,
  /// replaces skipped gradients by "no gradient" for skip_parameter; true for a skipped step.
  bool judge(std::vector<grad_ref>& g, const std::function<std::string(std::size_t)>& describe, const char* hint,
             NonFinitePolicy policy) {
    bool any = false;
    for (std::size_t i = 0; i < g.size(); ++i) {
      if (m_counts_host(i) == 0) continue;
      LATHER_THROW_IF(policy == NonFinitePolicy::raise, "lather::", m_optimizer, "::step: the gradient of ", describe(i),
                      " has ", m_counts_host(i), " NaN or Inf value(s) out of ", g[i].size(),
                      "; nothing was changed. ", hint,
                      " (or choose NonFinitePolicy::skip_parameter / skip_step with set_nonfinite_policy)");
      any = true;
    }
    if (!any) return false;
    for (std::size_t i = 0; i < g.size(); ++i) {
      if (m_counts_host(i) == 0) continue;
      ++m_skips[i];
      if (policy == NonFinitePolicy::skip_parameter) g[i] = grad_ref();
    }
    if (policy == NonFinitePolicy::skip_step) ++m_skipped_steps;
    return policy == NonFinitePolicy::skip_step;
  }

  /// Whether host spaces count with the kernels devices run (the optimizers'
  /// set_portable_kernels), not the host chunk loop.
  void set_count_with_kernels(bool on) noexcept { m_with_kernels = on; }

  /// Steps on which parameter i's gradient had NaN/Inf values and was skipped.
  [[nodiscard]] std::int64_t nonfinite_skips(std::size_t i) const { return m_skips.at(i); }
  /// Whole steps skipped by NonFinitePolicy::skip_step.
  [[nodiscard]] std::int64_t skipped_steps() const noexcept { return m_skipped_steps; }

  /// Counts NaN/Inf values of every present gradient (one loop over all of them: a kernel on
  /// devices) and copies the counts back (one fence of `space`); throws naming the first bad
  /// parameter.
  void check_finite(const ExecSpace& space, const std::vector<grad_ref>& g, const std::vector<param_ref>& params,
                    const std::function<std::string(std::size_t)>& describe, const char* hint) {
    count_nonfinite(space, g, params, m_with_kernels);
    for (std::size_t i = 0; i < g.size(); ++i)
      LATHER_THROW_IF(m_counts_host(i) != 0, "lather::", m_optimizer, "::step: the gradient of ", describe(i),
                      " has ", m_counts_host(i), " NaN or Inf value(s) out of ", g[i].size(),
                      "; nothing was changed. ", hint);
  }

 private:
  // A gradient that overlaps another gradient or any parameter is a caller bug that would
  // silently corrupt the step (the update reads the gradient while writing parameters/state).
  struct Range {
    std::uintptr_t first, last;
    std::size_t index;
    bool is_grad;
  };
  void check_aliasing(const std::vector<grad_ref>& g, const std::vector<param_ref>& params,
                      const std::function<std::string(std::size_t)>& describe) {
    std::vector<Range>& r = m_ranges;  // reused: no allocation after the first step
    r.clear();
    r.reserve(2 * g.size());
    for (std::size_t i = 0; i < g.size(); ++i) {
      const auto [gf, gl] = byte_range(g[i]);
      if (gf != gl) r.push_back({gf, gl, i, true});
      const auto [pf, pl] = byte_range(params[i]);
      if (pf != pl) r.push_back({pf, pl, i, false});
    }
    // Insertion sort: std::sort may allocate nothing either, but the ranges arrive nearly sorted
    // (parameters and gradients are usually allocated in order) and n is small.
    for (std::size_t k = 1; k < r.size(); ++k)
      for (std::size_t j = k; j > 0 && r[j].first < r[j - 1].first; --j) std::swap(r[j], r[j - 1]);
    // Sweep: compare each range with the open one that reaches furthest.
    std::size_t open = 0;
    for (std::size_t k = 1; k < r.size(); ++k) {
      if (r[k].first < r[open].last && (r[k].is_grad || r[open].is_grad)) {
        const Range& a = r[open].is_grad ? r[open] : r[k];
        const Range& b = r[open].is_grad ? r[k] : r[open];
        LATHER_THROW_IF(true, "lather::", m_optimizer, "::step: the gradient of ", describe(a.index),
                        " overlaps the memory of ", b.is_grad ? "the gradient of " : "", describe(b.index),
                        "; pass each parameter its own gradient buffer; nothing was changed");
      }
      if (r[k].last > r[open].last) open = k;
    }
  }

  // The counts of every present gradient in m_counts_host; `with_kernels` counts with the kernels
  // devices run also on host spaces.
  void count_nonfinite(const ExecSpace& space, const std::vector<grad_ref>& g, const std::vector<param_ref>& params,
                       [[maybe_unused]] bool with_kernels) {  // unused where there is no host chunk loop
#ifdef LATHER_HAS_HOST_CHUNKS
    if constexpr (Kokkos::SpaceAccessibility<ExecSpace, Kokkos::HostSpace>::accessible &&
                  Kokkos::SpaceAccessibility<Kokkos::HostSpace, MemorySpace>::accessible) {
      if (!with_kernels) {
        // Host: every gradient's chunks in one parallel loop (kernels/host_chunks.hpp says why).
        for (std::size_t i = 0; i < m_counts_host.extent(0); ++i) m_counts_host(i) = 0;
        m_chunks.clear();
        for (std::size_t i = 0; i < g.size(); ++i)
          if (has_gradient(g[i], params[i])) m_chunks.add(i, g[i].size());
        const auto counts = m_counts_host;
        kernels::for_host_chunks(m_check_label, space, m_chunks, [&](std::size_t e, std::int64_t begin, std::int64_t end) {
          const std::size_t i = m_chunks.item(e);
          const grad_ref& r = g[i];
          std::int64_t n = 0;
          if (r.is_row_major_contiguous()) {
            n = kernels::host_count_nonfinite(r.data() + begin, end - begin);
          } else {
            for (std::int64_t q = begin; q < end; ++q) n += !math::isfinite(r[q]);
          }
          if (n != 0) Kokkos::atomic_add(&counts(i), n);  // rare: no contention in the normal case
        });
        space.fence();
        return;
      }
    }
#endif
    queue_count(space, g, params);
    read_counts(space);
  }

  // Queues the zeroing of the counts and one kernel counting every present gradient into its
  // counter and the total (the last counter).
  void count_kernels(const ExecSpace& space, const std::vector<grad_ref>& g, const std::vector<param_ref>& params) {
    // A kernel, not deep_copy(space, view, 0): Kokkos 3.4's scalar fill allocates a label.
    Kokkos::parallel_for(LATHER_LABEL("lather::GradientIntake::zero_counts"),
                         Kokkos::RangePolicy<ExecSpace, Kokkos::IndexType<std::int64_t>>(
                             space, 0, static_cast<std::int64_t>(m_counts.extent(0))),
                         kernels::ZeroCounts<MemorySpace>{m_counts});
    // Every gradient in one kernel (kernels/multi_tensor.hpp).
    m_count_jobs.clear();
    m_count_jobs.begin_step();  // one launch a step: the same place each step
    for (std::size_t i = 0; i < g.size(); ++i)
      if (has_gradient(g[i], params[i]))
        m_count_jobs.add({g[i], m_counts.data(), i, m_counts.data() + (m_counts.extent(0) - 1)}, g[i].size());
    m_count_jobs.launch(m_check_label, space);
  }

  std::string m_optimizer;
  std::string m_check_label;  // built once: a label built per launch allocates
  std::string m_read_label;
  std::vector<grad_ref> m_converted;
  std::vector<Range> m_ranges;
  std::vector<std::int64_t> m_combined;
  kernels::HostChunkTable m_chunks;  // host spaces: the gradients' chunks (storage reused)
  kernels::MultiTensorTable<ExecSpace, MemorySpace, kernels::CountNonFinite<T, MemorySpace>> m_count_jobs;  // elsewhere
  // The counts' host copy: pinned where the copy back is queued behind an event (CUDA, HIP),
  // else a mirror (the counts themselves where the memory is the host's).
  using counts_view = Kokkos::View<std::int64_t*, MemorySpace>;
  using counts_host_view =
      std::conditional_t<DeviceEvent<ExecSpace>::is_event, Kokkos::View<std::int64_t*, pinned_host_space_t<ExecSpace>>,
                         decltype(Kokkos::create_mirror_view(std::declval<counts_view>()))>;  // `auto`-typed: View::HostMirror is deprecated in Kokkos 5
  static counts_host_view make_counts_host(const counts_view& counts) {
    if constexpr (DeviceEvent<ExecSpace>::is_event) {
      return counts_host_view(Kokkos::view_alloc(Kokkos::WithoutInitializing, counts.label() + "_host"), counts.extent(0));
    } else {
      return Kokkos::create_mirror_view(counts);
    }
  }
  counts_view m_counts;
  counts_host_view m_counts_host;
  DeviceEvent<ExecSpace> m_counts_ready;  // after the counts' copy back (queue_count)
  std::vector<std::int64_t> m_skips;
  std::int64_t m_skipped_steps = 0;
  bool m_with_kernels = false;
};

}  // namespace lather::impl

#endif
