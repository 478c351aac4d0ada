// SPDX-License-Identifier: Apache-2.0
/// \file
/// \brief Private. The machinery of the optimizers whose state is not element-wise (Adafactor,
/// CAME, GaLore, LAMB) and that run on tensor-parallel / ZeRO-sharded parameters: parameter
/// groups, per-parameter Sharding, the TP and DP communicators, gradient checks agreed across
/// ranks, per-parameter state of any shape, learning-rate changes and state dictionaries. An
/// Algorithm policy supplies the options, the state and the step.
///
/// Algorithm requirements:
/// - `options_type` (with `lr` and `visit_fields`), `static constexpr const char* name`,
///   `static void validate(const options_type&, const OptionCheck&)`;
/// - `template <class T, class M> struct State` with `template <class F> void visit(F&& f)` calling
///   `f(name, view, shape)` for every buffer (rank-1 Views of float, double, std::uint8_t or
///   std::int64_t; `shape` the logical shape stored in state dicts);
/// - `template <class T, class M> static State<T, M> make_state(const options_type&, const Sharding&,
///   std::int64_t numel)`: every buffer allocated (and initialized) here, so step() does not allocate;
/// - `template <class Ctx> static void step(Ctx& ctx)` over the parameters in `ctx.active`;
/// - optionally `template <class T, class M> struct Scratch` (default-constructible): what the
///   step needs from one step to the next besides the state (reduction buffers, the step's
///   per-parameter lists, host copies), kept by the optimizer and reached as `ctx.scratch`, so
///   that a step allocates nothing after the first (it sizes the scratch; vectors are cleared,
///   never shrunk).
#ifndef LATHER_IMPL_SHARDED_OPTIMIZER_HPP
#define LATHER_IMPL_SHARDED_OPTIMIZER_HPP

#include <lather/comm/serial_communicator.hpp>
#include <lather/concepts/communicator.hpp>
#include <lather/concepts/execution.hpp>
#include <lather/concepts/tensor.hpp>
#include <lather/error.hpp>
#include <lather/impl/gradients.hpp>
#include <lather/impl/option_check.hpp>
#include <lather/impl/options_io.hpp>
#include <lather/io/state_dict.hpp>
#include <lather/layout/sharding.hpp>
#include <lather/optimizers/param_group.hpp>

#include <Kokkos_Core.hpp>

#include <cmath>
#include <concepts>
#include <cstdint>
#include <ranges>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

namespace lather {

/// \brief How an optimizer's parameters are distributed: the tensor-parallel and data-parallel
/// (ZeRO) communicators and one Sharding per parameter (group order).
///
/// Every rank of both groups constructs the optimizer with the same parameter list (its own
/// shards) and options, and calls step() together. A group of one (SerialCommunicator, or an
/// MpiCommunicator of one rank) means "not split over that group".
template <concepts::Communicator Comm>
struct Distribution {
  Comm tp{};
  Comm dp{};
  std::vector<Sharding> shardings{};  ///< empty: every parameter whole on this rank
};

namespace impl {

/// What an Algorithm's step sees: the parameters with a gradient this step and everything about them.
template <class T, class M, class ExecSpace, class Comm, class Options, class State, class Scratch>
struct ShardedStepContext {
  using value_type = T;
  using memory_space_type = M;
  using execution_space = ExecSpace;

  const ExecSpace& space;
  const Comm& tp;
  const Comm& dp;
  const std::vector<std::size_t>& active;  ///< parameters with a gradient this step, in order
  std::vector<TensorRef<T, M>>& params;
  std::vector<TensorRef<const T, M>>& grads;
  std::vector<State>& states;
  const std::vector<Sharding>& shardings;
  const std::vector<std::int64_t>& steps;     ///< already incremented for this step
  const std::vector<const Options*>& options;  ///< per parameter
  Scratch& scratch;                            ///< the Algorithm's Scratch (NoScratch without one)

  /// Whether this rank counts parameter i's piece in a sum over both groups: a piece replicated
  /// over a group (not split by it) is counted by that group's rank 0 only.
  [[nodiscard]] bool owns_piece(std::size_t i) const {
    const Sharding& s = shardings[i];
    return (s.tp_split() || tp.rank() == 0) && (s.zero || dp.rank() == 0);
  }

