// Ops<CudaSpace>'s compression family (kernels/cuda/compression.hpp) against Ops<HostSpace>'s
// (kernels/host/compression.hpp) on fresh Philox inputs, outputs poisoned where the op writes
// them whole. Bitwise: subtract, take_top_magnitude (indices, values and the zeroed x; ties, ±0,
// ±∞ and NaNs of two keys among the entries), scatter_add. Within 1e-6 (unit columns):
// orthonormalise_columns, whose sums run in another order on the device, including columns that
// must come out zero (a zero one, exactly dependent ones, more columns than rows), and the device's
// columns orthonormal on their own. redraw_zero_rows: rows left alone bitwise, redrawn rows within
// 1e-5 (logf and cosf may differ in the last ulp).
#include "device.hpp"

#include <dpml/core/philox.hpp>
#include <dpml/kernels/ops.hpp>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>
#include <type_traits>
#include <vector>

using namespace dpml;
using DOps = kernels::Ops<CudaSpace>;
using HOps = kernels::Ops<HostSpace>;

namespace {

template <class T>
using Bits = std::conditional_t<sizeof(T) == 8, std::uint64_t, std::uint32_t>;

template <class T>
Bits<T> bits_of(T v) {
  return std::bit_cast<Bits<T>>(v);
}
template <class T>
T from_bits(Bits<T> b) {
  return std::bit_cast<T>(b);
}

// The first index at which a and b differ in their bits (or in length), −1 when none.
template <class T>
std::int64_t first_difference(const std::vector<T>& a, const std::vector<T>& b) {
  const std::size_t n = std::min(a.size(), b.size());
  for (std::size_t i = 0; i < n; ++i)
    if (std::memcmp(&a[i], &b[i], sizeof(T)) != 0) return static_cast<std::int64_t>(i);
  return a.size() == b.size() ? -1 : static_cast<std::int64_t>(n);
}

// n standard normals (times scale) of Philox stream `stream` under `seed`.
template <class T>
std::vector<T> normals(std::int64_t n, std::uint64_t seed, double scale = 1.0, std::uint64_t stream = 1) {
  const PhiloxStream rng(seed, stream);
  std::vector<T> v(static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < n; ++i) v[static_cast<std::size_t>(i)] = static_cast<T>(scale * rng.normal(static_cast<std::uint64_t>(i)));
  return v;
}

constexpr double ortho_tol = 1e-6;

// P (n, r) through both ops: device columns within ortho_tol of the host's (element-wise and in L2:
// the columns have norm 1), zero exactly where the host's are and where `zero` says, and
// orthonormal among themselves.
template <class T>
void check_orthonormalise(kernels::Device<CudaSpace>& dev, std::vector<T> hp, std::int64_t n, int r,
                          const std::vector<int>& zero) {
  CAPTURE(n, r);
  kernels::Device<HostSpace> hdev;
  test::DeviceVec<T> p(hp);
  HOps::orthonormalise_columns(hdev, hp.data(), n, r);
  DOps::orthonormalise_columns(dev, p.ptr, n, r);
  const std::vector<T> got = p.download();
  const auto at = [r](const std::vector<T>& v, std::int64_t i, int c) {
    return static_cast<double>(v[static_cast<std::size_t>(i * r + c)]);
  };
  std::vector<bool> kept(static_cast<std::size_t>(r));
  for (int c = 0; c < r; ++c) {
    CAPTURE(c);
    double num = 0, den = 0, worst = 0;
    bool host_zero = true, dev_zero = true;
    for (std::int64_t i = 0; i < n; ++i) {
      const double h = at(hp, i, c), d = at(got, i, c);
      num += (d - h) * (d - h);
      den += h * h;
      worst = std::max(worst, std::abs(d - h));  // NaN: fails below
      host_zero = host_zero && h == 0.0;
      dev_zero = dev_zero && d == 0.0;
    }
    const bool want_zero = std::find(zero.begin(), zero.end(), c) != zero.end();
    CHECK(host_zero == want_zero);  // the case is what it claims to be
    CHECK(dev_zero == host_zero);
    if (!host_zero) {
      CHECK(std::sqrt(num) <= ortho_tol * std::sqrt(den));
      CHECK(worst <= ortho_tol);
    }
    kept[static_cast<std::size_t>(c)] = !dev_zero;
  }
  // Pᵀ P on the device's columns: the identity on the kept ones.
  const double orth_tol = std::is_same_v<T, float> ? 1e-6 : 1e-12;
  double worst = 0;
  for (int a = 0; a < r; ++a) {
    if (!kept[static_cast<std::size_t>(a)]) continue;
    for (int b = a; b < r; ++b) {
      if (!kept[static_cast<std::size_t>(b)]) continue;
      double dot = 0;
      for (std::int64_t i = 0; i < n; ++i) dot += at(got, i, a) * at(got, i, b);
      worst = std::max(worst, std::abs(dot - (a == b ? 1.0 : 0.0)));
    }
  }
  CHECK(worst <= orth_tol);
}

// take_top_magnitude's x (n): normals, or (ties) multiples of 1/8 in [−2, 2] of both signs, with
// ±0, ±∞ (three of them: ties) and NaNs of two keys (a quiet one, its negative: the same key; one
// just above ∞) among them.
template <class T>
std::vector<T> top_input(std::int64_t n, bool ties, std::uint64_t seed) {
  const PhiloxStream rng(seed, 2);
  std::vector<T> x(static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < n; ++i) {
    const auto u = static_cast<std::uint64_t>(i);
    x[static_cast<std::size_t>(i)] =
        ties ? static_cast<T>(static_cast<int>(rng.u32(u) % 33) - 16) / T(8) : static_cast<T>(rng.normal(u));
  }
  const Bits<T> sign = Bits<T>{1} << (sizeof(T) * 8 - 1);
  const T inf = std::numeric_limits<T>::infinity(), qnan = std::numeric_limits<T>::quiet_NaN();
  const auto put = [&](std::int64_t i, T v) { x[static_cast<std::size_t>(i)] = v; };
  put(n / 2, qnan);
  put(n / 3, from_bits<T>(bits_of(qnan) | sign));  // −NaN: the key of the NaN at n/2, a lower index
  put(n / 5, from_bits<T>(bits_of(inf) + 1));       // a NaN just above ∞
  put(n - 1, inf);
  put(n - 2, -inf);
  put(3, -inf);
  put(5, T(-0.0));
  put(6, T(0.0));
  return x;
}

// take_top_magnitude(x, k) on both: idx, val and x afterwards bitwise the host's.
template <class T>
void check_take(kernels::Device<CudaSpace>& dev, const std::vector<T>& hx, std::int64_t k) {
  const auto n = static_cast<std::int64_t>(hx.size());
  CAPTURE(n, k);
  kernels::Device<HostSpace> hdev;
  std::vector<T> want_x = hx, want_val(static_cast<std::size_t>(k));
  std::vector<std::int32_t> want_idx(static_cast<std::size_t>(k));
  HOps::take_top_magnitude(hdev, want_x.data(), n, k, want_idx.data(), want_val.data());
  test::DeviceVec<T> x(hx), val(static_cast<std::size_t>(k));
  test::DeviceVec<std::int32_t> idx(static_cast<std::size_t>(k));
  val.poison();
  idx.poison();
  DOps::take_top_magnitude(dev, x.ptr, n, k, idx.ptr, val.ptr);
  CHECK(first_difference(idx.download(), want_idx) == -1);
  CHECK(first_difference(val.download(), want_val) == -1);
  CHECK(first_difference(x.download(), want_x) == -1);
}

}  // namespace

