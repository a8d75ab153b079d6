#pragma once
// Conv2d over NHWC (channels-last) bf16 tensors as an implicit GEMM on tensor cores: the im2col
// matrix is never stored; the shared-memory loader gathers it, 16 bytes (8 channels) per cp.async.
//
//   x (N, H, W, Cin), w (Cout, kh, kw, Cin), y and dy (N, Ho, Wo, Cout), taps K = kh·kw·Cin
//   forward          y  (N·Ho·Wo, Cout)  = im2col(x) (N·Ho·Wo, K) · wᵀ (K, Cout)  (+ bias (Cout))
//   backward_input   dx (N·H·W, Cin)     = the transposed convolution of dy with w, one GEMM per
//                                          stride phase (below); every dx element written once
//   backward_weight  dw (Cout, K) fp32   = dyᵀ (Cout, N·Ho·Wo) · im2col(x) + beta·dw
//
// The trick, in four parts:
//  * One main loop for the three passes (mainloop() below): the mma.sync block tile
//    (gemm/block_tile.hpp: block and warp tiles, shared-memory slab layout, ldmatrix into
//    mma.sync.m16n8k16, bf16 in, fp32 accumulate) under a multi-stage cp.async pipeline, and the
//    GEMM epilogue (gemm/epilogue.hpp).
//    Only the loaders differ: a pass says how a slab row is found, not how it is multiplied.
//  * Gathers. A row of im2col(x) is an output pixel, a column a tap (i, j, c); the 8 columns of a
//    16-byte chunk share (i, j) when Cin % 8 == 0, so a chunk is one contiguous 16-byte piece of x
//    (or of dy in backward_input). A chunk that falls into the zero padding, or past the matrix,
//    is a cp.async with source size 0: shared memory is zero-filled, nothing is read. A thread
//    loads the same slab rows and column in every k-tile, so what stays fixed (the pixel of an
//    im2col row in forward and backward_input, the tap of a column in backward_weight) is decoded
//    once per block, the rest once per k-tile.
//  * Stride phases in backward_input. dx[h, w] receives dy[ho, wo]·w[i, j] only where
//    ho·s − p + i = h, i.e. i ≡ h + p (mod s). Splitting dx by (h mod s, w mod s) makes each phase
//    a plain gather GEMM over the taps of its residue class — no divisibility test per element and
//    no multiply-by-zero (for stride 2, a 1×1 conv's odd phases have no taps at all: their dx rows
//    are written as zeros by the epilogue). The phases are blockIdx.y; their dx rows interleave.
//  * Split-K in backward_weight, deterministic. dw has few tiles (Cout × K) and a long reduction
//    (N·Ho·Wo), so the reduction is cut into contiguous ranges of k-tiles (blockIdx.y); each writes
//    its fp32 partial (Cout, K) to scratch and a second kernel adds them in split order (no float
//    atomics, so the same shape gives the same bits). With one split the GEMM writes dw directly.
//
// Channels: when the channel counts a pass reads in chunks are multiples of 8 (forward: Cin; the
// backward passes: Cin and Cout) and its input tensors are 16-byte aligned, every load is a
// 16-byte cp.async; otherwise (e.g. the RGB stem, Cin = 3) a scalar fallback of the same kernels
// loads element by element (synchronous loads, still zero-filled at the edges), and the epilogue
// stores single elements where the output's rows are odd. Index arithmetic is 32-bit inside an
// image and a GEMM (sizes are checked against 2³¹), 64-bit for addresses.
//
// The conv bias gradient is a column sum of dy (N·Ho·Wo, Cout): bias_grad_rows (elementwise.hpp).
// Launchers take the stream and never synchronise.

#include "dpml/core/bf16.hpp"
#include "dpml/core/cuda_error.hpp"
#include "dpml/core/error.hpp"
#include "dpml/kernels/cuda/common.hpp"
#include "dpml/kernels/cuda/gemm/block_tile.hpp"
#include "dpml/kernels/cuda/gemm/epilogue.hpp"
#include "dpml/kernels/cuda/gemm/gemm.hpp"
#include "dpml/kernels/cuda/mma.hpp"
#include "dpml/kernels/host/conv.hpp"

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <utility>

