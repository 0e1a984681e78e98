// The server's scheduler (rotary_server/scheduler.h) on the llama3 fixture with its tokenizer: a request's tokens
// are the same alone and among others decoded together (greedy and seeded sampling, prompts read in pieces beside
// other streams), and equal engine::generate's; max_tokens, end of turn and stop strings end an answer with the
// right reason and usage; a cancelled request frees its slot; a full queue and a prompt past the context are refused
// by status and code; drain finishes the running requests and refuses new ones.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "rotary/error.h"
#include "rotary_engine/generate.h"
#include "rotary_engine/hf_model.h"
#include "rotary_server/scheduler.h"

namespace rotary::server {
namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;

const fs::path kSource(ROTARY_SOURCE_DIR);

struct Fixture {
  engine::HfModel hf = engine::open_hf_model((kSource / "tests/data/hf_checkpoints/llama3").string());
  std::shared_ptr<const tokenizers::Tokenizer> tokenizer =
      tokenizers::load_tokenizer(kSource / "tests/data/hf_tokenizers/llama3_style");
  // memory_for_all: every session with the test's memory (a server run with --memory), not only a request's own.
  ServedModel served(bool memory_for_all = false) const {
    engine::SessionOptions o;
    o.positions = hf.description.positions();
    if (memory_for_all) {
      engine::MemoryOptions memory;
      memory.window = 4, memory.top_k = 3;
      o.memory = memory;
    }
    return {hf.model,
            [o, m = hf.model](int64_t capacity, const Job* job) {
              engine::SessionOptions c = o;
              c.capacity = capacity;
              if (job && job->positions) c.positions = *job->positions;
              if (job && job->memory.any()) {  // (the test's memory: exact at the request's window and top-k)
                engine::MemoryOptions memory;
                memory.window = job->memory.window.value_or(4), memory.top_k = int(job->memory.top_k.value_or(3));
                c.memory = memory;
              }
              return engine::Session(m, c);
            },
            tokenizer, o.positions};
  }
};

std::shared_ptr<Job> make_job(const Fixture& f, const std::string& prompt, int64_t max_new, double temperature = 0,
                              uint64_t seed = 0) {
  auto job = std::make_shared<Job>();
  job->prompt = f.tokenizer->encode(prompt);
  job->sampling.max_new = max_new, job->sampling.temperature = temperature, job->sampling.seed = seed;
  job->sampling.sample_vocab = f.tokenizer->vocab_size();
  return job;
}

Job::Update wait(Job& job, std::string* text = nullptr) {
  Job::Update all;
  for (int i = 0; i < 600; ++i) {
    Job::Update u = job.next(100ms);
    all.text += u.text;
    if (u.finished) {
      u.text = all.text;
      if (text) *text = u.text;
      return u;
    }
  }
  ADD_FAILURE() << "the job did not finish within a minute";
  return all;
}

// engine::generate's text for the same prompt and options: the reference a scheduled request must equal.
std::string generate_text(const Fixture& f, const Job& job, int64_t context) {
  engine::Session s = f.served().new_session(context, job.own_session() ? &job : nullptr);
  const std::vector<int64_t> out = engine::generate(s, job.prompt, job.sampling);
  std::vector<int64_t> tail(job.prompt.end() - std::min<size_t>(8, job.prompt.size()), job.prompt.end());
  return f.tokenizer->decode_continuation(tail, out);
}

TEST(Scheduler, ARequestsTokensAreTheSameAloneAndBatchedAndEqualGenerates) {
  const Fixture f;
  const std::vector<std::string> prompts = {"hello there", "a much longer prompt that is read in pieces of three",
                                            "x", "sampled at a temperature"};
  auto jobs_for = [&] {
    std::vector<std::shared_ptr<Job>> jobs;
    for (size_t i = 0; i < prompts.size(); ++i)
      jobs.push_back(make_job(f, prompts[i], 12 + int64_t(i), i == 3 ? 0.8 : 0.0, 7 + i));
    return jobs;
  };
  SchedulerOptions o;
  o.context = 96, o.prefill_step = 3;
  // Alone: one slot, one request at a time.
  std::vector<std::string> alone;
  {
    o.slots = 1;
    Scheduler s(f.served(), o);
    for (const auto& job : jobs_for()) {
      s.submit(job, "prompt");
      std::string text;
      const Job::Update u = wait(*job, &text);
      ASSERT_FALSE(u.error) << u.error->what();
      EXPECT_EQ(u.finish, FinishReason::Length);
      EXPECT_EQ(u.usage.completion_tokens, job->sampling.max_new);
      EXPECT_EQ(u.usage.prompt_tokens, int64_t(job->prompt.size()));
      EXPECT_EQ(text, generate_text(f, *job, o.context)) << "alone differs from engine::generate";
      alone.push_back(text);
    }
  }
  // Together: four slots, all submitted at once (their prompts read in pieces between the others' decode steps):
  // a piece beside decode tokens goes through the layers that fit --prompt-share (the default), one layer per step
  // (a share too small for more), or whole (0) - the same tokens each way.
  o.slots = 4;
  for (double share : {SchedulerOptions{}.prompt_share, 1e-9, 0.0}) {
    o.prompt_share = share;
    Scheduler s(f.served(), o);
    const auto jobs = jobs_for();
    for (const auto& job : jobs) s.submit(job, "prompt");
    for (size_t i = 0; i < jobs.size(); ++i) {
      std::string text;
      wait(*jobs[i], &text);
      EXPECT_EQ(text, alone[i]) << "request " << i << " batched with others, --prompt-share " << share;
      EXPECT_FALSE(text.empty());
    }
    EXPECT_GT(s.stats().steps, 0);
    EXPECT_EQ(s.stats().requests_finished, int64_t(jobs.size()));
    if (share == 1e-9) {
      EXPECT_GT(s.stats().prompt_layer_steps, 0) << "pieces beside decode tokens ran layer by layer";
    } else if (share == 0) {
      EXPECT_EQ(s.stats().prompt_layer_steps, 0) << "whole pieces";
    }
  }
}

// --prompt-share out of [0, 1000] (negative, NaN, huge) is refused naming the flag, before any slot is made.
TEST(Scheduler, RefusesAPromptShareOutOfRangeByName) {
  for (double share : {-0.5, std::nan(""), 1e9}) {
    SchedulerOptions o;
    o.prompt_share = share;
    try {
      o.validate();
      ADD_FAILURE() << "--prompt-share " << share << " was taken";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("--prompt-share"), std::string::npos) << e.what();
    }
  }
  SchedulerOptions ok;
  ok.prompt_share = 0;
  EXPECT_NO_THROW(ok.validate());
}

