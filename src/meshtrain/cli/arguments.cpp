// The shared argument parser (arguments.h): every command's flags and hints come from its table entry.
#include "meshtrain/cli/arguments.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <utility>

#include "meshtrain/config/config.h"
#include "meshtrain/core/error.h"

namespace meshtrain {
namespace {

const FlagSpec* find_flag(const CommandSpec& command, const std::string& name) {
  for (const FlagSpec& flag : command.flags) {
    if (flag.name == name) return &flag;
  }
  return nullptr;
}

// A word that names a flag: "--x", "--x=v", or -h.
bool is_flag_word(const std::string& word) {
  return word.starts_with("--") || word == "-h";
}

std::string flag_list(const CommandSpec& command) {
  std::string names;
  for (const FlagSpec& flag : command.flags) names += (names.empty() ? "" : ", ") + flag.name;
  return names;
}

}  // namespace

const std::string* ParsedArguments::value(const std::string& flag) const {
  MT_CHECK(find_flag(*command, flag) != nullptr, "every flag a command reads is in its table entry");
  const auto found = flags.find(flag);
  return found == flags.end() ? nullptr : &found->second;
}

std::string ParsedArguments::where(const std::string& flag) const {
  return "meshtrain " + command->name + " " + flag;
}

std::string ParsedArguments::usage_hint() const {
  return "usage: meshtrain " + command->usage + "; all flags: meshtrain " + command->name + " --help";
}

std::string ParsedArguments::required(const std::string& flag, const std::string& expected) const {
  const std::string* given = value(flag);
  if (given == nullptr || given->empty()) fail(where(flag), expected, "none given", usage_hint());
  return *given;
}

std::string ParsedArguments::required_positional(const std::string& expected) const {
  if (!positional) fail("meshtrain " + command->name, expected, "none given", usage_hint());
  return *positional;
}

std::string ParsedArguments::config() const {
  if (!positional) {
    std::string presets;
    for (const std::string& name : preset_names()) presets += (presets.empty() ? "" : ", ") + name;
    fail(
        "meshtrain " + command->name, "a config: a preset name (" + presets + ") or a YAML path", "none",
        "e.g. meshtrain " + command->name + " qwen3-tiny; all flags: meshtrain " + command->name + " --help");
  }
  return *positional;
}

int64_t ParsedArguments::integer(const std::string& flag, int64_t fallback, int64_t minimum) const {
  const std::string* text = value(flag);
  if (text == nullptr) return fallback;
  int64_t number = 0;
  const auto [end, error] = std::from_chars(text->data(), text->data() + text->size(), number);
  if (text->empty() || error != std::errc() || end != text->data() + text->size() || number < minimum) {
    fail(where(flag), "an integer >= " + std::to_string(minimum), "'" + *text + "'", usage_hint());
  }
  return number;
}

double ParsedArguments::number(const std::string& flag, double fallback) const {
  const std::string* text = value(flag);
  if (text == nullptr) return fallback;
  char* end = nullptr;
  const double number = std::strtod(text->c_str(), &end);
  if (text->empty() || end != text->c_str() + text->size() || !std::isfinite(number)) {
    fail(where(flag), "a finite number", "'" + *text + "'", usage_hint());
  }
  return number;
}

bool asks_for_help(const CommandSpec& command, const std::vector<std::string>& words) {
  for (size_t i = 0; i < words.size(); ++i) {
    if (words[i] == "--help" || words[i] == "-h") return true;
    const FlagSpec* flag = find_flag(command, words[i]);
    if (flag != nullptr && !flag->placeholder.empty()) ++i;  // its value, whatever it says
  }
  return false;
}

ParsedArguments parse_arguments(const CommandSpec& command, const std::vector<std::string>& words) {
  ParsedArguments parsed;
  parsed.command = &command;
  for (size_t i = 0; i < words.size(); ++i) {
    const std::string& word = words[i];
    if (is_flag_word(word)) {
      const size_t equals = word.find('=');
      const std::string name = word.substr(0, equals);
      const FlagSpec* flag = find_flag(command, name);
      if (flag == nullptr) {
        // `--steps 3` for `steps=3`: a config key written as a flag.
        std::string key = name.substr(name.starts_with("--") ? 2 : 1);
        std::replace(key.begin(), key.end(), '-', '_');
        const std::vector<std::string> keys = config_key_names();
        if (command.config_overrides && std::find(keys.begin(), keys.end(), key) != keys.end()) {
          fail("meshtrain " + command.name + " argument '" + word + "'",
               "config keys as key=value words, flags as --flag", "the config key '" + key + "' as a flag",
               "write " + key + "=" + (equals != std::string::npos ? word.substr(equals + 1) : "VALUE") +
                   " (config keys are key=value words: docs/configuration.md lists them)");
        }
        std::vector<std::string> names;
        for (const FlagSpec& known : command.flags) names.push_back(known.name);
        if (names.empty()) {
          // train and info take no flags: a misspelt config key written as a flag is the likely meaning.
          const std::string hint = command.config_overrides
                                       ? "did you mean the config key " + closest_name(key, keys) +
                                             "=VALUE? " + parsed.usage_hint()
                                       : parsed.usage_hint();
          fail("meshtrain " + command.name + " argument '" + word + "'",
               command.config_overrides ? "key=value config overrides (the command takes no flags)"
                                        : "no flags",
               "an unknown flag", hint);
        }
        fail("meshtrain " + command.name + " argument '" + word + "'",
             "one of the " + command.name + " flags: " + flag_list(command), "an unknown flag",
             "did you mean '" + closest_name(name, names) + "'? all flags: meshtrain " + command.name +
                 " --help");
      }
      std::string value;
      if (flag->placeholder.empty()) {
        if (equals != std::string::npos) {
          fail(parsed.where(name), "no value (a switch)", "'" + word + "'", "write " + name + " alone");
        }
      } else if (equals != std::string::npos) {
        value = word.substr(equals + 1);
      } else {
        if (i + 1 == words.size()) {
          fail(parsed.where(name), flag->placeholder + " after it (" + flag->help + ")", "nothing",
               parsed.usage_hint());
        }
        value = words[++i];
      }
      if (!parsed.flags.emplace(name, value).second) {
        fail(parsed.where(name), "the flag once", "given twice", "keep one of the two");
      }
    } else if (command.config_overrides && word.find('=') != std::string::npos) {
      parsed.overrides.push_back(word);
    } else if (!parsed.positional && !command.positional.empty()) {
      parsed.positional = word;
    } else {
      fail("meshtrain " + command.name + " argument '" + word + "'",
           command.positional.empty()
               ? std::string("flags only")
               : "one " + command.positional +
                     (command.config_overrides ? ", then key=value overrides" : std::string()),
           parsed.positional ? "a second word after '" + *parsed.positional + "'" : "a word that is no flag",
           parsed.usage_hint());
    }
  }
  return parsed;
}

uint64_t parse_byte_size(const std::string& flag, const std::string& text) {
  static const std::vector<std::pair<std::string, double>> kUnits = {
      {"GiB", 1073741824.0}, {"MiB", 1048576.0}, {"KiB", 1024.0}, {"GB", 1e9},
      {"MB", 1e6},           {"KB", 1e3},        {"kB", 1e3},     {"B", 1.0}};
  double scale = 1.0;
  std::string number = text;
  for (const auto& [unit, factor] : kUnits) {
    if (text.size() > unit.size() && text.ends_with(unit)) {
      scale = factor;
      number = text.substr(0, text.size() - unit.size());
      break;
    }
  }
  char* end = nullptr;
  const double value = std::strtod(number.c_str(), &end);
  const double bytes = value * scale;
  if (number.empty() || end != number.c_str() + number.size() || !(bytes >= 1.0) || !(bytes < 1.8e19)) {
    fail(flag, "a size of at least one byte such as 5GB, 500MB or 2GiB", "'" + text + "'",
         "e.g. " + flag + "=5GB");
  }
  return static_cast<uint64_t>(bytes);
}

}  // namespace meshtrain