  /// Sums `v` (host, double) over both groups: the ranks of the TP group and of the DP group
  /// together hold every piece once when each contribution is counted by its owner.
  void all_reduce_host(Kokkos::View<double*, Kokkos::HostSpace> v) const {
    if (dp.size() > 1) dp.all_reduce_sum(Kokkos::DefaultHostExecutionSpace(), v);
    if (tp.size() > 1) tp.all_reduce_sum(Kokkos::DefaultHostExecutionSpace(), v);
  }
};

/// The scratch of an Algorithm without one.
struct NoScratch {};
template <class Algorithm, class T, class M>
struct ScratchOf {
  using type = NoScratch;
};
template <class Algorithm, class T, class M>
  requires requires { typename Algorithm::template Scratch<T, M>; }
struct ScratchOf<Algorithm, T, M> {
  using type = typename Algorithm::template Scratch<T, M>;
};

template <class Param, class ExecSpace, class Comm, class Algorithm>
class ShardedOptimizer {
  static_assert(check_valid_tensor_traits<Param>());
  using traits = traits_of<Param>;

 public:
  using param_type = Param;
  using execution_space = ExecSpace;
  using communicator_type = Comm;
  using value_type = typename traits::value_type;
  using memory_space = typename traits::memory_space;
  using options_type = typename Algorithm::options_type;
  using group_type = ParamGroup<Param, options_type>;
  using tensor_type = TensorRef<value_type, memory_space>;
  using state_type = typename Algorithm::template State<value_type, memory_space>;
  using scratch_type = typename ScratchOf<Algorithm, value_type, memory_space>::type;
  using distribution_type = Distribution<Comm>;

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
  ShardedOptimizer(const ShardedOptimizer&) = delete;
  ShardedOptimizer& operator=(const ShardedOptimizer&) = delete;
  ShardedOptimizer(ShardedOptimizer&&) = default;
  ShardedOptimizer& operator=(ShardedOptimizer&&) = default;
  ~ShardedOptimizer() = default;

  /// One group of whole parameters on this rank (single device).
  explicit ShardedOptimizer(std::span<Param> params, options_type options = {}, std::vector<std::string> names = {})
      : ShardedOptimizer(std::vector<group_type>{group_type{params, options, std::move(names)}}) {}
  /// One group of sharded parameters. (A template so that `Opt(params, {})` means options.)
  template <class D>
    requires std::same_as<std::remove_cvref_t<D>, distribution_type>
  ShardedOptimizer(std::span<Param> params, D&& dist, options_type options = {}, std::vector<std::string> names = {})
      : ShardedOptimizer(std::vector<group_type>{group_type{params, options, std::move(names)}},
                         distribution_type(std::forward<D>(dist))) {}
  /// Several parameter groups, each with its own options; `dist` says how they are sharded.
  explicit ShardedOptimizer(std::vector<group_type> groups, distribution_type dist = {})
      : m_tp(std::move(dist.tp)), m_dp(std::move(dist.dp)) {
    LATHER_THROW_IF(groups.empty(), "lather::", Algorithm::name, ": no parameter groups given; pass at least one parameter");
    std::size_t total = 0;
    for (std::size_t g = 0; g < groups.size(); ++g) {
      Algorithm::validate(groups[g].options, group_check(g));
      LATHER_THROW_IF(groups[g].params.empty(), "lather::", Algorithm::name, ": parameter group ", g,
                      " is empty; every group needs at least one parameter");
      LATHER_THROW_IF(!groups[g].names.empty() && groups[g].names.size() != groups[g].params.size(), "lather::",
                      Algorithm::name, ": parameter group ", g, " has ", groups[g].params.size(), " parameters but ",
                      groups[g].names.size(), " names; give one name per parameter or none");
      total += groups[g].params.size();
    }
    LATHER_THROW_IF(!dist.shardings.empty() && dist.shardings.size() != total, "lather::", Algorithm::name, ": got ",
                    dist.shardings.size(), " shardings for ", total,
                    " parameters; give one Sharding per parameter (group order) or none");
    m_params.reserve(total);
    for (std::size_t g = 0; g < groups.size(); ++g) {
      m_group_options.push_back(groups[g].options);
      m_group_begin.push_back(m_params.size());
      for (std::size_t k = 0; k < groups[g].params.size(); ++k) {
        const std::size_t index = m_params.size();
        m_names.push_back(groups[g].names.empty() ? std::string() : groups[g].names[k]);
        tensor_type ref = tensor_ref(groups[g].params[k]);
        LATHER_THROW_IF(ref.data() == nullptr && ref.size() > 0, "lather::", Algorithm::name, ": ", describe(index),
                        " has no data (null pointer)");
        for (std::size_t j = 0; j < index; ++j)
          LATHER_THROW_IF(ref.size() > 0 && m_params[j].data() == ref.data(), "lather::", Algorithm::name, ": ",
                          describe(index), " and ", describe(j),
                          " share memory; each parameter may appear only once");
        m_params.push_back(ref);
        m_group_of.push_back(g);
        m_shardings.push_back(dist.shardings.empty() ? Sharding::whole(shape_of(ref)) : dist.shardings[index]);
        check_sharding(index);
      }
    }
    m_group_begin.push_back(m_params.size());
    check_agreement();
    m_intake = GradientIntake<value_type, memory_space, ExecSpace>(Algorithm::name, m_params.size());
    m_steps.assign(m_params.size(), 0);
    m_steps_before.assign(m_params.size(), 0);
    m_active.reserve(m_params.size());
    m_step_options.reserve(m_params.size());
    m_presence.assign(m_params.size(), 0);
    m_presence_sums = Kokkos::View<double*, Kokkos::HostSpace>(
        Kokkos::view_alloc(Kokkos::WithoutInitializing, "lather::group_counts"), m_params.size());
    if constexpr (requires { m_scratch.reserve(std::size_t{}); }) m_scratch.reserve(m_params.size());
    m_states.reserve(m_params.size());
    for (std::size_t i = 0; i < m_params.size(); ++i)
      m_states.push_back(Algorithm::template make_state<value_type, memory_space>(
          m_group_options[m_group_of[i]], m_shardings[i], m_params[i].size()));
  }