namespace dpml::kernels::cuda {

// Tiles and pipeline of the convolution kernels, and the split-K targets of backward_weight: the
// tiled GEMM's (bench/gemm) slab depth and warp tile, with BN = 64 because ResNet's narrowest
// layers have 64 channels; the split count aims at two waves on an H100's 132 SMs while giving
// each split at least 8 k-tiles (256 pixels) of work. Chosen before any GPU run and not tuned since: on an H100 this
// policy runs ResNet-50's convolutions at 0.34 of cuDNN's speed per step (bench/RESULTS.md,
// "Convolutions: ours against cuDNN"), so resnet_train defaults to CudnnConv where cuDNN is found.
template <class Tile_, class Warp_, int Stages_, int WgradTargetBlocks_ = 264, int WgradMinKTiles_ = 8>
struct ConvPolicy {
  using Tile = Tile_;
  using Warp = Warp_;
  static constexpr int stages = Stages_;
  static constexpr int wgrad_target_blocks = WgradTargetBlocks_;
  static constexpr int wgrad_min_k_tiles = WgradMinKTiles_;
};
using DefaultConvPolicy = ConvPolicy<TileShape<128, 64, 32>, WarpTile<64, 32>, 4>;

// A convolution's sizes: x (N, H, W, Cin) with Cin = in.C, w (Cout, kh, kw, Cin).
struct Conv2dShape {
  std::int64_t N = 0, Cout = 0;
  host::ConvGeometry in{};  // C (= Cin), H, W, kh, kw, stride, pad
  std::int64_t out_h() const noexcept { return in.out_h(); }
  std::int64_t out_w() const noexcept { return in.out_w(); }
  std::int64_t pixels() const noexcept { return N * out_h() * out_w(); }  // rows of y
  std::int64_t taps() const noexcept { return in.kh * in.kw * in.C; }     // K: a row of w
};

namespace detail::conv {

// The shape in 32-bit ints (checked by check_shape), as the kernels read it.
struct Geo {
  int N, H, W, Ci, Co, kh, kw, s, p, Ho, Wo;
};

// Thread → 16-byte chunks of a slab S filled by Threads threads: a thread keeps one column (8
// elements) and `count` rows, the same in every k-tile.
template <class S, int Threads>
struct Chunks {
  static constexpr int per_row = S::cols / 8, rows_per_pass = Threads / per_row, count = S::chunks / Threads;
  static_assert(S::cols % 8 == 0 && Threads % per_row == 0 && S::chunks % Threads == 0,
                "a slab must split into whole 16-byte chunks, the same number per thread");
  __device__ static int col() { return static_cast<int>(threadIdx.x) % per_row * 8; }
  __device__ static int row(int it) { return static_cast<int>(threadIdx.x) / per_row + it * rows_per_pass; }
  __device__ static bf16* dst(bf16* slab, int it) { return slab + row(it) * S::stride + col(); }
};

// 8 bf16 bit patterns → one 16-byte shared-memory store (the scalar path's chunk).
__device__ __forceinline__ void store_chunk(bf16* dst, const std::uint16_t (&v)[8]) {
  uint4 u;
  u.x = v[0] | (static_cast<unsigned>(v[1]) << 16);
  u.y = v[2] | (static_cast<unsigned>(v[3]) << 16);
  u.z = v[4] | (static_cast<unsigned>(v[5]) << 16);
  u.w = v[6] | (static_cast<unsigned>(v[7]) << 16);
  *reinterpret_cast<uint4*>(dst) = u;
}

// Fills slab S from a row-contiguous operand: slab row r is the global row at row_ptr(r) (nullptr:
// a row past the matrix, zeros), columns [c0, c0 + S::cols) of `cols`. Vec: 16-byte cp.async
// (rows 16-byte aligned, cols % 8 == 0); otherwise element loads.
template <class S, int Threads, bool Vec, class RowPtr>
__device__ __forceinline__ void load_rows(bf16* slab, RowPtr row_ptr, int c0, int cols, const bf16* any) {
  using P = Chunks<S, Threads>;
  const int c = c0 + P::col();
#pragma unroll
  for (int it = 0; it < P::count; ++it) {
    const bf16* row = row_ptr(P::row(it));
    if constexpr (Vec) {
      const bool ok = row != nullptr && c < cols;
      cp_async_16(P::dst(slab, it), ok ? row + c : any, ok ? 16 : 0);
    } else {
      std::uint16_t v[8];
#pragma unroll
      for (int e = 0; e < 8; ++e) v[e] = row != nullptr && c + e < cols ? row[c + e].bits : 0;
      store_chunk(P::dst(slab, it), v);
    }
  }
}

// An implicit gather matrix G (rows, cols) over an NHWC source (images, H, W, C):
//   row m = (n, a, b), a < per_h, b < per_w, is centred at (a·step + off_h, b·step + off_w) of image n
//   column k = (i, j, c), j < taps_w, c < C, is the tap at offset (sign·i, sign·j), channel c
//   G(m, k) = src[n, centre + offset, c], 0 outside the image.
// im2col(x) of a convolution: centre = (ho·s − p, wo·s − p), sign +1. backward_input's gather of
// dy: centre = the phase position's (a + dh, b + dw), sign −1 (ho = a + dh − ii).
struct Gather {
  const bf16* src;
  int H, W, C;
  int rows, per_h, per_w, step, off_h, off_w;
  int cols, taps_w, sign;
};
struct Pixel {
  const bf16* img;  // image n of src; nullptr: a row past the matrix
  int h, w;         // the centre
};
struct Tap {
  int dh, dw, c;  // c < 0: a column past the matrix
};

__device__ __forceinline__ Pixel pixel(const Gather& G, int m) {
  if (m >= G.rows) return {nullptr, 0, 0};
  const int per_img = G.per_h * G.per_w, n = m / per_img, r = m - n * per_img, a = r / G.per_w, b = r - a * G.per_w;
  return {G.src + static_cast<std::int64_t>(n) * G.H * G.W * G.C, a * G.step + G.off_h, b * G.step + G.off_w};
}
__device__ __forceinline__ Tap tap(const Gather& G, int k) {
  if (k >= G.cols) return {0, 0, -1};
  const int row = G.taps_w * G.C, i = k / row, r = k - i * row, j = r / G.C;
  return {G.sign * i, G.sign * j, r - j * G.C};
}
// The element G(pixel, tap), or nullptr where it is a zero.
__device__ __forceinline__ const bf16* element(const Gather& G, const Pixel& p, const Tap& t) {
  const int h = p.h + t.dh, w = p.w + t.dw;
  if (p.img == nullptr || t.c < 0 || h < 0 || h >= G.H || w < 0 || w >= G.W) return nullptr;
  return p.img + (static_cast<std::int64_t>(h) * G.W + w) * G.C + t.c;
}
// One chunk G(p, k .. k + 7): a 16-byte cp.async (C % 8 == 0, so the 8 columns share their tap)…
__device__ __forceinline__ void gather16(bf16* dst, const Gather& G, const Pixel& p, const Tap& t) {
  const bf16* e = element(G, p, t);
  cp_async_16(dst, e != nullptr ? e : G.src, e != nullptr ? 16 : 0);
}
// … or 8 element loads, each with its own tap.
__device__ __forceinline__ void gather8(bf16* dst, const Gather& G, const Pixel& p, int k) {
  std::uint16_t v[8];
#pragma unroll
  for (int e = 0; e < 8; ++e) {
    const bf16* s = element(G, p, tap(G, k + e));
    v[e] = s != nullptr ? s->bits : 0;
  }
  store_chunk(dst, v);
}
// An A slab (BM pixels, BK taps) of G: this thread's rows are the pixels px, its column tap k.
template <class PA, bool Vec>
__device__ __forceinline__ void gather_rows(bf16* slab, const Gather& G, const Pixel (&px)[PA::count], int k) {
  if constexpr (Vec) {
    const Tap t = tap(G, k);  // shared by the thread's rows
#pragma unroll
    for (int it = 0; it < PA::count; ++it) gather16(PA::dst(slab, it), G, px[it], t);
  } else {
#pragma unroll
    for (int it = 0; it < PA::count; ++it) gather8(PA::dst(slab, it), G, px[it], k);
  }
}

// The block and warp layout of the policy's tile (gemm/block_tile.hpp).
template <class Pol, bool TransA, bool TransB>
using Layout = tiled::BlockLayout<typename Pol::Tile, typename Pol::Warp, Pol::stages, TransA, TransB>;
template <class Pol, bool TransA, bool TransB>
using Accumulators = float[Layout<Pol, TransA, TransB>::MI][Layout<Pol, TransA, TransB>::NI][4];  // (MI, NI) m16n8

// acc += the product of k-tiles [kt0, kt1): load(slab_a, slab_b, kt) fills one stage (cp.async or
// plain stores), the warps multiply the stage that has landed. A is (BM, BK) or, TransA, (BK, BM)
// in shared memory; B is (BK, BN) or, TransB, (BN, BK).
template <class Pol, bool TransA, bool TransB, class Load>
__device__ __forceinline__ void mainloop(Accumulators<Pol, TransA, TransB>& acc, bf16* smem, int kt0, int kt1,
                                         Load&& load) {
  using Kn = Layout<Pol, TransA, TransB>;
  using SlabA = typename Kn::SlabA;
  using SlabB = typename Kn::SlabB;
  constexpr int Stages = Pol::stages;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int wm0 = (warp / Kn::WarpsN) * Kn::WM, wn0 = (warp % Kn::WarpsN) * Kn::WN;
  auto slab_a = [&](int s) { return smem + s * Kn::stage_elems; };
  auto slab_b = [&](int s) { return smem + s * Kn::stage_elems + SlabA::elems; };

  const int n = kt1 - kt0;
#pragma unroll
  for (int s = 0; s < Stages - 1; ++s) {
    if (s < n) load(slab_a(s), slab_b(s), kt0 + s);
    cp_async_commit();
  }
  for (int t = 0; t < n; ++t) {
    cp_async_wait<Stages - 2>();
    __syncthreads();  // k-tile t has landed for everyone; k-tile t − 1's readers are done
    const int next = t + Stages - 1;
    if (next < n) load(slab_a(next % Stages), slab_b(next % Stages), kt0 + next);
    cp_async_commit();

    const bf16* As = slab_a(t % Stages);
    const bf16* Bs = slab_b(t % Stages);
    tiled::multiply_slabs<SlabA, SlabB, Kn::BK, TransA, TransB>(acc, As, Bs, wm0, wn0, lane);
  }
  cp_async_wait<0>();
}

// The epilogue of a (BM, BN) tile at (m0, n0) of an (M, N) GEMM: GEMM row m goes to row
// out_row(m) of C. `paired`: C's rows allow paired stores (even ldc, C aligned to two elements);
// otherwise each element is stored alone (epilogue_pair with N = col + 1 stores just col).
template <class Pol, bool TransA, bool TransB, class Epi, class TC, class OutRow>
__device__ __forceinline__ void store_tile(const Accumulators<Pol, TransA, TransB>& acc,
                                           const EpilogueParams<TC, Epi>& ep, bool paired, int M, int N, int m0, int n0,
                                           OutRow out_row) {
  using Kn = Layout<Pol, TransA, TransB>;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int wm0 = (warp / Kn::WarpsN) * Kn::WM, wn0 = (warp % Kn::WarpsN) * Kn::WN;
  // Accumulator (mi, nj) element e sits at row g + 8·(e/2), column 2·(lane%4) + e%2, g = lane/4.
  const int g = lane / 4, c2 = (lane % 4) * 2;
#pragma unroll
  for (int mi = 0; mi < Kn::MI; ++mi)
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int m = m0 + wm0 + mi * 16 + g + half * 8;
      if (m >= M) continue;
      const std::int64_t row = out_row(m);
#pragma unroll
      for (int nj = 0; nj < Kn::NI; ++nj) {
        const int col = n0 + wn0 + nj * 8 + c2;
        const float v0 = acc[mi][nj][half * 2], v1 = acc[mi][nj][half * 2 + 1];
        if (paired) {
          epilogue_pair(ep, N, row, col, v0, v1);
        } else {
          if (col < N) epilogue_pair(ep, std::int64_t{col} + 1, row, col, v0, 0.f);
          if (col + 1 < N) epilogue_pair(ep, std::int64_t{col} + 2, row, col + 1, v1, 0.f);
        }
      }
    }
}

template <class Pol, bool TransA, bool TransB>
inline constexpr int kThreads = Layout<Pol, TransA, TransB>::Threads;

// ---- forward: y (M = N·Ho·Wo, Cout) = im2col(x) (M, K) · wᵀ, w stored (Cout, K) ----
template <class Pol, bool Vec, class Epi>
__global__ void __launch_bounds__(kThreads<Pol, false, true>)
    fprop_kernel(Gather A, const bf16* __restrict__ w, int Cout, EpilogueParams<bf16, Epi> ep, bool paired) {
  using Kn = Layout<Pol, false, true>;
  using PA = Chunks<typename Kn::SlabA, Kn::Threads>;
  extern __shared__ uint4 smem_raw[];
  const int M = A.rows, K = A.cols;
  const TileCoord tile = grouped_tile(static_cast<int>(blockIdx.x), static_cast<int>(ceil_div(M, Kn::BM)),
                                      static_cast<int>(ceil_div(Cout, Kn::BN)));
  const int m0 = tile.m * Kn::BM, n0 = tile.n * Kn::BN;
  Pixel px[PA::count];  // this thread's slab rows: output pixels, fixed for the whole K loop
#pragma unroll
  for (int it = 0; it < PA::count; ++it) px[it] = pixel(A, m0 + PA::row(it));

  auto w_row = [&](int r) -> const bf16* {  // row n0 + r of w (Cout, K)
    const int co = n0 + r;
    return co < Cout ? w + static_cast<std::int64_t>(co) * K : nullptr;
  };
  float acc[Kn::MI][Kn::NI][4] = {};
  mainloop<Pol, false, true>(acc, reinterpret_cast<bf16*>(smem_raw), 0, static_cast<int>(ceil_div(K, Kn::BK)),
                             [&](bf16* sa, bf16* sb, int kt) {
                               const int k0 = kt * Kn::BK;
                               gather_rows<PA, Vec>(sa, A, px, k0 + PA::col());                     // (BM, BK)
                               load_rows<typename Kn::SlabB, Kn::Threads, Vec>(sb, w_row, k0, K, w);  // (BN, BK)
                             });
  store_tile<Pol, false, true>(acc, ep, paired, M, Cout, m0, n0, [](int m) { return std::int64_t{m}; });
}

// ---- backward_input, one stride phase (ph, pw) = (blockIdx.y / s, blockIdx.y % s) ----
// dx positions (ph + s·a, pw + s·b), a < Hp, b < Wp, receive the taps i = i0 + s·ii (ii < ki),
// j = j0 + s·jj (jj < kj), from dy[a + dh − ii, b + dw − jj]: i0 ≡ ph + p (mod s), dh = (ph + p − i0) / s.
struct Phase {
  int ph, pw, Hp, Wp, i0, j0, ki, kj, dh, dw;
};
DPML_HD inline Phase phase_of(const Geo& g, int idx) {
  Phase f{};
  f.ph = idx / g.s;
  f.pw = idx % g.s;
  f.Hp = (g.H - f.ph + g.s - 1) / g.s;  // 0 when the phase lies past a small image
  f.Wp = (g.W - f.pw + g.s - 1) / g.s;
  f.i0 = (f.ph + g.p) % g.s;
  f.j0 = (f.pw + g.p) % g.s;
  f.ki = f.i0 < g.kh ? (g.kh - f.i0 + g.s - 1) / g.s : 0;
  f.kj = f.j0 < g.kw ? (g.kw - f.j0 + g.s - 1) / g.s : 0;
  f.dh = (f.ph + g.p - f.i0) / g.s;
  f.dw = (f.pw + g.p - f.j0) / g.s;
  return f;
}

//   A (M = N·Hp·Wp, K = ki·kj·Cout): the gather of dy;  B (K, Cin): rows (co, i, j) of w (Cout·kh·kw, Cin)
template <class Pol, bool Vec>
__global__ void __launch_bounds__(kThreads<Pol, false, false>)
    dgrad_kernel(Geo g, const bf16* __restrict__ dy, const bf16* __restrict__ w,
                 EpilogueParams<bf16, epilogue::None> ep, bool paired) {
  using Kn = Layout<Pol, false, false>;
  using PA = Chunks<typename Kn::SlabA, Kn::Threads>;
  extern __shared__ uint4 smem_raw[];
  const Phase f = phase_of(g, static_cast<int>(blockIdx.y));
  const Gather A{.src = dy, .H = g.Ho, .W = g.Wo, .C = g.Co,
                 .rows = g.N * f.Hp * f.Wp, .per_h = f.Hp, .per_w = f.Wp, .step = 1, .off_h = f.dh, .off_w = f.dw,
                 .cols = f.ki * f.kj * g.Co, .taps_w = f.kj, .sign = -1};
  const int M = A.rows, K = A.cols, tiles_m = static_cast<int>(ceil_div(M, Kn::BM)),
            tiles_n = static_cast<int>(ceil_div(g.Ci, Kn::BN));
  if (static_cast<int>(blockIdx.x) >= tiles_m * tiles_n) return;  // the grid is sized for phase 0, the largest
  const TileCoord tile = grouped_tile(static_cast<int>(blockIdx.x), tiles_m, tiles_n);
  const int m0 = tile.m * Kn::BM, n0 = tile.n * Kn::BN;
  Pixel px[PA::count];
#pragma unroll
  for (int it = 0; it < PA::count; ++it) px[it] = pixel(A, m0 + PA::row(it));

  int k0 = 0;
  auto w_row = [&](int r) -> const bf16* {  // the row of w (Cout·kh·kw, Cin) of phase tap k = (ii, jj, co)
    const int k = k0 + r;
    if (k >= K) return nullptr;
    const int per = f.kj * g.Co, ii = k / per, rem = k - ii * per, jj = rem / g.Co, co = rem - jj * g.Co;
    return w + static_cast<std::int64_t>((co * g.kh + f.i0 + g.s * ii) * g.kw + f.j0 + g.s * jj) * g.Ci;
  };
  float acc[Kn::MI][Kn::NI][4] = {};
  mainloop<Pol, false, false>(acc, reinterpret_cast<bf16*>(smem_raw), 0, static_cast<int>(ceil_div(K, Kn::BK)),
                              [&](bf16* sa, bf16* sb, int kt) {
                                k0 = kt * Kn::BK;
                                gather_rows<PA, Vec>(sa, A, px, k0 + PA::col());                       // (BM, BK)
                                load_rows<typename Kn::SlabB, Kn::Threads, Vec>(sb, w_row, n0, g.Ci, w);  // (BK, BN)
                              });
  store_tile<Pol, false, false>(acc, ep, paired, M, g.Ci, m0, n0, [&](int m) {
    const int per_img = f.Hp * f.Wp, n = m / per_img, r = m - n * per_img, a = r / f.Wp, b = r - a * f.Wp;
    return (static_cast<std::int64_t>(n) * g.H + f.ph + g.s * a) * g.W + f.pw + g.s * b;  // row of dx (N·H·W, Cin)
  });
}

// ---- backward_weight: dw (Cout, K) = dyᵀ (Cout, P) · im2col(x) (P, K), P = N·Ho·Wo ----
// Split blockIdx.y takes k-tiles [y·per_split, (y + 1)·per_split) and writes C + y·split_stride.
//   A: dy stored (P, Cout), read as (BK, BM) slabs;  B: im2col(x) (P, K), read as (BK, BN) slabs
template <class Pol, bool Vec>
__global__ void __launch_bounds__(kThreads<Pol, true, false>)
    wgrad_kernel(Gather B, const bf16* __restrict__ dy, int Cout, int per_split, std::int64_t split_stride,
                 EpilogueParams<float, epilogue::None> ep, bool paired) {
  using Kn = Layout<Pol, true, false>;
  using PB = Chunks<typename Kn::SlabB, Kn::Threads>;
  extern __shared__ uint4 smem_raw[];
  const int P = B.rows, K = B.cols;
  const TileCoord tile = grouped_tile(static_cast<int>(blockIdx.x), static_cast<int>(ceil_div(Cout, Kn::BM)),
                                      static_cast<int>(ceil_div(K, Kn::BN)));
  const int m0 = tile.m * Kn::BM, n0 = tile.n * Kn::BN;
  const int k_tiles = static_cast<int>(ceil_div(P, Kn::BK)), kt0 = static_cast<int>(blockIdx.y) * per_split;
  const int kt1 = min(kt0 + per_split, k_tiles);
  ep.C += static_cast<std::int64_t>(blockIdx.y) * split_stride;
  const Tap t = tap(B, n0 + PB::col());  // this thread's slab column: one tap, fixed for the whole K loop
  int k0 = 0;
  auto dy_row = [&](int r) -> const bf16* {  // pixel k0 + r of dy (P, Cout)
    const int p = k0 + r;
    return p < P ? dy + static_cast<std::int64_t>(p) * Cout : nullptr;
  };
  float acc[Kn::MI][Kn::NI][4] = {};
  mainloop<Pol, true, false>(acc, reinterpret_cast<bf16*>(smem_raw), kt0, kt1, [&](bf16* sa, bf16* sb, int kt) {
    k0 = kt * Kn::BK;
    load_rows<typename Kn::SlabA, Kn::Threads, Vec>(sa, dy_row, m0, Cout, dy);  // (BK, BM)
#pragma unroll
    for (int it = 0; it < PB::count; ++it) {  // (BK, BN): this thread's rows are pixels, its column the tap t
      const Pixel px = pixel(B, k0 + PB::row(it));
      if constexpr (Vec) gather16(PB::dst(sb, it), B, px, t);
      else gather8(PB::dst(sb, it), B, px, n0 + PB::col());
    }
  });
  store_tile<Pol, true, false>(acc, ep, paired, Cout, K, m0, n0, [](int m) { return std::int64_t{m}; });
}

// dw = Σ_s partial[s] (in split order) + beta·dw; beta = 0 does not read dw. (A template only so
// that the header can be included by several translation units of one program.)
template <int = 0>
__global__ void split_sum_kernel(const float* __restrict__ partial, int splits, std::int64_t stride, float* dw,
                                 float beta) {
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < stride;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    float s = 0.f;
    for (int k = 0; k < splits; ++k) s += partial[k * stride + i];
    dw[i] = beta != 0.f ? s + beta * dw[i] : s;
  }
}

