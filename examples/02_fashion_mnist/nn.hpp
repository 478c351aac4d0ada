// SPDX-License-Identifier: Apache-2.0
// The trainer's models: an MLP and a small convolutional net for 28x28 images and 10 classes,
// forward and backward written with Kokkos kernels and Kokkos Kernels' BLAS (gemm, gemv), on any
// execution space. Templated on the scalar type: float to train, double for the
// finite-difference gradient test.
//
// Activations are row-major (batch, features); convolution activations are NHWC so that the
// im2col product lands directly in the next layer's layout. Parameters use PyTorch's shapes
// (Linear weight (out, in), Conv2d weight (out, in, k, k)), so Shampoo sees the same tensors a
// PyTorch user's DistributedShampoo would.
#ifndef LATHER_EXAMPLES_FMNIST_NN_HPP
#define LATHER_EXAMPLES_FMNIST_NN_HPP

#include <lather/traits/tensor_traits.hpp>

#include <Kokkos_Core.hpp>
#include <KokkosBlas2_gemv.hpp>
#include <KokkosBlas3_gemm.hpp>

#include <cmath>
#include <cstdint>
#include <memory>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

namespace fmnist {

// Device-callable exp and log: Kokkos::Experimental:: in Kokkos 3.4-3.6, Kokkos:: from 3.7 on
// (the Experimental names are gone in 4.x).
template <class T>
KOKKOS_INLINE_FUNCTION T exp(T x) {
#if KOKKOS_VERSION >= 30700
  return Kokkos::exp(x);
#else
  return Kokkos::Experimental::exp(x);
#endif
}
template <class T>
KOKKOS_INLINE_FUNCTION T log(T x) {
#if KOKKOS_VERSION >= 30700
  return Kokkos::log(x);
#else
  return Kokkos::Experimental::log(x);
#endif
}

template <class T, class Mem>
using UMatrix = Kokkos::View<T**, Kokkos::LayoutRight, Mem, Kokkos::MemoryTraits<Kokkos::Unmanaged>>;
template <class T, class Mem>
using UVector = Kokkos::View<T*, Kokkos::LayoutRight, Mem, Kokkos::MemoryTraits<Kokkos::Unmanaged>>;

/// Every parameter and every gradient live in one flat buffer each: data-parallel training
/// all-reduces the gradients in one call, and ranks start identical by broadcasting one array.
template <class T, class ExecSpace>
class ParameterSet {
 public:
  using memory_space = typename ExecSpace::memory_space;
  using tensor_type = lather::TensorRef<T, memory_space>;
  struct Entry {
    std::string name;
    std::vector<std::int64_t> shape;
    std::int64_t offset = 0, numel = 1;
    double bound = 0;  ///< initialization: uniform(-bound, bound)
  };

  /// Declares a parameter (before allocate()); returns its index.
  std::size_t declare(std::string name, std::vector<std::int64_t> shape, double bound) {
    if (m_values.size() > 0) throw std::logic_error("fmnist::ParameterSet: declare after allocate");
    Entry e{std::move(name), std::move(shape), m_total, 1, bound};
    for (auto d : e.shape) e.numel *= d;
    m_total += e.numel;
    m_entries.push_back(std::move(e));
    return m_entries.size() - 1;
  }
  void allocate() {
    m_values = Kokkos::View<T*, memory_space>("fmnist::parameters", m_total);
    m_grads = Kokkos::View<T*, memory_space>("fmnist::gradients", m_total);
  }
  /// PyTorch's default Linear/Conv2d initialization (uniform in +-1/sqrt(fan_in) for weights
  /// and biases), drawn on the host with a fixed generator so that every execution space,
  /// thread count and rank count starts from the same numbers.
  void initialize(std::uint64_t seed) {
    std::mt19937_64 gen(seed);
    std::vector<T> host(static_cast<std::size_t>(m_total));
    for (const auto& e : m_entries) {
      std::uniform_real_distribution<double> u(-e.bound, e.bound);
      for (std::int64_t i = 0; i < e.numel; ++i) host[static_cast<std::size_t>(e.offset + i)] = static_cast<T>(u(gen));
    }
    Kokkos::deep_copy(m_values, Kokkos::View<const T*, Kokkos::HostSpace, Kokkos::MemoryTraits<Kokkos::Unmanaged>>(
                                    host.data(), host.size()));
  }

