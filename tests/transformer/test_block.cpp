// A whole pre-LN transformer block on one rank: both backward halves against central finite
// differences in float64 (attention and MLP layers too), causality through the block,
// recomputation, deferred weight gradients and the GELU recompute giving bit-identical gradients
// over interleaved micro-batches, the residual joins, and the float instantiation agreeing with
// float64.
#include "check.hpp"

#include <dpml/layers/init.hpp>
#include <dpml/layers/embedding.hpp>
#include <dpml/layers/stack.hpp>
#include <dpml/layers/transformer_block.hpp>
#include <dpml/layers/vocab_parallel_cross_entropy.hpp>

#include <algorithm>
#include <map>
#include <random>
#include <span>
#include <vector>

using namespace dpml;

namespace {
// All parameters of a layer grad-checked against loss(); returns nothing, CHECKs each.
template <class L, class Loss>
void check_parameter_gradients(L& layer, Loss&& loss) {
  for (auto* p : layer.parameters()) {
    CAPTURE(p->name());
    CHECK(test::rel_error(p->grad(), test::numeric_gradient(loss, p->value().data(), p->numel())) < 1e-7);
  }
}
}  // namespace

TEST_CASE("CausalSelfAttention and Mlp layers: both backward halves match finite differences",
          "[transformer][attention][mlp]") {
  auto gen = test::rng(21);
  const std::int64_t B = 2, Tn = 4, C = 6;
  layers::CausalSelfAttention<double> attn(C, 3, "attn");
  layers::Mlp<double> mlp(C, 10, "mlp");
  layers::initialize_all(attn.parameters(), 5, nullptr);
  layers::initialize_all(mlp.parameters(), 5, nullptr);
  auto x = test::random_tensor<double>({B, Tn, C}, gen);
  auto r = test::random_tensor<double>({B, Tn, C}, gen);
  layers::Context<> ctx;
  auto run = [&](auto& layer) {
    layer.forward(ctx, x.cview());
    const auto dx = test::to_vector(layer.backward_input(ctx, r.cview()));
    layer.backward_weight(ctx, r.cview());
    auto loss = [&] { return test::dot(layer.forward(ctx, x.cview()), r); };
    CHECK(test::rel_error(dx, test::numeric_gradient(loss, x.data(), x.numel())) < 1e-7);
    check_parameter_gradients(layer, loss);
  };
  run(attn);
  run(mlp);
}

