// SPDX-License-Identifier: Apache-2.0
/// \file
/// \brief Private. The machinery every element-wise optimizer shares: parameter groups, gradient
/// checks, per-parameter state, learning-rate changes and state dictionaries. An Algorithm policy
/// (impl::SgdAlgorithm, impl::AdamAlgorithm, ...) supplies the options, state fields and kernel.
#ifndef LATHER_IMPL_DIAGONAL_OPTIMIZER_HPP
#define LATHER_IMPL_DIAGONAL_OPTIMIZER_HPP

#include <lather/concepts/execution.hpp>
#include <lather/concepts/tensor.hpp>
#include <lather/error.hpp>
#include <lather/impl/gradients.hpp>
#include <lather/impl/kernels/diagonal.hpp>
#include <lather/impl/kernels/host_chunks.hpp>
#include <lather/impl/kernels/multi_tensor.hpp>
#include <lather/impl/option_check.hpp>
#include <lather/impl/options_io.hpp>
#include <lather/io/state_dict.hpp>
#include <lather/optimizers/param_group.hpp>

#include <Kokkos_Core.hpp>

#include <array>
#include <cstdint>
#include <ranges>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

namespace lather::impl {

/// Per-parameter state: the step count and the algorithm's named buffers (flat, row-major over
/// the parameter's logical shape). A buffer is "present" once it holds state (torch creates some
/// buffers lazily, e.g. SGD's momentum buffer is a copy of the first direction).
template <class T, class MemorySpace, std::size_t NumFields>
struct DiagonalParamState {
  std::int64_t step = 0;
  std::array<Kokkos::View<T*, MemorySpace>, NumFields> fields{};
  std::array<bool, NumFields> present{};
};

/// Runs an algorithm's element kernel over parameter `p`: `make(std::true_type{})` builds its
/// contiguous form (plain pointers, vectorizable) when both tensors are row-major contiguous,
/// `make(std::false_type{})` the general one.
template <class ExecSpace, class T, class M, class Make>
void launch_element_kernel(const std::string& label, const ExecSpace& space, const TensorRef<T, M>& p,
                           const TensorRef<const T, M>& g, Make&& make) {
  const Kokkos::RangePolicy<ExecSpace, Kokkos::IndexType<std::int64_t>> range(space, 0, p.size());
  if (p.is_row_major_contiguous() && g.is_row_major_contiguous()) Kokkos::parallel_for(label, range, make(std::true_type{}));
  else Kokkos::parallel_for(label, range, make(std::false_type{}));
}

/// Whether parameter `p` may join the host chunk loop (DiagonalOptimizer::step): host data on a
/// host space, both tensors contiguous.
template <class ExecSpace, class T, class M>
bool joins_host_chunks(const TensorRef<T, M>& p, const TensorRef<const T, M>& g) {
  return kernels::host_chunks_apply<ExecSpace, M> && p.is_row_major_contiguous() && g.is_row_major_contiguous();
}


template <class Param, class ExecSpace, class Algorithm>
class DiagonalOptimizer {
  static_assert(check_valid_tensor_traits<Param>());
  using traits = traits_of<Param>;

 public:
  using param_type = Param;
  using execution_space = ExecSpace;
  using value_type = typename traits::value_type;
  using memory_space = typename traits::memory_space;
  using options_type = typename Algorithm::options_type;
  using group_type = ParamGroup<Param, options_type>;
  using tensor_type = TensorRef<value_type, memory_space>;
  static constexpr std::size_t num_fields = Algorithm::field_names.size();
  using state_type = DiagonalParamState<value_type, memory_space, num_fields>;

  static_assert(std::is_same_v<value_type, float> || std::is_same_v<value_type, double>,
                "lather: optimizer parameters must be float or double tensors");
  static_assert(!std::is_const_v<typename traits::element_type>,
                "lather: parameters must be writable (got a tensor of const elements)");
  static_assert(Kokkos::SpaceAccessibility<ExecSpace, memory_space>::accessible,
                "lather: the execution space cannot access the parameters' memory space");

