// Hugging Face checkpoints: every fixture family (tests/data/hf_checkpoints, made by
// tests/hf/make_checkpoint_fixtures.py) loads and gives the logits of the independent transcription of
// transformers' modeling code - in float64 to the rounding of the stored float32 logits, in float32 to float32
// rounding; through the full forward, the KV-cache decoder, and a ReRoPE override. Then every way a checkpoint
// directory can be wrong gives an error that names the tensor or field.
#include <gtest/gtest.h>

#include <sys/stat.h>

#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <functional>
#include <fstream>
#include <nlohmann/json.hpp>

#include "expect_error.h"
#include "rotary/safetensors.h"
#include "rotary_nn/hf_checkpoint.h"
#include "rotary_nn/hf_engine.h"

namespace rotary::nn {
namespace {

namespace fs = std::filesystem;
using test::expect_error;
using test::expect_error_naming;

const fs::path kFixtures = fs::path(ROTARY_SOURCE_DIR) / "tests/data/hf_checkpoints";
const char* kFamilies[] = {"llama2", "llama3", "mistral", "qwen2", "gpt_neox"};

struct Expected {
  std::vector<int64_t> tokens;
  std::map<std::string, torch::Tensor> logits;  // "logits", "logits_rerope_w8": float64 [S, V]
};

Expected read_expected(const fs::path& dir) {
  const SafetensorsFile f = SafetensorsFile::open((dir / "expected.safetensors").string());
  Expected e;
  for (const SafetensorsTensor& t : f.tensors()) {
    torch::Tensor v = torch::empty(t.shape, torch::kFloat);
    std::memcpy(v.data_ptr(), t.data, t.bytes);
    if (t.name == "tokens") {
      for (float x : std::vector<float>(v.data_ptr<float>(), v.data_ptr<float>() + v.numel())) e.tokens.push_back(int64_t(x));
    } else {
      e.logits[t.name] = v.to(torch::kDouble);
    }
  }
  return e;
}

// max |a - b| / max |b|: the logits' scale differs by family (tied heads give logits ~30, untied ~3).
double relative_error(const torch::Tensor& a, const torch::Tensor& b) {
  return (a.to(torch::kDouble) - b).abs().max().item<double>() / b.abs().max().item<double>();
}

torch::Tensor forward(Transformer& m, const std::vector<int64_t>& tokens, torch::ScalarType dtype) {
  torch::NoGradGuard no_grad;
  m->to(dtype);
  return m->forward(torch::tensor(tokens).view({1, -1}))[0];
}

// Tolerances. The reference is float64 rounded to float32 when stored (2^-24 relative to each logit, <= 6e-8 of
// the largest), with the rotary frequencies transformers computes in float32 (hf_rope_reference.py): their
// rounding, 2^-24 relative, turns position p's angle by p * 6e-8 of itself - at p = 40 and theta 5e5 the logits
// move by up to ~3e-7 of the largest (llama3, measured). The float64 model adds nothing visible, so 2e-6; a wrong
// architecture detail (a bias, a norm, an activation, a rope pair) moves the logits by 1e-2 or more.
// The float32 model also rounds each of its ~10 matrix products and norms at 2^-24 relative, on sums of 32 to 96
// terms whose partial sums are at most a few times the result: measured <= 7e-7 of the largest logit; 5e-6.
constexpr double kTolF64 = 2e-6, kTolF32 = 5e-6;

class HfFixture : public ::testing::TestWithParam<const char*> {};

TEST_P(HfFixture, LogitsMatchTheTranscriptionOfTransformers) {
  const fs::path dir = kFixtures / GetParam();
  HfCheckpoint c = load_hf_checkpoint(dir.string());
  EXPECT_EQ(c.spec.model_type, std::string(GetParam()).starts_with("llama") ? "llama" : GetParam());
  const Expected e = read_expected(dir);
  const torch::Tensor& want = e.logits.at("logits");
  ASSERT_EQ(want.size(0), int64_t(e.tokens.size()));
  EXPECT_LT(relative_error(forward(c.model, e.tokens, torch::kDouble), want), kTolF64);
  EXPECT_LT(relative_error(forward(c.model, e.tokens, torch::kFloat), want), kTolF32);
}

TEST_P(HfFixture, PlainAttentionAndTheDecoderGiveTheSameLogits) {
  const fs::path dir = kFixtures / GetParam();
  HfCheckpoint c = load_hf_checkpoint(dir.string());
  const Expected e = read_expected(dir);
  const torch::Tensor& want = e.logits.at("logits");
  c.model->to(torch::kDouble);
  // The KV-cache decoder: prefill 5 tokens, then one at a time.
  EXPECT_LT(relative_error(c.model->decode_logits(e.tokens, 5), want), kTolF64);
  // The plain torch attention (the baseline path) on the same weights.
  ModelConfig plain = c.spec.config;
  plain.fused = false;
  Transformer p(plain);
  {
    torch::NoGradGuard no_grad;
    p->to(torch::kDouble);
    auto dst = p->named_parameters();
    for (const auto& src : c.model->named_parameters()) dst[src.key()].copy_(src.value());
  }
  EXPECT_LT(relative_error(forward(p, e.tokens, torch::kDouble), want), kTolF64);
}

INSTANTIATE_TEST_SUITE_P(Families, HfFixture, ::testing::ValuesIn(kFamilies),
                         [](const auto& info) { return std::string(info.param); });

// The fixtures with a ReRoPE reference: a full-rotation family and the partial-rotation one.
class HfRerope : public ::testing::TestWithParam<const char*> {};

TEST_P(HfRerope, OverrideMatchesTheTranscription) {
  const fs::path dir = kFixtures / GetParam();
  const Expected e = read_expected(dir);
  auto it = e.logits.find("logits_rerope_w8");
  ASSERT_NE(it, e.logits.end()) << GetParam() << " has no ReRoPE reference";
  HfCheckpoint c = load_hf_checkpoint(dir.string());
  EncodingOverride o;
  o.kind = EncodingKind::Rerope;
  o.window = 8;
  c.model->set_override(o);
  const torch::Tensor got = forward(c.model, e.tokens, torch::kDouble);
  EXPECT_LT(relative_error(got, it->second), kTolF64);
  // ...and the override changes the logits (the sequence is longer than the window), so the check has power.
  EXPECT_GT(relative_error(got, e.logits.at("logits")), 1e-3);
  EXPECT_LT(relative_error(c.model->decode_logits(e.tokens, 3), it->second), kTolF64);
}

INSTANTIATE_TEST_SUITE_P(Families, HfRerope, ::testing::Values("llama2", "gpt_neox"),
                         [](const auto& info) { return std::string(info.param); });

TEST(HfModelSpec, ReadsEachFamilysArchitecture) {
  const HfModelSpec llama = hf_model_spec_file((kFixtures / "llama3").string());
  EXPECT_EQ(llama.config.normalization, NormKind::RmsNorm);
  EXPECT_EQ(llama.config.mlp, MlpKind::SwiGlu);
  EXPECT_FALSE(llama.config.qkv_bias);
  EXPECT_TRUE(llama.config.tie_embeddings);
  EXPECT_EQ(llama.config.kv_heads(), 1);
  EXPECT_EQ(llama.config.encoding.rope.scaling, RopeScaling::Llama3);
  EXPECT_EQ(llama.trained_context, 16);  // original_max_position_embeddings of the scaled rope
  const HfModelSpec qwen = hf_model_spec_file((kFixtures / "qwen2").string());
  EXPECT_TRUE(qwen.config.qkv_bias);
  EXPECT_FALSE(qwen.config.out_bias);
  EXPECT_EQ(qwen.config.sliding_window, 0);  // use_sliding_window false
  const HfModelSpec mistral = hf_model_spec_file((kFixtures / "mistral").string());
  EXPECT_EQ(mistral.config.head_dim(), 32);
  EXPECT_EQ(mistral.trained_context, 64);
  EXPECT_EQ(mistral.config.sliding_window, 0);  // "sliding_window": null, as Mistral v0.2 / v0.3 write it
  const HfModelSpec neox = hf_model_spec_file((kFixtures / "gpt_neox").string());
  EXPECT_TRUE(neox.config.parallel_residual);
  EXPECT_EQ(neox.config.resolved_encoding().rope.rotary_dim, 4);
  EXPECT_EQ(neox.config.normalization, NormKind::LayerNorm);
}

// ---- Bad checkpoints ---------------------------------------------------------------------------------------------

// A scratch copy of a fixture whose files a test may change.
struct ScratchModel {
  fs::path dir;
  explicit ScratchModel(const std::string& family) {
    dir = fs::temp_directory_path() / ("rotary_hf_" + family + "_" + std::to_string(::getpid()) + "_" +
                                       ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir);
    fs::copy(kFixtures / family, dir, fs::copy_options::recursive);
  }
  ~ScratchModel() { fs::remove_all(dir); }
  nlohmann::json config() const {
    std::ifstream in(dir / "config.json");
    return nlohmann::json::parse(in);
  }
  void set_config(const nlohmann::json& j) const { std::ofstream(dir / "config.json") << j.dump(2); }
  void edit(const std::string& key, const nlohmann::json& value) const {
    nlohmann::json j = config();
    j[key] = value;
    set_config(j);
  }
  std::string load() const { return load_hf_checkpoint(dir.string()).spec.model_type; }
};

// Config keys read with the family's own meaning (transformers' config classes).
TEST(HfModelSpec, FamilySemanticsOfOptionalKeys) {
  // sliding_window: null is no window (MistralConfig's None); absent is the class default, 4096.
  const auto spec_of = [](const std::string& family, const std::function<void(nlohmann::json&)>& edit) {
    std::ifstream in(kFixtures / family / "config.json");
    nlohmann::json j = nlohmann::json::parse(in);
    edit(j);
    return hf_model_spec(j.dump(), family + "/config.json");
  };
  EXPECT_EQ(spec_of("mistral", [](auto& j) { j["sliding_window"] = nullptr; }).config.sliding_window, 0);
  EXPECT_EQ(spec_of("mistral", [](auto& j) { j.erase("sliding_window"); }).config.sliding_window, 4096);
  EXPECT_EQ(spec_of("mistral", [](auto& j) { j["sliding_window"] = 32; }).config.sliding_window, 32);
  // Qwen2: the window only with use_sliding_window, and null there is no window too.
  EXPECT_EQ(spec_of("qwen2", [](auto& j) { j["use_sliding_window"] = true, j["sliding_window"] = nullptr; })
                .config.sliding_window, 0);
  EXPECT_EQ(spec_of("qwen2", [](auto& j) { j["use_sliding_window"] = true, j["sliding_window"] = 16; })
                .config.sliding_window, 16);
  expect_error([&] { spec_of("mistral", [](auto& j) { j["sliding_window"] = "wide"; }); }, "sliding_window = \"wide\"");
  // GPT-NeoX has no num_key_value_heads (GPTNeoXConfig ignores the key): one kv head per head, and it loads.
  const HfModelSpec neox = spec_of("gpt_neox", [](auto& j) { j["num_key_value_heads"] = 1; });
  EXPECT_EQ(neox.config.kv_heads(), neox.config.n_heads);
}

// config.json is read with the core's one rule for integers (json_guard.h), as the RoPE fields are: 32.0 (as
// Python writes float(32)) is 32; 32.5, a string, a value past 2^63 or out of range is refused naming the key.
TEST(HfModelSpec, IntegersFollowTheOneRuleOfEveryJsonReader) {
  const auto spec_of = [](const std::function<void(nlohmann::json&)>& edit) {
    std::ifstream in(kFixtures / "llama2" / "config.json");
    nlohmann::json j = nlohmann::json::parse(in);
    edit(j);
    return hf_model_spec(j.dump(), "llama2/config.json");
  };
  const HfModelSpec plain = spec_of([](auto&) {});
  const HfModelSpec written_as_floats = spec_of([](auto& j) {
    for (const char* key : {"hidden_size", "num_hidden_layers", "intermediate_size", "vocab_size"})
      j[key] = j[key].template get<double>();
  });
  EXPECT_EQ(written_as_floats.config.d_model, plain.config.d_model);
  EXPECT_EQ(written_as_floats.config.n_layers, plain.config.n_layers);
  EXPECT_EQ(written_as_floats.config.d_ff, plain.config.d_ff);
  EXPECT_EQ(written_as_floats.config.vocab_size, plain.config.vocab_size);
  expect_error([&] { spec_of([](auto& j) { j["hidden_size"] = 32.5; }); },
               {"llama2/config.json: hidden_size = 32.5", "an integer in [1, 65536]"});
  expect_error([&] { spec_of([](auto& j) { j["num_hidden_layers"] = "2"; }); },
               {"llama2/config.json: num_hidden_layers = \"2\"", "an integer in [1, 1024]"});
  expect_error([&] { spec_of([](auto& j) { j["vocab_size"] = uint64_t(1) << 63; }); },
               {"vocab_size = 9223372036854775808", "an integer in [1, 2147483647]"});
  expect_error([&] { spec_of([](auto& j) { j.erase("intermediate_size"); }); },
               {"llama2/config.json: intermediate_size = (missing)", "an integer in [1, 1048576]"});
  expect_error([&] { spec_of([](auto& j) { j["rms_norm_eps"] = 0; }); },
               {"llama2/config.json: rms_norm_eps = 0", "a number in (0, 1)"});
  // 1 normalises by sqrt(mean + 1): refused by the reader, which states the engine's range.
  expect_error([&] { spec_of([](auto& j) { j["rms_norm_eps"] = 1; }); },
               {"llama2/config.json: rms_norm_eps = 1", "a number in (0, 1)"});
}

TEST(HfCheckpointErrors, GptNeoxWithAKeyItsFamilyLacksLoads) {
  ScratchModel neox("gpt_neox");
  neox.edit("num_key_value_heads", 1);
  EXPECT_EQ(neox.load(), "gpt_neox");
}

TEST(HfCheckpointErrors, MissingAndMisshapedTensorsAreNamed) {
  ScratchModel more_layers("llama2");
  more_layers.edit("num_hidden_layers", 3);
  expect_error([&] { more_layers.load(); }, {"model.layers.2.input_layernorm.weight", "is missing"});
  ScratchModel wider("llama2");
  wider.edit("intermediate_size", 65);
  expect_error([&] { wider.load(); }, {"model.layers.0.mlp.gate_proj.weight shape = [64, 32]", "[65, 32]"});
  ScratchModel fewer_layers("qwen2");
  fewer_layers.edit("num_hidden_layers", 1);
  expect_error([&] { fewer_layers.load(); }, {"tensors = model.layers.1.", "qwen2"});
}

// The tensors are checked against config.json before the model is built from it: a vocab_size the embedding
// does not have is refused at once, not after allocating 2^31 x 32 floats (275 GB: std::bad_alloc, or minutes).
TEST(HfCheckpointErrors, TensorShapesAreCheckedBeforeTheModelIsAllocated) {
  ScratchModel huge("llama2");
  huge.edit("vocab_size", 2147483647);
  expect_error([&] { huge.load(); }, {"model.embed_tokens.weight shape = [64, 32]", "[2147483647, 32]"});
  ScratchModel wide("gpt_neox");
  wide.edit("vocab_size", 20000000);
  const auto t0 = std::chrono::steady_clock::now();
  expect_error([&] { wide.load(); }, {"gpt_neox.embed_in.weight", "[20000000, 32]"});
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 2.0);
}

// Overwrites the first element of tensor `name` (F32 or BF16) in a safetensors file with `value`.
void poison_tensor(const fs::path& file, const std::string& name, float value) {
  std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
  uint64_t header_bytes = 0;
  f.read(reinterpret_cast<char*>(&header_bytes), 8);
  std::string header(header_bytes, '\0');
  f.read(header.data(), std::streamsize(header_bytes));
  const nlohmann::json j = nlohmann::json::parse(header);
  const std::string dtype = j.at(name).at("dtype");
  ASSERT_TRUE(dtype == "F32" || dtype == "BF16") << dtype;
  uint32_t bits = 0;
  std::memcpy(&bits, &value, sizeof bits);
  f.seekp(std::streamoff(8 + header_bytes + j.at(name).at("data_offsets")[0].get<uint64_t>()));
  if (dtype == "F32") {
    f.write(reinterpret_cast<const char*>(&bits), 4);
  } else {
    const uint16_t high = uint16_t(bits >> 16);  // bfloat16: the float's upper half (NaN and Inf stay so)
    f.write(reinterpret_cast<const char*>(&high), 2);
  }
}

// A NaN or Inf weight is refused at load, naming the tensor (it would turn every loss into nan).
TEST(HfCheckpointErrors, NonFiniteWeightsAreNamed) {
  ScratchModel nan_norm("llama3");
  poison_tensor(nan_norm.dir / "model.safetensors", "model.norm.weight", std::nanf(""));
  expect_error([&] { nan_norm.load(); }, {"tensor model.norm.weight = non-finite (element 0 is nan)", "finite weights"});
  ScratchModel inf_sharded("llama2");
  poison_tensor(inf_sharded.dir / "model-00001-of-00002.safetensors", "model.embed_tokens.weight", -INFINITY);
  expect_error([&] { inf_sharded.load(); }, {"tensor model.embed_tokens.weight", "-inf"});
  // The engine, which reads the weights in place, refuses them the same way.
  expect_error([&] { load_hf_engine(nan_norm.dir.string()); },
               {"tensor model.norm.weight = non-finite (element 0 is nan)", "finite weights"});
  expect_error([&] { load_hf_engine(inf_sharded.dir.string()); }, {"tensor model.embed_tokens.weight", "-inf"});
}

// What the loader opens is checked to be a regular file before open(): a FIFO would block it forever (no writer),
// a directory named config.json is said to be one (not "malformed JSON").
TEST(HfCheckpointErrors, FifosAndDirectoriesInPlaceOfFilesAreRefusedWithoutBlocking) {
  ScratchModel fifo_config("mistral");
  fs::remove(fifo_config.dir / "config.json");
  ASSERT_EQ(::mkfifo((fifo_config.dir / "config.json").c_str(), 0600), 0);
  expect_error([&] { fifo_config.load(); }, {"config.json (a FIFO)", "a readable config.json"});
  ScratchModel fifo_weights("mistral");
  fs::remove(fifo_weights.dir / "model.safetensors");
  ASSERT_EQ(::mkfifo((fifo_weights.dir / "model.safetensors").c_str(), 0600), 0);
  expect_error([&] { fifo_weights.load(); }, {"model.safetensors (a FIFO)"});
  ScratchModel fifo_index("llama2");
  fs::remove(fifo_index.dir / "model.safetensors.index.json");
  ASSERT_EQ(::mkfifo((fifo_index.dir / "model.safetensors.index.json").c_str(), 0600), 0);
  expect_error([&] { fifo_index.load(); }, {"model.safetensors.index.json (a FIFO)"});
  ScratchModel dir_config("mistral");
  fs::remove(dir_config.dir / "config.json");
  fs::create_directory(dir_config.dir / "config.json");
  try {
    dir_config.load();
    ADD_FAILURE() << "a directory named config.json was read";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("config.json (a directory)"), std::string::npos) << e.what();
    EXPECT_EQ(std::string(e.what()).find("malformed JSON"), std::string::npos) << e.what();
  }
}

