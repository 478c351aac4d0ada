// SPDX-License-Identifier: Apache-2.0
// The Fashion-MNIST trainer's parts: model gradients against central finite differences (double,
// every execution space), the convolution and pooling kernels against direct loops, the loss
// against a hand-computed case, the learning-rate schedule, the epoch order, and the IDX reader's
// errors on missing, truncated and corrupt files.
#include "data.hpp"
#include "idx.hpp"
#include "nn.hpp"
#include "train.hpp"

#include <exec_spaces.hpp>
#include <test_utils.hpp>

#include <doctest/doctest.h>
#include <zlib.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

namespace {

template <class T, class Mem>
std::vector<double> host_copy(const Kokkos::View<T*, Mem>& v) {
  auto h = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), v);
  return std::vector<double>(h.data(), h.data() + h.extent(0));
}

template <class T, class Mem>
void upload(const Kokkos::View<T*, Mem>& v, const std::vector<double>& x) {
  auto h = Kokkos::create_mirror_view(v);
  for (std::size_t i = 0; i < x.size(); ++i) h(i) = static_cast<T>(x[i]);
  Kokkos::deep_copy(v, h);
}

/// Checks every parameter's gradient against central differences of the same loss:
/// L(theta) = scale * sum of the batch's losses. Double precision with h = 1e-6 gives a truncation
/// error ~h^2 |L'''| and a rounding error ~1e-16 / h, both far below the 1e-6 tolerance; a wrong
/// index in any backward kernel gives errors of order |g|.
template <class ExecSpace>
void check_gradients(fmnist::Model<double, ExecSpace>& model, int n, std::uint64_t stream, std::size_t stride) {
  using Mem = typename ExecSpace::memory_space;
  auto& p = model.parameters();
  p.initialize(lather::test::seed() + stream);
  // Nudge the parameters away from PyTorch's tiny-bias init so ReLUs are neither all on nor off.
  auto values = host_copy(p.flat_values());
  const auto noise = lather::test::random_values(values.size(), stream + 1, 0.05);
  for (std::size_t i = 0; i < values.size(); ++i) values[i] += noise[i];
  upload(p.flat_values(), values);

  Kokkos::View<double**, Kokkos::LayoutRight, Mem> x("x", n, 784);
  Kokkos::View<int*, Mem> y("y", n);
  {
    auto hx = Kokkos::create_mirror_view(x);
    auto hy = Kokkos::create_mirror_view(y);
    const auto r = lather::test::random_values(std::size_t(n) * 784, stream + 2, 1.5);
    for (int i = 0; i < n; ++i) {
      for (int j = 0; j < 784; ++j) hx(i, j) = r[std::size_t(i) * 784 + j];
      hy(i) = (3 * i + 1) % 10;
    }
    Kokkos::deep_copy(x, hx);
    Kokkos::deep_copy(y, hy);
  }
  const typename fmnist::Model<double, ExecSpace>::const_matrix xm(x.data(), n, 784);
  const Kokkos::View<const int*, Mem> ym = y;
  const double scale = 1.0 / n;
  const auto base = model.forward_backward(xm, ym, scale);
  const auto grads = host_copy(p.flat_grads());
  // forward() and forward_backward() compute the same loss.
  CHECK(model.forward(xm, ym).loss_sum == doctest::Approx(base.loss_sum).epsilon(1e-14));

  const double h = 1e-6;
  double worst = 0;
  std::size_t worst_index = 0, checked = 0;
  for (std::size_t k = 0; k < values.size(); k += stride) {
    auto v = values;
    v[k] = values[k] + h;
    upload(p.flat_values(), v);
    const double up = model.forward(xm, ym).loss_sum * scale;
    v[k] = values[k] - h;
    upload(p.flat_values(), v);
    const double down = model.forward(xm, ym).loss_sum * scale;
    const double fd = (up - down) / (2 * h);
    const double err = std::abs(fd - grads[k]) / std::max(1.0, std::abs(fd));
    if (err > worst) {
      worst = err;
      worst_index = k;
    }
    ++checked;
  }
  upload(p.flat_values(), values);
  INFO(model.name(), ": ", checked, " coordinates checked, worst at ", worst_index, " (analytic ", grads[worst_index],
       ")");
  CHECK(worst < 1e-6);
  // The check is not vacuous: the gradient is far from zero.
  double norm = 0;
  for (double g : grads) norm += g * g;
  CHECK(std::sqrt(norm) > 1e-2);
}

}  // namespace

