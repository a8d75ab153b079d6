#pragma once
// Tensors: TensorView<T, Space> is a non-owning (pointer, shape, strides) triple; Tensor<T, Space>
// owns a contiguous row-major buffer in its space and hands out views. Shapes have up to
// kMaxRank dimensions; strides are in elements. Element access with operator() works only in
// host-accessible spaces; device code takes data() and the shape.
//
// copy(dst, src) moves elements between any two spaces (SpaceCopy), for contiguous views of equal
// shape; a mismatch is an Error naming both shapes.

#include "dpml/core/error.hpp"
#include "dpml/core/memory_space.hpp"

#include <algorithm>
#include <array>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <sstream>
#include <string>
#include <type_traits>
#include <utility>

namespace dpml {

inline constexpr int kMaxRank = 6;

class Shape {
 public:
  constexpr Shape() = default;
  Shape(std::initializer_list<std::int64_t> dims) {
    DPML_REQUIRE(dims.size() <= kMaxRank, "a shape has at most " << kMaxRank << " dimensions, got " << dims.size());
    for (auto d : dims) {
      DPML_REQUIRE(d >= 0, "negative dimension " << d << " in a shape");
      dims_[rank_++] = d;
    }
  }
  template <class It>
  static Shape from_range(It first, It last) {
    Shape s;
    for (; first != last; ++first) {
      DPML_REQUIRE(s.rank_ < kMaxRank && *first >= 0, "bad shape (too many or negative dimensions)");
      s.dims_[s.rank_++] = static_cast<std::int64_t>(*first);
    }
    return s;
  }

  constexpr int rank() const noexcept { return rank_; }
  constexpr std::int64_t operator[](int i) const noexcept { return dims_[i]; }
  constexpr std::int64_t& operator[](int i) noexcept { return dims_[i]; }
  constexpr std::int64_t numel() const noexcept {
    std::int64_t n = 1;
    for (int i = 0; i < rank_; ++i) n *= dims_[i];
    return n;
  }
  constexpr const std::int64_t* begin() const noexcept { return dims_.data(); }
  constexpr const std::int64_t* end() const noexcept { return dims_.data() + rank_; }

  friend constexpr bool operator==(const Shape& a, const Shape& b) noexcept {
    if (a.rank_ != b.rank_) return false;
    for (int i = 0; i < a.rank_; ++i)
      if (a.dims_[i] != b.dims_[i]) return false;
    return true;
  }
  std::string str() const {
    std::ostringstream os;
    os << '(';
    for (int i = 0; i < rank_; ++i) os << (i ? ", " : "") << dims_[i];
    os << ')';
    return os.str();
  }

 private:
  std::array<std::int64_t, kMaxRank> dims_{};
  int rank_ = 0;
};

// Row-major strides of a shape.
inline Shape contiguous_strides(const Shape& shape) {
  Shape strides = shape;
  std::int64_t s = 1;
  for (int i = shape.rank() - 1; i >= 0; --i) {
    strides[i] = s;
    s *= shape[i];
  }
  return strides;
}

template <class T, class Space = HostSpace>
class TensorView {
 public:
  using value_type = T;
  using space = Space;

  TensorView() = default;
  TensorView(T* data, Shape shape) : data_(data), shape_(shape), strides_(contiguous_strides(shape)) {}
  TensorView(T* data, Shape shape, Shape strides) : data_(data), shape_(shape), strides_(strides) {
    DPML_REQUIRE(shape.rank() == strides.rank(), "shape " << shape.str() << " and strides " << strides.str()
                                                           << " differ in rank");
  }
  // A view of const T from a view of T.
  template <class U>
    requires(std::is_same_v<const U, T> && !std::is_same_v<U, T>)
  TensorView(const TensorView<U, Space>& other)  // NOLINT(google-explicit-constructor)
      : data_(other.data()), shape_(other.shape()), strides_(other.strides()) {}

  T* data() const noexcept { return data_; }
  const Shape& shape() const noexcept { return shape_; }
  const Shape& strides() const noexcept { return strides_; }
  int rank() const noexcept { return shape_.rank(); }
  std::int64_t size(int dim) const noexcept { return shape_[dim]; }
  std::int64_t numel() const noexcept { return shape_.numel(); }
  bool empty() const noexcept { return numel() == 0; }
  bool is_contiguous() const noexcept { return strides_ == contiguous_strides(shape_); }

  template <class... I>
  T& operator()(I... idx) const
    requires(Space::host_accessible)
  {
    static_assert(sizeof...(I) <= kMaxRank);
    const std::int64_t ids[] = {static_cast<std::int64_t>(idx)...};
    std::int64_t off = 0;
    for (std::size_t d = 0; d < sizeof...(I); ++d) off += ids[d] * strides_[static_cast<int>(d)];
    return data_[off];
  }
  T& operator[](std::int64_t flat) const
    requires(Space::host_accessible)
  {
    return data_[flat];
  }

