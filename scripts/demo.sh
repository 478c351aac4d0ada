#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The main job: sets everything up on a fresh Debian bookworm machine, builds the demo trainer
# and runs it. Arguments go to the trainer (--help lists them).
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=$("$root/scripts/configure.sh" -DLATHER_ENABLE_TESTS=OFF -DLATHER_ENABLE_BENCHMARKS=OFF \
  -DLATHER_ENABLE_EXAMPLES=ON)
cmake --build "$build" --target lather-demo -j "${LATHER_JOBS:-2}" >&2
export OMP_PROC_BIND=${OMP_PROC_BIND:-false}
exec "$build/examples/01_linear_regression/lather-demo" "$@"
