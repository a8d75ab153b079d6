// comm::Nccl on one GPU per rank: every collective element by element (float, int32 exactly; bf16
// sums within bf16 tolerance), at odd sizes, in and out of place; batched sends and receives; a
// ring; comm::CopyEngine's all-reduce on the copy engines; the refusal of a GPU index that does
// not exist; and (hidden, its own CTest entry) the timeout message when a peer skips a
// collective. Run with as many ranks as GPUs (2 in CTest); where a node has fewer GPUs than ranks
// the program exits 77 (skipped).
#include "../cuda/device.hpp"
#include "nccl_fixture.hpp"

#include <dpml/comm/local_rank.hpp>
#include <dpml/comm/nccl.hpp>
#include <dpml/comm/nccl_copy_engine.hpp>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <numeric>
#include <type_traits>
#include <vector>

using namespace dpml;
using comm::ReduceOp;
using test::DeviceVec;

namespace {
template <class T>
double dbl(T v) {
  if constexpr (std::is_same_v<T, bf16>)
    return static_cast<double>(static_cast<float>(v));
  else
    return static_cast<double>(v);
}
// The value rank r contributes at index i: distinct per (r, i), exact in float and int32; in bf16
// the host rounds it as the device holds it, so moved values compare exactly.
template <class T>
T value(int r, std::size_t i) {
  return T(static_cast<float>((static_cast<long long>(i) % 997) * 3 + r * 7 + 1));
}
double dvalue(int r, std::size_t i) { return dbl(value<float>(r, i)); }

const std::size_t kSizes[] = {1, 7, 1000003};
int chosen_device = -1;  // by comm::select_device, in nccl()

// One communicator (and GPU) per process, shared by the tests. It enqueues on the legacy default
// stream (0), so the tests' cudaMemcpy/cudaMemset (DeviceVec) are ordered before the collectives.
// Never destroyed: a static's destructor would run after the CUDA runtime has shut down.
const comm::Nccl& nccl() {
  static const comm::Nccl* c = [] {
    chosen_device = test::gpu_per_rank();
    return new comm::Nccl(comm::Nccl::from(test::world(), nullptr));
  }();
  return *c;
}

template <class T>
std::vector<T> contribution(int r, std::size_t n, std::size_t offset = 0) {
  std::vector<T> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = value<T>(r, offset + i);
  return v;
}

// Elements of `got` differing from `want` by more than tol·|want| (exact for tol = 0).
template <class T>
std::size_t mismatches(const std::vector<T>& got, const std::vector<double>& want, double tol = 0) {
  std::size_t bad = 0;
  for (std::size_t i = 0; i < want.size(); ++i) {
    const double g = dbl(got[i]);
    bad += !(std::abs(g - want[i]) <= tol * std::abs(want[i]));
  }
  return bad;
}

template <class T>
double tolerance() {
  return std::is_same_v<T, bf16> ? 1.0 / 128 : 0.0;  // sums rounded to bf16: 8 significant bits
}
}  // namespace

TEMPLATE_TEST_CASE("Nccl allreduce sum, avg, max, min, in and out of place", "[nccl]", float, bf16, std::int32_t) {
  const auto& c = nccl();
  const int p = c.size();
  for (std::size_t n : kSizes) {
    CAPTURE(n);
    DeviceVec<TestType> send(contribution<TestType>(c.rank(), n)), out(n);
    std::vector<double> sum(n), avg(n), hi(n), lo(n);
    for (std::size_t i = 0; i < n; ++i) {
      for (int r = 0; r < p; ++r) sum[i] += dbl(value<TestType>(r, i));
      avg[i] = sum[i] / p;
      hi[i] = dbl(value<TestType>(p - 1, i));
      lo[i] = dbl(value<TestType>(0, i));
    }

    out.poison();
    c.allreduce(send.ptr, out.ptr, n, ReduceOp::sum);
    CHECK(mismatches(out.download(), sum, tolerance<TestType>()) == 0);

    DeviceVec<TestType> inplace(contribution<TestType>(c.rank(), n));
    c.iallreduce(inplace.ptr, n, ReduceOp::max).wait();
    CHECK(mismatches(inplace.download(), hi) == 0);

    out.poison();
    c.allreduce(send.ptr, out.ptr, n, ReduceOp::min);
    CHECK(mismatches(out.download(), lo) == 0);

    if constexpr (!std::is_same_v<TestType, std::int32_t>) {
      out.poison();
      c.allreduce(send.ptr, out.ptr, n, ReduceOp::avg);
      CHECK(mismatches(out.download(), avg, std::max(tolerance<TestType>(), 1e-6)) == 0);
    }
  }
}

