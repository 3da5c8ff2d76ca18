// The datasets a run reads (DataSource, source.h): text files tokenized with the run's tokenizer, token
// shards from `meshtrain prepare`, mixtures of either, and synthetic tokens; and the synthetic rows.
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

#include "meshtrain/data/mixture.h"
#include "meshtrain/data/records/record_reader.h"
#include "meshtrain/data/source.h"

namespace meshtrain {

std::unique_ptr<RowSource> open_synthetic_rows(const LoaderOptions& options);

// A dataset whose rows are token windows over shards (token shards, tokenized text files): what a mixture's
// entry is.
class TokenWindowsSource : public DataSource {
 public:
  bool needs_tokenizer() const final { return true; }  // the EOS id
  std::unique_ptr<RowSource> open(Split split, const LoaderOptions& options) const final;
  // The split's shards, resolved when a split is opened (after prepare()).
  virtual std::vector<std::string> shards(Split split) const = 0;
};

// `meshtrain prepare`'s output (or any .tokens shards): the train split from train_pattern, the validation
// split from validation_pattern (resolve_token_pattern, token_windows.h: a file, a folder or a glob). The
// train shards are resolved here, so a missing dataset is reported before anything else is loaded.
class TokenShardsSource final : public TokenWindowsSource {
 public:
  TokenShardsSource(const std::string& train_pattern, std::string validation_pattern);
  std::vector<std::string> shards(Split split) const override;

 private:
  std::vector<std::string> train_shards_;
  std::string validation_pattern_;
};

// Text sources, tokenized with the run's tokenizer into work_dir by prepare() before the first step:
//  - text files (a file or a folder; empty: the King James Bible, load_corpus in corpus.h): split 95 / 5 by
//    document (split_documents) into work_dir/{train,validation}.tokens, rebuilt at every start;
//  - JSON Lines or Parquet records (a file, a folder holding any, or a glob): read with the record reader
//    (the text in column `records.column`, train_data_columns) and tokenized on every core by prepare_records
//    (prepare_records.h), 1 document in 20 to validation, into work_dir's shards and index.json. The shards
//    are those `meshtrain prepare --tokenizer` writes for the same source, so both paths train on the same
//    tokens; a restart with the same sources, tokenizer and column reuses them.
// For large corpora `meshtrain prepare` once and token shards are the better path (several ranks share it).
inline constexpr double kTextValidationFraction = 0.05;
class TextFilesSource final : public TokenWindowsSource {
 public:
  TextFilesSource(std::string corpus_path, std::string work_dir, RecordOptions records = {});
  bool needs_preparing() const override { return true; }
  void prepare(const Tokenizer* tokenizer) override;
  std::vector<std::string> shards(Split split) const override;
  const RecordOptions& records() const { return records_; }

 private:
  std::string corpus_path_, work_dir_;
  RecordOptions records_;
};

// Several weighted sources (dataset_path's mixture, mixture.h): each split is MixtureRows (mixture_rows.h)
// over the entries' shards of that split, so the validation split mixes each source's own validation split
// with the same weights (in stream order, as every eval split).
class MixtureDataSource final : public DataSource {
 public:
  // `key`: the config key the entries are from, for errors (dataset_path, eval_dataset_path).
  MixtureDataSource(std::vector<MixtureSource> entries,
                    std::vector<std::unique_ptr<TokenWindowsSource>> parts, std::string key);
  bool needs_preparing() const override;
  void prepare(const Tokenizer* tokenizer) override;
  bool needs_tokenizer() const override { return true; }
  std::unique_ptr<RowSource> open(Split split, const LoaderOptions& options) const override;

 private:
  std::vector<MixtureSource> entries_;
  std::vector<std::unique_ptr<TokenWindowsSource>> parts_;
  std::string key_;
};

// dataset_type=tokens. dataset_path: one source (a .tokens file, a folder, a glob) or a mixture; the
// validation split from eval_dataset_path when given (one source or a mixture), else from each source's own
// (a folder's validation.tokens; else its shards).
std::unique_ptr<DataSource> make_token_shards_source(const std::string& dataset_path,
                                                     const std::string& eval_dataset_path);
// dataset_type=text. dataset_path: one source, tokenized into work_dir, or a mixture, entry i tokenized into
// work_dir/source-<i>; each source holds out its own 5% for validation.
std::unique_ptr<DataSource> make_text_files_source(const std::string& dataset_path,
                                                   const std::string& work_dir, const RecordOptions& records);

// Random ids from the seed: no file at all.
class SyntheticSource final : public DataSource {
 public:
  bool needs_tokenizer() const override { return false; }
  std::unique_ptr<RowSource> open(Split split, const LoaderOptions& options) const override;
};

}  // namespace meshtrain
