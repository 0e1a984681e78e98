// Checkpoints: exact round trip of model, optimizer, RNGs and config; atomic replacement; the format version and
// checksum; a clear error for a checkpoint of a different run.
#include <gtest/gtest.h>

#include <filesystem>

#include "common/files.h"
#include "rotary/error.h"
#include "rotary_nn/model.h"
#include "train/checkpoint.h"
#include "train/config.h"

namespace rotary::train {
namespace {

namespace fs = std::filesystem;

nn::ModelConfig tiny_model() {
  nn::ModelConfig m;
  m.vocab_size = 11;
  m.d_model = 16;
  m.n_layers = 1;
  m.n_heads = 1;
  return m;
}

struct Fixture : ::testing::Test {
  std::string dir;
  void SetUp() override {
    dir = (fs::temp_directory_path() / ("rotary_ckpt_" + std::to_string(::getpid()) + "_" +
                                        ::testing::UnitTest::GetInstance()->current_test_info()->name()))
              .string();
    fs::remove_all(dir);
    fs::create_directories(dir);
  }
  void TearDown() override { fs::remove_all(dir); }

  // One AdamW step so that the optimizer has moments to save.
  static void step(nn::Transformer& model, torch::optim::AdamW& opt) {
    torch::Tensor tokens = torch::arange(8, torch::kInt64).remainder(11).view({1, 8});  // [1, 8]
    opt.zero_grad();
    model->forward(tokens).pow(2).mean().backward();
    opt.step();
  }
};

TEST_F(Fixture, RoundTripRestoresEverythingExactly) {
  torch::manual_seed(3);
  nn::Transformer a(tiny_model());
  torch::optim::AdamW opt_a(a->parameters(), torch::optim::AdamWOptions(1e-2));
  step(a, opt_a);
  std::mt19937_64 rng(42);
  rng.discard(5);
  TrainConfig cfg;
  cfg.model = tiny_model();
  CheckpointMeta meta;
  meta.step = 1;
  meta.config = cfg;
  meta.data_rng = rng_to_text(rng);
  const std::string path = lab::join_path(dir, "checkpoint.pt");
  torch::manual_seed(99);
  save_checkpoint(path, meta, *a, &opt_a);
  const double next_random_after_save = torch::rand({1}).item<double>();

  torch::manual_seed(4);  // different init
  nn::Transformer b(tiny_model());
  torch::optim::AdamW opt_b(b->parameters(), torch::optim::AdamWOptions(1e-2));
  CheckpointMeta back = load_checkpoint(path, *b, &opt_b, /*restore_torch_rng=*/true);
  EXPECT_EQ(torch::rand({1}).item<double>(), next_random_after_save);  // the torch generator came back
  EXPECT_EQ(back.step, 1);
  EXPECT_EQ(back.config, meta.config);
  std::mt19937_64 rng_back = rng_from_text(back.data_rng);
  EXPECT_EQ(rng_back(), rng());

  auto pa = a->named_parameters(), pb = b->named_parameters();
  ASSERT_EQ(pa.size(), pb.size());
  for (const auto& item : pa) EXPECT_TRUE(torch::equal(item.value(), pb[item.key()])) << item.key();
  // Same moments: one more identical step gives identical parameters.
  step(a, opt_a);
  step(b, opt_b);
  for (const auto& item : a->named_parameters()) EXPECT_TRUE(torch::equal(item.value(), pb[item.key()])) << item.key();
  EXPECT_EQ(read_checkpoint_meta(path).step, 1);
}

TEST_F(Fixture, SavingAgainReplacesAtomicallyAndLeavesNoTemporaryFiles) {
  nn::Transformer m(tiny_model());
  CheckpointMeta meta;
  meta.config = nlohmann::json::object();
  const std::string path = lab::join_path(dir, "checkpoint.pt");
  for (int64_t s : {5, 10}) {
    meta.step = s;
    save_checkpoint(path, meta, *m, nullptr);
  }
  EXPECT_EQ(read_checkpoint_meta(path).step, 10);
  int files = 0;
  for (const auto& e : fs::directory_iterator(dir)) {
    ++files;
    EXPECT_EQ(e.path().filename(), "checkpoint.pt");
  }
  EXPECT_EQ(files, 1);
  // An inference export has no optimizer state: resuming from it is refused with a reason.
  torch::optim::AdamW opt(m->parameters());
  EXPECT_THROW(load_checkpoint(path, *m, &opt, false), Error);
}

TEST_F(Fixture, DamageTruncationAndUnknownVersionsAreReported) {
  nn::Transformer m(tiny_model());
  CheckpointMeta meta;
  meta.config = nlohmann::json::object();
  const std::string path = lab::join_path(dir, "checkpoint.pt");
  save_checkpoint(path, meta, *m, nullptr);
  const std::string good = lab::read_file(path);
  auto message = [&](const std::string& bytes) {
    lab::write_file_atomic(path, bytes);
    try {
      load_checkpoint(path, *m, nullptr, false);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  std::string flipped = good;
  flipped[flipped.size() - 100] ^= 0x5a;
  EXPECT_NE(message(flipped).find("damaged"), std::string::npos);
  EXPECT_NE(message(good.substr(0, good.size() - 10)).find("truncated"), std::string::npos);
  std::string v2 = good;
  v2[8] = 2;  // format version, little-endian
  EXPECT_NE(message(v2).find("format_version = 2"), std::string::npos);
  EXPECT_NE(message("PK\x03\x04 a zip file").find("not a rotary checkpoint"), std::string::npos);
  EXPECT_EQ(message(good), "");
}

TEST_F(Fixture, MismatchedConfigNamesTheField) {
  TrainConfig a, b;
  b.model.encoding.kind = nn::EncodingKind::Roper;
  try {
    check_config_matches("ck.pt", nlohmann::json(a), nlohmann::json(b));
    FAIL() << "no error";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("model.encoding.kind = \"rope\" in the checkpoint, \"roper\" in this run"), std::string::npos) << m;
  }
  b = a;
  b.out_dir = "moved";  // bookkeeping: resuming a copied run directory is fine
  EXPECT_NO_THROW(check_config_matches("ck.pt", nlohmann::json(a), nlohmann::json(b)));
}

}  // namespace
}  // namespace rotary::train
