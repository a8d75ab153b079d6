#pragma once
// WgmmaGemm<TileShape<BM, BN, 64>, Stages, Schedule>: dpml's Hopper GEMM policy — wgmma
// tensor-core instructions fed by the TMA copy engine, warp-specialised. It reaches 0.74–0.98 of
// cuBLASLt on GPT-2's shapes and wins none, so no dispatch row selects it and it lives here, in
// bench/gemm (README.md has the figures). Same interface and epilogues as TiledGemm
// (include/dpml/kernels/cuda/gemm/gemm.hpp, policy.hpp); all four (ta, tb) layouts; sm_90a only. Schedules (types in
// wgmma_schedule): Cooperative, one tile per block with its two consumer warpgroups splitting
// the rows (the kernel described next); CooperativeTmaStore, the same with the epilogue staged in
// shared memory and stored by TMA (staged_epilogue); CooperativeMulticast, the same kernel with blocks paired in
// 2×1 thread-block clusters over vertically adjacent tiles, each block copying half of the pair's
// shared B slab into both (TMA .multicast::cluster; consumers release a stage in both blocks); and
// Pingpong, persistent blocks whose consumer warpgroups take whole tiles in turn (PingpongKernel
// below). Without clusters, few tiles over a long K are split along K (split_k_handoff).
//
// The trick, in four parts:
//  * TMA loads. Two CUtensorMaps (built on the host per call by cuTensorMapEncodeTiled, a driver
//    function reached through cudaGetDriverEntryPointByVersion, so no -lcuda) describe A and B in
//    their stored layouts. One thread of a producer warpgroup issues cp.async.bulk.tensor copies of
//    64-element-wide boxes into shared memory with the 128-byte swizzle; the copy engine zero-fills
//    what lies past M, N or K (ragged edges need no code) and signals an mbarrier ("full") with the
//    bytes it wrote. `Stages` slabs (BM×64 of A, BN×64 of B) are in flight.
//  * wgmma straight from shared memory. Each consumer warpgroup (BM/64 of them) owns 64 rows of
//    the tile and issues wgmma.m64nBNk16 four times per slab; the operands are described by 64-bit
//    matrix descriptors (address, leading/stride byte offsets, swizzle mode) over the swizzled
//    slabs, and the instruction's transpose bits read a K-contiguous slab ("K-major", the layout of
//    A as stored when ta = no, of B when tb = yes) or an M/N-contiguous one ("MN-major") alike —
//    one kernel for all four layouts. Accumulators stay in registers (BN/2 floats per thread).
//  * Two mbarriers per stage. Consumers wait on "full", issue their wgmmas, commit them as a
//    group, and once the previous group has retired (wgmma.wait_group 1) release that slab on its
//    "empty" barrier, which the producer waits on before refilling it. setmaxnreg hands the
//    producer's registers to the consumers.
//  * Epilogue in registers: the m64nN accumulator fragment has the mma.sync layout (a thread owns
//    columns 2t, 2t+1 of rows g and g+8 of its warp's 16 rows), so it uses the tiled kernel's
//    epilogue and block order (gemm/epilogue.hpp).
//
// sm_90a: wgmma and setmaxnreg exist only in the architecture-specific target
// (`-gencode=arch=compute_90a,code=sm_90a`, CMAKE_CUDA_ARCHITECTURES=90a). In any other build the
// kernel body is empty and supports() is false (the attributes of a probe kernel tell which image
// the device runs), so callers fall back to another policy.

#include "policy.hpp"

#include "dpml/core/error.hpp"
#include "dpml/kernels/cuda/common.hpp"
#include "dpml/kernels/cuda/gemm/block_tile.hpp"  // TileShape
#include "dpml/kernels/cuda/gemm/epilogue.hpp"
#include "dpml/kernels/cuda/gemm/gemm.hpp"
#include "dpml/kernels/cuda/mma.hpp"  // smem_addr

#include <cuda.h>          // CUtensorMap and its enums (types only)
#include <cudaTypedefs.h>  // PFN_cuTensorMapEncodeTiled
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <string_view>
#include <type_traits>

namespace dpml::kernels::cuda {

namespace detail::wgmma {

// ---- device primitives (PTX ISA: mbarrier, cp.async.bulk.tensor, wgmma, setmaxnreg) ----

__device__ __forceinline__ void mbar_init(std::uint32_t bar, std::uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}
__device__ __forceinline__ void mbar_expect_tx(std::uint32_t bar, std::uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
}
__device__ __forceinline__ void mbar_arrive(std::uint32_t bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}
// Waits until the phase with parity `parity` of the barrier has completed.
__device__ __forceinline__ void mbar_wait(std::uint32_t bar, std::uint32_t parity) {
  std::uint32_t done = 0;
  do {
    asm volatile(
        "{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
        : "=r"(done)
        : "r"(bar), "r"(parity)
        : "memory");
  } while (!done);
}

// Box at coordinates (c0 innermost, c1) of the tensor map into shared memory at dst, completing
// on the mbarrier bar.
__device__ __forceinline__ void tma_load(const CUtensorMap* map, std::uint32_t dst, std::uint32_t bar, int c0,
                                         int c1) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];\n" ::"r"(
          dst),
      "l"(reinterpret_cast<std::uint64_t>(map)), "r"(c0), "r"(c1), "r"(bar)
      : "memory");
}
// The multicast form: the box lands at offset dst of the shared memory of every block of this
// cluster named in `ctas` (one bit per rank) and completes on the mbarrier at offset bar in each.
__device__ __forceinline__ void tma_load_multicast(const CUtensorMap* map, std::uint32_t dst, std::uint32_t bar, int c0,
                                                   int c1, std::uint16_t ctas) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes.multicast::cluster [%0], [%1, {%2, "
      "%3}], [%4], %5;\n" ::"r"(dst),
      "l"(reinterpret_cast<std::uint64_t>(map)), "r"(c0), "r"(c1), "r"(bar), "h"(ctas)
      : "memory");
}
// Arrives on the mbarrier at offset bar of block `cta` of this cluster (this block included).
// CTA-scope release, as for a local arrive: the operand reads it orders are the wgmmas' already
// retired ones. A `.release.cluster` arrive compiles to a GPU-wide memory fence, which cost ~1 µs
// per slab on the consumer's critical path (the kernel ran at half speed).
__device__ __forceinline__ void mbar_arrive_cluster(std::uint32_t bar, std::uint32_t cta) {
  asm volatile(
      "{\n.reg .b32 remote;\nmapa.shared::cluster.u32 remote, %0, %1;\n"
      "mbarrier.arrive.shared::cluster.b64 _, [remote];\n}\n" ::"r"(bar),
      "r"(cta)
      : "memory");
}
// Every thread of every block of the cluster: what was written before is seen after.
__device__ __forceinline__ void cluster_sync() {
  asm volatile("barrier.cluster.arrive.release;\nbarrier.cluster.wait.acquire;\n" ::: "memory");
}
__device__ __forceinline__ std::uint32_t cluster_rank() {
  std::uint32_t r;
  asm volatile("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(r));
  return r;
}
__device__ __forceinline__ void tma_prefetch(const CUtensorMap* map) {
  asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<std::uint64_t>(map)) : "memory");
}
// The box at shared-memory address src to coordinates (c0 innermost, c1) of the tensor map (the
// copy engine clips what lies past the tensor's edges), as part of this thread's bulk group.
__device__ __forceinline__ void tma_store(const CUtensorMap* map, std::uint32_t src, int c0, int c1) {
  asm volatile("cp.async.bulk.tensor.2d.global.shared::cta.bulk_group [%0, {%1, %2}], [%3];\n" ::"l"(
                   reinterpret_cast<std::uint64_t>(map)),
               "r"(c0), "r"(c1), "r"(src)
               : "memory");
}
// Closes this thread's bulk group, then waits until its copies have read their shared memory (the
// global writes may still be in flight: they complete before the kernel does).
__device__ __forceinline__ void tma_store_commit_and_wait_read() {
  asm volatile("cp.async.bulk.commit_group;\ncp.async.bulk.wait_group.read 0;\n" ::: "memory");
}
// Makes this thread's shared-memory writes visible to the copy engine (the async proxy).
__device__ __forceinline__ void fence_proxy_async_shared() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}
__device__ __forceinline__ void st_shared_u32(std::uint32_t addr, std::uint32_t v) {
  asm volatile("st.shared.u32 [%0], %1;\n" ::"r"(addr), "r"(v) : "memory");
}
// Barrier `id` (1–15; 0 is __syncthreads') over `threads` threads, whole warps.
__device__ __forceinline__ void named_barrier_sync(int id, int threads) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
// Keeps the compiler from moving accumulator reads or writes across wgmma issue and wait.
template <int R>
__device__ __forceinline__ void fence_operands(float (&d)[R]) {
#pragma unroll
  for (int i = 0; i < R; ++i) asm volatile("" : "+f"(d[i])::"memory");
}
template <int Regs>
__device__ __forceinline__ void setmaxnreg_inc() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(Regs));
}
template <int Regs>
__device__ __forceinline__ void setmaxnreg_dec() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(Regs));
}