// ---- host side: checks, choices, launches ----

inline Geo check_shape(const Conv2dShape& s, const char* pass) {
  const auto& c = s.in;
  DPML_REQUIRE(s.N >= 0 && s.Cout > 0 && c.C > 0 && c.kh > 0 && c.kw > 0 && c.stride > 0 && c.pad >= 0,
               "conv2d " << pass << ": N=" << s.N << " Cin=" << c.C << " Cout=" << s.Cout << " kernel " << c.kh << "x"
                         << c.kw << " stride " << c.stride << " pad " << c.pad
                         << " must be positive (N, pad ≥ 0)");
  DPML_REQUIRE(c.H > 0 && c.W > 0 && c.H + 2 * c.pad >= c.kh && c.W + 2 * c.pad >= c.kw,
               "conv2d " << pass << ": input " << c.H << "x" << c.W << " with padding " << c.pad
                         << " is smaller than the kernel " << c.kh << "x" << c.kw);
  constexpr std::int64_t lim = std::numeric_limits<int>::max();
  const std::int64_t big = std::max({s.N * c.H * c.W, s.pixels(), s.taps(), c.kh * c.kw * s.Cout, c.H * c.W * c.C,
                                     s.out_h() * s.out_w() * s.Cout});
  DPML_REQUIRE(big < lim && c.stride * c.stride <= 65535,
               "conv2d " << pass << ": N=" << s.N << " H=" << c.H << " W=" << c.W << " Cin=" << c.C
                         << " Cout=" << s.Cout << " kernel " << c.kh << "x" << c.kw << " stride " << c.stride
                         << " exceeds the kernels' 32-bit GEMM sizes (or stride² > 65535)");
  auto i32 = [](std::int64_t v) { return static_cast<int>(v); };
  return {i32(s.N),  i32(c.H),      i32(c.W),   i32(c.C),       i32(s.Cout),   i32(c.kh),
          i32(c.kw), i32(c.stride), i32(c.pad), i32(s.out_h()), i32(s.out_w())};
}

