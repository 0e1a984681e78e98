// The "decode" op cases: a decode step over a KvCache (attention_decode, the library's float64
// attention_decode_reference and the re-rotating baseline) equals the oracle's last row of the prefill, for every
// position mode (None, Rope, Rerope, LeakyRerope; log-n; RoPER; attention factor; partial rotation; both
// layouts), every storage dtype and SIMD target; GQA/MQA and odd head dims; appends in pieces; split-K across
// threads over long caches; a strided o; NaN/Inf in one key, value or query head. Q8 caches (KvStorage::Q8) are
// checked against the library's float64 reference over the same cache - attention over the rows as stored - since
// the quantization itself is test_decode.cpp's (each stored element within half its block's scale); Leaky ones,
// whose far copies the reference does not read, against the oracle within q8's rounding (ToleranceInputs::q8).
#include "cases_decode.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <random>
#include <tuple>

namespace rotary::test {

std::string describe(const DecodeSpec& c) {
  const char* modes[] = {"none", "rope", "rerope", "leaky"};
  return std::string(modes[int(c.mode)]) + " " + dtype_name(c.dtype) +
         (c.layout == RopeLayout::Interleaved ? " interleaved" : " half") + " D=" + std::to_string(c.D) +
         " r=" + std::to_string(c.rotary_dim) + " Hq=" + std::to_string(c.Hq) + " Hkv=" + std::to_string(c.Hkv) +
         " n=" + std::to_string(c.n) + (c.roper ? " roper" : "") + (c.logn ? " logn" : "") +
         " a=" + std::to_string(c.attention_factor);
}

RopeFreqs make_freqs(const DecodeSpec& c) {
  RopeSpec spec;
  spec.head_dim = c.D;
  spec.rotary_dim = c.rotary_dim;
  spec.base = 10000.0;
  spec.layout = c.layout;
  RopeFreqs f = spec.freqs();
  f.attention_factor = c.attention_factor;
  return f;
}

PositionParams make_pos(const DecodeSpec& c, const RopeFreqs* f) {
  PositionParams pp;
  pp.mode = c.mode;
  pp.freqs = c.mode == PositionMode::None ? nullptr : f;
  pp.roper = c.roper;
  pp.window = c.window;
  pp.leaky_k = c.leaky_k;
  pp.logn_train_len = c.logn;
  return pp;
}

std::vector<int64_t> make_positions(int64_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<int64_t> pos(static_cast<size_t>(n));
  int64_t p = 2;
  for (auto& x : pos) x = (p += 1 + int64_t(rng() % 3));
  return pos;
}

std::vector<double> turn(const RopeFreqs& f, const std::vector<double>& x, double angle, double factor) {
  std::vector<double> y(x);
  const int r = f.rotary_dim;
  for (int i = 0; i < r / 2; ++i) {
    const int a = f.layout == RopeLayout::Interleaved ? 2 * i : i;
    const int b = f.layout == RopeLayout::Interleaved ? 2 * i + 1 : i + r / 2;
    const double c = std::cos(angle * f.inv_freq[size_t(i)]) * factor,
                 s = std::sin(angle * f.inv_freq[size_t(i)]) * factor;
    y[size_t(a)] = x[size_t(a)] * c - x[size_t(b)] * s;
    y[size_t(b)] = x[size_t(a)] * s + x[size_t(b)] * c;
  }
  return y;
}

static double dot(const std::vector<double>& a, const std::vector<double>& b) {
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i) s += a[i] * b[i];
  return s;
}

std::vector<double> DecodeRows::row(const GuardedBuffer& b, int64_t index, int D) const {
  std::vector<double> x(static_cast<size_t>(D));
  for (int d = 0; d < D; ++d) x[size_t(d)] = b.get(index * D + d);
  return x;
}