TEST(HfCheckpointErrors, ConfigFieldsAreChecked) {
  ScratchModel bert("llama2");
  bert.edit("model_type", "bert");
  expect_error([&] { bert.load(); }, {"model_type = bert", "llama, mistral, qwen2, gpt_neox"});
  ScratchModel act("mistral");
  act.edit("hidden_act", "gelu");
  expect_error_naming([&] { act.load(); }, "hidden_act");
  ScratchModel heads("llama2");
  heads.edit("num_attention_heads", "two");
  expect_error([&] { heads.load(); }, {"num_attention_heads = \"two\"", "an integer"});
  ScratchModel gqa("llama3");
  gqa.edit("num_key_value_heads", 3);
  expect_error_naming([&] { gqa.load(); }, "n_kv_heads");
  ScratchModel rope("qwen2");
  rope.edit("rope_scaling", nlohmann::json{{"type", "yarn"}, {"factor", -4.0}});
  expect_error([&] { rope.load(); }, "factor");
}

TEST(HfCheckpointErrors, BrokenFilesAreRefusedBeforeAnyRead) {
  ScratchModel truncated("mistral");
  fs::resize_file(truncated.dir / "model.safetensors", fs::file_size(truncated.dir / "model.safetensors") - 100);
  expect_error([&] { truncated.load(); }, "model.safetensors");
  ScratchModel none("llama3");
  fs::rename(none.dir / "model.safetensors", none.dir / "pytorch_model.bin");
  expect_error([&] { none.load(); }, {"without model.safetensors", "pytorch_model.bin"});
  ScratchModel no_config("llama3");
  fs::remove(no_config.dir / "config.json");
  expect_error([&] { no_config.load(); }, "config.json");
}