  // Move-only. The state lives in Kokkos Views, which copy as shared handles, next to host-side
  // counters and references to the user's parameters: a copy would update the same parameters and
  // share the state while its step count diverged. Duplicate an optimizer's state through
  // state_dict() / load_state_dict() (docs/state.md).
  DiagonalOptimizer(const DiagonalOptimizer&) = delete;
  DiagonalOptimizer& operator=(const DiagonalOptimizer&) = delete;
  DiagonalOptimizer(DiagonalOptimizer&&) = default;
  DiagonalOptimizer& operator=(DiagonalOptimizer&&) = default;
  ~DiagonalOptimizer() = default;

  /// One group of parameters with shared options.
  explicit DiagonalOptimizer(std::span<Param> params, options_type options = {},
                             std::vector<std::string> names = {})
      : DiagonalOptimizer(std::vector<group_type>{group_type{params, options, std::move(names)}}) {}

  /// Several parameter groups, each with its own options.
  explicit DiagonalOptimizer(std::vector<group_type> groups) {
    LATHER_THROW_IF(groups.empty(), "lather::", Algorithm::name,
                    ": no parameter groups given; pass at least one parameter");
    std::size_t total = 0;
    for (std::size_t g = 0; g < groups.size(); ++g) {
      Algorithm::validate(groups[g].options, group_check(g));
      LATHER_THROW_IF(groups[g].params.empty(), "lather::", Algorithm::name, ": parameter group ",
                      g, " is empty; every group needs at least one parameter");
      LATHER_THROW_IF(!groups[g].names.empty() && groups[g].names.size() != groups[g].params.size(),
                      "lather::", Algorithm::name, ": parameter group ", g, " has ",
                      groups[g].params.size(), " parameters but ", groups[g].names.size(),
                      " names; give one name per parameter or none");
      total += groups[g].params.size();
    }
    m_params.reserve(total);
    for (std::size_t g = 0; g < groups.size(); ++g) {
      m_group_options.push_back(groups[g].options);
      m_group_begin.push_back(m_params.size());
      for (std::size_t k = 0; k < groups[g].params.size(); ++k) {
        const std::size_t index = m_params.size();
        m_names.push_back(groups[g].names.empty() ? std::string() : groups[g].names[k]);
        tensor_type ref = tensor_ref(groups[g].params[k]);
        LATHER_THROW_IF(ref.data() == nullptr && ref.size() > 0, "lather::", Algorithm::name, ": ",
                        describe(index), " has no data (null pointer)");
        for (std::size_t j = 0; j < index; ++j)
          LATHER_THROW_IF(ref.size() > 0 && m_params[j].data() == ref.data(), "lather::",
                          Algorithm::name, ": ", describe(index), " and ", describe(j),
                          " share memory; each parameter may appear only once");
        m_params.push_back(ref);
        m_group_of.push_back(g);
      }
    }
    m_group_begin.push_back(m_params.size());
    m_intake = GradientIntake<value_type, memory_space, ExecSpace>(Algorithm::name, m_params.size());
    m_states.resize(m_params.size());
    for (std::size_t i = 0; i < m_params.size(); ++i) allocate_needed(i);
    if constexpr (has_host_jobs) {  // no allocation in step(), whichever parameters have gradients
      m_jobs.reserve(m_params.size());
      m_job_chunks.reserve(m_params.size());
    }
    m_multi.reserve(m_params.size());
    m_saved.reserve(m_params.size());
  }

  // ---- the step ------------------------------------------------------------------------------