// Matrix descriptor of a 128-byte-swizzled operand in shared memory (PTX ISA, "Matrix
// Descriptor Format"): start address, leading and stride byte offsets (all >> 4), swizzle mode 1.
//   K-major  (rows of 64 K-elements = 128 B): LBO unused (1), SBO = 1024 (8 rows to the next 8).
//   MN-major (rows of 64 M/N-elements, one per k): LBO = stride between 64-wide M/N blocks,
//            SBO = 1024 (8 k-rows to the next 8).
__device__ __forceinline__ std::uint64_t smem_desc(std::uint32_t addr, std::uint32_t lbo, std::uint32_t sbo) {
  return static_cast<std::uint64_t>((addr & 0x3FFFF) >> 4) | static_cast<std::uint64_t>((lbo & 0x3FFFF) >> 4) << 16 |
         static_cast<std::uint64_t>((sbo & 0x3FFFF) >> 4) << 32 | std::uint64_t{1} << 62;
}

// wgmma.mma_async.m64nNk16, bf16 operands from shared memory, fp32 accumulators d += A·B, with
// the transpose bits (0: K-major, 1: MN-major) as template arguments.
template <int N, int TransA, int TransB>
struct Wgmma;

template <int TransA, int TransB>
struct Wgmma<128, TransA, TransB> {
  __device__ __forceinline__ static void mma(float (&d)[64], std::uint64_t desc_a, std::uint64_t desc_b) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {"
        "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15,"
        "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31,"
        "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47,"
        "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, "
        "%64, %65, p, 1, 1, %67, %68;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
        "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
        "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
        "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
        "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
        "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
        "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
        : "l"(desc_a), "l"(desc_b), "r"(1), "n"(TransA), "n"(TransB));
  }
};

template <int TransA, int TransB>
struct Wgmma<256, TransA, TransB> {
  __device__ __forceinline__ static void mma(float (&d)[128], std::uint64_t desc_a, std::uint64_t desc_b) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %130, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 {"
        "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15,"
        "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31,"
        "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47,"
        "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63,"
        "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79,"
        "%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95,"
        "%96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111,"
        "%112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127}, "
        "%128, %129, p, 1, 1, %131, %132;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
        "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
        "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
        "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
        "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
        "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
        "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]),
        "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]),
        "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]),
        "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]),
        "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]),
        "+f"(d[96]), "+f"(d[97]), "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]),
        "+f"(d[104]), "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), "+f"(d[108]), "+f"(d[109]), "+f"(d[110]), "+f"(d[111]),
        "+f"(d[112]), "+f"(d[113]), "+f"(d[114]), "+f"(d[115]), "+f"(d[116]), "+f"(d[117]), "+f"(d[118]), "+f"(d[119]),
        "+f"(d[120]), "+f"(d[121]), "+f"(d[122]), "+f"(d[123]), "+f"(d[124]), "+f"(d[125]), "+f"(d[126]), "+f"(d[127])
        : "l"(desc_a), "l"(desc_b), "r"(1), "n"(TransA), "n"(TransB));
  }
};

// ---- what both kernels do with a stage: copy it in, describe it to wgmma ----

inline constexpr int kAtom = 64 * 64 * 2;  // one 64×64 box of bf16: 8 KiB

// Issues the copies of one stage — A's (BM, 64) slab at a, B's (BN, 64) slab at b, from rows m0,
// n0 and column k0 — completing on bar. A stored (K, M): BM/64 boxes of (64 k, 64 m), MN-major;
// stored (M, K): one box of (BM m, 64 k), K-major. B stored (N, K): one box of (BN n, 64 k),
// K-major; stored (K, N): BN/64 boxes of (64 k, 64 n), MN-major. In a cluster of `Cluster` blocks
// that share B (same n0), block `rank` copies only part `rank` of B's slab — rows [rank·BN/Cluster,
// (rank + 1)·BN/Cluster) — into every block of the cluster (the B tensor map's boxes are then
// BN/Cluster rows when K-major), and each block's bar counts the whole stage.
template <int BM, int BN, bool TransA, bool TransB, int Cluster = 1>
__device__ __forceinline__ void load_stage(const CUtensorMap* map_a, const CUtensorMap* map_b, std::uint32_t a,
                                           std::uint32_t b, std::uint32_t bar, int m0, int n0, int k0, int rank = 0) {
  static_assert(BN % (64 * Cluster) == 0, "B splits into 64-wide boxes per block of the cluster");
  if constexpr (TransA) {
#pragma unroll
    for (int i = 0; i < BM / 64; ++i) tma_load(map_a, a + i * kAtom, bar, m0 + 64 * i, k0);
  } else {
    tma_load(map_a, a, bar, k0, m0);
  }
  if constexpr (Cluster > 1) {
    constexpr auto all = static_cast<std::uint16_t>((1u << Cluster) - 1);
    constexpr int rows = BN / Cluster;  // of B's slab, per block
    if constexpr (TransB) {
      tma_load_multicast(map_b, b + rank * rows * 128, bar, k0, n0 + rank * rows, all);
    } else {
#pragma unroll
      for (int i = rank * rows / 64; i < (rank + 1) * rows / 64; ++i)
        tma_load_multicast(map_b, b + i * kAtom, bar, n0 + 64 * i, k0, all);
    }
  } else if constexpr (TransB) {
    tma_load(map_b, b, bar, k0, n0);
  } else {
#pragma unroll
    for (int i = 0; i < BN / 64; ++i) tma_load(map_b, b + i * kAtom, bar, n0 + 64 * i, k0);
  }
}

