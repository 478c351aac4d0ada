// SPDX-License-Identifier: Apache-2.0
/// \file
/// \brief Shampoo: Meta's DistributedShampoo (single process), as a class template over the
/// parameter type, execution space, root-inverse strategy, grafting policy and precision.
///
/// Semantics follow DistributedShampoo step by step (docs/shampoo.md): parameters are merged and
/// blocked (merge_small_dims, multi_dim_split); each block keeps Kronecker factors
/// L_k = beta2 L_k + w G_(k) G_(k)^T per preconditioned dimension, whose inverse roots are
/// recomputed on amortized steps; the direction is the filtered gradient multiplied by the
/// inverse factors along every dimension, optionally grafted per block; then decoupled weight
/// decay, momentum and the learning rate.
#ifndef LATHER_OPTIMIZERS_SHAMPOO_HPP
#define LATHER_OPTIMIZERS_SHAMPOO_HPP

#include <lather/comm/serial_communicator.hpp>
#include <lather/concepts/communicator.hpp>
#include <lather/concepts/execution.hpp>
#include <lather/concepts/root_inverse.hpp>
#include <lather/concepts/tensor.hpp>
#include <lather/error.hpp>
#include <lather/distributed/shampoo_distribution.hpp>
#include <lather/grafting/grafting.hpp>
#include <lather/impl/agreement.hpp>
#include <lather/impl/backends/blas.hpp>
#include <lather/impl/backends/blas_split.hpp>
#include <lather/impl/gradients.hpp>
#include <lather/impl/host_scratch.hpp>
#include <lather/impl/kernels/distributed.hpp>
#include <lather/impl/kernels/diagonal.hpp>
#include <lather/impl/kernels/launch.hpp>
#include <lather/impl/kernels/matrix_functions.hpp>
#include <lather/impl/kernels/multi_tensor.hpp>
#include <lather/impl/kernels/shampoo.hpp>
#include <lather/impl/kernels/shampoo_batched.hpp>
#include <lather/impl/backends/gemm_batches.hpp>
#include <lather/impl/label.hpp>
#include <lather/impl/option_check.hpp>
#include <lather/impl/state_arena.hpp>
#include <lather/io/checkpoint.hpp>
#include <lather/io/state_dict.hpp>
#include <lather/layout/blocking.hpp>
#include <lather/memory.hpp>
#include <lather/optimizers/nonfinite.hpp>
#include <lather/optimizers/param_group.hpp>
#include <lather/preconditioners/preconditioners.hpp>
#include <lather/root_inverse/eigen_root_inverse.hpp>

#include <Kokkos_Core.hpp>
#include <KokkosBlas3_gemm.hpp>

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <exception>
#include <limits>
#include <map>
#include <optional>
#include <ranges>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <variant>
#include <vector>

namespace lather {

/// "Never precondition" for `start_preconditioning_step` (math.inf in DistributedShampoo).
inline constexpr std::int64_t never = unbounded;

/// How `weight_decay` is applied (DistributedShampoo's WeightDecayType).
enum class WeightDecayType {
  l2,           ///< added to the gradient before everything (Adam-style)
  decoupled,    ///< P += wd * W before momentum and -lr (AdamW-style; the default)
  corrected,    ///< P += wd * lr / peak_lr * W (AdamC-style)
  independent,  ///< P += wd / peak_lr * W
};

/// Iterate averaging besides classic momentum (DistributedShampoo's iterate_averaging_config).
enum class IterateAveraging {
  none,                          ///< plain steps (classic momentum through `momentum`)
  generalized_primal_averaging,  ///< GeneralizedPrimalAveragingConfig: mu_x = eval_interp_coeff
  schedule_free,                 ///< ScheduleFreeConfig: mu_x = 1 - lr^p / sum_(i <= t) lr_i^p
};

/// Exponent override for blocks of one order: one exponent for all dimensions and/or one per
/// dimension (the others keep the default). An exponent of 0 means: do not precondition.
struct InverseExponentOverride {
  std::optional<double> all = std::nullopt;
  std::map<int, double> per_dimension{};
};

/// \brief Options of Shampoo, named and defaulted as DistributedShampoo's constructor
/// (DefaultShampooConfig, no grafting, single device). See docs/shampoo.md for each.
struct ShampooOptions {
  double lr = 1e-2;
  std::array<double, 2> betas = {0.9, 1.0};
  double beta3 = -1.0;  ///< -1: beta3 = betas[0]
  double epsilon = 1e-12;
  double weight_decay = 0.0;
  WeightDecayType weight_decay_type = WeightDecayType::decoupled;
  std::optional<double> peak_lr = std::nullopt;    ///< for corrected/independent decay; default: lr
  std::int64_t max_preconditioner_dim = 1024;      ///< lather::unbounded = no blocking
  std::int64_t precondition_frequency = 1;
  std::int64_t start_preconditioning_step = -1;    ///< -1: = precondition_frequency; lather::never
  bool use_bias_correction = true;
  std::int64_t target_parameter_dimensionality = 1;  ///< lather::unbounded = keep all dimensions
  // ClassicMomentumConfig (the seed README's momentum / dampening / use_nesterov)
  double momentum = 0.0;
  double dampening = 0.0;
  bool use_nesterov = false;
  // Root exponents: default -1/(2 * order) per factor.
  std::map<int, InverseExponentOverride> inverse_exponent_override{};  ///< keyed by block order
  std::vector<int> inv_root_override{};  ///< legacy: one root for every order, or one per order (index = order); 0 = default
  double exponent_multiplier = 1.0;      ///< legacy: exponent = exponent_multiplier / root
  // Iterate averaging (GeneralizedPrimalAveragingConfig / ScheduleFreeConfig); excludes momentum.
  IterateAveraging iterate_averaging = IterateAveraging::none;
  double eval_interp_coeff = 0.9;    ///< GPA's mu_x, in [0, 1)
  double train_interp_coeff = 0.8;   ///< mu_y, in (0, 1]: the train point y = mu_y x + (1 - mu_y) z
  double eval_coeff_lr_power = 2.0;  ///< Schedule-Free's p, > 0
  int num_tolerated_failed_amortized_computations = 3;
  /// Store each factor and inverse factor as its row-major upper triangle, d (d + 1) / 2 values
  /// (the reference's default; state-dict tensors are then 1-D).
  bool use_symmetric_packing = true;
  /// Spread the amortized computations (root inverses, eigenbases) of the blocks over the
  /// `precondition_frequency` steps instead of computing all of them on the same step: block n
  /// (in the global order: parameters in order, blocks in order) recomputes on the steps t >
  /// start with t % precondition_frequency == n % precondition_frequency (block 0 keeps the
  /// unstaggered schedule); every block still computes on the start step itself. Removes the
  /// step-time spikes of amortized steps; off by default because it changes the numbers (not in
  /// the reference).
  bool stagger_amortized_computations = false;

  /// The start step after the -1 rule.
  [[nodiscard]] std::int64_t start_step() const {
    return start_preconditioning_step == -1 ? precondition_frequency : start_preconditioning_step;
  }
  [[nodiscard]] double effective_beta3() const { return beta3 == -1.0 ? betas[0] : beta3; }
};

/// Storage precision of the Kronecker factors and their inverse roots (DistributedShampoo's
/// factor_matrix_dtype and inv_factor_matrix_dtype; both float32 by default).
template <class FactorScalar = float, class InverseFactorScalar = FactorScalar>
struct ShampooPrecision {
  using factor_type = FactorScalar;
  using inverse_factor_type = InverseFactorScalar;
};

/// State of one Kronecker factor of one block: the factor and its inverse root, d x d
/// symmetric, stored in full (row-major) or packed (row-major upper triangle; `paired`: the two
/// triangles of one (d + 1) x d buffer, see impl::kernels::SymmetricStorage::tri). Read and
/// written through factor_storage() and inverse_storage(), which know the layout.
template <class F, class Finv, class MemorySpace>
struct ShampooFactorState {
  bool preconditioned = false;
  double root = 0;  ///< the inverse root computed: X = A^(-1/root)
  std::int64_t dim = 0;
  bool packed = false;
  /// Packed, with the inverse root in `factor`'s buffer: its upper triangle the factor (row 0
  /// on), its lower triangle from row 1 the inverse root; `inverse_factor` is empty.
  bool paired = false;
  Kokkos::View<F*, MemorySpace> factor;
  Kokkos::View<Finv*, MemorySpace> inverse_factor;  ///< root-inverse kinds (eigendecomposed: rebuilt from the eigenpairs)
  Kokkos::View<Finv*, MemorySpace> eigenvectors;    ///< eigenbasis kinds: full row-major d x d, column k = eigenvector k
  Kokkos::View<Finv*, MemorySpace> eigenvalues;     ///< eigendecomposed: d, ascending
  [[nodiscard]] impl::kernels::SymmetricStorage<F> factor_storage() const {
    return {factor.data(), dim, packed, std::int8_t(paired ? 1 : 0)};
  }
  [[nodiscard]] impl::kernels::SymmetricStorage<Finv> inverse_storage() const {
    if constexpr (std::is_same_v<F, Finv>)
      if (paired) return {factor.data() + dim, dim, true, 2};
    return {inverse_factor.data(), dim, packed};
  }
};

/// State of one block of one parameter (its filtered gradient, grafting state and momentum live
/// in the parameter's blocked buffers, at [begin, begin + numel)).
template <class F, class Finv, class MemorySpace>
struct ShampooBlockState {
  std::vector<std::int64_t> extent;
  std::int64_t begin = 0;  ///< in the parameter's (or piece's) state buffers, which hold this rank's blocks only
  std::size_t id = 0;      ///< the block's index in the parameter's (or piece's) layout
  std::int64_t ordinal = 0;  ///< its index over every piece's layout blocks (the staggering order)
  std::vector<ShampooFactorState<F, Finv, MemorySpace>> factors;
  int consecutive_failures = 0;
  std::int64_t failed_amortized_computations = 0;  ///< total, for monitoring
};

namespace impl {
/// Where the last step's time went (Shampoo::set_phase_timing), in seconds, for monitoring and
/// benchmarks: perf's sampling distorts memory-bound passes on some virtual machines (docs/performance.md).
/// `total` and the step-level phases (`screen`, `roots`) are wall time of the calling thread. The
/// block phases are measured on the fused host path only (blocks as host tasks; every other path
/// leaves them 0): each is the time the thread that runs a block spends in that part of it,
/// summed over the blocks, so on several threads they add up to thread-seconds (a block whose
/// products all threads share counts its wall time once).
struct ShampooPhaseSeconds {
  double total = 0;      ///< the whole step() call
  double screen = 0;     ///< the gradients' conversion and NaN/Inf screen
  double roots = 0;      ///< root inverses and other amortized computations (with their fences)
  double gather = 0;     ///< gradients copied into a block's buffer (blocks not read in place)
  double factors = 0;    ///< factor updates: Gram products, their combination, backups
  double filter = 0;     ///< filtering, grafting state (and the grafting norm where it rides along)
  double direction = 0;  ///< preconditioning products, with unpacking of inverse factors
  double norms = 0;      ///< grafting and direction norms in passes of their own
  double update = 0;     ///< the parameter (and momentum) update
  /// The block phases' sum.
  [[nodiscard]] double blocks() const noexcept { return gather + factors + filter + direction + norms + update; }
};

/// Adds the time since the last lap to a phase (nothing when acc is null: timing off).
class PhaseClock {
 public:
  explicit PhaseClock(ShampooPhaseSeconds* acc) : m_acc(acc) {
    if (m_acc != nullptr) m_last = std::chrono::steady_clock::now();
  }
  void lap(double ShampooPhaseSeconds::*phase) {
    if (m_acc == nullptr) return;
    const auto now = std::chrono::steady_clock::now();
    m_acc->*phase += std::chrono::duration<double>(now - m_last).count();
    m_last = now;
  }

 private:
  ShampooPhaseSeconds* m_acc;
  std::chrono::steady_clock::time_point m_last{};
};

/// Counts of what the last step did, for tests and monitoring.
struct ShampooStepInfo {
  bool amortized = false;
  bool grafted = false;
  int failed_root_computations = 0;
  int root_computations_not_converged = 0;
  std::int64_t fused_blocks = 0;  ///< blocks that took the fused host path (block tasks)
  std::int64_t wide_blocks = 0;   ///< of those, blocks run by all threads together (products split)
  std::int64_t roots_side_by_side = 0;  ///< root computations (inverse roots, eigenbases) run as host tasks
  /// blocks the per-parameter path ran as host tasks, once per phase (factor updates, the
  /// eigenvalue correction's update, directions): DDP/sharded modes and eigenvalue-corrected
  /// Shampoo/SOAP on several threads
  std::int64_t block_tasks = 0;
  std::int64_t batched_launches = 0;  ///< kernels the batched passes launched (set_batched_passes)
  /// BLAS calls for the batched passes' products: one per shape where the BLAS batches them
  /// (cuBLAS), else one per product; the adding kernel of split products counts as one
  std::int64_t batched_gemm_calls = 0;
  /// Deep Gram products of small factors the batched passes ran as chunks (set_gram_split)
  std::int64_t split_gram_products = 0;
  /// Gram products of large factors the batched passes ran as lower-triangle tiles (set_gram_tiles)
  std::int64_t tiled_gram_products = 0;
  /// Host-to-memory-space copies the batched passes made: job tables and product pointer arrays
  /// that differ from what the memory space holds from the previous step (a steady step with
  /// constant options copies only the tables with per-step scalars)
  std::int64_t batched_uploads = 0;
  /// Where the step's time went: zeros unless Shampoo::set_phase_timing(true)
  ShampooPhaseSeconds seconds;
};
// Owner tags of Shampoo's host scratch vectors (impl::host_scratch), shared by every
// instantiation: the eigenbasis kinds' refreshes, eigendecomposed Shampoo's inverse roots from
// their eigenpairs, and spectral descent's SVD.
struct EigenRefreshScratch {};
struct InverseFromEigenpairsScratch {};
struct OrthogonalizeScratch {};
}  // namespace impl

/// \brief DistributedShampoo on one process.
/// \tparam Param any concepts::FloatingTensor (Kokkos::View, Eigen matrix, lather::TensorRef)
/// \tparam ExecSpace where the kernels run
/// \tparam Preconditioner a root-inverse strategy (EigenRootInverse, CoupledNewtonRootInverse,
///         CoupledHigherOrderRootInverse: classic Shampoo) or a preconditioner policy
///         (EigendecomposedShampoo, EigenvalueCorrectedShampoo / SOAP, KLShampoo, SpectralDescent /
///         Muon, SignDescent; docs/shampoo-family.md)
/// \tparam Grafting NoGrafting, SGDGrafting, AdaGradGrafting, RMSpropGrafting or AdamGrafting
/// \tparam Precision ShampooPrecision<factor type, inverse-factor type>
/// \tparam Communicator the group the DDP / HSDP modes spread blocks over (SerialCommunicator:
///         one process; MpiCommunicator; docs/distributed-shampoo.md)
template <concepts::FloatingTensor Param,
          concepts::ExecutionSpaceFor<Param> ExecSpace = default_execution_space_t<Param>,
          concepts::ShampooPreconditioner Preconditioner = EigenRootInverse,
          concepts::GraftingPolicy Grafting = NoGrafting, class Precision = ShampooPrecision<>,
          concepts::Communicator Communicator = SerialCommunicator>
class Shampoo {
  using traits = impl::traits_of<Param>;

 public:
  using param_type = Param;
  using execution_space = ExecSpace;
  using value_type = typename traits::value_type;
  using memory_space = typename traits::memory_space;
  using factor_type = typename Precision::factor_type;
  using inverse_factor_type = typename Precision::inverse_factor_type;
  using tensor_type = TensorRef<value_type, memory_space>;
  using group_type = ParamGroup<Param, ShampooOptions>;
  using block_state_type = ShampooBlockState<factor_type, inverse_factor_type, memory_space>;
  using factor_state_type = ShampooFactorState<factor_type, inverse_factor_type, memory_space>;
  using vector_type = Kokkos::View<value_type*, memory_space>;
  using communicator_type = Communicator;

  static_assert(!std::is_const_v<typename traits::element_type>,
                "lather::Shampoo: parameters must be writable (got a tensor of const elements)");
  static_assert(std::is_floating_point_v<factor_type> && std::is_floating_point_v<inverse_factor_type>,
                "lather::Shampoo: factor precisions must be float or double");

  using preconditioner_type = Preconditioner;
  /// The policy doing the amortized work (KLShampoo's inner policy, else Preconditioner).
  using inner_type = impl::inner_preconditioner_t<Preconditioner>;
  /// What the policy computes (classic root inverse, eigenvalue correction, ...).
  static constexpr PreconditionerKind kind = impl::preconditioner_kind<Preconditioner>();
  /// KL-Shampoo's factor update.
  static constexpr bool kl = impl::is_kl<Preconditioner>();

  // Move-only. The state lives in Kokkos Views, which copy as shared handles, next to host-side
  // counters and references to the user's parameters: a copy would update the same parameters and
  // share the state while its step count diverged. Duplicate an optimizer's state through
  // state_dict() / load_state_dict() (docs/state.md).
  Shampoo(const Shampoo&) = delete;
  Shampoo& operator=(const Shampoo&) = delete;
  Shampoo(Shampoo&&) = default;
  Shampoo& operator=(Shampoo&&) = default;
  ~Shampoo() = default;

  Shampoo(std::span<Param> params, ShampooOptions options = {}, Preconditioner preconditioner = {},
          Grafting grafting = {}, std::vector<std::string> names = {})
    requires std::default_initializable<Communicator>
      : Shampoo(std::vector<group_type>{group_type{params, std::move(options), std::move(names)}},
                std::move(preconditioner), std::move(grafting)) {}

  explicit Shampoo(std::vector<group_type> groups, Preconditioner preconditioner = {}, Grafting grafting = {})
    requires std::default_initializable<Communicator>
      : Shampoo(std::move(groups), Communicator{}, ShampooDistributedOptions{}, std::move(preconditioner),
                std::move(grafting)) {}

  /// \brief Distributed Shampoo over `comm` (docs/distributed-shampoo.md): DDP (every rank has
  /// the full, already averaged gradients; blocks are owned by ranks, one all-gather per step),
  /// sharded (FSDP: each rank's parameters are flat ranges described by `distributed.shards`;
  /// no communication) or HSDP (sharded, and DDP over `comm`, the replicas of a shard). Every
  /// rank of `comm` must construct it with the same parameter shapes and options (checked: a
  /// mismatch is an error on every rank, not a hang); step(), train(), eval() and
  /// consolidated_state_dict() are then collective over `comm`.
  /// (The communicator is a deduced argument so that `{}` for the policies stays unambiguous.)
  template <class C>
    requires std::same_as<std::remove_cvref_t<C>, Communicator>
  Shampoo(std::span<Param> params, ShampooOptions options, C&& comm, ShampooDistributedOptions distributed,
          Preconditioner preconditioner = {}, Grafting grafting = {}, std::vector<std::string> names = {})
      : Shampoo(std::vector<group_type>{group_type{params, std::move(options), std::move(names)}}, std::forward<C>(comm),
                std::move(distributed), std::move(preconditioner), std::move(grafting)) {}

  template <class C>
    requires std::same_as<std::remove_cvref_t<C>, Communicator>
  Shampoo(std::vector<group_type> groups, C&& comm, ShampooDistributedOptions distributed,
          Preconditioner preconditioner = {}, Grafting grafting = {})
      : m_preconditioner(std::move(preconditioner)), m_grafting(std::move(grafting)), m_comm(std::forward<C>(comm)),
        m_dist(std::move(distributed)) {
    LATHER_THROW_IF(groups.empty(), "lather::Shampoo: no parameter groups given; pass at least one parameter");
    m_huge_pages = huge_pages_enabled();  // once, before anything is allocated (lather/memory.hpp)
    for (std::size_t g = 0; g < groups.size(); ++g) {
      auto& o = groups[g].options;
      if (!o.peak_lr) o.peak_lr = o.lr;
      // Sign and spectral descent have no amortized computation: the reference forces F = 1.
      if constexpr (kind == PreconditionerKind::spectral_descent || kind == PreconditionerKind::sign_descent)
        o.precondition_frequency = 1;
      // Spectral descent works on matrices: the reference forces target_parameter_dimensionality = 2.
      if constexpr (kind == PreconditionerKind::spectral_descent) o.target_parameter_dimensionality = 2;
      validate(o, impl::OptionCheck("Shampoo", "parameter group " + std::to_string(g)));
      LATHER_THROW_IF(groups[g].params.empty(), "lather::Shampoo: parameter group ", g,
                      " is empty; every group needs at least one parameter");
      LATHER_THROW_IF(!groups[g].names.empty() && groups[g].names.size() != groups[g].params.size(),
                      "lather::Shampoo: parameter group ", g, " has ", groups[g].params.size(),
                      " parameters but ", groups[g].names.size(), " names");
    }
    std::size_t total_params = 0;
    for (const auto& grp : groups) total_params += grp.params.size();
    validate_distribution(total_params);
    for (std::size_t g = 0; g < groups.size(); ++g) {
      m_groups.push_back(GroupState{groups[g].options, 0});
      for (std::size_t k = 0; k < groups[g].params.size(); ++k) {
        const std::size_t index = m_users.size();
        UserParam u;
        u.group = g;
        u.name = groups[g].names.empty() ? std::string() : groups[g].names[k];
        u.param = tensor_ref(groups[g].params[k]);
        for (const auto& q : m_users)
          LATHER_THROW_IF(u.param.size() > 0 && q.param.data() == u.param.data(), "lather::Shampoo: ",
                          describe_name(index, u.name), " shares memory with another parameter");
        u.first = m_params.size();
        add_pieces(index, u);
        u.count = m_params.size() - u.first;
        m_users.push_back(std::move(u));
      }
    }
    if (exchanges()) {
      check_agreement();
      const int g = m_dist.num_trainers_per_group == -1 ? m_comm.size() : m_dist.num_trainers_per_group;
      // Contiguous groups of g ranks each own every block (dist.new_subgroups(group_size=g)).
      if (g < m_comm.size()) m_comm = m_comm.split(m_comm.rank() / g, m_comm.rank());
      m_dist_rank = m_comm.rank();
      m_dist_size = m_comm.size();
    }
    assign_blocks();
    for (std::size_t i = 0; i < m_params.size(); ++i) build_param_state(i);
    allocate_factor_storage();
    allocate_element_states();
    if (exchanges()) build_exchange();
    std::int64_t max_numel = 1;
    for (const auto& p : m_params) max_numel = std::max(max_numel, p.layout.numel());
    m_grad = buffer("lather::Shampoo::blocked_grad", max_numel);
    m_work0 = buffer("lather::Shampoo::work0", max_numel);
    m_work1 = buffer("lather::Shampoo::work1", max_numel);
    if constexpr (!block_concurrency_possible) {
      // Partial norms of the chunked block norms, where a parameter has a block of several chunks.
      std::int64_t partials = 0;
      for (const auto& p : m_params)
        if (p.chunks > static_cast<std::int64_t>(p.blocks.size())) partials = std::max(partials, p.chunks);
      if (partials > 0) m_norm_partials = Kokkos::View<double*, memory_space>("lather::Shampoo::norm_partials", partials);
    }
    // The unfolded copy of a block for its middle dimensions' products (empty without any).
    std::int64_t max_unfold = 0;
    for (const auto& p : m_params)
      for (const auto& blk : p.blocks)
        for (std::size_t k = 0; k < blk.factors.size(); ++k) {
          const auto [outer, d, inner] = unfold(blk.extent, k);
          if (blk.factors[k].preconditioned && outer > 1 && inner > 1) max_unfold = std::max(max_unfold, outer * d * inner);
        }
    if (max_unfold > 0) m_unfold = buffer("lather::Shampoo::unfolded_block", max_unfold);
    allocate_block_threads(max_unfold);
    size_root_step_tables();
    m_intake = impl::GradientIntake<value_type, memory_space, ExecSpace>("Shampoo", m_users.size());
    if (!host_products && batched_passes_possible()) set_batched_passes(true);
  }

  // ---- the step ------------------------------------------------------------------------------

  /// \brief One Shampoo step with `grads` (one per parameter in group order; an empty tensor
  /// means "no gradient" and masks that parameter). Everything is checked first; a step that
  /// throws leaves parameters, state and step counters as they were.
  /// Synchronization: fences `space` once for the gradient check and, on amortized steps, for
  /// each root computation; the rest is queued on `space`.
  template <std::ranges::random_access_range Grads>
    requires concepts::Tensor<std::ranges::range_value_t<Grads>>
  void step(const ExecSpace& space, const Grads& grads) {
    using G = std::ranges::range_value_t<Grads>;
    LATHER_THROW_RUNTIME_IF(!m_train, "lather::Shampoo::step: the optimizer is in eval mode (iterate averaging: "
                            "the parameters hold the averaged iterate x); call train() before step(); nothing was changed");
    Kokkos::Profiling::pushRegion(LATHER_LABEL("lather::Shampoo::step"));
    const auto step_start = m_phase_timing ? std::chrono::steady_clock::now() : std::chrono::steady_clock::time_point{};
    static_assert(std::is_same_v<typename impl::traits_of<G>::value_type, value_type>,
                  "lather::Shampoo: gradient value_type must equal the parameters' value_type");
    static_assert(
        Kokkos::SpaceAccessibility<ExecSpace, typename impl::traits_of<G>::memory_space>::accessible,
        "lather::Shampoo: the execution space cannot access the gradients' memory space");
    // Buffers of the step live in the optimizer and are reused: a steady step allocates nothing
    // on the host after the first (docs/performance.md; tests/unit/test_host_blas.cpp).
    std::vector<tensor_type>& params = m_user_params;
    if (params.size() != m_users.size()) {
      params.resize(m_users.size());
      for (std::size_t i = 0; i < m_users.size(); ++i) params[i] = m_users[i].param;
    }
    const auto describe_param = [this](std::size_t i) { return describe(i); };
    std::vector<TensorRef<const value_type, memory_space>>* converted = nullptr;
    try {
      converted = &m_intake.convert(grads, params, describe_param);
    } catch (...) {
      Kokkos::Profiling::popRegion();
      throw;
    }
    auto& g = *converted;
    if (exchanges()) agree_on_presence(space, g);  // before anything else that could differ
    // Always checked: a NaN/Inf gradient would poison the factor matrices for good. In DDP and
    // HSDP the counts are summed over the group first, so every rank takes the same decision.
    // Gated (queues_screen: a steady step of the batched passes): the count is queued, the
    // step's state-changing jobs behind it skip on the device what the counts refuse, and the
    // host reads the counts once, after queueing the step; otherwise the screen waits for its
    // counts before anything is queued.
    static constexpr const char* hint = "Skip this batch, lower the learning rate or clip gradients";
    m_intake.set_count_with_kernels(m_batched);  // the batched passes are the device path, on any space
    m_gated = queues_screen(g);
    if (m_gated) {
      m_intake.queue_count(space, g, params);
    } else {
      std::function<void(std::vector<std::int64_t>&)> combine;
      if (exchanges()) combine = [&](std::vector<std::int64_t>& counts) { sum_over_group(space, counts); };
      if (m_intake.screen(space, g, params, describe_param, hint, m_nonfinite_policy, combine)) {
        Kokkos::Profiling::popRegion();
        return;  // NonFinitePolicy::skip_step: nothing changes, step counters included
      }
    }
    const auto& pieces = piece_gradients(g);
    const double screen_seconds = m_phase_timing ? seconds_since(step_start) : 0.0;

    // Step counters advance for every group (as the reference does, with or without gradients);
    // so does Schedule-Free's sum of lr^p.
    std::vector<double>& lr_sums = m_lr_sums_before;
    lr_sums.clear();
    for (auto& grp : m_groups) {
      lr_sums.push_back(grp.lr_sum);
      grp.step += 1;
      if (grp.options.iterate_averaging == IterateAveraging::schedule_free)
        grp.lr_sum += std::pow(grp.options.lr, grp.options.eval_coeff_lr_power);
    }
    const impl::ShampooStepInfo info_before = m_info;
    m_info = {};
    m_info.seconds.screen = screen_seconds;
    const std::int64_t uploads_before = batched_upload_count();
    const auto put_back_counters = [&] {
      for (std::size_t k = 0; k < m_groups.size(); ++k) {
        m_groups[k].step -= 1;
        m_groups[k].lr_sum = lr_sums[k];
      }
    };
    try {
      if (!m_root_steps_reserved) reserve_root_steps(space);
      run_step(space, pieces);
      m_info.batched_uploads = batched_upload_count() - uploads_before;
    } catch (...) {
      put_back_counters();
      m_gated = false;
      Kokkos::Profiling::popRegion();
      throw;
    }
    if (m_gated) {
      m_gated = false;
      m_intake.read_counts(space);
      if (m_intake.any_counted()) {
        // The gated jobs changed nothing the policy refuses on the device. raise and skip_step
        // change nothing at all: the host's step counters and step info are put back too.
        // skip_parameter: the skipped parameters' jobs did not run, as for a parameter without
        // a gradient (the step counters advance for those as well).
        if (m_nonfinite_policy != NonFinitePolicy::skip_parameter) {
          put_back_counters();
          m_info = info_before;
        }
        Kokkos::Profiling::popRegion();
        m_intake.judge(g, describe_param, hint, m_nonfinite_policy);  // raise throws here
        m_info.grafted = false;  // skip_parameter: as if the skipped parameters had no gradient
        for (std::size_t i = 0; i < m_params.size(); ++i)
          m_info.grafted = m_info.grafted || (computes(i, g) && uses_graft(m_params[i].group));
        if (m_phase_timing) m_info.seconds.total = seconds_since(step_start);
        return;
      }
    }
    if (m_phase_timing) {
      space.fence();  // the total covers the queued work (device spaces)
      m_info.seconds.total = seconds_since(step_start);
    }
    Kokkos::Profiling::popRegion();
  }

  template <std::ranges::random_access_range Grads>
    requires concepts::Tensor<std::ranges::range_value_t<Grads>>
  void step(const Grads& grads) {
    step(ExecSpace(), grads);
  }

  /// \brief What step() does with a NaN/Inf gradient (NonFinitePolicy::raise by default):
  /// raise, treat that parameter as having no gradient (skip_parameter: its factors, state and
  /// values stay; the group's step counter advances as for any parameter without a gradient), or
  /// skip the whole step (skip_step: nothing changes, step counters included).
  void set_nonfinite_policy(NonFinitePolicy p) noexcept { m_nonfinite_policy = p; }
  [[nodiscard]] NonFinitePolicy nonfinite_policy() const noexcept { return m_nonfinite_policy; }
  /// \brief Whether a multi-threaded host execution space runs a parameter's blocks side by side
  /// (one block per thread, each with a single-threaded OpenBLAS; on by default). It applies to
  /// root-inverse and eigendecomposed Shampoo with float/double on the host, where the BLAS is
  /// OpenBLAS (its thread count is set to 1 during those products, process-wide, and restored);
  /// to eigenvalue-corrected Shampoo and SOAP likewise (their whole block step in the task), to
  /// KL-Shampoo as block tasks of the per-parameter path, to these policies' blocks as such tasks
  /// in DDP/sharded modes, and to every policy's root computations, one factor per thread (on
  /// every rank of a distributed run). The results agree either way, bit for bit on one thread
  /// and to a few units in the last place on several (products the per-parameter kernels split
  /// over the threads run whole in a block's task; the root computations agree bit for bit with
  /// a single-threaded BLAS); turn it off if other threads of the process run BLAS calls at the
  /// same time.
  void set_block_concurrency(bool on) noexcept { m_block_concurrency = on; }
  [[nodiscard]] bool block_concurrency() const noexcept { return m_block_concurrency; }
  /// \brief Whether steps measure where their time goes, into last_step_info().seconds (off by
  /// default; impl::ShampooPhaseSeconds says what each phase covers). It reads the clock at each
  /// phase boundary of every block (about 8 reads a block) and fences `space` at the end of a
  /// step; results do not change. Turning it on allocates one slot per host thread; steps then
  /// allocate nothing more.
  void set_phase_timing(bool on) {
    m_phase_timing = on;
    const int threads = std::max(1, Kokkos::DefaultHostExecutionSpace().concurrency());
    if (on && m_thread_seconds.size() < static_cast<std::size_t>(threads)) m_thread_seconds.resize(static_cast<std::size_t>(threads));
  }
  [[nodiscard]] bool phase_timing() const noexcept { return m_phase_timing; }
  /// \brief Whether a step runs each of its passes as one kernel over every block of every
  /// parameter (gather, factor combine, filtering, grafting norms and scale, one-dimensional
  /// products, update), instead of kernels per parameter and per block; the two- and more-
  /// dimensional blocks' products stay one vendor-BLAS call per factor. On by default on device
  /// spaces where batched_passes_possible(); off on host spaces, whose fused host blocks are
  /// faster there (switching it on runs the device path on the host, for tests and comparisons).
  /// The results agree with the per-parameter kernels up to the products' summation order.
  /// Steady steps do not wait for the NaN/Inf screen: their state-changing jobs are gated on its
  /// device counts and the counts are read once, at the end (docs/reliability.md).
  /// Memory: two work buffers of all parameters' elements in the parameters' type, and a pool
  /// for Gram matrices and unpacked inverse factors of `pool_elements` (16 Mi by default; at least
  /// the largest factor, at most all factors; a smaller pool runs the queued combines and
  /// products more often); allocated here, so call it outside step(), not concurrently with one.
  void set_batched_passes(bool on, std::int64_t pool_elements = std::int64_t{1} << 24) {
    LATHER_THROW_IF(pool_elements < 1, "lather::Shampoo::set_batched_passes: pool_elements = ", pool_elements,
                    " must be >= 1 (it is raised to the largest factor's d^2)");
    LATHER_THROW_IF(on && !batched_passes_possible(), "lather::Shampoo::set_batched_passes: the batched passes need "
                    "root-inverse or eigendecomposed Shampoo (not KL) with inverse factors in the parameters' type, "
                    "on one process (no DDP or sharding) and without iterate averaging; keep the per-parameter "
                    "kernels (set_batched_passes(false)) for these options");
    if (on) allocate_batched(pool_elements);
    m_batched = on;
  }
  [[nodiscard]] bool batched_passes() const noexcept { return m_batched; }
  /// \brief How the batched passes compute deep Gram products of small factors: a factor of
  /// d <= `max_output` rows whose Gram product G G^T sums k > max(16 d, `chunk`) terms runs as
  /// chunks of max(16 d, `chunk`) terms, batched by shape with the other products, and one kernel
  /// adds the chunks' outputs in order (impl::blas::GemmBatches::set_split). A batched BLAS call
  /// cannot split its sums, and one call per deep product of a small output leaves most of a GPU
  /// idle (docs/performance.md, "On a GPU"). `max_output` 0 turns it off. Default: 32 and 2048
  /// where the BLAS batches (CUDA), off elsewhere (a host BLAS call splits a deep product over its
  /// threads itself). The results agree with unsplit products up to the sums' order. Call it
  /// outside step(); the chunks' outputs are allocated at the next step that splits.
  void set_gram_split(std::int64_t max_output, std::int64_t chunk) {
    LATHER_THROW_IF(max_output < 0 || chunk < 1, "lather::Shampoo::set_gram_split: max_output = ", max_output,
                    " must be >= 0 (0 turns splitting off) and chunk = ", chunk, " must be >= 1");
    m_gemm_batches.set_split(max_output, chunk);
  }
  [[nodiscard]] std::int64_t gram_split_max_output() const noexcept { return m_gemm_batches.split_max_output(); }
  [[nodiscard]] std::int64_t gram_split_chunk() const noexcept { return m_gemm_batches.split_chunk(); }
  /// \brief How the batched passes compute the Gram products of large factors: a factor of d rows
  /// whose Gram product sums at most 16 d terms (one the batched BLAS takes) and whose d x d Gram
  /// matrix splits into nt x nt tiles of at least `min_tile` rows (nt the largest of
  /// 2..`max_tiles` dividing d) has only the
  /// nt (nt + 1) / 2 tiles on and below the diagonal computed, batched by shape with the other
  /// products (impl::blas::GemmBatches::set_tiles). A batched GEMM computes the whole Gram matrix,
  /// twice a SYRK's work, of which the factor update reads one triangle; there is no batched
  /// SYRK. `min_tile` 0 turns it off. Default: 128 and 8 where the BLAS batches (CUDA), off
  /// elsewhere (the host BLAS runs a SYRK). The results agree with untiled products up to the
  /// sums' rounding. Call it outside step().
  void set_gram_tiles(std::int64_t min_tile, std::int64_t max_tiles = 8) {
    LATHER_THROW_IF(min_tile < 0 || max_tiles < 2, "lather::Shampoo::set_gram_tiles: min_tile = ", min_tile,
                    " must be >= 0 (0 turns tiling off) and max_tiles = ", max_tiles, " must be >= 2");
    m_gemm_batches.set_tiles(min_tile, max_tiles);
  }
  [[nodiscard]] std::int64_t gram_tile_min() const noexcept { return m_gemm_batches.tile_min(); }
  [[nodiscard]] std::int64_t gram_tile_max() const noexcept { return m_gemm_batches.tile_max(); }
  /// Whether these options allow the batched passes (see set_batched_passes).
  [[nodiscard]] bool batched_passes_possible() const noexcept {
    if constexpr (!batched_kind) {
      return false;
    } else {
      if (exchanges() || sharded() || m_dist_size != 1) return false;
      for (const auto& grp : m_groups)
        if (grp.options.iterate_averaging != IterateAveraging::none) return false;
      return true;
    }
  }
  /// Steps on which parameter i's gradient had NaN/Inf values and was skipped.
  [[nodiscard]] std::int64_t nonfinite_skips(std::size_t i) const {
    (void)user(i);
    return m_intake.nonfinite_skips(i);
  }
  /// Whole steps skipped by NonFinitePolicy::skip_step.
  [[nodiscard]] std::int64_t skipped_steps() const noexcept { return m_intake.skipped_steps(); }

