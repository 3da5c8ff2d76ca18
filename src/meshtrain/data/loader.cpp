// BatchLoader: windows, per-epoch Philox shuffles, batch layout and cursors; the rules are in loader.h.
#include "meshtrain/data/loader.h"

#include <algorithm>
#include <filesystem>
#include <numeric>

#include "meshtrain/core/error.h"
#include "meshtrain/core/rng.h"

namespace meshtrain {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

constexpr const char* kCursorFormat = "meshtrain-data-cursor";
constexpr int kCursorVersion = 1;

void check_options(const LoaderOptions& options) {
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

Batch empty_batch(int64_t rows, int64_t sequence) {
  const size_t cells = static_cast<size_t>(rows * sequence);
  Batch batch;
  batch.tokens.resize(cells);
  batch.targets.resize(cells);
  batch.positions.resize(cells);
  batch.segment_ids.resize(cells);
  batch.loss_mask.resize(cells);
  return batch;
}

template <class T>
T cursor_field(const json& cursor, const char* key, const std::string& where) {
  try {
    return cursor.at(key).get<T>();
  } catch (const json::exception& error) {
    fail(where, std::string("a data cursor with field '") + key + "'", error.what(),
         "the checkpoint's data cursor is damaged or from another meshtrain version");
  }
}

template <class T>
void expect_same(const json& cursor, const char* key, const T& mine, const std::string& where,
                 const std::string& hint) {
  const T theirs = cursor_field<T>(cursor, key, where);
  if (theirs != mine) {
    fail(where, std::string(key) + " = " + json(mine).dump() + " (this run's data)",
         json(theirs).dump() + " (when the cursor was saved)", hint);
  }
}

}  // namespace

BatchLoader BatchLoader::from_shards(const std::vector<std::string>& shard_paths,
                                     const LoaderOptions& options) {
  check_options(options);
  if (shard_paths.empty()) fail("dataset_path", "at least one token shard", "none", "run meshtrain prepare");
  if (options.eos_id < 0) {
    fail("tokenizer_path", "a tokenizer with an end-of-sequence token (<|endoftext|>)", "none",
         "use the tokenizer.json that meshtrain prepare wrote next to the shards");
  }
  if (options.eos_id >= options.vocab_size) {
    fail("vocab_size", "more than the EOS id " + std::to_string(options.eos_id),
         std::to_string(options.vocab_size), "the tokenizer does not match the model's vocab_size");
  }
  BatchLoader loader;
  loader.sequence_length_ = options.sequence_length;
  loader.rows_per_micro_ = options.per_device_batch_size;
  loader.ranks_ = options.data_ranks;
  loader.micro_batches_ = options.gradient_accumulation_steps;
  loader.seed_ = options.seed;
  loader.packing_ = options.packing;
  loader.shuffle_ = options.shuffle;
  loader.eos_id_ = options.eos_id;
  loader.vocab_size_ = options.vocab_size;

  loader.shard_offsets_.push_back(0);
  for (const std::string& path : shard_paths) {
    TokenShard shard = TokenShard::open(path);
    if (shard.max_token() >= options.vocab_size) {
      uint64_t index = 0;
      while (shard[index] < options.vocab_size) ++index;
      fail(
          path, "token ids below the model's vocab_size " + std::to_string(options.vocab_size),
          "id " + std::to_string(shard[index]) + " at token " + std::to_string(index),
          "the tokenizer does not match the model's vocab_size: set vocab_size to the tokenizer's, or re-run "
          "meshtrain prepare with --vocab-size");
    }
    loader.token_count_ += shard.size();
    loader.shard_offsets_.push_back(loader.token_count_);
    loader.shards_.push_back(std::move(shard));
  }

  const uint64_t sequence = static_cast<uint64_t>(options.sequence_length);
  if (options.packing) {
    loader.packed_windows_ = loader.token_count_ > sequence ? (loader.token_count_ - 1) / sequence : 0;
  } else {
    // One pass over the stream for document boundaries; each document gets ceil((L - 1) / S) windows.
    const auto add_document = [&](uint64_t start, uint64_t length) {
      for (uint64_t offset = 0; offset + 1 < length; offset += sequence) {
        const uint64_t size = std::min(sequence + 1, length - offset);
        loader.spans_.push_back(Span{start + offset, static_cast<uint32_t>(size)});
      }
    };
    uint64_t document_start = 0, position = 0;
    for (const TokenShard& shard : loader.shards_) {
      for (uint64_t i = 0; i < shard.size(); ++i, ++position) {
        if (shard[i] == options.eos_id) {
          add_document(document_start, position + 1 - document_start);
          document_start = position + 1;
        }
      }
    }
    add_document(document_start, position - document_start);  // a tail without EOS
  }
  if (loader.windows_per_epoch() == 0) {
    std::string names;
    for (const std::string& path : shard_paths) names += (names.empty() ? "" : ", ") + path;
    fail(names,
         options.packing ? "at least max_target_length + 1 = " + std::to_string(sequence + 1) + " tokens"
                         : "at least one document of 2 or more tokens",
         std::to_string(loader.token_count_) + " tokens",
         "use a larger dataset or a shorter max_target_length");
  }
  loader.select_windows();
  return loader;
}

BatchLoader BatchLoader::synthetic(const LoaderOptions& options) {
  check_options(options);
  BatchLoader loader;
  loader.synthetic_ = true;
  loader.sequence_length_ = options.sequence_length;
  loader.rows_per_micro_ = options.per_device_batch_size;
  loader.ranks_ = options.data_ranks;
  loader.micro_batches_ = options.gradient_accumulation_steps;
  loader.seed_ = options.seed;
  loader.packing_ = false;
  loader.shuffle_ = false;
  loader.vocab_size_ = options.vocab_size;
  return loader;
}

uint64_t BatchLoader::windows_per_epoch() const {
  if (synthetic_) return 0;
  return packing_ ? packed_windows_ : spans_.size();
}

const std::vector<uint64_t>& BatchLoader::permutation(uint64_t epoch) {
  if (epoch != cached_epoch_) {
    const uint64_t windows = windows_per_epoch();
    cached_permutation_.resize(windows);
    std::iota(cached_permutation_.begin(), cached_permutation_.end(), uint64_t{0});
    const PhiloxKey key = philox_key(seed_, "meshtrain/data-shuffle/epoch=" + std::to_string(epoch));
    for (uint64_t i = windows; i-- > 1;) {
      // uniform_at has 53 random bits: the bias for any realistic window count is far below noise.
      const auto j = std::min(i, static_cast<uint64_t>(uniform_at(key, i) * static_cast<double>(i + 1)));
      std::swap(cached_permutation_[i], cached_permutation_[j]);
    }
    cached_epoch_ = epoch;
  }
  return cached_permutation_;
}

void BatchLoader::select_windows() {
  if (synthetic_) return;
  const uint64_t windows = windows_per_epoch();
  const auto rows = static_cast<uint64_t>(global_batch_rows());
  step_windows_.resize(rows);
  for (uint64_t row = 0; row < rows; ++row) {
    const uint64_t counter = windows_consumed_ + row;
    const uint64_t index = counter % windows;
    step_windows_[row] = shuffle_ ? permutation(counter / windows)[index] : index;
  }
}

void BatchLoader::read_tokens(uint64_t start, size_t count, int32_t* out) const {
  auto shard =
      std::upper_bound(shard_offsets_.begin(), shard_offsets_.end(), start) - shard_offsets_.begin() - 1;
  while (count > 0) {
    const uint64_t local = start - shard_offsets_[shard];
    const size_t take = static_cast<size_t>(std::min<uint64_t>(count, shards_[shard].size() - local));
    shards_[shard].read(local, take, out);
    out += take;
    start += take;
    count -= take;
    ++shard;
  }
}

void BatchLoader::fill_row(int64_t global_row, int64_t out_row, Batch& batch) const {
  const auto sequence = static_cast<size_t>(sequence_length_);
  const size_t base = static_cast<size_t>(out_row) * sequence;
  int32_t* tokens = batch.tokens.data() + base;
  int32_t* targets = batch.targets.data() + base;
  int32_t* positions = batch.positions.data() + base;
  int32_t* segments = batch.segment_ids.data() + base;
  uint8_t* mask = batch.loss_mask.data() + base;

  if (synthetic_) {
    const PhiloxKey key = philox_key(seed_, "meshtrain/synthetic-data/step=" + std::to_string(step_));
    const uint64_t first = static_cast<uint64_t>(global_row) * (sequence + 1);
    const auto vocab = static_cast<uint32_t>(vocab_size_);
    int32_t previous = static_cast<int32_t>(uint32_at(key, first) % vocab);
    for (size_t c = 0; c < sequence; ++c) {
      const auto next = static_cast<int32_t>(uint32_at(key, first + c + 1) % vocab);
      tokens[c] = previous;
      targets[c] = next;
      positions[c] = static_cast<int32_t>(c);
      segments[c] = 0;
      mask[c] = 1;
      previous = next;
    }
    return;
  }

  const uint64_t window = step_windows_[static_cast<size_t>(global_row)];
  Span span;
  if (packing_) {
    span = Span{window * sequence, static_cast<uint32_t>(sequence + 1)};
  } else {
    span = spans_[window];
  }
  std::vector<int32_t> buffer(span.length);
  read_tokens(span.start, span.length, buffer.data());
  const size_t real = span.length - 1;  // input/target pairs from the data
  int32_t segment = 0, position = 0;
  for (size_t c = 0; c < real; ++c) {
    const int32_t input = buffer[c];
    tokens[c] = input;
    targets[c] = buffer[c + 1];
    positions[c] = position;
    segments[c] = segment;
    // Packing: EOS ends its document; its target is the next document's first token, not predictable.
    const bool ends_document = packing_ && input == eos_id_;
    mask[c] = ends_document ? 0 : 1;
    if (ends_document) {
      ++segment;
      position = 0;
    } else {
      ++position;
    }
  }
  for (size_t c = real; c < sequence; ++c) {  // packing = false: padding after a short last window
    tokens[c] = eos_id_;
    targets[c] = eos_id_;
    positions[c] = static_cast<int32_t>(c);
    segments[c] = 1;
    mask[c] = 0;
  }
}

Batch BatchLoader::micro_batch(int data_rank, int micro_index) const {
  MT_CHECK(data_rank >= 0 && data_rank < ranks_, "data rank " + std::to_string(data_rank));
  MT_CHECK(micro_index >= 0 && micro_index < micro_batches_, "micro-batch " + std::to_string(micro_index));
  Batch batch = empty_batch(rows_per_micro_, sequence_length_);
  const int64_t first = (micro_index * ranks_ + data_rank) * rows_per_micro_;
  for (int64_t row = 0; row < rows_per_micro_; ++row) fill_row(first + row, row, batch);
  return batch;
}

Batch BatchLoader::global_batch() const {
  const int64_t rows = global_batch_rows();
  Batch batch = empty_batch(rows, sequence_length_);
  for (int64_t row = 0; row < rows; ++row) fill_row(row, row, batch);
  return batch;
}

void BatchLoader::advance() {
  ++step_;
  windows_consumed_ += static_cast<uint64_t>(global_batch_rows());
  select_windows();
}

void BatchLoader::reset() {
  step_ = 0;
  windows_consumed_ = 0;
  select_windows();
}

json BatchLoader::cursor() const {
  json cursor = {{"format", kCursorFormat},
                 {"version", kCursorVersion},
                 {"kind", synthetic_ ? "synthetic" : "tokens"},
                 {"step", step_},
                 {"seed", seed_},
                 {"sequence_length", sequence_length_}};
  if (synthetic_) {
    cursor["vocab_size"] = vocab_size_;
    return cursor;
  }
  json checksums = json::array();
  for (const TokenShard& shard : shards_) checksums.push_back(shard.summary().checksum);
  cursor["windows_consumed"] = windows_consumed_;
  cursor["packing"] = packing_;
  cursor["shuffle"] = shuffle_;
  cursor["token_count"] = token_count_;
  cursor["windows_per_epoch"] = windows_per_epoch();
  cursor["shard_checksums"] = checksums;
  return cursor;
}

void BatchLoader::restore(const json& cursor, const std::string& where) {
  if (!cursor.is_object() || cursor.value("format", "") != kCursorFormat) {
    fail(where, "a meshtrain data cursor", cursor.dump().substr(0, 120),
         "the checkpoint's data cursor is damaged or from another program");
  }
  expect_same<int>(cursor, "version", kCursorVersion, where,
                   "the checkpoint is from another meshtrain version");
  const std::string kind = synthetic_ ? "synthetic" : "tokens";
  const std::string dataset_hint =
      "resume with the dataset_type, dataset_path, data_shuffle_seed, "
      "max_target_length and packing the checkpoint was made with, or use a "
      "fresh run_dir";
  expect_same<std::string>(cursor, "kind", kind, where, dataset_hint);
  expect_same<uint64_t>(cursor, "seed", seed_, where, dataset_hint);
  expect_same<int64_t>(cursor, "sequence_length", sequence_length_, where, dataset_hint);
  const auto step = cursor_field<int64_t>(cursor, "step", where);
  if (step < 0) fail(where, "a step >= 0", std::to_string(step));
  if (synthetic_) {
    expect_same<int64_t>(cursor, "vocab_size", vocab_size_, where, dataset_hint);
    step_ = step;
    return;
  }
  expect_same<bool>(cursor, "packing", packing_, where, dataset_hint);
  expect_same<bool>(cursor, "shuffle", shuffle_, where, dataset_hint);
  expect_same<uint64_t>(cursor, "token_count", token_count_, where, dataset_hint);
  std::vector<uint32_t> checksums;
  for (const TokenShard& shard : shards_) checksums.push_back(shard.summary().checksum);
  expect_same<std::vector<uint32_t>>(cursor, "shard_checksums", checksums, where, dataset_hint);
  step_ = step;
  windows_consumed_ = cursor_field<uint64_t>(cursor, "windows_consumed", where);
  select_windows();
}

std::vector<std::string> resolve_token_shards(const std::string& path, const std::string& split) {
  std::error_code error;
  if (fs::is_regular_file(path, error)) return {path};
  if (!fs::is_directory(path, error)) {
    fail(path, "a .tokens shard or a folder of them", "nothing readable at that path",
         "run meshtrain prepare --out DIR and set dataset_path=DIR");
  }
  const fs::path named = fs::path(path) / (split + ".tokens");
  if (fs::is_regular_file(named, error)) return {named.string()};
  std::vector<std::string> shards;
  for (fs::recursive_directory_iterator it(path, error), end; !error && it != end; it.increment(error)) {
    std::error_code kind_error;
    if (it->is_regular_file(kind_error) && it->path().extension() == ".tokens")
      shards.push_back(it->path().string());
  }
  if (error) fail(path, "a readable folder", error.message());
  if (shards.empty()) {
    fail(path, "a folder with " + split + ".tokens or other *.tokens shards", "none",
         "run meshtrain prepare --out " + path);
  }
  std::sort(shards.begin(), shards.end());
  return shards;
}

}  // namespace meshtrain
