// rope_spec_from_hf_config: each real config in tests/data/hf_configs lands in the expected RopeSpec fields,
// the old / new spellings transformers accepts are read, and malformed, incomplete or contradictory configs
// throw rotary::Error naming the JSON field. (That the frequencies then agree with Hugging Face's own code is
// tested by tests/cli/test_freqs.sh against tests/hf/hf_rope_reference.py.)
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <string>
#include <unistd.h>

#include "expect.h"
#include "rotary/error.h"
#include "rotary/hf_config.h"
#include "rotary/rope_spec.h"

namespace rotary {
namespace {

namespace fs = std::filesystem;

RopeSpec load(const std::string& name) {
  return rope_spec_from_hf_config_file(std::string(ROTARY_SOURCE_DIR) + "/tests/data/hf_configs/" + name);
}

// The message names the field and what is allowed.
void expect_bad(const std::string& json, const std::string& field) {
  test::expect_error([&] { rope_spec_from_hf_config(json); }, {field, "allowed"});
}

TEST(hf_config, EveryRealConfigParsesAndYieldsValidFreqs) {
  int n = 0;
  for (const auto& e : fs::directory_iterator(std::string(ROTARY_SOURCE_DIR) + "/tests/data/hf_configs")) {
    if (e.path().extension() != ".json") continue;
    SCOPED_TRACE(e.path().string());
    const RopeSpec s = rope_spec_from_hf_config_file(e.path().string());
    EXPECT_EQ(s.layout, RopeLayout::HalfSplit);
    for (int64_t len : {int64_t(0), int64_t(1), int64_t(1) << 20}) EXPECT_NO_THROW(s.freqs(len).validate());
    ++n;
  }
  EXPECT_GE(n, 13);
}

TEST(hf_config, Llama2DefaultsTheBase) {
  const RopeSpec s = load("llama-2-7b-hf.json");
  EXPECT_EQ(s.head_dim, 128);
  EXPECT_EQ(s.rotary_dim, 128);
  EXPECT_EQ(s.base, 10000.0);  // the config has no rope_theta
  EXPECT_EQ(s.scaling, RopeScaling::None);
  EXPECT_EQ(s.max_position_embeddings, 4096);
}

TEST(hf_config, Llama31IsLlama3) {
  const RopeSpec s = load("llama-3.1-8b.json");
  EXPECT_EQ(s.scaling, RopeScaling::Llama3);
  EXPECT_EQ(s.base, 500000.0);
  EXPECT_EQ(s.factor, 8.0);
  EXPECT_EQ(s.llama3.low_freq_factor, 1.0);
  EXPECT_EQ(s.llama3.high_freq_factor, 4.0);
  EXPECT_EQ(s.original_max_position_embeddings, 8192);
  EXPECT_EQ(s.max_position_embeddings, 131072);
  EXPECT_EQ(s.head_dim, 128);
}

TEST(hf_config, Qwen25YarnKeepsItsExplicitFactor) {
  const RopeSpec s = load("qwen2.5-7b-instruct-yarn.json");
  EXPECT_EQ(s.scaling, RopeScaling::Yarn);
  EXPECT_EQ(s.head_dim, 128);  // 3584 / 28
  EXPECT_EQ(s.base, 1000000.0);
  // max_position_embeddings / original = 1 here; the explicit factor 4 wins (transformers >= 4.56).
  EXPECT_EQ(s.factor, 4.0);
  EXPECT_EQ(s.original_max_position_embeddings, 32768);
  EXPECT_EQ(s.yarn.beta_fast, 32.0);
  EXPECT_EQ(s.yarn.beta_slow, 1.0);
  EXPECT_FALSE(s.yarn.mscale);
  EXPECT_TRUE(s.yarn.truncate);
  EXPECT_FALSE(s.attention_factor);
}

TEST(hf_config, Phi3LongRopeDerivesTheFactorFromTheContexts) {
  const RopeSpec s = load("phi-3-mini-128k-instruct.json");
  EXPECT_EQ(s.scaling, RopeScaling::LongRope);
  EXPECT_EQ(s.head_dim, 96);
  EXPECT_EQ(s.rotary_dim, 96);
  EXPECT_EQ(s.original_max_position_embeddings, 4096);  // top-level key
  EXPECT_EQ(s.max_position_embeddings, 131072);
  EXPECT_EQ(s.factor, 32.0);
  ASSERT_EQ(s.short_factor.size(), 48u);
  ASSERT_EQ(s.long_factor.size(), 48u);
  EXPECT_EQ(s.short_factor[0], 1.1);
  EXPECT_EQ(s.long_factor[47], 64.76000213623047);
  EXPECT_NEAR(s.freqs().attention_factor, std::sqrt(1 + std::log(32.0) / std::log(4096.0)), 1e-15);
}

TEST(hf_config, LinearDynamicAndGptNeoX) {
  RopeSpec s = load("vicuna-7b-v1.5-16k.json");
  EXPECT_EQ(s.scaling, RopeScaling::Linear);
  EXPECT_EQ(s.factor, 4.0);
  EXPECT_EQ(s.max_position_embeddings, 4096);

  s = load("internlm2_5-7b-chat-dynamic.json");
  EXPECT_EQ(s.scaling, RopeScaling::Dynamic);
  EXPECT_EQ(s.factor, 2.0);
  EXPECT_EQ(s.base, 1000000.0);
  EXPECT_EQ(s.max_position_embeddings, 32768);

  s = load("pythia-70m.json");  // rotary_pct 0.25 of 512 / 8 = 64
  EXPECT_EQ(s.head_dim, 64);
  EXPECT_EQ(s.rotary_dim, 16);
  EXPECT_EQ(s.base, 10000.0);
  s = load("gpt-neox-20b.json");  // 0.25 of 6144 / 64 = 96
  EXPECT_EQ(s.head_dim, 96);
  EXPECT_EQ(s.rotary_dim, 24);
}

TEST(hf_config, ExplicitHeadDimWins) {
  RopeSpec s = load("gemma-7b.json");
  EXPECT_EQ(s.head_dim, 256);  // not 3072 / 16 = 192
  EXPECT_EQ(s.rotary_dim, 256);
  s = load("mistral-nemo-base-2407.json");
  EXPECT_EQ(s.head_dim, 128);  // not 5120 / 32 = 160
  EXPECT_EQ(s.base, 1000000.0);
  s = load("gpt-oss-20b.json");
  EXPECT_EQ(s.head_dim, 64);  // not 2880 / 64 = 45
  EXPECT_EQ(s.scaling, RopeScaling::Yarn);
  EXPECT_FALSE(s.yarn.truncate);
  EXPECT_EQ(s.base, 150000.0);
  EXPECT_EQ(s.factor, 32.0);
}

TEST(hf_config, DeepSeekYarnRotatesQkRopeHeadDimWithMscales) {
  RopeSpec s = load("deepseek-v3.json");
  EXPECT_EQ(s.head_dim, 64);
  EXPECT_EQ(s.scaling, RopeScaling::Yarn);
  EXPECT_EQ(s.factor, 40.0);
  EXPECT_EQ(s.original_max_position_embeddings, 4096);
  ASSERT_TRUE(s.yarn.mscale && s.yarn.mscale_all_dim);
  EXPECT_EQ(*s.yarn.mscale, 1.0);
  EXPECT_EQ(*s.yarn.mscale_all_dim, 1.0);
  s = load("deepseek-v2-lite.json");
  ASSERT_TRUE(s.yarn.mscale);
  EXPECT_EQ(*s.yarn.mscale, 0.707);
  EXPECT_NEAR(s.freqs().attention_factor, 1.0, 1e-15);  // equal mscales cancel
}

TEST(hf_config, OldAndNewSpellings) {
  // transformers 5: rope_parameters holding rope_theta and partial_rotary_factor.
  RopeSpec s = rope_spec_from_hf_config(R"({"hidden_size": 2048, "num_attention_heads": 16,
      "max_position_embeddings": 4096, "rope_parameters": {"rope_type": "yarn", "rope_theta": 1000000.0,
      "factor": 4.0, "original_max_position_embeddings": 1024, "partial_rotary_factor": 0.5}})");
  EXPECT_EQ(s.scaling, RopeScaling::Yarn);
  EXPECT_EQ(s.base, 1000000.0);
  EXPECT_EQ(s.rotary_dim, 64);
  EXPECT_EQ(s.original_max_position_embeddings, 1024);
  // A null head_dim means "derive it"; "type" is the old key; "default" is no scaling.
  s = rope_spec_from_hf_config(R"({"hidden_size": 4096, "num_attention_heads": 32, "head_dim": null,
      "rope_scaling": {"type": "default"}})");
  EXPECT_EQ(s.head_dim, 128);
  EXPECT_EQ(s.scaling, RopeScaling::None);
  s = rope_spec_from_hf_config(R"({"head_dim": 64, "rope_scaling": {"type": "linear", "factor": 2}})");
  EXPECT_EQ(s.scaling, RopeScaling::Linear);
  // "su" is longrope; Phi-3's first configs also called it "yarn".
  const std::string lists = R"("short_factor": [1, 1, 1, 1], "long_factor": [2, 2, 2, 2])";
  s = rope_spec_from_hf_config(R"({"head_dim": 8, "max_position_embeddings": 8192,
      "original_max_position_embeddings": 2048, "rope_scaling": {"type": "su", )" + lists + "}}");
  EXPECT_EQ(s.scaling, RopeScaling::LongRope);
  EXPECT_EQ(s.factor, 4.0);
  s = rope_spec_from_hf_config(R"({"model_type": "phi3", "head_dim": 8, "max_position_embeddings": 8192,
      "original_max_position_embeddings": 2048, "rope_scaling": {"type": "yarn", )" + lists + "}}");
  EXPECT_EQ(s.scaling, RopeScaling::LongRope);
  // Multimodal: the language model's fields under text_config.
  s = rope_spec_from_hf_config(R"({"model_type": "llava", "text_config": {"hidden_size": 4096,
      "num_attention_heads": 32, "rope_theta": 500000.0}, "vision_config": {"hidden_size": 1024}})");
  EXPECT_EQ(s.head_dim, 128);
  EXPECT_EQ(s.base, 500000.0);
}

