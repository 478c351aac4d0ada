#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# GPU compile check (no GPU needed): proves that every lather test, example and benchmark
# translation unit compiles AND links for NVIDIA (CUDA, nvcc, Hopper sm_90, C++20) and for AMD
# (HIP, Debian's hipcc, gfx90a; Kokkos built as C++17, lather's code as C++20), against Kokkos +
# Kokkos Kernels 3.4.1 built from the same Debian trilinos sources as the host build, patched with
# scripts/patches/kokkos-3.4.1-gpu.patch. Nothing is run. Device code calling a host-only function
# is an error (nvcc: -Xcudafe --diag_error=20011/20014; hipcc/clang: by default), and a negative
# test (tests/gpu_compile/) proves the check fails when that happens. See docs/gpu-compile-check.md.
#
# Usage: scripts/gpu-compile-check.sh [cuda] [hip]      (no argument: both)
#
# Environment:
#   LATHER_DEPS_CACHE       cache root, as scripts/setup-deps.sh (default ~/.cache/lather); the GPU
#                           Kokkos installs go to $LATHER_DEPS_CACHE/kokkos-3.4.1-{cuda-sm90,hip-gfx90a}-*
#   LATHER_JOBS             parallel jobs (default 2)
#   LATHER_SKIP_APT=1       do not call apt-get (also passed on to setup-deps.sh)
#   LATHER_GPU_BUILD_ROOT   where build-gpu-cuda/, build-gpu-hip/ and build-gpu-logs/ go (default: repo root)
#   LATHER_GPU_BUILD_DIR_CUDA, LATHER_GPU_BUILD_DIR_HIP, LATHER_GPU_LOG_DIR   override each of them
#   LATHER_GPU_ALLOW_FAIL_CUDA, LATHER_GPU_ALLOW_FAIL_HIP
#                           target names (space-separated) whose failure is reported but does not
#                           fail the check (for known tool-chain bugs; default: none)
#   LATHER_GPU_CMAKE_ARGS   extra arguments for lather's configure (both back ends), e.g. -DLATHER_ENABLE_MPI=OFF
#   LATHER_GPU_HIP_CLANG    16 (default): Debian's hipcc driving Debian's clang-16; 15: hipcc's own
#                           clang-15, which crashes on libstdc++ 12's std::map and <regex> in C++20
#                           device code (LLVM #62017; doctest, Google Benchmark, xtensor hit it)
#   LATHER_GPU_OPT          host optimization flag of lather's translation units (default -O0:
#                           the check compiles and links, nothing runs; the front end's device
#                           diagnostics and the device link do not depend on it, and -O0 halves the
#                           CUDA build and cuts the HIP build 3x, docs/gpu-compile-check.md). -O3
#                           gives the Release flags users build with. Kokkos itself stays Release.
#   LATHER_GPU_TARGETS      build only these executable targets (space-separated; default: every
#                           one in `all`), as scripts/gpu-run.sh does for the bundle it runs on a GPU
#   CUDA_HOME               CUDA toolkit (default /usr/local/cuda)
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
log() { echo "[gpu-check] $*" >&2; }
die() { log "ERROR: $*"; exit 1; }

readonly KOKKOS_VERSION=3.4.1
readonly TRILINOS_VERSION=13.2.0
CACHE_ROOT=${LATHER_DEPS_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/lather}
SRC_CACHE="$CACHE_ROOT/src/trilinos-${TRILINOS_VERSION}"
JOBS=${LATHER_JOBS:-2}
CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
BUILD_ROOT=${LATHER_GPU_BUILD_ROOT:-$root}
LOG_DIR=${LATHER_GPU_LOG_DIR:-$BUILD_ROOT/build-gpu-logs}
PATCH="$root/scripts/patches/kokkos-3.4.1-gpu.patch"
# Device code calling a host-only function: an error, not nvcc's default warning. Two separate
# -Xcudafe arguments (nvcc_wrapper forwards each with its value). In CMAKE_CXX_FLAGS, which CMake
# never de-duplicates (target options would lose the second -Xcudafe).
CUDA_DIAG_FLAGS="-Xcudafe --diag_error=20011 -Xcudafe --diag_error=20014"
read -r -a EXTRA_CMAKE_ARGS <<<"${LATHER_GPU_CMAKE_ARGS:-}"
GPU_OPT=${LATHER_GPU_OPT:--O0}
[[ "$GPU_OPT" =~ ^-O[0-3s]$ ]] || die "LATHER_GPU_OPT must be one of -O0 -O1 -O2 -O3 -Os (got '$GPU_OPT')"
HIP_CLANG=${LATHER_GPU_HIP_CLANG:-16}
case "$HIP_CLANG" in 15 | 16) ;; *) die "LATHER_GPU_HIP_CLANG must be 15 or 16" ;; esac

