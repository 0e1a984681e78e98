// RopeSpec: every scaling type against values computed here, independently of rope_spec.cpp, from the formulas
// of ../shared/reference/position-encodings.md (in long double, with exp/log where the library uses pow),
// properties that tie the types together, and every bad input.
//
// Tolerance: both sides are exact formulas evaluated in >= float64; they differ by a few double roundings
// amplified by at most ln(base) * (exponent <= 1) ~ 20 for the bases used here, so 1e-13 relative.
// (Agreement with Hugging Face's float32 code is tested by tests/cli/test_freqs.sh.)
#include <gtest/gtest.h>

#include <cmath>
#include <numbers>
#include <string>
#include <vector>

#include "expect.h"
#include "rotary/error.h"
#include "rotary/rope_spec.h"

namespace rotary {
namespace {

constexpr double kRel = 1e-13;
using ld = long double;
const ld kPi = std::numbers::pi_v<long double>;

// inv_i = base^(-2i/r) written as exp(-(2i/r) ln base).
std::vector<ld> default_inv(ld base, int r) {
  std::vector<ld> v;
  for (int i = 0; i < r / 2; ++i) v.push_back(std::exp(-(ld(2 * i) / ld(r)) * std::log(base)));
  return v;
}

void expect_near_rel(const std::vector<double>& got, const std::vector<ld>& want, double rel = kRel) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i)
    EXPECT_NEAR(got[i], double(want[i]), rel * std::fabs(double(want[i]))) << "pair " << i;
}

RopeSpec make(int head_dim, double base, RopeScaling scaling, double factor = 1.0) {
  RopeSpec s;
  s.head_dim = head_dim;
  s.base = base;
  s.scaling = scaling;
  s.factor = factor;
  return s;
}

TEST(rope_spec, DefaultMatchesFormulaAndUsesRotaryDimInExponent) {
  RopeSpec s = make(128, 10000.0, RopeScaling::None);
  RopeFreqs f = s.freqs();
  EXPECT_EQ(f.head_dim, 128);
  EXPECT_EQ(f.rotary_dim, 128);
  EXPECT_EQ(f.pairs(), 64);
  EXPECT_EQ(f.attention_factor, 1.0);
  expect_near_rel(f.inv_freq, default_inv(10000.0L, 128));

  // Partial rotation: 32 of 128 features; the exponent is 2i/32, not 2i/128.
  s.rotary_dim = 32;
  f = s.freqs();
  EXPECT_EQ(f.head_dim, 128);
  EXPECT_EQ(f.rotary_dim, 32);
  expect_near_rel(f.inv_freq, default_inv(10000.0L, 32));
  EXPECT_NO_THROW(f.validate());
}

TEST(rope_spec, LinearIsDefaultOverFactor) {
  const RopeFreqs base = make(64, 500000.0, RopeScaling::None).freqs();
  const RopeFreqs lin = make(64, 500000.0, RopeScaling::Linear, 4.0).freqs();
  ASSERT_EQ(lin.inv_freq.size(), base.inv_freq.size());
  for (size_t i = 0; i < base.inv_freq.size(); ++i) EXPECT_DOUBLE_EQ(lin.inv_freq[i], base.inv_freq[i] / 4.0);
  EXPECT_EQ(lin.attention_factor, 1.0);
}

TEST(rope_spec, NtkFixedRaisesTheBase) {
  const int r = 64;
  const ld factor = 8.0L;
  const ld base2 = 10000.0L * std::exp(ld(r) / ld(r - 2) * std::log(factor));
  expect_near_rel(make(r, 10000.0, RopeScaling::NtkFixed, 8.0).freqs().inv_freq, default_inv(base2, r));
}

TEST(rope_spec, NtkMixedDividesPairJByExpAJToTheB) {
  RopeSpec s = make(64, 10000.0, RopeScaling::NtkMixed, 16.0);
  s.ntk_mixed_exponent = 0.75;
  std::vector<ld> want = default_inv(10000.0L, 64);
  const ld a = std::log(16.0L) / std::pow(32.0L, 0.75L);
  for (size_t j = 0; j < want.size(); ++j) want[j] /= std::exp(a * std::pow(ld(j), 0.75L));
  const RopeFreqs f = s.freqs();
  expect_near_rel(f.inv_freq, want);
  EXPECT_EQ(f.inv_freq[0], 1.0);  // lambda_0 = exp(0) = 1: the fastest pair is never scaled
}