// wgmma descriptors of k16 step kk: rows [64r, 64r + 64) of the A slab at a, and the B slab at b.
// K-major advances 32 bytes per k16 inside the swizzled row; MN-major 16 k-rows.
template <bool TransA>
__device__ __forceinline__ std::uint64_t desc_a(std::uint32_t a, int r, int kk) {
  return TransA ? smem_desc(a + r * kAtom + kk * 128, kAtom, 1024) : smem_desc(a + r * 64 * 128 + kk * 2, 16, 1024);
}
template <bool TransB>
__device__ __forceinline__ std::uint64_t desc_b(std::uint32_t b, int kk) {
  return TransB ? smem_desc(b + kk * 2, 16, 1024) : smem_desc(b + kk * 128, kAtom, 1024);
}

// The shared memory of both kernels: `Stages` stages, each an A slab (BM, 64) then a B slab
// (BN, 64), K-major or MN-major, from the first 1024-byte boundary (128-byte swizzle atoms must
// start on one); then a "full" and an "empty" mbarrier per stage and `Extra` more 8-byte words.
template <int BM, int BN, int Stages, int Extra>
struct StageRing {
  static constexpr std::uint32_t a_bytes = BM * 64 * 2, b_bytes = BN * 64 * 2, stage_bytes = a_bytes + b_bytes;
  static constexpr std::size_t smem_bytes =
      1024 /* alignment slack */ + std::size_t{Stages} * stage_bytes + (2 * Stages + Extra) * sizeof(std::uint64_t);

  std::uint32_t base;  // shared-memory address of stage 0
  __device__ explicit StageRing(const void* smem) : base((smem_addr(smem) + 1023u) & ~1023u) {}
  __device__ std::uint32_t a(int s) const { return base + static_cast<std::uint32_t>(s) * stage_bytes; }
  __device__ std::uint32_t b(int s) const { return a(s) + a_bytes; }
  __device__ std::uint32_t full(int s) const { return word(s); }
  __device__ std::uint32_t empty(int s) const { return word(Stages + s); }
  __device__ std::uint32_t extra(int i) const { return word(2 * Stages + i); }
  // Every stage's full barrier for the producer's one arrive_expect_tx (+ the copies' bytes), its
  // empty barrier for `empty_arrivals` releases (one thread, before the fences).
  __device__ void init_barriers(std::uint32_t empty_arrivals) const {
    for (int s = 0; s < Stages; ++s) {
      mbar_init(full(s), 1);
      mbar_init(empty(s), empty_arrivals);
    }
  }

 private:
  __device__ std::uint32_t word(int i) const {
    return base + Stages * stage_bytes + 8u * static_cast<std::uint32_t>(i);
  }
};

// ---- split K, shared by both kernels ----
//
// With `splits` > 1, a tile's k-slabs are cut into `splits` runs of `k_per_split`, each run its
// own unit of work. A consumer warpgroup that finished a run stores its fp32 partial tile (each
// thread its own accumulators: coalesced float4s through L2) and counts itself in on the tile
// part's counter; the one that completes the count sums the partials in split order — the same
// bits whichever split finished last — runs the epilogue and resets the counter to 0. Nobody waits
// on anybody. A "part" is what one warpgroup holds: a whole tile in the ping-pong kernel, its 64
// rows in the cooperative one.
struct SplitK {
  int splits;         // K splits per tile (1: none)
  int k_per_split;    // k-slabs of 64 per split
  float* partials;    // (parts, splits, part size) fp32, when splits > 1
  int* arrivals;      // (parts) counters of finished splits, zero between calls
};

// The hand-off of one consumer warpgroup's RB m64nBN fragments (frag(r, q): float4 q of row
// block r) as split `split_index` of part `part`; returns whether this warpgroup was the last
// split of the part, in which case emit4(r, q, sum) has received every float4 summed over the
// splits. `barrier` is a named barrier of this warpgroup's 128 threads alone and `last` a word of
// shared memory of its own.
template <int RB, int BN, class Frag, class Emit>
__device__ __forceinline__ bool split_k_handoff(const SplitK& split, int part, int split_index, int barrier, int* last,
                                                Frag frag, Emit emit4) {
  // Float4 q of row block r of split s for thread tid: parts[s][(r·BN/8 + q)·128 + tid] —
  // coalesced, and the same fragment layout in every split.
  constexpr std::int64_t kPart4 = RB * 64 * BN / 4;
  const int tid = static_cast<int>(threadIdx.x) % 128;
  float4* parts = reinterpret_cast<float4*>(split.partials) + static_cast<std::int64_t>(part) * split.splits * kPart4;
  auto at = [&](int s, int r, int q) { return parts + s * kPart4 + (r * (BN / 8) + q) * 128 + tid; };
#pragma unroll
  for (int r = 0; r < RB; ++r)
#pragma unroll
    for (int q = 0; q < BN / 8; ++q) __stcg(at(split_index, r, q), frag(r, q));
  __threadfence();
  named_barrier_sync(barrier, 128);
  if (tid == 0) *last = atomicAdd(split.arrivals + part, 1) == split.splits - 1;
  named_barrier_sync(barrier, 128);
  if (!*last) return false;
  __threadfence();
  if (tid == 0) split.arrivals[part] = 0;  // ready for the next call
  // In chunks of kChunk float4s (the fragments are dead here: their registers hold the loads).
  constexpr int kChunk = 8;
#pragma unroll
  for (int r = 0; r < RB; ++r)
#pragma unroll
    for (int q0 = 0; q0 < BN / 8; q0 += kChunk) {
      float4 sum[kChunk];
#pragma unroll
      for (int q = 0; q < kChunk; ++q) sum[q] = __ldcg(at(0, r, q0 + q));
      for (int s = 1; s < split.splits; ++s) {
        float4 v[kChunk];
#pragma unroll
        for (int q = 0; q < kChunk; ++q) v[q] = __ldcg(at(s, r, q0 + q));
#pragma unroll
        for (int q = 0; q < kChunk; ++q)
          sum[q] = make_float4(sum[q].x + v[q].x, sum[q].y + v[q].y, sum[q].z + v[q].z, sum[q].w + v[q].w);
      }
#pragma unroll
      for (int q = 0; q < kChunk; ++q) emit4(r, q0 + q, sum[q]);
    }
  return true;
}

// ---- the kernel ----

