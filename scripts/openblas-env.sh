# SPDX-License-Identifier: Apache-2.0
# Sourced by the scripts that time or run BLAS-heavy code (demo.sh, bench-*.sh).
# OpenBLAS 0.3.21 falls back to its slow generic x86 kernels on CPUs it does not know by model
# (e.g. cloud VMs reporting "Intel Xeon Processor"); the SkylakeX kernels (AVX-512 F/BW/DQ/VL) or
# the Haswell kernels (AVX2 + FMA) are correct on any CPU with those instructions and several
# times faster (docs/performance.md). An OPENBLAS_CORETYPE already set is kept.
if [ -z "${OPENBLAS_CORETYPE:-}" ] && [ -r /proc/cpuinfo ]; then
  if grep -qw avx512f /proc/cpuinfo && grep -qw avx512bw /proc/cpuinfo && grep -qw avx512dq /proc/cpuinfo \
     && grep -qw avx512vl /proc/cpuinfo; then
    export OPENBLAS_CORETYPE=SkylakeX
  elif grep -qw avx2 /proc/cpuinfo && grep -qw fma /proc/cpuinfo; then
    export OPENBLAS_CORETYPE=Haswell
  fi
fi
