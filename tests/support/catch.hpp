#pragma once
// Catch2 v2 (Debian 12: <catch2/catch.hpp>) and v3 (GPU machines: <catch2/catch_all.hpp>) from one
// source. Tests use the macros common to both, and dpml::test::Approx.
#if __has_include(<catch2/catch_all.hpp>)
#include <catch2/catch_all.hpp>
#define DPML_CATCH3 1
namespace dpml::test {
using Catch::Approx;
}
#else
#include <catch2/catch.hpp>
namespace dpml::test {
using Catch::Detail::Approx;
}
#endif
