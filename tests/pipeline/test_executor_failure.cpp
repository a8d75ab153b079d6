// A stage that throws in the middle of a pipeline step (run under dpml::run): the failing rank
// prints its error and the whole job exits non-zero — no rank hangs on the receives left posted
// (driven by tests/expect_failure.cmake). On 2 ranks the last stage posts all its receives at the
// start (a valid table): when it fails in F0, stage 0 never gets gradient 0, so never sends the
// activations of micro-batches 2 and 3, and those receives can never complete — unwinding must
// not wait for them. On more ranks, the generated ZB-H1 table.
#include <dpml/comm/launch.hpp>
#include <dpml/core/tensor.hpp>
#include <dpml/parallel/pipeline/executor.hpp>
#include <dpml/parallel/pipeline/schedule.hpp>

#include <vector>

namespace pl = dpml::parallel::pipeline;

namespace {
struct FailingStage {
  using value_type = float;
  int rank;
  dpml::Tensor<float> buf{{4, 4}, 0.f};  // (m, 4): one row per micro-batch, for every message
  void forward(int mb) { DPML_REQUIRE(!(rank == 1 && mb == 0), "toy stage 1 fails in forward of micro-batch " << mb); }
  void backward_input(int) {}
  void backward_weight(int) {}
  dpml::TensorView<float> recv_forward_buffer(int mb) { return buf.view().select0(mb); }
  dpml::TensorView<const float> send_forward_buffer(int mb) { return buf.view().select0(mb); }
  dpml::TensorView<float> recv_backward_buffer(int mb) { return buf.view().select0(mb); }
  dpml::TensorView<const float> send_backward_buffer(int mb) { return buf.view().select0(mb); }
};
}  // namespace

int main(int argc, char** argv) {
  return dpml::run(argc, argv, [](const dpml::comm::Mpi& world) {
    const int p = world.size(), m = 4;
    pl::Schedule schedule = pl::make_schedule(pl::ZeroBubbleH1{}, p, m);
    if (p == 2) {
      schedule = pl::make_schedule(pl::OneFOneB{}, p, m);
      auto& last = schedule[1];
      std::erase_if(last, [](const pl::Action& a) { return a.op == pl::Op::RecvForward; });
      for (int mb = m - 1; mb >= 0; --mb) last.insert(last.begin(), pl::Action{pl::Op::RecvForward, mb});
    }
    pl::check_schedule(schedule, p, m).throw_if_error();
    FailingStage stage{world.rank()};
    pl::run_stage(schedule[static_cast<std::size_t>(world.rank())], stage, world);
    return 0;
  });
}
