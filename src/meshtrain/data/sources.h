// The datasets a run reads (DataSource, source.h): text files tokenized with the run's tokenizer, token
// shards from `meshtrain prepare`, and synthetic tokens; and the synthetic rows.
//
// Synthetic rows. Token (step, global row g, column c) = Philox uint32_at(key(seed, step), g * (S + 1) + c)
// mod vocab_size for c in [0, S]: inputs columns [0, S), targets [1, S + 1); one segment, positions 0..S-1,
// mask 1. It does not depend on B, R or GA, so every mesh sees the same batch. The validation split draws
// from seed + 0x5EED. Cursor field: vocab_size; the position is the step. There is no stream to order, so
// LoaderOptions::shuffle (enable_data_shuffling) has no effect: every row is a fresh draw either way.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "meshtrain/data/source.h"

namespace meshtrain {

std::unique_ptr<RowSource> open_synthetic_rows(const LoaderOptions& options);

// `meshtrain prepare`'s output (or any .tokens shards): the train split from train_path, the validation
// split from validation_path (resolve_token_shards, token_windows.h). The train shards are resolved here,
// so a missing dataset is reported before anything else is loaded.
class TokenShardsSource final : public DataSource {
 public:
  TokenShardsSource(const std::string& train_path, std::string validation_path);
  bool needs_tokenizer() const override { return true; }  // the EOS id
  std::unique_ptr<RowSource> open(Split split, const LoaderOptions& options) const override;

 private:
  std::vector<std::string> train_shards_;
  std::string validation_path_;
};

// Text files (a file or a folder; empty: the King James Bible, load_corpus in corpus.h), split 95 / 5 and
// tokenized with the run's tokenizer into work_dir/{train,validation}.tokens by prepare(), rebuilt at every
// start. For large corpora `meshtrain prepare` once and token shards are the better path.
class TextFilesSource final : public DataSource {
 public:
  TextFilesSource(std::string corpus_path, std::string work_dir);
  bool needs_preparing() const override { return true; }
  void prepare(const Tokenizer* tokenizer) override;
  bool needs_tokenizer() const override { return true; }
  std::unique_ptr<RowSource> open(Split split, const LoaderOptions& options) const override;

 private:
  std::string corpus_path_, work_dir_;
};

// Random ids from the seed: no file at all.
class SyntheticSource final : public DataSource {
 public:
  bool needs_tokenizer() const override { return false; }
  std::unique_ptr<RowSource> open(Split split, const LoaderOptions& options) const override;
};

}  // namespace meshtrain