TEST_CASE("Bidirectional attention and block, with and without padded keys: both backward halves match finite "
          "differences; a padded key's token changes no output; every token sees the last one",
          "[transformer][attention][block][bidirectional]") {
  auto gen = test::rng(29);
  const std::int64_t B = 2, Tn = 4, C = 6;
  layers::BidirectionalSelfAttention<double> attn(C, 3, "attn");
  using Block = layers::TransformerBlock<double, HostSpace, parallel::default_comm_t<HostSpace>, attention::Bidirectional>;
  Block block({.dim = C, .heads = 2}), recomputed({.dim = C, .heads = 2, .recompute = true});
  layers::initialize_all(attn.parameters(), 5, nullptr);
  layers::initialize_all(block.parameters(), 5, nullptr);
  layers::initialize_all(recomputed.parameters(), 5, nullptr);
  auto x = test::random_tensor<double>({B, Tn, C}, gen);
  auto r = test::random_tensor<double>({B, Tn, C}, gen);
  const std::int64_t valid[B] = {2, 4};
  const bool mask[B * Tn] = {true, false, true, true, /* b = 1 */ false, true, true, true};
  layers::Context<> ctx;
  auto check = [&](auto& layer, const layers::KeyPadding& keys) {
    test::Padded<std::remove_reference_t<decltype(layer)>> padded{layer, keys};
    for (auto* p : layer.parameters()) std::fill(p->grad().begin(), p->grad().end(), 0.0);
    padded.forward(ctx, x.cview());
    const auto dx = test::to_vector(padded.backward_input(ctx, r.cview()));
    padded.backward_weight(ctx, r.cview());
    auto loss = [&] { return test::dot(padded.forward(ctx, x.cview()), r); };
    CHECK(test::rel_error(dx, test::numeric_gradient(loss, x.data(), x.numel())) < 1e-7);
    check_parameter_gradients(layer, loss);
    // A padded key's token reaches only its own output (its query); every other output ignores it.
    const auto before = test::to_vector(padded.forward(ctx, x.cview()));
    for (std::int64_t b = 0; b < B; ++b)
      for (std::int64_t t = 0; t < Tn; ++t) {
        if (keys.empty() || keys.data()[b * Tn + t] != 0) continue;
        for (std::int64_t c = 0; c < C; ++c) x(b, t, c) += 0.5 * static_cast<double>(c % 3);
        const auto after = test::to_vector(padded.forward(ctx, x.cview()));
        for (std::int64_t c = 0; c < C; ++c) x(b, t, c) -= 0.5 * static_cast<double>(c % 3);
        for (std::int64_t i = 0; i < B * Tn * C; ++i) {
          CAPTURE(b, t, i);
          if (i / C != b * Tn + t) CHECK(after[i] == test::Approx(before[i]).epsilon(1e-13));
        }
      }
  };
  for (const auto& keys : {layers::KeyPadding(), layers::KeyPadding::lengths(valid, Tn), layers::KeyPadding::mask(mask, B, Tn)}) {
    CAPTURE(keys.empty());
    check(attn, keys);
    check(block, keys);
    check(recomputed, keys);
  }
  // No padding: the first token's output depends on the last token (a causal block's would not).
  const auto before = test::to_vector(block.forward(ctx, x.cview()));
  for (std::int64_t c = 0; c < C; ++c) x(0, Tn - 1, c) += 0.5 * static_cast<double>(c % 3);
  const auto after = test::to_vector(block.forward(ctx, x.cview()));
  CHECK(before[0] != after[0]);
  CHECK(test::message_of([&] { block.forward(ctx, x.cview(), layers::KeyPadding::lengths(valid, Tn + 1)); }) ==
        "attention: key padding (2, 5) is not the input's (B=2, T=4)");
  CHECK(test::message_of([&] { layers::KeyPadding::lengths(std::vector<std::int64_t>{0}, Tn); }) ==
        "key padding: sample 0 has 0 valid keys, not in [1, 4]");
}

TEST_CASE("TransformerBlock: forward is x + attn(ln_1 x) then + mlp(ln_2 r); both backward halves match finite "
          "differences", "[transformer][block]") {
  auto gen = test::rng(22);
  const std::int64_t B = 2, Tn = 4, C = 8;
  layers::TransformerBlock<double> block({.dim = C, .heads = 2, .name = "h.0"});
  layers::LayerNorm<double> ln_1(C, "h.0.ln_1"), ln_2(C, "h.0.ln_2");
  layers::CausalSelfAttention<double> attn(C, 2, "h.0.attn");
  layers::Mlp<double> mlp(C, 0, "h.0.mlp");
  layers::initialize_all(block.parameters(), 9, nullptr);
  for (auto* p : block.parameters())  // LayerNorms away from 1 / 0, so that their gradients matter
    if (p->name().find(".ln_") != std::string::npos)
      test::fill_uniform<double>(p->value().begin(), p->value().end(), gen, 0.5, 1.5);
  // The same model as separate layers (same names, same initial values) gives the reference.
  std::vector<layers::Param<double>*> parts;
  for (auto* p : ln_1.parameters()) parts.push_back(p);
  for (auto* p : attn.parameters()) parts.push_back(p);
  for (auto* p : ln_2.parameters()) parts.push_back(p);
  for (auto* p : mlp.parameters()) parts.push_back(p);
  REQUIRE(parts.size() == block.parameters().size());
  for (std::size_t i = 0; i < parts.size(); ++i) {
    REQUIRE(parts[i]->name() == block.parameters()[i]->name());
    copy(parts[i]->value(), TensorView<const double>(block.parameters()[i]->value()));
  }
  auto x = test::random_tensor<double>({B, Tn, C}, gen);
  auto r = test::random_tensor<double>({B, Tn, C}, gen);
  layers::Context<> ctx;
  auto y = test::to_vector(block.forward(ctx, x.cview()));
  Tensor<double> res({B, Tn, C}), ref({B, Tn, C});
  auto a = attn.forward(ctx, ln_1.forward(ctx, x.cview()));
  for (std::int64_t i = 0; i < res.numel(); ++i) res[i] = x[i] + a[i];
  auto m = mlp.forward(ctx, ln_2.forward(ctx, res.cview()));
  for (std::int64_t i = 0; i < ref.numel(); ++i) ref[i] = res[i] + m[i];
  CHECK(test::rel_error(y, ref) < 1e-14);

  const auto dx = test::to_vector(block.backward_input(ctx, r.cview()));
  block.backward_weight(ctx, r.cview());
  auto loss = [&] { return test::dot(block.forward(ctx, x.cview()), r); };
  CHECK(test::rel_error(dx, test::numeric_gradient(loss, x.data(), x.numel())) < 1e-7);
  check_parameter_gradients(block, loss);
}