  // ---- options and inspection --------------------------------------------------------------

  [[nodiscard]] std::size_t num_groups() const noexcept { return m_groups.size(); }
  [[nodiscard]] std::size_t num_params() const noexcept { return m_users.size(); }
  [[nodiscard]] const ShampooOptions& options(std::size_t g = 0) const { return group(g).options; }
  [[nodiscard]] std::int64_t step_count(std::size_t g = 0) const { return group(g).step; }
  /// Sets the learning rate of every group (peak_lr is unchanged, as with torch schedulers).
  void set_lr(double lr) {
    for (std::size_t g = 0; g < num_groups(); ++g)
      impl::OptionCheck("Shampoo", "parameter group " + std::to_string(g)).at_least("lr", lr, 0.0);
    for (auto& grp : m_groups) grp.options.lr = lr;
  }
  void set_lr(std::size_t g, double lr) {
    impl::OptionCheck("Shampoo", "parameter group " + std::to_string(g)).at_least("lr", lr, 0.0);
    group(g).options.lr = lr;
  }
  /// The preconditioner policy.
  [[nodiscard]] const Preconditioner& preconditioner() const noexcept { return m_preconditioner; }
  /// The root-inverse strategy (classic and KL root-inverse Shampoo).
  [[nodiscard]] const auto& root_inverse() const noexcept
    requires(kind == PreconditionerKind::root_inverse)
  {
    return inner();
  }
  [[nodiscard]] const Grafting& grafting() const noexcept { return m_grafting; }
  /// The merged shape and blocks of parameter i (sharded modes: of its only piece; see
  /// num_pieces()).
  [[nodiscard]] const BlockLayout& layout(std::size_t i) const {
    const auto& u = user(i);
    LATHER_THROW_IF(u.count != 1, "lather::Shampoo::layout: ", describe(i), " is held as ", u.count,
                    " pieces on this rank (sharded mode); use piece_layout(i, j)");
    return m_params[u.first].layout;
  }
  /// Sharded modes: the whole tensors this rank's range of parameter i was cut into (1 otherwise).
  [[nodiscard]] std::size_t num_pieces(std::size_t i) const { return user(i).count; }
  [[nodiscard]] const BlockLayout& piece_layout(std::size_t i, std::size_t j) const {
    const auto& u = user(i);
    LATHER_THROW_IF(j >= u.count, "lather::Shampoo: ", describe(i), " has ", u.count, " pieces on this rank, no piece ", j);
    return m_params[u.first + j].layout;
  }
  /// Blocks of parameter i (all of them, whichever rank owns them; sharded modes: of this rank's
  /// pieces, numbered in order).
  [[nodiscard]] std::size_t num_blocks(std::size_t i) const {
    const auto& u = user(i);
    std::size_t n = 0;
    for (std::size_t j = 0; j < u.count; ++j) n += piece_blocks(u.first + j);
    return n;
  }
  /// The rank of the DDP group (0 without one) that owns block b of parameter i and keeps its state.
  [[nodiscard]] int block_owner(std::size_t i, std::size_t b) const {
    const auto [piece, id] = locate(i, b);
    return m_params[piece].owner[id];
  }
  [[nodiscard]] bool owns_block(std::size_t i, std::size_t b) const { return block_owner(i, b) == m_dist_rank; }
  /// The state of block b of parameter i; only on its owner.
  [[nodiscard]] const block_state_type& block(std::size_t i, std::size_t b) const {
    const auto [piece, id] = locate(i, b);
    const auto& p = m_params[piece];
    LATHER_THROW_IF(p.local_of[id] < 0, "lather::Shampoo: block ", b, " of ", describe(i), " is owned by rank ",
                    p.owner[id], " of the DDP group, not this rank (", m_dist_rank,
                    "); inspect it there or use consolidated_state_dict()");
    return p.blocks[static_cast<std::size_t>(p.local_of[id])];
  }
  /// The distributed options (mode single when not distributed).
  [[nodiscard]] const ShampooDistributedOptions& distribution() const noexcept { return m_dist; }
  /// This rank in the DDP group that shares the blocks, and the group's size (0 and 1 unless DDP/HSDP).
  [[nodiscard]] int distribution_rank() const noexcept { return m_dist_rank; }
  [[nodiscard]] int distribution_size() const noexcept { return m_dist_size; }
  /// Bytes of optimizer state this rank holds (factors, inverse factors, eigenbases, per-element
  /// state of its blocks; not the shared work buffers).
  [[nodiscard]] std::size_t state_bytes() const {
    std::size_t n = 0;
    for (const auto& p : m_params)
      for (const auto& blk : p.blocks)
        for (const auto& f : blk.factors)
          n += f.factor.span() * sizeof(factor_type) +
               (f.inverse_factor.span() + f.eigenvectors.span() + f.eigenvalues.span()) * sizeof(inverse_factor_type);
    for (const auto& u : m_users)
      n += (u.filtered.span() + u.graft_state.span() + u.momentum.span() + u.corrected.span() + u.weight_buffer.span()) *
           sizeof(value_type);
    return n;
  }
  /// Bytes of work arrays this rank's optimizer holds besides state_bytes(), as they stand: the
  /// blocked gradient and direction buffers, the unfolded block, the Gram and bias-corrected
  /// scratch matrices, each preconditioned factor's root result and factor backup (a root step
  /// commits all its roots or none, and a failed step restores the factors), the amortized
  /// eigenbases' pending results, the per-thread buffers of host block concurrency and of roots
  /// computed side by side, the DDP exchange's send and receive buffers, and the batched passes'
  /// buffers, job tables and device products' partial sums. All sized at construction, but the
  /// amortized eigenbases' pending results (at their first root step) and the batched passes'
  /// (when they are turned on). Not counted: the blocks' index arrays and other bookkeeping (tens
  /// of bytes a block), and the root-inverse strategy's own per-thread work arrays
  /// (EigenRootInverse: impl::EigenWorkspace and LAPACK's, kept per host thread for the largest
  /// root seen and shared by every optimizer of the process; docs/performance.md, "Tuning guide",
  /// counts them), nor the host scratch of the eigenbasis refreshes and the SVD
  /// (impl::host_scratch, per thread and process-wide as well).
  [[nodiscard]] std::size_t workspace_bytes() const {
    const auto bytes = [](const auto& v) {
      return v.span() * sizeof(typename std::decay_t<decltype(v)>::value_type);
    };
    std::size_t n = bytes(m_send) + bytes(m_recv) + bytes(m_grad) + bytes(m_work0) + bytes(m_work1) + bytes(m_unfold) +
                    bytes(m_norm_partials) + bytes(m_batch_grad) + bytes(m_batch_work) + bytes(m_batch_pool) +
                    bytes(m_batch_norms) + bytes(m_batch_partials) + m_gemm_batches.workspace_bytes() +
                    m_tab_gather.bytes() + m_tab_backup.bytes() + m_tab_unfold.bytes() + m_tab_combine.bytes() +
                    m_tab_filter.bytes() + m_tab_unpack.bytes() + m_tab_copy.bytes() + m_tab_apply.bytes() +
                    m_tab_norms.bytes() + m_tab_norm_sums.bytes() + m_step_values.bytes() + m_tab_matvec.bytes() +
                    m_tab_scale.bytes();
    for (const auto* m : {&m_gram, &m_gram2})
      for (const auto& [d, v] : *m) n += bytes(v);
    for (const auto& [d, v] : m_scratch) n += bytes(v);
    n += bytes(m_root_full);
    for (const auto* t : {&m_thread_gram, &m_thread_unfold, &m_thread_grad, &m_thread_x, &m_thread_y})
      for (const auto& v : *t) n += bytes(v);
    for (const auto* t : {&m_thread_root, &m_thread_root_out})
      for (const auto& v : *t) n += v.capacity() * sizeof(factor_type);
    for (const auto& p : m_params) {
      n += bytes(p.norms);
      for (const auto& per_block : p.backup)
        for (const auto& v : per_block) n += bytes(v);
      for (const auto& per_block : p.result)
        for (const auto& v : per_block) n += bytes(v);
      for (const auto* pending : {&p.pending_q, &p.pending_lambda, &p.pending_x})
        for (const auto& per_block : *pending)
          for (const auto& v : per_block) n += v.capacity() * sizeof(inverse_factor_type);
    }
    return n;
  }
  /// Bytes of the factor matrices' storage (factors, inverse roots, eigenbases: one allocation
  /// per scalar type) and per-element state advised as transparent huge pages: host memory on
  /// Linux, its whole 2 MiB pages, when lather::huge_pages_enabled() said so at construction
  /// (off by default; `LATHER_HUGE_PAGES=1` or lather::set_huge_pages) and the system offers
  /// them (not "never"); 0 otherwise.
  [[nodiscard]] std::size_t huge_page_bytes() const noexcept { return m_huge_page_bytes; }
  /// Factor matrix k of block b of parameter i as a full d x d matrix (a new view; unpacked when
  /// stored packed). Fences.
  [[nodiscard]] Kokkos::View<factor_type**, Kokkos::LayoutRight, memory_space> factor_matrix(std::size_t i, std::size_t b,
                                                                                           std::size_t k) const {
    return unpack(factor_of(i, b, k).factor_storage());
  }
  /// The inverse root of factor matrix k of block b of parameter i, as a full matrix. Fences.
  [[nodiscard]] Kokkos::View<inverse_factor_type**, Kokkos::LayoutRight, memory_space> inverse_factor_matrix(
      std::size_t i, std::size_t b, std::size_t k) const {
    return unpack(factor_of(i, b, k).inverse_storage());
  }

  /// The eigenvectors of factor k of block b of parameter i (eigenvalue-corrected and
  /// eigendecomposed Shampoo) as a d x d matrix whose column j is the j-th eigenvector (a new view).
  [[nodiscard]] Kokkos::View<inverse_factor_type**, Kokkos::LayoutRight, memory_space> eigenvectors(
      std::size_t i, std::size_t b, std::size_t k) const
    requires(kind == PreconditionerKind::eigenvalue_corrected || kind == PreconditionerKind::eigendecomposed)
  {
    const auto& f = factor_of(i, b, k);
    return unpack(impl::kernels::SymmetricStorage<const inverse_factor_type>{f.eigenvectors.data(), f.dim, false});
  }
  /// The stored eigenvalues of factor k of block b of parameter i (eigendecomposed Shampoo).
  [[nodiscard]] Kokkos::View<const inverse_factor_type*, memory_space> eigenvalues(std::size_t i, std::size_t b,
                                                                                 std::size_t k) const
    requires(kind == PreconditionerKind::eigendecomposed)
  {
    return factor_of(i, b, k).eigenvalues;
  }

  /// Per-element state of parameter i in blocked order ("filtered_grad", "adagrad" (grafting),
  /// "momentum_buffer", "corrected_eigenvalues" (eigenvalue correction's D), "weight_buffer"
  /// (iterate averaging's Z)); empty when not used.
  /// DDP: this rank's blocks only; sharded modes: this rank's pieces, one after the other.
  [[nodiscard]] vector_type state(std::size_t i, const std::string& name) const {
    const auto& p = user(i);
    if (name == "filtered_grad") return p.filtered;
    if (name == "adagrad") return p.graft_state;
    if (name == "momentum_buffer") return p.momentum;
    if (name == "corrected_eigenvalues") return p.corrected;
    if (name == "weight_buffer") return p.weight_buffer;
    impl::throw_error<invalid_argument>(std::source_location::current(), "lather::Shampoo: no state '", name,
                                        "'; per-element state is 'filtered_grad', 'adagrad', 'momentum_buffer', "
                                        "'corrected_eigenvalues', 'weight_buffer'");
  }

  // ---- iterate averaging: train / eval -----------------------------------------------------

  /// \brief Train mode (the default): with generalized primal averaging or Schedule-Free, moves
  /// every parameter from the averaged iterate x to the training point y = x + (1 - mu_y)(z - x).
  /// A no-op when already training or without iterate averaging.
  void train() { switch_mode(true); }
  /// \brief Eval mode: moves every parameter to the averaged iterate x, W <- W + (1 - 1/mu_y)(Z - W).
  /// step() raises until train() is called. A no-op when already in eval mode or without averaging.
  void eval() { switch_mode(false); }
  /// Whether the optimizer is in train mode.
  [[nodiscard]] bool training() const noexcept { return m_train; }
  /// What the last step did (amortized, grafted, failed root computations).
  [[nodiscard]] const impl::ShampooStepInfo& last_step_info() const noexcept { return m_info; }

  // ---- state dictionaries --------------------------------------------------------------------

  /// \brief Every block's factors, inverse factors, failure counters, filtered gradient,
  /// grafting state and momentum, each group's step counter, lr and peak_lr, as host tensors.
  /// Fences (Kokkos::deep_copy).
  [[nodiscard]] StateDict state_dict() const {
    StateDict d;
    d.format = state_format();
    for (std::size_t g = 0; g < m_groups.size(); ++g) {
      const std::string key = "param_groups." + std::to_string(g) + ".";
      d.tensors[key + "step"] = StateTensor{{}, std::vector<std::int64_t>{m_groups[g].step}};
      d.tensors[key + "lr"] = StateTensor{{}, std::vector<double>{m_groups[g].options.lr}};
      d.tensors[key + "peak_lr"] = StateTensor{{}, std::vector<double>{*m_groups[g].options.peak_lr}};
      if (m_groups[g].options.iterate_averaging == IterateAveraging::schedule_free)
        d.tensors[key + "lr_sum"] = StateTensor{{}, std::vector<double>{m_groups[g].lr_sum}};
      for (auto& [name, t] : recorded_options(m_groups[g].options)) d.tensors[key + name] = std::move(t);
    }
    for (std::size_t i = 0; i < m_params.size(); ++i) {
      const auto& p = m_params[i];
      for (std::size_t b = 0; b < p.blocks.size(); ++b) {
        const auto& blk = p.blocks[b];
        const std::string key = block_key(i, blk.id);
        d.tensors[key + "consecutive_failures"] =
            StateTensor{{}, std::vector<std::int64_t>{blk.consecutive_failures}};
        for (std::size_t k = 0; k < blk.factors.size(); ++k) {
          const auto& f = blk.factors[k];
          if (!f.preconditioned) continue;
          for (const int which : factor_entries()) {
            const std::string name = key + factor_entry_name(which) + std::to_string(k);
            if (which == 0) d.tensors[name] = symmetric_to_tensor(f.factor, f.factor_storage(), factor_entry_shape(which, f));
            else if (which == 1) d.tensors[name] = symmetric_to_tensor(inverse_owner(f), f.inverse_storage(),
                                                                     factor_entry_shape(which, f));
            else d.tensors[name] = view_to_tensor(factor_entry_view(which, f), factor_entry_shape(which, f));
          }
        }
        for (const char* name : element_state_names) {
          const vector_type v = piece_state(i, name);
          if (v.data() == nullptr) continue;
          d.tensors[key + name] = slice_to_tensor(v, blk);
        }
      }
    }
    return d;
  }

  /// \brief Every block's state gathered from its owner (collective over the DDP group): the
  /// dictionary a single process would have, which loads on any number of ranks (and into a
  /// Shampoo without distribution). Without DDP/HSDP it is state_dict().
  [[nodiscard]] StateDict consolidated_state_dict() const {
    StateDict local = state_dict();
    if (!exchanges() || m_dist_size == 1) return local;
    LATHER_THROW_IF(m_dist.mode == ShampooDistributionMode::hsdp, "lather::Shampoo::consolidated_state_dict: in HSDP "
                    "mode the blocks of a rank's shard are spread over its replicas; gather them with state_dict() "
                    "on every rank (a consolidated form needs the whole parameters)");
    const std::vector<std::byte> mine = serialize_state_dict(local);
    Kokkos::View<std::int64_t*, Kokkos::HostSpace> sizes("lather::Shampoo::consolidate_sizes", m_dist_size);
    sizes(m_dist_rank) = static_cast<std::int64_t>(mine.size());
    m_comm.all_reduce_sum(Kokkos::DefaultHostExecutionSpace(), sizes);
    std::int64_t longest = 0;
    for (int r = 0; r < m_dist_size; ++r) longest = std::max(longest, sizes(r));
    Kokkos::View<std::uint8_t*, Kokkos::HostSpace> in("lather::Shampoo::consolidate_in", static_cast<std::size_t>(longest));
    Kokkos::View<std::uint8_t*, Kokkos::HostSpace> out("lather::Shampoo::consolidate_out",
                                                       static_cast<std::size_t>(longest) * static_cast<std::size_t>(m_dist_size));
    std::memcpy(in.data(), mine.data(), mine.size());
    m_comm.all_gather(Kokkos::DefaultHostExecutionSpace(), Kokkos::View<const std::uint8_t*, Kokkos::HostSpace>(in), out);
    StateDict all;
    all.format = local.format;
    for (int r = 0; r < m_dist_size; ++r) {
      const auto* bytes = reinterpret_cast<const std::byte*>(out.data()) + static_cast<std::size_t>(r * longest);
      StateDict part = deserialize_state_dict(std::span<const std::byte>(bytes, static_cast<std::size_t>(sizes(r))),
                                              "rank " + std::to_string(r) + " of the DDP group");
      for (auto& [k, t] : part.tensors) all.tensors.insert_or_assign(k, std::move(t));
    }
    return all;
  }

  /// \brief Restores a state_dict() of a Shampoo over the same parameter shapes, options and
  /// preconditioner. Every entry is checked first; on any error nothing changes. Fences. The
  /// train/eval mode is not part of the state: the mode before the load stays. In DDP mode the
  /// dictionary may be this rank's own or a consolidated one (any rank count, or one process):
  /// entries of blocks other ranks own are skipped.
  void load_state_dict(const StateDict& d) {
    LATHER_THROW_IF(d.format != state_format(), "lather::Shampoo::load_state_dict: the dictionary is a '", d.format,
                    "' state, expected '", state_format(), "' (saved with another preconditioner?)");
    std::size_t expected = 0;
    auto entry = [&](const std::string& name) -> const StateTensor& {
      auto it = d.tensors.find(name);
      LATHER_THROW_IF(it == d.tensors.end(), "lather::Shampoo::load_state_dict: missing entry '", name, "'");
      ++expected;
      return it->second;
    };
    auto scalar_double = [&](const std::string& name) {
      const StateTensor& t = entry(name);
      LATHER_THROW_IF(!t.shape.empty() || !std::holds_alternative<std::vector<double>>(t.values) ||
                          t.stored_size() != 1,
                      "lather::Shampoo::load_state_dict: '", name, "' must be a float64 scalar");
      return std::get<std::vector<double>>(t.values)[0];
    };
    auto scalar_int = [&](const std::string& name) {
      const StateTensor& t = entry(name);
      LATHER_THROW_IF(!t.shape.empty() || !std::holds_alternative<std::vector<std::int64_t>>(t.values) ||
                          t.stored_size() != 1 || std::get<std::vector<std::int64_t>>(t.values)[0] < 0,
                      "lather::Shampoo::load_state_dict: '", name, "' must be a non-negative int64 scalar");
      return std::get<std::vector<std::int64_t>>(t.values)[0];
    };
    std::vector<GroupState> groups = m_groups;
    for (std::size_t g = 0; g < groups.size(); ++g) {
      const std::string key = "param_groups." + std::to_string(g) + ".";
      groups[g].step = scalar_int(key + "step");
      groups[g].options.lr = scalar_double(key + "lr");
      groups[g].options.peak_lr = scalar_double(key + "peak_lr");
      if (groups[g].options.iterate_averaging == IterateAveraging::schedule_free) {
        groups[g].lr_sum = scalar_double(key + "lr_sum");
        LATHER_THROW_IF(!(groups[g].lr_sum >= 0.0) || !std::isfinite(groups[g].lr_sum),
                        "lather::Shampoo::load_state_dict: '", key, "lr_sum' must be finite and >= 0");
      }
      validate(groups[g].options, impl::OptionCheck("Shampoo", "load_state_dict: parameter group " + std::to_string(g)));
      // Every other option (and the grafting settings) must be the ones the dictionary was saved
      // with: a checkpoint from another option set is refused, never loaded silently.
      for (const auto& [name, want] : recorded_options(m_groups[g].options)) {
        const StateTensor& t = entry(key + name);
        LATHER_THROW_IF(!(t == want), "lather::Shampoo::load_state_dict: the dictionary was saved with option '", name,
                        "' = ", option_string(t), " in parameter group ", g, ", this optimizer has ",
                        option_string(want), "; construct it with the checkpoint's options (only 'lr' and 'peak_lr' "
                        "are restored); nothing was changed");
      }
      // Recorded only when on (see recorded_options): its presence alone must match too.
      LATHER_THROW_IF(!m_groups[g].options.stagger_amortized_computations &&
                          d.tensors.count(key + "stagger_amortized_computations") != 0,
                      "lather::Shampoo::load_state_dict: the dictionary was saved with option "
                      "'stagger_amortized_computations' = 1 in parameter group ", g,
                      ", this optimizer has 0; construct it with the checkpoint's options; nothing was changed");
    }
    struct Pending {
      const StateTensor* t;
      std::size_t i, b, k;
      int which;       // factor entry (0 factor, 1 inverse, 2 eigenvectors, 3 eigenvalues)
      const char* element;  // element state name, or nullptr
    };
    std::vector<Pending> pending;
    std::vector<std::vector<int>> failures(m_params.size());
    for (std::size_t i = 0; i < m_params.size(); ++i) {
      const auto& p = m_params[i];
      for (std::size_t b = 0; b < p.blocks.size(); ++b) {
        const auto& blk = p.blocks[b];
        const std::string key = block_key(i, blk.id);
        failures[i].push_back(static_cast<int>(scalar_int(key + "consecutive_failures")));
        for (std::size_t k = 0; k < blk.factors.size(); ++k) {
          if (!blk.factors[k].preconditioned) continue;
          const auto& fs = blk.factors[k];
          for (const int which : factor_entries()) {
            const std::string name = key + factor_entry_name(which) + std::to_string(k);
            const StateTensor& t = entry(name);
            const auto want_shape = factor_entry_shape(which, fs);
            const bool dtype_ok = which == 0 ? holds<factor_type>(t) : holds<inverse_factor_type>(t);
            const bool shape_ok = t.shape == want_shape && t.stored_size() == static_cast<std::size_t>(numel_of(want_shape));
            LATHER_THROW_IF(!dtype_ok || !shape_ok, "lather::Shampoo::load_state_dict: '", name, "' must be a ",
                            which == 3 ? "vector of " + std::to_string(fs.dim)
                                       : std::to_string(fs.dim) + "x" + std::to_string(fs.dim) +
                                             (which <= 1 && fs.packed ? " packed (upper-triangle) matrix" : " matrix"),
                            ", shape ", shape_string(want_shape), ", of the ", which == 0 ? "factor" : "inverse-factor",
                            " precision (got ", t.dtype(), " ", shape_string(t.shape), ")");
            pending.push_back({&t, i, b, k, which, nullptr});
          }
        }
        for (const char* name : element_state_names) {
          const vector_type v = piece_state(i, name);
          if (v.data() == nullptr) continue;
          const StateTensor& t = entry(key + name);
          LATHER_THROW_IF(!holds<value_type>(t) || t.shape != blk.extent ||
                              t.stored_size() != static_cast<std::size_t>(numel_of(blk.extent)),
                          "lather::Shampoo::load_state_dict: '", key, name,
                          "' does not match the block's shape and the parameter dtype");
          pending.push_back({&t, i, b, 0, -1, name});
        }
      }
    }
    // Entries of blocks that other ranks own (a consolidated dictionary) are theirs to check.
    if (m_dist_size > 1) {
      std::vector<std::string> others;
      for (std::size_t i = 0; i < m_params.size(); ++i)
        for (std::size_t b = 0; b < m_params[i].layout.blocks.size(); ++b)
          if (m_params[i].local_of[b] < 0) others.push_back(block_key(i, b));
      std::sort(others.begin(), others.end());
      for (const auto& [name, t] : d.tensors) {
        auto it = std::upper_bound(others.begin(), others.end(), name);
        if (it != others.begin() && name.starts_with(*std::prev(it))) ++expected;
      }
    }
    LATHER_THROW_IF(expected != d.tensors.size(), "lather::Shampoo::load_state_dict: the dictionary has ",
                    d.tensors.size() - expected,
                    " unknown entries (saved from different parameters or options?)");
    // Eigendecomposed Shampoo: rebuild the inverse roots from the loaded eigenpairs before
    // committing anything (a non-finite root is an error that changes nothing).
    std::vector<std::vector<inverse_factor_type>> rebuilt;
    if constexpr (kind == PreconditionerKind::eigendecomposed) {
      for (const auto& pe : pending) {
        if (pe.which != 2) continue;
        const auto& f = m_params[pe.i].blocks[pe.b].factors[pe.k];
        const auto& q = std::get<std::vector<inverse_factor_type>>(pe.t->values);
        const StateTensor& lt = d.tensors.at(block_key(pe.i, m_params[pe.i].blocks[pe.b].id) + factor_entry_name(3) +
                                             std::to_string(pe.k));
        const auto& l = std::get<std::vector<inverse_factor_type>>(lt.values);
        std::vector<inverse_factor_type> x;
        LATHER_THROW_IF(!inverse_from_eigenpairs(q, l, f.dim, f.packed, f.root, m_groups[m_params[pe.i].group].options.epsilon, x),
                        "lather::Shampoo::load_state_dict: the eigenpairs of factor ", pe.k, " of block ", pe.b, " of ",
                        describe_piece(pe.i), " give a non-finite inverse root; nothing was changed");
        rebuilt.push_back(std::move(x));
      }
    }
    // Apply.
    m_groups = std::move(groups);
    for (std::size_t i = 0; i < m_params.size(); ++i)
      for (std::size_t b = 0; b < m_params[i].blocks.size(); ++b) m_params[i].blocks[b].consecutive_failures = failures[i][b];
    std::size_t next_rebuilt = 0;
    for (const auto& pe : pending) {
      auto& blk = m_params[pe.i].blocks[pe.b];
      if (pe.element != nullptr) {
        tensor_to_slice(*pe.t, piece_state(pe.i, pe.element), blk);
        continue;
      }
      auto& f = blk.factors[pe.k];
      if (pe.which == 0) tensor_to_symmetric(*pe.t, f.factor, f.factor_storage());
      else if (pe.which == 1) tensor_to_symmetric(*pe.t, inverse_owner(f), f.inverse_storage());
      else tensor_to_storage(*pe.t, factor_entry_view(pe.which, f));
      if (kind == PreconditionerKind::eigendecomposed && pe.which == 2)
        host_to_symmetric(ExecSpace(), rebuilt[next_rebuilt++], f);
    }
    ExecSpace().fence();
  }

 private:
  struct GroupState {
    ShampooOptions options;
    std::int64_t step = 0;
    double lr_sum = 0.0;  // Schedule-Free: sum of lr^p over the steps taken
  };
  // A parameter as the user gave it; its state buffers (this rank's blocks, piece after piece).
  struct UserParam {
    tensor_type param;
    std::string name;
    std::size_t group = 0;
    std::size_t first = 0, count = 0;  // its pieces in m_params (1 unless sharded)
    vector_type filtered, graft_state, momentum, corrected, weight_buffer;
  };
  // What the step works on: a whole parameter, or (sharded modes) one piece of this rank's range
  // of it, a whole row-major tensor inside the user's memory.
  struct ParamState {
    tensor_type param;
    std::string name;
    std::size_t group = 0;
    std::size_t user = 0;
    std::size_t piece = 0;          // its number among the user parameter's pieces
    std::int64_t offset = 0;        // sharded: where the piece starts in the rank's flat range
    std::size_t block_offset = 0;   // blocks of the user parameter's earlier pieces
    BlockLayout layout;
    std::int64_t ordinal_base = 0;  // blocks of the earlier pieces' layouts (staggering order)
    std::vector<int> owner;         // per block of the layout: the DDP rank that owns it
    std::vector<int> local_of;      // per block of the layout: its index in `blocks`, -1 elsewhere
    std::int64_t local_numel = 0;   // elements of this rank's blocks
    Kokkos::View<std::int64_t*, memory_space> block_begin;  // this rank's blocks, + end
    // The blocks' chunks for the per-parameter device norms and scale (impl::kernels::BlockChunks).
    Kokkos::View<std::int64_t*, memory_space> chunk_begin;
    std::int64_t chunks = 0;  // of all this rank's blocks
    Kokkos::View<std::int64_t*, memory_space> index_begin;  // per block of the layout: begin here or -1
    impl::kernels::BlockedIndex<memory_space> index;
    // DDP / HSDP: where each block sits in this rank's send slice (-1: another rank's) and in the
    // gathered buffer, in elements of the communication dtype.
    Kokkos::View<std::int64_t*, memory_space> send_begin, recv_begin;
    impl::kernels::BlockedIndex<memory_space> send_index, recv_index;
    std::vector<block_state_type> blocks;  // this rank's blocks only
    vector_type filtered, graft_state, momentum;
    vector_type corrected;      // eigenvalue correction's D (blocked order)
    vector_type weight_buffer;  // iterate averaging's Z (blocked order)
    double corrected_exponent = 0.5;
    // Eigenbasis kinds: the amortized step's pending basis and eigenvalues (host, row-major).
    std::vector<std::vector<std::vector<inverse_factor_type>>> pending_q, pending_lambda, pending_x;
    Kokkos::View<double**, memory_space> norms;  // per block: ||graft(Gbar)||^2, ||P||^2
    // Transactional amortized steps: factors before this step's update, root results pending
    // (root-inverse kind only), both stored as the factor is (packed: the upper triangle).
    std::vector<std::vector<Kokkos::View<factor_type*, memory_space>>> backup, result;
  };

  // ---- construction --------------------------------------------------------------------------

  void validate(const ShampooOptions& o, const impl::OptionCheck& c) const {
    c.at_least("lr", o.lr, 0.0);
    c.in_half_open("betas[0]", o.betas[0], 0.0, 1.0);
    c.in_closed("betas[1]", o.betas[1], 0.0, 1.0);
    c.require(o.beta3 == -1.0 || (o.beta3 >= 0.0 && o.beta3 < 1.0),
              impl::concat("invalid option 'beta3' = ", o.beta3, " (must be -1, meaning betas[0], or in [0, 1))"));
    bool zero_epsilon = false;
    if constexpr (requires { inner().requires_zero_epsilon(); }) zero_epsilon = inner().requires_zero_epsilon();
    if (zero_epsilon)
      c.require(o.epsilon == 0.0, impl::concat("invalid option 'epsilon' = ", o.epsilon,
                                         " (must be 0 with the pseudo-inverse)"));
    else
      c.greater_than("epsilon", o.epsilon, 0.0);
    c.at_least("weight_decay", o.weight_decay, 0.0);
    if (o.weight_decay_type == WeightDecayType::corrected || o.weight_decay_type == WeightDecayType::independent)
      c.require(o.peak_lr && *o.peak_lr > 0,
                "weight_decay_type corrected/independent needs 'peak_lr' > 0");
    c.require(o.max_preconditioner_dim >= 1, impl::concat("invalid option 'max_preconditioner_dim' = ",
                                                    o.max_preconditioner_dim, " (must be >= 1 or lather::unbounded)"));
    c.require(o.precondition_frequency >= 1, impl::concat("invalid option 'precondition_frequency' = ",
                                                    o.precondition_frequency, " (must be >= 1)"));
    c.require(o.start_preconditioning_step == -1 || o.start_preconditioning_step >= o.precondition_frequency,
              impl::concat("invalid option 'start_preconditioning_step' = ", o.start_preconditioning_step,
                     " (must be -1, lather::never, or >= precondition_frequency = ", o.precondition_frequency,
                     ")"));
    c.require(o.target_parameter_dimensionality >= 1,
              impl::concat("invalid option 'target_parameter_dimensionality' = ", o.target_parameter_dimensionality,
                     " (must be >= 1 or lather::unbounded)"));
    c.in_half_open("momentum", o.momentum, 0.0, 1.0);
    c.in_half_open("dampening", o.dampening, 0.0, 1.0);
    c.require(!o.use_nesterov || o.momentum > 0, "option 'use_nesterov' = true requires 'momentum' > 0");
    c.greater_than("exponent_multiplier", o.exponent_multiplier, 0.0);
    c.require(o.num_tolerated_failed_amortized_computations >= 0,
              "option 'num_tolerated_failed_amortized_computations' must be >= 0");
    for (int r : o.inv_root_override)
      c.require(r >= 0, impl::concat("invalid option 'inv_root_override' entry ", r, " (must be >= 0; 0 = default)"));
    for (const auto& [order, ov] : o.inverse_exponent_override) {
      c.require(order >= 0, impl::concat("inverse_exponent_override: order ", order, " must be >= 0"));
      if (ov.all) c.at_least("inverse_exponent_override[order].all", *ov.all, 0.0);
      for (const auto& [dim, e] : ov.per_dimension) {
        c.require(dim >= 0 && dim < std::max(order, 1),
                  impl::concat("inverse_exponent_override: dimension ", dim, " does not exist in order-", order, " blocks"));
        c.at_least("inverse_exponent_override[order].per_dimension", e, 0.0);
      }
    }
    if constexpr (concepts::RootInverseStrategy<inner_type>) inner().validate();
    else inner().validate(c);
    m_grafting.validate(c);
    if (o.iterate_averaging != IterateAveraging::none) {
      c.require(o.momentum == 0.0, "iterate averaging (generalized primal averaging, Schedule-Free) and classic "
                                   "'momentum' exclude each other; set momentum = 0");
      c.in_closed("train_interp_coeff", o.train_interp_coeff, 0.0, 1.0);
      c.greater_than("train_interp_coeff", o.train_interp_coeff, 0.0);
      if (o.iterate_averaging == IterateAveraging::generalized_primal_averaging)
        c.in_half_open("eval_interp_coeff", o.eval_interp_coeff, 0.0, 1.0);
      else
        c.greater_than("eval_coeff_lr_power", o.eval_coeff_lr_power, 0.0);
    }
  }

  // The exponent of dimension `dim` of an order-`order` block; 0 = not preconditioned.
  static double exponent_for(const ShampooOptions& o, int order, int dim) {
    int root = 2 * std::max(order, 1);
    if (!o.inv_root_override.empty()) {
      const int r = o.inv_root_override.size() == 1
                        ? o.inv_root_override[0]
                        : (static_cast<std::size_t>(order) < o.inv_root_override.size() ? o.inv_root_override[order] : 0);
      if (r != 0) root = r;
    }
    double exponent = o.exponent_multiplier / root;
    if (auto it = o.inverse_exponent_override.find(order); it != o.inverse_exponent_override.end()) {
      if (it->second.all) exponent = *it->second.all;
      if (auto d = it->second.per_dimension.find(dim); d != it->second.per_dimension.end()) exponent = d->second;
    }
    return exponent;
  }

  // The pieces of user parameter `index` (the whole parameter unless sharded), with their layouts.
  void add_pieces(std::size_t index, const UserParam& u) {
    const auto& o = m_groups[u.group].options;
    auto add = [&](tensor_type t, std::int64_t offset, std::size_t piece, std::size_t block_offset) {
      ParamState p;
      p.group = u.group;
      p.user = index;
      p.name = u.name;
      p.piece = piece;
      p.offset = offset;
      p.block_offset = block_offset;
      p.param = t;
      std::vector<std::int64_t> shape(static_cast<std::size_t>(t.rank()));
      for (int k = 0; k < t.rank(); ++k) shape[static_cast<std::size_t>(k)] = t.extent(k);
      p.layout = BlockLayout(shape, o.max_preconditioner_dim, o.target_parameter_dimensionality);
      p.owner.assign(p.layout.blocks.size(), 0);
      m_params.push_back(std::move(p));
    };
    if (!sharded()) {
      add(u.param, 0, 0, 0);
      return;
    }
    const ShampooShard& sh = m_dist.shards[index];
    std::int64_t global = 1;
    for (auto e : sh.global_shape) {
      LATHER_THROW_IF(e < 0, "lather::Shampoo: shards[", index, "] of ", describe_name(index, u.name),
                      " has a negative extent in its global_shape");
      global *= e;
    }
    LATHER_THROW_IF(sh.start < 0 || sh.end < sh.start || sh.end > global, "lather::Shampoo: shards[", index, "] of ",
                    describe_name(index, u.name), " has the range [", sh.start, ", ", sh.end,
                    ") outside its global shape's ", global, " elements; pass this rank's flat range [start, end)");
    LATHER_THROW_IF(u.param.size() != sh.end - sh.start, "lather::Shampoo: ", describe_name(index, u.name), " has ",
                    u.param.size(), " elements but shards[", index, "] says this rank holds [", sh.start, ", ", sh.end,
                    "), ", sh.end - sh.start, " elements; pass the rank's flat shard of the parameter");
    LATHER_THROW_IF(u.param.size() > 0 && !u.param.is_row_major_contiguous(), "lather::Shampoo: ",
                    describe_name(index, u.name), " must be contiguous in sharded mode (a flat range of the parameter)");
    std::size_t piece = 0, blocks = 0;
    for (const auto& pc : impl::recover_shard_pieces(sh.global_shape, sh.start, sh.end)) {
      add(tensor_type(u.param.data() + pc.offset, std::span<const std::int64_t>(pc.shape)), pc.offset, piece++, blocks);
      blocks += m_params.back().layout.blocks.size();
    }
  }

  // DDP / HSDP: every block of every piece gets an owner by the reference's LPT rule over the
  // global block order (parameters in order, blocks in order; one assignment for all groups).
  void assign_blocks() {
    if (!exchanges()) return;
    const std::size_t bytes = communication_bytes(m_dist.communication_dtype, sizeof(value_type));
    std::vector<double> costs;
    for (const auto& p : m_params)
      if (p.param.size() > 0)
        for (const auto& b : p.layout.blocks) costs.push_back(impl::block_cost(m_dist.cost_model, b.extent, bytes));
    const auto owner = impl::assign_blocks_lpt(costs, m_dist_size);
    std::size_t next = 0;
    for (auto& p : m_params)
      if (p.param.size() > 0)
        for (auto& o : p.owner) o = owner[next++];
  }