TEST(rope_spec, DynamicEqualsDefaultUpToMaxPositionsThenGrowsTheBase) {
  RopeSpec s = make(128, 1000000.0, RopeScaling::Dynamic, 2.0);
  s.max_position_embeddings = 32768;
  const RopeFreqs plain = make(128, 1000000.0, RopeScaling::None).freqs();
  for (int64_t len : {int64_t(0), int64_t(1), int64_t(4096), int64_t(32768)})
    expect_near_rel(s.freqs(len).inv_freq, default_inv(1000000.0L, 128));
  EXPECT_EQ(s.freqs(32768).inv_freq, plain.inv_freq);

  // L = 100000 > 32768: base' = base (f L / M - (f - 1))^(r / (r - 2)).
  const ld scale = 2.0L * 100000.0L / 32768.0L - 1.0L;
  const ld base2 = 1000000.0L * std::exp(ld(128) / ld(126) * std::log(scale));
  expect_near_rel(s.freqs(100000).inv_freq, default_inv(base2, 128));
  // ... which is fixed NTK with factor f L / M - (f - 1).
  const std::vector<double> ntk = make(128, 1000000.0, RopeScaling::NtkFixed, double(scale)).freqs().inv_freq;
  expect_near_rel(s.freqs(100000).inv_freq, std::vector<ld>(ntk.begin(), ntk.end()), 1e-14);
  EXPECT_EQ(s.freqs(100000).attention_factor, 1.0);
}

// YaRN written out from position-encodings.md.
struct YarnWant {
  std::vector<ld> inv;
  ld low, high;
};
YarnWant yarn_want(ld base, int r, ld factor, ld l_orig, ld beta_fast, ld beta_slow, bool truncate) {
  auto corr = [&](ld n) { return ld(r) * std::log(l_orig / (2 * kPi * n)) / (2 * std::log(base)); };
  ld low = corr(beta_fast), high = corr(beta_slow);
  if (truncate) {
    low = std::floor(low);
    high = std::ceil(high);
  }
  low = std::max<ld>(low, 0);
  high = std::min<ld>(high, ld(r - 1));
  if (low == high) high += 0.001L;
  YarnWant w{default_inv(base, r), low, high};
  for (size_t j = 0; j < w.inv.size(); ++j) {
    const ld ramp = std::clamp((ld(j) - low) / (high - low), ld(0), ld(1));
    const ld m = 1 - ramp;
    w.inv[j] = (w.inv[j] / factor) * (1 - m) + w.inv[j] * m;
  }
  return w;
}

TEST(rope_spec, YarnMatchesTheRampFormula) {
  RopeSpec s = make(128, 1000000.0, RopeScaling::Yarn, 4.0);
  s.max_position_embeddings = 131072;
  s.original_max_position_embeddings = 32768;
  const YarnWant w = yarn_want(1000000.0L, 128, 4.0L, 32768.0L, 32.0L, 1.0L, true);
  const RopeFreqs f = s.freqs();
  expect_near_rel(f.inv_freq, w.inv);
  EXPECT_NEAR(f.attention_factor, 0.1 * std::log(4.0) + 1.0, 1e-15);
  // Pairs below the ramp keep their frequency, pairs above it are divided by the factor.
  const std::vector<ld> plain = default_inv(1000000.0L, 128);
  ASSERT_GT(w.low, 1.0L);
  ASSERT_LT(w.high, 63.0L);
  EXPECT_NEAR(f.inv_freq[0], double(plain[0]), 1e-15);
  EXPECT_NEAR(f.inv_freq[63], double(plain[63] / 4), 1e-13 * double(plain[63]));
}

TEST(rope_spec, YarnUsesMaxPositionsWhenNoOriginalIsGiven) {
  RopeSpec s = make(64, 10000.0, RopeScaling::Yarn, 8.0);
  s.max_position_embeddings = 4096;
  expect_near_rel(s.freqs().inv_freq, yarn_want(10000.0L, 64, 8.0L, 4096.0L, 32.0L, 1.0L, true).inv);
}

TEST(rope_spec, YarnWithoutTruncationKeepsTheRangeFractional) {
  RopeSpec s = make(64, 150000.0, RopeScaling::Yarn, 32.0);
  s.original_max_position_embeddings = 4096;
  s.yarn.truncate = false;
  const YarnWant w = yarn_want(150000.0L, 64, 32.0L, 4096.0L, 32.0L, 1.0L, false);
  ASSERT_NE(w.low, std::floor(w.low));  // the case really is fractional
  expect_near_rel(s.freqs().inv_freq, w.inv);
  const std::vector<double> unrounded = s.freqs().inv_freq;
  s.yarn.truncate = true;
  EXPECT_NE(s.freqs().inv_freq, unrounded);
  expect_near_rel(s.freqs().inv_freq, yarn_want(150000.0L, 64, 32.0L, 4096.0L, 32.0L, 1.0L, true).inv);
}

