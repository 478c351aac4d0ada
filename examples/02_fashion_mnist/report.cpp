// SPDX-License-Identifier: Apache-2.0
// CSV, comparison table and gnuplot plot of training runs (plain C++, no Kokkos).
#include "results.hpp"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <stdexcept>

namespace fmnist {

namespace {
std::string percent(double x) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f%%", 100 * x);
  return buf;
}
std::string fixed(double x, int digits) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", digits, x);
  return buf;
}
/// The first epoch whose test accuracy reaches `target`, or nullptr.
const EpochRecord* first_reaching(const RunResult& r, double target) {
  for (const auto& e : r.epochs)
    if (e.epoch > 0 && e.test_accuracy >= target) return &e;
  return nullptr;
}
const EpochRecord& best_of(const RunResult& r) {
  const EpochRecord* best = &r.epochs.front();
  for (const auto& e : r.epochs)
    if (e.test_accuracy > best->test_accuracy) best = &e;
  return *best;
}
}  // namespace

void write_csv(const std::string& path, const TrainSettings& s, const std::vector<RunResult>& runs) {
  std::ofstream out(path);
  if (!out) throw std::runtime_error("cannot write --csv file " + path);
  out << "run,optimizer,lr,model,batch_size,seed,epoch,steps,epoch_lr,train_loss,train_accuracy,test_loss,"
         "test_accuracy,epoch_seconds,train_seconds\n";
  for (std::size_t i = 0; i < runs.size(); ++i)
    for (const auto& e : runs[i].epochs)
      out << i << ",\"" << runs[i].label << "\"," << runs[i].settings.lr << ',' << s.model << ',' << s.batch_size << ','
          << s.seed << ',' << e.epoch << ',' << e.steps << ',' << e.lr << ',' << e.train_loss << ','
          << e.train_accuracy << ',' << e.test_loss << ',' << e.test_accuracy << ',' << e.epoch_seconds << ','
          << e.train_seconds << '\n';
  if (!out) throw std::runtime_error("error writing --csv file " + path);
}

std::string comparison_table(const TrainSettings& s, const std::vector<RunResult>& runs) {
  std::ostringstream t;
  if (runs.empty()) return {};
  std::size_t rows = 0;
  for (const auto& r : runs) rows = std::max(rows, r.epochs.size());
  t << "| epoch |";
  for (const auto& r : runs) t << ' ' << r.label << " |";
  t << "\n|---:|";
  for (std::size_t i = 0; i < runs.size(); ++i) t << "---:|";
  t << '\n';
  for (std::size_t e = 0; e < rows; ++e) {
    t << "| " << e << " |";
    for (const auto& r : runs) t << ' ' << (e < r.epochs.size() ? percent(r.epochs[e].test_accuracy) : "-") << " |";
    t << '\n';
  }
  const auto& ref = runs.front();
  const auto& ref_best = best_of(ref);
  const double target = s.target_accuracy > 0 ? s.target_accuracy : ref_best.test_accuracy;
  t << "\nTarget test accuracy " << percent(target)
    << (s.target_accuracy > 0 ? " (--target-accuracy)"
                              : " (" + ref.label + "'s best, epoch " + std::to_string(ref_best.epoch) + ")")
    << ".\n\n| optimizer | best test acc | epochs to target | training time to target | time per step | training time |\n"
       "|---|---:|---:|---:|---:|---:|\n";
  for (const auto& r : runs) {
    const auto* hit = first_reaching(r, target);
    t << "| " << r.label << (r.failure.empty() ? "" : " (stopped: " + r.failure + ")") << " | "
      << percent(best_of(r).test_accuracy) << " | " << (hit ? std::to_string(hit->epoch) : "not reached") << " | "
      << (hit ? fixed(hit->train_seconds, 1) + " s" : "-") << " | " << fixed(1e3 * r.seconds_per_step(), 1)
      << " ms | " << fixed(r.epochs.back().train_seconds, 1) << " s |\n";
  }
  return t.str();
}

std::string plot_png(const std::string& png, const std::vector<RunResult>& runs) {
  const std::string script = png + ".gp";
  {
    std::ofstream g(script);
    if (!g) return "cannot write " + script;
    for (std::size_t i = 0; i < runs.size(); ++i) {
      g << "$run" << i << " << EOD\n# epoch train_seconds test_accuracy test_loss train_loss\n";
      for (const auto& e : runs[i].epochs)
        g << e.epoch << ' ' << e.train_seconds << ' ' << 100 * e.test_accuracy << ' ' << e.test_loss << ' '
          << e.train_loss << '\n';
      g << "EOD\n";
    }
    g << "set terminal pngcairo size 1400,1000 font ',11'\nset output '" << png << "'\n"
      << "set multiplot layout 2,2 title 'Fashion-MNIST: test accuracy and loss'\nset grid\nset key bottom right\n";
    const char* panels[4][4] = {{"1", "3", "epoch", "test accuracy (%)"},
                                {"2", "3", "training time (s)", "test accuracy (%)"},
                                {"1", "4", "epoch", "test loss"},
                                {"2", "4", "training time (s)", "test loss"}};
    for (int p = 0; p < 4; ++p) {
      g << "set xlabel '" << panels[p][2] << "'\nset ylabel '" << panels[p][3] << "'\n";
      g << (p < 2 ? "set key bottom right\n" : "set key top right\n");
      // Curves start at epoch 1: the untrained model (~10%, loss ~2.3) would flatten them.
      g << "plot ";
      for (std::size_t i = 0; i < runs.size(); ++i) {
        std::string title = runs[i].label;
        for (auto& c : title)
          if (c == '\'') c = '"';
        g << (i ? ", " : "") << "$run" << i << " using " << panels[p][0] << ':'
          << "($1 > 0 ? $" << panels[p][1] << " : NaN)"
          << " with linespoints lw 2 title '" << title << "'";
      }
      g << '\n';
    }
    g << "unset multiplot\n";
  }
  const std::string cmd = "gnuplot '" + script + "' 2>&1";
  std::FILE* pipe = popen(cmd.c_str(), "r");
  if (!pipe) return "cannot start gnuplot";
  std::string output;
  char buf[256];
  while (std::fgets(buf, sizeof buf, pipe)) output += buf;
  const int status = pclose(pipe);
  if (status != 0)
    return "gnuplot failed (install Debian's gnuplot-nox; scripts/setup-deps.sh does): " +
           (output.empty() ? std::string("exit status ") + std::to_string(status) : output);
  return {};
}

}  // namespace fmnist
