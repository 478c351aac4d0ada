// SPDX-License-Identifier: Apache-2.0
/// \file
/// \brief Private. Per-thread host scratch vectors kept from one call to the next.
///
/// Why: the eigenbasis preconditioners' refreshes (eigh, QR iteration), the inverse roots
/// eigendecomposed Shampoo rebuilds from its eigenpairs and spectral descent's SVD work in host
/// `std::vector`s. Made per call, a root step of eigendecomposed Shampoo took 71 heap allocations
/// and one of SOAP 102 (tests/unit/test_host_blas.cpp, policy allocations), where issue #7 asks
/// for none after the first step. Each (element type, owner, slot) names one vector per thread;
/// its user resizes or assigns it, which reuses the capacity of the largest size seen, so after
/// a model's first root step these paths allocate nothing. Like impl::EigenWorkspace and LAPACK's
/// syevd arrays, the memory stays with the thread until it exits.
///
/// A slot may be used by one function at a time on a thread: each owner (a tag type) numbers its
/// own slots, and a function that calls another with scratch passes its own vectors, never the
/// callee's.
#ifndef LATHER_IMPL_HOST_SCRATCH_HPP
#define LATHER_IMPL_HOST_SCRATCH_HPP

#include <vector>

namespace lather::impl {

/// This thread's scratch vector `Slot` of `Owner`, holding T (see the file comment).
template <class T, class Owner, int Slot>
std::vector<T>& host_scratch() {
  thread_local std::vector<T> v;
  return v;
}

}  // namespace lather::impl

#endif
