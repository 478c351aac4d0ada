// SPDX-License-Identifier: Apache-2.0
// The trainer's settings as plain data: filled by the command line (cli.cpp, the only file that
// sees CLI11) and read by the training code. No Kokkos here.
#ifndef LATHER_EXAMPLES_FMNIST_OPTIONS_HPP
#define LATHER_EXAMPLES_FMNIST_OPTIONS_HPP

#include <array>
#include <cstdint>
#include <string>
#include <vector>

namespace fmnist {

/// One optimizer's settings. Names follow PyTorch / DistributedShampoo.
struct OptimizerSettings {
  std::string name = "adamw";  ///< sgd, adagrad, rmsprop, adam, adamw, shampoo, adafactor, came, lamb, galore
  double lr = 1e-3;
  std::array<double, 2> betas = {0.9, 0.999};
  double eps = 1e-8;
  double weight_decay = 1e-4;
  double momentum = 0.9;  ///< sgd (and rmsprop when > 0)
  bool nesterov = false;
  // Shampoo
  std::string grafting = "adam";       ///< none, sgd, adagrad, rmsprop, adam
  std::string root_inverse = "eigen";  ///< eigen, newton, higher-order
  double shampoo_beta2 = 0.999;        ///< the factors' EMA (DistributedShampoo's betas[1])
  double shampoo_epsilon = 1e-12;
  double grafting_beta2 = 0.999;
  double grafting_epsilon = 1e-8;
  std::int64_t precondition_frequency = 20;
  std::int64_t start_preconditioning_step = -1;
  std::int64_t max_preconditioner_dim = 1024;
  /// Packed factors halve their memory but are unpacked for every BLAS call; the trainer's
  /// factors are small, so it stores them full by default.
  bool use_symmetric_packing = false;
  // GaLore-AdamW (projected weight matrices; biases get plain AdamW)
  std::int64_t galore_rank = 64;
  std::int64_t galore_update_proj_gap = 200;
  double galore_scale = 0.25;
  bool galore_8bit = false;

  /// A one-line description for logs and tables.
  [[nodiscard]] std::string describe() const;
};

/// Everything one run needs.
struct TrainSettings {
  std::string model = "mlp";  ///< mlp or cnn
  std::vector<int> mlp_hidden = {512, 256};  ///< the MLP's hidden widths
  std::string data_dir = "/usr/share/datasets/fashion-mnist";
  int epochs = 10;
  int batch_size = 128;  ///< global batch (split over MPI ranks)
  double warmup_epochs = 0.5;
  double final_lr_fraction = 0.0;  ///< cosine decays to lr * this
  std::uint64_t seed = 1;
  int train_limit = 0;  ///< use only the first N training samples (0: all)
  int test_limit = 0;
  std::string csv;         ///< per-epoch curves; empty: none
  bool progress = true;    ///< the per-epoch progress bar (only on a terminal)
  std::vector<OptimizerSettings> optimizers;  ///< one run each (compare mode: several)
  std::string plot;        ///< comparison plot (PNG); empty: none
  std::string table;       ///< comparison table (Markdown); empty: stdout only
  double target_accuracy = 0;  ///< reached-at column; 0: the first optimizer's best
  int threads = 0;             ///< host threads for Kokkos (0: Kokkos' default)
};

/// Parses the command line into `s`. Returns -1 to go on, or the exit code (help, bad input);
/// messages are printed only when `print` (rank 0).
int parse_command_line(int argc, char** argv, TrainSettings& s, bool print);

}  // namespace fmnist

#endif
