// SPDX-License-Identifier: Apache-2.0
// The Shampoo family as preconditioner policies of lather::Shampoo: eigenvalue-corrected Shampoo
// and SOAP (equal to Adam/AdamW/AdaGrad/RMSprop when the basis never changes; the notes' G3
// golden values; the step-1 closed form), eigendecomposed Shampoo (equal to root-inverse
// Shampoo; adaptive skip), KL-Shampoo (against an independent Eigen reference), spectral
// descent (Newton-Schulz against the SVD and the singular values its coefficients promise),
// sign descent, iterate averaging (GPA = heavy-ball SGD; Schedule-Free's weights; train/eval),
// grafting, float precision and bit-identical resume for every variant.
#include <lather/config.hpp>  // LATHER_ENABLE_EIGEN, read below
#include <lather/optimizers/adagrad.hpp>
#include <lather/optimizers/adam.hpp>
#include <lather/optimizers/rmsprop.hpp>
#include <lather/optimizers/sgd.hpp>
#include <lather/optimizers/shampoo.hpp>
#include <lather/preconditioners/preconditioners.hpp>
#include <lather/root_inverse/root_inverse.hpp>
#ifdef LATHER_ENABLE_EIGEN
#include <Eigen/Dense>
#endif

#include <Kokkos_Core.hpp>

#include <doctest/doctest.h>

#include "exec_spaces.hpp"
#include "test_utils.hpp"

#include <algorithm>
#include <functional>
#include <cmath>
#include <vector>

