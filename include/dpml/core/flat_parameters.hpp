#pragma once
// FlatParameters: every parameter of a model moved onto two contiguous buffers, one of values and
// one of gradients, in registration order. The optimizer, the gradient buckets and ZeRO then work
// on large contiguous ranges (one all-reduce per bucket, one update loop per shard) instead of one
// small tensor at a time.
//
//   values (n_total)   [ p0 | p1 | … | pk ]     offsets()[i] = start of parameter i
//   grads  (n_total)   [ p0 | p1 | … | pk ]

#include "dpml/core/parameter.hpp"
#include "dpml/core/tensor.hpp"

#include <algorithm>
#include <cstdint>
#include <ranges>
#include <vector>

namespace dpml {

template <class T, class Space = HostSpace>
class FlatParameters {
 public:
  using ParamT = Param<T, Space>;

  template <std::ranges::range Params>
  explicit FlatParameters(Params&& params) {
    std::int64_t total = 0;
    for (ParamT* p : params) {
      params_.push_back(p);
      offsets_.push_back(total);
      total += p->numel();
    }
    values_ = Tensor<T, Space>(Shape{total});
    grads_ = Tensor<T, Space>(Shape{total});
    for (std::size_t i = 0; i < params_.size(); ++i)
      params_[i]->bind(values_.data() + offsets_[i], grads_.data() + offsets_[i]);
  }

  FlatParameters(const FlatParameters&) = delete;
  FlatParameters& operator=(const FlatParameters&) = delete;
  // The parameters outlive the flat buffers (a model outlives its trainer): give them back
  // storage of their own, with their current values.
  ~FlatParameters() {
    for (ParamT* p : params_) p->unbind();
  }

  std::int64_t numel() const noexcept { return values_.numel(); }
  TensorView<T, Space> values() const noexcept { return values_.view(); }
  TensorView<T, Space> grads() const noexcept { return grads_.view(); }
  const std::vector<ParamT*>& params() const noexcept { return params_; }
  const std::vector<std::int64_t>& offsets() const noexcept { return offsets_; }
  // Index of a parameter in registration order (for bucket bookkeeping).
  std::size_t index_of(const ParamBase* p) const {
    auto it = std::find(params_.begin(), params_.end(), p);
    DPML_REQUIRE(it != params_.end(), "parameter '" << p->name() << "' is not in this flat buffer");
    return static_cast<std::size_t>(it - params_.begin());
  }

  void zero_grads() const
    requires(Space::host_accessible)
  {
    std::fill(grads_.begin(), grads_.end(), T(0));
  }

 private:
  std::vector<ParamT*> params_;
  std::vector<std::int64_t> offsets_;
  Tensor<T, Space> values_, grads_;
};

}  // namespace dpml