TEST_CASE_TEMPLATE_DEFINE("fashion-mnist: MLP and CNN gradients match finite differences", ExecSpace, fd_models) {
  SUBCASE("mlp 784-12-7-10, batch 5, every coordinate") {
    fmnist::Mlp<double, ExecSpace> mlp(5, {12, 7});
    check_gradients(mlp, 5, 11, 1);
  }
  SUBCASE("mlp 784-512-256-10 (the trained model), batch 3, every 97th coordinate") {
    fmnist::Mlp<double, ExecSpace> mlp(4, {512, 256});
    check_gradients(mlp, 3, 12, 97);
  }
  SUBCASE("cnn conv5x5(2,3)-6-10, batch 3, every coordinate") {
    fmnist::Cnn<double, ExecSpace> cnn(3, 2, 3, 6, 5);
    check_gradients(cnn, 3, 13, 1);
  }
  SUBCASE("cnn conv3x3(3,4)-5-10, batch 2 in a batch-4 model, every coordinate") {
    fmnist::Cnn<double, ExecSpace> cnn(4, 3, 4, 5, 3);
    check_gradients(cnn, 2, 14, 1);
  }
}
TEST_CASE_TEMPLATE_APPLY(fd_models, lather_test_exec_spaces);

TEST_CASE_TEMPLATE_DEFINE("fashion-mnist: im2col convolution and max pooling equal direct loops", ExecSpace, conv_direct) {
  using Mem = typename ExecSpace::memory_space;
  for (const auto [n, h, c, o, k] : {std::array{2, 6, 1, 3, 5}, std::array{1, 4, 3, 2, 3}, std::array{3, 2, 2, 2, 1}}) {
    CAPTURE(n);
    CAPTURE(h);
    CAPTURE(c);
    CAPTURE(k);
    const int w = h, p = (k - 1) / 2;
    const auto xs = lather::test::random_values(std::size_t(n) * h * w * c, 21);
    const auto ws = lather::test::random_values(std::size_t(o) * c * k * k, 22);
    const auto bs = lather::test::random_values(std::size_t(o), 23);
    Kokkos::View<double*, Mem> x("x", xs.size()), wt("w", ws.size()), b("b", bs.size());
    upload(x, xs);
    upload(wt, ws);
    upload(b, bs);
    Kokkos::View<double*, Mem> cols("cols", std::size_t(n) * h * w * c * k * k), out("out", std::size_t(n) * h * w * o);
    fmnist::im2col<ExecSpace, double, Mem>(fmnist::UVector<const double, Mem>(x.data(), x.extent(0)), n, h, w, c, k,
                                           fmnist::UMatrix<double, Mem>(cols.data(), n * h * w, c * k * k));
    fmnist::linear_forward<ExecSpace, double, Mem>(
        fmnist::UMatrix<const double, Mem>(cols.data(), n * h * w, c * k * k),
        fmnist::UMatrix<double, Mem>(wt.data(), o, c * k * k), fmnist::UVector<double, Mem>(b.data(), o),
        fmnist::UMatrix<double, Mem>(out.data(), n * h * w, o));
    const auto got = host_copy(out);
    // Direct: out(b, y, x, oc) = bias + sum_{ci,i,j} W(oc, ci, i, j) in(b, y+i-p, x+j-p, ci).
    double worst = 0;
    for (int bi = 0; bi < n; ++bi)
      for (int yy = 0; yy < h; ++yy)
        for (int xx = 0; xx < w; ++xx)
          for (int oc = 0; oc < o; ++oc) {
            double s = bs[oc];
            for (int ci = 0; ci < c; ++ci)
              for (int i = 0; i < k; ++i)
                for (int j = 0; j < k; ++j) {
                  const int sy = yy + i - p, sx = xx + j - p;
                  if (sy < 0 || sy >= h || sx < 0 || sx >= w) continue;
                  s += ws[((oc * c + ci) * k + i) * k + j] * xs[((bi * h + sy) * w + sx) * c + ci];
                }
            worst = std::max(worst, std::abs(s - got[((bi * h + yy) * w + xx) * o + oc]));
          }
    CHECK(worst < 1e-13);

    // Max pooling of the input: the largest of each 2x2 window, and the winner's position.
    if (h % 2 == 0) {
      Kokkos::View<double*, Mem> pooled("pooled", std::size_t(n) * h * w * c / 4);
      Kokkos::View<int*, Mem> arg("arg", pooled.extent(0));
      fmnist::maxpool_forward<ExecSpace, double, Mem>(fmnist::UVector<const double, Mem>(x.data(), x.extent(0)), n, h, w,
                                                      c, fmnist::UVector<double, Mem>(pooled.data(), pooled.extent(0)),
                                                      arg);
      const auto hp = host_copy(pooled);
      auto ha = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), arg);
      bool ok = true;
      for (int bi = 0; bi < n; ++bi)
        for (int yy = 0; yy < h / 2; ++yy)
          for (int xx = 0; xx < w / 2; ++xx)
            for (int ci = 0; ci < c; ++ci) {
              double m = -1e300;
              int best = -1;
              for (int q = 0; q < 4; ++q) {
                const double v = xs[((bi * h + 2 * yy + q / 2) * w + 2 * xx + q % 2) * c + ci];
                if (v > m) {
                  m = v;
                  best = q;
                }
              }
              const std::size_t e = ((std::size_t(bi) * (h / 2) + yy) * (w / 2) + xx) * c + ci;
              ok = ok && hp[e] == m && ha(e) == best;
            }
      CHECK(ok);
    }
  }
}
TEST_CASE_TEMPLATE_APPLY(conv_direct, lather_test_exec_spaces);