  // ---- the step ------------------------------------------------------------------------------

  /// \brief Applies one step with `grads` (one per parameter, in group order; the gradient of
  /// this rank's shard) on `space`. Every rank of the TP and DP groups calls it together.
  ///
  /// A gradient with no data means "no gradient this step" (torch's `grad is None`); it must be
  /// absent on every rank that holds a piece of the parameter (checked: a clear error, never a
  /// hang). Gradients are checked (shapes, aliasing, NaN/Inf agreed across ranks) before
  /// anything changes; on an error nothing changes on any rank.
  template <std::ranges::random_access_range Grads>
    requires concepts::Tensor<std::ranges::range_value_t<Grads>>
  void step(const ExecSpace& space, const Grads& grads) {
    static const std::string region = std::string("lather::") + Algorithm::name + "::step";  // built once
    Kokkos::Profiling::pushRegion(region);
    using G = std::ranges::range_value_t<Grads>;
    static_assert(std::is_same_v<typename traits_of<G>::value_type, value_type>,
                  "lather: gradient value_type must equal the parameters' value_type");
    static_assert(Kokkos::SpaceAccessibility<ExecSpace, typename traits_of<G>::memory_space>::accessible,
                  "lather: the execution space cannot access the gradients' memory space");
    const auto describe_param = [this](std::size_t i) { return describe(i); };
    auto& g = m_intake.convert(grads, m_params, describe_param);
    check_presence(g);
    if (m_check_finite &&
        m_intake.screen(space, g, m_params, describe_param,
                        "Skip this batch, lower the learning rate or add gradient clipping", m_nonfinite_policy,
                        distributed() ? std::function<void(std::vector<std::int64_t>&)>(
                                            [this](std::vector<std::int64_t>& c) { sum_over_groups(c); })
                                      : std::function<void(std::vector<std::int64_t>&)>())) {
      Kokkos::Profiling::popRegion();
      return;  // NonFinitePolicy::skip_step: nothing changes
    }
    // The step's lists are members, cleared and refilled (sized at construction): no allocation.
    m_step_options.clear();
    m_active.clear();
    m_steps_before.assign(m_steps.begin(), m_steps.end());
    for (std::size_t i = 0; i < m_params.size(); ++i) {
      m_step_options.push_back(&m_group_options[m_group_of[i]]);
      if (!m_intake.has_gradient(g[i], m_params[i]) || m_shardings[i].global_numel() == 0) continue;
      m_active.push_back(i);
      m_steps[i] += 1;
    }
    ShardedStepContext<value_type, memory_space, ExecSpace, Comm, options_type, state_type, scratch_type> ctx{
        space, m_tp, m_dp, m_active, m_params, g, m_states, m_shardings, m_steps, m_step_options, m_scratch};
    try {
      Algorithm::step(ctx);
    } catch (...) {
      // An algorithm raises before it changes parameters or state (e.g. a failed SVD): the step
      // did not happen.
      m_steps.assign(m_steps_before.begin(), m_steps_before.end());
      Kokkos::Profiling::popRegion();
      throw;
    }
    Kokkos::Profiling::popRegion();
  }

