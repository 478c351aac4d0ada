#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Builds and runs the benchmark suite; results are printed and written as JSON to
# ${LATHER_BUILD_DIR:-build}/benchmarks/results.json. Arguments go to Google Benchmark.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=$("$root/scripts/configure.sh" -DLATHER_ENABLE_BENCHMARKS=ON)
cmake --build "$build" --target lather_bench_diagonal -j "${LATHER_JOBS:-2}" >&2
export OMP_PROC_BIND=${OMP_PROC_BIND:-spread} OMP_PLACES=${OMP_PLACES:-threads}
"$build/benchmarks/lather_bench_diagonal" --benchmark_out="$build/benchmarks/results.json" \
  --benchmark_out_format=json "$@"
