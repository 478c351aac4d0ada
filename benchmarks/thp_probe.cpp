// SPDX-License-Identifier: Apache-2.0
// lather_thp_probe: does this machine slow down passes over ordinary (4 KiB-page) memory while a
// process also writes memory on transparent huge pages? Shampoo can keep its state on huge pages
// (impl::StateArena; off by default, LATHER_HUGE_PAGES=1 or lather::set_huge_pages turns it on),
// and the user's parameters and gradients usually sit on 4 KiB pages. On the PVM-based VMs of
// 2026-12-02 (a guest of shadow paging: "kvm-pvm" in the kernel log) passes over the 4 KiB
// memory took 10-35x their time
// every second or so while a huge-page region was being written, and never without one
// (docs/performance.md, "Huge pages on a shadow-paging VM"). No lather code: the probe measures
// the machine, so that a slow step can be told from a slow VM before anything is tuned, and
// huge pages turned on only where they do not stall.
//
//   lather_thp_probe [seconds per run]      (default 4; two runs of each kind, alternating)
//
// Each run is a child process: a 100 MiB "gradient" array on 4 KiB pages (MADV_NOHUGEPAGE) and a
// 400 MiB "state" region, advised MADV_HUGEPAGE or MADV_NOHUGEPAGE, both written once. Then,
// until the time is up: 200 ms of arithmetic without memory (the products of a step), one
// read-modify-write pass over the state, one timed read pass over the gradient (the NaN/Inf
// screen's count), one write pass over it. Printed per run: the read passes' minimum, median and
// maximum, and how many took over 3x the minimum.
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

namespace {

double now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// A region of `bytes` (a multiple of 2 MiB, 2 MiB aligned so that the advice can take whole
// pages), advised before its first write.
std::uint32_t* region(std::size_t bytes, bool huge) {
  void* p = std::aligned_alloc(std::size_t{2} << 20, bytes);
  if (p == nullptr) {
    std::fprintf(stderr, "lather_thp_probe: cannot allocate %zu bytes\n", bytes);
    std::exit(2);
  }
  madvise(p, bytes, huge ? MADV_HUGEPAGE : MADV_NOHUGEPAGE);  // advice only: failure changes nothing measured
  std::memset(p, 1, bytes);
  return static_cast<std::uint32_t*>(p);
}

// The count of floats whose exponent bits are all ones (vectorizes; reads every line).
std::int64_t count_nonfinite(const std::uint32_t* x, std::size_t n) {
  std::int64_t c = 0;
  for (std::size_t i = 0; i < n; ++i) c += (x[i] & 0x7f800000u) == 0x7f800000u;
  return c;
}

void rewrite(std::uint32_t* x, std::size_t n, std::uint32_t salt) {
  for (std::size_t i = 0; i < n; ++i) x[i] = (x[i] ^ salt) & 0x3fffffffu;
}

volatile double g_sink;
volatile std::int64_t g_found;

void arithmetic(double seconds) {
  const double start = now();
  double x = 1.0;
  while (now() - start < seconds)
    for (int i = 0; i < 4096; ++i) x = x * 1.0000001 + 1e-12;
  g_sink = x;
}

int run(bool huge_state, double seconds) {
  constexpr std::size_t grad_bytes = std::size_t{100} << 20, state_bytes = std::size_t{400} << 20;
  std::uint32_t* grad = region(grad_bytes, false);
  std::uint32_t* state = region(state_bytes, huge_state);
  std::vector<double> passes;
  const double start = now();
  for (std::uint32_t k = 0; now() - start < seconds; ++k) {
    arithmetic(0.2);
    rewrite(state, state_bytes / 4, k);
    const double t0 = now();
    g_found = g_found + count_nonfinite(grad, grad_bytes / 4);  // kept: volatile
    passes.push_back(now() - t0);
    rewrite(grad, grad_bytes / 4, k);
  }
  std::vector<double> sorted = passes;
  std::sort(sorted.begin(), sorted.end());
  const double lo = sorted.front();
  const auto stalls = std::count_if(passes.begin(), passes.end(), [&](double t) { return t > 3 * lo; });
  std::printf(
      "state on %-10s %3zu passes over 100 MiB: min %6.1f ms, median %6.1f, max %6.1f; over 3x min: %ld\n",
      huge_state ? "huge pages" : "4 KiB", passes.size(), lo * 1e3, sorted[sorted.size() / 2] * 1e3,
      sorted.back() * 1e3, static_cast<long>(stalls));
  std::fflush(stdout);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const double seconds = argc > 1 ? std::atof(argv[1]) : 4.0;
  if (!(seconds > 0)) {
    std::fprintf(stderr, "usage: lather_thp_probe [seconds per run > 0]\n");
    return 2;
  }
  std::FILE* thp = std::fopen("/sys/kernel/mm/transparent_hugepage/enabled", "r");
  char setting[128] = "(no sysfs file)";
  if (thp != nullptr) {
    if (std::fgets(setting, sizeof setting, thp) == nullptr) std::strcpy(setting, "(unreadable)");
    std::fclose(thp);
  }
  setting[std::strcspn(setting, "\n")] = '\0';
  std::printf("transparent_hugepage/enabled: %s\n", setting);
  // Separate processes: a region freed by one run does not carry its pages into the next.
  for (int round = 0; round < 2; ++round)
    for (const bool huge : {false, true}) {
      std::fflush(stdout);
      const pid_t child = fork();
      if (child < 0) {
        std::perror("lather_thp_probe: fork");
        return 2;
      }
      if (child == 0) std::_Exit(run(huge, seconds));
      int status = 0;
      waitpid(child, &status, 0);
      if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) return 1;
    }
  return 0;
}
