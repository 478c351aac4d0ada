// SPDX-License-Identifier: Apache-2.0
/// \file
/// \brief The root-inverse strategies of Shampoo (docs/root-inverse.md): EigenRootInverse (host
/// LAPACK eigendecomposition), CoupledNewtonRootInverse and CoupledHigherOrderRootInverse (coupled
/// iterations on the execution space), AutoRootInverse (the faster of the first two per size and
/// execution space), and the RootInverseStrategy concept they model.
#ifndef LATHER_ROOT_INVERSE_ROOT_INVERSE_HPP
#define LATHER_ROOT_INVERSE_ROOT_INVERSE_HPP

#include <lather/concepts/root_inverse.hpp>
#include <lather/root_inverse/auto_root_inverse.hpp>
#include <lather/root_inverse/coupled_higher_order.hpp>
#include <lather/root_inverse/coupled_newton.hpp>
#include <lather/root_inverse/eigen_root_inverse.hpp>

namespace lather {

static_assert(concepts::RootInverseStrategy<EigenRootInverse>);
static_assert(concepts::RootInverseStrategy<CoupledNewtonRootInverse>);
static_assert(concepts::RootInverseStrategy<CoupledHigherOrderRootInverse>);
static_assert(concepts::RootInverseStrategy<AutoRootInverse>);

}  // namespace lather

#endif