  void build_param_state(std::size_t idx) {
    auto& p = m_params[idx];
    const auto& o = m_groups[p.group].options;
    const std::size_t nb = p.layout.blocks.size();
    p.ordinal_base = 0;
    for (std::size_t j = 0; j < idx; ++j) p.ordinal_base += static_cast<std::int64_t>(m_params[j].layout.blocks.size());
    p.local_of.assign(nb, -1);
    if (p.param.size() == 0) return;  // zero-size parameters are skipped entirely
    const auto& merged = p.layout.merged_shape;
    // This rank's blocks, packed one after the other in its state buffers.
    std::vector<std::int64_t> begins(nb, -1), local{0};
    for (std::size_t b = 0; b < nb; ++b) {
      if (p.owner[b] != m_dist_rank) continue;
      p.local_of[b] = static_cast<int>(local.size() - 1);
      begins[b] = local.back();
      local.push_back(local.back() + p.layout.blocks[b].numel());
    }
    p.local_numel = local.back();
    p.block_begin = to_device_view("lather::Shampoo::block_begin", local);
    const std::vector<std::int64_t> chunk_begins = impl::kernels::BlockChunks<memory_space>::chunk_begins(local);
    p.chunk_begin = to_device_view("lather::Shampoo::chunk_begin", chunk_begins);
    p.chunks = chunk_begins.back();
    p.index_begin = to_device_view("lather::Shampoo::index_begin", begins);
    p.index.rank = static_cast<int>(merged.size());
    p.index.block_size = o.max_preconditioner_dim;
    for (std::size_t j = 0; j < merged.size(); ++j) {
      p.index.dims[j] = merged[j];
      p.index.grid[j] = o.max_preconditioner_dim == unbounded ? 1 : (merged[j] + o.max_preconditioner_dim - 1) / o.max_preconditioner_dim;
    }
    p.index.block_begin = p.index_begin;
    p.index.identity = nb == 1 && p.local_of[0] == 0;
    p.norms = Kokkos::View<double**, memory_space>("lather::Shampoo::block_norms", local.size() - 1, 2);
    const int order = static_cast<int>(merged.size());
    if constexpr (kind == PreconditionerKind::eigenvalue_corrected) p.corrected_exponent = inner().exponent(order);
    if constexpr (kind == PreconditionerKind::spectral_descent) {
      LATHER_THROW_IF(order != 2 && o.start_preconditioning_step != never,
                      "lather::Shampoo: spectral descent orthogonalizes matrices, but ",
                      describe_piece(idx), " has ", order,
                      "-D blocks; put it in a parameter group with start_preconditioning_step = lather::never "
                      "(it then takes the grafting method's or Gbar's direction, as the reference's Muon recipe)");
    }
    constexpr bool has_factors = kind == PreconditionerKind::root_inverse ||
                                 kind == PreconditionerKind::eigendecomposed ||
                                 kind == PreconditionerKind::eigenvalue_corrected;
    for (std::size_t b = 0; b < p.layout.blocks.size(); ++b) {
      if (p.local_of[b] < 0) continue;  // another rank's block: no state here
      block_state_type blk;
      blk.extent = p.layout.blocks[b].extent;
      blk.begin = begins[b];
      blk.id = b;
      blk.ordinal = p.ordinal_base + static_cast<std::int64_t>(b);
      p.backup.emplace_back();
      p.result.emplace_back();
      p.pending_q.emplace_back(static_cast<std::size_t>(order));
      p.pending_lambda.emplace_back(static_cast<std::size_t>(order));
      p.pending_x.emplace_back(static_cast<std::size_t>(order));
      if constexpr (kind == PreconditionerKind::spectral_descent) {
        if (order == 2) {
          const auto m = static_cast<std::size_t>(std::min(blk.extent[0], blk.extent[1]));
          if (m_gram.find(m) == m_gram.end()) m_gram[m] = vector_type("lather::Shampoo::gram", m * m);
          if (m_gram2.find(m) == m_gram2.end()) m_gram2[m] = vector_type("lather::Shampoo::gram2", m * m);
        }
      }
      for (int k = 0; k < order; ++k) {
        ShampooFactorState<factor_type, inverse_factor_type, memory_space> f;
        double e = 0.0;
        if constexpr (kind == PreconditionerKind::eigenvalue_corrected) e = inner().ignored(order, k) ? 0.0 : 1.0;
        else if constexpr (has_factors) e = exponent_for(o, order, k);
        f.preconditioned = has_factors && e != 0.0;
        const auto dk = static_cast<std::size_t>(blk.extent[k]);
        if (f.preconditioned) {
          f.root = 1.0 / e;
          if constexpr (kind == PreconditionerKind::root_inverse || kind == PreconditionerKind::eigendecomposed) {
            LATHER_THROW_IF(!inner().supports_root(f.root), "lather::Shampoo: the root-inverse strategy cannot compute the root ",
                            f.root, " needed by dimension ", k, " of the order-", order, " blocks of ",
                            describe_piece(idx),
                            "; choose an exponent it supports (coupled Newton needs 1/exponent to be an integer)");
          }
          f.dim = static_cast<std::int64_t>(dk);
          f.packed = o.use_symmetric_packing;
          // Paired where the host BLAS does the block's products on this dimension (not a
          // vector along it: those take the rank-one update and SPMV on packed storage).
          f.paired = paired_possible && f.packed && numel_of(blk.extent) > f.dim;
          const auto stored = static_cast<std::size_t>(impl::kernels::SymmetricStorage<factor_type>::size(f.dim, f.packed));
          // The matrices themselves come from the arenas once every block is known
          // (allocate_factor_storage).
          // The eigenbasis kinds keep their pending results on the host (pending_q, ...).
          if constexpr (kind == PreconditionerKind::root_inverse)
            p.result.back().emplace_back("lather::Shampoo::root_result", stored);
          else
            p.result.back().emplace_back();
          p.backup.back().emplace_back("lather::Shampoo::factor_backup", stored);
          if (m_gram.find(dk) == m_gram.end())
            m_gram[dk] = vector_type("lather::Shampoo::gram", dk * dk);
          if (m_scratch.find(dk) == m_scratch.end())
            m_scratch[dk] = Kokkos::View<factor_type**, Kokkos::LayoutRight, memory_space>("lather::Shampoo::bias_corrected", dk, dk);
          if constexpr (kind == PreconditionerKind::root_inverse)
            if (m_root_full.extent(0) < dk * dk) Kokkos::realloc(m_root_full, dk * dk);
        } else {
          p.backup.back().emplace_back();
          p.result.back().emplace_back();
        }
        blk.factors.push_back(std::move(f));
      }
      p.blocks.push_back(std::move(blk));
    }
    ExecSpace().fence();
  }

  // A zero state or work buffer of n elements, on huge pages where they apply
  // (impl::huge_page_view).
  vector_type buffer(const std::string& label, std::int64_t n) {
    return impl::huge_page_view<vector_type>(label, static_cast<std::size_t>(n), m_huge_pages,
                                             &m_huge_page_bytes);
  }

  // Every preconditioned factor's matrices (the factor, its inverse root unless paired with it,
  // eigenvectors, eigenvalues), slices of two arenas (impl::StateArena: one allocation per
  // scalar type, on huge pages in host memory), then set to the reference's initial state:
  // factors 0, inverse roots and eigenvectors I, eigenvalues 1.
  void allocate_factor_storage() {
    impl::StateArena<factor_type, memory_space> factors;
    impl::StateArena<inverse_factor_type, memory_space> inverses;
    // Slice lengths: (factor, inverse root, eigenvectors, eigenvalues).
    auto lengths = [](const factor_state_type& f) {
      const auto stored = static_cast<std::size_t>(impl::kernels::SymmetricStorage<factor_type>::size(f.dim, f.packed));
      const auto d = static_cast<std::size_t>(f.dim);
      const std::size_t inverse = kind != PreconditionerKind::eigenvalue_corrected && !f.paired ? stored : 0;
      const std::size_t vectors =
          kind == PreconditionerKind::eigenvalue_corrected || kind == PreconditionerKind::eigendecomposed ? d * d : 0;
      const std::size_t values = kind == PreconditionerKind::eigendecomposed ? d : 0;
      return std::array<std::size_t, 4>{f.paired ? 2 * stored : stored, inverse, vectors, values};
    };
    for (const auto& p : m_params)
      for (const auto& blk : p.blocks)
        for (const auto& f : blk.factors) {
          if (!f.preconditioned) continue;
          const auto n = lengths(f);
          factors.reserve(n[0]);
          for (std::size_t j = 1; j < 4; ++j) inverses.reserve(n[j]);
        }
    factors.allocate("lather::Shampoo::factor_matrices", m_huge_pages);
    inverses.allocate("lather::Shampoo::inverse_factor_matrices", m_huge_pages);
    using MD = Kokkos::MDRangePolicy<ExecSpace, Kokkos::Rank<2>, Kokkos::IndexType<std::int64_t>>;
    for (auto& p : m_params)
      for (auto& blk : p.blocks)
        for (auto& f : blk.factors) {
          if (!f.preconditioned) continue;
          const auto n = lengths(f);
          f.factor = factors.take(n[0]);
          f.inverse_factor = inverses.take(n[1]);
          f.eigenvectors = inverses.take(n[2]);
          f.eigenvalues = inverses.take(n[3]);
          if constexpr (kind != PreconditionerKind::eigenvalue_corrected)
            Kokkos::parallel_for(LATHER_LABEL("lather::Shampoo::identity"), MD({0, 0}, {f.dim, f.dim}),
                                 impl::kernels::SetIdentity<inverse_factor_type>{f.inverse_storage()});
          // Q = I and lambda = 1 until the first amortized step (the reference's initial state).
          if constexpr (kind == PreconditionerKind::eigenvalue_corrected || kind == PreconditionerKind::eigendecomposed)
            Kokkos::parallel_for(LATHER_LABEL("lather::Shampoo::identity"), MD({0, 0}, {f.dim, f.dim}),
                                 impl::kernels::SetIdentity<inverse_factor_type>{{f.eigenvectors.data(), f.dim, false}});
          if constexpr (kind == PreconditionerKind::eigendecomposed) Kokkos::deep_copy(f.eigenvalues, inverse_factor_type(1));
        }
    m_huge_page_bytes += factors.advised_bytes() + inverses.advised_bytes();
    ExecSpace().fence();
  }

  // The per-element state of a user parameter (this rank's blocks of all its pieces), each
  // piece's part a subview of it.
  // All of them are slices of one arena (impl::StateArena): a model's many small parameters
  // (biases, norms) then share pages with the rest instead of each taking its own.
  void allocate_element_states() {
    impl::StateArena<value_type, memory_space> arena;
    for (const auto& u : m_users)
      for (const auto n : element_lengths(u)) arena.reserve(n);
    arena.allocate("lather::Shampoo::element_state", m_huge_pages);
    m_huge_page_bytes += arena.advised_bytes();
    for (auto& u : m_users) allocate_element_state(u, arena);
  }
  // The lengths of u's filtered gradient, grafting state, momentum, corrected eigenvalues and
  // weight buffer (0: not kept).
  std::array<std::size_t, 5> element_lengths(const UserParam& u) const {
    const auto& o = m_groups[u.group].options;
    std::int64_t numel = 0;
    for (std::size_t j = 0; j < u.count; ++j) numel += m_params[u.first + j].local_numel;
    const auto n = static_cast<std::size_t>(numel);
    return {o.betas[0] != 0.0 ? n : 0, Grafting::has_state ? n : 0, o.momentum != 0.0 ? n : 0,
            kind == PreconditionerKind::eigenvalue_corrected ? n : 0,
            o.iterate_averaging != IterateAveraging::none ? n : 0};
  }
  void allocate_element_state(UserParam& u, impl::StateArena<value_type, memory_space>& arena) {
    const auto n = element_lengths(u);
    u.filtered = arena.take(n[0]);
    u.graft_state = arena.take(n[1]);
    u.momentum = arena.take(n[2]);
    u.corrected = arena.take(n[3]);
    u.weight_buffer = arena.take(n[4]);
    std::int64_t at = 0;
    for (std::size_t j = 0; j < u.count; ++j) {
      auto& p = m_params[u.first + j];
      const auto range = std::make_pair(at, at + p.local_numel);
      auto part = [&](const vector_type& v) { return v.data() == nullptr ? vector_type() : vector_type(v, range); };
      p.filtered = part(u.filtered);
      p.graft_state = part(u.graft_state);
      p.momentum = part(u.momentum);
      p.corrected = part(u.corrected);
      p.weight_buffer = part(u.weight_buffer);
      at += p.local_numel;
      // Z starts at the parameters' values at construction.
      if (p.weight_buffer.data() != nullptr && p.local_numel > 0)
        for_each_blocked(LATHER_LABEL("lather::Shampoo::init_weight_buffer"), ExecSpace(), p,
                         impl::kernels::GatherParam<value_type, memory_space>{p.param, p.weight_buffer});
    }
    ExecSpace().fence();
  }

  // DDP / HSDP: the all-gather buffer (notes 6.1.4): rank r's slice holds its blocks in global
  // block order, each padded to 64 bytes of the communication dtype; the slices are as long as
  // the longest.
  void build_exchange() {
    const std::size_t bytes = communication_bytes(m_dist.communication_dtype, sizeof(value_type));
    std::vector<std::int64_t> load(static_cast<std::size_t>(m_dist_size), 0);
    std::vector<std::vector<std::int64_t>> at(m_params.size());
    for (std::size_t i = 0; i < m_params.size(); ++i) {
      const auto& p = m_params[i];
      if (p.param.size() == 0) continue;
      for (std::size_t b = 0; b < p.layout.blocks.size(); ++b) {
        auto& l = load[static_cast<std::size_t>(p.owner[b])];
        at[i].push_back(l);
        l += impl::aligned_bytes(p.layout.blocks[b].numel(), bytes);
      }
    }
    m_slice_bytes = std::max<std::int64_t>(64, *std::max_element(load.begin(), load.end()));
    m_send = Kokkos::View<std::uint8_t*, memory_space>("lather::Shampoo::send", static_cast<std::size_t>(m_slice_bytes));
    m_recv = Kokkos::View<std::uint8_t*, memory_space>("lather::Shampoo::recv",
                                                       static_cast<std::size_t>(m_slice_bytes * m_dist_size));
    const auto elem = static_cast<std::int64_t>(bytes);
    for (std::size_t i = 0; i < m_params.size(); ++i) {
      auto& p = m_params[i];
      if (p.param.size() == 0) continue;
      std::vector<std::int64_t> send(p.layout.blocks.size()), recv(p.layout.blocks.size());
      for (std::size_t b = 0; b < p.layout.blocks.size(); ++b) {
        send[b] = p.owner[b] == m_dist_rank ? at[i][b] / elem : -1;
        recv[b] = (p.owner[b] * m_slice_bytes + at[i][b]) / elem;
      }
      p.send_begin = to_device_view("lather::Shampoo::send_begin", send);
      p.recv_begin = to_device_view("lather::Shampoo::recv_begin", recv);
      p.send_index = p.index;
      p.send_index.identity = false;
      p.send_index.block_begin = p.send_begin;
      p.recv_index = p.send_index;
      p.recv_index.block_begin = p.recv_begin;
    }
  }

  static Kokkos::View<std::int64_t*, memory_space> to_device_view(const char* label, const std::vector<std::int64_t>& v) {
    Kokkos::View<std::int64_t*, memory_space> d(std::string(label), v.size());
    Kokkos::View<const std::int64_t*, Kokkos::HostSpace, Kokkos::MemoryTraits<Kokkos::Unmanaged>> h(v.data(), v.size());
    Kokkos::deep_copy(d, h);
    return d;
  }

  // ---- distribution --------------------------------------------------------------------------

  // Whether steps exchange blocks over the communicator (DDP and HSDP).
  [[nodiscard]] bool exchanges() const noexcept {
    return m_dist.mode == ShampooDistributionMode::ddp || m_dist.mode == ShampooDistributionMode::hsdp;
  }
  [[nodiscard]] bool sharded() const noexcept {
    return m_dist.mode == ShampooDistributionMode::sharded || m_dist.mode == ShampooDistributionMode::hsdp;
  }

  void validate_distribution(std::size_t total_params) const {
    const impl::OptionCheck c("Shampoo", "distributed options");
    if (exchanges()) {
      const int g = m_dist.num_trainers_per_group;
      c.require(g == -1 || (g >= 1 && m_comm.size() % g == 0),
                impl::concat("invalid option 'num_trainers_per_group' = ", g, " (must be -1, meaning all ", m_comm.size(),
                             " ranks, or a divisor of the communicator's size)"));
    }
    if (const auto* a = std::get_if<AlignedMemoryCostModel>(&m_dist.cost_model))
      c.require(a->alignment >= 1, impl::concat("invalid option 'cost_model.alignment' = ", a->alignment, " (must be >= 1)"));
    if (sharded())
      c.require(m_dist.shards.size() == total_params,
                impl::concat("sharded and hsdp modes need one entry of 'shards' per parameter: got ", m_dist.shards.size(),
                             " for ", total_params, " parameters"));
    else
      c.require(m_dist.shards.empty(), "option 'shards' is only for the sharded and hsdp modes");
  }

  // Every rank of the communicator must hold the same parameters (shapes, shard ranges), options
  // and distributed options; a mismatch would hang the all-gather or diverge silently.
  void check_agreement() {
    std::vector<double> sig;
    std::vector<std::string> what;
    auto add = [&](double v, const std::string& name) {
      sig.push_back(v);
      what.push_back(name);
    };
    add(static_cast<double>(m_users.size()), "the number of parameters");
    for (std::size_t i = 0; i < m_users.size(); ++i) {
      const auto& u = m_users[i];
      add(static_cast<double>(u.group), "the group of " + describe(i));
      add(u.param.rank(), "the rank of " + describe(i));
      for (int k = 0; k < u.param.rank(); ++k) add(static_cast<double>(u.param.extent(k)), "the shape of " + describe(i));
      if (sharded()) {
        const auto& sh = m_dist.shards[i];
        add(static_cast<double>(sh.global_shape.size()), "the global shape of " + describe(i));
        for (auto e : sh.global_shape) add(static_cast<double>(e), "the global shape of " + describe(i));
        add(static_cast<double>(sh.start), "the shard range of " + describe(i) + " (in HSDP the replicas of a shard agree)");
        add(static_cast<double>(sh.end), "the shard range of " + describe(i) + " (in HSDP the replicas of a shard agree)");
      }
    }
    for (std::size_t g = 0; g < m_groups.size(); ++g) {
      add(m_groups[g].options.lr, "option 'lr' of parameter group " + std::to_string(g));
      // No structured binding here: clang 16 cannot capture one in a lambda with -fopenmp.
      for (const auto& option : recorded_options(m_groups[g].options)) {
        const std::string label = "option '" + option.first + "' of parameter group " + std::to_string(g);
        std::visit([&](const auto& v) {
          add(static_cast<double>(v.size()), label);
          for (const auto& x : v) add(static_cast<double>(x), label);
        }, option.second.values);
      }
    }
    add(static_cast<double>(m_dist.mode), "the distribution mode");
    add(static_cast<double>(m_dist.communication_dtype), "option 'communication_dtype'");
    add(m_dist.num_trainers_per_group, "option 'num_trainers_per_group'");
    add(m_dist.communicate_params ? 1.0 : 0.0, "option 'communicate_params'");
    add(static_cast<double>(m_dist.cost_model.index()), "option 'cost_model'");
    impl::check_ranks_agree(m_comm, sig, [&](std::size_t k) { return what[k]; }, "Shampoo");
  }

  // DDP / HSDP: a parameter must have a gradient on every rank or on none (else the ranks would
  // compute different steps); checked with one small all-reduce, an error on every rank.
  void agree_on_presence(const ExecSpace& space, const std::vector<TensorRef<const value_type, memory_space>>& g) {
    std::vector<std::int64_t> has(m_users.size());
    for (std::size_t i = 0; i < m_users.size(); ++i) has[i] = g[i].data() != nullptr ? 1 : 0;
    const auto mine = has;
    sum_over_group(space, has);
    for (std::size_t i = 0; i < m_users.size(); ++i)
      LATHER_THROW_IF(has[i] != 0 && has[i] != m_dist_size, "lather::Shampoo::step: ", describe(i), " has a gradient on ",
                      has[i], " of the ", m_dist_size, " ranks of the DDP group (",
                      mine[i] ? "this rank has one" : "not on this rank",
                      "); pass a gradient on every rank or on none (an empty tensor); nothing was changed");
  }
  void sum_over_group(const ExecSpace& space, std::vector<std::int64_t>& v) const {
    (void)space;
    Kokkos::View<std::int64_t*, Kokkos::HostSpace> h("lather::Shampoo::group_sum", v.size());
    for (std::size_t k = 0; k < v.size(); ++k) h(k) = v[k];
    m_comm.all_reduce_sum(Kokkos::DefaultHostExecutionSpace(), h);
    for (std::size_t k = 0; k < v.size(); ++k) v[k] = h(k);
  }

  // The gradients of the pieces (sharded modes: cut out of the user's flat gradients).
  // The result is `g` itself, or a member reused from step to step.
  const std::vector<TensorRef<const value_type, memory_space>>& piece_gradients(
      const std::vector<TensorRef<const value_type, memory_space>>& g) {
    if (!sharded()) return g;
    std::vector<TensorRef<const value_type, memory_space>>& out = m_piece_grads;
    out.assign(m_params.size(), TensorRef<const value_type, memory_space>());
    for (std::size_t i = 0; i < m_params.size(); ++i) {
      const auto& p = m_params[i];
      const auto& gu = g[p.user];
      if (gu.data() == nullptr) continue;
      LATHER_THROW_IF(!gu.is_row_major_contiguous(), "lather::Shampoo::step: the gradient of ", describe(p.user),
                      " must be contiguous in sharded mode; nothing was changed");
      std::array<std::int64_t, max_tensor_rank> shape{};
      for (int k = 0; k < p.param.rank(); ++k) shape[static_cast<std::size_t>(k)] = p.param.extent(k);
      out[i] = TensorRef<const value_type, memory_space>(
          gu.data() + p.offset, std::span<const std::int64_t>(shape.data(), static_cast<std::size_t>(p.param.rank())));
    }
    return out;
  }

  // The updates (or updated parameters) of this rank's blocks of piece i into its send slice.
  void pack(const ExecSpace& space, std::size_t i, const value_type* delta) {
    auto& p = m_params[i];
    with_comm_type([&](auto tag) {
      using C = decltype(tag);
      for_each_blocked(LATHER_LABEL("lather::Shampoo::pack"), space, p,
                       impl::kernels::PackComm<value_type, C, memory_space>{p.param, delta,
                                                                           reinterpret_cast<C*>(m_send.data())},
                       p.send_index);
    });
  }
  // One all-gather, then every rank's blocks of the pieces `use(i)` selects into the parameters.
  template <class Use>
  void exchange(const ExecSpace& space, bool add, const Use& use) {
    m_comm.all_gather(space, Kokkos::View<const std::uint8_t*, memory_space>(m_send), m_recv);
    for (std::size_t i = 0; i < m_params.size(); ++i) {
      if (!use(i)) continue;
      auto& p = m_params[i];
      with_comm_type([&](auto tag) {
        using C = decltype(tag);
        for_each_blocked(LATHER_LABEL("lather::Shampoo::unpack"), space, p,
                         impl::kernels::UnpackComm<value_type, C, memory_space>{
                             p.param, reinterpret_cast<const C*>(m_recv.data()), add},
                         p.recv_index);
      });
    }
  }
  template <class F>
  void with_comm_type(F&& f) const {
    switch (m_dist.communication_dtype) {
      case CommunicationDtype::parameter: f(value_type{}); break;
      case CommunicationDtype::float32: f(float{}); break;
      case CommunicationDtype::bfloat16: f(impl::bf16_bits{}); break;
      case CommunicationDtype::float16: f(impl::fp16_bits{}); break;
    }
  }

  // ---- the step, in phases -----------------------------------------------------------------

  static double seconds_since(std::chrono::steady_clock::time_point t0) {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }

  void run_step(const ExecSpace& space, const std::vector<TensorRef<const value_type, memory_space>>& g) {
    bool any_amortized = false;
    for (std::size_t i = 0; i < m_params.size(); ++i)
      any_amortized = any_amortized || (computes(i, g) && local_blocks_amortized(i));
    // DDP: whether a step is amortized is the same on every rank (same groups and counters); a
    // rank without amortized blocks still takes part in the failure agreement below.
    bool amortized_here = any_amortized;
    if (exchanges())
      for (std::size_t i = 0; i < m_params.size(); ++i)
        amortized_here = amortized_here || (active(i, g) && layout_blocks_amortized(i));
    const bool batched = batched_now();
    const bool fused = !batched && fused_possible(space);
    if (!amortized_here) {
      // Nothing can fail after the checks: one pass per parameter (or per block, fused; or one
      // over all parameters, batched).
      if constexpr (batched_kind) {  // not instantiated for policies the batched passes do not cover
        if (batched) {
          batched_factors(space, g, false);
          batched_direction(space, g);
          return;
        }
      }
      if (fused) {
        run_fused(space, g, true, true, false);
        return;
      }
      for (std::size_t i = 0; i < m_params.size(); ++i) {
        if (!computes(i, g)) continue;
        gather(space, i, g[i]);
        update_factors(space, i, false, m_groups[m_params[i].group].options);
        direction_and_update(space, i);
      }
      finish_exchange(space, g);
      return;
    }
    // Amortized step, in phases so that an error leaves everything as it was.
    // Phase A: factor statistics of every parameter, with the previous factors backed up.
    if (fused) run_fused(space, g, true, false, true);
    if constexpr (batched_kind)
      if (batched) batched_factors(space, g, true);
    for (std::size_t i = 0; i < m_params.size() && !fused && !batched; ++i) {
      if (!computes(i, g)) continue;
      gather(space, i, g[i]);
      update_factors(space, i, true, m_groups[m_params[i].group].options);
    }
    // Phase B: root inverses into pending results; any error restores the factors and throws
    // (DDP: on every rank, so none waits in the all-gather).
    // Per piece, block and factor (kept across steps, so a root step does not allocate either);
    // m_status_set marks the pieces computed on this step.
    auto& status = m_status;
    if (status.size() != m_params.size()) status.resize(m_params.size());
    m_status_set.assign(m_params.size(), 0);
    std::exception_ptr error;
    const auto roots_start = m_phase_timing ? std::chrono::steady_clock::now() : std::chrono::steady_clock::time_point{};
    try {
      compute_roots(space, g, status);
    } catch (...) {
      error = std::current_exception();
    }
    if (m_phase_timing) m_info.seconds.roots += seconds_since(roots_start);
    if (exchanges()) {
      std::vector<std::int64_t>& failed = m_failed_ranks;
      failed.assign(static_cast<std::size_t>(m_dist_size), 0);
      failed[static_cast<std::size_t>(m_dist_rank)] = error ? 1 : 0;
      sum_over_group(space, failed);
      int first = -1;
      for (int r = 0; r < m_dist_size && first < 0; ++r)
        if (failed[static_cast<std::size_t>(r)] != 0) first = r;
      if (first >= 0 && !error) {
        restore_factors(space, g);
        impl::throw_error<runtime_error>(std::source_location::current(), "lather::Shampoo::step: the root computations "
                                         "failed on rank ", first, " of the DDP group (its error names the block); "
                                         "nothing was changed on any rank");
      }
    }
    if (error) {
      restore_factors(space, g);
      std::rethrow_exception(error);
    }
    m_info.amortized = true;
    // Phase C: commit the root results (a failed computation keeps the previous inverse factor).
    for (std::size_t i = 0; i < m_params.size(); ++i) {
      if (!m_status_set[i]) continue;
      auto& p = m_params[i];
      for (std::size_t b = 0; b < p.blocks.size(); ++b) {
        if (status[i][b].empty()) continue;  // staggered: this block computed nothing
        bool failed = false;
        for (std::size_t k = 0; k < p.blocks[b].factors.size(); ++k) {
          auto& f = p.blocks[b].factors[k];
          if (!f.preconditioned) continue;
          const RootInverseStatus s = status[i][b][k];
          if (s == RootInverseStatus::failed) {
            failed = true;
            continue;
          }
          if (s == RootInverseStatus::max_iterations_reached) ++m_info.root_computations_not_converged;
          if constexpr (kind == PreconditionerKind::eigenvalue_corrected || kind == PreconditionerKind::eigendecomposed) {
            host_to_view(space, p.pending_q[b][k], f.eigenvectors);
            if constexpr (kind == PreconditionerKind::eigendecomposed) {
              host_to_view(space, p.pending_lambda[b][k], f.eigenvalues);
              host_to_symmetric(space, p.pending_x[b][k], f);
            }
            continue;
          }
          Kokkos::parallel_for(LATHER_LABEL("lather::Shampoo::commit_inverse"),
                               Kokkos::MDRangePolicy<ExecSpace, Kokkos::Rank<2>, Kokkos::IndexType<std::int64_t>>(
                                   space, {0, 0}, {f.dim, f.dim}),
                               impl::kernels::SymmetricCopy<factor_type, inverse_factor_type>{
                                   result_storage(p, b, k).as_const(), f.inverse_storage()});
        }
        if (failed) {
          ++p.blocks[b].consecutive_failures;
          ++p.blocks[b].failed_amortized_computations;
          ++m_info.failed_root_computations;
        } else {
          p.blocks[b].consecutive_failures = 0;
        }
      }
    }
    // Phase D: filtering, grafting, direction, update (the blocked gradient is gathered again:
    // the shared buffer holds the last parameter's).
    if (fused) run_fused(space, g, false, true, false);
    if constexpr (batched_kind)
      if (batched) batched_direction(space, g);
    for (std::size_t i = 0; i < m_params.size() && !fused && !batched; ++i) {
      if (!computes(i, g)) continue;
      gather(space, i, g[i]);
      direction_and_update(space, i);
    }
    finish_exchange(space, g);
  }

  // DDP / HSDP: the all-gather of this step's updates (skipped on every rank alike when no
  // parameter had a gradient), then every rank's blocks into the parameters.
  void finish_exchange(const ExecSpace& space, const std::vector<TensorRef<const value_type, memory_space>>& g) {
    if (!exchanges()) return;
    bool any = false;
    for (std::size_t i = 0; i < m_params.size(); ++i) any = any || active(i, g);
    if (!any) return;
    exchange(space, !m_dist.communicate_params, [&](std::size_t i) { return active(i, g); });
  }

  // Whether piece i has a gradient, and whether this rank computes any of its blocks.
  bool computes(std::size_t i, const std::vector<TensorRef<const value_type, memory_space>>& g) const {
    return active(i, g) && m_params[i].local_numel > 0;
  }
  bool active(std::size_t i, const std::vector<TensorRef<const value_type, memory_space>>& g) const {
    return g[i].data() != nullptr && m_params[i].param.size() > 0;
  }
  bool is_amortized(std::size_t grp) const {
    const auto& o = m_groups[grp].options;
    const std::int64_t t = m_groups[grp].step, s = o.start_step(), f = o.precondition_frequency;
    return (t % f == 0 && t > s) || t == s;
  }
  // Whether the block with this ordinal recomputes on its group's current step (is_amortized
  // without staggering).
  bool block_amortized(std::size_t grp, std::int64_t ordinal) const {
    const auto& o = m_groups[grp].options;
    if (!o.stagger_amortized_computations) return is_amortized(grp);
    const std::int64_t t = m_groups[grp].step, s = o.start_step(), f = o.precondition_frequency;
    return t == s || (t > s && t % f == ordinal % f);
  }
  // Whether any of this rank's blocks of piece i recomputes on this step.
  bool local_blocks_amortized(std::size_t i) const {
    const auto& p = m_params[i];
    if (!m_groups[p.group].options.stagger_amortized_computations) return is_amortized(p.group);
    for (const auto& blk : p.blocks)
      if (block_amortized(p.group, blk.ordinal)) return true;
    return false;
  }
  // Whether any block of piece i's layout, on any rank, recomputes on this step (the same
  // answer on every rank: DDP ranks agree on taking the amortized path).
  bool layout_blocks_amortized(std::size_t i) const {
    const auto& p = m_params[i];
    if (!m_groups[p.group].options.stagger_amortized_computations) return is_amortized(p.group);
    for (std::size_t b = 0; b < p.layout.blocks.size(); ++b)
      if (block_amortized(p.group, p.ordinal_base + static_cast<std::int64_t>(b))) return true;
    return false;
  }
  bool uses_graft(std::size_t grp) const {
    return Grafting::enabled && m_groups[grp].step < m_groups[grp].options.start_step();
  }

  void gather(const ExecSpace& space, std::size_t i, const TensorRef<const value_type, memory_space>& g) {
    auto& p = m_params[i];
    const auto& o = m_groups[p.group].options;
    const bool l2 = o.weight_decay_type == WeightDecayType::l2 && o.weight_decay != 0.0;
    for_each_blocked(LATHER_LABEL("lather::Shampoo::gather"), space, p,
                     impl::kernels::GatherGradient<value_type, memory_space>{
                         g, p.param, m_grad, value_type(l2 ? o.weight_decay : 0.0)});
  }

  /// Runs op.apply(flat, blocked) over every element of parameter p: flat for one block and 1-D
  /// tensors, one team per row of the last merged dimension otherwise.
  /// `index` maps to this rank's state buffers by default (elements of other ranks' blocks are
  /// skipped), or to the DDP send / gathered buffers.
  template <class Op>
  static void for_each_blocked(const std::string& label, const ExecSpace& space, const ParamState& p, const Op& op) {
    for_each_blocked(label, space, p, op, p.index);
  }
  template <class Op>
  static void for_each_blocked(const std::string& label, const ExecSpace& space, const ParamState& p, const Op& op,
                               const impl::kernels::BlockedIndex<memory_space>& index) {
    const std::int64_t n = p.param.size();
    if (n == 0) return;
    // by_argument: the gather's and the update's functors (two TensorRefs and the index) pass
    // 512 bytes, where CUDA and HIP would launch through constant memory and wait (launch.hpp).
    if (index.identity || index.rank <= 1) {
      Kokkos::parallel_for(label,
                           impl::kernels::by_argument(
                               Kokkos::RangePolicy<ExecSpace, Kokkos::IndexType<std::int64_t>>(space, 0, n)),
                           impl::kernels::FlatBlocked<Op, memory_space>{op, index});
    } else {
      Kokkos::parallel_for(label,
                           impl::kernels::by_argument(
                               Kokkos::TeamPolicy<ExecSpace>(space, static_cast<int>(n / index.last()), Kokkos::AUTO)),
                           impl::kernels::RowwiseBlocked<Op, memory_space>{op, index});
    }
  }

  // Column-major unmanaged matrices on ExecSpace: a row-major (r x c) block is the column-major
  // (c x r) matrix at the same address, which is what BLAS wants.
  using blas_matrix_type = Kokkos::View<value_type**, Kokkos::LayoutLeft, Kokkos::Device<ExecSpace, memory_space>,
                                        Kokkos::MemoryTraits<Kokkos::Unmanaged>>;
  static blas_matrix_type blas_matrix(value_type* data, std::int64_t rows, std::int64_t cols) {
    return blas_matrix_type(data, static_cast<std::size_t>(rows), static_cast<std::size_t>(cols));
  }
  // Products of host data on a host space go to the host BLAS (impl/backends/blas.hpp) directly.
  static constexpr bool host_products =
      impl::blas::host_blas_eligible<ExecSpace, blas_matrix_type, blas_matrix_type, blas_matrix_type>;
  // Whether packed factors can share a buffer with their inverse roots (ShampooFactorState::
  // paired): host BLAS products of one type (the SYRK's beta and the SYMM read the stored
  // triangles in place), root-inverse and eigendecomposed kinds (not KL, whose products are the
  // portable mode products). Device spaces keep the reference's packing: their products are
  // batched GEMMs of unpacked operands (a full matrix per product either way).
  static constexpr bool paired_possible =
      host_products && !kl && std::is_same_v<value_type, factor_type> && std::is_same_v<value_type, inverse_factor_type> &&
      impl::blas::is_blas_scalar<value_type> &&
      (kind == PreconditionerKind::root_inverse || kind == PreconditionerKind::eigendecomposed);
  // A d x d work matrix of the parameters' type (Gram matrices, unpacked inverse factors);
  // allocated once per size at construction.
  blas_matrix_type gram_scratch(std::int64_t d) const {
    const auto& v = m_gram.at(static_cast<std::size_t>(d));
    return blas_matrix_type(v.data(), static_cast<std::size_t>(d), static_cast<std::size_t>(d));
  }
  // The host BLAS directly for host data, else KokkosBlas::gemm ordered with `space` by fences
  // (impl::kernels::gemm).
  // Host products are split over the space's threads (impl/backends/blas_split.hpp), as the
  // fused path's wide blocks' are, so both give the same bits there.
  static void gemm(const ExecSpace& space, const char* ta, const char* tb, value_type alpha, const blas_matrix_type& a,
                   const blas_matrix_type& b, value_type beta, const blas_matrix_type& c) {
    if constexpr (host_products) {
      const auto m = static_cast<std::int64_t>(c.extent(0)), n = static_cast<std::int64_t>(c.extent(1));
      const auto ra = static_cast<std::int64_t>(a.extent(0)), rb = static_cast<std::int64_t>(b.extent(0));
      const auto k = static_cast<std::int64_t>(ta[0] == 'N' ? a.extent(1) : a.extent(0));
      if (impl::blas::fits_int(m) && impl::blas::fits_int(n) && impl::blas::fits_int(k) && impl::blas::fits_int(ra) &&
          impl::blas::fits_int(rb)) {
        space.fence();
        impl::blas::split::gemm<value_type>(&space, ta[0], tb[0], m, n, k, alpha, a.data(), std::max<std::int64_t>(1, ra),
                                            b.data(), std::max<std::int64_t>(1, rb), beta, c.data(),
                                            std::max<std::int64_t>(1, m));
        return;
      }
    }
    impl::kernels::gemm(space, ta, tb, alpha, a, b, beta, c);
  }
  // The Gram matrix X^T X (`transpose_first`) or X X^T into `gram`, of which only the lower
  // triangle (i >= j, column-major) is meaningful afterwards: SYRK, half a product's work, in the host BLAS;
  // a full GEMM where there is no SYRK (Kokkos Kernels on a device).
  static void gram_product(const ExecSpace& space, bool transpose_first, const blas_matrix_type& x,
                           const blas_matrix_type& gram) {
    if constexpr (host_products) {
      const auto d = static_cast<std::int64_t>(gram.extent(0));
      const auto rows = static_cast<std::int64_t>(x.extent(0));
      const auto k = static_cast<std::int64_t>(transpose_first ? x.extent(0) : x.extent(1));
      if (impl::blas::fits_int(d) && impl::blas::fits_int(k) && impl::blas::fits_int(rows)) {
        space.fence();
        impl::blas::split::syrk_lower<value_type>(&space, transpose_first ? 'T' : 'N', d, k, value_type(1), x.data(),
                                     std::max<std::int64_t>(1, rows), value_type(0), gram.data(),
                                     std::max<std::int64_t>(1, d));
        return;
      }
    }
    if (transpose_first) gemm(space, "T", "N", value_type(1), x, x, value_type(0), gram);
    else gemm(space, "N", "T", value_type(1), x, x, value_type(0), gram);
  }

