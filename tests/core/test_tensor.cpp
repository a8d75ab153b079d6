#include "test.hpp"

#include <dpml/core/tensor.hpp>

using namespace dpml;

TEST_CASE("shape: rank, numel, strides, equality", "[tensor]") {
  Shape s{2, 3, 4};
  CHECK(s.rank() == 3);
  CHECK(s.numel() == 24);
  CHECK(contiguous_strides(s) == Shape{12, 4, 1});
  CHECK(s == Shape{2, 3, 4});
  CHECK_FALSE(s == Shape{2, 3});
  CHECK(Shape{}.numel() == 1);
  CHECK(s.str() == "(2, 3, 4)");
  CHECK_THROWS_AS((Shape{1, 2, 3, 4, 5, 6, 7}), Error);
  CHECK_THROWS_AS((Shape{2, -1}), Error);
}

TEST_CASE("tensor: element access through views, slices, reshape", "[tensor]") {
  Tensor<float> t(Shape{3, 4});
  for (int i = 0; i < 3; ++i)
    for (int j = 0; j < 4; ++j) t(i, j) = static_cast<float>(10 * i + j);
  auto v = t.view();
  CHECK(v(2, 3) == 23.0f);
  CHECK(v[5] == 11.0f);

  auto cols = v.slice(1, 1, 3);  // (3, 2), strided
  CHECK(cols.shape() == Shape{3, 2});
  CHECK_FALSE(cols.is_contiguous());
  CHECK(cols(0, 0) == 1.0f);
  CHECK(cols(2, 1) == 22.0f);
  CHECK_THROWS_AS(cols.reshape(Shape{6}), Error);

  auto row = v.select0(1);  // (4,)
  CHECK(row.shape() == Shape{4});
  CHECK(row(3) == 13.0f);

  auto flat = v.reshape(Shape{12});
  CHECK(flat(7) == 13.0f);
  CHECK_THROWS_AS(v.reshape(Shape{5}), Error);
  CHECK_THROWS_AS(v.slice(0, 2, 4), Error);

  TensorView<const float> cv = v;  // const view from a mutable one
  CHECK(cv(1, 1) == 11.0f);
}

TEST_CASE("tensor: copies and moves keep elements; resize reuses capacity", "[tensor]") {
  auto gen = test::rng(1);
  auto a = test::random_tensor<double>(Shape{5, 7}, gen);
  Tensor<double> b(Shape{5, 7}, -1.0);
  copy(b, a);
  for (std::int64_t i = 0; i < a.numel(); ++i) CHECK(b[i] == a[i]);

  auto c = to_space<HostSpace>(a.cview());
  CHECK(c.shape() == a.shape());
  CHECK(test::rel_error(c, a) == 0.0);

  Tensor<double> wrong(Shape{7, 5});
  CHECK_THROWS_AS(copy(wrong, a), Error);

  const double* before = c.data();
  Tensor<double> moved = std::move(c);
  CHECK(moved.data() == before);
  CHECK(c.data() == nullptr);

  moved.resize(Shape{3, 3});  // smaller: same buffer
  CHECK(moved.data() == before);
  CHECK(moved.numel() == 9);
  moved.resize(Shape{10, 10});
  CHECK(moved.numel() == 100);
}