TEMPLATE_TEST_CASE("Nccl broadcast from every root", "[nccl]", float, bf16, std::int32_t) {
  const auto& c = nccl();
  for (std::size_t n : kSizes)
    for (int root = 0; root < c.size(); ++root) {
      CAPTURE(n, root);
      DeviceVec<TestType> buf(contribution<TestType>(c.rank(), n));
      c.broadcast(buf.ptr, n, root);
      std::vector<double> want(n);
      for (std::size_t i = 0; i < n; ++i) want[i] = dbl(value<TestType>(root, i));
      CHECK(mismatches(buf.download(), want) == 0);
    }
}

TEMPLATE_TEST_CASE("Nccl allgather, in and out of place, and allgatherv", "[nccl]", float, bf16, std::int32_t) {
  const auto& c = nccl();
  const int p = c.size();
  for (std::size_t n : kSizes) {
    CAPTURE(n);
    const std::size_t total = n * static_cast<std::size_t>(p);
    std::vector<double> want(total);
    for (int r = 0; r < p; ++r)
      for (std::size_t i = 0; i < n; ++i) want[static_cast<std::size_t>(r) * n + i] = dbl(value<TestType>(r, i));

    DeviceVec<TestType> send(contribution<TestType>(c.rank(), n)), out(total);
    out.poison();
    c.iallgather(send.ptr, out.ptr, n).wait();
    CHECK(mismatches(out.download(), want) == 0);

    out.poison();  // in place: this rank's block already sits in the output
    DPML_CHECK_CUDA(cudaMemcpy(out.ptr + static_cast<std::size_t>(c.rank()) * n, send.ptr, n * sizeof(TestType),
                               cudaMemcpyDeviceToDevice));
    c.allgather(out.ptr + static_cast<std::size_t>(c.rank()) * n, out.ptr, n);
    CHECK(mismatches(out.download(), want) == 0);
  }
  // Uneven blocks: rank r sends 1000·r + 3 elements, rank 1 none.
  std::vector<int> counts(static_cast<std::size_t>(p));
  for (int r = 0; r < p; ++r) counts[static_cast<std::size_t>(r)] = r == 1 ? 0 : 1000 * r + 3;
  const std::size_t total = static_cast<std::size_t>(std::accumulate(counts.begin(), counts.end(), 0));
  std::vector<double> want;
  for (int r = 0; r < p; ++r)
    for (int i = 0; i < counts[static_cast<std::size_t>(r)]; ++i)
      want.push_back(dbl(value<TestType>(r, static_cast<std::size_t>(i))));
  DeviceVec<TestType> send(contribution<TestType>(c.rank(), static_cast<std::size_t>(counts[static_cast<std::size_t>(c.rank())])));
  DeviceVec<TestType> out(total);
  out.poison();
  c.iallgatherv(send.ptr, out.ptr, counts).wait();
  CHECK(mismatches(out.download(), want) == 0);
}