void decode_oracle(const PositionParams& pp, int D, int64_t Hq, int64_t Hkv, const DecodeRows& rows, const int64_t* pos,
                   int64_t n, int64_t q_pos, double scale, std::vector<double>& o, std::vector<double>& lse) {
  o.assign(size_t(Hq * D), 0.0);
  lse.assign(size_t(Hq), 0.0);
  const RopeFreqs* f = pp.freqs;
  const double a = f ? f->attention_factor : 1.0, w = double(pp.window), kk = pp.leaky_k;
  const bool clipped = pp.mode == PositionMode::Rerope || pp.mode == PositionMode::LeakyRerope;
  for (int64_t h = 0; h < Hq; ++h) {
    const int64_t g = h / (Hq / Hkv);
    std::vector<double> q = rows.row(rows.q, h, D);
    double lam = scale;
    if (pp.logn_train_len > 1) lam *= std::max(1.0, std::log(double(q_pos) + 1) / std::log(double(pp.logn_train_len)));
    for (double& x : q) x *= lam;
    std::vector<double> s(static_cast<size_t>(n)), delta(static_cast<size_t>(n));
    for (int64_t j = 0; j < n; ++j) {
      const std::vector<double> k = rows.row(rows.k, j * Hkv + g, D);
      const double d = double(q_pos - pos[j]);
      delta[size_t(j)] = d;
      if (pp.mode == PositionMode::None) {
        s[size_t(j)] = dot(q, k);
      } else if (!clipped || d < w) {
        s[size_t(j)] = dot(turn(*f, q, double(q_pos), a), turn(*f, k, double(pos[j]), a));
      } else if (pp.mode == PositionMode::Rerope) {
        s[size_t(j)] = dot(turn(*f, q, w, a * a), k);
        delta[size_t(j)] = w;
      } else {
        s[size_t(j)] = dot(turn(*f, q, (double(q_pos) - w) / kk + w, a), turn(*f, k, double(pos[j]) / kk, a));
        delta[size_t(j)] = w + (d - w) / kk;
      }
    }
    const double mx = *std::max_element(s.begin(), s.end());
    double sum = 0;
    for (double x : s) sum += std::exp(x - mx);
    for (int64_t j = 0; j < n; ++j) {
      std::vector<double> v = rows.row(rows.v, j * Hkv + g, D);
      if (pp.roper) v = turn(*f, v, -delta[size_t(j)], 1.0);
      const double p = std::exp(s[size_t(j)] - mx) / sum;
      for (int d = 0; d < D; ++d) o[size_t(h * D + d)] += p * v[size_t(d)];
    }
    lse[size_t(h)] = mx + std::log(sum);
  }
}


namespace {

enum class DecodeEngine { Kernel, LibraryReference, RerotateBaseline };

struct DecodeCaseSpec {
  std::string label;
  DecodeSpec c;
  DecodeEngine engine = DecodeEngine::Kernel;
  int64_t piece = 0;  // > 0: the cache filled by appends of this many tokens
  int threads = 0;
  int64_t split = 0;      // DecodeParams::split_keys
  bool o_padded = false;  // o through a strided view (padding between heads, after the sequence)
  bool poison = false;    // in the non-finite modes
  bool q8 = false;        // the cache stores q8 blocks (KvStorage::Q8); kernel only, against the library reference
};

class DecodeCase : public OpCase {
 public:
  explicit DecodeCase(DecodeCaseSpec s) : s_(std::move(s)) {}
  std::string op() const override { return "decode"; }
  std::string name() const override {
    static const char* engines[] = {"kernel", "library_reference", "rerotate_baseline"};
    std::string n = s_.label + " " + describe(s_.c) + " " + engines[int(s_.engine)];
    if (s_.piece) n += " piece" + std::to_string(s_.piece);
    if (s_.threads) n += " threads" + std::to_string(s_.threads);
    if (s_.split) n += " split" + std::to_string(s_.split);
    if (s_.o_padded) n += " o_padded";
    if (s_.q8) n += " q8";
    return identifier(n);
  }

  void setup() override {
    const DecodeSpec& c = s_.c;
    f_ = make_freqs(c);
    pp_ = make_pos(c, &f_);
    rows_ = std::make_unique<DecodeRows>(c.dtype, c.Hq, c.Hkv, c.n, c.D);
    fill_uniform(rows_->q, c.seed * 3 + 0);
    fill_uniform(rows_->k, c.seed * 3 + 1);
    fill_uniform(rows_->v, c.seed * 3 + 2);
    pos_ = make_positions(c.n, c.seed);
    q_pos_ = pos_.back() + c.q_gap;
    // The baseline takes the default scale (1/sqrt(D)); the others an explicit one.
    scale_ = s_.engine == DecodeEngine::RerotateBaseline ? 1 / std::sqrt(double(c.D)) : 1.1 / std::sqrt(double(c.D));
    fill_cache();
  }
  void release() override { rows_.reset(), cache_.reset(), o_.reset(), lse_.reset(); }

