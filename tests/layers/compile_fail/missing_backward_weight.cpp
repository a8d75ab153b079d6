// Must not compile: NoWeightGrad has forward and backward_input but no backward_weight, so
// Sequential rejects it with "dpml Layer: missing `void backward_weight(Context<space>&, Output dy)`"
// (checked by tests/layers/CMakeLists.txt through expect_failure.cmake).
#include <dpml/layers/linear.hpp>
#include <dpml/layers/sequential.hpp>

#include <vector>

struct NoWeightGrad {
  using value_type = float;
  using space = dpml::HostSpace;
  using Input = dpml::TensorView<const float>;
  using Output = dpml::TensorView<const float>;
  Output forward(dpml::layers::Context<space>&, Input x) { return x; }
  Input backward_input(dpml::layers::Context<space>&, Output dy) { return dy; }
  std::vector<dpml::layers::Param<float>*> parameters() { return {}; }
};

int main() {
  dpml::layers::Sequential<dpml::layers::Linear<float>, NoWeightGrad> model(dpml::layers::Linear<float>(2, 2),
                                                                           NoWeightGrad{});
  return static_cast<int>(model.parameters().size());
}
