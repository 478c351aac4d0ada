// SPDX-License-Identifier: Apache-2.0
// Must not compile: std::vector is not a tensor. Expected diagnostic: the named static_assert of
// lather::impl::check_valid_tensor_traits (or the FloatingTensor constraint).
#include <lather/optimizers/adam.hpp>

#include <vector>

int main() {
  std::vector<std::vector<double>> params(1, std::vector<double>(3));
  lather::Adam<std::vector<double>> opt(params);
  (void)opt;
}
