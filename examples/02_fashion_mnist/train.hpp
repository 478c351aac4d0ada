// SPDX-License-Identifier: Apache-2.0
// The training loop: data-parallel over the ranks of a lather communicator (SerialCommunicator
// for one process), warm-up + cosine learning rate, evaluation, progress bar and per-epoch log.
#ifndef LATHER_EXAMPLES_FMNIST_TRAIN_HPP
#define LATHER_EXAMPLES_FMNIST_TRAIN_HPP

#include "data.hpp"
#include "nn.hpp"
#include "optimizers.hpp"
#include "options.hpp"
#include "progress.hpp"
#include "results.hpp"

#include <Kokkos_Core.hpp>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

namespace fmnist {

/// The learning rate at step t (0-based) of `total`: linear warm-up over `warmup` steps to `lr`,
/// then cosine decay to lr * final_fraction.
inline double scheduled_lr(double lr, std::int64_t t, std::int64_t warmup, std::int64_t total, double final_fraction) {
  if (t < warmup) return lr * static_cast<double>(t + 1) / static_cast<double>(warmup);
  const double span = static_cast<double>(std::max<std::int64_t>(total - warmup, 1));
  const double progress = std::min(1.0, static_cast<double>(t - warmup) / span);
  return lr * (final_fraction + (1.0 - final_fraction) * 0.5 * (1.0 + std::cos(3.14159265358979323846 * progress)));
}

/// The half-open slice [begin, end) of `count` items that rank `r` of `size` owns.
inline std::pair<int, int> slice_of(int count, int r, int size) {
  return {static_cast<int>(std::int64_t(count) * r / size), static_cast<int>(std::int64_t(count) * (r + 1) / size)};
}

template <class T, class ExecSpace, class Comm>
class Trainer {
 public:
  using memory_space = typename ExecSpace::memory_space;
  using model_type = Model<T, ExecSpace>;
  using tensor_type = typename ParameterSet<T, ExecSpace>::tensor_type;

  Trainer(TrainSettings settings, const Comm& comm, Dataset<T, ExecSpace> train, Dataset<T, ExecSpace> test)
      : m_s(std::move(settings)), m_comm(comm), m_train(std::move(train)), m_test(std::move(test)) {
    if (m_s.batch_size < m_comm.size())
      throw std::invalid_argument("--batch-size " + std::to_string(m_s.batch_size) + " is smaller than the " +
                                  std::to_string(m_comm.size()) + " ranks; every rank needs at least one sample");
    if (m_s.batch_size > m_train.size())
      throw std::invalid_argument("--batch-size " + std::to_string(m_s.batch_size) + " exceeds the " +
                                  std::to_string(m_train.size()) + " training samples");
    m_local_capacity = slice_of(m_s.batch_size, 0, m_comm.size()).second + 1;
    m_x = decltype(m_x)("fmnist::batch_x", m_local_capacity, 784);
    m_y = decltype(m_y)("fmnist::batch_y", m_local_capacity);
    m_sums = Kokkos::View<double*, Kokkos::HostSpace>("fmnist::sums", 2);
  }

  [[nodiscard]] bool is_root() const { return m_comm.rank() == 0; }
  [[nodiscard]] const TrainSettings& settings() const { return m_s; }