  void run_reference() override {
    if (against_library_reference()) {  // attention over the stored rows, in float64
      const DecodeSpec& c = s_.c;
      GuardedBuffer o(c.dtype, c.Hq * c.D), lse(DType::F32, c.Hq);
      DecodeParams p;
      p.q = token_view(rows_->q, c.Hq, c.D), p.o = token_view(o, c.Hq, c.D), p.lse = lse.data();
      p.q_positions = &q_pos_, p.softmax_scale = scale_;
      attention_decode_reference(*cache_, p);
      o_ref_ = o.to_double(), lse_ref_ = lse.to_double();
      return;
    }
    decode_oracle(pp_, s_.c.D, s_.c.Hq, s_.c.Hkv, *rows_, pos_.data(), s_.c.n, q_pos_, scale_, o_ref_, lse_ref_);
  }
  void run_fast() override {
    const DecodeSpec& c = s_.c;
    const int64_t hs = s_.o_padded ? c.D + 5 : c.D;
    o_ = std::make_unique<WatchedBuffer>("o", c.dtype, c.Hq * hs + (s_.o_padded ? 3 : 0));
    for (int64_t i = 0; i < o_->size(); ++i) o_->set(i, 7.0);  // what must stay outside the view
    o_view_ = {o_->data(), c.Hq, c.Hq * hs + (s_.o_padded ? 3 : 0), hs};
    o_->allow_writes(o_view_, 1, c.D);
    o_->snapshot();
    lse_ = std::make_unique<GuardedBuffer>(c.dtype == DType::F64 ? DType::F64 : DType::F32, c.Hq);
    DecodeParams p;
    p.q = token_view(rows_->q, c.Hq, c.D);
    p.o = o_view_;
    p.threads = s_.threads;
    p.split_keys = s_.split;
    if (s_.engine == DecodeEngine::RerotateBaseline) {  // q_positions null: the last cached position
      attention_decode_rerotate_baseline(*cache_, p, scratch_);
      return;
    }
    p.lse = lse_->data();
    p.q_positions = &q_pos_;
    p.softmax_scale = scale_;
    if (s_.engine == DecodeEngine::Kernel) attention_decode(*cache_, p);
    else attention_decode_reference(*cache_, p);
  }
  std::vector<Output> outputs() const override {
    const ToleranceInputs in{.dtype = s_.c.dtype, .max_position = q_pos_, .q8 = s_.q8 && !against_library_reference()};
    std::vector<Output> out{{"o", o_->gather(o_view_, 1, s_.c.D), o_ref_, tolerance(Quantity::DecodeOutput, in)}};
    if (s_.engine != DecodeEngine::RerotateBaseline)
      out.push_back({"lse", lse_->to_double(), lse_ref_, tolerance(Quantity::DecodeLse, in)});
    return out;
  }
  std::string memory_violations() const override {
    if (std::string v = o_->violations(); !v.empty()) return v;
    return lse_->guards_intact() ? "" : "lse: a guard zone was overwritten";
  }

  // NaN: one cached key far from and one near the query (kv head 1), one query head. Inf: one value (parity).
  std::vector<PoisonSite> poison_sites(NonFinite kind) const override {
    if (!s_.poison) return {};
    if (kind == NonFinite::Inf) return {{"v", 5, 1, 3}, {"v", s_.c.n - 2, 0, 0}};
    return {{"k", 5, 1, 3}, {"k", s_.c.n - 2, 1, 3}, {"q", 0, 2, 7}};
  }
  void poison(const PoisonSite& s, double value) override {
    const DecodeSpec& c = s_.c;
    if (s.input == "q") {
      rows_->q.set(s.head * c.D + s.feature, value);
      return;
    }
    GuardedBuffer& b = s.input == "k" ? rows_->k : rows_->v;
    b.set((s.token * c.Hkv + s.head) * c.D + s.feature, value);
    fill_cache();
  }
  // A NaN in a key reaches exactly the query heads of its kv group (no silent drop by the exp), through every
  // chunk of a split; a NaN in one query head reaches only that head; all features and lse of those heads.
  std::optional<std::vector<char>> expected_nonfinite(const PoisonSite& s, NonFinite kind,
                                                      const std::string& output) const override {
    if (kind != NonFinite::NaN) return std::nullopt;
    const int64_t group = s_.c.Hq / s_.c.Hkv;
    std::vector<char> m;
    for (int64_t h = 0; h < s_.c.Hq; ++h) {
      const bool sees = s.input == "q" ? h == s.head : h / group == s.head;
      m.insert(m.end(), output == "o" ? size_t(s_.c.D) : 1, sees);
    }
    return m;
  }

