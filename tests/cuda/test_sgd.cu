// The fused SGD step (kernels/cuda/sgd.hpp) against the host rule optim::Sgd::update run in
// double: fresh random master weights, gradients and momentum at sizes that are and are not
// multiples of the block (1, 1000, 2^20 + 3), every option combination (momentum 0 / 0.9,
// Nesterov, weight decay 0 / 1e-4), three steps, fp32 and bf16 gradients, with and without a
// grad_scale of 0.5. Master and momentum within kFp32Tol (relative L2, float vs float64); the bf16
// working copy, poisoned (NaN) before every step, equals bf16(master) bit for bit. A grad_scale of
// +inf (an overflowed gradient norm) leaves master, momentum and working copy bit-identical.
#include "device.hpp"

#include <dpml/kernels/cuda/sgd.hpp>
#include <dpml/optim/sgd.hpp>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

using namespace dpml;
namespace kc = dpml::kernels::cuda;

namespace {

// Every valid combination of the options (Nesterov needs momentum > 0).
const optim::SgdOptions kOptions[] = {
    {.momentum = 0.0, .weight_decay = 0.0},     {.momentum = 0.0, .weight_decay = 1e-4},
    {.momentum = 0.9, .weight_decay = 0.0},     {.momentum = 0.9, .weight_decay = 1e-4},
    {.momentum = 0.9, .weight_decay = 0.0, .nesterov = true},
    {.momentum = 0.9, .weight_decay = 1e-4, .nesterov = true},
};
constexpr double kLr = 0.1;  // ResNet-50's
constexpr int kSteps = 3;

// Whether two downloaded buffers hold the same bytes.
template <class T>
bool same_bits(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0;
}

}  // namespace

TEMPLATE_TEST_CASE("sgd: fused update equals the host rule; bf16 copy; grad scale; skip on inf", "[sgd][gpu]", float,
                   bf16) {
  using G = TestType;
  const char* gname = std::is_same_v<G, float> ? "float" : "bf16";
  for (const std::int64_t n : {std::int64_t{1}, std::int64_t{1000}, (std::int64_t{1} << 20) + 3}) {
    auto gen = test::rng(static_cast<std::uint64_t>(n) + 11);
    const auto un = static_cast<std::size_t>(n);
    for (const optim::SgdOptions& o : kOptions) {
      for (const bool scaled : {false, true}) {
        CAPTURE(gname, n, o.momentum, o.weight_decay, o.nesterov, scaled);
        const bool has_momentum = o.momentum > 0.0;
        const auto hp = test::random_vec<float>(un, gen);             // master (n)
        const auto hg = test::random_vec<G>(un, gen);                 // grad (n)
        const auto hm = test::random_vec<float>(un, gen, -0.5, 0.5);  // momentum (n), mid-training
        test::DeviceVec<float> p(hp), m(has_momentum ? hm : std::vector<float>{}), scale(std::vector<float>{0.5f});
        test::DeviceVec<G> g(hg);
        test::DeviceVec<bf16> pb(un);  // working copy (n)
        float* mom = has_momentum ? m.ptr : nullptr;
        const float* gs = scaled ? scale.ptr : nullptr;
        for (int step = 1; step <= kSteps; ++step) {
          pb.poison();
          kc::sgd_update(p.ptr, pb.ptr, g.ptr, mom, n, o, kLr, gs, nullptr);
        }

        std::vector<double> rp(hp.begin(), hp.end()), rm(hm.begin(), hm.end()), rg(un);
        for (std::size_t i = 0; i < un; ++i) rg[i] = (scaled ? 0.5 : 1.0) * test::as_double(hg[i]);
        for (int step = 1; step <= kSteps; ++step)
          optim::Sgd::update<double>(rp, rg, rm, o, kLr, step);
        const auto gp = p.download();
        CHECK(test::rel_l2(gp, rp) <= test::kFp32Tol);
        std::vector<float> gm;
        if (has_momentum) {
          gm = m.download();
          CHECK(test::rel_l2(gm, rm) <= test::kFp32Tol);
        }
        const auto gpb = pb.download();
        int copy_mismatch = 0;
        for (std::size_t i = 0; i < un; ++i) {
          const bf16 want(gp[i]);  // round to nearest even
          copy_mismatch += std::memcmp(&gpb[i], &want, sizeof(bf16)) != 0;
        }
        CHECK(copy_mismatch == 0);

        // +inf scale (an overflowed norm): the step is skipped, every buffer keeps its bits.
        scale.upload(std::vector<float>{INFINITY});
        kc::sgd_update(p.ptr, pb.ptr, g.ptr, mom, n, o, kLr, scale.ptr, nullptr);
        CHECK(same_bits(p.download(), gp));
        CHECK(same_bits(pb.download(), gpb));
        if (has_momentum) {
          CHECK(same_bits(m.download(), gm));
        }
      }
    }
  }
}

TEST_CASE("sgd: momentum > 0 without a momentum buffer is refused", "[sgd][gpu]") {
  test::DeviceVec<float> p(4), g(4);
  const optim::SgdOptions o{.momentum = 0.9};
  CHECK(test::error_of([&] {
          kc::sgd_update(p.ptr, static_cast<bf16*>(nullptr), g.ptr, nullptr, 4, o, kLr, nullptr, nullptr);
        }).find("momentum buffer") != std::string::npos);
}