  [[nodiscard]] std::size_t size() const { return m_entries.size(); }
  [[nodiscard]] std::int64_t total() const { return m_total; }
  [[nodiscard]] const Entry& entry(std::size_t i) const { return m_entries[i]; }
  [[nodiscard]] T* value_data(std::size_t i) const { return m_values.data() + m_entries[i].offset; }
  [[nodiscard]] T* grad_data(std::size_t i) const { return m_grads.data() + m_entries[i].offset; }
  [[nodiscard]] tensor_type value(std::size_t i) const { return tensor_type(value_data(i), m_entries[i].shape); }
  [[nodiscard]] tensor_type grad(std::size_t i) const { return tensor_type(grad_data(i), m_entries[i].shape); }
  [[nodiscard]] std::vector<tensor_type> values() const {
    std::vector<tensor_type> v;
    for (std::size_t i = 0; i < size(); ++i) v.push_back(value(i));
    return v;
  }
  [[nodiscard]] std::vector<tensor_type> grads() const {
    std::vector<tensor_type> v;
    for (std::size_t i = 0; i < size(); ++i) v.push_back(grad(i));
    return v;
  }
  [[nodiscard]] std::vector<std::string> names() const {
    std::vector<std::string> v;
    for (const auto& e : m_entries) v.push_back(e.name);
    return v;
  }
  /// The flat buffers (all parameters / all gradients back to back).
  [[nodiscard]] const Kokkos::View<T*, memory_space>& flat_values() const { return m_values; }
  [[nodiscard]] const Kokkos::View<T*, memory_space>& flat_grads() const { return m_grads; }
  /// A parameter or gradient as a (rows, cols) row-major matrix (a Linear weight, or a Conv2d
  /// weight flattened to (out, in * k * k)).
  [[nodiscard]] UMatrix<T, memory_space> value_matrix(std::size_t i) const {
    return UMatrix<T, memory_space>(value_data(i), m_entries[i].shape[0], m_entries[i].numel / m_entries[i].shape[0]);
  }
  [[nodiscard]] UMatrix<T, memory_space> grad_matrix(std::size_t i) const {
    return UMatrix<T, memory_space>(grad_data(i), m_entries[i].shape[0], m_entries[i].numel / m_entries[i].shape[0]);
  }
  [[nodiscard]] UVector<T, memory_space> value_vector(std::size_t i) const {
    return UVector<T, memory_space>(value_data(i), m_entries[i].numel);
  }
  [[nodiscard]] UVector<T, memory_space> grad_vector(std::size_t i) const {
    return UVector<T, memory_space>(grad_data(i), m_entries[i].numel);
  }