TEMPLATE_TEST_CASE("compression: subtract, also in place", "[compression][gpu]", float, double) {
  using T = TestType;
  kernels::Device<CudaSpace> dev;
  kernels::Device<HostSpace> hdev;
  for (const std::int64_t n : {std::int64_t{1}, std::int64_t{1000}, std::int64_t{(1 << 20) + 3}}) {
    CAPTURE(n);
    const auto un = static_cast<std::size_t>(n);
    const auto ha = normals<T>(n, 11 + static_cast<std::uint64_t>(n), 3.0), hb = normals<T>(n, 12 + static_cast<std::uint64_t>(n));
    std::vector<T> want(un);
    HOps::subtract(hdev, ha.data(), hb.data(), want.data(), n);
    test::DeviceVec<T> a(ha), b(hb), y(un);
    y.poison();
    DOps::subtract(dev, a.ptr, b.ptr, y.ptr, n);
    CHECK(first_difference(y.download(), want) == -1);
    DOps::subtract(dev, a.ptr, b.ptr, a.ptr, n);  // y = a
    CHECK(first_difference(a.download(), want) == -1);
    a.upload(ha);
    DOps::subtract(dev, a.ptr, b.ptr, b.ptr, n);  // y = b
    CHECK(first_difference(b.download(), want) == -1);
  }
}