// rotary's extension: a request's own positions (ReRoPE at window 4, past which the tiny model's trained context of
// 16 is far) run in a session of their own beside requests on the server's positions, each equal to generate with its
// positions; the slot goes back to the server's after; positions that do not fit the model are refused at submit.
TEST(Scheduler, ARequestsOwnPositionsRunBesideTheServers) {
  const Fixture f;
  SchedulerOptions o;
  o.context = 96, o.slots = 2, o.prefill_step = 5;
  Scheduler s(f.served(), o);
  engine::PositionMethod rerope = f.served().positions;
  rerope.mode = PositionMode::Rerope, rerope.window = 4;
  // (sampled, one seed: the tiny model's greedy answers repeat one token whatever the positions)
  auto plain = make_job(f, "a prompt long enough to pass the window", 30, 2.0, 9);
  auto own = make_job(f, "a prompt long enough to pass the window", 30, 2.0, 9);
  own->positions = rerope;
  s.submit(plain, "prompt");
  s.submit(own, "prompt");
  std::string plain_text, own_text;
  wait(*plain, &plain_text);
  wait(*own, &own_text);
  EXPECT_EQ(plain_text, generate_text(f, *plain, o.context));
  EXPECT_EQ(own_text, generate_text(f, *own, o.context));
  EXPECT_NE(own_text, plain_text) << "ReRoPE at window 4 over 40 tokens should change the answer";
  // Both slots back on the server's positions.
  auto after1 = make_job(f, "a prompt long enough to pass the window", 30, 2.0, 9), after2 = make_job(f, "x", 3);
  s.submit(after1, "prompt");
  s.submit(after2, "prompt");
  std::string after_text;
  wait(*after1, &after_text);
  wait(*after2);
  EXPECT_EQ(after_text, plain_text);
  auto bad = make_job(f, "hi", 2);
  bad->positions = rerope;
  bad->positions->window = 0;  // ReRoPE needs a window
  try {
    s.submit(bad, "prompt");
    FAIL() << "ReRoPE without a window was taken";
  } catch (const ApiError& e) {
    EXPECT_EQ(e.status, 400);
    EXPECT_EQ(e.param, "rotary");
    EXPECT_NE(std::string(e.what()).find("window"), std::string::npos) << e.what();
  }
}

