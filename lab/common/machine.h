// lab/common/machine.h: what the benchmarks record about the machine they ran on.
#pragma once

#include <cstdint>
#include <string>

namespace rotary::lab {

// The "model name" of /proc/cpuinfo's first processor; "unknown" without one.
std::string cpu_model();
// The instruction-set flags the kernels dispatch on that /proc/cpuinfo lists (of avx2 fma f16c avx512f avx512bw
// avx512_vnni avx512_bf16), space-separated: a speed table means little without them (Zen 3 vs Zen 4).
std::string cpu_simd_flags();
// cpu_model() followed by "[cpu_simd_flags()]": what every benchmark prints and records as its CPU.
std::string cpu_description();

// Bytes of memory available to a new allocation now (/proc/meminfo MemAvailable); -1 when unknown.
int64_t available_memory_bytes();

}  // namespace rotary::lab

namespace rotary::lab {

// The rate (bytes per second) at which `threads` threads (0: OpenMP's default) read a buffer of `bytes` that no
// cache holds, the best of a few passes: the memory bus's read speed, which a bandwidth-bound kernel (a decode
// step's matrix-vector products) is measured against. Each thread sums its share as 64-bit integers (a loop the
// compiler vectorises), so the probe reads and does nothing else.
double read_bandwidth(int64_t bytes, int threads);

// The 1, 5 and 15 minute load averages of /proc/loadavg ("0.52 0.48 0.40"): how busy a shared machine was around
// a benchmark's timings.
std::string load_average();

// The process's resident set (bytes) after handing freed heap pages back (malloc_trim), so two readings differ by
// what is still held.
int64_t resident_bytes();

// The major page faults of this process so far: pages it waited for the disk to read.
int64_t major_faults();

}  // namespace rotary::lab