TEMPLATE_TEST_CASE("compression: orthonormalise_columns against the host's Gram-Schmidt", "[compression][gpu]", float,
                   double) {
  using T = TestType;
  kernels::Device<CudaSpace> dev;
  struct Case {
    std::int64_t n;
    int r;
    std::vector<int> zero;  // columns that come out zero
  };
  // (3, 5): columns 3 and 4 lie in the span of the first three.
  for (const Case& c : {Case{1, 1, {}}, Case{3, 5, {3, 4}}, Case{100, 7, {}}, Case{1000, 32, {}}, Case{50304, 4, {}},
                        Case{60000, 32, {}}}) {
    check_orthonormalise<T>(dev, normals<T>(c.n * c.r, 100 + static_cast<std::uint64_t>(c.n * c.r)), c.n, c.r, c.zero);
  }
  // Multiples of 1/64 below 2⁷ (sums of two are exact in float): column 2 zero, column 5 = −4 ·
  // column 0, column 6 = column 1 − column 3, column 7 = column 2: all four come out zero.
  const std::int64_t n = 1000;
  const int r = 8;
  std::vector<T> p = normals<T>(n * r, 7);
  for (std::int64_t i = 0; i < n; ++i) {
    T* row = p.data() + i * r;
    for (int c = 0; c < r; ++c) row[c] = std::round(std::clamp<T>(row[c], T(-30), T(30)) * T(64)) / T(64);
    row[2] = T(0);
    row[5] = T(-4) * row[0];
    row[6] = row[1] - row[3];
    row[7] = row[2];
  }
  check_orthonormalise<T>(dev, p, n, r, {2, 5, 6, 7});
}

TEMPLATE_TEST_CASE("compression: redraw_zero_rows redraws exactly the zero rows", "[compression][gpu]", float, double) {
  using T = TestType;
  kernels::Device<CudaSpace> dev;
  kernels::Device<HostSpace> hdev;
  const int r = 7;
  for (const std::int64_t m : {std::int64_t{1}, std::int64_t{1000}, std::int64_t{50304}}) {
    CAPTURE(m);
    std::vector<T> hq = normals<T>(r * m, 31 + static_cast<std::uint64_t>(m));
    const auto row = [&](int c) { return hq.begin() + c * m; };
    std::fill(row(0), row(1), T(0));
    for (std::int64_t j = 0; j < m; ++j) row(2)[j] = j % 2 ? T(-0.0) : T(0.0);  // −0 is zero too
    std::fill(row(3), row(4), T(0));
    row(3)[m - 1] = T(1e-30);  // one tiny nonzero
    std::fill(row(4), row(5), T(0));
    row(4)[m / 2] = std::numeric_limits<T>::quiet_NaN();  // NaN ≠ 0: left alone
    std::fill(row(5), row(6), T(0));
    const std::vector<int> redrawn{0, 2, 5};
    const std::uint64_t seed = 0x9e3779b97f4a7c15ull ^ static_cast<std::uint64_t>(m), stream = 42 + static_cast<std::uint64_t>(m),
                        offset = (std::uint64_t{1} << 40) + 3 * static_cast<std::uint64_t>(m);
    std::vector<T> want = hq;
    HOps::redraw_zero_rows(hdev, want.data(), r, m, seed, stream, offset);
    test::DeviceVec<T> q(hq);
    DOps::redraw_zero_rows(dev, q.ptr, r, m, seed, stream, offset);
    const std::vector<T> got = q.download();
    for (int c = 0; c < r; ++c) {
      CAPTURE(c);
      const auto part = [&](const std::vector<T>& v) {
        return std::vector<T>(v.begin() + c * m, v.begin() + (c + 1) * m);
      };
      const bool host_redrew = first_difference(part(want), part(hq)) != -1;
      CHECK(host_redrew == (std::find(redrawn.begin(), redrawn.end(), c) != redrawn.end()));
      if (host_redrew) {
        double worst = 0;
        for (std::int64_t j = 0; j < m; ++j) {
          const auto i = static_cast<std::size_t>(c * m + j);
          const double d = std::abs(static_cast<double>(got[i]) - static_cast<double>(want[i]));
          worst = std::isnan(d) ? INFINITY : std::max(worst, d);
        }
        CHECK(worst <= 1e-5);
      } else {
        CHECK(first_difference(part(got), part(hq)) == -1);
      }
    }
  }
}

