#pragma once
// Include in a test that needs a GPU: where none is usable the program exits 77 before main(),
// which CTest reports as skipped (SKIP_RETURN_CODE 77).
#include <dpml/core/cuda_space.hpp>

#include <cstdio>
#include <cstdlib>

namespace dpml::test {
inline const bool gpu_present = [] {
  if (cuda_device_count() == 0) {
    std::fprintf(stderr, "no usable CUDA device: test skipped\n");
    std::exit(77);
  }
  return true;
}();
}  // namespace dpml::test
