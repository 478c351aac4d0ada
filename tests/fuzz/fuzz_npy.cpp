// SPDX-License-Identifier: Apache-2.0
// libFuzzer target: lather-replay's .npy reader (tools/replay/replay.hpp parse_npy). Malformed
// input must end in the tool's own error (std::runtime_error), never a crash, a sanitizer
// report, a huge allocation or another exception.
#include "replay.hpp"

#include "fuzz_common.hpp"

#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string_view>

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  lather::fuzz::init_kokkos();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  try {
    const auto a = replay::parse_npy<double>(text, "fuzz.npy");
    const auto f = replay::parse_npy<float>(text, "fuzz.npy");
    if (a.size() != f.size() || a.shape().size() != f.shape().size())
      lather::fuzz::invariant_failed("float and double reads disagree on the shape");
  } catch (const std::runtime_error&) {
  }
  return 0;
}
