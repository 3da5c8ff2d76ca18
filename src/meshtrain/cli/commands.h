// The command table: every command's summary, usage, flags, notes and examples. Both the help text
// (`meshtrain CMD --help`, `meshtrain help [CMD]`) and the argument parser's error hints (cli/arguments.h)
// are made from it, so they cannot disagree.
#pragma once

#include <istream>
#include <ostream>
#include <string>
#include <vector>

namespace meshtrain {

struct FlagSpec {
  std::string name;         // "--max-new-tokens"
  std::string placeholder;  // "N"; empty: a boolean flag that takes no value
  std::string help;         // one sentence, with the default
};

struct CommandSpec {
  std::string name;     // "generate"
  std::string summary;  // one line, for `meshtrain help`
  std::string usage;    // the words after "meshtrain "
  // The one word that is not a flag (a config, a folder); empty: the command takes none.
  std::string positional;
  bool config_overrides = false;  // key=value words override config keys
  std::vector<FlagSpec> flags;
  std::vector<std::string> notes;
  std::vector<std::string> examples;  // each runnable as it stands after `meshtrain prepare` / a short train
};

const std::vector<CommandSpec>& command_table();
// The named command's entry; an unknown name is a MeshError with a did-you-mean.
const CommandSpec& find_command(const std::string& name);
// `meshtrain CMD --help`: the summary, "usage: ...", each flag with its sentence, the notes and examples.
std::string command_help(const CommandSpec& command);
// `meshtrain help`: every command with its summary.
std::string commands_overview();

// Runs `meshtrain WORDS...` (the words after the program name): `help [CMD]`, `--help`, `CMD --help` or
// `CMD -h` print help to `out` and return 0; no words print the overview to `err` and return 2; otherwise
// the command runs and its exit status is returned. Bad input is a MeshError (main prints it).
int run_command_line(const std::vector<std::string>& words, std::istream& in, std::ostream& out,
                     std::ostream& err);

}  // namespace meshtrain