 private:
  std::vector<Entry> m_entries;
  std::int64_t m_total = 0;
  Kokkos::View<T*, memory_space> m_values, m_grads;
};

/// The sum of the per-sample losses of a batch and how many samples it classified correctly.
struct BatchResult {
  double loss_sum = 0;
  std::int64_t correct = 0;
};

// ---- layer kernels (free functions: nvcc rejects extended lambdas in private members) ---------

/// y(n, out) = x(n, in) W(out, in)^T + b
template <class ExecSpace, class T, class Mem>
void linear_forward(const UMatrix<const T, Mem>& x, const UMatrix<T, Mem>& w, const UVector<T, Mem>& b,
                    const UMatrix<T, Mem>& y) {
  KokkosBlas::gemm("N", "T", T(1), x, w, T(0), y);
  const int n = static_cast<int>(y.extent(0)), out = static_cast<int>(y.extent(1));
  Kokkos::parallel_for(
      "fmnist::bias", Kokkos::MDRangePolicy<ExecSpace, Kokkos::Rank<2>>({0, 0}, {n, out}),
      KOKKOS_LAMBDA(int i, int o) { y(i, o) += b(o); });
}

/// gW = dy^T x, gb = dy^T 1 and, when dx is not empty, dx = dy W.
template <class ExecSpace, class T, class Mem>
void linear_backward(const UMatrix<const T, Mem>& x, const UMatrix<T, Mem>& w, const UMatrix<T, Mem>& dy,
                     const UVector<const T, Mem>& ones, const UMatrix<T, Mem>& gw, const UVector<T, Mem>& gb,
                     const UMatrix<T, Mem>& dx) {
  KokkosBlas::gemm("T", "N", T(1), dy, x, T(0), gw);
  KokkosBlas::gemv("T", T(1), dy, ones, T(0), gb);
  if (dx.data() != nullptr) KokkosBlas::gemm("N", "N", T(1), dy, w, T(0), dx);
}

template <class ExecSpace, class T, class Mem>
void relu_forward(const UVector<T, Mem>& y) {
  Kokkos::parallel_for(
      "fmnist::relu", Kokkos::RangePolicy<ExecSpace>(0, y.extent(0)), KOKKOS_LAMBDA(std::size_t i) {
        if (!(y(i) > T(0))) y(i) = T(0);
      });
}

/// dy *= (y > 0), with y the ReLU's output.
template <class ExecSpace, class T, class Mem>
void relu_backward(const UVector<const T, Mem>& y, const UVector<T, Mem>& dy) {
  Kokkos::parallel_for(
      "fmnist::relu_backward", Kokkos::RangePolicy<ExecSpace>(0, y.extent(0)), KOKKOS_LAMBDA(std::size_t i) {
        if (!(y(i) > T(0))) dy(i) = T(0);
      });
}

/// Softmax cross-entropy of each row: loss_i = logsumexp(z_i) - z_i[label_i]; dz = scale *
/// (softmax(z) - onehot). Returns the loss sum and the number of rows whose (first) arg-max is
/// the label.
template <class ExecSpace, class T, class Mem>
BatchResult softmax_cross_entropy(const UMatrix<const T, Mem>& z, const Kokkos::View<const int*, Mem>& labels,
                                  T scale, const UMatrix<T, Mem>& dz) {
  const int n = static_cast<int>(z.extent(0)), classes = static_cast<int>(z.extent(1));
  const bool want_grad = dz.data() != nullptr;
  double loss = 0;
  std::int64_t correct = 0;
  Kokkos::parallel_reduce(
      "fmnist::softmax_cross_entropy", Kokkos::RangePolicy<ExecSpace>(0, n),
      KOKKOS_LAMBDA(int i, double& acc) {
        T m = z(i, 0);
        for (int c = 1; c < classes; ++c) m = z(i, c) > m ? z(i, c) : m;
        T s = 0;
        for (int c = 0; c < classes; ++c) s += fmnist::exp(z(i, c) - m);
        const int y = labels(i);
        acc += static_cast<double>(fmnist::log(s) + m - z(i, y));
        if (want_grad)
          for (int c = 0; c < classes; ++c)
            dz(i, c) = scale * (fmnist::exp(z(i, c) - m) / s - (c == y ? T(1) : T(0)));
      },
      loss);
  Kokkos::parallel_reduce(
      "fmnist::accuracy", Kokkos::RangePolicy<ExecSpace>(0, n),
      KOKKOS_LAMBDA(int i, std::int64_t& acc) {
        int best = 0;
        for (int c = 1; c < classes; ++c)
          if (z(i, c) > z(i, best)) best = c;
        acc += best == labels(i) ? 1 : 0;
      },
      correct);
  return {loss, correct};
}

/// im2col for a stride-1, 'same'-padded k x k convolution of NHWC input x (n, h, w, c):
/// cols(b h w + y w + x, (ci k + i) k + j) = x(b, y + i - p, x + j - p, ci), zero outside.
/// The column order matches a PyTorch Conv2d weight (out, in, k, k) flattened row-major.
template <class ExecSpace, class T, class Mem>
void im2col(const UVector<const T, Mem>& x, int n, int h, int w, int c, int k, const UMatrix<T, Mem>& cols) {
  const int p = (k - 1) / 2, hw = h * w;
  Kokkos::parallel_for(
      "fmnist::im2col", Kokkos::MDRangePolicy<ExecSpace, Kokkos::Rank<2>>({0, 0}, {n * hw, c * k * k}),
      KOKKOS_LAMBDA(int r, int q) {
        const int b = r / hw, yx = r % hw, y = yx / w, xx = yx % w;
        const int ci = q / (k * k), ij = q % (k * k), i = ij / k, j = ij % k;
        const int sy = y + i - p, sx = xx + j - p;
        cols(r, q) = (sy >= 0 && sy < h && sx >= 0 && sx < w) ? x(((b * h + sy) * w + sx) * c + ci) : T(0);
      });
}

/// The adjoint of im2col, written as a gather (no atomics): dx(b, y, x, ci) = sum over (i, j)
/// of dcols(b h w + (y - i + p) w + (x - j + p), (ci k + i) k + j).
template <class ExecSpace, class T, class Mem>
void col2im(const UMatrix<const T, Mem>& dcols, int n, int h, int w, int c, int k, const UVector<T, Mem>& dx) {
  const int p = (k - 1) / 2;
  Kokkos::parallel_for(
      "fmnist::col2im", Kokkos::RangePolicy<ExecSpace>(0, n * h * w * c), KOKKOS_LAMBDA(int e) {
        const int ci = e % c, pix = e / c, xx = pix % w, y = (pix / w) % h, b = pix / (w * h);
        T s = 0;
        for (int i = 0; i < k; ++i) {
          const int oy = y - i + p;
          if (oy < 0 || oy >= h) continue;
          for (int j = 0; j < k; ++j) {
            const int ox = xx - j + p;
            if (ox < 0 || ox >= w) continue;
            s += dcols((b * h + oy) * w + ox, (ci * k + i) * k + j);
          }
        }
        dx(e) = s;
      });
}

/// 2x2 max pooling of NHWC x (n, h, w, c) into (n, h/2, w/2, c); `arg` records which of the
/// four inputs won (row-major 0..3, the first on ties).
template <class ExecSpace, class T, class Mem>
void maxpool_forward(const UVector<const T, Mem>& x, int n, int h, int w, int c, const UVector<T, Mem>& y,
                     const Kokkos::View<int*, Mem>& arg) {
  const int ho = h / 2, wo = w / 2;
  Kokkos::parallel_for(
      "fmnist::maxpool", Kokkos::RangePolicy<ExecSpace>(0, n * ho * wo * c), KOKKOS_LAMBDA(int e) {
        const int ci = e % c, pix = e / c, ox = pix % wo, oy = (pix / wo) % ho, b = pix / (wo * ho);
        int best = 0;
        T m = x(((b * h + 2 * oy) * w + 2 * ox) * c + ci);
        for (int q = 1; q < 4; ++q) {
          const T v = x(((b * h + 2 * oy + q / 2) * w + 2 * ox + q % 2) * c + ci);
          if (v > m) {
            m = v;
            best = q;
          }
        }
        y(e) = m;
        arg(e) = best;
      });
}

/// dx(b, y, x, c) = dy(b, y/2, x/2, c) where (y, x) won its pooling window, else 0 (a gather).
template <class ExecSpace, class T, class Mem>
void maxpool_backward(const UVector<const T, Mem>& dy, const Kokkos::View<const int*, Mem>& arg, int n, int h, int w,
                      int c, const UVector<T, Mem>& dx) {
  const int ho = h / 2, wo = w / 2;
  Kokkos::parallel_for(
      "fmnist::maxpool_backward", Kokkos::RangePolicy<ExecSpace>(0, n * h * w * c), KOKKOS_LAMBDA(int e) {
        const int ci = e % c, pix = e / c, xx = pix % w, y = (pix / w) % h, b = pix / (w * h);
        const int o = ((b * ho + y / 2) * wo + xx / 2) * c + ci;
        dx(e) = arg(o) == (y % 2) * 2 + (xx % 2) ? dy(o) : T(0);
      });
}

// ---- models ----------------------------------------------------------------------------------

/// A classifier of (n, 784) inputs into 10 classes. forward_backward writes the gradient of
/// grad_scale * (sum of the batch's losses) into the parameter set's gradient buffer.
template <class T, class ExecSpace>
class Model {
 public:
  using memory_space = typename ExecSpace::memory_space;
  using matrix = UMatrix<T, memory_space>;
  using const_matrix = UMatrix<const T, memory_space>;
  using vector = UVector<T, memory_space>;
  using const_vector = UVector<const T, memory_space>;
  using labels_type = Kokkos::View<const int*, memory_space>;