TEMPLATE_TEST_CASE("Nccl reduce_scatter (sum, avg) and reduce_scatterv", "[nccl]", float, bf16, std::int32_t) {
  const auto& c = nccl();
  const int p = c.size();
  const auto mine = static_cast<std::size_t>(c.rank());
  for (std::size_t n : kSizes) {
    CAPTURE(n);
    const std::size_t total = n * static_cast<std::size_t>(p);
    DeviceVec<TestType> send(contribution<TestType>(c.rank(), total)), out(n);
    std::vector<double> sum(n);
    for (std::size_t i = 0; i < n; ++i)
      for (int r = 0; r < p; ++r) sum[i] += dbl(value<TestType>(r, mine * n + i));
    out.poison();
    c.ireduce_scatter(send.ptr, out.ptr, n, ReduceOp::sum).wait();
    CHECK(mismatches(out.download(), sum, tolerance<TestType>()) == 0);

    if constexpr (!std::is_same_v<TestType, std::int32_t>) {  // in place, averaged
      c.reduce_scatter(send.ptr, send.ptr + mine * n, n, ReduceOp::avg);
      const std::vector<TestType> all = send.download();
      const std::vector<TestType> got(all.begin() + static_cast<std::ptrdiff_t>(mine * n),
                                      all.begin() + static_cast<std::ptrdiff_t>((mine + 1) * n));
      std::vector<double> avg(sum);
      for (double& a : avg) a /= p;
      CHECK(mismatches(got, avg, std::max(tolerance<TestType>(), 1e-6)) == 0);
    }
  }
  std::vector<int> counts(static_cast<std::size_t>(p));
  for (int r = 0; r < p; ++r) counts[static_cast<std::size_t>(r)] = 777 * r + 5;
  const std::size_t total = static_cast<std::size_t>(std::accumulate(counts.begin(), counts.end(), 0));
  const std::size_t offset = static_cast<std::size_t>(std::accumulate(counts.begin(), counts.begin() + c.rank(), 0));
  std::vector<double> want(static_cast<std::size_t>(counts[mine]));
  for (std::size_t i = 0; i < want.size(); ++i)
    for (int r = 0; r < p; ++r) want[i] += dbl(value<TestType>(r, offset + i));
  DeviceVec<TestType> send(contribution<TestType>(c.rank(), total)), out(want.size());
  out.poison();
  c.reduce_scatterv(send.ptr, out.ptr, counts, ReduceOp::sum);
  CHECK(mismatches(out.download(), want, tolerance<TestType>()) == 0);
  if constexpr (!std::is_same_v<TestType, std::int32_t>) {
    for (double& x : want) x /= p;
    out.poison();
    c.ireduce_scatterv(send.ptr, out.ptr, counts, ReduceOp::avg).wait();
    CHECK(mismatches(out.download(), want, std::max(tolerance<TestType>(), 1e-6)) == 0);
  }
}

TEST_CASE("Nccl send/recv: a ring, and several messages batched in one group", "[nccl]") {
  const auto& c = nccl();
  const int p = c.size(), next = (c.rank() + 1) % p, prev = (c.rank() + p - 1) % p;
  const std::size_t n = 1000003;
  {
    DeviceVec<float> send(contribution<float>(c.rank(), n)), got(n);
    got.poison();
    comm::Nccl::Request sent, received;
    {
      auto g = c.group();
      sent = c.isend(send.ptr, n, next, 0);
      received = c.irecv(got.ptr, n, prev, 0);
    }  // the group launches here; the requests record their events when first waited on
    received.wait();
    sent.wait();
    CHECK(!sent.pending());
    std::vector<double> want(n);
    for (std::size_t i = 0; i < n; ++i) want[i] = dvalue(prev, i);
    CHECK(mismatches(got.download(), want) == 0);
  }
  // Three messages of different sizes and types to every other rank, all in one group.
  const std::size_t sizes[] = {1, 7, 4099};
  std::vector<std::unique_ptr<DeviceVec<std::int32_t>>> ints;
  std::vector<std::unique_ptr<DeviceVec<bf16>>> halves;
  std::vector<std::pair<int, std::size_t>> expect_int, expect_bf16;  // (from, size), in posting order
  {
    auto g = c.group();
    for (int peer = 0; peer < p; ++peer) {
      if (peer == c.rank()) continue;
      for (std::size_t s : sizes) {
        ints.push_back(std::make_unique<DeviceVec<std::int32_t>>(contribution<std::int32_t>(c.rank(), s)));
        c.send(ints.back()->ptr, s, peer, 0);
        halves.push_back(std::make_unique<DeviceVec<bf16>>(contribution<bf16>(c.rank(), s, 11)));
        c.send(halves.back()->ptr, s, peer, 0);
      }
      for (std::size_t s : sizes) {
        ints.push_back(std::make_unique<DeviceVec<std::int32_t>>(s));
        ints.back()->poison();
        c.recv(ints.back()->ptr, s, peer, 0);
        expect_int.emplace_back(peer, ints.size() - 1);
        halves.push_back(std::make_unique<DeviceVec<bf16>>(s));
        halves.back()->poison();
        c.recv(halves.back()->ptr, s, peer, 0);
        expect_bf16.emplace_back(peer, halves.size() - 1);
      }
    }
  }
  c.request().wait();
  for (auto [from, k] : expect_int) {
    const auto got = ints[k]->download();
    std::vector<double> want(got.size());
    for (std::size_t i = 0; i < want.size(); ++i) want[i] = dvalue(from, i);
    CAPTURE(from, got.size());
    CHECK(mismatches(got, want) == 0);
  }
  for (auto [from, k] : expect_bf16) {
    const auto got = halves[k]->download();
    std::vector<double> want(got.size());
    for (std::size_t i = 0; i < want.size(); ++i) want[i] = dbl(value<bf16>(from, 11 + i));
    CAPTURE(from, got.size());
    CHECK(mismatches(got, want) == 0);
  }
}

