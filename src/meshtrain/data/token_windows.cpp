// TokenWindows: windows of the token shards' stream, their per-epoch Philox shuffles and cursor fields;
// the rules are in token_windows.h.
#include "meshtrain/data/token_windows.h"

#include <glob.h>

#include <algorithm>
#include <filesystem>

#include "meshtrain/core/error.h"
#include "meshtrain/data/prepare_records.h"
#include "meshtrain/data/records/source_files.h"

namespace meshtrain {

namespace fs = std::filesystem;

std::unique_ptr<TokenWindows> TokenWindows::open(const std::vector<std::string>& shard_paths,
                                                 const LoaderOptions& options) {
  check_loader_options(options);
  if (shard_paths.empty()) fail("dataset_path", "at least one token shard", "none", "run meshtrain prepare");
  if (options.eos_id < 0) {
    fail("tokenizer_path", "a tokenizer with an end-of-sequence token (<|endoftext|>)", "none",
         "use the tokenizer.json that meshtrain prepare wrote next to the shards");
  }
  if (options.eos_id >= options.vocab_size) {
    fail("vocab_size", "more than the EOS id " + std::to_string(options.eos_id),
         std::to_string(options.vocab_size), "the tokenizer does not match the model's vocab_size");
  }
  std::unique_ptr<TokenWindows> windows(new TokenWindows);
  windows->sequence_length_ = options.sequence_length;
  windows->seed_ = options.seed;
  windows->packing_ = options.packing;
  windows->shuffle_ = options.shuffle;
  windows->allow_data_change_ = options.allow_data_change;
  windows->eos_id_ = options.eos_id;

  windows->shard_offsets_.push_back(0);
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
    windows->token_count_ += shard.size();
    windows->shard_offsets_.push_back(windows->token_count_);
    windows->shards_.push_back(std::move(shard));
  }

  const uint64_t sequence = static_cast<uint64_t>(options.sequence_length);
  if (options.packing) {
    windows->packed_windows_ = windows->token_count_ > sequence ? (windows->token_count_ - 1) / sequence : 0;
  } else {
    // One pass over the stream for document boundaries; each document gets ceil((L - 1) / S) windows.
    const auto add_document = [&](uint64_t start, uint64_t length) {
      for (uint64_t offset = 0; offset + 1 < length; offset += sequence) {
        const uint64_t size = std::min(sequence + 1, length - offset);
        windows->spans_.push_back(Span{start + offset, static_cast<uint32_t>(size)});
      }
    };
    uint64_t document_start = 0, position = 0;
    for (const TokenShard& shard : windows->shards_) {
      for (uint64_t i = 0; i < shard.size(); ++i, ++position) {
        if (shard[i] == options.eos_id) {
          add_document(document_start, position + 1 - document_start);
          document_start = position + 1;
        }
      }
    }
    add_document(document_start, position - document_start);  // a tail without EOS
  }
  if (windows->rows_per_epoch() == 0) {
    std::string names;
    for (const std::string& path : shard_paths) names += (names.empty() ? "" : ", ") + path;
    fail(names,
         options.packing ? "at least max_target_length + 1 = " + std::to_string(sequence + 1) + " tokens"
                         : "at least one document of 2 or more tokens",
         std::to_string(windows->token_count_) + " tokens",
         "use a larger dataset or a shorter max_target_length");
  }
  windows->order_ = EpochShuffle(options.seed, windows->rows_per_epoch());
  return windows;
}

uint64_t TokenWindows::window_at(uint64_t stream_row) {
  return shuffle_ ? order_.row(stream_row) : stream_row % rows_per_epoch();
}

void TokenWindows::select(int64_t /*step*/, uint64_t first_row, uint64_t rows) {
  selected_windows_.resize(rows);
  for (uint64_t row = 0; row < rows; ++row) selected_windows_[row] = window_at(first_row + row);
}

