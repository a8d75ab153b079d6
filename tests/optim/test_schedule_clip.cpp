// Learning-rate schedules at chosen steps (values worked out by hand) and global-norm clipping.
#include "test.hpp"

#include <dpml/optim/clip.hpp>
#include <dpml/optim/schedule.hpp>

#include <cmath>
#include <numbers>
#include <span>
#include <vector>

using namespace dpml;
using dpml::test::Approx;

TEST_CASE("schedules: constant and step", "[optim][schedule]") {
  const optim::ConstantLR c{.lr = 0.3};
  CHECK(c(1) == 0.3);
  CHECK(c(1000) == 0.3);
  const optim::StepLR s{.lr = 1.0, .step_size = 3, .gamma = 0.5};
  // Updates 1-3 at 1.0, 4-6 at 0.5, 7-9 at 0.25.
  CHECK(s(1) == 1.0);
  CHECK(s(3) == 1.0);
  CHECK(s(4) == 0.5);
  CHECK(s(6) == 0.5);
  CHECK(s(7) == 0.25);
  CHECK(s(10) == 0.125);
  CHECK_THROWS_AS(s(0), Error);
}

TEST_CASE("schedules: linear warm-up then cosine to min_lr (Megatron)", "[optim][schedule]") {
  const optim::WarmupCosineLR w{.max_lr = 1.0, .min_lr = 0.1, .warmup_steps = 4, .decay_steps = 12};
  CHECK(w(1) == Approx(0.25));   // 1/4 of max
  CHECK(w(2) == Approx(0.5));
  CHECK(w(4) == Approx(1.0));    // end of warm-up: max
  // decay ratio (t - 4) / 8: t = 6 → 1/4: 0.1 + 0.9·½(1 + cos(π/4))
  CHECK(w(6) == Approx(0.1 + 0.9 * 0.5 * (1.0 + std::sqrt(0.5))));
  CHECK(w(8) == Approx(0.55));   // half-way: the mean of max and min
  CHECK(w(12) == Approx(0.1));   // decay_steps: min
  CHECK(w(13) == 0.1);           // and after
  CHECK(w(1000) == 0.1);
  for (std::int64_t t = 5; t < 12; ++t) CHECK(w(t + 1) < w(t));  // strictly decreasing in the cosine part
  const optim::WarmupCosineLR no_warmup{.max_lr = 2.0, .min_lr = 0.0, .warmup_steps = 0, .decay_steps = 2};
  CHECK(no_warmup(1) == Approx(1.0));  // ratio ½
  CHECK(no_warmup(2) == Approx(0.0).margin(1e-15));
  const optim::WarmupCosineLR bad{.max_lr = 1.0, .min_lr = 0.0, .warmup_steps = 5, .decay_steps = 5};
  CHECK_THROWS_AS(bad(1), Error);
}

TEST_CASE("clip_grad_norm: scales only above max_norm, returns the total norm", "[optim][clip]") {
  Param<double> a("a", Shape{2}, Init::constant(0)), b("b", Shape{1}, Init::constant(0));
  std::vector<Param<double>*> params{&a, &b};
  auto set = [&] {
    a.grad()[0] = 3.0;
    a.grad()[1] = 0.0;
    b.grad()[0] = 4.0;  // ‖g‖ = 5
  };
  set();
  CHECK(optim::clip_grad_norm(params, 10.0) == Approx(5.0));
  CHECK(a.grad()[0] == 3.0);  // below max_norm: untouched
  CHECK(b.grad()[0] == 4.0);

  CHECK(optim::clip_grad_norm(params, 1.0) == Approx(5.0));
  const double coef = 1.0 / (5.0 + 1e-6);  // PyTorch: max_norm / (norm + 1e-6)
  CHECK(a.grad()[0] == Approx(3.0 * coef).epsilon(1e-14));
  CHECK(b.grad()[0] == Approx(4.0 * coef).epsilon(1e-14));

  // The reduction sees the local squared sum and supplies the global one (here: 3 more ranks
  // holding the same gradients → ‖g‖ = √(4·25) = 10).
  set();
  double seen = 0;
  const double norm = optim::clip_grad_norm(params, 5.0, [&](double local) {
    seen = local;
    return 4.0 * local;
  });
  CHECK(seen == Approx(25.0));
  CHECK(norm == Approx(10.0));
  CHECK(b.grad()[0] == Approx(4.0 * 5.0 / (10.0 + 1e-6)).epsilon(1e-14));

  // A non-finite norm is returned and leaves the gradients alone.
  set();
  b.grad()[0] = std::numeric_limits<double>::infinity();
  CHECK(std::isinf(optim::clip_grad_norm(params, 1.0)));
  CHECK(a.grad()[0] == 3.0);
}

TEST_CASE("clip_grad_norm: over spans of a flat buffer, float", "[optim][clip]") {
  std::vector<float> flat{1, 2, 2, 0, 0, 4};  // two shards: ‖(1,2,2)‖ = 3, ‖(0,0,4)‖ = 4 → 5
  std::vector<std::span<float>> shards{std::span(flat).first(3), std::span(flat).subspan(3)};
  CHECK(optim::clip_grad_norm(shards, 2.5) == Approx(5.0));
  CHECK(flat[1] == Approx(2.0 * 2.5 / (5.0 + 1e-6)).epsilon(1e-6));
  CHECK(flat[5] == Approx(4.0 * 2.5 / (5.0 + 1e-6)).epsilon(1e-6));
  CHECK_THROWS_AS(optim::clip_grad_norm(shards, 0.0), Error);
}