TEST(hf_config, DefaultsFilledAsTransformers5Does) {
  // yarn without factor: max_position_embeddings / original; null or 0 betas and mscales: defaults.
  RopeSpec s = rope_spec_from_hf_config(R"({"head_dim": 64, "max_position_embeddings": 16384,
      "rope_scaling": {"rope_type": "yarn", "original_max_position_embeddings": 4096, "beta_fast": null,
      "beta_slow": 0, "mscale": 0, "mscale_all_dim": 1.0}})");
  EXPECT_EQ(s.factor, 4.0);
  EXPECT_EQ(s.yarn.beta_fast, 32.0);
  EXPECT_EQ(s.yarn.beta_slow, 1.0);
  EXPECT_FALSE(s.yarn.mscale);
  EXPECT_TRUE(s.yarn.mscale_all_dim);
  // llama3 without original_max_position_embeddings: max_position_embeddings stands in.
  s = rope_spec_from_hf_config(R"({"head_dim": 64, "max_position_embeddings": 8192, "rope_scaling":
      {"rope_type": "llama3", "factor": 8, "low_freq_factor": 1, "high_freq_factor": 4}})");
  EXPECT_EQ(s.original_max_position_embeddings, 8192);
  // longrope without any original: factor = 1, attention factor 1.
  s = rope_spec_from_hf_config(R"({"head_dim": 8, "max_position_embeddings": 4096, "rope_scaling":
      {"rope_type": "longrope", "short_factor": [1, 1, 1, 1], "long_factor": [2, 2, 2, 2]}})");
  EXPECT_EQ(s.factor, 1.0);
  EXPECT_EQ(s.freqs().attention_factor, 1.0);
  // Equal values given twice are fine.
  s = rope_spec_from_hf_config(R"({"head_dim": 64, "rope_theta": 5e5, "rope_parameters":
      {"rope_type": "default", "rope_theta": 500000}})");
  EXPECT_EQ(s.base, 500000.0);
}

