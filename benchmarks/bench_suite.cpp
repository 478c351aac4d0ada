// SPDX-License-Identifier: Apache-2.0
// The performance suite of docs/performance.md (scripts/bench-suite.sh runs it on 1 and 2
// threads): float32 parameter sets "mlp", "resnet50" and "gpt2-block"
// (../shared/reference/benchmark-shapes.md, written out below) under AdamW and under Shampoo with
// Adam grafting at max_preconditioner_dim 256 and 1024, with the references they are judged
// against, all measured in the same process:
//   - the machine's SGEMM throughput through the same BLAS (KokkosBlas::gemm -> OpenBLAS), and a
//     STREAM triad for the memory bandwidth;
//   - Shampoo's steady step (precondition_frequency 100: factor updates, grafting and
//     preconditioning, no root inverse) and its root step (every inverse root recomputed, which is
//     every step at precondition_frequency 1 and one step in 100 at 100), reported separately;
//     achieved GFLOP/s of the step's minimal work (per block: the factor updates as symmetric
//     rank-k updates, d_j N flops for the factor of dimension d_j of a block of N elements, plus
//     one product per factor to precondition, 2 d_j N) and optimizer-state bytes against the
//     reference's (packed and full factors, from the same blocks);
//   - root inverses against a bare LAPACK ssyevd/dsyevd on the same matrix, n = 128 to 2048, and
//     coupled Newton (the matrix-product strategy) in float and double, n <= 1024.
//   - the ColossalAI family's steady steps on the same sets ("family/<optimizer>/<set>": Adafactor,
//     CAME, LAMB and GaLore-AdamW at rank 128 without a projector refresh in the timed steps), with
//     their allocations per step, next to AdamW's.
// Besides Google Benchmark's report, `--summary=FILE` writes a Markdown summary with the derived
// ratios, `--plot-data=FILE` the step times per parameter set (for gnuplot) and
// `--target-rows=FILE` one tab-separated line per steady Shampoo cell measured with SGEMM 1024 in
// the same run (appended; scripts/bench-targets.sh takes the median over repeated runs); `--smoke`
// runs one iteration of each (for the CTest smoke test).
#include <lather/impl/backends/blas.hpp>
#include <lather/impl/backends/lapack.hpp>
#include <lather/lather.hpp>
#include <lather/optimizers/adam.hpp>
#include <lather/optimizers/shampoo.hpp>
#include <lather/root_inverse/root_inverse.hpp>

#include <KokkosBlas3_gemm.hpp>
#include <Kokkos_Core.hpp>
#include <Kokkos_Random.hpp>

#include <benchmark/benchmark.h>

#if __has_include(<execinfo.h>) && __has_include(<dlfcn.h>)
#include <dlfcn.h>
#include <execinfo.h>
#define LATHER_BENCH_ALLOC_TRACE 1
#endif

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <limits>
#include <map>
#include <new>
#include <string>
#include <string_view>
#include <vector>

// glibc 2.33+ says how much of the C heap is in use (mallinfo2), for the work arrays a first step
// leaves behind.
#if defined(__GLIBC__) && (__GLIBC__ > 2 || (__GLIBC__ == 2 && __GLIBC_MINOR__ >= 33)) && __has_include(<malloc.h>)
#include <malloc.h>
#define LATHER_BENCH_HEAP_IN_USE 1
#endif