  PerfCost cost() const override {
    const DecodeSpec& c = s_.c;
    // Every cached key and value read once; 4 D flops per (query head, key).
    const double element = s_.q8 ? 1.125 : double(dtype_size(c.dtype));  // q8: a float scale per 32
    return {double(2 * c.n * c.Hkv * c.D) * element, 4.0 * double(c.n * c.Hq * c.D)};
  }

 private:
  // A q8 cache's rows as stored are what the library's reference reads, except Leaky's far copies (it scores far
  // keys from the plain ones): a Leaky q8 cache is checked against the oracle, within q8's own rounding.
  bool against_library_reference() const { return s_.q8 && s_.c.mode != PositionMode::LeakyRerope; }

  // Fills a cache with the n tokens (all appended at once, or in pieces).
  void fill_cache() {
    const DecodeSpec& c = s_.c;
    KvCacheConfig config{c.n, c.Hkv, c.D, c.dtype, pp_};
    config.storage = s_.q8 ? KvStorage::Q8 : KvStorage::Dtype;
    cache_ = std::make_unique<KvCache>(config);
    const int64_t step = s_.piece > 0 ? s_.piece : c.n;
    for (int64_t t = 0; t < c.n; t += step) {
      const int64_t m = std::min(step, c.n - t);
      const int64_t off = t * c.Hkv * c.D * int64_t(dtype_size(c.dtype));
      HeadsView kv{static_cast<uint8_t*>(rows_->k.data()) + off, c.Hkv, c.Hkv * c.D, c.D};
      HeadsView vv{static_cast<uint8_t*>(rows_->v.data()) + off, c.Hkv, c.Hkv * c.D, c.D};
      cache_->append(m, kv, vv, pos_.data() + t);
    }
  }

  DecodeCaseSpec s_;
  RopeFreqs f_;
  PositionParams pp_;
  std::unique_ptr<DecodeRows> rows_;
  std::vector<int64_t> pos_;
  int64_t q_pos_ = 0;
  double scale_ = 0;
  std::unique_ptr<KvCache> cache_;
  std::unique_ptr<WatchedBuffer> o_;
  std::unique_ptr<GuardedBuffer> lse_;
  HeadsView o_view_;
  std::vector<double> o_ref_, lse_ref_;
  std::vector<float> scratch_;
};

}  // namespace