template <class Tile, int Stages, bool TransA, bool TransB, int Cluster, bool TmaStore = false>
struct Kernel {
  static constexpr int BM = Tile::M, BN = Tile::N, BK = Tile::K;
  static_assert(BK == 64, "a slab row is one 128-byte swizzle row: BK = 64 bf16");
  // One consumer warpgroup per 64 rows. Only BM = 128 (2 consumers, 384 threads) so far: its
  // register split below is the one checked against ptxas (168 registers at entry, no spills).
  static_assert(BM == 128, "WgmmaGemm: BM = 128 (two consumer warpgroups) is the configuration built and checked");
  static_assert(BN == 128 || BN == 256, "wgmma wrappers exist for n = 128 and n = 256");
  static_assert(Stages >= 2, "a pipeline needs at least two stages");
  static constexpr int Consumers = BM / 64;
  static constexpr int Threads = 128 * (Consumers + 1);  // warpgroup 0 produces
  using Ring = StageRing<BM, BN, Stages, 1>;  // extra word: the consumers' two last-split flags
  static constexpr int kStages = Stages;
  static_assert(Cluster == 1 || Cluster == 2, "blocks pair up in clusters of 2 or run alone");
  static constexpr int kCluster = Cluster;
  // The staged epilogue writes the tile over the ring: two warpgroups' (64, BN) bf16 parts.
  static_assert(!TmaStore || (Cluster == 1 && Consumers * 64 * BN * 2 <= Stages * Ring::stage_bytes),
                "the TMA-store epilogue runs without clusters and stages the tile in the ring");
  static constexpr bool kTmaStore = TmaStore;
  // Registers per thread: the launch gives every thread the cap of __launch_bounds__(Threads, 1)
  // (64 Ki / Threads, in steps of 8); setmaxnreg then moves the producer down to 40 and the
  // consumers up to what that frees (at most 256). Asking for more than the block holds would stall.
  static constexpr int kEntryRegs = 65536 / Threads / 8 * 8 > 248 ? 248 : 65536 / Threads / 8 * 8;
  static constexpr int kProducerRegs = 40;
  static constexpr int kFreedRegs = (Threads * kEntryRegs - 128 * kProducerRegs) / (128 * Consumers) / 8 * 8;
  static constexpr int kConsumerRegs = kFreedRegs > 256 ? 256 : kFreedRegs;
};

// The staged epilogue of consumer warpgroup c (rows [64c, 64c + 64) of the tile at (m0, n0)): its
// outputs in bf16 over the ring, as BN/64 boxes of (64 rows, 64 columns) laid out as TMA's 128-byte
// swizzle expects (16-byte chunk j of row r at chunk j ^ (r % 8)), then one thread stores the boxes
// with the copy engine, which clips them at M and N. The block can leave as soon as the engine has
// read them, while the writes drain — the next block's first loads overlap them.
template <class Kn, class Epi>
__device__ __forceinline__ void staged_epilogue(const typename Kn::Ring& ring, const CUtensorMap* map_c,
                                                const EpilogueParams<bf16, Epi>& ep, std::int64_t M, std::int64_t N,
                                                int m0, int n0, int c, const float (&acc)[Kn::BN / 2]) {
  constexpr int BN = Kn::BN;
  // Both warpgroups have retired their last wgmmas (they read every stage) before either writes.
  named_barrier_sync(1, 128 * Kn::Consumers);
  const std::uint32_t boxes = ring.a(0) + static_cast<std::uint32_t>(c * (BN / 64) * kAtom);
  const int lane = static_cast<int>(threadIdx.x) % 32, warp = (static_cast<int>(threadIdx.x) % 128) / 32;
  const int g = lane / 4, c2 = (lane % 4) * 2;
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int r = warp * 16 + g + half * 8;  // row in the warpgroup's 64
    const std::int64_t row = static_cast<std::int64_t>(m0) + c * 64 + r;
#pragma unroll
    for (int j = 0; j < BN / 8; ++j) {
      const std::int64_t col = static_cast<std::int64_t>(n0) + j * 8 + c2;
      float2 v = make_float2(0.f, 0.f);
      if (row < M && col < N) v = epilogue_values(ep, N, row, col, acc[4 * j + 2 * half], acc[4 * j + 2 * half + 1]);
      const std::uint32_t at = boxes + static_cast<std::uint32_t>((j / 8) * kAtom + r * 128 + (((j % 8) ^ (r % 8)) * 16) + c2 * 2);
      st_shared_u32(at, pack2<bf16>(v.x, v.y));
    }
  }
  fence_proxy_async_shared();
  named_barrier_sync(2 + c, 128);
  if (threadIdx.x % 128 == 0) {
#pragma unroll
    for (int b = 0; b < BN / 64; ++b) tma_store(map_c, boxes + static_cast<std::uint32_t>(b * kAtom), n0 + 64 * b, m0 + 64 * c);
    tma_store_commit_and_wait_read();
  }
}

