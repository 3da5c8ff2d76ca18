// `meshtrain prepare`: corpus -> trained BPE tokenizer -> token shards (train / validation) + prepare.json.
// Usage: meshtrain prepare [--out DIR] [--vocab-size N] [--corpus PATH] [--validation-fraction F]
#pragma once

#include <ostream>
#include <string>
#include <vector>

namespace meshtrain {

// Reads the flags (cli/arguments.h; `meshtrain prepare --help` prints them, from commands.cpp), runs
// prepare_dataset (data/prepare.h) and prints a summary of what it made or found up to date to `out`.
int run_prepare(const std::vector<std::string>& arguments, std::ostream& out);

}  // namespace meshtrain
