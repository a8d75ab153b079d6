#pragma once
// The three axes of the process grid — tensor (fastest), data, pipeline (slowest) — named here, at
// the bottom of the library, because parameters say along which axis they are split (Sharding,
// core/parameter.hpp) and every floor above may need the names. The grid itself, which turns a
// launch into communicators per axis, is parallel/grid.hpp.

#include <array>

namespace dpml {

enum class Axis { tensor = 0, data = 1, pipeline = 2 };
inline constexpr std::array<Axis, 3> kAxes = {Axis::tensor, Axis::data, Axis::pipeline};

inline const char* axis_name(Axis a) {
  switch (a) {
    case Axis::tensor: return "tensor";
    case Axis::data: return "data";
    case Axis::pipeline: return "pipeline";
  }
  return "?";
}

}  // namespace dpml
