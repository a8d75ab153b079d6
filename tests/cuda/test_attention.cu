// Flash-style attention, causal and bidirectional (every key), on the device against the host
// kernels (float64): forward output and logsumexp, and the whole dqkv of the backward, for head
// sizes 32/64/128 and sequence
// lengths that are not multiples of the row blocks (16 SIMT, 64 tensor cores) or the key tiles,
// for each policy (tensor cores, SIMT, and the default choice). Outputs and scratch are poisoned
// first. Tolerances: relative L2 ≤ 1e-2 for bf16 and fp16 tensors, ≤ 1e-5 for fp32.
#include "device.hpp"

#include <dpml/kernels/cuda/attention.hpp>
#include <dpml/kernels/host/attention.hpp>

#include <cmath>
#include <type_traits>
#include <vector>

using namespace dpml;
namespace kc = dpml::kernels::cuda;
namespace kh = dpml::kernels::host;

namespace {

template <class T, class Policy, class Mask = attention::Causal>
void check_attention() {
  constexpr bool causal = std::is_same_v<Mask, attention::Causal>;
  constexpr double tol = std::is_same_v<T, float> ? test::kFp32Tol : test::kBf16Tol;
  struct Case {
    std::int64_t B, Tn, H, D;
  };
  constexpr bool tensor_cores = std::is_same_v<Policy, kc::attention::TensorCore>;
  // D = 128 streams 32-row tiles against the 64-row blocks (attention_mma.hpp): T = 129, 300 and
  // 1024 end blocks and tiles at different places.
  for (const Case cs : {Case{1, 1, 1, 32}, Case{2, 37, 3, 32}, Case{1, 100, 2, 64}, Case{2, 64, 1, 128},
                        Case{1, 300, 2, 64}, Case{1, 129, 1, 128}, Case{1, 300, 2, 128}, Case{2, 1024, 2, 64},
                        Case{1, 1024, 2, 128}}) {
    const auto [B, Tn, H, D] = cs;
    const bool fp32 = std::is_same_v<T, float>, simt = std::is_same_v<Policy, kc::attention::Simt>;  // CAPTURE splits template commas
    CAPTURE(fp32, simt, tensor_cores, causal, B, Tn, H, D);
    auto gen = test::rng(static_cast<std::uint64_t>(B * 1000 + Tn * 10 + D));
    const auto n_qkv = static_cast<std::size_t>(B * Tn * H * 3 * D), n_out = static_cast<std::size_t>(B * Tn * H * D);
    const auto n_bht = static_cast<std::size_t>(B * H * Tn);
    auto hqkv = test::random_vec<T>(n_qkv, gen, -2.0, 2.0), hdout = test::random_vec<T>(n_out, gen);
    test::DeviceVec<T> qkv(hqkv), dout(hdout), out(n_out), dqkv(n_qkv);
    test::DeviceVec<float> lse(n_bht), delta(n_bht);
    out.poison();
    dqkv.poison();
    lse.poison();
    delta.poison();
    kc::attention_forward<T, Policy>(qkv.ptr, out.ptr, lse.ptr, B, Tn, H, D, nullptr, Mask{});
    kc::attention_backward<T, Policy>(dout.ptr, qkv.ptr, out.ptr, lse.ptr, delta.ptr, dqkv.ptr, B, Tn, H, D, nullptr, Mask{});

    const auto dq = test::to_double(hqkv), ddo = test::to_double(hdout);
    std::vector<double> rout(n_out), probs(static_cast<std::size_t>(B * H * Tn * Tn)), rdqkv(n_qkv), rlse(n_bht);
    kh::attention_forward(dq.data(), rout.data(), probs.data(), B, Tn, H, D, Mask{});
    kh::attention_backward(ddo.data(), dq.data(), probs.data(), rdqkv.data(), B, Tn, H, D, Mask{});
    const double scale = 1.0 / std::sqrt(static_cast<double>(D));
    for (std::int64_t b = 0; b < B; ++b)
      for (std::int64_t h = 0; h < H; ++h)
        for (std::int64_t i = 0; i < Tn; ++i) {
          const double* q = dq.data() + ((b * Tn + i) * H + h) * 3 * D;
          double m = -INFINITY;
          const std::int64_t keys = causal ? i + 1 : Tn;  // the keys query i sees
          std::vector<double> s(static_cast<std::size_t>(keys));
          for (std::int64_t j = 0; j < keys; ++j) {
            const double* k = dq.data() + ((b * Tn + j) * H + h) * 3 * D + D;
            double acc = 0;
            for (std::int64_t d = 0; d < D; ++d) acc += q[d] * k[d];
            s[static_cast<std::size_t>(j)] = acc * scale;
            m = std::max(m, acc * scale);
          }
          double sum = 0;
          for (double x : s) sum += std::exp(x - m);
          rlse[static_cast<std::size_t>((b * H + h) * Tn + i)] = m + std::log(sum);
        }
    const double err_out = test::rel_l2(out.download(), rout), err_lse = test::rel_l2(lse.download(), rlse),
                 err_dqkv = test::rel_l2(dqkv.download(), rdqkv);
    CAPTURE(err_out, err_lse, err_dqkv);
    CHECK(err_out <= tol);
    CHECK(err_lse <= test::kFp32Tol);
    // The backward chains two roundings of bf16 inputs (out, dout) through δ: allow 2× the bf16 bound.
    CHECK(err_dqkv <= (std::is_same_v<T, float> ? tol : 2 * tol));
  }
}

}  // namespace

TEST_CASE("attention: fp32 (SIMT) against the float64 host kernels", "[attention][gpu]") {
  check_attention<float, kc::attention::Auto>();
}
TEST_CASE("attention: bf16 on tensor cores against the float64 host kernels", "[attention][gpu]") {
  check_attention<bf16, kc::attention::TensorCore>();
}
TEST_CASE("attention: bf16 SIMT against the float64 host kernels", "[attention][gpu]") {
  check_attention<bf16, kc::attention::Simt>();
}
TEST_CASE("attention: bf16 default policy (tensor cores where they apply) against float64", "[attention][gpu]") {
  check_attention<bf16, kc::attention::Auto>();
}

TEST_CASE("attention: fp16 on tensor cores and SIMT against the float64 host kernels", "[attention][gpu]") {
  check_attention<kc::f16, kc::attention::TensorCore>();
  check_attention<kc::f16, kc::attention::Simt>();
}

TEST_CASE("attention, bidirectional: fp32 (SIMT), bf16 and fp16 on tensor cores and SIMT against float64",
          "[attention][gpu]") {
  check_attention<float, kc::attention::Auto, attention::Bidirectional>();
  check_attention<bf16, kc::attention::TensorCore, attention::Bidirectional>();
  check_attention<bf16, kc::attention::Simt, attention::Bidirectional>();
  check_attention<kc::f16, kc::attention::TensorCore, attention::Bidirectional>();
}

TEST_CASE("attention: an unsupported head size is refused", "[attention][gpu]") {
  CHECK(test::error_of([] { kc::attention_forward<float>(nullptr, nullptr, nullptr, 1, 4, 1, 48, nullptr); })
            .find("head dimension 48") != std::string::npos);
  CHECK(test::error_of([] {
          kc::attention_forward<float, kc::attention::TensorCore>(nullptr, nullptr, nullptr, 1, 4, 1, 128, nullptr);
        }).find("tensor cores") != std::string::npos);
}
