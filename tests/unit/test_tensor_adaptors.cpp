// SPDX-License-Identifier: Apache-2.0
// The tensor customization point: Kokkos Views of every strided layout and rank 0-4, Eigen
// matrices, vectors, maps (col- and row-major, strided), raw pointer + shape, and optimizers
// constructed over each of them.
#include <lather/config.hpp>  // LATHER_ENABLE_EIGEN, read below
#include <lather/concepts/execution.hpp>
#include <lather/concepts/tensor.hpp>
#include <lather/optimizers/adam.hpp>
#include <lather/optimizers/sgd.hpp>
#ifdef LATHER_ENABLE_EIGEN
#include <lather/traits/eigen_matrix.hpp>
#endif

#include <Kokkos_Core.hpp>

#include <doctest/doctest.h>

#include "exec_spaces.hpp"
#include "test_utils.hpp"

#include <numeric>
#include <vector>

static_assert(lather::concepts::Tensor<Kokkos::View<double**>>);
static_assert(lather::concepts::Tensor<Kokkos::View<const float*, Kokkos::LayoutStride>>);
static_assert(lather::concepts::Tensor<lather::TensorRef<double>>);
static_assert(!lather::concepts::Tensor<std::vector<double>>);
static_assert(!lather::concepts::Tensor<double>);
static_assert(lather::concepts::FloatingTensor<Kokkos::View<float***>>);
static_assert(!lather::concepts::FloatingTensor<Kokkos::View<int*>>);
static_assert(lather::concepts::ExecutionSpace<Kokkos::DefaultHostExecutionSpace>);
static_assert(!lather::concepts::ExecutionSpace<Kokkos::HostSpace>);
static_assert(lather::concepts::ExecutionSpaceFor<Kokkos::DefaultHostExecutionSpace,
                                                  Kokkos::View<double*, Kokkos::HostSpace>>);
static_assert(std::is_same_v<lather::default_execution_space_t<lather::TensorRef<double>>,
                             Kokkos::DefaultHostExecutionSpace>);

TEST_CASE("tensor adaptors: TensorRef from a raw pointer and shape is row-major") {
  std::vector<double> data(24);
  std::iota(data.begin(), data.end(), 0.0);
  lather::TensorRef<double> t(data.data(), {2, 3, 4});
  CHECK(t.rank() == 3);
  CHECK(t.size() == 24);
  CHECK(t.stride(0) == 12);
  CHECK(t.stride(2) == 1);
  CHECK(t.is_row_major_contiguous());
  for (int i = 0; i < 24; ++i) CHECK(t[i] == data[i]);
  CHECK(t.shape_string() == "(2, 3, 4)");

  lather::TensorRef<double> scalar(data.data() + 5, std::span<const std::int64_t>());
  CHECK(scalar.rank() == 0);
  CHECK(scalar.size() == 1);
  CHECK(scalar[0] == 5.0);
  CHECK(scalar.shape_string() == "()");

  lather::TensorRef<double> zero(nullptr, {3, 0});
  CHECK(zero.size() == 0);

  // Strided: every other element of a (2, 6) row-major block -> (2, 3).
  const std::int64_t shape[] = {2, 3};
  const std::int64_t strides[] = {6, 2};
  lather::TensorRef<double> s(data.data(), shape, strides);
  CHECK_FALSE(s.is_row_major_contiguous());
  const double expect[] = {0, 2, 4, 6, 8, 10};
  for (int i = 0; i < 6; ++i) CHECK(s[i] == expect[i]);

  CHECK_THROWS_AS(lather::TensorRef<double>(data.data(), {2, -1}), lather::invalid_argument);
  const std::int64_t bad_strides[] = {1};
  CHECK_THROWS_AS(lather::TensorRef<double>(data.data(), shape, bad_strides), lather::invalid_argument);
}

