// tests/engine/hf_fixtures.h: the checkpoint fixtures (tests/data/hf_checkpoints, made by
// tests/hf/make_checkpoint_fixtures.py) as the engine's tests read them - the stored tokens and logits of the
// float64 transcription of transformers, the measure and tolerances the comparisons share, and logits from an
// engine session. Torch-free and free of nn: the engine suite (tests/engine) and the nn comparisons
// (tests/nn/test_hf_engine.cpp) both include it.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "rotary/safetensors.h"
#include "rotary_engine/hf_model.h"

// Designated initializers that leave the other fields at their defaults ({.window = 8}) are how these tests name a
// setting; GCC 12's -Wmissing-field-initializers reports each of them (GCC 14 no longer does).
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmissing-field-initializers"
#endif

namespace rotary::test {

// The tests run on every fixture family (INSTANTIATE_TEST_SUITE_P(Families, HfEngineFixture, ValuesIn(kFamilies))).
class HfEngineFixture : public ::testing::TestWithParam<const char*> {};

inline const std::filesystem::path kFixtures = std::filesystem::path(ROTARY_SOURCE_DIR) / "tests/data/hf_checkpoints";
inline const char* const kFamilies[] = {"llama2", "llama3", "mistral", "qwen2", "gpt_neox"};

struct Expected {
  std::vector<int64_t> tokens;
  std::map<std::string, std::vector<double>> logits;  // [S * V] float64 of the stored float32
};

inline Expected read_expected(const std::filesystem::path& dir) {
  const SafetensorsFile f = SafetensorsFile::open((dir / "expected.safetensors").string());
  Expected e;
  for (const SafetensorsTensor& t : f.tensors()) {
    std::vector<float> v(size_t(t.bytes / 4));
    std::memcpy(v.data(), t.data, t.bytes);
    if (t.name == "tokens") {
      for (float x : v) e.tokens.push_back(int64_t(x));
    } else {
      e.logits[t.name] = std::vector<double>(v.begin(), v.end());
    }
  }
  return e;
}

// max |a - b| / max |b| (the measure of the nn fixture test).
inline double relative_error(const std::vector<double>& a, const std::vector<double>& b) {
  double err = 0, scale = 0;
  for (size_t i = 0; i < b.size(); ++i) err = std::max(err, std::fabs(a[i] - b[i])), scale = std::max(scale, std::fabs(b[i]));
  return err / scale;
}

// The float32 model's bound against the transcription (test_hf_checkpoint.cpp: float32 products and norms at
// 2^-24 relative, measured <= 7e-7 of the largest logit): 5e-6. Two float32 implementations differ by at most
// the sum of their errors: 1e-5.
constexpr double kTolF32 = 5e-6, kTolF32Pair = 1e-5;

// The position mode's name in messages ("rope", "rerope", "leaky_rerope": as the lab's encoding kinds).
inline const char* position_mode_name(PositionMode m) {
  switch (m) {
    case PositionMode::Rope: return "rope";
    case PositionMode::Rerope: return "rerope";
    case PositionMode::LeakyRerope: return "leaky_rerope";
    case PositionMode::None: return "none";
  }
  return "?";
}

// The two windowed methods the chunk tests run beside the checkpoint's own rope: ReRoPE w = 8, Leaky ReRoPE
// w = 6, k = 3.
struct ReropeVariants {
  engine::PositionMethod rerope, leaky;
};
inline ReropeVariants rerope_variants(const engine::PositionMethod& native) {
  ReropeVariants v{native, native};
  v.rerope.mode = PositionMode::Rerope, v.rerope.window = 8;
  v.leaky.mode = PositionMode::LeakyRerope, v.leaky.window = 6, v.leaky.leaky_k = 3;
  return v;
}
// ReRoPE at window w over the checkpoint's own rotation.
inline engine::PositionMethod rerope_at(const engine::PositionMethod& native, int64_t window) {
  engine::PositionMethod p = native;
  p.mode = PositionMode::Rerope, p.window = window;
  return p;
}

// Positions 0 .. S-1.
inline std::vector<int64_t> positions_from_zero(int64_t S) {
  std::vector<int64_t> pos(static_cast<size_t>(S));
  for (int64_t i = 0; i < S; ++i) pos[size_t(i)] = i;
  return pos;
}

// Logits [S * V] from the engine: the first `prompt` tokens as one prompt, the rest one at a time.
inline std::vector<double> engine_logits(const std::shared_ptr<const engine::Model>& model,
                                         const engine::PositionMethod& positions, const std::vector<int64_t>& tokens,
                                         int64_t prompt, DType kv = DType::F32,
                                         std::optional<engine::MemoryOptions> memory = std::nullopt,
                                         int64_t prefill_chunk = engine::SessionOptions{}.prefill_chunk,
                                         bool keep_caches = true, KvStorage kv_storage = KvStorage::Dtype) {
  engine::SessionOptions o;
  o.capacity = int64_t(tokens.size()), o.kv_dtype = kv, o.positions = positions, o.memory = memory;
  o.prefill_chunk = prefill_chunk, o.keep_caches = keep_caches, o.kv_storage = kv_storage;
  engine::Session s(model, o);
  const int64_t S = int64_t(tokens.size()), d = model->arch().d_model, V = model->arch().vocab_size;
  const std::vector<int64_t> pos = positions_from_zero(S);
  std::vector<float> hidden(size_t(S * d)), logits(size_t(S * V));
  s.forward(tokens.data(), pos.data(), prompt, hidden.data());
  for (int64_t t = prompt; t < S; ++t) s.forward(tokens.data() + t, pos.data() + t, 1, hidden.data() + t * d);
  s.logits(hidden.data(), S, logits.data());
  EXPECT_EQ(s.size(), S);
  return std::vector<double>(logits.begin(), logits.end());
}

}  // namespace rotary::test
