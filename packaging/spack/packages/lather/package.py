# SPDX-License-Identifier: Apache-2.0
# Spack recipe for lather. Use this directory as a Spack repository:
#   spack repo add packaging/spack && spack install lather@main +mpi +eigen
from spack.package import *


class Lather(CMakePackage):
    """Header-only C++20 neural-network optimizers (Shampoo, Adam, ...) on Kokkos, with MPI
    communicators for distributed training."""

    # lather has no public mirror yet: point `git` at your clone, or use
    # `spack develop --path /path/to/lather lather@main`.
    homepage = "https://github.com/lather-optim/lather"
    git = "https://github.com/lather-optim/lather.git"
    license("Apache-2.0")

    version("main", branch="main")

    variant("mpi", default=True, description="Build MpiCommunicator (distributed optimizers)")
    variant("eigen", default=True, description="Accept Eigen matrices as parameters and gradients")
    variant("hdf5", default=False, description="Link HDF5 (parallel with +mpi) for checkpoints")
    variant("gpu_aware_mpi", default=False, when="+mpi",
            description="Hand device buffers to MPI directly instead of staging through the host")

    depends_on("cxx", type="build")
    depends_on("cmake@3.22:", type="build")

    depends_on("kokkos@3.4.1: cxxstd=20")
    depends_on("kokkos-kernels@3.4.1:")
    depends_on("lapack")
    depends_on("blas")
    depends_on("zlib-api")  # CRC-32 of checkpoint files
    depends_on("eigen@3.3:", when="+eigen")
    depends_on("mpi", when="+mpi")
    depends_on("hdf5", when="+hdf5")
    depends_on("hdf5+mpi", when="+hdf5+mpi")

    # Test-only dependencies (run_tests): doctest, nlohmann-json, xtensor, CLI11, google-benchmark.
    depends_on("doctest", type="test")
    depends_on("nlohmann-json", type="test")
    depends_on("xtensor", type="test")
    depends_on("cli11", type="test")
    depends_on("benchmark", type="test")

    def cmake_args(self):
        tests = self.run_tests
        return [
            self.define("Kokkos_ROOT", self.spec["kokkos"].prefix),
            self.define_from_variant("LATHER_ENABLE_MPI", "mpi"),
            self.define_from_variant("LATHER_ENABLE_EIGEN", "eigen"),
            self.define_from_variant("LATHER_ENABLE_HDF5", "hdf5"),
            self.define_from_variant("LATHER_ENABLE_GPU_AWARE_MPI", "gpu_aware_mpi"),
            self.define("LATHER_ENABLE_TESTS", tests),
            self.define("LATHER_ENABLE_EXAMPLES", tests),
            self.define("LATHER_ENABLE_BENCHMARKS", False),
        ]