// im2col(x) of the convolution as a Gather: rows N·Ho·Wo pixels, columns kh·kw·Cin taps.
inline Gather im2col_of(const bf16* x, const Geo& g) {
  return {.src = x, .H = g.H, .W = g.W, .C = g.Ci,
          .rows = g.N * g.Ho * g.Wo, .per_h = g.Ho, .per_w = g.Wo, .step = g.s, .off_h = -g.p, .off_w = -g.p,
          .cols = g.kh * g.kw * g.Ci, .taps_w = g.kw, .sign = 1};
}

template <class TC>
bool pairs(const TC* C, std::int64_t ldc) {
  return ldc % 2 == 0 && reinterpret_cast<std::uintptr_t>(C) % (2 * sizeof(TC)) == 0;
}

// Opting in to more than 48 KiB of dynamic shared memory: per kernel, once per instantiation
// (keyed by the kernel itself: kernels of one signature share a function type).
template <auto Kernel>
void opt_in_smem(std::size_t bytes) {
  static const bool done = [&] {
    DPML_CHECK_CUDA(cudaFuncSetAttribute(Kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes)));
    return true;
  }();
  (void)done;
}

// Split-K of backward_weight: k-tiles per split and the number of splits (≥ 1, none empty).
template <class Pol>
std::pair<int, int> wgrad_splits(const Conv2dShape& s) {
  using Kn = Layout<Pol, true, false>;
  const std::int64_t tiles = ceil_div(s.Cout, Kn::BM) * ceil_div(s.taps(), Kn::BN);
  const std::int64_t k_tiles = ceil_div(s.pixels(), Kn::BK);
  const std::int64_t want = std::clamp<std::int64_t>(ceil_div(Pol::wgrad_target_blocks, tiles), 1,
                                                     std::max<std::int64_t>(1, k_tiles / Pol::wgrad_min_k_tiles));
  const std::int64_t per_split = std::max<std::int64_t>(1, ceil_div(k_tiles, want));
  return {static_cast<int>(per_split), static_cast<int>(std::max<std::int64_t>(1, ceil_div(k_tiles, per_split)))};
}

}  // namespace detail::conv