TEST(HfCheckpointErrors, ShardIndexIsChecked) {
  const auto edit_index = [](const ScratchModel& m, const std::function<void(nlohmann::json&)>& f) {
    std::ifstream in(m.dir / "model.safetensors.index.json");
    nlohmann::json j = nlohmann::json::parse(in);
    f(j);
    std::ofstream(m.dir / "model.safetensors.index.json") << j.dump();
  };
  ScratchModel escape("llama2");
  edit_index(escape, [](auto& j) { j["weight_map"]["model.norm.weight"] = "../model-00001-of-00002.safetensors"; });
  expect_error([&] { escape.load(); }, {"weight_map[\"model.norm.weight\"]", "no '/'"});
  ScratchModel missing_shard("llama2");
  fs::remove(missing_shard.dir / "model-00002-of-00002.safetensors");
  expect_error([&] { missing_shard.load(); }, "model-00002-of-00002.safetensors");
  ScratchModel wrong_shard("llama2");
  edit_index(wrong_shard, [](auto& j) {
    for (auto& [name, file] : j["weight_map"].items())
      if (name == "model.norm.weight") file = file == "model-00001-of-00002.safetensors"
                                                   ? "model-00002-of-00002.safetensors"
                                                   : "model-00001-of-00002.safetensors";
  });
  expect_error([&] { wrong_shard.load(); }, {"model.norm.weight", "which does not hold it"});
  ScratchModel empty_map("llama2");
  edit_index(empty_map, [](auto& j) { j["weight_map"] = nlohmann::json::object(); });
  expect_error_naming([&] { empty_map.load(); }, "weight_map");
}

TEST(HfCheckpointErrors, SequencesBeyondASlidingWindowAreRefused) {
  ScratchModel windowed("mistral");
  windowed.edit("sliding_window", 16);
  HfCheckpoint c = load_hf_checkpoint(windowed.dir.string());
  EXPECT_EQ(c.spec.config.sliding_window, 16);
  std::vector<int64_t> tokens(16, 3);
  EXPECT_NO_THROW(forward(c.model, tokens, torch::kFloat));  // within the window the model is exact
  tokens.push_back(4);
  expect_error([&] { forward(c.model, tokens, torch::kFloat); }, {"positions (span) = 17", "sliding_window = 16"});
  expect_error([&] { c.model->generate({1, 2, 3}, 20, 0.0, -1, 0); }, "sliding_window = 16");
}

}  // namespace
}  // namespace rotary::nn
