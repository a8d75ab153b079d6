// Host-only algebra of the tensor-core kernels (runs without a GPU, in CI): the ldmatrix row
// offsets of mma.hpp, fed to a model of ldmatrix.x4 (plain and .trans) as the PTX ISA defines it,
// must deliver exactly the mma.m16n8k16 A and B fragments, for every tile layout the mma.sync
// block tile (gemm/block_tile.hpp: K- and M/N-major slabs, padded strides) and the flash attention
// use; and each ldmatrix phase (8 row addresses of 16 bytes) must hit 32 distinct shared-memory
// banks.
#include "test.hpp"

#include <dpml/kernels/cuda/mma.hpp>

#include <array>
#include <set>
#include <utility>
#include <vector>

using namespace dpml::kernels::cuda::detail;

namespace {

using Pair = std::pair<int, int>;
using Regs = std::array<std::array<Pair, 4>, 32>;  // [lane][register] = two b16 elements

// ldmatrix.x4: lanes 8i … 8i+7 give the rows of matrix i; lane l then holds, in register i, row
// l/4 and columns 2(l%4), 2(l%4)+1 of matrix i (or, with .trans, that element pair of its transpose).
Regs ldmatrix_x4_model(const std::vector<int>& smem, const std::array<int, 32>& offs, bool trans) {
  Regs r{};
  for (int i = 0; i < 4; ++i)
    for (int l = 0; l < 32; ++l) {
      const int g = l / 4, t = l % 4;
      auto at = [&](int row, int col) { return smem.at(static_cast<std::size_t>(offs[8 * i + row] + col)); };
      r[l][i] = trans ? Pair{at(2 * t, g), at(2 * t + 1, g)} : Pair{at(g, 2 * t), at(g, 2 * t + 1)};
    }
  return r;
}

// 32 distinct banks for the 8 rows of each matrix (4-byte banks, 16-byte rows, tile 128-byte aligned).
bool conflict_free(const std::array<int, 32>& offs) {
  for (int i = 0; i < 4; ++i) {
    std::set<int> banks;
    for (int r = 0; r < 8; ++r)
      for (int w = 0; w < 4; ++w) banks.insert((offs[8 * i + r] * 2 / 4 + w) % 32);
    if (banks.size() != 32) return false;
  }
  return true;
}

// A tile of `rows` × `cols` elements with row stride `stride`, element (r, c) holding id(r, c).
template <class F>
std::vector<int> tile(int rows, int cols, int stride, F id) {
  std::vector<int> s(static_cast<std::size_t>(rows * stride), -1);
  for (int r = 0; r < rows; ++r)
    for (int c = 0; c < cols; ++c) s[static_cast<std::size_t>(r * stride + c)] = id(r, c);
  return s;
}

int id(int r, int c) { return r * 10000 + c; }  // logical (row, col) of the operand

// Checks the A fragment of logical rows [m, m+16), columns [k, k+16), for a K-major or M-major tile.
void check_a(bool m_major, int rows, int K, int pad) {
  const int stride = (m_major ? rows : K) + pad;
  const auto smem = m_major ? tile(K, rows, stride, [](int r, int c) { return id(c, r); })
                            : tile(rows, K, stride, [](int r, int c) { return id(r, c); });
  for (int m = 0; m < rows; m += 16)
    for (int k = 0; k < K; k += 16) {
      std::array<int, 32> offs{};
      for (int l = 0; l < 32; ++l)
        offs[l] = m_major ? m + a_mmajor_offset(l, stride, k) : m * stride + a_kmajor_offset(l, stride, k);
      const Regs r = ldmatrix_x4_model(smem, offs, m_major);
      int wrong = 0;
      for (int l = 0; l < 32; ++l) {
        const int g = l / 4, t = l % 4;
        const std::array<Pair, 4> want{Pair{id(m + g, k + 2 * t), id(m + g, k + 2 * t + 1)},
                                       Pair{id(m + g + 8, k + 2 * t), id(m + g + 8, k + 2 * t + 1)},
                                       Pair{id(m + g, k + 2 * t + 8), id(m + g, k + 2 * t + 9)},
                                       Pair{id(m + g + 8, k + 2 * t + 8), id(m + g + 8, k + 2 * t + 9)}};
        for (int j = 0; j < 4; ++j) wrong += r[l][j] != want[j];
      }
      CAPTURE(m_major, rows, K, pad, m, k);
      CHECK(wrong == 0);
      CHECK(conflict_free(offs));
    }
}

// Checks the B fragments of n-tiles n, n+8 for k-slice [k, k+16), for a K-major or N-major tile;
// logical B is (K, N).
void check_b(bool n_major, int N, int K, int pad) {
  const int stride = (n_major ? N : K) + pad;
  const auto smem = n_major ? tile(K, N, stride, [](int r, int c) { return id(r, c); })
                            : tile(N, K, stride, [](int r, int c) { return id(c, r); });
  for (int n = 0; n < N; n += 16)
    for (int k = 0; k < K; k += 16) {
      std::array<int, 32> offs{};
      for (int l = 0; l < 32; ++l)
        offs[l] = n_major ? b_nmajor_offset(l, stride, n, k) : b_kmajor_offset(l, stride, n, k);
      const Regs r = ldmatrix_x4_model(smem, offs, n_major);
      int wrong = 0;
      for (int l = 0; l < 32; ++l) {
        const int g = l / 4, t = l % 4;
        for (int half = 0; half < 2; ++half) {  // registers 2·half, 2·half + 1 → n-tile n + 8·half
          const int col = n + 8 * half + g;
          wrong += r[l][2 * half] != Pair{id(k + 2 * t, col), id(k + 2 * t + 1, col)};
          wrong += r[l][2 * half + 1] != Pair{id(k + 2 * t + 8, col), id(k + 2 * t + 9, col)};
        }
      }
      CAPTURE(n_major, N, K, pad, n, k);
      CHECK(wrong == 0);
      CHECK(conflict_free(offs));
    }
}

}  // namespace

TEST_CASE("mma fragments: the tiled GEMM's slabs give mma's A and B fragments", "[mma][fragments]") {
  // 128×128×32 and 64×64×32 tiles; slabs padded by 8 elements (gemm/block_tile.hpp kPad).
  for (bool major : {false, true}) {
    check_a(major, 128, 32, 8);
    check_a(major, 64, 32, 8);
    check_a(major, 128, 64, 8);
    check_b(major, 128, 32, 8);
    check_b(major, 256, 32, 8);
    check_b(major, 64, 64, 8);
  }
}

TEST_CASE("mma fragments: the flash attention's tiles give mma's A and B fragments", "[mma][fragments]") {
  // (64, D) tiles with stride D + 8 (attention_mma.hpp): Q/K/V/dO rows as A (K-major), K and Q as
  // K-major B of the score products, V, K, dO and Q as N-major B of the output products.
  for (int D : {32, 64}) {
    check_a(false, 64, D, 8);
    check_b(false, 64, D, 8);
    check_b(true, D, 64, 8);
  }
}
