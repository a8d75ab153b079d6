// Device kernels other than GEMM and attention, each against its host reference on fresh random
// inputs at several sizes (including ones that are not multiples of the block or vector width),
// with outputs poisoned (all bytes 0xFF: NaN) before each run. Tolerances: relative L2 ≤ 1e-2
// where results are stored in bf16, ≤ 1e-5 for fp32 paths (float vs the float64 reference).
// Also: the caching allocator reaches the driver only while warming up, and the deterministic
// backward passes give the same bits twice.
#include "device.hpp"

#include <dpml/core/cuda_allocator.hpp>
#include <dpml/kernels/cuda/cross_entropy.hpp>
#include <dpml/kernels/cuda/elementwise.hpp>
#include <dpml/kernels/cuda/embedding.hpp>
#include <dpml/kernels/cuda/grad_norm.hpp>
#include <dpml/kernels/cuda/layer_norm.hpp>
#include <dpml/kernels/host/activation.hpp>
#include <dpml/kernels/host/elementwise.hpp>
#include <dpml/kernels/host/embedding.hpp>
#include <dpml/kernels/host/layer_norm.hpp>
#include <dpml/kernels/host/softmax.hpp>

#include <cmath>
#include <cstring>
#include <deque>
#include <span>
#include <type_traits>
#include <vector>

using namespace dpml;
namespace kc = dpml::kernels::cuda;
namespace kh = dpml::kernels::host;

namespace {

template <class T>
constexpr double tol_for() {
  return std::is_same_v<T, float> ? test::kFp32Tol : test::kBf16Tol;
}

template <class T>
const char* type_name() {
  return std::is_same_v<T, float> ? "float" : std::is_same_v<T, bf16> ? "bf16" : "fp16";
}

}  // namespace

TEST_CASE("allocator: reuses its pool after warm-up and counts bytes", "[allocator][gpu]") {
  CudaAllocator alloc;
  cudaStream_t s = nullptr;
  auto step = [&] {
    std::vector<DeviceBuffer<float>> bufs;
    for (std::size_t n : {1000u, 1u << 20, 12345u, 1u << 22}) bufs.emplace_back(alloc, n, s);
    DPML_CHECK_CUDA(cudaMemsetAsync(bufs[3].data(), 0, bufs[3].size() * sizeof(float), s));
  };
  step();
  const auto warm = alloc.stats();
  CHECK(warm.grows >= 1);
  CHECK(warm.in_use == 0);
  CHECK(warm.peak == (1000u + (1u << 20) + 12345u + (1u << 22)) * sizeof(float));
  for (int i = 0; i < 5; ++i) step();
  DPML_CHECK_CUDA(cudaStreamSynchronize(s));
  CHECK(alloc.stats().grows == warm.grows);  // no new memory from the driver after the first step
  CHECK(alloc.stats().reserved == warm.reserved);
  DeviceBuffer<float> held(alloc, 100, s);
  CHECK(alloc.stats().in_use == 400);
  held.reset();
  CHECK(alloc.stats().in_use == 0);
}

