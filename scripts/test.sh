#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Every test: sets everything up on a fresh Debian bookworm machine, builds lather's tests,
# examples and benchmarks, and runs the whole CTest suite (unit tests on every execution space,
# MPI tests at 1, 2 and 4 ranks, compile-fail, header and install-consumer checks).
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=$("$root/scripts/configure.sh" -DLATHER_ENABLE_TESTS=ON -DLATHER_ENABLE_EXAMPLES=ON \
  -DLATHER_ENABLE_BENCHMARKS=ON -DLATHER_ENABLE_HDF5=ON)
cmake --build "$build" -j "${LATHER_JOBS:-2}"
cd "$build"
ctest --output-on-failure --no-tests=error -j "${LATHER_JOBS:-2}" "$@"
