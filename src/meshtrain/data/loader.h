// The training / eval batch stream: a RowSource's rows (source.h) grouped into global batches and split into
// per-(data rank, micro-batch) slices. Its whole state is the step and the rows consumed (a global position):
// it survives any world size.
//
// Batches. The stream of rows runs on across epochs; global batch k takes the next G = B x R x GA rows
// (B per-device rows, R data ranks, GA micro-batches).
// Split. Global row g = (micro_index * R + data_rank) * B + i, so micro_batch(r, m) holds rows
// [(m * R + r) * B, +B). The global batch is the same G rows whatever (B, R, GA) give the same G, and
// with R = 1 the GA micro-batches concatenated are exactly the rows of one GA = 1 batch of GA x B rows.
// Cursor. JSON {format, version, kind, step, seed, sequence_length, global_batch_rows (G), and the source's
// fields (token windows: windows_consumed, packing, shuffle, token_count, shard checksums, ...)}: restore()
// continues with identical batches, and rejects a cursor from another dataset, seed, sequence length, packing
// mode or order, or of another global batch (a run resuming on another mesh derives
// gradient_accumulation_steps from G first: train/run.h keep_checkpoint_global_batch). Cursors saved before G
// was recorded have none.
#pragma once

#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "meshtrain/data/batch.h"
#include "meshtrain/data/source.h"

namespace meshtrain {

// The global batch in rows a saved cursor records; nullopt for a cursor saved before it was recorded.
// `where` names the cursor's origin in errors (a field that is there but not a positive integer).
std::optional<int64_t> cursor_global_batch_rows(const nlohmann::json& cursor, const std::string& where);

class BatchLoader {
 public:
  // `options` gives the layout (B, R, GA); the rows were opened with the same options.
  BatchLoader(std::unique_ptr<RowSource> rows, const LoaderOptions& options);

  // The [B, S] slice of the current global batch for (data_rank, micro_index). Const and free of caches:
  // safe to call from several threads at once (advance / restore / reset are not).
  Batch micro_batch(int data_rank, int micro_index) const;
  // All G rows of the current global batch, [G, S].
  Batch global_batch() const;
  void advance();  // next step
  void reset();    // back to the first batch (eval restarts from the beginning each time)

  nlohmann::json cursor() const;
  // `where` names the cursor's origin (e.g. the checkpoint file) in errors.
  void restore(const nlohmann::json& cursor, const std::string& where = "data cursor");

  int64_t step() const { return step_; }
  int64_t global_batch_rows() const { return rows_per_micro_ * ranks_ * micro_batches_; }
  int64_t sequence_length() const { return rows_->sequence_length(); }
  const RowSource& rows() const { return *rows_; }

 private:
  void select();  // points the rows at the current step's global batch

  std::unique_ptr<RowSource> rows_;
  int64_t rows_per_micro_ = 1, ranks_ = 1, micro_batches_ = 1;
  int64_t step_ = 0;
  uint64_t rows_consumed_ = 0;  // rows taken by the steps before this one
};

}  // namespace meshtrain
