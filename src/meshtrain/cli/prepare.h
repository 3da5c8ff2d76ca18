// `meshtrain prepare`: corpus -> trained BPE tokenizer -> token shards (train / validation) + prepare.json.
// Usage: meshtrain prepare [--out DIR] [--vocab-size N] [--corpus PATH] [--validation-fraction F]
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <ostream>
#include <string>
#include <vector>

namespace meshtrain {

struct PrepareOptions {
  std::string out_dir = "data/kjv";
  int64_t vocab_size = 8192;          // ids in the trained tokenizer, EOS included
  std::string corpus;                 // empty: the King James Bible (fixed split); else a file or folder
  double validation_fraction = 0.05;  // user corpora only
};

struct PrepareResult {
  std::string tokenizer_path, train_path, validation_path, summary_path;
  bool skipped = false;    // outputs were already complete for these arguments
  nlohmann::json summary;  // what prepare.json holds
};

// Does the work (or skips it when `out_dir/prepare.json` records the same arguments, the same corpus
// checksum and outputs that still verify) and prints a summary to `out`.
// Output files: tokenizer.json, train.tokens, validation.tokens, and prepare.json (written last).
PrepareResult prepare_dataset(const PrepareOptions& options, std::ostream& out);

// Parses the flags (--flag VALUE or --flag=VALUE; --help prints usage) and runs prepare_dataset.
int run_prepare(const std::vector<std::string>& arguments, std::ostream& out);

}  // namespace meshtrain