TEST_CASE("Nccl on a stream of its own: barrier and request completion", "[nccl]") {
  nccl();  // device chosen
  const auto own = comm::Nccl::from(test::world());
  CHECK(own.stream() != nullptr);
  own.barrier();
  const std::size_t n = 1000003;
  DeviceVec<float> buf(contribution<float>(own.rank(), n));
  DPML_CHECK_CUDA(cudaDeviceSynchronize());  // the upload ran on the default stream
  auto req = own.iallreduce(buf.ptr, n, ReduceOp::sum);
  CHECK(req.pending());
  req.wait();
  CHECK(!req.pending());
  CHECK(req.test());
  std::vector<double> want(n);
  for (std::size_t i = 0; i < n; ++i)
    for (int r = 0; r < own.size(); ++r) want[i] += dvalue(r, i);
  CHECK(mismatches(buf.download(), want) == 0);
}

// Nccl::on: a handle of the same NCCL communicator on another stream (no new communicator).
// Calls through the two handles, each on its stream, back to back with no host wait between
// them, sum correctly; an abort through one ends the communicator for both.
TEST_CASE("Nccl::on shares the communicator on another stream; an abort through it ends both", "[nccl]") {
  nccl();  // device chosen
  auto own = comm::Nccl::from(test::world());
  cudaStream_t other = nullptr;
  DPML_CHECK_CUDA(cudaStreamCreateWithFlags(&other, cudaStreamNonBlocking));
  {
    auto view = own.on(other);
    CHECK(view.native() == own.native());
    CHECK(view.stream() == other);
    CHECK(view.rank() == own.rank());
    CHECK(view.size() == own.size());
    const std::size_t n = 100003;
    DeviceVec<float> a(contribution<float>(own.rank(), n));
    DeviceVec<float> b(contribution<float>(own.rank(), n, 5));
    DPML_CHECK_CUDA(cudaDeviceSynchronize());  // the uploads ran on the default stream
    for (int round = 0; round < 3; ++round) {
      own.allreduce(a.ptr, n, ReduceOp::sum);
      view.allreduce(b.ptr, n, ReduceOp::sum);
    }
    view.request().wait();
    own.request().wait();
    std::vector<double> want_a(n), want_b(n);
    const double ranks = own.size();
    for (std::size_t i = 0; i < n; ++i)
      for (int r = 0; r < own.size(); ++r) {
        want_a[i] += dvalue(r, i) * ranks * ranks;  // three rounds: × size each, after the first sum
        want_b[i] += dvalue(r, i + 5) * ranks * ranks;
      }
    CHECK(mismatches(a.download(), want_a) == 0);
    CHECK(mismatches(b.download(), want_b) == 0);
    view.abort();
    CHECK(own.native() == nullptr);
    CHECK(view.native() == nullptr);
  }
  DPML_CHECK_CUDA(cudaStreamDestroy(other));
}