template <class ExecSpace>
void impl_test_view_layouts() {
  using M = typename ExecSpace::memory_space;
  Kokkos::View<double**, Kokkos::LayoutLeft, M> left("left", 3, 4);
  Kokkos::View<double**, Kokkos::LayoutRight, M> right("right", 3, 4);
  // The same logical values in both layouts.
  auto hl = Kokkos::create_mirror_view(left);
  auto hr = Kokkos::create_mirror_view(right);
  for (int i = 0; i < 3; ++i)
    for (int j = 0; j < 4; ++j) hl(i, j) = hr(i, j) = 10 * i + j;
  Kokkos::deep_copy(left, hl);
  Kokkos::deep_copy(right, hr);
  auto rl = lather::tensor_ref(left);
  auto rr = lather::tensor_ref(right);
  CHECK(rl.stride(0) == 1);
  CHECK(rl.stride(1) == 3);
  CHECK_FALSE(rl.is_row_major_contiguous());
  CHECK(rr.is_row_major_contiguous());
  CHECK(lather::test::to_host(rl) == lather::test::to_host(rr));

  Kokkos::View<double****, M> v4("v4", 2, 1, 3, 2);
  auto r4 = lather::tensor_ref(v4);
  CHECK(r4.rank() == 4);
  CHECK(r4.size() == 12);
  Kokkos::View<double, M> v0_storage("v0");
  Kokkos::View<const double, M> v0 = v0_storage;
  auto r0 = lather::tensor_ref(v0);
  static_assert(std::is_same_v<decltype(r0), lather::TensorRef<const double, M>>);
  CHECK(r0.rank() == 0);

  // A subview with a non-unit stride in both dimensions.
  Kokkos::View<double**, Kokkos::LayoutRight, M> big("big", 6, 8);
  auto sub = Kokkos::subview(big, std::make_pair(1, 5), std::make_pair(2, 5));
  auto rs = lather::tensor_ref(sub);
  CHECK(rs.extent(0) == 4);
  CHECK(rs.extent(1) == 3);
  CHECK(rs.stride(0) == 8);
  CHECK(rs.stride(1) == 1);
  CHECK_FALSE(rs.is_row_major_contiguous());
}

TEST_CASE_TEMPLATE_DEFINE("tensor adaptors: Kokkos views of every strided layout", ExecSpace, view_layouts) {
  impl_test_view_layouts<ExecSpace>();
}
TEST_CASE_TEMPLATE_APPLY(view_layouts, lather_test_exec_spaces);

// An optimizer over a View type directly (class template argument deduction), and the same
// optimizer over a subview in LayoutStride, give identical results.
template <class ExecSpace>
void impl_test_view_param_types() {
  using M = typename ExecSpace::memory_space;
  Kokkos::View<double**, Kokkos::LayoutLeft, M> w("w", 4, 3);
  Kokkos::View<double**, Kokkos::LayoutRight, M> storage("storage", 4, 6);
  Kokkos::View<double**, Kokkos::LayoutStride, M> ws(storage.data(), Kokkos::LayoutStride(4, 6, 3, 2));
  const auto init = lather::test::random_values(12, 7);
  lather::test::from_host(lather::tensor_ref(w), init);
  lather::test::from_host(lather::tensor_ref(ws), init);
  std::vector<decltype(w)> pa{w};
  std::vector<decltype(ws)> pb{ws};
  lather::Adam<decltype(w), ExecSpace> a(pa, lather::AdamOptions{.lr = 0.1});
  lather::Adam<decltype(ws), ExecSpace> b(pb, lather::AdamOptions{.lr = 0.1});
  // Deduction picks the parameter type and its memory space's default execution space.
  lather::Adam deduced(pa, lather::AdamOptions{.lr = 0.1});
  static_assert(std::is_same_v<decltype(deduced), lather::Adam<decltype(w)>>);
  Kokkos::View<double**, Kokkos::LayoutRight, M> g("g", 4, 3);
  for (int t = 0; t < 4; ++t) {
    lather::test::from_host(lather::tensor_ref(g), lather::test::random_values(12, 50 + t));
    a.step(ExecSpace(), std::vector{g});
    b.step(ExecSpace(), std::vector{g});
  }
  CHECK(lather::test::to_host(lather::tensor_ref(w)) == lather::test::to_host(lather::tensor_ref(ws)));
}
TEST_CASE_TEMPLATE_DEFINE("tensor adaptors: optimizers over View types directly", ExecSpace, view_params) {
  impl_test_view_param_types<ExecSpace>();
}
TEST_CASE_TEMPLATE_APPLY(view_params, lather_test_exec_spaces);

