// SPDX-License-Identifier: Apache-2.0
// docs/tensors.md: adapting an application's own tensor type to lather with a tensor_traits
// specialization, then training it with Adam.
#include <lather/lather.hpp>

#include <Kokkos_Core.hpp>

#include <cstdint>
#include <cstdio>
#include <vector>

/// An application's tensor: owning, row-major, with run-time rank.
class MyTensor {
 public:
  explicit MyTensor(std::vector<std::int64_t> shape) : m_shape(std::move(shape)), m_strides(m_shape.size()) {
    std::int64_t n = 1;
    for (std::size_t i = m_shape.size(); i-- > 0;) {
      m_strides[i] = n;
      n *= m_shape[i];
    }
    m_values.assign(static_cast<std::size_t>(n), 0.0f);
  }
  [[nodiscard]] int ndim() const { return static_cast<int>(m_shape.size()); }
  [[nodiscard]] std::int64_t shape(int i) const { return m_shape[static_cast<std::size_t>(i)]; }
  [[nodiscard]] std::int64_t stride(int i) const { return m_strides[static_cast<std::size_t>(i)]; }
  [[nodiscard]] float* ptr() const { return const_cast<float*>(m_values.data()); }
  [[nodiscard]] std::vector<float>& values() { return m_values; }

 private:
  std::vector<std::int64_t> m_shape, m_strides;
  std::vector<float> m_values;
};

// [traits]
template <>
struct lather::tensor_traits<MyTensor> {
  using value_type = float;                    // scalar, without const
  using element_type = float;                  // or const float for read-only tensors
  using memory_space = Kokkos::HostSpace;      // where the data lives
  static constexpr int rank = lather::dynamic_rank;   // or a fixed rank
  static int runtime_rank(const MyTensor& t) { return t.ndim(); }
  static std::int64_t extent(const MyTensor& t, int i) { return t.shape(i); }
  static std::int64_t stride(const MyTensor& t, int i) { return t.stride(i); }  // in elements
  static float* data(const MyTensor& t) { return t.ptr(); }
};
// [traits]

static_assert(lather::concepts::FloatingTensor<MyTensor>);

int main(int argc, char** argv) {
  Kokkos::ScopeGuard guard(argc, argv);
  std::vector<MyTensor> params{MyTensor({2, 3})}, grads{MyTensor({2, 3})};
  for (auto& g : grads[0].values()) g = 1.0f;
  lather::Adam<MyTensor> opt(params, lather::AdamOptions{.lr = 0.1});
  opt.step(grads);
  // Adam's first step moves every element by lr against the gradient's sign.
  const float v = params[0].values()[4];
  std::printf("MyTensor element after one Adam step: %.6f (expected -0.1)\n", v);
  return std::abs(v + 0.1f) < 1e-6f ? 0 : 1;
}