// The prefix cache: a request whose prompt goes on from a finished one's tokens (a conversation's next turn) reads
// only the rest - usage.prompt_tokens_details.cached_tokens counts what it did not read - and answers exactly as on a
// server without a cache (its pieces' rows are the same bits); a prompt sharing a part takes a copy of that part and
// leaves the kept session in the cache; a request with other positions (ReRoPE) never continues the server's rows;
// a budget smaller than a session keeps nothing.
TEST(Scheduler, APromptThatGoesOnFromAKeptSessionReadsOnlyTheRest) {
  const Fixture f;
  SchedulerOptions o;
  o.context = 96, o.slots = 2, o.prefill_step = 3, o.prefix_cache_bytes = 64 << 20;
  auto run = [&](Scheduler& s, const std::shared_ptr<Job>& job, std::string* text) {
    s.submit(job, "prompt");
    const Job::Update u = wait(*job, text);
    EXPECT_FALSE(u.error) << u.error->what();
    return u;
  };
  auto job_of = [&](const std::vector<int64_t>& prompt, int64_t max_new) {
    auto job = make_job(f, "x", max_new, 2.0, 11);  // (sampled: the tiny model's greedy answers repeat one token)
    job->prompt = prompt;
    return job;
  };
  Scheduler cached(f.served(), o);
  SchedulerOptions plain_options = o;
  plain_options.prefix_cache_bytes = 0;
  Scheduler plain(f.served(), plain_options);
  // The first turn: nothing kept yet.
  const std::vector<int64_t> first = f.tokenizer->encode("the first turn of a conversation about prefixes");
  auto a = job_of(first, 6);
  std::string a_text;
  EXPECT_EQ(run(cached, a, &a_text).usage.cached_tokens, 0);
  EXPECT_EQ(cached.stats().prefix_cache_entries, 1);
  EXPECT_GT(cached.stats().prefix_cache_bytes, 0);
  // The next turn: the first's prompt, its answer, more. The kept session holds the prompt and the answer's tokens
  // but the last (chosen, never run).
  engine::Session reference = f.served().new_session(o.context, nullptr);
  const std::vector<int64_t> answer = engine::generate(reference, first, a->sampling);
  ASSERT_EQ(answer.size(), 6u);
  std::vector<int64_t> second = first;
  second.insert(second.end(), answer.begin(), answer.end());
  const std::vector<int64_t> more = f.tokenizer->encode(" and then a second question");
  second.insert(second.end(), more.begin(), more.end());
  auto b = job_of(second, 8), b_plain = job_of(second, 8);
  std::string b_text, b_plain_text;
  const Job::Update ub = run(cached, b, &b_text);
  EXPECT_EQ(ub.usage.cached_tokens, int64_t(first.size()) + 5);
  EXPECT_EQ(ub.usage.prompt_tokens, int64_t(second.size()));
  EXPECT_EQ(run(plain, b_plain, &b_plain_text).usage.cached_tokens, 0);
  EXPECT_EQ(b_text, b_plain_text) << "a request that went on from the cache answers differently";
  EXPECT_FALSE(b_text.empty());
  // The second turn's session holds the first's tokens: one entry.
  EXPECT_EQ(cached.stats().prefix_cache_entries, 1);
  // A prompt sharing the first half of the first turn: a copy of that half; the entry stays.
  std::vector<int64_t> other(first.begin(), first.begin() + int64_t(first.size()) / 2);
  const std::vector<int64_t> tail = f.tokenizer->encode(" something else entirely");
  other.insert(other.end(), tail.begin(), tail.end());
  auto c = job_of(other, 5), c_plain = job_of(other, 5);
  std::string c_text, c_plain_text;
  EXPECT_EQ(run(cached, c, &c_text).usage.cached_tokens, int64_t(first.size()) / 2);
  run(plain, c_plain, &c_plain_text);
  EXPECT_EQ(c_text, c_plain_text);
  EXPECT_EQ(cached.stats().prefix_cache_entries, 2);
  EXPECT_EQ(cached.stats().prefix_cache_hits, 2);
  EXPECT_EQ(cached.stats().cached_prompt_tokens, int64_t(first.size()) + 5 + int64_t(first.size()) / 2);
  // Other positions: the same prompt as the second turn reads everything.
  auto own = job_of(second, 3);
  own->positions = f.served().positions;
  own->positions->mode = PositionMode::Rerope, own->positions->window = 4;
  EXPECT_EQ(run(cached, own, nullptr).usage.cached_tokens, 0);
  // ... and its own session is kept under its own settings: the same request again goes on from it.
  auto own_again = job_of(second, 3);
  own_again->positions = own->positions;
  EXPECT_EQ(run(cached, own_again, nullptr).usage.cached_tokens, int64_t(second.size()) - 1);
  // A budget below one session's rows keeps nothing.
  SchedulerOptions tiny = o;
  tiny.prefix_cache_bytes = 1;
  Scheduler small(f.served(), tiny);
  run(small, job_of(first, 3), nullptr);
  EXPECT_EQ(run(small, job_of(first, 3), nullptr).usage.cached_tokens, 0);
  EXPECT_EQ(small.stats().prefix_cache_entries, 0);
}