namespace {

using doctest::Contains;
constexpr std::int64_t never = lather::never;

// Two parameters, (5, 3) and (3,), with random initial values and random gradients per step.
template <class T, class ExecSpace>
struct Problem {
  using M = typename ExecSpace::memory_space;
  using P = lather::TensorRef<T, M>;
  Kokkos::View<T**, Kokkos::LayoutRight, M> w{"w", 5, 3}, g{"g", 5, 3};
  Kokkos::View<T*, M> b{"b", 3}, gb{"gb", 3};
  std::vector<P> params{lather::tensor_ref(w), lather::tensor_ref(b)};
  std::vector<P> grads{lather::tensor_ref(g), lather::tensor_ref(gb)};
  Problem() {
    lather::test::from_host(params[0], lather::test::random_values(15, 10));
    lather::test::from_host(params[1], lather::test::random_values(3, 11));
  }
  void set_grads(int t, double scale = 1.0) {
    lather::test::from_host(grads[0], lather::test::random_values(15, 100 + t, scale));
    lather::test::from_host(grads[1], lather::test::random_values(3, 200 + t, scale));
  }
  std::vector<std::vector<double>> values() const {
    return {lather::test::to_host(params[0]), lather::test::to_host(params[1])};
  }
};

template <class T, class ExecSpace, class Pre, class Graft = lather::NoGrafting>
using ShampooOf = lather::Shampoo<lather::TensorRef<T, typename ExecSpace::memory_space>, ExecSpace, Pre, Graft,
                                  lather::ShampooPrecision<T>>;

// Runs `steps` steps of the optimizer made by `make` and of the reference `ref` on the same data,
// comparing the parameters after every step.
template <class ExecSpace, class Opt, class Ref>
void compare_runs(Problem<double, ExecSpace>& a, Opt& opt, Problem<double, ExecSpace>& b, Ref& ref, int steps,
                  double rtol, double atol, const char* what) {
  const std::string what_text(what);  // (doctest shows a const char* as its address)
  CAPTURE(what_text);
  for (int t = 1; t <= steps; ++t) {
    CAPTURE(t);
    a.set_grads(t);
    b.set_grads(t);
    opt.step(ExecSpace(), a.grads);
    ref.step(ExecSpace(), b.grads);
    const auto va = a.values(), vb = b.values();
    for (std::size_t i = 0; i < va.size(); ++i) lather::test::all_close(va[i], vb[i], rtol, atol, what);
  }
}

// ---- eigenvalue-corrected Shampoo and SOAP ----------------------------------------------------

// With a basis that never changes (start_preconditioning_step = never, or every dimension's basis
// change ignored) eigenvalue-corrected Shampoo is Adam / AdamW / AdaGrad / RMSprop on Gbar.
template <class ExecSpace, class Pre>
void ec_equals_diagonal(const Pre& pre, std::int64_t start, const char* what) {
  using P = lather::TensorRef<double, typename ExecSpace::memory_space>;
  const std::string what_text(what);  // (doctest shows a const char* as its address)
  CAPTURE(what_text);
  // Same formulas in a different order (sqrt(D / bc2) + eps against torch's sqrt(v) / sqrt(bc2) +
  // eps): a few ulps per step.
  const double rtol = 1e-12, atol = 1e-14;
  {
    Problem<double, ExecSpace> a, b;
    ShampooOf<double, ExecSpace, Pre> opt(a.params, {.lr = 0.05, .betas = {0.9, 0.999}, .epsilon = 1e-8, .weight_decay = 0.3,
                                                     .weight_decay_type = lather::WeightDecayType::l2,
                                                     .start_preconditioning_step = start},
                                          pre);
    lather::Adam<P, ExecSpace> ref(b.params, {.lr = 0.05, .betas = {0.9, 0.999}, .eps = 1e-8, .weight_decay = 0.3});
    compare_runs(a, opt, b, ref, 6, rtol, atol, "Adam with L2");
  }
  {
    Problem<double, ExecSpace> a, b;
    ShampooOf<double, ExecSpace, Pre> opt(
        a.params, {.lr = 0.05, .betas = {0.9, 0.999}, .epsilon = 1e-8, .weight_decay = 0.3, .start_preconditioning_step = start},
        pre);
    lather::AdamW<P, ExecSpace> ref(b.params, {.lr = 0.05, .betas = {0.9, 0.999}, .eps = 1e-8, .weight_decay = 0.3});
    compare_runs(a, opt, b, ref, 6, rtol, atol, "AdamW");
  }
  {
    Problem<double, ExecSpace> a, b;
    ShampooOf<double, ExecSpace, Pre> opt(
        a.params, {.lr = 0.1, .betas = {0.0, 1.0}, .epsilon = 1e-10, .start_preconditioning_step = start}, pre);
    lather::Adagrad<P, ExecSpace> ref(b.params, {.lr = 0.1, .eps = 1e-10});
    compare_runs(a, opt, b, ref, 6, rtol, atol, "AdaGrad");
  }
  {
    Problem<double, ExecSpace> a, b;
    ShampooOf<double, ExecSpace, Pre> opt(a.params, {.lr = 0.01, .betas = {0.0, 0.99}, .epsilon = 1e-8,
                                                     .start_preconditioning_step = start, .use_bias_correction = false},
                                          pre);
    lather::RMSprop<P, ExecSpace> ref(b.params, {.lr = 0.01, .alpha = 0.99, .eps = 1e-8});
    compare_runs(a, opt, b, ref, 6, rtol, atol, "RMSprop");
  }
}

template <class ExecSpace>
void impl_test_ec_diagonal() {
  ec_equals_diagonal<ExecSpace>(lather::EigenvalueCorrectedShampoo<>{}, never, "eigh, never preconditioning");
  ec_equals_diagonal<ExecSpace>(lather::SOAP{}, never, "SOAP (qr), never preconditioning");
  // Every basis change ignored: the amortized steps run from step 1 (S = F = 1) and change nothing.
  const std::map<int, std::vector<int>> all{{1, {0}}, {2, {0, 1}}};
  ec_equals_diagonal<ExecSpace>(lather::EigenvalueCorrectedShampoo<>{.ignored_basis_change_dims = all}, -1,
                                "eigh, every basis dimension ignored");
  ec_equals_diagonal<ExecSpace>(lather::SOAP{.ignored_basis_change_dims = all}, -1, "SOAP, every basis dimension ignored");
}

// The notes' G3 values (DefaultEigenvalueCorrectedShampooConfig, no grafting, lr 0.1, betas
// (0.9, 0.999), eps 1e-3, one (4, 3) block): printed from a float32 run, which the notes' float64
// reference matches to 1.5e-5.
template <class ExecSpace>
void impl_test_ec_golden() {
  const std::vector<std::vector<double>> g3 = {
      {0.0877535, -0.0357572, -0.1996165, 0.2073687, 0.0020403, -0.0674551, 0.274261, 0.0839274, 0.0807329, 0.3188146,
       0.2265673, 0.2006925},
      {0.1357515, -0.1079702, -0.1875122, 0.1820372, -0.0619759, 0.0111615, 0.1988855, 0.0869635, 0.1535827,
       0.2627012, 0.2938643, 0.2007937},
      {0.1418317, -0.0946803, -0.2046488, 0.2033575, -0.0692903, -0.0040696, 0.2158418, 0.0657701, 0.1542615,
       0.259706, 0.2782771, 0.2167591}};
  auto run = [&](auto tag) {
    using T = decltype(tag);
    using M = typename ExecSpace::memory_space;
    using P = lather::TensorRef<T, M>;
    Kokkos::View<T**, Kokkos::LayoutRight, M> w("w", 4, 3), g("g", 4, 3);
    std::vector<P> params{lather::tensor_ref(w)};
    std::vector<double> w0(12);
    for (int i = 0; i < 4; ++i)
      for (int j = 0; j < 3; ++j) w0[3 * i + j] = 0.1 * (i - j) + 0.05;
    lather::test::from_host(params[0], w0);
    ShampooOf<T, ExecSpace, lather::EigenvalueCorrectedShampoo<>> opt(
        params, {.lr = 0.1, .betas = {0.9, 0.999}, .epsilon = 1e-3, .max_preconditioner_dim = 4});
    for (int t = 1; t <= 3; ++t) {
      std::vector<double> gv(12);
      for (int i = 0; i < 4; ++i)
        for (int j = 0; j < 3; ++j) gv[3 * i + j] = std::sin(1.0 + i + 2.0 * j + 3.0 * t);
      lather::test::from_host(lather::tensor_ref(g), gv);
      opt.step(ExecSpace(), std::vector<P>{lather::tensor_ref(g)});
      CAPTURE(t);
      // double: the notes' float64 reference is within 1.5e-5 of these float32 values. float: the
      // 4x4 left factor of a 4x3 gradient is rank-deficient; its null-space eigenvector, and the
      // rotated gradient there (rounding, ~1e-7), divided by (|r| + eps = 1e-3) add ~1e-5 that
      // depends on the eigensolver's rounding and grows as D is not re-projected (seen: 5.1e-5 at
      // step 3): 1e-4.
      lather::test::all_close(lather::test::to_host(params[0]), g3[t - 1], 0.0, std::is_same_v<T, float> ? 1e-4 : 1.6e-5,
                              "G3");
    }
  };
  run(double{});
  run(float{});
}

#ifdef LATHER_ENABLE_EIGEN
// Step 1 with beta2 = 1: L = G G^T, R = G^T G, so Q_L^T G Q_R = diag(sigma) (up to signs and
// rounding), D = sigma^2 and P = U diag(sigma / (sigma + eps)) V^T: the polar factor U V^T for
// eps -> 0. Checked against that closed form from Eigen's SVD.
template <class ExecSpace>
void impl_test_ec_polar() {
  using M = typename ExecSpace::memory_space;
  using P = lather::TensorRef<double, M>;
  Kokkos::View<double**, Kokkos::LayoutRight, M> w("w", 6, 4), g("g", 6, 4);
  std::vector<P> params{lather::tensor_ref(w)};
  const auto gv = lather::test::random_values(24, 77);
  lather::test::from_host(lather::tensor_ref(g), gv);
  const double eps = 1e-3;
  ShampooOf<double, ExecSpace, lather::EigenvalueCorrectedShampoo<>> opt(
      params, {.lr = 1.0, .betas = {0.9, 1.0}, .epsilon = eps, .max_preconditioner_dim = 8});
  opt.step(ExecSpace(), std::vector<P>{lather::tensor_ref(g)});
  Eigen::Matrix<double, 6, 4, Eigen::RowMajor> gm;
  for (int i = 0; i < 24; ++i) gm.data()[i] = gv[i];
  Eigen::JacobiSVD<Eigen::MatrixXd> svd(gm, Eigen::ComputeThinU | Eigen::ComputeThinV);
  Eigen::VectorXd s = svd.singularValues();
  for (int k = 0; k < s.size(); ++k) s(k) = s(k) / (s(k) + eps);
  const Eigen::MatrixXd want_m = svd.matrixU() * s.asDiagonal() * svd.matrixV().transpose();
  std::vector<double> want(24);
  for (int i = 0; i < 6; ++i)
    for (int j = 0; j < 4; ++j) want[4 * i + j] = -want_m(i, j);
  // The rotated G's off-diagonal entries are rounding (1e-16) divided by (|.| + eps): 1e-13.
  lather::test::all_close(lather::test::to_host(params[0]), want, 0.0, 1e-11, "eigenvalue-corrected step 1");
  // The stored basis diagonalizes the factor: Q^T L Q is diagonal with ascending entries.
  const auto q = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), opt.eigenvectors(0, 0, 0));
  const auto l = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), opt.factor_matrix(0, 0, 0));
  Eigen::MatrixXd qm(6, 6), lm(6, 6);
  for (int i = 0; i < 6; ++i)
    for (int j = 0; j < 6; ++j) {
      qm(i, j) = q(i, j);
      lm(i, j) = l(i, j);
    }
  const Eigen::MatrixXd d = qm.transpose() * lm * qm;
  for (int i = 0; i < 6; ++i)
    for (int j = 0; j < 6; ++j)
      if (i != j) CHECK(std::abs(d(i, j)) < 1e-12 * d.norm());
  for (int i = 0; i + 1 < 6; ++i) CHECK(d(i, i) <= d(i + 1, i + 1) + 1e-12);
}
#endif

// SOAP's QR refresh is one step of orthogonal iteration from the previous basis: with many
// iterations it converges to the eigenbasis, so SOAP with max_iterations = 200 tracks eigh.
template <class ExecSpace>
void impl_test_qr_converges() {
  Problem<double, ExecSpace> a, b;
  const lather::ShampooOptions o{.lr = 0.01, .betas = {0.9, 0.999}, .epsilon = 1e-3, .max_preconditioner_dim = 8};
  ShampooOf<double, ExecSpace, lather::SOAP> soap(a.params, o, {.amortized = {.max_iterations = 200, .tolerance = 1e-14}});
  ShampooOf<double, ExecSpace, lather::EigenvalueCorrectedShampoo<>> eigh(b.params, o);
  // Converged orthogonal iteration equals eigh up to the iteration's tolerance and eigenvector
  // signs (a sign flip of a column cancels in Q f(.) Q^T): 1e-9 over 4 steps.
  compare_runs(a, soap, b, eigh, 4, 1e-9, 1e-11, "SOAP (200 QR iterations) vs eigh");
}

