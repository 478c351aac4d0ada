#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Installs lather's dependencies on Debian bookworm and builds Kokkos + Kokkos Kernels 3.4.1 from
# Debian's trilinos 13.2.0 source package (Debian's binary Kokkos is Serial-only, C++14, and ships a
# broken CMake config). The Kokkos install is cached outside the clone, keyed by version and options,
# and reused when present. Prints nothing on stdout but the Kokkos prefix (last line), so callers can
# do: KOKKOS_PREFIX=$(scripts/setup-deps.sh | tail -n1).
#
# Environment:
#   LATHER_DEPS_CACHE  cache root (default: ${XDG_CACHE_HOME:-$HOME/.cache}/lather)
#   LATHER_SKIP_APT=1  do not call apt-get (the packages are already there)
#   Kokkos_ROOT        if set, nothing is built: that Kokkos is used and echoed back
set -euo pipefail

log() { echo "[lather setup] $*" >&2; }

readonly KOKKOS_VERSION=3.4.1
readonly TRILINOS_VERSION=13.2.0
readonly KOKKOS_OPTIONS="serial-openmp-cxx20-release-openblas"
CACHE_ROOT=${LATHER_DEPS_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/lather}
PREFIX="$CACHE_ROOT/kokkos-${KOKKOS_VERSION}-${KOKKOS_OPTIONS}"
JOBS=${LATHER_JOBS:-2}

SUDO=""
if [ "$(id -u)" != 0 ]; then SUDO="sudo"; fi

# Debian packages: build tools, numerical libraries, MPI, test/bench frameworks and the small
# well-kept libraries the examples and tools use (JSON, CLI, zlib), the Fashion-MNIST data set
# and gnuplot for the trainer's plot; python3 for the documentation's link check (a test) and
# CI's launch check; ccache so that repeated builds (CI, fresh clones on the same machine) reuse
# compiled objects; clang-16 with its libFuzzer/sanitizer runtimes and OpenMP runtime for the
# fuzz targets (scripts/fuzz.sh).
PACKAGES=(
  build-essential cmake ninja-build ccache pkg-config dpkg-dev xz-utils ca-certificates
  libopenblas-dev liblapack-dev liblapacke-dev libeigen3-dev
  openmpi-bin libopenmpi-dev libhdf5-openmpi-dev hdf5-tools
  doctest-dev libbenchmark-dev
  nlohmann-json3-dev libcli11-dev libxtensor-dev zlib1g-dev
  dataset-fashion-mnist gnuplot-nox python3
  clang-16 libclang-rt-16-dev libomp-16-dev
)

missing_packages() {
  local p
  for p in "${PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}\n' "$p" 2>/dev/null | grep -q '^install ok installed$' || echo "$p"
  done
}

if [ "${LATHER_SKIP_APT:-0}" != 1 ]; then
  mapfile -t need < <(missing_packages)
  if [ "${#need[@]}" -gt 0 ]; then
    log "installing Debian packages: ${need[*]}"
    export DEBIAN_FRONTEND=noninteractive
    $SUDO apt-get update -qq >&2
    $SUDO apt-get install -y -qq --no-install-recommends "${need[@]}" >&2
  fi
fi

if [ -n "${Kokkos_ROOT:-}" ]; then
  log "Kokkos_ROOT=$Kokkos_ROOT given: not building Kokkos"
  echo "$Kokkos_ROOT"
  exit 0
fi

if [ -f "$PREFIX/.complete" ]; then
  log "reusing cached Kokkos $KOKKOS_VERSION at $PREFIX"
  echo "$PREFIX"
  exit 0
fi

# A deb-src entry derived from the machine's own Debian sources (deb822 or one-line format), so
# `apt-get source` reaches whatever mirror this machine already uses.
trilinos_src_version() {
  apt-cache showsrc trilinos 2>/dev/null | sed -n 's/^Version: //p' | grep -m1 "^${TRILINOS_VERSION}-"
}

