// BatchLoader: batch layout, steps and cursors over a RowSource; the rules are in loader.h.
#include "meshtrain/data/loader.h"

#include "meshtrain/core/error.h"

namespace meshtrain {
namespace {

using json = nlohmann::json;

constexpr const char* kCursorFormat = "meshtrain-data-cursor";
constexpr int kCursorVersion = 1;

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

constexpr const char* kGlobalBatchField = "global_batch_rows";

}  // namespace

std::optional<int64_t> cursor_global_batch_rows(const json& cursor, const std::string& where) {
  if (!cursor.is_object() || !cursor.contains(kGlobalBatchField)) return std::nullopt;
  const auto rows = cursor_field<int64_t>(cursor, kGlobalBatchField, where);
  if (rows < 1) fail(where, "a global batch of at least 1 row", std::to_string(rows));
  return rows;
}

BatchLoader::BatchLoader(std::unique_ptr<RowSource> rows, const LoaderOptions& options)
    : rows_(std::move(rows)),
      rows_per_micro_(options.per_device_batch_size),
      ranks_(options.data_ranks),
      micro_batches_(options.gradient_accumulation_steps) {
  MT_CHECK(rows_ != nullptr && rows_->sequence_length() == options.sequence_length,
           "rows opened with other options");
  select();
}

void BatchLoader::select() {
  rows_->select(step_, rows_consumed_, static_cast<uint64_t>(global_batch_rows()));
}

Batch BatchLoader::micro_batch(int data_rank, int micro_index) const {
  MT_CHECK(data_rank >= 0 && data_rank < ranks_, "data rank " + std::to_string(data_rank));
  MT_CHECK(micro_index >= 0 && micro_index < micro_batches_, "micro-batch " + std::to_string(micro_index));
  Batch batch = empty_batch(rows_per_micro_, sequence_length());
  const int64_t first = (micro_index * ranks_ + data_rank) * rows_per_micro_;
  for (int64_t row = 0; row < rows_per_micro_; ++row)
    rows_->fill_row(static_cast<uint64_t>(first + row), row, batch);
  return batch;
}

Batch BatchLoader::global_batch() const {
  const int64_t rows = global_batch_rows();
  Batch batch = empty_batch(rows, sequence_length());
  for (int64_t row = 0; row < rows; ++row) rows_->fill_row(static_cast<uint64_t>(row), row, batch);
  return batch;
}

void BatchLoader::advance() {
  ++step_;
  rows_consumed_ += static_cast<uint64_t>(global_batch_rows());
  select();
}

void BatchLoader::reset() {
  step_ = 0;
  rows_consumed_ = 0;
  select();
}

json BatchLoader::cursor() const {
  json cursor = {{"format", kCursorFormat},
                 {"version", kCursorVersion},
                 {"kind", rows_->kind()},
                 {"step", step_},
                 {"seed", rows_->seed()},
                 {"sequence_length", sequence_length()},
                 {kGlobalBatchField, global_batch_rows()}};
  rows_->write_cursor(cursor, rows_consumed_);
  return cursor;
}

void BatchLoader::restore(const json& cursor, const std::string& where) {
  if (!cursor.is_object() || cursor.value("format", "") != kCursorFormat) {
    fail(where, "a meshtrain data cursor", cursor.dump().substr(0, 120),
         "the checkpoint's data cursor is damaged or from another program");
  }
  expect_cursor_field<int>(cursor, "version", kCursorVersion, where,
                           "the checkpoint is from another meshtrain version");
  expect_cursor_field<std::string>(cursor, "kind", rows_->kind(), where);
  expect_cursor_field<uint64_t>(cursor, "seed", rows_->seed(), where);
  expect_cursor_field<int64_t>(cursor, "sequence_length", sequence_length(), where);
  // The rows consumed are a global position: they give the same batches only with the same global batch.
  if (const std::optional<int64_t> saved = cursor_global_batch_rows(cursor, where);
      saved && *saved != global_batch_rows()) {
    fail(where, "a global batch of " + std::to_string(global_batch_rows()) + " rows (this run's)",
         std::to_string(*saved) + " rows (when the cursor was saved)",
         "resume with per_device_batch_size x devices x gradient_accumulation_steps = " +
             std::to_string(*saved) + " (a run resuming its checkpoint derives gradient_accumulation_steps)");
  }
  const auto step = cursor_field<int64_t>(cursor, "step", where);
  if (step < 0) fail(where, "a step >= 0", std::to_string(step));
  const std::optional<uint64_t> rows_consumed = rows_->read_cursor(cursor, where);
  step_ = step;
  // A source without a row position (synthetic) follows the step alone.
  rows_consumed_ = rows_consumed.value_or(static_cast<uint64_t>(step * global_batch_rows()));
  select();
}

}  // namespace meshtrain
