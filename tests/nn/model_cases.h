// Small model configurations covering every encoding kind, shared by the nn tests.
#pragma once

#include <string>
#include <vector>

#include "rotary_nn/model.h"

namespace rotary::nn::testing {

struct Case {
  std::string name;
  ModelConfig config;
};

// vocab 23, d_model 64, 4 query heads of dim 16 (the fused kernel's smallest), 2 kv heads (GQA), 2 layers.
inline ModelConfig small_config(const std::string& kind) {
  ModelConfig c;
  c.vocab_size = 23;
  c.d_model = 64;
  c.n_layers = 2;
  c.n_heads = 4;
  c.n_kv_heads = 2;
  c.d_ff = 96;
  c.max_seq_len = 40;
  c.encoding.kind = parse_encoding_kind(kind, "kind");
  if (is_windowed(c.encoding.kind)) c.encoding.window = 5;
  if (c.encoding.kind == EncodingKind::LeakyRerope) c.encoding.leaky_k = 3;
  return c;
}

// YaRN gives an attention factor != 1, which checks where both paths put it (near and far scores).
inline RopeSpec yarn_spec() {
  RopeSpec s;
  s.scaling = RopeScaling::Yarn;
  s.factor = 4;
  s.max_position_embeddings = 32;
  s.original_max_position_embeddings = 8;
  return s;
}

inline std::vector<Case> all_cases() {
  std::vector<Case> cases;
  auto add = [&](const std::string& name, ModelConfig c) { cases.push_back({name, c}); };
  for (const char* kind : {"none", "learned", "sinusoidal", "alibi", "t5", "rope", "roper", "rerope", "leaky_rerope"})
    add(kind, small_config(kind));
  {
    ModelConfig c = small_config("t5");  // log buckets reached inside the test rows
    c.encoding.t5_num_buckets = 8;
    c.encoding.t5_max_distance = 12;
    add("t5_8_buckets_to_12", c);
  }
  {
    ModelConfig c = small_config("rope");
    c.encoding.rope.layout = RopeLayout::Interleaved;
    c.encoding.rotary_fraction = 0.5;
    c.encoding.rope.scaling = RopeScaling::Linear;
    c.encoding.rope.factor = 2;
    add("rope_interleaved_partial_linear", c);
  }
  {
    ModelConfig c = small_config("roper");
    c.encoding.rotary_fraction = 0.5;
    c.n_kv_heads = 1;  // MQA
    add("roper_partial_mqa", c);
  }
  {
    ModelConfig c = small_config("rerope");
    c.encoding.rope = yarn_spec();
    add("rerope_yarn", c);
  }
  {
    ModelConfig c = small_config("leaky_rerope");
    c.encoding.rope = yarn_spec();
    c.encoding.rope.layout = RopeLayout::Interleaved;
    c.n_kv_heads = 0;  // MHA
    add("leaky_rerope_yarn_interleaved_mha", c);
  }
  for (const char* kind : {"none", "alibi", "t5", "rope", "roper", "rerope", "leaky_rerope"}) {
    ModelConfig c = small_config(kind);
    c.encoding.logn_train_len = 6;
    add(std::string(kind) + "_logn", c);
  }
  {
    ModelConfig c = small_config("rope");
    c.pre_norm = false;
    c.tie_embeddings = false;
    add("rope_postnorm_untied", c);
  }
  {
    ModelConfig c = small_config("rope");
    c.attention = AttentionKind::Linear;
    add("linear_rope", c);
  }
  {
    ModelConfig c = small_config("rope");
    c.attention = AttentionKind::Linear;
    c.encoding.rope = yarn_spec();
    c.encoding.rope.layout = RopeLayout::Interleaved;
    add("linear_rope_yarn_interleaved", c);
  }
  {
    ModelConfig c = small_config("none");
    c.attention = AttentionKind::Linear;
    add("linear_none", c);
  }
  {
    ModelConfig c = small_config("rope");  // rotary before FAVOR+, GQA, m = round(16 ln 16) = 44
    c.attention = AttentionKind::Performer;
    add("performer_rope", c);
  }
  {
    ModelConfig c = small_config("rope");
    c.attention = AttentionKind::Performer;
    c.encoding.rope = yarn_spec();
    c.encoding.rope.layout = RopeLayout::Interleaved;
    c.encoding.rotary_fraction = 0.5;
    c.performer_features = 20;  // fewer features than a block of head_dim rows plus a partial block
    add("performer_rope_yarn_interleaved_partial_m20", c);
  }
  {
    ModelConfig c = small_config("learned");
    c.attention = AttentionKind::Performer;
    c.n_kv_heads = 0;
    add("performer_learned_mha", c);
  }
  return cases;
}

}  // namespace rotary::nn::testing
