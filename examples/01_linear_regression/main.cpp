// SPDX-License-Identifier: Apache-2.0
// lather-demo: trains a linear model y = W x + b on synthetic regression data with every
// optimizer lather has, from the same initialization and the same mini-batches, and prints the
// loss curves side by side. Forward and backward run on Kokkos (gradients through Kokkos
// Kernels' gemm); the optimizers see the parameters as Kokkos Views.
#include <lather/lather.hpp>

#include <Kokkos_Core.hpp>
#include <Kokkos_Random.hpp>
#include <KokkosBlas3_gemm.hpp>

#include <CLI/CLI.hpp>

#include <chrono>
#include <cstdio>
#include <functional>
#include <map>
#include <string>
#include <vector>

namespace {

using ExecSpace = Kokkos::DefaultExecutionSpace;
using Matrix = Kokkos::View<float**, Kokkos::LayoutRight, ExecSpace::memory_space>;
using Vector = Kokkos::View<float*, ExecSpace::memory_space>;
using Param = lather::TensorRef<float, ExecSpace::memory_space>;

struct Data {
  Matrix x, y;  // (n, in), (n, out)
};

// y = W* x + b* + noise, with a fixed teacher (W*, b*) and Gaussian inputs.
Data make_data(int n, int in, int out, std::uint64_t seed, float noise) {
  Data d{Matrix("x", n, in), Matrix("y", n, out)};
  Kokkos::Random_XorShift64_Pool<ExecSpace> pool(seed);
  Kokkos::fill_random(d.x, pool, -1.0f, 1.0f);
  Matrix w_true("w_true", out, in);
  Vector b_true("b_true", out);
  Kokkos::fill_random(w_true, pool, -1.0f, 1.0f);
  Kokkos::fill_random(b_true, pool, -0.5f, 0.5f);
  Matrix eps("eps", n, out);
  Kokkos::fill_random(eps, pool, -noise, noise);
  KokkosBlas::gemm("N", "T", 1.0f, d.x, w_true, 0.0f, d.y);  // y = x W*^T
  auto y = d.y;
  Kokkos::parallel_for(
      "lather::demo::teacher_bias", Kokkos::MDRangePolicy<ExecSpace, Kokkos::Rank<2>>({0, 0}, {n, out}),
      KOKKOS_LAMBDA(int i, int o) { y(i, o) += b_true(o) + eps(i, o); });
  return d;
}

struct Model {
  Matrix w;  // (out, in)
  Vector b;  // (out)
  Matrix gw;
  Vector gb;
  Matrix residual;  // (batch, out)
  Model(int in, int out, int batch)
      : w("w", out, in), b("b", out), gw("gw", out, in), gb("gb", out), residual("r", batch, out) {}
};

// Mean squared error 0.5 * mean_i ||W x_i + b - y_i||^2 of one batch, and its gradients.
float loss_and_grad(Model& m, const Matrix& xb, const Matrix& yb) {
  const int batch = static_cast<int>(xb.extent(0));
  const int out = static_cast<int>(m.w.extent(0));
  auto r = Kokkos::subview(m.residual, std::make_pair(0, batch), Kokkos::ALL);
  Kokkos::deep_copy(r, yb);
  KokkosBlas::gemm("N", "T", 1.0f, xb, m.w, -1.0f, r);  // r = x W^T - y
  auto b = m.b;
  auto gb = m.gb;
  const float inv = 1.0f / static_cast<float>(batch);
  float loss = 0;
  Kokkos::parallel_reduce(
      "lather::demo::residual", Kokkos::MDRangePolicy<ExecSpace, Kokkos::Rank<2>>({0, 0}, {batch, out}),
      KOKKOS_LAMBDA(int i, int o, float& acc) {
        r(i, o) += b(o);
        acc += 0.5f * r(i, o) * r(i, o);
      },
      loss);
  KokkosBlas::gemm("T", "N", inv, r, xb, 0.0f, m.gw);  // gW = r^T x / batch
  Kokkos::parallel_for(
      "lather::demo::grad_bias", Kokkos::RangePolicy<ExecSpace>(0, out), KOKKOS_LAMBDA(int o) {
        float s = 0;
        for (int i = 0; i < batch; ++i) s += r(i, o);
        gb(o) = s * inv;
      });
  return loss * inv;
}

float full_loss(Model& m, const Data& d) {
  const int n = static_cast<int>(d.x.extent(0));
  const int batch = static_cast<int>(m.residual.extent(0));
  double total = 0;
  for (int s = 0; s < n; s += batch) {
    const int e = std::min(n, s + batch);
    auto xb = Kokkos::subview(d.x, std::make_pair(s, e), Kokkos::ALL);
    auto yb = Kokkos::subview(d.y, std::make_pair(s, e), Kokkos::ALL);
    total += double(loss_and_grad(m, Matrix(xb), Matrix(yb))) * (e - s);
  }
  return static_cast<float>(total / n);
}

struct Run {
  std::vector<float> curve;
  double seconds = 0;
};

template <class Opt>
Run train(Opt& opt, Model& m, const Data& d, int epochs, int batch) {
  Run run;
  const int n = static_cast<int>(d.x.extent(0));
  std::vector<Param> grads{lather::tensor_ref(m.gw), lather::tensor_ref(m.gb)};
  const ExecSpace space;
  const auto t0 = std::chrono::steady_clock::now();
  run.curve.push_back(full_loss(m, d));
  for (int epoch = 0; epoch < epochs; ++epoch) {
    for (int s = 0; s + batch <= n; s += batch) {
      auto xb = Kokkos::subview(d.x, std::make_pair(s, s + batch), Kokkos::ALL);
      auto yb = Kokkos::subview(d.y, std::make_pair(s, s + batch), Kokkos::ALL);
      loss_and_grad(m, Matrix(xb), Matrix(yb));
      opt.step(space, grads);
    }
    run.curve.push_back(full_loss(m, d));
  }
  space.fence();
  run.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return run;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"lather-demo: one linear-regression problem, every lather optimizer"};
  int epochs = 10, batch = 64, n = 16384, in = 128, out = 16;
  std::uint64_t seed = 7;
  std::vector<std::string> only;
  app.add_option("--epochs", epochs, "passes over the data")->check(CLI::PositiveNumber);
  app.add_option("--batch-size", batch, "samples per step")->check(CLI::PositiveNumber);
  app.add_option("--samples", n, "training samples")->check(CLI::PositiveNumber);
  app.add_option("--in", in, "input features")->check(CLI::PositiveNumber);
  app.add_option("--out", out, "outputs")->check(CLI::PositiveNumber);
  app.add_option("--seed", seed, "data and initialization seed");
  app.add_option("--optimizer", only, "run only these (sgd, adagrad, rmsprop, adam, adamw)");
  CLI11_PARSE(app, argc, argv);
  if (batch > n) {
    std::fprintf(stderr, "lather-demo: --batch-size (%d) must not exceed --samples (%d)\n", batch, n);
    return 2;
  }

