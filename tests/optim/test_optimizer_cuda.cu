// optim::Optimizer on the GPU — each rule's step functor in the one generic update kernel
// (kernels/cuda/update.hpp) — against the same Optimizer on the host in float64: AdamW and SGD
// (Nesterov momentum, weight decay), bf16 parameters (fp32 master weights and state), fp16 ones
// under AdamW (the --fp16 trainer's) and float ones, three ranges of 1, 1000 and 3·8192 + 5
// elements (several blocks, a partial one) with gaps between them in one buffer, three steps with
// gradient scales 1, 0.5, 1. State and master weights within kFp32Tol (relative L2, float vs
// float64); float values within kFp32Tol; bf16 and fp16 values equal to their master rounded, bit
// for bit; the gaps untouched. A NaN scale (a non-finite norm) leaves every buffer bit-identical. Skipped (exit 77) without a GPU.
#include "../cuda/device.hpp"

#include <dpml/core/cuda_space.hpp>
#include <dpml/core/tensor.hpp>
#include <dpml/kernels/cuda/common.hpp>
#include <dpml/kernels/cuda/device.hpp>
#include <dpml/optim/adamw.hpp>
#include <dpml/optim/optimizer.hpp>
#include <dpml/optim/sgd.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <span>
#include <type_traits>
#include <vector>

using namespace dpml;

namespace {

template <class R, class T>
struct Case {
  using Rule = R;
  using type = T;
};

template <class Rule>
typename Rule::Options options_of() {
  if constexpr (std::is_same_v<Rule, optim::AdamW>) return {.beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8, .weight_decay = 0.1};
  else return {.momentum = 0.9, .weight_decay = 1e-4, .nesterov = true};
}

constexpr std::int64_t kSizes[] = {1, 1000, 3 * 8192 + 5};
constexpr std::int64_t kGap = 7;  // elements between the ranges (and before the first)

template <class T>
std::vector<T> download(const T* p, std::size_t n) {
  std::vector<T> h(n);
  SpaceCopy<HostSpace, CudaSpace>::copy(h.data(), p, n * sizeof(T));
  return h;
}
template <class T>
void upload(T* p, const std::vector<T>& h) {
  SpaceCopy<CudaSpace, HostSpace>::copy(p, h.data(), h.size() * sizeof(T));
  DPML_CHECK_CUDA(cudaDeviceSynchronize());  // the copy has landed before the stream's next kernel
}

}  // namespace

