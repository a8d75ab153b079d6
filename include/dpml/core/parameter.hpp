#pragma once
// Parameters: a named value tensor, its gradient, and how it is sharded across the process grid.
// They sit in core/, below layers/ and parallel/, because both speak of them: layers own them,
// the parallel runtime (flat buffers, gradient buckets, ZeRO) and the optimizer update them.
//
// A layer owns its Params. Each starts with storage of its own; flatten_parameters() (optim/…)
// may later rebind every Param of a model onto two flat buffers (values, gradients), so that the
// optimizer and the gradient buckets work on large contiguous ranges. Layers therefore always
// read and write through value()/grad() views, never through a stored tensor (under ZeRO-2 a
// gradient's storage changes from one round to the next: GradProvider below; under ZeRO-3 a
// value's too: ValueProvider), and use a view only while the operation that asked for it runs.
//
// Sharding says which dimension of the *global* tensor is split across which axis (tensor
// parallel weights), or that the tensor is replicated. Every parameter is also replicated along
// the data axis (its gradient is reduced there) unless ZeRO shards its optimizer state.

#include "dpml/core/axis.hpp"
#include "dpml/core/error.hpp"
#include "dpml/core/tensor.hpp"

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>

namespace dpml {

// How a parameter is initialised: drawn once from its *global* index, so that every layout
// (tp, pp, dp) starts from the same global weights. See layers/init.hpp.
struct Init {
  enum class Kind { constant, uniform, normal } kind = Kind::constant;
  double a = 0.0;  // constant: value; uniform: low;  normal: mean
  double b = 0.0;  //                  uniform: high; normal: standard deviation
  // Elements [fill_begin, fill_end) of the global tensor (row-major flat index) start at `fill`
  // instead of a draw: an LSTM's forget-gate quarter of its bias. Empty unless with_fill says.
  std::int64_t fill_begin = 0, fill_end = 0;
  double fill = 0.0;
  static Init constant(double v) { return {Kind::constant, v, 0.0}; }
  static Init uniform(double lo, double hi) { return {Kind::uniform, lo, hi}; }
  static Init normal(double mean, double std) { return {Kind::normal, mean, std}; }
  Init with_fill(std::int64_t begin, std::int64_t end, double value) const {
    Init i = *this;
    i.fill_begin = begin, i.fill_end = end, i.fill = value;
    return i;
  }
};

// The order of a parameter's elements in memory, as a permutation of its dimensions: memory
// dimension i is logical dimension (*this)[i], row-major over those (the identity for nearly every
// parameter). A parameter keeps ONE logical shape and name on every space — what initialisation by
// global index and checkpoints speak of — and a space whose kernels want another order stores it
// permuted: a convolution's weight, logical (Cout, Cin, kh, kw), lies (Cout, kh, kw, Cin) on a GPU
// (kernels::Ops<Space>::conv_weight_order). value() and grad() are views of the memory (their shape
// is the logical one, their elements in storage order); what crosses spaces or leaves the process
// (initialisation, copies between models, checkpoints) converts on the host with to_storage_order
// and to_logical_order below, everything else (flat buffers, reductions, optimizers) is
// element-wise and does not care.
class StorageOrder {
 public:
  StorageOrder() = default;  // the identity
  template <std::size_t R>
  explicit StorageOrder(const std::array<int, R>& dims) {
    static_assert(R <= kMaxRank);
    for (std::size_t i = 0; i < R; ++i) dims_[i] = dims[i];
  }
  int operator[](int i) const noexcept { return dims_[static_cast<std::size_t>(i)]; }
  bool is_identity() const noexcept {
    for (int i = 0; i < kMaxRank; ++i)
      if ((*this)[i] != i) return false;
    return true;
  }
  // Whether this is a permutation of the first `rank` dimensions (and the identity beyond).
  bool permutes(int rank) const noexcept {
    std::array<bool, kMaxRank> seen{};
    for (int i = 0; i < kMaxRank; ++i) {
      const int d = (*this)[i];
      if (d < 0 || d >= kMaxRank || seen[static_cast<std::size_t>(d)] || (i >= rank && d != i) || (i < rank && d >= rank))
        return false;
      seen[static_cast<std::size_t>(d)] = true;
    }
    return true;
  }
  friend bool operator==(const StorageOrder&, const StorageOrder&) = default;

 private:
  std::array<int, kMaxRank> dims_{0, 1, 2, 3, 4, 5};
};

struct Sharding {
  int dim = -1;                       // split dimension of the global tensor; -1 = replicated
  Axis axis = Axis::tensor;
  static Sharding replicated() { return {}; }
  static Sharding split(int dim, Axis axis = Axis::tensor) { return {dim, axis}; }
  bool is_replicated() const noexcept { return dim < 0; }
};

class ParamBase;
// Where a parameter without gradient storage gets some (ZeRO-2, parallel/data.hpp: gradients live
// in a pool of bucket slots, bound while their bucket collects a round of them): provide(p) binds
// p's gradient, and its bucket's, before p.grad() returns.
class GradProvider {
 public:
  virtual void provide(ParamBase& p) = 0;