TEST(rope_spec, YarnWithFactorOneIsDefault) {
  RopeSpec s = make(128, 10000.0, RopeScaling::Yarn, 1.0);
  s.original_max_position_embeddings = 4096;
  const RopeFreqs f = s.freqs();
  expect_near_rel(f.inv_freq, default_inv(10000.0L, 128), 1e-13);
  EXPECT_EQ(f.attention_factor, 1.0);  // get_mscale(1) = 1
}

TEST(rope_spec, YarnAttentionFactorFromMscalesOrOverride) {
  RopeSpec s = make(64, 10000.0, RopeScaling::Yarn, 40.0);
  s.max_position_embeddings = 163840;
  s.original_max_position_embeddings = 4096;
  s.yarn.mscale = 0.707;
  s.yarn.mscale_all_dim = 1.0;
  const double want = (0.1 * 0.707 * std::log(40.0) + 1.0) / (0.1 * 1.0 * std::log(40.0) + 1.0);
  EXPECT_NEAR(s.freqs().attention_factor, want, 1e-15);
  s.yarn.mscale_all_dim = 0.707;  // DeepSeek-V2/V3 give equal mscales: the ratio is 1
  EXPECT_NEAR(s.freqs().attention_factor, 1.0, 1e-15);
  s.yarn.mscale_all_dim.reset();  // only one of them: the plain 0.1 ln(f) + 1
  EXPECT_NEAR(s.freqs().attention_factor, 0.1 * std::log(40.0) + 1.0, 1e-15);
  s.attention_factor = 1.25;
  EXPECT_EQ(s.freqs().attention_factor, 1.25);
}

TEST(rope_spec, YarnWithRangeCollapsedOnTheLastIndexKeepsEveryPair) {
  // l_orig so large that corr(beta_fast) lands in [r-1, r): low = high = r-1, and HF adds 0.001 to high.
  RopeSpec s = make(8, 10000.0, RopeScaling::Yarn, 4.0);
  const ld base = 10000.0L;
  const ld target = 7.5L;  // corr(32) = 8 ln(L / (64 pi)) / (2 ln base) = 7.5
  s.original_max_position_embeddings = int64_t(std::llround(64 * kPi * std::exp(target * 2 * std::log(base) / 8)));
  const YarnWant w = yarn_want(base, 8, 4.0L, ld(s.original_max_position_embeddings), 32.0L, 1.0L, true);
  ASSERT_EQ(w.low, 7.0L);
  ASSERT_NEAR(double(w.high), 7.001, 1e-12);
  expect_near_rel(s.freqs().inv_freq, default_inv(base, 8));
}

TEST(rope_spec, Llama3KeepsHighFrequenciesDividesLowOnesAndBlendsBetween) {
  RopeSpec s = make(128, 500000.0, RopeScaling::Llama3, 8.0);
  s.max_position_embeddings = 131072;
  s.original_max_position_embeddings = 8192;
  s.llama3 = {1.0, 4.0};
  const RopeFreqs f = s.freqs();
  const std::vector<ld> plain = default_inv(500000.0L, 128);
  int high = 0, low = 0, mid = 0;
  for (size_t i = 0; i < plain.size(); ++i) {
    const ld wavelen = 2 * kPi / plain[i];
    ld want;
    if (wavelen < 8192.0L / 4) {
      want = plain[i];
      ++high;
    } else if (wavelen > 8192.0L / 1) {
      want = plain[i] / 8;
      ++low;
    } else {
      const ld smooth = (8192.0L / wavelen - 1) / (4 - 1);
      want = (1 - smooth) * plain[i] / 8 + smooth * plain[i];
      ++mid;
    }
    EXPECT_NEAR(f.inv_freq[i], double(want), kRel * double(want)) << "pair " << i;
  }
  EXPECT_GT(high, 0);
  EXPECT_GT(low, 0);
  EXPECT_GT(mid, 0);
  EXPECT_EQ(f.attention_factor, 1.0);
}

