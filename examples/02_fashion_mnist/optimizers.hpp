// SPDX-License-Identifier: Apache-2.0
// Choosing a lather optimizer at run time. lather picks strategies at compile time (the root
// inverse and the grafting are template parameters), so a trainer that takes them from the
// command line instantiates each combination once and hides it behind a small interface.
#ifndef LATHER_EXAMPLES_FMNIST_OPTIMIZERS_HPP
#define LATHER_EXAMPLES_FMNIST_OPTIMIZERS_HPP

#include "options.hpp"

#include <lather/lather.hpp>

#include <memory>
#include <span>
#include <string>
#include <vector>

namespace fmnist {

/// The trainer's view of an optimizer.
template <class Tensor>
class AnyOptimizer {
 public:
  virtual ~AnyOptimizer() = default;
  virtual void step(const std::vector<Tensor>& grads) = 0;
  virtual void set_lr(double lr) = 0;
};

namespace detail {
template <class Tensor, class Opt>
class OptimizerModel final : public AnyOptimizer<Tensor> {
 public:
  explicit OptimizerModel(Opt opt) : m_opt(std::move(opt)) {}
  void step(const std::vector<Tensor>& grads) override { m_opt.step(grads); }
  void set_lr(double lr) override { m_opt.set_lr(lr); }

 private:
  Opt m_opt;
};

template <class Tensor, class Opt>
std::unique_ptr<AnyOptimizer<Tensor>> wrap(Opt opt) {
  return std::make_unique<OptimizerModel<Tensor, Opt>>(std::move(opt));
}

template <class Tensor, class ExecSpace, class RootInverse>
std::unique_ptr<AnyOptimizer<Tensor>> make_shampoo(std::vector<Tensor>& params, const std::vector<std::string>& names,
                                                   const OptimizerSettings& s, RootInverse root) {
  lather::ShampooOptions o;
  o.lr = s.lr;
  o.betas = {s.betas[0], s.shampoo_beta2};
  o.epsilon = s.shampoo_epsilon;
  o.weight_decay = s.weight_decay;
  o.weight_decay_type = lather::WeightDecayType::decoupled;
  o.precondition_frequency = s.precondition_frequency;
  o.start_preconditioning_step = s.start_preconditioning_step;
  o.max_preconditioner_dim = s.max_preconditioner_dim;
  o.use_symmetric_packing = s.use_symmetric_packing;
  const std::span<Tensor> p(params);
  const auto make = [&](auto grafting) {
    return wrap<Tensor>(lather::Shampoo<Tensor, ExecSpace, RootInverse, decltype(grafting)>(p, o, root, grafting, names));
  };
  if (s.grafting == "none") return make(lather::NoGrafting{});
  if (s.grafting == "sgd") return make(lather::SGDGrafting{});
  if (s.grafting == "adagrad") return make(lather::AdaGradGrafting{s.grafting_epsilon});
  if (s.grafting == "rmsprop") return make(lather::RMSpropGrafting{s.grafting_beta2, s.grafting_epsilon});
  if (s.grafting == "adam") return make(lather::AdamGrafting{s.grafting_beta2, s.grafting_epsilon});
  throw std::invalid_argument("unknown --grafting '" + s.grafting + "' (choose none, sgd, adagrad, rmsprop or adam)");
}
}  // namespace detail

/// Builds the optimizer `s` names over `params` (which must outlive it).
template <class Tensor, class ExecSpace>
std::unique_ptr<AnyOptimizer<Tensor>> make_optimizer(std::vector<Tensor>& params, const std::vector<std::string>& names,
                                                     const OptimizerSettings& s) {
  const std::span<Tensor> p(params);
  if (s.name == "sgd")
    return detail::wrap<Tensor>(lather::SGD<Tensor, ExecSpace>(
        p, lather::SGDOptions{.lr = s.lr, .momentum = s.momentum, .weight_decay = s.weight_decay, .nesterov = s.nesterov},
        names));
  if (s.name == "adagrad")
    return detail::wrap<Tensor>(lather::Adagrad<Tensor, ExecSpace>(
        p, lather::AdagradOptions{.lr = s.lr, .weight_decay = s.weight_decay, .eps = s.eps}, names));
  if (s.name == "rmsprop")
    return detail::wrap<Tensor>(lather::RMSprop<Tensor, ExecSpace>(
        p, lather::RMSpropOptions{.lr = s.lr, .alpha = s.betas[1], .eps = s.eps, .weight_decay = s.weight_decay},
        names));
  if (s.name == "adam")
    return detail::wrap<Tensor>(lather::Adam<Tensor, ExecSpace>(
        p, lather::AdamOptions{.lr = s.lr, .betas = s.betas, .eps = s.eps, .weight_decay = s.weight_decay}, names));
  if (s.name == "adamw")
    return detail::wrap<Tensor>(lather::AdamW<Tensor, ExecSpace>(
        p, lather::AdamWOptions{.lr = s.lr, .betas = s.betas, .eps = s.eps, .weight_decay = s.weight_decay}, names));
  // Adafactor with an external learning rate (the trainer's schedule), as HuggingFace recommends
  // for it: relative_step and scale_parameter off, no first moment.
  if (s.name == "adafactor")
    return detail::wrap<Tensor>(lather::Adafactor<Tensor, ExecSpace>(
        p,
        lather::AdafactorOptions{.lr = s.lr, .beta1 = 0.0, .weight_decay = s.weight_decay, .scale_parameter = false,
                                 .relative_step = false},
        names));
  if (s.name == "came")
    return detail::wrap<Tensor>(lather::CAME<Tensor, ExecSpace>(
        p, lather::CAMEOptions{.lr = s.lr, .betas = {s.betas[0], s.betas[1], 0.9999}, .weight_decay = s.weight_decay},
        names));
  if (s.name == "lamb")
    return detail::wrap<Tensor>(lather::Lamb<Tensor, ExecSpace>(
        p, lather::LambOptions{.lr = s.lr, .betas = s.betas, .eps = s.eps, .weight_decay = s.weight_decay}, names));
  if (s.name == "galore")
    return detail::wrap<Tensor>(lather::GaLoreAdamW<Tensor, ExecSpace>(
        p,
        lather::GaLoreOptions{.lr = s.lr, .betas = s.betas, .eps = s.eps, .weight_decay = s.weight_decay,
                              .rank = s.galore_rank, .update_proj_gap = s.galore_update_proj_gap,
                              .scale = s.galore_scale, .quantize_states = s.galore_8bit},
        names));
  if (s.name == "shampoo") {
    if (s.root_inverse == "eigen") return detail::make_shampoo<Tensor, ExecSpace>(params, names, s, lather::EigenRootInverse{});
    if (s.root_inverse == "newton")
      return detail::make_shampoo<Tensor, ExecSpace>(params, names, s, lather::CoupledNewtonRootInverse{});
    if (s.root_inverse == "higher-order")
      return detail::make_shampoo<Tensor, ExecSpace>(params, names, s, lather::CoupledHigherOrderRootInverse{});
    throw std::invalid_argument("unknown --root-inverse '" + s.root_inverse + "' (choose eigen, newton or higher-order)");
  }
  throw std::invalid_argument("unknown optimizer '" + s.name +
                              "' (choose sgd, adagrad, rmsprop, adam, adamw, shampoo, adafactor, came, lamb or galore)");
}

}  // namespace fmnist

#endif
