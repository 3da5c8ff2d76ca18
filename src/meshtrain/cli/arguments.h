// The one argument parser of every command (shared/specs/config-keys.md "Command line"): `--flag VALUE`,
// `--flag=VALUE`, boolean `--flag`, one positional word (a config or a folder) and, where the command takes
// a config, key=value overrides. Flags and hints come from the command's entry in the table (commands.h).
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "meshtrain/cli/commands.h"

namespace meshtrain {

struct ParsedArguments {
  const CommandSpec* command = nullptr;
  std::optional<std::string> positional;
  std::vector<std::string> overrides;        // key=value
  std::map<std::string, std::string> flags;  // flag -> value ("" for a boolean flag)

  // Whether the flag was given. Every flag read here must be in the command's table entry (an internal
  // error otherwise), so that the help lists all the flags the command reads.
  bool has(const std::string& flag) const { return value(flag) != nullptr; }
  // The flag's value; nullptr when it was not given.
  const std::string* value(const std::string& flag) const;
  // "meshtrain CMD --flag": where an error about the flag points.
  std::string where(const std::string& flag) const;
  // "usage: meshtrain CMD ...; all flags: meshtrain CMD --help": the fix part of an error about arguments.
  std::string usage_hint() const;
  // The flag's value, required non-empty: a MeshError naming `expected` when absent.
  std::string required(const std::string& flag, const std::string& expected) const;
  // The positional word, required: a MeshError naming `expected` when absent.
  std::string required_positional(const std::string& expected) const;
  // The config (train, info, compile): a preset name or a YAML path, required.
  std::string config() const;
  // Integer >= minimum / finite number; `fallback` when the flag is absent.
  int64_t integer(const std::string& flag, int64_t fallback, int64_t minimum) const;
  double number(const std::string& flag, double fallback) const;
};

// True when a word in flag position is --help or -h (a flag's value such as `--prompt -h` is not).
bool asks_for_help(const CommandSpec& command, const std::vector<std::string>& words);

// Parses the words after the command name. An unknown flag is a MeshError with a did-you-mean among the
// command's own flags; a missing value, a value given to a boolean flag, a flag given twice and a second
// positional word are MeshErrors pointing at `meshtrain CMD --help`.
ParsedArguments parse_arguments(const CommandSpec& command, const std::vector<std::string>& words);

// "5GB", "500MB", "1.5GiB", "123" (bytes) -> bytes; `flag` names the flag for errors.
uint64_t parse_byte_size(const std::string& flag, const std::string& text);

}  // namespace meshtrain