// store_tma (Kn::kTmaStore only): C is bf16 and map_c describes it (boxes of (64, 64), 128-byte
// swizzle); otherwise map_c is unused and the epilogue stores from registers. Split K (without
// clusters): block b computes split b / tiles of tile b % tiles, its warpgroups' rows two parts
// (split_k_handoff), summed and stored from registers.
template <class Kn, bool TransA, bool TransB, class Epi, class TC>
__global__ void __launch_bounds__(Kn::Threads, 1)
    wgmma_gemm_kernel(const __grid_constant__ CUtensorMap map_a, const __grid_constant__ CUtensorMap map_b,
                      const __grid_constant__ CUtensorMap map_c, bool store_tma, std::int64_t M, std::int64_t N,
                      std::int64_t K, EpilogueParams<TC, Epi> ep, SplitK split) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  constexpr int BM = Kn::BM, BN = Kn::BN, BK = Kn::BK, S = Kn::kStages, CL = Kn::kCluster;
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  const typename Kn::Ring ring(smem_raw);

  // A cluster of CL blocks computes CL vertically adjacent tiles (one column of tiles): rank r the
  // r-th. Past M (an odd tile count) a block still loads and shares its part of B and stores nothing.
  const int rank = CL > 1 ? static_cast<int>(cluster_rank()) : 0;
  const int columns_m = static_cast<int>(ceil_div(M, CL * BM)), columns = columns_m * static_cast<int>(ceil_div(N, BN));
  const int unit = static_cast<int>(blockIdx.x) / CL, column_index = unit % columns, split_index = unit / columns;
  const TileCoord column = grouped_tile(column_index, columns_m, columns / columns_m);  // in (CL·BM, BN) tiles
  const int m0 = (column.m * CL + rank) * BM, n0 = column.n * BN;  // < 2^31: supports()
  const int kps = split.k_per_split, kt0 = split_index * kps;  // this block's k-slabs (past K: zeros)
  const int wg = static_cast<int>(threadIdx.x) / 128;

  if (threadIdx.x == 0) {
    tma_prefetch(&map_a);
    tma_prefetch(&map_b);
    if (Kn::kTmaStore && store_tma) tma_prefetch(&map_c);
    ring.init_barriers(Kn::Consumers * CL);  // empty: one arrive per consumer warpgroup of the cluster
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
  }
  if constexpr (CL > 1) {
    cluster_sync();  // the other blocks' barriers exist before anything lands on them
  } else {
    __syncthreads();
  }

  if (wg == 0) {
    // Producer: one thread walks K, refilling each stage once its consumers have released it.
    setmaxnreg_dec<Kn::kProducerRegs>();
    if (threadIdx.x == 0) {
      for (int kt = 0; kt < kps; ++kt) {
        const int s = kt % S, k0 = (kt0 + kt) * BK;
        if (kt >= S) mbar_wait(ring.empty(s), static_cast<std::uint32_t>((kt / S - 1) & 1));
        mbar_expect_tx(ring.full(s), Kn::Ring::stage_bytes);  // boxes past the edges still count in full
        load_stage<BM, BN, TransA, TransB, CL>(&map_a, &map_b, ring.a(s), ring.b(s), ring.full(s), m0, n0, k0, rank);
      }
    }
  } else {
    // Consumer warpgroup c: rows [64c, 64c + 64) of the tile, all BN columns.
    setmaxnreg_inc<Kn::kConsumerRegs>();
    const int c = wg - 1;
    float acc[BN / 2];  // m64nBN fragment
#pragma unroll
    for (int i = 0; i < BN / 2; ++i) acc[i] = 0.f;

    for (int kt = 0; kt < kps; ++kt) {
      const int s = kt % S;
      mbar_wait(ring.full(s), static_cast<std::uint32_t>((kt / S) & 1));
      fence_operands(acc);
      wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < BK; kk += 16) {
        Wgmma<BN, TransA ? 1 : 0, TransB ? 0 : 1>::mma(acc, desc_a<TransA>(ring.a(s), c, kk),
                                                       desc_b<TransB>(ring.b(s), kk));
      }
      wgmma_commit();
      wgmma_wait<1>();  // the previous slab's wgmmas have retired: release it
      fence_operands(acc);
      if (kt > 0 && threadIdx.x % 128 == 0) {
        // Released in every block of the cluster: each block's producer refills B in all of them.
        if constexpr (CL > 1) {
#pragma unroll
          for (int r = 0; r < CL; ++r) mbar_arrive_cluster(ring.empty((kt - 1) % S), static_cast<std::uint32_t>(r));
        } else {
          mbar_arrive(ring.empty((kt - 1) % S));
        }
      }
    }
    wgmma_wait<0>();
    fence_operands(acc);

    // Fragment: acc[4j + e] is row 16·warp + g + 8·(e / 2), column 8j + 2t + e % 2.
    const int lane = static_cast<int>(threadIdx.x) % 32, warp = (static_cast<int>(threadIdx.x) % 128) / 32;
    const int g = lane / 4, c2 = (lane % 4) * 2;
    if constexpr (CL == 1) {
      if (split.splits > 1) {
        int* const last = reinterpret_cast<int*>(smem_raw + (ring.extra(0) - smem_addr(smem_raw))) + c;
        auto frag = [&](int, int q) { return make_float4(acc[4 * q], acc[4 * q + 1], acc[4 * q + 2], acc[4 * q + 3]); };
        auto emit4 = [&](int, int q, float4 v) {
          const std::int64_t row = static_cast<std::int64_t>(m0) + c * 64 + warp * 16 + g;
          const std::int64_t col = static_cast<std::int64_t>(n0) + q * 8 + c2;
          if (row < M) epilogue_pair(ep, N, row, col, v.x, v.y);
          if (row + 8 < M) epilogue_pair(ep, N, row + 8, col, v.z, v.w);
        };
        split_k_handoff<1, BN>(split, column_index * Kn::Consumers + c, split_index, 2 + c, last, frag, emit4);
        return;
      }
    }
    if constexpr (Kn::kTmaStore && std::is_same_v<TC, bf16>) {
      if (store_tma) {  // without clusters (Kernel's static_assert): nothing follows the epilogue
        staged_epilogue<Kn>(ring, &map_c, ep, M, N, m0, n0, c, acc);
        return;
      }
    }
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const std::int64_t row = static_cast<std::int64_t>(m0) + c * 64 + warp * 16 + g + half * 8;
      if (row >= M) continue;
#pragma unroll
      for (int j = 0; j < BN / 8; ++j)
        epilogue_pair(ep, N, row, static_cast<std::int64_t>(n0) + j * 8 + c2, acc[4 * j + 2 * half],
                      acc[4 * j + 2 * half + 1]);
    }
  }
  if constexpr (CL > 1) cluster_sync();  // no block leaves while another may still arrive on its barriers
#endif
}

// ---- the persistent ping-pong kernel ----
//
// One block per SM walks a list of work units (output tile × K split) with a stride of the grid.
// The producer streams the units' slabs through one ring of `Stages` slots; the two consumer
// warpgroups take the block's units in turn (local unit j goes to warpgroup j % 2), each computing
// a whole (BM, BN) tile. Their main loops alternate — warpgroup w starts unit j only once the
// other has issued all of unit j − 1's wgmmas (an "order" mbarrier per warpgroup) — so the tensor
// cores stay busy with one warpgroup's main loop while the other runs its epilogue. The order
// also keeps every wait on a "full" barrier at most one phase ahead of the barrier (a consumer
// never waits for a slot's fill n while fill n − 1 is still pending: its parity would alias).
//
// Split K (split_k_handoff): with `splits` > 1, unit u is split s = u / tiles of tile u % tiles,
// covering k-slabs [s·k_per_split, (s + 1)·k_per_split); a tile is one part.

template <class Tile, int Stages>
struct PingpongKernel {
  static constexpr int BM = Tile::M, BN = Tile::N, BK = Tile::K;
  static_assert(BK == 64, "a slab row is one 128-byte swizzle row: BK = 64 bf16");
  static_assert(BM % 64 == 0 && (BN == 128 || BN == 256), "BM: multiples of 64; BN: 128 or 256 (wgmma wrappers)");
  static constexpr int RowBlocks = BM / 64;  // m64 wgmmas per k16 step
  static_assert(RowBlocks * BN / 2 <= 128, "a consumer holds its whole tile: at most 128 fp32 accumulators a thread");
  static_assert(Stages >= 2, "a pipeline needs at least two stages");
  // Two consumer warpgroups (warps 0–7: a warpgroup's first warp must be a multiple of 4) and one
  // producer warp. A sub-partition's 16 Ki registers serve at most 3 of the 9 warps, so a thread
  // gets 168 — enough for 128 accumulators without setmaxnreg (ptxas: 166–168 used; no spills
  // with no epilogue or a bias beyond 8–40 bytes, but ~300 bytes with the GELU epilogue at 128×128
  // and ~500 at 64×256 — not yet measured or mended).
  static constexpr int Threads = 288, kProducer = 256;
  // Extra words: the two "order" mbarriers, and the consumers' two last-split flags (ints).
  using Ring = StageRing<BM, BN, Stages, 3>;
  static_assert(Ring::smem_bytes <= 227 * 1024, "the stages do not fit in an SM's shared memory");
  static constexpr int kStages = Stages;
};

