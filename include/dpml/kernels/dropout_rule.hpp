#pragma once
// The dropout mask as a pure function of where an element sits, written once for both spaces: the
// host loop (kernels/host/activation.hpp) and the device kernel (kernels/cuda/dropout.hpp) both
// call DropoutRule::kept4, so a CudaSpace Dropout draws the host's mask bit for bit.
//
// Element e of global sample g, at step t, in the dropout layer with stream id s, is kept iff word
// g·2³² + e of Philox stream (s·φ + t) under the run seed, read as a uniform in [0, 1)
// (PhiloxStream::uniform), is ≥ p. A sample starts at a multiple of four words, so elements
// 4q … 4q+3 of a sample are the four words of Philox block g·2³⁰ + q: kept4 draws them in one
// block (a quarter of the work of four single draws). Needs per_sample < 2³² and g < 2³² (the
// layer checks both).

#include "dpml/core/config.hpp"
#include "dpml/core/philox.hpp"

#include <cstdint>

namespace dpml::kernels {

struct DropoutRule {
  DPML_HD constexpr DropoutRule(std::uint64_t seed, std::uint64_t layer_stream, std::uint64_t step, float p)
      : rng(seed, layer_stream * 0x9E3779B97F4A7C15ull + step), p(p) {}

  // Bit j set: element 4q + j of global sample g is kept.
  DPML_HD constexpr unsigned kept4(std::uint64_t g, std::uint64_t q) const {
    const Philox4x32::Counter words = rng.block((g << 30) + q);  // offsets g·2³² + 4q + j, j < 4
    unsigned bits = 0;
    for (int j = 0; j < 4; ++j) bits |= (PhiloxStream::uniform_of(words[j]) >= p ? 1u : 0u) << j;
    return bits;
  }

  PhiloxStream rng;  // seed, stream s·φ + t
  float p;           // drop probability
};

}  // namespace dpml::kernels
