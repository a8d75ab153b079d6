#pragma once
// Helpers shared by dpml's tests: the world communicator, seeded random tensors, and relative
// errors in float64.
#include "catch.hpp"

#include <dpml/comm/mpi.hpp>
#include <dpml/core/error.hpp>
#include <dpml/core/tensor.hpp>

#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

namespace dpml::test {

inline comm::Mpi world() { return comm::Mpi(MPI_COMM_WORLD); }

// A generator seeded from the test's name and a number, so each test draws its own numbers,
// reproducibly, and every rank draws the same ones.
inline std::mt19937_64 rng(std::uint64_t salt = 0) { return std::mt19937_64(0x5eedd9a1ull ^ salt); }

template <class T, class It>
void fill_uniform(It first, It last, std::mt19937_64& gen, double lo = -1.0, double hi = 1.0) {
  std::uniform_real_distribution<double> u(lo, hi);
  for (; first != last; ++first) *first = static_cast<T>(u(gen));
}

template <class T>
Tensor<T> random_tensor(Shape shape, std::mt19937_64& gen, double lo = -1.0, double hi = 1.0) {
  Tensor<T> t(shape);
  fill_uniform<T>(t.begin(), t.end(), gen, lo, hi);
  return t;
}

// ‖a − b‖₂ / max(‖b‖₂, tiny), in float64.
template <class A, class B>
double rel_error(const A& a, const B& b) {
  double num = 0, den = 0;
  auto ib = b.begin();
  for (auto ia = a.begin(); ia != a.end(); ++ia, ++ib) {
    const double x = static_cast<double>(*ia), y = static_cast<double>(*ib);
    num += (x - y) * (x - y);
    den += y * y;
  }
  return std::sqrt(num) / std::max(std::sqrt(den), 1e-300);
}

// The what() of the dpml::Error that f() throws, or "" when it throws none (Catch2 v2 and v3
// differ in their message matchers; this works with both).
template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

// The message of the dpml::Error that f throws, without the rank and source location ("" if none):
// for tests that compare a whole message.
template <class F>
std::string message_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.message();
  }
  return "";
}

}  // namespace dpml::test