template <class Kn, bool TransA, bool TransB, class Epi, class TC>
__global__ void __launch_bounds__(Kn::Threads, 1)
    wgmma_pingpong_kernel(const __grid_constant__ CUtensorMap map_a, const __grid_constant__ CUtensorMap map_b,
                          std::int64_t M, std::int64_t N, std::int64_t K, EpilogueParams<TC, Epi> ep, SplitK split) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  constexpr int BM = Kn::BM, BN = Kn::BN, BK = Kn::BK, S = Kn::kStages, RB = Kn::RowBlocks;
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  const typename Kn::Ring ring(smem_raw);
  auto order = [&](int c) { return ring.extra(c); };  // consumer c may start its next unit
  // Per consumer warpgroup: whether it finished a tile's last split (after the barriers).
  int* const last_split = reinterpret_cast<int*>(smem_raw + (ring.extra(2) - smem_addr(smem_raw)));

  const int tiles_m = static_cast<int>(ceil_div(M, BM)), tiles_n = static_cast<int>(ceil_div(N, BN));
  const int tiles = tiles_m * tiles_n, units = tiles * split.splits, kps = split.k_per_split;
  const int wg = static_cast<int>(threadIdx.x) / 128;

  if (threadIdx.x == 0) {
    tma_prefetch(&map_a);
    tma_prefetch(&map_b);
    ring.init_barriers(1);  // empty: the consuming warpgroup's release
    mbar_init(order(0), 1);
    mbar_init(order(1), 1);
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
  }
  __syncthreads();

  if (wg == 2) {
    // Producer: one thread fills ring position p = (local unit)·kps + k-slab, in unit order.
    if (threadIdx.x == Kn::kProducer) {
      int p = 0;
      for (int u = static_cast<int>(blockIdx.x); u < units; u += static_cast<int>(gridDim.x)) {
        const TileCoord tile = grouped_tile(u % tiles, tiles_m, tiles_n);
        const int m0 = tile.m * BM, n0 = tile.n * BN, kt0 = (u / tiles) * kps;
        for (int kt = 0; kt < kps; ++kt, ++p) {
          const int s = p % S, k0 = (kt0 + kt) * BK;  // slabs past K arrive as zeros
          if (p >= S) mbar_wait(ring.empty(s), static_cast<std::uint32_t>((p / S - 1) & 1));
          mbar_expect_tx(ring.full(s), Kn::Ring::stage_bytes);
          load_stage<BM, BN, TransA, TransB>(&map_a, &map_b, ring.a(s), ring.b(s), ring.full(s), m0, n0, k0);
        }
      }
    }
    return;
  }

  // Consumer warpgroup c: local units c, c + 2, c + 4, … of this block.
  const int c = wg, tid = static_cast<int>(threadIdx.x) % 128;
  const int lane = tid % 32, warp = tid / 32, g = lane / 4, c2 = (lane % 4) * 2;
  float acc[RB][BN / 2];  // RB m64nBN fragments
  for (int j = c, u = static_cast<int>(blockIdx.x) + c * static_cast<int>(gridDim.x); u < units;
       j += 2, u += 2 * static_cast<int>(gridDim.x)) {
    const int t = u % tiles, split_index = u / tiles;
    const TileCoord tile = grouped_tile(t, tiles_m, tiles_n);
    const int m0 = tile.m * BM, n0 = tile.n * BN;
#pragma unroll
    for (int r = 0; r < RB; ++r)
#pragma unroll
      for (int i = 0; i < BN / 2; ++i) acc[r][i] = 0.f;

    if (j > 0) mbar_wait(order(c), static_cast<std::uint32_t>(((j - 1) / 2) & 1));  // the other's turn is over
    for (int kt = 0; kt < kps; ++kt) {
      const int p = j * kps + kt, s = p % S;
      mbar_wait(ring.full(s), static_cast<std::uint32_t>((p / S) & 1));
#pragma unroll
      for (int r = 0; r < RB; ++r) fence_operands(acc[r]);
      wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < BK; kk += 16) {
        const std::uint64_t db = desc_b<TransB>(ring.b(s), kk);
#pragma unroll
        for (int r = 0; r < RB; ++r) Wgmma<BN, TransA ? 1 : 0, TransB ? 0 : 1>::mma(acc[r], desc_a<TransA>(ring.a(s), r, kk), db);
      }
      wgmma_commit();
      wgmma_wait<1>();  // the previous slab's wgmmas have retired: release it
#pragma unroll
      for (int r = 0; r < RB; ++r) fence_operands(acc[r]);
      if (kt > 0 && tid == 0) mbar_arrive(ring.empty((p - 1) % S));
    }
    if (tid == 0) mbar_arrive(order(1 - c));  // all of this unit's slabs are in: the other may start
    wgmma_wait<0>();
#pragma unroll
    for (int r = 0; r < RB; ++r) fence_operands(acc[r]);
    if (kps > 0 && tid == 0) mbar_arrive(ring.empty((j * kps + kps - 1) % S));

    // Output (row, col), (row, col + 1) from v.x, v.y and row + 8 from v.z, v.w: float4 q of row
    // block r of the fragment (acc[r][4q + e] is row 64r + 16·warp + g + 8·(e / 2), column
    // 8q + 2t + e % 2).
    auto epilogue4 = [&](int r, int q, float4 v) {
      const std::int64_t row = static_cast<std::int64_t>(m0) + r * 64 + warp * 16 + g;
      const std::int64_t col = static_cast<std::int64_t>(n0) + q * 8 + c2;
      if (row < M) epilogue_pair(ep, N, row, col, v.x, v.y);
      if (row + 8 < M) epilogue_pair(ep, N, row + 8, col, v.z, v.w);
    };

    auto frag = [&](int r, int q) {
      return make_float4(acc[r][4 * q], acc[r][4 * q + 1], acc[r][4 * q + 2], acc[r][4 * q + 3]);
    };
    if (split.splits > 1) {
      split_k_handoff<RB, BN>(split, t, split_index, 1 + c, last_split + c, frag, epilogue4);
      continue;
    }

#pragma unroll
    for (int r = 0; r < RB; ++r)
#pragma unroll
      for (int q = 0; q < BN / 8; ++q) epilogue4(r, q, frag(r, q));
  }
#endif
}

// Whether the device runs this build's sm_90a image (compute capability 9.0 and a build that
// includes 90a). The probe kernel's sm_90a image declares kProbeWords words of static shared
// memory and every other image none, so its attributes tell which image the device loaded —
// without a launch, an allocation or a synchronisation (safe inside stream capture). A device
// with no image for it at all fails the query, which also means no.
inline constexpr int kProbeWords = 1024;

template <int = 0>
__global__ void wgmma_probe_kernel(int* out) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  __shared__ int marker[kProbeWords];
  marker[threadIdx.x % kProbeWords] = static_cast<int>(threadIdx.x);
  __syncthreads();
  out[threadIdx.x] = marker[(threadIdx.x + 1) % kProbeWords];