backends=()
for a in "$@"; do
  case "$a" in
    cuda | hip) backends+=("$a") ;;
    all) backends+=(cuda hip) ;;
    -h | --help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) die "unknown argument '$a' (expected: cuda, hip, all)" ;;
  esac
done
[ "${#backends[@]}" -gt 0 ] || backends=(cuda hip)

command -v ninja >/dev/null || die "ninja is required (scripts/setup-deps.sh installs ninja-build)"
mkdir -p "$LOG_DIR"
t_start=$(date +%s)
WORKDIRS=()
cleanup() { local d; for d in "${WORKDIRS[@]}"; do rm -rf "$d"; done; }
trap cleanup EXIT

# run_logged NAME CMD...: output to $LOG_DIR/NAME.log; on failure show its tail.
run_logged() {
  local name=$1
  shift
  local logfile="$LOG_DIR/$name.log"
  local rc=0
  "$@" >"$logfile" 2>&1 || rc=$?
  [ "$rc" != 0 ] || return 0
  log "FAILED ($rc): $name; last lines of $logfile:"
  tail -n 40 "$logfile" | sed 's/^/    /' >&2
  return "$rc"
}

# summarize_errors LOG ROOT: for each "FAILED:" step of a ninja log, its first 8 error lines, the
# error lines in files under ROOT, and the first 6 instantiation steps through ROOT (lines cut at 300).
summarize_errors() {
  awk -v root="$2" '
    function out(line) { if (!(line in seen)) { seen[line] = 1; print "  " substr(line, 1, 300) } }
    /^FAILED: / { print; n = 0; m = 0; k = 0; delete seen; next }
    / -c \// || /^\[[0-9]+\/[0-9]+\]/ { next }
    /[Ee]rror[: ]|Segmentation fault/ {
      if (n < 8) { out($0); n++ } else if (index($0, root "/") && m < 20) { out($0); m++ }
      next }
    index($0, root "/") && /instantiation|required from/ && k < 6 { out($0); k++ }
  ' "$1"
}

# ---- 1. host dependencies, Kokkos sources (setup-deps.sh), HIP tool chain ------------------------
t0=$(date +%s)
log "setup-deps.sh: Debian packages, Kokkos sources, host Kokkos (log: $LOG_DIR/setup-deps.log)"
run_logged setup-deps env -u Kokkos_ROOT "$root/scripts/setup-deps.sh" || die "scripts/setup-deps.sh failed"
[ -f "$SRC_CACHE/.complete" ] || die "no Kokkos sources at $SRC_CACHE after setup-deps.sh"

SUDO=""
if [ "$(id -u)" != 0 ]; then SUDO="sudo"; fi
if [[ " ${backends[*]} " == *" hip "* ]] && [ "${LATHER_SKIP_APT:-0}" != 1 ]; then
  need=()
  hip_pkgs=(hipcc libamdhip64-dev rocm-device-libs)
  [ "$HIP_CLANG" = 16 ] && hip_pkgs+=(clang-16 lld-16 clang-tools-16 libclang-rt-16-dev)
  for p in "${hip_pkgs[@]}"; do
    dpkg-query -W -f='${Status}\n' "$p" 2>/dev/null | grep -q '^install ok installed$' || need+=("$p")
  done
  if [ "${#need[@]}" -gt 0 ]; then
    log "installing ${need[*]} (log: $LOG_DIR/apt-hip.log)"
    run_logged apt-hip env DEBIAN_FRONTEND=noninteractive bash -c \
      "$SUDO apt-get update -qq && $SUDO apt-get install -y -qq --no-install-recommends ${need[*]}" ||
      die "could not install the HIP tool chain"
  fi
