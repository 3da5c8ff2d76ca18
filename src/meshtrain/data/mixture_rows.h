// A mixture's rows (dataset_path with several weighted sources): row n of the global stream is the next row
// of the source MixtureDraw (mixture.h) picks for n, each source read in its own stream of token windows.
//
// Sources. Source i is TokenWindows over its shards, opened with the seed mixture_source_seed(seed, i): its
// row c is window (c mod R_i) of its epoch c / R_i, in EpochShuffle's order for that seed (stream order with
// enable_data_shuffling=false), so a source that runs out starts a new epoch with its own new shuffle while
// the others go on. Rows are read through TokenWindows::window_at / fill_window, the single source's path.
//
// Cursor ("kind": "tokens", as a single source's: the two tell each other apart by "sources", which only a
// mixture's has, and refuse each other unless allow_data_change): packing, shuffle,
// rows_consumed (the global position) and "sources", one entry per source in dataset_path's order: path (as
// written), weight, share, token_count, windows_per_epoch, shard_checksums, rows (its stream position) and
// drawn (the draw's count for it; equal to rows unless the run was resumed with allow_data_change). Resuming
// checks every source's path, share, token_count, windows_per_epoch and shard checksums, and refuses a change
// naming the entry, the field and both values.
// allow_data_change = true continues on the new data instead: a source of this run whose path (as written)
// was in the checkpoint continues its own stream at the rows it had read; a new source starts at row 0; a
// dropped one is forgotten; a single source's cursor gives every source row 0. The draw restarts from that
// point (its counts 0), so the new weights hold for the rows from the resume on; the global position
// (rows_consumed, or a single source's windows_consumed) carries on.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "meshtrain/data/mixture.h"
#include "meshtrain/data/token_windows.h"

namespace meshtrain {

class MixtureRows final : public RowSource {
 public:
  // `entries` (parse_dataset_path's of config key `key`) and each one's shards, in the same order. A
  // source without a single window is a MeshError naming the key and the entry.
  static std::unique_ptr<MixtureRows> open(const std::vector<MixtureSource>& entries,
                                           const std::vector<std::vector<std::string>>& shards,
                                           const LoaderOptions& options,
                                           const std::string& key = "dataset_path");

  const char* kind() const override { return "tokens"; }
  uint64_t seed() const override { return seed_; }
  int64_t sequence_length() const override { return sequence_length_; }
  uint64_t rows_per_epoch() const override;  // the sources' together (each has its own epochs)
  // Moves the draw to `first_row` (replayed from the start state when behind it) and draws the batch.
  void select(int64_t step, uint64_t first_row, uint64_t rows) override;
  void fill_row(uint64_t row, int64_t out_row, Batch& batch) const override;
  void write_cursor(nlohmann::json& cursor, uint64_t rows_consumed) const override;
  // Also sets the state select() starts from (the loader's restore selects right after).
  std::optional<uint64_t> read_cursor(const nlohmann::json& cursor, const std::string& where) const override;
  // {"sources": {"source<i>": {path, rows, tokens, epochs}}} before the selected batch; tokens are row
  // tokens (rows x max_target_length input/target cells, padding included).
  nlohmann::json metrics() const override;

  // Each source's stream position (rows read from it) before the selected batch.
  std::vector<uint64_t> source_rows() const;

 private:
  MixtureRows(const std::vector<MixtureSource>& entries, std::vector<std::unique_ptr<TokenWindows>> sources,
              const LoaderOptions& options);
  nlohmann::json source_identity(size_t source) const;

  struct SelectedRow {
    size_t source = 0;
    uint64_t window = 0;
  };
  // Where the draw starts: global row 0 with nothing drawn, or a cursor's position.
  struct Start {
    uint64_t row = 0;
    std::vector<uint64_t> drawn;    // the draw's counts
    std::vector<uint64_t> offsets;  // each source's stream position when the draw had drawn nothing
  };

  std::vector<MixtureSource> entries_;
  std::vector<std::unique_ptr<TokenWindows>> sources_;
  uint64_t seed_ = 0;
  int64_t sequence_length_ = 0;
  bool packing_ = true, shuffle_ = true, allow_data_change_ = false;

  // read_cursor is const in RowSource: it leaves the restored start here, for the next select().
  mutable Start start_;
  mutable bool restart_ = true;
  MixtureDraw draw_;
  uint64_t draw_row_ = 0;                     // the global row the draw is at
  uint64_t selected_first_row_ = 0;           // the selected batch's first global row
  std::vector<uint64_t> drawn_before_batch_;  // the draw's counts at selected_first_row_
  std::vector<SelectedRow> selected_;         // [G]
};

}  // namespace meshtrain
