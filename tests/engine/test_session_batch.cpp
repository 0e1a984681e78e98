// SessionBatch (rotary_engine/model.h): several sessions' tokens through one pass over the weights per layer give
// each session bitwise the hidden rows its own Session::forward calls give - prompts read whole or in chunks beside
// other sequences' decode steps, sessions joining and leaving, with the checkpoint's RoPE, ReRoPE, Leaky ReRoPE, a
// bf16 and a q8 KV cache, on weights as stored and converted to bf16 (bf16 activations) and q8 (q8 activations) - on
// every fixture family; a memory session runs its own forward inside a batch; what a batch refuses, by name; and
// end_thread_team, which `rotary serve` calls so that only the scheduler thread's OpenMP team is left.
#include <gtest/gtest.h>
#include <omp.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <optional>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "expect_error.h"
#include "hf_fixtures.h"
#include "rotary/linear.h"
#include "rotary_engine/hf_model.h"

namespace rotary::test {
namespace {

namespace fs = std::filesystem;

// One sequence's calls: its tokens in pieces (a prompt, maybe in chunks, then one token at a time), each piece
// in the batch step `first_step + i`.
struct Sequence {
  engine::SessionOptions options;
  std::vector<int64_t> tokens;
  std::vector<int64_t> pieces;  // lengths, summing to tokens.size()
  int64_t first_step = 0;
};

// Hidden rows of every piece of each sequence: alone (its own Session::forward per piece) or batched (the pieces
// that share a step in one SessionBatch::forward).
std::vector<std::vector<float>> run(const std::shared_ptr<const engine::Model>& model, const std::vector<Sequence>& seqs,
                                    bool batched) {
  const int64_t d = model->arch().d_model;
  std::vector<engine::Session> sessions;
  std::vector<std::vector<float>> hidden(seqs.size());
  std::vector<std::vector<int64_t>> pos(seqs.size());
  for (size_t i = 0; i < seqs.size(); ++i) {
    sessions.emplace_back(model, seqs[i].options);
    hidden[i].assign(seqs[i].tokens.size() * size_t(d), -1.0f);
    pos[i] = positions_from_zero(int64_t(seqs[i].tokens.size()));
  }
  engine::SessionBatch batch(model);
  int64_t last_step = 0;
  for (const Sequence& s : seqs) last_step = std::max(last_step, s.first_step + int64_t(s.pieces.size()));
  for (int64_t step = 0; step < last_step; ++step) {
    std::vector<engine::BatchStep> steps;
    for (size_t i = 0; i < seqs.size(); ++i) {
      const int64_t piece = step - seqs[i].first_step;
      if (piece < 0 || piece >= int64_t(seqs[i].pieces.size())) continue;
      int64_t t0 = 0;
      for (int64_t p = 0; p < piece; ++p) t0 += seqs[i].pieces[size_t(p)];
      steps.push_back({&sessions[i], seqs[i].tokens.data() + t0, pos[i].data() + t0, seqs[i].pieces[size_t(piece)],
                       hidden[i].data() + t0 * d});
    }
    if (batched) {
      batch.forward(steps);
    } else {
      for (const engine::BatchStep& st : steps) st.session->forward(st.tokens, st.positions, st.n, st.hidden);
    }
  }
  return hidden;
}

std::vector<int64_t> decode_pieces(int64_t prompt_pieces_total, std::vector<int64_t> prompt, int64_t total) {
  int64_t done = prompt_pieces_total;
  while (done < total) prompt.push_back(1), ++done;
  return prompt;
}

TEST_P(HfEngineFixture, ABatchGivesEachSessionItsOwnForwardsBits) {
  const fs::path dir = kFixtures / GetParam();
  const Expected e = read_expected(dir);
  const int64_t S = int64_t(e.tokens.size());
  struct Weights {
    const char* name;
    engine::LoadOptions load;
  };
  engine::LoadOptions bf16, q8;
  bf16.weights = WeightFormat::BF16, bf16.activations = ActivationFormat::BF16;
  q8.weights = WeightFormat::Q8, q8.activations = ActivationFormat::Q8;
  for (const Weights& w : {Weights{"as stored", {}}, Weights{"bf16", bf16}, Weights{"q8", q8}}) {
    const engine::HfModel c = engine::open_hf_model(dir.string(), w.load);
    const engine::PositionMethod native = c.description.positions();
    const auto [rerope, leaky] = rerope_variants(native);
    auto options = [&](const engine::PositionMethod& p, DType kv, KvStorage storage, int64_t chunk) {
      engine::SessionOptions o;
      o.capacity = S, o.positions = p, o.kv_dtype = kv, o.kv_storage = storage, o.prefill_chunk = chunk;
      return o;
    };
    // Shifted token streams, so the sequences differ.
    auto tokens = [&](int64_t shift) {
      std::vector<int64_t> t = e.tokens;
      std::rotate(t.begin(), t.begin() + shift % S, t.end());
      return t;
    };
    const std::vector<Sequence> seqs = {
        // a whole prompt, then decode
        {options(native, DType::F32, KvStorage::Dtype, 512), tokens(0), decode_pieces(S / 2, {S / 2}, S), 0},
        // ReRoPE, its prompt read in two pieces (the second beside the first sequence's decode steps), chunked
        // inside each layer
        {options(rerope, DType::BF16, KvStorage::Dtype, 3), tokens(1), decode_pieces(S / 2, {S / 4, S / 2 - S / 4}, S), 0},
        // Leaky ReRoPE joining later, q8 cache, one token at a time from its start
        {options(leaky, DType::F32, KvStorage::Q8, 512), tokens(2), decode_pieces(0, {}, S), 3},
        // a one-token piece then a prompt-sized piece (the decode path of several tokens)
        {options(native, DType::F16, KvStorage::Dtype, 4), tokens(3), decode_pieces(S - 1, {1, S - 2}, S), 1},
    };
    const auto alone = run(c.model, seqs, false), together = run(c.model, seqs, true);
    for (size_t i = 0; i < seqs.size(); ++i) {
      ASSERT_EQ(alone[i].size(), together[i].size());
      EXPECT_EQ(std::memcmp(alone[i].data(), together[i].data(), alone[i].size() * 4), 0)
          << GetParam() << ", weights " << w.name << ": sequence " << i << "'s hidden rows differ in a batch";
      EXPECT_NE(alone[i].front(), -1.0f) << "sequence " << i << " ran";
    }
  }
}

// A memory session in a batch runs its own forward: its rows equal its own calls', and the others' theirs.
TEST_P(HfEngineFixture, AMemorySessionInABatchRunsItsOwnForward) {
  const fs::path dir = kFixtures / GetParam();
  const Expected e = read_expected(dir);
  const int64_t S = int64_t(e.tokens.size());
  const engine::HfModel c = engine::open_hf_model(dir.string());
  engine::SessionOptions plain, memory;
  plain.capacity = memory.capacity = S, plain.positions = memory.positions = c.description.positions();
  engine::MemoryOptions m;
  m.window = 4, m.top_k = 3, m.chunk = 2;
  memory.memory = m;
  const std::vector<Sequence> seqs = {{plain, e.tokens, decode_pieces(S / 2, {S / 2}, S), 0},
                                      {memory, e.tokens, decode_pieces(S / 2, {S / 2}, S), 1},
                                      {plain, e.tokens, decode_pieces(0, {}, S), 2}};
  const auto alone = run(c.model, seqs, false), together = run(c.model, seqs, true);
  for (size_t i = 0; i < seqs.size(); ++i)
    EXPECT_EQ(std::memcmp(alone[i].data(), together[i].data(), alone[i].size() * 4), 0) << "sequence " << i;
}

// A piece run a part per step (BatchStep::layer_rows: whole layers and parts of a layer, as `rotary serve` reads a
// prompt beside decoding streams) gives bitwise the rows of the piece run whole, beside another session's decode
// steps and a third's whole piece: its size() and tokens grow, and its hidden rows are written, only at its end;
// while it is in progress its session refuses forward(), copies and saves, and a step with other tokens; clear()
// drops it.
TEST_P(HfEngineFixture, APieceRunAPartPerStepGivesThePieceWholesBits) {
  const fs::path dir = kFixtures / GetParam();
  const Expected e = read_expected(dir);
  const int64_t S = int64_t(e.tokens.size());
  engine::LoadOptions q8;
  q8.weights = WeightFormat::Q8, q8.activations = ActivationFormat::Q8;
  for (const engine::LoadOptions& load : {engine::LoadOptions{}, q8}) {
    const engine::HfModel c = engine::open_hf_model(dir.string(), load);
    const int64_t d = c.model->arch().d_model, L = c.model->arch().n_layers;
    const engine::PositionMethod native = c.description.positions();
    const auto [rerope, leaky] = rerope_variants(native);
    for (const auto& [name, positions, kv, storage, chunk] :
         {std::tuple{"native", &native, DType::F32, KvStorage::Dtype, int64_t(512)},
          std::tuple{"rerope", &rerope, DType::BF16, KvStorage::Dtype, int64_t(2)},
          std::tuple{"leaky", &leaky, DType::F32, KvStorage::Q8, int64_t(3)}}) {
      engine::SessionOptions o;
      o.capacity = S, o.positions = *positions, o.kv_dtype = kv, o.kv_storage = storage, o.prefill_chunk = chunk;
      const std::vector<int64_t> pos = positions_from_zero(S);
      // The piece's session: a prompt of S/2 in two pieces, then one token at a time; alone, each piece whole.
      const std::vector<int64_t> pieces = decode_pieces(S / 2, {S / 4, S / 2 - S / 4}, S);
      std::vector<float> alone(size_t(S * d)), layered(size_t(S * d), -1.0f);
      {
        engine::Session s(c.model, o);
        int64_t t = 0;
        for (int64_t n : pieces) s.forward(e.tokens.data() + t, pos.data() + t, n, alone.data() + t * d), t += n;
      }
      engine::Session s(c.model, o), decoding(c.model, o), whole(c.model, o);
      std::vector<float> other(size_t(S * d));
      decoding.forward(e.tokens.data(), pos.data(), 2, other.data());
      engine::SessionBatch batch(c.model);
      int64_t t = 0, other_t = 2, step = 0;
      for (int64_t n : pieces) {
        for (int64_t done = 0; done < n * L; ++step) {
          // parts of 1, 2, ... 5 token-layers: ends inside a layer, across layers, at a layer's end
          const int64_t part = 1 + step % 5;
          std::vector<engine::BatchStep> steps;
          if (other_t < S) steps.push_back({&decoding, e.tokens.data() + other_t, pos.data() + other_t, 1, other.data() + other_t * d});
          steps.push_back({&s, e.tokens.data() + t, pos.data() + t, n, layered.data() + t * d, part});
          if (step == 1) steps.push_back({&whole, e.tokens.data(), pos.data(), 3, nullptr});
          batch.forward(steps);
          if (other_t < S) ++other_t;
          done = std::min(n * L, done + part);
          if (done < n * L) {
            EXPECT_EQ(s.piece_rows_done(), done);
            EXPECT_EQ(s.size(), t) << "a piece in progress counts no token";
            EXPECT_EQ(layered[size_t(t * d)], -1.0f) << "no hidden row before the piece's end";
            EXPECT_FALSE(s.can_copy_prefix());
            expect_error([&] { s.forward(e.tokens.data() + t, pos.data() + t, n, nullptr); },
                         {"forward", "middle of a piece", "token-layers run by SessionBatch"});
            expect_error([&] { s.save_context((fs::temp_directory_path() / "rotary_piece_ctx").string()); },
                         {"save_context", "middle of a piece"});
            if (n > 1)
              expect_error([&] { batch.forward({{&s, e.tokens.data() + t + 1, pos.data() + t + 1, n - 1, nullptr}}); },
                           {"steps[0].tokens", "piece in progress"});
          }
        }
        EXPECT_EQ(s.piece_rows_done(), 0);
        t += n;
        EXPECT_EQ(s.size(), t);
      }
      EXPECT_EQ(whole.size(), 3);
      EXPECT_EQ(std::memcmp(alone.data(), layered.data(), alone.size() * 4), 0)
          << GetParam() << ", weights " << (load.weights ? "q8" : "as stored") << ", " << name
          << ": a piece run a part per step differs from the piece whole";
      EXPECT_EQ(s.tokens(), e.tokens);
      // clear() drops a piece in progress.
      s.clear();
      if (L > 1) {
        batch.forward({{&s, e.tokens.data(), pos.data(), 2, nullptr, 3}});
        EXPECT_EQ(s.piece_rows_done(), 3);
        s.clear();
      }
      EXPECT_EQ(s.piece_rows_done(), 0);
      EXPECT_EQ(s.size(), 0);
      s.forward(e.tokens.data(), pos.data(), 2, nullptr);
      EXPECT_EQ(s.size(), 2);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Families, HfEngineFixture, ::testing::ValuesIn(kFamilies));

TEST(SessionBatch, RefusesStepsByNameBeforeAnyWork) {
  const engine::HfModel c = engine::open_hf_model((kFixtures / "llama3").string());
  const engine::HfModel other = engine::open_hf_model((kFixtures / "llama3").string());
  engine::SessionOptions o;
  o.capacity = 4, o.positions = c.description.positions();
  engine::Session a(c.model, o), b(c.model, o), foreign(other.model, o);
  engine::SessionBatch batch(c.model);
  const int64_t tokens[] = {1, 2}, bad[] = {1, 1 << 30}, pos[] = {0, 1};
  expect_error([&] { batch.forward({{&a, tokens, pos, 2, nullptr}, {&foreign, tokens, pos, 2, nullptr}}); },
               {"steps[1].session", "another model"});
  expect_error([&] { batch.forward({{&a, tokens, pos, 2, nullptr}, {&a, tokens, pos, 2, nullptr}}); },
               {"steps[1].session", "each session once"});
  expect_error([&] { batch.forward({{&a, tokens, pos, 2, nullptr}, {&b, bad, pos, 2, nullptr}}); },
               {"steps[1]", "tokens[1]", "vocab_size"});
  expect_error([&] { batch.forward({{&a, tokens, pos, 0, nullptr}}); }, {"steps[0].n", ">= 1"});
  expect_error([&] { batch.forward({{&a, tokens, pos, 2, nullptr, -1}}); }, {"steps[0].layer_rows", ">= 0"});
  // Nothing ran: both sessions are still empty.
  EXPECT_EQ(a.size(), 0);
  EXPECT_EQ(b.size(), 0);
  batch.forward({{&a, tokens, pos, 2, nullptr}, {&b, tokens, pos, 2, nullptr}});
  EXPECT_EQ(a.size(), 2);
  EXPECT_EQ(b.size(), 2);
}

// The threads of this process (Linux: /proc/self/task).
int64_t ThreadCount() {
  int64_t n = 0;
  for ([[maybe_unused]] const auto& entry : fs::directory_iterator("/proc/self/task")) ++n;
  return n;
}

TEST(EndThreadTeam, TheCallingThreadsIdleWorkersExitAndTheNextRegionStartsANewTeam) {
  // A team of 2 threads on this thread: a linear layer of enough rows for two groups of work.
  const int64_t rows = 512, cols = 512;  // past 2 x 64k multiply-adds: linear_forward gives small calls one thread
  std::vector<float> w(static_cast<size_t>(rows * cols)), x(static_cast<size_t>(cols)), y(static_cast<size_t>(rows));
  std::vector<float> again(y.size());
  for (size_t i = 0; i < w.size(); ++i) w[i] = float(int(i % 7) - 3) / 8;
  for (size_t i = 0; i < x.size(); ++i) x[i] = float(int(i % 5) - 2) / 4;
  LinearParams p;
  p.w.format = WeightFormat::F32, p.w.data = w.data(), p.w.rows = rows, p.w.cols = cols, p.w.row_stride = cols;
  p.tokens = 1, p.x = x.data(), p.x_stride = cols, p.y = y.data(), p.y_stride = rows, p.threads = 2;
  linear_forward(p);
  const int64_t with_team = ThreadCount();
  engine::end_thread_team();
  // libgomp (the engine's OpenMP) joins the released worker; wait a little in case a runtime lets it exit later.
  int64_t now = ThreadCount();
  for (int i = 0; i < 200 && now >= with_team; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    now = ThreadCount();
  }
  EXPECT_EQ(now, with_team - 1) << "the calling thread's idle OpenMP worker is still there";
  p.y = again.data();
  linear_forward(p);
  EXPECT_EQ(ThreadCount(), with_team) << "the next parallel region starts a team of 2 again";
  EXPECT_EQ(std::memcmp(y.data(), again.data(), y.size() * sizeof(float)), 0);
}

TEST(EndThreadTeam, RefusesACallInsideAParallelRegion) {
  // Inside a region the team is in use: pausing the runtime there would pull threads from under the region's work.
  std::string message;
  int team = 0;
#pragma omp parallel num_threads(2)
  {
#pragma omp single
    {
      team = omp_get_num_threads();
      try {
        engine::end_thread_team();
      } catch (const Error& e) {
        message = e.what();
      }
    }
  }
  if (team < 2) GTEST_SKIP() << "OpenMP gave the region one thread (an inactive region: omp_in_parallel is false)";
  EXPECT_NE(message.find("end_thread_team"), std::string::npos) << message;
  EXPECT_NE(message.find("inside a parallel region"), std::string::npos) << message;
  // Outside every region the call goes through.
  EXPECT_NO_THROW(engine::end_thread_team());
}

}  // namespace
}  // namespace rotary::test