TEST_CASE("TransformerBlock: recomputation gives bit-identical outputs and gradients over interleaved micro-batches",
          "[transformer][block][recompute]") {
  auto gen = test::rng(23);
  const std::int64_t B = 2, Tn = 5, C = 8;
  layers::TransformerBlock<double> stored({.dim = C, .heads = 4}), recomputed({.dim = C, .heads = 4, .recompute = true});
  layers::initialize_all(stored.parameters(), 3, nullptr);
  layers::initialize_all(recomputed.parameters(), 3, nullptr);
  Tensor<double> x[2] = {test::random_tensor<double>({B, Tn, C}, gen), test::random_tensor<double>({B, Tn, C}, gen)};
  Tensor<double> r[2] = {test::random_tensor<double>({B, Tn, C}, gen), test::random_tensor<double>({B, Tn, C}, gen)};
  std::vector<double> out[2][2], dx[2][2];  // [layer][micro-batch]
  auto run = [&](layers::TransformerBlock<double>& block, int k) {
    layers::Context<> ctx;
    for (int mb = 0; mb < 2; ++mb) {  // forward both micro-batches, then backward both (1F1B-like)
      ctx.micro_batch = mb;
      out[k][mb] = test::to_vector(block.forward(ctx, x[mb].cview()));
    }
    for (int mb = 0; mb < 2; ++mb) {
      ctx.micro_batch = mb;
      dx[k][mb] = test::to_vector(block.backward_input(ctx, r[mb].cview()));
      block.backward_weight(ctx, r[mb].cview());
    }
  };
  run(stored, 0);
  run(recomputed, 1);
  for (int mb = 0; mb < 2; ++mb) {
    CHECK(out[0][mb] == out[1][mb]);
    CHECK(dx[0][mb] == dx[1][mb]);
  }
  for (std::size_t i = 0; i < stored.parameters().size(); ++i) {
    CAPTURE(stored.parameters()[i]->name());
    CHECK(test::to_vector(stored.parameters()[i]->grad()) == test::to_vector(recomputed.parameters()[i]->grad()));
  }
}

TEST_CASE("TransformerBlock: deferred weight gradients, GELU recompute and recomputation give bit-identical "
          "outputs and gradients over interleaved micro-batches", "[transformer][block][deferred]") {
  auto gen = test::rng(27);
  const std::int64_t B = 2, Tn = 5, C = 8;
  Tensor<double> x[2] = {test::random_tensor<double>({B, Tn, C}, gen), test::random_tensor<double>({B, Tn, C}, gen)};
  Tensor<double> r[2] = {test::random_tensor<double>({B, Tn, C}, gen), test::random_tensor<double>({B, Tn, C}, gen)};
  struct Run {
    std::vector<double> out[2], dx[2];
    std::vector<std::vector<double>> grads;
  };
  // Both forwards, then each backward_input (the second into a buffer of the caller's), with its
  // backward_weight at once unless deferred (then both after); every parameter must be reported
  // ready once per micro-batch.
  auto run = [&](bool deferred, bool recompute, bool recompute_gelu) {
    layers::TransformerBlock<double> block({.dim = C, .heads = 2, .recompute = recompute, .recompute_gelu = recompute_gelu});
    layers::initialize_all(block.parameters(), 3, nullptr);
    std::map<const void*, int> reports;
    layers::Context<> ctx;
    ctx.deferred_weight_gradients = deferred;
    ctx.on_grad_ready = [&](std::span<layers::ParamBase* const> ps) {
      for (auto* p : ps) ++reports[static_cast<const void*>(p)];
    };
    Run out;
    for (int mb = 0; mb < 2; ++mb) {
      ctx.micro_batch = mb;
      out.out[mb] = test::to_vector(block.forward(ctx, x[mb].cview()));
    }
    Tensor<double> own({B, Tn, C});  // micro-batch 1's input gradient into a buffer of the caller's
    for (int mb = 0; mb < 2; ++mb) {
      ctx.micro_batch = mb;
      out.dx[mb] = mb == 0 ? test::to_vector(block.backward_input(ctx, r[mb].cview()))
                           : test::to_vector(block.backward_input_into(ctx, r[mb].cview(), own.view()));
      if (!deferred) block.backward_weight(ctx, r[mb].cview());
    }
    for (int mb = 0; deferred && mb < 2; ++mb) {
      ctx.micro_batch = mb;
      block.backward_weight(ctx, r[mb].cview());
    }
    for (auto* p : block.parameters()) {
      CAPTURE(p->name());
      CHECK(reports[static_cast<const void*>(static_cast<layers::ParamBase*>(p))] == 2);
      out.grads.push_back(test::to_vector(p->grad()));
    }
    return out;
  };
  const Run want = run(false, false, false);
  for (bool deferred : {false, true})
    for (bool recompute : {false, true})
      for (bool recompute_gelu : {false, true}) {
        CAPTURE(deferred, recompute, recompute_gelu);
        const Run got = run(deferred, recompute, recompute_gelu);
        for (int mb = 0; mb < 2; ++mb) {
          CHECK(got.out[mb] == want.out[mb]);
          CHECK(got.dx[mb] == want.dx[mb]);
        }
        CHECK(got.grads == want.grads);
      }
}

