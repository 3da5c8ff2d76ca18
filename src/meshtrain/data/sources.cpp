// The datasets (token shards, text files, synthetic), the synthetic rows and the checks of LoaderOptions that
// every split makes first; the rules are in sources.h and source.h.
#include "meshtrain/data/sources.h"

#include <filesystem>

#include "meshtrain/core/error.h"
#include "meshtrain/core/rng.h"
#include "meshtrain/data/corpus.h"
#include "meshtrain/data/prepare.h"
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

TokenShardsSource::TokenShardsSource(const std::string& train_path, std::string validation_path)
    : train_shards_(resolve_token_shards(train_path, split_name(Split::train))),
      validation_path_(std::move(validation_path)) {}

std::unique_ptr<RowSource> TokenShardsSource::open(Split split, const LoaderOptions& options) const {
  return TokenWindows::open(
      split == Split::train ? train_shards_ : resolve_token_shards(validation_path_, split_name(split)),
      options);
}

TextFilesSource::TextFilesSource(std::string corpus_path, std::string work_dir)
    : corpus_path_(std::move(corpus_path)), work_dir_(std::move(work_dir)) {}

void TextFilesSource::prepare(const Tokenizer* tokenizer) {
  MT_CHECK(tokenizer != nullptr, "text files need the run's tokenizer");
  const std::optional<int32_t> eos_id = tokenizer->eos_id();
  if (!eos_id) {
    fail(tokenizer->source_path(), "a tokenizer with an end-of-text token (<|endoftext|>)", "none",
         "dataset_type=text packs documents with EOS between them");
  }
  const Corpus corpus = load_corpus(corpus_path_, 0.05, kTrainCorpusSettings);
  std::filesystem::create_directories(work_dir_);
  tokenize_corpus(corpus, *tokenizer, *eos_id, work_dir_);
}

std::unique_ptr<RowSource> TextFilesSource::open(Split split, const LoaderOptions& options) const {
  return TokenWindows::open(resolve_token_shards(work_dir_, split_name(split)), options);
}

std::unique_ptr<RowSource> SyntheticSource::open(Split split, const LoaderOptions& options) const {
  LoaderOptions rows = options;
  if (split == Split::validation) rows.seed += 0x5EED;  // held-out synthetic rows
  return open_synthetic_rows(rows);
}

}  // namespace meshtrain
