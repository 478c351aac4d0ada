#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Runs lather's device-space tests and the performance suite on a real NVIDIA GPU, from binaries
# built here (a machine without a GPU) and carried to the GPU machine. Two halves:
#
#   scripts/gpu-run.sh bundle [DIR]        here: build the CUDA targets below at -O3 (the GPU compile
#                                          check's tool chain and Kokkos install, scripts/gpu-compile-check.sh,
#                                          with LATHER_GPU_TARGETS) and pack them with the shared
#                                          libraries they need into DIR/bundle.tar.xz
#                                          (default DIR: build-gpu-bundle/)
#   scripts/gpu-run.sh run [DIR] [OUT]     on the GPU machine, from the repository root: unpack,
#                                          run every test executable, then the suite's device
#                                          benchmarks; logs, JSON and the summary go to OUT
#                                          (default: $OUT, else DIR/out)
#
# The tests are instantiated for the device space alone (LATHER_TEST_DEVICE_SPACES_ONLY, as in the
# compile check): the host spaces are what scripts/test.sh runs everywhere else. MPI is off (one
# process; the MPI tests run on the host). The machine needs an NVIDIA driver and cuBLAS 13
# (libcublas.so.13: the CUDA 13 toolkit, or the nvidia-cublas Python wheel); nothing is fetched.
# docs/gpu-compile-check.md ("Running on a GPU") has the measured results and how they were made.
#
# Environment:
#   LATHER_GPU_RUN_TARGETS   targets to bundle (default below)
#   LATHER_GPU_RUN_BUILD_DIR build directory (default build-gpu-run/, logs in build-gpu-run-logs/)
#   LATHER_GPU_TEST_TIMEOUT  seconds per test executable (default 240)
#   LATHER_GPU_TESTS_BUDGET  seconds for all test executables together (default 300); the ones left
#                            when it is spent are reported as not run (a failure)
#   LATHER_GPU_BENCH_FILTER  Google Benchmark filter of the suite (default: the device benchmarks)
#   LATHER_GPU_BENCH_TIMEOUT seconds for the suite (default 420)
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
log() { echo "[gpu-run] $*" >&2; }
die() { log "ERROR: $*"; exit 1; }

DEFAULT_TARGETS="lather_unit_tests lather_root_inverse_tests lather_shampoo_tests lather_shampoo_family_tests
lather_adafactor_came_tests lather_lamb_tests lather_galore_tests lather_quantization_tests
lather_reliability_tests lather_checkpoint_tests lather_bench_suite"
TARGETS=$(echo ${LATHER_GPU_RUN_TARGETS:-$DEFAULT_TARGETS})
# On a GPU the suite's host-only parts (set_products, block_products, the host root inverses and
# syevd) would time the GPU machine's CPU; they are left out.
DEFAULT_FILTER='^(sgemm|stream_triad|adamw|shampoo/|shampoo_period|eigen_root_inverse_space|coupled_newton_space|gemm_batches_depth)'

mode=${1:-}
[ -n "$mode" ] || die "usage: scripts/gpu-run.sh bundle [DIR] | run [DIR] [OUT]"
dir=${2:-$root/build-gpu-bundle}

if [ "$mode" = bundle ]; then
  build=${LATHER_GPU_RUN_BUILD_DIR:-$root/build-gpu-run}
  mkdir -p "$dir"
  log "building $TARGETS in $build (CUDA, -O3; logs in $build-logs)"
  LATHER_GPU_TARGETS="$TARGETS" LATHER_GPU_OPT=-O3 LATHER_GPU_BUILD_DIR_CUDA="$build" \
    LATHER_GPU_LOG_DIR="$build-logs" LATHER_GPU_CMAKE_ARGS="-DLATHER_ENABLE_MPI=OFF ${LATHER_GPU_CMAKE_ARGS:-}" \
    "$root/scripts/gpu-compile-check.sh" cuda
  stage=$(mktemp -d)
  trap 'rm -rf "$stage"' EXIT
  mkdir -p "$stage/bin" "$stage/lib" "$stage/lib-fallback"
  for t in $TARGETS; do
    f=$(find "$build" -type f -name "$t" -perm -u+x | head -n1)
    [ -n "$f" ] || die "no executable $t in $build"
    cp "$f" "$stage/bin/"
  done
  # Shared libraries from Debian's lib directories, but not the C library, the driver or CUDA's
  # own (the GPU machine brings those); libstdc++ and libgcc_s only as a fallback, used there
  # when its own are older than bookworm's.
  for f in "$stage"/bin/*; do ldd "$f"; done | awk '$2 == "=>" && $3 ~ /^\// {print $3}' | sort -u |
    while read -r lib; do
      base=$(basename "$lib")
      case "$base" in
        libc.so* | libm.so* | libdl.so* | libpthread.so* | librt.so* | ld-linux* | libcuda.so* | libcublas* | \
          libcudart* | libnvidia* | libnvJitLink*) ;;
        libstdc++.so* | libgcc_s.so*) cp -L "$lib" "$stage/lib-fallback/$base" ;;
        *) cp -L "$lib" "$stage/lib/$base" ;;
      esac
    done
  echo "$TARGETS" | tr ' ' '\n' >"$stage/order"  # the run's order: the core tests first
  cp "$root/scripts/openblas-env.sh" "$stage/"
  # The tests read their data from the source tree path compiled into them.
  echo "$root" >"$stage/source-root"
  tar -C "$stage" -cJf "$dir/bundle.tar.xz" .
  log "bundle: $dir/bundle.tar.xz ($(du -h "$dir/bundle.tar.xz" | cut -f1)); binaries:"
  ls -la "$stage/bin" "$stage/lib" "$stage/lib-fallback" >&2
  exit 0
fi

[ "$mode" = run ] || die "unknown mode '$mode' (bundle or run)"
out=${3:-${OUT:-$dir/out}}
mkdir -p "$out"
work=$(mktemp -d)
tar -C "$work" -xJf "$dir/bundle.tar.xz"
{
  nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv || true
  lscpu | sed -n 's/^Model name: *//p;s/^CPU(s): *//p'
} 2>&1 | tee "$out/machine.txt" >&2