// ---- eigendecomposed Shampoo ------------------------------------------------------------------

template <class ExecSpace>
void impl_test_eigendecomposed() {
  {  // Same eigenvalue rule as EigenRootInverse, applied to stored eigenpairs: equal trajectories.
    Problem<double, ExecSpace> a, b;
    const lather::ShampooOptions o{.lr = 0.02, .betas = {0.9, 0.999}, .epsilon = 1e-6, .max_preconditioner_dim = 8,
                                   .precondition_frequency = 2};
    ShampooOf<double, ExecSpace, lather::EigendecomposedShampoo<>> eig(a.params, o);
    ShampooOf<double, ExecSpace, lather::EigenRootInverse> root(b.params, o);
    compare_runs(a, eig, b, root, 6, 1e-12, 1e-14, "eigendecomposed vs root inverse");
    // The stored eigenvalues include the eps ridge: they are those of L / bc2 + eps I (step 6).
    const auto lambda = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), eig.eigenvalues(0, 0, 0));
    CHECK(lambda.extent(0) == 5);
    for (std::size_t k = 0; k + 1 < lambda.extent(0); ++k) CHECK(lambda(k) <= lambda(k + 1));
    CHECK(lambda(0) >= 1e-6 * (1 - 1e-9));
  }
  {  // The pseudo-inverse rule (epsilon = 0) likewise.
    Problem<double, ExecSpace> a, b;
    const lather::ShampooOptions o{.lr = 0.02, .epsilon = 0.0, .max_preconditioner_dim = 8};
    const lather::PseudoInverse pinv{.rank_atol = 1e-10};
    ShampooOf<double, ExecSpace, lather::EigendecomposedShampoo<>> eig(a.params, o, {.pseudo_inverse = pinv});
    ShampooOf<double, ExecSpace, lather::EigenRootInverse> root(b.params, o, {.pseudo_inverse = pinv});
    compare_runs(a, eig, b, root, 4, 1e-10, 1e-12, "eigendecomposed vs root inverse, pseudo-inverse");
    Problem<double, ExecSpace> c;
    using E = ShampooOf<double, ExecSpace, lather::EigendecomposedShampoo<>>;
    CHECK_THROWS_WITH_AS(E(c.params, {.epsilon = 1e-6}, {.pseudo_inverse = pinv}), Contains("must be 0 with the pseudo-inverse"),
                         lather::invalid_argument);
  }
  {  // Adaptive skip with tolerance 1: the first basis (identity) is always kept, so the stored
     // eigenvalues are the diagonal of L / bc2 + eps I.
    Problem<double, ExecSpace> a;
    ShampooOf<double, ExecSpace, lather::EigendecomposedShampoo<>> eig(
        a.params, {.lr = 0.02, .betas = {0.9, 1.0}, .epsilon = 1e-6, .max_preconditioner_dim = 8},
        {.amortized = {.tolerance = 1.0}});
    for (int t = 1; t <= 3; ++t) {
      a.set_grads(t);
      eig.step(ExecSpace(), a.grads);
    }
    const auto q = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), eig.eigenvectors(0, 0, 1));
    const auto l = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), eig.factor_matrix(0, 0, 1));
    const auto lambda = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), eig.eigenvalues(0, 0, 1));
    for (int i = 0; i < 3; ++i) {
      CHECK(lambda(i) == doctest::Approx(l(i, i) + 1e-6).epsilon(1e-14));
      for (int j = 0; j < 3; ++j) CHECK(q(i, j) == (i == j ? 1.0 : 0.0));
    }
  }
}

// ---- KL-Shampoo ------------------------------------------------------------------------------

#ifdef LATHER_ENABLE_EIGEN
// Independent reference for one 2-D block: L += Gt Gt^T with Gt = G R^(-1/4)_current,
// R += Gt2^T Gt2 with Gt2 = L^(-1/4)_current G, roots of (L + eps I) by eigh with the
// perturbation rule, P = L^(-1/4) G R^(-1/4); beta1 = 0, beta2 = 1, F = 1.
Eigen::MatrixXd inv_root(const Eigen::MatrixXd& a, double eps) {
  Eigen::SelfAdjointEigenSolver<Eigen::MatrixXd> es(a + eps * Eigen::MatrixXd::Identity(a.rows(), a.cols()));
  Eigen::VectorXd l = es.eigenvalues();
  if (l(0) < eps) l.array() += eps - l(0);
  return es.eigenvectors() * l.array().pow(-0.25).matrix().asDiagonal() * es.eigenvectors().transpose();
}

template <class ExecSpace, class Pre>
void kl_against_reference(const Pre& pre, const char* what) {
  const std::string what_text(what);  // (doctest shows a const char* as its address)
  CAPTURE(what_text);
  using M = typename ExecSpace::memory_space;
  using P = lather::TensorRef<double, M>;
  Kokkos::View<double**, Kokkos::LayoutRight, M> w("w", 5, 3), g("g", 5, 3);
  std::vector<P> params{lather::tensor_ref(w)};
  const double eps = 1e-4, lr = 0.05;
  ShampooOf<double, ExecSpace, Pre> opt(params, {.lr = lr, .betas = {0.0, 1.0}, .epsilon = eps, .max_preconditioner_dim = 8},
                                        pre);
  Eigen::MatrixXd wm = Eigen::MatrixXd::Zero(5, 3), l = Eigen::MatrixXd::Zero(5, 5), r = Eigen::MatrixXd::Zero(3, 3);
  Eigen::MatrixXd pl = Eigen::MatrixXd::Identity(5, 5), pr = Eigen::MatrixXd::Identity(3, 3);
  for (int t = 1; t <= 5; ++t) {
    const auto gv = lather::test::random_values(15, 300 + t);
    lather::test::from_host(lather::tensor_ref(g), gv);
    opt.step(ExecSpace(), std::vector<P>{lather::tensor_ref(g)});
    Eigen::MatrixXd gm(5, 3);
    for (int i = 0; i < 5; ++i)
      for (int j = 0; j < 3; ++j) gm(i, j) = gv[3 * i + j];
    const Eigen::MatrixXd gl = gm * pr, gr = pl.transpose() * gm;  // with the roots before this step
    l += gl * gl.transpose();
    r += gr.transpose() * gr;
    pl = inv_root(l, eps);
    pr = inv_root(r, eps);
    wm -= lr * (pl.transpose() * gm * pr);
    std::vector<double> want(15);
    for (int i = 0; i < 5; ++i)
      for (int j = 0; j < 3; ++j) want[3 * i + j] = wm(i, j);
    CAPTURE(t);
    // Two eigensolvers (LAPACK, Eigen) on matrices with condition number <= 1e4: 1e-10.
    lather::test::all_close(lather::test::to_host(params[0]), want, 1e-9, 1e-11, "KL-Shampoo");
  }
}