namespace {

using ExecSpace = Kokkos::DefaultExecutionSpace;
using M = ExecSpace::memory_space;
using P = lather::TensorRef<float, M>;
using Shape = std::vector<std::int64_t>;
using ShampooOpt = lather::Shampoo<P, ExecSpace, lather::EigenRootInverse, lather::AdamGrafting>;

// ---- parameter sets -------------------------------------------------------------------------

std::vector<Shape> mlp_shapes() { return {{512, 784}, {512}, {256, 512}, {256}, {10, 256}, {10}}; }

std::vector<Shape> gpt2_block_shapes() {
  return {{768}, {768}, {2304, 768}, {2304}, {768, 768},  {768},
          {768}, {768}, {3072, 768}, {3072}, {768, 3072}, {768}};
}

// torchvision ResNet-50 v1.5 in parameter order: the stem, then per stage the bottleneck blocks
// (conv1 1x1, conv2 3x3, conv3 1x1, each with batch-norm weight and bias; the first block of a
// stage also has the 1x1 downsample convolution and its batch norm), then fc.
std::vector<Shape> resnet50_shapes() {
  std::vector<Shape> s;
  auto conv_bn = [&](std::int64_t out, std::int64_t in, std::int64_t k) {
    s.push_back({out, in, k, k});
    s.push_back({out});
    s.push_back({out});
  };
  conv_bn(64, 3, 7);
  const std::int64_t widths[4] = {64, 128, 256, 512}, blocks[4] = {3, 4, 6, 3};
  std::int64_t in = 64;
  for (int stage = 0; stage < 4; ++stage) {
    const std::int64_t w = widths[stage], out = 4 * w;
    for (std::int64_t b = 0; b < blocks[stage]; ++b) {
      conv_bn(w, in, 1);
      conv_bn(w, w, 3);
      conv_bn(out, w, 1);
      if (b == 0) conv_bn(out, in, 1);  // downsample
      in = out;
    }
  }
  s.push_back({1000, 2048});
  s.push_back({1000});
  return s;
}

std::int64_t numel(const Shape& s) {
  std::int64_t n = 1;
  for (auto e : s) n *= e;
  return n;
}

struct Model {
  std::vector<Kokkos::View<float*, M>> storage, grad_storage;
  std::vector<P> params, grads;
  std::int64_t size = 0;
  explicit Model(const std::vector<Shape>& shapes) {
    std::uint64_t seed = 1;
    for (const auto& s : shapes) {
      const std::int64_t n = numel(s);
      size += n;
      storage.emplace_back("p", n);
      grad_storage.emplace_back("g", n);
      Kokkos::Random_XorShift64_Pool<ExecSpace> pool(seed++);
      Kokkos::fill_random(storage.back(), pool, -0.05f, 0.05f);
      Kokkos::fill_random(grad_storage.back(), pool, -0.01f, 0.01f);
      params.emplace_back(storage.back().data(), s);
      grads.emplace_back(grad_storage.back().data(), s);
    }
  }
};

// ---- results kept for the summary --------------------------------------------------------------

struct Result {
  double seconds = 0;     // per iteration
  double flops = 0;       // per iteration (minimal work)
  double bytes = 0;       // memory traffic per iteration, or lather's state bytes (Shampoo)
  double ref_packed = 0;  // Shampoo: the reference's state bytes, packed factors
  double ref_full = 0;    // ... full factors
  double heap_allocations = 0, kokkos_allocations = 0;  // per step, after the first
  double best_seconds = 0;              // Shampoo steady steps: the fastest timed step
  double kernels = 0, deep_copies = 0;  // Shampoo: Kokkos kernels and deep copies per step
  double ref_per_element = 0;           // Shampoo: the reference's state bytes of the block's size (no factors)
};
std::map<std::string, Result>& results() {
  static std::map<std::string, Result> r;
  return r;
}

// A benchmark that could not measure what it names fails the run (exit status 1), so the smoke
// test (benchmarks/CMakeLists.txt) catches it.
bool g_failed = false;
// Bytes of the C heap in use (small blocks and mmap'd large ones), or -1 where the C library does
// not say. Kokkos' host allocations and std::vector both come from it.
double heap_in_use() {
#ifdef LATHER_BENCH_HEAP_IN_USE
  const struct mallinfo2 m = mallinfo2();
  return static_cast<double>(m.uordblks) + static_cast<double>(m.hblkhd);
#else
  return -1;
#endif
}

void fail(benchmark::State& state, const char* why) {
  g_failed = true;
  state.SkipWithError(why);
}

// Heap allocations inside step(): operator new is counted while `g_counting` is set (this
// executable replaces the global operator new, host code and, on GPU builds, the libraries it
// links such as cuBLAS), Kokkos allocations through the Kokkos Tools allocate-data hook,
// installed only for the counting steps (tools change what Kokkos does).
std::atomic<bool> g_counting{false};
std::atomic<std::int64_t> g_heap_allocations{0};
std::int64_t g_kokkos_allocations = 0;
void count_kokkos_allocation(Kokkos::Profiling::SpaceHandle, const char*, const void*, std::uint64_t) {
  ++g_kokkos_allocations;
}

// LATHER_BENCH_ALLOC_TRACE=n (glibc): the call stacks of the first n (at most 64) heap
// allocations counted in each cell go to stderr after its counting steps, one line per
// allocation, each frame as module+offset of its return address (symbolize with `addr2line -f -C
// -i -e MODULE OFFSET-1`): what allocates inside step() where the count is not 0.
constexpr int trace_max = 64, trace_frames = 24;
void* g_traces[trace_max][trace_frames];
int g_trace_depth[trace_max];
std::atomic<int> g_trace_count{0};
int g_trace_limit = 0;
thread_local bool g_in_trace = false;
std::string g_cell;  // the cell whose steps are counted, for the trace's header
void trace_allocation() {
#if defined(LATHER_BENCH_ALLOC_TRACE)
  if (g_trace_limit == 0 || g_in_trace) return;
  const int i = g_trace_count.fetch_add(1, std::memory_order_relaxed);
  if (i >= g_trace_limit) return;
  g_in_trace = true;  // backtrace() itself may allocate
  g_trace_depth[i] = backtrace(g_traces[i], trace_frames);
  g_in_trace = false;
#endif
}
void print_traces() {
#if defined(LATHER_BENCH_ALLOC_TRACE)
  const int n = std::min(g_trace_count.load(), g_trace_limit);
  std::fprintf(stderr, "alloc-trace %s: %d allocations counted, %d traced\n", g_cell.c_str(), g_trace_count.load(), n);
  for (int i = 0; i < n; ++i) {
    std::fprintf(stderr, "alloc-trace %d:", i);
    for (int f = 1; f < g_trace_depth[i]; ++f) {  // frame 0 is trace_allocation
      Dl_info info{};
      if (dladdr(g_traces[i][f], &info) != 0 && info.dli_fname != nullptr) {
        const char* base = std::strrchr(info.dli_fname, '/');
        std::fprintf(stderr, " %s+0x%lx", base != nullptr ? base + 1 : info.dli_fname,
                     static_cast<unsigned long>(reinterpret_cast<std::uintptr_t>(g_traces[i][f]) -
                                                reinterpret_cast<std::uintptr_t>(info.dli_fbase)));
      } else {
        std::fprintf(stderr, " %p", g_traces[i][f]);
      }
    }
    std::fprintf(stderr, "\n");
  }
  g_trace_count = 0;
#endif
}

struct AllocationCounts {
  double heap = 0, kokkos = 0;
};
// Runs `steps` calls of `step` counting allocations; per step.
template <class F>
AllocationCounts count_allocations(int steps, F&& step) {
  g_heap_allocations = 0;
  g_counting = true;
  for (int s = 0; s < steps; ++s) step();
  g_counting = false;
  if (g_trace_limit > 0) print_traces();
  const auto heap = static_cast<double>(g_heap_allocations.load());
  g_kokkos_allocations = 0;
  Kokkos::Tools::Experimental::set_allocate_data_callback(count_kokkos_allocation);
  for (int s = 0; s < steps; ++s) step();
  Kokkos::Tools::Experimental::set_allocate_data_callback(nullptr);
  return {heap / steps, static_cast<double>(g_kokkos_allocations) / steps};
}

// Kokkos kernels (parallel_for / reduce / scan) and deep copies per step, through the Kokkos
// Tools callbacks like the allocations above: on a GPU each launch costs microseconds, and a
// reduction or deep copy to the host waits for the device, so these counts explain a
// latency-bound step. BLAS calls are not Kokkos kernels and are not counted; nor are fences
// (Kokkos 3.4 has the fence hook but does not call it).
std::int64_t g_kernels = 0, g_deep_copies = 0;
void count_kernel(const char*, std::uint32_t, std::uint64_t* id) {
  ++g_kernels;
  *id = 0;
}
void count_deep_copy(Kokkos::Profiling::SpaceHandle, const char*, const void*, Kokkos::Profiling::SpaceHandle,
                     const char*, const void*, std::uint64_t) {
  ++g_deep_copies;
}
struct LaunchCounts {
  double kernels = 0, deep_copies = 0;
};
template <class F>
LaunchCounts count_launches(int steps, F&& step) {
  namespace T = Kokkos::Tools::Experimental;
  g_kernels = g_deep_copies = 0;
  T::set_begin_parallel_for_callback(count_kernel);
  T::set_begin_parallel_reduce_callback(count_kernel);
  T::set_begin_parallel_scan_callback(count_kernel);
  T::set_begin_deep_copy_callback(count_deep_copy);
  for (int s = 0; s < steps; ++s) step();
  T::set_begin_parallel_for_callback(nullptr);
  T::set_begin_parallel_reduce_callback(nullptr);
  T::set_begin_parallel_scan_callback(nullptr);
  T::set_begin_deep_copy_callback(nullptr);
  const double n = steps;
  return {static_cast<double>(g_kernels) / n, static_cast<double>(g_deep_copies) / n};
}

using Clock = std::chrono::steady_clock;

// LATHER_BENCH_KERNEL_PROFILE=FILE: after each steady Shampoo benchmark, one more step with every
// Kokkos kernel and deep copy fenced before and after and timed by name (Kokkos Tools begin/end
// callbacks), appended to FILE as a Markdown table. The fences serialize the step (its total is
// longer than the benchmark's), but on a GPU the question is where a latency-bound step goes:
// kernels (launch and run), copies to and from the host, or the rest (the BLAS calls between
// kernels, which the next fence waits for, and host code).
struct KernelTime {
  std::int64_t count = 0;
  double seconds = 0;
};
std::map<std::string, KernelTime> g_kernel_times;
std::vector<std::string> g_profile_names;
std::vector<Clock::time_point> g_profile_starts;
Clock::time_point g_copy_start;
void profile_begin(const char* name, std::uint32_t, std::uint64_t* id) {
  Kokkos::fence();
  *id = g_profile_names.size();
  g_profile_names.emplace_back(name);
  g_profile_starts.push_back(Clock::now());
}
void profile_end(std::uint64_t id) {
  Kokkos::fence();
  auto& k = g_kernel_times[g_profile_names[id]];
  ++k.count;
  k.seconds += std::chrono::duration<double>(Clock::now() - g_profile_starts[id]).count();
}
void profile_copy_begin(Kokkos::Profiling::SpaceHandle, const char*, const void*, Kokkos::Profiling::SpaceHandle,
                        const char*, const void*, std::uint64_t) {
  Kokkos::fence();
  g_copy_start = Clock::now();
}
void profile_copy_end() {
  Kokkos::fence();
  auto& k = g_kernel_times["(deep_copy)"];
  ++k.count;
  k.seconds += std::chrono::duration<double>(Clock::now() - g_copy_start).count();
}
void set_profile_callbacks(bool on) {
  namespace T = Kokkos::Tools::Experimental;
  T::set_begin_parallel_for_callback(on ? profile_begin : nullptr);
  T::set_begin_parallel_reduce_callback(on ? profile_begin : nullptr);
  T::set_begin_parallel_scan_callback(on ? profile_begin : nullptr);
  T::set_end_parallel_for_callback(on ? profile_end : nullptr);
  T::set_end_parallel_reduce_callback(on ? profile_end : nullptr);
  T::set_end_parallel_scan_callback(on ? profile_end : nullptr);
  T::set_begin_deep_copy_callback(on ? profile_copy_begin : nullptr);
  T::set_end_deep_copy_callback(on ? profile_copy_end : nullptr);
}
template <class F>
void profile_kernels(const std::string& benchmark_name, F&& step) {
  const char* file = std::getenv("LATHER_BENCH_KERNEL_PROFILE");
  if (file == nullptr || *file == '\0') return;
  g_kernel_times.clear();
  g_profile_names.clear();
  g_profile_starts.clear();
  set_profile_callbacks(true);
  Kokkos::fence();
  const auto t0 = Clock::now();
  step();
  Kokkos::fence();
  const double total = std::chrono::duration<double>(Clock::now() - t0).count();
  set_profile_callbacks(false);
  std::vector<std::pair<std::string, KernelTime>> rows(g_kernel_times.begin(), g_kernel_times.end());
  std::sort(rows.begin(), rows.end(), [](const auto& a, const auto& b) { return a.second.seconds > b.second.seconds; });
  double counted = 0;
  std::int64_t launches = 0;
  for (const auto& [name, k] : rows) {
    counted += k.seconds;
    launches += k.count;
  }
  FILE* out = std::fopen(file, "a");
  if (out == nullptr) {
    std::fprintf(stderr, "LATHER_BENCH_KERNEL_PROFILE=%s: cannot open the file\n", file);
    return;
  }
  std::fprintf(out, "\n### %s\n\nOne step, every kernel and copy fenced: %.3f ms; %lld kernels and copies %.3f ms "
               "(%.1f%%); the rest (BLAS between kernels, host code) %.3f ms (%.1f%%).\n\n"
               "| kernel | calls | ms | share |\n| --- | ---: | ---: | ---: |\n",
               benchmark_name.c_str(), total * 1e3, static_cast<long long>(launches), counted * 1e3,
               100 * counted / total, (total - counted) * 1e3, 100 * (total - counted) / total);
  for (std::size_t i = 0; i < rows.size() && i < 20; ++i)
    std::fprintf(out, "| %s | %lld | %.3f | %.1f%% |\n", rows[i].first.c_str(),
                 static_cast<long long>(rows[i].second.count), rows[i].second.seconds * 1e3,
                 100 * rows[i].second.seconds / total);
  std::fclose(out);
}

// Times each iteration by hand (steps fence inside), reports manual time, keeps the mean (and
// the fastest iteration in `best` where asked).
template <class F>
double timed_loop(benchmark::State& state, F&& body, double* best = nullptr) {
  double total = 0;
  for (auto _ : state) {
    const auto t0 = Clock::now();
    body();
    const double dt = std::chrono::duration<double>(Clock::now() - t0).count();
    state.SetIterationTime(dt);
    total += dt;
    if (best != nullptr) *best = *best == 0 ? dt : std::min(*best, dt);
  }
  return state.iterations() > 0 ? total / static_cast<double>(state.iterations()) : 0.0;
}

// ---- references: SGEMM and a STREAM triad ------------------------------------------------------

// On the execution space's memory: OpenBLAS on a host build, cuBLAS on a CUDA build (the vendor
// BLAS the step's device products use), fenced, since a device GEMM returns before it is done.
void sgemm(benchmark::State& state, std::int64_t n) {
  using V = Kokkos::View<float**, Kokkos::LayoutLeft, M>;
  V a("a", n, n), b("b", n, n), c("c", n, n);
  Kokkos::Random_XorShift64_Pool<ExecSpace> pool(7);
  Kokkos::fill_random(a, pool, -1.0f, 1.0f);
  Kokkos::fill_random(b, pool, -1.0f, 1.0f);
  KokkosBlas::gemm("N", "N", 1.0f, a, b, 0.0f, c);  // warm-up (threads, page faults, cuBLAS handle)
  Kokkos::fence();
  // The reference rate is the best iteration, as the bandwidth's: on this shared VM the mean of a
  // 2-thread SGEMM 1024 moved between 156 and 202 GFLOP/s within one evening, and a low mean made
  // the steps' "of SGEMM" ratios look better than they were. The steps keep their mean.
  double best = 0;
  const double mean = timed_loop(state, [&] {
    const auto t0 = Clock::now();
    KokkosBlas::gemm("N", "N", 1.0f, a, b, 0.0f, c);
    Kokkos::fence();
    const double dt = std::chrono::duration<double>(Clock::now() - t0).count();
    best = best == 0 ? dt : std::min(best, dt);
  });
  const double flops = 2.0 * static_cast<double>(n) * static_cast<double>(n) * static_cast<double>(n);
  state.counters["GFLOP/s"] = flops / best * 1e-9;
  state.counters["GFLOP/s_mean"] = flops / mean * 1e-9;
  results()["sgemm/" + std::to_string(n)] = {best, flops, 0, 0, 0, 0, 0};
}

// The lower triangle of A^T A ('T', A k x n) or A A^T ('N', A n x k), n = k, single-threaded
// host BLAS, in the forms a factor update could take: "syrk" (one call, what the step runs),
// "blocked<b>" (a SYRK per b-wide diagonal block and a GEMM for the rows below it), "panel<b>"
// (one GEMM per b-wide column panel from its diagonal down: the diagonal blocks' upper halves
// computed and wasted) and "gemm" (the full product). GFLOP/s counts n^2 k for every form (the
// SYRK's work), so the forms compare by time. Whether a GEMM-built update beats OpenBLAS' SYRK at
// the sizes where the SYRK runs below the GEMM's rate (docs/performance-history.md, 19th round).
void syrk_forms(benchmark::State& state, char trans, std::int64_t n, const std::string& form) {
  namespace blas = lather::impl::blas;
  const std::int64_t k = n;
  const auto a_values = [&] {
    std::vector<float> v(static_cast<std::size_t>(n * k));
    std::uint64_t x = 88172645463325252ull;
    for (auto& e : v) {
      x ^= x << 13, x ^= x >> 7, x ^= x << 17;
      e = static_cast<float>(x >> 40) / static_cast<float>(1 << 24) - 0.5f;
    }
    return v;
  }();
  std::vector<float> c(static_cast<std::size_t>(n * n), 0.0f);
  const float* a = a_values.data();
  const bool tr = trans == 'T';
  const std::int64_t lda = tr ? k : n;
  // Rows j0 .. n of columns j0 .. j0 + w of C from the columns (rows) of op(A)^T they need.
  auto gemm_below = [&](std::int64_t i0, std::int64_t j0, std::int64_t m, std::int64_t w) {
    const float* ai = tr ? a + i0 * lda : a + i0;
    const float* aj = tr ? a + j0 * lda : a + j0;
    blas::gemm<float>(tr ? 'T' : 'N', tr ? 'N' : 'T', m, w, k, 1.0f, ai, lda, aj, lda, 0.0f, c.data() + i0 + j0 * n, n);
  };
  std::int64_t b = 0;
  if (form.starts_with("blocked")) b = std::stoll(form.substr(7));
  if (form.starts_with("panel")) b = std::stoll(form.substr(5));
  auto run = [&] {
    if (form == "syrk") {
      blas::syrk<float>('L', trans, n, k, 1.0f, a, lda, 0.0f, c.data(), n);
    } else if (form == "gemm") {
      gemm_below(0, 0, n, n);
    } else {
      for (std::int64_t j0 = 0; j0 < n; j0 += b) {
        const std::int64_t w = std::min(b, n - j0);
        if (form.starts_with("panel")) {
          gemm_below(j0, j0, n - j0, w);
          continue;
        }
        const float* aj = tr ? a + j0 * lda : a + j0;
        blas::syrk<float>('L', trans, w, k, 1.0f, aj, lda, 0.0f, c.data() + j0 + j0 * n, n);
        if (n > j0 + w) gemm_below(j0 + w, j0, n - j0 - w, w);
      }
    }
  };
  run();  // warm-up (OpenBLAS' buffers, page faults)
  double best = 0;
  timed_loop(state, run, &best);
  state.counters["GFLOP/s"] = static_cast<double>(n) * static_cast<double>(n) * static_cast<double>(k) / best * 1e-9;
}

// A factor update as the step runs it (C = 0.001 op(A) op(A)^T + 0.999 C in place, lower
// triangle, A n x n, single-threaded host BLAS: lather's tiles on AVX-512), over 200 blocks in
// turn whose A, C or both are distinct ("cold_a", "cold_c", "cold": 51 MiB each at n = 256, past
// a 32 MiB L3, so every block arrives from memory) or one block 200 times ("hot"). What a step's
// SYRK loses to memory, which syrk_forms (in cache) does not show; us/block is the best
// iteration's (docs/performance-history.md, "A fast VM of the same kind").
void syrk_stream(benchmark::State& state, char trans, std::int64_t n, const std::string& form) {
  namespace blas = lather::impl::blas;
  const std::int64_t k = n, blocks = 200;
  const bool cold_a = form == "cold" || form == "cold_a", cold_c = form == "cold" || form == "cold_c";
  std::vector<float> a(static_cast<std::size_t>(n * k * (cold_a ? blocks : 1)));
  std::vector<float> c(static_cast<std::size_t>(n * n * (cold_c ? blocks : 1)), 0.1f);
  std::uint64_t x = 88172645463325252ull;
  for (auto& e : a) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    e = static_cast<float>(x >> 40) / static_cast<float>(1 << 24) - 0.5f;
  }
  const blas::SingleThreaded single;
  auto run = [&] {
    for (std::int64_t b = 0; b < blocks; ++b)
      blas::syrk<float>('L', trans, n, k, 0.001f, a.data() + (cold_a ? b : 0) * n * k, n, 0.999f,
                        c.data() + (cold_c ? b : 0) * n * n, n);
  };
  run();  // warm-up (page faults)
  double best = 0;
  timed_loop(state, run, &best);
  state.counters["us/block"] = best / static_cast<double>(blocks) * 1e6;
  state.counters["GFLOP/s"] =
      static_cast<double>(n) * static_cast<double>(n) * static_cast<double>(k * blocks) / best * 1e-9;
}

