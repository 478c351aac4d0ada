#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Sets up dependencies (scripts/setup-deps.sh) and configures a Release build of lather in
# ${LATHER_BUILD_DIR:-build}. Extra arguments go to cmake. Used by demo.sh, test.sh and bench.sh.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
kokkos_prefix=$("$root/scripts/setup-deps.sh" | tail -n1)
build=${LATHER_BUILD_DIR:-$root/build}
gen=()
if command -v ninja >/dev/null && [ ! -f "$build/Makefile" ]; then gen=(-G Ninja); fi
# ccache (installed by setup-deps.sh; LATHER_CCACHE=0 turns it off): paths under the checkout are
# hashed relative to it, so another clone of the same sources on this machine reuses the objects.
launcher=()
if [ "${LATHER_CCACHE:-1}" != 0 ] && command -v ccache >/dev/null; then
  launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER="env;CCACHE_BASEDIR=$root;CCACHE_NOHASHDIR=true;ccache")
fi
cmake -S "$root" -B "$build" "${gen[@]}" -DCMAKE_BUILD_TYPE=Release \
  -DKokkos_ROOT="$kokkos_prefix" -DCMAKE_PREFIX_PATH="$kokkos_prefix" "${launcher[@]}" "$@" >&2
echo "$build"
