// train/memory.hpp on the host: the resident set now and at most are positive and ordered, and
// holding 64 MiB more (every page written) shows in both. (The GPT's memory estimate that
// train_gpt compares: tests/gpt/test_memory_estimate.cpp.)
#include "test.hpp"

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
