#include "meshtrain/cli/arguments.h"

#include <cstdlib>
#include <utility>

#include "meshtrain/config/config.h"
#include "meshtrain/core/error.h"

namespace meshtrain {

ConfigArguments parse_config_arguments(const std::string& command, const std::vector<std::string>& words) {
  ConfigArguments parsed;
  for (const std::string& word : words) {
    if (word.starts_with("--")) {
      parsed.flags.push_back(word);
    } else if (parsed.config.empty() && word.find('=') == std::string::npos) {
      parsed.config = word;
    } else {
      parsed.overrides.push_back(word);
    }
  }
  if (parsed.config.empty()) {
    std::string presets;
    for (const std::string& name : preset_names()) presets += (presets.empty() ? "" : ", ") + name;
    fail("meshtrain " + command, "a config: a preset name (" + presets + ") or a YAML path", "none",
         "e.g. meshtrain " + command + " qwen3-tiny");
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
