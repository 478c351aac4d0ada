#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Builds the libFuzzer targets (tests/fuzz, clang++-16, -fsanitize=fuzzer,address,undefined) in
# ${LATHER_FUZZ_BUILD_DIR:-build-fuzz}, replays each committed corpus (tests/fuzz/corpus/<target>)
# as a regression run, then fuzzes each target for a bounded time. Fails on any crash, sanitizer
# report, timeout, out-of-memory or unexpected exception; the input is left in
# <build>/fuzz-artifacts/ (add it to the corpus and as a unit test once fixed: docs/reliability.md).
#
# Environment:
#   LATHER_FUZZ_SECONDS   fuzzing time per target (default 60; 0 = corpus replay only)
#   LATHER_FUZZ_TARGETS   targets to run (default: fuzz_checkpoint fuzz_npy fuzz_case_json)
#   LATHER_FUZZ_BUILD_DIR build directory (default: build-fuzz)
#   LATHER_JOBS           build parallelism (default 2)
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
kokkos_prefix=$("$root/scripts/setup-deps.sh" | tail -n1)
build=${LATHER_FUZZ_BUILD_DIR:-$root/build-fuzz}
seconds=${LATHER_FUZZ_SECONDS:-60}
read -r -a targets <<<"${LATHER_FUZZ_TARGETS:-fuzz_checkpoint fuzz_npy fuzz_case_json}"
cxx=${LATHER_FUZZ_CXX:-clang++-16}

gen=()
if command -v ninja >/dev/null && [ ! -f "$build/Makefile" ]; then gen=(-G Ninja); fi
launcher=()
if [ "${LATHER_CCACHE:-1}" != 0 ] && command -v ccache >/dev/null; then
  launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER="env;CCACHE_BASEDIR=$root;CCACHE_NOHASHDIR=true;ccache")
fi
cmake -S "$root" -B "$build" "${gen[@]}" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_COMPILER="$cxx" \
  -DKokkos_ROOT="$kokkos_prefix" -DCMAKE_PREFIX_PATH="$kokkos_prefix" "${launcher[@]}" \
  -DLATHER_ENABLE_FUZZ=ON -DLATHER_ENABLE_TESTS=OFF -DLATHER_ENABLE_EXAMPLES=OFF \
  -DLATHER_ENABLE_BENCHMARKS=OFF -DLATHER_ENABLE_TOOLS=OFF -DLATHER_ENABLE_MPI=OFF >/dev/null
cmake --build "$build" -j "${LATHER_JOBS:-2}" --target "${targets[@]}"

export OMP_NUM_THREADS=1 OMP_PROC_BIND=false OMP_WAIT_POLICY=passive OPENBLAS_NUM_THREADS=1
# 1. Regression: every committed input, once.
(cd "$build" && ctest --output-on-failure --no-tests=error -R "^($(IFS='|'; echo "${targets[*]}"))_corpus$")

# 2. Fuzzing from the committed seeds; new inputs go to <build>/fuzz-corpus/<target>.
[ "$seconds" -gt 0 ] || exit 0
mkdir -p "$build/fuzz-artifacts"
status=0
for t in "${targets[@]}"; do
  work="$build/fuzz-corpus/$t"
  mkdir -p "$work"
  echo "== $t: fuzzing for ${seconds} s"
  start=$(date +%s)
  if ! "$build/tests/fuzz/$t" -max_total_time="$seconds" -rss_limit_mb=2048 -malloc_limit_mb=1024 -timeout=10 \
      -print_final_stats=1 -artifact_prefix="$build/fuzz-artifacts/$t-" "$work" "$root/tests/fuzz/corpus/$t" \
      >"$build/fuzz-$t.log" 2>&1; then
    status=1
    tail -n 60 "$build/fuzz-$t.log"
    echo "== $t: FAILED (input saved under $build/fuzz-artifacts/)"
  fi
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$build/fuzz-$t.log" | tail -n1)
  echo "== $t: ${execs:-?} executions in $(( $(date +%s) - start )) s, corpus $(find "$work" -type f | wc -l) inputs"
done
exit $status
