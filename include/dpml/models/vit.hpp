#pragma once
// A Vision Transformer (Dosovitskiy et al. 2021) for image classification, composed of library
// layers only — one Sequential, so the library's trainer runs it under data and tensor
// parallelism as any model:
//
//   images (N, Cin, H, W)
//   0 PatchTokens    (N, T, Cin·P·P)     T = (H/P)·(W/P) non-overlapping P × P patches
//   1 Linear         (N, T, C)           "1.patch_embed": the patch embedding (a stride-P Conv2d)
//   2 ClassToken     (N, 1 + T, C)       "2.embed.cls", "2.embed.pos": class token, positions
//   3 Stack of pre-LN TransformerBlocks with bidirectional attention, "3.blocks.<i>.ln_1.weight", …;
//     their attention heads and MLP split over the tensor axis (column/row parallel, as models::Gpt)
//   4 TakeClassToken (N, C)              the class token's row (the final LayerNorm is per token:
//   5 LayerNorm      (N, C)              "5.ln_f"   normalising only the row the head reads is the same)
//   6 Linear         (N, classes)        "6.head", replicated over the tensor axis
//
// Parameter names (Sequential's "<index>." prefix, then the layer's) are global and stable (the same on every layout), so initial weights (Philox at
// each element's global index, keyed by the name) and checkpoints are layout-independent. Written
// for any T and Space: on CudaSpace the attention's flash kernels need a head dim (C / heads) of
// 32, 64 or 128.

#include "dpml/core/error.hpp"
#include "dpml/kernels/attention_mask.hpp"
#include "dpml/layers/layer_norm.hpp"
#include "dpml/layers/linear.hpp"
#include "dpml/layers/sequential.hpp"
#include "dpml/layers/stack.hpp"
#include "dpml/layers/transformer_block.hpp"
#include "dpml/layers/vision.hpp"
#include "dpml/parallel/tensor.hpp"

#include <cstdint>
#include <string>
#include <vector>

namespace dpml::models {

struct VitConfig {
  std::int64_t image = 28;      // H = W
  std::int64_t channels = 1;    // Cin
  std::int64_t patch = 7;       // P, dividing image
  std::int64_t dim = 64;        // C
  std::int64_t layers = 4;      // transformer blocks
  std::int64_t heads = 4;       // dividing C, and divisible by tp
  std::int64_t mlp_hidden = 0;  // 0: 4 · C
  std::int64_t classes = 10;
  bool recompute_gelu = false;  // the MLP's GELU output shared by all blocks, recomputed in the backward

  std::int64_t tokens() const noexcept { return (image / patch) * (image / patch); }  // T
  // All parameters, whole tensors (not a tensor-parallel rank's shards).
  std::int64_t parameter_count() const noexcept {
    const std::int64_t C = dim, hidden = mlp_hidden > 0 ? mlp_hidden : 4 * dim;
    const std::int64_t block = 4 * C + (3 * C * C + 3 * C) + (C * C + C) + (C * hidden + hidden) + (hidden * C + C);
    return (channels * patch * patch * C + C) + C + (1 + tokens()) * C + layers * block + 2 * C + (C * classes + classes);
  }
};

template <class T = float, class Space = HostSpace, class Comm = parallel::default_comm_t<Space>>
struct Vit {
  using Block = layers::TransformerBlock<T, Space, Comm, attention::Bidirectional>;
  using Linear = layers::Linear<T, Space>;
  using Network = layers::Sequential<layers::PatchTokens<T, Space>, Linear, layers::ClassToken<T, Space>,
                                     layers::Stack<Block>, layers::TakeClassToken<T, Space>,
                                     layers::LayerNorm<T, Space>, Linear>;

  // region: the tensor axis (none: tp = 1); heads must be divisible by its size.
  static Network make(const VitConfig& c, const parallel::TensorRegion<Comm>& region = {}) {
    DPML_REQUIRE_EVERYWHERE(c.patch >= 1 && c.image >= c.patch && c.image % c.patch == 0,
                            "ViT: --patch-size " << c.patch << " does not divide the " << c.image << "×" << c.image << " image");
    DPML_REQUIRE_EVERYWHERE(c.layers >= 1 && c.dim >= 1 && c.channels >= 1 && c.classes >= 1,
                            "ViT: --num-layers " << c.layers << " and --hidden-size " << c.dim << " must be ≥ 1");
    std::vector<Block> blocks;
    for (std::int64_t i = 0; i < c.layers; ++i)
      blocks.emplace_back(
          layers::BlockOptions{.dim = c.dim, .heads = c.heads, .mlp_hidden = c.mlp_hidden, .recompute_gelu = c.recompute_gelu}, region);
    return Network(layers::PatchTokens<T, Space>(c.patch),
                   Linear(c.channels * c.patch * c.patch, c.dim, {.name = "patch_embed"}),
                   layers::ClassToken<T, Space>(c.tokens(), c.dim, "embed"), layers::Stack<Block>(std::move(blocks), "blocks"),
                   layers::TakeClassToken<T, Space>(), layers::LayerNorm<T, Space>(c.dim, "ln_f"),
                   Linear(c.dim, c.classes, {.name = "head"}));
  }
};

}  // namespace dpml::models