TEST(rope_spec, LongRopePicksShortOrLongFactorsBySeqLen) {
  RopeSpec s = make(96, 10000.0, RopeScaling::LongRope, 32.0);
  s.max_position_embeddings = 131072;
  s.original_max_position_embeddings = 4096;
  for (int j = 0; j < 48; ++j) {
    s.short_factor.push_back(1.0 + 0.05 * j);
    s.long_factor.push_back(1.0 + 1.3 * j);
  }
  auto want_with = [&](const std::vector<double>& ext) {
    std::vector<ld> w = default_inv(10000.0L, 96);
    for (size_t j = 0; j < w.size(); ++j) w[j] /= ld(ext[j]);
    return w;
  };
  for (int64_t len : {int64_t(0), int64_t(1), int64_t(4096)}) expect_near_rel(s.freqs(len).inv_freq, want_with(s.short_factor));
  for (int64_t len : {int64_t(4097), int64_t(131072), int64_t(1000000)})
    expect_near_rel(s.freqs(len).inv_freq, want_with(s.long_factor));
  const double want_att = std::sqrt(1.0 + std::log(32.0) / std::log(4096.0));
  EXPECT_NEAR(s.freqs().attention_factor, want_att, 1e-15);
  EXPECT_NEAR(s.freqs(5000).attention_factor, want_att, 1e-15);
  s.factor = 1.0;
  EXPECT_EQ(s.freqs().attention_factor, 1.0);
  s.attention_factor = 1.5;
  EXPECT_EQ(s.freqs().attention_factor, 1.5);
}

TEST(rope_spec, ExplicitDividesByTheGivenFactors) {
  RopeSpec s = make(16, 10000.0, RopeScaling::Explicit);
  s.freq_factors = {1, 2, 3, 4, 5, 6, 7, 8};
  std::vector<ld> want = default_inv(10000.0L, 16);
  for (size_t j = 0; j < want.size(); ++j) want[j] /= ld(j + 1);
  expect_near_rel(s.freqs().inv_freq, want);
}

TEST(rope_spec, NamesRoundTripAndAcceptHuggingFaceAliases) {
  for (RopeScaling t : {RopeScaling::None, RopeScaling::Linear, RopeScaling::NtkFixed, RopeScaling::NtkMixed,
                        RopeScaling::Dynamic, RopeScaling::Yarn, RopeScaling::Llama3, RopeScaling::LongRope,
                        RopeScaling::Explicit})
    EXPECT_EQ(parse_scaling(scaling_name(t)), t);
  EXPECT_EQ(parse_scaling("default"), RopeScaling::None);
  EXPECT_EQ(parse_scaling("su"), RopeScaling::LongRope);
  EXPECT_EQ(parse_scaling("ntk"), RopeScaling::NtkFixed);
  EXPECT_EQ(parse_scaling("NTK-Mixed"), RopeScaling::NtkMixed);
  for (RopeLayout l : {RopeLayout::Interleaved, RopeLayout::HalfSplit}) EXPECT_EQ(parse_layout(layout_name(l)), l);
  EXPECT_EQ(parse_layout("neox"), RopeLayout::HalfSplit);
  EXPECT_EQ(parse_layout("gptj"), RopeLayout::Interleaved);
  test::expect_error([] { parse_scaling("ntk-by-parts"); }, "scaling");
  test::expect_error([] { parse_scaling("ntk-by-parts"); }, "yarn");  // the choices are listed
  test::expect_error([] { parse_layout("diagonal"); }, "half_split");
}

TEST(rope_spec, DescribeNamesTheTypeAndItsParameters) {
  RopeSpec s = make(128, 1000000.0, RopeScaling::Yarn, 4.0);
  s.original_max_position_embeddings = 32768;
  const std::string d = s.describe();
  EXPECT_EQ(d.rfind("rope(d=128, r=128, base=1000000, half_split, yarn(factor=4", 0), 0u) << d;
  EXPECT_NE(d.find("orig_max_pos=32768"), std::string::npos) << d;
  EXPECT_EQ(make(64, 10000.0, RopeScaling::None).describe(), "rope(d=64, r=64, base=10000, half_split, none)");
}

