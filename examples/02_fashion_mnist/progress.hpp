// SPDX-License-Identifier: Apache-2.0
// A one-line progress bar with ETA on stderr, drawn only when stderr is a terminal (logs and CI
// output stay clean).
#ifndef LATHER_EXAMPLES_FMNIST_PROGRESS_HPP
#define LATHER_EXAMPLES_FMNIST_PROGRESS_HPP

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <string>

namespace fmnist {

class Progress {
 public:
  Progress(bool enabled, int epoch, int epochs, std::int64_t total)
      : m_active(enabled && isatty(fileno(stderr)) != 0), m_epoch(epoch), m_epochs(epochs), m_total(total),
        m_start(std::chrono::steady_clock::now()) {}
  Progress(const Progress&) = delete;
  Progress& operator=(const Progress&) = delete;
  ~Progress() { finish(); }

  [[nodiscard]] bool active() const { return m_active; }

  void update(std::int64_t done, double loss) {
    if (!m_active) return;
    const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - m_start).count();
    const double eta = done > 0 ? elapsed * double(m_total - done) / double(done) : 0.0;
    constexpr int width = 30;
    const int filled = static_cast<int>(width * done / std::max<std::int64_t>(m_total, 1));
    std::string bar(static_cast<std::size_t>(filled), '=');
    if (filled < width) bar += '>' + std::string(static_cast<std::size_t>(width - filled - 1), ' ');
    std::fprintf(stderr, "\r  epoch %d/%d [%s] %lld/%lld  loss %.4f  %5.1f s  ETA %5.1f s ", m_epoch, m_epochs,
                 bar.c_str(), static_cast<long long>(done), static_cast<long long>(m_total), loss, elapsed, eta);
    std::fflush(stderr);
    m_drawn = true;
  }

  /// Clears the line.
  void finish() {
    if (!m_drawn) return;
    std::fprintf(stderr, "\r%*s\r", 100, "");
    std::fflush(stderr);
    m_drawn = false;
  }

 private:
  bool m_active;
  bool m_drawn = false;
  int m_epoch, m_epochs;
  std::int64_t m_total;
  std::chrono::steady_clock::time_point m_start;
};

}  // namespace fmnist

#endif