void triad(benchmark::State& state) {
  const std::int64_t n = std::int64_t{1} << 25;  // 3 x 128 MiB: far beyond any cache
  Kokkos::View<float*, M> a("a", n), b("b", n), c("c", n);
  Kokkos::deep_copy(b, 1.0f);
  Kokkos::deep_copy(c, 2.0f);
  auto run = [&] {
    Kokkos::parallel_for(
        "triad", Kokkos::RangePolicy<ExecSpace>(0, n),
        KOKKOS_LAMBDA(std::int64_t i) { a(i) = b(i) + 0.5f * c(i); });
    Kokkos::fence();
  };
  run();
  // The machine's bandwidth is the best iteration (STREAM's rule; the mean moved by a third between
  // runs on this shared VM), counting the bytes the memory really moves: STREAM counts 3 arrays,
  // but a's cache lines are read before they are written (write-allocate), 4 arrays in all.
  // AdamW's 7 streams have no such hidden traffic (every array it writes it also reads), so
  // against STREAM's count it could reach more than 100%.
  double best = 0;
  timed_loop(state, [&] {
    const auto t0 = Clock::now();
    run();
    const double dt = std::chrono::duration<double>(Clock::now() - t0).count();
    best = best == 0 ? dt : std::min(best, dt);
  });
  const double bytes = 4.0 * 4.0 * static_cast<double>(n);
  state.counters["GB/s"] = bytes / best * 1e-9;
  state.counters["GB/s_stream_count"] = 0.75 * bytes / best * 1e-9;
  results()["triad"] = {best, 0, bytes, 0, 0, 0, 0};
}

// The ceiling a steady Shampoo step can reach with this BLAS: a square d x d block's four calls
// as the step makes them (the two factors' SYRKs, the two preconditioning SYMMs with the
// unpacked inverse roots), nothing else, on data that stay in cache. Each host thread runs its
// own block, as the step runs blocks side by side, single-threaded BLAS; per thread, the best of
// its repetitions; the rate is the threads' minimal work (6 d^3 each, the steps' count) over the
// slowest thread's best.
struct BlockProducts {
  std::int64_t d = 0;
  int repetitions = 0;
  std::vector<std::vector<float>>* buffers = nullptr;  // per thread: x, pm, gram, y
  std::vector<double>* best = nullptr;
  void operator()(int t) const {
    namespace blas = lather::impl::blas;
    auto& b = (*buffers)[static_cast<std::size_t>(t)];
    const std::int64_t n = d * d;
    float *x = b.data(), *pm = x + n, *gram = pm + n, *y = gram + n;
    double fastest = 0;
    for (int r = 0; r < repetitions; ++r) {
      const auto t0 = Clock::now();
      blas::syrk<float>('L', 'T', d, d, 1.0f, x, d, 0.0f, gram, d);
      blas::syrk<float>('L', 'N', d, d, 1.0f, x, d, 0.0f, gram, d);
      blas::symm<float>('R', 'L', d, d, 1.0f, pm, d, x, d, 0.0f, y, d);
      blas::symm<float>('L', 'L', d, d, 1.0f, pm, d, y, d, 0.0f, gram, d);
      const double dt = std::chrono::duration<double>(Clock::now() - t0).count();
      fastest = r == 0 ? dt : std::min(fastest, dt);
    }
    (*best)[static_cast<std::size_t>(t)] = fastest;
  }
};

void block_products(benchmark::State& state, std::int64_t d) {
  using Host = Kokkos::DefaultHostExecutionSpace;
  const int threads = Host().concurrency();
  const std::int64_t n = d * d;
  std::vector<std::vector<float>> buffers(static_cast<std::size_t>(threads));
  for (int t = 0; t < threads; ++t) {
    std::vector<float> r(static_cast<std::size_t>(2 * n));
    std::uint64_t state_bits = 0x9E3779B97F4A7C15ull * static_cast<std::uint64_t>(t + 1);
    for (auto& e : r) {  // uniform in [-1, 1): the values do not matter to the time
      state_bits = state_bits * 6364136223846793005ull + 1442695040888963407ull;
      e = static_cast<float>(static_cast<double>(state_bits >> 11) * 0x1.0p-52 - 1.0);
    }
    auto& b = buffers[static_cast<std::size_t>(t)];
    b.assign(static_cast<std::size_t>(4 * n), 0.0f);
    for (std::int64_t i = 0; i < n; ++i) b[static_cast<std::size_t>(i)] = r[static_cast<std::size_t>(i)];
    for (std::int64_t i = 0; i < d; ++i)  // pm: symmetric (both triangles set, as the step unpacks)
      for (std::int64_t j = 0; j <= i; ++j)
        b[static_cast<std::size_t>(n + i * d + j)] = b[static_cast<std::size_t>(n + j * d + i)] =
            r[static_cast<std::size_t>(n + i * d + j)];
  }
  std::vector<double> best(static_cast<std::size_t>(threads), 0.0);
  const BlockProducts run{d, d >= 1024 ? 5 : 100, &buffers, &best};
  const lather::impl::blas::SingleThreaded single;
  double slowest = 0;
  timed_loop(state, [&] {
    Kokkos::parallel_for("block_products", Kokkos::RangePolicy<Host, Kokkos::Schedule<Kokkos::Static>>(0, threads),
                         [&](int t) { run(t); });
    Kokkos::fence();
    slowest = *std::max_element(best.begin(), best.end());
  });
  const double flops = 6.0 * static_cast<double>(d) * static_cast<double>(d) * static_cast<double>(d) * threads;
  state.counters["GFLOP/s"] = flops / slowest * 1e-9;
  state.counters["threads"] = threads;
  results()["block_products/" + std::to_string(d)] = {slowest, flops, 0, 0, 0, 0, 0};
}

// The ceiling of a whole set's steady step with this BLAS: every block's calls as the step makes
// them (per dimension: the factor's SYRK, then the preconditioning SYMM with the unpacked inverse
// root; a middle dimension of a block of three or more on an unfolded copy, the copy not timed),
// nothing else, on data that stay in cache as far as they fit. Each distinct block shape runs on
// every thread at once, one block per thread as the step runs them, single-threaded BLAS; its
// time is the slowest thread's best repetition. The set's time is the sum over its blocks divided
// by the threads (perfect balance): a bound the step cannot beat, not a schedule it could follow.
// The rate is the minimal work (minimal_work's count) over that time.
struct ShapeProducts {
  std::vector<std::int64_t> extent;
  int repetitions = 0;
  std::vector<std::vector<float>>* buffers = nullptr;  // per thread: x, u, y, then pm and gram (d x d)
  std::vector<double>* best = nullptr;
  void operator()(int t) const {
    namespace blas = lather::impl::blas;
    auto& b = (*buffers)[static_cast<std::size_t>(t)];
    std::int64_t n = 1, dmax = 0;
    for (const auto e : extent) n *= e, dmax = std::max(dmax, e);
    float *x = b.data(), *u = x + n, *y = u + n, *pm = y + n, *gram = pm + dmax * dmax;
    double fastest = 0;
    for (int r = 0; r < repetitions; ++r) {
      const auto t0 = Clock::now();
      std::int64_t outer = 1, inner = n;
      if (extent.size() == 1) {
        // A one-dimensional block as the step makes it (block_factors, block_direction): the
        // rank-one update folded into the factor's combination, and SPMV on the packed inverse
        // factor; no Gram matrix, no unpacking.
        const std::int64_t d = extent[0];
        const lather::impl::kernels::RankOneCombineRows<float, float> rank_one{x, {gram, d, true}, 0.999f, 0.001f, true};
        for (std::int64_t i = 0; i < rank_one.iterations(d); ++i) rank_one(i);
        blas::spmv<float>('L', d, 1.0f, pm, x, 0.0f, y);
      } else {
        for (const std::int64_t d : extent) {
          inner /= d;
          const std::int64_t ld = std::max<std::int64_t>(1, d);
          if (outer == 1) {  // block_factors' and mode_product_symm's forms (optimizers/shampoo.hpp)
            blas::syrk<float>('L', 'T', d, inner, 1.0f, x, std::max<std::int64_t>(1, inner), 0.0f, gram, ld);
            blas::symm<float>('R', 'L', inner, d, 1.0f, pm, ld, x, std::max<std::int64_t>(1, inner), 0.0f, y,
                              std::max<std::int64_t>(1, inner));
          } else if (inner == 1) {
            blas::syrk<float>('L', 'N', d, outer, 1.0f, x, ld, 0.0f, gram, ld);
            blas::symm<float>('L', 'L', d, outer, 1.0f, pm, ld, x, ld, 0.0f, y, ld);
          } else {
            const std::int64_t m = outer * inner;
            blas::syrk<float>('L', 'T', d, m, 1.0f, u, m, 0.0f, gram, ld);
            blas::symm<float>('R', 'L', m, d, 1.0f, pm, ld, u, m, 0.0f, y, m);
          }
          outer *= d;
        }
      }
      const double dt = std::chrono::duration<double>(Clock::now() - t0).count();
      fastest = r == 0 ? dt : std::min(fastest, dt);
    }
    (*best)[static_cast<std::size_t>(t)] = fastest;
  }
};

void set_products(benchmark::State& state, const std::string& set, const std::vector<Shape>& shapes,
                  std::int64_t max_dim) {
  using Host = Kokkos::DefaultHostExecutionSpace;
  const int threads = Host().concurrency();
  // The blocks as the optimizer makes them (its defaults: merge_small_dims with target 1).
  std::map<std::vector<std::int64_t>, std::int64_t> count;
  for (const auto& s : shapes)
    for (const auto& blk : lather::BlockLayout(s, max_dim, lather::ShampooOptions{}.target_parameter_dimensionality).blocks)
      ++count[blk.extent];
  std::vector<std::vector<float>> buffers(static_cast<std::size_t>(threads));
  std::vector<double> best(static_cast<std::size_t>(threads), 0.0);
  const lather::impl::blas::SingleThreaded single;
  double seconds = 0, flops = 0;
  timed_loop(state, [&] {
    seconds = flops = 0;
    for (const auto& [extent, blocks] : count) {
      std::int64_t n = 1, dmax = 0;
      double work = 0;
      for (const auto e : extent) n *= e, dmax = std::max(dmax, e);
      for (const auto e : extent) work += 3.0 * static_cast<double>(e) * static_cast<double>(n);
      for (auto& b : buffers) {
        // Values do not change the time of these products; pm symmetric as the step unpacks it.
        b.assign(static_cast<std::size_t>(3 * n + 2 * dmax * dmax), 0.0f);
        for (std::size_t i = 0; i < b.size(); ++i) b[i] = static_cast<float>((i * 2654435761u) % 1000u) * 1e-3f - 0.5f;
      }
      // About half a second of products per shape and at least 5 repetitions (the first warms the
      // caches): the best of 3 was still a noisy moment's time on this shared VM.
      const int reps = static_cast<int>(std::clamp(0.5 / (work / 80e9), 5.0, 400.0));
      const ShapeProducts run{extent, reps, &buffers, &best};
      Kokkos::parallel_for("set_products", Kokkos::RangePolicy<Host, Kokkos::Schedule<Kokkos::Static>>(0, threads),
                           [&](int t) { run(t); });
      Kokkos::fence();
      seconds += static_cast<double>(blocks) * *std::max_element(best.begin(), best.end()) / threads;
      flops += static_cast<double>(blocks) * work;
    }
  });
  state.counters["GFLOP/s"] = flops / seconds * 1e-9;
  state.counters["threads"] = threads;
  results()["set_products/" + set + "/" + std::to_string(max_dim)] = {seconds, flops, 0, 0, 0, 0, 0};
}

// ---- steps of an optimizer (AdamW, Shampoo) ----------------------------------------------------

// The timed steps, each fenced: the mean step's seconds, the fastest in *best.
template <class Opt>
double timed_steps(benchmark::State& state, Opt& opt, const ExecSpace& space, Model& model, double* best) {
  return timed_loop(
      state,
      [&] {
        opt.step(space, model.grads);
        space.fence();
      },
      best);
}

// Two more steps counting allocations, then one counting Kokkos launches, into the counters.
template <class Opt>
std::pair<AllocationCounts, LaunchCounts> counted_steps(benchmark::State& state, Opt& opt, const ExecSpace& space,
                                                        Model& model) {
  const AllocationCounts allocs = count_allocations(2, [&] { opt.step(space, model.grads); });
  state.counters["heap_allocs/step"] = allocs.heap;
  state.counters["kokkos_allocs/step"] = allocs.kokkos;
  const LaunchCounts launches = count_launches(1, [&] { opt.step(space, model.grads); });
  state.counters["kernels/step"] = launches.kernels;
  state.counters["deep_copies/step"] = launches.deep_copies;
  return {allocs, launches};
}

// ---- AdamW -------------------------------------------------------------------------------------

