// tests/lab/test_common.cpp: the lab's helpers (lab/common): processes, files, gnuplot, machine info.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <new>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

#include "common/exit_status.h"
#include "common/files.h"
#include "common/lists.h"
#include "common/machine.h"
#include "common/plots.h"
#include "common/process.h"
#include "memory/memory_index.h"
#include "rotary/error.h"
#include "rotary/files.h"
#include "rotary/parse_number.h"
#include "tasks/kjv_corpus.h"
#include "rotary_tokenizers/tokenizer.h"

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

// The lab's writer is core's (rotary::write_file_atomic): a failed write keeps the old content and leaves no
// temporary file, and a write removes the temporary file a killed writer of the same file left.
TEST(Files, AtomicWriteIsCoresOneWriter) {
  const std::string dir = fresh_dir("atomic_core");
  const std::string path = join_path(dir, "checkpoint.pt");
  write_file_atomic(path, "old");
  fs::create_directories(join_path(dir, "summary.json/inside"));  // a rename onto a non-empty directory fails
  try {
    write_file_atomic(join_path(dir, "summary.json"), "new");
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("rotary: write: cannot rename"), std::string::npos) << e.what();
  }
  pid_t dead = ::fork();
  if (dead == 0) ::_exit(0);
  ASSERT_GT(dead, 0);
  int status = 0;
  ASSERT_EQ(::waitpid(dead, &status, 0), dead);
  std::ofstream(path + ".tmp." + std::to_string(dead)) << "torn";
  write_file_atomic(path, "new");
  EXPECT_EQ(read_file(path), "new");
  std::set<std::string> names;
  for (const auto& e : fs::directory_iterator(dir)) names.insert(e.path().filename().string());
  EXPECT_EQ(names, (std::set<std::string>{"checkpoint.pt", "summary.json"}));
  fs::remove_all(dir);
}

// gnuplot runs in the plot directory: plots.gp, gnuplot.log and the PNG are there; without gnuplot, the reason.
// A writer killed mid-write leaves "<name>.tmp.<pid>"; the next start removes those of dead processes only (a
// concurrent writer, here this test process, keeps its own), in subdirectories too.
TEST(Files, StaleTemporaryFilesOfDeadProcessesAreRemoved) {
  const std::string dir = fresh_dir("stale");
  fs::create_directories(dir + "/run/seed0");
  // A pid that ran and ended: a child that exits at once, reaped.
  pid_t dead = ::fork();
  if (dead == 0) ::_exit(0);
  ASSERT_GT(dead, 0);
  int status = 0;
  ASSERT_EQ(::waitpid(dead, &status, 0), dead);
  const std::string stale1 = dir + "/checkpoint.pt.tmp." + std::to_string(dead);
  const std::string stale2 = dir + "/run/seed0/summary.json.tmp." + std::to_string(dead) + ".3";
  const std::string live = dir + "/metrics.csv.tmp." + std::to_string(::getpid());
  const std::string other = dir + "/notes.tmp.txt";  // not ours: the suffix is not a pid
  for (const std::string& f : {stale1, stale2, live, other}) std::ofstream(f) << "x";
  EXPECT_EQ(remove_stale_temp_files(dir), 2);
  EXPECT_FALSE(fs::exists(stale1));
  EXPECT_FALSE(fs::exists(stale2));
  EXPECT_TRUE(fs::exists(live));
  EXPECT_TRUE(fs::exists(other));
  EXPECT_EQ(remove_stale_temp_files(dir + "/missing"), 0);
  fs::remove_all(dir);
}

// read_file looks before it opens: a FIFO (open() would wait for a writer forever) or a directory is refused by
// name, without blocking.
TEST(Files, ReadFileRefusesFifosAndDirectories) {
  const std::string dir = fresh_dir("read_fifo");
  const std::string fifo = join_path(dir, "ids.txt");
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  try {
    read_file(fifo);
    ADD_FAILURE() << "a FIFO was read";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(fifo + " (a FIFO)"), std::string::npos) << e.what();
  }
  try {
    read_file(dir);
    ADD_FAILURE() << "a directory was read";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(dir + " (a directory)"), std::string::npos) << e.what();
  }
  write_file_atomic(join_path(dir, "plain.txt"), "text");
  EXPECT_EQ(read_file(join_path(dir, "plain.txt")), "text");
  fs::remove_all(dir);
}