 protected:
  ~GradProvider() = default;
};

// Where a parameter without value storage gets it (ZeRO-3, parallel/data.hpp: each data rank holds
// a shard of the values; a bucket's whole values are all-gathered into a slot of a small pool when
// one of its parameters is read): provide_value(p) binds p's value, and its bucket's, before
// p.value() returns. The call is collective over the data axis: every data rank reads the same
// parameters in the same order (the model's forward and backward do). value_read(p) hears every
// other read of a value the provider bound, so that the pool gives back the bucket read least
// recently: one operation reads its weight and bias (two buckets) before it runs, and the second
// read must not take the first one's slot.
class ValueProvider {
 public:
  virtual void provide_value(ParamBase& p) = 0;
  virtual void value_read(const ParamBase& p) = 0;

 protected:
  ~ValueProvider() = default;
};

// What every parameter is, whatever its element type and memory space: a name, how it is
// initialised and sharded, and its shape. Gradient-ready reports (layers::Context::grad_ready) and
// the bucket bookkeeping of the parallel runtime speak of parameters through this base, so that
// one hook serves fp32, fp64 and bf16 parameters on either space.
class ParamBase {
 public:
  ParamBase() = default;
  ParamBase(std::string name, Shape shape, Init init, Sharding sharding)
      : name_(std::move(name)), shape_(shape), init_(init), sharding_(sharding) {}

  const std::string& name() const noexcept { return name_; }
  // Containers prefix their children's names ("3.conv.weight"); names key the initialisation
  // and checkpoint tensors, so they must be the same in every layout.
  void prefix_name(const std::string& prefix) { name_ = prefix + "." + name_; }
  const Init& init() const noexcept { return init_; }
  // A copy of a parameter that another rank owns (the tied token embedding on the last pipeline
  // stage): trained in step with it, but counted once in the gradient norm and saved once.
  bool is_duplicate() const noexcept { return duplicate_; }
  void mark_duplicate(bool d = true) noexcept { duplicate_ = d; }
  // Whether the gradient holds zeros that nothing has added to yet: the optimizer's begin_step
  // zeroes the gradients and sets it; a kernel that can write its contribution instead of adding
  // it (a weight-gradient GEMM with beta = 0 skips reading the zeros) asks take_grad_zero(), and
  // every other writer of a parameter that such a kernel also writes (a tied weight) takes it too,
  // so that the first writer of the step alone may overwrite. Left false, every write adds:
  // the same result, only slower.
  void mark_grad_zero(bool z = true) noexcept { grad_zero_ = z; }
  bool take_grad_zero() {
    bind_grad();  // ZeRO-2: a round opened here is zeros, whichever of grad() and this a writer calls first
    return std::exchange(grad_zero_, false);
  }
  // ZeRO-2: a parameter without gradient storage asks its provider (set_grad_provider) for some
  // when its gradient is first written or read; the provider binds it and marks it zero.
  void set_grad_provider(GradProvider* provider) noexcept { provider_ = provider; }
  // ZeRO-3: a parameter without value storage asks its provider for it when its value is read.
  void set_value_provider(ValueProvider* provider) noexcept { value_provider_ = provider; }
  const Sharding& sharding() const noexcept { return sharding_; }
  const Shape& shape() const noexcept { return shape_; }
  std::int64_t numel() const noexcept { return shape_.numel(); }
  // How value() and grad() hold the elements of shape() (StorageOrder above); set by the layer
  // that owns the parameter, from its space's kernels.
  const StorageOrder& storage_order() const noexcept { return order_; }
  void set_storage_order(const StorageOrder& order) {
    DPML_REQUIRE(order.permutes(shape_.rank()), "parameter '" << name_ << "' " << shape_.str()
                                                              << ": the storage order is not a permutation of its "
                                                              << shape_.rank() << " dimensions");
    order_ = order;
  }

 private:
  std::string name_;
  Shape shape_;
  Init init_;
  Sharding sharding_;
  StorageOrder order_;
  bool duplicate_ = false;
  bool grad_zero_ = false;

