#pragma once
// FlatParameters: every parameter of a model moved onto two contiguous buffers in one memory
// space, one of values and one of gradients, in registration order. The optimizer, the gradient
// buckets and ZeRO then work on large contiguous ranges (one collective per bucket, one update
// launch for all ranges) instead of one small tensor at a time; layers keep reading and writing
// through their Params' views, which now point into the buffers.
//
// The buffers are cut into *buckets* of whole parameters, taken from the last parameter backwards
// (the order in which backward finishes them), each holding at least `bucket_elements` unless the
// parameters run out. The layout (FlatLayout) adds zero padding so that
//
//   every parameter starts at a multiple of `align`     (64 elements on a GPU: 16-byte vector
//                                                       loads and cuBLASLt's pointer alignment)
//   every bucket starts and ends at a multiple of       (it splits into `shards` equal parts,
//   align · shards                                      each aligned: ZeRO-1's equal shards)
//
//   values (numel())  [ b_last … | pad ][ … | p_{k-1} pad p_k | pad ]      offsets()[i] = start of p_i
//   grads  (numel())  the same layout                    buckets()[0] = the bucket at the end
//                     (none under ZeRO-2: FlatLayout::grads false, the gradient buckets bind
//                     each bucket's parameters to a slot of their own pool while it collects)
//
// Padding starts at zero in both buffers and stays zero (zero gradients leave zero values alone
// under every update rule). With the default layout on the host (align 1, one shard, one bucket)
// the buffers are the parameters back to back, as before buckets existed.

#include "dpml/core/error.hpp"
#include "dpml/core/parameter.hpp"
#include "dpml/core/tensor.hpp"

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <ranges>
#include <utility>
#include <vector>

namespace dpml {

// Elements every parameter's offset is a multiple of in a space: 1 in host memory, 64 elsewhere
// (128 bytes of bf16, 256 of fp32: every vector width and cuBLASLt's 16-byte requirement).
template <class Space>
inline constexpr std::int64_t flat_alignment = Space::host_accessible ? 1 : 64;

struct FlatLayout {
  std::int64_t align = 1;                                               // parameter offsets: multiples of this
  std::int64_t bucket_elements = std::numeric_limits<std::int64_t>::max();  // at least this many per bucket
  std::int64_t shards = 1;                                              // buckets split into this many equal parts
  bool grads = true;  // a flat gradient buffer; false (ZeRO-2): none, the gradient buckets bind slots
};

// A bucket: parameters [first_param, last_param) in registration order, elements [offset, offset + count)
// of the buffers (padding included: count is a multiple of align · shards).
struct FlatBucket {
  std::size_t first_param = 0, last_param = 0;
  std::int64_t offset = 0, count = 0;
};

template <class T, class Space = HostSpace>
class FlatParameters {
 public:
  using ParamT = Param<T, Space>;

  template <std::ranges::range Params>
  explicit FlatParameters(Params&& params, FlatLayout layout = {.align = flat_alignment<Space>}) : layout_(layout) {
    DPML_REQUIRE(layout.align >= 1 && layout.shards >= 1 && layout.bucket_elements >= 1,
                 "flat parameter layout: align " << layout.align << ", shards " << layout.shards << " and bucket size "
                                                 << layout.bucket_elements << " must be positive");
    for (ParamT* p : params) params_.push_back(p);
    plan();
    values_ = Tensor<T, Space>(Shape{numel_});
    if (layout.grads) grads_ = Tensor<T, Space>(Shape{numel_});
    zero_padding();
    for (std::size_t i = 0; i < params_.size(); ++i)
      params_[i]->bind(values_.data() + offsets_[i], layout.grads ? grads_.data() + offsets_[i] : nullptr);
  }

  FlatParameters(const FlatParameters&) = delete;
  FlatParameters& operator=(const FlatParameters&) = delete;
  // The parameters outlive the flat buffers (a model outlives its trainer): give them back
  // storage of their own, with their current values.
  ~FlatParameters() {
    for (ParamT* p : params_) p->unbind();
  }

