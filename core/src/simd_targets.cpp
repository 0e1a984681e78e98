// core/src/simd_targets.cpp: the one place that reads and applies the SIMD target settings of the process
// (see simd_targets.h). Which targets the kernels compile is one policy for the whole library (HWY_DISABLED_TARGETS
// in core/CMakeLists.txt), so the list here is the list of every kernel.
#include "simd_targets.h"

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cstdio>
#include <cstdlib>

#include <hwy/targets.h>

#include "rotary/error.h"

namespace rotary::detail {
namespace {

std::string lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return char(std::tolower(c)); });
  return s;
}

// Targets compiled and supported by the CPU, before any ceiling: the names a user may ask for.
std::vector<int64_t> available_targets() {
  std::vector<int64_t> out;
  const int64_t cpu = hwy::SupportedTargets();
  for (int64_t t = cpu & HWY_TARGETS; t != 0; t &= t - 1) out.push_back(t & ~(t - 1));
  return out;  // ascending bit = best first
}

// Highway 1.0.3's SupportedTargets() (outside a test mock) points dispatch at the best target the CPU has,
// ignoring DisableTargets, and leaves it to the caller to Update() with its masked result; so every call that
// lists targets re-applies the mask, or listing them would quietly lift the ceiling.
void reapply_mask() { hwy::GetChosenTarget().Update(hwy::SupportedTargets()); }

// Read once, when rotary_core is loaded, before any kernel can run: Highway's DisableTargets removes every target
// better than the ceiling from dispatch (and from SupportedTargets, so per-target test loops see only the allowed
// ones, and force_simd_target(0) returns to the ceiling, not past it).
int64_t apply_environment() {
  const char* env = std::getenv("ROTARY_SIMD_TARGET");
  if (env == nullptr) return 0;
  int64_t ceiling = 0;
  try {
    ceiling = parse_simd_target(env, available_targets());
  } catch (const Error& e) {
    std::fprintf(stderr, "%s\n", e.what());
    std::exit(2);
  }
  if (ceiling != 0) hwy::DisableTargets(ceiling - 1);  // every lower bit is a better target
  reapply_mask();
  return ceiling;
}

const int64_t g_ceiling = apply_environment();

}  // namespace

int64_t parse_simd_target(const std::string& value, const std::vector<int64_t>& available) {
  const std::string v = lower(value);
  if (v == "best" || v.empty()) return 0;
  std::string allowed = "best, avx512, avx2, sse4, scalar";
  for (int64_t t : available) {
    const std::string name = lower(hwy::TargetName(t));
    if (allowed.find(name) == std::string::npos) allowed += ", " + name;
  }
  auto by_name = [&](const std::string& name) -> int64_t {
    for (int64_t t : available)
      if (lower(hwy::TargetName(t)) == name) return t;
    return 0;
  };
  int64_t t = 0;
  if (v == "avx512") t = by_name("avx3");
  else if (v == "scalar") t = available.empty() ? 0 : available.back();  // the portable fallback is the worst
  else t = by_name(v);
  if (t == 0) fail("ROTARY_SIMD_TARGET", "'" + value + "'", allowed + " (those this CPU supports and rotary compiled)");
  return t;
}

int64_t simd_target_ceiling() { return g_ceiling; }

std::vector<int64_t> simd_targets() {
  std::vector<int64_t> targets = hwy::SupportedAndGeneratedTargets();
  reapply_mask();
  return targets;
}

void force_simd_target(int64_t target) {
  hwy::SetSupportedTargetsForTest(target);  // 0 ends the override; targets above the ceiling stay disabled
  reapply_mask();
}

const char* simd_target_name(int64_t target) { return hwy::TargetName(target); }

namespace {
std::atomic<bool> g_avx_vnni_allowed{true};
}  // namespace

void allow_avx_vnni(bool allowed) { g_avx_vnni_allowed.store(allowed, std::memory_order_relaxed); }
bool avx_vnni_allowed() { return g_avx_vnni_allowed.load(std::memory_order_relaxed); }

}  // namespace rotary::detail