template <class ExecSpace>
void impl_test_kl() {
  kl_against_reference<ExecSpace>(lather::KLShampoo<lather::EigenRootInverse>{}, "root inverse");
  kl_against_reference<ExecSpace>(lather::KLShampoo<lather::EigendecomposedShampoo<>>{}, "eigendecomposed");
}
#endif

// ---- spectral and sign descent ---------------------------------------------------------------

#ifdef LATHER_ENABLE_EIGEN
// The Newton-Schulz polynomial on one singular value, `iterations` times.
double ns_map(double x, int iterations, const std::array<double, 3>& c) {
  for (int k = 0; k < iterations; ++k) x = c[0] * x + c[1] * x * x * x + c[2] * x * x * x * x * x;
  return x;
}

template <class ExecSpace>
void impl_test_spectral() {
  using M = typename ExecSpace::memory_space;
  using P = lather::TensorRef<double, M>;
  for (const auto& [rows, cols] : {std::pair{8, 4}, std::pair{3, 8}, std::pair{6, 6}}) {
    CAPTURE(rows);
    CAPTURE(cols);
    Kokkos::View<double**, Kokkos::LayoutRight, M> w1("w1", rows, cols), w2("w2", rows, cols), g("g", rows, cols);
    const auto gv = lather::test::random_values(static_cast<std::size_t>(rows * cols), 400 + rows);
    lather::test::from_host(lather::tensor_ref(g), gv);
    const lather::ShampooOptions o{.lr = 1.0, .betas = {0.0, 1.0}, .max_preconditioner_dim = lather::unbounded};
    std::vector<P> p1{lather::tensor_ref(w1)}, p2{lather::tensor_ref(w2)};
    ShampooOf<double, ExecSpace, lather::Muon> ns(p1, o);
    ShampooOf<double, ExecSpace, lather::SpectralDescent<lather::SVDOrthogonalization>> svd(p2, o);
    ns.step(ExecSpace(), std::vector<P>{lather::tensor_ref(g)});
    svd.step(ExecSpace(), std::vector<P>{lather::tensor_ref(g)});
    Eigen::MatrixXd gm(rows, cols), a(rows, cols), b(rows, cols);
    const auto h1 = lather::test::to_host(p1[0]), h2 = lather::test::to_host(p2[0]);
    for (int i = 0; i < rows; ++i)
      for (int j = 0; j < cols; ++j) {
        gm(i, j) = gv[static_cast<std::size_t>(i * cols + j)];
        a(i, j) = -h1[static_cast<std::size_t>(i * cols + j)];
        b(i, j) = -h2[static_cast<std::size_t>(i * cols + j)];
      }
    Eigen::JacobiSVD<Eigen::MatrixXd> sg(gm, Eigen::ComputeThinU | Eigen::ComputeThinV);
    // SVD orthogonalization is U V^T exactly (to rounding).
    const Eigen::MatrixXd polar = sg.matrixU() * sg.matrixV().transpose();
    CHECK((b - polar).norm() < 1e-12 * polar.norm());
    // Newton-Schulz maps each singular value x = sigma / ||G||_F to ns_map(x) (a polynomial in
    // G G^T acts on the singular values alone), so its output's singular values are exactly those.
    const std::array<double, 3> c = {3.4445, -4.7750, 2.0315};
    const Eigen::VectorXd s = sg.singularValues();
    const double fro = gm.norm();
    Eigen::JacobiSVD<Eigen::MatrixXd> sa(a);
    // ns_map is not monotonic: the output's singular values are the mapped ones, re-sorted.
    std::vector<double> wants;
    for (int k = 0; k < s.size(); ++k) wants.push_back(ns_map(s(k) / fro, 5, c));
    std::sort(wants.begin(), wants.end(), std::greater<>());
    double deviation = 0;
    for (int k = 0; k < s.size(); ++k) {
      const double want = wants[static_cast<std::size_t>(k)];
      CHECK(sa.singularValues()(k) == doctest::Approx(want).epsilon(1e-10));
      deviation = std::max(deviation, std::abs(want - 1.0));
      // The coefficients' promise: after 5 iterations every singular value of a matrix with
      // sigma_min / ||G||_F >= 0.02 lies in [0.68, 1.2] (scan of ns_map below).
      CHECK(want >= 0.68);
      CHECK(want <= 1.2);
    }
    // Newton-Schulz and the SVD differ only in the singular values: ||NS - U V^T||_2 = max |f(x) - 1|.
    CHECK((a - b).norm() <= std::sqrt(static_cast<double>(s.size())) * deviation + 1e-12);
  }
  // The scan behind the promise: ns_map over [0.02, 1] stays in [0.68, 1.2].
  double lo = 10, hi = 0;
  for (int k = 0; k <= 9800; ++k) {
    const double v = ns_map(0.02 + k * 1e-4, 5, {3.4445, -4.7750, 2.0315});
    lo = std::min(lo, v);
    hi = std::max(hi, v);
  }
  CHECK(lo >= 0.68);
  CHECK(hi <= 1.2);
  // Spectral descent rejects blocks that are not matrices, unless the group never preconditions.
  Kokkos::View<double*, M> v("v", 4);
  std::vector<P> pv{lather::tensor_ref(v)};
  CHECK_THROWS_WITH_AS((ShampooOf<double, ExecSpace, lather::Muon>(pv, {})), Contains("orthogonalizes matrices"),
                       lather::invalid_argument);
  CHECK_NOTHROW((ShampooOf<double, ExecSpace, lather::Muon>(pv, {.start_preconditioning_step = never})));
}
#endif

template <class ExecSpace>
void impl_test_sign() {
  using M = typename ExecSpace::memory_space;
  using P = lather::TensorRef<double, M>;
  Kokkos::View<double*, M> w("w", 5), g("g", 5);
  std::vector<P> params{lather::tensor_ref(w)};
  const std::vector<double> gv{0.5, -2.0, 0.0, 1e-30, -3.0};
  lather::test::from_host(lather::tensor_ref(g), gv);
  {
    ShampooOf<double, ExecSpace, lather::SignDescent> opt(params, {.lr = 0.1, .betas = {0.0, 1.0}});
    opt.step(ExecSpace(), std::vector<P>{lather::tensor_ref(g)});
    lather::test::all_close(lather::test::to_host(params[0]), {-0.1, 0.1, 0.0, -0.1, 0.1}, 0, 0, "sign, sign(0) = 0");
  }
  {  // A scale function: the mean absolute value (magnitude-preserving sign).
    lather::test::from_host(params[0], std::vector<double>(5, 0.0));
    ShampooOf<double, ExecSpace, lather::SignDescent> opt(
        params, {.lr = 0.1, .betas = {0.0, 1.0}},
        {.scale_fn = [](const lather::SignDescentBlockStats& s) { return s.l1_norm / static_cast<double>(s.numel); }});
    opt.step(ExecSpace(), std::vector<P>{lather::tensor_ref(g)});
    const double m = (0.5 + 2.0 + 0.0 + 1e-30 + 3.0) / 5;
    lather::test::all_close(lather::test::to_host(params[0]), {-0.1 * m, 0.1 * m, 0.0, -0.1 * m, 0.1 * m}, 1e-15, 0,
                            "scaled sign");
  }
}

// ---- iterate averaging -----------------------------------------------------------------------

