#pragma once
// GPT-2 as Hugging Face transformers reads and writes it: tensor names, the model directory and
// its config.json — what train_gpt's --export DIR/ writes and --import reads besides a file of
// GPT-2's bare names (train/checkpointing.hpp: export_gpt2 / import_gpt2 do the collective part).
//
// Names. dpml's parameters carry GPT-2's bare names (wte.weight, h.N.attn.c_attn.weight, …,
// ln_f.bias), as OpenAI's checkpoint does (and the Hub's `gpt2` model.safetensors). transformers'
// GPT2LMHeadModel names the same tensors by module path, "transformer." + name, and its head
// `lm_head.weight` is tied to transformer.wte.weight (GPT2LMHeadModel lists it in
// _tied_weights_keys): save_pretrained leaves it out of model.safetensors and from_pretrained ties
// it back when tie_word_embeddings is true — so an export writes no lm_head.weight. An import
// takes either naming; an lm_head.weight in the file must equal the file's wte bit for bit (an
// untied head is a model dpml cannot hold: refused); GPT-2's attention masks h.N.attn.bias and
// h.N.attn.masked_bias, buffers that older checkpoints carry, are skipped by name. Layouts (Conv1D
// weights (in, out), c_attn columns [q | k | v]) are the same in both namings: checkpointing.hpp.
//
// Paths. A path ending in '/' or naming an existing directory is a Hugging Face directory:
// DIR/model.safetensors + DIR/config.json. Any other path is one safetensors file; on import the
// config.json beside it, if there is one, is checked too (save_pretrained writes them together).
//
// config.json (hf_gpt2_config): GPT2Config's fields for this model — sizes; n_inner null (4C);
// activation "gelu_new" (dpml's GELU is the tanh approximation: kernels/host/activation.hpp);
// layer_norm_epsilon 1e-5 (layers/layer_norm.hpp); no dropout (pdrop 0); attention scaled by
// 1/sqrt(head dim) (scale_attn_weights); tied embeddings; float32 (as torch_dtype and as dtype,
// its name since transformers 4.56); bos/eos 50256, the GPT-2 tokenizer's <|endoftext|>, where
// the vocabulary holds it (V ≥ 50257), else null (a byte vocabulary has no such token;
// GPT2Config's default 50256 would lie outside it). An import reads F32 or BF16 tensors.
// check_hf_gpt2_config refuses a config.json that describes another model: a size other than
// this run's (naming the field, the file and the flag; a field it lacks means GPT2Config's
// default, as it does to transformers) or a computation dpml does not do (another activation,
// epsilon, untied head, …).
//
//   train::hf_gpt2_config(cfg).dump()                 // → DIR/config.json
//   const auto src = train::resolve_gpt2_import(path); // src.weights, src.config ("" = none)

#include "dpml/checkpoint/json.hpp"
#include "dpml/core/error.hpp"
#include "dpml/models/gpt.hpp"
#include "dpml/train/args.hpp"

#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace dpml::train {

inline constexpr std::string_view kHfPrefix = "transformer.";     // GPT2LMHeadModel's base model
inline constexpr std::string_view kHfHead = "lm_head.weight";      // tied to transformer.wte.weight
inline constexpr const char* kHfWeightsFile = "model.safetensors";
inline constexpr const char* kHfConfigFile = "config.json";
inline constexpr std::int64_t kGpt2EndOfText = 50256;              // GPT-2 tokenizer's <|endoftext|>

// dpml's (GPT-2's bare) name → the name in a transformers GPT2LMHeadModel file, and back (a bare
// name stays as it is).
inline std::string hf_tensor_name(std::string_view ours) { return std::string(kHfPrefix) + std::string(ours); }
inline std::string tensor_name_from_file(std::string_view name) {
  return std::string(name.starts_with(kHfPrefix) ? name.substr(kHfPrefix.size()) : name);
}
// GPT-2's attention-mask buffers (either naming): not parameters, skipped on import.
inline bool is_gpt2_buffer(std::string_view name) {
  return name.ends_with(".attn.bias") || name.ends_with(".attn.masked_bias");
}

// Whether an --export / --import path names a Hugging Face directory: ends in '/' or is one.
inline bool is_hf_directory(const std::string& path) {
  std::error_code ec;
  return path.ends_with('/') || std::filesystem::is_directory(path, ec);
}

// Refuses (on every rank alike) an --export target that cannot be written: a directory (existing
// and writable, or to be made in a writable one), else a file (train/args.hpp, as every output flag).
inline void require_writable_export(std::string_view flag, const std::string& path) {
  if (is_hf_directory(path)) require_writable_directory(flag, path, Missing::last);
  else require_writable_output(flag, path);
}

// GPT2Config of a dpml GPT (see the top of the file), in config.json's field names.
inline checkpoint::Json hf_gpt2_config(const models::GptConfig& c) {
  using checkpoint::Json;
  const Json eot = c.vocab > kGpt2EndOfText ? Json(kGpt2EndOfText) : Json(nullptr);
  return Json(Json::Object{{"model_type", "gpt2"},
                           {"architectures", Json(Json::Array{"GPT2LMHeadModel"})},
                           {"vocab_size", c.vocab},
                           {"n_positions", c.max_seq},
                           {"n_embd", c.dim},
                           {"n_layer", c.layers},
                           {"n_head", c.heads},
                           {"n_inner", nullptr},
                           {"activation_function", "gelu_new"},
                           {"layer_norm_epsilon", 1e-5},
                           {"resid_pdrop", 0.0},
                           {"embd_pdrop", 0.0},
                           {"attn_pdrop", 0.0},
                           {"initializer_range", 0.02},
                           {"scale_attn_weights", true},
                           {"scale_attn_by_inverse_layer_idx", false},
                           {"reorder_and_upcast_attn", false},
                           {"tie_word_embeddings", true},
                           {"use_cache", true},
                           {"bos_token_id", eot},
                           {"eos_token_id", eot},
                           {"torch_dtype", "float32"},    // transformers < 4.56
                           {"dtype", "float32"}});        // transformers >= 4.56
}

