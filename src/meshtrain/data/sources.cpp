// The datasets (token shards, text files, synthetic), the synthetic rows and the checks of LoaderOptions that
// every split makes first; the rules are in sources.h and source.h.
#include "meshtrain/data/sources.h"

#include <filesystem>

#include "meshtrain/core/error.h"
#include "meshtrain/core/rng.h"
#include "meshtrain/data/corpus.h"
#include "meshtrain/data/mixture_rows.h"
#include "meshtrain/data/prepare.h"
#include "meshtrain/data/prepare_records.h"
#include "meshtrain/data/records/source_files.h"
#include "meshtrain/data/token_windows.h"
#include "meshtrain/data/tokenizer/tokenizer.h"

namespace meshtrain {
namespace {

class SyntheticRows final : public RowSource {
 public:
  explicit SyntheticRows(const LoaderOptions& options)
      : seed_(options.seed), sequence_length_(options.sequence_length), vocab_size_(options.vocab_size) {}

  const char* kind() const override { return "synthetic"; }
  uint64_t seed() const override { return seed_; }
  int64_t sequence_length() const override { return sequence_length_; }
  uint64_t rows_per_epoch() const override { return 0; }
  void select(int64_t step, uint64_t /*first_row*/, uint64_t /*rows*/) override { step_ = step; }

  void fill_row(uint64_t row, int64_t out_row, Batch& batch) const override {
    const auto sequence = static_cast<size_t>(sequence_length_);
    const size_t base = static_cast<size_t>(out_row) * sequence;
    const PhiloxKey key = philox_key(seed_, "meshtrain/synthetic-data/step=" + std::to_string(step_));
    const uint64_t first = row * (sequence + 1);
    const auto vocab = static_cast<uint32_t>(vocab_size_);
    int32_t previous = static_cast<int32_t>(uint32_at(key, first) % vocab);
    for (size_t c = 0; c < sequence; ++c) {
      const auto next = static_cast<int32_t>(uint32_at(key, first + c + 1) % vocab);
      batch.tokens[base + c] = previous;
      batch.targets[base + c] = next;
      batch.positions[base + c] = static_cast<int32_t>(c);
      batch.segment_ids[base + c] = 0;
      batch.loss_mask[base + c] = 1;
      previous = next;
    }
  }

  void write_cursor(nlohmann::json& cursor, uint64_t /*rows_consumed*/) const override {
    cursor["vocab_size"] = vocab_size_;
  }
  std::optional<uint64_t> read_cursor(const nlohmann::json& cursor, const std::string& where) const override {
    expect_cursor_field<int64_t>(cursor, "vocab_size", vocab_size_, where);
    return std::nullopt;
  }

 private:
  uint64_t seed_ = 0;
  int64_t sequence_length_ = 0, vocab_size_ = 0;
  int64_t step_ = 0;
};

}  // namespace

void check_loader_options(const LoaderOptions& options) {
  if (options.sequence_length < 1 || options.sequence_length >= (int64_t{1} << 30)) {
    fail("max_target_length", "a sequence length in [1, 2^30)", std::to_string(options.sequence_length));
  }
  if (options.per_device_batch_size < 1) {
    fail("per_device_batch_size", "at least 1", std::to_string(options.per_device_batch_size));
  }
  if (options.gradient_accumulation_steps < 1) {
    fail("gradient_accumulation_steps", "at least 1", std::to_string(options.gradient_accumulation_steps));
  }
  MT_CHECK(options.data_ranks >= 1, "data ranks " + std::to_string(options.data_ranks));
  if (options.vocab_size < 1 || options.vocab_size > (int64_t{1} << 31)) {
    fail("vocab_size", "a vocabulary size in [1, 2^31]", std::to_string(options.vocab_size));
  }
}

std::unique_ptr<RowSource> open_synthetic_rows(const LoaderOptions& options) {
  check_loader_options(options);
  return std::make_unique<SyntheticRows>(options);
}

std::unique_ptr<RowSource> TokenWindowsSource::open(Split split, const LoaderOptions& options) const {
  return TokenWindows::open(shards(split), options);
}

TokenShardsSource::TokenShardsSource(const std::string& train_pattern, std::string validation_pattern)
    : train_shards_(resolve_token_pattern(train_pattern, split_name(Split::train))),
      validation_pattern_(std::move(validation_pattern)) {}

std::vector<std::string> TokenShardsSource::shards(Split split) const {
  return split == Split::train ? train_shards_
                               : resolve_token_pattern(validation_pattern_, split_name(split));
}

TextFilesSource::TextFilesSource(std::string corpus_path, std::string work_dir, RecordOptions records)
    : corpus_path_(std::move(corpus_path)), work_dir_(std::move(work_dir)), records_(std::move(records)) {}

void TextFilesSource::prepare(const Tokenizer* tokenizer) {
  MT_CHECK(tokenizer != nullptr, "text files need the run's tokenizer");
  const std::optional<int32_t> eos_id = tokenizer->eos_id();
  if (!eos_id) {
    fail(tokenizer->source_path(), "a tokenizer with an end-of-text token (<|endoftext|>)", "none",
         "dataset_type=text packs documents with EOS between them");
  }
  std::filesystem::create_directories(work_dir_);
  const std::string index = work_dir_ + "/index.json";
  // Plain text files keep their whole-corpus split; records go through prepare_records.
  if (holds_records(corpus_path_)) {
    // Skipped when index.json already describes these sources, tokenizer and column (a restart).
    PrepareRecordsOptions options;
    options.source = corpus_path_;
    options.tokenizer_path = tokenizer->source_path();
    options.out_dir = work_dir_;
    options.column = records_.column;
    options.path_setting = records_.path_setting;
    options.column_setting = records_.column_setting;
    options.validation_fraction = kTextValidationFraction;
    prepare_records(options);
    return;
  }
  std::filesystem::remove(index);  // shards() would take an earlier records run's index over these shards
  const Corpus corpus = load_corpus(corpus_path_, kTextValidationFraction, kTrainCorpusSettings);
  tokenize_corpus(corpus, *tokenizer, *eos_id, work_dir_);
}

std::vector<std::string> TextFilesSource::shards(Split split) const {
  return resolve_token_shards(work_dir_, split_name(split));
}

MixtureDataSource::MixtureDataSource(std::vector<MixtureSource> entries,
                                     std::vector<std::unique_ptr<TokenWindowsSource>> parts, std::string key)
    : entries_(std::move(entries)), parts_(std::move(parts)), key_(std::move(key)) {
  MT_CHECK(entries_.size() == parts_.size(), "a source per mixture entry");
}

bool MixtureDataSource::needs_preparing() const {
  for (const auto& part : parts_)
    if (part->needs_preparing()) return true;
  return false;
}

void MixtureDataSource::prepare(const Tokenizer* tokenizer) {
  for (size_t i = 0; i < parts_.size(); ++i)
    in_mixture_entry(mixture_entry_name(entries_, i, key_), [&] { parts_[i]->prepare(tokenizer); });
}

std::unique_ptr<RowSource> MixtureDataSource::open(Split split, const LoaderOptions& options) const {
  std::vector<std::vector<std::string>> shards;
  for (size_t i = 0; i < parts_.size(); ++i) {
    shards.push_back(
        in_mixture_entry(mixture_entry_name(entries_, i, key_), [&] { return parts_[i]->shards(split); }));
  }
  return MixtureRows::open(entries_, shards, options, key_);
}

namespace {

// The train split from one dataset, the validation split from another (eval_dataset_path's).
class SplitSources final : public DataSource {
 public:
  // The validation entries are resolved when that split is opened: a run without eval never needs them.
  SplitSources(std::unique_ptr<DataSource> train, std::vector<MixtureSource> validation)
      : train_(std::move(train)), validation_(std::move(validation)) {}
  bool needs_preparing() const override { return train_->needs_preparing(); }
  void prepare(const Tokenizer* tokenizer) override { train_->prepare(tokenizer); }
  bool needs_tokenizer() const override { return true; }
  std::unique_ptr<RowSource> open(Split split, const LoaderOptions& options) const override;

