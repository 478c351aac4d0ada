// SPDX-License-Identifier: Apache-2.0
// lather-replay's parsers (tools/replay/replay.hpp) and the fuzzers' corpora: hostile .npy
// headers and case.json option values end in the tool's own errors, and every committed fuzz
// input (tests/fuzz/corpus/<target>/, including the regression inputs of crashes the fuzzers
// found) is handled here too, so the regular suite catches a regression without libFuzzer.
#include "replay.hpp"

#include <lather/io/checkpoint.hpp>

#include <doctest/doctest.h>

#include <algorithm>
#include <filesystem>
#include <optional>
#include <fstream>
#include <stdexcept>
#include <string>

namespace {

namespace fs = std::filesystem;
using doctest::Contains;

std::string npy(const std::string& dict, std::size_t data_bytes, char version = 1) {
  std::string h = "\x93NUMPY";
  h += version;
  h += '\0';
  std::string text = dict;
  const std::size_t prefix = version == 1 ? 10 : 12;
  while ((prefix + text.size() + 1) % 64 != 0) text += ' ';
  text += '\n';
  h += static_cast<char>(text.size() & 0xFF);
  h += static_cast<char>((text.size() >> 8) & 0xFF);
  if (version != 1) h += std::string(2, '\0');
  return h + text + std::string(data_bytes, '\0');
}

std::string read_file(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

}  // namespace

TEST_CASE("replay: the .npy reader checks every size before allocating") {
  const auto a = replay::parse_npy<double>(npy("{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }", 24), "a");
  CHECK(a.shape().size() == 2);
  CHECK(a.size() == 6);
  CHECK(replay::parse_npy<float>(npy("{'descr': '<f8', 'fortran_order': False, 'shape': (), }", 8, 2), "s").size() == 1);
  CHECK(replay::parse_npy<double>(npy("{'descr': '<f8', 'fortran_order': False, 'shape': (0, 5), }", 0), "z").size() == 0);
  CHECK_THROWS_WITH_AS(
      replay::parse_npy<double>(npy("{'descr': '<f8', 'fortran_order': False, 'shape': (100000000000000,), }", 16), "h"),
      Contains("truncated or corrupt .npy"), std::runtime_error);
  CHECK_THROWS_WITH_AS(
      replay::parse_npy<double>(
          npy("{'descr': '<f8', 'fortran_order': False, 'shape': (4294967296, 4294967296, 16), }", 16), "o"),
      Contains("too large to address"), std::runtime_error);
  CHECK_THROWS_WITH_AS(
      replay::parse_npy<double>(npy("{'descr': '<f8', 'fortran_order': False, 'shape': (1000000000000,), }", 16), "m"),
      Contains("describes far more"), std::runtime_error);
  // Empty (a zero extent) but with the other extents' product past the address space: building the
  // array would overflow its strides (fuzz_npy crash input, kept in the corpus as well).
  CHECK_THROWS_WITH_AS(
      replay::parse_npy<double>(
          npy("{'descr': '<f8', 'fortran_order': False, 'shape': (2147483044068, 0, 728, 4, 728, 44294, 667297, 2, 79976), }",
              0),
          "e"),
      Contains("too large to address"), std::runtime_error);
  CHECK_THROWS_WITH_AS(
      replay::parse_npy<double>(npy("{'descr': '<f8', 'fortran_order': False, 'shape': (99999999999999999999999,), }", 8), "d"),
      Contains("too large"), std::runtime_error);
  CHECK_THROWS_WITH_AS(replay::parse_npy<double>(npy("{'descr': '<i4', 'fortran_order': False, 'shape': (2,), }", 8), "i"),
                       Contains("unsupported dtype '<i4'"), std::runtime_error);
  CHECK_THROWS_WITH_AS(replay::parse_npy<double>(npy("{'descr': '<f8', 'fortran_order': True, 'shape': (1,), }", 8), "f"),
                       Contains("Fortran-order"), std::runtime_error);
  CHECK_THROWS_WITH_AS(replay::parse_npy<double>(npy("{'descr': '<f8', 'shape': (1,), }", 8), "m"),
                       Contains("lacks"), std::runtime_error);
  CHECK_THROWS_WITH_AS(replay::parse_npy<double>(npy("{'descr': '<f8', 'fortran_order': False, 'shape': (1,), }", 8, 4), "v"),
                       Contains("unsupported .npy format version 4"), std::runtime_error);
  CHECK_THROWS_WITH_AS(replay::parse_npy<double>(std::string("\x93NUMPY\x01\x00\xff\xff{", 11), "t"),
                       Contains("truncated .npy header"), std::runtime_error);
  CHECK_THROWS_WITH_AS(replay::parse_npy<double>("PK\x03\x04 not npy", "zip"), Contains("not a .npy file"),
                       std::runtime_error);
}

TEST_CASE("replay: case.json values of the wrong type or range are the tool's errors") {
  auto options = [](const std::string& optimizer) {
    const std::string text = R"({"optimizer": )" + optimizer + R"(, "params": [], "steps": 1, "grads": []})";
    return replay::parse_optimizer(replay::parse_case(text, "d", "d/case.json").optimizer);
  };
  CHECK(options(R"({"name": "adam", "lr": 0.5})").adam.lr == 0.5);
  CHECK(options(R"({"lr": 0.5, "num_tolerated_failed_amortized_computations": 7.0})")
            .shampoo.num_tolerated_failed_amortized_computations == 7);
  CHECK_THROWS_WITH_AS(options(R"({"lr": 1, "num_tolerated_failed_amortized_computations": 1e300})"),
                       Contains("must be an integer in the range of int"), std::runtime_error);
  CHECK_THROWS_WITH_AS(options(R"({"lr": 1, "inv_root_override": [1.5e10]})"),
                       Contains("must be an integer in the range of int"), std::runtime_error);
  CHECK_THROWS_WITH_AS(options(R"({"lr": 1, "inverse_exponent_override": {"two": 0.5}})"),
                       Contains("key 'two' must be an integer"), std::runtime_error);
  CHECK_THROWS_WITH_AS(options(R"({"lr": 1, "weight_decay_type": 3})"), Contains("'weight_decay_type' must be"),
                       std::runtime_error);
  CHECK_THROWS_WITH_AS(options(R"({"name": 5})"), Contains("'name' must be a string"), std::runtime_error);
  CHECK_THROWS_WITH_AS(options(R"({"name": "adam", "betas": ["a", 1]})"), Contains("list of two numbers"),
                       std::runtime_error);
  CHECK_THROWS_WITH_AS(options(R"([1])"), Contains("'optimizer' must be a JSON object"), std::runtime_error);
  CHECK_THROWS_WITH_AS(replay::parse_case(R"({"optimizer": {}, "params": [1], "steps": 1, "grads": []})", "d", "c.json"),
                       Contains("c.json: [json.exception.type_error"), std::runtime_error);
  CHECK_THROWS_WITH_AS(replay::parse_case(R"({"optimizer": {}, "params": [], "steps": 1e10, "grads": []})", "d", "c.json"),
                       Contains("'steps' must be a non-negative integer"), std::runtime_error);
  CHECK_THROWS_WITH_AS(replay::parse_case("[]", "d", "c.json"), Contains("must be a JSON object"), std::runtime_error);
  // Found by fuzz_case_json (tests/fuzz/corpus/fuzz_case_json/regression-number-overflow.json):
  // nlohmann throws out_of_range, not parse_error, for a number beyond double.
  CHECK_THROWS_WITH_AS(replay::parse_case(R"({"optimizer": {"lr": 1e309}})", "d", "c.json"),
                       Contains("c.json: invalid JSON: [json.exception.out_of_range.406]"), std::runtime_error);
}

// Every committed fuzz input: accepted, or refused with the parser's own error type.
TEST_CASE("fuzz corpora: every committed input is handled (regression run without libFuzzer)") {
  const fs::path corpus = LATHER_FUZZ_CORPUS_DIR;
  int seen = 0;
  for (const auto& e : fs::directory_iterator(corpus / "fuzz_checkpoint")) {
    CAPTURE(e.path());
    const std::string bytes = read_file(e.path());
    try {
      (void)lather::deserialize_state_dict(std::as_bytes(std::span(bytes)), e.path().string());
    } catch (const lather::invalid_argument&) {
    }
    // fuzz_checkpoint's invariant too: what parses writes back to the same bytes, up to the CRC.
    std::optional<lather::StateDict> d;
    try {
      d = lather::impl::parse_checkpoint(std::as_bytes(std::span(bytes)), e.path().string(), false);
    } catch (const lather::invalid_argument&) {
    }
    if (d) {
      const auto again = lather::serialize_state_dict(*d);  // outside the try: it must not throw
      REQUIRE(again.size() == bytes.size());
      CHECK(std::equal(again.begin(), again.end() - 4, std::as_bytes(std::span(bytes)).begin()));
    }
    ++seen;
  }
  for (const auto& e : fs::directory_iterator(corpus / "fuzz_npy")) {
    CAPTURE(e.path());
    try {
      (void)replay::parse_npy<double>(read_file(e.path()), e.path().string());
    } catch (const std::runtime_error&) {
    }
    ++seen;
  }
  for (const auto& e : fs::directory_iterator(corpus / "fuzz_case_json")) {
    CAPTURE(e.path());
    try {
      (void)replay::parse_optimizer(replay::parse_case(read_file(e.path()), "d", e.path().string()).optimizer);
    } catch (const std::runtime_error&) {
    }
    ++seen;
  }
  CHECK(seen > 10);
}