  static constexpr int input_size = 784;
  static constexpr int classes = 10;

  virtual ~Model() = default;
  [[nodiscard]] virtual std::string name() const = 0;
  [[nodiscard]] virtual BatchResult forward_backward(const const_matrix& x, const labels_type& labels,
                                                     T grad_scale) = 0;
  [[nodiscard]] virtual BatchResult forward(const const_matrix& x, const labels_type& labels) = 0;
  [[nodiscard]] ParameterSet<T, ExecSpace>& parameters() { return m_params; }
  [[nodiscard]] const ParameterSet<T, ExecSpace>& parameters() const { return m_params; }
  [[nodiscard]] int max_batch() const { return m_max_batch; }

 protected:
  explicit Model(int max_batch) : m_max_batch(max_batch) {
    if (max_batch < 1) throw std::invalid_argument("fmnist::Model: the batch capacity must be at least 1");
    m_ones = Kokkos::View<T*, memory_space>("fmnist::ones", static_cast<std::size_t>(max_batch) * 28 * 28);
    Kokkos::deep_copy(m_ones, T(1));
  }
  /// A scratch buffer of at least `n` elements, viewed as (rows, cols).
  static matrix as_matrix(const Kokkos::View<T*, memory_space>& buf, int rows, int cols) {
    return matrix(buf.data(), rows, cols);
  }
  static vector as_vector(const Kokkos::View<T*, memory_space>& buf, std::size_t n) { return vector(buf.data(), n); }
  const_vector ones(int n) const { return const_vector(m_ones.data(), static_cast<std::size_t>(n)); }
  void check_batch(const const_matrix& x, const labels_type& labels) const {
    if (x.extent(0) > static_cast<std::size_t>(m_max_batch) || x.extent(1) != std::size_t(input_size) ||
        labels.extent(0) != x.extent(0))
      throw std::invalid_argument("fmnist::" + name() + ": batch of shape (" + std::to_string(x.extent(0)) + ", " +
                                  std::to_string(x.extent(1)) + ") with " + std::to_string(labels.extent(0)) +
                                  " labels; expected (<= " + std::to_string(m_max_batch) + ", 784) and one label per row");
  }