OpCases decode_cases() {
  OpCases cases;
  // The kernel and the library's float64 reference, each against the oracle.
  auto add_both = [&](DecodeCaseSpec s) {
    for (DecodeEngine e : {DecodeEngine::Kernel, DecodeEngine::LibraryReference}) {
      s.engine = e;
      cases.push_back(std::make_unique<DecodeCase>(s));
    }
  };

  // The kernel on a q8 cache (KvStorage::Q8) against the library's reference over it (DecodeCase).
  auto add_q8 = [&](DecodeCaseSpec s) {
    s.q8 = true, s.engine = DecodeEngine::Kernel, s.label = "q8_" + s.label;
    cases.push_back(std::make_unique<DecodeCase>(s));
  };
  // Every mode x dtype; then partial rotation, log-n, attention factor, RoPER, MQA and a q gap. (Seeds from
  // `seed` and `seed` + 90.)
  auto add_modes = [&](std::initializer_list<DType> dtypes, const std::function<void(DecodeCaseSpec)>& add,
                       uint64_t seed) {
    uint64_t count = 0;
    for (PositionMode mode : {PositionMode::None, PositionMode::Rope, PositionMode::Rerope, PositionMode::LeakyRerope})
      for (DType t : dtypes) {
        DecodeCaseSpec s;
        s.label = "modes";
        s.c.mode = mode, s.c.dtype = t, s.c.seed = seed + count++;
        add(s);
        if (mode == PositionMode::None) continue;
        DecodeSpec& c = s.c;
        c.layout = RopeLayout::Interleaved, c.D = 48, c.rotary_dim = 20, c.logn = 16, c.attention_factor = 1.25;
        c.roper = true, c.Hq = 3, c.Hkv = 1, c.q_gap = 3, c.seed = seed + 90 + count++;
        add(s);
      }
  };
  add_modes({DType::F32, DType::BF16, DType::F16, DType::F64}, add_both, 10);

  // MHA, GQA, MQA and odd head dims / rotary dims.
  for (auto [Hq, Hkv, D, r] : std::vector<std::tuple<int64_t, int64_t, int, int>>{
           {4, 4, 16, 16}, {8, 2, 40, 40}, {6, 1, 70, 64}, {2, 2, 130, 128}, {5, 5, 18, 2}})
    for (PositionMode mode : {PositionMode::Rope, PositionMode::Rerope, PositionMode::LeakyRerope}) {
      DecodeCaseSpec s;
      s.label = "heads";
      s.c.mode = mode, s.c.Hq = Hq, s.c.Hkv = Hkv, s.c.D = D, s.c.rotary_dim = r, s.c.n = 75, s.c.window = 9;
      s.c.seed = uint64_t(Hq * 100 + D);
      add_both(s);
    }

  {  // Appends of 7 tokens build the same cache as one append.
    DecodeCaseSpec s;
    s.label = "pieces";
    s.c.mode = PositionMode::LeakyRerope, s.c.roper = true, s.c.dtype = DType::BF16, s.piece = 7;
    add_both(s);
  }

  // Split-K across 2 threads over 5000 keys: positions step 1..3, so with w = 20000 all keys are near and
  // distances past the 8192-entry near table are computed per key; then Leaky + RoPER with a far part.
  {
    DecodeCaseSpec s;
    s.label = "long";
    s.c.mode = PositionMode::Rerope;
    s.c.Hq = 4, s.c.Hkv = 1, s.c.D = 64, s.c.rotary_dim = 64, s.c.n = 5000, s.c.window = 20000;
    s.threads = 2, s.split = 300;
    add_both(s);
    s.c.mode = PositionMode::LeakyRerope, s.c.window = 700, s.c.roper = true, s.split = 512;
    add_both(s);
  }

  // The re-rotating baseline (seed 004) computes the same step.
  for (PositionMode mode : {PositionMode::Rerope, PositionMode::LeakyRerope}) {
    DecodeCaseSpec s;
    s.label = "baseline";
    s.c.mode = mode, s.c.n = 300, s.c.window = 40, s.c.attention_factor = 1.2, s.c.logn = 64;
    s.engine = DecodeEngine::RerotateBaseline;
    cases.push_back(std::make_unique<DecodeCase>(s));
  }

  {  // o through a strided view: nothing outside the view changes.
    DecodeCaseSpec s;
    s.label = "strided_o";
    s.c.mode = PositionMode::Rerope, s.c.dtype = DType::BF16, s.o_padded = true;
    add_both(s);
  }

  // Non-finite keys, values and query heads, whole and split into chunks of 64 keys.
  for (PositionMode mode : {PositionMode::Rope, PositionMode::Rerope})
    for (int64_t split : {int64_t(0), int64_t(64)}) {
      DecodeCaseSpec s;
      s.label = "nonfinite";
      s.c.mode = mode, s.c.n = 200, s.c.window = 20, s.split = split, s.poison = true;
      cases.push_back(std::make_unique<DecodeCase>(s));
      add_q8(s);
    }

  // Q8 caches: every mode x q / o dtype (and the partial-rotation, log-n, RoPER variant); rows padded to whole
  // blocks (D = 70, 18, 130); appends in pieces; split-K over 5000 keys past the near table. (Non-finite inputs:
  // with the others above.)
  add_modes({DType::F32, DType::BF16, DType::F16}, add_q8, 300);
  for (auto [Hq, Hkv, D, r] : std::vector<std::tuple<int64_t, int64_t, int, int>>{{6, 1, 70, 64}, {2, 2, 130, 128},
                                                                                  {5, 5, 18, 2}})
    for (PositionMode mode : {PositionMode::Rope, PositionMode::LeakyRerope}) {
      DecodeCaseSpec s;
      s.label = "heads";
      s.c.mode = mode, s.c.Hq = Hq, s.c.Hkv = Hkv, s.c.D = D, s.c.rotary_dim = r, s.c.n = 75, s.c.window = 9;
      s.c.roper = mode == PositionMode::LeakyRerope, s.c.seed = uint64_t(Hq * 100 + D + 7);
      add_q8(s);
    }
  {
    DecodeCaseSpec s;
    s.label = "pieces";
    s.c.mode = PositionMode::LeakyRerope, s.c.roper = true, s.c.dtype = DType::BF16, s.piece = 7;
    add_q8(s);
    s.label = "long";
    s.piece = 0, s.c.dtype = DType::F32;
    s.c.Hq = 4, s.c.Hkv = 1, s.c.D = 64, s.c.rotary_dim = 64, s.c.n = 5000, s.c.window = 700;
    s.threads = 2, s.split = 512;
    add_q8(s);
    s.c.mode = PositionMode::Rerope, s.c.roper = false, s.c.window = 20000, s.split = 300;
    add_q8(s);
  }
  return cases;
}

}  // namespace rotary::test