TEST_CASE_TEMPLATE_DEFINE("fashion-mnist: softmax cross-entropy, hand-computed", ExecSpace, xent) {
  using Mem = typename ExecSpace::memory_space;
  // Row 0: z = (1, 2, 3), label 2: loss = log(e + e^2 + e^3) - 3 = 0.40760596444438030;
  // row 1: z = (0, 0, 0), label 0: loss = log 3, arg-max ties resolve to class 0 (correct).
  Kokkos::View<double*, Mem> z("z", 6), dz("dz", 6);
  Kokkos::View<int*, Mem> y("y", 2);
  upload(z, {1, 2, 3, 0, 0, 0});
  auto hy = Kokkos::create_mirror_view(y);
  hy(0) = 2;
  hy(1) = 0;
  Kokkos::deep_copy(y, hy);
  const auto r = fmnist::softmax_cross_entropy<ExecSpace, double, Mem>(
      fmnist::UMatrix<const double, Mem>(z.data(), 2, 3), y, 0.5, fmnist::UMatrix<double, Mem>(dz.data(), 2, 3));
  CHECK(r.loss_sum == doctest::Approx(0.40760596444438030 + std::log(3.0)).epsilon(1e-15));
  CHECK(r.correct == 2);
  const auto g = host_copy(dz);
  const double s = std::exp(1.0) + std::exp(2.0) + std::exp(3.0);
  const std::vector<double> expected{0.5 * std::exp(1.0) / s, 0.5 * std::exp(2.0) / s, 0.5 * (std::exp(3.0) / s - 1),
                                     0.5 * (1.0 / 3 - 1), 0.5 / 3, 0.5 / 3};
  for (int i = 0; i < 6; ++i) CHECK(g[std::size_t(i)] == doctest::Approx(expected[std::size_t(i)]).epsilon(1e-14));
}
TEST_CASE_TEMPLATE_APPLY(xent, lather_test_exec_spaces);

TEST_CASE("fashion-mnist: learning-rate schedule, slices and epoch order") {
  // Warm-up: (t + 1) / warmup of the peak; then cosine from the peak to final_fraction * peak.
  CHECK(fmnist::scheduled_lr(1.0, 0, 4, 14, 0.0) == doctest::Approx(0.25));
  CHECK(fmnist::scheduled_lr(1.0, 3, 4, 14, 0.0) == doctest::Approx(1.0));
  CHECK(fmnist::scheduled_lr(1.0, 4, 4, 14, 0.0) == doctest::Approx(1.0));
  CHECK(fmnist::scheduled_lr(1.0, 9, 4, 14, 0.0) == doctest::Approx(0.5));  // half-way: cos(pi/2) = 0
  CHECK(fmnist::scheduled_lr(2.0, 14, 4, 14, 0.1) == doctest::Approx(0.2));
  CHECK(fmnist::scheduled_lr(1.0, 0, 0, 10, 0.0) == doctest::Approx(1.0));
  // Slices of a batch over ranks cover it exactly, in order, sizes differing by at most one.
  for (int count : {1, 7, 128, 130})
    for (int size : {1, 2, 3, 4}) {
      if (count < size) continue;
      int next = 0;
      for (int r = 0; r < size; ++r) {
        const auto [lo, hi] = fmnist::slice_of(count, r, size);
        CHECK(lo == next);
        CHECK(hi - lo >= count / size);
        CHECK(hi - lo <= count / size + 1);
        next = hi;
      }
      CHECK(next == count);
    }
  // The epoch order is a permutation, reproducible, and different per epoch and seed.
  const auto a = fmnist::epoch_order(1000, 5, 1), b = fmnist::epoch_order(1000, 5, 1);
  const auto c = fmnist::epoch_order(1000, 5, 2), d = fmnist::epoch_order(1000, 6, 1);
  CHECK(a == b);
  CHECK(a != c);
  CHECK(a != d);
  auto sorted = a;
  std::sort(sorted.begin(), sorted.end());
  for (int i = 0; i < 1000; ++i) CHECK(sorted[std::size_t(i)] == i);
}