fi
t_setup=$(($(date +%s) - t0))

patch_hash=$(sha256sum "$PATCH" | cut -c1-12)

# ---- 2. Kokkos + Kokkos Kernels per back end ---------------------------------------------------
# Common Kokkos Kernels options: no pre-instantiation (like setup-deps.sh), no tests.
KERNELS_COMMON=(
  -DKokkosKernels_INST_DOUBLE=OFF -DKokkosKernels_INST_FLOAT=OFF
  -DKokkosKernels_INST_COMPLEX_DOUBLE=OFF -DKokkosKernels_INST_COMPLEX_FLOAT=OFF
  -DKokkosKernels_INST_ORDINAL_INT=OFF -DKokkosKernels_INST_ORDINAL_INT64_T=OFF
  -DKokkosKernels_INST_OFFSET_INT=OFF -DKokkosKernels_INST_OFFSET_SIZE_T=OFF
  -DKokkosKernels_INST_LAYOUTLEFT=OFF -DKokkosKernels_INST_LAYOUTRIGHT=OFF
  -DKokkosKernels_INST_EXECSPACE_SERIAL=OFF
  -DKokkosKernels_ENABLE_TESTS=OFF -DKokkosKernels_ENABLE_EXAMPLES=OFF
  -DKokkosKernels_ENABLE_PERFTESTS=OFF
)

# build_kokkos BACKEND PREFIX CXX -- KOKKOS_ARGS... -- KERNELS_ARGS...
# CXX "@nvcc_wrapper" means the patched source's bin/nvcc_wrapper (Kokkos) and the installed one
# (Kokkos Kernels).
build_kokkos() {
  local be=$1 prefix=$2 cxx=$3
  shift 4
  local kargs=() kkargs=()
  while [ "$1" != -- ]; do kargs+=("$1"); shift; done
  shift
  kkargs=("$@")
  local work
  work=$(mktemp -d "${TMPDIR:-/tmp}/lather-gpu-kokkos-$be.XXXXXX")
  WORKDIRS+=("$work")
  # The cached sources stay pristine (the host build uses them): patch a copy.
  cp -a "$SRC_CACHE/packages/kokkos" "$work/kokkos"
  (cd "$work/kokkos" && patch -p1 -s --no-backup-if-mismatch <"$PATCH") >"$LOG_DIR/kokkos-$be-patch.log" 2>&1 ||
    { tail -n 20 "$LOG_DIR/kokkos-$be-patch.log" >&2; return 1; }
  local kcxx=$cxx kkcxx=$cxx
  if [ "$cxx" = "@nvcc_wrapper" ]; then kcxx="$work/kokkos/bin/nvcc_wrapper"; kkcxx="$prefix/bin/nvcc_wrapper"; fi
  rm -rf "$prefix"
  run_logged "kokkos-$be-configure" cmake -S "$work/kokkos" -B "$work/kokkos-build" -G Ninja \
    -DCMAKE_CXX_COMPILER="$kcxx" -DCMAKE_BUILD_TYPE=Release -DCMAKE_INSTALL_PREFIX="$prefix" \
    -DCMAKE_CXX_EXTENSIONS=OFF -DKokkos_ENABLE_SERIAL=ON \
    -DKokkos_ENABLE_TESTS=OFF -DKokkos_ENABLE_EXAMPLES=OFF "${kargs[@]}" || return 1
  run_logged "kokkos-$be-build" cmake --build "$work/kokkos-build" -j "$JOBS" || return 1
  run_logged "kokkos-$be-install" cmake --install "$work/kokkos-build" || return 1
  run_logged "kernels-$be-configure" cmake -S "$SRC_CACHE/packages/kokkos-kernels" -B "$work/kernels-build" \
    -G Ninja -DCMAKE_CXX_COMPILER="$kkcxx" -DCMAKE_BUILD_TYPE=Release -DCMAKE_INSTALL_PREFIX="$prefix" \
    -DKokkos_ROOT="$prefix" -DCMAKE_CXX_EXTENSIONS=OFF "${KERNELS_COMMON[@]}" "${kkargs[@]}" || return 1
  run_logged "kernels-$be-build" cmake --build "$work/kernels-build" -j "$JOBS" || return 1
  run_logged "kernels-$be-install" cmake --install "$work/kernels-build" || return 1
  touch "$prefix/.complete"
  rm -rf "$work"
}