TEMPLATE_TEST_CASE("layer_norm: forward and both backward halves (with and without a joining residual) against float64", "[layer_norm][gpu]", float, bf16, kc::f16) {
  using T = TestType;
  for (auto [rows, C] : {std::pair{1, 32}, std::pair{37, 768}, std::pair{300, 100}, std::pair{1000, 13}}) {
    CAPTURE(type_name<T>(), rows, C);
    auto gen = test::rng(static_cast<std::uint64_t>(rows * 131 + C));
    const auto n = static_cast<std::size_t>(rows * C);
    auto hx = test::random_vec<T>(n, gen, -2.0, 3.0), hdy = test::random_vec<T>(n, gen);
    auto hw = test::random_vec<T>(static_cast<std::size_t>(C), gen, 0.5, 1.5);
    auto hb = test::random_vec<T>(static_cast<std::size_t>(C), gen);
    auto hdw = test::random_vec<T>(static_cast<std::size_t>(C), gen), hdb = test::random_vec<T>(static_cast<std::size_t>(C), gen);
    test::DeviceVec<T> x(hx), dy(hdy), w(hw), b(hb), y(n), dx(n), dw(hdw), db(hdb);
    test::DeviceVec<float> mean(static_cast<std::size_t>(rows)), rstd(static_cast<std::size_t>(rows)),
        scratch(static_cast<std::size_t>(kc::layer_norm_weight_scratch(rows, C)));
    y.poison();
    dx.poison();
    mean.poison();
    rstd.poison();
    scratch.poison();
    kc::layer_norm_forward(x.ptr, w.ptr, b.ptr, y.ptr, mean.ptr, rstd.ptr, rows, C, 1e-5f, nullptr);
    kc::layer_norm_backward_input(dy.ptr, x.ptr, w.ptr, mean.ptr, rstd.ptr, dx.ptr, rows, C, nullptr);
    kc::layer_norm_backward_weight(dy.ptr, x.ptr, mean.ptr, rstd.ptr, dw.ptr, db.ptr, scratch.ptr, rows, C, nullptr);

    auto dX = test::to_double(hx), dDY = test::to_double(hdy), dW = test::to_double(hw), dB = test::to_double(hb);
    std::vector<double> ry(n), rmean(static_cast<std::size_t>(rows)), rrstd(rmean.size()), rdx(n);
    auto rdw = test::to_double(hdw), rdb = test::to_double(hdb);
    kh::layer_norm_forward(dX.data(), dW.data(), dB.data(), ry.data(), rmean.data(), rrstd.data(), rows, C, 1e-5);
    kh::layer_norm_backward_input(dDY.data(), dX.data(), dW.data(), rmean.data(), rrstd.data(), rdx.data(), rows, C);
    kh::layer_norm_backward_weight(dDY.data(), dX.data(), rmean.data(), rrstd.data(), rdw.data(), rdb.data(), rows, C);
    CHECK(test::rel_l2(y.download(), ry) <= tol_for<T>());
    CHECK(test::rel_l2(mean.download(), rmean) <= test::kFp32Tol);
    CHECK(test::rel_l2(rstd.download(), rrstd) <= test::kFp32Tol);
    CHECK(test::rel_l2(dx.download(), rdx) <= tol_for<T>());
    CHECK(test::rel_l2(dw.download(), rdw) <= tol_for<T>());
    CHECK(test::rel_l2(db.download(), rdb) <= tol_for<T>());

    // A residual gradient joining in the same kernel: dx = dres + the input gradient, into a
    // buffer of its own, then in place over dres.
    const auto hres = test::random_vec<T>(n, gen);
    test::DeviceVec<T> dres(hres), dx_res(n);
    dx_res.poison();
    kc::layer_norm_backward_input(dy.ptr, x.ptr, w.ptr, mean.ptr, rstd.ptr, dx_res.ptr, rows, C, nullptr, dres.ptr);
    auto rdx_res = test::to_double(hres);
    for (std::size_t i = 0; i < n; ++i) rdx_res[i] += rdx[i];
    CHECK(test::rel_l2(dx_res.download(), rdx_res) <= tol_for<T>());
    kc::layer_norm_backward_input(dy.ptr, x.ptr, w.ptr, mean.ptr, rstd.ptr, dres.ptr, rows, C, nullptr, dres.ptr);
    CHECK(test::rel_l2(dres.download(), rdx_res) <= tol_for<T>());
  }
}

