// Tensor parallel equals tp = 1. On a grid whose tensor axis is the whole world, each
// tensor-parallel layer, initialised from the same seed by global index, gives the same outputs,
// input gradients and gathered weight gradients as the same layer built with tp = 1 (float64;
// tolerance 1e-12 relative: only the summation order of the all-reduces differs). Sizes that tp
// does not divide are refused on every rank with Scope::everywhere.
#include "check.hpp"

#include <dpml/layers/attention.hpp>
#include <dpml/layers/embedding.hpp>
#include <dpml/layers/init.hpp>
#include <dpml/layers/mlp.hpp>
#include <dpml/layers/parallel_linear.hpp>
#include <dpml/layers/transformer_block.hpp>
#include <dpml/layers/vocab_parallel_cross_entropy.hpp>
#include <dpml/parallel/grid.hpp>
#include <dpml/parallel/tensor.hpp>

#include <vector>

using namespace dpml;
using Region = parallel::TensorRegion<comm::Mpi>;

namespace {
constexpr double kTol = 1e-12;

struct TensorGrid {
  comm::Mpi world = test::world();
  ProcessGrid grid = ProcessGrid::create(world, {.tp = world.size()});
  Region region{&grid.comm(Axis::tensor)};
  int tp() const { return grid.tp(); }
};

// The global tensor of a sharded parameter's value or gradient (`v`), gathered over the tensor axis.
std::vector<double> global_of(const layers::Param<double>& p, TensorView<double> v, const TensorGrid& g) {
  if (p.sharding().is_replicated() || g.tp() == 1) return test::to_vector(v);
  std::int64_t outer = 1;
  for (int d = 0; d < p.sharding().dim; ++d) outer *= v.size(d);
  // (outer, chunk) locally; the tensor ranks' chunks sit side by side in the global tensor.
  const TensorView<const double> local(v.data(), Shape{outer, v.numel() / outer});
  std::vector<double> full(static_cast<std::size_t>(v.numel() * g.tp()));
  g.region.gather_last_dim(local, TensorView<double>(full.data(), Shape{outer, local.size(1) * g.tp()}));
  return full;
}

// Own slice of the last dimension / the whole tensor from every rank's slices.
Tensor<double> own_slice(TensorView<const double> full, const TensorGrid& g) {
  Shape s = full.shape();
  s[s.rank() - 1] /= g.tp();
  Tensor<double> local(s);
  g.region.keep_own_slice(full, local.view());
  return local;
}
Tensor<double> gathered(TensorView<const double> local, const TensorGrid& g) {
  Shape s = local.shape();
  s[s.rank() - 1] *= g.tp();
  Tensor<double> full(s);
  g.region.gather_last_dim(local, full.view());
  return full;
}

void expect_same_parameters(std::vector<layers::Param<double>*> serial, std::vector<layers::Param<double>*> par,
                            const TensorGrid& g, bool grads) {
  REQUIRE(serial.size() == par.size());
  for (std::size_t i = 0; i < serial.size(); ++i) {
    CAPTURE(serial[i]->name(), grads);
    REQUIRE(serial[i]->name() == par[i]->name());
    const auto want = test::to_vector(grads ? serial[i]->grad() : serial[i]->value());
    const auto got = global_of(*par[i], grads ? par[i]->grad() : par[i]->value(), g);
    if (grads)
      CHECK(test::rel_error(got, want) < kTol);
    else
      CHECK(got == want);  // identical by construction
  }
}

// Runs two interleaved micro-batches through the tp = 1 layer and the tensor-parallel layer and
// compares everything. in_split / out_split: the parallel layer's input / output is this rank's
// slice of the last dimension.
template <class L>
void expect_same_as_serial(L& serial, L& par, const TensorGrid& g, Shape in_shape, bool in_split, bool out_split,
                           std::uint64_t salt) {
  layers::initialize_all(serial.parameters(), 42, nullptr);
  layers::initialize_all(par.parameters(), 42, &g.grid);
  expect_same_parameters(serial.parameters(), par.parameters(), g, false);
  auto gen = test::rng(salt);
  layers::Context<> ctx;
  ctx.grid = &g.grid;
  std::vector<Tensor<double>> x, xl, r, rl;
  for (int mb = 0; mb < 2; ++mb) {
    ctx.micro_batch = mb;
    x.push_back(test::random_tensor<double>(in_shape, gen));
    xl.push_back(in_split ? own_slice(x.back().cview(), g) : test::random_tensor<double>(Shape{0}, gen));
    auto y1 = test::to_vector(serial.forward(ctx, x.back().cview()));
    auto yp = par.forward(ctx, in_split ? xl.back().cview() : x.back().cview());
    CAPTURE(mb);
    CHECK(test::rel_error(out_split ? test::to_vector(gathered(yp, g)) : test::to_vector(yp), y1) < kTol);
    Shape out_shape = yp.shape();
    if (out_split) out_shape[out_shape.rank() - 1] *= g.tp();
    r.push_back(test::random_tensor<double>(out_shape, gen));
    rl.push_back(out_split ? own_slice(r.back().cview(), g) : test::random_tensor<double>(Shape{0}, gen));
  }
  for (int mb = 0; mb < 2; ++mb) {
    ctx.micro_batch = mb;
    const auto dy = out_split ? rl[mb].cview() : r[mb].cview();
    auto dx1 = test::to_vector(serial.backward_input(ctx, r[mb].cview()));
    auto dxp = par.backward_input(ctx, dy);
    CAPTURE(mb);
    CHECK(test::rel_error(in_split ? test::to_vector(gathered(dxp, g)) : test::to_vector(dxp), dx1) < kTol);
    serial.backward_weight(ctx, r[mb].cview());
    par.backward_weight(ctx, dy);
  }
  expect_same_parameters(serial.parameters(), par.parameters(), g, true);
}
}  // namespace

