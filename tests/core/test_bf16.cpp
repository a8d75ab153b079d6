#include "test.hpp"

#include <dpml/core/bf16.hpp>

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>

using dpml::bf16;

TEST_CASE("bf16: every one of the 65536 values round-trips through float", "[bf16]") {
  for (std::uint32_t b = 0; b < 65536; ++b) {
    const bf16 h = bf16::from_bits(static_cast<std::uint16_t>(b));
    const float f = static_cast<float>(h);
    CHECK(std::bit_cast<std::uint32_t>(f) == b << 16);  // widening is exact
    if (std::isnan(f)) {
      CHECK(bf16(f).bits == 0x7fff);  // NaNs become the canonical NaN, as in CUDA
    } else {
      CAPTURE(b);
      CHECK(bf16(f).bits == b);
    }
  }
}

static std::uint16_t bits_of(float f) { return bf16(f).bits; }
static float from_u32(std::uint32_t u) { return std::bit_cast<float>(u); }

TEST_CASE("bf16: rounding to nearest, ties to even", "[bf16]") {
  // 1.0 = 0x3F80'0000; one bf16 ulp at 1.0 is 0x0001'0000 in float bits.
  CHECK(bits_of(1.0f) == 0x3F80);
  CHECK(bits_of(from_u32(0x3F80'7FFF)) == 0x3F80);  // below half: down
  CHECK(bits_of(from_u32(0x3F80'8000)) == 0x3F80);  // tie, even stays
  CHECK(bits_of(from_u32(0x3F81'8000)) == 0x3F82);  // tie, odd rounds up to even
  CHECK(bits_of(from_u32(0x3F80'8001)) == 0x3F81);  // above half: up
  CHECK(bits_of(-1.0f) == 0xBF80);
  CHECK(bits_of(from_u32(0xBF80'8001)) == 0xBF81);  // negative, magnitude rounds up
  CHECK(bits_of(3.14159265f) == 0x4049);            // pi → 3.140625
  CHECK(bits_of(0.0f) == 0x0000);
  CHECK(bits_of(-0.0f) == 0x8000);
  CHECK(bits_of(std::numeric_limits<float>::infinity()) == 0x7F80);
  CHECK(bits_of(-std::numeric_limits<float>::infinity()) == 0xFF80);
  CHECK(bits_of(std::numeric_limits<float>::max()) == 0x7F80);   // overflows to +inf
  CHECK(bits_of(from_u32(0x7F7F'7FFF)) == 0x7F7F);                // largest finite bf16 stays
  CHECK(bits_of(from_u32(0x0000'8001)) == 0x0001);                // denormals round too
  CHECK(bits_of(std::numeric_limits<float>::quiet_NaN()) == 0x7FFF);
  CHECK(bits_of(from_u32(0xFFC0'0001)) == 0x7FFF);                // negative NaN payload
}

TEST_CASE("bf16: conversion error is within half an ulp on random floats", "[bf16]") {
  auto gen = dpml::test::rng(7);
  std::uniform_real_distribution<float> u(-1e4f, 1e4f);
  for (int i = 0; i < 100000; ++i) {
    const float f = u(gen);
    const float r = static_cast<float>(bf16(f));
    const float ulp = std::ldexp(1.0f, std::ilogb(f) - 7);
    CHECK(std::fabs(r - f) <= 0.5f * ulp);
  }
}