  /// \brief Applies one step with `grads` (one per parameter, in group order) on `space`.
  ///
  /// A gradient with no data (a default-constructed tensor) means "no gradient this step": that
  /// parameter and its state are left untouched, as torch does for `grad is None`.
  /// Every gradient is checked before anything is modified; on an error nothing changes.
  /// Synchronization: asynchronous with respect to the host; kernels are queued on `space`.
  template <std::ranges::random_access_range Grads>
    requires concepts::Tensor<std::ranges::range_value_t<Grads>>
  void step(const ExecSpace& space, const Grads& grads) {
    Kokkos::Profiling::pushRegion(step_label());
    using G = std::ranges::range_value_t<Grads>;
    using gtraits = traits_of<G>;
    static_assert(std::is_same_v<typename gtraits::value_type, value_type>,
                  "lather: gradient value_type must equal the parameters' value_type");
    static_assert(Kokkos::SpaceAccessibility<ExecSpace, typename gtraits::memory_space>::accessible,
                  "lather: the execution space cannot access the gradients' memory space");
    const auto describe_param = [this](std::size_t i) { return describe(i); };
    auto& g = m_intake.convert(grads, m_params, describe_param);  // reused storage: no allocation
    static constexpr const char* hint = "Skip this batch, lower the learning rate or add gradient clipping";
    // Gated (queues_screen): the update kernel skips on the device what the screen's counts
    // refuse, and the host reads the counts after queueing it (one wait, at the end); otherwise
    // the screen waits for its counts before anything is queued.
    m_intake.set_count_with_kernels(m_portable_kernels);
    const bool gated = m_check_finite && queues_screen(g);
    if (m_check_finite && !gated && m_intake.screen(space, g, m_params, describe_param, hint, m_nonfinite_policy)) {
      Kokkos::Profiling::popRegion();
      return;  // NonFinitePolicy::skip_step: nothing changes
    }
    if (gated) m_intake.queue_count(space, g, m_params);
    const std::size_t n = g.size();
    if constexpr (has_host_jobs) {
      m_jobs.clear();
      m_job_chunks.clear();
    }
    m_multi.clear();
    m_multi.begin_step();  // one launch a step: the same place each step
    m_saved.clear();
    for (std::size_t i = 0; i < n; ++i) {
      if (!m_intake.has_gradient(g[i], m_params[i]) || m_params[i].size() == 0) continue;
      const options_type& o = m_group_options[m_group_of[i]];
      allocate_needed(i);  // allocates nothing when gated (queues_screen)
      state_type& s = m_states[i];
      if (gated) m_saved.push_back({i, s.step, s.present});  // put back if the screen refuses
      s.step += 1;
      if constexpr (has_host_jobs) {
        // Host data the algorithm can run in chunks: collected, then one loop for all (below).
        typename host_jobs<Algorithm>::type job;
        if (!m_portable_kernels && Algorithm::template host_job<ExecSpace>(o, s, m_params[i], g[i], job)) {
          m_job_chunks.add(m_jobs.size(), m_params[i].size());
          m_jobs.push_back(job);
          continue;
        }
      }
      if (m_params[i].is_row_major_contiguous() && g[i].is_row_major_contiguous()) {
        // Everything else contiguous (all of it on devices): one kernel for all (below).
        m_multi.add(Algorithm::template step_kernel<true>(o, s, m_params[i], g[i]), m_params[i].size(),
                    gated ? m_intake.gate(i, m_nonfinite_policy) : nullptr);
        continue;
      }
      Algorithm::template update<ExecSpace>(space, o, s, m_params[i], g[i]);
    }
    if constexpr (has_host_jobs) {
      if (!m_jobs.empty())
        kernels::for_host_chunks(step_label(), space, m_job_chunks,
                                 [&](std::size_t e, std::int64_t begin, std::int64_t end) {
                                   m_jobs[m_job_chunks.item(e)](begin, end);
                                 });
      m_jobs.clear();  // jobs may hold Views of the state: no reference outlives the step
    }
    m_multi.launch(step_label(), space);
    if (gated) {
      m_intake.read_counts(space);
      if (m_intake.any_counted()) {
        // The gated kernels changed nothing the policy refuses; put back the host's side of it
        // (step counts, buffers marked as holding state), then raise or count as screen() does.
        for (const Saved& k : m_saved) {
          if (m_nonfinite_policy == NonFinitePolicy::skip_parameter && m_intake.count(k.index) == 0) continue;
          m_states[k.index].step = k.step;
          m_states[k.index].present = k.present;
        }
        Kokkos::Profiling::popRegion();
        m_intake.judge(g, describe_param, hint, m_nonfinite_policy);
        return;
      }
    }
    Kokkos::Profiling::popRegion();
  }