template <class ExecSpace>
void impl_test_averaging() {
  using P = lather::TensorRef<double, typename ExecSpace::memory_space>;
  const double lr = 0.1, mu = 0.9;
  {  // GPA with mu_y = 1 is heavy-ball momentum: torch SGD(lr (1 - mu_x), momentum mu_x).
    Problem<double, ExecSpace> a, b;
    ShampooOf<double, ExecSpace, lather::EigenRootInverse> gpa(
        a.params, {.lr = lr, .betas = {0.0, 1.0}, .start_preconditioning_step = never,
                   .iterate_averaging = lather::IterateAveraging::generalized_primal_averaging,
                   .eval_interp_coeff = mu, .train_interp_coeff = 1.0});
    lather::SGD<P, ExecSpace> sgd(b.params, {.lr = lr * (1 - mu), .momentum = mu});
    compare_runs(a, gpa, b, sgd, 8, 1e-12, 1e-14, "GPA vs heavy-ball SGD");
  }
  {  // Schedule-Free with a constant lr: mu_x = 1 - 1/t (p = 2). Simulated with the reference's
     // update (notes section 3, steps 11-14): z' = z (1 - lr wd), P = -lr G,
     // y += (1 - mu_x)(z' - y) + (1 - mu_x mu_y) P, z = z' + P; and x = y + (1 - 1/mu_y)(z - y).
     // Without decay these are the primal-averaging sequences z -= lr g, x = mu_x x + (1 - mu_x) z,
     // y = mu_y x + (1 - mu_y) z.
    Problem<double, ExecSpace> a;
    const double muy = 0.8, wd = 0.01;
    ShampooOf<double, ExecSpace, lather::EigenRootInverse> sf(
        a.params, {.lr = lr, .betas = {0.0, 1.0}, .weight_decay = wd, .start_preconditioning_step = never,
                   .iterate_averaging = lather::IterateAveraging::schedule_free, .train_interp_coeff = muy});
    auto y = a.values();
    auto z = y;
    auto x = y;
    for (int t = 1; t <= 6; ++t) {
      a.set_grads(t);
      sf.step(ExecSpace(), a.grads);
      const double mux = 1.0 - 1.0 / t;
      for (std::size_t i = 0; i < 2; ++i) {
        const auto gv = lather::test::random_values(y[i].size(), (i == 0 ? 100 : 200) + t);
        for (std::size_t e = 0; e < y[i].size(); ++e) {
          const double zd = z[i][e] * (1 - lr * wd), p = -lr * gv[e];
          y[i][e] += (1 - mux) * (zd - y[i][e]) + (1 - mux * muy) * p;
          z[i][e] = zd + p;
          x[i][e] = y[i][e] + (1 - 1 / muy) * (z[i][e] - y[i][e]);
        }
      }
      const auto got = a.values();
      CAPTURE(t);
      for (std::size_t i = 0; i < 2; ++i) lather::test::all_close(got[i], y[i], 1e-12, 1e-14, "Schedule-Free y");
    }
    // eval() moves to x, step() then raises and changes nothing, train() returns to y.
    sf.eval();
    CHECK_FALSE(sf.training());
    const auto at_x = a.values();
    for (std::size_t i = 0; i < 2; ++i) lather::test::all_close(at_x[i], x[i], 1e-12, 1e-14, "Schedule-Free x");
    const auto state = sf.state_dict();
    CHECK_THROWS_WITH_AS(sf.step(ExecSpace(), a.grads), Contains("eval mode"), lather::runtime_error);
    CHECK(sf.state_dict() == state);
    CHECK(a.values() == at_x);
    sf.train();
    sf.train();  // a no-op
    const auto back = a.values();
    for (std::size_t i = 0; i < 2; ++i) lather::test::all_close(back[i], y[i], 1e-14, 1e-15, "train/eval round trip");
  }
  {  // Momentum and iterate averaging exclude each other.
    Problem<double, ExecSpace> a;
    using S = ShampooOf<double, ExecSpace, lather::EigenRootInverse>;
    CHECK_THROWS_WITH_AS(S(a.params, {.momentum = 0.9, .iterate_averaging = lather::IterateAveraging::schedule_free}),
                         Contains("exclude each other"), lather::invalid_argument);
    CHECK_THROWS_WITH_AS(S(a.params, {.iterate_averaging = lather::IterateAveraging::generalized_primal_averaging,
                                      .eval_interp_coeff = 1.0}),
                         Contains("eval_interp_coeff"), lather::invalid_argument);
  }
}

// ---- every variant: grafting, float precision, resume ----------------------------------------

// Step 1 with Adam grafting and lr = 1, no decay: each block's update has the norm of
// graft(Gbar) = G / (sqrt(G^2) + eps) (V = (1 - b2) G^2, bc = 1 - b2), whatever the variant.
template <class ExecSpace, class Pre>
void grafted_norm(const Pre& pre, const char* what) {
  const std::string what_text(what);  // (doctest shows a const char* as its address)
  CAPTURE(what_text);
  Problem<double, ExecSpace> a;
  const auto w0 = a.values();
  ShampooOf<double, ExecSpace, Pre, lather::AdamGrafting> opt(
      a.params, {.lr = 1.0, .betas = {0.9, 0.999}, .epsilon = 1e-6, .max_preconditioner_dim = 8}, pre,
      {.beta2 = 0.999, .epsilon = 1e-8});
  a.set_grads(1);
  opt.step(ExecSpace(), a.grads);
  const auto w1 = a.values();
  for (std::size_t i = 0; i < 2; ++i) {
    const auto gv = lather::test::random_values(w0[i].size(), (i == 0 ? 100 : 200) + 1);
    double want = 0, got = 0;
    for (std::size_t e = 0; e < gv.size(); ++e) {
      const double gr = gv[e] / (std::sqrt(gv[e] * gv[e]) + 1e-8);
      want += gr * gr;
      got += (w1[i][e] - w0[i][e]) * (w1[i][e] - w0[i][e]);
    }
    CHECK(std::sqrt(got) == doctest::Approx(std::sqrt(want)).epsilon(1e-12));
  }
}

// Saving after k steps and resuming in a new optimizer continues bit-identically; a dictionary
// of another preconditioner is rejected by name.
template <class ExecSpace, class Pre>
void resume(const Pre& pre, const lather::ShampooOptions& o, const char* what) {
  const std::string what_text(what);  // (doctest shows a const char* as its address)
  CAPTURE(what_text);
  using S = ShampooOf<double, ExecSpace, Pre>;
  Problem<double, ExecSpace> a, b;
  S first(a.params, o, pre);
  for (int t = 1; t <= 3; ++t) {
    a.set_grads(t);
    first.step(ExecSpace(), a.grads);
  }
  const auto saved = first.state_dict();
  const auto saved_params = a.values();
  for (std::size_t i = 0; i < 2; ++i) lather::test::from_host(b.params[i], saved_params[i]);
  S second(b.params, o, pre);
  second.load_state_dict(saved);
  CHECK(second.state_dict() == saved);
  for (int t = 4; t <= 7; ++t) {
    a.set_grads(t);
    b.set_grads(t);
    first.step(ExecSpace(), a.grads);
    second.step(ExecSpace(), b.grads);
    CHECK(a.values() == b.values());
  }
  CHECK(first.state_dict() == second.state_dict());
  ShampooOf<double, ExecSpace, lather::EigenRootInverse> classic(b.params, o);
  if (!std::is_same_v<Pre, lather::EigenRootInverse>)
    CHECK_THROWS_WITH_AS(classic.load_state_dict(saved), Contains("saved with another preconditioner"),
                         lather::invalid_argument);
}