// `portable`: host spaces run the portable multi-tensor kernel (the one devices run) instead of
// the vectorized host chunk loop (AdamW::set_portable_kernels).
void adamw(benchmark::State& state, const std::string& set, const std::vector<Shape>& shapes, bool portable) {
  Model model(shapes);
  lather::AdamW<P, ExecSpace> opt(model.params, lather::AdamWOptions{});
  opt.set_portable_kernels(portable);
  const ExecSpace space;
  opt.step(space, model.grads);
  double best = 0;
  const double t = timed_steps(state, opt, space, model, &best);
  g_cell = "adamw/" + set + (portable ? "/portable" : "");
  const auto [allocs, launches] = counted_steps(state, opt, space, model);
  // One fused pass: parameters read and written, gradients read, two moments read and written.
  const double bytes = 7.0 * 4.0 * static_cast<double>(model.size);
  state.counters["GB/s"] = bytes / t * 1e-9;
  // The fastest step, like with like against the triad's best iteration (the bandwidth).
  state.counters["GB/s_best"] = best > 0 ? bytes / best * 1e-9 : 0.0;
  state.counters["state_bytes"] = 2.0 * 4.0 * static_cast<double>(model.size);
  results()["adamw/" + set + (portable ? "/portable" : "")] = {t, 0, bytes, 0, 0, allocs.heap, allocs.kokkos, best};
}

// ---- the ColossalAI family ---------------------------------------------------------------------

enum class Family { adafactor, came, lamb, galore };
const char* family_name(Family f) {
  switch (f) {
    case Family::adafactor: return "adafactor";
    case Family::came: return "came";
    case Family::lamb: return "lamb";
    case Family::galore: return "galore";
  }
  return "";
}

// Steady steps of one family optimizer on a set: the first step (GaLore's projector SVDs) untimed;
// options at their defaults but for GaLore's rank 128 (capped per matrix at its smaller
// dimension) and a projector gap longer than the run.
void family(benchmark::State& state, const std::string& set, const std::vector<Shape>& shapes, Family kind) {
  Model model(shapes);
  const ExecSpace space;
  const std::string cell = std::string("family/") + family_name(kind) + "/" + set;
  const auto run = [&](auto& opt) {
    opt.step(space, model.grads);
    space.fence();
    double best = 0;
    const double t = timed_steps(state, opt, space, model, &best);
    g_cell = cell;
    const auto counts = counted_steps(state, opt, space, model);
    state.counters["state_bytes"] = static_cast<double>(opt.state_bytes());
    results()[cell] = {t, 0, static_cast<double>(opt.state_bytes()), 0, 0, counts.first.heap, counts.first.kokkos, best};
  };
  switch (kind) {
    case Family::adafactor: {
      lather::Adafactor<P, ExecSpace> opt(model.params, lather::AdafactorOptions{});
      run(opt);
      break;
    }
    case Family::came: {
      lather::CAME<P, ExecSpace> opt(model.params, lather::CAMEOptions{});
      run(opt);
      break;
    }
    case Family::lamb: {
      lather::Lamb<P, ExecSpace> opt(model.params, lather::LambOptions{});
      run(opt);
      break;
    }
    case Family::galore: {
      lather::GaLoreAdamW<P, ExecSpace> opt(std::span<P>(model.params),
                                            lather::GaLoreOptions{.rank = 128, .update_proj_gap = 1000000});
      run(opt);
      break;
    }
  }
}

// ---- Shampoo -----------------------------------------------------------------------------------

struct WorkAndMemory {
  double flops = 0;             // minimal work of one steady step
  double reference_packed = 0;  // the reference's state bytes, factors packed (its default)
  double reference_full = 0;    // ... with full d x d factors
  double per_element = 0;       // ... of which the buffers of the parameters' size (grafting, filter)
};

// From lather's own blocks (merge_small_dims + multi_dim_split, the reference's rules).
template <class Opt>
WorkAndMemory minimal_work(const Opt& opt, const Model& model) {
  WorkAndMemory w;
  for (std::size_t i = 0; i < opt.num_params(); ++i) {
    for (const auto& blk : opt.layout(i).blocks) {
      const auto n = static_cast<double>(blk.numel());
      for (const auto d64 : blk.extent) {
        const auto d = static_cast<double>(d64);
        w.flops += 3.0 * d * n;
        // factor and inverse factor, float32
        w.reference_packed += 2.0 * 4.0 * d * (d + 1) / 2;
        w.reference_full += 2.0 * 4.0 * d * d;
      }
    }
  }
  // Adam grafting's second moment and the filtered gradient (betas[0] > 0), float32.
  const double per_element = 2.0 * 4.0 * static_cast<double>(model.size);
  w.reference_packed += per_element;
  w.reference_full += per_element;
  w.per_element = per_element;
  return w;
}

lather::ShampooOptions shampoo_options(std::int64_t max_dim, std::int64_t frequency) {
  return {.lr = 1e-3,
          .betas = {0.9, 0.999},
          .epsilon = 1e-8,
          .max_preconditioner_dim = max_dim,
          .precondition_frequency = frequency,
          .start_preconditioning_step = frequency};
}

// Moves the optimizer's step counter (a state-dict round trip, the supported way).
template <class Opt>
void set_step(Opt& opt, std::int64_t step) {
  auto d = opt.state_dict();
  d.tensors["param_groups.0.step"] = lather::StateTensor{{}, std::vector<std::int64_t>{step}};
  opt.load_state_dict(d);
}

// LATHER_BENCH_PHASES=1: after a steady cell's measured steps, as many more with
// Shampoo::set_phase_timing (the step count set back to 100 first, so that none computes roots),
// reported as phase_ms/<phase> (mean per step; block phases in thread-milliseconds) and
// products_GFLOP/s_thread: the minimal work over the factor and direction phases (per thread: a
// rate to hold against one thread's SGEMM). Off by default: the clock reads stay out of the
// suite's own steps and the run is shorter.
bool phases_wanted() {
  const char* e = std::getenv("LATHER_BENCH_PHASES");
  return e != nullptr && *e != '\0' && std::string(e) != "0";
}

template <class Opt>
void phase_counters(benchmark::State& state, Opt& opt, const ExecSpace& space, Model& model, double flops,
                    std::int64_t steps) {
  set_step(opt, 100);
  opt.set_phase_timing(true);
  lather::impl::ShampooPhaseSeconds sum;
  double* const parts[] = {&sum.total, &sum.screen, &sum.gather, &sum.factors,
                           &sum.filter, &sum.direction, &sum.norms, &sum.update};
  const char* names[] = {"total", "screen", "gather", "factors", "filter", "direction", "norms", "update"};
  for (std::int64_t k = 0; k < steps; ++k) {
    opt.step(space, model.grads);
    const auto& s = opt.last_step_info().seconds;
    const double got[] = {s.total, s.screen, s.gather, s.factors, s.filter, s.direction, s.norms, s.update};
    for (std::size_t i = 0; i < std::size(parts); ++i) *parts[i] += got[i];
  }
  opt.set_phase_timing(false);
  if (opt.last_step_info().amortized) fail(state, "a phase-timed step computed roots");
  for (std::size_t i = 0; i < std::size(parts); ++i)
    state.counters[std::string("phase_ms/") + names[i]] = *parts[i] / static_cast<double>(steps) * 1e3;
  const double products = (sum.factors + sum.direction) / static_cast<double>(steps);
  if (products > 0) state.counters["products_GFLOP/s_thread"] = flops / products * 1e-9;
}

// kind "steady": precondition_frequency 100; steps 1 and 100 (the first root inverses) untimed,
// then steps 101, 102, ... timed (none computes a root inverse).
// kind "root": precondition_frequency 1: every timed step recomputes every inverse root.
// Strategy: EigenRootInverse (the suite's Shampoo), or, on device builds, coupled Newton
// ("root_newton") and AutoRootInverse's defaults ("root_auto": Newton with the eigendecomposition
// where Newton does not succeed) for every root.
// LATHER_BENCH_GRAM_TILES=min[:max]: Shampoo::set_gram_tiles(min, max) (default max 8) for every
// Shampoo cell instead of the build's default, 0 for untiled Gram products (A/B runs of the tiling).
template <class Opt>
void apply_gram_tiles(Opt& opt) {
  const char* e = std::getenv("LATHER_BENCH_GRAM_TILES");
  if (e == nullptr || *e == '\0') return;
  char* end = nullptr;
  const long min_tile = std::strtol(e, &end, 10);
  long max_tiles = 8;
  if (end != nullptr && *end == ':') max_tiles = std::strtol(end + 1, &end, 10);
  if (end == e || (end != nullptr && *end != '\0') || min_tile < 0 || max_tiles < 2) {
    std::fprintf(stderr, "LATHER_BENCH_GRAM_TILES=%s: give min[:max], min >= 0 (0: off), max >= 2\n", e);
    std::exit(2);
  }
  opt.set_gram_tiles(min_tile, max_tiles);
}

template <class Strategy>
std::string shampoo_key(const std::string& set, std::int64_t max_dim, bool root_step) {
  const char* kind = !root_step                                                        ? "/steady"
                     : std::is_same_v<Strategy, lather::EigenRootInverse>           ? "/root"
                     : std::is_same_v<Strategy, lather::CoupledNewtonRootInverse> ? "/root_newton"
                                                                                    : "/root_auto";
  return "shampoo/" + set + "/" + std::to_string(max_dim) + kind;
}

// `other_passes`: the steady step with the other form of the element passes than the space's
// default (Shampoo::set_batched_passes): on host builds the batched passes devices run
// ("steady_batched"), on device builds the per-parameter kernels ("steady_per_parameter").
template <class Strategy>
void shampoo_run(benchmark::State& state, const std::string& set, const std::vector<Shape>& shapes,
                 std::int64_t max_dim, bool root_step, bool other_passes = false) {
  using Opt = lather::Shampoo<P, ExecSpace, Strategy, lather::AdamGrafting>;
  Model model(shapes);
  Opt opt(model.params, shampoo_options(max_dim, root_step ? 1 : 100), Strategy{},
          lather::AdamGrafting{.epsilon = 1e-8});
  if (other_passes) opt.set_batched_passes(!opt.batched_passes());
  apply_gram_tiles(opt);
  const ExecSpace space;
  // What the first steps leave on the heap beside the state (built with the optimizer): the
  // block tasks' work arrays and the root inverses' (per thread, LAPACK's workspace included).
  // Those are thread-local and grown to the largest size seen, so a cell after a larger one in the
  // same process reads less: run a cell alone for its own figure.
  const double heap_built = heap_in_use();
  // The first step: a grafted step plus, since 2026-12-07, the sizing of the root steps' work
  // arrays on stand-in matrices (one root per distinct factor size, or per thread side by side).
  const auto first_start = std::chrono::steady_clock::now();
  opt.step(space, model.grads);
  space.fence();
  state.counters["first_step_ms"] =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - first_start).count();
  if (!root_step) {
    set_step(opt, 99);
    opt.step(space, model.grads);  // step 100: roots computed, preconditioning from here on
  }
  if (heap_built >= 0) state.counters["first_steps_heap_MB"] = (heap_in_use() - heap_built) * 1e-6;
  double best = 0;
  const double t = timed_steps(state, opt, space, model, &best);
  if (root_step != opt.last_step_info().amortized || opt.last_step_info().grafted)
    fail(state, "the timed steps were not the kind named (amortized / preconditioned)");
  // Two more steps of the same kind (the steady ones stay below step 200), then one counting launches.
  g_cell = shampoo_key<Strategy>(set, max_dim, root_step);
  const auto [allocs, launches] = counted_steps(state, opt, space, model);
  const WorkAndMemory w = minimal_work(opt, model);
  const auto bytes = static_cast<double>(opt.state_bytes());
  // Issue #7: no more state than the reference for the same options (its packed default).
  if (bytes != w.reference_packed) fail(state, "state_bytes() differs from the reference's packed state of the same blocks");
  if (!root_step) {
    state.counters["min_GFLOP/s"] = w.flops / t * 1e-9;
    state.counters["min_GFLOP/s_best"] = w.flops / best * 1e-9;
  }
  state.counters["state_MB"] = bytes * 1e-6;
  // The optimizer's own work arrays beside the state (Shampoo::workspace_bytes(): sized at
  // construction, the batched passes' when they are on), exact where first_steps_heap_MB is not.
  state.counters["workspace_MB"] = static_cast<double>(opt.workspace_bytes()) * 1e-6;
  state.counters["ref_state_MB"] = w.reference_packed * 1e-6;
  state.counters["huge_page_MB"] = static_cast<double>(opt.huge_page_bytes()) * 1e-6;
  state.counters["batched_launches/step"] = static_cast<double>(opt.last_step_info().batched_launches);
  state.counters["batched_gemm_calls/step"] = static_cast<double>(opt.last_step_info().batched_gemm_calls);
  state.counters["split_gram_products/step"] = static_cast<double>(opt.last_step_info().split_gram_products);
  state.counters["tiled_gram_products/step"] = static_cast<double>(opt.last_step_info().tiled_gram_products);
  state.counters["batched_uploads/step"] = static_cast<double>(opt.last_step_info().batched_uploads);
  state.counters["wide_blocks/step"] = static_cast<double>(opt.last_step_info().wide_blocks);
  const std::string other = other_passes ? (opt.batched_passes() ? "_batched" : "_per_parameter") : "";
  if (!root_step)
    profile_kernels(shampoo_key<Strategy>(set, max_dim, root_step) + other, [&] { opt.step(space, model.grads); });
  if (!root_step && phases_wanted()) phase_counters(state, opt, space, model, w.flops, state.iterations());
  results()[shampoo_key<Strategy>(set, max_dim, root_step) + other] = {
      t, w.flops, bytes, w.reference_packed, w.reference_full, allocs.heap, allocs.kokkos, best,
      launches.kernels, launches.deep_copies, w.per_element};
}

