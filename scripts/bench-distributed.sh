#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# DDP Shampoo's step time and per-rank state memory on 1, 2 and 4 MPI ranks (4 oversubscribed on
# a 2-core machine), one OpenMP and one OpenBLAS thread per rank, and 1 rank with 2 threads for
# comparison. Results: docs/distributed-shampoo.md. Arguments go to Google Benchmark.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=$("$root/scripts/configure.sh" -DLATHER_ENABLE_BENCHMARKS=ON)
cmake --build "$build" --target lather_bench_dist_shampoo -j "${LATHER_JOBS:-2}" >&2
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_btl=self,vader,tcp
export OMP_PROC_BIND=false OPENBLAS_NUM_THREADS=1 OMP_WAIT_POLICY=passive
# OpenBLAS kernels for this CPU (scripts/openblas-env.sh; OPENBLAS_CORETYPE overrides).
source "$root/scripts/openblas-env.sh"
bench=$build/benchmarks/lather_bench_dist_shampoo
for np in 1 2 4; do
  echo "== $np rank(s), 1 thread each$([ "$np" -gt "$(nproc)" ] && echo ', oversubscribed')"
  OMP_NUM_THREADS=1 mpiexec -n "$np" --oversubscribe "$bench" "$@"
done
echo "== 1 rank, 2 threads"
# --bind-to none: with 1 or 2 ranks OpenMPI binds each to one core, where its 2 threads would
# take turns (the table's 2-thread column before 2026-12-07 was measured so).
OMP_NUM_THREADS=2 OPENBLAS_NUM_THREADS=2 mpiexec --bind-to none -n 1 "$bench" "$@"