  ParameterSet<T, ExecSpace> m_params;
  int m_max_batch;
  Kokkos::View<T*, memory_space> m_ones;
};

/// Multi-layer perceptron: Linear + ReLU for each hidden width, then a Linear to 10 classes.
template <class T, class ExecSpace>
class Mlp final : public Model<T, ExecSpace> {
  using base = Model<T, ExecSpace>;

 public:
  using typename base::const_matrix;
  using typename base::labels_type;
  using typename base::matrix;
  using typename base::memory_space;
  using typename base::vector;

  Mlp(int max_batch, std::vector<int> hidden = {512, 256}) : base(max_batch), m_widths{base::input_size} {
    for (int h : hidden) {
      if (h < 1) throw std::invalid_argument("fmnist::Mlp: hidden widths must be positive");
      m_widths.push_back(h);
    }
    m_widths.push_back(base::classes);
    for (std::size_t l = 0; l + 1 < m_widths.size(); ++l) {
      const double bound = 1.0 / std::sqrt(static_cast<double>(m_widths[l]));
      const auto tag = "fc" + std::to_string(l + 1);
      this->m_params.declare(tag + ".weight", {m_widths[l + 1], m_widths[l]}, bound);
      this->m_params.declare(tag + ".bias", {m_widths[l + 1]}, bound);
      m_act.emplace_back("fmnist::mlp::activation", static_cast<std::size_t>(max_batch) * m_widths[l + 1]);
    }
    this->m_params.allocate();
    int widest = 0;
    for (int w : m_widths) widest = std::max(widest, w);
    m_delta[0] = Kokkos::View<T*, memory_space>("fmnist::mlp::delta0", static_cast<std::size_t>(max_batch) * widest);
    m_delta[1] = Kokkos::View<T*, memory_space>("fmnist::mlp::delta1", static_cast<std::size_t>(max_batch) * widest);
  }

  [[nodiscard]] std::string name() const override {
    // Appended piece by piece: GCC 12 warned (-Wrestrict, a false positive) on `" " + to_string(w)`.
    std::string s = "mlp";
    for (std::size_t l = 0; l < m_widths.size(); ++l) {
      s += l == 0 ? ' ' : '-';
      s += std::to_string(m_widths[l]);
    }
    return s;
  }

  BatchResult forward(const const_matrix& x, const labels_type& labels) override {
    this->check_batch(x, labels);
    const int n = static_cast<int>(x.extent(0));
    run_forward(x, n);
    return softmax_cross_entropy<ExecSpace, T, memory_space>(output(n), labels, T(0), matrix());
  }

  BatchResult forward_backward(const const_matrix& x, const labels_type& labels, T grad_scale) override {
    this->check_batch(x, labels);
    const int n = static_cast<int>(x.extent(0));
    const std::size_t layers = m_widths.size() - 1;
    run_forward(x, n);
    auto& p = this->m_params;
    int cur = 0;
    auto delta = [&](int which, int cols) { return base::as_matrix(m_delta[which], n, cols); };
    const auto result = softmax_cross_entropy<ExecSpace, T, memory_space>(output(n), labels, grad_scale,
                                                                         delta(cur, m_widths.back()));
    for (std::size_t l = layers; l-- > 0;) {
      const const_matrix in = l == 0 ? x : const_matrix(activation(l - 1, n));
      const matrix dx = l == 0 ? matrix() : delta(1 - cur, m_widths[l]);
      linear_backward<ExecSpace, T, memory_space>(in, p.value_matrix(2 * l), delta(cur, m_widths[l + 1]),
                                                  this->ones(n), p.grad_matrix(2 * l), p.grad_vector(2 * l + 1), dx);
      if (l > 0) {
        relu_backward<ExecSpace, T, memory_space>(base::as_vector(m_act[l - 1], std::size_t(n) * m_widths[l]),
                                                  base::as_vector(m_delta[1 - cur], std::size_t(n) * m_widths[l]));
        cur = 1 - cur;
      }
    }
    return result;
  }