TEMPLATE_TEST_CASE("elementwise: gelu forward/backward, relu backward, add, scaled add, bias gradient against float64",
                   "[elementwise][gpu]",
                   float, bf16, kc::f16) {
  using T = TestType;
  for (std::int64_t n : {1, 7, 8, 1000, 4099, 1 << 20}) {
    CAPTURE(type_name<T>(), n);
    auto gen = test::rng(static_cast<std::uint64_t>(n));
    const auto un = static_cast<std::size_t>(n);
    auto hx = test::random_vec<T>(un, gen, -4.0, 4.0), hdy = test::random_vec<T>(un, gen);
    test::DeviceVec<T> x(hx), dy(hdy), y(un), dx(un), sum(un), mean(un), drelu(un);
    y.poison();
    dx.poison();
    sum.poison();
    mean.poison();
    drelu.poison();
    kc::gelu_forward(x.ptr, y.ptr, n, nullptr);
    kc::gelu_backward(x.ptr, dy.ptr, dx.ptr, n, nullptr);
    kc::relu_backward(x.ptr, dy.ptr, drelu.ptr, n, nullptr);  // x as the ReLU's output: about half positive
    kc::add(x.ptr, dy.ptr, sum.ptr, n, nullptr);
    kc::add_scaled(x.ptr, dy.ptr, mean.ptr, n, 0.5f, nullptr);
    auto dX = test::to_double(hx), dDY = test::to_double(hdy);
    std::vector<double> ry(un), rdx(un), rsum(un), rdrelu(un);
    for (std::size_t i = 0; i < un; ++i) rdrelu[i] = dX[i] > 0 ? dDY[i] : 0.0;
    CHECK(test::rel_l2(drelu.download(), rdrelu) == 0.0);  // a copy or a zero: exact
    kh::gelu_forward(dX.data(), ry.data(), n);
    kh::gelu_backward(dX.data(), dDY.data(), rdx.data(), n);
    kh::add(dX.data(), dDY.data(), rsum.data(), n);
    std::vector<double> rmean(un);
    for (std::size_t i = 0; i < un; ++i) rmean[i] = 0.5 * rsum[i];
    CHECK(test::rel_l2(y.download(), ry) <= tol_for<T>());
    CHECK(test::rel_l2(dx.download(), rdx) <= tol_for<T>());
    CHECK(test::rel_l2(sum.download(), rsum) <= tol_for<T>());
    CHECK(test::rel_l2(mean.download(), rmean) <= tol_for<T>());
    // In place and through a misaligned pointer (the scalar path).
    if (n > 1) {
      test::DeviceVec<T> z(hx);
      kc::gelu_forward(z.ptr + 1, z.ptr + 1, n - 1, nullptr);
      const auto got = z.download();
      CHECK(test::as_double(got[0]) == dX[0]);
      CHECK(test::rel_l2(std::vector<T>(got.begin() + 1, got.end()), std::vector<double>(ry.begin() + 1, ry.end())) <=
            tol_for<T>());
    }
  }
  for (auto [rows, cols] : {std::pair{1, 1}, std::pair{300, 77}, std::pair{1025, 768}}) {
    CAPTURE(type_name<T>(), rows, cols);
    auto gen = test::rng(static_cast<std::uint64_t>(rows + cols));
    auto hdy = test::random_vec<T>(static_cast<std::size_t>(rows * cols), gen);
    auto hdb = test::random_vec<T>(static_cast<std::size_t>(cols), gen);
    test::DeviceVec<T> dy(hdy), db(hdb);
    test::DeviceVec<float> scratch(static_cast<std::size_t>(kc::column_sums_scratch(rows, cols, 1)));
    scratch.poison();
    kc::bias_grad_rows(dy.ptr, db.ptr, scratch.ptr, rows, cols, nullptr);
    auto rdb = test::to_double(hdb);
    auto dDY = test::to_double(hdy);
    kh::bias_grad_rows(dDY.data(), rdb.data(), rows, cols);
    CHECK(test::rel_l2(db.download(), rdb) <= tol_for<T>());
  }
}