  /// step() on a default-constructed instance of the execution space.
  template <std::ranges::random_access_range Grads>
    requires concepts::Tensor<std::ranges::range_value_t<Grads>>
  void step(const Grads& grads) {
    step(ExecSpace(), grads);
  }

  /// \brief Whether step() checks every gradient for NaN and Inf before changing anything (on
  /// by default). The check reads each gradient once and waits for the result (one fence of the
  /// step's execution space per step): on devices (and with set_portable_kernels(true)) after
  /// the update kernel is queued, which skips on the device what the counts refuse, except on a
  /// step that allocates a buffer (one that set_options turned on; the others are allocated with
  /// the optimizer) or has a non-contiguous parameter, where the check waits before anything is
  /// queued. Turn it off to keep step() fully asynchronous
  /// when the trainer checks its loss itself (on CUDA and host spaces; on other devices the
  /// upload of the multi-tensor loop's job table still waits for its copy, see
  /// set_portable_kernels).
  void set_check_finite(bool on) noexcept { m_check_finite = on; }
  [[nodiscard]] bool check_finite() const noexcept { return m_check_finite; }

  /// \brief Whether host spaces run the portable multi-tensor kernel (false by default).
  ///
  /// Every step runs its element updates in one loop over all parameters. On devices that is
  /// a kernel with one team per chunk of 4096 elements of any parameter (the step uploads a
  /// table of one job per parameter first); on host spaces a vectorized loop over the same
  /// chunks, for the parameters and options it covers (float/double, contiguous; Adam without
  /// amsgrad), and the portable kernel for the rest. `true` sends every contiguous host
  /// parameter to the portable kernel as on a device: the same operations in the same order,
  /// so the same results where the compiler contracts no multiply-add; for tests and
  /// comparisons. Non-contiguous parameters keep a kernel each on every space. With `true` the
  /// NaN/Inf screen also counts with the devices' kernel and gates the update as on a device
  /// (set_check_finite), slower on the host than its vectorized count.
  void set_portable_kernels(bool on) noexcept { m_portable_kernels = on; }
  [[nodiscard]] bool portable_kernels() const noexcept { return m_portable_kernels; }

  /// \brief What step() does with a NaN/Inf gradient (NonFinitePolicy::raise by default):
  /// raise, skip that parameter, or skip the whole step. Needs the check (check_finite()).
  void set_nonfinite_policy(NonFinitePolicy p) noexcept { m_nonfinite_policy = p; }
  [[nodiscard]] NonFinitePolicy nonfinite_policy() const noexcept { return m_nonfinite_policy; }
  /// Steps on which parameter i's gradient had NaN/Inf values and was skipped.
  [[nodiscard]] std::int64_t nonfinite_skips(std::size_t i) const {
    check_param(i);
    return m_intake.nonfinite_skips(i);
  }
  /// Whole steps skipped by NonFinitePolicy::skip_step.
  [[nodiscard]] std::int64_t skipped_steps() const noexcept { return m_intake.skipped_steps(); }

  // ---- options -------------------------------------------------------------------------------