// float parameters and factors: the same trajectory as double to float accuracy.
template <class ExecSpace, class Pre>
void float_close(const Pre& pre, const lather::ShampooOptions& o, double tol, const char* what) {
  const std::string what_text(what);  // (doctest shows a const char* as its address)
  CAPTURE(what_text);
  Problem<double, ExecSpace> a;
  Problem<float, ExecSpace> b;
  ShampooOf<double, ExecSpace, Pre> d(a.params, o, pre);
  ShampooOf<float, ExecSpace, Pre> f(b.params, o, pre);
  for (int t = 1; t <= 4; ++t) {
    a.set_grads(t);
    b.set_grads(t);
    d.step(ExecSpace(), a.grads);
    f.step(ExecSpace(), b.grads);
  }
  const auto va = a.values(), vb = b.values();
  for (std::size_t i = 0; i < 2; ++i) lather::test::all_close(vb[i], va[i], tol, tol, what);
}

template <class ExecSpace>
void impl_test_every_variant() {
  const lather::ShampooOptions o{.lr = 0.01, .betas = {0.9, 0.999}, .epsilon = 1e-4, .weight_decay = 0.01,
                                 .max_preconditioner_dim = 4, .precondition_frequency = 2};
  const lather::ShampooOptions spectral{.lr = 0.01, .betas = {0.9, 0.999}, .weight_decay = 0.01,
                                        .max_preconditioner_dim = lather::unbounded};
  const lather::ShampooOptions gpa{.lr = 0.01, .betas = {0.9, 0.999}, .epsilon = 1e-4, .weight_decay = 0.01,
                                   .max_preconditioner_dim = 4,
                                   .iterate_averaging = lather::IterateAveraging::schedule_free};
  grafted_norm<ExecSpace>(lather::EigenvalueCorrectedShampoo<>{}, "eigenvalue corrected");
  grafted_norm<ExecSpace>(lather::SOAP{}, "SOAP");
  grafted_norm<ExecSpace>(lather::EigendecomposedShampoo<>{}, "eigendecomposed");
  grafted_norm<ExecSpace>(lather::KLShampoo<>{}, "KL");
  grafted_norm<ExecSpace>(lather::SignDescent{}, "sign");
  resume<ExecSpace>(lather::EigenvalueCorrectedShampoo<>{}, o, "eigenvalue corrected");
  resume<ExecSpace>(lather::SOAP{}, o, "SOAP");
  resume<ExecSpace>(lather::EigendecomposedShampoo<lather::QREigendecomposition>{}, o, "eigendecomposed (qr)");
  resume<ExecSpace>(lather::KLShampoo<>{}, o, "KL");
  resume<ExecSpace>(lather::SignDescent{}, o, "sign");
  resume<ExecSpace>(lather::EigenRootInverse{}, gpa, "Schedule-Free");
  float_close<ExecSpace>(lather::EigenvalueCorrectedShampoo<>{}, o, 1e-4, "eigenvalue corrected");
  float_close<ExecSpace>(lather::SOAP{}, o, 1e-4, "SOAP");
  float_close<ExecSpace>(lather::EigendecomposedShampoo<>{}, o, 1e-4, "eigendecomposed");
  float_close<ExecSpace>(lather::KLShampoo<>{}, o, 1e-4, "KL");
  // The (3,) bias of the Problem is 1-D: Muon runs on matrices, so test it on the (5, 3) weight only.
  Problem<double, ExecSpace> a, b;
  Problem<float, ExecSpace> c;
  using PD = lather::TensorRef<double, typename ExecSpace::memory_space>;
  using PF = lather::TensorRef<float, typename ExecSpace::memory_space>;
  std::vector<PD> pa{a.params[0]}, pb{b.params[0]};
  std::vector<PF> pc{c.params[0]};
  ShampooOf<double, ExecSpace, lather::Muon> m1(pa, spectral);
  ShampooOf<float, ExecSpace, lather::Muon> mf(pc, spectral);
  for (int t = 1; t <= 3; ++t) {
    a.set_grads(t);
    b.set_grads(t);
    c.set_grads(t);
    m1.step(ExecSpace(), std::vector{a.grads[0]});
    mf.step(ExecSpace(), std::vector{c.grads[0]});
  }
  lather::test::all_close(lather::test::to_host(pc[0]), lather::test::to_host(pa[0]), 1e-4, 1e-5, "Muon float");
  const auto saved = m1.state_dict();
  ShampooOf<double, ExecSpace, lather::Muon> m2(pb, spectral);
  lather::test::from_host(pb[0], lather::test::to_host(pa[0]));
  m2.load_state_dict(saved);
  for (int t = 4; t <= 6; ++t) {
    a.set_grads(t);
    b.set_grads(t);
    m1.step(ExecSpace(), std::vector{a.grads[0]});
    m2.step(ExecSpace(), std::vector{b.grads[0]});
    CHECK(lather::test::to_host(pa[0]) == lather::test::to_host(pb[0]));
  }
}

// The root steps of every policy computed side by side on a host space's threads (one factor per
// task, since the thirty-fifth session for the eigenbasis kinds and KL-Shampoo) give the bits of
// the sequential loop (block concurrency off): same LAPACK and BLAS calls per factor, both
// single-threaded under the tests' environment. Where a space has one thread, or is a device,
// neither runs side by side and both must agree all the more.
template <class T, class ExecSpace, class Pre>
void roots_side_by_side(const Pre& pre, const char* what) {
  const std::string what_text(what);  // (doctest shows a const char* as its address)
  CAPTURE(what_text);
  const lather::ShampooOptions o{.lr = 0.01, .betas = {0.9, 0.999}, .epsilon = 1e-4, .weight_decay = 0.01,
                                 .max_preconditioner_dim = 4, .precondition_frequency = 2};
  Problem<T, ExecSpace> a, b;
  ShampooOf<T, ExecSpace, Pre> together(a.params, o, pre), apart(b.params, o, pre);
  apart.set_block_concurrency(false);
  constexpr bool host = Kokkos::SpaceAccessibility<Kokkos::HostSpace, typename ExecSpace::memory_space>::accessible;
  const bool threads = Kokkos::Experimental::UniqueToken<ExecSpace>(ExecSpace()).size() > 1;
  int side_by_side_steps = 0;
  for (int t = 1; t <= 6; ++t) {
    CAPTURE(t);
    a.set_grads(t);
    b.set_grads(t);
    together.step(ExecSpace(), a.grads);
    apart.step(ExecSpace(), b.grads);
    CHECK(a.values() == b.values());
    const bool roots = together.last_step_info().amortized;
    CHECK(apart.last_step_info().roots_side_by_side == 0);
    // (5, 3) at block size 4: blocks (4, 3) and (1, 3), and the (3,) bias: five factors.
    CHECK(together.last_step_info().roots_side_by_side == (roots && host && threads ? 5 : 0));
    side_by_side_steps += together.last_step_info().roots_side_by_side > 0 ? 1 : 0;
  }
  CHECK(together.state_dict() == apart.state_dict());
  CHECK(side_by_side_steps == (host && threads ? 3 : 0));
}

