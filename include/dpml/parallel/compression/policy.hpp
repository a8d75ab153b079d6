#pragma once
// Gradient compression of the data axis: the policy tags, their run-time sizes, and the one
// declared extension point every compressor specialises.
//
// A data-parallel step sends every gradient over the data axis; on slow links that is what limits
// scaling. A compression policy of DataParallel (parallel/strategy.hpp) changes what a gradient
// bucket (parallel/data.hpp) puts on the wire:
//
//   NoCompression        the bucket in its own type (the default; the buckets' own collectives)
//   WirePrecision<W>     fp32 gradients cast to W (bf16, or Fp16: IEEE binary16) for the wire,
//                        summed in fp32 on arrival, cast back: half the bytes, a rounding per hop
//                        (compression/wire_precision.hpp)
//   PowerSgd             each matrix M of the bucket as a rank-r product P Qᵀ (Vogels et al. 2019),
//                        with error feedback and a warm-started Q (compression/powersgd.hpp)
//   TopK                 the k largest entries of gradient + residual as (index, value) pairs, the
//                        rest kept as the next step's residual (compression/topk.hpp)
//
// The type chooses the method; the sizes (PowerSGD's rank, top-k's fraction, the seed of PowerSGD's
// first Q) come from the launch, in CompressionOptions. Each method is a specialisation of
// BucketCompressor<Policy, T, Space, Comm>, whose primary template refuses at compile time.
// PowerSgd and TopK are written once for both memory spaces (their kernels are Ops<Space>'
// compression family, their collectives the buckets' CommLink); WirePrecision runs on host
// buckets over comm::Mpi only. The flat all-reduce is their data axis (with_strategy refuses
// comm::Hierarchical with a compression).
//
// Bytes on the wire are counted per rank as a ring (bandwidth-optimal) algorithm sends them, the
// convention of nccl-tests' "bus bandwidth" (parallel/wire_bytes.hpp). The buckets add up what they
// sent and what the same reductions would have sent uncompressed (GradientBuckets::wire_bytes /
// dense_bytes).

#include "dpml/core/bf16.hpp"
#include "dpml/core/memory_space.hpp"
#include "dpml/parallel/wire_bytes.hpp"

#include <bit>
#include <cstddef>
#include <cstdint>
#include <string_view>
#include <type_traits>