// Floats of scratch that conv2d_backward_weight needs for this shape (0: it writes dw directly).
template <class Pol = DefaultConvPolicy>
std::int64_t conv2d_weight_scratch(const Conv2dShape& s) {
  const int splits = detail::conv::wgrad_splits<Pol>(s).second;
  return splits > 1 ? splits * s.Cout * s.taps() : 0;
}

// y (N, Ho, Wo, Cout) = conv(x (N, H, W, Cin), w (Cout, kh, kw, Cin)) + bias (Cout) if bias != nullptr.
template <class Pol = DefaultConvPolicy>
void conv2d_forward(const bf16* x, const bf16* w, const bf16* bias, bf16* y, const Conv2dShape& s,
                    cudaStream_t stream) {
  using namespace detail::conv;
  const Geo g = check_shape(s, "forward");
  if (s.pixels() == 0) return;
  const Gather A = im2col_of(x, g);
  const bool vec = g.Ci % 8 == 0 && detail::aligned16(x) && detail::aligned16(w);
  const bool paired = pairs(y, s.Cout);
  using Kn = Layout<Pol, false, true>;
  const auto blocks = static_cast<unsigned>(ceil_div(s.pixels(), Kn::BM) * ceil_div(s.Cout, Kn::BN));
  auto launch = [&]<bool Vec, class Epi>() {
    constexpr auto kernel = &fprop_kernel<Pol, Vec, Epi>;
    opt_in_smem<kernel>(Kn::smem_bytes);
    const detail::EpilogueParams<bf16, Epi> ep{y, s.Cout, 1.f, 0.f, bias, nullptr};
    kernel<<<blocks, Kn::Threads, Kn::smem_bytes, stream>>>(A, w, g.Co, ep, paired);
    DPML_CHECK_LAUNCH();
  };
  if (bias != nullptr) {
    if (vec) launch.template operator()<true, epilogue::Bias>();
    else launch.template operator()<false, epilogue::Bias>();
  } else {
    if (vec) launch.template operator()<true, epilogue::None>();
    else launch.template operator()<false, epilogue::None>();
  }
}