  // (outer, d, inner) of dimension k of a block.
  static std::array<std::int64_t, 3> unfold(const std::vector<std::int64_t>& e, std::size_t k) {
    std::int64_t outer = 1, inner = 1;
    for (std::size_t j = 0; j < k; ++j) outer *= e[j];
    for (std::size_t j = k + 1; j < e.size(); ++j) inner *= e[j];
    return {outer, e[k], inner};
  }

  void update_factors(const ExecSpace& space, std::size_t i, bool amortize, const ShampooOptions& o) {
    auto& p = m_params[i];
    const double beta2 = o.betas[1];
    const double weight = beta2 == 1.0 ? 1.0 : 1.0 - beta2;
    if (run_blocks_concurrently(space, p, BlockTask::factors, amortize, beta2, weight)) return;
    for (std::size_t b = 0; b < p.blocks.size(); ++b) {
      auto& blk = p.blocks[b];
      for (std::size_t k = 0; k < blk.factors.size(); ++k) {
        auto& f = blk.factors[k];
        if (!f.preconditioned) continue;
        if (amortize && block_amortized(p.group, blk.ordinal)) copy_factor(space, f.factor_storage(), backup_storage(p, b, k));
        value_type* source = m_grad.data() + blk.begin;
        if constexpr (kl) {
          // KL-Shampoo: G~ = G x_(j != k) P_j with the current inverse roots (before this step's
          // amortized update), ping-pong in the work buffers (free until the direction phase).
          source = precondition_block(space, blk, m_grad.data() + blk.begin, m_work0.data() + blk.begin,
                                      m_work1.data() + blk.begin, k);
        }
        accumulate_factor(space, f, source, blk.extent, k, beta2, weight);
      }
    }
  }

  // L = beta2 L + w X_(k) X_(k)^T for the block data x.
  void accumulate_factor(const ExecSpace& space, factor_state_type& f, value_type* x_data,
                         const std::vector<std::int64_t>& extent, std::size_t k, double beta2, double weight) {
    const auto [outer, d, inner] = unfold(extent, k);
    if constexpr (host_products) {
      if (outer == 1 && inner == 1) {
        // A one-dimensional block: the rank-one update in place (block_factors' form).
        using Rows = impl::kernels::RankOneCombineRows<value_type, factor_type>;
        Kokkos::parallel_for(LATHER_LABEL("lather::Shampoo::factor_rank_one"),
                             Kokkos::RangePolicy<ExecSpace, Kokkos::IndexType<std::int64_t>>(space, 0, Rows::iterations(d)),
                             Rows{x_data, f.factor_storage(), factor_type(beta2), factor_type(weight), beta2 != 1.0});
        return;
      }
    }
    if constexpr (paired_possible) {
      if (f.paired) {
        // The SYRK into the paired factor in place (as block_factors): L = w X X^T + beta2 L.
        value_type* x = x_data;
        bool transpose_first = outer == 1;
        std::int64_t rows = outer == 1 ? inner : d, k_terms = outer == 1 ? inner : outer;
        if (outer != 1 && inner != 1) {
          Kokkos::parallel_for(LATHER_LABEL("lather::Shampoo::unfold"),
                               Kokkos::RangePolicy<ExecSpace, Kokkos::IndexType<std::int64_t>>(space, 0, outer * d),
                               impl::kernels::UnfoldMode<value_type>{x_data, m_unfold.data(), outer, d, inner, false});
          x = m_unfold.data();
          transpose_first = true;
          rows = k_terms = outer * inner;
        }
        space.fence();
        impl::blas::split::syrk_lower<value_type>(&space, transpose_first ? 'T' : 'N', d, k_terms, value_type(weight), x,
                                                  std::max<std::int64_t>(1, rows), value_type(beta2), f.factor.data(),
                                                  std::max<std::int64_t>(1, d));
        return;
      }
    }
    if (outer == 1 || inner == 1) {
      // A first or last dimension: the Gram matrix is one GEMM (vendor BLAS where Kokkos
      // Kernels has it), then combined with the reference's formula.
      auto gram = gram_scratch(d);
      const auto x = blas_matrix(x_data, outer == 1 ? inner : d, outer == 1 ? d : outer);
      gram_product(space, outer == 1, x, gram);
      combine_factor(space, f, gram, beta2, weight);
    } else {
      // A middle dimension: unfolded to the front (one pass over the block), then one SYRK
      // with all outer * inner columns, instead of `outer` products of `inner` columns each
      // (a 3x3 convolution's (out, in, 9) block gave 256 rank-9 updates).
      const std::int64_t m = outer * inner;
      Kokkos::parallel_for(LATHER_LABEL("lather::Shampoo::unfold"),
                           Kokkos::RangePolicy<ExecSpace, Kokkos::IndexType<std::int64_t>>(space, 0, outer * d),
                           impl::kernels::UnfoldMode<value_type>{x_data, m_unfold.data(), outer, d, inner, false});
      auto gram = gram_scratch(d);
      gram_product(space, true, blas_matrix(m_unfold.data(), m, d), gram);
      combine_factor(space, f, gram, beta2, weight);
    }
  }

  // L = beta2 L + w S with the Gram matrix S (lower triangle meaningful): by rows on the host
  // (contiguous, balanced), by elements on devices (coalesced).
  static void combine_factor(const ExecSpace& space, factor_state_type& f, const blas_matrix_type& gram, double beta2,
                             double weight) {
    const std::int64_t d = f.dim;
    if constexpr (host_products) {
      using Rows = impl::kernels::FactorCombineRows<value_type, factor_type>;
      Kokkos::parallel_for(LATHER_LABEL("lather::Shampoo::factor_combine"),
                           Kokkos::RangePolicy<ExecSpace, Kokkos::IndexType<std::int64_t>>(space, 0, Rows::iterations(d)),
                           Rows{gram.data(), f.factor_storage(), factor_type(beta2), factor_type(weight), beta2 != 1.0});
    } else {
      Kokkos::parallel_for(LATHER_LABEL("lather::Shampoo::factor_combine"),
                           Kokkos::MDRangePolicy<ExecSpace, Kokkos::Rank<2>, Kokkos::IndexType<std::int64_t>>(
                               space, {0, 0}, {d, d}),
                           impl::kernels::FactorCombine<value_type, factor_type, blas_matrix_type>{
                               gram, f.factor_storage(), factor_type(beta2), factor_type(weight), beta2 != 1.0});
    }
  }

  // ---- host block concurrency ("batched" blocks on a CPU) ---------------------------------
  // A parameter's blocks are independent. On a multi-threaded host space their products run side
  // by side, one block per thread with a single-threaded BLAS (impl::blas::SingleThreaded), instead
  // of one block after the other with the BLAS' own threads, which gain little on products of the
  // usual block sizes (256: 1.05x on 2 threads, docs/performance.md). Same operations and BLAS
  // calls per block as the sequential path; only the element loops around them run serially
  // inside the block's thread. Root-inverse, eigendecomposed and (since the thirty-sixth session,
  // the fused path included) eigenvalue-corrected Shampoo and SOAP, not KL; float/double. The
  // eigenvalue-corrected kinds' blocks run the corrected second moment's update and the
  // direction's rotations in the task too (rotations as single-threaded GEMMs); as per-phase
  // block tasks alone (thirty-fifth session) their steady steps on 2 threads were 1.06-1.2x
  // shorter than on 1 before and about 1.85x after (docs/shampoo-family.md).
  static constexpr bool block_concurrency_possible =
#ifdef LATHER_HAS_BLAS_THREAD_CONTROL
      host_products && !kl &&
      std::is_same_v<value_type, inverse_factor_type> &&
      (kind == PreconditionerKind::root_inverse || kind == PreconditionerKind::eigendecomposed ||
       kind == PreconditionerKind::eigenvalue_corrected);
#else
      false;
#endif
  // KL-Shampoo too: its factor updates precondition the gradient along the other dimensions
  // first (precondition_block_serial), its directions are the root kinds' (block_direction).
  static constexpr bool kl_tasks_possible =
#ifdef LATHER_HAS_BLAS_THREAD_CONTROL
      host_products && kl && std::is_same_v<value_type, inverse_factor_type> &&
      (kind == PreconditionerKind::root_inverse || kind == PreconditionerKind::eigendecomposed);
#else
      false;
#endif
  static constexpr bool block_tasks_possible = block_concurrency_possible || kl_tasks_possible;
  enum class BlockTask { factors, direction, corrected };

  // Per-thread work matrices: a Gram / unpacked-inverse matrix of the largest factor dimension and
  // an unfolded copy of the largest block with a middle dimension; for the fused host blocks
  // also, from the second thread on, two buffers of the largest block (construction only).
  void allocate_block_threads(std::int64_t max_unfold) {
    allocate_root_threads();
    if constexpr (block_tasks_possible) {
      const int threads = Kokkos::Experimental::UniqueToken<ExecSpace>(ExecSpace()).size();
      bool any = false, fits = true;
      std::int64_t max_d = 0, max_block = 0;
      for (const auto& p : m_params) {
        for (const auto& blk : p.blocks) {
          const std::int64_t n = numel_of(blk.extent);
          fits = fits && impl::blas::fits_int(n);
          max_block = std::max(max_block, n);
          for (const auto& f : blk.factors)
            if (f.preconditioned) max_d = std::max(max_d, f.dim);
          any = any || (p.blocks.size() >= 2 && impl::blas::fits_int(n));
        }
      }
      // Fused blocks: one process (no DDP exchange, no sharding), every block within the BLAS' ints.
      m_fused_eligible = block_concurrency_possible && fits && !exchanges() && !sharded() && m_dist_size == 1;
      if (threads < 2 || (!any && !m_fused_eligible) || max_d == 0) return;
      for (int t = 0; t < threads; ++t) {
        m_thread_gram.emplace_back("lather::Shampoo::thread_gram", max_d * max_d);
        m_thread_unfold.push_back(buffer("lather::Shampoo::thread_unfolded_block", max_unfold));
        if (!m_fused_eligible) continue;
        m_thread_grad.emplace_back(t == 0 ? vector_type() : buffer("lather::Shampoo::thread_block_grad", max_block));
        m_thread_x.emplace_back(t == 0 ? vector_type() : buffer("lather::Shampoo::thread_block_work", max_block));
        if constexpr (kind == PreconditionerKind::eigenvalue_corrected)  // the rotations' second buffer
          m_thread_y.emplace_back(t == 0 ? vector_type() : buffer("lather::Shampoo::thread_block_rotated", max_block));
      }
    } else {
      (void)max_unfold;
    }
  }

  // Per-thread matrices of the roots side by side (compute_roots_side_by_side), threads > 0:
  // the bias-corrected factor and, for root-inverse kinds, the full root before it is stored.
  void allocate_root_threads() {
    if constexpr (roots_side_by_side_possible) {
      const int threads = Kokkos::Experimental::UniqueToken<ExecSpace>(ExecSpace()).size();
      std::int64_t max_d = 0;
      for (const auto& p : m_params)
        for (const auto& blk : p.blocks)
          for (const auto& f : blk.factors)
            if (f.preconditioned) max_d = std::max(max_d, f.dim);
      // Every distribution mode: a rank's root jobs are its own blocks' factors (the sequential
      // loop's), and no job communicates; the DDP/HSDP agreement on failures follows both forms.
      if (threads < 2 || max_d == 0) return;
      for (int t = 0; t < threads; ++t) {
        m_thread_root.emplace_back(t == 0 ? 0 : static_cast<std::size_t>(max_d * max_d));
        if constexpr (kind == PreconditionerKind::root_inverse)
          m_thread_root_out.emplace_back(t == 0 ? 0 : static_cast<std::size_t>(max_d * max_d));
      }
    }
  }

  // Runs `task` for every block of p on the host threads when that applies; false otherwise (the
  // caller then runs its sequential path).
  bool run_blocks_concurrently(const ExecSpace& space, ParamState& p, BlockTask task, bool amortize, double beta2,
                               double weight) {
    if constexpr (block_tasks_possible) {
      if (!m_block_concurrency || p.blocks.size() < 2 || m_thread_gram.empty() || space.concurrency() < 2) return false;
      // Worth it when the BLAS' own threads gain little (products of dimension <= 512, measured) or
      // when there are enough blocks to keep every thread busy; a few large blocks of unequal
      // sizes (gpt2-block's (2304, 768) at 1024: 1024, 1024, 256 rows) do better on all threads each.
      std::int64_t largest = 0;
      for (const auto& blk : p.blocks) {
        if (!impl::blas::fits_int(numel_of(blk.extent))) return false;
        for (const auto e : blk.extent) largest = std::max(largest, e);
      }
      const auto threads = static_cast<std::size_t>(space.concurrency());
      if (largest > 512 && p.blocks.size() < 2 * threads) return false;
      impl::blas::SingleThreaded single;
      if (!single.active()) return false;  // the BLAS' own threads would oversubscribe the cores
      Kokkos::parallel_for(LATHER_LABEL("lather::Shampoo::blocks"),
                           Kokkos::RangePolicy<ExecSpace, Kokkos::Schedule<Kokkos::Dynamic>, Kokkos::IndexType<std::int64_t>>(
                               space, 0, static_cast<std::int64_t>(p.blocks.size())),
                           BlockRunner{this, &p, Kokkos::Experimental::UniqueToken<ExecSpace>(space), task, amortize,
                                       beta2, weight});
      space.fence();  // the guard restores the BLAS' threads when this returns
      m_info.block_tasks += static_cast<std::int64_t>(p.blocks.size());
      return true;
    } else {
      (void)space, (void)p, (void)task, (void)amortize, (void)beta2, (void)weight;
      return false;
    }
  }

  // Host functor (never a device one: block_concurrency_possible is false in GPU builds).
  struct BlockRunner {
    Shampoo* self;
    ParamState* p;
    Kokkos::Experimental::UniqueToken<ExecSpace> token;
    BlockTask task;
    bool amortize;
    double beta2, weight;
    void operator()(std::int64_t b) const {
      const int t = token.acquire();
      auto& blk = p->blocks[static_cast<std::size_t>(b)];
      value_type* gram = self->m_thread_gram[static_cast<std::size_t>(t)].data();
      value_type* unfolded = self->m_thread_unfold[static_cast<std::size_t>(t)].data();
      if (task == BlockTask::factors) {
        self->block_factors(*p, static_cast<std::size_t>(b), self->m_grad.data() + blk.begin, amortize, beta2, weight, gram,
                            unfolded);
      } else if constexpr (kind == PreconditionerKind::eigenvalue_corrected) {
        value_type* x = task == BlockTask::corrected ? self->m_work1.data() + blk.begin : self->m_work0.data() + blk.begin;
        value_type* y = task == BlockTask::corrected ? self->m_work0.data() + blk.begin : self->m_work1.data() + blk.begin;
        if (task == BlockTask::corrected) {
          std::copy_n(self->m_grad.data() + blk.begin, numel_of(blk.extent), x);
          self->block_corrected_update(*p, blk, x, y, beta2, weight);
        } else {
          self->block_corrected_direction(*p, blk, x, y);
        }
      } else {
        self->block_direction(blk, self->m_work0.data() + blk.begin, self->m_work1.data() + blk.begin, gram, unfolded);
      }
      token.release(t);
    }
  };

  // accumulate_factor for every factor of block b (its gradient at x), serially in the calling
  // thread.
  // `row_stride`: for a two-dimensional block, the distance between its rows at x (the
  // parameter's row length where x is the gradient itself; 0: contiguous).
  void block_factors(ParamState& p, std::size_t b, const value_type* x_in, bool amortize, double beta2, double weight,
                     value_type* gram_data, value_type* unfolded, impl::blas::split::Crew* split = nullptr,
                     std::int64_t row_stride = 0) {
    auto& blk = p.blocks[b];
    for (std::size_t k = 0; k < blk.factors.size(); ++k) {
      auto& f = blk.factors[k];
      if (!f.preconditioned) continue;
      if (amortize && block_amortized(p.group, blk.ordinal)) {
        const auto backup = backup_storage(p, b, k);
        if (f.paired) {
          const impl::kernels::CopyTriangle<factor_type> copy{f.factor_storage().as_const(), backup};
          for (std::int64_t i = 0; i < f.dim; ++i) copy.row(i);
        } else {
          const std::int64_t stored = impl::kernels::SymmetricStorage<factor_type>::size(f.dim, f.packed);
          const impl::kernels::CopyBlock<factor_type> copy{f.factor.data(), backup.data};
          for (std::int64_t e = 0; e < stored; ++e) copy(e);
        }
      }
      const auto [outer, d, inner] = unfold(blk.extent, k);
      const value_type* x = x_in;
      if constexpr (kl_tasks_possible) {
        // KL-Shampoo (block tasks only, contiguous x): G~ = G x_(j != k) P_j, ping-pong in the
        // block's own ranges of the work buffers (update_factors' form).
        x = precondition_block_serial(blk, x_in, m_work0.data() + blk.begin, m_work1.data() + blk.begin, k, gram_data);
      }
      // A two-dimensional block's rows are row_stride apart: the leading dimension of both
      // products (the second's taking the first branch only for a single row, contiguous). So
      // are a three-dimensional block's rows of its last two dimensions (fused_block's
      // split_rows): the first mode's leading dimension, the middle mode's slab stride, the last
      // mode's stride between runs of outer / extent[0] columns.
      const bool strided = blk.extent.size() == 2 && row_stride > 0;
      const bool rows3 = blk.extent.size() == 3 && row_stride > 0;
      if (outer == 1 && inner == 1 && !((strided || rows3) && k == 0)) {
        // A single contiguous vector (a one-dimensional block, a block of one row): L = beta2 L +
        // w x x^T in one pass over the factor, the same bits as SYRK (k = 1) and the combination
        // below, without the d x d Gram matrix. A block of one column read in place (strided)
        // keeps the SYRK, which rounds alike.
        const impl::kernels::RankOneCombineRows<value_type, factor_type> rank_one{
            x, f.factor_storage(), factor_type(beta2), factor_type(weight), beta2 != 1.0};
        triangle_rows(split, rank_one, d);
        continue;
      }
      // A paired factor is the SYRK's C itself: L = w G G^T + beta2 L in place (the BLAS scales
      // by beta2 first, then adds w times the sum: the combination's rounding), no Gram matrix.
      // Otherwise into the Gram scratch, then combined.
      const bool in_place = paired_possible && f.paired;
      value_type* const c = in_place ? reinterpret_cast<value_type*>(f.factor.data()) : gram_data;
      const auto alpha = in_place ? value_type(weight) : value_type(1);
      const auto beta = in_place ? value_type(beta2) : value_type(0);
      if (outer == 1) {
        impl::blas::split::syrk_lower<value_type>(
            split, 'T', d, inner, alpha, x, (strided || rows3) && k == 0 ? row_stride : std::max<std::int64_t>(1, inner),
            beta, c, std::max<std::int64_t>(1, d));
      } else if (inner == 1 && rows3) {
        // The last mode of rows row_stride apart: outer / extent[0] columns of d per row
        // (fused_block reads such a block in place only where lather's short-dimension SYRK
        // takes d).
        impl::blas::split::syrk_lower_runs<value_type>(d, outer, alpha, x, d, outer / blk.extent[0], row_stride, beta, c, d);
      } else if (inner == 1) {
        impl::blas::split::syrk_lower<value_type>(split, 'N', d, outer, alpha, x,
                                                  strided ? row_stride : std::max<std::int64_t>(1, d), beta, c,
                                                  std::max<std::int64_t>(1, d));
      } else if (!impl::blas::split::syrk_lower_unfolded<value_type>(split, d, outer, inner, alpha, x, beta, c, d,
                                                                     rows3 ? row_stride : 0)) {
        // A middle mode: lather's own SYRK reads the unfolding from x (its transposition's pass
        // does the unfolding's: a pass over the block fewer); otherwise unfolded here first.
        const std::int64_t m = outer * inner;
        const impl::kernels::UnfoldMode<value_type> to_front{x, unfolded, outer, d, inner, false, rows3 ? row_stride : 0};
        to_front.all();
        impl::blas::split::syrk_lower<value_type>(split, 'T', d, m, alpha, unfolded, m, beta, c, d);
      }
      if (in_place) continue;
      const impl::kernels::FactorCombineRows<value_type, factor_type> combine{
          gram_data, f.factor_storage(), factor_type(beta2), factor_type(weight), beta2 != 1.0};
      triangle_rows(split, combine, d);
    }
  }

  // apply_inverse_factors for one block at x (result back at x, y its scratch), serially in the
  // calling thread: `pm` holds each unpacked inverse factor in turn.
  void block_direction(const block_state_type& blk, value_type* const x, value_type* const y, value_type* pm,
                       value_type* unfolded, impl::blas::split::Crew* split = nullptr) const {
    value_type* from = x;
    for (std::size_t k = 0; k < blk.factors.size(); ++k) {
      const auto& f = blk.factors[k];
      if (!f.preconditioned) continue;
      const auto [outer, d, inner] = unfold(blk.extent, k);
      value_type* to = from == x ? y : x;
      if constexpr (std::is_same_v<value_type, inverse_factor_type> && impl::blas::is_blas_scalar<value_type>) {
        if (f.packed && !f.paired && outer == 1 && inner == 1 && impl::blas::fits_int(d)) {
          // A one-dimensional block: y = P x from the packed storage itself (SPMV; as
          // apply_inverse_factors), no unpacking.
          impl::blas::spmv<value_type>('L', d, value_type(1), f.inverse_factor.data(), from, value_type(0), to);
          from = to;
          continue;
        }
      }
      if (f.packed && impl::blas::fits_int(outer * inner)) {
        // Packed: SYMM from the paired triangle in place, else one triangle unpacked first (as
        // apply_inverse_factors).
        auto [operand, uplo] = stored_symm_operand(f);
        if (operand == nullptr) {
          const impl::kernels::UnpackLower<inverse_factor_type, value_type> lower{f.inverse_storage().as_const(), pm};
          triangle_rows(split, lower, d);
          operand = pm;
        }
        if (outer != 1 && inner != 1) {
          // A middle mode: lather's 'R' tiles unfold B's rows as they copy them into panels and
          // fold each panel of C back, in place; otherwise two passes around the product.
          if (!impl::blas::split::symm_right_mode<value_type>(split, uplo, outer, d, inner, value_type(1), operand,
                                                              std::max<std::int64_t>(1, d), from, from)) {
            const impl::kernels::UnfoldMode<value_type> to_front{from, unfolded, outer, d, inner, false};
            to_front.all();
            mode_product_symm(split, outer, d, inner, operand, unfolded, to, uplo);
            const impl::kernels::UnfoldMode<value_type> back{to, from, outer, d, inner, true};
            back.all();
          }
        } else {
          mode_product_symm(split, outer, d, inner, operand, from, to, uplo);
          from = to;
        }
        continue;
      }
      // Full storage is read where it is (apply_inverse_factors: the stored row-major P is P^T
      // column-major, hence the flipped transposes); packed storage is unpacked first.
      const InverseOperand pf = inverse_operand(f, pm, d);
      const char keep = pf.transposed ? 'T' : 'N', flip = pf.transposed ? 'N' : 'T';
      if (outer == 1) {
        impl::blas::split::gemm<value_type>(split, 'N', keep, inner, d, d, value_type(1), from, std::max<std::int64_t>(1, inner),
                                            pf.data, std::max<std::int64_t>(1, d), value_type(0), to, std::max<std::int64_t>(1, inner));
        from = to;
      } else if (inner == 1) {
        impl::blas::split::gemm<value_type>(split, flip, 'N', d, outer, d, value_type(1), pf.data, std::max<std::int64_t>(1, d),
                                            from, std::max<std::int64_t>(1, d), value_type(0), to, std::max<std::int64_t>(1, d));
        from = to;
      } else {
        const std::int64_t m = outer * inner;
        const impl::kernels::UnfoldMode<value_type> to_front{from, unfolded, outer, d, inner, false};
        to_front.all();
        impl::blas::split::gemm<value_type>(split, 'N', keep, m, d, d, value_type(1), unfolded, m, pf.data, d, value_type(0), to, m);
        const impl::kernels::UnfoldMode<value_type> back{to, from, outer, d, inner, true};
        back.all();
      }
    }
    if (from != x) {
      const std::int64_t n = numel_of(blk.extent);
      for (std::int64_t e = 0; e < n; ++e) x[e] = from[e];
    }
  }

  // ---- fused host blocks --------------------------------------------------------------------
  // On a host space (block_concurrency_possible) a step of a non-distributed Shampoo runs as one
  // task per block over all parameters, each task the block's whole step in one thread: gather,
  // factor update, filtering and grafting, norms, products, scale and update. The block stays in
  // cache from one pass to the next (a pass over a whole parameter goes to memory), no kernel
  // launch or fence is paid per pass, and small parameters fill the threads together instead of
  // one parameter at a time. The tasks are taken largest first (dynamic, one at a time), each
  // with a single-threaded BLAS. A parameter with a block larger than an equal share of all the
  // work per thread ("wide": mlp's (512, 784) at block size 1024) runs its blocks first, in the
  // calling thread, with each product split over the threads (impl/backends/blas_split.hpp;
  // OpenBLAS' own threads left asleep, so they do not spin against the tasks that follow), and so
  // do the blocks balance_fused picks. Same operations per element and the same summation order
  // for the norms as the per-parameter path; the same BLAS calls for wide blocks (split alike)
  // and for blocks whose products that path does not split: the same bits there (tested). A
  // task's product the per-parameter path splits differs in the last bits.
  struct FusedTask {
    std::uint32_t param = 0, block = 0;
  };
  struct FusedBuffers {
    value_type *grad = nullptr, *x = nullptr, *gram = nullptr, *unfolded = nullptr;
    value_type* y = nullptr;  // a third block buffer (eigenvalue-corrected kinds)
  };

  // Whether this step can take the fused path on `space`.
  bool fused_possible(const ExecSpace& space) const {
    if constexpr (block_concurrency_possible) {
      if (!m_block_concurrency || !m_fused_eligible) return false;
      const int threads = Kokkos::Experimental::UniqueToken<ExecSpace>(space).size();
      if (threads < 2) return true;
      // Threads beyond the first need their own buffers (construction) and a single-threaded BLAS.
      return static_cast<std::size_t>(threads) <= m_thread_grad.size() && impl::blas::SingleThreaded::available();
    } else {
      (void)space;
      return false;
    }
  }

  // The task order and the wide parameters for `threads` threads (recomputed only when the
  // thread count changes; the per-step list then reuses its capacity).
  void plan_fused(int threads) {
    m_fused_threads = threads;
    m_fused_wide.assign(m_params.size(), 0);
    std::vector<std::pair<double, FusedTask>> all;
    std::vector<double> largest(m_params.size(), 0.0), work(m_params.size(), 0.0);
    std::vector<char> candidate(m_params.size(), 0);
    for (std::size_t i = 0; i < m_params.size(); ++i) {
      for (std::size_t b = 0; b < m_params[i].blocks.size(); ++b) {
        const auto& blk = m_params[i].blocks[b];
        // Products (3 d_k flops per element and factor, SYRK counted as half a product) plus the
        // element passes.
        const auto n = static_cast<double>(numel_of(blk.extent));
        double c = 16.0 * n;
        // (Eigenvalue-corrected: three rotations, general products, instead of one preconditioning
        // product.)
        const double per_factor = kind == PreconditionerKind::eigenvalue_corrected ? 7.0 : 3.0;
        for (const auto& f : blk.factors)
          if (f.preconditioned) c += per_factor * static_cast<double>(f.dim) * n;
        work[i] += c;
        largest[i] = std::max(largest[i], c);
        for (const auto e : blk.extent) candidate[i] = candidate[i] || e > 256;
        all.push_back({c, FusedTask{static_cast<std::uint32_t>(i), static_cast<std::uint32_t>(b)}});
      }
    }
    // Wide: a block above an equal share per thread of the remaining parameters' work, with a
    // dimension above 256 (where the BLAS' threads gain; 1.05-1.1x at 256); repeated, since the
    // share shrinks as wide parameters leave (mlp at 1024: (512, 784), then (256, 512)).
    for (bool more = threads > 1; more;) {
      more = false;
      double rest = 0;
      for (std::size_t i = 0; i < m_params.size(); ++i)
        if (!m_fused_wide[i]) rest += work[i];
      for (std::size_t i = 0; i < m_params.size(); ++i) {
        if (m_fused_wide[i] || !candidate[i] || m_params[i].blocks.size() >= static_cast<std::size_t>(threads)) continue;
        if (largest[i] > rest / threads) m_fused_wide[i] = more = true;
      }
    }
    // A total order, so std::sort is deterministic (std::stable_sort's temporary buffer uses the
    // nothrow operator new, which the tests' counting allocator does not replace).
    std::sort(all.begin(), all.end(), [](const auto& a, const auto& b) {
      if (a.first != b.first) return a.first > b.first;
      return a.second.param != b.second.param ? a.second.param < b.second.param : a.second.block < b.second.block;
    });
    m_fused_wide_tasks.clear();
    for (std::size_t i = 0; i < m_params.size(); ++i)
      for (std::size_t b = 0; m_fused_wide[i] && b < m_params[i].blocks.size(); ++b)
        m_fused_wide_tasks.push_back(FusedTask{static_cast<std::uint32_t>(i), static_cast<std::uint32_t>(b)});
    std::vector<std::pair<double, FusedTask>> rest;
    for (const auto& entry : all)
      if (!m_fused_wide[entry.second.param]) rest.push_back(entry);
    std::vector<char> eligible(rest.size(), 0);
    for (std::size_t k = 0; k < rest.size(); ++k)
      for (const auto e : m_params[rest[k].second.param].blocks[rest[k].second.block].extent)
        eligible[k] = eligible[k] || e > 256;
    const std::vector<char> wide_block = balance_fused(rest, eligible, threads);
    m_fused_order.clear();
    for (std::size_t k = 0; k < rest.size(); ++k)
      (wide_block[k] ? m_fused_wide_tasks : m_fused_order).push_back(rest[k].second);
    m_fused_tasks.clear();
    m_fused_tasks.reserve(m_fused_order.size());
  }

  // Which of the tasks (largest first, as the threads take them) run wide instead, so that the
  // threads finish together. The threads take the tasks one at a time as they come free (list
  // scheduling), so a few large blocks near the end leave threads idle: gpt2-block at 1024 on 2
  // threads is eight blocks of (1024, 768), one of (768, 768) and one of (256, 768), and the
  // thread that takes the (768, 768) block works 6% past the other (the idle thread's share of
  // the step, measured with perf: 12%). A wide block takes every thread, before the tasks, at
  // an assumed wide_efficiency of the threads (its products split at row boundaries, most of its
  // element passes split too). Greedy: the block whose move shortens the modelled step most,
  // while the gain is over 1%, among blocks with an extent above 256 (below it a split product
  // gains 1.05-1.1x on 2 threads).
  static std::vector<char> balance_fused(const std::vector<std::pair<double, FusedTask>>& tasks,
                                         const std::vector<char>& eligible, int threads) {
    constexpr double wide_efficiency = 0.85, min_gain = 0.01;
    constexpr int max_moves = 16;
    std::vector<char> wide(tasks.size(), 0);
    if (threads < 2) return wide;
    std::vector<double> load(static_cast<std::size_t>(threads));
    // The modelled time of the tasks that are not wide, `skip` left out too: list scheduling.
    auto makespan = [&](std::size_t skip) {
      std::fill(load.begin(), load.end(), 0.0);
      for (std::size_t k = 0; k < tasks.size(); ++k)
        if (!wide[k] && k != skip) *std::min_element(load.begin(), load.end()) += tasks[k].first;
      return *std::max_element(load.begin(), load.end());
    };
    const double per_wide = 1.0 / (threads * wide_efficiency);
    double wide_time = 0, best = makespan(tasks.size());
    // Candidates: the largest eligible blocks, at least an eighth of a thread's share each (the
    // small ones fill the gaps anyway), at most max_candidates of them (the plan stays cheap
    // with many blocks and threads).
    constexpr std::size_t max_candidates = 32;
    double total = 0;
    for (const auto& t : tasks) total += t.first;
    std::vector<std::size_t> candidates;
    for (std::size_t k = 0; k < tasks.size() && candidates.size() < max_candidates; ++k)
      if (eligible[k] && tasks[k].first >= total / threads / 8) candidates.push_back(k);
    for (int move = 0; move < max_moves; ++move) {
      std::size_t pick = tasks.size();
      double pick_time = best * (1.0 - min_gain);
      for (const std::size_t k : candidates) {
        if (wide[k]) continue;
        const double t = wide_time + tasks[k].first * per_wide + makespan(k);
        if (t < pick_time) {
          pick_time = t;
          pick = k;
        }
      }
      if (pick == tasks.size()) break;
      wide[pick] = 1;
      wide_time += tasks[pick].first * per_wide;
      best = pick_time;
    }
    return wide;
  }

  // One phase of the step for every parameter with a gradient: factor updates (`factors`, with
  // the amortized backups when `amortize`), direction and update (`direction`), or both.
  void run_fused(const ExecSpace& space, const std::vector<TensorRef<const value_type, memory_space>>& g, bool factors,
                 bool direction, bool amortize) {
    if constexpr (block_concurrency_possible) {
      const int threads = Kokkos::Experimental::UniqueToken<ExecSpace>(space).size();
      if (threads != m_fused_threads) plan_fused(threads);
      if (m_phase_timing) {
        if (m_thread_seconds.size() < static_cast<std::size_t>(threads)) m_thread_seconds.resize(static_cast<std::size_t>(threads));
        for (auto& t : m_thread_seconds) t.s = {};
      }
      // The threads' block phases into the step's (at every return below).
      struct Collect {
        Shampoo* self;
        ~Collect() {
          if (!self->m_phase_timing) return;
          auto& to = self->m_info.seconds;
          for (const auto& t : self->m_thread_seconds) {
            to.gather += t.s.gather;
            to.factors += t.s.factors;
            to.filter += t.s.filter;
            to.direction += t.s.direction;
            to.norms += t.s.norms;
            to.update += t.s.update;
          }
        }
      } collect{this};
      for (std::size_t i = 0; i < m_params.size(); ++i)
        if (direction && computes(i, g)) m_info.grafted = m_info.grafted || uses_graft(m_params[i].group);
      std::int64_t wide = 0;
      for (const auto& task : m_fused_wide_tasks) wide += computes(task.param, g) ? 1 : 0;
      m_info.fused_blocks += wide;
      m_info.wide_blocks += wide;
      if (wide > 0) run_wide(space, g, factors, direction, amortize);
      m_fused_tasks.clear();
      for (const auto& task : m_fused_order)
        if (computes(task.param, g)) m_fused_tasks.push_back(task);
      if (m_fused_tasks.empty()) return;
      m_info.fused_blocks += static_cast<std::int64_t>(m_fused_tasks.size());
      space.fence();  // the wide parameters' split products used the shared buffers that thread 0 takes now
      std::optional<impl::blas::SingleThreaded> single;
      if (threads > 1) single.emplace();
      Kokkos::parallel_for(LATHER_LABEL("lather::Shampoo::fused_blocks"),
                           Kokkos::RangePolicy<ExecSpace, Kokkos::Schedule<Kokkos::Dynamic>, Kokkos::IndexType<std::int64_t>>(
                               space, 0, static_cast<std::int64_t>(m_fused_tasks.size()), Kokkos::ChunkSize(1)),
                           FusedRunner{this, &g, Kokkos::Experimental::UniqueToken<ExecSpace>(space), factors, direction,
                                       amortize});
      space.fence();  // before the guard gives the BLAS its threads back
    } else {
      (void)space, (void)g, (void)factors, (void)direction, (void)amortize;
    }
  }

