// SPDX-License-Identifier: Apache-2.0
// docs/getting-started.md: a first optimizer over Eigen matrices (host memory).
#include <lather/lather.hpp>

#include <Kokkos_Core.hpp>

#include <Eigen/Dense>

#include <cstdio>
#include <vector>

int main(int argc, char** argv) {
  Kokkos::ScopeGuard guard(argc, argv);
  // Least squares: minimize 0.5 * ||A w - y||^2 over w.
  const Eigen::MatrixXd a = Eigen::MatrixXd::Random(50, 4);
  const Eigen::VectorXd y = a * Eigen::VectorXd::LinSpaced(4, 1.0, 4.0);
  std::vector<Eigen::VectorXd> params{Eigen::VectorXd::Zero(4)};  // updated in place
  lather::SGD opt(params, lather::SGDOptions{.lr = 0.01, .momentum = 0.9});
  std::vector<Eigen::VectorXd> grads(1);
  for (int t = 0; t < 500; ++t) {
    grads[0] = a.transpose() * (a * params[0] - y);
    opt.step(grads);
  }
  std::printf("w = (%.4f, %.4f, %.4f, %.4f)\n", params[0](0), params[0](1), params[0](2), params[0](3));
  return (params[0] - Eigen::VectorXd::LinSpaced(4, 1.0, 4.0)).norm() < 1e-6 ? 0 : 1;
}