TEST(hf_config, MalformedConfigsNameTheField) {
  expect_bad("{\"head_dim\": 64,", "config.json");
  expect_bad("[1, 2]", "config.json");
  expect_bad("{}", "head_dim");
  expect_bad(R"({"hidden_size": 4096})", "head_dim");
  expect_bad(R"({"hidden_size": 4096, "num_attention_heads": 33})", "hidden_size");
  expect_bad(R"({"hidden_size": 4096, "num_attention_heads": 0})", "num_attention_heads");
  expect_bad(R"({"head_dim": "128"})", "head_dim");
  expect_bad(R"({"head_dim": 63.5})", "head_dim");
  expect_bad(R"({"head_dim": 1})", "head_dim");
  expect_bad(R"({"head_dim": 64, "rope_theta": "1e4"})", "rope_theta");
  expect_bad(R"({"head_dim": 64, "rope_theta": -10000})", "rope_theta");
  expect_bad(R"({"head_dim": 64, "rotary_emb_base": 0})", "rotary_emb_base");
  expect_bad(R"({"head_dim": 64, "partial_rotary_factor": 1.5})", "partial_rotary_factor");
  expect_bad(R"({"head_dim": 64, "partial_rotary_factor": 0.3})", "partial_rotary_factor");  // int(19.2) odd
  expect_bad(R"({"head_dim": 64, "max_position_embeddings": -1})", "max_position_embeddings");
  expect_bad(R"({"head_dim": 64, "rope_scaling": 4.0})", "rope_scaling");
  expect_bad(R"({"head_dim": 64, "rope_scaling": {"rope_type": "ntk-by-parts"}})", "rope_scaling.rope_type");
  expect_bad(R"({"head_dim": 64, "rope_scaling": {"rope_type": "ntk-by-parts"}})", "llama3");  // the choices
  expect_bad(R"({"head_dim": 64, "rope_scaling": {"rope_type": 3}})", "rope_scaling.rope_type");
  expect_bad(R"({"head_dim": 64, "rope_scaling": {"type": "linear"}})", "rope_scaling.factor");
  expect_bad(R"({"head_dim": 64, "rope_scaling": {"type": "linear", "factor": "4"}})", "rope_scaling.factor");
  expect_bad(R"({"head_dim": 64, "rope_scaling": {"type": "linear", "factor": 0.5}})", "rope_scaling.factor");
  expect_bad(R"({"head_dim": 64, "rope_scaling": {"type": "dynamic", "factor": 2}})", "max_position_embeddings");
  expect_bad(R"({"head_dim": 64, "rope_scaling": {"rope_type": "yarn", "factor": 4}})", "max_position_embeddings");
  expect_bad(R"({"head_dim": 64, "rope_scaling": {"rope_type": "yarn", "original_max_position_embeddings": 4096}})",
             "rope_scaling.factor");
  expect_bad(R"({"head_dim": 64, "max_position_embeddings": 4096, "rope_scaling": {"rope_type": "yarn",
      "factor": 4, "beta_fast": 1, "beta_slow": 2}})", "rope_scaling.beta_fast");
  expect_bad(R"({"head_dim": 64, "max_position_embeddings": 4096, "rope_scaling": {"rope_type": "yarn",
      "factor": 4, "mscale": -1}})", "rope_scaling.mscale");
  expect_bad(R"({"head_dim": 64, "max_position_embeddings": 4096, "rope_scaling": {"rope_type": "yarn",
      "factor": 4, "truncate": "no"}})", "rope_scaling.truncate");
  expect_bad(R"({"head_dim": 64, "max_position_embeddings": 4096, "rope_scaling": {"rope_type": "yarn",
      "factor": 4, "attention_factor": 0}})", "rope_scaling.attention_factor");
  const std::string llama3 = R"({"head_dim": 64, "max_position_embeddings": 4096, "rope_scaling": {"rope_type": "llama3", )";
  expect_bad(llama3 + R"("factor": 8, "high_freq_factor": 4}})", "rope_scaling.low_freq_factor");
  expect_bad(llama3 + R"("factor": 8, "low_freq_factor": 4, "high_freq_factor": 4}})", "rope_scaling.high_freq_factor");
  const std::string longrope = R"({"head_dim": 8, "max_position_embeddings": 8192, "rope_scaling": {"rope_type": "longrope", )";
  expect_bad(longrope + R"("short_factor": [1, 1, 1], "long_factor": [2, 2, 2, 2]}})", "rope_scaling.short_factor");
  expect_bad(longrope + R"("short_factor": [1, 1, 1, 1], "long_factor": [2, 2, 2, "x"]}})", "rope_scaling.long_factor[3]");
  expect_bad(longrope + R"("short_factor": [1, 1, 1, 1], "long_factor": [2, 2, 2, -2]}})", "rope_scaling.long_factor[3]");
  expect_bad(longrope + R"("short_factor": [1, 1, 1, 1]}})", "rope_scaling.long_factor");
  expect_bad(longrope + R"("short_factor": 1, "long_factor": [2, 2, 2, 2]}})", "rope_scaling.short_factor");
  expect_bad(R"({"head_dim": 64, "rope_parameters": {"full_attention": {"rope_type": "default"},
      "sliding_attention": {"rope_type": "default"}}})", "rope_parameters.");
}