  std::int64_t numel() const noexcept { return numel_; }  // padding included
  TensorView<T, Space> values() const noexcept { return values_.view(); }
  TensorView<T, Space> grads() const noexcept { return grads_.view(); }  // empty without one (FlatLayout::grads)
  const std::vector<ParamT*>& params() const noexcept { return params_; }
  const std::vector<std::int64_t>& offsets() const noexcept { return offsets_; }
  const FlatLayout& layout() const noexcept { return layout_; }
  // Production order: buckets()[0] holds the last parameters.
  const std::vector<FlatBucket>& buckets() const noexcept { return buckets_; }
  std::size_t bucket_of(std::size_t param_index) const { return bucket_of_.at(param_index); }
  // Index of a parameter in registration order (for bucket bookkeeping).
  std::size_t index_of(const ParamBase* p) const {
    auto it = std::find(params_.begin(), params_.end(), p);
    DPML_REQUIRE(it != params_.end(), "parameter '" << p->name() << "' is not in this flat buffer");
    return static_cast<std::size_t>(it - params_.begin());
  }

  // ZeRO-3 (parallel/data.hpp keeps each data rank's shard of the values): the whole values buffer
  // goes away, the parameters left without value storage until their bucket is gathered.
  void drop_values() {
    for (ParamT* p : params_) p->set_value_storage(nullptr);
    values_ = Tensor<T, Space>();
  }
  // ZeRO-3's end: a whole values buffer again, each parameter bound to its place in it (zeros in
  // the padding); the caller fills it. Returns it.
  TensorView<T, Space> restore_values() {
    values_ = Tensor<T, Space>(Shape{numel_});
    for (std::size_t i = 0; i < params_.size(); ++i) params_[i]->set_value_storage(values_.data() + offsets_[i]);
    return values_.view();
  }

  void zero_grads() const
    requires(Space::host_accessible)
  {
    std::fill(grads_.begin(), grads_.end(), T(0));
  }

 private:
  static std::int64_t round_up(std::int64_t n, std::int64_t m) { return (n + m - 1) / m * m; }

  // Bucket membership from the back, then offsets from the front.
  void plan() {
    std::vector<std::pair<std::size_t, std::size_t>> members;  // [first, last) per bucket, production order
    for (std::size_t end = params_.size(); end > 0;) {
      std::size_t begin = end;
      std::int64_t n = 0;
      while (begin > 0 && n < layout_.bucket_elements) n += params_[--begin]->numel();
      members.emplace_back(begin, end);
      end = begin;
    }
    const std::int64_t quantum = layout_.align * layout_.shards;
    offsets_.assign(params_.size(), 0);
    bucket_of_.assign(params_.size(), 0);
    buckets_.resize(members.size());
    std::int64_t at = 0;
    for (std::size_t b = members.size(); b-- > 0;) {  // from the buffer's start
      FlatBucket& bucket = buckets_[b];
      bucket.first_param = members[b].first;
      bucket.last_param = members[b].second;
      bucket.offset = at;
      for (std::size_t i = bucket.first_param; i < bucket.last_param; ++i) {
        offsets_[i] = round_up(at, layout_.align);
        at = offsets_[i] + params_[i]->numel();
        bucket_of_[i] = b;
      }
      at = round_up(at, quantum);
      bucket.count = at - bucket.offset;
    }
    numel_ = at;
  }

  // Zeros into every element no parameter covers (copied from the host: the gaps are short).
  void zero_padding() {
    std::vector<std::pair<std::int64_t, std::int64_t>> gaps;  // [begin, end)
    std::int64_t at = 0, widest = 0;
    auto gap_to = [&](std::int64_t end) {
      if (end <= at) return;
      gaps.emplace_back(at, end);
      widest = std::max(widest, end - at);
    };
    for (std::size_t i = 0; i < params_.size(); ++i) {
      gap_to(offsets_[i]);
      at = offsets_[i] + params_[i]->numel();
    }
    gap_to(numel_);
    const std::vector<std::byte> zeros(static_cast<std::size_t>(widest) * sizeof(T), std::byte{0});
    for (const auto& [begin, end] : gaps)
      for (T* base : {values_.data(), grads_.data()})
        if (base != nullptr)
          SpaceCopy<Space, HostSpace>::copy(base + begin, zeros.data(), static_cast<std::size_t>(end - begin) * sizeof(T));
  }

  FlatLayout layout_;
  std::vector<ParamT*> params_;
  std::vector<std::int64_t> offsets_;
  std::vector<FlatBucket> buckets_;
  std::vector<std::size_t> bucket_of_;
  std::int64_t numel_ = 0;
  Tensor<T, Space> values_, grads_;
};

}  // namespace dpml
