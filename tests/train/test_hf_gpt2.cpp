// train/hf_gpt2.hpp: transformers' names both ways, config.json against GPT-2's own on the Hub,
// a config.json of another model refused naming the field, the file and the flag, and what an
// --import / --export path names. The files themselves (train_gpt --export DIR/, --import) are
// checked by tests/train/hf_export.py.
#include "test.hpp"

#include <dpml/checkpoint/json.hpp>
#include <dpml/train/hf_gpt2.hpp>

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <string>
#include <utility>

using namespace dpml;
using checkpoint::Json;
namespace fs = std::filesystem;

namespace {

// config.json of the Hub's `gpt2` (124M), as published: the reference written by transformers,
// not by dpml.
constexpr const char* kHubGpt2Config = R"({
  "activation_function": "gelu_new", "architectures": ["GPT2LMHeadModel"], "attn_pdrop": 0.1,
  "bos_token_id": 50256, "embd_pdrop": 0.1, "eos_token_id": 50256, "initializer_range": 0.02,
  "layer_norm_epsilon": 1e-05, "model_type": "gpt2", "n_ctx": 1024, "n_embd": 768, "n_head": 12,
  "n_layer": 12, "n_positions": 1024, "resid_pdrop": 0.1, "summary_activation": null,
  "summary_first_dropout": 0.1, "summary_proj_to_labels": true, "summary_type": "cls_index",
  "summary_use_proj": true, "task_specific_params": {"text-generation": {"do_sample": true, "max_length": 50}},
  "vocab_size": 50257})";

// config.json that transformers 5.17 wrote (GPT2LMHeadModel(GPT2Config(vocab_size=256,
// n_positions=32, n_embd=64, n_layer=2, n_head=2, pdrops 0, bos/eos None)).save_pretrained).
constexpr const char* kTransformersTinyConfig = R"({
  "activation_function": "gelu_new", "add_cross_attention": false, "architectures": ["GPT2LMHeadModel"],
  "attn_pdrop": 0.0, "bos_token_id": null, "dtype": "float32", "embd_pdrop": 0.0, "eos_token_id": null,
  "initializer_range": 0.02, "layer_norm_epsilon": 1e-05, "model_type": "gpt2", "n_embd": 64, "n_head": 2,
  "n_inner": null, "n_layer": 2, "n_positions": 32, "pad_token_id": null, "reorder_and_upcast_attn": false,
  "resid_pdrop": 0.0, "scale_attn_by_inverse_layer_idx": false, "scale_attn_weights": true,
  "summary_activation": null, "summary_first_dropout": 0.1, "summary_proj_to_labels": true,
  "summary_type": "cls_index", "summary_use_proj": true, "tie_word_embeddings": true,
  "transformers_version": "5.17.0", "use_cache": true, "vocab_size": 256})";

const models::GptConfig kGpt2Small{.vocab = 50257, .max_seq = 1024, .layers = 12, .heads = 12, .dim = 768};
const models::GptConfig kTiny{.vocab = 256, .max_seq = 16, .layers = 2, .heads = 2, .dim = 32};

// `config` with member `key` set to `value` (added if absent), or removed when `value` is absent.
Json with(const Json& config, const std::string& key, const Json* value) {
  Json out = Json::object();
  bool seen = false;
  for (const auto& [k, v] : config.as_object()) {
    if (k != key) out.set(k, v);
    else if (value) out.set(k, *value), seen = true;
  }
  if (value && !seen) out.set(key, *value);
  return out;
}
Json with(const Json& config, const std::string& key, Json value) { return with(config, key, &value); }
Json without(const Json& config, const std::string& key) { return with(config, key, nullptr); }

std::string refusal(const Json& config, const models::GptConfig& c) {
  return test::message_of([&] { train::check_hf_gpt2_config(config, "run/config.json", c); });
}

// A fresh directory under the system's temporary one, removed at the end of the test.
struct TempDir {
  fs::path path = fs::temp_directory_path() / ("dpml-hf-gpt2-" + std::to_string(::getpid()));
  TempDir() {
    fs::remove_all(path);
    fs::create_directories(path);
  }
  ~TempDir() { fs::remove_all(path); }
  void touch(const fs::path& name) const { std::ofstream(path / name) << "x"; }
};

}  // namespace