// dx (N, H, W, Cin) = ∂(Σ y·dy)/∂x for dy (N, Ho, Wo, Cout), w (Cout, kh, kw, Cin); overwritten.
template <class Pol = DefaultConvPolicy>
void conv2d_backward_input(const bf16* dy, const bf16* w, bf16* dx, const Conv2dShape& s, cudaStream_t stream) {
  using namespace detail::conv;
  const Geo g = check_shape(s, "backward_input");
  if (s.N == 0) return;
  const bool vec = g.Ci % 8 == 0 && g.Co % 8 == 0 && detail::aligned16(dy) && detail::aligned16(w);
  const bool paired = pairs(dx, s.in.C);
  using Kn = Layout<Pol, false, false>;
  const Phase f0 = phase_of(g, 0);  // the phase with the most rows
  const auto blocks = static_cast<unsigned>(ceil_div(s.N * f0.Hp * f0.Wp, Kn::BM) * ceil_div(s.in.C, Kn::BN));
  const dim3 grid(blocks, static_cast<unsigned>(g.s * g.s));
  const detail::EpilogueParams<bf16, epilogue::None> ep{dx, s.in.C, 1.f, 0.f, nullptr, nullptr};
  auto launch = [&]<bool Vec>() {
    constexpr auto kernel = &dgrad_kernel<Pol, Vec>;
    opt_in_smem<kernel>(Kn::smem_bytes);
    kernel<<<grid, Kn::Threads, Kn::smem_bytes, stream>>>(g, dy, w, ep, paired);
    DPML_CHECK_LAUNCH();
  };
  if (vec) launch.template operator()<true>();
  else launch.template operator()<false>();
}

