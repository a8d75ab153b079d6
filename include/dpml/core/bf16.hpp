#pragma once
// bfloat16 for host and device code: 1 sign, 8 exponent, 7 mantissa bits (the top half of an
// IEEE float). float → bf16 rounds to nearest, ties to even; NaN becomes the canonical quiet NaN
// 0x7FFF, as CUDA's __float2bfloat16 does, so host and device produce the same bits. bf16 → float
// is exact (shift left by 16). Arithmetic goes through float.

#include "dpml/core/config.hpp"

#include <bit>
#include <cstdint>

namespace dpml {

struct bf16 {
  std::uint16_t bits = 0;

  constexpr bf16() = default;
  DPML_HD constexpr explicit bf16(float f) : bits(round_from_float(f)) {}
  DPML_HD static constexpr bf16 from_bits(std::uint16_t b) {
    bf16 h;
    h.bits = b;
    return h;
  }
  DPML_HD constexpr explicit operator float() const { return std::bit_cast<float>(std::uint32_t{bits} << 16); }

  DPML_HD static constexpr std::uint16_t round_from_float(float f) {
    const std::uint32_t x = std::bit_cast<std::uint32_t>(f);
    if ((x & 0x7fffffffu) > 0x7f800000u) return 0x7fff;          // NaN → canonical NaN
    const std::uint32_t lsb = (x >> 16) & 1u;                     // ties to even
    return static_cast<std::uint16_t>((x + 0x7fffu + lsb) >> 16); // overflow rounds to ±inf
  }

  friend DPML_HD constexpr bool operator==(bf16 a, bf16 b) { return float(a) == float(b); }
};

DPML_HD constexpr float to_float(bf16 v) { return float(v); }
DPML_HD constexpr float to_float(float v) { return v; }
DPML_HD constexpr double to_float(double v) { return v; }

}  // namespace dpml
