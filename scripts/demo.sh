#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The main job: sets everything up on a fresh Debian bookworm machine, builds lather-train and
# runs its comparison mode: AdamW and Shampoo on Fashion-MNIST (MLP 784-512-256-10) from the same
# seed and initialization, a side-by-side table, and results/compare.{csv,md,png}.
# Arguments go to lather-train (`scripts/demo.sh --help`; `--full` for the 10-epoch run of
# docs/results.md). LATHER_DEMO=linear-regression runs the older linear-regression demo instead.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=$("$root/scripts/configure.sh" -DLATHER_ENABLE_TESTS=OFF -DLATHER_ENABLE_BENCHMARKS=OFF \
  -DLATHER_ENABLE_EXAMPLES=ON)
export OMP_PROC_BIND=${OMP_PROC_BIND:-false}
# Kokkos' OpenMP threads and OpenBLAS' threads take turns on the same cores: passive waiting keeps
# idle Kokkos workers from spinning while a BLAS call runs.
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-passive}
# OpenBLAS kernels for this CPU (scripts/openblas-env.sh; OPENBLAS_CORETYPE overrides).
source "$root/scripts/openblas-env.sh"
if [ "${LATHER_DEMO:-train}" = linear-regression ]; then
  cmake --build "$build" --target lather-demo -j "${LATHER_JOBS:-2}" >&2
  exec "$build/examples/01_linear_regression/lather-demo" "$@"
fi
cmake --build "$build" --target lather-train -j "${LATHER_JOBS:-2}" >&2
cd "$root"
exec "$build/examples/02_fashion_mnist/lather-train" --compare "$@"