// Every field in its range, the frequencies overflowing (fuzz_hf_config's finds): refused when the config is read.
TEST(hf_config, ConfigsWhoseFrequenciesOverflowAreRefusedWhenRead) {
  test::expect_error([] { rope_spec_from_hf_config(R"({"head_dim": 4096, "rope_theta": 1e-310})"); },
                     {"base = 1e-310", "finite", "config.json gives"});
  test::expect_error([] { rope_spec_from_hf_config(R"({"head_dim": 8, "max_position_embeddings": 100,
      "rope_scaling": {"type": "longrope", "factor": 2, "short_factor": [1e-320, 1, 1, 1], "long_factor": [1, 1, 1, 1]}})"); },
                     {"short_factor[0]", "finite"});
  test::expect_error([] { rope_spec_from_hf_config(R"({"head_dim": 8, "max_position_embeddings": 100,
      "rope_scaling": {"type": "longrope", "factor": 2, "short_factor": [1, 1, 1, 1], "long_factor": [1, 1, 1e-320, 1]}})"); },
                     {"long_factor[2]", "finite"});
  test::expect_error([] { rope_spec_from_hf_config(R"({"head_dim": 8, "max_position_embeddings": 100,
      "rope_scaling": {"type": "yarn", "factor": 1e300, "mscale": 1e307, "mscale_all_dim": 1}})"); },
                     {"yarn.mscale", "finite"});
}