// A server whose sessions have a retrieval memory (--memory) keeps a finished request's session whole: the next turn,
// whose prompt goes on from all of its tokens, continues it (cached_tokens, and the answer of one engine session that
// read the first turn, decoded its answer and read the rest: engine::generate twice); a prompt sharing only a part
// reads everything (a memory's rows cannot be cut); a request with its own memory settings never takes the server's.
TEST(Scheduler, AMemorySessionIsKeptWholeForTheNextTurn) {
  const Fixture f;
  SchedulerOptions o;
  // (--prefill-step 4: whole memory chunks, so the pieces start where generate's chunks do)
  o.context = 256, o.slots = 2, o.prefill_step = 4, o.prefix_cache_bytes = 64 << 20;
  Scheduler s(f.served(true), o);
  auto job_of = [&](const std::vector<int64_t>& prompt, int64_t max_new) {
    auto job = make_job(f, "x", max_new, 2.0, 5);
    job->prompt = prompt;
    return job;
  };
  auto run = [&](const std::shared_ptr<Job>& job, std::string* text) {
    s.submit(job, "prompt");
    const Job::Update u = wait(*job, text);
    EXPECT_FALSE(u.error) << u.error->what();
    return u;
  };
  const std::vector<int64_t> first = f.tokenizer->encode("a first turn long enough to pass the memory's window of four");
  auto a = job_of(first, 6);
  EXPECT_EQ(run(a, nullptr).usage.cached_tokens, 0);
  EXPECT_EQ(s.stats().prefix_cache_entries, 1);
  // The reference: one session, the first turn and its answer, then the rest of the second turn's prompt.
  engine::Session reference = f.served(true).new_session(o.context, nullptr);
  const std::vector<int64_t> answer = engine::generate(reference, first, a->sampling);
  ASSERT_EQ(answer.size(), 6u);
  const std::vector<int64_t> more = f.tokenizer->encode(" and a second question about it");
  std::vector<int64_t> second = first, rest = {answer.back()};
  second.insert(second.end(), answer.begin(), answer.end());
  second.insert(second.end(), more.begin(), more.end());
  rest.insert(rest.end(), more.begin(), more.end());
  auto b = job_of(second, 8);
  const std::vector<int64_t> expected = engine::generate(reference, rest, b->sampling);
  std::vector<int64_t> tail(second.end() - 8, second.end());
  std::string b_text;
  const Job::Update ub = run(b, &b_text);
  EXPECT_EQ(ub.usage.cached_tokens, int64_t(first.size()) + 5);
  EXPECT_EQ(b_text, f.tokenizer->decode_continuation(tail, expected)) << "the continued memory session differs";
  EXPECT_EQ(s.stats().prefix_cache_entries, 1) << "the second turn's session came back in place of the first's";
  // A prompt sharing only the first half: nothing to continue.
  std::vector<int64_t> other(first.begin(), first.begin() + int64_t(first.size()) / 2);
  other.push_back(first.front());
  EXPECT_EQ(run(job_of(other, 3), nullptr).usage.cached_tokens, 0);
  // A request with its own memory settings: not the server's session, even for the same prompt.
  auto own = job_of(second, 3);
  own->memory.policy = "exact", own->memory.window = 4, own->memory.top_k = 2;
  EXPECT_EQ(run(own, nullptr).usage.cached_tokens, 0);
}

