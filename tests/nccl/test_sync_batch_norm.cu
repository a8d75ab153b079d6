// Synchronised BatchNorm2d on CudaSpace (layers/batch_norm.hpp with a device communicator): K
// ranks, each with its slice of a global batch, compute what one rank computes over the whole
// batch — outputs, dL/dx, the summed dweight and dbias, and the running statistics. The batch has
// 2K + 1 images, so rank 0 holds one more than the others: the statistics' count travels with the
// sums (counted statistics, kernels/cuda/conv/batch_norm.hpp), and a count of rows × ranks would be
// wrong. Reference: the float64 host layer on the whole batch (no sync), inputs rounded to T on
// both. fp32 (the BatchNorm kernels take it) at fp32 tolerance, bf16 at bf16 tolerance. Over
// comm::Nccl with a GPU per rank, comm::Staged where the ranks share one (test::with_gpu_comm).
#include "nccl_fixture.hpp"
#include "../cuda/layer_check.hpp"

#include <dpml/kernels/image.hpp>
#include <dpml/layers/batch_norm.hpp>

#include <cstdint>
#include <type_traits>
#include <vector>

using namespace dpml;
using kernels::ImageDims;
using kernels::ImageLayout;

namespace {

template <class T, class Comm>
void sync_equals_whole_batch() {
  constexpr double tol = test::kLayerTol<T>;
  auto world = test::world();
  const int K = world.size(), r = world.rank();
  const std::int64_t N = 2 * K + 1, C = 12, H = 5, W = 7;
  auto first = [&](int k) -> std::int64_t { return k == 0 ? 0 : 2 * k + 1; };  // rank k's images [first(k), first(k + 1))
  const std::int64_t b0 = first(r), b1 = r + 1 == K ? N : first(r + 1), n = b1 - b0;

  auto gen = test::rng(31);
  auto x = test::random_tensor<double>(Shape{N, C, H, W}, gen, -1, 2), dy = test::random_tensor<double>(x.shape(), gen);
  auto gamma = test::random_tensor<double>(Shape{C}, gen, 0.5, 1.5), beta = test::random_tensor<double>(Shape{C}, gen);
  for (auto* t : {&x, &dy, &gamma, &beta}) test::round_to<T>(*t);

  layers::BatchNorm2d<double> whole(C, {.momentum = 0.3});
  copy(whole.parameters()[0]->value(), gamma.cview());
  copy(whole.parameters()[1]->value(), beta.cview());
  for (auto* p : whole.parameters()) layers::zero_grad(*p);
  layers::Context<HostSpace> hctx;
  const auto y1 = whole.forward(hctx, x.cview());
  const auto dx1 = whole.backward_input(hctx, dy.cview());
  whole.backward_weight(hctx, dy.cview());

  kernels::Device<CudaSpace> device;
  const Comm dp = Comm::from(world, device.stream());
  layers::Context<CudaSpace> ctx;
  ctx.device = &device;
  layers::BatchNorm2d<T, CudaSpace, Comm> part(C, {.momentum = 0.3, .sync = true}, &dp);
  copy(part.parameters()[0]->value(), test::upload_as<T>(gamma).cview());
  copy(part.parameters()[1]->value(), test::upload_as<T>(beta).cview());
  for (auto* p : part.parameters()) layers::zero_grad(*p);
  // this rank's slice, NHWC on the device
  const ImageDims d{n, C, H, W};
  auto slice_nhwc = [&](const Tensor<double>& t) {
    Tensor<double> out(Shape{n, H, W, C});
    kernels::to_layout(ImageLayout::nchw, ImageLayout::nhwc, t.data() + b0 * C * H * W, out.data(), d);
    return test::upload_as<T>(out);
  };
  auto nchw_of = [&](TensorView<const T, CudaSpace> v) {
    const auto h = test::download_doubles(v);
    std::vector<double> out(h.size());
    kernels::to_layout(ImageLayout::nhwc, ImageLayout::nchw, h.data(), out.data(), d);
    return out;
  };
  auto my_rows = [&](TensorView<const double> t) {
    const std::int64_t per = C * H * W;
    return std::vector<double>(t.begin() + b0 * per, t.begin() + b1 * per);
  };
  const auto xs = slice_nhwc(x), dys = slice_nhwc(dy);
  const auto yk = part.forward(ctx, xs.cview());
  const auto dxk = part.backward_input(ctx, dys.cview());
  part.backward_weight(ctx, dys.cview());

  CAPTURE(K, r, n);
  CHECK(test::rel_l2(nchw_of(yk), my_rows(y1)) < tol);
  CHECK(test::rel_l2(nchw_of(dxk), my_rows(dx1)) < tol);
  for (std::size_t i = 0; i < 2; ++i) {  // the data-parallel reduction sums the ranks' gradients
    CAPTURE(i);
    auto g = test::download_doubles(part.parameters()[i]->grad());
    world.allreduce(g.data(), g.size(), comm::ReduceOp::sum);
    const auto want = whole.parameters()[i]->grad();
    CHECK(test::rel_l2(g, std::vector<double>(want.begin(), want.end())) < tol);
  }
  const auto rm = whole.running_mean(), rv = whole.running_var();
  CHECK(test::rel_l2(test::download_doubles(part.running_mean()), std::vector<double>(rm.begin(), rm.end())) < 1e-4);
  CHECK(test::rel_l2(test::download_doubles(part.running_var()), std::vector<double>(rv.begin(), rv.end())) < 1e-4);
}

}  // namespace

TEMPLATE_TEST_CASE("BatchNorm2d synchronised over device communicators equals one rank on the whole batch",
                   "[cuda][layers][nccl]", float, bf16) {
  test::with_gpu_comm([]<class Comm>(std::type_identity<Comm>) { sync_equals_whole_batch<TestType, Comm>(); });
}
