// SPDX-License-Identifier: Apache-2.0
/// \file
/// \brief Private. Element-wise kernels of the diagonal optimizers (SGD, Adagrad, RMSprop, Adam,
/// AdamW). The per-element operations are separate functions so that Shampoo's grafting policies
/// reuse exactly the same arithmetic.
///
/// The operation order follows torch.optim's single-tensor CPU path (torch 1.13; torch 2 computes
/// the same values): `add_(x, alpha=a)` is `self + a*x`, `addcmul_(x, y, value=v)` is
/// `self + v*x*y`, `addcdiv_(x, y, value=v)` is `self + v*x/y`. Matching it makes double runs agree
/// with PyTorch to the last few ulps.
#ifndef LATHER_IMPL_KERNELS_DIAGONAL_HPP
#define LATHER_IMPL_KERNELS_DIAGONAL_HPP

#include <lather/impl/math.hpp>
#include <lather/traits/tensor_traits.hpp>

#include <Kokkos_Core.hpp>

#include <cstdint>

namespace lather::impl::kernels {

// ---- shared element operations ------------------------------------------------------------------

/// Exponential moving average `m*beta + (1-beta)*x` (torch: mul_(beta).add_(x, alpha=1-beta)).
template <class T>
KOKKOS_INLINE_FUNCTION T ema(T m, T x, T beta, T one_minus_beta) {
  return m * beta + one_minus_beta * x;
}
/// Second moment `v*beta2 + (1-beta2)*g*g` (torch: mul_(beta2).addcmul_(g, g, value=1-beta2)).
/// With beta2 = 1 and one_minus_beta2 = 1 it is AdaGrad's plain sum.
template <class T>
KOKKOS_INLINE_FUNCTION T second_moment(T v, T g, T beta2, T one_minus_beta2) {
  return v * beta2 + one_minus_beta2 * g * g;
}
/// Adam's denominator `sqrt(v)/sqrt(bias_correction2) + eps`.
template <class T>
KOKKOS_INLINE_FUNCTION T adam_denominator(T v, T bias_correction2_sqrt, T eps) {
  return math::sqrt(v) / bias_correction2_sqrt + eps;
}

using index_type = std::int64_t;

/// \brief A state buffer as the element kernels see it: the View's pointer, indexed like the
/// View. Why not the View: a kernel that holds only pointers, TensorRefs and scalars is
/// trivially copyable, so the multi-tensor loop (kernels/multi_tensor.hpp) can keep one per
/// parameter in a table in device memory; the buffers stay alive in the optimizer's state.
template <class T>
struct Field {
  T* ptr = nullptr;
  Field() = default;
  template <class V>
    requires requires(const V& v) { v.data(); }
  Field(const V& view) : ptr(view.data()) {}  // NOLINT(google-explicit-constructor): built from the state's Views
  KOKKOS_INLINE_FUNCTION Field(T* p) : ptr(p) {}  // NOLINT(google-explicit-constructor): a work buffer's range
  KOKKOS_INLINE_FUNCTION T& operator()(index_type i) const { return ptr[i]; }
  KOKKOS_INLINE_FUNCTION T* data() const { return ptr; }
};

/// Adds the number of NaN/Inf elements of `grad` to `counts(slot)` (and to `*total` when set).
template <class T, class MemorySpace>
struct CountNonFinite {
  TensorRef<const T, MemorySpace> grad;
  std::int64_t* counts;  // device memory, one counter per gradient
  std::size_t slot;
  std::int64_t* total = nullptr;  // also counted here when set (the screen's gate for a whole step)
  KOKKOS_FUNCTION void operator()(index_type i) const {
    if (!math::isfinite(grad[i])) {
      Kokkos::atomic_add(counts + slot, std::int64_t{1});
      if (total != nullptr) Kokkos::atomic_add(total, std::int64_t{1});
    }
  }
};

/// counts(i) = 0.
template <class MemorySpace>
struct ZeroCounts {
  Kokkos::View<std::int64_t*, MemorySpace> counts;
  KOKKOS_FUNCTION void operator()(index_type i) const { counts(i) = 0; }
};

// ---- SGD ------------------------------------------------------------------------------------------

/// \tparam Contiguous both tensors row-major contiguous: plain pointer access (see AdamStep).
template <class T, class MemorySpace, bool Contiguous = false>
struct SgdStep {
  TensorRef<T, MemorySpace> param;
  TensorRef<const T, MemorySpace> grad;
  Field<T> momentum_buffer;  // empty without momentum
  T lr, weight_decay, momentum, one_minus_dampening;
  bool nesterov, maximize, use_momentum, first_momentum_step;

