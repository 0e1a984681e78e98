// rotary reproduce: the verdict rule, the scales' run descriptions (the seed scale is the seed's settings as
// examples/runs/ hold them), and bad input. The whole command at smoke scale: tests/cli/test_reproduce_smoke.sh.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>

#include "common/files.h"
#include "experiments/example_runs.h"
#include "experiments/reproduce.h"
#include "rotary/error.h"
#include "train/config.h"

namespace rotary::experiments {
namespace {

using train::TrainConfig;

TEST(Reproduce, OrderingVerdictWeighsTheDifferenceAgainstTheSpread) {
  // Every run of the expected winner beats every run of the other.
  EXPECT_EQ(ordering_verdict({0.60, 0.62, 0.65}, {0.40, 0.45, 0.50}, true), "reproduced");
  EXPECT_EQ(ordering_verdict({2.70, 2.71}, {2.80, 2.90}, false), "reproduced");
  // Means in order (after dropping each side's worst run), ranges overlapping.
  EXPECT_EQ(ordering_verdict({0.45, 0.66, 0.67}, {0.62, 0.63, 0.64}, true), "same ordering, within noise");
  // The other way round.
  EXPECT_EQ(ordering_verdict({0.40, 0.45}, {0.60, 0.62}, true), "not reproduced");
  EXPECT_EQ(ordering_verdict({2.9, 2.8}, {2.7, 2.75}, false), "not reproduced");
  // A diverged run (NaN) is left out; nothing finite on one side is "not measured".
  EXPECT_EQ(ordering_verdict({0.6, std::nan("")}, {0.4}, true), "reproduced");
  EXPECT_EQ(ordering_verdict({std::nan("")}, {0.4}, true), "not measured");
  EXPECT_EQ(ordering_verdict({}, {0.4}, true), "not measured");
}

// Every example run file is compiled in (experiments/example_runs.h) as it is on disk, and reads as a run; another
// name is refused naming the ones there are.
TEST(ExampleRuns, AreTheFilesOnDiskAndReadAsRuns) {
  const std::filesystem::path dir = std::filesystem::path(ROTARY_SOURCE_DIR) / "examples" / "runs";
  size_t on_disk = 0;
  for (const auto& entry : std::filesystem::directory_iterator(dir))
    if (entry.path().extension() == ".toml") ++on_disk;
  ASSERT_GT(on_disk, 0u);
  EXPECT_EQ(example_runs().size(), on_disk);
  for (const ExampleRun& r : example_runs()) {
    EXPECT_EQ(std::string(r.toml), lab::read_file(dir / (std::string(r.name) + ".toml"))) << r.name;
    EXPECT_NO_THROW(example_run(r.name).validate()) << r.name;
  }
  try {
    example_run("seed000-division");
    ADD_FAILURE() << "an unknown example run was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("seed000-addition"), std::string::npos) << e.what();
  }
}

// The seed scale trains the seed's own models: the example run files of seed 000 (read from the compiled-in text;
// compared here with the files as a user loads them).
TEST(Reproduce, SeedScaleIsTheSeedsSettings) {
  ReproduceSpec spec;
  spec.scale = "seed";
  const std::pair<const char*, const char*> studies[] = {
      {"seed000_addition", "seed000-addition.toml"},
      {"seed000_substring_index", "seed000-substring-index.toml"},
      {"seed000_substring_search", "seed000-substring-search.toml"}};
  for (const auto& [study, file] : studies) {
    const CompareSpec c = reproduce_compare_spec(spec, study);
    TrainConfig want = train::load_config_file(std::string(ROTARY_SOURCE_DIR) + "/examples/runs/" + file);
    nlohmann::json a = c.base, b = want;
    // What a compare sets per run, and bookkeeping, may differ.
    for (nlohmann::json* j : {&a, &b}) {
      j->erase("out_dir");
      j->erase("threads");
      (*j)["model"]["encoding"].erase("kind");
    }
    EXPECT_EQ(train::first_difference(a, b), "") << study << " vs " << file;
    EXPECT_EQ(c.encodings, (std::vector<std::string>{"rope", "roper"})) << study;
    EXPECT_EQ(c.seeds, 10) << "seed 000 ran 10 sessions per method";
  }
  const CompareSpec text = reproduce_compare_spec(spec, "seed002_text");
  EXPECT_EQ(text.base.model.d_model, 768);
  EXPECT_EQ(text.base.model.n_layers, 12);
  EXPECT_EQ(reproduce_compare_spec(spec, "seed002_performer").base.model.n_layers, 8);
  EXPECT_EQ(reproduce_extrapolate_spec(spec).text.seq_len, 512) << "seed 004 trains at 512";
}

// Every scale's run descriptions are valid for every encoding they compare, live under the reproduce output
// directory, and the smoke scale is small.
TEST(Reproduce, EveryScaleDescribesValidRuns) {
  for (std::string_view scale : kReproduceScales) {
    ReproduceSpec spec;
    spec.scale = std::string(scale);
    spec.out_dir = "/tmp/reproduce_out";
    EXPECT_NO_THROW(validate(spec));
    for (std::string_view study : kReproduceStudies) {
      const std::string s(study);
      if (s == "seed002_runtime" || s == "seed003_decay" || s == "seed004_extrapolate" || s == "seed001_memory")
        continue;
      const CompareSpec c = reproduce_compare_spec(spec, s);
      EXPECT_EQ(c.out_dir, "/tmp/reproduce_out/" + s);
      for (const std::string& enc : c.encodings) {
        TrainConfig t = c.base;
        t.model.encoding.kind = nn::parse_encoding_kind(enc, "encodings");
        EXPECT_NO_THROW(t.validate()) << scale << " " << s << " " << enc;
      }
      if (scale == "smoke") {
        EXPECT_LE(c.base.steps * c.seeds * int64_t(c.encodings.size()), 16 * 2 * 6) << s;
      }
    }
    const ExtrapolateSpec e = reproduce_extrapolate_spec(spec);
    EXPECT_NO_THROW(validate(e)) << scale;
    const MemorySpec m = reproduce_memory_spec(spec);
    EXPECT_NO_THROW(validate(m)) << scale;
    EXPECT_EQ(m.out_dir, "/tmp/reproduce_out/seed001_memory");
    if (scale == "smoke") {
      EXPECT_LE(m.run.steps * int64_t(m.multiples.size()) * m.problems, 16 * 2 * 2);
    }
    EXPECT_EQ(e.text.out_dir, "/tmp/reproduce_out/seed004_extrapolate/text_model");
  }
  ReproduceSpec d;
  const CompareSpec text = reproduce_compare_spec(d, "seed002_text");
  EXPECT_EQ(text.encodings, (std::vector<std::string>{"learned", "t5", "rope", "sinusoidal", "alibi", "roper"}));
  EXPECT_EQ(text.base.task, "text");
  EXPECT_EQ(text.base.eval_problems, 0);
  const CompareSpec perf = reproduce_compare_spec(d, "seed002_performer");
  EXPECT_EQ(perf.base.model.attention, nn::AttentionKind::Performer);
  EXPECT_EQ(perf.base.task_options.text_tokenizer, "char");
  EXPECT_EQ(perf.encodings, (std::vector<std::string>{"none", "rope"}));
}

TEST(Reproduce, BadInputNamesTheField) {
  auto rejects = [](const ReproduceSpec& s, const std::string& field) {
    try {
      validate(s);
      ADD_FAILURE() << "accepted a bad " << field;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(field), std::string::npos) << e.what();
    }
  };
  ReproduceSpec s;
  s.scale = "huge";
  rejects(s, "scale");
  s = {};
  s.studies = {"seed005_unknown"};
  rejects(s, "studies");
  s.studies = {"seed002_text", "seed002_text"};
  rejects(s, "studies");
  s = {};
  s.jobs = -1;
  rejects(s, "jobs");
  EXPECT_THROW(reproduce_compare_spec(ReproduceSpec{}, "seed002_runtime"), Error);
}

}  // namespace
}  // namespace rotary::experiments