  [[nodiscard]] std::size_t num_groups() const noexcept { return m_group_options.size(); }
  [[nodiscard]] std::size_t num_params() const noexcept { return m_params.size(); }
  /// Options of group `g` (read-only; change them with set_options or set_lr).
  [[nodiscard]] const options_type& options(std::size_t g = 0) const {
    check_group(g);
    return m_group_options[g];
  }
  /// Replaces group `g`'s options after validating them (nothing changes if they are invalid).
  void set_options(std::size_t g, const options_type& o) {
    check_group(g);
    Algorithm::validate(o, group_check(g));
    m_group_options[g] = o;
  }
  /// Sets the learning rate of every group (what a scheduler does between steps).
  void set_lr(double lr) {
    for (std::size_t g = 0; g < num_groups(); ++g) {
      options_type o = m_group_options[g];
      o.lr = lr;
      Algorithm::validate(o, group_check(g));
    }
    for (auto& o : m_group_options) o.lr = lr;
  }
  /// Sets the learning rate of group `g`.
  void set_lr(std::size_t g, double lr) {
    check_group(g);
    options_type o = m_group_options[g];
    o.lr = lr;
    set_options(g, o);
  }

  // ---- inspection ----------------------------------------------------------------------------

  /// The parameter with flat index `i` (groups in order).
  [[nodiscard]] const tensor_type& param(std::size_t i) const {
    check_param(i);
    return m_params[i];
  }
  /// The user-given name of parameter `i`, or "" when none was given.
  [[nodiscard]] const std::string& param_name(std::size_t i) const {
    check_param(i);
    return m_names[i];
  }
  /// Steps taken by parameter `i` (steps where it had a gradient).
  [[nodiscard]] std::int64_t step_count(std::size_t i) const {
    check_param(i);
    return m_states[i].step;
  }
  /// The names of this optimizer's per-parameter state buffers, e.g. {"exp_avg", "exp_avg_sq"}.
  [[nodiscard]] static constexpr auto state_names() { return Algorithm::field_names; }
  /// State buffer `name` of parameter `i`: flat, row-major over the parameter's shape. Empty when
  /// the buffer does not hold state yet (e.g. SGD's momentum buffer before the first step).
  [[nodiscard]] Kokkos::View<value_type*, memory_space> state(std::size_t i,
                                                              const std::string& name) const {
    check_param(i);
    const std::size_t f = field_index(name);
    LATHER_THROW_IF(f == num_fields, "lather::", Algorithm::name, ": no state buffer '", name,
                    "'; this optimizer has ", field_list());
    return m_states[i].present[f] ? m_states[i].fields[f] : Kokkos::View<value_type*, memory_space>();
  }

  // ---- state dictionaries --------------------------------------------------------------------

  /// \brief The complete state (per-parameter buffers and step counts, and every group's
  /// options) copied to host memory. Fences the default instance of the memory space's
  /// execution space (Kokkos::deep_copy).
  [[nodiscard]] StateDict state_dict() const {
    StateDict d;
    d.format = format_name();
    for (std::size_t i = 0; i < m_params.size(); ++i) {
      const std::string key = "state." + std::to_string(i) + ".";
      d.tensors[key + "step"] = StateTensor{{}, std::vector<std::int64_t>{m_states[i].step}};
      for (std::size_t f = 0; f < num_fields; ++f) {
        if (!m_states[i].present[f]) continue;
        std::vector<value_type> host(static_cast<std::size_t>(m_params[i].size()));
        Kokkos::View<value_type*, Kokkos::HostSpace, Kokkos::MemoryTraits<Kokkos::Unmanaged>> h(
            host.data(), host.size());
        Kokkos::deep_copy(h, m_states[i].fields[f]);
        d.tensors[key + Algorithm::field_names[f]] = StateTensor{shape_of(m_params[i]), std::move(host)};
      }
    }
    for (std::size_t g = 0; g < num_groups(); ++g) {
      const std::string key = "param_groups." + std::to_string(g) + ".";
      d.tensors[key + "num_params"] = StateTensor{
          {}, std::vector<std::int64_t>{static_cast<std::int64_t>(m_group_begin[g + 1] - m_group_begin[g])}};
      options_io::write(d, key, m_group_options[g]);
    }
    return d;
  }

