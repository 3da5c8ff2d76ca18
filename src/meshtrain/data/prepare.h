// The dataset pipeline: a corpus, a tokenizer, the token shards of its train and validation splits.
// `meshtrain prepare` runs all of it (training the tokenizer, recording prepare.json); dataset_type=text
// runs tokenize_corpus with the run's tokenizer.
#pragma once

#include <cstdint>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "meshtrain/data/corpus.h"
#include "meshtrain/data/shards.h"
#include "meshtrain/data/tokenizer/tokenizer.h"

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

// Trains the tokenizer on the train split and writes tokenizer.json, train.tokens, validation.tokens and
// prepare.json (last) under out_dir; skips the work when prepare.json records the same arguments, the same
// corpus checksum and outputs that still verify.
PrepareResult prepare_dataset(const PrepareOptions& options);

// Document i encoded for every i < count, on `threads` OpenMP threads (0: OpenMP's default); text(i) gives
// its text and may do work of its own first (a JSON line's parse) and throw. The result does not depend on
// the thread count, nor which error is thrown: the first failing document's.
std::vector<std::vector<int32_t>> encode_in_parallel(const Tokenizer& tokenizer, size_t count,
                                                     const std::function<std::string_view(size_t)>& text,
                                                     int threads = 0);

// The threads encode_in_parallel (and prepare_records) encode on for `threads` (0: OpenMP's default).
int encoding_threads(int threads);

// Both splits of a corpus tokenized (in parallel) and written as out_dir/{train,validation}.tokens, each
// document followed by `eos_id`. out_dir must exist.
struct TokenizedCorpus {
  std::string train_path, validation_path;
  std::vector<std::vector<int32_t>> train, validation;  // token ids per document, EOS not included
  ShardSummary train_shard, validation_shard;
  double encode_seconds = 0.0, write_seconds = 0.0;
};
TokenizedCorpus tokenize_corpus(const Corpus& corpus, const Tokenizer& tokenizer, int32_t eos_id,
                                const std::string& out_dir);

}  // namespace meshtrain
