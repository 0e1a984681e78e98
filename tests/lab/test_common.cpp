// tests/lab/test_common.cpp: the lab's helpers (lab/common): processes, files, gnuplot, machine info.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <filesystem>
#include <string>

#include "common/files.h"
#include "common/machine.h"
#include "common/plots.h"
#include "common/process.h"
#include "rotary/error.h"

namespace rotary::lab {
namespace {

namespace fs = std::filesystem;

std::string fresh_dir(const std::string& name) {
  const fs::path p = fs::temp_directory_path() / ("rotary_common_test_" + name + "_" + std::to_string(::getpid()));
  fs::remove_all(p);
  fs::create_directories(p);
  return fs::canonical(p).string();
}

// The launcher's and gnuplot's way: a working directory (relative output paths land in it), environment overrides
// that replace variables of the same name, stdout and stderr into one file, and a program other than argv[0].
TEST(Process, SpawnSetsDirectoryEnvironmentAndFiles) {
  const std::string dir = fresh_dir("spawn");
  ::setenv("ROTARY_TEST_VAR", "old", 1);
  SpawnOptions options;
  options.program = "/bin/sh";
  options.cwd = dir;
  options.env = {{"ROTARY_TEST_VAR", "new"}, {"ROTARY_TEST_OTHER", "2"}};
  options.stdout_path = "log";
  options.stderr_to_stdout = true;
  pid_t pid = 0;
  ASSERT_EQ(spawn_process({"argv0", "-c", "echo $0; pwd; env | grep ^ROTARY_TEST_ | sort; echo err >&2"}, options, pid),
            0);
  EXPECT_EQ(wait_process(pid), 0);
  ::unsetenv("ROTARY_TEST_VAR");
  EXPECT_EQ(read_file(join_path(dir, "log")),
            "argv0\n" + dir + "\nROTARY_TEST_OTHER=2\nROTARY_TEST_VAR=new\nerr\n");
  fs::remove_all(dir);
}

TEST(Process, MissingProgramsAndSignalsHaveTheirStatus) {
  pid_t pid = 0;
  EXPECT_EQ(spawn_process({"rotary-no-such-program"}, {}, pid), ENOENT);
  ASSERT_EQ(spawn_process({"sh", "-c", "kill -TERM $$"}, {}, pid), 0);
  EXPECT_EQ(wait_process(pid), 128 + 15);
  EXPECT_THROW(spawn_process({}, {}, pid), Error);
}

TEST(Process, FindInPathIsCommandV) {
  EXPECT_FALSE(find_in_path("sh").empty());
  EXPECT_EQ(find_in_path("/bin/sh"), "/bin/sh");
  EXPECT_EQ(find_in_path("rotary-no-such-program"), "");
  EXPECT_EQ(find_in_path(""), "");
}

TEST(Files, AtomicWriteReplacesContentAndLeavesNoTemporaryFile) {
  const std::string dir = fresh_dir("atomic");
  const std::string path = join_path(dir, "x.txt");
  write_file_atomic(path, "first");
  write_file_atomic(path, std::string("second\0binary", 13));
  EXPECT_EQ(read_file(path), std::string("second\0binary", 13));
  int entries = 0;
  for (const auto& e : fs::directory_iterator(dir)) {
    ++entries;
    EXPECT_EQ(e.path().filename(), "x.txt");
  }
  EXPECT_EQ(entries, 1);
  EXPECT_THROW(write_file_atomic(join_path(dir, "no/such/dir/x"), "y"), Error);
  fs::remove_all(dir);
}

// gnuplot runs in the plot directory: plots.gp, gnuplot.log and the PNG are there; without gnuplot, the reason.
TEST(Plots, GnuplotRunsInThePlotDirectory) {
  const std::string dir = fresh_dir("plots in 'odd' dir");  // no shell to quote for
  const std::string script = "set output 'line.png'\nplot x with lines\n";
  const char* path = std::getenv("PATH");
  const std::string saved = path != nullptr ? path : "";
  ::setenv("PATH", dir.c_str(), 1);
  EXPECT_EQ(run_gnuplot(dir, script), "gnuplot is not installed (Debian: gnuplot-nox); no plots");
  ::setenv("PATH", saved.c_str(), 1);
  if (find_in_path("gnuplot").empty()) GTEST_SKIP() << "gnuplot not installed";
  EXPECT_EQ(run_gnuplot(dir, script), "");
  EXPECT_EQ(read_file(join_path(dir, "line.png")).substr(1, 3), "PNG");
  EXPECT_NE(read_file(join_path(dir, "plots.gp")).find("size 1000,600"), std::string::npos);
  EXPECT_TRUE(fs::exists(join_path(dir, "gnuplot.log")));
  EXPECT_EQ(run_gnuplot(dir, "plot no_such_function(x)\n"), "gnuplot failed; see " + join_path(dir, "gnuplot.log"));
  EXPECT_FALSE(read_file(join_path(dir, "gnuplot.log")).empty());
  fs::remove_all(dir);
}

TEST(Machine, CpuModelNamesTheProcessor) {
  EXPECT_FALSE(cpu_model().empty());
}

}  // namespace
}  // namespace rotary::lab
