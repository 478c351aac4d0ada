// SPDX-License-Identifier: Apache-2.0
// lather-train's command line (CLI11). Kept apart from the Kokkos code: it is plain C++.
#include "options.hpp"

#include <CLI/CLI.hpp>

#include <cstdio>
#include <sstream>

namespace fmnist {

std::string OptimizerSettings::describe() const {
  std::ostringstream s;
  s << name;
  if (name == "galore") s << "(rank " << galore_rank << (galore_8bit ? ", 8-bit" : "") << ')';
  if (name == "shampoo") {
    s << '(' << grafting << " grafting";
    if (root_inverse != "eigen") s << ", " << root_inverse;
    s << ", every " << precondition_frequency << ')';
  }
  s << " lr=" << lr;
  return s.str();
}

int parse_command_line(int argc, char** argv, TrainSettings& s, bool print) {
  CLI::App app{
      "lather-train: Fashion-MNIST with lather's optimizers (MLP or CNN, Kokkos forward/backward).\n"
      "Run it under mpiexec for data-parallel training: each rank takes a slice of every global batch."};
  app.option_defaults()->always_capture_default();
  OptimizerSettings o;
  std::vector<std::string> names{"adamw"};
  std::vector<double> lrs;
  bool compare = false, full = false, no_progress = false;
  double adamw_lr = 1e-3, shampoo_lr = 2e-3;  // each the best of docs/results.md's grid

  app.add_option("--model", s.model, "model")->check(CLI::IsMember({"mlp", "cnn"}));
  app.add_option("--hidden", s.mlp_hidden, "the MLP's hidden layer widths")->check(CLI::PositiveNumber);
  app.add_option("--data-dir", s.data_dir, "directory with the four Fashion-MNIST .gz files");
  app.add_option("--epochs", s.epochs, "passes over the training set")->check(CLI::PositiveNumber);
  app.add_option("--batch-size", s.batch_size, "global batch size (split over MPI ranks)")->check(CLI::PositiveNumber);
  app.add_option("--warmup-epochs", s.warmup_epochs, "linear learning-rate warm-up")->check(CLI::NonNegativeNumber);
  app.add_option("--final-lr-fraction", s.final_lr_fraction, "cosine schedule ends at lr times this")
      ->check(CLI::Range(0.0, 1.0));
  app.add_option("--seed", s.seed, "initialization and shuffling seed");
  app.add_option("--train-limit", s.train_limit, "use only the first N training samples (0: all 60000)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--test-limit", s.test_limit, "use only the first N test samples (0: all 10000)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--threads", s.threads, "host threads for Kokkos (0: Kokkos' default)")->check(CLI::NonNegativeNumber);
  app.add_option("--csv", s.csv, "write the per-epoch curves of every run to this CSV file");
  app.add_option("--plot", s.plot, "write a PNG plot of the curves (gnuplot)");
  app.add_option("--table", s.table, "write the comparison table (Markdown) to this file");
  app.add_option("--target-accuracy", s.target_accuracy,
                 "accuracy (0..1) for the 'epochs to target' column (default: the first run's best)")
      ->check(CLI::Range(0.0, 1.0));
  app.add_flag("--no-progress", no_progress, "no progress bar");

  auto* opt = app.add_option_group("optimizer", "Optimizer (names as in PyTorch and DistributedShampoo)");
  opt->add_option("--optimizer", names, "one run per optimizer (and per --lr)")
      ->check(CLI::IsMember({"sgd", "adagrad", "rmsprop", "adam", "adamw", "shampoo", "adafactor", "came", "lamb",
                             "galore"}));
  opt->add_option("--lr", lrs, "peak learning rate(s); several give one run each (default 1e-3; sgd 0.05, adagrad 0.01)")
      ->check(CLI::PositiveNumber);
  // A vector, not the std::array itself: nvcc's front end finds CLI11's conversions for
  // std::array ambiguous (seen with nvcc 13 and CLI11 2.3).
  std::vector<double> betas{o.betas[0], o.betas[1]};
  opt->add_option("--betas", betas,
                  "beta1 beta2 (Adam, AdamW, LAMB, GaLore, CAME's first two; RMSprop's alpha = beta2; Shampoo's beta1)")
      ->expected(2)
      ->check(CLI::Range(0.0, 1.0));
  opt->add_option("--eps", o.eps, "Adam / AdamW / Adagrad / RMSprop epsilon")->check(CLI::PositiveNumber);
  opt->add_option("--weight-decay", o.weight_decay, "decoupled for AdamW and Shampoo, L2 otherwise")
      ->check(CLI::NonNegativeNumber);
  opt->add_option("--momentum", o.momentum, "SGD momentum")->check(CLI::Range(0.0, 1.0));
  opt->add_flag("--nesterov", o.nesterov, "SGD Nesterov momentum");
  auto* sh = app.add_option_group("shampoo", "Shampoo");
  sh->add_option("--grafting", o.grafting, "grafting type")
      ->check(CLI::IsMember({"none", "sgd", "adagrad", "rmsprop", "adam"}));
  sh->add_option("--root-inverse", o.root_inverse, "root-inverse strategy")
      ->check(CLI::IsMember({"eigen", "newton", "higher-order"}));
  sh->add_option("--precondition-frequency", o.precondition_frequency, "steps between root computations")
      ->check(CLI::PositiveNumber);
  sh->add_option("--start-preconditioning-step", o.start_preconditioning_step, "-1: = precondition frequency");
  sh->add_option("--max-preconditioner-dim", o.max_preconditioner_dim, "block size")->check(CLI::PositiveNumber);
  sh->add_flag("--symmetric-packing", o.use_symmetric_packing, "store factors as packed upper triangles");
  sh->add_option("--shampoo-beta2", o.shampoo_beta2, "factor EMA (betas[1]; 1 = sum)")->check(CLI::Range(0.0, 1.0));
  sh->add_option("--shampoo-epsilon", o.shampoo_epsilon, "factor regularization")->check(CLI::PositiveNumber);
  sh->add_option("--grafting-beta2", o.grafting_beta2, "Adam / RMSprop grafting beta2")->check(CLI::Range(0.0, 1.0));
  sh->add_option("--grafting-epsilon", o.grafting_epsilon, "grafting epsilon")->check(CLI::PositiveNumber);

  auto* gl = app.add_option_group("galore", "GaLore-AdamW (--optimizer galore)");
  gl->add_option("--galore-rank", o.galore_rank, "projection rank of each weight matrix")->check(CLI::PositiveNumber);
  gl->add_option("--galore-update-proj-gap", o.galore_update_proj_gap, "steps between projection refreshes (SVD)")
      ->check(CLI::PositiveNumber);
  gl->add_option("--galore-scale", o.galore_scale, "scale of the projected-back update")->check(CLI::PositiveNumber);
  gl->add_flag("--galore-8bit", o.galore_8bit, "8-bit block-wise quantized Adam states");

  auto* cmp = app.add_option_group("comparison", "Comparison mode (what the README's main command runs)");
  cmp->add_flag("--compare", compare,
                "train AdamW and Shampoo from the same seed and initialization, print the side-by-side table and "
                "write results/compare.{csv,md,png} (defaults: 3 epochs, ~5 minutes on 2 cores)");
  cmp->add_flag("--full", full, "with --compare: 10 epochs (the docs/results.md run)");
  cmp->add_option("--adamw-lr", adamw_lr, "AdamW's learning rate in --compare")->check(CLI::PositiveNumber);
  cmp->add_option("--shampoo-lr", shampoo_lr, "Shampoo's learning rate in --compare")->check(CLI::PositiveNumber);

  try {
    app.parse(argc, argv);
    if (full && !compare) throw CLI::ValidationError("--full", "only applies with --compare");
    if (compare && (app.count("--optimizer") > 0 || app.count("--lr") > 0))
      throw CLI::ValidationError("--compare", "chooses the optimizers itself; use --adamw-lr / --shampoo-lr");
  } catch (const CLI::ParseError& e) {
    if (print) return app.exit(e);
    return e.get_exit_code();
  }
  o.betas = {betas[0], betas[1]};
  s.progress = !no_progress;
  s.optimizers.clear();
  if (compare) {
    if (app.count("--epochs") == 0) s.epochs = full ? 10 : 3;
    if (s.csv.empty()) s.csv = "results/compare.csv";
    if (s.table.empty()) s.table = "results/compare.md";
    if (s.plot.empty()) s.plot = "results/compare.png";
    OptimizerSettings a = o, b = o;
    a.name = "adamw";
    a.lr = adamw_lr;
    b.name = "shampoo";
    b.lr = shampoo_lr;
    s.optimizers = {a, b};
    return -1;
  }
  for (const auto& n : names) {
    const double fallback = n == "sgd" ? 0.05 : n == "adagrad" ? 0.01 : 1e-3;
    for (double lr : lrs.empty() ? std::vector<double>{fallback} : lrs) {
      OptimizerSettings x = o;
      x.name = n;
      x.lr = lr;
      s.optimizers.push_back(x);
    }
  }
  return -1;
}

}  // namespace fmnist