  // The wide parameters' blocks, one after the other, in one team of all threads: the lead runs
  // each block's step, the others their parts of its products (impl::blas::split::Crew).
  void run_wide(const ExecSpace& space, const std::vector<TensorRef<const value_type, memory_space>>& g, bool factors,
                bool direction, bool amortize) {
    if constexpr (block_concurrency_possible) {
      using Policy = Kokkos::TeamPolicy<ExecSpace>;
      const Policy probe(space, 1, 1);
      const int size = std::min(Kokkos::Experimental::UniqueToken<ExecSpace>(space).size(),
                                probe.team_size_max(WideRunner{}, Kokkos::ParallelForTag()));
      impl::blas::split::Crew crew(size);
      impl::blas::SingleThreaded single;
      space.fence();
      Kokkos::parallel_for(LATHER_LABEL("lather::Shampoo::wide_blocks"), Policy(space, 1, size),
                           WideRunner{this, &g, &crew, factors, direction, amortize});
      space.fence();  // before the guard gives the BLAS its threads back
    } else {
      (void)space, (void)g, (void)factors, (void)direction, (void)amortize;
    }
  }
  struct WideRunner {
    Shampoo* self = nullptr;
    const std::vector<TensorRef<const value_type, memory_space>>* g = nullptr;
    impl::blas::split::Crew* crew = nullptr;
    bool factors = false, direction = false, amortize = false;
    void operator()(const typename Kokkos::TeamPolicy<ExecSpace>::member_type& member) const {
      if (member.team_rank() != 0) {
        crew->serve(member.team_rank());
        return;
      }
      for (const auto& task : self->m_fused_wide_tasks) {
        if (!self->computes(task.param, *g)) continue;
        auto& p = self->m_params[task.param];
        self->fused_block(p, task.block, (*g)[task.param], self->fused_buffers(0, p.blocks[task.block]), factors,
                          direction, amortize, crew, false, {}, self->thread_seconds(0));
      }
      crew->finish();
    }
  };

  // Host functor (never a device one: block_concurrency_possible is false in GPU builds).
  struct FusedRunner {
    Shampoo* self;
    const std::vector<TensorRef<const value_type, memory_space>>* g;
    Kokkos::Experimental::UniqueToken<ExecSpace> token;
    bool factors, direction, amortize;
    void operator()(std::int64_t n) const {
      const FusedTask task = self->m_fused_tasks[static_cast<std::size_t>(n)];
      const int t = token.acquire();
      auto& p = self->m_params[task.param];
      // On one thread, the gradient of the task it takes next, fetched on the side of this one's
      // SYRKs: its first pass (the transposition of the first SYRK 'T') then reads from cache,
      // not memory. Not with several threads: there one thread's memory-bound passes already
      // overlap another's products, the fetch gained 0.5% at most, and the demo's 2-thread
      // steps got 3% slower with it (fourteenth session, docs/performance-history.md).
      const bool alone = token.size() == 1;
      const auto ahead = static_cast<std::size_t>(n) + 1;
      impl::blas::tiled::SideFetch::Range next{};
      if (alone && factors && ahead < self->m_fused_tasks.size()) {
        const FusedTask after = self->m_fused_tasks[ahead];
        const auto& q = self->m_params[after.param];
        const auto& grad = (*g)[after.param];
        if (grad.is_row_major_contiguous()) next = block_rows(q, q.blocks[after.block], grad.data());
      }
      self->fused_block(p, task.block, (*g)[task.param], self->fused_buffers(t, p.blocks[task.block]), factors, direction,
                        amortize, nullptr, alone, next, self->thread_seconds(t));
      token.release(t);
    }
  };

  // Thread t's phase times, or null with phase timing off.
  impl::ShampooPhaseSeconds* thread_seconds(int t) {
    return m_phase_timing && static_cast<std::size_t>(t) < m_thread_seconds.size() ? &m_thread_seconds[static_cast<std::size_t>(t)].s
                                                                                    : nullptr;
  }

  // Thread 0 uses the shared buffers (the wide parameters are done before the tasks start), the
  // others their own.
  FusedBuffers fused_buffers(int t, const block_state_type& blk) const {
    if (t == 0 || m_thread_grad.empty()) {
      std::int64_t d = 0;
      for (const auto& f : blk.factors)
        if (f.preconditioned) d = std::max(d, f.dim);
      return {m_grad.data(), m_work0.data(), d > 0 ? gram_scratch(d).data() : nullptr, m_unfold.data(), m_work1.data()};
    }
    const auto u = static_cast<std::size_t>(t);
    return {m_thread_grad[u].data(), m_thread_x[u].data(), m_thread_gram[u].data(), m_thread_unfold[u].data(),
            u < m_thread_y.size() ? m_thread_y[u].data() : nullptr};
  }

  // f(flat, local, length) for every run of the block: `flat` the parameter's row-major index of
  // the run's first element, `local` its place in the block (row-major), `length` elements
  // contiguous in both. A run is a row of the last dimension, joined with the rows after it while
  // the dimensions after a first one `lead` are the parameter's whole extents: resnet50's blocks
  // of (256, 256, 9) out of (512, 512, 9) are 256 runs of 2304 elements, not 65536 of 9 (a call
  // and a loop too short to vectorize per row: the memmove of their gathering, 1% of a steady
  // step at block size 256, and the update pass).
  template <class F>
  static void for_block_rows(const ParamState& p, const block_state_type& blk, const F& f) {
    const int r = static_cast<int>(blk.extent.size());
    if (r == 0) {  // a scalar parameter
      f(std::int64_t(0), std::int64_t(0), std::int64_t(1));
      return;
    }
    const auto& offset = p.layout.blocks[blk.id].offset;
    const auto& dims = p.layout.merged_shape;
    int lead = r - 1;  // the dimensions before `lead` are iterated; those from it on form a run
    while (lead > 0 && blk.extent[static_cast<std::size_t>(lead)] == dims[static_cast<std::size_t>(lead)]) --lead;
    std::int64_t run = 1;
    for (int j = lead; j < r; ++j) run *= blk.extent[static_cast<std::size_t>(j)];
    const std::int64_t n = numel_of(blk.extent);
    if (run == 0 || n == 0) return;
    std::int64_t m[max_tensor_rank] = {};  // the run's position in the block's leading dimensions
    for (std::int64_t local = 0; local < n; local += run) {
      std::int64_t flat = 0;
      for (int j = 0; j < r; ++j) {
        const auto u = static_cast<std::size_t>(j);
        flat = flat * dims[u] + offset[u] + (j < lead ? m[j] : 0);
      }
      f(flat, local, run);
      for (int j = lead - 1; j >= 0; --j) {
        if (++m[j] < blk.extent[static_cast<std::size_t>(j)]) break;
        m[j] = 0;
      }
    }
  }
  // The parameter's row-major index of the block's first element.
  static std::int64_t first_flat(const ParamState& p, const block_state_type& blk) {
    const auto& offset = p.layout.blocks[blk.id].offset;
    const auto& dims = p.layout.merged_shape;
    std::int64_t flat = 0;
    for (std::size_t j = 0; j < blk.extent.size(); ++j) flat = flat * dims[j] + offset[j];
    return flat;
  }
  // How many parts rows_in_parts splits `rows` rows of `row_len` into.
  static int parts_of(const impl::blas::split::Crew* crew, std::int64_t rows, std::int64_t row_len) {
    return crew == nullptr || rows * row_len < 32768 ? 1 : static_cast<int>(std::min<std::int64_t>(crew->size(), rows));
  }
  // f(r0, r1) for row ranges covering [0, rows): on the wide path (a crew), one range per crew
  // member, side by side, for passes over at least 32768 elements (rows x row_len) whose
  // elements are independent (the same bits however split); else all rows in the calling thread.
  template <class F>
  static void rows_in_parts(impl::blas::split::Crew* crew, std::int64_t rows, std::int64_t row_len, const F& f) {
    const int parts = parts_of(crew, rows, row_len);
    if (parts <= 1) {
      f(std::int64_t(0), rows);
      return;
    }
    crew->run(parts, [&](int t) { f(rows * t / parts, rows * (t + 1) / parts); });
  }
  // The rows of a triangle, k.row(i) for i in [0, d) (FactorCombineRows, RankOneCombineRows,
  // UnpackLower): split over a crew in pairs of equal work (rows r and d - 1 - r, k(r)); in one
  // thread in order instead, one forward stream over the packed storage that the hardware
  // prefetcher follows (the pairs' second stream runs backwards in ever longer rows). Each
  // element's operations do not depend on the order: the same bits.
  template <class K>
  static void triangle_rows(impl::blas::split::Crew* crew, const K& k, std::int64_t d) {
    if (parts_of(crew, K::iterations(d), d) <= 1) {
      for (std::int64_t i = 0; i < d; ++i) k.row(i);
      return;
    }
    rows_in_parts(crew, K::iterations(d), d, [&](std::int64_t r0, std::int64_t r1) {
      for (std::int64_t r = r0; r < r1; ++r) k(r);
    });
  }
  // op.apply(flat, local) for every element of the block.
  template <class Op>
  static void for_block_elements(const ParamState& p, const block_state_type& blk, const Op& op) {
    for_block_rows(p, blk, [&](std::int64_t flat, std::int64_t local, std::int64_t len) {
      for (std::int64_t c = 0; c < len; ++c) op.apply(flat + c, local + c);
    });
  }

  // The fused path's element loops for contiguous host data in their most common forms, with the
  // kernels' operations in the same order (the same bits) and the options as template arguments,
  // so that the compiler vectorizes them: the functors' per-element option branches and
  // flat-index arithmetic kept these loops scalar (a tenth of a steady gpt2-block step at block
  // size 256 in perf). Other forms run the functors themselves.
  // `norm`: the grafting norm's 16 partial sums, carried through this row (host_filter_norm_wide;
  // the caller checked host_filter_norm_fusable), or null.
  template <bool State, bool Beta1, bool Beta3, bool Bias>
  static void filter_loop(const value_type* __restrict g, value_type* __restrict filtered,
                          value_type* __restrict state, value_type* __restrict out, std::int64_t n,
                          const impl::kernels::FilterAndGraft<value_type, memory_space>& k, double* norm) {
    const impl::kernels::FilterScalars<value_type> wide{k.graft.beta2,    k.graft.one_minus_beta2, k.beta1,
                                                        k.one_minus_beta1, k.beta3,               k.one_minus_beta3,
                                                        k.bias_correction1};
    const std::int64_t wide_done =
        norm != nullptr
            ? impl::kernels::host_filter_norm_wide<State, Beta1, Beta3, Bias>(g, filtered, state, out, n, wide, k.graft, norm)
            : impl::kernels::host_filter_wide<State, Beta1, Beta3, Bias>(g, filtered, state, out, n, wide);
    for (std::int64_t q = wide_done; q < n; ++q) {
      const value_type gq = g[q];
      if constexpr (State) state[q] = impl::kernels::second_moment(state[q], gq, k.graft.beta2, k.graft.one_minus_beta2);
      value_type gbar = gq;
      if constexpr (Beta1) {
        const value_type m_old = filtered[q];
        const value_type m = impl::kernels::ema(m_old, gq, k.beta1, k.one_minus_beta1);
        filtered[q] = m;
        gbar = Beta3 ? impl::kernels::ema(m_old, gq, k.beta3, k.one_minus_beta3) : m;
        if constexpr (Bias) gbar = gbar / k.bias_correction1;
      }
      out[q] = gbar;
    }
  }
  // The vectorized filter loop over rows(fn), which calls fn(g, offset, length) for each run of
  // `length` gradient values at g whose filtered, state and output entries start at `offset`;
  // false (nothing done) where the functor form must run (graft-only steps). `norm`: see
  // filter_loop (rows in order, in one thread).
  template <class Rows>
  static bool run_filter_rows(const impl::kernels::FilterAndGraft<value_type, memory_space>& k, const Rows& rows,
                              double* norm = nullptr) {
    constexpr bool state = Grafting::has_state;
    if (k.apply_graft || state != k.graft_has_state) return false;
    value_type *const f = k.filtered.data(), *const v = k.graft_state.data(), *const out = k.out.data();
    auto go = [&]<bool Beta1, bool Beta3, bool Bias>() {
      rows([&](const value_type* g, std::int64_t off, std::int64_t len) {
        filter_loop<state, Beta1, Beta3, Bias>(g, Beta1 ? f + off : nullptr, state ? v + off : nullptr, out + off, len, k,
                                               norm);
      });
    };
    if (!k.use_beta1) go.template operator()<false, false, false>();
    else if (k.separate_beta3) k.use_bias_correction ? go.template operator()<true, true, true>()
                                                     : go.template operator()<true, true, false>();
    else k.use_bias_correction ? go.template operator()<true, false, true>() : go.template operator()<true, false, false>();
    return true;
  }
  static void run_filter(const impl::kernels::FilterAndGraft<value_type, memory_space>& k, std::int64_t n) {
    if (run_filter_rows(k, [&](const auto& fn) { fn(k.grad.data(), std::int64_t(0), n); })) return;
    for (std::int64_t q = 0; q < n; ++q) k(q);
  }
  // `scale`: the grafting ratio, applied here instead of in a pass of its own
  // (impl::kernels::host_update_row: AVX-512 where the CPU has it, the same bits).
  template <bool Decay, bool Momentum, bool Nesterov>
  static void update_row(value_type* __restrict w, const value_type* __restrict dir, value_type* __restrict mom,
                         std::int64_t len, const impl::kernels::ApplyUpdate<value_type, memory_space>& k, value_type scale) {
    impl::kernels::host_update_row<Decay, Momentum, Nesterov>(
        w, dir, mom, len,
        impl::kernels::UpdateScalars<value_type>{k.decay, k.momentum, k.one_minus_dampening, value_type(-k.lr), scale});
  }
  // `split`: the wide path's crew, which takes a share of a two-dimensional block's rows.
  template <bool Decay, bool Momentum, bool Nesterov>
  static void run_update(const ParamState& p, const block_state_type& blk,
                         const impl::kernels::ApplyUpdate<value_type, memory_space>& k, value_type scale,
                         impl::blas::split::Crew* split) {
    value_type* const w = k.param.data();
    const value_type* const dir = k.direction.data();
    value_type* const mom = k.momentum_buffer.data();
    if (blk.extent.size() == 2) {
      const std::int64_t rows = blk.extent[0], len = blk.extent[1], stride = p.layout.merged_shape[1];
      value_type* const w0 = w + first_flat(p, blk);
      // The parameter's rows are short runs a stride apart (a block of 256 columns of a (768, 768)
      // weight: 1 KiB every 3 KiB), which the hardware prefetcher barely follows: each row missed
      // in full. Fetching the rows a few ahead while this one is updated made the pass 2.5x faster
      // (perf: 3.2% -> 1.3% of a steady gpt2-block step at block size 256, 1 thread, Zen 5).
      constexpr std::int64_t rows_ahead = 4;
      rows_in_parts(split, rows, len, [&](std::int64_t r0, std::int64_t r1) {
        for (std::int64_t r = r0; r < r1; ++r) {
          if (r + rows_ahead < r1) impl::kernels::prefetch_for_write(w0 + (r + rows_ahead) * stride, len);
          update_row<Decay, Momentum, Nesterov>(w0 + r * stride, dir + r * len, Momentum ? mom + r * len : nullptr, len,
                                                k, scale);
        }
      });
      return;
    }
    for_block_rows(p, blk, [&](std::int64_t flat, std::int64_t local, std::int64_t len) {
      update_row<Decay, Momentum, Nesterov>(w + flat, dir + local, Momentum ? mom + local : nullptr, len, k, scale);
    });
  }

  // The block's part of a row-major tensor of the parameter's shape (its parameter or gradient) at
  // `base`, as a side-fetch range: the rows of a two-dimensional block, one run for a block
  // contiguous in the parameter (one-dimensional, or all but its first extent the parameter's),
  // and for a block of more dimensions whose extents after the second are the parameter's its
  // rows along the first (the (256, 256, 9) blocks of a (512, 512, 9) convolution: runs of 256 x
  // 9 elements, 512 x 9 apart); empty for other blocks.
  static impl::blas::tiled::SideFetch::Range block_rows(const ParamState& p, const block_state_type& blk,
                                                        const value_type* base) {
    constexpr auto size = static_cast<std::int64_t>(sizeof(value_type));
    const auto* first = reinterpret_cast<const char*>(base + first_flat(p, blk));
    const int rank = static_cast<int>(blk.extent.size());
    const auto& shape = p.layout.merged_shape;
    if (rank == 2) return {first, blk.extent[1] * size, shape[1] * size, blk.extent[0]};
    bool contiguous = rank >= 1;
    for (int j = 1; contiguous && j < rank; ++j)
      contiguous = blk.extent[static_cast<std::size_t>(j)] == shape[static_cast<std::size_t>(j)];
    if (contiguous) return {first, numel_of(blk.extent) * size, 0, 1};
    if (rank < 3) return {};  // a scalar's block of no dimensions (an unbounded target keeps its shape)
    std::int64_t trailing = 1;  // the elements of one index of the second dimension
    for (int j = 2; j < rank; ++j) {
      if (blk.extent[static_cast<std::size_t>(j)] != shape[static_cast<std::size_t>(j)]) return {};
      trailing *= shape[static_cast<std::size_t>(j)];
    }
    return {first, blk.extent[1] * trailing * size, shape[1] * trailing * size, blk.extent[0]};
  }

  // The step of block b of p in the calling thread (see "fused host blocks"). `side_fetch`: the
  // block's SYRK tiles fetch what its update reads, then `next` (FusedRunner on one thread: the
  // gradient of the block it takes next), on the side.
  void fused_block(ParamState& p, std::size_t b, const TensorRef<const value_type, memory_space>& grad,
                   const FusedBuffers& buf, bool factors, bool direction, bool amortize,
                   impl::blas::split::Crew* split = nullptr, bool side_fetch = false,
                   const impl::blas::tiled::SideFetch::Range& next = {}, impl::ShampooPhaseSeconds* times = nullptr) {
    impl::PhaseClock clock(times);
    using Phases = impl::ShampooPhaseSeconds;
    auto& blk = p.blocks[b];
    const auto& o = m_groups[p.group].options;
    const std::int64_t n = numel_of(blk.extent);
    // Unmanaged views of the block's part of a state buffer (empty stays empty).
    auto part = [&](const vector_type& v) { return v.data() == nullptr ? vector_type() : vector_type(v.data() + blk.begin, n); };
    const vector_type gv(buf.grad, n), xv(buf.x, n);
    const bool l2 = o.weight_decay_type == WeightDecayType::l2 && o.weight_decay != 0.0;
    const StepScalars sc = step_scalars(p);
    // A block of at most two dimensions of a row-major gradient without L2 decay is read where it
    // is (BLAS with the parameter's row stride, the filter loop row by row): no copy into the
    // block buffer (a pass over the gradient: 2.5% of a steady gpt2-block step at block size 256).
    // So is a block of more dimensions that is contiguous in the parameter (all but its first
    // extent the parameter's: resnet50's 3x3 convolutions up to 256 channels), read as one run,
    // and a block of three whose last extent is the parameter's (a (256, 256, 9) block of a
    // (512, 512, 9) convolution), read as rows of its last two dimensions a row stride apart:
    // its first mode's SYRK with that stride, its middle mode's from slabs that far apart, its
    // last mode's in runs of rows (block_factors; a pass over 2.4 MB saved per such block).
    const int rank = static_cast<int>(blk.extent.size());
    const auto& shape = p.layout.merged_shape;
    bool contiguous = rank >= 3;
    for (int j = 1; contiguous && j < rank; ++j)
      contiguous = blk.extent[static_cast<std::size_t>(j)] == shape[static_cast<std::size_t>(j)];
    // (The last mode's runs need lather's short-dimension SYRK: d <= 16 floats, AVX-512.)
    const bool split_rows = rank == 3 && !contiguous && blk.extent[2] == shape[2] &&
                            (!blk.factors[2].preconditioned || impl::blas::small::takes<value_type>(blk.extent[2]));
    const bool in_place = grad.is_row_major_contiguous() && !l2 && rank >= 1 &&
                          (rank <= 2 || contiguous || split_rows) && (!direction || !sc.graft_now);
    const value_type* const block_grad = in_place ? grad.data() + first_flat(p, blk) : buf.grad;
    const std::int64_t row_stride = !in_place ? 0 : rank == 2 ? shape[1] : split_rows ? shape[1] * shape[2] : 0;
    if (!in_place) {
      const impl::kernels::GatherGradient<value_type, memory_space> gather{grad, p.param, gv,
                                                                          value_type(l2 ? o.weight_decay : 0.0)};
      if (grad.is_row_major_contiguous() && gather.l2_weight_decay == value_type(0)) {
        for_block_rows(p, blk, [&](std::int64_t flat, std::int64_t local, std::int64_t len) {
          std::copy_n(grad.data() + flat, len, buf.grad + local);
        });
      } else {
        for_block_elements(p, blk, gather);
      }
      clock.lap(&Phases::gather);
    }
    if (factors) {
      // `side_fetch` (a block run by the only thread): what the update pass reads from memory
      // (the parameter's rows, the momentum) is fetched while the SYRK tiles compute
      // (impl::blas::tiled::SideFetch), so that the pass finds it in cache: the update's share of
      // a steady gpt2-block step at block size 256 (1 thread) went from 2.9% to 1.5%. Not the
      // filter's state: that pass is bound by its divisions and square roots, not by memory
      // (fetching it early changed nothing).
      impl::blas::tiled::SideFetchScope side;
      if (side_fetch && direction && o.iterate_averaging == IterateAveraging::none && p.param.is_row_major_contiguous()) {
        const auto rows = block_rows(p, blk, p.param.data());
        side.add(rows.first, rows.row_bytes, rows.stride, rows.rows);
        if (p.momentum.data() != nullptr)
          side.add(p.momentum.data() + blk.begin, n * static_cast<std::int64_t>(sizeof(value_type)));
      }
      if (side_fetch) side.add(next.first, next.row_bytes, next.stride, next.rows);
      const double beta2 = o.betas[1];
      block_factors(p, b, block_grad, amortize, beta2, beta2 == 1.0 ? 1.0 : 1.0 - beta2, buf.gram, buf.unfolded, split,
                    row_stride);
      clock.lap(&Phases::factors);
    }
    if (!direction) return;
    const auto graft_state = part(p.graft_state);
    const auto filter = filter_kernel(p, sc, gv, part(p.filtered), graft_state, xv);
    // The block's gradient as `rows` rows of `row_len`, `grad_stride` apart from block_grad (a
    // gathered block is contiguous; one read in place is contiguous or has two dimensions). The
    // vectorized loop always runs in place (in_place excludes graft-only steps).
    const std::int64_t rows = rank >= 2 && blk.extent[0] > 0 ? blk.extent[0] : 1, row_len = n / rows;
    const std::int64_t grad_stride = row_stride > 0 ? row_stride : row_len;
    // The grafting norm rides along the filter where its rows allow host_block_sq_norm's order.
    double graft_partial[impl::kernels::host_norm_partials] = {};
    const bool norm_in_filter = Grafting::enabled && !sc.graft_now && parts_of(split, rows, row_len) <= 1 &&
                                impl::kernels::host_filter_norm_fusable<value_type>(row_len, n);
    const bool by_rows = run_filter_rows(
        filter,
        [&](const auto& fn) {
          rows_in_parts(split, rows, row_len, [&](std::int64_t r0, std::int64_t r1) {
            for (std::int64_t r = r0; r < r1; ++r) fn(block_grad + r * grad_stride, r * row_len, row_len);
          });
        },
        norm_in_filter ? graft_partial : nullptr);
    if (!by_rows) run_filter(filter, n);
    clock.lap(&Phases::filter);
    if constexpr (kind == PreconditionerKind::eigenvalue_corrected) {
      // The correction's update (update_corrected: every step, graft-only ones too) from the raw
      // gradient, copied (read in place, it must stay as it is) and rotated between the gradient
      // buffer, free after the filter, and the third one.
      if (block_grad != buf.grad)
        for (std::int64_t r = 0; r < rows; ++r) std::copy_n(block_grad + r * grad_stride, row_len, buf.grad + r * row_len);
      const double beta2 = o.betas[1];
      block_corrected_update(p, blk, buf.grad, buf.y, beta2, beta2 == 1.0 ? 1.0 : 1.0 - beta2, split);
      clock.lap(&Phases::direction);
    }
    value_type ratio = value_type(1);  // the grafting scale of the direction x
    if (!sc.graft_now) {
      double graft_sq = 0, direction_sq = 0;
      if constexpr (Grafting::enabled) {
        graft_sq = by_rows && norm_in_filter
                       ? impl::kernels::host_sq_norm_of(graft_partial)
                       : impl::kernels::host_block_sq_norm(buf.x, graft_state.data(), n, sc.graft, Grafting::has_state);
        clock.lap(&Phases::norms);
      }
      if constexpr (kind == PreconditionerKind::eigenvalue_corrected)
        block_corrected_direction(p, blk, buf.x, buf.grad, split);
      else
        block_direction(blk, buf.x, buf.grad, buf.gram, buf.unfolded, split);  // the gradient copy is free now
      clock.lap(&Phases::direction);
      if constexpr (Grafting::enabled) {
        direction_sq = impl::kernels::host_block_sq_norm<value_type>(buf.x, nullptr, n, sc.graft, false);
        p.norms(b, 0) = graft_sq;
        p.norms(b, 1) = direction_sq;
        ratio = impl::kernels::GraftScale<value_type, memory_space, ExecSpace>::ratio_of(graft_sq, direction_sq);
        clock.lap(&Phases::norms);
      }
    }
    // The update loops below scale x as they read it; the functor forms need x scaled first.
    auto scale_x = [&] {
      if constexpr (Grafting::enabled)
        if (!sc.graft_now)
          for (std::int64_t q = 0; q < n; ++q) buf.x[q] = buf.x[q] * ratio;
    };
    if (o.iterate_averaging != IterateAveraging::none) {
      scale_x();
      for_block_elements(p, blk, averaged_update_kernel(p, sc, xv, part(p.weight_buffer), nullptr));
      clock.lap(&Phases::update);
      return;
    }
    const auto update = update_kernel(p, sc, xv, part(p.momentum), nullptr);
    if (!p.param.is_row_major_contiguous()) {
      scale_x();
      for_block_elements(p, blk, update);
    } else if (update.use_momentum) {
      const bool decay = update.decay != value_type(0);
      if (update.nesterov)
        decay ? run_update<true, true, true>(p, blk, update, ratio, split)
              : run_update<false, true, true>(p, blk, update, ratio, split);
      else
        decay ? run_update<true, true, false>(p, blk, update, ratio, split)
              : run_update<false, true, false>(p, blk, update, ratio, split);
    } else {
      update.decay != value_type(0) ? run_update<true, false, false>(p, blk, update, ratio, split)
                                    : run_update<false, false, false>(p, blk, update, ratio, split);
    }
    clock.lap(&Phases::update);
  }

  // The block x multiplied along every preconditioned dimension but `skip` by its inverse factor;
  // returns where the result is (x itself, a or b; x is not written).
  value_type* precondition_block(const ExecSpace& space, const block_state_type& blk, value_type* x, value_type* a,
                                 value_type* b, std::size_t skip) {
    using Range = Kokkos::RangePolicy<ExecSpace, Kokkos::IndexType<std::int64_t>>;
    value_type* from = x;
    for (std::size_t j = 0; j < blk.factors.size(); ++j) {
      const auto& f = blk.factors[j];
      if (!f.preconditioned || j == skip) continue;
      value_type* to = from == a ? b : a;
      const auto [outer, d, inner] = unfold(blk.extent, j);
      if constexpr (host_products && std::is_same_v<value_type, inverse_factor_type>) {
        // GEMMs, as the eigenbasis rotations (rotate_mode_blas, whose Q(c, i) is ModeProduct's
        // P(c, i)): a full inverse root as stored, a packed one unpacked row-major into the d x d
        // Gram scratch first (free: this factor's Gram product comes after).
        const auto st = f.inverse_storage();
        const inverse_factor_type* q = st.data;
        if (st.packed) {
          const auto full = gram_scratch(d);
          Kokkos::parallel_for(LATHER_LABEL("lather::Shampoo::unpack_inverse"),
                               Kokkos::MDRangePolicy<ExecSpace, Kokkos::Rank<2>, Kokkos::IndexType<std::int64_t>>(
                                   space, {0, 0}, {d, d}),
                               impl::kernels::Unpack<inverse_factor_type, blas_matrix_type>{st.as_const(), full});
          q = full.data();
        }
        rotate_mode_blas(space, from, to, outer, d, inner, q, false);
      } else {
        Kokkos::parallel_for(LATHER_LABEL("lather::Shampoo::precondition"), Range(space, 0, outer * d * inner),
                             impl::kernels::ModeProduct<value_type, inverse_factor_type>{
                                 from, to, d, inner, f.inverse_storage().as_const()});
      }
      from = to;
    }
    return from;
  }

  // The block x rotated along every factor's eigenbasis (Q^T, or Q with `back`), ping-pong
  // between x and y; returns where the result is.
  value_type* rotate_block(const ExecSpace& space, const block_state_type& blk, value_type* x, value_type* y, bool back) {
    using Range = Kokkos::RangePolicy<ExecSpace, Kokkos::IndexType<std::int64_t>>;
    value_type* from = x;
    for (std::size_t j = 0; j < blk.factors.size(); ++j) {
      const auto& f = blk.factors[j];
      if (!f.preconditioned) continue;
      value_type* to = from == x ? y : x;
      const auto [outer, d, inner] = unfold(blk.extent, j);
      if constexpr (host_products && std::is_same_v<value_type, inverse_factor_type>) {
        rotate_mode_blas(space, from, to, outer, d, inner, f.eigenvectors.data(), back);
      } else {
        Kokkos::parallel_for(LATHER_LABEL("lather::Shampoo::rotate"), Range(space, 0, outer * d * inner),
                             impl::kernels::ModeProductGeneral<value_type, inverse_factor_type>{
                                 from, to, d, inner, f.eigenvectors.data(), back});
      }
      from = to;
    }
    return from;
  }
  // y = x (row-major (outer, d, inner)) rotated along its middle mode by Q^T, or Q with `back`
  // (Q row-major d x d, column j the j-th eigenvector), as the host BLAS's GEMMs: the portable
  // kernel (ModeProductGeneral, one dot product of length d per element) ran at a few GFLOP/s
  // and took 88% of an eigenvalue-corrected root step of gpt2-block at block size 256
  // (docs/performance-history.md, "Eigenbasis rotations through the BLAS"). The row-major Q is
  // the column-major Q^T (qc below); a slice x_a (d x inner, row-major) the column-major
  // inner x d matrix M_a = x_a^T, and y_a^T = M_a Q (M_a Q^T with `back`). For inner = 1 all
  // slices are one column-major d x outer matrix Z, and y = Q^T Z (Q Z).
  void rotate_mode_blas(const ExecSpace& space, value_type* x, value_type* y, std::int64_t outer, std::int64_t d,
                        std::int64_t inner, const inverse_factor_type* q, bool back) {
    const auto qc = blas_matrix(const_cast<value_type*>(q), d, d);
    if (inner == 1) {
      gemm(space, back ? "T" : "N", "N", value_type(1), qc, blas_matrix(x, d, outer), value_type(0),
           blas_matrix(y, d, outer));
      return;
    }
    for (std::int64_t a = 0; a < outer; ++a)
      gemm(space, "N", back ? "N" : "T", value_type(1), blas_matrix(x + a * d * inner, inner, d), qc, value_type(0),
           blas_matrix(y + a * d * inner, inner, d));
  }

  // to = from for a factor and its backup: a kernel, not Kokkos::deep_copy, whose parallel host
  // copy in Kokkos 3.4 builds a label string on every call (a heap allocation in each root step).
  // Backups are packed as the reference packs (d (d + 1) / 2 numbers) or full, whatever the
  // factor's storage; a paired factor's triangle is copied element by element (root steps only).
  static void copy_factor(const ExecSpace& space, const impl::kernels::SymmetricStorage<factor_type>& from,
                          const impl::kernels::SymmetricStorage<factor_type>& to) {
    if (from.tri == to.tri) {
      Kokkos::parallel_for(LATHER_LABEL("lather::Shampoo::copy_factor"),
                           Kokkos::RangePolicy<ExecSpace, Kokkos::IndexType<std::int64_t>>(
                               space, 0, impl::kernels::SymmetricStorage<factor_type>::size(from.d, from.packed)),
                           impl::kernels::CopyBlock<factor_type>{from.data, to.data});
    } else {
      Kokkos::parallel_for(LATHER_LABEL("lather::Shampoo::copy_factor"),
                           Kokkos::MDRangePolicy<ExecSpace, Kokkos::Rank<2>, Kokkos::IndexType<std::int64_t>>(
                               space, {std::int64_t{0}, std::int64_t{0}}, {from.d, from.d}),
                           impl::kernels::CopyTriangle2D<factor_type>{from.as_const(), to});
    }
  }
  static impl::kernels::SymmetricStorage<factor_type> backup_storage(const ParamState& p, std::size_t b, std::size_t k) {
    const auto& f = p.blocks[b].factors[k];
    return {p.backup[b][k].data(), f.dim, f.packed};
  }
  // A pending root result (root-inverse kind), stored as the factor is.
  static impl::kernels::SymmetricStorage<factor_type> result_storage(const ParamState& p, std::size_t b, std::size_t k) {
    const auto& f = p.blocks[b].factors[k];
    return {p.result[b][k].data(), f.dim, f.packed};
  }
  // A full root into its pending result on the host: one contiguous copy per row of the upper
  // triangle (packed rows are contiguous) rather than a 2-D kernel per factor.
  static void store_root_on_host(const Kokkos::View<factor_type**, Kokkos::LayoutRight, memory_space>& full,
                                 const impl::kernels::SymmetricStorage<factor_type>& out) {
    const std::int64_t d = out.d;
    for (std::int64_t r = 0; r < d; ++r) {
      const factor_type* row = full.data() + r * d;
      if (out.packed)
        std::copy(row + r, row + d, out.upper_row(r) + r);
      else
        std::copy(row, row + d, out.data + r * d);
    }
  }

  void restore_factors(const ExecSpace& space, const std::vector<TensorRef<const value_type, memory_space>>& g) {
    for (std::size_t i = 0; i < m_params.size(); ++i) {
      if (!active(i, g) || !local_blocks_amortized(i)) continue;
      auto& p = m_params[i];
      for (std::size_t b = 0; b < p.blocks.size(); ++b)
        if (block_amortized(p.group, p.blocks[b].ordinal))
          for (std::size_t k = 0; k < p.blocks[b].factors.size(); ++k)
          if (p.blocks[b].factors[k].preconditioned) copy_factor(space, backup_storage(p, b, k), p.blocks[b].factors[k].factor_storage());
    }
    space.fence();
  }

  void compute_roots(const ExecSpace& space, const std::vector<TensorRef<const value_type, memory_space>>& g,
                     std::vector<std::vector<std::vector<RootInverseStatus>>>& status) {
    if constexpr (roots_side_by_side_possible) {  // (its host functors are never compiled for a device)
      if (roots_side_by_side_now(space)) {
        compute_roots_side_by_side(space, g, status);
        return;
      }
    }
    for (std::size_t i = 0; i < m_params.size(); ++i) {
      if (!active(i, g) || !local_blocks_amortized(i)) continue;
      auto& p = m_params[i];
      const auto& grp = m_groups[p.group];
      const auto& o = grp.options;
      const bool bias = o.use_bias_correction && o.betas[1] < 1.0;
      const double bc2 = bias ? 1.0 - std::pow(o.betas[1], static_cast<double>(grp.step)) : 1.0;
      for (std::size_t b = 0; b < p.blocks.size(); ++b) {
        auto& blk = p.blocks[b];
        if (!begin_block_roots(i, b, status)) continue;
        int failures_here = 0;
        for (std::size_t k = 0; k < blk.factors.size(); ++k) {
          auto& f = blk.factors[k];
          if (!f.preconditioned) continue;
          const std::int64_t dk = f.dim;
          auto a = m_scratch.at(static_cast<std::size_t>(dk));
          Kokkos::parallel_for(LATHER_LABEL("lather::Shampoo::bias_correct"),
                               Kokkos::MDRangePolicy<ExecSpace, Kokkos::Rank<2>, Kokkos::IndexType<std::int64_t>>(
                                   space, {0, 0}, {dk, dk}),
                               impl::kernels::UnpackScaled<factor_type, memory_space>{
                                   f.factor_storage().as_const(), a, factor_type(bc2), bias});
          std::int64_t bad = 0;
          Kokkos::parallel_reduce(LATHER_LABEL("lather::Shampoo::check_factor"),
                                  Kokkos::MDRangePolicy<ExecSpace, Kokkos::Rank<2>, Kokkos::IndexType<std::int64_t>>(
                                      space, {0, 0}, {dk, dk}),
                                  impl::kernels::CountNonFiniteMatrix<factor_type, memory_space>{a}, bad);
          space.fence();
          if (bad != 0) throw_bad_factor(i, blk, k, bad);
          RootInverseStatus s = RootInverseStatus::failed;
          if constexpr (kind == PreconditionerKind::root_inverse) {
            const Kokkos::View<factor_type**, Kokkos::LayoutRight, memory_space> full(m_root_full.data(), dk, dk);
            s = inner().compute(space, Kokkos::View<const factor_type**, Kokkos::LayoutRight, memory_space>(a), f.root,
                                o.epsilon, full);
            if constexpr (Kokkos::SpaceAccessibility<Kokkos::HostSpace, memory_space>::accessible) {
              space.fence();
              store_root_on_host(full, result_storage(p, b, k));
            } else {
              Kokkos::parallel_for(LATHER_LABEL("lather::Shampoo::store_root"),
                                   Kokkos::MDRangePolicy<ExecSpace, Kokkos::Rank<2>, Kokkos::IndexType<std::int64_t>>(
                                       space, {0, 0}, {dk, dk}),
                                   impl::kernels::PackCopy<factor_type, factor_type, memory_space>{full, result_storage(p, b, k)});
            }
          } else if constexpr (kind == PreconditionerKind::eigendecomposed ||
                               kind == PreconditionerKind::eigenvalue_corrected) {
            s = inner().amortized.compute_in_double ? eigen_refresh<double>(space, a, f, o.epsilon, p, b, k)
                                                    : eigen_refresh<factor_type>(space, a, f, o.epsilon, p, b, k);
          }
          if (s == RootInverseStatus::non_finite) throw_non_finite_root(i, blk, k);
          status[i][b][k] = s;
          if (s == RootInverseStatus::failed) ++failures_here;
        }
        check_block_failures(i, blk, failures_here);
      }
    }
  }