TEMPLATE_TEST_CASE("embedding: forward and deterministic backward against the host", "[embedding][gpu]", float, bf16, kc::f16) {
  using T = TestType;
  struct Case {
    std::int64_t B, Tn, C, vocab, begin, end;
  };
  for (const Case cs : {Case{1, 1, 8, 5, 0, 5}, Case{4, 33, 96, 50, 0, 50}, Case{3, 64, 72, 1000, 300, 700},
                        Case{8, 128, 768, 97, 0, 97}, Case{32, 512, 768, 30522, 0, 30522}, Case{2, 40, 100, 30, 0, 30}}) {
    const std::int64_t N = cs.B * cs.Tn, rows = cs.end - cs.begin;
    CAPTURE(type_name<T>(), cs.B, cs.Tn, cs.C, cs.vocab, cs.begin, cs.end);
    auto gen = test::rng(static_cast<std::uint64_t>(N * 7 + cs.C));
    std::vector<std::int32_t> htok(static_cast<std::size_t>(N));
    std::uniform_int_distribution<std::int32_t> pick(0, static_cast<std::int32_t>(cs.vocab - 1));
    for (auto& t : htok) t = pick(gen) % 7 == 0 ? 3 : pick(gen);  // many repeats of token 3 (BERT's [MASK]: 2340 of 16384)
    auto hW = test::random_vec<T>(static_cast<std::size_t>(rows * cs.C), gen);
    auto hP = test::random_vec<T>(static_cast<std::size_t>(cs.Tn * cs.C), gen);
    auto hdy = test::random_vec<T>(static_cast<std::size_t>(N * cs.C), gen);
    auto hdW = test::random_vec<T>(hW.size(), gen), hdP = test::random_vec<T>(hP.size(), gen);
    test::DeviceVec<std::int32_t> tok(htok);
    test::DeviceVec<T> W(hW), P(hP), dy(hdy), y(static_cast<std::size_t>(N * cs.C)), dW(hdW), dP(hdP);
    const std::size_t ws_bytes = kc::embedding_backward_workspace(N, cs.vocab);
    test::DeviceVec<unsigned char> ws(ws_bytes);
    y.poison();
    kc::embedding_token_forward(tok.ptr, W.ptr, y.ptr, N, cs.C, cs.begin, cs.end, nullptr);
    kc::embedding_position_forward(P.ptr, y.ptr, cs.B, cs.Tn, cs.C, nullptr);
    kc::embedding_token_backward(tok.ptr, dy.ptr, dW.ptr, N, cs.C, cs.begin, cs.end, cs.vocab, ws.ptr, ws_bytes, nullptr);
    kc::embedding_position_backward(dy.ptr, dP.ptr, cs.B, cs.Tn, cs.C, nullptr);
    const auto got_dW = dW.download();

    auto dWd = test::to_double(hW), dPd = test::to_double(hP), dDY = test::to_double(hdy);
    std::vector<double> ry(static_cast<std::size_t>(N * cs.C));
    auto rdW = test::to_double(hdW), rdP = test::to_double(hdP);
    kh::embedding_token_forward(htok.data(), dWd.data(), ry.data(), N, cs.C, cs.begin, cs.end);
    kh::embedding_position_forward(dPd.data(), ry.data(), cs.B, cs.Tn, cs.C);
    kh::embedding_token_backward(htok.data(), dDY.data(), rdW.data(), N, cs.C, cs.begin, cs.end);
    kh::embedding_position_backward(dDY.data(), rdP.data(), cs.B, cs.Tn, cs.C);
    CHECK(test::rel_l2(y.download(), ry) <= tol_for<T>());
    CHECK(test::rel_l2(got_dW, rdW) <= tol_for<T>());
    CHECK(test::rel_l2(dP.download(), rdP) <= tol_for<T>());

    // Deterministic: the same gradient again gives the same bits.
    dW.upload(hdW);
    kc::embedding_token_backward(tok.ptr, dy.ptr, dW.ptr, N, cs.C, cs.begin, cs.end, cs.vocab, ws.ptr, ws_bytes, nullptr);
    const auto again = dW.download();
    CHECK(std::memcmp(again.data(), got_dW.data(), again.size() * sizeof(T)) == 0);
    // Scaled (a data-parallel rank adding every rank's rows, averaged): dW + scale · Σ dy.
    dW.upload(hdW);
    constexpr float kScale = 0.375f;
    kc::embedding_token_backward(tok.ptr, dy.ptr, dW.ptr, N, cs.C, cs.begin, cs.end, cs.vocab, ws.ptr, ws_bytes, nullptr,
                                 kScale);
    std::vector<double> scaled = test::to_double(hdW);
    for (std::size_t i = 0; i < scaled.size(); ++i) scaled[i] += kScale * (rdW[i] - scaled[i]);
    CHECK(test::rel_l2(dW.download(), scaled) <= tol_for<T>());
    // Two ranks' equal rows gathered in rank order, blocks of N rows, scale 1/2: one rank's bits.
    {
      std::vector<std::int32_t> htok2(htok);
      htok2.insert(htok2.end(), htok.begin(), htok.end());
      std::vector<T> hdy2(hdy);
      hdy2.insert(hdy2.end(), hdy.begin(), hdy.end());
      test::DeviceVec<std::int32_t> tok2(htok2);
      test::DeviceVec<T> dy2(hdy2);
      const std::size_t ws2_bytes = kc::embedding_backward_workspace(2 * N, cs.vocab);
      test::DeviceVec<unsigned char> ws2(ws2_bytes);
      dW.upload(hdW);
      kc::embedding_token_backward(tok2.ptr, dy2.ptr, dW.ptr, 2 * N, cs.C, cs.begin, cs.end, cs.vocab, ws2.ptr, ws2_bytes,
                                   nullptr, 0.5f, N);
      const auto pair = dW.download();
      CHECK(std::memcmp(pair.data(), got_dW.data(), pair.size() * sizeof(T)) == 0);
    }
  }
}