 private:
  matrix activation(std::size_t l, int n) const { return base::as_matrix(m_act[l], n, m_widths[l + 1]); }
  const_matrix output(int n) const { return activation(m_widths.size() - 2, n); }
  void run_forward(const const_matrix& x, int n) {
    auto& p = this->m_params;
    const std::size_t layers = m_widths.size() - 1;
    for (std::size_t l = 0; l < layers; ++l) {
      const const_matrix in = l == 0 ? x : const_matrix(activation(l - 1, n));
      linear_forward<ExecSpace, T, memory_space>(in, p.value_matrix(2 * l), p.value_vector(2 * l + 1), activation(l, n));
      if (l + 1 < layers) relu_forward<ExecSpace, T, memory_space>(base::as_vector(m_act[l], std::size_t(n) * m_widths[l + 1]));
    }
  }

  std::vector<int> m_widths;
  std::vector<Kokkos::View<T*, memory_space>> m_act;
  Kokkos::View<T*, memory_space> m_delta[2];
};

/// Small CNN: conv(k5, c1) + ReLU + maxpool 2, conv(k5, c2) + ReLU + maxpool 2, Linear(49 c2,
/// hidden) + ReLU, Linear(hidden, 10). The conv weights are 4-D (out, in, 5, 5) parameters.
template <class T, class ExecSpace>
class Cnn final : public Model<T, ExecSpace> {
  using base = Model<T, ExecSpace>;

 public:
  using typename base::const_matrix;
  using typename base::const_vector;
  using typename base::labels_type;
  using typename base::matrix;
  using typename base::memory_space;
  using typename base::vector;
  using buffer = Kokkos::View<T*, memory_space>;

  Cnn(int max_batch, int c1 = 8, int c2 = 16, int hidden = 128, int kernel = 5)
      : base(max_batch), m_c1(c1), m_c2(c2), m_hidden(hidden), m_k(kernel) {
    if (c1 < 1 || c2 < 1 || hidden < 1 || kernel < 1 || kernel % 2 == 0)
      throw std::invalid_argument("fmnist::Cnn: channels and hidden width must be positive and the kernel odd");
    auto& p = this->m_params;
    const double b1 = 1.0 / std::sqrt(double(1 * m_k * m_k)), b2 = 1.0 / std::sqrt(double(m_c1 * m_k * m_k));
    const double b3 = 1.0 / std::sqrt(double(49 * m_c2)), b4 = 1.0 / std::sqrt(double(m_hidden));
    p.declare("conv1.weight", {m_c1, 1, m_k, m_k}, b1);
    p.declare("conv1.bias", {m_c1}, b1);
    p.declare("conv2.weight", {m_c2, m_c1, m_k, m_k}, b2);
    p.declare("conv2.bias", {m_c2}, b2);
    p.declare("fc1.weight", {m_hidden, 49 * m_c2}, b3);
    p.declare("fc1.bias", {m_hidden}, b3);
    p.declare("fc2.weight", {base::classes, m_hidden}, b4);
    p.declare("fc2.bias", {base::classes}, b4);
    p.allocate();
    const std::size_t n = static_cast<std::size_t>(max_batch), kk = std::size_t(m_k) * m_k;
    m_cols = buffer("fmnist::cnn::cols", n * std::max<std::size_t>(784 * kk, 196 * m_c1 * kk));
    m_dcols = buffer("fmnist::cnn::dcols", n * 196 * m_c1 * kk);
    m_a1 = buffer("fmnist::cnn::a1", n * 784 * m_c1);  // conv1 + ReLU, 28x28
    m_p1 = buffer("fmnist::cnn::p1", n * 196 * m_c1);  // pooled, 14x14
    m_a2 = buffer("fmnist::cnn::a2", n * 196 * m_c2);  // conv2 + ReLU, 14x14
    m_p2 = buffer("fmnist::cnn::p2", n * 49 * m_c2);   // pooled, 7x7 (fc1's input, NHWC-flat)
    m_h = buffer("fmnist::cnn::h", n * m_hidden);
    m_z = buffer("fmnist::cnn::z", n * base::classes);
    m_arg1 = Kokkos::View<int*, memory_space>("fmnist::cnn::arg1", n * 196 * m_c1);
    m_arg2 = Kokkos::View<int*, memory_space>("fmnist::cnn::arg2", n * 49 * m_c2);
    // Two ping-pong buffers for the backward pass, each as large as the largest delta.
    const std::size_t widest = std::max<std::size_t>({784 * std::size_t(m_c1), 196 * std::size_t(m_c2),
                                                      std::size_t(m_hidden), std::size_t(base::classes)});
    m_d0 = buffer("fmnist::cnn::d0", n * widest);
    m_d1 = buffer("fmnist::cnn::d1", n * widest);
  }

