// Checkpoints: exact round trip of model, optimizer, RNGs and config; atomic replacement; the format version and
// a checksum over every byte (metadata included); sizes checked before allocation; every metadata field
// range-checked; format 1 still read; a clear error for a checkpoint of a different run.
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
  std::string v3 = good;
  v3[8] = 3;  // format version, little-endian
  EXPECT_NE(message(v3).find("format_version = 3"), std::string::npos);
  EXPECT_NE(message("PK\x03\x04 a zip file").find("not a rotary checkpoint"), std::string::npos);
  EXPECT_EQ(message(good), "");
}

// Tampering anywhere is caught, not resumed: one digit of the stored step, a byte of the config, the checksum
// itself, or a length field claiming gigabytes (refused from the file size, before any allocation).
TEST_F(Fixture, EveryByteIsCovered) {
  TrainConfig cfg;
  cfg.model = tiny_model();
  CheckpointMeta meta;
  meta.step = 15;
  meta.config = cfg;
  const std::string bytes = encode_checkpoint(meta, "payload bytes", "1.13.1");
  EXPECT_EQ(decode_checkpoint("ck", bytes).meta.step, 15);
  EXPECT_EQ(decode_checkpoint("ck", bytes).payload, "payload bytes");
  auto error_of = [](const std::string& b) {
    try {
      (void)decode_checkpoint("ck", b);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  std::string step = bytes;
  const size_t at = step.find("\"step\":15");
  ASSERT_NE(at, std::string::npos);
  step[at + 8] = '6';  // 15 -> 16: still a valid run state, so only the checksum can tell
  EXPECT_NE(error_of(step).find("is damaged"), std::string::npos) << error_of(step);
  std::string lr = bytes;
  lr[lr.find("\"lr\":") + 6] ^= 1;
  EXPECT_NE(error_of(lr).find("is damaged"), std::string::npos) << error_of(lr);
  std::string sum = bytes;
  sum.back() ^= 0x40;
  EXPECT_NE(error_of(sum).find("is damaged"), std::string::npos);
  std::string huge = bytes;
  huge[12 + 5] = 0x7f;  // metadata length ~ 2^46
  EXPECT_NE(error_of(huge).find("truncated or damaged"), std::string::npos) << error_of(huge);
  std::string payload_len = bytes;
  payload_len[20] ^= 1;
  EXPECT_NE(error_of(payload_len).find("truncated or damaged"), std::string::npos);
  EXPECT_NE(error_of(bytes.substr(0, 30)).find("truncated"), std::string::npos);
  EXPECT_NE(error_of(bytes + "x").find("truncated or damaged"), std::string::npos);
  EXPECT_NE(error_of(bytes).find("no error"), std::string::npos);
}

// A file whose checksum holds can still carry values no run could have written (made by hand, or by a bug): each
// field is range-checked and named.
TEST_F(Fixture, MetadataFieldsAreRangeChecked) {
  TrainConfig cfg;
  cfg.model = tiny_model();
  cfg.steps = 20;
  auto error_of = [](const CheckpointMeta& m) {
    try {
      (void)decode_checkpoint("ck", encode_checkpoint(m, "p", "x"));
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  CheckpointMeta m;
  m.config = cfg;
  m.step = 20;
  EXPECT_EQ(error_of(m), "no error");
  m.step = -1;
  EXPECT_NE(error_of(m).find("step = -1; allowed: an integer in [0, 20]"), std::string::npos) << error_of(m);
  m.step = 21;
  EXPECT_NE(error_of(m).find("step = 21"), std::string::npos);
  m.step = 0;
  TrainConfig bad = cfg;
  bad.optim.lr = -1e-3;
  m.config = bad;
  EXPECT_NE(error_of(m).find("optim.lr"), std::string::npos) << error_of(m);
  m.config = cfg;
  m.config["model"]["d_model"] = "sixteen";
  EXPECT_NE(error_of(m).find("d_model"), std::string::npos) << error_of(m);
  m.config = cfg;
  m.config["surprise"] = 1;
  EXPECT_NE(error_of(m).find("surprise"), std::string::npos) << error_of(m);
  m.config = cfg;
  std::mt19937_64 rng(5);
  m.data_rng = rng_to_text(rng);
  EXPECT_EQ(error_of(m), "no error");
  // libstdc++'s operator>> would take an index past the state and read out of bounds on the next draw.
  m.data_rng = m.data_rng.substr(0, m.data_rng.rfind(' ')) + " 999";
  EXPECT_NE(error_of(m).find("data_rng"), std::string::npos) << error_of(m);
  m.data_rng = "1 2 3";
  EXPECT_NE(error_of(m).find("data_rng"), std::string::npos);
  m.data_rng = rng_to_text(rng) + " 7";
  EXPECT_NE(error_of(m).find("data_rng"), std::string::npos);
}

// Files written before format 2 (payload-only checksum) still load; damage to their payload is still caught.
TEST_F(Fixture, FormatOneStillReads) {
  TrainConfig cfg;
  cfg.model = tiny_model();
  const std::string payload = "old payload";
  // FNV-1a 64 of the payload, as format 1 stored it (hex).
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char c : payload) h = (h ^ c) * 0x100000001b3ull;
  char hex[17];
  std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(h));
  const std::string meta = nlohmann::json{{"format_version", 1},      {"step", 3},
                                          {"config", nlohmann::json(cfg)}, {"data_rng", ""},
                                          {"payload_bytes", payload.size()}, {"payload_fnv1a64", hex},
                                          {"torch_version", "1.13.1"}}
                               .dump();
  std::string v1("ROTARYCK", 8);
  for (int i = 0; i < 4; ++i) v1.push_back(static_cast<char>(i == 0 ? 1 : 0));
  for (int i = 0; i < 8; ++i) v1.push_back(static_cast<char>((meta.size() >> (8 * i)) & 0xff));
  v1 += meta + payload;
  const DecodedCheckpoint d = decode_checkpoint("old", v1);
  EXPECT_EQ(d.meta.format_version, 1u);
  EXPECT_EQ(d.meta.step, 3);
  EXPECT_EQ(d.payload, payload);
  v1.back() ^= 1;
  EXPECT_THROW((void)decode_checkpoint("old", v1), Error);
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