 protected:
  void bind_grad() {
    if (grad_unbound_ && provider_ != nullptr) provider_->provide(*this);
  }
  void bind_value() {
    if (value_provider_ == nullptr) return;
    if (value_unbound_) value_provider_->provide_value(*this);
    else value_provider_->value_read(*this);
  }
  GradProvider* provider_ = nullptr;
  bool grad_unbound_ = false;  // no gradient storage (set by the derived Param)
  ValueProvider* value_provider_ = nullptr;
  bool value_unbound_ = false;  // no value storage (ZeRO-3; set by the derived Param)
};

namespace detail {
// Walks p's elements in storage order: f(stored flat index, logical flat index).
template <class F>
void for_each_stored(const ParamBase& p, F&& f) {
  const Shape& shape = p.shape();
  const StorageOrder& order = p.storage_order();
  const int r = shape.rank();
  const Shape logical_strides = contiguous_strides(shape);
  std::array<std::int64_t, kMaxRank> idx{}, extent{}, stride{};  // per memory dimension
  for (int i = 0; i < r; ++i) {
    extent[static_cast<std::size_t>(i)] = shape[order[i]];
    stride[static_cast<std::size_t>(i)] = logical_strides[order[i]];
  }
  std::int64_t logical = 0;
  for (std::int64_t stored = 0; stored < p.numel(); ++stored) {
    f(stored, logical);
    for (int i = r - 1; i >= 0; --i) {  // advance the memory multi-index
      const auto u = static_cast<std::size_t>(i);
      logical += stride[u];
      if (++idx[u] < extent[u]) break;
      logical -= stride[u] * extent[u];
      idx[u] = 0;
    }
  }
}
}  // namespace detail

// stored (numel, in p's storage order) from logical (numel, row-major over p.shape()); host memory.
template <class T>
void to_storage_order(const ParamBase& p, const T* logical, T* stored) {
  detail::for_each_stored(p, [&](std::int64_t s, std::int64_t l) { stored[s] = logical[l]; });
}
// logical (row-major over p.shape()) from stored (in p's storage order); host memory.
template <class T>
void to_logical_order(const ParamBase& p, const T* stored, T* logical) {
  detail::for_each_stored(p, [&](std::int64_t s, std::int64_t l) { logical[l] = stored[s]; });
}

template <class T, class Space = HostSpace>
class Param : public ParamBase {
 public:
  using value_type = T;
  using space = Space;

  Param() = default;
  Param(std::string name, Shape shape, Init init, Sharding sharding = Sharding::replicated())
      : ParamBase(std::move(name), shape, init, sharding), own_value_(shape), own_grad_(shape),
        value_(own_value_.view()), grad_(own_grad_.view()) {}
  Param(Param&&) noexcept = default;
  Param& operator=(Param&&) noexcept = default;

  TensorView<T, Space> value() const {
    const_cast<Param&>(*this).bind_value();
    return value_;
  }
  TensorView<T, Space> grad() const {
    const_cast<Param&>(*this).bind_grad();
    return grad_;
  }

  // Move this parameter onto external storage (flat buffers); the current value is copied over
  // and the own storage released. `value` and `grad` each hold numel() elements; grad nullptr:
  // no gradient storage until a GradProvider binds some (ZeRO-2).
  void bind(T* value, T* grad) {
    TensorView<T, Space> v(value, shape()), g(grad, shape());
    copy(v, TensorView<const T, Space>(value_));
    if (grad != nullptr) copy(g, TensorView<const T, Space>(grad_));
    value_ = v;
    grad_ = g;
    grad_unbound_ = grad == nullptr;
    own_value_ = Tensor<T, Space>();
    own_grad_ = Tensor<T, Space>();
  }
  // Back onto storage of its own (copying the current value and gradient, zeros for a gradient
  // that has none), before the external storage goes away.
  void unbind() {
    Tensor<T, Space> v(shape()), g(shape());
    bind_value();  // ZeRO-3: the value gathered once more, to be kept
    copy(v.view(), TensorView<const T, Space>(value_));
    if (grad_.data() != nullptr) copy(g.view(), TensorView<const T, Space>(grad_));
    else copy(g.view(), Tensor<T>(shape(), T(0)).cview());
    own_value_ = std::move(v);
    own_grad_ = std::move(g);
    value_ = own_value_.view();
    grad_ = own_grad_.view();
    provider_ = nullptr;
    grad_unbound_ = false;
    value_provider_ = nullptr;
    value_unbound_ = false;
  }
  // ZeRO-2: a parameter bound by bind(value, nullptr) has no gradient storage of its own; the
  // provider binds some (set_grad_storage) when grad() or take_grad_zero() is first called, and
  // unbinds it (nullptr) once its bucket's round has been reduced.
  void set_grad_storage(T* grad) noexcept {
    grad_ = TensorView<T, Space>(grad, shape());
    grad_unbound_ = grad == nullptr;
  }
  // ZeRO-3: the value's storage in its bucket's gathered slot, or none (nullptr) when the slot is
  // given back; the provider binds it again when the value is next read.
  void set_value_storage(T* value) noexcept {
    value_ = TensorView<T, Space>(value, shape());
    value_unbound_ = value == nullptr;
  }

 private:
  Tensor<T, Space> own_value_, own_grad_;
  TensorView<T, Space> value_, grad_;
};

}  // namespace dpml