TEMPLATE_TEST_CASE("optimizer on the GPU equals the host rule in float64", "[optim][gpu]", (Case<optim::AdamW, bf16>),
                   (Case<optim::AdamW, kernels::cuda::f16>), (Case<optim::AdamW, float>), (Case<optim::Sgd, bf16>),
                   (Case<optim::Sgd, float>)) {
  using Rule = typename TestType::Rule;
  using T = typename TestType::type;
  using Dev = optim::Optimizer<Rule, T, CudaSpace>;
  using M = typename Dev::master_type;
  constexpr double kLr = std::is_same_v<Rule, optim::AdamW> ? 3e-3 : 0.1;
  kernels::Device<CudaSpace> dev;
  auto gen = test::rng(std::is_same_v<T, bf16> ? 31 : 32);

  // One buffer: [gap | range 0 | gap | range 1 | gap | range 2], the gaps holding a sentinel.
  std::vector<std::int64_t> at;
  std::int64_t total = 0;
  for (std::int64_t n : kSizes) {
    at.push_back(total + kGap);
    total += kGap + n;
  }
  const auto un = static_cast<std::size_t>(total);
  std::vector<T> hv = test::random_vec<T>(un, gen), hg(un, T(0.f));
  Tensor<T, CudaSpace> v(Shape{total}), g(Shape{total});
  upload(v.data(), hv);
  std::vector<double> rv = test::to_double(hv), rg(un);  // the host reference starts from the rounded values

  std::vector<optim::Range<T>> dranges;
  std::vector<optim::Range<double>> hranges;
  for (std::size_t i = 0; i < at.size(); ++i) {
    const auto n = static_cast<std::size_t>(kSizes[i]);
    dranges.push_back({"r" + std::to_string(i), std::span<T>(v.data() + at[i], n), std::span<const T>(g.data() + at[i], n)});
    hranges.push_back({"r" + std::to_string(i), std::span<double>(rv.data() + at[i], n), std::span<const double>(rg.data() + at[i], n)});
  }
  Dev opt(dranges, options_of<Rule>(), dev);
  optim::Optimizer<Rule, double> ref(hranges, options_of<Rule>());
  Tensor<M, CudaSpace> scale(Shape{1});
  for (int step = 1; step <= 3; ++step) {
    CAPTURE(step);
    for (std::size_t i = 0; i < un; ++i) hg[i] = T(static_cast<float>(std::sin(0.37 * static_cast<double>(i) + step)));
    upload(g.data(), hg);
    const std::vector<double> dg = test::to_double(hg);
    std::copy(dg.begin(), dg.end(), rg.begin());  // in place: the reference's ranges point into rg
    const double s = step == 2 ? 0.5 : 1.0;
    upload(scale.data(), std::vector<M>{static_cast<M>(s)});
    opt.step(kLr, scale.data());
    ref.step(kLr, &s);
  }

  const auto gv = download(v.data(), un);
  for (std::size_t i = 0; i < at.size(); ++i) {
    CAPTURE(i);
    const auto n = static_cast<std::size_t>(kSizes[i]);
    for (std::size_t k = 0; k < Dev::kStates; ++k)
      CHECK(test::rel_l2(download(opt.state(i, k).data(), n),
                         std::vector<double>(ref.state(i, k).begin(), ref.state(i, k).end())) <= test::kFp32Tol);
    const std::vector<double> want(rv.begin() + at[i], rv.begin() + at[i] + static_cast<std::ptrdiff_t>(n));
    const std::vector<T> got(gv.begin() + at[i], gv.begin() + at[i] + static_cast<std::ptrdiff_t>(n));
    if constexpr (Dev::keeps_master) {
      const auto master = download(opt.master(i).data(), n);
      CHECK(test::rel_l2(master, want) <= test::kFp32Tol);
      int mismatch = 0;
      for (std::size_t j = 0; j < n; ++j) {
        const T rounded(master[j]);  // to nearest even, as the update kernel rounds
        mismatch += std::memcmp(&got[j], &rounded, sizeof(T)) != 0;
      }
      CHECK(mismatch == 0);
    } else {
      CHECK(test::rel_l2(got, want) <= test::kFp32Tol);
    }
  }
  int gaps_changed = 0;  // elements outside every range: as uploaded
  for (std::size_t i = 0, r = 0; i < un; ++i) {
    if (r < at.size() && static_cast<std::int64_t>(i) >= at[r] + kSizes[r]) ++r;
    const bool inside = r < at.size() && static_cast<std::int64_t>(i) >= at[r];
    if (!inside) gaps_changed += std::memcmp(&gv[i], &hv[i], sizeof(T)) != 0;
  }
  CHECK(gaps_changed == 0);

  // A NaN scale: nothing moves.
  upload(scale.data(), std::vector<M>{static_cast<M>(NAN)});
  const auto state_before = download(opt.state(2, 0).data(), static_cast<std::size_t>(kSizes[2]));
  opt.step(kLr, scale.data());
  const auto after = download(v.data(), un);
  CHECK(std::memcmp(after.data(), gv.data(), un * sizeof(T)) == 0);
  const auto state_after = download(opt.state(2, 0).data(), static_cast<std::size_t>(kSizes[2]));
  CHECK(std::memcmp(state_after.data(), state_before.data(), state_after.size() * sizeof(M)) == 0);
}