// One command at a time per output directory: a second lock is refused naming the field and the holder's pid, and
// the lock is free again once the holder is gone.
TEST(Files, DirectoryLockRefusesASecondHolder) {
  const std::string dir = join_path(fresh_dir("lock"), "out");  // created by the lock
  {
    const DirectoryLock first(dir, "--out");
    try {
      const DirectoryLock second(dir, "--out");
      ADD_FAILURE() << "two locks on one directory";
    } catch (const Error& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find("--out = " + dir + " (in use by another rotary command, pid " + std::to_string(::getpid()) + ")"),
                std::string::npos)
          << msg;
    }
    // Another process is refused too (flock is per open file, across processes as within one).
    const pid_t child = ::fork();
    if (child == 0) {
      try {
        const DirectoryLock other(dir, "--out");
        ::_exit(0);
      } catch (const Error&) {
        ::_exit(2);
      }
    }
    int status = 0;
    ::waitpid(child, &status, 0);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 2);
  }
  EXPECT_NO_THROW(DirectoryLock(dir, "--out"));  // released with its holder
  fs::remove_all(fs::path(dir).parent_path());
}

// A child started with die_with_parent ends when its parent does, even killed outright (SIGKILL: no handler runs).
TEST(Process, ChildrenStartedToDieWithTheirParentDo) {
  const std::string dir = fresh_dir("pdeathsig");
  const std::string pid_file = join_path(dir, "grandchild.pid");
  const pid_t parent = ::fork();
  if (parent == 0) {
    // The parent: starts a child that calls die_with_parent_if_asked (as `rotary` does first thing) and then
    // sleeps, and waits to be killed.
    SpawnOptions o;
    o.program = "/proc/self/exe";
    o.die_with_parent = true;
    o.env = {{"ROTARY_TEST_SLEEP_CHILD", pid_file}};
    pid_t child = 0;
    if (spawn_process({"test", "--gtest_filter=Process.SleepingChild"}, o, child) != 0) ::_exit(1);
    for (;;) ::pause();
  }
  // Wait for the child to be up, then kill its parent with SIGKILL.
  pid_t child = 0;
  for (int i = 0; i < 500 && child == 0; ++i) {
    std::ifstream in(pid_file);
    if (!(in >> child)) child = 0, ::usleep(20000);
  }
  ASSERT_GT(child, 0) << "the child did not start";
  ::kill(parent, SIGKILL);
  ::waitpid(parent, nullptr, 0);
  bool gone = false;
  for (int i = 0; i < 500 && !gone; ++i) {
    gone = ::kill(child, 0) != 0 && errno == ESRCH;
    if (!gone) ::usleep(20000);
  }
  EXPECT_TRUE(gone) << "the child " << child << " outlived its parent";
  if (!gone) ::kill(child, SIGKILL);
  fs::remove_all(dir);
}

// The child of the test above (run as this test binary with a filter): asks to die with its parent, says its pid,
// sleeps. Skipped when not started that way.
TEST(Process, SleepingChild) {
  const char* pid_file = std::getenv("ROTARY_TEST_SLEEP_CHILD");
  if (pid_file == nullptr) GTEST_SKIP() << "only as the child of ChildrenStartedToDieWithTheirParentDo";
  die_with_parent_if_asked();
  write_file_atomic(pid_file, std::to_string(::getpid()) + "\n", Durability::Cache);
  ::sleep(30);
  ::_exit(0);
}

TEST(Lists, RepeatedItemsAreNamed) {
  EXPECT_NO_THROW(check_unique(std::vector<std::string>{"rope", "roper"}, "encodings"));
  try {
    check_unique(std::vector<std::string>{"rope", "roper", "rope"}, "encodings");
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("encodings = rope (given twice)"), std::string::npos) << e.what();
  }
  EXPECT_THROW(check_unique(std::vector<int>{1, 2, 1}, "lengths"), Error);
}

