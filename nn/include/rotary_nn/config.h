// rotary_nn/config.h: the configuration of the transformer (torch-free, so configs can be read and checked without
// libtorch): position encoding, model shape, JSON, validation, and inference-time overrides.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <ostream>
#include <string>
#include <string_view>
#include <vector>

#include "rotary/rope_spec.h"
#include "rotary/settings.h"
#include "rotary_engine/kinds.h"
#include "rotary_nn/limits.h"

namespace rotary::nn {

// How positions enter the model. The names ("leaky_rerope") appear only at the edges: JSON, TOML, flags and
// messages (encoding_kind_name / parse_encoding_kind); the code compares the enum.
enum class EncodingKind { None, Learned, Sinusoidal, Alibi, T5, Rope, Roper, Rerope, LeakyRerope };

// Every kind, in the order error messages and --help list them.
inline constexpr EncodingKind kEncodingKinds[] = {EncodingKind::None,  EncodingKind::Learned, EncodingKind::Sinusoidal,
                                                  EncodingKind::Alibi, EncodingKind::T5,      EncodingKind::Rope,
                                                  EncodingKind::Roper, EncodingKind::Rerope,  EncodingKind::LeakyRerope};
// softmax; linear: RoFormer eq. 19 (phi = elu + 1, RoPE on the features); performer: FAVOR+ (Choromanski et al.),
// positive orthogonal random features of the (rotated) q and k. Names at the edges only, as for EncodingKind.
enum class AttentionKind : uint8_t { Softmax, Linear, Performer };
inline constexpr AttentionKind kAttentionKinds[] = {AttentionKind::Softmax, AttentionKind::Linear,
                                                    AttentionKind::Performer};
std::string_view attention_kind_name(AttentionKind kind);  // "softmax", "linear", "performer"
std::ostream& operator<<(std::ostream& os, AttentionKind kind);
// How the parameters start (docs/model.md): GPT-2's N(0, 0.02) for every matrix and embedding, or fan_in -
// torch's own defaults - a matrix uniform in +-1/sqrt(its inputs), an embedding N(0, 1). A small model on the
// key-value task forms its lookup heads only from fan_in's larger attention scores (docs/tasks.md).
enum class InitKind : uint8_t { Gpt2, FanIn };
inline constexpr InitKind kInitKinds[] = {InitKind::Gpt2, InitKind::FanIn};
std::string_view init_kind_name(InitKind kind);  // "gpt2", "fan_in"
std::ostream& operator<<(std::ostream& os, InitKind kind);
// The block's normalisation and MLP, the engine's enums (it runs the same blocks): GPT-2's LayerNorm + GELU by
// default; Llama, Mistral and Qwen use RMSNorm + SwiGLU (docs/checkpoints.md); GPT-NeoX LayerNorm + GELU with a
// parallel residual.
using engine::MlpKind;
using engine::NormKind;

std::string_view encoding_kind_name(EncodingKind kind);  // "none", "learned", ..., "leaky_rerope"
// rotary::Error "<field> = <name> is invalid; allowed: none, learned, ..." for an unknown name.
EncodingKind parse_encoding_kind(std::string_view name, std::string_view field);
std::string encoding_kind_names();  // "none, learned, sinusoidal, alibi, t5, rope, roper, rerope, leaky_rerope"
std::ostream& operator<<(std::ostream& os, EncodingKind kind);  // the name, so check() messages show it

// What each kind is, answered in one place.
// Scores come from rotated queries and keys (the kind uses EncodingConfig::rope): rope, roper, rerope, leaky_rerope.
bool is_rotary(EncodingKind kind);
// Distances past a window are clipped (rerope) or compressed (leaky_rerope): the kind uses EncodingConfig::window.
bool is_windowed(EncodingKind kind);
// A bias added to the scores from the query-key distance (alibi; t5's learned bias per head and bucket): the fused
// attention kernel adds it (a score-bias mode); the core decoder has no bias yet, so generation keeps their keys in
// the plain cache.
bool has_score_bias(EncodingKind kind);
// The position mode of the fused attention ops for a rotary kind: RoPER is the rope mode with values rotated too.
struct FusedPositionMode {
  std::string mode;  // "rope", "rerope" or "leaky_rerope" (rotary::attention's `mode` argument)
  bool roper = false;
};
FusedPositionMode fused_position_mode(EncodingKind kind);  // rotary::Error for a kind that is not rotary

// The rotary kinds use `rope` (layout, rotary fraction via rotary_dim, base, scaling); rerope/leaky_rerope also
// `window` (and `leaky_k`); every kind may add log-n query scaling (logn_train_len > 1).
struct EncodingConfig {
  EncodingKind kind = EncodingKind::Rope;
  RopeSpec rope;                 // head_dim is filled from the model; rotary_dim 0 = from rotary_fraction
  double rotary_fraction = 1.0;  // convenience: rotary_dim = head_dim * fraction (rounded down to even)
  int64_t window = 0;            // rerope / leaky_rerope: distances >= window are clipped (ReRoPE) or compressed
  double leaky_k = 1.0;          // leaky_rerope: beyond the window the distance grows by 1/k per token
  int64_t logn_train_len = 0;    // > 1: q *= max(1, ln(pos + 1) / ln(logn_train_len)); 0: off
  int t5_num_buckets = 32;       // t5: relative position buckets (rotary/t5_bias.h), causal
  int t5_max_distance = 128;     // t5: distances beyond share the last bucket
};

struct ModelConfig {
  int vocab_size = 0;
  int d_model = 128;
  int n_layers = 2;
  int n_heads = 4;
  int n_kv_heads = 0;      // 0 = n_heads
  int d_ff = 0;            // 0 = 4 * d_model
  int head_dim_override = 0;  // JSON "head_dim": 0 = d_model / n_heads (Mistral Nemo, Qwen3 set their own)
  bool pre_norm = true;
  NormKind normalization = NormKind::LayerNorm;  // layernorm (weight, bias) | rmsnorm (weight only)
  double norm_eps = 1e-5;
  MlpKind mlp = MlpKind::Gelu;  // gelu (erf) | gelu_tanh | swiglu: down(silu(gate(x)) * up(x))
  bool qkv_bias = true;      // biases of the q, k, v projections (Llama: none; Qwen2: these only)
  bool out_bias = true;      // bias of the attention's output projection
  bool mlp_bias = true;      // biases of the MLP's projections
  bool parallel_residual = false;  // GPT-NeoX: x + attn(ln_attn(x)) + mlp(ln_mlp(x)) (pre-norm only)
  int64_t sliding_window = 0;      // > 0: the checkpoint attends only this far back (Mistral v0.1); we have no
                                   // sliding-window attention, so longer sequences are refused, not run differently
  double dropout = 0.0;
  bool tie_embeddings = true;
  InitKind init = InitKind::Gpt2;  // gpt2 | fan_in (see InitKind)
  int max_seq_len = 1024;  // learned absolute positions only
  AttentionKind attention = AttentionKind::Softmax;  // softmax | linear (RoFormer eq. 19) | performer (FAVOR+)
  int performer_features = 0;         // performer: random features m per layer (0 = round(head_dim ln head_dim))
  int64_t performer_redraw = 1000;    // performer: training redraws the features every N steps (0 = never)
  bool fused = true;       // true: rotary torch ops (fused kernels); false: plain torch ops (the baseline)
  EncodingConfig encoding;

