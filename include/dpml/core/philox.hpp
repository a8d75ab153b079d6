#pragma once
// Philox4x32-10 (Salmon et al., "Parallel Random Numbers: As Easy as 1, 2, 3", SC'11): a
// counter-based generator. Output is a pure function of (key, counter), so any element of a
// stream can be computed independently, on the host or in a CUDA thread, with identical bits.
//
// dpml's convention: key = the 64-bit seed; counter = (offset / 4 as 64 bits, stream as 64 bits).
// Element `offset` of stream `stream` under `seed` is word (offset % 4) of that block. Layers
// draw from disjoint streams (e.g. dropout: stream = layer id, offset = step × numel + i), so a
// run is reproducible for a seed whatever the parallel layout.

#include "dpml/core/config.hpp"

#include <array>
#include <cmath>
#include <cstdint>

namespace dpml {

struct Philox4x32 {
  using Counter = std::array<std::uint32_t, 4>;
  using Key = std::array<std::uint32_t, 2>;
  static constexpr std::uint32_t kM0 = 0xD2511F53u, kM1 = 0xCD9E8D57u;  // multipliers
  static constexpr std::uint32_t kW0 = 0x9E3779B9u, kW1 = 0xBB67AE85u;  // Weyl key increments

  // The raw 10-round bijection: 4 words of output for one counter.
  DPML_HD static constexpr Counter block(Counter c, Key k) {
    for (int round = 0; round < 10; ++round) {
      const std::uint64_t p0 = std::uint64_t{kM0} * c[0];
      const std::uint64_t p1 = std::uint64_t{kM1} * c[2];
      c = Counter{static_cast<std::uint32_t>(p1 >> 32) ^ c[1] ^ k[0], static_cast<std::uint32_t>(p1),
                  static_cast<std::uint32_t>(p0 >> 32) ^ c[3] ^ k[1], static_cast<std::uint32_t>(p0)};
      k = Key{k[0] + kW0, k[1] + kW1};
    }
    return c;
  }
};

// A (seed, stream) pair; u32(offset) is its offset-th 32-bit word.
class PhiloxStream {
 public:
  DPML_HD constexpr PhiloxStream(std::uint64_t seed, std::uint64_t stream = 0)
      : key_{static_cast<std::uint32_t>(seed), static_cast<std::uint32_t>(seed >> 32)}, stream_(stream) {}

  DPML_HD constexpr Philox4x32::Counter block(std::uint64_t block_index) const {
    return Philox4x32::block({static_cast<std::uint32_t>(block_index), static_cast<std::uint32_t>(block_index >> 32),
                              static_cast<std::uint32_t>(stream_), static_cast<std::uint32_t>(stream_ >> 32)},
                             key_);
  }
  DPML_HD constexpr std::uint32_t u32(std::uint64_t offset) const { return block(offset / 4)[offset % 4]; }

  // Uniform in [0, 1): the top 24 bits, exactly representable in float.
  DPML_HD constexpr float uniform(std::uint64_t offset) const { return uniform_of(u32(offset)); }
  // The same uniform from a word already drawn (callers that use all four words of a block).
  DPML_HD static constexpr float uniform_of(std::uint32_t word) { return float(word >> 8) * 0x1p-24f; }

  // Standard normal by Box–Muller from words 2·offset and 2·offset+1 (one block holds two pairs).
  DPML_HD float normal(std::uint64_t offset) const {
    const auto b = block(offset / 2);
    const int half = static_cast<int>(offset % 2) * 2;
    const float u1 = (float(b[half] >> 8) + 1.0f) * 0x1p-24f;  // (0, 1]: log is finite
    const float u2 = float(b[half + 1] >> 8) * 0x1p-24f;
    return sqrtf(-2.0f * logf(u1)) * cosf(6.283185307179586f * u2);
  }

 private:
  Philox4x32::Key key_;
  std::uint64_t stream_;
};

}  // namespace dpml