// One policy: the user's input exits 2 with its message; anything else is a bug (70), said in one line without
// the C++ frames torch appends; out of memory is 71.
TEST(ExitStatus, EveryExceptionHasItsStatusAndOneLine) {
  auto run = [](std::exception_ptr e, std::string& text) {
    std::FILE* f = std::tmpfile();
    const int code = report_exception(e, f);
    std::rewind(f);
    char buf[1024] = {};
    text.assign(buf, std::fread(buf, 1, sizeof buf - 1, f));
    std::fclose(f);
    return code;
  };
  std::string text;
  EXPECT_EQ(run(std::make_exception_ptr(Error("rotary: seq_len = 1 is invalid; allowed: >= 2")), text), 2);
  EXPECT_EQ(text, "error: rotary: seq_len = 1 is invalid; allowed: >= 2\n");
  EXPECT_EQ(run(std::make_exception_ptr(std::runtime_error("shape mismatch\nException raised from f at x.cpp:3\nframe #0")),
                text),
            70);
  EXPECT_NE(text.find("internal error (a bug in rotary"), std::string::npos) << text;
  EXPECT_NE(text.find("shape mismatch"), std::string::npos) << text;
  EXPECT_EQ(text.find("frame"), std::string::npos) << text;
  EXPECT_EQ(run(std::make_exception_ptr(std::bad_alloc()), text), 71);
  EXPECT_NE(text.find("out of memory"), std::string::npos);
  EXPECT_EQ(run(std::make_exception_ptr(42), text), 70);
  // Torch's failed allocations are c10::Errors (std::exceptions), not std::bad_alloc: still out of memory. (The
  // text is libtorch 1.13's CPU allocator's; tests/train checks a real one.)
  EXPECT_EQ(run(std::make_exception_ptr(std::runtime_error(
                    "[enforce fail at alloc_cpu.cpp:75] err == 0. DefaultCPUAllocator: can't allocate memory: you tried to "
                    "allocate 274877906944 bytes. Error code 12 (Cannot allocate memory)\nframe #0")),
                text),
            71);
  EXPECT_NE(text.find("out of memory"), std::string::npos) << text;
  EXPECT_EQ(text.find("internal error"), std::string::npos) << text;
  EXPECT_EQ(text.find("frame"), std::string::npos) << text;
  EXPECT_EQ(interrupted_exit_status(0), 130);
  EXPECT_EQ(interrupted_exit_status(15), 143);
}

// A message quoting a user's text with a NUL in it (a token id file) is printed whole, the NUL escaped, never cut.
TEST(ExitStatus, AMessageWithANulIsPrintedWhole) {
  std::FILE* f = std::tmpfile();
  using namespace std::string_literals;
  const std::string message = "rotary: ids.txt: token 2 (line 1) = \"3\0x9\" is invalid; allowed: ids"s;
  EXPECT_EQ(report_exception(std::make_exception_ptr(Error(message)), f), 2);
  std::rewind(f);
  char buf[256] = {};
  const std::string text(buf, std::fread(buf, 1, sizeof buf - 1, f));
  std::fclose(f);
  EXPECT_EQ(text, "error: rotary: ids.txt: token 2 (line 1) = \"3\\x00x9\" is invalid; allowed: ids\n");
}