TEST_CASE("compression: take_top_magnitude (float) against the host's selection", "[compression][gpu]") {
  kernels::Device<CudaSpace> dev;  // its scratch is kept from call to call, as in training
  for (const bool ties : {true, false}) {
    CAPTURE(ties);
    const auto x = top_input<float>(1000, ties, 1);
    for (const std::int64_t k : {1, 2, 3, 4, 5, 6, 7, 10, 500, 999, 1000}) check_take(dev, x, k);
  }
  for (const bool ties : {true, false}) {
    CAPTURE(ties);
    const std::int64_t n = 1000000;
    const auto x = top_input<float>(n, ties, 2);
    for (const std::int64_t k : {std::int64_t{1}, n / 100, n}) check_take(dev, x, k);
  }
  const std::int64_t n = 30000000;
  const auto x = top_input<float>(n, true, 3);
  for (const std::int64_t k : {std::int64_t{1}, n / 100, n}) check_take(dev, x, k);
}

TEST_CASE("compression: take_top_magnitude (double) against the host's selection", "[compression][gpu]") {
  kernels::Device<CudaSpace> dev;
  const auto small = top_input<double>(1000, true, 4);
  for (const std::int64_t k : {1, 3, 7, 10, 999, 1000}) check_take(dev, small, k);
  const std::int64_t n = 1000000;
  const auto large = top_input<double>(n, false, 5);
  for (const std::int64_t k : {std::int64_t{1}, n / 100}) check_take(dev, large, k);
}

// Two calls in a row, as top-k's reduce adds rank after rank: distinct indices within a call, the
// same indices again in the second.
TEMPLATE_TEST_CASE("compression: scatter_add", "[compression][gpu]", float, double) {
  using T = TestType;
  kernels::Device<CudaSpace> dev;
  kernels::Device<HostSpace> hdev;
  const std::int64_t n = 100003;
  std::vector<std::int32_t> perm(static_cast<std::size_t>(n));
  std::iota(perm.begin(), perm.end(), 0);
  auto gen = test::rng(77);
  std::shuffle(perm.begin(), perm.end(), gen);
  for (const std::int64_t k : {std::int64_t{1}, std::int64_t{1000}, n}) {
    CAPTURE(k);
    std::vector<std::int32_t> ia(static_cast<std::size_t>(k)), ib(static_cast<std::size_t>(k));
    for (std::int64_t j = 0; j < k; ++j) {
      ia[static_cast<std::size_t>(j)] = perm[static_cast<std::size_t>(j)];
      ib[static_cast<std::size_t>(j)] = perm[static_cast<std::size_t>((j + n / 2) % n)];
    }
    const auto hy = normals<T>(n, 50 + static_cast<std::uint64_t>(k)), va = normals<T>(k, 51 + static_cast<std::uint64_t>(k)),
               vb = normals<T>(k, 52 + static_cast<std::uint64_t>(k));
    std::vector<T> want = hy;
    HOps::scatter_add(hdev, ia.data(), va.data(), k, want.data());
    HOps::scatter_add(hdev, ib.data(), vb.data(), k, want.data());
    test::DeviceVec<T> y(hy), a(va), b(vb);
    test::DeviceVec<std::int32_t> da(ia), db(ib);
    DOps::scatter_add(dev, da.ptr, a.ptr, k, y.ptr);
    DOps::scatter_add(dev, db.ptr, b.ptr, k, y.ptr);
    CHECK(first_difference(y.download(), want) == -1);
  }
}
