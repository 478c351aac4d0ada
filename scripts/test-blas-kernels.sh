#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Runs the host tests again under each OpenBLAS kernel family this CPU can execute, after the
# README's test command (scripts/test.sh) has built them: OPENBLAS_CORETYPE=Prescott (SSE3: the
# generic kernels OpenBLAS falls back to), Sandybridge (AVX, no FMA), Haswell (AVX2 + FMA; what
# OpenBLAS runs on AMD Zen) and SkylakeX (AVX-512).
#
# Why: OpenBLAS picks its kernels at run time by CPU model (on a CPU it does not know by model,
# such as many cloud VMs, its generic ones), and the families round differently: FMA or not, and
# in which order each kernel sums. A tolerance read off one machine, or a bit-for-bit comparison
# that holds only in one kernel's summation order, then fails on another machine (2026-12-02: the
# batched-passes Shampoo test on an Intel Xeon, which OpenBLAS ran on SkylakeX kernels where the
# AMD machines had run Haswell ones). Checking every family on one machine catches that here.
#
# Which tests: every CTest test but the MPI ones (their ranks run the kernels the single-process
# tests cover, and some read files that another rank count's run wrote, so they cannot be
# picked apart), the install, compile-failure and header checks, the documentation-snippet
# match, the documentation's link check and the benchmark smoke test, which do not depend on
# the BLAS. Extra arguments go to
# ctest.
# Environment: LATHER_BUILD_DIR (default build, as scripts/test.sh), LATHER_JOBS (default 2),
# LATHER_BLAS_KERNELS (the families to run; default: those the CPU's flags allow).
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${LATHER_BUILD_DIR:-$root/build}
jobs=${LATHER_JOBS:-2}
if [ ! -f "$build/CTestTestfile.cmake" ]; then
  echo "test-blas-kernels.sh: no tests in $build; run scripts/test.sh (the README's test command) first" >&2
  exit 2
fi
if [ -z "${LATHER_BLAS_KERNELS:-}" ]; then
  flags=$(grep -m1 '^flags' /proc/cpuinfo 2>/dev/null || true)
  has() { for f in "$@"; do [[ " $flags " == *" $f "* ]] || return 1; done; }
  LATHER_BLAS_KERNELS=""
  has pni && LATHER_BLAS_KERNELS+=" Prescott"  # pni: SSE3's name in /proc/cpuinfo
  has avx && LATHER_BLAS_KERNELS+=" Sandybridge"
  has avx2 fma && LATHER_BLAS_KERNELS+=" Haswell"
  has avx512f avx512bw avx512dq avx512vl && LATHER_BLAS_KERNELS+=" SkylakeX"
fi
if [ -z "${LATHER_BLAS_KERNELS// /}" ]; then
  echo "test-blas-kernels.sh: this CPU runs none of OpenBLAS' Prescott, Sandybridge, Haswell or SkylakeX kernels; nothing to do"
  exit 0
fi
cd "$build"
status=0
for kernels in $LATHER_BLAS_KERNELS; do
  step=$(date +%s)
  echo "== host tests with OPENBLAS_CORETYPE=$kernels"
  OPENBLAS_CORETYPE=$kernels ctest --output-on-failure --no-tests=error -j "$jobs" \
    -E '(_np[0-9]|^install_|^compile_fail_|^header_|^doc_snippets_match_examples$|^bench_suite_smoke$|^docs_links)' "$@" ||
    { status=1; echo "test-blas-kernels.sh: tests failed with OPENBLAS_CORETYPE=$kernels" >&2; }
  echo "== OPENBLAS_CORETYPE=$kernels: $(( $(date +%s) - step )) s"
done
exit "$status"
