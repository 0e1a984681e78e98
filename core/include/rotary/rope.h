// rotary/rope.h: apply a rotation to q and k (and anything else shaped [tokens, heads, head_dim]).
//
// Views are strided [tokens, heads, head_dim] with a contiguous last dim; batch and sequence are flattened
// into "tokens" through the token stride, so [B,S,H,D], [S,B,H,D], [T,H,D] and padded heads all fit:
//   [B,S,H,D] contiguous: tokens = B*S, token_stride = H*D, head_stride = D
//   [S,B,H,D] with a view of one batch row: token_stride = B*H*D
// Each token has its own int64 position (packed sequences, left padding, speculative trees).
// rope_apply is the fast kernel (Highway SIMD, runtime dispatch, OpenMP over tokens);
// rope_apply_reference is the float64 scalar oracle with the same contract.
//
// The convention of every Params struct of the core (RopeParams here, AttentionParams / PositionParams in
// attention.h, LinearAttentionParams, KvCacheConfig / DecodeParams in kv_cache.h):
//   - the frequencies are a member `const RopeFreqs* freqs` (in PositionParams where a position mode picks how
//     they are used), never a separate argument; the caller keeps them alive for the call (a KvCache copies them);
//   - `int threads`: OpenMP threads at most, 0: omp_get_max_threads() (a kernel may use fewer when the work is
//     small); the gradient Params use their `fwd.threads`.
// rope_apply(freqs, params), the form before this rule, stays as an inline overload below.
#pragma once

#include <cstdint>

#include "rotary/dtype.h"
#include "rotary/rope_spec.h"

namespace rotary {

// A strided [tokens, heads, head_dim] view; element strides; feature stride is 1.
struct HeadsView {
  void* data = nullptr;
  int64_t heads = 0;
  int64_t token_stride = 0;  // elements from token t to t+1
  int64_t head_stride = 0;   // elements from head h to h+1 (>= head_dim)
};

enum class RopeDirection : uint8_t {
  Forward,    // y = a R(p) x                      (a = attention factor)
  Inverse,    // y = R(-p) x / a                   (undoes Forward)
  Transpose,  // y = a R(-p) x = (a R(p))^T x       (the gradient of Forward)
};

struct RopeParams {
  const RopeFreqs* freqs = nullptr;    // required: the rotation's frequencies, layout and attention factor
  int64_t tokens = 0;
  const int64_t* positions = nullptr;  // [tokens]
  DType dtype = DType::F32;            // storage of q, k and their outputs; arithmetic in fp32 (fp64 for F64)
  HeadsView q_in, q_out;               // q_out.data == q_in.data rotates in place
  HeadsView k_in, k_out;               // optional (k_in.data == nullptr); k may have fewer heads (GQA)
  RopeDirection direction = RopeDirection::Forward;
  int threads = 0;                     // OpenMP threads at most; 0: omp_get_max_threads() (small calls use fewer)
};

// Throws rotary::Error on any field that does not fit (null freqs or data, heads < 1, strides that overlap, ...).
void validate_rope_params(const RopeParams& p);

// Features [0, rotary_dim) rotate; [rotary_dim, head_dim) are copied (out of place) or left alone (in place).
void rope_apply(const RopeParams& p);
void rope_apply_reference(const RopeParams& p);

// The earlier form with the frequencies as a separate argument (lab/bench and older callers): `f` takes the place
// of p.freqs, whatever that holds.
inline void validate_rope_params(const RopeFreqs& f, const RopeParams& p) {
  RopeParams with = p;
  with.freqs = &f;
  validate_rope_params(with);
}
inline void rope_apply(const RopeFreqs& f, const RopeParams& p) {
  RopeParams with = p;
  with.freqs = &f;
  rope_apply(with);
}
inline void rope_apply_reference(const RopeFreqs& f, const RopeParams& p) {
  RopeParams with = p;
  with.freqs = &f;
  rope_apply_reference(with);
}

// The Highway target rope_apply dispatches to on this CPU ("AVX3", "AVX2", ...), for benchmark reports.
const char* rope_simd_target();

}  // namespace rotary