TEST_CASE("Residual joins: attention and MLP forward(x, res) = res + forward(x); the row-parallel linear in place",
          "[transformer][attention][mlp]") {
  auto gen = test::rng(28);
  const std::int64_t B = 2, Tn = 3, C = 6;
  layers::CausalSelfAttention<double> attn(C, 3, "attn");
  layers::Mlp<double> mlp(C, 10, "mlp");
  layers::RowParallelLinear<double> row(4, C, {.name = "row"});
  layers::initialize_all(attn.parameters(), 5, nullptr);
  layers::initialize_all(mlp.parameters(), 5, nullptr);
  layers::initialize_all(row.parameters(), 5, nullptr);
  auto x = test::random_tensor<double>({B, Tn, C}, gen), res = test::random_tensor<double>({B, Tn, C}, gen);
  layers::Context<> ctx;
  auto check_join = [&](auto& layer, TensorView<const double> in) {
    const auto joined = test::to_vector(layer.forward(ctx, in, res.cview()));
    const auto plain = layer.forward(ctx, in);
    for (std::int64_t i = 0; i < res.numel(); ++i) CHECK(joined[static_cast<std::size_t>(i)] == test::Approx(plain[i] + res[i]).epsilon(1e-14));
    return joined;
  };
  check_join(attn, x.cview());
  check_join(mlp, x.cview());
  auto xr = test::random_tensor<double>({B, Tn, 4}, gen);
  const auto joined = check_join(row, xr.cview());
  Tensor<double> stream({B, Tn, C});
  copy(stream.view(), res.cview());
  CHECK(row.forward(ctx, xr.cview(), stream.cview(), stream.view()).data() == stream.data());  // in place
  CHECK(test::rel_error(test::to_vector(stream), joined) < 1e-15);
}

static_assert(layers::check_layer<layers::TransformerBlock<double>>());
static_assert(layers::check_layer<layers::CausalSelfAttention<float>>());
static_assert(layers::check_layer<layers::BidirectionalSelfAttention<float>>());
static_assert(layers::check_layer<layers::Mlp<float>>());
static_assert(layers::check_layer<layers::LayerNorm<float>>());
static_assert(layers::check_layer<layers::Embedding<float>>());
static_assert(layers::check_layer<layers::ColumnParallelLinear<float>>());
static_assert(layers::check_layer<layers::RowParallelLinear<float>>());