template <class ExecSpace>
void impl_test_roots_side_by_side() {
  roots_side_by_side<double, ExecSpace>(lather::EigenRootInverse{}, "root inverse");
  roots_side_by_side<double, ExecSpace>(lather::EigendecomposedShampoo<>{}, "eigendecomposed, eigh");
  roots_side_by_side<float, ExecSpace>(lather::EigendecomposedShampoo<>{}, "eigendecomposed, eigh, float");
  roots_side_by_side<float, ExecSpace>(lather::EigendecomposedShampoo<>{.amortized = {.compute_in_double = true}},
                                       "eigendecomposed, eigh in double, float");
  roots_side_by_side<double, ExecSpace>(lather::EigendecomposedShampoo<lather::QREigendecomposition>{},
                                        "eigendecomposed, QR");
  roots_side_by_side<double, ExecSpace>(lather::EigenvalueCorrectedShampoo<>{}, "eigenvalue corrected");
  roots_side_by_side<double, ExecSpace>(lather::EigenvalueCorrectedShampoo<>{.amortized = {.tolerance = 0.3}},
                                        "eigenvalue corrected, adaptive skip");
  roots_side_by_side<double, ExecSpace>(lather::SOAP{}, "SOAP");
  roots_side_by_side<float, ExecSpace>(lather::SOAP{}, "SOAP, float");
  roots_side_by_side<double, ExecSpace>(lather::KLShampoo<>{}, "KL");
  roots_side_by_side<double, ExecSpace>(lather::KLShampoo<lather::EigendecomposedShampoo<>>{}, "KL, eigendecomposed");
}

// Eigenvalue-corrected Shampoo and SOAP run a block's whole step as a fused host task (since the
// thirty-sixth session; on any number of threads), KL-Shampoo a parameter's blocks as host tasks
// per phase on several threads (factor updates with the gradient preconditioned along the other
// dimensions first, then the directions; since the thirty-fifth session): the per-parameter
// path's numbers (block concurrency off). Small blocks (the Problem at block size 4, whose products
// the per-parameter path does not split over the threads) agree bit for bit; blocks of 96 (a
// (200, 150) parameter and a (150,) one) to a few units in the last place, the rotations run
// whole in a task and possibly split over the threads otherwise.
template <class ExecSpace, class Pre>
void corrected_block_tasks(const Pre& pre, int phases, bool fused, const char* what) {
  const std::string what_text(what);  // (doctest shows a const char* as its address)
  CAPTURE(what_text);
  using M = typename ExecSpace::memory_space;
  using P = lather::TensorRef<double, M>;
  constexpr bool host = Kokkos::SpaceAccessibility<Kokkos::HostSpace, M>::accessible;
  const bool threads = Kokkos::Experimental::UniqueToken<ExecSpace>(ExecSpace()).size() > 1;
  const lather::ShampooOptions small{.lr = 0.01, .betas = {0.9, 0.999}, .epsilon = 1e-4, .weight_decay = 0.01,
                                     .max_preconditioner_dim = 4, .precondition_frequency = 2};
  {
    Problem<double, ExecSpace> a, b;
    ShampooOf<double, ExecSpace, Pre, lather::AdamGrafting> tasks(a.params, small, pre), one(b.params, small, pre);
    one.set_block_concurrency(false);
    for (int t = 1; t <= 6; ++t) {
      CAPTURE(t);
      a.set_grads(t);
      b.set_grads(t);
      tasks.step(ExecSpace(), a.grads);
      one.step(ExecSpace(), b.grads);
      CHECK(a.values() == b.values());
      CHECK(one.last_step_info().block_tasks == 0);
      CHECK(one.last_step_info().fused_blocks == 0);
      if (fused) {
        // Blocks (4, 3) and (1, 3) of the weight and the bias's, each a fused task on any number
        // of threads (twice on root steps: factors, then the rest).
        CHECK(tasks.last_step_info().block_tasks == 0);
        CHECK(tasks.last_step_info().fused_blocks == (host ? (tasks.last_step_info().amortized ? 6 : 3) : 0));
        continue;
      }
      // Blocks (4, 3) and (1, 3) of the weight, one of the bias (not a task: a single block), each
      // phase with its own tasks: factor updates, the correction's update (eigenvalue-corrected)
      // and the direction (not on step 1, before the first root step: grafted only).
      CHECK(tasks.last_step_info().block_tasks == (host && threads ? (t == 1 ? phases - 1 : phases) * 2 : 0));
    }
    CHECK(tasks.state_dict() == one.state_dict());
  }
  lather::ShampooOptions large = small;
  large.max_preconditioner_dim = 96;
  Kokkos::View<double**, Kokkos::LayoutRight, M> w1("w1", 200, 150), w2("w2", 200, 150), g("g", 200, 150);
  Kokkos::View<double*, M> v1("v1", 150), v2("v2", 150), gv("gv", 150);
  std::vector<P> p1{lather::tensor_ref(w1), lather::tensor_ref(v1)}, p2{lather::tensor_ref(w2), lather::tensor_ref(v2)};
  std::vector<P> grads{lather::tensor_ref(g), lather::tensor_ref(gv)};
  for (auto* p : {&p1, &p2}) {
    lather::test::from_host((*p)[0], lather::test::random_values(30000, 31));
    lather::test::from_host((*p)[1], lather::test::random_values(150, 32));
  }
  ShampooOf<double, ExecSpace, Pre> tasks(p1, large, pre), one(p2, large, pre);
  one.set_block_concurrency(false);
  for (int t = 1; t <= 5; ++t) {
    CAPTURE(t);
    lather::test::from_host(grads[0], lather::test::random_values(30000, 300 + t));
    lather::test::from_host(grads[1], lather::test::random_values(150, 400 + t));
    tasks.step(ExecSpace(), grads);
    one.step(ExecSpace(), grads);
    // (200, 150) at 96: blocks (96, 96), (96, 54), (96, 96), (96, 54), (8, 96), (8, 54); (150,): 96, 54.
    if (fused)
      CHECK(tasks.last_step_info().fused_blocks == (host ? (tasks.last_step_info().amortized ? 2 : 1) * (6 + 2) : 0));
    else
      CHECK(tasks.last_step_info().block_tasks == (host && threads ? phases * (6 + 2) : 0));
    for (std::size_t i = 0; i < p1.size(); ++i)
      lather::test::all_close(lather::test::to_host(p1[i]), lather::test::to_host(p2[i]), 1e-11, 1e-13, what);
  }
}

template <class ExecSpace>
void impl_test_corrected_block_tasks() {
  corrected_block_tasks<ExecSpace>(lather::EigenvalueCorrectedShampoo<>{}, 3, true, "eigenvalue corrected");
  corrected_block_tasks<ExecSpace>(lather::SOAP{}, 3, true, "SOAP");
  corrected_block_tasks<ExecSpace>(lather::KLShampoo<>{}, 2, false, "KL");
  corrected_block_tasks<ExecSpace>(lather::KLShampoo<lather::EigendecomposedShampoo<>>{}, 2, false, "KL, eigendecomposed");
}

