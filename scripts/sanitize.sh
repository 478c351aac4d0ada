#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The test suite under AddressSanitizer + UndefinedBehaviorSanitizer (with LeakSanitizer): sets up
# the dependencies (scripts/configure.sh -> scripts/setup-deps.sh), builds lather's tests, tools and
# examples with g++ -fsanitize=address,undefined in ${LATHER_ASAN_BUILD_DIR:-build-asan}, and runs
# the CTest suite, MPI tests at 1, 2 and 4 ranks included. Any sanitizer report fails the run.
# Extra arguments go to ctest (e.g. scripts/sanitize.sh -R mpi). See docs/testing.md, "Sanitizers".
#
# What is instrumented: lather's headers and the tests (with LATHER_SANITIZE_FULL=1 also
# lather-replay and the examples; see "Scope" below) (every template
# of lather, Kokkos, Kokkos Kernels, Eigen, xtensor, ... is compiled into instrumented translation
# units). Not instrumented: the prebuilt libraries they link (Kokkos' and Kokkos Kernels' .a files
# from ~/.cache/lather, OpenBLAS/LAPACK, OpenMPI, libgomp); ASan still checks their heap use
# through its malloc/free interceptors.
#
# Tests left out (-E), none of which runs lather code in an instrumented binary:
#   compile_fail_*  invoke the compiler on programs that must not compile;
#   install_*       install the headers and build a separate consumer project (with the plain
#                   Release flags, not ours) -- its one SGD step is run instrumented by
#                   lather_unit_tests and doc_first_view.
# The header self-containment objects (lather_header_checks) are not built (-DLATHER_HEADER_CHECKS=OFF):
# they are compiled, never run.
#
# Reports go to ${build}/sanitizer-logs/ (log_path) as well as failing the test's exit status, so a
# test that passes on a regular expression of its output still fails the job when a report appears.
#
# Environment: LATHER_ASAN_BUILD_DIR, LATHER_JOBS (default 2); ASAN_OPTIONS, UBSAN_OPTIONS and
# LSAN_OPTIONS are appended to the defaults below (later settings win). LATHER_SANITIZE_TARGETS
# (test executables, space-separated): build only these and run only their CTest tests (the
# target's own test, its _npN runs under mpiexec, lather_shampoo_tests_huge_pages); .ci/run
# passes a subset (docs/testing.md, "What CI runs").
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${LATHER_ASAN_BUILD_DIR:-$root/build-asan}
jobs=${LATHER_JOBS:-2}
supp=$root/tests/sanitizers

# -O1 -g1: line tables for symbolized stacks, at a fraction of -O0's run time and -g's build cost;
# NDEBUG as in the Release suite. The flags apply to the whole build tree (not a consumer's).
san="-fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=all"
# Scope. By default (what .ci/run runs) the test programs of tests/: every unit test (all
# optimizers, strategies, Shampoo family, state, checkpoints, reliability, errors) on Serial and
# OpenMP, and the MPI tests at 1, 2 and 4 ranks. LATHER_SANITIZE_FULL=1 adds lather-replay (the
# conformance and replay-error runs) and the examples (the trainer's tests, the doc programs,
# the demo): the same library code through three more, heavy, instrumented builds -- about 40
# minutes more of compiling on two cores with an empty ccache, too much for every CI run.
full=OFF
if [ "${LATHER_SANITIZE_FULL:-0}" = 1 ]; then full=ON; fi
LATHER_BUILD_DIR=$build "$root/scripts/configure.sh" \
  -DCMAKE_CXX_COMPILER=g++ -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -g1 -DNDEBUG" -DCMAKE_CXX_FLAGS="$san" \
  -DCMAKE_EXE_LINKER_FLAGS="-fsanitize=address,undefined" \
  -DCMAKE_SHARED_LINKER_FLAGS="-fsanitize=address,undefined" \
  -DLATHER_ENABLE_TESTS=ON -DLATHER_ENABLE_EXAMPLES="$full" -DLATHER_ENABLE_TOOLS="$full" \
  -DLATHER_ENABLE_BENCHMARKS=OFF -DLATHER_HEADER_CHECKS=OFF >/dev/null
read -r -a targets <<<"${LATHER_SANITIZE_TARGETS:-}"
select=()
if [ "${#targets[@]}" -gt 0 ]; then
  cmake --build "$build" -j "$jobs" --target "${targets[@]}"
  select=(-R "^($(IFS='|'; echo "${targets[*]}"))(_np[0-9]+|_huge_pages)?\$")
else
  cmake --build "$build" -j "$jobs"
fi

logs=$build/sanitizer-logs
rm -rf "$logs" && mkdir -p "$logs"
# Every test inherits these, the ranks under mpiexec too: OpenMPI's mpiexec passes its whole
# environment to the ranks it starts on the local node (checked: verbosity=1 prints ASan's start-up
# lines once per rank).
common="halt_on_error=1:print_summary=1:log_path=$logs/report"
# fast_unwind_on_malloc=0: OpenMPI, libc and OpenBLAS have no frame pointers, so the fast unwinder
# stops at their first frame and a leak's stack would never reach the library that a suppression
# (tests/sanitizers/lsan.supp) names. OpenMPI keeps its plugins loaded for the same reason.
export OMPI_MCA_mca_base_component_disable_dlclose=1
# detect_stack_use_after_return stays off: its fake stack frames made Kokkos-heavy code 50-100x
# slower (doc_shampoo_family: 0.9 s -> 53 s), past the tests' time limits.
export ASAN_OPTIONS="$common:detect_leaks=1:fast_unwind_on_malloc=0:check_initialization_order=1:strict_init_order=1:strict_string_checks=1:suppressions=$supp/asan.supp${ASAN_OPTIONS:+:$ASAN_OPTIONS}"
export LSAN_OPTIONS="suppressions=$supp/lsan.supp:print_suppressions=0${LSAN_OPTIONS:+:$LSAN_OPTIONS}"
export UBSAN_OPTIONS="$common:print_stacktrace=1:suppressions=$supp/ubsan.supp${UBSAN_OPTIONS:+:$UBSAN_OPTIONS}"

cd "$build"
status=0
ctest --output-on-failure --no-tests=error -j "$jobs" -E '^(compile_fail_|install_)' "${select[@]}" "$@" || status=$?
if compgen -G "$logs/report*" >/dev/null; then
  echo "sanitizer reports ($logs):" >&2
  for f in "$logs"/report*; do echo "==== $f" >&2; cat "$f" >&2; done
  status=1
fi
exit "$status"
