// lab/experiments/cell_store.cpp: the store of finished cells (cell_store.h).
#include "experiments/cell_store.h"

#include <cmath>
#include <exception>
#include <filesystem>

#include "common/files.h"
#include "rotary/error.h"
#include "rotary/json_guard.h"

namespace rotary::experiments {
namespace {

void nulls_for_non_finite(nlohmann::json& v) {
  if (v.is_number_float() && !std::isfinite(v.get<double>())) {
    v = nullptr;
  } else if (v.is_structured()) {
    for (auto& item : v) nulls_for_non_finite(item);
  }
}

}  // namespace

const char* cell_lookup_name(CellLookup lookup) {
  switch (lookup) {
    case CellLookup::Missing: return "missing";
    case CellLookup::Reused: return "reused";
    case CellLookup::SettingsChanged: return "settings changed";
    case CellLookup::Damaged: return "damaged";
  }
  return "?";
}

std::string CellStore::path(const std::string& name) const { return lab::join_path(dir_, name); }

CellLookup CellStore::find(const std::string& name, const nlohmann::json& settings,
                           const std::function<void(const nlohmann::json& result)>& read) const {
  const std::string file = path(name);
  if (!lab::file_exists(file)) return CellLookup::Missing;
  nlohmann::json stored;
  try {
    stored = parse_json(lab::read_file(file), file);
  } catch (const std::exception&) {
    return CellLookup::Damaged;
  }
  if (!stored.is_object() || !stored.contains("settings") || !stored.contains("result")) return CellLookup::Damaged;
  if (stored["settings"] != settings) return CellLookup::SettingsChanged;
  try {
    read(stored["result"]);
  } catch (const std::exception&) {  // nlohmann's type and key errors, rotary::Error from the experiment's reader
    return CellLookup::Damaged;
  }
  return CellLookup::Reused;
}

void CellStore::store(const std::string& name, const nlohmann::json& settings, nlohmann::json result) const {
  nulls_for_non_finite(result);
  const std::string file = path(name);
  lab::make_dirs(std::filesystem::path(file).parent_path().string());
  lab::write_file_atomic(file, nlohmann::json{{"settings", settings}, {"result", result}}.dump() + "\n");
}

double cell_number(const nlohmann::json& v) { return v.is_null() ? std::nan("") : v.get<double>(); }

}  // namespace rotary::experiments
