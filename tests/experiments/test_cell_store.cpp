// The store every experiment resumes from (lab/experiments/cell_store.h): a cell is reused only under the settings
// it was computed with; a missing, damaged or foreign file, or a result the experiment cannot read, is one case -
// computed again - and reported as which; non-finite numbers survive the round trip as NaN (so a NaN cell is
// reused, not recomputed on every rerun).
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <stdexcept>
#include <unistd.h>

#include "common/files.h"
#include "experiments/cell_store.h"

namespace rotary::experiments {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

struct ScratchDir {
  fs::path path = fs::temp_directory_path() / ("rotary_cell_store_" + std::to_string(::getpid()));
  ScratchDir() { fs::remove_all(path); }
  ~ScratchDir() { fs::remove_all(path); }
};

TEST(CellStore, ReusesOnlyUnderTheSameSettingsAndSaysWhyNot) {
  ScratchDir dir;
  const CellStore store((dir.path / "cells").string());
  const json settings{{"method", "rerope"}, {"length", 512}};
  json got;
  auto keep = [&](const json& result) { got = result; };

  EXPECT_EQ(store.find("rerope/T512.json", settings, keep), CellLookup::Missing);
  store.store("rerope/T512.json", settings, {{"loss", 2.5}, {"count", 7}});  // creates cells/rerope/
  EXPECT_TRUE(fs::exists(dir.path / "cells" / "rerope" / "T512.json"));
  EXPECT_EQ(store.find("rerope/T512.json", settings, keep), CellLookup::Reused);
  EXPECT_EQ(got, (json{{"loss", 2.5}, {"count", 7}}));

  got = nullptr;
  const json other{{"method", "rerope"}, {"length", 1024}};
  EXPECT_EQ(store.find("rerope/T512.json", other, keep), CellLookup::SettingsChanged);
  EXPECT_TRUE(got.is_null()) << "the reader must not see another run's result";

  // The experiment's reader refusing the result (a field missing, another version's cell) is a damaged cell.
  EXPECT_EQ(store.find("rerope/T512.json", settings, [](const json& r) { (void)r.at("tail_loss"); }),
            CellLookup::Damaged);
  EXPECT_EQ(store.find("rerope/T512.json", settings, [](const json&) { throw std::runtime_error("no"); }),
            CellLookup::Damaged);

  // Damaged files: cut short, not JSON, JSON that is not a cell.
  const fs::path file = dir.path / "cells" / "rerope" / "T512.json";
  for (const char* bytes : {"{\"settings\": {\"method\"", "\x01\x02garbage", "[1, 2]", "{\"settings\": {}}"}) {
    std::ofstream(file, std::ios::binary | std::ios::trunc) << bytes;
    EXPECT_EQ(store.find("rerope/T512.json", settings, keep), CellLookup::Damaged) << bytes;
  }
  // Storing again replaces the damaged file.
  store.store("rerope/T512.json", settings, {{"loss", 3.0}});
  EXPECT_EQ(store.find("rerope/T512.json", settings, keep), CellLookup::Reused);
  EXPECT_EQ(got["loss"], 3.0);
  EXPECT_STREQ(cell_lookup_name(CellLookup::SettingsChanged), "settings changed");
}

TEST(CellStore, NonFiniteNumbersAreStoredAsNullAndReadBackAsNaN) {
  ScratchDir dir;
  const CellStore store(dir.path.string());
  const double nan = std::nan(""), inf = std::numeric_limits<double>::infinity();
  store.store("c.json", {{"k", 1}},
              {{"loss", nan}, {"by_position", {1.0, inf, -inf, nan}}, {"nested", {{"x", nan}}}, {"n", 3}});
  // The file is JSON (no NaN or Infinity tokens), which any reader parses.
  const json on_disk = json::parse(lab::read_file(dir.path / "c.json"));
  EXPECT_TRUE(on_disk["result"]["loss"].is_null());
  EXPECT_EQ(on_disk["result"]["by_position"], json::parse("[1.0, null, null, null]"));
  EXPECT_TRUE(on_disk["result"]["nested"]["x"].is_null());

  double loss = 0;
  std::vector<double> by_position;
  ASSERT_EQ(store.find("c.json", {{"k", 1}},
                       [&](const json& r) {
                         loss = cell_number(r.at("loss"));
                         for (const json& v : r.at("by_position")) by_position.push_back(cell_number(v));
                       }),
            CellLookup::Reused);
  EXPECT_TRUE(std::isnan(loss));
  ASSERT_EQ(by_position.size(), 4u);
  EXPECT_EQ(by_position[0], 1.0);
  EXPECT_TRUE(std::isnan(by_position[1]) && std::isnan(by_position[2]) && std::isnan(by_position[3]));
  EXPECT_EQ(cell_number(json(2.5)), 2.5);
}

// find_cell leaves the experiment's cell untouched unless the stored one is reused (then it is marked reused).
TEST(CellStore, FindCellReplacesTheCellOnlyWhenReused) {
  struct Cell {
    double loss = -1;
    bool reused = false;
  };
  auto read = [](const json& r, Cell& c) {
    c.loss = 0;  // half-filled before the next line throws on a damaged result
    c.loss = r.at("loss").get<double>();
  };
  ScratchDir dir;
  const CellStore store(dir.path.string());
  Cell c;
  EXPECT_EQ(store.find_cell("c.json", {{"k", 1}}, c, read), CellLookup::Missing);
  store.store("c.json", {{"k", 1}}, {{"los", 2.0}});
  EXPECT_EQ(store.find_cell("c.json", {{"k", 1}}, c, read), CellLookup::Damaged);
  EXPECT_EQ(c.loss, -1);
  EXPECT_FALSE(c.reused);
  store.store("c.json", {{"k", 1}}, {{"loss", 2.0}});
  EXPECT_EQ(store.find_cell("c.json", {{"k", 2}}, c, read), CellLookup::SettingsChanged);
  EXPECT_FALSE(c.reused);
  EXPECT_EQ(store.find_cell("c.json", {{"k", 1}}, c, read), CellLookup::Reused);
  EXPECT_EQ(c.loss, 2.0);
  EXPECT_TRUE(c.reused);
}

TEST(RunOutcome, InterruptedCarriesItsSignalAndMessage) {
  const RunOutcome done;
  EXPECT_FALSE(done.interrupted());
  EXPECT_EQ(done.status, RunStatus::Finished);
  const RunOutcome stopped = RunOutcome::interrupted_by(15, "checkpoint saved; rerun to continue");
  EXPECT_TRUE(stopped.interrupted());
  EXPECT_EQ(stopped.signal, 15);
  EXPECT_EQ(stopped.message, "checkpoint saved; rerun to continue");
}

}  // namespace
}  // namespace rotary::experiments
