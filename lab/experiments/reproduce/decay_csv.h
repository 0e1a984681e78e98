// lab/experiments/reproduce/decay_csv.h: the measured decay that seed 003's study reads back from `rotary decay`.
#pragma once

#include <cstdint>
#include <map>
#include <string>

namespace rotary::experiments::reproduce {

// decay_model.csv (written by `rotary decay --checkpoint`): distance -> measured mean |q R(d) k|, relative to d = 0.
std::map<int64_t, double> read_measured_decay(const std::string& csv_path);

}  // namespace rotary::experiments::reproduce