// rotary's extension: a request's own retrieval memory (exact, window 4, top-3 on the tiny model: the fixture's
// factory) runs in a session of its own beside a plain request, equal to generate on a session with that memory, and
// differs from the plain answer; the slot goes back to the server's settings after.
TEST(Scheduler, ARequestsOwnMemoryRunsBesideTheServers) {
  const Fixture f;
  SchedulerOptions o;
  // (--prefill-step 5: a memory session's pieces are whole memory chunks, 4 here, so that its chunks start where
  // generate's do)
  o.context = 96, o.slots = 2, o.prefill_step = 5, o.prefix_cache_bytes = 16 << 20;
  Scheduler s(f.served(), o);
  const std::string prompt = "a prompt long enough to pass the memory's window of four tokens";
  auto plain = make_job(f, prompt, 20, 2.0, 9), own = make_job(f, prompt, 20, 2.0, 9);
  own->memory.policy = "exact", own->memory.window = 4, own->memory.top_k = 3;
  s.submit(plain, "prompt");
  s.submit(own, "prompt");
  std::string plain_text, own_text;
  wait(*plain, &plain_text);
  const Job::Update u = wait(*own, &own_text);
  ASSERT_FALSE(u.error) << u.error->what();
  EXPECT_EQ(own_text, generate_text(f, *own, o.context));
  EXPECT_EQ(plain_text, generate_text(f, *plain, o.context));
  EXPECT_NE(own_text, plain_text) << "a memory of window 4 over 60 tokens should change the answer";
  EXPECT_EQ(u.usage.cached_tokens, 0) << "a memory session never continues the server's rows";
  auto after = make_job(f, prompt, 20, 2.0, 9);
  s.submit(after, "prompt");
  std::string after_text;
  wait(*after, &after_text);
  EXPECT_EQ(after_text, plain_text);
}

TEST(Scheduler, EndOfTurnAndStopStringsEndAnAnswerWithReasonStop) {
  const Fixture f;
  SchedulerOptions o;
  o.context = 64;
  Scheduler s(f.served(), o);
  // (sampled: the tiny model's greedy answer repeats one token) The reference answer, then the same request stopped at its second token (end of turn) and at a stop string.
  auto ref = make_job(f, "hello there", 10, 2.0, 5);
  s.submit(ref, "prompt");
  std::string full;
  wait(*ref, &full);
  ASSERT_GE(full.size(), 4u);
  std::vector<int64_t> ids = engine::generate(*std::make_unique<engine::Session>(f.served().new_session(64, nullptr)), ref->prompt,
                                              ref->sampling);
  // The first answer token that did not come before: an end of turn there leaves the tokens before it.
  size_t k = 1;
  while (k < ids.size() && std::find(ids.begin(), ids.begin() + int64_t(k), ids[k]) != ids.begin() + int64_t(k)) ++k;
  ASSERT_LT(k, ids.size()) << "the answer repeats one token: " << ::testing::PrintToString(ids);
  auto eot = make_job(f, "hello there", 10, 2.0, 5);
  eot->sampling.stop_ids = {ids[k]};
  s.submit(eot, "prompt");
  const Job::Update u = wait(*eot);
  EXPECT_EQ(u.finish, FinishReason::Stop);
  EXPECT_EQ(u.usage.completion_tokens, int64_t(k));
  auto stop = make_job(f, "hello there", 10, 2.0, 5);
  const std::string cut = full.substr(2, 2);
  stop->stop_strings = {cut};
  s.submit(stop, "prompt");
  std::string text;
  const Job::Update v = wait(*stop, &text);
  EXPECT_EQ(v.finish, FinishReason::Stop);
  EXPECT_EQ(text, full.substr(0, full.find(cut))) << "the text stops before the stop string";
}