template <class Strategy = lather::EigenRootInverse>
void shampoo(benchmark::State& state, const std::string& set, const std::vector<Shape>& shapes,
             std::int64_t max_dim, bool root_step) {
  if constexpr (std::is_same_v<Strategy, lather::EigenRootInverse>) {
    shampoo_run<Strategy>(state, set, shapes, max_dim, root_step);
  } else {
    // Root steps whose roots are not finite are a result here (coupled Newton diverging on a
    // rank-deficient float factor, where the step refuses and changes nothing), not a broken
    // benchmark: reported, the suite goes on, the summary says so.
    try {
      shampoo_run<Strategy>(state, set, shapes, max_dim, root_step);
    } catch (const std::exception& e) {
      state.SkipWithError(e.what());
      results()[shampoo_key<Strategy>(set, max_dim, root_step)] = Result{.seconds = -1};
    }
  }
}

// kind "period": precondition_frequency 20; after step 20 (every block's first roots), each
// iteration times one full period of 20 steps one by one, with or without
// stagger_amortized_computations: the mean step and the longest one (the spike staggering removes).
constexpr std::int64_t period_frequency = 20;
void shampoo_period(benchmark::State& state, const std::string& set, const std::vector<Shape>& shapes,
                    std::int64_t max_dim, bool stagger) {
  Model model(shapes);
  auto o = shampoo_options(max_dim, period_frequency);
  o.stagger_amortized_computations = stagger;
  ShampooOpt opt(model.params, o, lather::EigenRootInverse{}, lather::AdamGrafting{.epsilon = 1e-8});
  const ExecSpace space;
  opt.step(space, model.grads);
  set_step(opt, period_frequency - 1);
  opt.step(space, model.grads);
  double longest = 0, total = 0;
  std::int64_t steps = 0;
  for (auto _ : state) {
    double period = 0;
    for (std::int64_t k = 0; k < period_frequency; ++k) {
      const auto t0 = Clock::now();
      opt.step(space, model.grads);
      space.fence();
      const double dt = std::chrono::duration<double>(Clock::now() - t0).count();
      longest = std::max(longest, dt);
      period += dt;
      ++steps;
    }
    state.SetIterationTime(period);
    total += period;
  }
  state.counters["mean_step_ms"] = steps > 0 ? total / static_cast<double>(steps) * 1e3 : 0.0;
  state.counters["longest_step_ms"] = longest * 1e3;
  results()["shampoo_period/" + set + "/" + std::to_string(max_dim) + (stagger ? "/stagger" : "/plain")] = {
      steps > 0 ? total / static_cast<double>(steps) : 0.0, longest, 0, 0, 0, 0, 0};
}

// Optimizer-state bytes with full (unpacked) factors, from construction (no step needed).
void shampoo_unpacked_state(benchmark::State& state, const std::string& set, const std::vector<Shape>& shapes,
                            std::int64_t max_dim) {
  Model model(shapes);
  auto o = shampoo_options(max_dim, 100);
  o.use_symmetric_packing = false;
  ShampooOpt opt(model.params, o, lather::EigenRootInverse{}, lather::AdamGrafting{.epsilon = 1e-8});
  const ExecSpace space;
  opt.step(space, model.grads);
  double bytes = 0;
  for (auto _ : state) bytes = static_cast<double>(opt.state_bytes());
  if (bytes != minimal_work(opt, model).reference_full)
    fail(state, "state_bytes() with full factors differs from the reference's full state of the same blocks");
  state.counters["state_MB"] = bytes * 1e-6;
  results()["shampoo/" + set + "/" + std::to_string(max_dim) + "/full_state"] = {0, 0, bytes, 0, 0, 0, 0};
}

// ---- root inverses against a bare syevd -------------------------------------------------------

// A factor-like SPD matrix: X X^T / n + 1e-3 I, X with uniform entries (condition ~1e3 - 1e4).
template <class T>
Kokkos::View<T**, Kokkos::LayoutRight, Kokkos::HostSpace> spd(std::int64_t n) {
  Kokkos::View<T**, Kokkos::LayoutRight, Kokkos::HostSpace> x("x", n, n), a("a", n, n);
  Kokkos::Random_XorShift64_Pool<Kokkos::DefaultHostExecutionSpace> pool(11);
  Kokkos::fill_random(x, pool, T(-1), T(1));
  KokkosBlas::gemm("N", "T", T(1) / static_cast<T>(n), x, x, T(0), a);
  for (std::int64_t i = 0; i < n; ++i) a(i, i) += T(1e-3);
  return a;
}

template <class T>
void bare_syevd(benchmark::State& state, std::int64_t n) {
  const auto a = spd<T>(n);
  std::vector<T> work_a(static_cast<std::size_t>(n * n)), w(static_cast<std::size_t>(n));
  const int nn = static_cast<int>(n);
  int lwork = -1, liwork = -1, info = 0, iq = 0;
  T q = 0;
  auto call = [&](T* work, int* iwork) {
    if constexpr (std::is_same_v<T, float>)
      ssyevd_("V", "L", &nn, work_a.data(), &nn, w.data(), work, &lwork, iwork, &liwork, &info, 1, 1);
    else
      dsyevd_("V", "L", &nn, work_a.data(), &nn, w.data(), work, &lwork, iwork, &liwork, &info, 1, 1);
  };
  call(&q, &iq);  // workspace query
  lwork = static_cast<int>(q);
  liwork = iq;
  std::vector<T> work(static_cast<std::size_t>(lwork));
  std::vector<int> iwork(static_cast<std::size_t>(liwork));
  auto once = [&] {
    std::copy(a.data(), a.data() + n * n, work_a.begin());  // syevd overwrites its input
    call(work.data(), iwork.data());
  };
  once();  // untimed: the first call of a routine pays one-off costs (seen: 10 ms for dsyevd at n = 128)
  const double t = timed_loop(state, once);
  if (info != 0) fail(state, "syevd failed");
  results()[std::string("syevd/") + (sizeof(T) == 4 ? "float/" : "double/") + std::to_string(n)] =
      Result{.seconds = t};
}

template <class T, class Strategy>
void root_inverse(benchmark::State& state, const char* name, const Strategy& strategy, std::int64_t n) {
  const auto a = spd<T>(n);
  Kokkos::View<T**, Kokkos::LayoutRight, Kokkos::HostSpace> x("x", n, n);
  const Kokkos::DefaultHostExecutionSpace space;
  const Kokkos::View<const T**, Kokkos::LayoutRight, Kokkos::HostSpace> ac = a;
  lather::RootInverseStatus status = lather::RootInverseStatus::success;
  status = strategy.compute(space, ac, 4.0, 0.0, x);  // untimed first call, as for syevd
  const double t = timed_loop(state, [&] { status = strategy.compute(space, ac, 4.0, 0.0, x); });
  if (!lather::is_usable(status)) fail(state, lather::to_string(status));
  results()[std::string(name) + (sizeof(T) == 4 ? "/float/" : "/double/") + std::to_string(n)] =
      Result{.seconds = t};
}

// GemmBatches' depth rule (impl/backends/gemm_batches.hpp): `count` Gram products C = X^T X, m x m
// from X of k x m (Shampoo's form for a block's first dimension), queued and run as one batched
// call (depth ratio raised until the group fits) or one call per product (ratio 0), the same queue
// and the same one-by-one routine as Shampoo's device path (a general product: Kokkos Kernels'
// gemm, cuBLAS on CUDA). Where the batched call starts to lose as k / m grows is what the default
// ratio (16) should be; it was set from two ResNet-50 shapes only (docs/performance.md, "On a
// GPU"). Where there is no batched BLAS (host builds, HIP) both forms are the same calls: the host
// registers two small cells so the smoke test runs the code. "calls" counts the BLAS calls a run made.
// The third form, "split", is GemmBatches::set_split for every output size (Shampoo's default splits
// outputs of at most 32 rows): products deeper than 2048 become batched chunks of 2048 rows and an
// adding kernel. The batched and split results are checked against one call per product.
enum class DepthForm { batched, one_by_one, split };
const char* depth_form_name(DepthForm f) {
  return f == DepthForm::batched ? "/batched" : f == DepthForm::one_by_one ? "/one_by_one" : "/split";
}
void gemm_batches_depth(benchmark::State& state, std::int64_t m, std::int64_t k, std::int64_t count, DepthForm form) {
  using Batches = lather::impl::blas::GemmBatches<ExecSpace, float, M>;
  using Matrix = Kokkos::View<float**, Kokkos::LayoutLeft, M, Kokkos::MemoryTraits<Kokkos::Unmanaged>>;
  Kokkos::View<float*, M> x("x", static_cast<std::size_t>(count * k * m)), c("c", static_cast<std::size_t>(count * m * m));
  Kokkos::Random_XorShift64_Pool<ExecSpace> pool(11);
  Kokkos::fill_random(x, pool, -1.0f, 1.0f);
  Batches batches;
  batches.reserve(count);
  const auto configure = [](Batches& b, DepthForm f) {
    b.set_depth_ratio(f == DepthForm::batched      ? std::numeric_limits<std::int64_t>::max()
                      : f == DepthForm::one_by_one ? 0
                                                   : Batches::default_depth_ratio);
    b.set_split(f == DepthForm::split ? std::numeric_limits<std::int64_t>::max() : 0, Batches::default_split_chunk);
  };
  configure(batches, form);
  const ExecSpace space;
  auto one = [&](const Batches::Product& p) {
    // The first k rows of X's lda (a chunk of a split product is a slice of X).
    const auto a = Kokkos::subview(Matrix(const_cast<float*>(p.a), static_cast<std::size_t>(p.lda), static_cast<std::size_t>(p.m)),
                                   Kokkos::make_pair(std::int64_t(0), p.k), Kokkos::ALL);
    const Matrix out(p.c, static_cast<std::size_t>(p.ldc), static_cast<std::size_t>(p.n));
    lather::impl::kernels::gemm(space, "T", "N", 1.0f, a, a, 0.0f, out);
  };
  std::int64_t calls = 0;
  auto queue = [&](Batches& b, const Kokkos::View<float*, M>& into) {
    b.begin_step();
    for (std::int64_t i = 0; i < count; ++i) {
      Batches::Product p;
      p.ta = 'T';
      p.tb = 'N';
      p.m = p.n = m;
      p.k = k;
      p.a = p.b = x.data() + i * k * m;
      p.lda = p.ldb = k;
      p.c = into.data() + i * m * m;
      p.ldc = m;
      p.gram = true;
      b.add(p);
    }
    const std::int64_t made = b.run(space, one);
    space.fence();
    return made;
  };
  auto run = [&] { calls = queue(batches, c); };
  run();  // untimed: the pointer arrays' upload, the cuBLAS handle, first-touch
  const double t = timed_loop(state, run);
  // The form named must be the form run: one call where the BLAS batches, else one per product;
  // split: the chunks (one call per chunk shape where the BLAS batches) and the adding kernel.
  const std::int64_t ratio = Batches::default_depth_ratio;
  const std::int64_t kc = std::max(ratio * m, Batches::default_split_chunk), chunks = (k + kc - 1) / kc;
  const bool batches_whole = Batches::batched_blas && count > 1 &&
                             (form == DepthForm::batched || (form == DepthForm::split && k <= ratio * m));
  const std::int64_t want = form == DepthForm::split && k > kc
                                ? (Batches::batched_blas ? (k % kc == 0 ? 1 : 2) : count * chunks) + 1
                                : batches_whole ? 1 : count;
  if (calls != want) fail(state, "GemmBatches made a different number of calls than the form named");
  if (form != DepthForm::one_by_one) {  // the lower triangles against one call per product
    Kokkos::View<float*, M> c1("c1", static_cast<std::size_t>(count * m * m));
    Batches ref;
    configure(ref, DepthForm::one_by_one);
    queue(ref, c1);
    const auto h = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace{}, c);
    const auto h1 = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace{}, c1);
    double diff = 0, scale = 0;
    for (std::int64_t i = 0; i < count; ++i)
      for (std::int64_t col = 0; col < m; ++col)
        for (std::int64_t row = col; row < m; ++row) {
          const auto e = static_cast<std::size_t>(i * m * m + col * m + row);
          diff = std::max(diff, std::abs(static_cast<double>(h(e)) - static_cast<double>(h1(e))));
          scale = std::max(scale, std::abs(static_cast<double>(h1(e))));
        }
    state.counters["rel_diff"] = scale > 0 ? diff / scale : diff;
    // Float sums of k products in another order differ by about sqrt(k) u of the largest entry
    // (an H100's batched 64 x 64 from 262144: 7.4e-5); a chunk missed or repeated, by 1/chunks.
    const double tolerance = std::max(1e-5, 8.0 * std::sqrt(static_cast<double>(k)) * std::numeric_limits<float>::epsilon());
    if (!(diff <= tolerance * scale)) fail(state, "the batched or split products differ from one call per product");
  }
  // A general product's flops (the device has no batched SYRK; Shampoo's device Gram products are GEMMs).
  const double flops = 2.0 * static_cast<double>(m) * static_cast<double>(m) * static_cast<double>(k) *
                       static_cast<double>(count);
  state.counters["GFLOP/s"] = t > 0 ? flops / t * 1e-9 : 0.0;
  state.counters["calls"] = static_cast<double>(calls);
  state.counters["k_over_m"] = static_cast<double>(k) / static_cast<double>(m);
  results()["gemm_batches_depth/" + std::to_string(m) + "/" + std::to_string(k) + "/" + std::to_string(count) +
            depth_form_name(form)] = Result{.seconds = t, .flops = flops};
}