  Kokkos::ScopeGuard guard(argc, argv);
  std::printf("lather %s on %s; %d samples, %d -> %d, batch %d, %d epochs, seed %llu\n",
              lather::version_string, ExecSpace::name(), n, in, out, batch, epochs,
              static_cast<unsigned long long>(seed));
  std::map<std::string, Run> runs;
  {
    const Data data = make_data(n, in, out, seed, 0.05f);
    Matrix w0("w0", out, in);
    Kokkos::Random_XorShift64_Pool<ExecSpace> pool(seed + 1);
    Kokkos::fill_random(w0, pool, -0.1f, 0.1f);

    auto run = [&](const std::string& name, auto make_and_train) {
      if (!only.empty() && std::find(only.begin(), only.end(), name) == only.end()) return;
      Model m(in, out, batch);
      Kokkos::deep_copy(m.w, w0);  // the same initialization for every optimizer
      runs[name] = make_and_train(m);
    };
    auto params_of = [](Model& m) { return std::vector<Param>{lather::tensor_ref(m.w), lather::tensor_ref(m.b)}; };
    run("sgd", [&](Model& m) {
      auto p = params_of(m);
      lather::SGD<Param> opt(p, {.lr = 0.05, .momentum = 0.9, .nesterov = true});
      return train(opt, m, data, epochs, batch);
    });
    run("adagrad", [&](Model& m) {
      auto p = params_of(m);
      lather::Adagrad<Param> opt(p, {.lr = 0.1});
      return train(opt, m, data, epochs, batch);
    });
    run("rmsprop", [&](Model& m) {
      auto p = params_of(m);
      lather::RMSprop<Param> opt(p, {.lr = 1e-2});
      return train(opt, m, data, epochs, batch);
    });
    run("adam", [&](Model& m) {
      auto p = params_of(m);
      lather::Adam<Param> opt(p, {.lr = 1e-2});
      return train(opt, m, data, epochs, batch);
    });
    run("adamw", [&](Model& m) {
      auto p = params_of(m);
      lather::AdamW<Param> opt(p, {.lr = 1e-2, .weight_decay = 1e-4});
      return train(opt, m, data, epochs, batch);
    });
  }
  if (runs.empty()) {
    std::fprintf(stderr, "lather-demo: no optimizer selected; use sgd, adagrad, rmsprop, adam or adamw\n");
    return 2;
  }

  std::printf("\ntraining loss (0.5 * mean squared error) after each epoch\n%-6s", "epoch");
  for (const auto& [name, r] : runs) std::printf(" %12s", name.c_str());
  std::printf("\n");
  for (int e = 0; e <= epochs; ++e) {
    std::printf("%-6d", e);
    for (const auto& [name, r] : runs) std::printf(" %12.6f", r.curve[e]);
    std::printf("\n");
  }
  std::printf("%-6s", "time");
  for (const auto& [name, r] : runs) std::printf(" %11.3fs", r.seconds);
  std::printf("\n");
  // The teacher's noise, uniform in [-0.05, 0.05] on each of `out` outputs, puts the best
  // achievable loss at 0.5 * out * 0.05^2 / 3: a healthy run ends near it.
  std::printf("noise floor (best achievable loss): %.6f\n", 0.5 * out * 0.05 * 0.05 / 3.0);
  // Exit non-zero if any optimizer failed to at least halve the initial loss.
  bool ok = true;
  for (const auto& [name, r] : runs) ok = ok && r.curve.back() < 0.5f * r.curve.front();
  if (!ok) std::printf("some optimizer did not halve the initial loss\n");
  return ok ? 0 : 1;
}