TEST_CASE("hf_gpt2: transformers' names both ways", "[train][hf]") {
  for (const std::string ours : {"wte.weight", "wpe.weight", "h.0.ln_1.weight", "h.11.attn.c_attn.weight", "h.3.mlp.c_proj.bias",
                                 "ln_f.bias"}) {
    CAPTURE(ours);
    CHECK(train::hf_tensor_name(ours) == "transformer." + ours);
    CHECK(train::tensor_name_from_file(train::hf_tensor_name(ours)) == ours);
    CHECK(train::tensor_name_from_file(ours) == ours);  // GPT-2's bare names are read as they are
  }
  CHECK(train::tensor_name_from_file("lm_head.weight") == "lm_head.weight");  // not a transformer. tensor
  CHECK(train::kHfHead == "lm_head.weight");
  for (const std::string buffer : {"h.0.attn.bias", "h.5.attn.masked_bias", "transformer.h.1.attn.bias",
                                   "transformer.h.1.attn.masked_bias"})
    CHECK(train::is_gpt2_buffer(buffer));
  for (const std::string param : {"h.0.attn.c_attn.bias", "transformer.h.0.attn.c_proj.bias", "h.0.mlp.c_fc.bias", "ln_f.bias"})
    CHECK_FALSE(train::is_gpt2_buffer(param));
}

TEST_CASE("hf_gpt2: config.json holds GPT2Config's fields as the Hub's gpt2 has them", "[train][hf]") {
  const Json hub = Json::parse(kHubGpt2Config, "the Hub's gpt2 config.json");
  // Written out and parsed back, as transformers reads it.
  const Json ours = Json::parse(train::hf_gpt2_config(kGpt2Small).dump(), "ours");
  for (const char* key : {"activation_function", "architectures", "bos_token_id", "eos_token_id", "initializer_range",
                          "layer_norm_epsilon", "model_type", "n_embd", "n_head", "n_layer", "n_positions", "vocab_size"}) {
    CAPTURE(key);
    CHECK(ours.at(key) == hub.at(key));
  }
  for (const char* key : {"attn_pdrop", "embd_pdrop", "resid_pdrop"}) CHECK(ours.at(key).as_double() == 0.0);  // no dropout in dpml
  CHECK(ours.at("n_inner").is_null());
  CHECK(ours.at("tie_word_embeddings").as_bool());
  CHECK(ours.at("scale_attn_weights").as_bool());
  CHECK_FALSE(ours.at("scale_attn_by_inverse_layer_idx").as_bool());
  CHECK(ours.at("torch_dtype").as_string() == "float32");
  // The Hub's own config describes the same model: accepted, as is ours.
  CHECK(refusal(hub, kGpt2Small).empty());
  CHECK(refusal(ours, kGpt2Small).empty());
  // <|endoftext|> only where the vocabulary holds token 50256.
  for (std::int64_t v : {256, 50256, 50257, 65536}) {
    CAPTURE(v);
    models::GptConfig c = kTiny;
    c.vocab = v;
    const Json j = train::hf_gpt2_config(c);
    CHECK(j.at("vocab_size").as_int() == v);
    CHECK(j.at("bos_token_id") == (v >= 50257 ? Json(50256) : Json(nullptr)));
    CHECK(j.at("eos_token_id") == j.at("bos_token_id"));
  }
  // Every field transformers writes for a byte-level model of this size, ours has alike.
  const models::GptConfig byte_model{.vocab = 256, .max_seq = 32, .layers = 2, .heads = 2, .dim = 64};
  const Json written = Json::parse(kTransformersTinyConfig, "transformers' config.json");
  const Json mine = train::hf_gpt2_config(byte_model);
  for (const auto& [key, value] : mine.as_object()) {
    CAPTURE(key);
    if (key != "torch_dtype") CHECK(value == written.at(key));
  }
  CHECK(refusal(written, byte_model).empty());
  const Json tiny = train::hf_gpt2_config(kTiny);
  CHECK(tiny.at("n_positions").as_int() == 16);
  CHECK(tiny.at("n_embd").as_int() == 32);
  CHECK(tiny.at("n_layer").as_int() == 2);
  CHECK(tiny.at("n_head").as_int() == 2);
}