namespace {
namespace fs = std::filesystem;

struct TempDir {
  fs::path path;
  TempDir() : path(fs::temp_directory_path() / ("lather-idx-" + std::to_string(::getpid()))) {
    fs::create_directories(path);
  }
  ~TempDir() { fs::remove_all(path); }
};

std::vector<unsigned char> idx_bytes(std::vector<std::uint32_t> shape, unsigned char type = 0x08) {
  std::vector<unsigned char> out{0, 0, type, static_cast<unsigned char>(shape.size())};
  std::size_t n = 1;
  for (auto d : shape) {
    for (int s = 24; s >= 0; s -= 8) out.push_back(static_cast<unsigned char>(d >> s));
    n *= d;
  }
  for (std::size_t i = 0; i < n; ++i) out.push_back(static_cast<unsigned char>(i % 10));
  return out;
}

void write_gz(const fs::path& p, const std::vector<unsigned char>& bytes) {
  gzFile f = gzopen(p.string().c_str(), "wb");
  REQUIRE(f != nullptr);
  REQUIRE(gzwrite(f, bytes.data(), static_cast<unsigned>(bytes.size())) == static_cast<int>(bytes.size()));
  gzclose(f);
}

std::string error_of(const fs::path& p, std::size_t rank) {
  try {
    (void)fmnist::read_idx(p, rank);
  } catch (const fmnist::DataError& e) {
    return e.what();
  }
  return "no error";
}
}  // namespace

TEST_CASE("fashion-mnist: IDX files are read exactly and bad ones get a clear error") {
  TempDir dir;
  const auto ok = dir.path / "ok-images-idx3-ubyte.gz";
  write_gz(ok, idx_bytes({3, 2, 4}));
  const auto a = fmnist::read_idx(ok, 3);
  CHECK(a.shape == std::vector<std::uint32_t>{3, 2, 4});
  REQUIRE(a.data.size() == 24);
  CHECK(a.data[13] == 3);

  CHECK(error_of(dir.path / "missing.gz", 3).find("cannot open") != std::string::npos);
  CHECK(error_of(ok, 1).find("IDX rank 3, expected 1") != std::string::npos);

  auto bad_type = idx_bytes({3}, 0x0D);  // float data
  write_gz(dir.path / "float.gz", bad_type);
  CHECK(error_of(dir.path / "float.gz", 1).find("not an IDX file of unsigned bytes") != std::string::npos);

  auto truncated = idx_bytes({10, 5});
  truncated.resize(truncated.size() - 7);
  write_gz(dir.path / "truncated.gz", truncated);
  CHECK(error_of(dir.path / "truncated.gz", 2).find("file ends inside the data") != std::string::npos);

  auto trailing = idx_bytes({4});
  trailing.push_back(1);
  write_gz(dir.path / "trailing.gz", trailing);
  CHECK(error_of(dir.path / "trailing.gz", 1).find("trailing bytes") != std::string::npos);

  // A wrong CRC in the gzip trailer (the data decodes, the check fails), and garbage inside
  // the compressed stream: zlib reports both.
  write_gz(dir.path / "crc.gz", idx_bytes({64, 64}));
  {
    std::fstream f(dir.path / "crc.gz", std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(-8, std::ios::end);
    const char junk[4] = {'\x55', '\x2a', '\x7f', '\x13'};
    f.write(junk, 4);
  }
  INFO(error_of(dir.path / "crc.gz", 2));
  CHECK(error_of(dir.path / "crc.gz", 2).find("corrupt gzip data") != std::string::npos);
  write_gz(dir.path / "corrupt.gz", idx_bytes({64, 64}));
  {
    std::fstream f(dir.path / "corrupt.gz", std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(12, std::ios::beg);
    const char junk[4] = {'\x55', '\x2a', '\x7f', '\x13'};
    f.write(junk, 4);
  }
  INFO(error_of(dir.path / "corrupt.gz", 2));
  CHECK(error_of(dir.path / "corrupt.gz", 2).find("corrupt gzip data") != std::string::npos);

  // A directory without the data set names the Debian package to install.
  try {
    (void)fmnist::read_split(dir.path, "train");
    FAIL("read_split of an empty directory did not throw");
  } catch (const fmnist::DataError& e) {
    CHECK(std::string(e.what()).find("dataset-fashion-mnist") != std::string::npos);
  }
  // Images and labels of different counts.
  write_gz(dir.path / "train-images-idx3-ubyte.gz", idx_bytes({3, 2, 2}));
  write_gz(dir.path / "train-labels-idx1-ubyte.gz", idx_bytes({4}));
  try {
    (void)fmnist::read_split(dir.path, "train");
    FAIL("mismatched split did not throw");
  } catch (const fmnist::DataError& e) {
    CHECK(std::string(e.what()).find("has 3 images but") != std::string::npos);
  }
}
