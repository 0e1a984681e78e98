// lab/cli/torch/train_flags.h: the flags that set TrainConfig fields, shared by `rotary train` and
// `rotary compare`. A flag overrides the TOML file (--config), which overrides the built-in defaults: every
// flag remembers whether it was given and sets its one field only then.
#pragma once

#include <CLI/CLI.hpp>

#include <fstream>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "cli/command_line.h"
#include "cli/options.h"
#include "common/files.h"
#include "rotary/error.h"
#include "rotary/settings.h"
#include "train/config.h"

namespace rotary::cli {

class TrainFlags {
 public:
  // One flag per setting of train::train_settings() that names one: its type, help and range come from that
  // declaration, so --help, the flag's checks and the TOML/JSON readers cannot disagree.
  void add_to(CLI::App& app) {
    app.add_option("--config", config_file, "TOML file with the run's settings (flags override it)")
        ->check(CLI::ExistingFile);
    for (const settings::Setting<train::TrainConfig>& s : train::train_settings())
      if (!s.flag.empty()) add(app, s);
  }

  bool any_given() const {
    for (const Flag& f : flags_)
      if (f.option->count() > 0) return true;
    return !config_file.empty();
  }

  // base <- the TOML file (if given) <- the flags that were given.
  train::TrainConfig resolve(train::TrainConfig base) const {
    if (!config_file.empty()) {
      nlohmann::json file = train::toml_to_json(lab::read_file(config_file), config_file);
      try {
        train::from_json(file, base);
      } catch (const Error& e) {
        throw Error(std::string(e.what()) + " (in " + config_file + ")");
      }
    }
    for (const Flag& f : flags_)
      if (f.option->count() > 0) {
        // The same checked path as a file's value, with the flag's name in any message.
        const settings::Setting<train::TrainConfig>& s = *f.setting;
        s.set(base, settings::checked_value(s.allowed, f.value(), s.flag), s.flag);
      }
    return base;
  }

  std::string config_file;

 private:
  struct Flag {
    CLI::Option* option;
    const settings::Setting<train::TrainConfig>* setting;
    std::function<nlohmann::json()> value;  // what was given, as JSON
  };

  // Numbers carry the options.h validator of their declared range (CLI11's own conversion would wrap, clamp or
  // read octal); the rest name their allowed values in --help.
  void add(CLI::App& app, const settings::Setting<train::TrainConfig>& s) {
    using settings::Kind;
    const settings::Allowed& a = s.allowed;
    const std::string help = s.help + (a.note.empty() ? "" : " (" + a.note + ")");
    CLI::Option* opt = nullptr;
    std::function<nlohmann::json()> value;
    // An option holding a T, whose value reaches the setting as JSON.
    auto typed = [&]<class T>(std::type_identity<T>, const std::string& text) {
      auto v = std::make_shared<T>();
      opt = app.add_option(s.flag, *v, text);
      value = [v] { return nlohmann::json(*v); };
    };
    switch (a.kind) {
      // Numbers: an open end (lr > 0) is refused when the flag is applied, with the flag's name.
      case Kind::Integer: typed(std::type_identity<int64_t>{}, help), opt->transform(range_of(a)); break;
      case Kind::Unsigned: typed(std::type_identity<uint64_t>{}, help), opt->transform(range_of(a)); break;
      case Kind::Real: typed(std::type_identity<double>{}, help), opt->transform(range_of(a)); break;
      case Kind::Boolean:
        if (s.flag_words.size() == 2) {  // --norm pre|post
          typed(std::type_identity<std::string>{}, help + ": " + s.flag_words[1] + " | " + s.flag_words[0]);
          opt->check(CLI::IsMember(s.flag_words));
          value = [words = s.flag_words, v = value] { return nlohmann::json(v().get<std::string>() == words[1]); };
        } else {
          typed(std::type_identity<bool>{}, help + " (true/false)");
        }
        break;
      case Kind::Text:
      case Kind::Choice:
      case Kind::Reals:
        typed(std::type_identity<std::string>{}, help + (a.kind == Kind::Choice ? ": " + a.text() : ""));
        break;
    }
    // A flag given twice takes its last value, so a script can append an override to a shared flag list.
    opt->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
    flags_.push_back({opt, &s, std::move(value)});
  }

  std::vector<Flag> flags_;
};

}  // namespace rotary::cli
