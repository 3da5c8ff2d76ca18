// `meshtrain prepare`: corpus -> trained BPE tokenizer -> token shards (train / validation) + prepare.json;
// or, with --tokenizer, raw sources (text, JSON Lines, Parquet) -> token shards + index.json.
// Usage: meshtrain prepare [--out DIR] [--vocab-size N] [--corpus PATH] [--validation-fraction F]
//        meshtrain prepare --corpus SOURCE --tokenizer PATH --out DIR [--column NAME] [--validation-fraction
//        F]
//                          [--threads N]
#pragma once

#include <ostream>
#include <string>
#include <vector>

namespace meshtrain {

// Reads the flags (cli/arguments.h; `meshtrain prepare --help` prints them, from commands.cpp), runs
// prepare_dataset (data/prepare.h), or prepare_records (data/prepare_records.h) with --tokenizer, and prints
// a summary of what it made or found up to date to `out` (rank 0 only under mpirun).
int run_prepare(const std::vector<std::string>& arguments, std::ostream& out);

}  // namespace meshtrain
