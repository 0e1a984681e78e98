// A session saved and continued (Session::save_context / open_context, docs/memory.md and docs/engine.md) on every
// fixture family (tests/data/hf_checkpoints), opened by engine::open_hf_model: with a memory, with the KV caches
// alone, with a search that keeps what it built; the saved context as one unit (engine/src/saved_context.h) and
// bound to the weights by content; what does not fit, refused by name.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "expect_error.h"
#include "hf_fixtures.h"
#include "rotary_engine/generate.h"
#include "rotary_engine/hf_model.h"

namespace rotary::test {
namespace {

namespace fs = std::filesystem;


// Session options `o` (capacity: every token) over tokens [0, first), saved to `ctx` (save_context) and continued in
// a session opened from it with a capacity of the rest (the capacity given counts the tokens after the context):
// the opened session holds `first` tokens, goes on at `first`, and gives the rest of the tokens the hidden states -
// bit for bit - and memory the session that went on gives them. Returns those hidden states.
std::vector<float> expect_context_continues(const engine::HfModel& c, const std::vector<int64_t>& tokens,
                                            const engine::SessionOptions& o, int64_t first, const std::string& ctx) {
  const int64_t S = int64_t(tokens.size()), d = c.model->arch().d_model;
  const std::vector<int64_t> pos = positions_from_zero(S);
  std::vector<float> stayed(size_t((S - first) * d)), opened(stayed.size());
  engine::Session a(c.model, o);
  a.forward(tokens.data(), pos.data(), first, nullptr);
  a.save_context(ctx);
  a.forward(tokens.data() + first, pos.data() + first, S - first, stayed.data());
  engine::SessionOptions small = o;
  small.capacity = S - first;
  engine::Session b(c.model, small);
  b.open_context(ctx);
  EXPECT_EQ(b.size(), first);
  EXPECT_EQ(b.next_position(), first);
  EXPECT_EQ(b.capacity(), S);
  b.forward(tokens.data() + first, pos.data() + first, S - first, opened.data());
  EXPECT_EQ(opened, stayed);
  EXPECT_EQ(b.memory_stats().memory_tokens, a.memory_stats().memory_tokens);
  return opened;
}

// A session with a memory saved after part of a sequence (save_context) and continued in another session
// (open_context) gives the rest of the sequence the bits the session that went on gives it, and that one sequence
// through one session gives (the chunks fall at the same places); generate() after a context goes on from it;
// what does not fit is refused by name.
TEST_P(HfEngineFixture, ASavedContextGoesOnAsTheSessionThatStayed) {
  const fs::path dir = kFixtures / GetParam();
  const engine::HfModel c = engine::open_hf_model(dir.string());
  const Expected e = read_expected(dir);
  const engine::PositionMethod native = c.description.positions();
  const int64_t S = int64_t(e.tokens.size()), first = 9, d = c.model->arch().d_model;  // first: whole chunks of 3
  const std::string ctx = ::testing::TempDir() + "/rotary_ctx_" + GetParam() + "_" + std::to_string(::getpid());
  engine::SessionOptions o;
  o.capacity = S, o.positions = native;
  o.memory = engine::MemoryOptions{.window = 4, .top_k = 3, .chunk = 3};
  const std::vector<int64_t> pos = positions_from_zero(S);
  std::vector<float> whole(size_t(S * d));
  engine::Session one(c.model, o);
  one.forward(e.tokens.data(), pos.data(), S, whole.data());
  const std::vector<float> opened = expect_context_continues(c, e.tokens, o, first, ctx);
  EXPECT_EQ(opened, std::vector<float>(whole.begin() + first * d, whole.end()));
  engine::SessionOptions small = o;
  small.capacity = S - first;

  // generate() after a context: the rest of the prompt, then new tokens, as one session over the whole prompt.
  const std::vector<int64_t> rest(e.tokens.begin() + first, e.tokens.end()), all(e.tokens.begin(), e.tokens.end());
  o.capacity = S + 4;
  engine::Session g1(c.model, o);
  const std::vector<int64_t> want = engine::generate(g1, all, {.max_new = 4});
  small.capacity = S - first + 4;
  engine::Session g2(c.model, small);
  g2.open_context(ctx);
  EXPECT_EQ(engine::generate(g2, rest, {.max_new = 4}), want);

  // Refused: a session that holds tokens, one without a memory (whose files are the KV caches'), other settings
  // (the files' fingerprint or layout).
  expect_error([&] { g2.open_context(ctx); }, {"open_context", "an empty session"});
  engine::SessionOptions plain = o;
  plain.memory.reset();
  expect_error([&] { engine::Session(c.model, plain).open_context(ctx); }, {ctx + "/context.json", "saved with a memory"});
  expect_error([&] { engine::Session(c.model, plain).save_context(ctx); }, {"save_context", "an empty session"});
  expect_error([&] { engine::Session(c.model, o).save_context(ctx); }, {"save_context", "an empty session"});
  engine::SessionOptions other = o;
  other.positions = rerope_at(native, 3);
  expect_error([&] { engine::Session(c.model, other).open_context(ctx); },
                 {ctx + "/context.json", "saved with", "the same positions, cache and memory settings"});
  other = o, other.memory->storage = DType::BF16;
  expect_error([&] { engine::Session(c.model, other).open_context(ctx); },
                 {ctx + "/context.json", "saved with", "the same positions, cache and memory settings"});
  std::filesystem::remove_all(ctx);
}

// A search that keeps what it built (MemorySearch::save / open): save_context hands each layer's search the path
// layer<i>.search once the caches are written, and a search that keeps nothing leaves no file (an earlier save's
// is removed, so no stale search of other rows survives); open_context hands the new session's searches the files
// the manifest names, before their first sync, and no path when it names none. Here each search keeps the
// memory's size at the save, checked when read back.
TEST_P(HfEngineFixture, ASearchKeepsWhatItBuiltInASavedContext) {
  const fs::path dir = kFixtures / GetParam();
  const engine::HfModel c = engine::open_hf_model(dir.string());
  const Expected e = read_expected(dir);
  const engine::PositionMethod native = c.description.positions();
  const int64_t S = int64_t(e.tokens.size()), first = 9, layers = c.model->arch().n_layers;
  const std::string ctx = ::testing::TempDir() + "/rotary_sctx_" + GetParam() + "_" + std::to_string(::getpid());
  struct Calls {
    std::vector<std::string> saved, opened;
    int64_t read_back = 0;  // opens that found their file, the memory's size as saved
  };
  struct Keeping final : engine::MemorySearch {
    const KvMemory& memory;
    bool keep;
    Calls* calls;
    bool synced = false;
    Keeping(const KvMemory& m, bool k, Calls* cs) : memory(m), keep(k), calls(cs) {}
    void sync() override { synced = true; }
    double candidates(const MemoryAttentionParams& p, int64_t* out) override {
      std::fill(out, out + p.tokens * p.q.heads * p.top_k, int64_t(-1));
      return 0.0;
    }
    void save(const std::string& path) override {
      if (!keep) return;
      calls->saved.push_back(path);
      std::ofstream(path) << memory.size();
    }
    void open(const std::string& path) override {
      calls->opened.push_back(path);
      EXPECT_FALSE(synced) << "opened after a sync";
      std::ifstream in(path);
      int64_t rows = -1;
      if (!(in >> rows)) return;
      EXPECT_EQ(rows, memory.size()) << path;
      ++calls->read_back;
    }
  };
  auto options = [&](bool keep, Calls* calls) {
    engine::SessionOptions o;
    o.capacity = S, o.positions = native;
    o.memory = engine::MemoryOptions{.window = 4, .top_k = 3, .chunk = 3};
    o.memory->search_factory = [keep, calls](const KvMemory& m) { return std::make_unique<Keeping>(m, keep, calls); };
    return o;
  };
  std::vector<std::string> files;
  for (int64_t i = 0; i < layers; ++i) files.push_back(ctx + "/layer" + std::to_string(i) + ".search");
  const std::vector<int64_t> pos = positions_from_zero(S);
  Calls saving, opening;
  {
    engine::Session a(c.model, options(true, &saving));
    a.forward(e.tokens.data(), pos.data(), first, nullptr);
    a.save_context(ctx);
  }
  EXPECT_EQ(saving.saved, files);
  engine::Session b(c.model, options(true, &opening));
  b.open_context(ctx);
  EXPECT_EQ(opening.opened, files);
  EXPECT_EQ(opening.read_back, layers);
  b.forward(e.tokens.data() + first, pos.data() + first, S - first, nullptr);  // goes on after what it read
  // Saved again by a search that keeps nothing: no search file is left; opened, its searches find none.
  Calls plain, after;
  {
    engine::Session a(c.model, options(false, &plain));
    a.forward(e.tokens.data(), pos.data(), first, nullptr);
    a.save_context(ctx);
  }
  for (const std::string& f : files) EXPECT_FALSE(std::filesystem::exists(f)) << f;
  engine::Session(c.model, options(true, &after)).open_context(ctx);
  EXPECT_TRUE(after.opened.empty());  // the manifest names no search file: the searches build as usual
  EXPECT_EQ(after.read_back, 0);
  std::filesystem::remove_all(ctx);
}

// A session without a memory saved after its prompt (its KV caches, KvCache::save) and continued in another session
// gives the tokens after it the bits the session that went on gives them - f32, bf16 and q8 caches, RoPE and
// ReRoPE - and generate() after the context the tokens of one session over the whole prompt. Refused: a one-pass
// session (no caches), a context saved with another cache storage or method (named by its file).
TEST_P(HfEngineFixture, ASavedKvCacheContextGoesOnAsTheSessionThatStayed) {
  const fs::path dir = kFixtures / GetParam();
  const engine::HfModel c = engine::open_hf_model(dir.string());
  const Expected e = read_expected(dir);
  const engine::PositionMethod native = c.description.positions();
  const ReropeVariants variants = rerope_variants(native);
  const int64_t S = int64_t(e.tokens.size()), first = 7;
  const std::string ctx = ::testing::TempDir() + "/rotary_kvctx_" + GetParam() + "_" + std::to_string(::getpid());
  const std::vector<int64_t> pos = positions_from_zero(S);
  struct Run {
    const engine::PositionMethod* method;
    DType dtype;
    KvStorage storage;
  };
  for (const Run& r : {Run{&native, DType::F32, KvStorage::Dtype}, Run{&native, DType::BF16, KvStorage::Dtype},
                       Run{&variants.rerope, DType::F32, KvStorage::Q8}}) {
    SCOPED_TRACE(std::string(position_mode_name(r.method->mode)) + " kv " + dtype_name(r.dtype) + " " +
                 kv_storage_name(r.storage));
    engine::SessionOptions o;
    o.capacity = S, o.positions = *r.method, o.kv_dtype = r.dtype, o.kv_storage = r.storage;
    expect_context_continues(c, e.tokens, o, first, ctx);
    engine::SessionOptions small = o;
    small.capacity = S - first;

    const std::vector<int64_t> rest(e.tokens.begin() + first, e.tokens.end());
    o.capacity = S + 3, small.capacity = S - first + 3;
    engine::Session g1(c.model, o);
    g1.forward(e.tokens.data(), pos.data(), first, nullptr);
    const std::vector<int64_t> want = engine::generate(g1, rest, {.max_new = 3});
    engine::Session g2(c.model, small);
    g2.open_context(ctx);
    EXPECT_EQ(engine::generate(g2, rest, {.max_new = 3}), want);

    engine::SessionOptions other = small;
    other.kv_storage = r.storage == KvStorage::Q8 ? KvStorage::Dtype : KvStorage::Q8, other.kv_dtype = DType::F32;
    expect_error([&] { engine::Session(c.model, other).open_context(ctx); },
                 {ctx + "/context.json", "saved with", "the same positions, cache and memory settings"});
    other = small, other.positions = r.method == &native ? variants.leaky : native;
    expect_error([&] { engine::Session(c.model, other).open_context(ctx); },
                 {ctx + "/context.json", "saved with", "the same positions, cache and memory settings"});
    other = small, other.keep_caches = false;
    expect_error([&] { engine::Session(c.model, other).open_context(ctx); }, {"open_context", "keep_caches = false"});
  }
  std::filesystem::remove_all(ctx);
}

// A saved context is one unit (issue 48): its manifest, written last, names every file with its size and content
// hash and the model by content; each layer file carries the save's id and its layer in its fingerprint; a save holds
// a lock, removes the earlier manifest first and every earlier file after. Each case below was accepted before, and
// continued with rows of another session, another layer or another model.
TEST(HfEngine, ASavedContextIsOneUnit) {
  const fs::path dir = kFixtures / "llama3";
  const engine::HfModel c = engine::open_hf_model(dir.string());
  const Expected e = read_expected(dir);
  const int64_t S = int64_t(e.tokens.size());
  ASSERT_GE(c.model->arch().n_layers, 2);
  const std::string base = ::testing::TempDir() + "/rotary_unit_" + std::to_string(::getpid());
  const std::string ctx = base + "/ctx", other_ctx = base + "/other";
  engine::SessionOptions o;
  o.capacity = S, o.positions = c.description.positions();
  const std::vector<int64_t> pos = positions_from_zero(S);
  auto save = [&](const std::string& where, int64_t n, int64_t offset) {
    engine::Session s(c.model, o);
    s.forward(e.tokens.data() + offset, pos.data(), n, nullptr);
    s.save_context(where);
  };
  auto open = [&](const std::string& where) {
    engine::SessionOptions small = o;
    small.capacity = 4;
    engine::Session s(c.model, small);
    s.open_context(where);
    return s.size();
  };
  auto copy = [](const std::string& from, const std::string& to) {
    fs::copy_file(from, to, fs::copy_options::overwrite_existing);
  };
  save(ctx, 6, 0);
  save(other_ctx, 6, 1);  // the same length, other tokens: every file has the same size as ctx's
  EXPECT_EQ(open(ctx), 6);
  ASSERT_TRUE(fs::exists(ctx + "/context.json"));

  // A layer file of another save (a re-save killed between two layers' renames, two saves at once): refused by the
  // manifest's content hash; with the manifest rewritten to match, by the file's own fingerprint (its save id).
  copy(other_ctx + "/layer1.kv", ctx + "/layer1.kv");
  expect_error([&] { open(ctx); }, {ctx + "/layer1.kv", "content hash", "context.json"});
  copy(other_ctx + "/context.json", ctx + "/context.json");
  expect_error([&] { open(ctx); }, {ctx + "/layer0.kv", "content hash"});
  copy(other_ctx + "/layer0.kv", ctx + "/layer0.kv");
  expect_error([&] { open(ctx); }, {ctx + "/tokens.ids", "content hash"});
  copy(other_ctx + "/tokens.ids", ctx + "/tokens.ids");
  EXPECT_EQ(open(ctx), 6);  // all of the other save now: one unit again
  // The token ids of another save with a manifest rewritten to match: refused by the file's own fingerprint.
  save(ctx, 6, 0);
  copy(other_ctx + "/tokens.ids", ctx + "/tokens.ids");
  {
    auto manifest_of = [](const std::string& path) {
      std::ifstream in(path);
      return nlohmann::json::parse(in);
    };
    nlohmann::json manifest = manifest_of(ctx + "/context.json");
    const nlohmann::json other_manifest = manifest_of(other_ctx + "/context.json");
    for (nlohmann::json& f : manifest["files"])
      for (const nlohmann::json& g : other_manifest["files"])
        if (f["name"] == "tokens.ids" && g["name"] == "tokens.ids") f = g;
    std::ofstream(ctx + "/context.json", std::ios::trunc) << manifest.dump(2);
  }
  expect_error([&] { open(ctx); }, {ctx + "/tokens.ids", "fingerprint", "another save"});

  // Swapped layers, with a manifest that records the swap: each file knows its layer.
  save(ctx, 6, 0);
  fs::rename(ctx + "/layer0.kv", ctx + "/swap"), fs::rename(ctx + "/layer1.kv", ctx + "/layer0.kv");
  fs::rename(ctx + "/swap", ctx + "/layer1.kv");
  expect_error([&] { open(ctx); }, {ctx + "/layer0.kv", "content hash"});
  {
    std::ifstream in(ctx + "/context.json");
    std::string manifest((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    in.close();
    const size_t a = manifest.find("\"layer0.kv\""), b = manifest.find("\"layer1.kv\"");
    ASSERT_NE(a, std::string::npos);
    ASSERT_NE(b, std::string::npos);
    manifest.replace(a, 11, "\"layer1.kv\""), manifest.replace(b, 11, "\"layer0.kv\"");
    std::ofstream(ctx + "/context.json", std::ios::trunc) << manifest;
  }
  expect_error([&] { open(ctx); }, {ctx + "/layer0.kv", "fingerprint"});

  // A save that did not finish leaves no manifest: nothing of it, nor of the save before, is read.
  save(ctx, 6, 0);
  fs::remove(ctx + "/context.json");
  expect_error([&] { open(ctx); }, {"open_context " + ctx, "no context.json", "whose save finished"});

  // A save of the other kind removes the earlier one's files: a KV-cache save leaves no layer<i>.memory / .window,
  // and a leftover temporary file of a killed writer goes too.
  {
    engine::SessionOptions m = o;
    m.memory = engine::MemoryOptions{.window = 4, .top_k = 3, .chunk = 3};
    engine::Session s(c.model, m);
    s.forward(e.tokens.data(), pos.data(), 9, nullptr);
    s.save_context(ctx);
  }
  ASSERT_TRUE(fs::exists(ctx + "/layer0.memory"));
  std::ofstream(ctx + "/layer0.kv.tmp.999999") << "left by a killed save";
  std::ofstream(ctx + "/notes.txt") << "the user's own file";
  save(ctx, 6, 0);
  EXPECT_FALSE(fs::exists(ctx + "/layer0.memory"));
  EXPECT_FALSE(fs::exists(ctx + "/layer0.window"));
  EXPECT_FALSE(fs::exists(ctx + "/layer0.kv.tmp.999999"));
  EXPECT_TRUE(fs::exists(ctx + "/notes.txt"));  // not a context's file: left alone
  {
    engine::SessionOptions m = o;
    m.memory = engine::MemoryOptions{.window = 4, .top_k = 3, .chunk = 3};
    expect_error([&] { engine::Session(c.model, m).open_context(ctx); }, {"context.json", "saved without a memory"});
  }

  // A symlink loop in place of a layer file: refused by name (was an uncaught filesystem error).
  fs::remove(ctx + "/layer1.kv");
  fs::create_symlink("layer1.kv", ctx + "/layer1.kv");
  expect_error([&] { open(ctx); }, {ctx + "/layer1.kv", "Too many levels of symbolic links"});

  // Two saves at once: the second is refused while the first holds the lock (held here by hand), naming its pid.
  save(ctx, 6, 0);
  {
    const int fd = ::open((ctx + "/context.lock").c_str(), O_RDWR);
    ASSERT_GE(fd, 0);
    ASSERT_EQ(::flock(fd, LOCK_EX | LOCK_NB), 0);
    ASSERT_EQ(::ftruncate(fd, 0), 0);
    ASSERT_EQ(::write(fd, "4242\n", 5), 5);
    expect_error([&] { save(ctx, 6, 0); }, {"save_context " + ctx, "pid 4242"});
    expect_error([&] { open(ctx); }, {"open_context " + ctx, "pid 4242"});
    ::close(fd);
  }
  EXPECT_EQ(open(ctx), 6);

  // A save onto a regular file, or of a session that could never be saved, is refused by check_save_context - which
  // the command line calls before the prompt is read.
  std::ofstream(base + "/file") << "x";
  expect_error([&] { engine::Session(c.model, o).check_save_context(base + "/file"); }, {"save_context dir", base + "/file"});
  engine::SessionOptions unl = o;
  unl.memory = engine::MemoryOptions{.policy = MemoryPolicy::Unlimiformer, .window = 4, .top_k = 3, .chunk = 3};
  expect_error([&] { engine::Session(c.model, unl).check_save_context(base + "/u"); }, {"save_context", "unlimiformer"});
  fs::remove_all(base);
}

// A context is bound to the weights by content: a model whose embedding rows are the same but another layer's
// weights differ (a fine-tune) is refused, as is the same model converted to another format; the same weights
// read from another copy give the same weights_hash.
TEST(HfEngine, ASavedContextIsBoundToTheWeightsByContent) {
  const fs::path dir = kFixtures / "llama2";
  const engine::HfModelDescription spec = engine::read_hf_model_file(dir.string());
  const engine::Architecture arch = spec.arch;
  std::vector<std::vector<float>> stored;  // every slot's values, deterministic
  for (const engine::TensorSlot& slot : engine::tensor_slots(arch)) {
    int64_t n = 1;
    for (int64_t d : slot.shape) n *= d;
    std::vector<float>& v = stored.emplace_back(size_t(n));
    for (int64_t i = 0; i < n; ++i) v[size_t(i)] = slot.name.ends_with("norm.weight") ? 1.0f : 0.02f * float((i * 7919 + int64_t(stored.size()) * 31) % 101 - 50) / 50.0f;
  }
  auto lookup = [&](const std::vector<std::vector<float>>& values) {
    return [&, values_ptr = &values](const std::string& name) {
      const std::vector<engine::TensorSlot> slots = engine::tensor_slots(arch);
      for (size_t i = 0; i < slots.size(); ++i)
        if (slots[i].name == name) return engine::StoredTensor{DType::F32, (*values_ptr)[i].data(), slots[i].shape};
      throw Error("rotary: no tensor " + name);
    };
  };
  std::vector<std::vector<float>> tuned = stored, copied = stored;
  const std::vector<engine::TensorSlot> slots = engine::tensor_slots(arch);
  for (size_t i = 0; i < slots.size(); ++i)
    if (slots[i].name == "layers.1.down.weight") tuned[i][3] += 0.01f;  // one weight of one layer
  const auto base = engine::Model::load(arch, lookup(stored), {}, nullptr);
  const auto same = engine::Model::load(arch, lookup(copied), {}, nullptr);
  const auto fine_tuned = engine::Model::load(arch, lookup(tuned), {}, nullptr);
  const auto q8 = engine::Model::load(arch, lookup(stored), {.weights = WeightFormat::Q8}, nullptr);
  EXPECT_EQ(base->weights_hash(), same->weights_hash());
  EXPECT_NE(base->weights_hash(), fine_tuned->weights_hash());
  EXPECT_EQ(base->weights_hash(), q8->weights_hash());  // the stored weights; the format is checked on its own

  const std::string ctx = ::testing::TempDir() + "/rotary_bound_" + std::to_string(::getpid());
  engine::SessionOptions o;
  o.capacity = 8, o.positions = spec.positions();
  const int64_t ids[4] = {1, 2, 3, 4}, pos[4] = {0, 1, 2, 3};
  {
    engine::Session s(base, o);
    s.forward(ids, pos, 4, nullptr);
    s.save_context(ctx);
  }
  engine::Session(same, o).open_context(ctx);
  expect_error([&] { engine::Session(fine_tuned, o).open_context(ctx); }, {ctx + "/context.json", "other weights"});
  expect_error([&] { engine::Session(q8, o).open_context(ctx); }, {ctx + "/context.json", "saved with weights f32", "--weights"});
  fs::remove_all(ctx);
}


INSTANTIATE_TEST_SUITE_P(Families, HfEngineFixture, ::testing::ValuesIn(kFamilies));

}  // namespace
}  // namespace rotary::test