// Refuses a config.json (`file`) that describes a model other than `c`; see the top of the file.
inline void check_hf_gpt2_config(const checkpoint::Json& config, const std::string& file, const models::GptConfig& c) {
  using checkpoint::Json;
  DPML_REQUIRE(config.is_object(), "'" << file << "' is not a JSON object");
  struct Size {
    const char* field;
    const char* flag;
    std::int64_t ours, default_value;  // GPT2Config's default, where the file lacks the field
  };
  const Size sizes[] = {{"n_layer", "--num-layers", c.layers, 12},        {"n_head", "--num-attention-heads", c.heads, 12},
                        {"n_embd", "--hidden-size", c.dim, 768},          {"vocab_size", "--vocab-size", c.vocab, 50257},
                        {"n_positions", "--seq-length", c.max_seq, 1024}};
  for (const auto& s : sizes) {
    const Json* v = config.find(s.field);
    DPML_REQUIRE(v == nullptr || v->is_int(), "'" << file << "': " << s.field << " is " << v->dump() << ", not an integer");
    const std::int64_t theirs = v ? v->as_int() : s.default_value;
    DPML_REQUIRE(theirs == s.ours, "'" << file << "' has " << s.field << " " << theirs
                                       << (v ? "" : " (GPT2Config's default: the file does not set it)") << ", this run has "
                                       << s.flag << " " << s.ours);
  }
  // What dpml's GPT computes: a field the file lacks takes GPT2Config's default, which is ours.
  const auto is_string_in = [](std::vector<std::string_view> ok) {  // of string literals
    return [ok = std::move(ok)](const Json& v) {
      for (auto s : ok)
        if (v.is_string() && v.as_string() == s) return true;
      return false;
    };
  };
  const auto is_bool = [](bool b) { return [b](const Json& v) { return v.is_bool() && v.as_bool() == b; }; };
  struct Semantic {
    const char* field;
    std::function<bool(const Json&)> ours;
    const char* what;  // what dpml computes
  };
  const Semantic semantics[] = {
      {"model_type", is_string_in({"gpt2"}), "\"gpt2\""},
      {"activation_function", is_string_in({"gelu_new", "gelu_pytorch_tanh", "gelu_fast"}),
       "GELU's tanh approximation (\"gelu_new\")"},
      {"layer_norm_epsilon", [](const Json& v) { return v.is_number() && std::abs(v.as_double() - 1e-5) <= 1e-12; }, "1e-05"},
      {"n_inner", [&c](const Json& v) { return v.is_null() || (v.is_int() && v.as_int() == 4 * c.dim); },
       "null (an MLP of 4 × n_embd)"},
      {"tie_word_embeddings", is_bool(true), "true (the head is the token embedding)"},
      {"scale_attn_weights", is_bool(true), "true (scores scaled by 1/sqrt(head dim))"},
      {"scale_attn_by_inverse_layer_idx", is_bool(false), "false"},
      {"add_cross_attention", is_bool(false), "false"}};
  for (const auto& s : semantics) {
    const Json* v = config.find(s.field);
    DPML_REQUIRE(v == nullptr || s.ours(*v), "'" << file << "' has " << s.field << " " << v->dump() << ": dpml's GPT has "
                                                 << s.what << ", so its weights would compute another model");
  }
}

// A JSON file, parsed (errors name the file).
inline checkpoint::Json read_json_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  DPML_REQUIRE(in.good(), "cannot read '" << path << "'");
  std::stringstream text;
  text << in.rdbuf();
  return checkpoint::Json::parse(text.str(), path);
}

// What an --import path names: the safetensors file and the config.json to check ("" = none).
struct Gpt2Source {
  std::string weights, config;
};
inline Gpt2Source resolve_gpt2_import(const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (is_hf_directory(path)) {
    DPML_REQUIRE(fs::is_directory(path, ec), "'" << path << "' is not a directory");
    const fs::path dir(path);
    const fs::path weights = dir / kHfWeightsFile;
    if (!fs::exists(weights, ec)) {
      const bool sharded = fs::exists(dir / "model.safetensors.index.json", ec), torch = fs::exists(dir / "pytorch_model.bin", ec);
      DPML_REQUIRE(false, "directory '" << path << "' has no " << kHfWeightsFile
                                        << (sharded ? " (a sharded model.safetensors.index.json is not read: save with a larger max_shard_size)"
                                            : torch ? " (pytorch_model.bin is not read: save with safe_serialization=True)"
                                                    : ""));
    }
    const fs::path config = dir / kHfConfigFile;
    return {weights.string(), fs::exists(config, ec) ? config.string() : ""};
  }
  DPML_REQUIRE(fs::is_regular_file(path, ec), "'" << path << "' does not exist or is not a file");
  const fs::path beside = fs::path(path).parent_path() / kHfConfigFile;
  return {path, fs::is_regular_file(beside, ec) ? beside.string() : ""};
}

}  // namespace dpml::train