  /// Trains a fresh model (initialized from the seed) with `opt`; rank 0 logs to `log`. When
  /// `final_parameters` is given, the trained parameters (flat, in declaration order) go there.
  RunResult run(const OptimizerSettings& opt, std::FILE* log, std::vector<T>* final_parameters = nullptr) {
    RunResult result;
    result.settings = opt;
    result.label = opt.describe();
    auto model = make_model<T, ExecSpace>(m_s.model, m_local_capacity, m_s.mlp_hidden);
    auto& params = model->parameters();
    params.initialize(m_s.seed);
    auto values = params.values();
    const auto grads = params.grads();
    auto optimizer = make_optimizer<tensor_type, ExecSpace>(values, params.names(), opt);

    const int n = m_train.size();
    const std::int64_t steps_per_epoch = n / m_s.batch_size;
    const std::int64_t total = steps_per_epoch * m_s.epochs;
    const std::int64_t warmup = static_cast<std::int64_t>(std::llround(m_s.warmup_epochs * static_cast<double>(steps_per_epoch)));
    const auto [lo, hi] = slice_of(m_s.batch_size, m_comm.rank(), m_comm.size());
    const T grad_scale = T(1) / static_cast<T>(m_s.batch_size);
    const ExecSpace space;
    if (is_root() && log)
      std::fprintf(log, "[%s] %s, %d parameters, %lld steps of batch %d over %d rank(s)\n", result.label.c_str(),
                   model->name().c_str(), static_cast<int>(params.total()), static_cast<long long>(total),
                   m_s.batch_size, m_comm.size());

    EpochRecord initial;
    std::tie(initial.test_loss, initial.test_accuracy) = evaluate(*model);
    result.epochs.push_back(initial);
    double train_seconds = 0;
    std::int64_t step = 0;
    Kokkos::View<int*, memory_space> order("fmnist::order", n);
    for (int epoch = 1; epoch <= m_s.epochs && result.failure.empty(); ++epoch) {
      const auto host_order = epoch_order(n, m_s.seed, epoch);
      Kokkos::deep_copy(order, Kokkos::View<const int*, Kokkos::HostSpace, Kokkos::MemoryTraits<Kokkos::Unmanaged>>(
                                   host_order.data(), host_order.size()));
      Progress bar(is_root() && m_s.progress, epoch, m_s.epochs, steps_per_epoch);
      double loss_sum = 0, correct = 0, lr = 0;
      space.fence();
      const auto t0 = std::chrono::steady_clock::now();
      for (std::int64_t b = 0; b < steps_per_epoch; ++b, ++step) {
        const int begin = static_cast<int>(b * m_s.batch_size) + lo, count = hi - lo;
        gather<T, ExecSpace>(m_train, order, begin, count, m_x, m_y);
        const auto xb = typename model_type::const_matrix(m_x.data(), count, 784);
        const auto yb = Kokkos::View<const int*, memory_space>(Kokkos::subview(m_y, std::make_pair(0, count)));
        const auto r = model->forward_backward(xb, yb, grad_scale);
        m_sums(0) = r.loss_sum;
        m_sums(1) = static_cast<double>(r.correct);
        if (m_comm.size() > 1) {
          m_comm.all_reduce_sum(space, params.flat_grads());
          m_comm.all_reduce_sum(Kokkos::DefaultHostExecutionSpace(), m_sums);
        }
        loss_sum += m_sums(0);
        correct += m_sums(1);
        lr = scheduled_lr(opt.lr, step, warmup, total, m_s.final_lr_fraction);
        optimizer->set_lr(lr);
        try {
          optimizer->step(grads);
        } catch (const std::exception& e) {
          result.failure = "epoch " + std::to_string(epoch) + ", step " + std::to_string(b + 1) + ": " + e.what();
          break;
        }
        if (bar.active() && (b % 8 == 0 || b + 1 == steps_per_epoch))
          bar.update(b + 1, loss_sum / (double(b + 1) * m_s.batch_size));
      }
      space.fence();
      const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      bar.finish();
      if (!result.failure.empty()) {
        if (is_root() && log) std::fprintf(log, "[%s] stopped: %s\n", result.label.c_str(), result.failure.c_str());
        break;
      }
      train_seconds += seconds;
      EpochRecord rec;
      rec.epoch = epoch;
      rec.steps = step;
      rec.lr = lr;
      rec.train_loss = loss_sum / (double(steps_per_epoch) * m_s.batch_size);
      rec.train_accuracy = correct / (double(steps_per_epoch) * m_s.batch_size);
      std::tie(rec.test_loss, rec.test_accuracy) = evaluate(*model);
      rec.epoch_seconds = seconds;
      rec.train_seconds = train_seconds;
      result.epochs.push_back(rec);
      if (is_root() && log)
        std::fprintf(log, "[%s] epoch %2d/%d  train loss %.4f  test loss %.4f  test acc %6.2f%%  %6.1f s (%.1f ms/step)\n",
                     result.label.c_str(), epoch, m_s.epochs, rec.train_loss, rec.test_loss, 100 * rec.test_accuracy,
                     seconds, 1e3 * seconds / double(steps_per_epoch));
      if (is_root() && log) std::fflush(log);
    }
    if (final_parameters) {
      final_parameters->resize(static_cast<std::size_t>(params.total()));
      Kokkos::deep_copy(Kokkos::View<T*, Kokkos::HostSpace, Kokkos::MemoryTraits<Kokkos::Unmanaged>>(
                            final_parameters->data(), final_parameters->size()),
                        params.flat_values());
    }
    return result;
  }

  /// Mean loss and accuracy on the test split; each rank evaluates its slice.
  std::pair<double, double> evaluate(model_type& model) {
    const int n = m_test.size();
    const auto [lo, hi] = slice_of(n, m_comm.rank(), m_comm.size());
    Kokkos::View<int*, memory_space> index("fmnist::eval_index", std::max(hi - lo, 1));
    const int first = lo;
    Kokkos::parallel_for(
        "fmnist::eval_index", Kokkos::RangePolicy<ExecSpace>(0, hi - lo), KOKKOS_LAMBDA(int i) { index(i) = first + i; });
    double loss = 0, correct = 0;
    for (int s = 0; s < hi - lo; s += m_local_capacity) {
      const int count = std::min(m_local_capacity, hi - lo - s);
      gather<T, ExecSpace>(m_test, index, s, count, m_x, m_y);
      const auto r = model.forward(typename model_type::const_matrix(m_x.data(), count, 784),
                                   Kokkos::View<const int*, memory_space>(Kokkos::subview(m_y, std::make_pair(0, count))));
      loss += r.loss_sum;
      correct += static_cast<double>(r.correct);
    }
    m_sums(0) = loss;
    m_sums(1) = correct;
    if (m_comm.size() > 1) m_comm.all_reduce_sum(Kokkos::DefaultHostExecutionSpace(), m_sums);
    return {m_sums(0) / n, m_sums(1) / n};
  }

 private:
  TrainSettings m_s;
  const Comm& m_comm;
  Dataset<T, ExecSpace> m_train, m_test;
  int m_local_capacity = 0;
  Kokkos::View<T**, Kokkos::LayoutRight, memory_space> m_x;
  Kokkos::View<int*, memory_space> m_y;
  Kokkos::View<double*, Kokkos::HostSpace> m_sums;
};

}  // namespace fmnist

#endif
