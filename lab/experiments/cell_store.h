// lab/experiments/cell_store.h: the one store of finished cells every experiment resumes from, and the one outcome
// type every experiment's run returns.
//
// A cell is one measured unit of an experiment (a method at a length, a policy at a test length, a benchmark's
// output): a JSON file {"settings": ..., "result": ...} under <out>/cells (or another directory the experiment
// names). A rerun reuses a cell whose stored settings equal the settings it would run with, so an interrupted
// command continues where it stopped and a changed flag recomputes exactly the cells it changes. One rule for
// everything else: a missing, unreadable, damaged or foreign file, or one whose result the experiment cannot read,
// is computed again and replaced (a cell is derived data; the store never refuses to run because of one). JSON has
// no NaN or Inf: every non-finite number of a result is stored as null and read back as NaN (cell_number), so a
// cell whose loss is NaN is reused as what it is, not recomputed on every rerun.
#pragma once

#include <cstdint>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>

namespace rotary::experiments {

// How a stored cell answered a lookup.
enum class CellLookup : uint8_t {
  Missing,          // no file: computed
  Reused,           // settings equal, result read: not computed
  SettingsChanged,  // another run's settings (a flag or the model changed): computed again, the file replaced
  Damaged,          // not JSON, not a cell, or a result the experiment cannot read: computed again, replaced
};
const char* cell_lookup_name(CellLookup lookup);  // "missing", "reused", "settings changed", "damaged"

class CellStore {
 public:
  explicit CellStore(std::string dir) : dir_(std::move(dir)) {}
  const std::string& dir() const { return dir_; }
  // <dir>/<name> (name may hold '/': "T512/exact_k32.json").
  std::string path(const std::string& name) const;

  // Looks `name` up: when its stored settings equal `settings`, `read` is given the stored result (it may throw
  // on a result it cannot read: the lookup is then Damaged). `read` is not called otherwise.
  CellLookup find(const std::string& name, const nlohmann::json& settings,
                  const std::function<void(const nlohmann::json& result)>& read) const;
  // find() for an experiment's cell type (one with a `bool reused`): `read(result, cell)` fills a copy of `cell`,
  // which replaces `cell` (marked reused) only when the lookup is Reused - a damaged result never half-fills it.
  template <class Cell, class Read>
  CellLookup find_cell(const std::string& name, const nlohmann::json& settings, Cell& cell, Read read) const {
    Cell stored = cell;
    const CellLookup found = find(name, settings, [&](const nlohmann::json& result) { read(result, stored); });
    if (found == CellLookup::Reused) {
      cell = std::move(stored);
      cell.reused = true;
    }
    return found;
  }
  // Stores a finished cell atomically (rotary::Error naming the path if it cannot be written); every non-finite
  // number in `result`, at any depth, becomes null.
  void store(const std::string& name, const nlohmann::json& settings, nlohmann::json result) const;

 private:
  std::string dir_;
};

// A stored number: NaN for null (a non-finite value, or a quantity the cell does not have).
double cell_number(const nlohmann::json& v);

// How an experiment's run ended. Interrupted: a signal (SIGINT, SIGTERM) stopped it after its finished cells and
// checkpoints were saved; rerunning the same command continues it, and the CLI exits 128 + signal.
enum class RunStatus : uint8_t { Finished, Interrupted };

struct RunOutcome {
  RunStatus status = RunStatus::Finished;
  int signal = 0;        // Interrupted: the signal
  std::string message;   // Interrupted: where it stopped and how to continue
  bool interrupted() const { return status == RunStatus::Interrupted; }
  static RunOutcome interrupted_by(int signal, std::string message) {
    return {RunStatus::Interrupted, signal, std::move(message)};
  }
};

}  // namespace rotary::experiments
