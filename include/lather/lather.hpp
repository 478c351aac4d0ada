// SPDX-License-Identifier: Apache-2.0
/// \file
/// \brief Umbrella header: everything public in lather (MPI and Eigen parts when enabled).
#ifndef LATHER_LATHER_HPP
#define LATHER_LATHER_HPP

#include <lather/config.hpp>
#include <lather/version.hpp>
#include <lather/error.hpp>
#include <lather/memory.hpp>

#include <lather/traits/tensor_traits.hpp>
#include <lather/traits/kokkos_view.hpp>
#ifdef LATHER_ENABLE_EIGEN
#include <lather/traits/eigen_matrix.hpp>
#endif

#include <lather/concepts/tensor.hpp>
#include <lather/concepts/execution.hpp>
#include <lather/concepts/communicator.hpp>

#include <lather/comm/serial_communicator.hpp>
#ifdef LATHER_ENABLE_MPI
#include <lather/comm/mpi_communicator.hpp>
#endif

#include <lather/io/state_dict.hpp>
#include <lather/io/checkpoint.hpp>
#ifdef LATHER_ENABLE_HDF5
#include <lather/io/hdf5_checkpoint.hpp>
#endif
#include <lather/optimizers/param_group.hpp>
#include <lather/optimizers/nonfinite.hpp>
#include <lather/optimizers/sgd.hpp>
#include <lather/optimizers/adagrad.hpp>
#include <lather/optimizers/rmsprop.hpp>
#include <lather/optimizers/adam.hpp>
#include <lather/optimizers/lamb.hpp>
#include <lather/optimizers/galore.hpp>
#include <lather/optimizers/adafactor.hpp>
#include <lather/optimizers/came.hpp>
#include <lather/layout/blocking.hpp>
#include <lather/layout/sharding.hpp>
#include <lather/distributed/shampoo_distribution.hpp>
#include <lather/distributed/gradients.hpp>
#include <lather/grafting/grafting.hpp>
#include <lather/root_inverse/root_inverse.hpp>
#include <lather/root_inverse/eigen_root_inverse.hpp>
#include <lather/root_inverse/coupled_newton.hpp>
#include <lather/root_inverse/coupled_higher_order.hpp>
#include <lather/preconditioners/eigendecomposition.hpp>
#include <lather/preconditioners/preconditioners.hpp>
#include <lather/optimizers/shampoo.hpp>

#endif