  KOKKOS_FUNCTION void operator()(index_type i) const {
    T& p = Contiguous ? param.data()[i] : param[i];
    const T gi = Contiguous ? grad.data()[i] : grad[i];
    T d = maximize ? -gi : gi;
    if (weight_decay != T(0)) d = d + weight_decay * p;
    if (use_momentum) {
      // torch: the first buffer is a copy of d (no dampening), then buf*momentum + (1-dampening)*d.
      const T b = first_momentum_step ? d : momentum_buffer(i) * momentum + one_minus_dampening * d;
      momentum_buffer(i) = b;
      d = nesterov ? d + momentum * b : b;
    }
    p = p + (-lr) * d;
  }
};

// ---- Adagrad --------------------------------------------------------------------------------------

/// \tparam Contiguous both tensors row-major contiguous: plain pointer access (see AdamStep).
template <class T, class MemorySpace, bool Contiguous = false>
struct AdagradStep {
  TensorRef<T, MemorySpace> param;
  TensorRef<const T, MemorySpace> grad;
  Field<T> sum;
  T clr, weight_decay, eps;
  bool maximize;

  KOKKOS_FUNCTION void operator()(index_type i) const {
    T& p = Contiguous ? param.data()[i] : param[i];
    const T gi = Contiguous ? grad.data()[i] : grad[i];
    T g = maximize ? -gi : gi;
    if (weight_decay != T(0)) g = g + weight_decay * p;
    const T s = second_moment(sum(i), g, T(1), T(1));
    sum(i) = s;
    p = p + (-clr) * g / (math::sqrt(s) + eps);
  }
};

// ---- RMSprop --------------------------------------------------------------------------------------

/// \tparam Contiguous both tensors row-major contiguous: plain pointer access (see AdamStep).
template <class T, class MemorySpace, bool Contiguous = false>
struct RmspropStep {
  TensorRef<T, MemorySpace> param;
  TensorRef<const T, MemorySpace> grad;
  Field<T> square_avg;
  Field<T> grad_avg;         // empty unless centered
  Field<T> momentum_buffer;  // empty without momentum
  T lr, alpha, one_minus_alpha, eps, weight_decay, momentum;
  bool centered, use_momentum, maximize;

  KOKKOS_FUNCTION void operator()(index_type i) const {
    T& p = Contiguous ? param.data()[i] : param[i];
    const T gi = Contiguous ? grad.data()[i] : grad[i];
    T g = maximize ? -gi : gi;
    if (weight_decay != T(0)) g = g + weight_decay * p;
    const T sq = second_moment(square_avg(i), g, alpha, one_minus_alpha);
    square_avg(i) = sq;
    T avg;
    if (centered) {
      const T ga = ema(grad_avg(i), g, alpha, one_minus_alpha);
      grad_avg(i) = ga;
      avg = math::sqrt(sq + T(-1) * ga * ga) + eps;
    } else {
      avg = math::sqrt(sq) + eps;
    }
    if (use_momentum) {
      const T b = momentum_buffer(i) * momentum + g / avg;
      momentum_buffer(i) = b;
      p = p + (-lr) * b;
    } else {
      p = p + (-lr) * g / avg;
    }
  }
};

// ---- Adam / AdamW ---------------------------------------------------------------------------------

/// \tparam Contiguous both tensors row-major contiguous (the common case): plain pointer
/// arithmetic instead of TensorRef's per-element layout branch, so the loop vectorizes.
template <class T, class MemorySpace, bool Contiguous = false>
struct AdamStep {
  TensorRef<T, MemorySpace> param;
  TensorRef<const T, MemorySpace> grad;
  Field<T> exp_avg, exp_avg_sq;
  Field<T> max_exp_avg_sq;  // empty unless amsgrad
  T beta1, one_minus_beta1, beta2, one_minus_beta2;
  T l2_weight_decay;     // Adam: added to the gradient
  T decoupled_factor;    // AdamW: 1 - lr*weight_decay, applied to the parameter first
  T step_size;           // lr / (1 - beta1^t)
  T bias_correction2_sqrt, eps;
  bool amsgrad, maximize, decoupled;

  KOKKOS_FUNCTION void operator()(index_type i) const {
    T& p = Contiguous ? param.data()[i] : param[i];
    if (decoupled) p = p * decoupled_factor;
    const T gi = Contiguous ? grad.data()[i] : grad[i];
    T g = maximize ? -gi : gi;
    if (l2_weight_decay != T(0)) g = g + l2_weight_decay * p;
    const T m = ema(exp_avg(i), g, beta1, one_minus_beta1);
    exp_avg(i) = m;
    T v = second_moment(exp_avg_sq(i), g, beta2, one_minus_beta2);
    exp_avg_sq(i) = v;
    if (amsgrad) {
      v = math::max(max_exp_avg_sq(i), v);
      max_exp_avg_sq(i) = v;
    }
    p = p + (-step_size) * m / adam_denominator(v, bias_correction2_sqrt, eps);
  }
};

}  // namespace lather::impl::kernels

#endif