TEMPLATE_TEST_CASE("cross entropy: fused softmax + loss + gradient against float64", "[cross_entropy][gpu]", float,
                   bf16, kc::f16) {
  using T = TestType;
  struct Case {
    std::int64_t N, V, V_real;
  };
  for (const Case cs : {Case{1, 2, 2}, Case{7, 1000, 1000}, Case{33, 4099, 4000}, Case{4, 50304, 50257}}) {
    CAPTURE(type_name<T>(), cs.N, cs.V, cs.V_real);
    auto gen = test::rng(static_cast<std::uint64_t>(cs.N * 3 + cs.V));
    auto hx = test::random_vec<T>(static_cast<std::size_t>(cs.N * cs.V), gen, -8.0, 8.0);
    std::vector<std::int32_t> ht(static_cast<std::size_t>(cs.N));
    std::uniform_int_distribution<std::int32_t> pick(0, static_cast<std::int32_t>(cs.V_real - 1));
    for (auto& t : ht) t = pick(gen);
    if (cs.N > 2) ht[1] = -1;  // an ignored row
    test::DeviceVec<T> x(hx);
    test::DeviceVec<std::int32_t> tgt(ht);
    test::DeviceVec<float> loss(static_cast<std::size_t>(cs.N));
    loss.poison();
    const float dloss = 1.f / static_cast<float>(cs.N);
    kc::softmax_cross_entropy(x.ptr, tgt.ptr, loss.ptr, dloss, cs.N, cs.V, cs.V_real, nullptr);

    std::vector<double> rloss(static_cast<std::size_t>(cs.N)), rdx(hx.size(), 0.0);
    const auto dx = test::to_double(hx);
    for (std::int64_t r = 0; r < cs.N; ++r) {
      if (ht[static_cast<std::size_t>(r)] < 0) continue;
      std::vector<double> p(dx.begin() + r * cs.V, dx.begin() + r * cs.V + cs.V_real);
      kh::softmax_row(p.data(), p.data(), cs.V_real);
      const auto t = ht[static_cast<std::size_t>(r)];
      rloss[static_cast<std::size_t>(r)] = -std::log(p[static_cast<std::size_t>(t)]);
      for (std::int64_t j = 0; j < cs.V_real; ++j)
        rdx[static_cast<std::size_t>(r * cs.V + j)] = (p[static_cast<std::size_t>(j)] - (j == t)) * dloss;
    }
    CHECK(test::rel_l2(loss.download(), rloss) <= test::kFp32Tol * 10);  // fast exp: ~1e-6 relative
    const auto got = x.download();
    CHECK(test::rel_l2(got, rdx) <= (std::is_same_v<T, float> ? test::kFp32Tol * 10 : test::kBf16Tol));
    int padding_nonzero = 0;
    for (std::int64_t r = 0; r < cs.N; ++r)
      for (std::int64_t j = cs.V_real; j < cs.V; ++j) padding_nonzero += test::as_double(got[r * cs.V + j]) != 0.0;
    CHECK(padding_nonzero == 0);
  }
}