namespace dpml::parallel {

// ---- policy tags --------------------------------------------------------------------------------
struct NoCompression {};
struct Fp16 {};  // IEEE binary16 on the wire (host code has no half type: WireCodec<Fp16> below)
template <class Wire>
struct WirePrecision {
  using wire = Wire;
};
struct PowerSgd {};
struct TopK {};

template <class P>
inline constexpr bool is_compression = false;
template <>
inline constexpr bool is_compression<NoCompression> = true;
template <class W>
inline constexpr bool is_compression<WirePrecision<W>> = true;
template <>
inline constexpr bool is_compression<PowerSgd> = true;
template <>
inline constexpr bool is_compression<TopK> = true;

// Whether a compression keeps state between steps and approximates (error feedback): such a
// policy needs every data rank to hold the whole bucket, so it cannot feed ZeRO-1's reduce-scatter.
template <class P>
inline constexpr bool approximates = std::is_same_v<P, PowerSgd> || std::is_same_v<P, TopK>;

// The sizes a compression takes from the launch (--powersgd-rank, --topk-ratio,
// --compression-start-iter, --seed).
struct CompressionOptions {
  int powersgd_rank = 4;        // r: columns of P and Q
  double topk_ratio = 0.01;     // k = ⌈ratio · bucket elements⌉ entries per rank and bucket, in (0, 1]
  std::uint64_t seed = 0;       // PowerSGD's first Q (Philox), the same on every rank
  std::int64_t start_step = 1;  // the first step compressed; steps before it are all-reduced exactly
                                // (PyTorch's start_powerSGD_iter). Steps as the trainer counts them
                                // (from 1, restored by a resume): a resumed run switches at the
                                // same step as an uninterrupted one.
};

// ---- the extension point ------------------------------------------------------------------------
// One compressor per bucket list:
//   BucketCompressor(const FlatParameters<T, Space>&, kernels::Device<Space>&, CommLink<Comm, Space>&,
//                    bool sharded, CompressionOptions)
//   std::int64_t reduce(std::size_t bucket, T* grads, T* shard)
//     grads: (bucket.count) this rank's gradients of the bucket; with shard == nullptr they become
//     the reduced (summed) gradients of all ranks; else (ZeRO-1) shard: (bucket.count / p) gets
//     this rank's part of the sum and grads are scratch. Returns the bytes this rank sent. The
//     work is ordered after what the Device has queued, and what the Device queues next sees the
//     result (host: done on return; GPU: stream order).
template <class Policy, class T, class Space, class Comm>
class BucketCompressor {
  static_assert(sizeof(Policy) == 0,
                "dpml: no gradient compressor for this policy, memory space and communicator — PowerSgd and TopK run "
                "on either space, WirePrecision on host buckets over comm::Mpi (see parallel/compression/policy.hpp)");
};

// ---- wire types ---------------------------------------------------------------------------------
// 16-bit codes of a wire type, to and from float: WireCodec<W>::encode / decode. Both round to
// nearest, ties to even; decode is exact.
template <class W>
struct WireCodec;
template <>
struct WireCodec<bf16> {
  static constexpr std::string_view name = "bf16";
  static constexpr std::uint16_t encode(float f) { return bf16::round_from_float(f); }
  static constexpr float decode(std::uint16_t h) { return float(bf16::from_bits(h)); }
};
template <>
struct WireCodec<Fp16> {
  static constexpr std::string_view name = "fp16";
  // IEEE binary16: 1 sign, 5 exponent (bias 15), 10 mantissa bits; largest finite 65504; values
  // from 65520 up round to infinity; NaN becomes the quiet NaN 0x7e00 (sign kept).
  static constexpr std::uint16_t encode(float f) {
    const std::uint32_t x = std::bit_cast<std::uint32_t>(f);
    const auto sign = static_cast<std::uint16_t>((x >> 16) & 0x8000u);
    const std::uint32_t ax = x & 0x7fffffffu;
    if (ax > 0x7f800000u) return sign | 0x7e00u;              // NaN
    if (ax >= 0x477ff000u) return sign | 0x7c00u;             // ≥ 65520: infinity
    if (ax < 0x38800000u) {                                   // below 2^-14: a subnormal (or zero)
      const float scaled = std::bit_cast<float>(ax) * 0x1p24f;  // in units of 2^-24, exact
      const float rounded = (scaled + 0x1p23f) - 0x1p23f;       // nearest integer, ties to even
      return sign | static_cast<std::uint16_t>(rounded);        // 1024 is the smallest normal: right code
    }
    std::uint32_t h = (ax - 0x38000000u) >> 13;  // exponent rebiased 127 → 15, mantissa's top 10 bits
    const std::uint32_t rest = ax & 0x1fffu;
    h += (rest > 0x1000u || (rest == 0x1000u && (h & 1u))) ? 1u : 0u;  // a carry moves into the exponent
    return sign | static_cast<std::uint16_t>(h);
  }
  static constexpr float decode(std::uint16_t h) {
    const std::uint32_t sign = std::uint32_t{h & 0x8000u} << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
    if (e == 0) {
      const float v = static_cast<float>(m) * 0x1p-24f;
      return sign ? -v : v;
    }
    if (e == 31) return std::bit_cast<float>(sign | 0x7f800000u | (m << 13));
    return std::bit_cast<float>(sign | ((e + 112u) << 23) | (m << 13));
  }
};

}  // namespace dpml::parallel

namespace dpml {
using parallel::Fp16;
using parallel::NoCompression;
using parallel::PowerSgd;
using parallel::TopK;
using parallel::WirePrecision;
}  // namespace dpml