TEST_CASE("tensor parallel: column- and row-parallel linears equal tp = 1", "[transformer][tp]") {
  TensorGrid g;
  const std::int64_t in = 6, out = 8;
  {
    layers::ColumnParallelLinear<double> s(in, out, {.name = "col"}), p(in, out, {.name = "col"}, g.region);
    expect_same_as_serial(s, p, g, Shape{2, 3, in}, false, true, 1);
  }
  {
    layers::ColumnParallelLinear<double> s(in, out, {.gather_output = true, .name = "colg"}),
        p(in, out, {.gather_output = true, .name = "colg"}, g.region);
    expect_same_as_serial(s, p, g, Shape{5, in}, false, false, 2);
  }
  {
    layers::RowParallelLinear<double> s(out, in, {.name = "row"}), p(out, in, {.name = "row"}, g.region);
    expect_same_as_serial(s, p, g, Shape{2, 3, out}, true, false, 3);
  }
}

TEST_CASE("tensor parallel: a region counts the bytes its operations send, shared by its copies", "[transformer][tp]") {
  TensorGrid g;
  const std::int64_t p = g.tp();
  const Region copy = g.region;  // what a layer keeps
  std::mt19937_64 gen(11);
  auto x = test::random_tensor<double>(Shape{3, 4}, gen);
  copy.all_reduce(x.view());  // a ring all-reduce of 12 doubles: 2(p−1)/p · 96 bytes
  const auto local = test::random_tensor<float>(Shape{2, 5}, gen);
  Tensor<float> full(Shape{2, 5 * p});
  copy.gather_last_dim(local.cview(), full.view());  // an all-gather of 10 floats: (p−1) · 40 bytes
  const std::int64_t want = 2 * (p - 1) * 96 / p + (p - 1) * 40;
  CHECK(copy.sent_bytes() == want);
  CHECK(g.region.sent_bytes() == want);
  CHECK(Region().sent_bytes() == 0);
}

TEST_CASE("tensor parallel: attention (heads split), MLP and a whole block equal tp = 1", "[transformer][tp]") {
  TensorGrid g;
  const std::int64_t C = 8;
  const Shape x{2, 5, C};
  {
    layers::CausalSelfAttention<double> s(C, 4, "attn"), p(C, 4, "attn", g.region);
    expect_same_as_serial(s, p, g, x, false, false, 4);
  }
  {
    layers::Mlp<double> s(C, 0, "mlp"), p(C, 0, "mlp", g.region);
    expect_same_as_serial(s, p, g, x, false, false, 5);
  }
  for (bool recompute : {false, true}) {
    CAPTURE(recompute);
    const layers::BlockOptions o{.dim = C, .heads = 4, .recompute = recompute};
    layers::TransformerBlock<double> s(o), p(o, g.region);
    expect_same_as_serial(s, p, g, x, false, false, 6);
  }
}

TEST_CASE("tensor parallel: bidirectional attention and block, with padded keys, equal tp = 1",
          "[transformer][tp][bidirectional]") {
  TensorGrid g;
  const std::int64_t C = 8, valid[2] = {3, 5};
  const Shape x{2, 5, C};
  for (const auto& keys : {layers::KeyPadding(), layers::KeyPadding::lengths(valid, 5)}) {
    CAPTURE(keys.empty());
    {
      layers::BidirectionalSelfAttention<double> s(C, 4, "attn"), p(C, 4, "attn", g.region);
      test::Padded<decltype(s)> ps{s, keys}, pp{p, keys};
      expect_same_as_serial(ps, pp, g, x, false, false, 7);
    }
    const layers::BlockOptions o{.dim = C, .heads = 4};
    layers::TransformerBlock<double, HostSpace, comm::Mpi, attention::Bidirectional> s(o), p(o, g.region);
    test::Padded<decltype(s)> ps{s, keys}, pp{p, keys};
    expect_same_as_serial(ps, pp, g, x, false, false, 8);
  }
}