# ---- 3.-5. lather for one back end ---------------------------------------------------------------
declare -A R_KOKKOS R_KTIME R_TARGETS R_NEG R_TIME R_STATUS R_NOTE

# check_backend BACKEND PREFIX CXX NEG_REGEX CMAKE_ARGS...
check_backend() {
  local be=$1 prefix=$2 cxx=$3 neg_regex=$4
  shift 4
  local cmake_args=("$@")
  local up=${be^^}
  local bdir_var="LATHER_GPU_BUILD_DIR_$up"
  local bdir=${!bdir_var:-$BUILD_ROOT/build-gpu-$be}
  local t0
  t0=$(date +%s)

  # A build dir configured for another Kokkos/compiler (patch changed, ...) is started afresh.
  local key="$prefix|$cxx"
  if [ -f "$bdir/CMakeCache.txt" ] && [ "$(cat "$bdir/.lather-gpu-check-key" 2>/dev/null)" != "$key" ]; then
    log "$be: $bdir was configured for another Kokkos or compiler: starting afresh"
    rm -rf "$bdir"
  fi
  mkdir -p "$bdir"
  # ccache, as scripts/configure.sh (LATHER_CCACHE=0 turns it off): it recognizes nvcc_wrapper as
  # nvcc (measured: a repeated nvcc compile 16 s -> 0.05 s); for what it cannot cache it simply
  # runs the compiler. The negative test below never goes through it.
  local launcher=()
  if [ "${LATHER_CCACHE:-1}" != 0 ] && command -v ccache >/dev/null; then
    launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER="env;CCACHE_BASEDIR=$root;CCACHE_NOHASHDIR=true;ccache")
  fi
  log "$be: configuring lather in $bdir (log: $LOG_DIR/lather-$be-configure.log)"
  run_logged "lather-$be-configure" cmake -S "$root" -B "$bdir" -G Ninja -DCMAKE_BUILD_TYPE=Release \
    -DCMAKE_CXX_COMPILER="$cxx" -DKokkos_ROOT="$prefix" -DCMAKE_PREFIX_PATH="$prefix" "${launcher[@]}" \
    -DCMAKE_CXX_FLAGS_RELEASE="$GPU_OPT -DNDEBUG" \
    -DCMAKE_CXX_EXTENSIONS=OFF -DCMAKE_EXPORT_COMPILE_COMMANDS=ON \
    -DLATHER_ENABLE_TESTS=ON -DLATHER_ENABLE_EXAMPLES=ON -DLATHER_ENABLE_BENCHMARKS=ON \
    -DLATHER_ENABLE_TOOLS=OFF -DLATHER_TEST_DEVICE_SPACES_ONLY=ON \
    "${cmake_args[@]}" "${EXTRA_CMAKE_ARGS[@]}" || { R_NOTE[$be]="lather configure failed"; return 1; }
  echo "$key" >"$bdir/.lather-gpu-check-key"

  # Every executable in `all` (tests, examples, benchmarks; compile-fail programs are
  # EXCLUDE_FROM_ALL, the header-check object library is not an executable and is skipped).
  local in_all exes=() paths=()
  in_all=$(ninja -C "$bdir" -t inputs all | sed -n 's/^cmake_object_order_depends_target_//p')
  local line path name
  while read -r line; do
    path=${line%%: *}
    name=$(sed -E 's/^.*: CXX_EXECUTABLE_LINKER__(.*)_Release$/\1/' <<<"$line")
    if grep -qxF "$name" <<<"$in_all"; then exes+=("$name"); paths+=("$path"); fi
  done < <(ninja -C "$bdir" -t targets all | grep -E ': CXX_EXECUTABLE_LINKER__.*_Release$')
  # LATHER_GPU_TARGETS: only these (a GPU run's bundle, scripts/gpu-run.sh), each must exist.
  if [ -n "${LATHER_GPU_TARGETS:-}" ]; then
    local want w i keep_e=() keep_p=()
    read -r -a want <<<"$LATHER_GPU_TARGETS"
    for w in "${want[@]}"; do
      for i in "${!exes[@]}"; do
        if [ "${exes[$i]}" = "$w" ]; then keep_e+=("$w"); keep_p+=("${paths[$i]}"); fi
      done
    done
    [ "${#keep_e[@]}" = "${#want[@]}" ] || { R_NOTE[$be]="LATHER_GPU_TARGETS names a target not in all"; return 1; }
    exes=("${keep_e[@]}")
    paths=("${keep_p[@]}")
  fi
  [ "${#exes[@]}" -gt 0 ] || { R_NOTE[$be]="no executable targets found"; return 1; }
  log "$be: building ${#exes[@]} targets: ${exes[*]} (log: $LOG_DIR/lather-$be-build.log)"

  local build_ok=1 blog="$LOG_DIR/lather-$be-build.log"
  if ! cmake --build "$bdir" -j "$JOBS" --target "${exes[@]}" -- -k 0 >"$blog" 2>&1; then
    build_ok=0
    log "$be: BUILD FAILED; per failed translation unit, the first error lines and every error or"
    log "$be: instantiation step in lather's own files (full output: $blog):"
    summarize_errors "$blog" "$root" | sed 's/^/    /' >&2
  fi
  # A target is built when its file exists and ninja has nothing left to compile or link for it.
  local built=0 i failed_t=() allowed_t=()
  local allow_var="LATHER_GPU_ALLOW_FAIL_$up"
  local allow=" ${!allow_var:-} "
  for i in "${!paths[@]}"; do
    if [ -f "$bdir/${paths[$i]}" ] &&
      ! ninja -C "$bdir" -n "${paths[$i]}" 2>/dev/null | grep -qE '^\[[0-9]+/[0-9]+\] (Building|Linking)'; then
      built=$((built + 1))
    elif [[ "$allow" == *" ${exes[$i]} "* ]]; then
      allowed_t+=("${exes[$i]}")
    else
      failed_t+=("${exes[$i]}")
    fi
  done
  R_TARGETS[$be]="$built/${#exes[@]}"
  # The build's exit status is not used: an allowed failure (LATHER_GPU_ALLOW_FAIL_*) is reported
  # but does not fail the check; any other target that did not build does.
  build_ok=1
  [ "${#failed_t[@]}" = 0 ] || { build_ok=0; log "$be: targets NOT built: ${failed_t[*]}"; }
  [ "${#allowed_t[@]}" = 0 ] || log "$be: targets not built but allowed by $allow_var: ${allowed_t[*]}"

  # lather's translation units are C++20 whatever Kokkos was built with; for CUDA every one
  # carries the host-call diagnostics as errors.
  local cmds n_cmds n_20 n_diag
  cmds=$(grep '"command":' "$bdir/compile_commands.json" || true)
  n_cmds=$(grep -c . <<<"$cmds" || true)
  n_20=$(grep -c -- '-std=c++20' <<<"$cmds" || true)
  if [ "$n_cmds" = 0 ] || [ "$n_20" != "$n_cmds" ]; then
    log "$be: only $n_20 of $n_cmds compile commands use -std=c++20"
    build_ok=0
  fi
  local note="-std=c++20: $n_20/$n_cmds compile commands"
  if [ "$be" = cuda ]; then
    n_diag=$(grep -c -- '--diag_error=20011 -Xcudafe --diag_error=20014' <<<"$cmds" || true)
    note="$note, --diag_error: $n_diag/$n_cmds"
    [ "$n_diag" = "$n_cmds" ] || build_ok=0
  fi
  [ "${#failed_t[@]}" = 0 ] || note="$note; FAILED: ${failed_t[*]}"
  [ "${#allowed_t[@]}" = 0 ] || note="$note; allowed failures: ${allowed_t[*]}"

  # Negative test: the same compiler and flags must REJECT device code that calls a host-only
  # function, and accept it once the function is marked KOKKOS_INLINE_FUNCTION (control).
  local ndir="$bdir/gpu_compile_negative" neg="FAILED"
  if run_logged "negative-$be-configure" cmake -S "$root/tests/gpu_compile" -B "$ndir" -G Ninja \
    -DCMAKE_BUILD_TYPE=Release -DCMAKE_CXX_COMPILER="$cxx" -DKokkos_ROOT="$prefix" \
    -DCMAKE_CXX_FLAGS_RELEASE="$GPU_OPT -DNDEBUG" -DCMAKE_CXX_EXTENSIONS=OFF "${cmake_args[@]}" &&
    run_logged "negative-$be-control" cmake --build "$ndir" --target host_call_in_device_control; then
    if cmake --build "$ndir" --target host_call_in_device >"$LOG_DIR/negative-$be.log" 2>&1; then
      log "$be: NEGATIVE TEST FAILED: tests/gpu_compile/host_call_in_device.cpp compiled, so device"
      log "$be: code calling a host-only function would go unnoticed ($LOG_DIR/negative-$be.log)"
      neg="FAILED (compiled)"
    elif grep -Eq "$neg_regex" "$LOG_DIR/negative-$be.log"; then
      neg="ok (rejected)"
      log "$be: negative test proved: a KOKKOS_LAMBDA calling a host-only function is rejected:"
      grep -E -m2 "$neg_regex" "$LOG_DIR/negative-$be.log" | sed 's/^/    /' >&2
    else
      neg="FAILED (wrong error)"
      log "$be: negative test failed for another reason than the expected diagnostic /$neg_regex/:"
      tail -n 30 "$LOG_DIR/negative-$be.log" | sed 's/^/    /' >&2
    fi
  else
    neg="FAILED (control did not compile)"
  fi
  R_NEG[$be]=$neg
  R_NOTE[$be]=$note
  R_TIME[$be]=$(($(date +%s) - t0))
  [ "$build_ok" = 1 ] && [ "$neg" = "ok (rejected)" ]
}