  [[nodiscard]] std::string name() const override {
    return "cnn conv" + std::to_string(m_k) + "x" + std::to_string(m_k) + "(" + std::to_string(m_c1) + "," +
           std::to_string(m_c2) + ")-" + std::to_string(m_hidden) + "-10";
  }

  BatchResult forward(const const_matrix& x, const labels_type& labels) override {
    this->check_batch(x, labels);
    const int n = static_cast<int>(x.extent(0));
    run_forward(x, n);
    return softmax_cross_entropy<ExecSpace, T, memory_space>(const_matrix(base::as_matrix(m_z, n, 10)), labels, T(0),
                                                            matrix());
  }

  BatchResult forward_backward(const const_matrix& x, const labels_type& labels, T grad_scale) override {
    this->check_batch(x, labels);
    const int n = static_cast<int>(x.extent(0));
    const int kk = m_k * m_k;
    run_forward(x, n);
    auto& p = this->m_params;
    // Head: dz (n, 10) -> fc2 -> dh (n, hidden) -> ReLU -> fc1 -> dp2 (n, 49 c2).
    auto dz = base::as_matrix(m_d0, n, 10);
    const auto result = softmax_cross_entropy<ExecSpace, T, memory_space>(const_matrix(base::as_matrix(m_z, n, 10)),
                                                                         labels, grad_scale, dz);
    auto dh = base::as_matrix(m_d1, n, m_hidden);
    linear_backward<ExecSpace, T, memory_space>(const_matrix(base::as_matrix(m_h, n, m_hidden)), p.value_matrix(6), dz,
                                                this->ones(n), p.grad_matrix(6), p.grad_vector(7), dh);
    relu_backward<ExecSpace, T, memory_space>(const_vector(base::as_vector(m_h, std::size_t(n) * m_hidden)),
                                              base::as_vector(m_d1, std::size_t(n) * m_hidden));
    auto dp2 = base::as_matrix(m_d0, n, 49 * m_c2);
    linear_backward<ExecSpace, T, memory_space>(const_matrix(base::as_matrix(m_p2, n, 49 * m_c2)), p.value_matrix(4),
                                                dh, this->ones(n), p.grad_matrix(4), p.grad_vector(5), dp2);
    // Pool 2 and conv2: da2 (n 14 14, c2) -> gW2, gb2 and dcols2 -> dp1 (n, 14, 14, c1). The
    // cols buffer still holds conv2's im2col from the forward pass.
    auto da2 = base::as_vector(m_d1, std::size_t(n) * 196 * m_c2);
    maxpool_backward<ExecSpace, T, memory_space>(const_vector(base::as_vector(m_d0, std::size_t(n) * 49 * m_c2)), m_arg2,
                                                 n, 14, 14, m_c2, da2);
    relu_backward<ExecSpace, T, memory_space>(const_vector(base::as_vector(m_a2, std::size_t(n) * 196 * m_c2)), da2);
    const const_matrix cols2 = base::as_matrix(m_cols, n * 196, m_c1 * kk);
    const matrix da2m = base::as_matrix(m_d1, n * 196, m_c2);
    KokkosBlas::gemm("T", "N", T(1), const_matrix(da2m), cols2, T(0), p.grad_matrix(2));
    KokkosBlas::gemv("T", T(1), const_matrix(da2m), this->ones(n * 196), T(0), p.grad_vector(3));
    const matrix dcols2 = base::as_matrix(m_dcols, n * 196, m_c1 * kk);
    KokkosBlas::gemm("N", "N", T(1), const_matrix(da2m), const_matrix(p.value_matrix(2)), T(0), dcols2);
    auto dp1 = base::as_vector(m_d0, std::size_t(n) * 196 * m_c1);
    col2im<ExecSpace, T, memory_space>(const_matrix(dcols2), n, 14, 14, m_c1, m_k, dp1);
    // Pool 1 and conv1: da1 (n 28 28, c1) -> gW1, gb1 (the input needs no gradient).
    auto da1 = base::as_vector(m_d1, std::size_t(n) * 784 * m_c1);
    maxpool_backward<ExecSpace, T, memory_space>(const_vector(dp1), m_arg1, n, 28, 28, m_c1, da1);
    relu_backward<ExecSpace, T, memory_space>(const_vector(base::as_vector(m_a1, std::size_t(n) * 784 * m_c1)), da1);
    auto cols1 = base::as_matrix(m_cols, n * 784, kk);
    im2col<ExecSpace, T, memory_space>(const_vector(x.data(), std::size_t(n) * 784), n, 28, 28, 1, m_k, cols1);
    const const_matrix da1m(da1.data(), n * 784, m_c1);
    KokkosBlas::gemm("T", "N", T(1), da1m, const_matrix(cols1), T(0), p.grad_matrix(0));
    KokkosBlas::gemv("T", T(1), da1m, this->ones(n * 784), T(0), p.grad_vector(1));
    return result;
  }

