// lab/common/machine.cpp
#include "common/machine.h"

#include <malloc.h>
#include <omp.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <set>
#include <sstream>
#include <vector>

namespace rotary::lab {

std::string cpu_model() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line))
    if (line.rfind("model name", 0) == 0) return line.substr(line.find(':') + 2);
  return "unknown";
}

std::string cpu_simd_flags() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("flags", 0) != 0) continue;
    std::istringstream words(line.substr(line.find(':') + 1));
    std::set<std::string> have;
    for (std::string w; words >> w;) have.insert(w);
    std::string out;
    for (const char* f : {"avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512_vnni", "avx512_bf16"})
      if (have.count(f)) out += (out.empty() ? "" : " ") + std::string(f);
    return out.empty() ? "none of avx2 fma f16c avx512*" : out;
  }
  return "unknown";
}

std::string cpu_description() { return cpu_model() + " [" + cpu_simd_flags() + "]"; }

int64_t available_memory_bytes() {
  std::ifstream in("/proc/meminfo");
  std::string key;
  int64_t kb = 0;
  std::string unit;
  while (in >> key >> kb >> unit)
    if (key == "MemAvailable:") return kb * 1024;
  return -1;
}

}  // namespace rotary::lab

namespace rotary::lab {

double read_bandwidth(int64_t bytes, int threads) {
  const int64_t words = std::max<int64_t>(bytes / 8, 1024);
  std::vector<uint64_t> buffer(static_cast<size_t>(words));
  const int nt = threads > 0 ? threads : omp_get_max_threads();
#pragma omp parallel for schedule(static) num_threads(nt)
  for (int64_t i = 0; i < words; ++i) buffer[size_t(i)] = uint64_t(i) * 0x9e3779b97f4a7c15ull;  // pages touched
  double best = 0;
  uint64_t sink = 0;
  for (int pass = 0; pass < 5; ++pass) {
    const auto t0 = std::chrono::steady_clock::now();
    uint64_t sum = 0;
#pragma omp parallel for schedule(static) num_threads(nt) reduction(+ : sum)
    for (int64_t i = 0; i < words; ++i) sum += buffer[size_t(i)];
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    sink += sum;
    best = std::max(best, double(words * 8) / s);
  }
  volatile uint64_t keep = sink;  // the sums are used: no pass can be left out
  (void)keep;
  return best;
}

std::string load_average() {
  std::ifstream in("/proc/loadavg");
  std::string a, b, c;
  in >> a >> b >> c;
  return a + " " + b + " " + c;
}

int64_t resident_bytes() {
  malloc_trim(0);
  std::ifstream in("/proc/self/statm");
  int64_t total_pages = 0, resident_pages = 0;
  in >> total_pages >> resident_pages;
  return resident_pages * int64_t(sysconf(_SC_PAGESIZE));
}

int64_t major_faults() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return int64_t(u.ru_majflt);
}

}  // namespace rotary::lab