TEST(rope_spec, BadInputNamesTheField) {
  auto bad = [](auto edit, const std::string& field) {
    RopeSpec s = make(64, 10000.0, RopeScaling::None);
    edit(s);
    test::expect_error([&] { s.validate(); }, field);
    test::expect_error([&] { s.freqs(); }, field);
  };
  bad([](RopeSpec& s) { s.head_dim = 1; }, "head_dim");
  bad([](RopeSpec& s) { s.head_dim = 65; }, "head_dim");  // odd, all features rotating
  bad([](RopeSpec& s) { s.rotary_dim = 7; }, "rotary_dim");
  bad([](RopeSpec& s) { s.rotary_dim = 66; }, "rotary_dim");
  bad([](RopeSpec& s) { s.rotary_dim = -2; }, "rotary_dim");
  bad([](RopeSpec& s) { s.base = 0; }, "base");
  bad([](RopeSpec& s) { s.base = -10000; }, "base");
  bad([](RopeSpec& s) { s.base = NAN; }, "base");
  bad([](RopeSpec& s) { s.base = INFINITY; }, "base");
  bad([](RopeSpec& s) { s.max_position_embeddings = -1; }, "max_position_embeddings");
  bad([](RopeSpec& s) { s.attention_factor = 0.0; }, "attention_factor");
  bad([](RopeSpec& s) { s.scaling = RopeScaling::Linear, s.factor = 0; }, "factor");
  bad([](RopeSpec& s) { s.scaling = RopeScaling::Linear, s.factor = 0.5; }, "factor");  // HF requires >= 1
  bad([](RopeSpec& s) { s.scaling = RopeScaling::Linear, s.factor = NAN; }, "factor");
  bad([](RopeSpec& s) { s.scaling = RopeScaling::NtkFixed, s.factor = -2; }, "factor");
  bad([](RopeSpec& s) { s.scaling = RopeScaling::NtkFixed, s.rotary_dim = 2; }, "rotary_dim");
  bad([](RopeSpec& s) { s.scaling = RopeScaling::NtkMixed, s.factor = 2, s.ntk_mixed_exponent = 0; },
      "ntk_mixed_exponent");
  bad([](RopeSpec& s) { s.scaling = RopeScaling::Dynamic, s.factor = 2; }, "max_position_embeddings");
  bad([](RopeSpec& s) { s.scaling = RopeScaling::Dynamic, s.factor = 2, s.max_position_embeddings = 4096,
                        s.rotary_dim = 2; }, "rotary_dim");
  bad([](RopeSpec& s) { s.scaling = RopeScaling::Yarn, s.factor = 4; }, "original_max_position_embeddings");
  auto yarn = [](RopeSpec& s) { s.scaling = RopeScaling::Yarn, s.factor = 4, s.original_max_position_embeddings = 4096; };
  bad([&](RopeSpec& s) { yarn(s), s.yarn.beta_fast = 1, s.yarn.beta_slow = 1; }, "beta_fast");
  bad([&](RopeSpec& s) { yarn(s), s.yarn.beta_fast = 0.5; }, "beta_fast");
  bad([&](RopeSpec& s) { yarn(s), s.yarn.beta_slow = 0; }, "beta_slow");
  bad([&](RopeSpec& s) { yarn(s), s.yarn.mscale = -1.0; }, "mscale");
  bad([&](RopeSpec& s) { yarn(s), s.yarn.mscale_all_dim = 0.0; }, "mscale_all_dim");
  bad([&](RopeSpec& s) { yarn(s), s.base = 1.0; }, "base");  // ln(base) divides
  bad([&](RopeSpec& s) { yarn(s), s.factor = 0.9; }, "factor");
  auto llama3 = [](RopeSpec& s) { s.scaling = RopeScaling::Llama3, s.factor = 8, s.original_max_position_embeddings = 8192; };
  bad([&](RopeSpec& s) { llama3(s), s.llama3 = {4.0, 4.0}; }, "high_freq_factor");
  bad([&](RopeSpec& s) { llama3(s), s.llama3 = {4.0, 1.0}; }, "high_freq_factor");
  bad([&](RopeSpec& s) { llama3(s), s.llama3 = {0.0, 4.0}; }, "low_freq_factor");
  bad([&](RopeSpec& s) { llama3(s), s.original_max_position_embeddings = 0; }, "original_max_position_embeddings");
  auto longrope = [](RopeSpec& s) {
    s.scaling = RopeScaling::LongRope, s.factor = 32, s.original_max_position_embeddings = 4096;
    s.short_factor.assign(32, 1.0), s.long_factor.assign(32, 2.0);
  };
  bad([&](RopeSpec& s) { longrope(s), s.short_factor.resize(31); }, "short_factor");
  bad([&](RopeSpec& s) { longrope(s), s.long_factor.resize(64, 1.0); }, "long_factor");
  bad([&](RopeSpec& s) { longrope(s), s.long_factor[5] = 0.0; }, "long_factor[5]");
  bad([&](RopeSpec& s) { longrope(s), s.short_factor[0] = NAN; }, "short_factor[0]");
  bad([&](RopeSpec& s) { longrope(s), s.original_max_position_embeddings = 0; }, "original_max_position_embeddings");
  bad([](RopeSpec& s) { s.scaling = RopeScaling::Explicit, s.freq_factors.assign(31, 1.0); }, "freq_factors");
  bad([](RopeSpec& s) { s.scaling = RopeScaling::Explicit, s.freq_factors.assign(32, -1.0); }, "freq_factors[0]");
  bad([](RopeSpec& s) { s.scaling = RopeScaling(42); }, "scaling");

  RopeSpec ok = make(64, 10000.0, RopeScaling::None);
  test::expect_error([&] { ok.freqs(-1); }, "seq_len");
}

