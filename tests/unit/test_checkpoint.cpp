// SPDX-License-Identifier: Apache-2.0
// Checkpoint files (include/lather/io/checkpoint.hpp): bit-identical round trips, every
// truncation and every single-bit flip rejected with lather::invalid_argument, a corrupt file
// leaves an optimizer unchanged, save -> load -> resume continues bit-identically, and the
// inputs the fuzzer found (tests/fuzz/corpus/fuzz_checkpoint/regression-*) stay rejected.
#include <lather/io/checkpoint.hpp>
#include <lather/optimizers/adam.hpp>
#include <lather/optimizers/shampoo.hpp>

#include <Kokkos_Core.hpp>

#include <doctest/doctest.h>

#include "exec_spaces.hpp"
#include "test_utils.hpp"

#include <bit>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <string>
#include <vector>

#include <unistd.h>

namespace {

namespace fs = std::filesystem;
using doctest::Contains;

fs::path scratch_dir() {
  const fs::path d = fs::temp_directory_path() / ("lather_checkpoint_tests_" + std::to_string(::getpid()));
  fs::create_directories(d);
  return d;
}

lather::StateDict sample_dict() {
  lather::StateDict d;
  d.format = "lather.Test.v1";
  d.tensors["f32"] = {{2, 3}, std::vector<float>{1.5f, -0.0f, std::numeric_limits<float>::denorm_min(),
                                                 std::numeric_limits<float>::infinity(), 3e38f, -7.25f}};
  d.tensors["f64"] = {{3}, std::vector<double>{0.1, std::numeric_limits<double>::quiet_NaN(), -1e-310}};
  d.tensors["i64"] = {{}, std::vector<std::int64_t>{std::numeric_limits<std::int64_t>::min()}};
  d.tensors["empty"] = {{0, 4}, std::vector<double>{}};
  return d;
}

// Bitwise equality (StateTensor's == is value equality, which NaN defeats).
bool bitwise_equal(const lather::StateDict& a, const lather::StateDict& b) {
  if (a.format != b.format || a.tensors.size() != b.tensors.size()) return false;
  for (const auto& [name, t] : a.tensors) {
    auto it = b.tensors.find(name);
    if (it == b.tensors.end() || it->second.shape != t.shape || it->second.values.index() != t.values.index())
      return false;
    const bool same = std::visit(
        [&](const auto& v) {
          const auto& w = std::get<std::decay_t<decltype(v)>>(it->second.values);
          return v.size() == w.size() && (v.empty() || std::memcmp(v.data(), w.data(), v.size() * sizeof(v[0])) == 0);
        },
        t.values);
    if (!same) return false;
  }
  return true;
}

void write_bytes(const fs::path& p, const std::vector<std::byte>& bytes) {
  std::ofstream out(p, std::ios::binary);
  out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
}

std::vector<std::byte> read_bytes(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::vector<char> c((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::vector<std::byte> b(c.size());
  std::memcpy(b.data(), c.data(), c.size());
  return b;
}

}  // namespace

TEST_CASE("checkpoint: round trips are bit-identical for float32, float64, int64, rank 0 and empty") {
  const lather::StateDict d = sample_dict();
  const auto bytes = lather::serialize_state_dict(d);
  CHECK(bitwise_equal(lather::deserialize_state_dict(bytes, "memory"), d));
  CHECK(lather::serialize_state_dict(lather::deserialize_state_dict(bytes, "memory")) == bytes);

  const lather::StateDict empty;
  CHECK(lather::deserialize_state_dict(lather::serialize_state_dict(empty), "memory") == empty);

  const fs::path file = scratch_dir() / "sample.ckpt";
  lather::save_checkpoint(file, d);
  CHECK(bitwise_equal(lather::load_checkpoint(file), d));
  // Saving again replaces the file atomically and leaves no temporary behind.
  lather::save_checkpoint(file, empty);
  CHECK(lather::load_checkpoint(file) == empty);
  int files = 0;
  for ([[maybe_unused]] const auto& e : fs::directory_iterator(file.parent_path())) ++files;
  CHECK(files == 1);
  fs::remove_all(file.parent_path());
}

TEST_CASE("checkpoint: every truncation and every single-bit flip is rejected") {
  lather::StateDict d;
  d.format = "lather.Adam.v1";
  d.tensors["state.0.exp_avg"] = {{2, 2}, std::vector<float>{1, 2, 3, 4}};
  d.tensors["state.0.step"] = {{}, std::vector<std::int64_t>{3}};
  const auto bytes = lather::serialize_state_dict(d);
  for (std::size_t n = 0; n < bytes.size(); ++n) {
    CAPTURE(n);
    CHECK_THROWS_AS((void)lather::deserialize_state_dict(std::span(bytes).first(n), "cut.ckpt"),
                    lather::invalid_argument);
  }
  for (std::size_t bit = 0; bit < bytes.size() * 8; ++bit) {
    CAPTURE(bit);
    auto flipped = bytes;
    flipped[bit / 8] ^= std::byte{static_cast<unsigned char>(1u << (bit % 8))};
    CHECK_THROWS_AS((void)lather::deserialize_state_dict(flipped, "flipped.ckpt"), lather::invalid_argument);
  }
  // Trailing bytes are rejected too.
  auto longer = bytes;
  longer.push_back(std::byte{0});
  CHECK_THROWS_WITH_AS((void)lather::deserialize_state_dict(longer, "long.ckpt"), Contains("unexpected bytes"),
                       lather::invalid_argument);
}

TEST_CASE("checkpoint: error messages name the file, the problem and what to do") {
  lather::StateDict d;
  d.format = "lather.Adam.v1";
  d.tensors["state.0.exp_avg"] = {{1024}, std::vector<float>(1024, 1.0f)};
  const auto bytes = lather::serialize_state_dict(d);
  const auto cut = std::span(bytes).first(bytes.size() - 4 - 4084);  // 12 value bytes left
  CHECK_THROWS_WITH_AS((void)lather::deserialize_state_dict(cut, "run/step100.ckpt"),
                       "lather: checkpoint 'run/step100.ckpt': truncated: entry 'state.0.exp_avg' needs 4096 bytes, "
                       "12 remain; the file is damaged or incomplete (or not a lather checkpoint): restore it from a "
                       "good copy or restart from an earlier checkpoint",
                       lather::invalid_argument);
  auto flipped = bytes;
  flipped[100] ^= std::byte{1};
  CHECK_THROWS_WITH_AS((void)lather::deserialize_state_dict(flipped, "x.ckpt"), Contains("CRC-32 mismatch"),
                       lather::invalid_argument);
  const std::string text = "{\"not\": \"a checkpoint\"}";
  CHECK_THROWS_WITH_AS((void)lather::deserialize_state_dict(std::as_bytes(std::span(text)), "x.json"),
                       Contains("not a lather checkpoint"), lather::invalid_argument);
  CHECK_THROWS_AS((void)lather::load_checkpoint(scratch_dir() / "does_not_exist.ckpt"), lather::runtime_error);
  CHECK_THROWS_AS(lather::save_checkpoint(scratch_dir() / "no_such_dir" / "x.ckpt", d), lather::runtime_error);
  lather::StateDict inconsistent;
  inconsistent.tensors["x"] = {{3}, std::vector<double>{1, 2}};
  CHECK_THROWS_WITH_AS((void)lather::serialize_state_dict(inconsistent), Contains("has shape (3,) but 2 values"),
                       lather::invalid_argument);
  fs::remove_all(scratch_dir());
}

TEST_CASE("checkpoint: hostile lengths, counts and shapes are refused before allocating") {
  // Hand-made headers: a huge entry count, a huge name, a huge rank, a shape whose product
  // overflows, an unknown dtype, a duplicate name. None may allocate more than the file holds.
  auto header = [](std::uint64_t count) {
    lather::impl::CheckpointWriter w;
    w.bytes(lather::impl::checkpoint_magic.data(), lather::impl::checkpoint_magic.size());
    w.integer(lather::impl::checkpoint_version);
    w.string("f", "format");
    w.integer(count);
    return w;
  };
  auto finish = [](lather::impl::CheckpointWriter& w) {
    w.integer(lather::impl::crc32_of(w.out()));
    return w.out();
  };
  {
    auto w = header(std::uint64_t{1} << 62);
    CHECK_THROWS_WITH_AS((void)lather::deserialize_state_dict(finish(w), "count"), Contains("entries need at least"),
                         lather::invalid_argument);
  }
  {
    auto w = header(1);
    w.integer(std::uint32_t{0xFFFFFFFFu});
    w.bytes(std::string(16, 'n').data(), 16);
    CHECK_THROWS_WITH_AS((void)lather::deserialize_state_dict(finish(w), "name"), Contains("truncated: entry 0's name"),
                         lather::invalid_argument);
  }
  {
    auto w = header(1);
    w.string("x", "name");
    w.integer(std::uint8_t{2});
    w.integer(std::uint32_t{0xFFFFFFFFu});
    CHECK_THROWS_WITH_AS((void)lather::deserialize_state_dict(finish(w), "rank"), Contains("shape of rank 4294967295"),
                         lather::invalid_argument);
  }
  {
    auto w = header(1);
    w.string("x", "name");
    w.integer(std::uint8_t{2});
    w.integer(std::uint32_t{3});
    for (int k = 0; k < 3; ++k) w.integer(std::uint64_t{1} << 32);  // product 2^96 overflows
    CHECK_THROWS_WITH_AS((void)lather::deserialize_state_dict(finish(w), "overflow"),
                         Contains("whose size overflows 64 bits"), lather::invalid_argument);
  }
  {
    // Found by fuzz_checkpoint (tests/fuzz/corpus/fuzz_checkpoint/regression-zero-extent-overflow.ckpt):
    // a zero extent makes an entry empty however large the others are; the reader took such a shape
    // and serialize_state_dict refused to write it back ("overflowing shape").
    auto w = header(1);
    w.string("x", "name");
    w.integer(std::uint8_t{1});
    w.integer(std::uint32_t{3});
    for (const std::uint64_t e : {std::uint64_t{1} << 40, std::uint64_t{1} << 40, std::uint64_t{0}}) w.integer(e);
    const auto bytes = finish(w);
    const lather::StateDict d = lather::deserialize_state_dict(bytes, "zero extent");
    REQUIRE(d.tensors.count("x") == 1);
    CHECK(d.tensors.at("x").stored_size() == 0);
    CHECK(lather::serialize_state_dict(d) == bytes);
  }
  {
    auto w = header(1);
    w.string("x", "name");
    w.integer(std::uint8_t{2});
    w.integer(std::uint32_t{2});
    w.integer(std::uint64_t{1} << 62);
    w.integer(std::uint64_t{0});  // a zero extent after a huge one: empty, and valid
    const auto d = lather::deserialize_state_dict(finish(w), "zero");
    CHECK(d.at("x").stored_size() == 0);
  }
  {
    auto w = header(1);
    w.string("x", "name");
    w.integer(std::uint8_t{2});
    w.integer(std::uint32_t{1});
    w.integer(~std::uint64_t{0});  // -1
    CHECK_THROWS_WITH_AS((void)lather::deserialize_state_dict(finish(w), "neg"), Contains("negative extent -1"),
                         lather::invalid_argument);
  }
  {
    auto w = header(1);
    w.string("x", "name");
    w.integer(std::uint8_t{7});
    CHECK_THROWS_WITH_AS((void)lather::deserialize_state_dict(finish(w), "dtype"), Contains("unknown dtype code 7"),
                         lather::invalid_argument);
  }
  {
    auto w = header(2);
    for (int k = 0; k < 2; ++k) {
      w.string("x", "name");
      w.integer(std::uint8_t{3});
      w.integer(std::uint32_t{0});
      w.integer(std::uint64_t{5});
    }
    CHECK_THROWS_WITH_AS((void)lather::deserialize_state_dict(finish(w), "dup"), Contains("duplicate entry 'x'"),
                         lather::invalid_argument);
  }
  {
    // Found by fuzz_checkpoint (tests/fuzz/corpus/fuzz_checkpoint/regression-entry-order.ckpt): a
    // file with its entries out of name order parsed, and wrote back differently.
    auto w = header(2);
    for (const char* name : {"y", "x"}) {
      w.string(name, "name");
      w.integer(std::uint8_t{3});
      w.integer(std::uint32_t{0});
      w.integer(std::uint64_t{5});
    }
    CHECK_THROWS_WITH_AS((void)lather::deserialize_state_dict(finish(w), "order"),
                         Contains("entry 'x' is out of order (it follows 'y'"), lather::invalid_argument);
  }
}

namespace {

// A corrupt checkpoint given to the load path (load_checkpoint, then load_state_dict) changes
// nothing; a valid one from another optimizer is refused by load_state_dict, unchanged too.
template <class ExecSpace>
void impl_test_corrupt_file_leaves_optimizer() {
  using M = typename ExecSpace::memory_space;
  using P = lather::TensorRef<double, M>;
  Kokkos::View<double**, M> w("w", 3, 4), g("g", 3, 4);
  std::vector<P> params{lather::tensor_ref(w)};
  lather::test::from_host(params[0], lather::test::random_values(12, 1));
  lather::Adam<P, ExecSpace> opt(params, lather::AdamOptions{.lr = 0.1});
  lather::test::from_host(lather::tensor_ref(g), lather::test::random_values(12, 2));
  opt.step(ExecSpace(), std::vector<P>{lather::tensor_ref(g)});
  const fs::path dir = scratch_dir();
  const fs::path file = dir / "adam.ckpt";
  lather::save_checkpoint(file, opt.state_dict());
  lather::test::from_host(lather::tensor_ref(g), lather::test::random_values(12, 3));
  opt.step(ExecSpace(), std::vector<P>{lather::tensor_ref(g)});
  const auto before = opt.state_dict();
  const auto values = lather::test::to_host(params[0]);

  auto bytes = read_bytes(file);
  auto corrupt = bytes;
  corrupt[bytes.size() / 2] ^= std::byte{0x10};
  write_bytes(dir / "corrupt.ckpt", corrupt);
  write_bytes(dir / "short.ckpt", std::vector<std::byte>(bytes.begin(), bytes.end() - 7));
  for (const char* name : {"corrupt.ckpt", "short.ckpt"}) {
    CAPTURE(name);
    CHECK_THROWS_WITH_AS(opt.load_state_dict(lather::load_checkpoint(dir / name)), Contains(name),
                         lather::invalid_argument);
    CHECK(opt.state_dict() == before);
    CHECK(lather::test::to_host(params[0]) == values);
  }
  // A valid file that does not fit (a Shampoo's state) is refused by load_state_dict.
  lather::Shampoo<P, ExecSpace> other(params, lather::ShampooOptions{.lr = 0.1});
  lather::save_checkpoint(dir / "shampoo.ckpt", other.state_dict());
  CHECK_THROWS_AS(opt.load_state_dict(lather::load_checkpoint(dir / "shampoo.ckpt")), lather::invalid_argument);
  CHECK(opt.state_dict() == before);
  fs::remove_all(dir);
}

// Save at step 4 to a file, load into a fresh optimizer, continue: equal to the straight run.
template <class Opt, class ExecSpace, class MakeOpt>
void check_resume_through_file(MakeOpt&& make, const char* what) {
  CAPTURE(what);
  using M = typename ExecSpace::memory_space;
  using P = lather::TensorRef<float, M>;
  Kokkos::View<float**, M> g("g", 5, 6), w1("w1", 5, 6), w2("w2", 5, 6);
  auto grads_for = [&](int t) { lather::test::from_host(lather::tensor_ref(g), lather::test::random_values(30, 400 + t)); };
  std::vector<P> p1{lather::tensor_ref(w1)}, p2{lather::tensor_ref(w2)};
  lather::test::from_host(p1[0], lather::test::random_values(30, 1));
  const fs::path file = scratch_dir() / "resume.ckpt";
  Opt a = make(p1);
  std::vector<double> saved_w;
  for (int t = 1; t <= 7; ++t) {
    if (t == 4) {
      lather::save_checkpoint(file, a.state_dict());
      saved_w = lather::test::to_host(p1[0]);
    }
    grads_for(t);
    a.step(ExecSpace(), std::vector<P>{lather::tensor_ref(g)});
  }
  lather::test::from_host(p2[0], saved_w);
  Opt c = make(p2);
  c.load_state_dict(lather::load_checkpoint(file));
  for (int t = 4; t <= 7; ++t) {
    grads_for(t);
    c.step(ExecSpace(), std::vector<P>{lather::tensor_ref(g)});
  }
  CHECK(lather::test::to_host(p2[0]) == lather::test::to_host(p1[0]));  // bitwise
  CHECK(c.state_dict() == a.state_dict());
  fs::remove_all(file.parent_path());
}

template <class ExecSpace>
void impl_test_resume_through_file() {
  using M = typename ExecSpace::memory_space;
  using P = lather::TensorRef<float, M>;
  using Adam = lather::Adam<P, ExecSpace>;
  check_resume_through_file<Adam, ExecSpace>(
      [](std::vector<P>& p) { return Adam(p, lather::AdamOptions{.lr = 0.01, .weight_decay = 0.1, .amsgrad = true}); },
      "Adam");
  using Shampoo = lather::Shampoo<P, ExecSpace, lather::EigenRootInverse, lather::AdamGrafting>;
  check_resume_through_file<Shampoo, ExecSpace>(
      [](std::vector<P>& p) {
        return Shampoo(p,
                       lather::ShampooOptions{.lr = 0.01, .betas = {0.9, 0.999}, .epsilon = 1e-6,
                                              .max_preconditioner_dim = 4, .precondition_frequency = 2,
                                              .start_preconditioning_step = 2, .momentum = 0.3},
                       {}, {.epsilon = 1e-8});
      },
      "Shampoo");
}

}  // namespace

TEST_CASE_TEMPLATE_DEFINE("checkpoint: a corrupt file leaves the optimizer unchanged", ExecSpace, ckpt_corrupt) {
  impl_test_corrupt_file_leaves_optimizer<ExecSpace>();
}
TEST_CASE_TEMPLATE_APPLY(ckpt_corrupt, lather_test_exec_spaces);

TEST_CASE_TEMPLATE_DEFINE("checkpoint: save, load and resume is bit-identical (Adam, Shampoo)", ExecSpace,
                          ckpt_resume) {
  impl_test_resume_through_file<ExecSpace>();
}
TEST_CASE_TEMPLATE_APPLY(ckpt_resume, lather_test_exec_spaces);