# ---- back ends -------------------------------------------------------------------------------------
run_cuda() {
  [ -x "$CUDA_HOME/bin/nvcc" ] || { R_NOTE[cuda]="no nvcc at $CUDA_HOME/bin"; return 1; }
  export PATH="$CUDA_HOME/bin:$PATH" CUDA_ROOT="$CUDA_HOME"
  export NVCC_WRAPPER_DEFAULT_COMPILER=${NVCC_WRAPPER_DEFAULT_COMPILER:-g++}
  export NVCC_WRAPPER_DEFAULT_ARCH=sm_90  # CMake's compiler checks; Kokkos' targets add -arch=sm_90
  local nvcc_ver
  nvcc_ver=$(nvcc --version | sed -n 's/.*release \([0-9]*\.[0-9]*\).*/\1/p')
  local prefix="$CACHE_ROOT/kokkos-${KOKKOS_VERSION}-cuda-sm90-cxx20-release-cublas-nvcc${nvcc_ver}-p${patch_hash}"
  local t0
  t0=$(date +%s)
  if [ -f "$prefix/.complete" ]; then
    R_KOKKOS[cuda]="cached"
  else
    log "cuda: building Kokkos + Kokkos Kernels $KOKKOS_VERSION (Cuda+Serial, HOPPER90, C++20, cuBLAS) into $prefix"
    build_kokkos cuda "$prefix" @nvcc_wrapper \
      -- -DKokkos_ENABLE_CUDA=ON -DKokkos_ENABLE_CUDA_LAMBDA=ON -DKokkos_ARCH_HOPPER90=ON \
      -DCMAKE_CXX_STANDARD=20 -DKokkos_CXX_STANDARD=20 \
      -- -DKokkosKernels_ENABLE_TPL_CUBLAS=ON -DKokkosKernels_ENABLE_TPL_CUSPARSE=OFF \
      -DKokkosKernels_INST_EXECSPACE_CUDA=OFF -DKokkosKernels_INST_MEMSPACE_CUDASPACE=OFF \
      -DKokkosKernels_INST_MEMSPACE_CUDAUVMSPACE=OFF ||
      { R_NOTE[cuda]="Kokkos build failed"; return 1; }
    R_KOKKOS[cuda]="built"
  fi
  R_KTIME[cuda]=$(($(date +%s) - t0))
  check_backend cuda "$prefix" "$prefix/bin/nvcc_wrapper" '#2001[14]-D|calling a __host__ function' \
    -DCMAKE_CXX_STANDARD=20 "-DCMAKE_CXX_FLAGS=$CUDA_DIAG_FLAGS"
}