  /// step() on a default-constructed instance of the execution space.
  template <std::ranges::random_access_range Grads>
    requires concepts::Tensor<std::ranges::range_value_t<Grads>>
  void step(const Grads& grads) {
    step(ExecSpace(), grads);
  }

  /// Whether step() checks every gradient for NaN and Inf before changing anything (on by default).
  void set_check_finite(bool on) noexcept { m_check_finite = on; }
  [[nodiscard]] bool check_finite() const noexcept { return m_check_finite; }
  /// What step() does with a NaN/Inf gradient (NonFinitePolicy::raise by default). Across ranks
  /// the decision is the group's: a NaN in any rank's shard skips the parameter on every rank.
  void set_nonfinite_policy(NonFinitePolicy p) noexcept { m_nonfinite_policy = p; }
  [[nodiscard]] NonFinitePolicy nonfinite_policy() const noexcept { return m_nonfinite_policy; }
  [[nodiscard]] std::int64_t nonfinite_skips(std::size_t i) const {
    check_param(i);
    return m_intake.nonfinite_skips(i);
  }
  [[nodiscard]] std::int64_t skipped_steps() const noexcept { return m_intake.skipped_steps(); }

  // ---- options -------------------------------------------------------------------------------

  [[nodiscard]] std::size_t num_groups() const noexcept { return m_group_options.size(); }
  [[nodiscard]] std::size_t num_params() const noexcept { return m_params.size(); }
  [[nodiscard]] const options_type& options(std::size_t g = 0) const {
    check_group(g);
    return m_group_options[g];
  }
  /// Replaces group `g`'s options after validating them. Options that size the state (e.g.
  /// GaLore's rank) cannot change: construct a new optimizer.
  void set_options(std::size_t g, const options_type& o) {
    check_group(g);
    Algorithm::validate(o, group_check(g));
    if constexpr (requires { Algorithm::same_state_layout(o, o); })
      LATHER_THROW_IF(!Algorithm::same_state_layout(m_group_options[g], o), "lather::", Algorithm::name,
                      ": parameter group ", g,
                      ": these options change the shape of the optimizer state; construct a new optimizer instead");
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
  void set_lr(std::size_t g, double lr) {
    check_group(g);
    options_type o = m_group_options[g];
    o.lr = lr;
    set_options(g, o);
  }

  // ---- inspection ----------------------------------------------------------------------------

  [[nodiscard]] const tensor_type& param(std::size_t i) const {
    check_param(i);
    return m_params[i];
  }
  [[nodiscard]] const std::string& param_name(std::size_t i) const {
    check_param(i);
    return m_names[i];
  }
  [[nodiscard]] const Sharding& sharding(std::size_t i) const {
    check_param(i);
    return m_shardings[i];
  }
  [[nodiscard]] std::int64_t step_count(std::size_t i) const {
    check_param(i);
    return m_steps[i];
  }
  [[nodiscard]] const Comm& tp_communicator() const noexcept { return m_tp; }
  [[nodiscard]] const Comm& dp_communicator() const noexcept { return m_dp; }
  /// Whether any parameter is split over more than one rank.
  [[nodiscard]] bool distributed() const noexcept { return m_tp.size() > 1 || m_dp.size() > 1; }

  /// State buffer `name` of parameter `i` as a host tensor (its logical shape); throws naming
  /// the buffers when there is none of that name.
  [[nodiscard]] StateTensor state(std::size_t i, const std::string& name) const {
    check_param(i);
    StateTensor out;
    bool found = false;
    std::string names;
    const_cast<state_type&>(m_states[i]).visit([&](const char* n, const auto& view, const std::vector<std::int64_t>& shape) {
      names += (names.empty() ? "'" : ", '") + std::string(n) + "'";
      if (name == n) {
        out = to_state_tensor(view, shape);
        found = true;
      }
    });
    LATHER_THROW_IF(!found, "lather::", Algorithm::name, ": ", describe(i), " has no state buffer '", name,
                    "'; it has ", names.empty() ? std::string("none") : names);
    return out;
  }

  /// Bytes of optimizer state this rank holds (every buffer of every parameter).
  [[nodiscard]] std::size_t state_bytes() const {
    std::size_t bytes = 0;
    for (const auto& s : m_states)
      const_cast<state_type&>(s).visit([&](const char*, const auto& view, const std::vector<std::int64_t>&) {
        bytes += view.span() * sizeof(typename std::decay_t<decltype(view)>::value_type);
      });
    return bytes;
  }

  // ---- state dictionaries --------------------------------------------------------------------

  /// \brief This rank's complete state (its shards' buffers, step counts, every group's options)
  /// copied to host memory.
  [[nodiscard]] StateDict state_dict() const {
    StateDict d;
    d.format = format_name();
    for (std::size_t i = 0; i < m_params.size(); ++i) {
      const std::string key = "state." + std::to_string(i) + ".";
      d.tensors[key + "step"] = StateTensor{{}, std::vector<std::int64_t>{m_steps[i]}};
      const_cast<state_type&>(m_states[i]).visit([&](const char* n, const auto& view, const std::vector<std::int64_t>& shape) {
        d.tensors[key + n] = to_state_tensor(view, shape);
      });
    }
    for (std::size_t g = 0; g < num_groups(); ++g) {
      const std::string key = "param_groups." + std::to_string(g) + ".";
      d.tensors[key + "num_params"] = StateTensor{
          {}, std::vector<std::int64_t>{static_cast<std::int64_t>(m_group_begin[g + 1] - m_group_begin[g])}};
      options_io::write(d, key, m_group_options[g]);
    }
    return d;
  }

  /// \brief Restores state saved by state_dict() of an optimizer over the same parameters,
  /// shardings and options (only `lr` is restored from the dictionary). Every entry is checked
  /// first; on any error nothing changes.
  void load_state_dict(const StateDict& d) {
    LATHER_THROW_IF(d.format != format_name(), "lather::", Algorithm::name, "::load_state_dict: the dictionary is a '",
                    d.format, "' state, expected '", format_name(), "'");
    std::vector<options_type> new_options = m_group_options;
    std::size_t expected_entries = 0;
    const auto entry = [&](const std::string& name) -> const StateTensor& {
      auto it = d.tensors.find(name);
      LATHER_THROW_IF(it == d.tensors.end(), "lather::", Algorithm::name, "::load_state_dict: missing entry '", name,
                      "' (saved from different parameters or a different optimizer?); nothing was changed");
      return it->second;
    };
    for (std::size_t g = 0; g < num_groups(); ++g) {
      const std::string key = "param_groups." + std::to_string(g) + ".";
      const StateTensor& np = entry(key + "num_params");
      const auto want = static_cast<std::int64_t>(m_group_begin[g + 1] - m_group_begin[g]);
      LATHER_THROW_IF(!options_io::holds_scalar<std::int64_t>(np) || std::get<std::vector<std::int64_t>>(np.values)[0] != want,
                      "lather::", Algorithm::name, "::load_state_dict: parameter group ", g,
                      " has a different number of parameters in the dictionary (expected ", want, ")");
      ++expected_entries;
      new_options[g] = options_io::read_checked(entry, key, m_group_options[g], Algorithm::name, g, expected_entries);
      Algorithm::validate(new_options[g], OptionCheck(Algorithm::name, concat("load_state_dict: parameter group ", g)));
    }
    std::vector<std::int64_t> steps(m_params.size());
    for (std::size_t i = 0; i < m_params.size(); ++i) {
      const std::string key = "state." + std::to_string(i) + ".";
      const StateTensor& st = entry(key + "step");
      LATHER_THROW_IF(!options_io::holds_scalar<std::int64_t>(st) || std::get<std::vector<std::int64_t>>(st.values)[0] < 0,
                      "lather::", Algorithm::name, "::load_state_dict: '", key, "step' must be a non-negative int64 scalar");
      steps[i] = std::get<std::vector<std::int64_t>>(st.values)[0];
      ++expected_entries;
      const_cast<state_type&>(m_states[i]).visit([&](const char* n, const auto& view, const std::vector<std::int64_t>& shape) {
        const StateTensor& t = entry(key + n);
        ++expected_entries;
        const StateTensor want_like = empty_like(view, shape);
        LATHER_THROW_IF(t.values.index() != want_like.values.index(), "lather::", Algorithm::name,
                        "::load_state_dict: '", key, n, "' is ", t.dtype(), " but ", describe(i), "'s buffer is ",
                        want_like.dtype(), "; nothing was changed");
        LATHER_THROW_IF(t.shape != shape || t.stored_size() != view.span(), "lather::", Algorithm::name,
                        "::load_state_dict: '", key, n, "' has a different shape than ", describe(i),
                        "'s buffer (saved with another sharding or options?); nothing was changed");
        if constexpr (std::is_same_v<typename std::decay_t<decltype(view)>::value_type, std::uint8_t>) {
          for (auto x : std::get<std::vector<std::int64_t>>(t.values))
            LATHER_THROW_IF(x < 0 || x > 255, "lather::", Algorithm::name, "::load_state_dict: '", key, n,
                            "' holds 8-bit codes but has the value ", x, "; nothing was changed");
        }
      });
    }
    if (d.tensors.size() != expected_entries)
      for (const auto& [name, t] : d.tensors)
        LATHER_THROW_IF(!known_entry(name), "lather::", Algorithm::name, "::load_state_dict: unknown entry '", name,
                        "' (saved from different parameters or a different optimizer?); nothing was changed");
    // Pass 2: apply.
    m_group_options = std::move(new_options);
    m_steps = std::move(steps);
    for (std::size_t i = 0; i < m_params.size(); ++i) {
      const std::string key = "state." + std::to_string(i) + ".";
      m_states[i].visit([&](const char* n, const auto& view, const std::vector<std::int64_t>&) {
        from_state_tensor(d.tensors.at(key + n), view);
      });
    }
  }

 protected:
  [[nodiscard]] std::string describe(std::size_t i) const {
    std::string s = "parameter " + std::to_string(i);
    if (i < m_names.size() && !m_names[i].empty()) s += " ('" + m_names[i] + "')";
    if (i < m_group_of.size() && m_group_begin.size() > 2) s += " in group " + std::to_string(m_group_of[i]);
    return s;
  }
  /// The Algorithm's scratch (see the file comment), for optimizers that report or release it.
  [[nodiscard]] scratch_type& scratch() noexcept { return m_scratch; }
  [[nodiscard]] const scratch_type& scratch() const noexcept { return m_scratch; }

 private:
  static std::string format_name() { return std::string("lather.") + Algorithm::name + ".v1"; }
  OptionCheck group_check(std::size_t g) const {
    return OptionCheck(Algorithm::name, "parameter group " + std::to_string(g));
  }
  void check_group(std::size_t g) const {
    LATHER_THROW_IF(g >= num_groups(), "lather::", Algorithm::name, ": no parameter group ", g, " (there are ",
                    num_groups(), ")");
  }
  void check_param(std::size_t i) const {
    LATHER_THROW_IF(i >= num_params(), "lather::", Algorithm::name, ": no parameter ", i, " (there are ",
                    num_params(), ")");
  }

  void check_sharding(std::size_t i) const {
    const Sharding& s = m_shardings[i];
    s.validate();
    const std::int64_t n = m_params[i].size();
    LATHER_THROW_IF(s.tp_split() && s.tp_size != m_tp.size(), "lather::", Algorithm::name, ": ", describe(i),
                    " is split over ", s.tp_size, " tensor-parallel ranks but the TP communicator has ", m_tp.size(),
                    " ranks");
    LATHER_THROW_IF(s.tp_split() && s.tp_rank != m_tp.rank(), "lather::", Algorithm::name, ": ", describe(i),
                    " holds the slice of TP rank ", s.tp_rank, " but this is TP rank ", m_tp.rank());
    LATHER_THROW_IF(s.zero ? !s.accepts_numel(n) : n != s.local_numel(), "lather::", Algorithm::name, ": ",
                    describe(i), " has ", n, " elements but its sharding ", s.describe(), " holds ",
                    s.zero ? concat(s.valid_numel(), " (", s.stored_numel(), " with padding)") : concat(s.local_numel()),
                    "; pass the tensor of this rank's shard");
  }

  // Every rank must agree on the parameters' global shapes, shardings' kinds and options: a
  // mismatch would otherwise hang a collective or silently diverge.
  void check_agreement() {
    if (!distributed()) return;
    std::vector<double> sig;
    sig.push_back(static_cast<double>(m_params.size()));
    for (std::size_t i = 0; i < m_params.size(); ++i) {
      const Sharding& s = m_shardings[i];
      sig.push_back(static_cast<double>(s.rank()));
      for (auto e : s.global_shape) sig.push_back(static_cast<double>(e));
      sig.push_back(s.tp_dim);
      sig.push_back(s.zero ? 1.0 : 0.0);
      options_type o = m_group_options[m_group_of[i]];
      options_type::visit_fields(o, [&](const char*, auto& v) { append(sig, v); });
    }
    // Same length everywhere first (else the next all-reduce would mismatch).
    Kokkos::View<double*, Kokkos::HostSpace> len("lather::agreement_len", 2);
    len(0) = static_cast<double>(sig.size());
    len(1) = len(0) * len(0);
    sum_view(len);
    const double ranks = static_cast<double>(m_tp.size() * m_dp.size());
    LATHER_THROW_IF(len(0) * len(0) != len(1) * ranks, "lather::", Algorithm::name,
                    ": the ranks were constructed with different numbers of parameters or different parameter "
                    "ranks; every rank must pass the same parameter list (its own shards of it)");
    Kokkos::View<double*, Kokkos::HostSpace> v("lather::agreement", 2 * sig.size());
    for (std::size_t k = 0; k < sig.size(); ++k) {
      v(2 * k) = sig[k];
      v(2 * k + 1) = sig[k] * sig[k];
    }
    sum_view(v);
    for (std::size_t k = 0; k < sig.size(); ++k) {
      // All equal <=> (sum x)^2 == n * sum x^2 (Cauchy-Schwarz); the values are small integers
      // or option values, compared with a relative tolerance for the rounding of the sums.
      const double lhs = v(2 * k) * v(2 * k), rhs = ranks * v(2 * k + 1);
      LATHER_THROW_IF(std::abs(lhs - rhs) > 1e-12 * std::max(1.0, std::abs(rhs)), "lather::", Algorithm::name,
                      ": the ranks disagree on ", describe_signature_entry(k),
                      "; every rank must construct the optimizer with the same global shapes, sharding kinds and "
                      "options");
    }
  }
  static void append(std::vector<double>& sig, double v) { sig.push_back(v); }
  static void append(std::vector<double>& sig, bool v) { sig.push_back(v ? 1.0 : 0.0); }
  static void append(std::vector<double>& sig, std::int64_t v) { sig.push_back(static_cast<double>(v)); }
  template <class E>
    requires std::is_enum_v<E>
  static void append(std::vector<double>& sig, E v) {
    sig.push_back(static_cast<double>(v));
  }
  template <std::size_t N>
  static void append(std::vector<double>& sig, const std::array<double, N>& v) {
    for (double x : v) sig.push_back(x);
  }
  std::string describe_signature_entry(std::size_t k) const {
    std::size_t pos = 1;
    if (k == 0) return "the number of parameters";
    for (std::size_t i = 0; i < m_params.size(); ++i) {
      const Sharding& s = m_shardings[i];
      const std::size_t shape_end = pos + 1 + s.global_shape.size();
      if (k < shape_end) return "the global shape of " + describe(i);
      if (k == shape_end) return "the split dimension (tp_dim) of " + describe(i);
      if (k == shape_end + 1) return "whether " + describe(i) + " is ZeRO-sharded";
      pos = shape_end + 2;
      std::string found;
      options_type o = m_group_options[m_group_of[i]];
      options_type::visit_fields(o, [&](const char* name, auto& v) {
        std::vector<double> tmp;
        append(tmp, v);
        if (found.empty() && k < pos + tmp.size()) found = concat("option '", name, "' of ", describe(i));
        pos += tmp.size();
      });
      if (!found.empty()) return found;
    }
    return "the parameters";
  }

  // A parameter must have a gradient on every rank or on none: otherwise some ranks would wait
  // in a collective the others never enter.
  void check_presence(const std::vector<TensorRef<const value_type, memory_space>>& g) {
    if (!distributed()) return;
    std::vector<std::int64_t>& total = m_presence;  // a member: no allocation per step
    for (std::size_t i = 0; i < m_params.size(); ++i) total[i] = m_intake.has_gradient(g[i], m_params[i]) ? 1 : 0;
    sum_over_groups(total);
    const std::int64_t ranks = m_tp.size() * m_dp.size();
    for (std::size_t i = 0; i < m_params.size(); ++i)
      LATHER_THROW_IF(total[i] != 0 && total[i] != ranks, "lather::", Algorithm::name, "::step: ", describe(i),
                      " has a gradient on ", total[i], " of ", ranks,
                      " ranks; pass it on every rank (a zero gradient) or on none; nothing was changed");
  }
  // Per-parameter counts (presence, NaN/Inf screens) summed over both groups, through a buffer
  // made at construction (one entry per parameter; larger lists get their own).
  void sum_over_groups(std::vector<std::int64_t>& c) const {
    Kokkos::View<double*, Kokkos::HostSpace> v;
    if (c.size() <= m_presence_sums.extent(0)) v = Kokkos::subview(m_presence_sums, std::make_pair(std::size_t{0}, c.size()));
    else v = Kokkos::View<double*, Kokkos::HostSpace>("lather::group_counts", c.size());
    for (std::size_t k = 0; k < c.size(); ++k) v(k) = static_cast<double>(c[k]);
    sum_view(v);
    for (std::size_t k = 0; k < c.size(); ++k) c[k] = static_cast<std::int64_t>(std::llround(v(k)));
  }
  void sum_view(const Kokkos::View<double*, Kokkos::HostSpace>& v) const {
    if (m_dp.size() > 1) m_dp.all_reduce_sum(Kokkos::DefaultHostExecutionSpace(), v);
    if (m_tp.size() > 1) m_tp.all_reduce_sum(Kokkos::DefaultHostExecutionSpace(), v);
  }

  template <class View>
  static StateTensor empty_like(const View&, const std::vector<std::int64_t>& shape) {
    using V = typename View::non_const_value_type;
    if constexpr (std::is_same_v<V, float>) return {shape, std::vector<float>{}};
    else if constexpr (std::is_same_v<V, double>) return {shape, std::vector<double>{}};
    else return {shape, std::vector<std::int64_t>{}};  // uint8 codes and int64 counters
  }
  template <class View>
  static StateTensor to_state_tensor(const View& view, const std::vector<std::int64_t>& shape) {
    using V = typename View::non_const_value_type;
    auto h = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), view);
    StateTensor t = empty_like(view, shape);
    std::visit(
        [&](auto& out) {
          using O = typename std::decay_t<decltype(out)>::value_type;
          out.resize(h.span());
          for (std::size_t k = 0; k < h.span(); ++k) out[k] = static_cast<O>(h.data()[k]);
        },
        t.values);
    static_cast<void>(sizeof(V));
    return t;
  }
  template <class View>
  static void from_state_tensor(const StateTensor& t, const View& view) {
    using V = typename View::non_const_value_type;
    auto h = Kokkos::create_mirror_view(view);
    std::visit(
        [&](const auto& in) {
          for (std::size_t k = 0; k < h.span(); ++k) h.data()[k] = static_cast<V>(in[k]);
        },
        t.values);
    Kokkos::deep_copy(view, h);
  }
  bool known_entry(const std::string& name) const {
    for (std::size_t i = 0; i < m_params.size(); ++i) {
      const std::string key = "state." + std::to_string(i) + ".";
      if (name == key + "step") return true;
      bool found = false;
      const_cast<state_type&>(m_states[i]).visit([&](const char* n, const auto&, const std::vector<std::int64_t>&) {
        found = found || name == key + n;
      });
      if (found) return true;
    }
    for (std::size_t g = 0; g < num_groups(); ++g) {
      const std::string key = "param_groups." + std::to_string(g) + ".";
      if (name == key + "num_params") return true;
      if (name.starts_with(key) && options_io::is_option<options_type>(std::string_view(name).substr(key.size())))
        return true;
    }
    return false;
  }

  Comm m_tp;
  Comm m_dp;
  std::vector<tensor_type> m_params;
  std::vector<std::string> m_names;
  std::vector<Sharding> m_shardings;
  std::vector<std::size_t> m_group_of;
  std::vector<std::size_t> m_group_begin;
  std::vector<options_type> m_group_options;
  std::vector<state_type> m_states;
  std::vector<std::int64_t> m_steps;
  // The step's working lists and the Algorithm's scratch, kept between steps (see step()).
  std::vector<std::int64_t> m_steps_before;
  std::vector<std::size_t> m_active;
  std::vector<const options_type*> m_step_options;
  std::vector<std::int64_t> m_presence;
  Kokkos::View<double*, Kokkos::HostSpace> m_presence_sums;
  scratch_type m_scratch{};
  bool m_check_finite = true;
  NonFinitePolicy m_nonfinite_policy = NonFinitePolicy::raise;
  GradientIntake<value_type, memory_space, ExecSpace> m_intake;
};

}  // namespace impl
}  // namespace lather

#endif