add_deb_src() {
  local out=/etc/apt/sources.list.d/lather-deb-src.sources
  local legacy=/etc/apt/sources.list.d/lather-deb-src.list
  if trilinos_src_version >/dev/null; then return 0; fi
  local tmp
  tmp=$(mktemp)
  local f
  for f in /etc/apt/sources.list.d/*.sources; do
    [ -f "$f" ] || continue
    case "$f" in *lather-deb-src*) continue ;; esac
    # deb822: copy each Debian stanza with Types: deb-src
    awk 'BEGIN{RS=""; ORS="\n\n"} /Types:[^\n]*deb/ && /debian/ {gsub(/Types:[^\n]*/, "Types: deb-src"); print}' "$f" >>"$tmp"
  done
  if [ -s "$tmp" ]; then
    $SUDO cp "$tmp" "$out"
  else
    local lists=()
    [ -f /etc/apt/sources.list ] && lists+=(/etc/apt/sources.list)
    for f in /etc/apt/sources.list.d/*.list; do [ -f "$f" ] && lists+=("$f"); done
    grep -hE '^deb[[:space:]]' "${lists[@]}" 2>/dev/null | grep debian | sed 's/^deb[[:space:]]/deb-src /' >"$tmp" || true
    [ -s "$tmp" ] || { log "no Debian apt source found to derive a deb-src entry from"; exit 1; }
    $SUDO cp "$tmp" "$legacy"
  fi
  rm -f "$tmp"
  log "added a deb-src entry derived from this machine's Debian sources"
  $SUDO apt-get update -qq >&2
}

WORK=$(mktemp -d "${TMPDIR:-/tmp}/lather-kokkos.XXXXXX")
trap 'rm -rf "$WORK"' EXIT

SRC_CACHE="$CACHE_ROOT/src/trilinos-${TRILINOS_VERSION}"
if [ ! -f "$SRC_CACHE/.complete" ]; then
  add_deb_src
  log "fetching Debian's trilinos ${TRILINOS_VERSION} source package (only kokkos and kokkos-kernels are kept)"
  version=$(trilinos_src_version) || {
    log "Debian offers no trilinos ${TRILINOS_VERSION} source package here (apt-cache showsrc trilinos)"
    exit 1
  }
  (cd "$WORK" && apt-get source --download-only "trilinos=${version}" >&2)
  orig=$(ls "$WORK"/trilinos_*.orig.tar.* | head -n1)
  mkdir -p "$SRC_CACHE"
  tar -xf "$orig" -C "$SRC_CACHE" --strip-components=1 --wildcards \
    '*/packages/kokkos/*' '*/packages/kokkos-kernels/*'
  touch "$SRC_CACHE/.complete"
  rm -f "$WORK"/trilinos_*
fi

KOKKOS_SRC="$SRC_CACHE/packages/kokkos"
KERNELS_SRC="$SRC_CACHE/packages/kokkos-kernels"
GEN=()
command -v ninja >/dev/null && GEN=(-G Ninja)

log "building Kokkos $KOKKOS_VERSION (Serial + OpenMP, C++20, Release) into $PREFIX"
cmake -S "$KOKKOS_SRC" -B "$WORK/kokkos-build" "${GEN[@]}" \
  -DCMAKE_BUILD_TYPE=Release -DCMAKE_INSTALL_PREFIX="$PREFIX" \
  -DCMAKE_CXX_STANDARD=20 -DCMAKE_CXX_EXTENSIONS=OFF \
  -DKokkos_CXX_STANDARD=20 \
  -DKokkos_ENABLE_SERIAL=ON -DKokkos_ENABLE_OPENMP=ON \
  -DKokkos_ENABLE_TESTS=OFF -DKokkos_ENABLE_EXAMPLES=OFF \
  -DCMAKE_POSITION_INDEPENDENT_CODE=ON >&2
cmake --build "$WORK/kokkos-build" -j "$JOBS" >&2
cmake --install "$WORK/kokkos-build" >&2

log "building Kokkos Kernels $KOKKOS_VERSION (OpenBLAS BLAS/LAPACK TPL, no pre-instantiation)"
cmake -S "$KERNELS_SRC" -B "$WORK/kernels-build" "${GEN[@]}" \
  -DCMAKE_BUILD_TYPE=Release -DCMAKE_INSTALL_PREFIX="$PREFIX" \
  -DKokkos_ROOT="$PREFIX" \
  -DKokkosKernels_ENABLE_TPL_BLAS=ON -DKokkosKernels_ENABLE_TPL_LAPACK=ON \
  -DBLAS_LIBRARY_NAMES=openblas -DLAPACK_LIBRARY_NAMES=openblas \
  -DKokkosKernels_INST_DOUBLE=OFF -DKokkosKernels_INST_FLOAT=OFF \
  -DKokkosKernels_INST_COMPLEX_DOUBLE=OFF -DKokkosKernels_INST_COMPLEX_FLOAT=OFF \
  -DKokkosKernels_INST_ORDINAL_INT=OFF -DKokkosKernels_INST_ORDINAL_INT64_T=OFF \
  -DKokkosKernels_INST_OFFSET_INT=OFF -DKokkosKernels_INST_OFFSET_SIZE_T=OFF \
  -DKokkosKernels_INST_LAYOUTLEFT=OFF -DKokkosKernels_INST_LAYOUTRIGHT=OFF \
  -DKokkosKernels_INST_EXECSPACE_SERIAL=OFF -DKokkosKernels_INST_EXECSPACE_OPENMP=OFF \
  -DKokkosKernels_ENABLE_TESTS=OFF -DKokkosKernels_ENABLE_EXAMPLES=OFF \
  -DKokkosKernels_ENABLE_PERFTESTS=OFF >&2
cmake --build "$WORK/kernels-build" -j "$JOBS" >&2
cmake --install "$WORK/kernels-build" >&2

touch "$PREFIX/.complete"
log "Kokkos $KOKKOS_VERSION installed at $PREFIX"
echo "$PREFIX"
