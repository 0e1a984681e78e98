// lab/experiments/reproduce/study_seed001.cpp
// Seed 001: the seed's problem - every retrieved segment at the same relative positions - and its two questions
// (how far Unlimiformer's approximations move the retrieval; whether the retrieved keys' rotation matters), on a
// ReRoPE passkey model read far past L through the memory (`rotary memory`).
#include <algorithm>
#include <cmath>
#include <fmt/format.h>

#include "experiments/memory_experiment.h"
#include "experiments/reproduce/study.h"

namespace rotary::experiments::reproduce {

bool seed001_study(Reproduction& r, const std::string& study, bool wanted) {
  Claim far{"001", study,
            "Through a memory that puts every retrieved key at one relative position (the model's own ReRoPE "
            "policy), a model reads far past its training length where full attention fails",
            "the seed's problem statement (no number)", "", "not measured", ""};
  Claim approx{"001", study,
               "Unlimiformer's two approximations (its store query, its key positions) change the keys retrieved "
               "and their logits",
               "\"confirmed experimentally\" (no number given)", "", "not measured", ""};
  Claim rotation{"001", study, "The retrieved keys' rotation is necessary during generation (Experiment 2)",
                 "the seed's question (no answer given)", "", "not measured", ""};
  if (!wanted) {
    far.note = approx.note = rotation.note = "study not run";
  } else {
    MemorySpec m = reproduce_memory_spec(r.spec);
    m.command_line = r.spec.command_line;
    if (r.progress) std::fprintf(stderr, "reproduce: %s\n", study.c_str());
    const MemoryResult res = run_memory(m, r.progress);
    if (res.run.interrupted()) return r.stopped(study, res.run);
    const int L = m.run.seq_len, k = m.top_k.front();
    const int far_len = L * *std::max_element(m.multiples.begin(), m.multiples.end());
    const std::string own = m.run.model.encoding.kind == nn::EncodingKind::Rope ? "exact" : "rerope";
    auto cell = [&](const std::string& kind, const std::string& name, int T) -> const MemoryCell* {
      for (const MemoryCell& c : res.cells)
        if (c.kind == kind && c.name == name && c.test_len == T && (kind == "full" || c.top_k == k)) return &c;
      return nullptr;
    };
    const std::string times = fmt::format("{}L", far_len / L);
    const MemoryCell *own_L = cell("memory", own, L), *own_far = cell("memory", own, far_len);
    // Full attention at the longest length it was run (full_max_multiple): where it has to reach past L.
    const MemoryCell* full = nullptr;
    for (const MemoryCell& c : res.cells)
      if (c.kind == "full" && c.name == "trained" && c.test_len > L && (!full || c.test_len > full->test_len))
        full = &c;
    if (own_L && own_far) {
      far.ours = fmt::format("memory `{}` (top-{}): {} at L, {} at {}", own, k, pct(own_L->accuracy),
                             pct(own_far->accuracy), times);
      bool ok = own_far->accuracy >= own_L->accuracy - 0.1;
      if (full) {
        const MemoryCell* own_there = cell("memory", own, full->test_len);
        far.ours += fmt::format("; full context {} at {}L", pct(full->accuracy), full->test_len / L);
        ok = ok && own_there && own_there->accuracy > full->accuracy;
      }
      far.verdict = verdict_of(ok);
    }
    if (const MemoryCell* u = cell("memory", "unlimiformer", far_len); u && std::isfinite(u->reference_overlap)) {
      approx.ours = fmt::format("at {}: its top-{} holds {:.0f}% of the `{}` top-{}; logits of what it retrieves off "
                                "by {:.2f} (scaled); exact match {}",
                                times, k, 100 * u->reference_overlap, own, k, u->logit_error, pct(u->accuracy));
      approx.verdict = verdict_of(u->reference_overlap < 0.9);
    }
    if (const MemoryCell* none = cell("memory", "none", far_len); none && own_far) {
      rotation.ours = fmt::format("at {}: un-rotated keys (`none`) {} vs `{}` {}", times, pct(none->accuracy), own,
                                  pct(own_far->accuracy));
      if (std::isfinite(none->reference_overlap))
        rotation.ours += fmt::format("; {:.0f}% of the `{}` top-{} retrieved", 100 * none->reference_overlap, own, k);
      rotation.verdict = verdict_of(none->accuracy < own_far->accuracy);
    }
    far.note = approx.note = rotation.note =
        fmt::format("one {} passkey model, L = {}, {} prompts a cell{}",
                    nn::encoding_kind_name(m.run.model.encoding.kind), L, m.problems, r.scale_note);
    r.sections << "### seed001_memory\n\n`rotary memory` on " << res.model.description
               << "; [report](seed001_memory/report.md)\n\n";
  }
  for (Claim* c : {&far, &approx, &rotation}) r.result.claims.push_back(*c);
  return true;
}

}  // namespace rotary::experiments::reproduce