#else
  (void)out;
#endif
}

inline bool wgmma_available() {
  static const bool available = [] {
    cudaFuncAttributes attr{};
    const bool ok = cudaFuncGetAttributes(&attr, &wgmma_probe_kernel<0>) == cudaSuccess &&
                    attr.sharedSizeBytes >= kProbeWords * sizeof(int);
    (void)cudaGetLastError();  // a failed query leaves nothing pending
    return ok;
  }();
  return available;
}

inline PFN_cuTensorMapEncodeTiled_v12000 encode_tiled() {
  static const PFN_cuTensorMapEncodeTiled_v12000 fn = [] {
    void* p = nullptr;
    cudaDriverEntryPointQueryResult found{};
    DPML_CHECK_CUDA(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &p, 12000, cudaEnableDefault, &found));
    DPML_REQUIRE(found == cudaDriverEntryPointSuccess && p != nullptr,
                 "wgmma GEMM: the driver has no cuTensorMapEncodeTiled (CUDA 12.0 or later needed)");
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(p);
  }();
  return fn;
}

// Tensor map of a row-major (rows, cols) bf16 matrix with row stride ld, read in boxes of
// (box_rows, box_cols = 64), 128-byte swizzled, zeros outside the matrix.
inline CUtensorMap tensor_map(const bf16* base, std::int64_t rows, std::int64_t cols, std::int64_t ld,
                              std::uint32_t box_rows, std::string_view operand) {
  CUtensorMap map;
  const cuuint64_t dims[2] = {static_cast<cuuint64_t>(cols > 0 ? cols : 1), static_cast<cuuint64_t>(rows > 0 ? rows : 1)};
  const cuuint64_t strides[1] = {static_cast<cuuint64_t>(ld) * sizeof(bf16)};
  const cuuint32_t box[2] = {64, box_rows}, elem_strides[2] = {1, 1};
  const CUresult rc = encode_tiled()(&map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, const_cast<bf16*>(base), dims, strides,
                                     box, elem_strides, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                                     CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  DPML_REQUIRE(rc == CUDA_SUCCESS, "wgmma GEMM: cuTensorMapEncodeTiled failed (CUresult " << static_cast<int>(rc)
                                       << ") for operand " << operand << " (" << rows << ", " << cols
                                       << ") with row stride " << ld);
  return map;
}

}  // namespace detail::wgmma

// Schedules of WgmmaGemm: how blocks and warpgroups share the work.
namespace wgmma_schedule {
// One (BM, BN) tile per block, its two consumer warpgroups splitting the rows (BM = 128).
struct Cooperative {
  static constexpr std::string_view name = "cooperative";
  static constexpr int cluster = 1;
  static constexpr bool tma_store = false;
};
// Cooperative, with the epilogue staged: each consumer warpgroup writes its bf16 outputs into
// shared memory and the copy engine stores the tile (TMA), so the block leaves once the engine has
// read it and the writes drain under the next block's first loads (bf16 C with a 16-byte row
// stride; other outputs take the register epilogue).
struct CooperativeTmaStore {
  static constexpr std::string_view name = "cooperative-tma-store";
  static constexpr int cluster = 1;
  static constexpr bool tma_store = true;
};
// Cooperative, with blocks paired in 2×1 thread-block clusters over vertically adjacent tiles: the
// pair shares its B slabs, each block copying half of every slab into both (TMA multicast), so a
// block reads (BM + BN/2)·64 elements per slab from L2 instead of (BM + BN)·64.
struct CooperativeMulticast {
  static constexpr std::string_view name = "cooperative-multicast";
  static constexpr int cluster = 2;
  static constexpr bool tma_store = false;
};
// A persistent block per SM; each consumer warpgroup computes whole (BM, BN) tiles, in turn with
// the other, and small tile counts are split along K (PingpongKernel above).
struct Pingpong {
  static constexpr std::string_view name = "pingpong";
  static constexpr int cluster = 1;
  static constexpr bool tma_store = false;
};
}  // namespace wgmma_schedule

template <class Tile, int Stages, class Schedule = wgmma_schedule::Pingpong>
struct WgmmaGemm {
  static constexpr std::string_view name = "wgmma";
  using tile = Tile;
  using schedule = Schedule;
  static constexpr bool persistent = std::is_same_v<Schedule, wgmma_schedule::Pingpong>;

  // TMA: 16-byte aligned operands with row strides that are multiples of 16 bytes; paired stores
  // into C; int32 tile coordinates; and an sm_90a image on a compute capability 9.0 device.
  template <class TC>
  static bool supports(const GemmArgs<TC>& g) {
    return layout_ok(g) && detail::wgmma::wgmma_available();
  }

  // splits: K splits per tile, 0 for split_count's choice (a forced count is for tuning sweeps:
  // bench_gemm --splits); in clusters always 1, and never more than K's slabs of 64.
  template <GemmEpilogue Epi, class TC>
  static void run(KernelContext& ctx, const GemmArgs<TC>& g, cudaStream_t stream, int splits = 0) {
    detail::check_gemm_args<Epi>(g, name);
    DPML_REQUIRE(splits >= 0, "wgmma GEMM: a split count of " << splits << " (0 picks one)");
    detail::require_vector_rows(layout_ok(g), g, name);
    DPML_REQUIRE(detail::wgmma::wgmma_available(),
                 "wgmma GEMM: this build has no sm_90a image for the device (build with "
                 "CMAKE_CUDA_ARCHITECTURES=90a and run on a compute capability 9.0 GPU)");
    if (g.M == 0 || g.N == 0) return;
    splits = splits_used(g.M, g.N, g.K, ctx.sm_count(), splits);
    detail::with_transposes(g, [&]<bool TA, bool TB>() { launch<TA, TB, Epi>(ctx, g, stream, splits); });
  }
  // The K splits per tile that run() uses when asked for `forced` (0: split_count's choice; in
  // clusters always that; never more than K's slabs of 64, never fewer than 1).
  static int splits_used(std::int64_t M, std::int64_t N, std::int64_t K, int sms, int forced) {
    const int s = forced == 0 || Schedule::cluster > 1 ? split_count(M, N, K, sms) : forced;
    return static_cast<int>(std::clamp<std::int64_t>(s, 1, std::max<std::int64_t>(ceil_div(K, Tile::K), 1)));
  }