// A failing factor among the roots side by side raises the sequential loop's error and changes
// nothing: the (4, 3) block's factors fail (a huge gradient entry), the (1, 3) block's and the
// bias's, computed on the other thread, are not committed.
template <class ExecSpace, class Pre>
void roots_side_by_side_failure(const Pre& pre, const char* what) {
  const std::string what_text(what);  // (doctest shows a const char* as its address)
  CAPTURE(what_text);
  Problem<double, ExecSpace> a;
  ShampooOf<double, ExecSpace, Pre> opt(a.params, {.lr = 0.01, .max_preconditioner_dim = 4, .precondition_frequency = 2},
                                        pre);
  for (int t = 1; t <= 3; ++t) {
    a.set_grads(t);
    opt.step(ExecSpace(), a.grads);
  }
  const auto before = opt.state_dict();
  const auto params = a.values();
  a.set_grads(4);
  auto gv = lather::test::random_values(15, 104);
  gv[0] = 1e200;
  lather::test::from_host(a.grads[0], gv);
  CHECK_THROWS_WITH_AS(opt.step(ExecSpace(), a.grads), Contains("of block 0 of parameter 0 has"), lather::runtime_error);
  CHECK(opt.state_dict() == before);
  CHECK(a.values() == params);
  // And the optimizer goes on as if the failed step had not been taken.
  a.set_grads(4);
  opt.step(ExecSpace(), a.grads);
  CHECK(opt.last_step_info().amortized);
}

template <class ExecSpace>
void impl_test_roots_side_by_side_failure() {
  roots_side_by_side_failure<ExecSpace>(lather::EigendecomposedShampoo<>{}, "eigendecomposed");
  roots_side_by_side_failure<ExecSpace>(lather::EigenvalueCorrectedShampoo<>{}, "eigenvalue corrected");
  roots_side_by_side_failure<ExecSpace>(lather::SOAP{}, "SOAP");
  roots_side_by_side_failure<ExecSpace>(lather::KLShampoo<>{}, "KL");
}

// A NaN in the eigenvalue-corrected factor (huge gradients) raises and changes nothing.
template <class ExecSpace>
void impl_test_ec_failure() {
  Problem<double, ExecSpace> a;
  ShampooOf<double, ExecSpace, lather::EigenvalueCorrectedShampoo<>> opt(a.params, {.lr = 0.01, .max_preconditioner_dim = 8});
  a.set_grads(1);
  opt.step(ExecSpace(), a.grads);
  const auto before = opt.state_dict();
  const auto params = a.values();
  // One huge entry overflows its Gram entries to +inf (no inf - inf, which would raise FE_INVALID
  // in the BLAS under the test harness's floating-point traps).
  a.set_grads(2);
  auto gv = lather::test::random_values(15, 102);
  gv[0] = 1e200;
  lather::test::from_host(a.grads[0], gv);
  CHECK_THROWS_WITH_AS(opt.step(ExecSpace(), a.grads), Contains("NaN or Inf entries; nothing was changed"),
                       lather::runtime_error);
  CHECK(opt.state_dict() == before);
  CHECK(a.values() == params);
}

}  // namespace

TEST_CASE_TEMPLATE_DEFINE("shampoo family: eigenvalue correction without basis change is Adam/AdaGrad/RMSprop",
                          ExecSpace, family_ec_diagonal) {
  impl_test_ec_diagonal<ExecSpace>();
}
TEST_CASE_TEMPLATE_APPLY(family_ec_diagonal, lather_test_exec_spaces);

TEST_CASE_TEMPLATE_DEFINE("shampoo family: eigenvalue-corrected golden values (G3)", ExecSpace, family_ec_golden) {
  impl_test_ec_golden<ExecSpace>();
}
TEST_CASE_TEMPLATE_APPLY(family_ec_golden, lather_test_exec_spaces);

#ifdef LATHER_ENABLE_EIGEN
TEST_CASE_TEMPLATE_DEFINE("shampoo family: eigenvalue correction at step 1 (polar factor)", ExecSpace, family_ec_polar) {
  impl_test_ec_polar<ExecSpace>();
}
TEST_CASE_TEMPLATE_APPLY(family_ec_polar, lather_test_exec_spaces);

TEST_CASE_TEMPLATE_DEFINE("shampoo family: KL-Shampoo against an independent reference", ExecSpace, family_kl) {
  impl_test_kl<ExecSpace>();
}
TEST_CASE_TEMPLATE_APPLY(family_kl, lather_test_exec_spaces);

TEST_CASE_TEMPLATE_DEFINE("shampoo family: Newton-Schulz and SVD orthogonalization", ExecSpace, family_spectral) {
  impl_test_spectral<ExecSpace>();
}
TEST_CASE_TEMPLATE_APPLY(family_spectral, lather_test_exec_spaces);
#endif

TEST_CASE_TEMPLATE_DEFINE("shampoo family: SOAP's QR refresh converges to eigh", ExecSpace, family_qr) {
  impl_test_qr_converges<ExecSpace>();
}
TEST_CASE_TEMPLATE_APPLY(family_qr, lather_test_exec_spaces);

TEST_CASE_TEMPLATE_DEFINE("shampoo family: eigendecomposed Shampoo", ExecSpace, family_eigendecomposed) {
  impl_test_eigendecomposed<ExecSpace>();
}
TEST_CASE_TEMPLATE_APPLY(family_eigendecomposed, lather_test_exec_spaces);

TEST_CASE_TEMPLATE_DEFINE("shampoo family: sign descent", ExecSpace, family_sign) { impl_test_sign<ExecSpace>(); }
TEST_CASE_TEMPLATE_APPLY(family_sign, lather_test_exec_spaces);

TEST_CASE_TEMPLATE_DEFINE("shampoo family: iterate averaging (GPA, Schedule-Free)", ExecSpace, family_averaging) {
  impl_test_averaging<ExecSpace>();
}
TEST_CASE_TEMPLATE_APPLY(family_averaging, lather_test_exec_spaces);

TEST_CASE_TEMPLATE_DEFINE("shampoo family: grafting, float precision and resume for every variant", ExecSpace,
                          family_every) {
  impl_test_every_variant<ExecSpace>();
}
TEST_CASE_TEMPLATE_APPLY(family_every, lather_test_exec_spaces);

TEST_CASE_TEMPLATE_DEFINE("shampoo family: every policy's roots side by side on a host's threads, the sequential bits",
                          ExecSpace, family_roots_side_by_side) {
  impl_test_roots_side_by_side<ExecSpace>();
}
TEST_CASE_TEMPLATE_APPLY(family_roots_side_by_side, lather_test_exec_spaces);

TEST_CASE_TEMPLATE_DEFINE("shampoo family: eigenvalue-corrected and KL blocks as host tasks, the per-parameter path's numbers",
                          ExecSpace, family_corrected_block_tasks) {
  impl_test_corrected_block_tasks<ExecSpace>();
}
TEST_CASE_TEMPLATE_APPLY(family_corrected_block_tasks, lather_test_exec_spaces);

TEST_CASE_TEMPLATE_DEFINE("shampoo family: a failing factor among the roots side by side raises and changes nothing",
                          ExecSpace, family_roots_side_by_side_failure) {
  impl_test_roots_side_by_side_failure<ExecSpace>();
}
TEST_CASE_TEMPLATE_APPLY(family_roots_side_by_side_failure, lather_test_exec_spaces);

TEST_CASE_TEMPLATE_DEFINE("shampoo family: a non-finite factor raises and changes nothing", ExecSpace, family_failure) {
  impl_test_ec_failure<ExecSpace>();
}
TEST_CASE_TEMPLATE_APPLY(family_failure, lather_test_exec_spaces);