#ifdef LATHER_ENABLE_EIGEN
static_assert(lather::concepts::Tensor<Eigen::MatrixXd>);
static_assert(lather::concepts::Tensor<Eigen::Map<Eigen::MatrixXf>>);
static_assert(lather::concepts::Tensor<Eigen::VectorXd>);
static_assert(lather::concepts::Tensor<Eigen::Ref<Eigen::MatrixXd>>);
static_assert(lather::impl::traits_of<Eigen::VectorXd>::rank == 1);
static_assert(lather::impl::traits_of<Eigen::RowVectorXd>::rank == 1);
static_assert(lather::impl::traits_of<Eigen::Matrix<double, 3, 4, Eigen::RowMajor>>::rank == 2);
static_assert(std::is_const_v<lather::impl::traits_of<Eigen::Map<const Eigen::MatrixXd>>::element_type>);

TEST_CASE("tensor adaptors: Eigen matrices keep their logical (rows, cols) order") {
  Eigen::MatrixXd col(3, 2);
  col << 1, 2, 3, 4, 5, 6;  // comma initializer is row-wise
  Eigen::Matrix<double, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor> row = col;
  auto rc = lather::tensor_ref(col);
  auto rr = lather::tensor_ref(row);
  CHECK(rc.extent(0) == 3);
  CHECK(rc.extent(1) == 2);
  const std::vector<double> expect = {1, 2, 3, 4, 5, 6};
  CHECK(lather::test::to_host(rc) == expect);
  CHECK(lather::test::to_host(rr) == expect);

  // A strided map: every other row of a 6x2 matrix.
  Eigen::MatrixXd tall(6, 2);
  tall.setZero();
  // Column-major 6x2: columns 6 apart, rows of the map 2 apart.
  Eigen::Map<Eigen::MatrixXd, 0, Eigen::Stride<6, 2>> every_other(tall.data(), 3, 2);
  every_other = col;
  auto rm = lather::tensor_ref(every_other);
  CHECK(lather::test::to_host(rm) == expect);

  const Eigen::VectorXd v = Eigen::VectorXd::LinSpaced(4, 0, 3);
  auto rv = lather::tensor_ref(v);
  static_assert(std::is_same_v<decltype(rv), lather::TensorRef<const double>>);
  CHECK(rv.rank() == 1);
  CHECK(lather::test::to_host(rv) == std::vector<double>{0, 1, 2, 3});
}

TEST_CASE("tensor adaptors: optimizers over Eigen parameters and gradients") {
  // Parameters are referenced: the optimizer updates the user's matrices in place.
  std::vector<Eigen::MatrixXd> params{Eigen::MatrixXd::Constant(2, 3, 1.0), Eigen::MatrixXd::Constant(3, 1, -1.0)};
  lather::SGD opt(params, lather::SGDOptions{.lr = 0.5});
  std::vector<Eigen::MatrixXd> grads{Eigen::MatrixXd::Constant(2, 3, 0.2), Eigen::MatrixXd::Constant(3, 1, 1.0)};
  opt.step(grads);
  CHECK(params[0](1, 2) == doctest::Approx(0.9).epsilon(1e-15));
  CHECK(params[1](2, 0) == doctest::Approx(-1.5).epsilon(1e-15));

  // Heterogeneous parameter types through TensorRef, mixing Eigen and raw pointers.
  Eigen::MatrixXf w = Eigen::MatrixXf::Ones(2, 2);
  std::vector<float> b(2, 1.0f);
  std::vector<lather::TensorRef<float>> mixed{lather::tensor_ref(w), lather::TensorRef<float>(b.data(), {2})};
  lather::Adam adam(mixed, lather::AdamOptions{.lr = 0.1});
  Eigen::MatrixXf gw = Eigen::MatrixXf::Ones(2, 2);
  std::vector<float> gb(2, -1.0f);
  adam.step(std::vector<lather::TensorRef<const float>>{lather::tensor_ref(std::as_const(gw)),
                                                        lather::TensorRef<const float>(gb.data(), {2})});
  CHECK(w(0, 0) == doctest::Approx(0.9f).epsilon(1e-6));
  CHECK(b[1] == doctest::Approx(1.1f).epsilon(1e-6));
}
#endif