// The vocabulary-parallel form on one GPU: the padded vocabulary cut into `shards` column blocks,
// each block's pass 1 (partials) on its own (N, V/shards) logits, the all-reduce (sum) of the
// shards' (shards, 3, N) stats done on the host, then each block's pass 2 (combine, dlogits in place): every shard's
// losses and its columns of dlogits against the float64 softmax of the whole row. Shards past the
// real vocabulary (all padding) and targets in every shard are in play.
TEMPLATE_TEST_CASE("cross entropy: vocabulary-parallel passes against float64", "[cross_entropy][gpu]", float, bf16) {
  using T = TestType;
  struct Case {
    std::int64_t N, V, V_real;
    int shards;
  };
  for (const Case cs : {Case{5, 128, 67, 2}, Case{9, 1200, 1000, 3}, Case{4, 50304, 50257, 4}, Case{3, 256, 100, 4}}) {
    CAPTURE(type_name<T>(), cs.N, cs.V, cs.V_real, cs.shards);
    const std::int64_t N = cs.N, Vl = cs.V / cs.shards;
    auto gen = test::rng(static_cast<std::uint64_t>(cs.N * 5 + cs.V));
    auto hx = test::random_vec<T>(static_cast<std::size_t>(N * cs.V), gen, -8.0, 8.0);
    std::vector<std::int32_t> ht(static_cast<std::size_t>(N));
    std::uniform_int_distribution<std::int32_t> pick(0, static_cast<std::int32_t>(cs.V_real - 1));
    for (auto& t : ht) t = pick(gen);
    ht[0] = -1;  // an ignored row
    test::DeviceVec<std::int32_t> tgt(ht);
    const float dloss = 1.f / static_cast<float>(N);
    std::deque<test::DeviceVec<T>> x;  // a deque: DeviceVec does not move
    std::deque<test::DeviceVec<float>> stats, loss;
    for (int k = 0; k < cs.shards; ++k) {
      std::vector<T> part(static_cast<std::size_t>(N * Vl));
      for (std::int64_t r = 0; r < N; ++r)
        std::copy_n(hx.begin() + r * cs.V + k * Vl, Vl, part.begin() + r * Vl);
      x.emplace_back(part);
      stats.emplace_back(static_cast<std::size_t>(3 * cs.shards * N));  // (shards, 3, N)
      stats.back().poison();
      loss.emplace_back(static_cast<std::size_t>(N));
      loss.back().poison();
      kc::vocab_parallel_xent_partials(x[k].ptr, tgt.ptr, stats[k].ptr, N, Vl, k * Vl, cs.V_real, cs.shards, k, nullptr);
    }
    // The all-reduce (sum) of the whole stats buffer over the shards.
    {
      std::vector<std::vector<float>> h;
      for (auto& st : stats) h.push_back(st.download());
      for (std::size_t i = 0; i < h[0].size(); ++i) {
        float v = h[0][i];
        for (int k = 1; k < cs.shards; ++k) v += h[static_cast<std::size_t>(k)][i];
        for (auto& hk : h) hk[i] = v;
      }
      for (int k = 0; k < cs.shards; ++k)
        DPML_CHECK_CUDA(cudaMemcpy(stats[k].ptr, h[k].data(), h[k].size() * sizeof(float), cudaMemcpyHostToDevice));
    }
    for (int k = 0; k < cs.shards; ++k)
      kc::vocab_parallel_xent_combine(x[k].ptr, x[k].ptr, tgt.ptr, stats[k].ptr, loss[k].ptr, dloss, N, Vl, k * Vl,
                                      cs.V_real, cs.shards, nullptr);

    std::vector<double> rloss(static_cast<std::size_t>(N)), rdx(hx.size(), 0.0);
    const auto dx = test::to_double(hx);
    for (std::int64_t r = 0; r < N; ++r) {
      const auto t = ht[static_cast<std::size_t>(r)];
      if (t < 0) continue;
      std::vector<double> p(dx.begin() + r * cs.V, dx.begin() + r * cs.V + cs.V_real);
      kh::softmax_row(p.data(), p.data(), cs.V_real);
      rloss[static_cast<std::size_t>(r)] = -std::log(p[static_cast<std::size_t>(t)]);
      for (std::int64_t j = 0; j < cs.V_real; ++j)
        rdx[static_cast<std::size_t>(r * cs.V + j)] = (p[static_cast<std::size_t>(j)] - (j == t)) * dloss;
    }
    std::vector<T> got(hx.size());
    for (int k = 0; k < cs.shards; ++k) {
      CAPTURE(k);
      CHECK(test::rel_l2(loss[k].download(), rloss) <= test::kFp32Tol * 10);  // every shard the whole row's loss
      const auto part = x[k].download();
      for (std::int64_t r = 0; r < N; ++r) std::copy_n(part.begin() + r * Vl, Vl, got.begin() + r * cs.V + k * Vl);
    }
    CHECK(test::rel_l2(got, rdx) <= (std::is_same_v<T, float> ? test::kFp32Tol * 10 : test::kBf16Tol));
    int padding_nonzero = 0;
    for (std::int64_t r = 0; r < N; ++r)
      for (std::int64_t j = cs.V_real; j < cs.V; ++j) padding_nonzero += test::as_double(got[r * cs.V + j]) != 0.0;
    CHECK(padding_nonzero == 0);
  }
}

