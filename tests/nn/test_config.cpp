// ModelConfig: JSON round trip, and every bad value / unknown name / bad override is a rotary::Error that names
// the field. Torch-free (includes only rotary_nn/config.h).
#include <gtest/gtest.h>

#include <functional>
#include <string>

#include "expect_error.h"
#include "rotary/error.h"
#include "rotary_nn/config.h"

namespace rotary::nn {
namespace {

using test::expect_error;
using test::expect_error_naming;

ModelConfig valid() {
  ModelConfig c;
  c.vocab_size = 50;
  c.d_model = 64;
  c.n_heads = 4;
  return c;
}

TEST(config, JsonRoundTripKeepsEveryField) {
  ModelConfig c = valid();
  c.n_layers = 3;
  c.n_kv_heads = 2;
  c.d_ff = 96;
  c.pre_norm = false;
  c.dropout = 0.125;
  c.tie_embeddings = false;
  c.init = InitKind::FanIn;
  c.max_seq_len = 77;
  c.fused = false;
  c.encoding.kind = EncodingKind::LeakyRerope;
  c.encoding.window = 12;
  c.encoding.leaky_k = 4.5;
  c.encoding.logn_train_len = 64;
  c.encoding.rotary_fraction = 0.5;
  c.encoding.rope.base = 500000;
  c.encoding.rope.layout = RopeLayout::Interleaved;
  c.encoding.rope.scaling = RopeScaling::Yarn;
  c.encoding.rope.factor = 4;
  c.encoding.rope.max_position_embeddings = 256;
  c.encoding.rope.original_max_position_embeddings = 64;
  c.encoding.rope.yarn.beta_fast = 16;
  c.encoding.rope.yarn.mscale = 0.707;
  c.encoding.rope.yarn.truncate = false;
  c.encoding.rope.attention_factor = 1.25;
  c.validate();
  const nlohmann::json j = c;
  const ModelConfig back = nlohmann::json::parse(j.dump()).get<ModelConfig>();
  EXPECT_EQ(nlohmann::json(back), j);
  EXPECT_EQ(back.encoding.kind, EncodingKind::LeakyRerope);
  EXPECT_EQ(back.encoding.rope.layout, RopeLayout::Interleaved);
  EXPECT_EQ(back.encoding.rope.scaling, RopeScaling::Yarn);
  EXPECT_EQ(back.encoding.rope.yarn.mscale, std::optional<double>(0.707));
  EXPECT_EQ(back.encoding.rope.attention_factor, std::optional<double>(1.25));
  EXPECT_EQ(back.encoding.leaky_k, 4.5);
  EXPECT_EQ(back.dropout, 0.125);
  EXPECT_EQ(back.init, InitKind::FanIn);
  EXPECT_EQ(j.at("init"), "fan_in");
  EXPECT_FALSE(nlohmann::json(valid()).contains("init"));  // gpt2, the default, is not written: stored configs keep their form
  EXPECT_FALSE(back.fused);
}

TEST(config, ReadingLeavesValuesToValidate) {
  // The lab reads vocab_size 0 ("from the task") and fills it in before validate().
  const auto c = nlohmann::json::parse(R"({"vocab_size": 0, "n_heads": 3})").get<ModelConfig>();
  EXPECT_EQ(c.n_heads, 3);
  EXPECT_THROW(c.validate(), rotary::Error);
}

TEST(config, MissingFieldsKeepDefaults) {
  const auto c = nlohmann::json::parse(R"({"vocab_size": 9, "encoding": {"kind": "alibi"}})").get<ModelConfig>();
  EXPECT_EQ(c.vocab_size, 9);
  EXPECT_EQ(c.d_model, ModelConfig{}.d_model);
  EXPECT_EQ(c.encoding.kind, EncodingKind::Alibi);
}

TEST(config, JsonErrorsNameTheField) {
  auto parse = [](const char* text) { return [text] { (void)nlohmann::json::parse(text).get<ModelConfig>(); }; };
  expect_error(parse(R"({"vocab_size": 9, "d_modle": 64})"), {"d_modle", "d_model"});
  expect_error(parse(R"({"vocab_size": 9, "n_layers": "2"})"), {"n_layers", "an integer"});
  expect_error(parse(R"({"vocab_size": 9, "n_layers": 3000000000})"), {"n_layers"});
  expect_error(parse(R"({"vocab_size": 9, "fused": 1})"), {"fused", "true or false"});
  expect_error(parse(R"({"vocab_size": 9, "encoding": {"kind": "xpos"}})"),
               {"encoding.kind", "xpos", "none, learned, sinusoidal, alibi, t5, rope, roper, rerope, leaky_rerope"});
  expect_error(parse(R"({"vocab_size": 9, "encoding": {"kind": "rope", "windw": 3}})"), {"encoding.windw"});
  // The kinds are enums in the code; their names are checked where they come in.
  expect_error(parse(R"({"vocab_size": 9, "normalization": "batchnorm"})"),
               {"normalization = batchnorm", "layernorm, rmsnorm"});
  expect_error(parse(R"({"vocab_size": 9, "mlp": "relu"})"), {"mlp = relu", "gelu, gelu_tanh, swiglu"});
  expect_error(parse(R"({"vocab_size": 9, "init": "xavier"})"), {"init = xavier", "gpt2, fan_in"});
  expect_error(parse(R"({"vocab_size": 9, "encoding": {"rope": {"scaling": "stretchy"}}})"), {"stretchy"});
  expect_error(parse(R"({"vocab_size": 9, "encoding": {"rope": {"yarn": {"beta": 1}}}})"),
               {"encoding.rope.yarn.beta"});
  expect_error(parse(R"({"vocab_size": 9, "attention": "sparse"})"), {"attention", "softmax, linear"});
  expect_error(parse(R"([1, 2])"), {"config"});
}

TEST(config, ValidateNamesTheField) {
  auto bad = [](std::function<void(ModelConfig&)> edit) {
    return [edit] {
      ModelConfig c = valid();
      edit(c);
      c.validate();
    };
  };
  expect_error(bad([](ModelConfig& c) { c.vocab_size = 0; }), {"vocab_size"});
  expect_error(bad([](ModelConfig& c) { c.n_heads = 5; }), {"n_heads", "d_model = 64"});
  expect_error(bad([](ModelConfig& c) { c.n_kv_heads = 3; }), {"n_kv_heads", "n_heads = 4"});
  expect_error(bad([](ModelConfig& c) { c.n_layers = 0; }), {"n_layers"});
  expect_error(bad([](ModelConfig& c) { c.dropout = 1.0; }), {"dropout"});
  expect_error(bad([](ModelConfig& c) { c.max_seq_len = 0; }), {"max_seq_len"});
  // Names are case-sensitive at the edge (JSON, TOML, flags); inside, the kind is an enum.
  expect_error([] { (void)parse_encoding_kind("Rope", "encoding.kind"); }, {"encoding.kind", "Rope", "rope, roper"});
  for (EncodingKind k : kEncodingKinds) EXPECT_EQ(parse_encoding_kind(encoding_kind_name(k), "kind"), k);
  expect_error(bad([](ModelConfig& c) { c.encoding.kind = EncodingKind::Rerope; }), {"encoding.window", ">= 1"});
  expect_error(bad([](ModelConfig& c) { c.encoding.window = 4; }), {"encoding.window", "only rerope"});
  expect_error(bad([](ModelConfig& c) { c.encoding.kind = EncodingKind::LeakyRerope, c.encoding.window = 4, c.encoding.leaky_k = 0; }),
               {"encoding.leaky_k"});
  expect_error(bad([](ModelConfig& c) { c.encoding.leaky_k = 2; }), {"encoding.leaky_k", "only leaky_rerope"});
  expect_error(bad([](ModelConfig& c) { c.encoding.t5_num_buckets = 16; }), {"encoding.t5_num_buckets", "only t5"});
  expect_error(bad([](ModelConfig& c) { c.encoding.kind = EncodingKind::T5, c.encoding.t5_max_distance = 8; }),
               {"t5_max_distance = 8", "> 16", "in encoding."});
  expect_error(bad([](ModelConfig& c) { c.encoding.kind = EncodingKind::T5, c.encoding.t5_num_buckets = 1; }),
               {"encoding.t5_num_buckets = 1", "[2, 4096]"});
  expect_error(bad([](ModelConfig& c) { c.encoding.logn_train_len = 1; }), {"encoding.logn_train_len"});
  expect_error(bad([](ModelConfig& c) { c.encoding.rotary_fraction = 0; }), {"encoding.rotary_fraction"});
  expect_error(bad([](ModelConfig& c) { c.encoding.rotary_fraction = 0.05; }), {"encoding.rope.rotary_dim"});
  expect_error(bad([](ModelConfig& c) { c.encoding.rope.rotary_dim = 7; }), {"encoding.rope.rotary_dim"});
  expect_error(bad([](ModelConfig& c) { c.encoding.rope.head_dim = 32; }), {"encoding.rope.head_dim"});
  expect_error(bad([](ModelConfig& c) { c.encoding.rope.scaling = RopeScaling::Linear, c.encoding.rope.factor = -1; }),
               {"factor", "encoding.rope"});
  expect_error(bad([](ModelConfig& c) { c.attention = AttentionKind::Linear, c.encoding.kind = EncodingKind::Alibi; }),
               {"encoding.kind", "linear"});
  expect_error(bad([](ModelConfig& c) { c.attention = AttentionKind::Linear, c.encoding.logn_train_len = 16; }),
               {"encoding.logn_train_len"});
  expect_error(bad([](ModelConfig& c) { c.d_model = 32; }), {"head_dim = 8", "16..256", "fused = false"});
  // The checkpoint families' block options.
  expect_error(bad([](ModelConfig& c) { c.norm_eps = 0; }), {"norm_eps = 0"});
  expect_error(bad([](ModelConfig& c) { c.pre_norm = false, c.parallel_residual = true; }), {"parallel_residual", "pre_norm"});
  expect_error(bad([](ModelConfig& c) { c.sliding_window = -1; }), {"sliding_window = -1"});
  expect_error(bad([](ModelConfig& c) { c.head_dim_override = 8; }), {"head_dim = 8", "16..256"});
  {
    ModelConfig explicit_head = valid();  // d_model 64, 4 heads: head_dim 32 instead of 16 is allowed
    explicit_head.head_dim_override = 32;
    explicit_head.n_heads = 3;  // no longer needs to divide d_model
    EXPECT_NO_THROW(explicit_head.validate());
    EXPECT_EQ(explicit_head.head_dim(), 32);
  }
  // The same shapes are fine where the fused kernel is not used.
  ModelConfig c = valid();
  c.d_model = 32;
  c.fused = false;
  EXPECT_NO_THROW(c.validate());
  c.fused = true;
  c.attention = AttentionKind::Linear;  // the linear attention kernel takes any head_dim up to 1024
  EXPECT_NO_THROW(c.validate());
  c.attention = AttentionKind::Softmax;
  c.encoding.kind = EncodingKind::Alibi;  // the score-bias kinds now run in the fused kernel too
  expect_error_naming([&] { c.validate(); }, "head_dim");
}

TEST(config, ResolvedEncodingFillsHeadAndRotaryDim) {
  ModelConfig c = valid();
  c.encoding.rotary_fraction = 0.4;  // 16 * 0.4 = 6.4 -> 6
  const EncodingConfig e = c.resolved_encoding();
  EXPECT_EQ(e.rope.head_dim, 16);
  EXPECT_EQ(e.rope.rotary_dim, 6);
}

TEST(config, OverridesAreCheckedAgainstTheTrainedModel) {
  ModelConfig c = valid();
  EncodingOverride o;
  o.kind = EncodingKind::Rerope;
  expect_error([&] { apply_override(c, o); }, {"override.window"});
  o.window = 8;
  EncodingConfig e = apply_override(c, o);
  EXPECT_EQ(e.kind, EncodingKind::Rerope);
  EXPECT_EQ(e.window, 8);
  EXPECT_EQ(e.rope.rotary_dim, 16);

  o = {};
  o.kind = EncodingKind::Alibi;
  expect_error([&] { apply_override(c, o); }, {"override.kind", "rope, rerope, leaky_rerope"});
  o = {};
  o.window = 4;  // a window on plain rope
  expect_error([&] { apply_override(c, o); }, {"override.window"});
  o = {};
  RopeSpec s;
  s.rotary_dim = 8;
  o.rope = s;
  expect_error([&] { apply_override(c, o); }, {"override.rope.rotary_dim", "16"});
  s.rotary_dim = 0;
  s.layout = RopeLayout::Interleaved;
  o.rope = s;
  expect_error([&] { apply_override(c, o); }, {"override.rope.layout"});
  s.layout = RopeLayout::HalfSplit;
  s.scaling = RopeScaling::Linear;
  s.factor = 4;
  o.rope = s;
  e = apply_override(c, o);
  EXPECT_EQ(e.rope.scaling, RopeScaling::Linear);
  EXPECT_EQ(e.rope.head_dim, 16);

  // Leaving leaky_rerope for rerope drops leaky_k; other kinds can only change their parameters.
  c.encoding.kind = EncodingKind::LeakyRerope, c.encoding.window = 4, c.encoding.leaky_k = 8;
  o = {};
  o.kind = EncodingKind::Rerope;
  EXPECT_EQ(apply_override(c, o).leaky_k, 1.0);
  c.encoding = EncodingConfig{};
  c.encoding.kind = EncodingKind::Learned;
  o = {};
  o.kind = EncodingKind::Rope;
  expect_error([&] { apply_override(c, o); }, {"override.kind", "learned"});
  o = {};
  o.rope = RopeSpec{};
  expect_error([&] { apply_override(c, o); }, {"override.rope", "learned"});
  o = {};
  o.logn_train_len = 32;
  EXPECT_EQ(apply_override(c, o).logn_train_len, 32);
}

TEST(config, OverrideJson) {
  const auto o = nlohmann::json::parse(R"({"kind": "rerope", "window": 7, "rope": {"scaling": "dynamic", "factor": 2,
                                           "max_position_embeddings": 64}})").get<EncodingOverride>();
  EXPECT_EQ(o.kind, std::optional<EncodingKind>(EncodingKind::Rerope));
  EXPECT_EQ(o.window, std::optional<int64_t>(7));
  ASSERT_TRUE(o.rope.has_value());
  EXPECT_EQ(o.rope->scaling, RopeScaling::Dynamic);
  EXPECT_FALSE(o.leaky_k.has_value());
  EXPECT_EQ(nlohmann::json(nlohmann::json(o).get<EncodingOverride>()), nlohmann::json(o));
  expect_error([] { (void)nlohmann::json::parse(R"({"widow": 3})").get<EncodingOverride>(); }, {"override.widow"});
  expect_error([] { (void)nlohmann::json::parse(R"({"window": 2.5})").get<EncodingOverride>(); }, {"override.window"});
}

}  // namespace
}  // namespace rotary::nn