  void validate() const;  // rotary::Error naming the field
  int head_dim() const { return head_dim_override != 0 ? head_dim_override : d_model / n_heads; }
  int kv_heads() const { return n_kv_heads == 0 ? n_heads : n_kv_heads; }
  int ff_dim() const { return d_ff == 0 ? 4 * d_model : d_ff; }
  // performer: m, the random features per layer (performer_features, or round(head_dim ln head_dim), at least 1).
  int performer_feature_count() const;
  // The encoding with rope.head_dim and rope.rotary_dim filled in from the model (call after validate()).
  EncodingConfig resolved_encoding() const;
};

// Every model field declared once - JSON path, flag, help, allowed values (rotary/settings.h) - which JSON, the
// ranges of validate(), the lab's flags and TOML files all use. rope_settings() declares RopeSpec's fields (their
// ranges are RopeSpec::validate()'s).
const settings::Table<ModelConfig>& model_settings();
const settings::Table<RopeSpec>& rope_settings();

void to_json(nlohmann::json& j, const ModelConfig& c);
// from_json: rotary::Error on unknown or ill-typed fields and unknown names (kind, layout, scaling); the values
// themselves are checked by validate(), so a config to be completed later (vocab_size 0) still reads.
void from_json(const nlohmann::json& j, ModelConfig& c);
void to_json(nlohmann::json& j, const EncodingConfig& e);
void from_json(const nlohmann::json& j, EncodingConfig& e);
// RopeSpec as JSON: {"base": 10000, "layout": "half_split", "scaling": "yarn", "factor": 4, ...}; names as
// rotary::parse_layout / parse_scaling accept them.
nlohmann::json rope_spec_to_json(const RopeSpec& s);
RopeSpec rope_spec_from_json(const nlohmann::json& j, const std::string& field);

// Inference-time overrides without retraining: a new rope scaling, ReRoPE window, leaky k, log-n, or even a
// different rope-family kind (rope -> rerope). Each set_override starts again from the trained encoding.
struct EncodingOverride {
  std::optional<EncodingKind> kind;
  std::optional<RopeSpec> rope;
  std::optional<int64_t> window;
  std::optional<double> leaky_k;
  std::optional<int64_t> logn_train_len;
};

// {"kind": "rerope", "window": 256, "rope": {...}, "leaky_k": 16, "logn_train_len": 512}, every field optional.
void to_json(nlohmann::json& j, const EncodingOverride& o);
void from_json(const nlohmann::json& j, EncodingOverride& o);  // rotary::Error naming the field ("override.window")

// The trained (resolved) encoding with the override applied and checked: rotary::Error naming the override field
// when it does not fit the trained model (e.g. a different rotary_dim or layout than the weights were trained with).
EncodingConfig apply_override(const ModelConfig& trained, const EncodingOverride& o);

}  // namespace rotary::nn