// dw (Cout, kh·kw·Cin) fp32 = Σ over pixels of dy (N, Ho, Wo, Cout) ⊗ im2col(x) + beta·dw (beta = 0
// overwrites without reading dw). scratch: conv2d_weight_scratch<Pol>(s) floats (may be null when 0).
template <class Pol = DefaultConvPolicy>
void conv2d_backward_weight(const bf16* dy, const bf16* x, float* dw, float beta, float* scratch,
                            std::int64_t scratch_floats, const Conv2dShape& s, cudaStream_t stream) {
  using namespace detail::conv;
  const Geo g = check_shape(s, "backward_weight");
  const auto [per_split, splits] = wgrad_splits<Pol>(s);
  const std::int64_t need = conv2d_weight_scratch<Pol>(s), taps = s.taps();
  DPML_REQUIRE(scratch_floats >= need && (need == 0 || scratch != nullptr),
               "conv2d backward_weight: N=" << s.N << " Cin=" << s.in.C << " Cout=" << s.Cout << " kernel " << s.in.kh
                                            << "x" << s.in.kw << " needs " << need << " floats of scratch, got "
                                            << scratch_floats);
  const bool vec = g.Ci % 8 == 0 && g.Co % 8 == 0 && detail::aligned16(dy) && detail::aligned16(x);
  float* out = splits > 1 ? scratch : dw;
  const bool paired = pairs(out, taps);
  const detail::EpilogueParams<float, epilogue::None> ep{out, taps, 1.f, splits > 1 ? 0.f : beta, nullptr, nullptr};
  const Gather B = im2col_of(x, g);
  using Kn = Layout<Pol, true, false>;
  const auto blocks = static_cast<unsigned>(ceil_div(s.Cout, Kn::BM) * ceil_div(taps, Kn::BN));
  const dim3 grid(blocks, static_cast<unsigned>(splits));
  auto launch = [&]<bool Vec>() {
    constexpr auto kernel = &wgrad_kernel<Pol, Vec>;
    opt_in_smem<kernel>(Kn::smem_bytes);
    kernel<<<grid, Kn::Threads, Kn::smem_bytes, stream>>>(B, dy, g.Co, per_split, s.Cout * taps, ep, paired);
    DPML_CHECK_LAUNCH();
  };
  if (vec) launch.template operator()<true>();
  else launch.template operator()<false>();
  if (splits > 1) {
    constexpr int threads = 256;
    split_sum_kernel<><<<grid_for(s.Cout * taps, threads), threads, 0, stream>>>(scratch, splits, s.Cout * taps, dw,
                                                                                beta);
    DPML_CHECK_LAUNCH();
  }
}

