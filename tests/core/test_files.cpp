// tests/core/test_files.cpp: the one atomic writer (rotary/files.h write_file_atomic): the content is written, a
// failure leaves the old content and no temporary file, and a temporary file a killed writer left is removed.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "expect_error.h"
#include "rotary/error.h"
#include "rotary/files.h"

namespace rotary {
namespace {

namespace fs = std::filesystem;
using test::expect_error;

std::string fresh_dir(const std::string& name) {
  const fs::path dir = fs::temp_directory_path() / ("rotary_test_files_" + name + "_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir.string();
}

std::set<std::string> names_in(const std::string& dir) {
  std::set<std::string> names;
  for (const auto& e : fs::directory_iterator(dir)) names.insert(e.path().filename().string());
  return names;
}

std::string content_of(const std::string& path) { return read_regular_file(path, "test file"); }

// A pid that ran and ended: a child that exits at once, reaped.
pid_t dead_pid() {
  const pid_t pid = ::fork();
  if (pid == 0) ::_exit(0);
  int status = 0;
  ::waitpid(pid, &status, 0);
  return pid;
}

TEST(AtomicWrite, WritesTheContentAndLeavesNoTemporaryFile) {
  const std::string dir = fresh_dir("content");
  const std::string path = dir + "/x.bin";
  write_file_atomic(path, "test", "first");
  write_file_atomic(path, "test", std::string("second\0binary", 13));
  EXPECT_EQ(content_of(path), std::string("second\0binary", 13));
  write_file_atomic(path, "test", [](FileSink& out) {
    out.write("ab", 2);
    out.pad_to(5);
    EXPECT_EQ(out.written(), 5u);
  });
  EXPECT_EQ(content_of(path), std::string("ab\0\0\0", 5));
  write_file_atomic(path, "test", "cache", Durability::Cache);
  EXPECT_EQ(content_of(path), "cache");
  EXPECT_EQ(names_in(dir), std::set<std::string>{"x.bin"});
  fs::remove_all(dir);
}

TEST(AtomicWrite, AFailureLeavesTheOldContentAndNoTemporaryFile) {
  const std::string dir = fresh_dir("failure");
  const std::string path = dir + "/x.bin";
  write_file_atomic(path, "test", "old");
  // The writer's own failure, half-way through the content.
  expect_error(
      [&] {
        write_file_atomic(path, "test", [](FileSink& out) {
          out.write("new, half", 9);
          throw Error("rotary: test: the content failed");
        });
      },
      {"the content failed"});
  EXPECT_EQ(content_of(path), "old");
  EXPECT_EQ(names_in(dir), std::set<std::string>{"x.bin"});
  // The rename fails: the target is a directory that is not empty.
  fs::create_directories(dir + "/d/inside");
  expect_error(
      [&] { write_file_atomic(dir + "/d", "test.save", "new"); },
      {"rotary: test.save: cannot rename " + dir + "/d.tmp." + std::to_string(::getpid()) + " to " + dir + "/d"});
  EXPECT_TRUE(fs::is_directory(dir + "/d/inside"));
  EXPECT_EQ(names_in(dir), (std::set<std::string>{"d", "x.bin"}));
  // The temporary file cannot be made at all.
  expect_error([&] { write_file_atomic(dir + "/no/such/dir/x", "test.save", "y"); },
               {"rotary: test.save: cannot create " + dir + "/no/such/dir/x.tmp."});
  fs::remove_all(dir);
}

// A writer killed mid-write leaves "<file>.tmp.<pid>": the next write of that file removes those of processes that no
// longer run - not a live writer's, not another file's, not a name whose suffix is no pid.
TEST(AtomicWrite, TheNextWriteRemovesATemporaryFileOfADeadWriter) {
  const std::string dir = fresh_dir("stale");
  const std::string dead = std::to_string(dead_pid());
  const std::string live = std::to_string(::getppid());  // the test runner: alive while the test runs
  for (const std::string& name :
       std::vector<std::string>{"layer0.kv.tmp." + dead, "layer0.kv.tmp." + dead + ".3", "layer0.kv.tmp." + live,
                                "layer1.kv.tmp." + dead, "layer0.kv.tmp.notes"})
    std::ofstream(dir + "/" + name) << "torn";
  write_file_atomic(dir + "/layer0.kv", "kv_cache.save", "rows");
  EXPECT_EQ(names_in(dir), (std::set<std::string>{"layer0.kv", "layer0.kv.tmp." + live, "layer1.kv.tmp." + dead,
                                                  "layer0.kv.tmp.notes"}));
  EXPECT_EQ(content_of(dir + "/layer0.kv"), "rows");
  fs::remove_all(dir);
}

TEST(AtomicWrite, IsStaleTempFileKnowsTheNamesOfDeadWriters) {
  const std::string dead = std::to_string(dead_pid());
  EXPECT_TRUE(is_stale_temp_file("checkpoint.pt.tmp." + dead));
  EXPECT_TRUE(is_stale_temp_file("summary.json.tmp." + dead + ".12"));
  EXPECT_FALSE(is_stale_temp_file("checkpoint.pt.tmp." + std::to_string(::getpid())));
  EXPECT_FALSE(is_stale_temp_file("checkpoint.pt"));
  EXPECT_FALSE(is_stale_temp_file("notes.tmp.txt"));
  EXPECT_FALSE(is_stale_temp_file(".tmp." + dead));                // no target
  EXPECT_FALSE(is_stale_temp_file("x.tmp.+" + dead));              // the one rule: no '+'
  EXPECT_FALSE(is_stale_temp_file("x.tmp." + dead + "."));         // no counter after the dot
  EXPECT_FALSE(is_stale_temp_file("x.tmp.99999999999999999999"));  // no pid
}

// Two threads of one process writing one file share its temporary name: they take turns, and the file is always one of
// the two contents, whole.
TEST(AtomicWrite, ThreadsWritingOneFileTakeTurns) {
  const std::string dir = fresh_dir("threads");
  const std::string path = dir + "/cell.json";
  const std::string a(1 << 16, 'a'), b(1 << 16, 'b');
  std::vector<std::thread> writers;
  for (const std::string* content : {&a, &b})
    writers.emplace_back([&, content] {
      for (int i = 0; i < 50; ++i) write_file_atomic(path, "test", *content, Durability::Cache);
    });
  for (std::thread& t : writers) t.join();
  const std::string last = content_of(path);
  EXPECT_TRUE(last == a || last == b);
  EXPECT_EQ(names_in(dir), std::set<std::string>{"cell.json"});
  fs::remove_all(dir);
}

}  // namespace
}  // namespace rotary
