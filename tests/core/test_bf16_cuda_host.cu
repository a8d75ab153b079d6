// Our host bf16 conversion against cuda_bf16.h's own host conversion, on every bf16 upper half
// with a spread of lower halves (ties, neighbours, NaN payloads). Needs nvcc, not a GPU.
#include "test.hpp"

#include <dpml/core/bf16.hpp>

#include <cuda_bf16.h>

#include <bit>
#include <cstdint>

TEST_CASE("bf16: host conversion is bit-identical to CUDA's __float2bfloat16", "[bf16]") {
  const std::uint32_t lows[] = {0x0000, 0x0001, 0x7fff, 0x8000, 0x8001, 0xffff, 0x1234, 0xedcb};
  int mismatches = 0;
  for (std::uint32_t hi = 0; hi < 65536; ++hi)
    for (auto lo : lows) {
      const float f = std::bit_cast<float>(hi << 16 | lo);
      mismatches += dpml::bf16(f).bits != std::bit_cast<std::uint16_t>(__float2bfloat16(f));
    }
  CHECK(mismatches == 0);
}