 private:
  void run_forward(const const_matrix& x, int n) {
    auto& p = this->m_params;
    const int kk = m_k * m_k;
    // conv1: (n 28 28, k^2) x W1^T -> a1 (n 28 28, c1), ReLU, pool -> p1 (n, 14, 14, c1)
    auto cols1 = base::as_matrix(m_cols, n * 784, kk);
    im2col<ExecSpace, T, memory_space>(const_vector(x.data(), std::size_t(n) * 784), n, 28, 28, 1, m_k, cols1);
    linear_forward<ExecSpace, T, memory_space>(const_matrix(cols1), p.value_matrix(0), p.value_vector(1),
                                               base::as_matrix(m_a1, n * 784, m_c1));
    relu_forward<ExecSpace, T, memory_space>(base::as_vector(m_a1, std::size_t(n) * 784 * m_c1));
    maxpool_forward<ExecSpace, T, memory_space>(const_vector(base::as_vector(m_a1, std::size_t(n) * 784 * m_c1)), n, 28,
                                                28, m_c1, base::as_vector(m_p1, std::size_t(n) * 196 * m_c1), m_arg1);
    // conv2: (n 14 14, c1 k^2) x W2^T -> a2 (n 14 14, c2), ReLU, pool -> p2 (n, 7, 7, c2)
    auto cols2 = base::as_matrix(m_cols, n * 196, m_c1 * kk);
    im2col<ExecSpace, T, memory_space>(const_vector(base::as_vector(m_p1, std::size_t(n) * 196 * m_c1)), n, 14, 14, m_c1,
                                       m_k, cols2);
    linear_forward<ExecSpace, T, memory_space>(const_matrix(cols2), p.value_matrix(2), p.value_vector(3),
                                               base::as_matrix(m_a2, n * 196, m_c2));
    relu_forward<ExecSpace, T, memory_space>(base::as_vector(m_a2, std::size_t(n) * 196 * m_c2));
    maxpool_forward<ExecSpace, T, memory_space>(const_vector(base::as_vector(m_a2, std::size_t(n) * 196 * m_c2)), n, 14,
                                                14, m_c2, base::as_vector(m_p2, std::size_t(n) * 49 * m_c2), m_arg2);
    // head
    linear_forward<ExecSpace, T, memory_space>(const_matrix(base::as_matrix(m_p2, n, 49 * m_c2)), p.value_matrix(4),
                                               p.value_vector(5), base::as_matrix(m_h, n, m_hidden));
    relu_forward<ExecSpace, T, memory_space>(base::as_vector(m_h, std::size_t(n) * m_hidden));
    linear_forward<ExecSpace, T, memory_space>(const_matrix(base::as_matrix(m_h, n, m_hidden)), p.value_matrix(6),
                                               p.value_vector(7), base::as_matrix(m_z, n, 10));
  }

  int m_c1, m_c2, m_hidden, m_k;
  buffer m_cols, m_dcols, m_a1, m_p1, m_a2, m_p2, m_h, m_z, m_d0, m_d1;
  Kokkos::View<int*, memory_space> m_arg1, m_arg2;
};

/// "mlp" (with the given hidden widths) or "cnn" (the defaults above).
template <class T, class ExecSpace>
std::unique_ptr<Model<T, ExecSpace>> make_model(const std::string& name, int max_batch,
                                                std::vector<int> mlp_hidden = {512, 256}) {
  if (name == "mlp") return std::make_unique<Mlp<T, ExecSpace>>(max_batch, std::move(mlp_hidden));
  if (name == "cnn") return std::make_unique<Cnn<T, ExecSpace>>(max_batch);
  throw std::invalid_argument("unknown model '" + name + "' (choose mlp or cnn)");
}

}  // namespace fmnist

#endif