# Debian's hipcc (ROCm 5.2) runs $HIP_CLANG_PATH/clang++-15; it honours HIP_CLANG_PATH only when
# HIP_COMPILER is not "clang" (hipvars.pm), and takes the clang resource directory and compiler-rt
# builtins from $HIP_CLANG_PATH/../lib/clang/<version>. A shim directory in the cache points those
# names at clang-16, and a wrapper named hipcc sets the variables, so CMake and Kokkos (which want a
# compiler whose --version says "HIP version") see an ordinary hipcc.
make_hipcc_clang16() {
  local shim="$CACHE_ROOT/hipcc-clang16"
  local ver res
  ver=$(clang++-16 --version | sed -n 's/.*clang version \([0-9.]*\).*/\1/p' | head -n1)
  res=$(clang++-16 -print-resource-dir)
  [ -n "$ver" ] && [ -d "$res" ] || return 1
  mkdir -p "$shim/bin" "$shim/lib/clang"
  ln -sfn /usr/lib/llvm-16/bin/clang++ "$shim/bin/clang++-15"
  ln -sfn /usr/lib/llvm-16/bin/clang "$shim/bin/clang-15"
  ln -sfn /usr/lib/llvm-16/bin/clang-offload-bundler "$shim/bin/clang-offload-bundler"
  ln -sfn /usr/lib/llvm-16/bin/ld.lld "$shim/bin/ld.lld"
  ln -sfn "$res" "$shim/lib/clang/$ver"
  {
    echo '#!/bin/sh'
    echo "# Generated by lather's scripts/gpu-compile-check.sh: Debian's hipcc with clang-16, not clang-15."
    echo "export HIP_COMPILER=clang-16 HIP_CLANG_PATH='$shim/bin'"
    echo 'export HCC_AMDGPU_TARGET="${HCC_AMDGPU_TARGET:-gfx90a}"'
    echo 'exec /usr/bin/hipcc "$@"'
  } >"$shim/bin/hipcc.tmp"
  chmod +x "$shim/bin/hipcc.tmp"
  # Replaced only when it changed: ccache hashes the compiler's mtime (compiler_check), so a
  # wrapper rewritten on every run made every HIP object a cache miss (the whole HIP build, about
  # 10 minutes, on each CI run).
  if cmp -s "$shim/bin/hipcc.tmp" "$shim/bin/hipcc"; then
    rm -f "$shim/bin/hipcc.tmp"
  else
    mv -f "$shim/bin/hipcc.tmp" "$shim/bin/hipcc"
  fi
  echo "$shim/bin/hipcc"
}