// GradNormOps (Ops<CudaSpace>'s norm family, what the parallel runtime calls): the squared sum of
// one whole buffer, then the clipping scale; a non-finite sum gives NaN (the update skips itself);
// loss-scaled gradients are compared unscaled and the scale divides S out.
TEMPLATE_TEST_CASE("grad norm: squared sum of a buffer and the clipping scale", "[grad_norm][gpu]", float, bf16, kc::f16) {
  using G = TestType;
  using Ops = kc::GradNormOps;
  kernels::Device<CudaSpace> dev;
  for (std::int64_t n : {1, 999, 1 << 22}) {
    CAPTURE(type_name<G>(), n);
    auto gen = test::rng(static_cast<std::uint64_t>(n) + 9);
    auto hg = test::random_vec<G>(static_cast<std::size_t>(n), gen);
    test::DeviceVec<G> g(hg);
    test::DeviceVec<std::int64_t> begin(std::vector<std::int64_t>{0}), before(std::vector<std::int64_t>{0, n});
    test::DeviceVec<double> sq(1);
    test::DeviceVec<float> coef(1);
    sq.poison();
    coef.poison();
    Ops::sum_squares(dev, g.ptr, begin.ptr, before.ptr, 1, n, sq.ptr);
    Ops::clip_scale(dev, sq.ptr, coef.ptr, 1.0);
    dev.synchronize();
    double want = 0;
    for (auto x : hg) want += test::as_double(x) * test::as_double(x);
    const double got = sq.download()[0];
    CHECK(std::abs(got - want) <= 1e-12 * want);
    const double want_coef = std::min(1.0, 1.0 / (std::sqrt(want) + 1e-6));
    CHECK(std::abs(coef.download()[0] - want_coef) <= 1e-6 * want_coef);
  }
  test::DeviceVec<double> inf(std::vector<double>{INFINITY});
  test::DeviceVec<float> coef(1);
  Ops::clip_scale(dev, inf.ptr, coef.ptr, 1.0);
  dev.synchronize();
  CHECK(std::isnan(coef.download()[0]));
  // Loss-scaled gradients (scale S = 1024): the norm is compared unscaled and the coefficient
  // also divides S out.
  for (const double norm : {0.5, 3.0}) {
    CAPTURE(norm);
    test::DeviceVec<double> sq(std::vector<double>{norm * norm * 1024.0 * 1024.0});
    Ops::clip_scale(dev, sq.ptr, coef.ptr, 1.0, 1.0 / 1024.0);
    dev.synchronize();
    const double want = std::min(1.0, 1.0 / (norm + 1e-6)) / 1024.0;
    CHECK(std::abs(coef.download()[0] - want) <= 1e-6 * want);
  }
}

// Ranges of a flat buffer (a tensor-parallel rank's shards): single elements, a range at the
// buffer's start and one at its end, long ones that start off a 16-byte boundary and cross tiles
// of the kernel, an empty one; the elements outside hold 1e6 so that counting any of them shows.
TEMPLATE_TEST_CASE("grad norm: squared sum over ranges of a buffer", "[grad_norm][gpu]", float, bf16) {
  using G = TestType;
  const std::int64_t n = (1 << 20) + 77;
  const std::vector<std::int64_t> begin{0, 5, 6, 1001, 600000, 700003, n - 3}, length{3, 1, 1, 1 << 19, 0, 40000, 3};
  auto gen = test::rng(21);
  std::vector<G> hg(static_cast<std::size_t>(n), G(1e6f));
  std::vector<std::int64_t> before{0};
  double want = 0;
  for (std::size_t r = 0; r < begin.size(); ++r) {
    const auto part = test::random_vec<G>(static_cast<std::size_t>(length[r]), gen);
    std::copy(part.begin(), part.end(), hg.begin() + begin[r]);
    for (auto x : part) want += test::as_double(x) * test::as_double(x);
    before.push_back(before.back() + length[r]);
  }
  test::DeviceVec<G> g(hg);
  test::DeviceVec<std::int64_t> d_begin(begin), d_before(before);
  test::DeviceVec<double> sq(1);
  const std::size_t bytes = kc::grad_norm_ranges_workspace<G>(before.back());
  test::DeviceVec<unsigned char> ws(bytes);
  sq.poison();
  kc::grad_norm_squared_ranges(g.ptr, d_begin.ptr, d_before.ptr, static_cast<int>(begin.size()), before.back(), sq.ptr,
                               ws.ptr, bytes, nullptr);
  const double got = sq.download()[0];
  CAPTURE(type_name<G>(), got, want);
  CHECK(std::abs(got - want) <= 1e-12 * want);
}