TEST_CASE("TransformerBlock: a change at position t0 leaves the outputs before t0 unchanged",
          "[transformer][block][attention]") {
  auto gen = test::rng(24);
  const std::int64_t B = 1, Tn = 6, C = 8, t0 = 4;
  layers::TransformerBlock<double> block({.dim = C, .heads = 2});
  layers::initialize_all(block.parameters(), 4, nullptr);
  auto x = test::random_tensor<double>({B, Tn, C}, gen);
  layers::Context<> ctx;
  const auto before = test::to_vector(block.forward(ctx, x.cview()));
  for (std::int64_t c = 0; c < C; ++c) x(0, t0, c) += 0.5 * static_cast<double>(c % 3);  // not a shift: LN would cancel it
  const auto after = test::to_vector(block.forward(ctx, x.cview()));
  for (std::int64_t t = 0; t < Tn; ++t) {
    bool same = true;
    for (std::int64_t c = 0; c < C; ++c) same = same && before[t * C + c] == after[t * C + c];
    CAPTURE(t);
    CHECK(same == (t < t0));
  }
}

TEST_CASE("TransformerBlock and the tied cross-entropy in float agree with float64", "[transformer][block][float]") {
  auto gen = test::rng(25);
  const std::int64_t B = 2, Tn = 4, C = 16, V = 30;
  layers::Embedding<float> ef({.vocab = V, .max_seq = Tn, .dim = C});
  layers::Embedding<double> ed({.vocab = V, .max_seq = Tn, .dim = C});
  layers::TransformerBlock<float> bf({.dim = C, .heads = 4});
  layers::TransformerBlock<double> bd({.dim = C, .heads = 4});
  layers::VocabParallelCrossEntropy<float> cf(ef);
  layers::VocabParallelCrossEntropy<double> cd(ed);
  for (auto* p : ef.parameters()) layers::initialize(*p, 8, nullptr);
  for (auto* p : ed.parameters()) layers::initialize(*p, 8, nullptr);
  layers::initialize_all(bf.parameters(), 8, nullptr);
  layers::initialize_all(bd.parameters(), 8, nullptr);
  Tensor<std::int32_t> tokens({B, Tn}), targets({B, Tn});
  std::uniform_int_distribution<int> tok(0, V - 1);
  for (auto& t : tokens) t = tok(gen);
  for (auto& t : targets) t = tok(gen);
  layers::Context<> ctx;
  cf.forward(ctx, bf.forward(ctx, ef.forward(ctx, tokens.cview())), targets.cview());
  cd.forward(ctx, bd.forward(ctx, ed.forward(ctx, tokens.cview())), targets.cview());
  const double lf = cf.take_loss(), ld = cd.take_loss();
  CHECK(lf == test::Approx(ld).epsilon(1e-5));
  CHECK(test::rel_error(bf.backward_input(ctx, cf.backward(ctx)), test::to_vector(bd.backward_input(ctx, cd.backward(ctx)))) < 1e-4);
}

TEST_CASE("Stack of TransformerBlocks: GPT-2 parameter names; every parameter reported ready once per micro-batch",
          "[transformer][block]") {
  auto gen = test::rng(26);
  const std::int64_t B = 1, Tn = 3, C = 8;
  std::vector<layers::TransformerBlock<double>> blocks;
  for (int i = 0; i < 2; ++i) blocks.emplace_back(layers::BlockOptions{.dim = C, .heads = 2, .recompute = i == 1});
  layers::Stack<layers::TransformerBlock<double>> stack(std::move(blocks), "h");
  const auto params = stack.parameters();
  CHECK(params.front()->name() == "h.0.ln_1.weight");
  CHECK(params[2]->name() == "h.0.attn.c_attn.weight");
  CHECK(params.back()->name() == "h.1.mlp.c_proj.bias");
  layers::initialize_all(params, 1, nullptr);

  std::map<const void*, int> reports;
  layers::Context<> ctx;
  ctx.on_grad_ready = [&](std::span<layers::ParamBase* const> ps) {
    for (auto* p : ps) ++reports[static_cast<const void*>(static_cast<layers::Param<double>*>(p))];
  };
  auto x = test::random_tensor<double>({B, Tn, C}, gen), r = test::random_tensor<double>({B, Tn, C}, gen);
  for (int mb = 0; mb < 2; ++mb) {
    ctx.micro_batch = mb;
    stack.forward(ctx, x.cview());
  }
  for (int mb = 0; mb < 2; ++mb) {
    ctx.micro_batch = mb;
    stack.backward_input(ctx, r.cview());
    stack.backward_weight(ctx, r.cview());
  }
  CHECK(reports.size() == params.size());
  for (auto* p : params) {
    CAPTURE(p->name());
    CHECK(reports[p] == 2);
  }
}