  // status[i][b] for this step (the caller set status[i] up): one `success` per factor, true;
  // cleared, false, when the block does not compute on this step (staggered).
  bool begin_block_roots(std::size_t i, std::size_t b, std::vector<std::vector<std::vector<RootInverseStatus>>>& status) {
    auto& p = m_params[i];
    if (status[i].size() != p.blocks.size()) status[i].resize(p.blocks.size());
    m_status_set[i] = 1;
    const auto& blk = p.blocks[b];
    if (!block_amortized(p.group, blk.ordinal)) {
      status[i][b].clear();
      return false;
    }
    status[i][b].assign(blk.factors.size(), RootInverseStatus::success);
    return true;
  }
  // The root steps' errors (both forms raise the same).
  [[noreturn]] void throw_bad_factor(std::size_t i, const block_state_type& blk, std::size_t k, std::int64_t bad) const {
    impl::throw_error<runtime_error>(std::source_location::current(), "lather::Shampoo::step: the factor matrix ", k,
                                     " of block ", blk.id, " of ", describe_piece(i), " has ", bad,
                                     " NaN or Inf entries; nothing was changed. Try a lower learning rate, a larger "
                                     "'start_preconditioning_step', a larger 'epsilon', or grafting");
  }
  [[noreturn]] void throw_non_finite_root(std::size_t i, const block_state_type& blk, std::size_t k) const {
    impl::throw_error<runtime_error>(std::source_location::current(),
                                     "lather::Shampoo::step: the inverse root of factor matrix ", k, " of block ", blk.id,
                                     " of ", describe_piece(i),
                                     " has NaN or Inf entries; nothing was changed. Try a larger 'epsilon' or a lower "
                                     "learning rate");
  }
  void check_block_failures(std::size_t i, const block_state_type& blk, int failures_here) const {
    const auto& o = m_groups[m_params[i].group].options;
    if (failures_here > 0)
      LATHER_THROW_RUNTIME_IF(blk.consecutive_failures + 1 > o.num_tolerated_failed_amortized_computations,
                              "lather::Shampoo::step: the root computations of block ", blk.id, " of ", describe_piece(i),
                              " failed ", blk.consecutive_failures + 1,
                              " times in a row, more than 'num_tolerated_failed_amortized_computations' = ",
                              o.num_tolerated_failed_amortized_computations,
                              "; nothing was changed. Try a larger 'epsilon', computing roots in double, or a "
                              "lower learning rate");
  }

  // ---- root inverses side by side (host) ---------------------------------------------------
  // On a multi-threaded host space (on every rank, in every distribution mode) an amortized
  // step's root computations run one factor per task, largest first, each thread with its own
  // bias-corrected copy and a single-threaded LAPACK/BLAS, no Kokkos call and no communication
  // in the task: root-inverse Shampoo and KL-Shampoo
  // with EigenRootInverse (compute_on_host: per-thread work arrays) and the eigenbasis kinds,
  // eigendecomposed, eigenvalue-corrected and SOAP (eigen_refresh_host: impl::host_scratch).
  // One after the other, the root step got no shorter on 2 threads than on 1 (slower for
  // classic Shampoo): syevd, QR and the products of eigenpairs gain little from OpenBLAS'
  // threads at these sizes. Errors are reported afterwards in the sequential order, so a
  // failing step raises what the sequential loop raises (and, as there, commits nothing).
  static constexpr bool roots_side_by_side_possible =
#ifdef LATHER_HAS_BLAS_THREAD_CONTROL
      host_products && std::is_same_v<value_type, inverse_factor_type> &&
      ((kind == PreconditionerKind::root_inverse && std::is_same_v<inner_type, EigenRootInverse>) ||
       kind == PreconditionerKind::eigendecomposed || kind == PreconditionerKind::eigenvalue_corrected);
#else
      false;
#endif
  struct RootJob {
    std::uint32_t param = 0, block = 0, factor = 0;
    std::int64_t bad = 0;  // non-finite entries of the bias-corrected factor
    RootInverseStatus status = RootInverseStatus::success;
    std::exception_ptr error;
  };

  void compute_roots_side_by_side(const ExecSpace& space, const std::vector<TensorRef<const value_type, memory_space>>& g,
                                  std::vector<std::vector<std::vector<RootInverseStatus>>>& status) {
    m_root_jobs.clear();
    for (std::size_t i = 0; i < m_params.size(); ++i) {
      if (!active(i, g) || !local_blocks_amortized(i)) continue;
      auto& p = m_params[i];
      for (std::size_t b = 0; b < p.blocks.size(); ++b) {
        const auto& blk = p.blocks[b];
        if (!begin_block_roots(i, b, status)) continue;
        for (std::size_t k = 0; k < blk.factors.size(); ++k)
          if (blk.factors[k].preconditioned)
            m_root_jobs.push_back(RootJob{static_cast<std::uint32_t>(i), static_cast<std::uint32_t>(b),
                                          static_cast<std::uint32_t>(k), 0, RootInverseStatus::success, nullptr});
      }
    }
    if (m_root_jobs.empty()) return;
    // Largest first (d^3 work each); m_root_order indexes m_root_jobs, which keeps the sequential order.
    m_root_order.resize(m_root_jobs.size());
    for (std::size_t j = 0; j < m_root_order.size(); ++j) m_root_order[j] = static_cast<std::uint32_t>(j);
    // std::sort with a total order (std::stable_sort would allocate its buffer on every root step).
    std::sort(m_root_order.begin(), m_root_order.end(), [&](std::uint32_t x, std::uint32_t y) {
      const std::int64_t dx = root_job_dim(m_root_jobs[x]), dy = root_job_dim(m_root_jobs[y]);
      return dx != dy ? dx > dy : x < y;
    });
    space.fence();
    if (!m_roots_reserved) reserve_thread_roots(space);  // (done on the first step unless the threads changed)
    {
      impl::blas::SingleThreaded single;
      Kokkos::parallel_for(LATHER_LABEL("lather::Shampoo::roots"),
                           Kokkos::RangePolicy<ExecSpace, Kokkos::Schedule<Kokkos::Dynamic>, Kokkos::IndexType<std::int64_t>>(
                               space, 0, static_cast<std::int64_t>(m_root_order.size()), Kokkos::ChunkSize(1)),
                           RootRunner{this, Kokkos::Experimental::UniqueToken<ExecSpace>(space)});
      space.fence();
    }
    m_info.roots_side_by_side += static_cast<std::int64_t>(m_root_jobs.size());
    // The sequential loop's checks and errors, in its order.
    std::size_t j = 0;
    while (j < m_root_jobs.size()) {
      const std::size_t first = j;
      int failures_here = 0;
      for (; j < m_root_jobs.size() && m_root_jobs[j].param == m_root_jobs[first].param &&
             m_root_jobs[j].block == m_root_jobs[first].block;
           ++j) {
        const RootJob& job = m_root_jobs[j];
        const auto& blk = m_params[job.param].blocks[job.block];
        if (job.bad != 0) throw_bad_factor(job.param, blk, job.factor, job.bad);
        if (job.error) std::rethrow_exception(job.error);
        if (job.status == RootInverseStatus::non_finite) throw_non_finite_root(job.param, blk, job.factor);
        status[job.param][job.block][job.factor] = job.status;
        if (job.status == RootInverseStatus::failed) ++failures_here;
      }
      const RootJob& job = m_root_jobs[first];
      check_block_failures(job.param, m_params[job.param].blocks[job.block], failures_here);
    }
  }
  std::int64_t root_job_dim(const RootJob& job) const {
    return m_params[job.param].blocks[job.block].factors[job.factor].dim;
  }

  // One factor's root in the calling thread (the sequential loop's steps for it).
  void root_job(RootJob& job, int t) {
    auto& p = m_params[job.param];
    auto& f = p.blocks[job.block].factors[job.factor];
    const auto& grp = m_groups[p.group];
    const auto& o = grp.options;
    const bool bias = o.use_bias_correction && o.betas[1] < 1.0;
    const double bc2 = bias ? 1.0 - std::pow(o.betas[1], static_cast<double>(grp.step)) : 1.0;
    const std::int64_t d = f.dim;
    const Kokkos::View<factor_type**, Kokkos::LayoutRight, memory_space> a =
        t == 0 ? m_scratch.at(static_cast<std::size_t>(d))
               : Kokkos::View<factor_type**, Kokkos::LayoutRight, memory_space>(m_thread_root[static_cast<std::size_t>(t)].data(),
                                                                                 d, d);
    const impl::kernels::UnpackScaled<factor_type, memory_space> unpack{f.factor_storage().as_const(), a,
                                                                        factor_type(bc2), bias};
    const impl::kernels::CountNonFiniteMatrix<factor_type, memory_space> count{a};
    std::int64_t bad = 0;
    for (std::int64_t r = 0; r < d; ++r)
      for (std::int64_t c = 0; c < d; ++c) {
        unpack(r, c);
        count(r, c, bad);
      }
    job.bad = bad;
    if (bad != 0) return;
    try {
      if constexpr (kind == PreconditionerKind::root_inverse) {
        const Kokkos::View<factor_type**, Kokkos::LayoutRight, memory_space> full(
            t == 0 ? m_root_full.data() : m_thread_root_out[static_cast<std::size_t>(t)].data(), d, d);
        job.status = inner().compute_on_host(Kokkos::View<const factor_type**, Kokkos::LayoutRight, memory_space>(a),
                                             f.root, o.epsilon, full);
        store_root_on_host(full, result_storage(p, job.block, job.factor));
      } else {
        const auto b = static_cast<std::size_t>(job.block), k = static_cast<std::size_t>(job.factor);
        const auto& am = inner().amortized;
        auto &pq = p.pending_q[b][k], &pl = p.pending_lambda[b][k], &px = p.pending_x[b][k];
        const inverse_factor_type* q = f.eigenvectors.data();
        job.status = am.compute_in_double
                         ? eigen_refresh_host<double>(am, a.data(), q, d, f.packed, f.root, o.epsilon, pq, pl, px)
                         : eigen_refresh_host<factor_type>(am, a.data(), q, d, f.packed, f.root, o.epsilon, pq, pl, px);
      }
    } catch (...) {
      job.error = std::current_exception();
    }
  }

  // Whether this step's roots run side by side (compute_roots_side_by_side) or one after the
  // other in the calling thread.
  bool roots_side_by_side_now(const ExecSpace& space) const {
    if constexpr (roots_side_by_side_possible) {
      const int threads = Kokkos::Experimental::UniqueToken<ExecSpace>(space).size();
      return m_block_concurrency && threads > 1 && static_cast<std::size_t>(threads) <= m_thread_root.size() &&
             impl::blas::SingleThreaded::available();
    } else {
      (void)space;
      return false;
    }
  }
  // Every thread's work arrays for the roots side by side grown for the largest factor, one
  // iteration per thread: whichever thread takes whichever factor later allocates nothing.
  void reserve_thread_roots(const ExecSpace& space) {
    if constexpr (roots_side_by_side_possible) {
      impl::blas::SingleThreaded single;
      const int threads = Kokkos::Experimental::UniqueToken<ExecSpace>(space).size();
      Kokkos::parallel_for(LATHER_LABEL("lather::Shampoo::reserve_roots"),
                           Kokkos::RangePolicy<ExecSpace, Kokkos::Schedule<Kokkos::Static>, Kokkos::IndexType<std::int64_t>>(
                               space, 0, threads, Kokkos::ChunkSize(1)),
                           RootReserve{this});
      space.fence();
    } else {
      (void)space;
    }
    m_roots_reserved = true;
  }

  // The root steps' tables and the eigenbasis kinds' pending results at their full size, from
  // construction: the first root step (step precondition_frequency by default) allocates
  // nothing for them. Groups that never precondition get none.
  void size_root_step_tables() {
    std::size_t jobs = 0;
    m_status.resize(m_params.size());
    m_status_set.reserve(m_params.size());
    for (std::size_t i = 0; i < m_params.size(); ++i) {
      auto& p = m_params[i];
      m_status[i].resize(p.blocks.size());
      const bool never_preconditions = m_groups[p.group].options.start_preconditioning_step == never;
      for (std::size_t b = 0; b < p.blocks.size(); ++b) {
        const auto& blk = p.blocks[b];
        m_status[i][b].reserve(blk.factors.size());
        for (std::size_t k = 0; k < blk.factors.size(); ++k) {
          const auto& f = blk.factors[k];
          if (!f.preconditioned) continue;
          ++jobs;
          if constexpr (kind == PreconditionerKind::eigendecomposed || kind == PreconditionerKind::eigenvalue_corrected) {
            if (never_preconditions) continue;
            const auto d = static_cast<std::size_t>(f.dim);
            p.pending_q[b][k].resize(d * d);
            p.pending_lambda[b][k].reserve(d);
            if constexpr (kind == PreconditionerKind::eigendecomposed)
              p.pending_x[b][k].resize(
                  static_cast<std::size_t>(impl::kernels::SymmetricStorage<inverse_factor_type>::size(f.dim, f.packed)));
          }
        }
      }
    }
    m_root_jobs.reserve(jobs);
    m_root_order.reserve(jobs);
    m_failed_ranks.reserve(static_cast<std::size_t>(std::max(m_dist_size, 1)));
  }

  // The first step grows a root step's work arrays (the root strategy's and LAPACK's, the
  // per-thread host scratch, the coupled iterations' Kokkos work matrices, spectral descent's
  // SVD arrays) to their largest size on stand-in matrices (impl::kernels::StandInFactor), so that
  // no later step allocates, the first root step included. Costs one root computation per
  // distinct factor size in the calling thread (AutoRootInverse picks its strategy by size), or,
  // where the roots run side by side, one of the largest factor on every thread.
  void reserve_root_steps(const ExecSpace& space) {
    m_root_steps_reserved = true;
    struct Size {
      std::int64_t dim;
      double root, epsilon;  // of the first factor of this dim (the strategy checks epsilon against its options)
    };
    std::vector<Size> sizes;                                      // each distinct dim
    std::vector<std::pair<std::int64_t, std::int64_t>> matrices;  // spectral descent: distinct 2-D blocks
    for (const auto& p : m_params) {
      if (m_groups[p.group].options.start_preconditioning_step == never) continue;
      for (const auto& blk : p.blocks) {
        for (const auto& f : blk.factors)
          if (f.preconditioned && std::none_of(sizes.begin(), sizes.end(), [&](const Size& s) { return s.dim == f.dim; }))
            sizes.push_back({f.dim, f.root, m_groups[p.group].options.epsilon});
        if (blk.extent.size() == 2) {
          const std::pair<std::int64_t, std::int64_t> rc{blk.extent[0], blk.extent[1]};
          if (std::find(matrices.begin(), matrices.end(), rc) == matrices.end()) matrices.push_back(rc);
        }
      }
    }
    std::sort(sizes.begin(), sizes.end(), [](const Size& x, const Size& y) { return x.dim > y.dim; });
    if constexpr (kind == PreconditionerKind::root_inverse || kind == PreconditionerKind::eigendecomposed ||
                  kind == PreconditionerKind::eigenvalue_corrected) {
      (void)matrices;
      if (sizes.empty()) return;
      if (roots_side_by_side_now(space)) {
        reserve_thread_roots(space);
        return;
      }
      if constexpr (kind == PreconditionerKind::root_inverse) {
        for (const auto& [d, root, epsilon] : sizes) {
          const auto& a = m_scratch.at(static_cast<std::size_t>(d));
          Kokkos::parallel_for(LATHER_LABEL("lather::Shampoo::stand_in_factor"),
                               Kokkos::MDRangePolicy<ExecSpace, Kokkos::Rank<2>, Kokkos::IndexType<std::int64_t>>(
                                   space, {0, 0}, {d, d}),
                               impl::kernels::StandInFactor<factor_type, memory_space>{a});
          const Kokkos::View<factor_type**, Kokkos::LayoutRight, memory_space> full(m_root_full.data(), d, d);
          (void)inner().compute(space, Kokkos::View<const factor_type**, Kokkos::LayoutRight, memory_space>(a), root, epsilon,
                                full);
        }
        space.fence();
      } else {
        if (inner().amortized.compute_in_double) reserve_eigen_refresh<double>(sizes.front().dim);
        else reserve_eigen_refresh<factor_type>(sizes.front().dim);
      }
    } else if constexpr (kind == PreconditionerKind::spectral_descent &&
                         std::is_same_v<inner_type, SpectralDescent<SVDOrthogonalization>>) {
      // orthogonalize's arrays (calling thread: spectral descent's blocks run one after the other).
      (void)sizes, (void)space;
      auto& m = impl::host_scratch<value_type, impl::OrthogonalizeScratch, 0>();
      auto& sv = impl::host_scratch<value_type, impl::OrthogonalizeScratch, 1>();
      auto& u = impl::host_scratch<value_type, impl::OrthogonalizeScratch, 2>();
      auto& vt = impl::host_scratch<value_type, impl::OrthogonalizeScratch, 3>();
      auto& uv = impl::host_scratch<value_type, impl::OrthogonalizeScratch, 4>();
      for (const auto& [r, c] : matrices) {
        const auto n = static_cast<std::size_t>(r * c);
        m.resize(std::max(m.size(), n));
        uv.resize(std::max(uv.size(), n));
        std::vector<value_type> stand_in(n);
        for (std::size_t e = 0; e < n; ++e) stand_in[e] = static_cast<value_type>(1.0 / (1.0 + static_cast<double>(e % 17)));
        (void)impl::dense::svd<value_type>(static_cast<int>(c), static_cast<int>(r), stand_in, sv, u, vt);
      }
    } else {
      (void)sizes, (void)matrices, (void)space;
    }
  }

  struct RootReserve {
    const Shampoo* self;
    void operator()(std::int64_t) const {
      std::int64_t d = 0;
      for (const auto& p : self->m_params)
        for (const auto& blk : p.blocks)
          for (const auto& f : blk.factors)
            if (f.preconditioned) d = std::max(d, f.dim);
      if constexpr (kind == PreconditionerKind::root_inverse) {
        self->inner().template reserve_on_host<factor_type>(static_cast<std::size_t>(d));
      } else {
        // The refresh's per-thread scratch (impl::host_scratch, LAPACK's arrays) grows to its
        // largest use by running it once on a d x d matrix that no tolerance finds diagonal.
        if (self->inner().amortized.compute_in_double) self->template reserve_eigen_refresh<double>(d);
        else self->template reserve_eigen_refresh<factor_type>(d);
      }
    }
  };
  // Host functor (never a device one: roots_side_by_side_possible is false in GPU builds).
  struct RootRunner {
    Shampoo* self;
    Kokkos::Experimental::UniqueToken<ExecSpace> token;
    void operator()(std::int64_t n) const {
      const int t = token.acquire();
      self->root_job(self->m_root_jobs[self->m_root_order[static_cast<std::size_t>(n)]], t);
      token.release(t);
    }
  };