// comm::CopyEngine: in-place all-reduces of ranges of a registered buffer (odd sizes and offsets:
// the halves' split and the kernel's scalar tail) enqueued back to back with no host wait, three
// rounds on the same buffer (its receive buffer reused, the flags counting on), against float64
// sums; the elements outside the ranges untouched; the same bits on both ranks. Then 40 calls
// on one range, each doubling it exactly, and an unregistered buffer (NCCL's path).
TEMPLATE_TEST_CASE("CopyEngine all-reduces a registered buffer on the copy engines", "[nccl][copy-engine]", float, bf16) {
  nccl();  // device chosen
  auto ce = comm::CopyEngine::from(test::world(), nullptr);  // the legacy stream, as DeviceVec's copies
  const int rank = ce.rank();
  const std::size_t total = std::size_t{1} << 21;
  DeviceVec<TestType> buf(total);
  ce.register_buffer(buf.ptr, total * sizeof(TestType));
  struct Range {
    std::size_t begin, n;
  };
  const Range ranges[] = {{0, 1}, {3, 7}, {64, 127}, {1000, 1000003}, {total - 200001, 200001}};
  const TestType untouched = TestType(-5.0f - static_cast<float>(rank));
  for (int round = 0; round < 3; ++round) {
    CAPTURE(round);
    const ReduceOp op = round == 1 ? ReduceOp::avg : ReduceOp::sum;
    std::vector<TestType> mine(total, untouched);
    std::vector<double> want(total, dbl(untouched));
    for (const Range& g : ranges)
      for (std::size_t i = g.begin; i < g.begin + g.n; ++i) {
        mine[i] = value<TestType>(rank, i + 13 * round);
        want[i] = 0;
        for (int r = 0; r < 2; ++r) want[i] += dbl(value<TestType>(r, i + 13 * round));
        if (op == ReduceOp::avg) want[i] /= 2;
      }
    buf.upload(mine);
    for (const Range& g : ranges) ce.allreduce(buf.ptr + g.begin, g.n, op);
    const std::vector<TestType> got = buf.download();
    CHECK(mismatches(got, want, tolerance<TestType>()) == 0);
    std::vector<float> reduced(total, 0.f);  // the ranges' results (outside, each rank keeps its own marker)
    for (const Range& g : ranges)
      for (std::size_t i = g.begin; i < g.begin + g.n; ++i) reduced[i] = static_cast<float>(dbl(got[i]));
    CHECK(test::same_on_every_rank(reduced));
  }

  const std::size_t n = 4099, at = 77;  // 40 calls back to back: 2^39 · round(a + b), exactly
  std::vector<TestType> mine(total, untouched);
  for (std::size_t i = 0; i < n; ++i) mine[at + i] = value<TestType>(rank, i);
  buf.upload(mine);
  for (int k = 0; k < 40; ++k) ce.allreduce(buf.ptr + at, n, ReduceOp::sum);
  const std::vector<TestType> got = buf.download();
  std::vector<double> doubled(n);
  std::vector<TestType> slice(got.begin() + at, got.begin() + at + n);
  for (std::size_t i = 0; i < n; ++i)
    doubled[i] = dbl(TestType(static_cast<float>(dbl(value<TestType>(0, i)) + dbl(value<TestType>(1, i))))) *
                 std::ldexp(1.0, 39);
  CHECK(mismatches(slice, doubled) == 0);

  DeviceVec<TestType> other(contribution<TestType>(rank, 1000));  // not registered: NCCL's all-reduce
  ce.allreduce(other.ptr, 1000, ReduceOp::sum);
  std::vector<double> sum(1000);
  for (std::size_t i = 0; i < 1000; ++i) sum[i] = dbl(value<TestType>(0, i)) + dbl(value<TestType>(1, i));
  CHECK(mismatches(other.download(), sum, tolerance<TestType>()) == 0);
}

TEST_CASE("a GPU index that does not exist is refused with its number", "[nccl]") {
  nccl();
  const int count = cuda_device_count();
  const std::string msg = test::error_of([&] { comm::set_device(count); });
  CHECK(msg.find("CUDA device " + std::to_string(count) + " does not exist") != std::string::npos);
  CHECK(msg.find("sees " + std::to_string(count) + " device") != std::string::npos);
  int current = -1;
  DPML_CHECK_CUDA(cudaGetDevice(&current));
  CHECK(current == chosen_device);  // unchanged by the refusal
}

// A peer that never joins a collective: the waiting rank gets the timeout message, not a hang.
// Hidden ([.]): CTest runs it as a program of its own (test_nccl_lost_peer_np2), since it leaves
// a kernel to be cancelled by ncclCommAbort.
TEST_CASE("a peer that skips a collective gives a timeout message", "[.][lost-peer]") {
  nccl();  // device chosen
  const auto w = test::world();
  auto lost = comm::Nccl::from(w);
  lost.set_timeout(2.0);
  DeviceVec<float> buf(1000);
  DPML_CHECK_CUDA(cudaDeviceSynchronize());
  // Once together, so that NCCL's connections for this call exist (it makes them lazily, on the
  // host, at the first call, and would wait there for the absent peer instead).
  lost.iallreduce(buf.ptr, 1000, ReduceOp::sum).wait();
  std::string msg = "(rank 1 posts nothing)";
  if (w.rank() == 0) {
    auto req = lost.iallreduce(buf.ptr, 1000, ReduceOp::sum);
    msg = test::error_of([&] { req.wait(); });
  }
  w.barrier();
  lost.abort();  // rank 0: cancels the stuck all-reduce; rank 1: nothing in flight
  CAPTURE(msg);
  if (w.rank() == 0) {
    CHECK(msg.find("did not complete within 2") != std::string::npos);
    CHECK(msg.find("rank 0 of " + std::to_string(w.size())) != std::string::npos);
  }
  DPML_CHECK_CUDA(cudaDeviceSynchronize());  // the cancelled kernel has ended
}
