// rotary_engine/kinds.h: the blocks' normalisation and MLP as the engine runs them, in a header of their own so that
// readers of model configs (the nn layer's ModelConfig, the fuzz targets) name them without the engine's model.
#pragma once

#include <cstdint>
#include <ostream>
#include <string_view>

namespace rotary::engine {

// The blocks' normalisation and MLP (the nn layer's ModelConfig uses these too). The names ("rmsnorm",
// "gelu_tanh") appear only at the edges - JSON, flags, messages - through norm_kind_name / mlp_kind_name.
enum class NormKind : uint8_t { RmsNorm, LayerNorm };
enum class MlpKind : uint8_t { SwiGlu, Gelu, GeluTanh };  // down(silu(gate x) * up x); down(gelu(up x)), erf / tanh
// Every kind, in the order messages and --help list them.
inline constexpr NormKind kNormKinds[] = {NormKind::LayerNorm, NormKind::RmsNorm};
inline constexpr MlpKind kMlpKinds[] = {MlpKind::Gelu, MlpKind::GeluTanh, MlpKind::SwiGlu};
constexpr std::string_view norm_kind_name(NormKind kind) {  // "layernorm", "rmsnorm"
  return kind == NormKind::RmsNorm ? "rmsnorm" : "layernorm";
}
constexpr std::string_view mlp_kind_name(MlpKind kind) {  // "gelu", "gelu_tanh", "swiglu"
  return kind == MlpKind::SwiGlu ? "swiglu" : kind == MlpKind::GeluTanh ? "gelu_tanh" : "gelu";
}
// The name, so check() messages show it.
inline std::ostream& operator<<(std::ostream& os, NormKind kind) { return os << norm_kind_name(kind); }
inline std::ostream& operator<<(std::ostream& os, MlpKind kind) { return os << mlp_kind_name(kind); }

}  // namespace rotary::engine