// Parameters each in range whose frequencies overflow (found by fuzz_hf_config): freqs() refuses them naming the
// parameter, never hands back an inf frequency or attention factor (NaN angles downstream).
TEST(rope_spec, FrequenciesThatOverflowNameTheParameter) {
  auto overflows = [](auto edit, int64_t seq_len, const std::string& field) {
    RopeSpec s = make(64, 10000.0, RopeScaling::None);
    edit(s);
    EXPECT_NO_THROW(s.validate());  // every field is in its own range
    test::expect_error([&] { s.freqs(seq_len); }, {field, "finite"});
  };
  // base^(-2i/r) for i = r/2 - 1 at r = 4096: base^(-0.9995); 1e-310 overflows it, 1e-300 does not.
  overflows([](RopeSpec& s) { s.head_dim = 4096, s.base = 1e-310; }, 0, "base");
  RopeSpec small_base = make(4096, 1e-300, RopeScaling::None);
  EXPECT_NO_THROW(small_base.freqs().validate());
  overflows([](RopeSpec& s) { s.scaling = RopeScaling::NtkFixed, s.factor = 1e-300, s.base = 1e-10; }, 0, "factor");
  // inv_31 / exp(ln(1e-320) * 31 / 32) = 1 / 1e-310 at base 1.
  overflows([](RopeSpec& s) { s.scaling = RopeScaling::NtkMixed, s.base = 1.0, s.factor = 1e-320, s.ntk_mixed_exponent = 1.0; },
            0, "factor");
  auto yarn = [](RopeSpec& s) { s.scaling = RopeScaling::Yarn, s.factor = 1e300, s.original_max_position_embeddings = 4096; };
  overflows([&](RopeSpec& s) { yarn(s), s.yarn.mscale = 1e307, s.yarn.mscale_all_dim = 1.0; }, 0, "yarn.mscale");
  overflows([&](RopeSpec& s) { yarn(s), s.yarn.mscale = 1.0, s.yarn.mscale_all_dim = 1e307; }, 0,
            "yarn.mscale_all_dim");
  auto longrope = [](RopeSpec& s) {
    s.scaling = RopeScaling::LongRope, s.factor = 32, s.original_max_position_embeddings = 4096;
    s.short_factor.assign(32, 1.0), s.long_factor.assign(32, 2.0);
  };
  overflows([&](RopeSpec& s) { longrope(s), s.short_factor[0] = 1e-320; }, 0, "short_factor[0]");
  overflows([&](RopeSpec& s) { longrope(s), s.long_factor[0] = 1e-320; }, 4097, "long_factor[0]");
  RopeSpec unused_list_tiny = make(64, 10000.0, RopeScaling::None);
  longrope(unused_list_tiny);
  unused_list_tiny.long_factor[0] = 1e-320;  // taken only past the original context
  EXPECT_NO_THROW(unused_list_tiny.freqs(4096).validate());
  overflows([](RopeSpec& s) { s.scaling = RopeScaling::Explicit, s.freq_factors.assign(32, 1.0), s.freq_factors[3] = 1e-320; },
            0, "freq_factors[3]");
}

TEST(rope_spec, ErrorMessagesSayValueAndWhatIsAllowed) {
  RopeSpec s = make(64, 10000.0, RopeScaling::None);
  s.rotary_dim = 7;
  try {
    s.validate();
    FAIL() << "no error";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("rotary_dim = 7"), std::string::npos) << m;
    EXPECT_NE(m.find("allowed"), std::string::npos) << m;
    EXPECT_NE(m.find("even"), std::string::npos) << m;
  }
}

}  // namespace
}  // namespace rotary
