// SPDX-License-Identifier: Apache-2.0
// What a training run produces, and the reports made from it (CSV, comparison table, plot).
// Plain C++: report.cpp compiles without Kokkos.
#ifndef LATHER_EXAMPLES_FMNIST_RESULTS_HPP
#define LATHER_EXAMPLES_FMNIST_RESULTS_HPP

#include "options.hpp"

#include <cstdint>
#include <string>
#include <vector>

namespace fmnist {

struct EpochRecord {
  int epoch = 0;              ///< 1-based; 0 is the initial model
  std::int64_t steps = 0;     ///< optimizer steps so far
  double lr = 0;              ///< at the epoch's last step
  double train_loss = 0;      ///< mean over the epoch's batches
  double train_accuracy = 0;  ///< fraction of the epoch's samples classified correctly (before each step)
  double test_loss = 0;
  double test_accuracy = 0;
  double epoch_seconds = 0;  ///< training time of this epoch (no evaluation)
  double train_seconds = 0;  ///< training time since the start (no evaluation)
};

struct RunResult {
  OptimizerSettings settings;
  std::string label;
  std::vector<EpochRecord> epochs;  ///< [0] is the initial model
  std::string failure;              ///< why training stopped early (empty: it did not)
  [[nodiscard]] double seconds_per_step() const {
    const auto& e = epochs.back();
    return e.steps > 0 ? e.train_seconds / static_cast<double>(e.steps) : 0.0;
  }
};

/// Writes every run's curves to a CSV file (one row per run and epoch).
void write_csv(const std::string& path, const TrainSettings& s, const std::vector<RunResult>& runs);

/// The side-by-side comparison: test accuracy per epoch, epochs and training time to reach the
/// target accuracy (the first run's best unless s.target_accuracy is set), time per step.
[[nodiscard]] std::string comparison_table(const TrainSettings& s, const std::vector<RunResult>& runs);

/// Plots test accuracy and test loss against epochs and against training time into a PNG with
/// gnuplot. The gnuplot script (data inline) is kept next to it as `<png>.gp` for restyling.
/// Returns an empty string, or why no plot was made.
[[nodiscard]] std::string plot_png(const std::string& png, const std::vector<RunResult>& runs);

}  // namespace fmnist

#endif
