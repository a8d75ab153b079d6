#pragma once
// A bump arena for activations: allocate() hands out aligned slices of large blocks and never
// frees them one by one; reset() forgets them all at once (e.g. at the end of a step). When a
// block runs out a new one is chained, so earlier pointers stay valid; at reset() the blocks are
// merged into one of the high-water size, so that a steady-state step allocates nothing.

#include "dpml/core/memory_space.hpp"
#include "dpml/core/tensor.hpp"

#include <algorithm>
#include <cstddef>
#include <vector>

namespace dpml {

template <class Space = HostSpace>
class Arena {
 public:
  static constexpr std::size_t kAlign = 256;

  explicit Arena(std::size_t initial_bytes = 0) {
    if (initial_bytes) add_block(initial_bytes);
  }
  Arena(const Arena&) = delete;
  Arena& operator=(const Arena&) = delete;
  ~Arena() { release_blocks(); }

  void* allocate_bytes(std::size_t bytes) {
    bytes = round_up(std::max<std::size_t>(bytes, 1));
    if (blocks_.empty() || blocks_.back().used + bytes > blocks_.back().size)
      add_block(std::max(bytes, blocks_.empty() ? bytes : blocks_.back().size * 2));
    Block& b = blocks_.back();
    void* p = static_cast<std::byte*>(b.data) + b.used;
    b.used += bytes;
    in_use_ += bytes;
    high_water_ = std::max(high_water_, in_use_);
    return p;
  }
  template <class T>
  TensorView<T, Space> allocate(Shape shape) {
    return {static_cast<T*>(allocate_bytes(static_cast<std::size_t>(shape.numel()) * sizeof(T))), shape};
  }

  // Forget every allocation; keep (or grow to) one block of the high-water size.
  void reset() {
    if (blocks_.size() > 1) {
      release_blocks();
      add_block(high_water_);
    }
    if (!blocks_.empty()) blocks_.back().used = 0;
    in_use_ = 0;
  }

  std::size_t bytes_in_use() const noexcept { return in_use_; }
  std::size_t high_water() const noexcept { return high_water_; }
  std::size_t capacity() const noexcept {
    std::size_t c = 0;
    for (const auto& b : blocks_) c += b.size;
    return c;
  }

 private:
  struct Block {
    void* data;
    std::size_t size, used;
  };
  static std::size_t round_up(std::size_t n) { return (n + kAlign - 1) / kAlign * kAlign; }
  void add_block(std::size_t bytes) {
    bytes = round_up(bytes);
    blocks_.push_back({Space::allocate(bytes), bytes, 0});
  }
  void release_blocks() noexcept {
    for (auto& b : blocks_) Space::deallocate(b.data, b.size);
    blocks_.clear();
  }
  std::vector<Block> blocks_;
  std::size_t in_use_ = 0, high_water_ = 0;
};

}  // namespace dpml
