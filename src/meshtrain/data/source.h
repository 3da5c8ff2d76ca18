// Where a run's rows come from, behind two interfaces: records -> tokens -> packed rows.
//   DataSource: a dataset with a train and a validation split (text files, token shards, synthetic, and a
//     mixture of weighted text or token sources). Opening a split gives its rows.
//   RowSource: one split as an endless stream of packed rows of S input/target pairs, numbered 0, 1, 2, ...
//     across epochs. BatchLoader (loader.h) cuts that stream into global batches and per-rank slices; its
//     whole state is the step and the rows consumed, so the stream itself knows nothing of ranks.
// The implementations live in token_windows.h (token shards cut into windows), mixture_rows.h (a mixture's
// rows) and sources.h (the datasets and the synthetic rows).
#pragma once

#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "meshtrain/core/error.h"
#include "meshtrain/data/batch.h"

namespace meshtrain {

class Tokenizer;

// What opening a split's rows and batching them needs: the row geometry, the order, the vocabulary and the
// batch layout (B, R, GA).
struct LoaderOptions {
  int64_t sequence_length = 0;              // S (max_target_length)
  int64_t per_device_batch_size = 1;        // B: rows of one micro_batch()
  int64_t data_ranks = 1;                   // R: ranks that receive different rows
  int64_t gradient_accumulation_steps = 1;  // GA
  uint64_t seed = 0;                        // data_shuffle_seed
  bool packing = true;
  bool shuffle = true;  // false for eval and enable_data_shuffling=false: windows in stream order
  int32_t eos_id = -1;  // required for shards; unused by synthetic
  int64_t vocab_size = 0;
  bool allow_data_change = false;  // a cursor from other data continues on this data (read_cursor)
};

// The checks every split makes first: S, B, GA, R and the vocabulary size (MeshErrors naming the key).
void check_loader_options(const LoaderOptions& options);

// One split's packed rows. Row r of the stream is [S] cells of a Batch: inputs, targets, positions,
// segment ids and loss mask.
class RowSource {
 public:
  virtual ~RowSource() = default;

  virtual const char* kind() const = 0;  // a cursor's "kind": "tokens", "synthetic"
  virtual uint64_t seed() const = 0;
  virtual int64_t sequence_length() const = 0;
  virtual uint64_t rows_per_epoch() const = 0;  // 0: unbounded (synthetic)

  // Makes the global batch of `step`, the stream's rows [first_row, first_row + rows), the one fill_row
  // reads (a shuffled source draws its epoch permutations here).
  virtual void select(int64_t step, uint64_t first_row, uint64_t rows) = 0;
  // Row `row` of the selected batch into row `out_row` of `batch`. Const and free of caches: safe to call
  // from several threads at once.
  virtual void fill_row(uint64_t row, int64_t out_row, Batch& batch) const = 0;

  // The source's fields of a data cursor beyond kind, seed and sequence length (what identifies the data,
  // and the position `rows_consumed` where the source has one).
  virtual void write_cursor(nlohmann::json& cursor, uint64_t rows_consumed) const = 0;
  // Checks those fields of a saved cursor against this source (a MeshError naming `where` on a mismatch) and
  // returns the rows consumed, or nothing where the rows follow the step alone (synthetic).
  virtual std::optional<uint64_t> read_cursor(const nlohmann::json& cursor,
                                              const std::string& where) const = 0;

  // The rows read through the selected batch, for the metrics record of the step that trains it (a mixture:
  // each source's rows, tokens and epochs); null where there is nothing beyond the loss's own figures.
  virtual nlohmann::json metrics() const { return nullptr; }
};

enum class Split { train, validation };
inline const char* split_name(Split split) {
  return split == Split::train ? "train" : "validation";
}

// A dataset: its splits opened as rows.
class DataSource {
 public:
  virtual ~DataSource() = default;
  // Work one process does before any process opens a split (text files: tokenizing the corpus into token
  // shards); the others wait for it. `tokenizer` is the run's (null where it needs none).
  virtual bool needs_preparing() const { return false; }
  virtual void prepare(const Tokenizer* /*tokenizer*/) {}
  // Whether the rows need the run's tokenizer (its EOS id, or to tokenize text).
  virtual bool needs_tokenizer() const = 0;
  virtual std::unique_ptr<RowSource> open(Split split, const LoaderOptions& options) const = 0;
};

// A saved cursor's field, or a MeshError naming `where` and the field.
template <class T>
T cursor_field(const nlohmann::json& cursor, const char* key, const std::string& where) {
  try {
    return cursor.at(key).get<T>();
  } catch (const nlohmann::json::exception& error) {
    fail(where, std::string("a data cursor with field '") + key + "'", error.what(),
         "the checkpoint's data cursor is damaged or from another meshtrain version");
  }
}

// What a cursor from other data is told.
inline constexpr const char* kOtherDataHint =
    "resume with the dataset_type, dataset_path, data_shuffle_seed, max_target_length and packing the "
    "checkpoint was made with, or use a fresh run_dir";

// A saved cursor's field must equal this run's value, else a MeshError naming both.
template <class T>
void expect_cursor_field(const nlohmann::json& cursor, const char* key, const T& mine,
                         const std::string& where, const std::string& hint = kOtherDataHint) {
  const T theirs = cursor_field<T>(cursor, key, where);
  if (theirs != mine) {
    fail(where, std::string(key) + " = " + nlohmann::json(mine).dump() + " (this run's data)",
         nlohmann::json(theirs).dump() + " (when the cursor was saved)", hint);
  }
}

}  // namespace meshtrain