TEST_CASE("hf_gpt2: a config.json of another model is refused naming the field, the file and the flag", "[train][hf]") {
  const Json ours = train::hf_gpt2_config(kTiny);
  struct Case {
    const char* field;
    const char* flag;
    std::int64_t theirs, mine;
  };
  for (const Case c : {Case{"n_layer", "--num-layers", 3, 2}, Case{"n_head", "--num-attention-heads", 4, 2},
                       Case{"n_embd", "--hidden-size", 64, 32}, Case{"vocab_size", "--vocab-size", 50257, 256},
                       Case{"n_positions", "--seq-length", 1024, 16}}) {
    CAPTURE(c.field);
    const std::string msg = refusal(with(ours, c.field, Json(c.theirs)), kTiny);
    CHECK(msg == "'run/config.json' has " + std::string(c.field) + " " + std::to_string(c.theirs) + ", this run has " + c.flag +
                     " " + std::to_string(c.mine));
  }
  // A size the file does not set is GPT2Config's default, as transformers reads it.
  CHECK(refusal(without(ours, "n_layer"), kTiny) ==
        "'run/config.json' has n_layer 12 (GPT2Config's default: the file does not set it), this run has --num-layers 2");
  CHECK(refusal(without(Json::parse(kHubGpt2Config), "n_layer"), kGpt2Small).empty());
  CHECK(refusal(with(ours, "n_layer", Json("2")), kTiny) == "'run/config.json': n_layer is \"2\", not an integer");
  // A computation dpml's GPT does not do.
  using Entries = std::initializer_list<std::pair<const char*, Json>>;
  for (const auto& [field, value] : Entries{{"activation_function", Json("relu")},
                                     {"activation_function", Json("gelu")},
                                     {"layer_norm_epsilon", Json(1e-6)},
                                     {"tie_word_embeddings", Json(false)},
                                     {"scale_attn_weights", Json(false)},
                                     {"scale_attn_by_inverse_layer_idx", Json(true)},
                                     {"add_cross_attention", Json(true)},
                                     {"model_type", Json("gpt_neo")},
                                     {"n_inner", Json(100)}}) {
    CAPTURE(field, value.dump());
    const std::string msg = refusal(with(ours, field, value), kTiny);
    CHECK(msg.starts_with("'run/config.json' has " + std::string(field) + " " + value.dump() + ": dpml's GPT has "));
  }
  for (const auto& [field, value] : Entries{{"activation_function", Json("gelu_pytorch_tanh")},
                                     {"n_inner", Json(4 * 32)},
                                     {"layer_norm_epsilon", Json(1e-5)}}) {
    CAPTURE(field);
    CHECK(refusal(with(ours, field, value), kTiny).empty());
  }
  CHECK(refusal(Json::array(), kTiny) == "'run/config.json' is not a JSON object");
}

TEST_CASE("hf_gpt2: what an --import or --export path names", "[train][hf]") {
  const TempDir tmp;
  const fs::path dir = tmp.path / "model";
  fs::create_directories(dir);
  CHECK(train::is_hf_directory(dir.string()));
  CHECK(train::is_hf_directory("not-yet-made/"));
  CHECK_FALSE(train::is_hf_directory((tmp.path / "gpt.safetensors").string()));

  // A directory: its model.safetensors, and its config.json where there is one.
  CHECK(test::message_of([&] { train::resolve_gpt2_import(dir.string()); }) ==
        "directory '" + dir.string() + "' has no model.safetensors");
  tmp.touch("model/pytorch_model.bin");
  CHECK(test::message_of([&] { train::resolve_gpt2_import(dir.string()); }).ends_with(
      "has no model.safetensors (pytorch_model.bin is not read: save with safe_serialization=True)"));
  tmp.touch("model/model.safetensors");
  auto src = train::resolve_gpt2_import(dir.string() + "/");
  CHECK(fs::equivalent(src.weights, dir / "model.safetensors"));
  CHECK(src.config.empty());
  tmp.touch("model/config.json");
  src = train::resolve_gpt2_import(dir.string());
  CHECK(fs::equivalent(src.config, dir / "config.json"));
  // A file: itself, and the config.json beside it.
  src = train::resolve_gpt2_import((dir / "model.safetensors").string());
  CHECK(src.weights == (dir / "model.safetensors").string());
  CHECK(fs::equivalent(src.config, dir / "config.json"));
  tmp.touch("bare.safetensors");
  src = train::resolve_gpt2_import((tmp.path / "bare.safetensors").string());
  CHECK(src.config.empty());
  CHECK(test::message_of([&] { train::resolve_gpt2_import((tmp.path / "none.safetensors").string()); }) ==
        "'" + (tmp.path / "none.safetensors").string() + "' does not exist or is not a file");
  CHECK(test::message_of([&] { train::resolve_gpt2_import((tmp.path / "none").string() + "/"); }) ==
        "'" + (tmp.path / "none").string() + "/' is not a directory");

  // --export DIR/: an existing writable directory or one to be made in a writable one.
  CHECK(test::message_of([&] { train::require_writable_export("--export", dir.string()); }).empty());
  CHECK(test::message_of([&] { train::require_writable_export("--export", (tmp.path / "new").string() + "/"); }).empty());
  CHECK(test::message_of([&] { train::require_writable_export("--export", "/nonexistent-dpml-dir/out/"); }) ==
        "flag --export '/nonexistent-dpml-dir/out/': cannot make directory '/nonexistent-dpml-dir/out': "
        "'/nonexistent-dpml-dir' is not a writable directory");
  CHECK(test::message_of([&] { train::require_writable_export("--export", (tmp.path / "bare.safetensors").string() + "/"); }) ==
        "flag --export '" + (tmp.path / "bare.safetensors").string() + "/': '" + (tmp.path / "bare.safetensors").string() +
            "' is not a directory");
  // A file: as every output flag.
  CHECK(test::message_of([&] { train::require_writable_export("--export", "/nonexistent-dpml-dir/gpt.safetensors"); }) ==
        "flag --export '/nonexistent-dpml-dir/gpt.safetensors': directory '/nonexistent-dpml-dir' does not exist");
}