  // Same elements, another shape (contiguous views only).
  TensorView reshape(Shape shape) const {
    DPML_REQUIRE(is_contiguous(), "reshape of a non-contiguous view " << shape_.str());
    DPML_REQUIRE(shape.numel() == numel(), "cannot reshape " << shape_.str() << " to " << shape.str());
    return TensorView(data_, shape);
  }
  // Elements [begin, end) along `dim`.
  TensorView slice(int dim, std::int64_t begin, std::int64_t end) const {
    DPML_REQUIRE(dim >= 0 && dim < rank() && 0 <= begin && begin <= end && end <= shape_[dim],
                 "slice [" << begin << ", " << end << ") of dimension " << dim << " of " << shape_.str());
    Shape s = shape_;
    s[dim] = end - begin;
    return TensorView(data_ + begin * strides_[dim], s, strides_);
  }
  // Index `i` along dimension 0, dropping that dimension.
  TensorView select0(std::int64_t i) const {
    DPML_REQUIRE(rank() >= 1 && 0 <= i && i < shape_[0], "index " << i << " out of " << shape_.str());
    return TensorView(data_ + i * strides_[0], Shape::from_range(shape_.begin() + 1, shape_.end()),
                      Shape::from_range(strides_.begin() + 1, strides_.end()));
  }
  T* begin() const noexcept { return data_; }
  T* end() const noexcept { return data_ + numel(); }

 private:
  T* data_ = nullptr;
  Shape shape_;
  Shape strides_;
};

template <class T, class Space = HostSpace>
class Tensor {
 public:
  using value_type = T;
  using space = Space;

  Tensor() = default;
  explicit Tensor(Shape shape) : shape_(shape) {
    static_assert(std::is_trivially_copyable_v<T>, "tensors hold trivially copyable elements");
    capacity_ = static_cast<std::size_t>(shape.numel());
    data_ = static_cast<T*>(Space::allocate(capacity_ * sizeof(T)));
  }
  Tensor(Shape shape, T fill) : Tensor(shape) {
    static_assert(Space::host_accessible, "fill-construct only in host memory; use a kernel elsewhere");
    std::fill(data_, data_ + capacity_, fill);
  }
  Tensor(const Tensor&) = delete;
  Tensor& operator=(const Tensor&) = delete;
  Tensor(Tensor&& o) noexcept { swap(o); }
  Tensor& operator=(Tensor&& o) noexcept {
    Tensor(std::move(o)).swap(*this);
    return *this;
  }
  ~Tensor() { Space::deallocate(data_, capacity_ * sizeof(T)); }

  // Reshape in place, reallocating only when the buffer is too small (contents are not kept then).
  void resize(Shape shape) {
    if (static_cast<std::size_t>(shape.numel()) > capacity_) *this = Tensor(shape);
    shape_ = shape;
  }

  T* data() const noexcept { return data_; }
  const Shape& shape() const noexcept { return shape_; }
  int rank() const noexcept { return shape_.rank(); }
  std::int64_t size(int dim) const noexcept { return shape_[dim]; }
  std::int64_t numel() const noexcept { return shape_.numel(); }
  bool empty() const noexcept { return numel() == 0; }

  TensorView<T, Space> view() const noexcept { return {data_, shape_}; }
  TensorView<const T, Space> cview() const noexcept { return {data_, shape_}; }
  operator TensorView<T, Space>() const noexcept { return view(); }          // NOLINT
  operator TensorView<const T, Space>() const noexcept { return cview(); }   // NOLINT

  template <class... I>
  T& operator()(I... idx) const
    requires(Space::host_accessible)
  {
    return view()(idx...);
  }
  T& operator[](std::int64_t flat) const
    requires(Space::host_accessible)
  {
    return data_[flat];
  }
  T* begin() const noexcept { return data_; }
  T* end() const noexcept { return data_ + numel(); }

  void swap(Tensor& o) noexcept {
    std::swap(data_, o.data_);
    std::swap(shape_, o.shape_);
    std::swap(capacity_, o.capacity_);
  }

 private:
  T* data_ = nullptr;
  Shape shape_;
  std::size_t capacity_ = 0;
};

// Copies src into dst (same shape, both contiguous), across memory spaces.
template <class T, class DstSpace, class SrcSpace>
void copy(TensorView<T, DstSpace> dst, TensorView<const T, SrcSpace> src) {
  DPML_REQUIRE(dst.shape() == src.shape(), "copy between shapes " << dst.shape().str() << " and " << src.shape().str());
  DPML_REQUIRE(dst.is_contiguous() && src.is_contiguous(), "copy needs contiguous views");
  SpaceCopy<DstSpace, SrcSpace>::copy(dst.data(), src.data(), static_cast<std::size_t>(src.numel()) * sizeof(T));
}
template <class T, class DstSpace, class SrcSpace>
void copy(TensorView<T, DstSpace> dst, TensorView<T, SrcSpace> src) {
  copy(dst, TensorView<const T, SrcSpace>(src));
}
template <class T, class DstSpace, class SrcSpace>
void copy(const Tensor<T, DstSpace>& dst, const Tensor<T, SrcSpace>& src) {
  copy(dst.view(), src.cview());
}

// A new tensor in DstSpace holding src's elements.
template <class DstSpace, class T, class SrcSpace>
Tensor<std::remove_const_t<T>, DstSpace> to_space(TensorView<T, SrcSpace> src) {
  Tensor<std::remove_const_t<T>, DstSpace> out(src.shape());
  copy(out.view(), TensorView<const std::remove_const_t<T>, SrcSpace>(src));
  return out;
}

}  // namespace dpml
