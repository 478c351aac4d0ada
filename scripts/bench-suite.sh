#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The performance suite of docs/performance.md: benchmarks/bench_suite.cpp on 1 and on 2 threads
# (Kokkos OpenMP and OpenBLAS alike), then a gnuplot SVG of the step times. Writes to
# ${LATHER_BENCH_OUT:-<build>/benchmarks/suite}: threads-N.json (Google Benchmark), summary-N.md
# (the tables of docs/performance.md, with the ratios), steps-N.dat and performance-steps.svg.
# Arguments go to Google Benchmark (e.g. --benchmark_filter=mlp). About 15 minutes on 2 cores.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=$("$root/scripts/configure.sh" -DLATHER_ENABLE_BENCHMARKS=ON)
cmake --build "$build" --target lather_bench_suite -j "${LATHER_JOBS:-2}" >&2
out=${LATHER_BENCH_OUT:-$build/benchmarks/suite}
mkdir -p "$out"
# Kokkos' OpenMP workers and OpenBLAS' threads take turns on the same cores: passive waiting keeps
# idle Kokkos workers from spinning while a BLAS call runs.
export OMP_PROC_BIND=false OMP_WAIT_POLICY=passive
# OpenBLAS kernels for this CPU (scripts/openblas-env.sh; OPENBLAS_CORETYPE overrides).
source "$root/scripts/openblas-env.sh"
echo "OPENBLAS_CORETYPE=${OPENBLAS_CORETYPE:-unset, OpenBLAS detects the CPU}" >&2
for t in 1 2; do
  echo "== $t thread(s)" >&2
  OMP_NUM_THREADS=$t OPENBLAS_NUM_THREADS=$t "$build/benchmarks/lather_bench_suite" \
    --benchmark_out="$out/threads-$t.json" --benchmark_out_format=json \
    --summary="$out/summary-$t.md" --plot-data="$out/steps-$t.dat" "$@"
done
if command -v gnuplot >/dev/null; then
  gnuplot <<GP
set terminal svg size 1000,420 font "sans,11"
set output "$out/performance-steps.svg"
set multiplot layout 1,2 title "lather optimizer step time, float32 (scripts/bench-suite.sh)"
set style data histograms
set style histogram clustered gap 1
set style fill solid 0.85 border -1
set logscale y
set ylabel "ms per step"
set yrange [0.5:100000]  # room above the bars for the key
set grid ytics
set key top left font ",9"
set xtics nomirror
do for [t in "1 2"] {
  set title t." thread(s)"
  plot "$out/steps-".t.".dat" using 2:xtic(1) title "AdamW", \
       "" using 3 title "Shampoo 256, steady", "" using 4 title "Shampoo 256, F=100 amortized", \
       "" using 5 title "Shampoo 1024, steady", "" using 6 title "Shampoo 1024, F=100 amortized"
}
unset multiplot
GP
  echo "plot: $out/performance-steps.svg" >&2
fi
echo "summaries: $out/summary-1.md $out/summary-2.md" >&2