run_hip() {
  command -v hipcc >/dev/null || { R_NOTE[hip]="no hipcc"; return 1; }
  export HCC_AMDGPU_TARGET=gfx90a  # no GPU: hipcc's target auto-detection would fail
  local hipcc_bin
  if [ "$HIP_CLANG" = 16 ]; then
    hipcc_bin=$(make_hipcc_clang16) ||
      { R_NOTE[hip]="clang-16 unusable (needs clang-16 lld-16 clang-tools-16 libclang-rt-16-dev)"; return 1; }
  else
    hipcc_bin=$(command -v hipcc)
  fi
  local hip_ver clang_ver
  hip_ver=$("$hipcc_bin" --version 2>/dev/null | sed -n 's/^HIP version: \([0-9]*\.[0-9]*\).*/\1/p')
  clang_ver=$("$hipcc_bin" --version 2>/dev/null | sed -n 's/.*clang version \([0-9]*\).*/\1/p' | head -n1)
  [ "$clang_ver" = "$HIP_CLANG" ] || { R_NOTE[hip]="$hipcc_bin runs clang '$clang_ver', not $HIP_CLANG"; return 1; }
  local prefix="$CACHE_ROOT/kokkos-${KOKKOS_VERSION}-hip-gfx90a-cxx17-release-hip${hip_ver}-clang${clang_ver}-p${patch_hash}"
  local t0
  t0=$(date +%s)
  if [ -f "$prefix/.complete" ]; then
    R_KOKKOS[hip]="cached"
  else
    # C++17: clang-15 crashes on Kokkos_Core.cpp in C++20 mode (libstdc++ <regex>, fixed in LLVM 16).
    log "hip: building Kokkos + Kokkos Kernels $KOKKOS_VERSION (HIP+Serial, VEGA90A, C++17) into $prefix"
    build_kokkos hip "$prefix" "$hipcc_bin" \
      -- -DKokkos_ENABLE_HIP=ON -DKokkos_ARCH_VEGA90A=ON -DCMAKE_CXX_STANDARD=17 -DKokkos_CXX_STANDARD=17 \
      -- -DCMAKE_CXX_STANDARD=17 -DKokkosKernels_INST_EXECSPACE_HIP=OFF \
      -DKokkosKernels_INST_MEMSPACE_HIPSPACE=OFF ||
      { R_NOTE[hip]="Kokkos build failed"; return 1; }
    R_KOKKOS[hip]="built"
  fi
  R_KTIME[hip]=$(($(date +%s) - t0))
  # No CMAKE_CXX_STANDARD: lather's INTERFACE cxx_std_20 must lift its TUs to C++20 over Kokkos'
  # cxx_std_17 (checked on compile_commands.json). clang rejects host calls from device code by default.
  check_backend hip "$prefix" "$hipcc_bin" 'reference to __host__ function'
}

failed=0
for be in "${backends[@]}"; do
  if run_"$be"; then R_STATUS[$be]=PASS; else R_STATUS[$be]=FAIL; failed=1; fi
done

total=$(($(date +%s) - t_start))
{
  echo
  echo "== lather GPU compile check (compile + link only; nothing runs) =="
  printf '%-5s %-6s %-16s %-8s %-34s %-8s %s\n' "back" "result" "Kokkos 3.4.1" "targets" "negative test" "lather" "notes"
  for be in "${backends[@]}"; do
    printf '%-5s %-6s %-16s %-8s %-34s %-8s %s\n' "$be" "${R_STATUS[$be]}" \
      "${R_KOKKOS[$be]:-not built} ${R_KTIME[$be]:+(${R_KTIME[$be]} s)}" "${R_TARGETS[$be]:--}" \
      "${R_NEG[$be]:-not run}" "${R_TIME[$be]:+${R_TIME[$be]} s}" "${R_NOTE[$be]:-}"
  done
  echo "total ${total} s (setup-deps.sh ${t_setup} s); lather compiled with $GPU_OPT; logs in $LOG_DIR"
} >&2
exit "$failed"