  /// \brief Restores state saved by state_dict() of an optimizer over parameters of the same
  /// shapes and groups. Every entry is checked first (format, names, dtypes, shapes, option
  /// values); on any error nothing changes. Fences like state_dict().
  void load_state_dict(const StateDict& d) {
    LATHER_THROW_IF(d.format != format_name(), "lather::", Algorithm::name,
                    "::load_state_dict: the dictionary is a '", d.format, "' state, expected '",
                    format_name(), "'");
    // Pass 1: check everything and build the new options; nothing is modified.
    std::vector<options_type> new_options = m_group_options;
    std::size_t expected_entries = 0;
    for (std::size_t g = 0; g < num_groups(); ++g) {
      const std::string key = "param_groups." + std::to_string(g) + ".";
      const StateTensor& np = entry(d, key + "num_params");
      const std::int64_t want = static_cast<std::int64_t>(m_group_begin[g + 1] - m_group_begin[g]);
      LATHER_THROW_IF(!options_io::holds_scalar<std::int64_t>(np) ||
                          std::get<std::vector<std::int64_t>>(np.values)[0] != want,
                      "lather::", Algorithm::name, "::load_state_dict: parameter group ", g,
                      " has a different number of parameters in the dictionary (expected ", want,
                      ")");
      ++expected_entries;
      // Only the learning rate (a scheduler's) is restored; a dictionary saved with other
      // options is refused, never loaded silently.
      new_options[g] = options_io::read_checked(
          [&](const std::string& name) -> const StateTensor& { return entry(d, name); }, key, m_group_options[g],
          Algorithm::name, g, expected_entries);
      Algorithm::validate(new_options[g], OptionCheck(Algorithm::name, concat(
          "load_state_dict: parameter group ", g)));
    }
    for (std::size_t i = 0; i < m_params.size(); ++i) {
      const std::string key = "state." + std::to_string(i) + ".";
      const StateTensor& st = entry(d, key + "step");
      LATHER_THROW_IF(!options_io::holds_scalar<std::int64_t>(st) ||
                          std::get<std::vector<std::int64_t>>(st.values)[0] < 0,
                      "lather::", Algorithm::name, "::load_state_dict: '", key,
                      "step' must be a non-negative int64 scalar");
      ++expected_entries;
      for (std::size_t f = 0; f < num_fields; ++f) {
        auto it = d.tensors.find(key + Algorithm::field_names[f]);
        if (it == d.tensors.end()) continue;
        ++expected_entries;
        const StateTensor& t = it->second;
        LATHER_THROW_IF(!std::holds_alternative<std::vector<value_type>>(t.values), "lather::",
                        Algorithm::name, "::load_state_dict: '", it->first, "' is ", t.dtype(),
                        " but ", describe(i), " is ", dtype_name());
        LATHER_THROW_IF(t.shape != shape_of(m_params[i]) ||
                            t.stored_size() != static_cast<std::size_t>(m_params[i].size()),
                        "lather::", Algorithm::name, "::load_state_dict: '", it->first,
                        "' does not match the shape ", m_params[i].shape_string(), " of ",
                        describe(i));
      }
    }
    if (d.tensors.size() != expected_entries) {
      for (const auto& [name, t] : d.tensors) {
        LATHER_THROW_IF(!known_entry(name), "lather::", Algorithm::name,
                        "::load_state_dict: unknown entry '", name,
                        "' (saved from different parameters or a different optimizer?)");
      }
    }
    // Pass 2: apply.
    m_group_options = std::move(new_options);
    for (std::size_t i = 0; i < m_params.size(); ++i) {
      const std::string key = "state." + std::to_string(i) + ".";
      m_states[i].step = std::get<std::vector<std::int64_t>>(d.tensors.at(key + "step").values)[0];
      for (std::size_t f = 0; f < num_fields; ++f) {
        auto it = d.tensors.find(key + Algorithm::field_names[f]);
        if (it == d.tensors.end()) {
          m_states[i].present[f] = false;
          continue;
        }
        ensure_allocated(i, f);
        const auto& host = std::get<std::vector<value_type>>(it->second.values);
        Kokkos::View<const value_type*, Kokkos::HostSpace, Kokkos::MemoryTraits<Kokkos::Unmanaged>> h(
            host.data(), host.size());
        Kokkos::deep_copy(m_states[i].fields[f], h);
        m_states[i].present[f] = true;
      }
    }
  }

