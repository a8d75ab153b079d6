// The pipeline executor on 1, 2 and 4 ranks (one stage per rank) with a toy differentiable stage
// y = tanh(w ⊙ x), loss = Σ y on the last stage: for each schedule, the loss and every stage's
// weight gradient equal a single-process run of all stages (float64; the arithmetic is the same
// and in the same order, so the tolerance is 1e-12 relative).
#include "test.hpp"

#include <dpml/parallel/grid.hpp>
#include <dpml/parallel/pipeline/executor.hpp>
#include <dpml/parallel/pipeline/schedule.hpp>

#include <cmath>
#include <vector>

namespace pl = dpml::parallel::pipeline;
using dpml::Tensor;
using dpml::TensorView;

namespace {

constexpr int kWidth = 5;

std::vector<double> stage_weights(int s) {
  auto gen = dpml::test::rng(100 + static_cast<std::uint64_t>(s));
  std::vector<double> w(kWidth);
  dpml::test::fill_uniform<double>(w.begin(), w.end(), gen, -1.5, 1.5);
  return w;
}
Tensor<double> inputs(int m) {  // (m, kWidth)
  auto gen = dpml::test::rng(7);
  return dpml::test::random_tensor<double>({m, kWidth}, gen);
}

// One stage of the toy model; models the pl::Stage concept.
struct ToyStage {
  using value_type = double;
  int stage, stages;
  std::vector<double> w, grad_w;  // (kWidth)
  Tensor<double> data, x, y, dy, dz, dx;  // data: stage 0's inputs; all (m, kWidth)
  double loss = 0;

  ToyStage(int s, int p, int m)
      : stage(s), stages(p), w(stage_weights(s)), grad_w(kWidth, 0.0), data(inputs(m)), x({m, kWidth}, 0.0),
        y({m, kWidth}, 0.0), dy({m, kWidth}, 0.0), dz({m, kWidth}, 0.0), dx({m, kWidth}, 0.0) {}

  void forward(int mb) {
    if (stage == 0) std::copy(data.view().select0(mb).begin(), data.view().select0(mb).end(), x.view().select0(mb).begin());
    for (int i = 0; i < kWidth; ++i) {
      y(mb, i) = std::tanh(w[static_cast<std::size_t>(i)] * x(mb, i));
      if (stage == stages - 1) loss += y(mb, i);
    }
  }
  void backward_input(int mb) {
    for (int i = 0; i < kWidth; ++i) {
      const double g = stage == stages - 1 ? 1.0 : dy(mb, i);
      dz(mb, i) = g * (1 - y(mb, i) * y(mb, i));
      dx(mb, i) = dz(mb, i) * w[static_cast<std::size_t>(i)];
    }
  }
  void backward_weight(int mb) {
    for (int i = 0; i < kWidth; ++i) grad_w[static_cast<std::size_t>(i)] += dz(mb, i) * x(mb, i);
  }
  TensorView<double> recv_forward_buffer(int mb) { return x.view().select0(mb); }
  TensorView<const double> send_forward_buffer(int mb) { return y.view().select0(mb); }
  TensorView<double> recv_backward_buffer(int mb) { return dy.view().select0(mb); }
  TensorView<const double> send_backward_buffer(int mb) { return dx.view().select0(mb); }
};
static_assert(pl::Stage<ToyStage>);

// All p stages in one process, micro-batch by micro-batch: the loss and each stage's grad_w.
struct Reference {
  double loss = 0;
  std::vector<std::vector<double>> grad_w;
};
Reference sequential(int p, int m) {
  std::vector<ToyStage> st;
  for (int s = 0; s < p; ++s) st.emplace_back(s, p, m);
  for (int mb = 0; mb < m; ++mb) {
    for (int s = 0; s < p; ++s) {
      if (s > 0) std::copy(st[s - 1].y.view().select0(mb).begin(), st[s - 1].y.view().select0(mb).end(),
                           st[s].x.view().select0(mb).begin());
      st[static_cast<std::size_t>(s)].forward(mb);
    }
    for (int s = p - 1; s >= 0; --s) {
      if (s < p - 1) std::copy(st[s + 1].dx.view().select0(mb).begin(), st[s + 1].dx.view().select0(mb).end(),
                               st[s].dy.view().select0(mb).begin());
      st[static_cast<std::size_t>(s)].backward_input(mb);
      st[static_cast<std::size_t>(s)].backward_weight(mb);
    }
  }
  Reference r{st.back().loss, {}};
  for (auto& s : st) r.grad_w.push_back(s.grad_w);
  return r;
}

template <class Tag>
void check_equal_to_sequential(const char* name, const dpml::comm::Mpi& pipe) {
  const int p = pipe.size(), s = pipe.rank();
  for (int m : {1, 3, 4, 8}) {
    CAPTURE(name, p, m, s);
    const auto schedule = pl::make_schedule(Tag{}, p, m);
    REQUIRE(pl::check_schedule(schedule, p, m).ok());
    ToyStage stage(s, p, m);
    const pl::StepTimings t = pl::run_stage(schedule[static_cast<std::size_t>(s)], stage, pipe);
    const Reference ref = sequential(p, m);
    double loss = stage.loss;  // only the last stage has it
    pipe.broadcast(&loss, 1, p - 1);
    CHECK(std::abs(loss - ref.loss) <= 1e-12 * std::abs(ref.loss));
    CHECK(dpml::test::rel_error(stage.grad_w, ref.grad_w[static_cast<std::size_t>(s)]) <= 1e-12);
    CHECK(t.total >= t.busy());
    CHECK(t.forward > 0);
    CHECK(t.backward_weight > 0);
    // Each micro-batch's activation goes forward unless this is the last stage, its gradient back
    // unless this is the first: kWidth doubles each.
    const auto message = static_cast<std::int64_t>(kWidth * sizeof(double));
    CHECK(t.sent_bytes == m * message * ((s < p - 1 ? 1 : 0) + (s > 0 ? 1 : 0)));
  }
}

}  // namespace

