#pragma once
// Warp-level tensor-core primitives shared by the mma.sync block tile (gemm/block_tile.hpp: the
// convolution, bench/gemm's GEMMs) and the flash attention: cp.async
// (global → shared, 16 bytes, zero-filling what lies past the source size), ldmatrix (8×8 b16
// tiles from shared memory into mma fragments, optionally transposed) and
// mma.sync.m16n8k16 with bf16 or fp16 operands and fp32 accumulators (sm_80 and later).
//
// Fragment layouts (PTX ISA, "mma.m16n8k16"), with g = lane / 4 and t = lane % 4:
//   A (16×16, row):  a[0] = (g, 2t..2t+1)  a[1] = (g+8, 2t..)  a[2] = (g, 2t+8..)  a[3] = (g+8, 2t+8..)
//   B (16×8, col):   b[0] = (k 2t..2t+1, n g)  b[1] = (k 2t+8.., n g)
//   C (16×8 fp32):   c[0..1] = (g, 2t..2t+1)   c[2..3] = (g+8, 2t..)
// so two neighbouring C tiles (n 0-7 and 8-15) packed to bf16 are exactly an A fragment of the
// next product (attention's P·V) — no trip through shared memory.

#include "dpml/core/bf16.hpp"
#include "dpml/core/config.hpp"
#include "dpml/kernels/cuda/common.hpp"

#include <cstdint>
#include <type_traits>

namespace dpml::kernels::cuda::detail {

__device__ __forceinline__ std::uint32_t smem_addr(const void* p) {
  return static_cast<std::uint32_t>(__cvta_generic_to_shared(p));
}

// cp.async of 16 bytes with `src_bytes` (0…16) read and the rest zero-filled.
__device__ __forceinline__ void cp_async_16(void* dst, const void* src, int src_bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_addr(dst)), "l"(src), "r"(src_bytes));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

__device__ __forceinline__ void ldmatrix_x4(std::uint32_t (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(p)));
}
__device__ __forceinline__ void ldmatrix_x4_trans(std::uint32_t (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(p)));
}

// d (16×8 fp32) += a (16×16 T, row) · b (16×8 T, col); T is bf16 or f16.
template <class T>
__device__ __forceinline__ void mma_16816(float (&d)[4], const std::uint32_t (&a)[4], std::uint32_t b0, std::uint32_t b1) {
  static_assert(std::is_same_v<T, bf16> || std::is_same_v<T, f16>);
  if constexpr (std::is_same_v<T, bf16>) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  } else {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
}

// Where each lane points ldmatrix.x4 (element offsets into a shared tile with row stride `stride`),
// so that the four 8×8 matrices land in the registers as mma fragments. Host and device: a host
// test checks them against a model of ldmatrix and mma (tests/cuda/test_fragments.cu).
//
//   a_kmajor   A fragment of rows [0, 16), columns [k, k + 16) of a (rows, K) tile
//   a_mmajor   the same A fragment from a (K, rows) tile (ldmatrix.trans)
//   b_kmajor   B fragments of n-tiles n and n + 8 for k-slice [k, k + 16) of a tile stored
//              (N rows, K contiguous), e.g. K in S = Q·Kᵀ (ldmatrix); registers 0, 1 → n-tile n,
//              2, 3 → n-tile n + 8
//   b_nmajor   the same from a tile stored (K rows, N contiguous), e.g. V in O = P·V (.trans)
DPML_HD constexpr int a_kmajor_offset(int lane, int stride, int k) {
  return (lane % 16) * stride + k + (lane / 16) * 8;
}
DPML_HD constexpr int a_mmajor_offset(int lane, int stride, int k) {
  return (k + lane % 8 + (lane / 16) * 8) * stride + ((lane / 8) % 2) * 8;
}
DPML_HD constexpr int b_kmajor_offset(int lane, int stride, int n, int k) {
  return (n + (lane / 16) * 8 + lane % 8) * stride + k + ((lane / 8) % 2) * 8;
}
DPML_HD constexpr int b_nmajor_offset(int lane, int stride, int n, int k) {
  return (k + lane % 8 + ((lane / 8) % 2) * 8) * stride + n + (lane / 16) * 8;
}

template <class T>
__device__ __forceinline__ void ldmatrix_a(std::uint32_t (&a)[4], const T* tile, int stride, int k, int lane) {
  ldmatrix_x4(a, tile + a_kmajor_offset(lane, stride, k));
}
template <class T>
__device__ __forceinline__ void ldmatrix_a_trans(std::uint32_t (&a)[4], const T* tile, int stride, int k,
                                                 int lane) {
  ldmatrix_x4_trans(a, tile + a_mmajor_offset(lane, stride, k));
}
template <class T>
__device__ __forceinline__ void ldmatrix_b_kmajor(std::uint32_t (&r)[4], const T* tile, int stride, int n, int k,
                                                  int lane) {
  ldmatrix_x4(r, tile + b_kmajor_offset(lane, stride, n, k));
}
template <class T>
__device__ __forceinline__ void ldmatrix_b_nmajor(std::uint32_t (&r)[4], const T* tile, int stride, int n, int k,
                                                  int lane) {
  ldmatrix_x4_trans(r, tile + b_nmajor_offset(lane, stride, n, k));
}

}  // namespace dpml::kernels::cuda::detail