TEST(hf_config, ContradictoryConfigsNameTheField) {
  expect_bad(R"({"head_dim": 64, "rope_theta": 10000, "rope_parameters": {"rope_type": "default", "rope_theta": 500000}})",
             "rope_theta");
  expect_bad(R"({"head_dim": 64, "rotary_pct": 0.25, "partial_rotary_factor": 0.5})", "rotary_pct");
  expect_bad(R"({"head_dim": 64, "rope_theta": 10000, "rotary_emb_base": 20000})", "rotary_emb_base");
  expect_bad(R"({"head_dim": 64, "qk_rope_head_dim": 32})", "head_dim");
  expect_bad(R"({"head_dim": 64, "rope_scaling": {"rope_type": "linear", "type": "dynamic", "factor": 2}})",
             "rope_scaling.type");
  expect_bad(R"({"head_dim": 64, "max_position_embeddings": 131072, "original_max_position_embeddings": 4096,
      "rope_scaling": {"rope_type": "yarn", "factor": 32, "original_max_position_embeddings": 8192}})",
             "original_max_position_embeddings");
  expect_bad(R"({"head_dim": 64, "rope_scaling": {"rope_type": "linear", "factor": 2},
      "rope_parameters": {"rope_type": "linear", "factor": 4}})", "rope_parameters.factor");
}

TEST(hf_config, FilesAndDirectories) {
  const fs::path dir = fs::temp_directory_path() / ("rotary_hf_config_test_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  std::ofstream(dir / "config.json") << R"({"hidden_size": 512, "num_attention_heads": 8, "rope_theta": 20000})";
  EXPECT_EQ(rope_spec_from_hf_config_file(dir.string()).base, 20000.0);  // a model directory
  EXPECT_EQ(rope_spec_from_hf_config_file((dir / "config.json").string()).head_dim, 64);
  std::ofstream(dir / "bad.json") << R"({"hidden_size": 512})";
  try {
    rope_spec_from_hf_config_file((dir / "bad.json").string());
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("bad.json"), std::string::npos) << e.what();  // says which file
  }
  test::expect_error([&] { rope_spec_from_hf_config_file((dir / "missing.json").string()); }, {"hf_config", "allowed"});
  fs::remove_all(dir);
}

// Hostile text (found by fuzz/hf_config_fuzzer.cpp): a config nested 100000 arrays deep used to overflow the stack
// while its error message was being written (json::dump recursing), and a number beyond double range escaped as
// nlohmann's out_of_range. Both are a rotary::Error naming config.json.
TEST(hf_config, HostileJsonIsAnErrorNotACrash) {
  const std::string deep = R"({"rope_scaling": )" + std::string(100000, '[') + std::string(100000, ']') + "}";
  expect_bad(deep, "config.json nesting depth = 100001");
  expect_bad(R"({"hidden_size": 64, "num_attention_heads": 2, "rope_theta": 1e400})", "config.json");
  // Below the bound, a wrong type is still named by its field, its value shown short.
  expect_bad(R"({"hidden_size": 64, "num_attention_heads": 2, "rope_scaling": )" + std::string(60, '[') +
                 std::string(60, ']') + "}",
             "rope_scaling = [[[[");
}

}  // namespace
}  // namespace rotary