TEST_CASE("executor: GPipe on p ranks equals the single-process run", "[pipeline][mpi]") {
  check_equal_to_sequential<pl::GPipe>("gpipe", dpml::test::world());
}
TEST_CASE("executor: 1F1B on p ranks equals the single-process run", "[pipeline][mpi]") {
  check_equal_to_sequential<pl::OneFOneB>("1f1b", dpml::test::world());
}
TEST_CASE("executor: ZB-H1 on p ranks equals the single-process run", "[pipeline][mpi]") {
  check_equal_to_sequential<pl::ZeroBubbleH1>("zb-h1", dpml::test::world());
}
TEST_CASE("executor: on the pipeline axis of a process grid (pp = 2, dp = rest)", "[pipeline][mpi]") {
  const auto world = dpml::test::world();
  if (world.size() % 2 != 0) return;  // needs an even world
  const auto grid = dpml::parallel::ProcessGrid::create(world, {.tp = 1, .pp = 2});
  const auto& pipe = grid.comm(dpml::parallel::Axis::pipeline);
  REQUIRE(pipe.size() == 2);
  check_equal_to_sequential<pl::GPipe>("gpipe", pipe);
  check_equal_to_sequential<pl::OneFOneB>("1f1b", pipe);
  check_equal_to_sequential<pl::ZeroBubbleH1>("zb-h1", pipe);
}
TEST_CASE("executor: the gradients are those of finite differences of the loss", "[pipeline][mpi]") {
  // Guards the toy model itself: d loss / d w of stage 0 by central differences (float64).
  const int p = 3, m = 2;
  const Reference ref = sequential(p, m);
  auto loss_with = [&](int i, double delta) {
    std::vector<ToyStage> st;
    for (int s = 0; s < p; ++s) st.emplace_back(s, p, m);
    st[0].w[static_cast<std::size_t>(i)] += delta;
    for (int mb = 0; mb < m; ++mb)
      for (int s = 0; s < p; ++s) {
        if (s > 0) std::copy(st[s - 1].y.view().select0(mb).begin(), st[s - 1].y.view().select0(mb).end(),
                             st[s].x.view().select0(mb).begin());
        st[static_cast<std::size_t>(s)].forward(mb);
      }
    return st.back().loss;
  };
  const double h = 1e-6;
  for (int i = 0; i < kWidth; ++i) {
    const double fd = (loss_with(i, h) - loss_with(i, -h)) / (2 * h);
    CHECK(std::abs(fd - ref.grad_w[0][static_cast<std::size_t>(i)]) <= 1e-7);
  }
}
