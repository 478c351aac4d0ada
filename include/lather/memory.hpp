// SPDX-License-Identifier: Apache-2.0
/// \file
/// \brief Whether optimizer state in host memory asks Linux for transparent huge pages.
///
/// Shampoo carves its factor matrices and per-element state out of a few large allocations
/// (impl::StateArena) that can be advised MADV_HUGEPAGE before their first write. Where that
/// works (bare metal, VMs on the CPU's nested paging) a steady step at block size 256 is 1-3%
/// shorter; on a shadow-paging VM (PVM) the huge-page writes stalled every pass over the
/// caller's 4 KiB-page arrays, and resnet50's step grew by a third (docs/performance.md, tuning
/// guide item 10; `lather_thp_probe` tells such a machine in 20 s). The gain is small and the
/// loss large, so the advice is off unless asked for, as PyTorch's THP_MEM_ALLOC_ENABLE is.
/// The choice belongs to the machine, not to an optimizer: one setting per process.
#ifndef LATHER_MEMORY_HPP
#define LATHER_MEMORY_HPP

#include <lather/error.hpp>

#include <atomic>
#include <cstdlib>
#include <cstring>

namespace lather {

/// The process-wide huge-page choice for optimizer state (set_huge_pages).
enum class HugePages {
  from_environment,  ///< `LATHER_HUGE_PAGES`: "1" on; unset, empty or "0" off (the default)
  off,               ///< never advise (ignores the environment)
  on,                ///< advise where the system offers transparent huge pages (ignores the environment)
};

namespace impl {
inline std::atomic<HugePages> huge_pages_choice{HugePages::from_environment};
}  // namespace impl

/// \brief Sets the huge-page choice for optimizer state allocated from now on (state that exists
/// keeps its pages). `from_environment` (the initial choice) defers to `LATHER_HUGE_PAGES`.
inline void set_huge_pages(HugePages choice) noexcept { impl::huge_pages_choice.store(choice); }

/// \brief The choice as set (`from_environment` unless set_huge_pages said otherwise).
[[nodiscard]] inline HugePages huge_pages() noexcept { return impl::huge_pages_choice.load(); }

/// \brief Whether state allocated now asks for huge pages: the set choice, or the environment's.
/// Throws lather::invalid_argument for a `LATHER_HUGE_PAGES` other than "0", "1" or empty (read
/// at each call, so before an optimizer allocates anything).
[[nodiscard]] inline bool huge_pages_enabled() {
  switch (huge_pages()) {
    case HugePages::off:
      return false;
    case HugePages::on:
      return true;
    case HugePages::from_environment:
      break;
  }
  const char* e = std::getenv("LATHER_HUGE_PAGES");
  if (e == nullptr || *e == '\0' || std::strcmp(e, "0") == 0) return false;
  LATHER_THROW_IF(std::strcmp(e, "1") != 0, "lather: the environment variable LATHER_HUGE_PAGES is '", e,
                  "'; set it to 1 (optimizer state on transparent huge pages) or 0 (not, the default), or "
                  "unset it, or call lather::set_huge_pages");
  return true;
}

}  // namespace lather

#endif
