// train/memory.hpp on the host: the resident set now and at most are positive and ordered, and
// holding 64 MiB more (every page written) shows in both. The lower bound that train_gpt's memory
// check compares (models::gpt_memory_lower_bound), with the host's terms and the GPU trainer's.
#include "test.hpp"

#include <dpml/models/gpt.hpp>
#include <dpml/train/memory.hpp>

#include <cstdint>
#include <cstring>
#include <memory>

using namespace dpml;

TEST_CASE("memory_now<HostSpace>: resident now ≤ most resident; 64 MiB written raise both", "[train][memory]") {
  constexpr std::int64_t MiB = 1 << 20;
  const train::MemoryUse before = train::memory_now<HostSpace>();
  CAPTURE(before.current_bytes, before.peak_bytes);
  CHECK(before.current_bytes > 0);
  CHECK(before.peak_bytes >= before.current_bytes);

  const auto block = std::make_unique<char[]>(64 * MiB);
  std::memset(block.get(), 1, 64 * MiB);  // touched: resident
  const train::MemoryUse during = train::memory_now<HostSpace>();
  CAPTURE(during.current_bytes, during.peak_bytes, static_cast<int>(block[64 * MiB - 1]));
  CHECK(during.current_bytes >= before.current_bytes + 60 * MiB);
  CHECK(during.peak_bytes >= before.current_bytes + 60 * MiB);
  CHECK(during.peak_bytes >= during.current_bytes);
}

TEST_CASE("gpt_memory_lower_bound: the host trainer's terms and the GPU trainer's preset", "[train][memory]") {
  const models::GptConfig c{.vocab = 256, .max_seq = 16, .layers = 2, .heads = 2, .dim = 32};
  const double params = 2 * (12 * 32 * 32 + 13 * 32) + 256 * 32;  // the blocks and wte: 33600
  const double logits = 2 * 16 * 256, probabilities = 2 * 2 * 2 * 16 * 16;  // B = 2: (B, T, V), L × (B, H, T, T)
  const auto host = models::gpt_memory_lower_bound(c, 1, 1, 2);
  CHECK(host.state == 16 * params);  // fp32 value, gradient and two moments
  CHECK(host.activations == 4 * (logits + probabilities));
  const auto gpu = models::gpt_memory_lower_bound(c, 1, 1, 2, models::GptMemoryTerms::gpu_trainer());
  CHECK(gpu.state == 16 * params);  // bf16 value and gradient, fp32 master and two moments
  CHECK(gpu.activations == 2 * logits);  // bf16; flash attention keeps no probabilities
  const auto zero = models::gpt_memory_lower_bound(c, 1, 1, 2, models::GptMemoryTerms::gpu_trainer(4));
  CHECK(zero.state == (4 + 12.0 / 4) * params);  // master and moments over 4 data ranks
}