// The one rule for numbers in text (rotary/parse_number.h) in the lab's readers: each refuses a sign, a prefix, an
// exponent, junk and an overflow, naming its field.
TEST(NumberRule, EveryReaderRefusesWhatTheRuleRefusesNamingItsField) {
  EXPECT_EQ(memory_index_from_name("pages010").pages_read, 10);
  EXPECT_EQ(memory_index_from_name("graph64").graph_width, 64);
  for (const std::string bad : {"pages+5", "pages-5", "pages0x10", "pages1e3", "pages 5", "graph99999999999999999999",
                                "pages2000000000"}) {
    try {
      memory_index_from_name(bad, "--search");
      ADD_FAILURE() << bad << ": no error";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("--search = " + bad + " is invalid"), std::string::npos) << e.what();
    }
  }
  const std::string dir = fresh_dir("number_rule");
  const std::string ids = join_path(dir, "ids.txt");
  for (const auto& [text, shown] : std::vector<std::pair<std::string, std::string>>{
           {"1 +5", "token 2 (line 1) = \"+5\""},
           {"1e3", "token 1 (line 1) = \"1e3\""},
           {"7\n12abc", "token 2 (line 2) = \"12abc\""},
           {"0x10", "token 1 (line 1) = \"0x10\""},
           {"99999999999999999999", "token 1 (line 1) = 99999999999999999999 is invalid"},
           {"-9223372036854775809", "token 1 (line 1) = \"-9223372036854775809\""},
           {std::string("12 3\0x9 4", 9),"token 2 (line 1) = \"3\\x00x9\" is invalid; allowed: decimal token ids"}}) {
    write_file_atomic(ids, text);
    try {
      tokenizers::read_token_id_file(ids, 100);
      ADD_FAILURE() << text << ": no error";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(ids + ": " + shown), std::string::npos) << e.what();
    }
  }
  write_file_atomic(ids, "010 7\n99");
  EXPECT_EQ(tokenizers::read_token_id_file(ids, 100), (std::vector<int64_t>{10, 7, 99}));
  fs::remove_all(dir);
  const std::string heading = "Genesis 1\n\n";
  for (const std::string verse : {"  +1 In", "  1e0 In", "  0x1 In", "  99999999999 In", "  1.0 In", "  2 In"}) {
    try {
      parse_kjv(heading + verse + "\n");
      ADD_FAILURE() << verse << ": no error";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("bible output = line 3 \"" + verse + "\""), std::string::npos) << e.what();
    }
  }
}

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

// The reports' figures: each starts from gnuplot's defaults (so one figure's log scale or range never leaks into
// the next), titles are quoted and shown as written, a figure with nothing to plot is left out, and data blocks are
// numbered as plot items address them.
TEST(Plots, FiguresStartFromTheSameStateAndBlocksAreIndexed) {
  DataBlocks data;
  EXPECT_EQ(data.add("rope", {{16, 1.5}, {32, 2.25}}), 0);
  EXPECT_EQ(data.add("leaky_rerope", {}), 1);
  EXPECT_EQ(data.size(), 2);
  EXPECT_EQ(data.text(), "# rope\n16 1.5\n32 2.25\n\n\n# leaky_rerope\n\n\n");
  EXPECT_EQ(data_series("d.dat", 1, "lines lw 2", "leaky_rerope"),
            "'d.dat' index 1 with lines lw 2 title \"leaky_rerope\" noenhanced");
  EXPECT_EQ(gnuplot_quoted("a \"b\" \\c"), "\"a \\\"b\\\" \\\\c\"");

  const Figure first{"a.png", "first", "x", "y", {"set logscale x 2"}, {"'d.dat' index 0 with lines"}};
  const Figure empty{"b.png", "nothing", "x", "y", {}, {}};
  const Figure second{"c.png", "second", "x", "y", {}, {"1 with lines", "2 with lines"}};
  const std::string script = figure_script({first, empty, second});
  EXPECT_EQ(script.find("b.png"), std::string::npos) << script;
  const size_t a = script.find("set output 'a.png'"), c = script.find("set output 'c.png'");
  ASSERT_NE(a, std::string::npos);
  ASSERT_NE(c, std::string::npos);
  EXPECT_NE(script.find("reset\n", a), std::string::npos);  // between the figures
  EXPECT_LT(script.find("reset\n", a), c);
  EXPECT_NE(script.find("set logscale x 2\nplot 'd.dat' index 0 with lines\nset output\n"), std::string::npos)
      << script;
  EXPECT_NE(script.find("plot 1 with lines, \\\n     2 with lines\n"), std::string::npos) << script;
  EXPECT_NE(script.find("set title \"second\" noenhanced"), std::string::npos) << script;
}

}  // namespace
}  // namespace rotary::lab