// The (m, k, count) cells of gemm_batches_depth: on a GPU k / m from 1 to 65536 around the default
// ratio 16 (k at most 262144: ResNet-50 at block size 1024 has 3 x 3 Gram products from 196608),
// for output sizes from 3 x 3 to a 256 block, 2 to 64 products, at most 2^28 floats of X per cell
// (1 GiB); on the host one small cell.
struct DepthCell {
  std::int64_t m, k, count;
};
std::vector<DepthCell> depth_cells(bool device) {
  if (!device) return {{16, 256, 8}, {4, 4100, 2}};  // the second split in three chunks
  std::vector<DepthCell> cells;
  for (const std::int64_t m : {3, 9, 32, 64, 128, 256})
    for (const std::int64_t r : {1, 4, 16, 64, 256, 1024, 4096, 16384, 65536})
      for (const std::int64_t count : {2, 8, 64}) {
        const std::int64_t k = r * m;
        if (k > 262144 || count * k * m > (std::int64_t{1} << 28)) continue;
        cells.push_back({m, k, count});
      }
  return cells;
}

// Device-only benchmarks: compiled for CUDA and HIP alone (the host builds' suite and its compile
// time stay as they were).
#if defined(KOKKOS_ENABLE_CUDA) || defined(KOKKOS_ENABLE_HIP)
#define LATHER_BENCH_DEVICE 1
#else
#define LATHER_BENCH_DEVICE 0
#endif
constexpr bool device_build = LATHER_BENCH_DEVICE != 0;

#if LATHER_BENCH_DEVICE
// The double eigendecomposition of spd<T>(n) (a float matrix is exact in double), computed once per
// matrix: both strategies are compared with it. Kept in std::vector, not a View: the cache
// outlives Kokkos::finalize.
template <class T>
const std::vector<double>& reference_root(std::int64_t n,
                                          const Kokkos::View<T**, Kokkos::LayoutRight, Kokkos::HostSpace>& a) {
  static std::map<std::int64_t, std::vector<double>> cache;
  auto it = cache.find(n);
  if (it == cache.end()) {
    Kokkos::View<double**, Kokkos::LayoutRight, Kokkos::HostSpace> a64("a64", n, n), x64("x64", n, n);
    for (std::int64_t i = 0; i < n; ++i)
      for (std::int64_t j = 0; j < n; ++j) a64(i, j) = static_cast<double>(a(i, j));
    const Kokkos::View<const double**, Kokkos::LayoutRight, Kokkos::HostSpace> ac = a64;
    (void)lather::EigenRootInverse{}.compute(Kokkos::DefaultHostExecutionSpace{}, ac, 4.0, 0.0, x64);
    it = cache.emplace(n, std::vector<double>(x64.data(), x64.data() + n * n)).first;
  }
  return it->second;
}

// On a device build: the strategy on the execution space, A and X in its memory. There the
// eigendecomposition copies A to the host, runs LAPACK on the CPU and copies X back, while
// coupled Newton's products stay on the device (cuBLAS); this is where AutoRootInverse's
// newton_min_dim_device comes from. "rel_diff" is max |X - X_eig| / max |X_eig| against a host
// eigendecomposition in double: the strategies agree to Newton's tolerance, not bit for bit.
template <class T, class Strategy>
void root_inverse_space(benchmark::State& state, const char* name, const Strategy& strategy, std::int64_t n) {
  const auto a_host = spd<T>(n);
  Kokkos::View<T**, Kokkos::LayoutRight, M> a("a", n, n), x("x", n, n);
  Kokkos::deep_copy(a, a_host);
  const ExecSpace space;
  const Kokkos::View<const T**, Kokkos::LayoutRight, M> ac = a;
  lather::RootInverseStatus status = strategy.compute(space, ac, 4.0, 0.0, x);  // untimed first call
  const double t = timed_loop(state, [&] {
    status = strategy.compute(space, ac, 4.0, 0.0, x);
    space.fence();
  });
  if (!lather::is_usable(status)) fail(state, lather::to_string(status));
  // Accuracy against a double eigendecomposition of the same matrix.
  const std::vector<double>& x64 = reference_root<T>(n, a_host);
  const auto xh = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace{}, x);
  double diff = 0, scale = 0;
  for (std::int64_t i = 0; i < n; ++i)
    for (std::int64_t j = 0; j < n; ++j) {
      const double ref = x64[static_cast<std::size_t>(i * n + j)];
      diff = std::max(diff, std::abs(static_cast<double>(xh(i, j)) - ref));
      scale = std::max(scale, std::abs(ref));
    }
  state.counters["rel_diff"] = scale > 0 ? diff / scale : diff;
  results()[std::string(name) + (sizeof(T) == 4 ? "/float/" : "/double/") + std::to_string(n)] =
      Result{.seconds = t, .flops = scale > 0 ? diff / scale : diff};
}
#endif

// ---- registration and summary --------------------------------------------------------------

struct Set {
  std::string name;
  std::vector<Shape> shapes;
  int steady_iterations, root_iterations;
};
int g_iterations_cap = 1 << 30;

// LATHER_BENCH_STEADY_ITERATIONS=n: n timed steady steps per set instead of the defaults (for
// profiling and A/B runs that want more samples; at most 90, so the steps stay below step 200
// and none recomputes a root inverse).
int steady_iterations(int fallback) {
  const char* e = std::getenv("LATHER_BENCH_STEADY_ITERATIONS");
  if (e == nullptr || *e == '\0') return fallback;
  const int n = std::atoi(e);
  if (n < 1 || n > 90) {
    std::fprintf(stderr, "LATHER_BENCH_STEADY_ITERATIONS=%s: give a count from 1 to 90\n", e);
    std::exit(2);
  }
  return n;
}

std::vector<Set> sets() {
  return {{"mlp", mlp_shapes(), steady_iterations(20), 5},
          {"gpt2-block", gpt2_block_shapes(), steady_iterations(5), 2},
          {"resnet50", resnet50_shapes(), steady_iterations(3), 1}};
}

// smoke: one iteration each (the CTest smoke test checks the kinds, not the times).
void register_all(bool smoke) {
  if (smoke) g_iterations_cap = 1;
  for (const std::int64_t n : {256, 1024, 2048}) {
    auto* b = benchmark::RegisterBenchmark(("sgemm/" + std::to_string(n)).c_str(), sgemm, n);
    b->UseManualTime()->Unit(benchmark::kMillisecond);
    if (smoke) b->Iterations(1);
  }
  for (const std::int64_t d : {256, 1024}) {
    auto* b = benchmark::RegisterBenchmark(("block_products/" + std::to_string(d)).c_str(), block_products, d);
    b->UseManualTime()->Iterations(1)->Unit(benchmark::kMillisecond);
  }
  for (const auto& s : sets())
    for (const std::int64_t dim : {256, 1024})
      benchmark::RegisterBenchmark(("set_products/" + s.name + "/" + std::to_string(dim)).c_str(), set_products,
                                   s.name, s.shapes, dim)
          ->UseManualTime()
          ->Iterations(1)
          ->Unit(benchmark::kMillisecond);
  if constexpr (!device_build)
    for (const char trans : {'T', 'N'})
      for (const std::int64_t n : {256, 512})
        for (const char* form : {"syrk", "blocked64", "blocked128", "panel64", "gemm"}) {
          auto* b = benchmark::RegisterBenchmark(
              ("syrk_forms/" + std::string(1, trans) + "/" + std::to_string(n) + "/" + form).c_str(), syrk_forms, trans,
              n, std::string(form));
          b->UseManualTime()->Unit(benchmark::kMicrosecond);
          if (smoke)
            b->Iterations(1);
          else
            b->MinTime(0.2);  // (Google Benchmark refuses both)
        }
  if constexpr (!device_build)
    for (const char trans : {'N', 'T'})
      for (const char* form : {"hot", "cold_a", "cold_c", "cold"}) {
        auto* b = benchmark::RegisterBenchmark(("syrk_stream/" + std::string(1, trans) + "/256/" + form).c_str(),
                                               syrk_stream, trans, std::int64_t{256}, std::string(form));
        b->UseManualTime()->Unit(benchmark::kMillisecond)->Iterations(smoke ? 1 : 7);
      }
  for (const DepthCell& d : depth_cells(device_build))
    for (const DepthForm form : {DepthForm::batched, DepthForm::one_by_one, DepthForm::split}) {
      auto* b = benchmark::RegisterBenchmark(("gemm_batches_depth/" + std::to_string(d.m) + "/" + std::to_string(d.k) +
                                              "/" + std::to_string(d.count) + depth_form_name(form))
                                                 .c_str(),
                                             gemm_batches_depth, d.m, d.k, d.count, form);
      b->UseManualTime()->Iterations(std::min(20, g_iterations_cap))->Unit(benchmark::kMicrosecond);
    }
  benchmark::RegisterBenchmark("stream_triad", triad)
      ->UseManualTime()
      ->Iterations(std::min(20, g_iterations_cap))
      ->Unit(benchmark::kMillisecond);
  for (const auto& s : sets()) {
    auto* b = benchmark::RegisterBenchmark(("adamw/" + s.name).c_str(), adamw, s.name, s.shapes, false);
    b->UseManualTime()->Unit(benchmark::kMillisecond);
    if (smoke) b->Iterations(1);
    if constexpr (!device_build) {  // on devices the default is the portable kernel
      auto* q = benchmark::RegisterBenchmark(("adamw/" + s.name + "/portable").c_str(), adamw, s.name, s.shapes, true);
      q->UseManualTime()->Unit(benchmark::kMillisecond);
      if (smoke) q->Iterations(1);
    }
  }
  for (const auto& s : sets())
    for (const Family f : {Family::adafactor, Family::came, Family::lamb, Family::galore}) {
      auto* b = benchmark::RegisterBenchmark((std::string("family/") + family_name(f) + "/" + s.name).c_str(), family,
                                             s.name, s.shapes, f);
      b->UseManualTime()->Iterations(std::min(s.steady_iterations, g_iterations_cap))->Unit(benchmark::kMillisecond);
      if (smoke) b->Iterations(1);
    }
  for (const auto& s : sets())
    for (const std::int64_t dim : {256, 1024}) {
      const std::string base = "shampoo/" + s.name + "/" + std::to_string(dim);
      benchmark::RegisterBenchmark((base + "/steady").c_str(), shampoo<>, s.name, s.shapes, dim, false)
          ->UseManualTime()
          ->Iterations(std::min(s.steady_iterations, g_iterations_cap))
          ->Unit(benchmark::kMillisecond);
      benchmark::RegisterBenchmark((base + (device_build ? "/steady_per_parameter" : "/steady_batched")).c_str(),
                                   shampoo_run<lather::EigenRootInverse>, s.name, s.shapes, dim, false, true)
          ->UseManualTime()
          ->Iterations(std::min(s.steady_iterations, g_iterations_cap))
          ->Unit(benchmark::kMillisecond);
      benchmark::RegisterBenchmark((base + "/root").c_str(), shampoo<>, s.name, s.shapes, dim, true)
          ->UseManualTime()
          ->Iterations(std::min(s.root_iterations, g_iterations_cap))
          ->Unit(benchmark::kMillisecond);
      benchmark::RegisterBenchmark((base + "/full_state").c_str(), shampoo_unpacked_state, s.name, s.shapes,
                                   dim)
          ->Iterations(1);
#if LATHER_BENCH_DEVICE  // root steps with every root by coupled Newton on the device
      benchmark::RegisterBenchmark((base + "/root_newton").c_str(), shampoo<lather::CoupledNewtonRootInverse>,
                                   s.name, s.shapes, dim, true)
          ->UseManualTime()
          ->Iterations(std::min(s.root_iterations, g_iterations_cap))
          ->Unit(benchmark::kMillisecond);
      benchmark::RegisterBenchmark((base + "/root_auto").c_str(), shampoo<lather::AutoRootInverse>, s.name,
                                   s.shapes, dim, true)
          ->UseManualTime()
          ->Iterations(std::min(s.root_iterations, g_iterations_cap))
          ->Unit(benchmark::kMillisecond);
#endif
    }
  for (const auto& s : sets()) {
    if (s.name == "resnet50") continue;  // 20 steps of seconds each per period: too long for the suite
    for (const bool stagger : {false, true})
      benchmark::RegisterBenchmark(
          ("shampoo_period/" + s.name + "/256/" + (stagger ? "stagger" : "plain")).c_str(), shampoo_period, s.name,
          s.shapes, std::int64_t{256}, stagger)
          ->UseManualTime()
          ->Iterations(1)
          ->Unit(benchmark::kMillisecond);
  }
  for (const std::int64_t n : {128, 256, 512, 1024, 2048}) {
    const int it = std::min(n >= 1024 ? 2 : 5, g_iterations_cap);
    const std::string sn = std::to_string(n);
    benchmark::RegisterBenchmark(("syevd/float/" + sn).c_str(), bare_syevd<float>, n)
        ->UseManualTime()
        ->Iterations(it)
        ->Unit(benchmark::kMillisecond);
    benchmark::RegisterBenchmark(("eigen_root_inverse/float/" + sn).c_str(),
                                 root_inverse<float, lather::EigenRootInverse>, "eigen_root_inverse",
                                 lather::EigenRootInverse{}, n)
        ->UseManualTime()
        ->Iterations(it)
        ->Unit(benchmark::kMillisecond);
    benchmark::RegisterBenchmark(("syevd/double/" + sn).c_str(), bare_syevd<double>, n)
        ->UseManualTime()
        ->Iterations(it)
        ->Unit(benchmark::kMillisecond);
    benchmark::RegisterBenchmark(("eigen_root_inverse/double/" + sn).c_str(),
                                 root_inverse<double, lather::EigenRootInverse>, "eigen_root_inverse",
                                 lather::EigenRootInverse{}, n)
        ->UseManualTime()
        ->Iterations(it)
        ->Unit(benchmark::kMillisecond);
    if (n <= 1024) {
      benchmark::RegisterBenchmark(("coupled_newton/float/" + sn).c_str(),
                                   root_inverse<float, lather::CoupledNewtonRootInverse>, "coupled_newton",
                                   lather::CoupledNewtonRootInverse{}, n)
          ->UseManualTime()
          ->Iterations(it)
          ->Unit(benchmark::kMillisecond);
      benchmark::RegisterBenchmark(("coupled_newton/double/" + sn).c_str(),
                                   root_inverse<double, lather::CoupledNewtonRootInverse>, "coupled_newton",
                                   lather::CoupledNewtonRootInverse{}, n)
          ->UseManualTime()
          ->Iterations(it)
          ->Unit(benchmark::kMillisecond);
    }
  }
#if LATHER_BENCH_DEVICE
  // Each strategy on the execution space, float and double ("<name>/<type>/<n>").
  const auto device_roots = [](const char* name, auto strategy) {
    using S = decltype(strategy);
    for (const std::int64_t n : {128, 256, 512, 1024, 2048, 4096})
      for (const bool f : {true, false})
        benchmark::RegisterBenchmark((std::string(name) + (f ? "/float/" : "/double/") + std::to_string(n)).c_str(),
                                     f ? root_inverse_space<float, S> : root_inverse_space<double, S>, name, strategy, n)
            ->UseManualTime()
            ->Iterations(std::min(n >= 1024 ? 2 : 5, g_iterations_cap))
            ->Unit(benchmark::kMillisecond);
  };
  device_roots("eigen_root_inverse_space", lather::EigenRootInverse{});
  device_roots("coupled_newton_space", lather::CoupledNewtonRootInverse{});
#endif
}