// The three passes as a convolution policy for the Conv2d layer (layers/conv2d.hpp): the same
// member functions as CudnnConv (conv/cudnn.hpp), with the split-K scratch of backward_weight
// owned here. prepare(shape) grows the scratch for a shape — call it for every shape at model
// construction, so that no step allocates.
template <class Pol = DefaultConvPolicy>
class ImplicitGemmConv {
 public:
  ImplicitGemmConv() = default;
  ImplicitGemmConv(const ImplicitGemmConv&) = delete;
  ImplicitGemmConv& operator=(const ImplicitGemmConv&) = delete;
  ~ImplicitGemmConv() { cudaFree(scratch_); }

  void prepare(const Conv2dShape& s) {
    const std::int64_t need = conv2d_weight_scratch<Pol>(s);
    if (need <= floats_) return;
    DPML_CHECK_CUDA(cudaFree(scratch_));
    scratch_ = nullptr;
    DPML_CHECK_CUDA(cudaMalloc(&scratch_, static_cast<std::size_t>(need) * sizeof(float)));
    floats_ = need;
  }
  void forward(const bf16* x, const bf16* w, bf16* y, const Conv2dShape& s, cudaStream_t stream) {
    conv2d_forward<Pol>(x, w, nullptr, y, s, stream);
  }
  void backward_input(const bf16* dy, const bf16* w, bf16* dx, const Conv2dShape& s, cudaStream_t stream) {
    conv2d_backward_input<Pol>(dy, w, dx, s, stream);
  }
  void backward_weight(const bf16* dy, const bf16* x, float* dw, float beta, const Conv2dShape& s,
                       cudaStream_t stream) {
    conv2d_backward_weight<Pol>(dy, x, dw, beta, scratch_, floats_, s, stream);
  }
  std::size_t scratch_bytes() const noexcept { return static_cast<std::size_t>(floats_) * sizeof(float); }

 private:
  float* scratch_ = nullptr;
  std::int64_t floats_ = 0;
};

}  // namespace dpml::kernels::cuda