  // Eigenbasis kinds: the amortized eigendecomposition of the bias-corrected factor `a` on the
  // host in precision C, into the pending basis (and, for eigendecomposed Shampoo, the pending
  // eigenvalues and the inverse root rebuilt from them).
  template <class C>
  RootInverseStatus eigen_refresh(const ExecSpace& space, const Kokkos::View<factor_type**, Kokkos::LayoutRight, memory_space>& a,
                                  const factor_state_type& f, double epsilon, ParamState& p, std::size_t b, std::size_t k) {
    space.fence();
    const auto ah = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), a);
    const auto qh = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), f.eigenvectors);
    return eigen_refresh_host<C>(inner().amortized, ah.data(), qh.data(), f.dim, f.packed, f.root, epsilon, p.pending_q[b][k],
                                 p.pending_lambda[b][k], p.pending_x[b][k]);
  }

  // eigen_refresh on host data, no Kokkos call (the roots side by side run it in their threads):
  // `amortized` the policy's refresh (inner().amortized but in reserve_eigen_refresh), `a` the
  // bias-corrected factor (n x n, row-major), `q_stored` the current basis as stored
  // (row-major, column j the j-th eigenvector); results into pq, plambda and, for eigendecomposed
  // Shampoo, px (the inverse root as the inverse factor is stored).
  template <class C, class Amortized>
  RootInverseStatus eigen_refresh_host(const Amortized& amortized, const factor_type* a, const inverse_factor_type* q_stored,
                                       std::int64_t dim, bool packed, double root, double epsilon,
                                       std::vector<inverse_factor_type>& pq, std::vector<inverse_factor_type>& plambda,
                                       std::vector<inverse_factor_type>& px) const {
    const auto n = static_cast<std::size_t>(dim);
    bool ridge = true;
    if constexpr (kind == PreconditionerKind::eigendecomposed) ridge = inner().ridge();
    // Per-thread scratch (impl::host_scratch): a root step allocates nothing after the first.
    auto& ac = impl::host_scratch<C, impl::EigenRefreshScratch, 0>();
    auto& q = impl::host_scratch<C, impl::EigenRefreshScratch, 1>();
    auto& lambda = impl::host_scratch<C, impl::EigenRefreshScratch, 2>();
    ac.resize(n * n);
    q.resize(n * n);
    for (std::size_t j = 0; j < n; ++j)
      for (std::size_t i = 0; i < n; ++i) {
        ac[i + j * n] = static_cast<C>(a[i * n + j]) + (ridge && i == j ? static_cast<C>(epsilon) : C(0));
        q[i + j * n] = static_cast<C>(q_stored[i * n + j]);
      }
    const RootInverseStatus s = amortized.refresh(ac, n, q, lambda);
    if (!is_usable(s)) return RootInverseStatus::failed;
    pq.resize(n * n);
    for (std::size_t i = 0; i < n; ++i)
      for (std::size_t j = 0; j < n; ++j) pq[i * n + j] = static_cast<inverse_factor_type>(q[i + j * n]);
    plambda.assign(lambda.begin(), lambda.end());
    if constexpr (kind == PreconditionerKind::eigendecomposed) {
      if (!inverse_from_eigenpairs(pq, plambda, dim, packed, root, epsilon, px)) return RootInverseStatus::non_finite;
    } else {
      (void)packed, (void)root, (void)px;
    }
    return s;
  }

  // Runs eigen_refresh_host once in the calling thread on a d x d problem that takes every
  // branch a refresh may take but the float-to-double retry (the policy's tolerance lowered so
  // that no basis is kept; a dense SPD matrix with a non-diagonal warm start), so that its
  // scratch and LAPACK's have their largest size before the roots are spread over the threads.
  template <class C>
  void reserve_eigen_refresh(std::int64_t d) const {
    if (d <= 0) return;
    const auto n = static_cast<std::size_t>(d);
    std::vector<factor_type> a(n * n);
    std::vector<inverse_factor_type> q(n * n, inverse_factor_type(0)), pq, plambda, px;
    for (std::size_t i = 0; i < n; ++i)
      for (std::size_t j = 0; j < n; ++j)
        a[i * n + j] = static_cast<factor_type>(i == j ? 2.0 * static_cast<double>(n) : 1.0 / (1.0 + static_cast<double>(i + j)));
    // A rotation of the identity by a Householder reflection (I - 2 v v^T, v = e / sqrt(n)):
    // orthogonal and dense, so Q^T A Q is far from diagonal.
    for (std::size_t i = 0; i < n; ++i)
      for (std::size_t j = 0; j < n; ++j)
        q[i * n + j] = static_cast<inverse_factor_type>((i == j ? 1.0 : 0.0) - 2.0 / static_cast<double>(n));
    auto amortized = inner().amortized;
    if constexpr (requires { amortized.tolerance; })
      if (amortized.tolerance > 0) amortized.tolerance = std::numeric_limits<double>::min();
    (void)eigen_refresh_host<C>(amortized, a.data(), q.data(), d, false, 2.0, 1e-12, pq, plambda, px);
  }

  // Eigendecomposed Shampoo's inverse root from stored eigenpairs (Q row-major, column j the j-th
  // eigenvector): X = Q diag(f(lambda)) Q^T with the policy's eigenvalue rule, into x as the
  // inverse factor is stored (SymmetricStorage with tri 0: packed upper rows, or full row-major).
  // False when X is not finite.
  bool inverse_from_eigenpairs(const std::vector<inverse_factor_type>& q_rows, const std::vector<inverse_factor_type>& lambda,
                               std::int64_t dim, bool packed, double root, double epsilon,
                               std::vector<inverse_factor_type>& x) const {
    const auto n = static_cast<std::size_t>(dim);
    auto& s = impl::host_scratch<inverse_factor_type, impl::InverseFromEigenpairsScratch, 0>();
    auto& q = impl::host_scratch<inverse_factor_type, impl::InverseFromEigenpairsScratch, 1>();
    auto& scaled = impl::host_scratch<inverse_factor_type, impl::InverseFromEigenpairsScratch, 2>();
    auto& xc = impl::host_scratch<inverse_factor_type, impl::InverseFromEigenpairsScratch, 3>();
    q.resize(n * n);
    scaled.resize(n * n);
    xc.resize(n * n);
    bool perturb_before = true;
    std::optional<PseudoInverse> pseudo;
    if constexpr (kind == PreconditionerKind::eigendecomposed) {
      perturb_before = inner().perturb_before_computation;
      pseudo = inner().pseudo_inverse;
    }
    if (!impl::inverse_root_scales(lambda, root, epsilon, perturb_before, pseudo, s)) return false;
    for (std::size_t i = 0; i < n; ++i)
      for (std::size_t j = 0; j < n; ++j) q[i + j * n] = q_rows[i * n + j];
    impl::matrix_from_eigenpairs_into(q.data(), s.data(), n, scaled.data(), xc.data());
    x.resize(static_cast<std::size_t>(impl::kernels::SymmetricStorage<inverse_factor_type>::size(dim, packed)));
    const impl::kernels::SymmetricStorage<inverse_factor_type> st{x.data(), dim, packed};
    bool finite = true;
    // xc is symmetric (mirrored): the stored triangle holds every value it has.
    for (std::int64_t i = 0; i < dim; ++i)
      for (std::int64_t j = packed ? i : 0; j < dim; ++j) {
        const inverse_factor_type v = xc[static_cast<std::size_t>(i) + static_cast<std::size_t>(j) * n];
        st(i, j) = v;
        finite = finite && std::isfinite(v);
      }
    return finite;
  }

  // Host vector into a view of the same length (ordered on `space`, which is fenced: the vector
  // may die after the call).
  template <class S, class V>
  static void host_to_view(const ExecSpace& space, const std::vector<S>& v, const V& view) {
    if constexpr (Kokkos::SpaceAccessibility<Kokkos::HostSpace, typename V::memory_space>::accessible) {
      // A copy on the calling thread: Kokkos 3.4's deep_copy of host memory goes parallel past
      // a size, and that allocates (tests/unit/test_host_blas.cpp, policy allocations).
      LATHER_THROW_RUNTIME_IF(view.span() != v.size(), "lather::Shampoo: internal error: a host copy of ", v.size(),
                              " values into a view of ", view.span());
      space.fence();
      std::copy(v.begin(), v.end(), view.data());
    } else {
      Kokkos::View<const S*, Kokkos::HostSpace, Kokkos::MemoryTraits<Kokkos::Unmanaged>> h(v.data(), v.size());
      Kokkos::deep_copy(space, view, h);
      space.fence();
    }
  }
  // An inverse root as inverse_from_eigenpairs stores it (the inverse factor's own layout but for
  // pairing) into the factor's inverse-factor storage.
  static void host_to_symmetric(const ExecSpace& space, const std::vector<inverse_factor_type>& x, const factor_state_type& f) {
    const auto n = f.dim;
    if (f.paired) {
      // Host memory (paired_possible): written in place once the space is done with it; x is
      // packed as the paired factor is.
      space.fence();
      const auto st = f.inverse_storage();
      const impl::kernels::SymmetricStorage<const inverse_factor_type> in{x.data(), n, true};
      for (std::int64_t i = 0; i < n; ++i)
        for (std::int64_t j = i; j < n; ++j) st(i, j) = in(i, j);
      return;
    }
    host_to_view(space, x, f.inverse_factor);
  }

  // A parameter's per-step scalars for filtering, grafting and the update; one source for the
  // per-parameter kernels and the fused host path, so both compute the same bits.
  struct StepScalars {
    GraftScalars<value_type> graft;
    double beta1 = 0, beta3 = 0, bias_correction1 = 1, decay = 0;
    double mu_x = 0, mu_y = 0;  // iterate averaging
    bool graft_now = false;
  };
  StepScalars step_scalars(const ParamState& p) const {
    const auto& grp = m_groups[p.group];
    const auto& o = grp.options;
    const std::int64_t t = grp.step;
    StepScalars sc;
    sc.graft_now = uses_graft(p.group);
    sc.graft = m_grafting.template scalars<value_type>(t);
    sc.beta1 = o.betas[0];
    sc.beta3 = o.effective_beta3();
    sc.bias_correction1 = 1.0 - sc.beta3 * std::pow(sc.beta1, static_cast<double>(t - 1));
    if (o.weight_decay != 0.0) {
      switch (o.weight_decay_type) {
        case WeightDecayType::l2: break;
        case WeightDecayType::decoupled: sc.decay = o.weight_decay; break;
        case WeightDecayType::corrected: sc.decay = o.weight_decay * o.lr / *o.peak_lr; break;
        case WeightDecayType::independent: sc.decay = o.weight_decay / *o.peak_lr; break;
      }
    }
    if (o.iterate_averaging != IterateAveraging::none) {
      sc.mu_y = o.train_interp_coeff;
      sc.mu_x = o.eval_interp_coeff;
      if (o.iterate_averaging == IterateAveraging::schedule_free)
        sc.mu_x = grp.lr_sum > 0.0 ? 1.0 - std::pow(o.lr, o.eval_coeff_lr_power) / grp.lr_sum : 0.0;
    }
    return sc;
  }
  // Gbar (or graft(Gbar) before preconditioning) from the blocked gradient into `out`.
  impl::kernels::FilterAndGraft<value_type, memory_space> filter_kernel(const ParamState& p, const StepScalars& sc,
                                                                        const vector_type& grad, const vector_type& filtered,
                                                                        const vector_type& graft_state,
                                                                        const vector_type& out) const {
    const auto& o = m_groups[p.group].options;
    return {grad, filtered, graft_state, out, value_type(sc.beta1), value_type(1.0 - sc.beta1), value_type(sc.beta3),
            value_type(1.0 - sc.beta3), value_type(sc.bias_correction1), sc.beta1 != 0.0, sc.beta3 != sc.beta1,
            o.use_bias_correction, sc.graft, Grafting::has_state, sc.graft_now};
  }
  impl::kernels::ApplyUpdate<value_type, memory_space> update_kernel(const ParamState& p, const StepScalars& sc,
                                                                     const vector_type& direction,
                                                                     const vector_type& momentum, value_type* delta_out) const {
    const auto& o = m_groups[p.group].options;
    return {p.param, direction, momentum, value_type(sc.decay), value_type(o.momentum), value_type(1.0 - o.dampening),
            value_type(o.lr), o.momentum != 0.0, o.use_nesterov, delta_out};
  }
  impl::kernels::ApplyAveragedUpdate<value_type, memory_space> averaged_update_kernel(
      const ParamState& p, const StepScalars& sc, const vector_type& direction, const vector_type& weight_buffer,
      value_type* delta_out) const {
    const auto& o = m_groups[p.group].options;
    return {p.param, direction, weight_buffer, value_type(1.0 - o.lr * sc.decay), value_type(o.lr),
            value_type(1.0 - sc.mu_x), value_type(1.0 - sc.mu_x * sc.mu_y), sc.decay != 0.0, delta_out};
  }

  // Squared norms per block into p.norms(., column): host_block_sq_norm's order wherever the
  // fused host path can run (so both paths give the same bits), elsewhere one team per chunk of
  // a block (impl::kernels::BlockChunks: a block's elements over several GPU multiprocessors),
  // then the chunks' partial sums added per block in chunk order where a block has several.
  void block_norms(const ExecSpace& space, ParamState& p, const vector_type& x, const vector_type& graft_state,
                   int column, const GraftScalars<value_type>& gs, bool has_state) const {
    const auto nb = static_cast<std::int64_t>(p.blocks.size());
    if constexpr (block_concurrency_possible) {
      Kokkos::parallel_for(LATHER_LABEL("lather::Shampoo::block_norms"),
                           Kokkos::RangePolicy<ExecSpace, Kokkos::IndexType<std::int64_t>>(space, 0, nb),
                           impl::kernels::HostBlockNorms<value_type, memory_space>{
                               {x, graft_state, p.block_begin, p.norms, column, gs, has_state}});
    } else {
      const bool direct = p.chunks == nb;
      Kokkos::parallel_for(LATHER_LABEL("lather::Shampoo::block_norms"),
                           Kokkos::TeamPolicy<ExecSpace>(space, static_cast<int>(p.chunks), Kokkos::AUTO),
                           impl::kernels::ChunkNorms<value_type, memory_space, ExecSpace>{
                               {p.block_begin, p.chunk_begin}, x, graft_state, m_norm_partials, p.norms, column, gs,
                               has_state, direct});
      if (!direct)
        Kokkos::parallel_for(LATHER_LABEL("lather::Shampoo::block_norm_sums"),
                             Kokkos::RangePolicy<ExecSpace, Kokkos::IndexType<std::int64_t>>(space, 0, nb),
                             impl::kernels::ChunkNormSums<memory_space>{p.chunk_begin, m_norm_partials, p.norms, column});
    }
  }

  void direction_and_update(const ExecSpace& space, std::size_t i) {
    auto& p = m_params[i];
    const auto& grp = m_groups[p.group];
    const auto& o = grp.options;
    const std::int64_t t = grp.step;
    const std::int64_t numel = p.local_numel;
    using Range = Kokkos::RangePolicy<ExecSpace, Kokkos::IndexType<std::int64_t>>;
    const StepScalars sc = step_scalars(p);
    const bool graft_now = sc.graft_now;
    m_info.grafted = m_info.grafted || graft_now;
    const auto gs = sc.graft;
    if constexpr (kind == PreconditionerKind::eigenvalue_corrected) update_corrected(space, p, o);
    // Gbar (or graft(Gbar) before preconditioning) into work0.
    Kokkos::parallel_for(LATHER_LABEL("lather::Shampoo::filter_and_graft"), Range(space, 0, numel),
                         filter_kernel(p, sc, m_grad, p.filtered, p.graft_state, m_work0));
    const vector_type direction = m_work0;
    if (!graft_now) {
      if constexpr (Grafting::enabled) {
        // ||graft(Gbar)|| per block, before work0 is turned into the Shampoo direction.
        block_norms(space, p, m_work0, p.graft_state, 0, gs, Grafting::has_state);
      }
      const bool concurrent = run_blocks_concurrently(space, p, BlockTask::direction, false, 0.0, 0.0);
      for (const auto& blk : p.blocks) {
        if (concurrent) break;  // done above, block by block on the host threads
        value_type* x = m_work0.data() + blk.begin;
        value_type* y = m_work1.data() + blk.begin;
        value_type* result = x;
        if constexpr (kind == PreconditionerKind::root_inverse || kind == PreconditionerKind::eigendecomposed) {
          result = apply_inverse_factors(space, blk, x, y);
        } else if constexpr (kind == PreconditionerKind::eigenvalue_corrected) {
          // X = Gbar x_k Q_k^T; X / ((D / bc2)^e + eps); back with x_k Q_k.
          const bool bias = o.use_bias_correction && o.betas[1] < 1.0;
          const double bc2 = bias ? 1.0 - std::pow(o.betas[1], static_cast<double>(t)) : 1.0;
          value_type* r = rotate_block(space, blk, x, y, false);
          Kokkos::parallel_for(LATHER_LABEL("lather::Shampoo::correct"), Range(space, 0, numel_of(blk.extent)),
                               impl::kernels::CorrectedScale<value_type>{
                                   r, p.corrected.data() + blk.begin, value_type(bc2), value_type(o.epsilon),
                                   value_type(p.corrected_exponent), bias, p.corrected_exponent == 0.5});
          result = rotate_block(space, blk, r, r == x ? y : x, true);
        } else if constexpr (kind == PreconditionerKind::spectral_descent) {
          if (blk.extent.size() == 2) result = orthogonalize(space, blk, x, y);
        } else {
          sign_block(space, blk, x);
        }
        if (result != x) {  // bring the block's result back to work0
          Kokkos::parallel_for(LATHER_LABEL("lather::Shampoo::copy_block"), Range(space, 0, numel_of(blk.extent)),
                               impl::kernels::CopyBlock<value_type>{result, x});
        }
      }
      if constexpr (Grafting::enabled) {
        block_norms(space, p, direction, vector_type(), 1, gs, false);
        Kokkos::parallel_for(LATHER_LABEL("lather::Shampoo::graft_scale"),
                             Kokkos::TeamPolicy<ExecSpace>(space, static_cast<int>(p.chunks), Kokkos::AUTO),
                             impl::kernels::ChunkGraftScale<value_type, memory_space, ExecSpace>{
                                 {p.block_begin, p.chunk_begin}, direction, p.norms});
      }
    }
    // DDP: the update (decoupled decay folded in, notes 6.1.6) goes through the all-gather, or
    // with communicate_params the owner updates its blocks and the parameters travel.
    value_type* const delta_out = exchanges() && !m_dist.communicate_params ? m_work1.data() : nullptr;
    if (o.iterate_averaging != IterateAveraging::none) {
      for_each_blocked(LATHER_LABEL("lather::Shampoo::apply_averaged"), space, p,
                       averaged_update_kernel(p, sc, direction, p.weight_buffer, delta_out));
    } else {
      for_each_blocked(LATHER_LABEL("lather::Shampoo::apply"), space, p,
                       update_kernel(p, sc, direction, p.momentum, delta_out));
    }
    if (exchanges()) pack(space, i, delta_out);
  }

  // ---- batched passes ("one kernel per pass over all blocks", devices) ----------------------
  // A step as the per-parameter path computes it, pass by pass over every parameter at once:
  // the gather, the factor backups, the unfolds of middle dimensions, the factor combines, the
  // filtering, the grafting norms and scale, the one-dimensional blocks' products and the
  // update are one kernel each (tables of trivially copyable jobs, kernels/multi_tensor.hpp); the
  // Gram and preconditioning products of larger blocks are queued and run one batched BLAS call
  // per shape where the BLAS has one (cuBLAS), else one call per factor
  // (impl/backends/gemm_batches.hpp). The gradient and the direction of every parameter have their own ranges of
  // two whole-model buffers, so no pass waits for another parameter's. Gram matrices and
  // unpacked inverse factors share a bounded pool: when it is full, the queued combines (or
  // unpacks) run and it is reused.
  static constexpr bool batched_kind = !kl && std::is_same_v<value_type, inverse_factor_type> &&
                                       (kind == PreconditionerKind::root_inverse ||
                                        kind == PreconditionerKind::eigendecomposed);
  // Where a block's elements are in its parameter (see impl::kernels::BlockMapped).
  struct BlockPlace {
    std::int64_t origin = 0;
    int rank = 0;
    bool small = true;
    std::int64_t ext[max_tensor_rank] = {}, stride[max_tensor_rank] = {};
  };
  template <class Op>
  impl::kernels::BlockMapped<Op> block_mapped(const Op& op, const block_state_type& blk, std::size_t global_block) const {
    const BlockPlace& place = m_batch_places[global_block];
    impl::kernels::BlockMapped<Op> m{op, blk.begin, place.origin, place.rank, place.small, {}, {}};
    for (int j = 0; j < place.rank; ++j) {
      m.ext[j] = place.ext[j];
      m.stride[j] = place.stride[j];
    }
    return m;
  }
  // One preconditioning product of a round: block data at cur, result at other.
  struct BatchedProduct {
    value_type* cur;
    value_type* other;
    const value_type* pm;  // the inverse factor, full storage (in place or unpacked into the pool)
    std::int64_t outer, d, inner;
    bool in_place;
  };

  // Whether this step's screen can be gated (see step()): a steady step of the batched passes
  // on one process. Every state-changing job of such a step is a table entry that can carry a
  // gate (the factors' combine, the filter with the grafting state, the update with the
  // momentum); the products, unfolds, unpacks and norms write scratch only. The gather is gated
  // too, so nothing computes with a refused gradient (the scratch keeps finite values of earlier
  // steps: no NaN-producing operation, which a host trapping FE_INVALID would stop on). Root steps wait
  // first: their computations are not gated (and an eigendecomposition reads the factors on the
  // host anyway). `g` before the screen: a step is steady here if no parameter with a gradient
  // recomputes on the coming step (the counters are advanced for the question and put back).
  bool queues_screen(const std::vector<TensorRef<const value_type, memory_space>>& g) {
    if constexpr (!batched_kind) {
      return false;
    } else {
      if (!batched_now() || exchanges() || sharded() || g.size() != m_params.size()) return false;
      for (auto& grp : m_groups) grp.step += 1;
      bool amortized = false;
      for (std::size_t i = 0; i < m_params.size() && !amortized; ++i)
        amortized = computes(i, g) && local_blocks_amortized(i);
      for (auto& grp : m_groups) grp.step -= 1;
      return !amortized;
    }
  }
  // The device counter piece i's state-changing batched jobs read. Set on every batched step,
  // gated or not: the batched passes count with the kernels (step()), so a step that waited for
  // its screen finds zero there for every parameter it runs, and the tables stay the same bytes
  // from a root step to a steady one (a gate set only on gated steps re-uploaded them at each
  // change).
  const std::int64_t* gate_of(std::size_t i) const {
    return m_batched ? m_intake.gate(m_params[i].user, m_nonfinite_policy) : nullptr;
  }

  bool batched_now() const {
    if constexpr (!batched_kind) {
      return false;
    } else {
      if (!m_batched) return false;
      for (const auto& grp : m_groups)  // options may have changed since set_batched_passes
        if (grp.options.iterate_averaging != IterateAveraging::none) return false;
      return true;
    }
  }

  void allocate_batched(std::int64_t pool_elements) {
    std::int64_t total = 0, blocks = 0, factors = 0, pool = 0, max_d2 = 0, chunks = 0;
    std::size_t max_rank = 0;
    m_batch_offset.assign(m_params.size(), 0);
    m_batch_first_block.assign(m_params.size(), 0);
    for (std::size_t i = 0; i < m_params.size(); ++i) {
      const auto& p = m_params[i];
      m_batch_offset[i] = total;
      m_batch_first_block[i] = blocks;
      total += p.local_numel;
      blocks += static_cast<std::int64_t>(p.blocks.size());
      for (const auto& blk : p.blocks) {
        chunks += chunked_table<impl::kernels::NormChunkJob<value_type>>::chunks_of(numel_of(blk.extent));
        max_rank = std::max(max_rank, blk.factors.size());
        for (const auto& f : blk.factors) {
          if (!f.preconditioned) continue;
          ++factors;
          pool += f.dim * f.dim;
          max_d2 = std::max(max_d2, f.dim * f.dim);
        }
      }
    }
    m_batch_max_rank = max_rank;
    // Each block's place in its parameter (row-major over the merged shape).
    m_batch_places.clear();
    m_batch_places.reserve(static_cast<std::size_t>(blocks));
    for (const auto& p : m_params) {
      const auto& merged = p.layout.merged_shape;
      const int rank = static_cast<int>(merged.size());
      std::int64_t stride[max_tensor_rank] = {};
      std::int64_t step = 1;
      for (int j = rank - 1; j >= 0; --j) {
        stride[j] = step;
        step *= merged[static_cast<std::size_t>(j)];
      }
      for (const auto& blk : p.blocks) {
        const auto& spec = p.layout.blocks[blk.id];
        BlockPlace place;
        place.rank = rank;
        std::int64_t n = 1;
        for (int j = 0; j < rank; ++j) {
          place.origin += spec.offset[static_cast<std::size_t>(j)] * stride[j];
          place.ext[j] = spec.extent[static_cast<std::size_t>(j)];
          place.stride[j] = stride[j];
          n *= place.ext[j];
        }
        LATHER_THROW_RUNTIME_IF(n != numel_of(blk.extent), "lather::Shampoo: internal error: block ", blk.id,
                                " of parameter '", p.name, "' has ", numel_of(blk.extent), " elements but its place ", n);
        place.small = n <= std::int64_t{0xFFFFFFFF};
        m_batch_places.push_back(place);
      }
    }
    if (static_cast<std::int64_t>(m_batch_grad.extent(0)) < std::max<std::int64_t>(total, 1)) {
      m_batch_grad = vector_type("lather::Shampoo::batched_grad", std::max<std::int64_t>(total, 1));
      m_batch_work = vector_type("lather::Shampoo::batched_direction", std::max<std::int64_t>(total, 1));
    }
    pool = std::max<std::int64_t>(1, std::max(max_d2, std::min(pool, pool_elements)));
    if (static_cast<std::int64_t>(m_batch_pool.extent(0)) != pool)
      m_batch_pool = vector_type("lather::Shampoo::batched_pool", pool);
    if (static_cast<std::int64_t>(m_batch_norms.extent(0)) < 2 * std::max<std::int64_t>(blocks, 1))
      m_batch_norms = Kokkos::View<double*, memory_space>("lather::Shampoo::batched_norms", 2 * std::max<std::int64_t>(blocks, 1));
    if (static_cast<std::int64_t>(m_batch_partials.extent(0)) < std::max<std::int64_t>(chunks, 1))
      m_batch_partials = Kokkos::View<double*, memory_space>("lather::Shampoo::batched_norm_partials", std::max<std::int64_t>(chunks, 1));
    const auto np = m_params.size(), nb = static_cast<std::size_t>(blocks), nf = static_cast<std::size_t>(factors);
    m_batch_cur.reserve(nb);
    m_batch_scalars.reserve(np);
    m_batch_products.reserve(nf);
    // Room for each table's launches of a step apart (UploadedTable): unfolds, one round of the
    // factors and two (unfold and fold) of the directions per dimension; unpacks and products
    // once per dimension; the norms twice (the grafting's and the direction's). Full pools add
    // launches, which then take places again (uploaded again, still correct).
    const std::size_t rounds = std::max<std::size_t>(max_rank, 1);
    m_tab_gather.reserve(nb);
    m_tab_backup.reserve(nf);
    m_tab_unfold.reserve(nb, 3 * rounds);
    m_tab_combine.reserve(nf, 2);
    m_tab_filter.reserve(np);
    m_step_values.reserve(np);
    m_tab_unpack.reserve(nf, rounds);
    m_tab_copy.reserve(nb);
    m_tab_apply.reserve(nb);
    m_tab_norms.reserve(nb, 2);
    m_tab_norm_sums.reserve(nb, 2);
    m_tab_matvec.reserve(nb, rounds);
    m_tab_scale.reserve(nb);
    m_gemm_batches.reserve(std::max<std::int64_t>(2 * factors, 1));
  }

  using gemm_batches_type = impl::blas::GemmBatches<ExecSpace, value_type, memory_space>;
  // A product for m_gemm_batches, shaped as gemm() reads its views.
  static typename gemm_batches_type::Product batched_product(char ta, char tb, const blas_matrix_type& a,
                                                             const blas_matrix_type& b, const blas_matrix_type& c,
                                                             bool gram = false) {
    typename gemm_batches_type::Product p;
    p.ta = ta;
    p.tb = tb;
    p.m = static_cast<std::int64_t>(c.extent(0));
    p.n = static_cast<std::int64_t>(c.extent(1));
    p.k = static_cast<std::int64_t>(ta == 'N' ? a.extent(1) : a.extent(0));
    p.a = a.data();
    p.lda = std::max<std::int64_t>(1, static_cast<std::int64_t>(a.extent(0)));
    p.b = b.data();
    p.ldb = std::max<std::int64_t>(1, static_cast<std::int64_t>(b.extent(0)));
    p.c = c.data();
    p.ldc = std::max<std::int64_t>(1, p.m);
    p.gram = gram;
    return p;
  }
  // The Gram product gram_product() would make, queued.
  void queue_gram(bool transpose_first, const blas_matrix_type& x, const blas_matrix_type& gram) {
    m_gemm_batches.add(transpose_first ? batched_product('T', 'N', x, x, gram, true)
                                       : batched_product('N', 'T', x, x, gram, true));
  }
  // Runs the queued products: one by one through gemm() / gram_product() (the same calls as
  // before they were queued) where the BLAS has no batched form.
  void run_gemm_batches(const ExecSpace& space) {
    m_info.batched_gemm_calls += m_gemm_batches.run(space, [&](const typename gemm_batches_type::Product& p) {
      if (p.chunk) {
        gram_chunk(space, p);
        return;
      }
      if (p.tile) {
        gram_tile(space, p);
        return;
      }
      const auto a = blas_matrix(const_cast<value_type*>(p.a), p.lda, p.ta == 'N' ? p.k : p.m);
      const auto c = blas_matrix(p.c, p.ldc, p.n);
      if (p.gram) {
        gram_product(space, p.ta == 'T', a, c);
        return;
      }
      const char ta[2] = {p.ta, '\0'}, tb[2] = {p.tb, '\0'};
      gemm(space, ta, tb, value_type(1), a, blas_matrix(const_cast<value_type*>(p.b), p.ldb, p.tb == 'N' ? p.n : p.k),
           value_type(0), c);
    });
    m_info.split_gram_products += m_gemm_batches.split_products();
    m_info.tiled_gram_products += m_gemm_batches.tiled_products();
  }

  // A tile of a tiled Gram product (set_gram_tiles) where the BLAS has no batched form: a plain
  // product whose A, B and C leading dimensions exceed the rows it reads and writes.
  static void gram_tile(const ExecSpace& space, const typename gemm_batches_type::Product& p) {
    if constexpr (host_products) {
      // GemmBatches::tiles() checked that the sizes and leading dimensions fit the BLAS' int.
      space.fence();
      impl::blas::split::gemm<value_type>(&space, p.ta, p.tb, p.m, p.n, p.k, value_type(1), p.a, p.lda, p.b, p.ldb,
                                          value_type(0), p.c, p.ldc);
    } else {
      const auto rows = [](const value_type* x, std::int64_t ld, std::int64_t r, std::int64_t c) {
        return Kokkos::subview(blas_matrix(const_cast<value_type*>(x), ld, c), Kokkos::make_pair(std::int64_t(0), r),
                               Kokkos::ALL);
      };
      const bool ta = p.ta == 'T', tb = p.tb == 'T';
      const char sa[2] = {p.ta, '\0'}, sb[2] = {p.tb, '\0'};
      impl::kernels::gemm(space, sa, sb, value_type(1), rows(p.a, p.lda, ta ? p.k : p.m, ta ? p.m : p.k),
                          rows(p.b, p.ldb, tb ? p.n : p.k, tb ? p.k : p.n), value_type(0), rows(p.c, p.ldc, p.m, p.n));
    }
  }

  // A chunk of a split Gram product (set_gram_split) where the BLAS has no batched form (the
  // host, HIP): op(X) is a slice of a longer X, so X's leading dimension exceeds the rows the
  // chunk reads, which gram_product()'s views cannot say. The lower triangle, as there.
  static void gram_chunk(const ExecSpace& space, const typename gemm_batches_type::Product& p) {
    if constexpr (host_products) {
      // GemmBatches::splits() checked that m, the chunk's rows and lda fit the BLAS' int.
      space.fence();
      impl::blas::split::syrk_lower<value_type>(&space, p.ta, p.m, p.k, value_type(1), p.a, p.lda, value_type(0), p.c,
                                                p.ldc);
    } else {
      const bool t = p.ta == 'T';
      const auto x = Kokkos::subview(blas_matrix(const_cast<value_type*>(p.a), p.lda, t ? p.m : p.k),
                                     Kokkos::make_pair(std::int64_t(0), t ? p.k : p.m), Kokkos::ALL);
      const char ta[2] = {p.ta, '\0'}, tb[2] = {p.tb, '\0'};
      impl::kernels::gemm(space, ta, tb, value_type(1), x, x, value_type(0), blas_matrix(p.c, p.ldc, p.n));
    }
  }

  // f(table) for every job table of the batched passes.
  template <class F>
  void for_each_table(F&& f) {
    f(m_tab_gather), f(m_tab_backup), f(m_tab_unfold), f(m_tab_combine), f(m_tab_filter), f(m_tab_unpack);
    f(m_tab_copy), f(m_tab_apply), f(m_tab_norms), f(m_tab_norm_sums), f(m_tab_matvec), f(m_tab_scale);
    f(m_step_values);
  }
  // Host-to-memory-space copies of the batched passes so far: job tables, product pointer arrays
  // and the adding jobs of split products.
  std::int64_t batched_upload_count() {
    std::int64_t n = m_gemm_batches.uploads() + m_gemm_batches.reduction_uploads();
    for_each_table([&](const auto& t) { n += t.uploads(); });
    return n;
  }

  template <class Table>
  void batch_launch(Table& table, const std::string& label, const ExecSpace& space) {
    if (table.empty()) return;
    table.launch(label, space);
    ++m_info.batched_launches;
  }

  // Runs the queued Gram products, then combines the factors whose Gram matrices are in the
  // pool; the pool is free again after.
  void flush_combines(const ExecSpace& space) {
    run_gemm_batches(space);
    batch_launch(m_tab_combine, LATHER_LABEL("lather::Shampoo::batched_combine"), space);
    m_tab_combine.clear();
    m_batch_pool_used = 0;
  }

  // Gather, factor backups (amortized steps) and factor updates of every parameter with a gradient.
  void batched_factors(const ExecSpace& space, const std::vector<TensorRef<const value_type, memory_space>>& g,
                       bool amortize) {
    using impl::kernels::GatherGradient;
    m_gemm_batches.begin_step();
    for_each_table([](auto& t) { t.begin_step(); });
    m_tab_gather.clear();
    m_tab_backup.clear();
    for (std::size_t i = 0; i < m_params.size(); ++i) {
      if (!computes(i, g)) continue;
      auto& p = m_params[i];
      const auto& o = m_groups[p.group].options;
      const bool l2 = o.weight_decay_type == WeightDecayType::l2 && o.weight_decay != 0.0;
      const GatherGradient<value_type, memory_space> gather{g[i], p.param, m_batch_grad.data() + m_batch_offset[i],
                                                            value_type(l2 ? o.weight_decay : 0.0)};
      for (std::size_t b = 0; b < p.blocks.size(); ++b)
        m_tab_gather.add(block_mapped(gather, p.blocks[b], static_cast<std::size_t>(m_batch_first_block[i]) + b),
                         numel_of(p.blocks[b].extent), gate_of(i));
      if (!amortize) continue;
      for (std::size_t b = 0; b < p.blocks.size(); ++b) {
        if (!block_amortized(p.group, p.blocks[b].ordinal)) continue;
        for (std::size_t k = 0; k < p.blocks[b].factors.size(); ++k) {
          const auto& f = p.blocks[b].factors[k];
          if (f.preconditioned)
            m_tab_backup.add({f.factor_storage().as_const(), backup_storage(p, b, k)},
                             f.paired ? f.dim * f.dim : impl::kernels::SymmetricStorage<factor_type>::size(f.dim, f.packed));
        }
      }
    }
    batch_launch(m_tab_gather, LATHER_LABEL("lather::Shampoo::batched_gather"), space);
    batch_launch(m_tab_backup, LATHER_LABEL("lather::Shampoo::batched_backup"), space);
    m_tab_combine.clear();
    m_batch_pool_used = 0;
    // Round k: every block's dimension k. Middle dimensions are unfolded into the direction
    // buffer (free until the direction passes) first, all in one kernel.
    for (std::size_t k = 0; k < m_batch_max_rank; ++k) {
      m_tab_unfold.clear();
      for (std::size_t i = 0; i < m_params.size(); ++i) {
        if (!computes(i, g)) continue;
        const auto& p = m_params[i];
        for (const auto& blk : p.blocks) {
          if (k >= blk.factors.size() || !blk.factors[k].preconditioned) continue;
          const auto [outer, d, inner] = unfold(blk.extent, k);
          const std::int64_t at = m_batch_offset[i] + blk.begin;
          if (outer > 1 && inner > 1)
            m_tab_unfold.add({m_batch_grad.data() + at, m_batch_work.data() + at, outer, d, inner, false}, outer * d);
        }
      }
      batch_launch(m_tab_unfold, LATHER_LABEL("lather::Shampoo::batched_unfold"), space);
      for (std::size_t i = 0; i < m_params.size(); ++i) {
        if (!computes(i, g)) continue;
        auto& p = m_params[i];
        const auto& o = m_groups[p.group].options;
        const double beta2 = o.betas[1];
        const auto fb = factor_type(beta2), fw = factor_type(beta2 == 1.0 ? 1.0 : 1.0 - beta2);
        for (auto& blk : p.blocks) {
          if (k >= blk.factors.size() || !blk.factors[k].preconditioned) continue;
          auto& f = blk.factors[k];
          const auto [outer, d, inner] = unfold(blk.extent, k);
          value_type* const x = m_batch_grad.data() + m_batch_offset[i] + blk.begin;
          if (outer * inner == 1) {  // a one-dimensional block: x x^T formed in the combine
            m_tab_combine.add({nullptr, x, f.factor_storage(), fb, fw, beta2 != 1.0}, d * d, gate_of(i));
            continue;
          }
          if (m_batch_pool_used + d * d > static_cast<std::int64_t>(m_batch_pool.extent(0))) flush_combines(space);
          value_type* const gram = m_batch_pool.data() + m_batch_pool_used;
          m_batch_pool_used += d * d;
          if (outer > 1 && inner > 1)
            queue_gram(true, blas_matrix(m_batch_work.data() + m_batch_offset[i] + blk.begin, outer * inner, d),
                       blas_matrix(gram, d, d));
          else
            queue_gram(outer == 1, blas_matrix(x, outer == 1 ? inner : d, outer == 1 ? d : outer), blas_matrix(gram, d, d));
          m_tab_combine.add({gram, nullptr, f.factor_storage(), fb, fw, beta2 != 1.0}, d * d, gate_of(i));
        }
      }
      // This round's Gram products, before the next round's unfolds overwrite what they read
      // (the combines wait: their Gram matrices are in the pool).
      run_gemm_batches(space);
    }
    flush_combines(space);
  }

  // Runs the queued products of a round: the unfolds of their middle dimensions, the unpacks of
  // their packed inverse factors into the pool, the products, then the folds; the pool and the
  // tables are free again after.
  void run_products(const ExecSpace& space) {
    batch_launch(m_tab_unfold, LATHER_LABEL("lather::Shampoo::batched_unfold"), space);
    m_tab_unfold.clear();
    for (const auto& q : m_batch_products)
      if (q.outer > 1 && q.inner > 1) m_tab_unfold.add({q.cur, q.other, q.outer, q.d, q.inner, true}, q.outer * q.d);
    flush_products(space);
    batch_launch(m_tab_unfold, LATHER_LABEL("lather::Shampoo::batched_fold"), space);
    m_tab_unfold.clear();
  }
  void flush_products(const ExecSpace& space) {
    batch_launch(m_tab_unpack, LATHER_LABEL("lather::Shampoo::batched_unpack"), space);
    m_tab_unpack.clear();
    for (const auto& q : m_batch_products) {
      const auto pm = blas_matrix(const_cast<value_type*>(q.pm), q.d, q.d);
      const char keep = q.in_place ? 'T' : 'N';
      if (q.outer == 1) {
        m_gemm_batches.add(batched_product('N', keep, blas_matrix(q.cur, q.inner, q.d), pm, blas_matrix(q.other, q.inner, q.d)));
      } else if (q.inner == 1) {
        m_gemm_batches.add(batched_product(q.in_place ? 'N' : 'T', 'N', pm, blas_matrix(q.cur, q.d, q.outer),
                                           blas_matrix(q.other, q.d, q.outer)));
      } else {  // unfolded into `other` before: the product back into `cur`, folded into `other` after
        m_gemm_batches.add(batched_product('N', keep, blas_matrix(q.other, q.outer * q.inner, q.d), pm,
                                           blas_matrix(q.cur, q.outer * q.inner, q.d)));
      }
    }
    run_gemm_batches(space);
    m_batch_products.clear();
    m_batch_pool_used = 0;
  }

  // Filtering, grafting, the preconditioned direction and the update of every parameter with a
  // gradient, from the gathered gradients (batched_factors).
  void batched_direction(const ExecSpace& space, const std::vector<TensorRef<const value_type, memory_space>>& g) {
    const value_type* const grad = m_batch_grad.data();
    value_type* const work = m_batch_work.data();
    double* const norms = m_batch_norms.data();
    double* const partials = m_batch_partials.data();
    m_batch_scalars.clear();
    m_step_values.clear();
    for (std::size_t i = 0; i < m_params.size(); ++i) {
      const auto& p = m_params[i];
      const StepScalars& sc = m_batch_scalars.emplace_back(step_scalars(p));
      // The bits the per-parameter kernels compute from (filter_kernel, update_kernel).
      m_step_values.add({value_type(m_groups[p.group].options.lr), value_type(sc.decay),
                         value_type(sc.bias_correction1), sc.graft.bias_correction});
    }
    const impl::kernels::StepValues<value_type>* const values = m_step_values.upload(space);
    // The jobs' own copies of these scalars are set to constants: not read, and the same bytes
    // on every step.
    m_tab_filter.clear();
    m_tab_norms.clear();
    m_tab_norm_sums.clear();
    for (std::size_t i = 0; i < m_params.size(); ++i) {
      auto& p = m_params[i];
      if (!computes(i, g)) continue;
      const StepScalars& sc = m_batch_scalars[i];
      m_info.grafted = m_info.grafted || sc.graft_now;
      auto filter = filter_kernel(p, sc, m_grad, p.filtered, p.graft_state, m_work0);
      filter.grad = grad + m_batch_offset[i];
      filter.out = work + m_batch_offset[i];
      filter.bias_correction1 = value_type(1);
      filter.graft.bias_correction = value_type(1);
      m_tab_filter.add({filter, values + i}, p.local_numel, gate_of(i));
      if (!Grafting::enabled || sc.graft_now) continue;
      GraftScalars<value_type> graft = sc.graft;
      graft.bias_correction = value_type(1);
      for (std::size_t b = 0; b < p.blocks.size(); ++b) {
        const auto& blk = p.blocks[b];
        const std::int64_t gb = m_batch_first_block[i] + static_cast<std::int64_t>(b), n = numel_of(blk.extent);
        const std::int64_t first = m_tab_norms.add({work + m_batch_offset[i] + blk.begin,
                                                    Grafting::has_state ? p.graft_state.data() + blk.begin : nullptr,
                                                    partials, graft, Grafting::has_state, values + i},
                                                   n);
        m_tab_norm_sums.add({partials, first, m_tab_norms.chunks_of(n), norms + 2 * gb});
      }
    }
    batch_launch(m_tab_filter, LATHER_LABEL("lather::Shampoo::batched_filter"), space);
    batch_launch(m_tab_norms, LATHER_LABEL("lather::Shampoo::batched_graft_norms"), space);
    batch_launch(m_tab_norm_sums, LATHER_LABEL("lather::Shampoo::batched_graft_norm_sums"), space);
    // The products, round k over every block's dimension k, each block alternating between its
    // range of the direction buffer and of the gradient buffer (free after the filtering).
    m_batch_cur.clear();
    for (std::size_t i = 0; i < m_params.size(); ++i)
      for (const auto& blk : m_params[i].blocks) m_batch_cur.push_back(work + m_batch_offset[i] + blk.begin);
    auto other_of = [&](std::size_t i, const block_state_type& blk, const value_type* cur) {
      const std::int64_t at = m_batch_offset[i] + blk.begin;
      return cur == work + at ? m_batch_grad.data() + at : work + at;
    };
    for (std::size_t k = 0; k < m_batch_max_rank; ++k) {
      m_tab_unfold.clear();
      m_tab_matvec.clear();
      m_batch_products.clear();
      m_tab_unpack.clear();
      m_batch_pool_used = 0;
      for (std::size_t i = 0; i < m_params.size(); ++i) {
        if (!computes(i, g) || m_batch_scalars[i].graft_now) continue;
        const auto& p = m_params[i];
        for (std::size_t b = 0; b < p.blocks.size(); ++b) {
          const auto& blk = p.blocks[b];
          if (k >= blk.factors.size() || !blk.factors[k].preconditioned) continue;
          const auto& f = blk.factors[k];
          value_type*& cur = m_batch_cur[static_cast<std::size_t>(m_batch_first_block[i]) + b];
          value_type* const other = other_of(i, blk, cur);
          const auto [outer, d, inner] = unfold(blk.extent, k);
          if (outer * inner == 1) {
            m_tab_matvec.add({f.inverse_storage(), cur, other}, d * d);
            cur = other;
            continue;
          }
          if (outer > 1 && inner > 1) m_tab_unfold.add({cur, other, outer, d, inner, false}, outer * d);
          const value_type* pm = f.inverse_factor.data();
          if (f.packed) {
            // Unpacked into the pool; a full pool runs the products queued so far first (the
            // unfolds are queued above them: launched now, before any product reads them).
            if (m_batch_pool_used + d * d > static_cast<std::int64_t>(m_batch_pool.extent(0))) run_products(space);
            value_type* const full = m_batch_pool.data() + m_batch_pool_used;
            m_batch_pool_used += d * d;
            m_tab_unpack.add({f.inverse_storage(), full}, d * d);
            pm = full;
          }
          m_batch_products.push_back({cur, other, pm, outer, d, inner, !f.packed});
          cur = other;
        }
      }
      batch_launch(m_tab_matvec, LATHER_LABEL("lather::Shampoo::batched_matvec"), space);
      run_products(space);
    }
    // Directions that ended in the gradient buffer back into the direction buffer, then the
    // grafting: ||P|| per block and the scale.
    m_tab_copy.clear();
    m_tab_norms.clear();
    m_tab_norm_sums.clear();
    m_tab_scale.clear();
    for (std::size_t i = 0; i < m_params.size(); ++i) {
      if (!computes(i, g) || m_batch_scalars[i].graft_now) continue;
      const auto& p = m_params[i];
      for (std::size_t b = 0; b < p.blocks.size(); ++b) {
        const auto& blk = p.blocks[b];
        const std::int64_t gb = m_batch_first_block[i] + static_cast<std::int64_t>(b), n = numel_of(blk.extent);
        value_type* const x = work + m_batch_offset[i] + blk.begin;
        const value_type* const cur = m_batch_cur[static_cast<std::size_t>(gb)];
        if (cur != x) m_tab_copy.add({cur, x}, n);
        if constexpr (Grafting::enabled) {
          // ||P||: no grafting state, so no scalars read.
          const std::int64_t first = m_tab_norms.add({x, nullptr, partials, GraftScalars<value_type>{}, false, nullptr}, n);
          m_tab_norm_sums.add({partials, first, m_tab_norms.chunks_of(n), norms + 2 * gb + 1});
          m_tab_scale.add({x, norms + 2 * gb}, n);
        }
      }
    }
    batch_launch(m_tab_copy, LATHER_LABEL("lather::Shampoo::batched_copy"), space);
    batch_launch(m_tab_norms, LATHER_LABEL("lather::Shampoo::batched_direction_norms"), space);
    batch_launch(m_tab_norm_sums, LATHER_LABEL("lather::Shampoo::batched_direction_norm_sums"), space);
    batch_launch(m_tab_scale, LATHER_LABEL("lather::Shampoo::batched_graft_scale"), space);
    m_tab_apply.clear();
    for (std::size_t i = 0; i < m_params.size(); ++i) {
      if (!computes(i, g)) continue;
      const auto& p = m_params[i];
      auto update = update_kernel(p, m_batch_scalars[i], m_work0, p.momentum, nullptr);
      update.direction = work + m_batch_offset[i];
      update.decay = value_type(0);
      update.lr = value_type(0);
      const impl::kernels::StepUpdate<value_type, memory_space> stepped{update, values + i};
      for (std::size_t b = 0; b < p.blocks.size(); ++b)
        m_tab_apply.add(block_mapped(stepped, p.blocks[b], static_cast<std::size_t>(m_batch_first_block[i]) + b),
                        numel_of(p.blocks[b].extent), gate_of(i));
    }
    batch_launch(m_tab_apply, LATHER_LABEL("lather::Shampoo::batched_apply"), space);
  }

  // The inverse factor of f as a full d x d column-major matrix in the Gram scratch (symmetric,
  // so the layout does not matter), queued on `space`.
  // The inverse factor P as a GEMM operand: full storage in place (row-major P read column-major
  // is P^T: `transposed`), so no copy of d x d elements before each product (2% of a steady
  // gpt2-block step at block size 256); packed storage unpacked into `pm` (column-major P).
  // Both give the same bits: the BLAS packs either into the same panels.
  struct InverseOperand {
    const value_type* data;
    bool transposed;
  };
  static InverseOperand inverse_operand(const factor_state_type& f, value_type* pm, std::int64_t d) {
    if (!f.packed) return {f.inverse_factor.data(), true};
    const impl::kernels::Unpack<inverse_factor_type, blas_matrix_type> unpack{f.inverse_storage().as_const(),
                                                                              blas_matrix(pm, d, d)};
    for (std::int64_t i = 0; i < d; ++i)
      for (std::int64_t j = 0; j < d; ++j) unpack(i, j);
    return {pm, false};
  }
  blas_matrix_type unpacked_inverse(const ExecSpace& space, const factor_state_type& f, std::int64_t d) const {
    auto pm = gram_scratch(d);
    Kokkos::parallel_for(LATHER_LABEL("lather::Shampoo::unpack_inverse"),
                         Kokkos::MDRangePolicy<ExecSpace, Kokkos::Rank<2>, Kokkos::IndexType<std::int64_t>>(
                             space, {0, 0}, {d, d}),
                         impl::kernels::Unpack<inverse_factor_type, blas_matrix_type>{
                             f.inverse_storage().as_const(), pm});
    return pm;
  }

  // The mode-k product of a block with a symmetric inverse factor P whose lower triangle is in the
  // column-major d x d `pm`, in the host BLAS: first dimension Y = X P (column-major view of the
  // row-major block: inner x d), last Y = P X (d x outer), a middle one on the block unfolded to
  // the front (outer * inner x d). Same products as the GEMM forms, reading one triangle.
  // `uplo` 'U': pm holds the upper triangle instead (a paired inverse factor read in place).
  template <class Where>
  static void mode_product_symm(Where* split, std::int64_t outer, std::int64_t d, std::int64_t inner,
                                const value_type* pm, const value_type* x, value_type* y, char uplo = 'L') {
    if (inner == 1 && outer != 1) {
      impl::blas::split::symm<value_type>(split, 'L', uplo, d, outer, value_type(1), pm, std::max<std::int64_t>(1, d), x,
                                          std::max<std::int64_t>(1, d), value_type(0), y, std::max<std::int64_t>(1, d));
    } else {
      const std::int64_t m = outer * inner;
      impl::blas::split::symm<value_type>(split, 'R', uplo, m, d, value_type(1), pm, std::max<std::int64_t>(1, d), x,
                                          std::max<std::int64_t>(1, m), value_type(0), y, std::max<std::int64_t>(1, m));
    }
  }
  // A SYMM operand for f's inverse root where it is stored: the lower triangle of a paired
  // inverse root (row-major) is the upper triangle of a column-major d x d matrix with leading
  // dimension d. {nullptr, 'L'} otherwise: the caller unpacks one triangle ('L').
  struct SymmOperand {
    const value_type* data;
    char uplo;
  };
  static SymmOperand stored_symm_operand(const factor_state_type& f) {
    if constexpr (paired_possible)
      if (f.paired) return {f.inverse_storage().data, 'U'};
    return {nullptr, 'L'};
  }

  // Root-inverse kinds: successive mode products of the block x with the inverse factors,
  // ping-pong between x and y (one GEMM for a first or last dimension when the types allow);
  // returns where the result is.
  value_type* apply_inverse_factors(const ExecSpace& space, const block_state_type& blk, value_type* x, value_type* y) {
    using Range = Kokkos::RangePolicy<ExecSpace, Kokkos::IndexType<std::int64_t>>;
    value_type* from = x;
    for (std::size_t k = 0; k < blk.factors.size(); ++k) {
      const auto& f = blk.factors[k];
      if (!f.preconditioned) continue;
      const auto [outer, d, inner] = unfold(blk.extent, k);
      value_type* to = from == x ? y : x;
      if constexpr (std::is_same_v<value_type, inverse_factor_type>) {
        if constexpr (host_products) {
          if (f.packed && !f.paired && outer == 1 && inner == 1 && impl::blas::fits_int(d)) {
            // A one-dimensional block: y = P x from the packed storage (SPMV reads the packed
            // matrix once; a SYMM with one row needed it unpacked and then copied it whole), on
            // a single-threaded BLAS as on the block threads (OpenBLAS' threaded SPMV sums
            // per-thread partial vectors: other bits).
            space.fence();
            impl::blas::SingleThreaded single;
            impl::blas::spmv<value_type>('L', d, value_type(1), f.inverse_factor.data(), from, value_type(0), to);
            from = to;
            continue;
          }
          if (f.packed && impl::blas::fits_int(outer * inner) && impl::blas::fits_int(d)) {
            // Packed (symmetric by construction): SYMM from the paired triangle in place, else one
            // triangle unpacked first.
            using Lower = impl::kernels::UnpackLower<inverse_factor_type, value_type>;
            auto [pm, uplo] = stored_symm_operand(f);
            if (pm == nullptr) {
              value_type* const full = gram_scratch(d).data();
              Kokkos::parallel_for(LATHER_LABEL("lather::Shampoo::unpack_inverse"), Range(space, 0, Lower::iterations(d)),
                                   Lower{f.inverse_storage().as_const(), full});
              pm = full;
            }
            if (outer != 1 && inner != 1)
              Kokkos::parallel_for(LATHER_LABEL("lather::Shampoo::unfold"), Range(space, 0, outer * d),
                                   impl::kernels::UnfoldMode<value_type>{from, m_unfold.data(), outer, d, inner, false});
            space.fence();
            mode_product_symm(&space, outer, d, inner, pm, outer != 1 && inner != 1 ? m_unfold.data() : from, to, uplo);
            if (outer != 1 && inner != 1) {
              Kokkos::parallel_for(LATHER_LABEL("lather::Shampoo::fold"), Range(space, 0, outer * d),
                                   impl::kernels::UnfoldMode<value_type>{to, from, outer, d, inner, true});
              continue;
            }
            from = to;
            continue;
          }
        }
        // The inverse factor P in place where stored in full (the row-major P read column-major is
        // P^T, hence the flipped transposes; see inverse_operand), else unpacked.
        const bool in_place = !f.packed;
        const auto pm = in_place ? blas_matrix(f.inverse_factor.data(), d, d) : unpacked_inverse(space, f, d);
        const char* const keep = in_place ? "T" : "N";
        if (outer == 1 || inner == 1) {
          // One GEMM with the inverse factor P: Y = P^T X (first dimension) or X P (last), in
          // column-major terms on the row-major block.
          if (outer == 1) gemm(space, "N", keep, value_type(1), blas_matrix(from, inner, d), pm, value_type(0),
                               blas_matrix(to, inner, d));
          else gemm(space, in_place ? "N" : "T", "N", value_type(1), pm, blas_matrix(from, d, outer), value_type(0),
                    blas_matrix(to, d, outer));
          from = to;
          continue;
        }
        // A middle dimension: unfolded to the front as T (d rows of outer * inner), one GEMM
        // P^T T (column-major: T^T P) into `to`, folded back into `from`.
        const std::int64_t m = outer * inner;
        Kokkos::parallel_for(LATHER_LABEL("lather::Shampoo::unfold"), Range(space, 0, outer * d),
                             impl::kernels::UnfoldMode<value_type>{from, m_unfold.data(), outer, d, inner, false});
        gemm(space, "N", keep, value_type(1), blas_matrix(m_unfold.data(), m, d), pm, value_type(0), blas_matrix(to, m, d));
        Kokkos::parallel_for(LATHER_LABEL("lather::Shampoo::fold"), Range(space, 0, outer * d),
                             impl::kernels::UnfoldMode<value_type>{to, from, outer, d, inner, true});
        continue;
      }
      Kokkos::parallel_for(LATHER_LABEL("lather::Shampoo::precondition"), Range(space, 0, outer * d * inner),
                           impl::kernels::ModeProduct<value_type, inverse_factor_type>{
                               from, to, d, inner, f.inverse_storage().as_const()});
      from = to;
    }
    return from;
  }

  // Eigenvalue correction: D = beta2 D + w R^2 with R the raw (blocked) gradient rotated into
  // the current eigenbasis (after this step's refresh), every step.
  void update_corrected(const ExecSpace& space, ParamState& p, const ShampooOptions& o) {
    using Range = Kokkos::RangePolicy<ExecSpace, Kokkos::IndexType<std::int64_t>>;
    const double beta2 = o.betas[1];
    const double weight = beta2 == 1.0 ? 1.0 : 1.0 - beta2;
    if (run_blocks_concurrently(space, p, BlockTask::corrected, false, beta2, weight)) return;
    Kokkos::parallel_for(LATHER_LABEL("lather::Shampoo::copy_grad"), Range(space, 0, p.local_numel),
                         impl::kernels::CopyBlock<value_type>{m_grad.data(), m_work1.data()});
    for (const auto& blk : p.blocks) {
      value_type* r = rotate_block(space, blk, m_work1.data() + blk.begin, m_work0.data() + blk.begin, false);
      Kokkos::parallel_for(LATHER_LABEL("lather::Shampoo::corrected_update"), Range(space, 0, numel_of(blk.extent)),
                           impl::kernels::CorrectedUpdate<value_type>{r, p.corrected.data() + blk.begin, value_type(beta2),
                                                                      value_type(weight), beta2 != 1.0});
    }
  }

  // update_corrected and the direction of eigenvalue-corrected Shampoo for one block, serially in
  // the calling thread (block tasks): the same element operations, the rotations as whole
  // single-threaded GEMMs (the per-parameter path may split a product over the threads).
  // x: the block's gradient (overwritten), y: a second block buffer. `split` (a wide fused
  // block): the rotations split over the threads as the per-parameter path splits them.
  void block_corrected_update(ParamState& p, const block_state_type& blk, value_type* x, value_type* y, double beta2,
                              double weight, impl::blas::split::Crew* split = nullptr) {
    const std::int64_t n = numel_of(blk.extent);
    const value_type* r = rotate_block_serial(blk, x, y, false, split);
    const impl::kernels::CorrectedUpdate<value_type> update{r, p.corrected.data() + blk.begin, value_type(beta2),
                                                             value_type(weight), beta2 != 1.0};
    for (std::int64_t e = 0; e < n; ++e) update(e);
  }
  // x: the filtered (grafted) block in, its direction out; y: a second block buffer.
  void block_corrected_direction(const ParamState& p, const block_state_type& blk, value_type* x, value_type* y,
                                 impl::blas::split::Crew* split = nullptr) const {
    const auto& grp = m_groups[p.group];
    const auto& o = grp.options;
    const bool bias = o.use_bias_correction && o.betas[1] < 1.0;
    const double bc2 = bias ? 1.0 - std::pow(o.betas[1], static_cast<double>(grp.step)) : 1.0;
    const std::int64_t n = numel_of(blk.extent);
    value_type* r = rotate_block_serial(blk, x, y, false, split);
    const impl::kernels::CorrectedScale<value_type> scale{r,
                                                          p.corrected.data() + blk.begin,
                                                          value_type(bc2),
                                                          value_type(o.epsilon),
                                                          value_type(p.corrected_exponent),
                                                          bias,
                                                          p.corrected_exponent == 0.5};
    for (std::int64_t e = 0; e < n; ++e) scale(e);
    value_type* result = rotate_block_serial(blk, r, r == x ? y : x, true, split);
    if (result != x) std::copy(result, result + n, x);
  }
  // rotate_block's host GEMMs, serially in the calling thread (rotate_mode_blas' calls, whole).
  value_type* rotate_block_serial(const block_state_type& blk, value_type* x, value_type* y, bool back,
                                  impl::blas::split::Crew* split = nullptr) const {
    value_type* from = x;
    for (std::size_t j = 0; j < blk.factors.size(); ++j) {
      const auto& f = blk.factors[j];
      if (!f.preconditioned) continue;
      value_type* to = from == x ? y : x;
      const auto [outer, d, inner] = unfold(blk.extent, j);
      rotate_mode_serial(from, to, outer, d, inner, f.eigenvectors.data(), back, split);
      from = to;
    }
    return from;
  }
  // rotate_mode_blas without an execution space: each GEMM whole and single-threaded, or split
  // over a wide block's crew.
  static void rotate_mode_serial(const value_type* x, value_type* y, std::int64_t outer, std::int64_t d, std::int64_t inner,
                                 const inverse_factor_type* q, bool back, impl::blas::split::Crew* split = nullptr) {
    const std::int64_t ld = std::max<std::int64_t>(1, d);
    if (inner == 1) {
      impl::blas::split::gemm<value_type>(split, back ? 'T' : 'N', 'N', d, outer, d, value_type(1), q, ld, x, ld, value_type(0),
                                          y, ld);
      return;
    }
    for (std::int64_t a = 0; a < outer; ++a)
      impl::blas::split::gemm<value_type>(split, 'N', back ? 'N' : 'T', inner, d, d, value_type(1), x + a * d * inner, inner, q,
                                          ld, value_type(0), y + a * d * inner, inner);
  }
  // precondition_block for KL-Shampoo's block tasks, serially in the calling thread: a packed
  // inverse root unpacked into `full` (d x d, the thread's Gram matrix, free until the factor's
  // own Gram product), the products as rotate_mode_serial's GEMMs. Returns where the result is
  // (x itself, a or b).
  const value_type* precondition_block_serial(const block_state_type& blk, const value_type* x, value_type* a, value_type* b,
                                              std::size_t skip, value_type* full) const {
    const value_type* from = x;
    for (std::size_t j = 0; j < blk.factors.size(); ++j) {
      const auto& f = blk.factors[j];
      if (!f.preconditioned || j == skip) continue;
      value_type* to = from == a ? b : a;
      const auto [outer, d, inner] = unfold(blk.extent, j);
      const auto st = f.inverse_storage();
      const inverse_factor_type* q = st.data;
      if (st.packed) {
        const impl::kernels::Unpack<inverse_factor_type, blas_matrix_type> unpack{st.as_const(), blas_matrix(full, d, d)};
        for (std::int64_t r = 0; r < d; ++r)
          for (std::int64_t c = 0; c < d; ++c) unpack(r, c);
        q = full;
      }
      rotate_mode_serial(from, to, outer, d, inner, q, false);
      from = to;
    }
    return from;
  }

  // Spectral descent of one 2-D block x (rows r x cols c, row-major = the column-major c x r
  // matrix M = X^T); returns where the result is (x or y).
  value_type* orthogonalize(const ExecSpace& space, const block_state_type& blk, value_type* x, value_type* y) {
    using Range = Kokkos::RangePolicy<ExecSpace, Kokkos::IndexType<std::int64_t>>;
    const std::int64_t r = blk.extent[0], c = blk.extent[1], n = r * c;
    const double scale = inner().scale(c, r);
    value_type* out = x;
    if constexpr (std::is_same_v<inner_type, SpectralDescent<SVDOrthogonalization>>) {
      // U V^T of M = (U V^T of X)^T, through host LAPACK, in per-thread scratch.
      auto& m = impl::host_scratch<value_type, impl::OrthogonalizeScratch, 0>();
      auto& sv = impl::host_scratch<value_type, impl::OrthogonalizeScratch, 1>();
      auto& u = impl::host_scratch<value_type, impl::OrthogonalizeScratch, 2>();
      auto& vt = impl::host_scratch<value_type, impl::OrthogonalizeScratch, 3>();
      auto& uv = impl::host_scratch<value_type, impl::OrthogonalizeScratch, 4>();
      m.resize(static_cast<std::size_t>(n));
      uv.resize(static_cast<std::size_t>(n));
      view_range_to_host(space, x, m);
      LATHER_THROW_RUNTIME_IF(impl::dense::svd<value_type>(static_cast<int>(c), static_cast<int>(r), m, sv, u, vt) != 0,
                              "lather::Shampoo::step: the SVD of a ", r, "x", c,
                              " block did not converge (NaN or Inf in the filtered gradient?)");
      const auto kk = static_cast<std::size_t>(std::min(r, c));
      impl::dense::gemm<value_type>("N", "N", static_cast<std::size_t>(c), static_cast<std::size_t>(r), kk, value_type(1),
                                    u.data(), vt.data(), value_type(0), uv.data());
      double factor = scale;
      if (inner().orthogonalization.scale_by_nuclear_norm) {
        double nuclear = 0;
        for (const auto s_k : sv) nuclear += static_cast<double>(s_k);
        factor *= nuclear;
      }
      for (auto& v : uv) v = static_cast<value_type>(v * static_cast<value_type>(factor));
      host_range_to_view(space, uv, x);
      return x;
    } else {
      const auto& ns = inner().orthogonalization;
      double sumsq = 0;
      Kokkos::parallel_reduce(LATHER_LABEL("lather::Shampoo::ns_norm"), Range(space, 0, n), impl::kernels::SumSquares<value_type>{x},
                              sumsq);
      const value_type norm = std::max(static_cast<value_type>(std::sqrt(sumsq)), value_type(1e-8));
      Kokkos::parallel_for(LATHER_LABEL("lather::Shampoo::ns_normalize"), Range(space, 0, n),
                           impl::kernels::Scale<value_type>{x, x, norm, true});
      const bool tall = r >= c;  // X^T X of the row-major X is M M^T (c x c); else M^T M (r x r)
      const std::int64_t m = std::min(r, c);
      const auto& bv = m_gram.at(static_cast<std::size_t>(m));
      const auto& b2v = m_gram2.at(static_cast<std::size_t>(m));
      const auto bm = blas_matrix(bv.data(), m, m), b2m = blas_matrix(b2v.data(), m, m);
      const auto [ca, cb, cc] = ns.coefficients;
      value_type *cur = x, *nxt = y;
      for (int it = 0; it < ns.num_iterations; ++it) {
        const auto mm = blas_matrix(cur, c, r);
        if (tall) gemm(space, "N", "T", value_type(1), mm, mm, value_type(0), bm);
        else gemm(space, "T", "N", value_type(1), mm, mm, value_type(0), bm);
        gemm(space, "N", "N", value_type(1), bm, bm, value_type(0), b2m);
        Kokkos::parallel_for(LATHER_LABEL("lather::Shampoo::ns_combine"), Range(space, 0, m * m),
                             impl::kernels::Combine2<value_type>{bv.data(), b2v.data(), value_type(cb), value_type(cc)});
        Kokkos::parallel_for(LATHER_LABEL("lather::Shampoo::ns_copy"), Range(space, 0, n),
                             impl::kernels::Scale<value_type>{cur, nxt, value_type(1), false});
        // X <- a X + X B: M <- a M + B M (tall) or M <- a M + M B (wide); B is symmetric.
        if (tall) gemm(space, "N", "N", value_type(1), bm, mm, value_type(ca), blas_matrix(nxt, c, r));
        else gemm(space, "N", "N", value_type(1), mm, bm, value_type(ca), blas_matrix(nxt, c, r));
        std::swap(cur, nxt);
      }
      out = cur;
      if (scale != 1.0)
        Kokkos::parallel_for(LATHER_LABEL("lather::Shampoo::scale_by_dims"), Range(space, 0, n),
                             impl::kernels::Scale<value_type>{out, out, value_type(scale), false});
    }
    return out;
  }

  // Sign descent of one block in place: sign(x) * scale_fn(stats of x).
  void sign_block(const ExecSpace& space, const block_state_type& blk, value_type* x) {
    using Range = Kokkos::RangePolicy<ExecSpace, Kokkos::IndexType<std::int64_t>>;
    const std::int64_t n = numel_of(blk.extent);
    double scale = 1.0;
    if constexpr (kind == PreconditionerKind::sign_descent) {
      if (inner().scale_fn) {
        SignDescentBlockStats stats;
        stats.numel = n;
        double sumsq = 0;
        Kokkos::parallel_reduce(LATHER_LABEL("lather::Shampoo::sign_l1"), Range(space, 0, n), impl::kernels::SumAbs<value_type>{x},
                                stats.l1_norm);
        Kokkos::parallel_reduce(LATHER_LABEL("lather::Shampoo::sign_l2"), Range(space, 0, n),
                                impl::kernels::SumSquares<value_type>{x}, sumsq);
        stats.l2_norm = std::sqrt(sumsq);
        scale = inner().scale_fn(stats);
      }
    }
    Kokkos::parallel_for(LATHER_LABEL("lather::Shampoo::sign"), Range(space, 0, n),
                         impl::kernels::SignScale<value_type>{x, value_type(scale)});
  }

  // Block data (a raw range of a work buffer) to and from a host vector of the same length.
  // Host memory is copied on the calling thread (see host_to_view).
  static void view_range_to_host(const ExecSpace& space, const value_type* x, std::vector<value_type>& h) {
    space.fence();
    if constexpr (Kokkos::SpaceAccessibility<Kokkos::HostSpace, memory_space>::accessible) {
      std::copy(x, x + h.size(), h.begin());
    } else {
      Kokkos::View<const value_type*, memory_space, Kokkos::MemoryTraits<Kokkos::Unmanaged>> d(x, h.size());
      Kokkos::View<value_type*, Kokkos::HostSpace, Kokkos::MemoryTraits<Kokkos::Unmanaged>> hv(h.data(), h.size());
      Kokkos::deep_copy(hv, d);
    }
  }
  static void host_range_to_view(const ExecSpace& space, const std::vector<value_type>& h, value_type* x) {
    if constexpr (Kokkos::SpaceAccessibility<Kokkos::HostSpace, memory_space>::accessible) {
      space.fence();
      std::copy(h.begin(), h.end(), x);
    } else {
      Kokkos::View<value_type*, memory_space, Kokkos::MemoryTraits<Kokkos::Unmanaged>> d(x, h.size());
      Kokkos::View<const value_type*, Kokkos::HostSpace, Kokkos::MemoryTraits<Kokkos::Unmanaged>> hv(h.data(), h.size());
      Kokkos::deep_copy(space, d, hv);
      space.fence();
    }
  }

  // ---- helpers -------------------------------------------------------------------------------

  const GroupState& group(std::size_t g) const {
    LATHER_THROW_IF(g >= m_groups.size(), "lather::Shampoo: no parameter group ", g, " (there are ", m_groups.size(), ")");
    return m_groups[g];
  }
  GroupState& group(std::size_t g) {
    LATHER_THROW_IF(g >= m_groups.size(), "lather::Shampoo: no parameter group ", g, " (there are ", m_groups.size(), ")");
    return m_groups[g];
  }
  const UserParam& user(std::size_t i) const {
    LATHER_THROW_IF(i >= m_users.size(), "lather::Shampoo: no parameter ", i, " (there are ", m_users.size(), ")");
    return m_users[i];
  }
  // Block b of user parameter i (numbered over its pieces): (piece, block of the piece's layout).
  std::pair<std::size_t, std::size_t> locate(std::size_t i, std::size_t b) const {
    const auto& u = user(i);
    std::size_t rest = b;
    for (std::size_t j = 0; j < u.count; ++j) {
      const std::size_t n = piece_blocks(u.first + j);
      if (rest < n) return {u.first + j, rest};
      rest -= n;
    }
    impl::throw_error<invalid_argument>(std::source_location::current(), "lather::Shampoo: ", describe(i),
                                        " has no block ", b, " (it has ", num_blocks(i), ")");
  }
  // The state-dict prefix of block b of piece i: "state.<param>.block_<b>." (the reference's
  // names); sharded modes name the shard's range, so a checkpoint of another sharding is refused
  // by name: "state.<param>.shard_<start>_<end>.block_<b>.".
  std::string block_key(std::size_t i, std::size_t b) const {
    const auto& p = m_params[i];
    std::string key = "state." + std::to_string(p.user) + ".";
    if (sharded())
      key += "shard_" + std::to_string(m_dist.shards[p.user].start) + "_" + std::to_string(m_dist.shards[p.user].end) + ".";
    return key + "block_" + std::to_string(p.block_offset + b) + ".";
  }
  vector_type piece_state(std::size_t i, const std::string& name) const {
    const auto& p = m_params[i];
    if (name == "filtered_grad") return p.filtered;
    if (name == "adagrad") return p.graft_state;
    if (name == "momentum_buffer") return p.momentum;
    if (name == "corrected_eigenvalues") return p.corrected;
    return p.weight_buffer;
  }
  // Blocks of piece i (none for a zero-size parameter, which is skipped entirely).
  std::size_t piece_blocks(std::size_t i) const {
    return m_params[i].param.size() == 0 ? 0 : m_params[i].layout.blocks.size();
  }
  std::string describe_piece(std::size_t i) const {
    const auto& p = m_params[i];
    std::string d = describe(p.user);
    if (sharded()) d += " (piece " + std::to_string(p.piece) + " of this rank's range)";
    return d;
  }
  const ShampooFactorState<factor_type, inverse_factor_type, memory_space>& factor_of(std::size_t i, std::size_t b,
                                                                                    std::size_t k) const {
    const auto& blk = block(i, b);
    LATHER_THROW_IF(k >= blk.factors.size() || !blk.factors[k].preconditioned, "lather::Shampoo: block ", b, " of ",
                    describe(i), " has no factor matrix for dimension ", k);
    return blk.factors[k];
  }
  template <class S>
  static Kokkos::View<std::remove_const_t<S>**, Kokkos::LayoutRight, memory_space> unpack(
      impl::kernels::SymmetricStorage<S> storage) {
    using U = std::remove_const_t<S>;
    Kokkos::View<U**, Kokkos::LayoutRight, memory_space> full("lather::Shampoo::unpacked", storage.d, storage.d);
    Kokkos::parallel_for(LATHER_LABEL("lather::Shampoo::unpack"),
                         Kokkos::MDRangePolicy<ExecSpace, Kokkos::Rank<2>, Kokkos::IndexType<std::int64_t>>(
                             {0, 0}, {storage.d, storage.d}),
                         impl::kernels::UnpackScaled<U, memory_space>{{storage.data, storage.d, storage.packed, storage.tri}, full, U(1), false});
    ExecSpace().fence();
    return full;
  }
  static std::string describe_name(std::size_t i, const std::string& name) {
    return "parameter " + std::to_string(i) + (name.empty() ? std::string() : " ('" + name + "')");
  }
  std::string describe(std::size_t i) const { return describe_name(i, m_users[i].name); }
  static std::int64_t numel_of(const std::vector<std::int64_t>& e) {
    std::int64_t n = 1;
    for (auto x : e) n *= x;
    return n;
  }
  template <class S>
  static bool holds(const StateTensor& t) {
    return std::holds_alternative<std::vector<S>>(t.values);
  }
  template <class V>
  static StateTensor view_to_tensor(const V& storage, std::vector<std::int64_t> shape) {
    using S = typename V::non_const_value_type;
    auto h = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), storage);
    std::vector<S> v(h.data(), h.data() + h.size());
    return StateTensor{std::move(shape), std::move(v)};
  }
  static std::string shape_string(const std::vector<std::int64_t>& shape) {
    std::string out = "(";
    for (std::size_t k = 0; k < shape.size(); ++k) out += (k ? ", " : "") + std::to_string(shape[k]);
    return out + (shape.size() == 1 ? ",)" : ")");
  }
  // The per-factor state-dict entries of this preconditioner: 0 factor, 1 inverse factor,
  // 2 eigenvectors, 3 eigenvalues (the reference's names).
  static std::vector<int> factor_entries() {
    if constexpr (kind == PreconditionerKind::root_inverse) return {0, 1};
    else if constexpr (kind == PreconditionerKind::eigendecomposed) return {0, 2, 3};
    else if constexpr (kind == PreconditionerKind::eigenvalue_corrected) return {0, 2};
    else return {};
  }
  static const char* factor_entry_name(int which) {
    switch (which) {
      case 0: return "shampoo.factor_matrices.";
      case 1: return "shampoo.inv_factor_matrices.";
      case 2: return "shampoo.factor_matrices_eigenvectors.";
      default: return "shampoo.factor_matrices_eigenvalues.";
    }
  }
  static std::vector<std::int64_t> factor_entry_shape(int which, const factor_state_type& f) {
    if (which <= 1) return f.packed ? std::vector<std::int64_t>{f.dim * (f.dim + 1) / 2} : std::vector<std::int64_t>{f.dim, f.dim};
    if (which == 2) return {f.dim, f.dim};
    return {f.dim};
  }
  // The buffer that holds f's inverse factor (its own, or the factor's when paired).
  static Kokkos::View<inverse_factor_type*, memory_space> inverse_owner(const factor_state_type& f) {
    if constexpr (paired_possible)
      if (f.paired) return f.factor;
    return f.inverse_factor;
  }
  static const Kokkos::View<inverse_factor_type*, memory_space>& factor_entry_view(int which, const factor_state_type& f) {
    return which == 1 ? f.inverse_factor : which == 2 ? f.eigenvectors : f.eigenvalues;
  }
  // The options a state dictionary records besides lr and peak_lr (restored) and the step
  // counters: everything that changes the numbers or the state's structure, so load_state_dict
  // can refuse a checkpoint of another configuration. Enums and flags as their integer values;
  // inverse_exponent_override as rows (order, dimension or -1 for 'all', exponent).
  std::vector<std::pair<std::string, StateTensor>> recorded_options(const ShampooOptions& o) const {
    std::vector<std::pair<std::string, StateTensor>> r;
    auto scalar = [&](const char* name, double v) { r.emplace_back(name, StateTensor{{}, std::vector<double>{v}}); };
    auto d = [](auto v) { return static_cast<double>(v); };
    r.emplace_back("betas", StateTensor{{2}, std::vector<double>{o.betas[0], o.betas[1]}});
    scalar("beta3", o.beta3);
    scalar("epsilon", o.epsilon);
    scalar("weight_decay", o.weight_decay);
    scalar("weight_decay_type", d(static_cast<int>(o.weight_decay_type)));
    scalar("max_preconditioner_dim", d(o.max_preconditioner_dim));
    scalar("precondition_frequency", d(o.precondition_frequency));
    scalar("start_preconditioning_step", d(o.start_preconditioning_step));
    scalar("use_bias_correction", d(o.use_bias_correction));
    scalar("target_parameter_dimensionality", d(o.target_parameter_dimensionality));
    scalar("momentum", o.momentum);
    scalar("dampening", o.dampening);
    scalar("use_nesterov", d(o.use_nesterov));
    std::vector<double> overrides;
    for (const auto& [order, ov] : o.inverse_exponent_override) {
      if (ov.all) overrides.insert(overrides.end(), {d(order), -1.0, *ov.all});
      for (const auto& [dim, e] : ov.per_dimension) overrides.insert(overrides.end(), {d(order), d(dim), e});
    }
    const auto rows = static_cast<std::int64_t>(overrides.size() / 3);
    r.emplace_back("inverse_exponent_override", StateTensor{{rows, 3}, std::move(overrides)});
    std::vector<double> roots(o.inv_root_override.begin(), o.inv_root_override.end());
    r.emplace_back("inv_root_override",
                   StateTensor{{static_cast<std::int64_t>(roots.size())}, std::move(roots)});
    scalar("exponent_multiplier", o.exponent_multiplier);
    scalar("iterate_averaging", d(static_cast<int>(o.iterate_averaging)));
    scalar("eval_interp_coeff", o.eval_interp_coeff);
    scalar("train_interp_coeff", o.train_interp_coeff);
    scalar("eval_coeff_lr_power", o.eval_coeff_lr_power);
    scalar("num_tolerated_failed_amortized_computations", d(o.num_tolerated_failed_amortized_computations));
    scalar("use_symmetric_packing", d(o.use_symmetric_packing));
    // Recorded only when on: dictionaries saved before the option existed still load.
    if (o.stagger_amortized_computations) scalar("stagger_amortized_computations", 1.0);
    if constexpr (requires { m_grafting.epsilon; }) scalar("grafting_epsilon", m_grafting.epsilon);
    if constexpr (requires { m_grafting.beta2; }) scalar("grafting_beta2", m_grafting.beta2);
    return r;
  }
  static std::string option_string(const StateTensor& t) {
    std::string s;
    std::visit([&](const auto& v) {
      for (std::size_t k = 0; k < v.size(); ++k) s += (k ? ", " : "") + impl::concat(v[k]);
    }, t.values);
    return t.shape.empty() ? s : "(" + s + ") of shape " + shape_string(t.shape);
  }
  // A sized std::array: nvcc's front end rejects a range-for over an in-class array of deduced size.
  static constexpr std::array<const char*, 5> element_state_names = {"filtered_grad", "adagrad", "momentum_buffer",
                                                                     "corrected_eigenvalues", "weight_buffer"};
  // "lather.Shampoo.v1" for classic Shampoo (unchanged), with the policy's kind otherwise, so a
  // dictionary saved with another preconditioner is rejected by name.
  static std::string state_format() {
    std::string f = "lather.Shampoo.v1";
    if constexpr (kl) f += "/kl";
    switch (kind) {
      case PreconditionerKind::root_inverse: break;
      case PreconditionerKind::eigendecomposed: f += "/eigendecomposed"; break;
      case PreconditionerKind::eigenvalue_corrected: f += "/eigenvalue_corrected"; break;
      case PreconditionerKind::spectral_descent: f += "/spectral_descent"; break;
      case PreconditionerKind::sign_descent: f += "/sign_descent"; break;
    }
    return f;
  }
  // DDP / HSDP: the owners move their blocks and the moves travel through the all-gather, so
  // train() and eval() are collective.
  void switch_mode(bool train) {
    if (m_train == train) return;
    const ExecSpace space;
    auto averaged = [&](std::size_t i) {
      const auto& p = m_params[i];
      return m_groups[p.group].options.iterate_averaging != IterateAveraging::none && p.param.size() > 0;
    };
    bool any = false;
    for (std::size_t i = 0; i < m_params.size(); ++i) {
      if (!averaged(i)) continue;
      any = true;
      auto& p = m_params[i];
      if (p.local_numel == 0) continue;
      const auto& o = m_groups[p.group].options;
      const double mu_y = o.train_interp_coeff;
      const double coefficient = train ? 1.0 - mu_y : 1.0 - 1.0 / mu_y;
      value_type* const delta_out = exchanges() && !m_dist.communicate_params ? m_work1.data() : nullptr;
      for_each_blocked(LATHER_LABEL("lather::Shampoo::train_eval"), space, p,
                       impl::kernels::Interpolate<value_type, memory_space>{p.param, p.weight_buffer,
                                                                            value_type(coefficient), delta_out});
      if (exchanges()) pack(space, i, delta_out);
    }
    if (exchanges() && any) exchange(space, !m_dist.communicate_params, averaged);
    space.fence();
    m_train = train;
  }
  const inner_type& inner() const noexcept {
    if constexpr (kl) return m_preconditioner.inner;
    else return m_preconditioner;
  }
  // A factor or inverse factor (storage `st` in the buffer `owner`) as its state-dict entry: the
  // reference's layout (packed contiguous rows, or full), whatever the storage's.
  template <class V, class S>
  static StateTensor symmetric_to_tensor(const V& owner, const impl::kernels::SymmetricStorage<S>& st,
                                         std::vector<std::int64_t> shape) {
    if (!st.packed || st.tri == 0) {
      const V part(st.data, static_cast<std::size_t>(impl::kernels::SymmetricStorage<S>::size(st.d, st.packed)));
      return view_to_tensor(part, std::move(shape));
    }
    auto h = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), owner);
    impl::kernels::SymmetricStorage<S> on_host = st;
    on_host.data = h.data() + (st.data - owner.data());
    std::vector<std::remove_const_t<S>> v(static_cast<std::size_t>(impl::kernels::SymmetricStorage<S>::size(st.d, true)));
    const impl::kernels::SymmetricStorage<std::remove_const_t<S>> packed{v.data(), st.d, true};
    for (std::int64_t i = 0; i < st.d; ++i)
      for (std::int64_t j = i; j < st.d; ++j) packed(i, j) = on_host(i, j);
    return StateTensor{std::move(shape), std::move(v)};
  }
  // The inverse of symmetric_to_tensor.
  template <class V, class S>
  static void tensor_to_symmetric(const StateTensor& t, const V& owner, const impl::kernels::SymmetricStorage<S>& st) {
    if (!st.packed || st.tri == 0) {
      tensor_to_storage(t, V(st.data, static_cast<std::size_t>(impl::kernels::SymmetricStorage<S>::size(st.d, st.packed))));
      return;
    }
    const auto& v = std::get<std::vector<S>>(t.values);
    auto h = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), owner);
    impl::kernels::SymmetricStorage<S> on_host = st;
    on_host.data = h.data() + (st.data - owner.data());
    const impl::kernels::SymmetricStorage<const S> packed{v.data(), st.d, true};
    for (std::int64_t i = 0; i < st.d; ++i)
      for (std::int64_t j = i; j < st.d; ++j) on_host(i, j) = packed(i, j);
    Kokkos::deep_copy(owner, h);
  }
  template <class V>
  static void tensor_to_storage(const StateTensor& t, const V& storage) {
    using S = typename V::non_const_value_type;
    const auto& v = std::get<std::vector<S>>(t.values);
    Kokkos::View<const S*, Kokkos::HostSpace, Kokkos::MemoryTraits<Kokkos::Unmanaged>> h(v.data(), v.size());
    Kokkos::deep_copy(storage, h);
  }
  static StateTensor slice_to_tensor(const vector_type& v, const block_state_type& blk) {
    const auto n = numel_of(blk.extent);
    auto sub = Kokkos::subview(v, std::make_pair(blk.begin, blk.begin + n));
    std::vector<value_type> host(static_cast<std::size_t>(n));
    Kokkos::View<value_type*, Kokkos::HostSpace, Kokkos::MemoryTraits<Kokkos::Unmanaged>> h(host.data(), host.size());
    Kokkos::deep_copy(h, sub);
    return StateTensor{blk.extent, std::move(host)};
  }
  static void tensor_to_slice(const StateTensor& t, const vector_type& v, const block_state_type& blk) {
    const auto& host = std::get<std::vector<value_type>>(t.values);
    auto sub = Kokkos::subview(v, std::make_pair(blk.begin, blk.begin + static_cast<std::int64_t>(host.size())));
    Kokkos::View<const value_type*, Kokkos::HostSpace, Kokkos::MemoryTraits<Kokkos::Unmanaged>> h(host.data(), host.size());
    Kokkos::deep_copy(sub, h);
  }

  Preconditioner m_preconditioner;
  Grafting m_grafting;
  bool m_train = true;
  Communicator m_comm;  // DDP / HSDP: the group sharing the blocks (after num_trainers_per_group)
  ShampooDistributedOptions m_dist;
  int m_dist_rank = 0, m_dist_size = 1;
  std::int64_t m_slice_bytes = 0;
  Kokkos::View<std::uint8_t*, memory_space> m_send, m_recv;  // the all-gather buffer
  std::vector<GroupState> m_groups;
  std::vector<UserParam> m_users;
  std::vector<ParamState> m_params;  // pieces
  std::map<std::size_t, Kokkos::View<factor_type**, Kokkos::LayoutRight, memory_space>> m_scratch;
  // Root-inverse kind: a full root as the strategy writes it, before it is stored as the factor
  // is (packed: half the bytes), the largest factor's d^2 once instead of d^2 per factor.
  Kokkos::View<factor_type*, memory_space> m_root_full{"lather::Shampoo::root_full", 0};
  std::map<std::size_t, vector_type> m_gram, m_gram2;
  vector_type m_grad, m_work0, m_work1, m_unfold;
  bool m_huge_pages = false;          // state on huge pages (lather::huge_pages_enabled at construction)
  std::size_t m_huge_page_bytes = 0;  // of the factor arenas (impl::StateArena)
  Kokkos::View<double*, memory_space> m_norm_partials;  // block_norms' chunk partials (device path)
  std::vector<vector_type> m_thread_gram, m_thread_unfold;  // host block concurrency, per thread
  std::vector<vector_type> m_thread_grad, m_thread_x;       // fused host blocks, threads > 0
  std::vector<vector_type> m_thread_y;                      // and eigenvalue-corrected ones' rotations
  bool m_fused_eligible = false;                            // see fused_possible()
  int m_fused_threads = 0;                                  // what plan_fused() planned for
  std::vector<char> m_fused_wide;                           // per parameter: all its blocks run wide
  std::vector<FusedTask> m_fused_order, m_fused_tasks;
  std::vector<FusedTask> m_fused_wide_tasks;  // the blocks that run wide (those parameters' and balance_fused's), in order
  // Roots side by side, threads > 0, largest d^2 each: the bias-corrected factor and the full
  // root before it is stored as the factor is (thread 0 takes m_scratch and m_root_full).
  std::vector<std::vector<factor_type>> m_thread_root, m_thread_root_out;
  std::vector<RootJob> m_root_jobs;
  bool m_roots_reserved = false;       // the roots side by side's per-thread arrays sized
  bool m_root_steps_reserved = false;  // reserve_root_steps ran (the first step)
  std::vector<std::uint32_t> m_root_order;
  impl::ShampooStepInfo m_info;
  impl::GradientIntake<value_type, memory_space, ExecSpace> m_intake;
  // step()'s reused host buffers (see step()).
  std::vector<tensor_type> m_user_params;
  std::vector<TensorRef<const value_type, memory_space>> m_piece_grads;
  std::vector<double> m_lr_sums_before;
  std::vector<std::vector<std::vector<RootInverseStatus>>> m_status;
  std::vector<char> m_status_set;
  std::vector<std::int64_t> m_failed_ranks;
  NonFinitePolicy m_nonfinite_policy = NonFinitePolicy::raise;
  bool m_block_concurrency = true;
  bool m_phase_timing = false;
  // Per host thread (a line each, no false sharing): the fused tasks' phase times (set_phase_timing).
  struct alignas(64) ThreadSeconds {
    impl::ShampooPhaseSeconds s;
  };
  std::vector<ThreadSeconds> m_thread_seconds;
  // Batched passes (see set_batched_passes and "batched passes" above).
  template <class Job>
  using multi_table = impl::kernels::MultiTensorTable<ExecSpace, memory_space, Job>;
  template <class Job>
  using team_table = impl::kernels::TeamTable<ExecSpace, memory_space, Job>;
  template <class Job>
  using chunked_table = impl::kernels::ChunkedTeamTable<ExecSpace, memory_space, Job>;
  bool m_batched = false;
  bool m_gated = false;  // this step's state-changing batched jobs are gated on the NaN/Inf counts
  vector_type m_batch_grad, m_batch_work, m_batch_pool;  // all parameters' blocked gradient and direction
  Kokkos::View<double*, memory_space> m_batch_norms;     // per block: ||graft(Gbar)||^2, ||P||^2
  Kokkos::View<double*, memory_space> m_batch_partials;  // per chunk of every block: a norm's partial sum
  std::vector<std::int64_t> m_batch_offset, m_batch_first_block;  // per piece
  std::int64_t m_batch_pool_used = 0;
  std::size_t m_batch_max_rank = 0;
  std::vector<value_type*> m_batch_cur;  // per block: where its direction is now
  std::vector<BlockPlace> m_batch_places;  // per block: where its elements are in the parameter
  std::vector<StepScalars> m_batch_scalars;  // per piece, this step's
  std::vector<BatchedProduct> m_batch_products;
  gemm_batches_type m_gemm_batches;  // the products of the batched passes, run by shape
  multi_table<impl::kernels::BlockMapped<impl::kernels::GatherGradient<value_type, memory_space>>> m_tab_gather;
  multi_table<impl::kernels::CopyTriangle<factor_type>> m_tab_backup;
  multi_table<impl::kernels::UnfoldMode<value_type>> m_tab_unfold;
  multi_table<impl::kernels::CombineJob<value_type, factor_type>> m_tab_combine;
  multi_table<impl::kernels::StepFilter<value_type, memory_space>> m_tab_filter;
  multi_table<impl::kernels::UnpackJob<inverse_factor_type, value_type>> m_tab_unpack;
  multi_table<impl::kernels::CopyBlock<value_type>> m_tab_copy;
  multi_table<impl::kernels::BlockMapped<impl::kernels::StepUpdate<value_type, memory_space>>> m_tab_apply;
  chunked_table<impl::kernels::NormChunkJob<value_type>> m_tab_norms;
  team_table<impl::kernels::NormSumJob> m_tab_norm_sums;
  // Per piece: this step's learning rate, decay and bias corrections, read by the filter, norm
  // and update jobs through pointers (so that their tables stay the same from step to step).
  impl::kernels::ValueTable<ExecSpace, memory_space, impl::kernels::StepValues<value_type>> m_step_values;
  chunked_table<impl::kernels::MatVecChunkJob<value_type, inverse_factor_type>> m_tab_matvec;
  chunked_table<impl::kernels::GraftScaleJob<value_type>> m_tab_scale;
};

template <class P>
Shampoo(std::vector<P>&, ShampooOptions = {}) -> Shampoo<P>;
template <class P, class R>
Shampoo(std::vector<P>&, ShampooOptions, R) -> Shampoo<P, default_execution_space_t<P>, R>;
template <class P, class R, class G>
Shampoo(std::vector<P>&, ShampooOptions, R, G) -> Shampoo<P, default_execution_space_t<P>, R, G>;

}  // namespace lather

#endif