# The CUDA 13 runtime and cuBLAS: the system's, else the CUDA toolkit's, else PyTorch's wheels.
libpath="$work/lib"
for l in libcudart.so.13 libcublas.so.13 libcublasLt.so.13; do
  ldconfig -p | grep "$l " >/dev/null && continue  # no -q: an early exit would SIGPIPE ldconfig (pipefail)
  f=$(find /usr/local/cuda*/lib64 /usr/local/cuda*/lib /usr/local/cuda*/targets/*/lib /opt /usr/lib /usr/local/lib \
    -name "$l" 2>/dev/null | head -n1 || true)
  [ -n "$f" ] || die "no $l on this machine"
  libpath="$libpath:$(dirname "$f")"
done
export LD_LIBRARY_PATH="$libpath${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
if ldd "$work"/bin/* 2>&1 | grep -qE 'GLIBCXX|CXXABI|GCC_|lib(stdc\+\+|gcc_s)\.so.* not found'; then
  log "this machine's libstdc++/libgcc_s are older than the bundle needs: using the bundle's"
  export LD_LIBRARY_PATH="$work/lib-fallback:$LD_LIBRARY_PATH"
fi
ldd "$work"/bin/* >"$out/ldd.txt" 2>&1 || true
if grep -q 'not found' "$out/ldd.txt"; then grep 'not found' "$out/ldd.txt" >&2; die "missing libraries"; fi
# The data-reading tests look for the source tree where the bundle was built.
src=$(cat "$work/source-root")
if [ ! -e "$src/tests/data" ]; then mkdir -p "$(dirname "$src")" && ln -sfn "$root" "$src"; fi
# shellcheck source=scripts/openblas-env.sh
source "$work/openblas-env.sh"
export OMP_PROC_BIND=false OMP_WAIT_POLICY=passive

failed=0
test_timeout=${LATHER_GPU_TEST_TIMEOUT:-240}
: >"$out/tests.txt"
budget_end=$(($(date +%s) + ${LATHER_GPU_TESTS_BUDGET:-300}))
for name in $(grep '_tests$' "$work/order"); do
  t="$work/bin/$name"
  left=$((budget_end - $(date +%s)))
  if [ "$left" -le 5 ]; then
    echo "$name not run: the tests' budget (LATHER_GPU_TESTS_BUDGET) is spent" | tee -a "$out/tests.txt" >&2
    failed=1
    continue
  fi
  t0=$(date +%s%N)
  rc=0
  timeout "$((left < test_timeout ? left : test_timeout))" "$t" >"$out/$name.log" 2>&1 || rc=$?
  ms=$((($(date +%s%N) - t0) / 1000000))
  status=$(grep -E '^\[doctest\] (test cases|assertions):' "$out/$name.log" | tr '\n' ' ' || true)
  printf '%-32s rc=%-3s %4d.%03d s  %s\n' "$name" "$rc" $((ms / 1000)) $((ms % 1000)) "$status" |
    tee -a "$out/tests.txt" >&2
  [ "$rc" = 0 ] || failed=1
done

if [ -x "$work/bin/lather_bench_suite" ]; then
  log "suite: filter ${LATHER_GPU_BENCH_FILTER:-$DEFAULT_FILTER}"
  rc=0
  timeout "${LATHER_GPU_BENCH_TIMEOUT:-420}" "$work/bin/lather_bench_suite" \
    --benchmark_filter="${LATHER_GPU_BENCH_FILTER:-$DEFAULT_FILTER}" \
    --benchmark_out="$out/suite-gpu.json" --benchmark_out_format=json \
    --summary="$out/summary-gpu.md" >"$out/suite.log" 2>&1 || rc=$?
  log "suite rc=$rc"
  [ "$rc" = 0 ] || failed=1
fi
log "done: $(awk '{print $1, $2}' "$out/tests.txt" | tr '\n' ';')"
exit "$failed"