const Result* find(const std::string& k) {
  const auto it = results().find(k);
  return it == results().end() ? nullptr : &it->second;
}

// threads, set, max dim, mean steady step (ms), best steady step (ms), SGEMM 1024 (GFLOP/s, best
// iteration), mean step's minimal work against it (%), best step's (%): the 80% target of #7 per
// cell, for runs repeated by scripts/bench-targets.sh.
void write_target_rows(const std::string& path, int threads) {
  const Result* gemm = find("sgemm/1024");
  if (gemm == nullptr) {
    std::fprintf(stderr, "--target-rows: no sgemm/1024 in this run (include it in --benchmark_filter)\n");
    g_failed = true;
    return;
  }
  std::ofstream out(path, std::ios::app);
  const double gemm_rate = gemm->flops / gemm->seconds;
  char buf[256];
  for (const auto& s : sets())
    for (const std::int64_t dim : {256, 1024}) {
      const Result* st = find("shampoo/" + s.name + "/" + std::to_string(dim) + "/steady");
      if (st == nullptr || st->seconds <= 0) continue;
      std::snprintf(buf, sizeof buf, "%d\t%s\t%lld\t%.3f\t%.3f\t%.1f\t%.1f\t%.1f\n", threads, s.name.c_str(),
                    static_cast<long long>(dim), st->seconds * 1e3, st->best_seconds * 1e3, gemm_rate * 1e-9,
                    100.0 * st->flops / st->seconds / gemm_rate, 100.0 * st->flops / st->best_seconds / gemm_rate);
      out << buf;
    }
}

