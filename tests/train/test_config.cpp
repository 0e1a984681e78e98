// Run settings: TOML files, flags over files, JSON round trip, bad values named, config differences.
#include <gtest/gtest.h>

#include <filesystem>
#include <set>
#include <system_error>
#include <vector>

#include "cli/torch/train_flags.h"
#include "common/files.h"
#include "rotary/error.h"
#include "tasks/task.h"
#include "train/config.h"

namespace rotary::train {
namespace {

namespace fs = std::filesystem;

// The files temp_file wrote, removed when the test program ends (under ctest each test is a process of its own).
struct TempFiles {
  std::vector<fs::path> paths;
  ~TempFiles() {
    for (const fs::path& p : paths) {
      std::error_code ignored;
      fs::remove(p, ignored);
    }
  }
};

std::string temp_file(const std::string& name, const std::string& text) {
  static TempFiles written;
  const fs::path p = fs::temp_directory_path() / ("rotary_cfg_" + std::to_string(::getpid()) + "_" + name);
  lab::write_file_atomic(p.string(), text);
  written.paths.push_back(p);
  return p.string();
}

// The message of the rotary::Error that f throws ("" if none).
template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

constexpr const char* kToml = R"(
task = "substring_index"
seq_len = 64
batch_size = 8
steps = 300
seed = 7
out_dir = "runs/x"

[task_options]
min_string = 3
max_string = 9

[model]
d_model = 32
n_layers = 3
n_heads = 2
fused = false

[model.encoding]
kind = "roper"
rotary_fraction = 0.5

[model.encoding.rope]
base = 500.0
layout = "interleaved"

[optim]
lr = 0.002
warmup_steps = 20
grad_clip = 0.5
)";

TEST(Config, TomlSetsTheGivenFieldsAndKeepsDefaultsForTheRest) {
  const TrainConfig c = load_config_file(temp_file("ok.toml", kToml));
  const TrainConfig d;
  EXPECT_EQ(c.task, "substring_index");
  EXPECT_EQ(c.seq_len, 64);
  EXPECT_EQ(c.steps, 300);
  EXPECT_EQ(c.seed, 7u);
  EXPECT_EQ(c.task_options.min_string, 3);
  EXPECT_EQ(c.task_options.max_digits, d.task_options.max_digits);
  EXPECT_EQ(c.model.d_model, 32);
  EXPECT_FALSE(c.model.fused);
  EXPECT_EQ(c.model.n_kv_heads, d.model.n_kv_heads);
  EXPECT_EQ(c.model.encoding.kind, nn::EncodingKind::Roper);
  EXPECT_EQ(c.model.encoding.rotary_fraction, 0.5);
  EXPECT_EQ(c.model.encoding.rope.base, 500.0);
  EXPECT_EQ(c.model.encoding.rope.layout, RopeLayout::Interleaved);
  EXPECT_EQ(c.optim.lr, 0.002);
  EXPECT_EQ(c.optim.beta2, d.optim.beta2);
  EXPECT_EQ(c.optim.grad_clip, 0.5);
  EXPECT_NO_THROW(c.validate());
}

TEST(Config, JsonRoundTripIsExact) {
  const TrainConfig c = load_config_file(temp_file("rt.toml", kToml));
  const nlohmann::json j = c;
  TrainConfig back;
  from_json(j, back);
  EXPECT_EQ(nlohmann::json(back), j);
  EXPECT_EQ(first_difference(nlohmann::json(back), j), "");
}

TEST(Config, UnknownAndIllTypedFieldsAreNamed) {
  EXPECT_NE(error_of([] { load_config_file(temp_file("u.toml", "[optim]\nlrr = 1\n")); }).find("optim.lrr"),
            std::string::npos);
  EXPECT_NE(error_of([] { load_config_file(temp_file("u2.toml", "stepz = 1\n")); }).find("stepz"), std::string::npos);
  const std::string typed = error_of([] { load_config_file(temp_file("t.toml", "steps = \"many\"\n")); });
  EXPECT_NE(typed.find("steps"), std::string::npos) << typed;
  EXPECT_NE(typed.find("integer"), std::string::npos) << typed;
  EXPECT_NE(error_of([] { load_config_file(temp_file("t2.toml", "seed = -3\n")); }).find("seed"), std::string::npos);
  EXPECT_NE(error_of([] { load_config_file(temp_file("m.toml", "[model]\nd_modle = 3\n")); }).find("d_modle"),
            std::string::npos);
}

TEST(Config, TomlSyntaxErrorNamesFileAndLine) {
  const std::string path = temp_file("syntax.toml", "steps = 10\nlr = = 3\n");
  const std::string e = error_of([&] { load_config_file(path); });
  EXPECT_NE(e.find(path + ":2:"), std::string::npos) << e;
}

TEST(Config, ValidateNamesTheBadField) {
  auto bad = [](auto mutate) {
    TrainConfig c;
    mutate(c);
    return error_of([&] { c.validate(); });
  };
  EXPECT_NE(bad([](TrainConfig& c) { c.seq_len = 1; }).find("seq_len = 1"), std::string::npos);
  EXPECT_NE(bad([](TrainConfig& c) { c.batch_size = 0; }).find("batch_size = 0"), std::string::npos);
  EXPECT_NE(bad([](TrainConfig& c) { c.optim.beta1 = 1.0; }).find("optim.beta1 = 1"), std::string::npos);
  EXPECT_NE(bad([](TrainConfig& c) { c.optim.lr = -1; }).find("optim.lr"), std::string::npos);
  const std::string task = bad([](TrainConfig& c) { c.task = "multiplication"; });
  EXPECT_NE(task.find("task = multiplication"), std::string::npos) << task;
  EXPECT_NE(task.find("addition"), std::string::npos) << task;  // lists the choices
  const std::string enc = error_of([] {
    TrainConfig c;
    from_json(nlohmann::json{{"model", {{"encoding", {{"kind", "ropex"}}}}}}, c);
  });
  EXPECT_NE(enc.find("ropex"), std::string::npos) << enc;
  EXPECT_NE(enc.find("roper"), std::string::npos) << enc;
  EXPECT_EQ(bad([](TrainConfig&) {}), "");
}

// Fields each inside its range whose product is not: a step of 2^20 rows of 2^20 tokens (made at once: it ran the
// machine out of memory) and 2^20 x 2^20 held-out rows (counted in an int) are refused, naming the product.
TEST(Config, ProductsOfFieldsAreBounded) {
  auto bad = [](auto mutate) {
    TrainConfig c;
    mutate(c);
    return error_of([&] { c.validate(); });
  };
  const std::string step = bad([](TrainConfig& c) { c.batch_size = 1 << 20, c.seq_len = 1 << 20; });
  EXPECT_NE(step.find("batch_size x seq_len = 1048576 x 1048576 = 1099511627776 is invalid"), std::string::npos) << step;
  const std::string heldout = bad([](TrainConfig& c) { c.batch_size = 1 << 11, c.seq_len = 2, c.eval_batches = 1 << 20; });
  EXPECT_NE(heldout.find("eval_batches x batch_size = 1048576 x 2048 = 2147483648"), std::string::npos) << heldout;
  EXPECT_EQ(bad([](TrainConfig& c) { c.batch_size = 64, c.seq_len = 1 << 20; }), "");  // 2^26 tokens: the bound
}

TEST(Config, FirstDifferenceFindsNestedFieldsAndIgnoresBookkeeping) {
  TrainConfig a, b;
  b.out_dir = "elsewhere";
  b.threads = 3;
  b.checkpoint_interval = 17;
  EXPECT_EQ(first_difference(nlohmann::json(a), nlohmann::json(b)), "");
  b.model.encoding.rope.base = 20000;
  EXPECT_EQ(first_difference(nlohmann::json(a), nlohmann::json(b)), "model.encoding.rope.base");
  EXPECT_EQ(value_at(nlohmann::json(b), "model.encoding.rope.base"), "20000.0");
  // 1 and 1.0 are the same setting.
  EXPECT_EQ(first_difference(nlohmann::json{{"x", 1}}, nlohmann::json{{"x", 1.0}}), "");
  EXPECT_EQ(first_difference(nlohmann::json{{"x", 1}}, nlohmann::json::object()), "x");
}

// Flags override the file; flags that are not given leave the file's values alone.
TEST(Config, FlagsOverrideTheFile) {
  CLI::App app;
  cli::TrainFlags flags;
  flags.add_to(app);
  const std::string path = temp_file("flags.toml", kToml);
  std::vector<std::string> args = {"--lr", "0.01", "--encoding", "rope", "--config", path, "--rope-scaling", "linear",
                                   "--rope-factor", "2", "--norm", "post"};
  std::reverse(args.begin(), args.end());  // CLI11 takes the vector in reverse order
  app.parse(args);
  const TrainConfig c = flags.resolve(TrainConfig{});
  EXPECT_EQ(c.optim.lr, 0.01);                      // flag
  EXPECT_EQ(c.optim.warmup_steps, 20);              // file
  EXPECT_EQ(c.model.encoding.kind, nn::EncodingKind::Rope);         // flag over file's roper
  EXPECT_EQ(c.model.encoding.rotary_fraction, 0.5); // file
  EXPECT_EQ(c.model.encoding.rope.scaling, RopeScaling::Linear);
  EXPECT_EQ(c.model.encoding.rope.factor, 2.0);
  EXPECT_FALSE(c.model.pre_norm);
  EXPECT_EQ(c.steps, 300);
  EXPECT_TRUE(flags.any_given());
}

TEST(Config, BadFlagValuesAreNamed) {
  auto resolve_with = [](std::vector<std::string> args) {
    CLI::App app;
    cli::TrainFlags flags;
    flags.add_to(app);
    std::reverse(args.begin(), args.end());
    try {
      app.parse(args);
    } catch (const CLI::ParseError& e) {
      return std::string(e.what());  // refused by the flag's own range (cli/options.h)
    }
    return error_of([&] { flags.resolve(TrainConfig{}).validate(); });
  };
  EXPECT_NE(resolve_with({"--rope-scaling", "squash"}).find("squash"), std::string::npos);
  const std::string norm = resolve_with({"--norm", "middle"});
  EXPECT_NE(norm.find("--norm: middle not in {post,pre}"), std::string::npos) << norm;
  EXPECT_NE(resolve_with({"--steps", "0"}).find("--steps: value 0 is not a decimal integer in [1, "), std::string::npos);
  EXPECT_NE(resolve_with({"--seed", "-1"}).find("--seed"), std::string::npos);  // not 2^64 - 1
  EXPECT_NE(resolve_with({"--warmup", "9223372036854775808"}).find("--warmup"), std::string::npos);  // not clamped
  EXPECT_NE(resolve_with({"--lr", "nan"}).find("--lr"), std::string::npos);
  // A value inside the flag's range can still fail the config's own rules, named by the field.
  EXPECT_NE(resolve_with({"--n-heads", "3"}).find("n_heads = 3"), std::string::npos);
  CLI::App app;
  cli::TrainFlags flags;
  flags.add_to(app);
  EXPECT_THROW(app.parse(std::vector<std::string>{"abc", "--lr"}), CLI::ParseError);  // not a number
}

// Hostile run configs (found by fuzz/): what used to crash, hit undefined behaviour or slip through.
TEST(Config, IntegersBeyondTheirTypeAreRefusedNotCast) {
  // 2^63 passed a `<= double(INT64_MAX)` test (INT64_MAX rounds up to 2^63 as a double) and was then cast to
  // int64: undefined behaviour, in practice steps = INT64_MIN. Likewise 2^64 for the uint64 seed.
  for (const char* toml : {"steps = 9.3e18", "steps = 9223372036854775808.0", "seed = 18446744073709551616.0",
                           "seq_len = 2147483648.0", "seed = -1.0"}) {
    TrainConfig c;
    const std::string e = error_of([&] { from_json(toml_to_json(toml, "t.toml"), c); });
    EXPECT_NE(e.find(std::string(toml).substr(0, std::string(toml).find(' '))), std::string::npos) << toml << ": " << e;
  }
  TrainConfig c;
  from_json(nlohmann::json::parse(R"({"seed": 18446744073709551615, "steps": 1099511627776})"), c);
  EXPECT_EQ(c.seed, UINT64_MAX);  // integers compare exactly, not through a double
  EXPECT_EQ(c.steps, int64_t{1} << 40);  // the top of steps' declared range
  EXPECT_NE(error_of([&] { from_json(nlohmann::json::parse(R"({"steps": 1099511627777})"), c); })
                .find("steps = 1099511627777 is invalid; allowed: an integer in [1, 1099511627776]"),
            std::string::npos);
  from_json(toml_to_json("seed = 18446744073709549568.0", "t.toml"), c);
  EXPECT_EQ(c.seed, uint64_t(18446744073709549568ULL));  // the largest double below 2^64 still fits
}

TEST(Config, DeepNestingIsRefusedByDepthNotByTheStack) {
  // A value 100000 arrays deep under a known field: writing its error message used to recurse in json::dump
  // until the stack overflowed.
  for (const char* field : {"task_options", "optim", "model", "steps"}) {
    // Built in place and moved: a copy of it would recurse as deep as dump() does.
    nlohmann::json config = nlohmann::json::object();
    nlohmann::json* inner = &config[field];
    for (int i = 0; i < 100000; ++i) {
      *inner = nlohmann::json::array();
      inner->push_back(nullptr);
      inner = &inner->back();
    }
    TrainConfig c;
    const std::string e = error_of([&] { from_json(config, c); });
    EXPECT_NE(e.find(field), std::string::npos) << e.substr(0, 200);
    EXPECT_NE(e.find(" = [[[["), std::string::npos) << e.substr(0, 200);
    EXPECT_LT(e.size(), 400u);
  }
  // TOML nests through arrays of arrays and through dotted keys (one table per part); the JSON made from it
  // gets the bound JSON text gets.
  const std::string arrays = "a = " + std::string(100, '[') + std::string(100, ']');
  EXPECT_NE(error_of([&] { toml_to_json(arrays, "t.toml"); }).find("t.toml nesting depth = 101"), std::string::npos);
  std::string dotted = "a";
  for (int i = 0; i < 1000; ++i) dotted += ".a";
  EXPECT_NE(error_of([&] { toml_to_json(dotted + " = 1", "t.toml"); }).find("t.toml nesting depth = 1001"),
            std::string::npos);
  EXPECT_EQ(error_of([&] { toml_to_json("a = " + std::string(60, '[') + std::string(60, ']'), "t.toml"); }), "");
}

// toml++ 3.3.0 reached __builtin_unreachable() on U+00A1..U+0499 (and two other ranges) wherever it looked for
// whitespace, and assumed a key after '[' (undefined behaviour under clang, an assertion in debug builds). Now:
// syntax errors where the text is wrong, and the character kept where it is right.
TEST(Config, TomlParserEdgeCasesAreSyntaxErrorsOrValues) {
  EXPECT_NE(error_of([] { toml_to_json("\xc3\xa9 = 1\n", "t.toml"); }).find("t.toml:1:"), std::string::npos);
  EXPECT_NE(error_of([] { toml_to_json("[=", "t.toml"); }).find("t.toml:1:"), std::string::npos);
  EXPECT_NE(error_of([] { toml_to_json(std::string("[\0", 2), "t.toml"); }).find("TOML syntax error"),
            std::string::npos);
  const nlohmann::json j = toml_to_json("out_dir = \"\"\"\\\n  \xc2\xa7runs\"\"\"\n", "t.toml");
  EXPECT_EQ(j.at("out_dir"), "\xc2\xa7runs");
}

// ---- Every setting declared once (train_settings): JSON, TOML, flags, validate() and --print-config -----------

TEST(Settings, PathsAndFlagsAreUniqueAndEveryFlagIsOnTheCommandLine) {
  CLI::App app;
  cli::TrainFlags flags;
  flags.add_to(app);
  std::set<std::string> paths, flag_names;
  for (const auto& s : train_settings()) {
    EXPECT_TRUE(paths.insert(s.path).second) << "declared twice: " << s.path;
    EXPECT_FALSE(s.help.empty()) << s.path;
    if (s.flag.empty()) continue;
    EXPECT_TRUE(flag_names.insert(s.flag).second) << "flag used twice: " << s.flag;
    EXPECT_NE(app.get_option_no_throw(s.flag), nullptr) << s.flag;
  }
  // The 49 flags `rotary train` had before the table (d12db00), + 2 of t5, + 8 of the checkpoint architectures
  // (--head-dim, --normalization, --norm-eps, --mlp, --qkv-bias, --out-bias, --mlp-bias, --parallel-residual),
  // + 2 of the performer (--performer-features, --performer-redraw), + 1 of the text task (--text-tokenizer),
  // + 4 of kv_retrieval (--kv-key-len, --kv-queries, --kv-loss, --kv-min-pairs), + 2 of passkey (--passkey-digits,
  // --passkey-eval-len), + 1 of the model's start (--init).
  EXPECT_EQ(flag_names.size(), 71u);
}

TEST(Settings, TheJsonFormIsTheOneEarlierVersionsStored) {
  // `rotary train --print-config` before the settings were declared in one table (commit d12db00): checkpoints
  // store this form, and compare it field by field on --resume.
  const nlohmann::json before = nlohmann::json::parse(
      lab::read_file(ROTARY_SOURCE_DIR "/tests/data/train_configs/default_before_settings_table.json"));
  EXPECT_EQ(nlohmann::json(TrainConfig{}), before);
  TrainConfig c;
  c.steps = 5;
  from_json(before, c);
  EXPECT_EQ(nlohmann::json(c), before);
  for (const auto& s : train_settings()) {  // every setting written for this config is in the stored form
    if (!s.written || s.written(c)) {
      EXPECT_TRUE(settings::find_path(before, s.path) != nullptr || s.allowed.optional) << s.path;
    }
  }
  // A field of a kind added later (t5) stays out of the other kinds' JSON, and is there for its own.
  EXPECT_EQ(settings::find_path(nlohmann::json(c), "model.encoding.t5_num_buckets"), nullptr);
  c.model.encoding.kind = nn::EncodingKind::T5;
  EXPECT_NE(settings::find_path(nlohmann::json(c), "model.encoding.t5_num_buckets"), nullptr);
}

TEST(Settings, TheTomlFileOfAConfigReadsBackToTheSameConfig) {
  TrainConfig c = load_config_file(temp_file("rt_in.toml", kToml));
  c.model.encoding.rope.yarn.mscale = 0.7;
  c.model.encoding.rope.short_factor = {1.0, 2.5};
  c.seed = UINT64_MAX;  // beyond TOML's int64: written as a string, read back exactly
  c.optim.eps = 1e-9;
  c.task_options.cache_dir = "a \"quoted\" dir";
  const std::string toml = to_toml(c);
  const TrainConfig back = load_config_file(temp_file("rt_out.toml", toml));
  EXPECT_EQ(nlohmann::json(back), nlohmann::json(c)) << toml;
  EXPECT_NE(toml.find("# AdamW peak learning rate [--lr]; a number > 0\nlr = 0.002"), std::string::npos) << toml;
  EXPECT_NE(toml.find("[model.encoding.rope.yarn]"), std::string::npos) << toml;
  EXPECT_NE(toml.find("# attention_factor = (unset)"), std::string::npos) << toml;  // optional, not set
}

// A range is declared once and the file, the flag and validate() refuse the same values with it.
TEST(Settings, EachRangeIsTheSameForTheFileTheFlagAndValidate) {
  const std::string file = error_of([] { load_config_file(temp_file("lr0.toml", "[optim]\nlr = 0\n")); });
  EXPECT_NE(file.find("optim.lr = 0 is invalid; allowed: a number > 0"), std::string::npos) << file;
  CLI::App app;
  cli::TrainFlags flags;
  flags.add_to(app);
  app.parse(std::vector<std::string>{"0", "--lr"});
  const std::string flag = error_of([&] { flags.resolve(TrainConfig{}); });
  EXPECT_NE(flag.find("--lr = 0.0 is invalid; allowed: a number > 0"), std::string::npos) << flag;
  TrainConfig c;
  c.optim.lr = 0;
  EXPECT_NE(error_of([&] { c.validate(); }).find("optim.lr = 0.0 is invalid; allowed: a number > 0"), std::string::npos);

  c = TrainConfig{};
  c.model.n_heads = 5000;
  EXPECT_NE(error_of([&] { c.validate(); }).find("model.n_heads = 5000 is invalid; allowed: an integer in [1, 4096]"),
            std::string::npos);
  CLI::App app2;
  cli::TrainFlags flags2;
  flags2.add_to(app2);
  try {
    app2.parse(std::vector<std::string>{"5000", "--n-heads"});
    ADD_FAILURE() << "--n-heads 5000 was accepted";
  } catch (const CLI::ParseError& e) {
    EXPECT_NE(std::string(e.what()).find("[1, 4096]"), std::string::npos) << e.what();
  }
  // A task option's range is the task's own: make_task refuses what the config refuses.
  c = TrainConfig{};
  c.task_options.max_digits = 201;
  EXPECT_NE(error_of([&] { c.validate(); }).find("task_options.max_digits = 201"), std::string::npos);
  EXPECT_NE(error_of([&] { lab::make_task("addition", c.task_options); }).find("max_digits = 201"), std::string::npos);
}

}  // namespace
}  // namespace rotary::train
