#include "meshtrain/cli/arguments.h"

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

}  // namespace meshtrain
