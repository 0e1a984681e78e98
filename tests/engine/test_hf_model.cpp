// The engine's description of a Hugging Face model directory (rotary_engine/hf_model.h): each fixture's
// config.json read as the engine's Architecture and the checkpoint's RopeSpec (read_hf_model), the families' tables
// of tensor names (hf_tensor_names), and what engine::open_hf_model refuses in a directory - an unknown family, a
// tensor no slot reads - or lets through (the buffers checkpoints carry, a tied model's stored head).
#include <gtest/gtest.h>

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "expect_error.h"
#include "hf_fixtures.h"
#include "rotary/safetensors.h"
#include "rotary_engine/hf_model.h"

namespace rotary::test {
namespace {

namespace fs = std::filesystem;
using engine::Architecture;
using engine::HfModelDescription;
using engine::HfTensorName;

std::string read_text(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

HfModelDescription description_of(const std::string& family) {
  return engine::read_hf_model(read_text(kFixtures / family / "config.json"), family + "/config.json");
}

// The slot named `slot` of the family's table (a failure when the table has none).
HfTensorName named(const std::vector<HfTensorName>& names, const std::string& slot) {
  for (const HfTensorName& n : names)
    if (n.slot.name == slot) return n;
  ADD_FAILURE() << "no slot " << slot;
  return {};
}

// The architecture and rotation each fixture's config.json describes, field by field (the values of
// tests/data/hf_checkpoints/<family>/config.json and the defaults of transformers' config classes).
TEST(HfModelDescription, ReadsEachFixturesConfig) {
  const HfModelDescription llama2 = description_of("llama2");
  EXPECT_EQ(llama2.model_type, "llama");
  const Architecture& a = llama2.arch;
  EXPECT_EQ(a.vocab_size, 64);
  EXPECT_EQ(a.d_model, 32);
  EXPECT_EQ(a.n_layers, 2);
  EXPECT_EQ(a.n_heads, 2);
  EXPECT_EQ(a.n_kv_heads, 2);  // no num_key_value_heads: one per head
  EXPECT_EQ(a.head_dim, 16);
  EXPECT_EQ(a.d_ff, 64);
  EXPECT_EQ(a.norm, engine::NormKind::RmsNorm);
  EXPECT_EQ(a.norm_eps, 1e-5);
  EXPECT_EQ(a.mlp, engine::MlpKind::SwiGlu);
  EXPECT_FALSE(a.qkv_bias || a.out_bias || a.mlp_bias || a.parallel_residual || a.fused_qkv || a.tie_embeddings);
  EXPECT_EQ(a.sliding_window, 0);
  EXPECT_EQ(llama2.rope.head_dim, 16);
  EXPECT_EQ(llama2.rope.rotary_dim, 16);
  EXPECT_EQ(llama2.rope.base, 10000.0);
  EXPECT_EQ(llama2.rope.scaling, RopeScaling::None);
  EXPECT_EQ(llama2.trained_context, 64);

  const HfModelDescription llama3 = description_of("llama3");
  EXPECT_EQ(llama3.model_type, "llama");
  EXPECT_EQ(llama3.arch.vocab_size, 302);
  EXPECT_EQ(llama3.arch.n_kv_heads, 1);
  EXPECT_EQ(llama3.arch.head_dim, 16);
  EXPECT_TRUE(llama3.arch.tie_embeddings);
  EXPECT_EQ(llama3.rope.head_dim, 16);
  EXPECT_EQ(llama3.rope.base, 500000.0);
  EXPECT_EQ(llama3.rope.scaling, RopeScaling::Llama3);
  EXPECT_EQ(llama3.rope.factor, 8.0);
  EXPECT_EQ(llama3.trained_context, 16);  // original_max_position_embeddings of the scaled rope

  const HfModelDescription mistral = description_of("mistral");
  EXPECT_EQ(mistral.model_type, "mistral");
  EXPECT_EQ(mistral.arch.head_dim, 32);  // config.json's own head_dim, not hidden_size / heads = 16
  EXPECT_EQ(mistral.rope.head_dim, 32);
  EXPECT_EQ(mistral.rope.rotary_dim, 32);
  EXPECT_EQ(mistral.arch.n_kv_heads, 1);
  EXPECT_EQ(mistral.arch.norm_eps, 1e-6);
  EXPECT_EQ(mistral.arch.sliding_window, 0);  // "sliding_window": null, as Mistral v0.2 / v0.3 write it
  EXPECT_EQ(mistral.rope.base, 1e6);
  EXPECT_EQ(mistral.trained_context, 64);

  const HfModelDescription qwen2 = description_of("qwen2");
  EXPECT_EQ(qwen2.model_type, "qwen2");
  EXPECT_TRUE(qwen2.arch.qkv_bias);
  EXPECT_FALSE(qwen2.arch.out_bias);
  EXPECT_FALSE(qwen2.arch.mlp_bias);
  EXPECT_TRUE(qwen2.arch.tie_embeddings);
  EXPECT_EQ(qwen2.arch.sliding_window, 0);  // use_sliding_window false
  EXPECT_EQ(qwen2.rope.head_dim, 16);
  EXPECT_EQ(qwen2.rope.scaling, RopeScaling::Yarn);
  EXPECT_EQ(qwen2.rope.factor, 4.0);
  EXPECT_EQ(qwen2.trained_context, 16);

  const HfModelDescription neox = description_of("gpt_neox");
  EXPECT_EQ(neox.model_type, "gpt_neox");
  EXPECT_EQ(neox.arch.norm, engine::NormKind::LayerNorm);
  EXPECT_EQ(neox.arch.norm_eps, 1e-5);
  EXPECT_EQ(neox.arch.mlp, engine::MlpKind::Gelu);
  EXPECT_TRUE(neox.arch.qkv_bias && neox.arch.out_bias && neox.arch.mlp_bias);
  EXPECT_TRUE(neox.arch.parallel_residual);
  EXPECT_TRUE(neox.arch.fused_qkv);
  EXPECT_FALSE(neox.arch.tie_embeddings);
  EXPECT_EQ(neox.arch.n_kv_heads, 2);
  EXPECT_EQ(neox.arch.d_ff, 96);
  EXPECT_EQ(neox.arch.head_dim, 16);
  EXPECT_EQ(neox.rope.head_dim, 16);
  EXPECT_EQ(neox.rope.rotary_dim, 4);  // rotary_pct 0.25 of 16
  EXPECT_EQ(neox.trained_context, 32);
}

// The checkpoint's own position method: its RoPE, no window, no log-n; read_hf_model_file reads a directory or its
// config.json alike, naming the file.
TEST(HfModelDescription, PositionsAreTheCheckpointsOwnRope) {
  for (const char* family : kFamilies) {
    SCOPED_TRACE(family);
    const HfModelDescription d = description_of(family);
    const engine::PositionMethod p = d.positions();
    EXPECT_EQ(p.mode, PositionMode::Rope);
    EXPECT_EQ(p.window, 0);
    EXPECT_EQ(p.leaky_k, 1.0);
    EXPECT_EQ(p.logn_train_len, 0);
    EXPECT_EQ(p.rope.describe(), d.rope.describe());
    EXPECT_EQ(p.rope.head_dim, d.arch.head_dim);
    EXPECT_GT(p.rope.rotary_dim, 0);  // resolved
    const HfModelDescription from_dir = engine::read_hf_model_file((kFixtures / family).string());
    const HfModelDescription from_file = engine::read_hf_model_file((kFixtures / family / "config.json").string());
    EXPECT_EQ(from_dir.model_type, d.model_type);
    EXPECT_EQ(from_file.model_type, d.model_type);
    EXPECT_EQ(from_dir.rope.describe(), d.rope.describe());
    EXPECT_EQ(from_dir.arch.d_ff, d.arch.d_ff);
    EXPECT_EQ(from_dir.trained_context, d.trained_context);
  }
}

// The Llama-like families' table: each slot's Hugging Face name and shape.
TEST(HfModelDescription, LlamaTensorNames) {
  const HfModelDescription d = description_of("llama2");
  const std::vector<HfTensorName> names = engine::hf_tensor_names(d);
  ASSERT_EQ(names.size(), engine::tensor_slots(d.arch).size());
  HfTensorName q = named(names, "layers.1.q.weight");
  EXPECT_EQ(q.stored, "model.layers.1.self_attn.q_proj.weight");
  EXPECT_EQ(q.slot.shape, (std::vector<int64_t>{32, 32}));
  EXPECT_EQ(q.slot.layer, 1);
  EXPECT_EQ(q.slot.part, "q");
  EXPECT_FALSE(q.slot.bias);
  EXPECT_EQ(named(names, "embed").stored, "model.embed_tokens.weight");
  EXPECT_EQ(named(names, "embed").slot.shape, (std::vector<int64_t>{64, 32}));
  EXPECT_EQ(named(names, "lm_head").stored, "lm_head.weight");
  EXPECT_EQ(named(names, "final_norm.weight").stored, "model.norm.weight");
  EXPECT_EQ(named(names, "final_norm.weight").slot.shape, (std::vector<int64_t>{32}));
  EXPECT_EQ(named(names, "layers.0.attn_norm.weight").stored, "model.layers.0.input_layernorm.weight");
  EXPECT_EQ(named(names, "layers.0.mlp_norm.weight").stored, "model.layers.0.post_attention_layernorm.weight");
  EXPECT_EQ(named(names, "layers.0.k.weight").stored, "model.layers.0.self_attn.k_proj.weight");
  EXPECT_EQ(named(names, "layers.0.v.weight").stored, "model.layers.0.self_attn.v_proj.weight");
  EXPECT_EQ(named(names, "layers.0.o.weight").stored, "model.layers.0.self_attn.o_proj.weight");
  const HfTensorName gate = named(names, "layers.0.gate.weight");
  EXPECT_EQ(gate.stored, "model.layers.0.mlp.gate_proj.weight");
  EXPECT_EQ(gate.slot.shape, (std::vector<int64_t>{64, 32}));
  EXPECT_EQ(named(names, "layers.1.up.weight").stored, "model.layers.1.mlp.up_proj.weight");
  const HfTensorName down = named(names, "layers.1.down.weight");
  EXPECT_EQ(down.stored, "model.layers.1.mlp.down_proj.weight");
  EXPECT_EQ(down.slot.shape, (std::vector<int64_t>{32, 64}));

  // Grouped keys (llama3: one kv head of 16) and a tied head (no lm_head slot); Qwen2's q, k, v biases.
  const std::vector<HfTensorName> l3 = engine::hf_tensor_names(description_of("llama3"));
  EXPECT_EQ(named(l3, "layers.0.k.weight").slot.shape, (std::vector<int64_t>{16, 32}));
  for (const HfTensorName& n : l3) EXPECT_NE(n.slot.part, "lm_head") << n.stored;
  const std::vector<HfTensorName> qwen = engine::hf_tensor_names(description_of("qwen2"));
  const HfTensorName qb = named(qwen, "layers.1.q.bias");
  EXPECT_EQ(qb.stored, "model.layers.1.self_attn.q_proj.bias");
  EXPECT_EQ(qb.slot.shape, (std::vector<int64_t>{32}));
  EXPECT_TRUE(qb.slot.bias);
  EXPECT_EQ(named(qwen, "layers.0.v.bias").slot.shape, (std::vector<int64_t>{16}));
  for (const HfTensorName& n : qwen) EXPECT_NE(n.slot.name, "layers.0.o.bias");
}

// GPT-NeoX's table: the fused query_key_value as one slot, its own module names, LayerNorm biases.
TEST(HfModelDescription, GptNeoxTensorNames) {
  const HfModelDescription d = description_of("gpt_neox");
  const std::vector<HfTensorName> names = engine::hf_tensor_names(d);
  ASSERT_EQ(names.size(), engine::tensor_slots(d.arch).size());
  const HfTensorName qkv = named(names, "layers.0.qkv.weight");
  EXPECT_EQ(qkv.stored, "gpt_neox.layers.0.attention.query_key_value.weight");
  EXPECT_EQ(qkv.slot.shape, (std::vector<int64_t>{96, 32}));  // 3 x 2 heads x 16
  EXPECT_EQ(qkv.slot.part, "qkv");
  EXPECT_EQ(named(names, "layers.0.qkv.bias").stored, "gpt_neox.layers.0.attention.query_key_value.bias");
  EXPECT_EQ(named(names, "layers.0.qkv.bias").slot.shape, (std::vector<int64_t>{96}));
  EXPECT_EQ(named(names, "layers.1.o.weight").stored, "gpt_neox.layers.1.attention.dense.weight");
  EXPECT_EQ(named(names, "embed").stored, "gpt_neox.embed_in.weight");
  EXPECT_EQ(named(names, "lm_head").stored, "embed_out.weight");
  EXPECT_EQ(named(names, "final_norm.bias").stored, "gpt_neox.final_layer_norm.bias");
  EXPECT_EQ(named(names, "layers.0.attn_norm.bias").stored, "gpt_neox.layers.0.input_layernorm.bias");
  EXPECT_EQ(named(names, "layers.0.up.weight").stored, "gpt_neox.layers.0.mlp.dense_h_to_4h.weight");
  EXPECT_EQ(named(names, "layers.0.up.weight").slot.shape, (std::vector<int64_t>{96, 32}));
  EXPECT_EQ(named(names, "layers.0.down.bias").stored, "gpt_neox.layers.0.mlp.dense_4h_to_h.bias");
  for (const HfTensorName& n : names) {
    EXPECT_NE(n.slot.part, "q") << n.stored;
    EXPECT_NE(n.slot.part, "gate") << n.stored;
  }
}

// Every family's table names exactly the fixture's tensors, in the stored shapes: each slot is found with its
// shape, and nothing of the checkpoint is left unread.
TEST(HfModelDescription, EachTableNamesEveryTensorOfItsFixture) {
  for (const char* family : kFamilies) {
    SCOPED_TRACE(family);
    const HfModelDescription d = description_of(family);
    const SafetensorsCheckpoint ckpt = SafetensorsCheckpoint::open((kFixtures / family).string());
    std::set<std::string> used;
    for (const HfTensorName& n : engine::hf_tensor_names(d)) {
      EXPECT_NO_THROW(ckpt.get(n.stored, n.slot.shape)) << n.stored;
      EXPECT_TRUE(used.insert(n.stored).second) << n.stored << " named twice";
    }
    EXPECT_NO_THROW(engine::check_hf_tensors_used(d, ckpt.names(), used, family));
  }
}

// An unknown or missing model_type is refused naming the source and the field, listing the families.
TEST(HfModelDescription, AnUnknownModelTypeIsRefusedByName) {
  std::string config = read_text(kFixtures / "llama2" / "config.json");
  const std::string from = "\"model_type\": \"llama\"";
  const size_t at = config.find(from);
  ASSERT_NE(at, std::string::npos);
  std::string bert = config, none = config;
  bert.replace(at, from.size(), "\"model_type\": \"bert\"");
  expect_error([&] { engine::read_hf_model(bert, "bert/config.json"); },
               {"bert/config.json: model_type = bert", "llama, mistral, qwen2, gpt_neox"});
  none.replace(at, from.size(), "\"model_kind\": \"llama\"");
  expect_error([&] { engine::read_hf_model(none, "none/config.json"); },
               {"none/config.json: model_type = missing", "llama, mistral, qwen2, gpt_neox"});
  // In a directory, before a weight is mapped.
  const fs::path dir = fs::path(::testing::TempDir()) / ("rotary_engine_bert_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::copy(kFixtures / "llama2", dir, fs::copy_options::recursive);
  std::ofstream(dir / "config.json", std::ios::trunc) << bert;
  expect_error([&] { engine::open_hf_model(dir.string()); }, {"model_type = bert", "llama, mistral, qwen2, gpt_neox"});
  fs::remove_all(dir);
}

// Appends tensors (F32, 1-d) to a safetensors file: the header gains their entries, the data their bytes.
void add_tensors(const fs::path& file, const std::vector<std::pair<std::string, std::vector<float>>>& tensors) {
  const std::string bytes = read_text(file);
  ASSERT_GE(bytes.size(), 8u);
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = n << 8 | uint8_t(bytes[size_t(i)]);
  const std::string header = bytes.substr(8, n), data = bytes.substr(8 + n);
  ASSERT_EQ(header.front(), '{');
  std::string entries, added;
  size_t offset = data.size();
  for (const auto& [name, values] : tensors) {
    const size_t size = values.size() * 4;
    entries += "\"" + name + "\":{\"dtype\":\"F32\",\"shape\":[" + std::to_string(values.size()) +
               "],\"data_offsets\":[" + std::to_string(offset) + "," + std::to_string(offset + size) + "]},";
    added.append(reinterpret_cast<const char*>(values.data()), size);
    offset += size;
  }
  std::string grown = "{" + entries + header.substr(1);
  while (grown.size() % 8) grown += ' ';
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[size_t(i)] = char(uint64_t(grown.size()) >> (8 * i) & 0xff);
  std::ofstream(file, std::ios::binary | std::ios::trunc) << out << grown << data << added;
}

// A scratch copy of a fixture whose files a test may change.
struct ScratchModel {
  fs::path dir;
  explicit ScratchModel(const std::string& family, const std::string& tag) {
    dir = fs::path(::testing::TempDir()) / ("rotary_engine_" + family + "_" + tag + "_" + std::to_string(::getpid()));
    fs::remove_all(dir);
    fs::copy(kFixtures / family, dir, fs::copy_options::recursive);
  }
  ~ScratchModel() { fs::remove_all(dir); }
};

// A tensor in the directory that no slot reads is refused naming it and the family (the config is probably another
// checkpoint's); the buffers checkpoints carry (rotary_emb.inv_freq, GPT-NeoX's attention masks) and a tied
// model's stored copy of its head are not weights and pass.
TEST(HfModelDescription, ATensorNoSlotReadsIsRefusedByName) {
  {
    ScratchModel extra("gpt_neox", "extra");
    add_tensors(extra.dir / "model.safetensors", {{"gpt_neox.layers.0.attention.extra_proj.weight", {1, 2, 3, 4}}});
    expect_error([&] { engine::open_hf_model(extra.dir.string()); },
                 {extra.dir.string() + ": tensors = gpt_neox.layers.0.attention.extra_proj.weight",
                  "only the tensors of a gpt_neox model"});
  }
  {
    ScratchModel extra("llama3", "extra");
    add_tensors(extra.dir / "model.safetensors", {{"model.layers.2.mlp.up_proj.weight", {1, 2}}});
    expect_error([&] { engine::open_hf_model(extra.dir.string()); },
                 {": tensors = model.layers.2.mlp.up_proj.weight", "only the tensors of a llama model"});
  }
  {
    ScratchModel buffers("gpt_neox", "buffers");
    add_tensors(buffers.dir / "model.safetensors", {{"gpt_neox.layers.0.attention.rotary_emb.inv_freq", {1, 0.5f}},
                                                    {"gpt_neox.layers.1.attention.bias", {1}},
                                                    {"gpt_neox.layers.1.attention.masked_bias", {-1e9f}}});
    const engine::HfModel m = engine::open_hf_model(buffers.dir.string());
    EXPECT_EQ(m.description.model_type, "gpt_neox");
  }
  {
    ScratchModel tied("llama3", "tied");  // tie_word_embeddings: the stored lm_head.weight is not read
    add_tensors(tied.dir / "model.safetensors", {{"lm_head.weight", {0.5f, 0.25f}}});
    const engine::HfModel m = engine::open_hf_model(tied.dir.string());
    EXPECT_TRUE(m.model->arch().tie_embeddings);
  }
}

// open_hf_model: the description read_hf_model gives, the model built on its architecture.
TEST(HfModelDescription, OpenGivesTheDescriptionAndItsModel) {
  for (const char* family : kFamilies) {
    SCOPED_TRACE(family);
    const engine::HfModel m = engine::open_hf_model((kFixtures / family).string());
    const HfModelDescription d = description_of(family);
    EXPECT_EQ(m.description.model_type, d.model_type);
    EXPECT_EQ(m.description.rope.describe(), d.rope.describe());
    EXPECT_EQ(m.description.trained_context, d.trained_context);
    const Architecture& a = m.model->arch();
    EXPECT_EQ(a.vocab_size, d.arch.vocab_size);
    EXPECT_EQ(a.d_model, d.arch.d_model);
    EXPECT_EQ(a.n_layers, d.arch.n_layers);
    EXPECT_EQ(a.n_heads, d.arch.n_heads);
    EXPECT_EQ(a.n_kv_heads, d.arch.n_kv_heads);
    EXPECT_EQ(a.head_dim, d.arch.head_dim);
    EXPECT_EQ(a.d_ff, d.arch.d_ff);
    EXPECT_EQ(a.fused_qkv, d.arch.fused_qkv);
    EXPECT_EQ(a.tie_embeddings, d.arch.tie_embeddings);
    // As stored: llama2 in f32, mistral and gpt_neox in f16, llama3 and qwen2 in bf16.
    const std::string f(family);
    EXPECT_EQ(m.model->matrix_format(), f == "llama2"                       ? WeightFormat::F32
                                        : f == "mistral" || f == "gpt_neox" ? WeightFormat::F16
                                                                            : WeightFormat::BF16);
    EXPECT_EQ(engine::open_hf_model((kFixtures / family).string()).model->weights_hash(), m.model->weights_hash());
  }
}

}  // namespace
}  // namespace rotary::test