  // K splits per tile on a device of `sms` SMs (one block per SM: the stages fill its shared
  // memory): the count that minimises a cost in slab times (one slab: BM×BN×64 of wgmma) —
  //   ceil(tiles·splits / sms) · (ceil(k_slabs / splits) + fill + store) + splits · sum,
  // store and sum only when split — with at least 4 slabs a split. fill = 10 per block of the
  // non-persistent grid (pipeline fill and epilogue), 0 for the persistent one; store = 8 (writing
  // a partial tile) and sum = 1 (reading one back) at 128×128, in proportion to the tile's area.
  // The constants are a least-squares fit to a sweep of forced splits on an H100 (bench_gemm
  // --splits, bench/RESULTS.md, 2026-11-26); on the five backward_weight shapes of GPT-2 and three
  // schedules the count picked ran within 4 % of the best one measured. 1 in clusters (multicast
  // pairs are not split).
  static int split_count(std::int64_t M, std::int64_t N, std::int64_t K, int sms) {
    if constexpr (Schedule::cluster > 1) {
      return 1;
    } else {
      const std::int64_t tiles = ceil_div(M, Tile::M) * ceil_div(N, Tile::N), slabs = ceil_div(K, Tile::K);
      if (slabs == 0) return 1;
      constexpr double area = Tile::M * Tile::N / (128.0 * 128.0);
      constexpr double fill = persistent ? 0 : 10, store = 8 * area, sum = 1 * area;
      auto cost = [&](std::int64_t s) {
        const double waves = static_cast<double>(ceil_div(tiles * s, sms)), run = static_cast<double>(ceil_div(slabs, s));
        return s == 1 ? waves * (run + fill) : waves * (run + fill + store) + s * sum;
      };
      std::int64_t best = 1;
      for (std::int64_t s = 2; s <= 16 && slabs / s >= 4; ++s)
        if (cost(s) < cost(best)) best = s;
      return static_cast<int>(ceil_div(slabs, ceil_div(slabs, best)));  // no split left empty
    }
  }

 private:
  template <class TC>
  static bool layout_ok(const GemmArgs<TC>& g) {
    constexpr std::int64_t kMax = std::int64_t{1} << 31;  // TMA takes int32 coordinates
    return detail::vector_rows<Tile::M, Tile::N>(g) && g.M + Tile::M < kMax && g.N + Tile::N < kMax && g.K < kMax;
  }

  template <bool TA, bool TB, class Epi, class TC>
  static void launch(KernelContext& ctx, const GemmArgs<TC>& g, cudaStream_t stream, int splits) {
    using Kn = std::conditional_t<persistent, detail::wgmma::PingpongKernel<Tile, Stages>,
                                  detail::wgmma::Kernel<Tile, Stages, TA, TB, Schedule::cluster, Schedule::tma_store>>;
    using detail::wgmma::tensor_map;
    const detail::EpilogueParams<TC, Epi> ep{g.C, g.ldc, g.alpha, g.beta, g.bias, g.pre_gelu};
    // A stored (K, M) when transposed, else (M, K); B stored (N, K) when transposed, else (K, N).
    // K-major slabs take one box of all their rows; MN-major ones boxes of 64 k-rows.
    const CUtensorMap map_a = TA ? tensor_map(g.A, g.K, g.M, g.lda, Kn::BK, "A")
                                 : tensor_map(g.A, g.M, g.K, g.lda, Kn::BM, "A");
    const CUtensorMap map_b = TB ? tensor_map(g.B, g.N, g.K, g.ldb, Kn::BN / Schedule::cluster, "B")
                                 : tensor_map(g.B, g.K, g.N, g.ldb, Kn::BK, "B");
    // Split K's scratch: each tile's splits·BM·BN partial sums, a counter per part (a tile in the
    // ping-pong kernel, a consumer's 64 rows of it in the cooperative one).
    const std::int64_t tiles = ceil_div(g.M, Tile::M) * ceil_div(g.N, Tile::N);
    DPML_REQUIRE(tiles * splits < (std::int64_t{1} << 31), "wgmma GEMM: too many tiles");
    detail::wgmma::SplitK split{splits, static_cast<int>(ceil_div(ceil_div(g.K, Tile::K), splits)), nullptr, nullptr};
    if (splits > 1) {
      const std::int64_t parts = persistent ? tiles : tiles * (Tile::M / 64);
      const auto scratch = ctx.split_scratch(static_cast<std::size_t>(tiles * splits * Tile::M * Tile::N),
                                             static_cast<std::size_t>(parts));
      split.partials = scratch.partials;
      split.arrivals = scratch.arrivals;
    }
    if constexpr (persistent) {
      constexpr auto kernel = &detail::wgmma::wgmma_pingpong_kernel<Kn, TA, TB, Epi, TC>;
      opt_in<kernel>(Kn::Ring::smem_bytes);
      const auto blocks = static_cast<unsigned>(std::min<std::int64_t>(tiles * splits, ctx.sm_count()));
      kernel<<<blocks, Kn::Threads, Kn::Ring::smem_bytes, stream>>>(map_a, map_b, g.M, g.N, g.K, ep, split);
    } else {
      constexpr auto kernel = &detail::wgmma::wgmma_gemm_kernel<Kn, TA, TB, Epi, TC>;
      opt_in<kernel>(Kn::Ring::smem_bytes);
      constexpr int kCluster = Schedule::cluster;
      const auto blocks =
          static_cast<unsigned>(kCluster * ceil_div(g.M, kCluster * Tile::M) * ceil_div(g.N, Tile::N) * splits);
      // The staged epilogue's tensor map of C: bf16, 16-byte aligned, rows a multiple of 16 bytes
      // apart, and N a multiple of 8 — the copy engine clips a store at N in 16-byte steps (on an
      // H200 it wrote columns [N, N rounded up to 8) where N = 75 and 300), so a ragged N takes
      // the register epilogue.
      bool store_tma = false;
      CUtensorMap map_c = map_a;  // unused unless store_tma
      if constexpr (Schedule::tma_store && std::is_same_v<TC, bf16>) {
        store_tma = g.N % 8 == 0 && g.ldc % 8 == 0 && reinterpret_cast<std::uintptr_t>(g.C) % 16 == 0;
        if (store_tma) map_c = tensor_map(g.C, g.M, g.N, g.ldc, 64, "C");
      }
      if constexpr (kCluster == 1) {
        kernel<<<blocks, Kn::Threads, Kn::Ring::smem_bytes, stream>>>(map_a, map_b, map_c, store_tma, g.M, g.N, g.K, ep,
                                                                      split);
      } else {
        cudaLaunchAttribute cluster{};
        cluster.id = cudaLaunchAttributeClusterDimension;
        cluster.val.clusterDim.x = kCluster;
        cluster.val.clusterDim.y = cluster.val.clusterDim.z = 1;
        cudaLaunchConfig_t config{};
        config.gridDim = dim3(blocks);
        config.blockDim = dim3(Kn::Threads);
        config.dynamicSmemBytes = Kn::Ring::smem_bytes;
        config.stream = stream;
        config.attrs = &cluster;
        config.numAttrs = 1;
        DPML_CHECK_CUDA(cudaLaunchKernelEx(&config, kernel, map_a, map_b, map_c, store_tma, g.M, g.N, g.K, ep, split));
      }
    }
    DPML_CHECK_LAUNCH();
  }

  // Kernels above 48 KiB of dynamic shared memory must say so, once per kernel.
  template <auto kernel>
  static void opt_in(std::size_t bytes) {
    static const bool done = [&] {
      DPML_CHECK_CUDA(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes)));
      return true;
    }();
    (void)done;
  }
};

}  // namespace dpml::kernels::cuda