void TokenWindows::read_tokens(uint64_t start, size_t count, int32_t* out) const {
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

void TokenWindows::fill_row(uint64_t row, int64_t out_row, Batch& batch) const {
  fill_window(selected_windows_[static_cast<size_t>(row)], out_row, batch);
}

void TokenWindows::fill_window(uint64_t window, int64_t out_row, Batch& batch) const {
  const auto sequence = static_cast<size_t>(sequence_length_);
  const size_t base = static_cast<size_t>(out_row) * sequence;
  int32_t* tokens = batch.tokens.data() + base;
  int32_t* targets = batch.targets.data() + base;
  int32_t* positions = batch.positions.data() + base;
  int32_t* segments = batch.segment_ids.data() + base;
  uint8_t* mask = batch.loss_mask.data() + base;

  const Span span = packing_ ? Span{window * sequence, static_cast<uint32_t>(sequence + 1)} : spans_[window];
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

std::vector<uint32_t> TokenWindows::shard_checksums() const {
  std::vector<uint32_t> checksums;
  for (const TokenShard& shard : shards_) checksums.push_back(shard.summary().checksum);
  return checksums;
}

void TokenWindows::write_cursor(nlohmann::json& cursor, uint64_t rows_consumed) const {
  cursor["windows_consumed"] = rows_consumed;
  cursor["packing"] = packing_;
  cursor["shuffle"] = shuffle_;
  cursor["token_count"] = token_count_;
  cursor["windows_per_epoch"] = rows_per_epoch();
  cursor["shard_checksums"] = shard_checksums();
}

void check_cursor_order(const nlohmann::json& cursor, bool packing, bool shuffle, const std::string& where) {
  expect_cursor_field<bool>(cursor, "packing", packing, where);
  // The cursor's "shuffle" is the train split's enable_data_shuffling: the rows consumed count positions
  // in one order, so they mean other rows in the other.
  const bool saved_shuffle = cursor_field<bool>(cursor, "shuffle", where);
  if (saved_shuffle != shuffle) {
    const auto text = [](bool value) { return std::string(value ? "true" : "false"); };
    fail(where, "enable_data_shuffling=" + text(shuffle) + " (this run)",
         "enable_data_shuffling=" + text(saved_shuffle) + " (when the checkpoint was saved)",
         "resume with enable_data_shuffling=" + text(saved_shuffle) +
             " (the order of a run's rows cannot change mid-run), or use a fresh run_dir");
  }
}

std::optional<uint64_t> TokenWindows::read_cursor(const nlohmann::json& cursor,
                                                  const std::string& where) const {
  check_cursor_order(cursor, packing_, shuffle_, where);
  if (allow_data_change_) {
    // A mixture's cursor (mixture_rows.h) holds the global position as rows_consumed.
    return cursor_field<uint64_t>(cursor, cursor.contains("sources") ? "rows_consumed" : "windows_consumed",
                                  where);
  }
  if (cursor.contains("sources")) {
    fail(where, "a data cursor of one source (this run's dataset_path)",
         "a cursor of a mixture of " + std::to_string(cursor["sources"].size()) + " sources",
         "resume with the dataset_path the checkpoint was made with, set allow_data_change=true to continue "
         "on this data from the checkpoint's position, or use a fresh run_dir");
  }
  const std::string hint = std::string(kOtherDataHint) +
                           "; or set allow_data_change=true to continue on "
                           "this data from the checkpoint's position";
  expect_cursor_field<uint64_t>(cursor, "token_count", token_count_, where, hint);
  expect_cursor_field<std::vector<uint32_t>>(cursor, "shard_checksums", shard_checksums(), where, hint);
  return cursor_field<uint64_t>(cursor, "windows_consumed", where);
}

std::vector<std::string> resolve_token_shards(const std::string& path, const std::string& split) {
  std::error_code error;
  if (fs::is_regular_file(path, error)) return {path};
  // The train split comes from dataset_path, the validation split from eval_dataset_path.
  const std::string key = split == "train" ? "dataset_path" : "eval_dataset_path";
  if (!fs::is_directory(path, error)) {
    fail(path, "a .tokens shard or a folder of them", "nothing readable at that path",
         "run meshtrain prepare --out DIR and set " + key + "=DIR");
  }
  // `meshtrain prepare --tokenizer` output: its index lists the split's shards in order.
  const fs::path index = fs::path(path) / "index.json";
  if (fs::is_regular_file(index, error)) return shards_of_index(index.string(), split);
  if (fs::is_directory(fs::path(path) / "files", error) && fs::is_directory(fs::path(path) / split, error)) {
    fail(path, "a finished meshtrain prepare (its index.json)",
         "shards without index.json: prepare stopped early",
         "re-run the meshtrain prepare that wrote " + path);
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

std::vector<std::string> resolve_token_pattern(const std::string& pattern, const std::string& split) {
  if (!is_glob(pattern)) return resolve_token_shards(pattern, split);
  glob_t matches{};
  const int status = glob(pattern.c_str(), 0, nullptr, &matches);
  std::vector<std::string> paths(matches.gl_pathv, matches.gl_pathv + matches.gl_pathc);
  globfree(&matches);
  if (status != 0 || paths.empty()) {
    fail(pattern, "a glob matching .tokens shards or folders of them", "no match",
         "check the pattern (it is matched from the working directory), or run meshtrain prepare first");
  }
  std::sort(paths.begin(), paths.end());
  std::vector<std::string> shards;
  for (const std::string& path : paths) {
    for (std::string& shard : resolve_token_shards(path, split)) shards.push_back(std::move(shard));
  }
  return shards;
}

}  // namespace meshtrain