 private:
  std::unique_ptr<DataSource> train_;
  std::vector<MixtureSource> validation_;
};

// One token source, or a mixture of them, each entry's splits from its own pattern.
std::unique_ptr<DataSource> token_shards_of(const std::vector<MixtureSource>& entries,
                                            const std::string& key) {
  if (entries.size() == 1) return std::make_unique<TokenShardsSource>(entries[0].path, entries[0].path);
  std::vector<std::unique_ptr<TokenWindowsSource>> parts;
  for (size_t i = 0; i < entries.size(); ++i) {
    parts.push_back(in_mixture_entry(mixture_entry_name(entries, i, key), [&] {
      return std::make_unique<TokenShardsSource>(entries[i].path, entries[i].path);
    }));
  }
  return std::make_unique<MixtureDataSource>(entries, std::move(parts), key);
}

std::unique_ptr<RowSource> SplitSources::open(Split split, const LoaderOptions& options) const {
  if (split == Split::train) return train_->open(split, options);
  return token_shards_of(validation_, "eval_dataset_path")->open(split, options);
}

}  // namespace

std::unique_ptr<DataSource> make_token_shards_source(const std::string& dataset_path,
                                                     const std::string& eval_dataset_path) {
  const std::vector<MixtureSource> entries = parse_dataset_path(dataset_path);
  if (entries.size() == 1 && entries[0].path.empty()) {
    fail("config key 'dataset_path'", "a .tokens shard or a folder from `meshtrain prepare`", "nothing",
         "run ./scripts/train.sh once, or `meshtrain prepare --out data/kjv`");
  }
  if (eval_dataset_path.empty()) return token_shards_of(entries, "dataset_path");
  const std::vector<MixtureSource> eval_entries = parse_dataset_path(eval_dataset_path);
  if (entries.size() == 1 && eval_entries.size() == 1) {  // a single source reads as it always has
    return std::make_unique<TokenShardsSource>(entries[0].path, eval_entries[0].path);
  }
  return std::make_unique<SplitSources>(token_shards_of(entries, "dataset_path"), eval_entries);
}

std::unique_ptr<DataSource> make_text_files_source(const std::string& dataset_path,
                                                   const std::string& work_dir,
                                                   const RecordOptions& records) {
  const std::vector<MixtureSource> entries = parse_dataset_path(dataset_path);
  if (entries.size() == 1) return std::make_unique<TextFilesSource>(entries[0].path, work_dir, records);
  std::vector<std::unique_ptr<TokenWindowsSource>> parts;
  for (size_t i = 0; i < entries.size(); ++i) {
    parts.push_back(std::make_unique<TextFilesSource>(entries[i].path,
                                                      work_dir + "/source-" + std::to_string(i), records));
  }
  return std::make_unique<MixtureDataSource>(entries, std::move(parts), "dataset_path");
}

std::unique_ptr<RowSource> SyntheticSource::open(Split split, const LoaderOptions& options) const {
  LoaderOptions rows = options;
  if (split == Split::validation) rows.seed += 0x5EED;  // held-out synthetic rows
  return open_synthetic_rows(rows);
}

}  // namespace meshtrain