 protected:
  /// "parameter 3 ('fc.bias') in group 1", for messages.
  [[nodiscard]] std::string describe(std::size_t i) const {
    std::string s = "parameter " + std::to_string(i);
    if (i < m_names.size() && !m_names[i].empty()) s += " ('" + m_names[i] + "')";
    if (i < m_group_of.size() && m_group_begin.size() > 2) s += " in group " + std::to_string(m_group_of[i]);
    return s;
  }

 private:
  // The profiling region's name, built once (a string built per step allocates).
  static const std::string& step_label() {
    static const std::string label = std::string("lather::") + Algorithm::name + "::step";
    return label;
  }
  static const char* dtype_name() { return std::is_same_v<value_type, float> ? "float32" : "float64"; }
  static std::string format_name() { return std::string("lather.") + Algorithm::name + ".v1"; }
  static std::string field_list() {
    std::string s;
    for (const char* f : Algorithm::field_names) s += (s.empty() ? "'" : ", '") + std::string(f) + "'";
    return s.empty() ? "no state buffers" : s;
  }
  static std::size_t field_index(const std::string& name) {
    for (std::size_t f = 0; f < num_fields; ++f)
      if (name == Algorithm::field_names[f]) return f;
    return num_fields;
  }
  OptionCheck group_check(std::size_t g) const {
    return OptionCheck(Algorithm::name, "parameter group " + std::to_string(g));
  }
  void check_group(std::size_t g) const {
    LATHER_THROW_IF(g >= num_groups(), "lather::", Algorithm::name, ": no parameter group ", g,
                    " (there are ", num_groups(), ")");
  }
  void check_param(std::size_t i) const {
    LATHER_THROW_IF(i >= num_params(), "lather::", Algorithm::name, ": no parameter ", i,
                    " (there are ", num_params(), ")");
  }
  void ensure_allocated(std::size_t i, std::size_t f) {
    auto& v = m_states[i].fields[f];
    if (v.extent(0) == static_cast<std::size_t>(m_params[i].size()) && v.data() != nullptr) return;
    v = Kokkos::View<value_type*, memory_space>(
        std::string("lather::") + Algorithm::name + "::" + Algorithm::field_names[f],
        static_cast<std::size_t>(m_params[i].size()));
  }
  // Whether this step's screen can be gated (see step()): the updates all go to the multi-tensor
  // kernel (a device, or set_portable_kernels(true) on a host space: the host chunk loop counts
  // in the same thread and has nothing to wait for), every parameter with a gradient is
  // contiguous (a kernel of its own would not be gated) and holds all its buffers already (an
  // allocation this step could not be taken back).
  bool queues_screen(const std::vector<TensorRef<const value_type, memory_space>>& g) const {
#ifdef LATHER_HAS_HOST_CHUNKS
    if (kernels::host_chunks_apply<ExecSpace, memory_space> && !m_portable_kernels) return false;
#endif
    for (std::size_t i = 0; i < g.size(); ++i) {
      if (!m_intake.has_gradient(g[i], m_params[i]) || m_params[i].size() == 0) continue;
      if (!m_params[i].is_row_major_contiguous() || !g[i].is_row_major_contiguous()) return false;
      const options_type& o = m_group_options[m_group_of[i]];
      for (std::size_t f = 0; f < num_fields; ++f)
        if (Algorithm::uses_field(o, f) &&
            (m_states[i].fields[f].data() == nullptr ||
             m_states[i].fields[f].extent(0) != static_cast<std::size_t>(m_params[i].size())))
          return false;
    }
    return true;
  }
  // Allocates (zeroed) every buffer the current options use, so step() does not allocate.
  void allocate_needed(std::size_t i) {
    const options_type& o = m_group_options[m_group_of[i]];
    for (std::size_t f = 0; f < num_fields; ++f) {
      if (!Algorithm::uses_field(o, f)) continue;
      const bool fresh = m_states[i].fields[f].data() == nullptr;
      ensure_allocated(i, f);
      // Buffers that start at a value (zeros, or Adagrad's initial accumulator) hold state from
      // the start; lazily created ones (SGD momentum) become present in the kernel launcher.
      if (fresh && Algorithm::initialize_field(o, f, m_states[i].fields[f]))
        m_states[i].present[f] = true;
    }
  }
  static const StateTensor& entry(const StateDict& d, const std::string& name) {
    auto it = d.tensors.find(name);
    LATHER_THROW_IF(it == d.tensors.end(), "lather::", Algorithm::name,
                    "::load_state_dict: missing entry '", name, "'");
    return it->second;
  }
  bool known_entry(const std::string& name) const {
    for (std::size_t i = 0; i < m_params.size(); ++i) {
      const std::string key = "state." + std::to_string(i) + ".";
      if (name == key + "step") return true;
      for (const char* f : Algorithm::field_names)
        if (name == key + f) return true;
    }
    for (std::size_t g = 0; g < num_groups(); ++g) {
      const std::string key = "param_groups." + std::to_string(g) + ".";
      if (name == key + "num_params") return true;
      if (name.starts_with(key) && options_io::is_option<options_type>(std::string_view(name).substr(key.size())))
        return true;
    }
    return false;
  }
  std::vector<tensor_type> m_params;
  std::vector<std::string> m_names;
  std::vector<std::size_t> m_group_of;
  std::vector<std::size_t> m_group_begin;
  std::vector<options_type> m_group_options;
  std::vector<state_type> m_states;
  // Host chunk loop (kernels/host_chunks.hpp): an Algorithm with `host_job_type<T, M>` and
  // `host_job(...)` runs the element updates of all parameters it accepts in one parallel loop.
  template <class A, class = void>
  struct host_jobs {
    using type = int;
    static constexpr bool value = false;
  };
  template <class A>
  struct host_jobs<A, std::void_t<typename A::template host_job_type<value_type, memory_space>>> {
    using type = typename A::template host_job_type<value_type, memory_space>;
    static constexpr bool value = true;
  };
  static constexpr bool has_host_jobs = host_jobs<Algorithm>::value;
  std::vector<typename host_jobs<Algorithm>::type> m_jobs;  // reserved for every parameter
  kernels::HostChunkTable m_job_chunks;
  // The portable multi-tensor loop (kernels/multi_tensor.hpp): every contiguous parameter on
  // devices, and on host spaces those the host chunk loop does not take (or all of them with
  // set_portable_kernels(true)). Its job is the algorithm's contiguous element kernel.
  using multi_job_type = decltype(Algorithm::template step_kernel<true>(
      std::declval<const options_type&>(), std::declval<state_type&>(), std::declval<const tensor_type&>(),
      std::declval<const TensorRef<const value_type, memory_space>&>()));
  kernels::MultiTensorTable<ExecSpace, memory_space, multi_job_type> m_multi;
  // A gated step's host bookkeeping before it (reserved: no allocation in step()).
  struct Saved {
    std::size_t index;
    std::int64_t step;
    std::array<bool, num_fields> present;
  };
  std::vector<Saved> m_saved;
  bool m_portable_kernels = false;
  bool m_check_finite = true;
  NonFinitePolicy m_nonfinite_policy = NonFinitePolicy::raise;
  GradientIntake<value_type, memory_space, ExecSpace> m_intake;
};

}  // namespace lather::impl

#endif
