// SPDX-License-Identifier: Apache-2.0
// The least-squares problem of the Shampoo doc examples: y = W x + b, W 16 x 8, on fixed data.
#ifndef LATHER_EXAMPLES_DOCS_LEAST_SQUARES_HPP
#define LATHER_EXAMPLES_DOCS_LEAST_SQUARES_HPP

#include <lather/traits/tensor_traits.hpp>

#include <algorithm>
#include <cmath>
#include <vector>

namespace example {
constexpr int out = 16, in = 8, samples = 64;

// Mean squared error of y = W x + b on fixed data, and its gradients.
struct Problem {
  std::vector<float> x, y;
  Problem() : x(samples * in), y(samples * out) {
    for (int s = 0; s < samples; ++s)
      for (int i = 0; i < in; ++i) x[s * in + i] = std::sin(0.7f * s + 1.3f * i);
    for (int s = 0; s < samples; ++s)
      for (int o = 0; o < out; ++o) {
        float v = 0.1f * o;
        for (int i = 0; i < in; ++i) v += std::cos(0.5f * o - 0.9f * i) * x[s * in + i];
        y[s * out + o] = v;
      }
  }
  float loss_and_grad(const std::vector<float>& w, const std::vector<float>& b, std::vector<float>& gw,
                      std::vector<float>& gb) const {
    float loss = 0;
    std::fill(gw.begin(), gw.end(), 0.0f);
    std::fill(gb.begin(), gb.end(), 0.0f);
    for (int s = 0; s < samples; ++s)
      for (int o = 0; o < out; ++o) {
        float r = b[o] - y[s * out + o];
        for (int i = 0; i < in; ++i) r += w[o * in + i] * x[s * in + i];
        loss += 0.5f * r * r / samples;
        gb[o] += r / samples;
        for (int i = 0; i < in; ++i) gw[o * in + i] += r * x[s * in + i] / samples;
      }
    return loss;
  }
};

inline float loss_of(const Problem& p, const std::vector<float>& w, const std::vector<float>& b) {
  std::vector<float> gw(w.size()), gb(b.size());
  return p.loss_and_grad(w, b, gw, gb);
}

// Zero-initialized parameters and gradient buffers, with TensorRefs over them.
struct Fit {
  std::vector<float> weight = std::vector<float>(out * in, 0.0f), bias = std::vector<float>(out, 0.0f);
  std::vector<float> gw = std::vector<float>(out * in), gb = std::vector<float>(out);
  std::vector<lather::TensorRef<float>> params{lather::TensorRef<float>(weight.data(), {out, in}),
                                               lather::TensorRef<float>(bias.data(), {out})};
  std::vector<lather::TensorRef<float>> grads{lather::TensorRef<float>(gw.data(), {out, in}),
                                              lather::TensorRef<float>(gb.data(), {out})};
};
}  // namespace example

#endif