TEST(Scheduler, RefusesByStatusAndCodeAndFreesACancelledSlot) {
  const Fixture f;
  SchedulerOptions o;
  o.context = 32, o.queue_limit = 1;
  Scheduler s(f.served(), o);
  // A prompt past the context, and a max_tokens past it.
  auto big = make_job(f, std::string(200, 'a'), 1);
  try {
    s.submit(big, "messages");
    FAIL() << "a prompt past the context was taken";
  } catch (const ApiError& e) {
    EXPECT_EQ(e.status, 400);
    EXPECT_EQ(e.code, "context_length_exceeded");
    EXPECT_EQ(e.param, "messages");
  }
  auto long_answer = make_job(f, "hi", 40);
  try {
    s.submit(long_answer, "prompt");
    FAIL() << "max_tokens past the context was taken";
  } catch (const ApiError& e) {
    EXPECT_EQ(e.code, "context_length_exceeded");
    EXPECT_EQ(e.param, "max_tokens");
  }
  // One long request runs (8k tokens to its context's end), one waits; a third finds the queue full (503).
  o.context = 8192;
  Scheduler t(f.served(), o);
  auto running = make_job(f, "hi", 0);
  auto waiting = make_job(f, "hi", 2);
  t.submit(running, "prompt");
  for (int i = 0; i < 100 && t.stats().slots_busy == 0; ++i) std::this_thread::sleep_for(10ms);
  t.submit(waiting, "prompt");
  try {
    t.submit(make_job(f, "hi", 2), "prompt");
    FAIL() << "a request past the queue's limit was taken";
  } catch (const ApiError& e) {
    EXPECT_EQ(e.status, 503);
    EXPECT_EQ(e.code, "queue_full");
  }
  // Cancelling the running one frees its slot for the waiting one.
  running->cancel();
  const Job::Update u = wait(*waiting);
  EXPECT_FALSE(u.error);
  EXPECT_EQ(u.usage.completion_tokens, 2);
  EXPECT_EQ(t.stats().requests_cancelled, 1);
  EXPECT_FALSE(running->next(0ms).finished) << "a cancelled request is not answered";
}

TEST(Scheduler, DrainFinishesRunningRequestsAndRefusesNewOnes) {
  const Fixture f;
  SchedulerOptions o;
  o.context = 64, o.slots = 2;
  Scheduler s(f.served(), o);
  auto a = make_job(f, "one", 20), b = make_job(f, "two", 20);
  s.submit(a, "prompt");
  s.submit(b, "prompt");
  s.drain(std::chrono::steady_clock::now() + 60s);
  EXPECT_TRUE(a->next(0ms).finished);
  EXPECT_EQ(wait(*b).usage.completion_tokens, 20);
  try {
    s.submit(make_job(f, "three", 2), "prompt");
    FAIL() << "a request after drain was taken";
  } catch (const ApiError& e) {
    EXPECT_EQ(e.status, 503);
    EXPECT_EQ(e.code, "shutting_down");
  }
  // A drain whose deadline has passed fails what is still running, cleanly.
  o.context = 8192;  // (8k decode steps: far longer than the drain's zero seconds)
  Scheduler t(f.served(), o);
  auto c = make_job(f, "one", 0);
  t.submit(c, "prompt");
  t.drain(std::chrono::steady_clock::now());
  const Job::Update u = wait(*c);
  ASSERT_TRUE(u.error);
  EXPECT_EQ(u.error->status, 503);
}

}  // namespace
}  // namespace rotary::server
