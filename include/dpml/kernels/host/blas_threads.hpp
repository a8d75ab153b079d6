#pragma once
// The host BLAS's (OpenBLAS's) thread count. OpenBLAS starts one thread per core in every process,
// so ranks sharing a node oversubscribe it: 4 ranks × 2 threads on 2 cores ran the Fashion-MNIST
// example at 300–813 img/s against 869–926 with one thread each. dpml::run sizes it from the
// cores and the node's ranks (comm/launch.hpp) unless the environment already does.

#include <cblas.h>

namespace dpml::kernels::host {

inline void set_blas_threads(int n) { openblas_set_num_threads(n < 1 ? 1 : n); }
inline int blas_threads() { return openblas_get_num_threads(); }

}  // namespace dpml::kernels::host