TEST_CASE("tensor parallel: vocabulary-parallel embedding + tied cross-entropy equal tp = 1, V = 67 padded",
          "[transformer][tp][cross_entropy]") {
  TensorGrid g;
  const std::int64_t V = 67, C = 8, B = 2, Tn = 5;
  auto gen = test::rng(7);
  Tensor<std::int32_t> tokens({B, Tn}), targets({B, Tn});
  std::uniform_int_distribution<int> tok(0, static_cast<int>(V) - 1);
  for (auto& t : tokens) t = tok(gen);
  for (auto& t : targets) t = tok(gen);
  targets[0] = static_cast<std::int32_t>(V - 1);  // the last real row, next to the padding
  for (std::int64_t pad : {1, 16}) {  // 16: at tp = 4, V_pad = 128 and the last shard is all padding
    CAPTURE(pad);
    const layers::EmbeddingOptions o{.vocab = V, .max_seq = 8, .dim = C, .pad_multiple = pad};
    layers::Embedding<double> es(o), ep(o, g.region);
    layers::VocabParallelCrossEntropy<double> cs(es), cp(ep);
    CHECK(ep.partition().padded % (g.tp() * pad) == 0);
    layers::initialize_all(es.parameters(), 11, nullptr);
    layers::initialize_all(ep.parameters(), 11, &g.grid);
    layers::Context<> ctx;
    ctx.global_batch = 4 * B * Tn;  // tokens of a step of 4 such micro-batches

    auto hs = es.forward(ctx, tokens.cview());
    auto hp = ep.forward(ctx, tokens.cview());
    CHECK(test::to_vector(hs) == test::to_vector(hp));  // one rank contributes each row: exact
    cs.forward(ctx, hs, targets.cview());
    cp.forward(ctx, hp, targets.cview());
    const double ls = cs.take_loss(), lp = cp.take_loss();
    CHECK(lp == test::Approx(ls).epsilon(kTol));
    auto dhs = cs.backward(ctx), dhp = cp.backward(ctx);
    CHECK(test::rel_error(dhp, dhs) < kTol);
    cs.backward_weight(ctx);
    cp.backward_weight(ctx);
    es.backward_weight(ctx, dhs);
    ep.backward_weight(ctx, dhp);

    // Gradients of the real rows agree; padding rows got none.
    auto* ws = es.parameters()[0];
    auto* wp = ep.parameters()[0];
    const auto gs = test::to_vector(ws->grad()), gp = global_of(*wp, wp->grad(), g);
    const std::vector<double> gp_real(gp.begin(), gp.begin() + V * C);
    CHECK(test::rel_error(gp_real, std::vector<double>(gs.begin(), gs.begin() + V * C)) < kTol);
    for (std::size_t i = static_cast<std::size_t>(V * C); i < gp.size(); ++i) CHECK(gp[i] == 0.0);
    CHECK(test::rel_error(es.parameters()[1]->grad(), test::to_vector(ep.parameters()[1]->grad())) < kTol);
  }
}

TEST_CASE("tensor parallel: heads or hidden sizes that tp does not divide are refused on every rank",
          "[transformer][tp][errors]") {
  TensorGrid g;
  if (g.tp() == 1) return;  // everything divides by 1
  auto refused = [&](auto&& build, const char* what) {
    bool everywhere = false;
    std::string message;
    try {
      build();
    } catch (const Error& e) {
      everywhere = e.scope() == Scope::everywhere;
      message = e.message();
    }
    CAPTURE(message);
    CHECK(everywhere);
    CHECK(test::contains(message, what));
    CHECK(test::contains(message, "--tp " + std::to_string(g.tp())));
  };
  refused([&] { layers::CausalSelfAttention<double>(12, 3, "attn", g.region); }, "3 heads are not divisible");
  refused([&] { layers::Mlp<double>(8, 5, "mlp", g.region); }, "hidden size 5");
  refused([&] { layers::ColumnParallelLinear<double>(4, 7, {.name = "head"}, g.region); }, "output size 7");
  refused([&] { layers::RowParallelLinear<double>(7, 4, {.name = "proj"}, g.region); }, "input size 7");
  refused([&] { layers::TransformerBlock<double>({.dim = 6, .heads = 3}, g.region); }, "3 heads are not divisible");
  g.world.barrier();  // every rank got here: nobody waits in a collective
}