void write_summary(const std::string& path, int threads) {
  std::ofstream out(path);
  char buf[512];
  const Result* gemm = find("sgemm/1024");
  const Result* tri = find("triad");
  const double gemm_rate = gemm ? gemm->flops / gemm->seconds : 0;
  out << "threads: " << threads << "\n\n";
  if (gemm) out << "SGEMM 1024 (best of its iterations): " << gemm_rate * 1e-9 << " GFLOP/s";
  if (tri)
    out << "; memory bandwidth (STREAM triad, best of its iterations, write-allocate counted): "
        << tri->bytes / tri->seconds * 1e-9 << " GB/s (STREAM's own count: " << 0.75 * tri->bytes / tri->seconds * 1e-9
        << ")";
  // The ceiling of a steady step with this BLAS (block_products above).
  for (const std::int64_t d : {256, 1024})
    if (const Result* bp = find("block_products/" + std::to_string(d))) {
      const double rate = bp->flops / bp->seconds;
      std::snprintf(buf, sizeof buf,
                    "\n\nA %lld x %lld block's four BLAS calls alone (hot caches, one block per thread): %.1f "
                    "GFLOP/s, %.0f%% of SGEMM 1024",
                    static_cast<long long>(d), static_cast<long long>(d), rate * 1e-9,
                    gemm_rate > 0 ? 100.0 * rate / gemm_rate : 0.0);
      out << buf;
    }
  // "of SGEMM": the mean steady step against SGEMM's best iteration (the conservative ratio);
  // "best step": the fastest timed step against the same (like with like; this shared VM's
  // neighbours move a mean by 10-30%).
  out << "\n\n| set | max dim | steady step | min work | GFLOP/s | of SGEMM | best step | of SGEMM (best step) | "
         "root step | F=100 amortized | state (lather) | state (reference, packed) | full factors (reference) | "
         "full factors (lather) | allocations per steady / root step (heap, Kokkos) |\n";
  out << "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n";
  for (const auto& s : sets())
    for (const std::int64_t dim : {256, 1024}) {
      const std::string base = "shampoo/" + s.name + "/" + std::to_string(dim);
      const Result *st = find(base + "/steady"), *rt = find(base + "/root"), *fs = find(base + "/full_state");
      if (!st) continue;
      const double rate = st->flops / st->seconds;
      const double best_rate = st->best_seconds > 0 ? st->flops / st->best_seconds : 0.0;
      // F = 100: 99 steady steps and one root step; "-" where the run filtered the root step out
      // (a GPU run's filter: its eigendecompositions run on the host).
      char root[64] = "- | -", allocs[64];
      if (rt) {
        std::snprintf(root, sizeof root, "%.0f ms | %.1f ms", rt->seconds * 1e3,
                      (99.0 * st->seconds + rt->seconds) / 100.0 * 1e3);
        std::snprintf(allocs, sizeof allocs, "%.0f, %.0f / %.0f, %.0f", st->heap_allocations, st->kokkos_allocations,
                      rt->heap_allocations, rt->kokkos_allocations);
      } else {
        std::snprintf(allocs, sizeof allocs, "%.0f, %.0f / -", st->heap_allocations, st->kokkos_allocations);
      }
      std::snprintf(buf, sizeof buf,
                    "| %s | %lld | %.1f ms | %.2f GFLOP | %.1f | %.0f%% | %.1f ms | %.0f%% | %s | %.1f MB | %.1f MB | "
                    "%.1f MB | %.1f MB | %s |\n",
                    s.name.c_str(), static_cast<long long>(dim), st->seconds * 1e3, st->flops * 1e-9,
                    rate * 1e-9, gemm_rate > 0 ? 100.0 * rate / gemm_rate : 0.0, st->best_seconds * 1e3,
                    gemm_rate > 0 ? 100.0 * best_rate / gemm_rate : 0.0, root, st->bytes * 1e-6,
                    st->ref_packed * 1e-6, st->ref_full * 1e-6, fs ? fs->bytes * 1e-6 : 0.0, allocs);
      out << buf;
    }
  // What symmetric packing can save: it halves (nearly) the factors and inverse factors, never
  // the buffers of the parameters' size, so the saving stays under half the factors' share of the
  // full state. Issue #7's "a third smaller" needs factors of at least two thirds of the state; a
  // square d x d block with Adam grafting and a filtered gradient has exactly two thirds (4 d^2
  // against 2 d^2) and saves (d - 1) / (3 d).
  out << "\n| set | max dim | state, full factors | state, packed | smaller by | factors' share of the full "
         "state | ceiling of packing (half that share) |\n| --- | ---: | ---: | ---: | ---: | ---: | ---: |\n";
  for (const auto& s : sets())
    for (const std::int64_t dim : {256, 1024}) {
      const std::string base = "shampoo/" + s.name + "/" + std::to_string(dim);
      const Result *st = find(base + "/steady"), *fs = find(base + "/full_state");
      if (!st || !fs || fs->bytes <= 0 || st->ref_full <= 0) continue;
      const double factor_share = (st->ref_full - st->ref_per_element) / st->ref_full;
      std::snprintf(buf, sizeof buf, "| %s | %lld | %.1f MB | %.1f MB | %.1f%% | %.1f%% | %.1f%% |\n", s.name.c_str(),
                    static_cast<long long>(dim), fs->bytes * 1e-6, st->bytes * 1e-6,
                    100.0 * (fs->bytes - st->bytes) / fs->bytes, 100.0 * factor_share, 50.0 * factor_share);
      out << buf;
    }
  // The steady step against the ceiling of its own products (set_products above).
  out << "\n| set | max dim | products alone (ceiling) | GFLOP/s | of SGEMM | steady step of the ceiling (mean) | "
         "(best step) |\n| --- | ---: | ---: | ---: | ---: | ---: | ---: |\n";
  for (const auto& s : sets())
    for (const std::int64_t dim : {256, 1024}) {
      const std::string d = std::to_string(dim);
      const Result *c = find("set_products/" + s.name + "/" + d), *st = find("shampoo/" + s.name + "/" + d + "/steady");
      if (!c || !st) continue;
      const double rate = c->flops / c->seconds;
      std::snprintf(buf, sizeof buf, "| %s | %lld | %.1f ms | %.1f | %.0f%% | %.0f%% | %.0f%% |\n", s.name.c_str(),
                    static_cast<long long>(dim), c->seconds * 1e3, rate * 1e-9,
                    gemm_rate > 0 ? 100.0 * rate / gemm_rate : 0.0, 100.0 * c->seconds / st->seconds,
                    st->best_seconds > 0 ? 100.0 * c->seconds / st->best_seconds : 0.0);
      out << buf;
    }
  // "of bandwidth": the mean step against the triad's best iteration (the conservative ratio, as
  // the steps' "of SGEMM"); "(best step)": the fastest step against the same.
  out << "\n| set | AdamW step | GB/s | of bandwidth | best step | of bandwidth (best step) | allocations per step "
         "(heap, Kokkos) |\n";
  out << "| --- | ---: | ---: | ---: | ---: | ---: | ---: |\n";
  for (const auto& s : sets())
    for (const char* variant : {"", "/portable"})
      if (const Result* a = find("adamw/" + s.name + variant)) {
        const double bw = a->bytes / a->seconds, bw_best = a->best_seconds > 0 ? a->bytes / a->best_seconds : 0.0;
        const double triad_bw = tri ? tri->bytes / tri->seconds : 0.0;
        std::snprintf(buf, sizeof buf, "| %s%s | %.2f ms | %.1f | %.0f%% | %.2f ms | %.0f%% | %.0f, %.0f |\n",
                      s.name.c_str(), *variant ? " (portable kernel)" : "", a->seconds * 1e3, bw * 1e-9,
                      triad_bw > 0 ? 100.0 * bw / triad_bw : 0.0, a->best_seconds * 1e3,
                      triad_bw > 0 ? 100.0 * bw_best / triad_bw : 0.0, a->heap_allocations, a->kokkos_allocations);
        out << buf;
      }
  // The ColossalAI family's steady steps, against AdamW's mean step on the same set.
  out << "\n| set | optimizer | mean step | of AdamW's | best step | state bytes | allocations per step (heap, Kokkos) |\n";
  out << "| --- | --- | ---: | ---: | ---: | ---: | ---: |\n";
  for (const auto& s : sets())
    for (const Family f : {Family::adafactor, Family::came, Family::lamb, Family::galore})
      if (const Result* r = find(std::string("family/") + family_name(f) + "/" + s.name)) {
        const Result* a = find("adamw/" + s.name);
        std::snprintf(buf, sizeof buf, "| %s | %s | %.2f ms | %.0f%% | %.2f ms | %.3g | %.0f, %.0f |\n", s.name.c_str(),
                      family_name(f), r->seconds * 1e3, a && a->seconds > 0 ? 100.0 * r->seconds / a->seconds : 0.0,
                      r->best_seconds * 1e3, r->bytes, r->heap_allocations, r->kokkos_allocations);
        out << buf;
      }
  out << "\n| set | max dim | F | mean step | longest step | mean step, staggered | longest step, staggered |\n";
  out << "| --- | ---: | ---: | ---: | ---: | ---: | ---: |\n";
  for (const auto& s : sets()) {
    const Result *pl = find("shampoo_period/" + s.name + "/256/plain"),
                 *st = find("shampoo_period/" + s.name + "/256/stagger");
    if (!pl || !st) continue;
    // Result::flops holds the longest step here (seconds).
    std::snprintf(buf, sizeof buf, "| %s | 256 | %lld | %.1f ms | %.1f ms | %.1f ms | %.1f ms |\n", s.name.c_str(),
                  static_cast<long long>(period_frequency), pl->seconds * 1e3, pl->flops * 1e3, st->seconds * 1e3,
                  st->flops * 1e3);
    out << buf;
  }
  out << "\n| n | syevd float | eigen root inverse float | ratio | coupled Newton float | syevd double | "
         "eigen root "
         "inverse double | ratio | coupled Newton double |\n| ---: | ---: | ---: | ---: | ---: | ---: | ---: "
         "| ---: | ---: |\n";
  for (const std::int64_t n : {128, 256, 512, 1024, 2048}) {
    const std::string sn = std::to_string(n);
    auto ms = [&](const std::string& k) {
      const Result* r = find(k);
      return r ? std::to_string(r->seconds * 1e3).substr(0, 7) + " ms" : std::string("-");
    };
    auto ratio = [&](const std::string& a, const std::string& b) {
      const Result *x = find(a), *y = find(b);
      return x && y ? std::to_string(x->seconds / y->seconds).substr(0, 4) : std::string("-");
    };
    out << "| " << n << " | " << ms("syevd/float/" + sn) << " | " << ms("eigen_root_inverse/float/" + sn)
        << " | " << ratio("eigen_root_inverse/float/" + sn, "syevd/float/" + sn) << " | "
        << ms("coupled_newton/float/" + sn) << " | " << ms("syevd/double/" + sn) << " | "
        << ms("eigen_root_inverse/double/" + sn) << " | "
        << ratio("eigen_root_inverse/double/" + sn, "syevd/double/" + sn) << " | "
        << ms("coupled_newton/double/" + sn) << " |\n";
  }
  // GemmBatches' depth rule (gemm_batches_depth): one batched call and the split against one call
  // per product.
  bool depth_header = false;
  for (const DepthCell& d : depth_cells(device_build)) {
    const std::string base =
        "gemm_batches_depth/" + std::to_string(d.m) + "/" + std::to_string(d.k) + "/" + std::to_string(d.count);
    const Result *b = find(base + "/batched"), *o = find(base + "/one_by_one"), *sp = find(base + "/split");
    if (!b || !o || !sp) continue;
    if (!depth_header) {
      out << "\n| Gram products m x m from k | k / m | products | one batched call | one call each | "
             "one call each / batched | split in chunks of 2048 | one call each / split |\n"
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n";
      depth_header = true;
    }
    std::snprintf(buf, sizeof buf, "| %lld x %lld from %lld | %lld | %lld | %.1f us | %.1f us | %.2f | %.1f us | %.2f |\n",
                  static_cast<long long>(d.m), static_cast<long long>(d.m), static_cast<long long>(d.k),
                  static_cast<long long>(d.k / d.m), static_cast<long long>(d.count), b->seconds * 1e6,
                  o->seconds * 1e6, b->seconds > 0 ? o->seconds / b->seconds : 0.0, sp->seconds * 1e6,
                  sp->seconds > 0 ? o->seconds / sp->seconds : 0.0);
    out << buf;
  }
  if (!device_build) return;
  // Device builds: what a steady step launches (a GPU step pays microseconds per kernel and a
  // wait per reduction or copy to the host), root inverses on the execution space, root steps by
  // coupled Newton.
  out << "\n| set | max dim | steady step | Kokkos kernels per step | deep copies per step | root step | kernels | "
         "deep copies |\n| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n";
  for (const auto& s : sets())
    for (const std::int64_t dim : {256, 1024}) {
      const std::string base = "shampoo/" + s.name + "/" + std::to_string(dim);
      const Result *st = find(base + "/steady"), *rt = find(base + "/root");
      if (!st) continue;
      char root[96] = "- | - | -";  // the run filtered the root step out
      if (rt) std::snprintf(root, sizeof root, "%.1f ms | %.0f | %.0f", rt->seconds * 1e3, rt->kernels, rt->deep_copies);
      std::snprintf(buf, sizeof buf, "| %s | %lld | %.2f ms | %.0f | %.0f | %s |\n", s.name.c_str(),
                    static_cast<long long>(dim), st->seconds * 1e3, st->kernels, st->deep_copies, root);
      out << buf;
    }
  out << "\nRoot inverses on the execution space (A and X in device memory; rel. difference against a "
         "double eigendecomposition):\n\n| n | eigen float | Newton float | Newton / eigen | eigen double | "
         "Newton double | Newton / eigen | rel. diff. eigen float | Newton float | Newton double |\n"
         "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n";
  for (const std::int64_t n : {128, 256, 512, 1024, 2048, 4096}) {
    const std::string sn = std::to_string(n);
    const Result *ef = find("eigen_root_inverse_space/float/" + sn), *nf = find("coupled_newton_space/float/" + sn),
                 *ed = find("eigen_root_inverse_space/double/" + sn), *nd = find("coupled_newton_space/double/" + sn);
    if (!ef || !nf || !ed || !nd) continue;
    std::snprintf(buf, sizeof buf, "| %lld | %.2f ms | %.2f ms | %.2f | %.2f ms | %.2f ms | %.2f | %.1e | %.1e | %.1e |\n",
                  static_cast<long long>(n), ef->seconds * 1e3, nf->seconds * 1e3, nf->seconds / ef->seconds,
                  ed->seconds * 1e3, nd->seconds * 1e3, nd->seconds / ed->seconds, ef->flops, nf->flops, nd->flops);
    out << buf;
  }
  out << "\n| set | max dim | root step (eigendecomposition) | root step (coupled Newton) | Newton / eigen | "
         "root step (AutoRootInverse defaults) | Auto / eigen |\n| --- | ---: | ---: | ---: | ---: | ---: | ---: |\n";
  auto cell = [&](const Result* r, const Result* e) {
    if (!r) return std::string("- | -");
    if (r->seconds < 0) return std::string("not finite (the step refused) | -");
    std::snprintf(buf, sizeof buf, "%.1f ms | %.2f", r->seconds * 1e3, e ? r->seconds / e->seconds : 0.0);
    return std::string(buf);
  };
  for (const auto& s : sets())
    for (const std::int64_t dim : {256, 1024}) {
      const std::string base = "shampoo/" + s.name + "/" + std::to_string(dim);
      const Result* e = find(base + "/root");
      if (!e) continue;
      const std::string nw = cell(find(base + "/root_newton"), e), au = cell(find(base + "/root_auto"), e);
      std::snprintf(buf, sizeof buf, "| %s | %lld | %.1f ms | ", s.name.c_str(), static_cast<long long>(dim),
                    e->seconds * 1e3);
      out << buf << nw << " | " << au << " |\n";
    }
}

}  // namespace

// Counting replacements of the global allocation functions (the aligned and nothrow forms are
// not used on a step's path; they keep the default behavior). GCC 12 sees free() after an
// inlined new-expression and warns of a mismatch; these functions are that pair.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"
#endif
#if defined(__CUDA_ARCH__) || defined(__HIP_DEVICE_COMPILE__)
// nvcc makes a replaced operator new __host__ __device__; its device pass, which has neither the
// host atomics nor exceptions, gets the plain allocation (nothing on a step's device path
// allocates). The host pass below counts.
void* operator new(std::size_t n) { return std::malloc(n == 0 ? 1 : n); }
#else
void* operator new(std::size_t n) {
  if (g_counting.load(std::memory_order_relaxed)) {
    g_heap_allocations.fetch_add(1, std::memory_order_relaxed);
    trace_allocation();
  }
  if (void* p = std::malloc(n == 0 ? 1 : n)) return p;
  throw std::bad_alloc();
}
#endif
void* operator new[](std::size_t n) { return ::operator new(n); }
void operator delete(void* p) noexcept { std::free(p); }
void operator delete[](void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t) noexcept { std::free(p); }

int main(int argc, char** argv) {
  Kokkos::ScopeGuard guard(argc, argv);
  if (const char* e = std::getenv("LATHER_BENCH_ALLOC_TRACE"); e != nullptr && *e != '\0') {
#if defined(LATHER_BENCH_ALLOC_TRACE)
    g_trace_limit = std::clamp(std::atoi(e), 0, trace_max);
    void* warm[2];
    (void)backtrace(warm, 2);  // loads the unwinder now, not inside a counted step
#else
    std::fprintf(stderr, "LATHER_BENCH_ALLOC_TRACE: no backtrace() on this system; ignored\n");
#endif
  }
  std::string summary, plot_data, target_rows;
  bool smoke = false;
  std::vector<char*> args;
  for (int i = 0; i < argc; ++i) {
    const std::string_view a = argv[i];
    if (a.starts_with("--summary="))
      summary = std::string(a.substr(10));
    else if (a.starts_with("--plot-data="))
      plot_data = std::string(a.substr(12));
    else if (a.starts_with("--target-rows="))
      target_rows = std::string(a.substr(14));
    else if (a == "--smoke")
      smoke = true;
    else
      args.push_back(argv[i]);
  }
  int n = static_cast<int>(args.size());
  register_all(smoke);
  benchmark::Initialize(&n, args.data());
  if (benchmark::ReportUnrecognizedArguments(n, args.data())) return 1;
  benchmark::AddCustomContext("lather", lather::version_string);
  benchmark::AddCustomContext("kokkos_execution_space", ExecSpace::name());
  benchmark::AddCustomContext("kokkos_threads", std::to_string(ExecSpace().concurrency()));
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  if (!summary.empty()) write_summary(summary, ExecSpace().concurrency());
  if (!target_rows.empty()) write_target_rows(target_rows, ExecSpace().concurrency());
  if (!plot_data.empty()) {
    std::ofstream out(plot_data);
    out << "# set adamw_ms shampoo256_steady_ms shampoo256_f100_ms shampoo1024_steady_ms "
           "shampoo1024_f100_ms\n";
    for (const auto& s : sets()) {
      out << '"' << s.name << '"';
      const Result* a = find("adamw/" + s.name);
      out << ' ' << (a ? a->seconds * 1e3 : 0.0);
      for (const std::int64_t dim : {256, 1024}) {
        const std::string base = "shampoo/" + s.name + "/" + std::to_string(dim);
        const Result *st = find(base + "/steady"), *rt = find(base + "/root");
        out << ' ' << (st ? st->seconds * 1e3 : 0.0) << ' '
            << (st && rt ? (99.0 * st->seconds + rt->seconds) / 100.0 * 1e3 : 0.0);
      }
      out << '\n';
    }
  }
  return g_failed ? 1 : 0;
}
