// comm::Staged (device buffers over MPI through host memory) with every rank on GPU 0, as the
// one-GPU runs of the multi-rank GPU tests use it: each collective element by element against
// values computed here (float exactly, bf16 sums within one rounding, in and out of place, at odd
// sizes), in order with the stream's work (a kernel-free memset enqueued before the call is what
// is sent), and a ring of sends and receives inside group() that would deadlock unbatched.
// Runs wherever one GPU is visible (2 ranks in CTest); skipped (exit 77) without a GPU.
#include "../cuda/device.hpp"
#include "nccl_fixture.hpp"

#include <dpml/comm/staged.hpp>

#include <cmath>
#include <cstdint>
#include <vector>

using namespace dpml;
using comm::ReduceOp;
using test::DeviceVec;

namespace {

// Every rank on device 0, whatever the machine has: this is comm::Staged's own test.
const comm::Staged& staged() {
  static const comm::Staged* c = [] {
    test::gpu_comm();  // skips without a GPU
    DPML_CHECK_CUDA(cudaSetDevice(0));
    return new comm::Staged(comm::Staged::from(test::world(), nullptr));  // never destroyed: see test_nccl.cu
  }();
  return *c;
}

float value(int r, std::size_t i) { return static_cast<float>((static_cast<long long>(i) % 997) * 3 + r * 7 + 1); }
template <class T>
std::vector<T> contribution(int r, std::size_t n, std::size_t offset = 0) {
  std::vector<T> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = T(value(r, offset + i));
  return v;
}
// Σ over the ranks of what each contributes at i, as T holds it (bf16 rounds the larger values).
template <class T = float>
double sum_over_ranks(int k, std::size_t i) {
  double s = 0;
  for (int r = 0; r < k; ++r) s += static_cast<double>(static_cast<float>(T(value(r, i))));
  return s;
}

}  // namespace

TEST_CASE("staged all-reduce: float exact, bf16 within one rounding, in and out of place") {
  const auto& c = staged();
  const int k = c.size();
  for (std::size_t n : {std::size_t{1}, std::size_t{7}, std::size_t{100003}}) {
    CAPTURE(n);
    DeviceVec<float> f(contribution<float>(c.rank(), n)), out(n);
    out.poison();
    c.allreduce(f.ptr, out.ptr, n, ReduceOp::sum);
    c.allreduce(f.ptr, n, ReduceOp::avg);
    const auto sum = out.download(), avg = f.download();
    DeviceVec<bf16> b(contribution<bf16>(c.rank(), n));
    c.allreduce(b.ptr, n, ReduceOp::sum);
    const auto bsum = b.download();
    for (std::size_t i = 0; i < n; ++i) {
      const double want = sum_over_ranks(k, i);
      REQUIRE(sum[i] == want);
      REQUIRE(std::abs(avg[i] - want / k) <= 1e-6 * want / k);
      const double bwant = sum_over_ranks<bf16>(k, i);  // then one rounding: within u = 2^-8 relative
      REQUIRE(std::abs(test::as_double(bsum[i]) - bwant) <= std::abs(bwant) * std::ldexp(1.0, -8));
    }
  }
}

TEST_CASE("staged all-gather, in-place reduce-scatter and broadcast") {
  const auto& c = staged();
  const int k = c.size(), r = c.rank();
  const std::size_t n = 1001;
  DeviceVec<float> mine(contribution<float>(r, n)), all(n * static_cast<std::size_t>(k));
  all.poison();
  c.allgather(mine.ptr, all.ptr, n);
  const auto gathered = all.download();
  for (int q = 0; q < k; ++q)
    for (std::size_t i = 0; i < n; ++i) REQUIRE(gathered[static_cast<std::size_t>(q) * n + i] == value(q, i));

  // In place, as NCCL allows: this rank's block of the sum lands at its own offset.
  DeviceVec<float> whole(contribution<float>(r, n * static_cast<std::size_t>(k)));
  float* block = whole.ptr + static_cast<std::size_t>(r) * n;
  c.reduce_scatter(whole.ptr, block, n, ReduceOp::sum);
  const auto reduced = whole.download();
  for (std::size_t i = 0; i < n; ++i) REQUIRE(reduced[static_cast<std::size_t>(r) * n + i] == sum_over_ranks(k, static_cast<std::size_t>(r) * n + i));

  DeviceVec<float> b(contribution<float>(r, n));
  c.broadcast(b.ptr, n, k - 1);
  const auto got = b.download();
  for (std::size_t i = 0; i < n; ++i) REQUIRE(got[i] == value(k - 1, i));
}

TEST_CASE("staged calls act on what the stream ran before them") {
  const auto& c = staged();
  const std::size_t n = 4096;
  DeviceVec<float> x(contribution<float>(c.rank(), n));
  DPML_CHECK_CUDA(cudaMemsetAsync(x.ptr, 0, n * sizeof(float), c.stream()));  // enqueued, not waited for
  c.allreduce(x.ptr, n, ReduceOp::sum);
  for (float v : x.download()) REQUIRE(v == 0.f);
}

TEST_CASE("staged ring of sends and receives in a group") {
  const auto& c = staged();
  const int k = c.size(), r = c.rank();
  const std::size_t n = 1 << 20;  // larger than MPI's eager limit: unbatched, both would block in send
  DeviceVec<float> out(contribution<float>(r, n)), in(n);
  in.poison();
  {
    auto g = c.group();
    c.send(out.ptr, n, (r + 1) % k, 0);
    c.recv(in.ptr, n, (r + k - 1) % k, 0);
  }
  const auto got = in.download();
  for (std::size_t i = 0; i < n; i += 997) REQUIRE(got[i] == value((r + k - 1) % k, i));
}
