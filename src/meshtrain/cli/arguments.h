// Command-line conventions (shared/specs/config-keys.md): `meshtrain CMD <config> [key=value ...] [--flags]`.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace meshtrain {

struct ConfigArguments {
  std::string config;                  // preset name or YAML path
  std::vector<std::string> overrides;  // key=value
  std::vector<std::string> flags;      // --flag or --flag=value
};

// Splits the words after the command; a missing config is an error that names the command.
ConfigArguments parse_config_arguments(const std::string& command, const std::vector<std::string>& words);

// "5GB", "500MB", "1.5GiB", "123" (bytes) -> bytes; `flag` names the flag for errors.
uint64_t parse_byte_size(const std::string& flag, const std::string& text);

}  // namespace meshtrain
