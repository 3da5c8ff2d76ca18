// Token shards as rows: the shards' stream cut into fixed windows, shuffled per epoch with Philox or in
// stream order.
//
// Windows. A window is S + 1 consecutive tokens; inputs are window[0, S), targets window[1, S + 1).
//  - packing = true: the shards are one concatenated stream (documents each followed by EOS) cut into
//    windows at stride S (neighbours share one token), so W = (N - 1) / S windows; a trailing remainder
//    is dropped. Inside a window the segment id starts at 0 and goes up by one after every EOS input,
//    positions restart at 0 after every EOS (and at the window start, even in mid-document), and the
//    target whose input is EOS (the first token of the next document) is masked out.
//  - packing = false: every document (its tokens and its EOS) gets its own windows at stride S, so no
//    window crosses a document boundary: a document of n tokens followed by its EOS (n + 1 tokens) gives
//    ceil(n / S) windows of at most S + 1 tokens starting at its tokens 0, S, 2S, ... A short last window
//    is padded with EOS inputs and targets, loss_mask 0, segment id 1 (real tokens are segment 0, so no
//    real token attends padding) and positions continuing from the real ones. Documents of a lone EOS
//    give no window; a tail after the last EOS is cut like a document without one.
//    So a document of exactly S tokens is exactly one row: inputs its S tokens, targets its tokens 1..S-1
//    then the EOS, all S counted; one of S + 1 tokens is a full row and a row of one target (its last
//    token predicting the EOS) padded with S - 1 masked cells.
//  Positions are thus always < S.
// Order. shuffle = true: epoch e visits all W windows in a Fisher-Yates permutation drawn with Philox from
// (data_shuffle_seed, e); shuffle = false (eval, and training with enable_data_shuffling=false): stream
// order, every epoch alike. Row r of the stream is window r mod W of epoch r / W.
// The permutations are EpochShuffle's (shuffle.h), which a mixture's sources share: a mixture
// (mixture_rows.h) reads each source's windows through window_at / fill_window, the same path select /
// fill_row take. Cursor fields: windows_consumed (the position), packing, shuffle, token_count,
// windows_per_epoch and the shard checksums; a cursor from other shards, another packing or order is rejected
// (another order naming enable_data_shuffling). With allow_data_change, a cursor from other shards (or a
// mixture's) is accepted: the run continues at the saved position (windows_consumed, or a mixture's
// rows_consumed) of the new stream.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "meshtrain/data/shards.h"
#include "meshtrain/data/shuffle.h"
#include "meshtrain/data/source.h"

namespace meshtrain {

class TokenWindows final : public RowSource {
 public:
  // The shards, concatenated in the given order. Every id must be < vocab_size (else a MeshError naming
  // the shard and the id); the stream must hold at least one window.
  static std::unique_ptr<TokenWindows> open(const std::vector<std::string>& shard_paths,
                                            const LoaderOptions& options);

  const char* kind() const override { return "tokens"; }
  uint64_t seed() const override { return seed_; }
  int64_t sequence_length() const override { return sequence_length_; }
  uint64_t rows_per_epoch() const override { return packing_ ? packed_windows_ : spans_.size(); }
  void select(int64_t step, uint64_t first_row, uint64_t rows) override;
  void fill_row(uint64_t row, int64_t out_row, Batch& batch) const override;
  void write_cursor(nlohmann::json& cursor, uint64_t rows_consumed) const override;
  std::optional<uint64_t> read_cursor(const nlohmann::json& cursor, const std::string& where) const override;

  // The window at position `stream_row` of this source's own stream: its epoch's shuffle, or stream order.
  // Not const: it draws (and keeps) the epoch's permutation.
  uint64_t window_at(uint64_t stream_row);
  // Window `window` (< rows_per_epoch()) into row `out_row` of `batch`. Const: safe from several threads.
  void fill_window(uint64_t window, int64_t out_row, Batch& batch) const;

  uint64_t token_count() const { return token_count_; }
  std::vector<uint32_t> shard_checksums() const;

 private:
  TokenWindows() = default;
  void read_tokens(uint64_t start, size_t count, int32_t* out) const;

  struct Span {
    uint64_t start = 0;   // first token in the stream
    uint32_t length = 0;  // tokens in the window, at most S + 1
  };

  int64_t sequence_length_ = 0;
  uint64_t seed_ = 0;
  bool packing_ = true, shuffle_ = true, allow_data_change_ = false;
  int32_t eos_id_ = -1;

  std::vector<TokenShard> shards_;
  std::vector<uint64_t> shard_offsets_;  // [shards + 1] first stream token of each shard, then the total
  uint64_t token_count_ = 0;
  uint64_t packed_windows_ = 0;  // packing: W
  std::vector<Span> spans_;      // packing = false: [W] the per-document windows

  EpochShuffle order_;                      // shuffle = true: the windows' per-epoch order
  std::vector<uint64_t> selected_windows_;  // [G] window ids of the selected global batch
};

// A cursor's order fields must be this run's: packing, then shuffle (named as enable_data_shuffling). Shared
// by single sources and mixtures (MeshErrors naming `where`).
void check_cursor_order(const nlohmann::json& cursor, bool packing, bool shuffle, const std::string& where);

// Shards for a dataset path: a .tokens file as is; a folder holding index.json (what meshtrain prepare
// --tokenizer writes) gives the shards it lists for `split` ("train" or "validation"), in order, each checked
// to exist; a folder holding `<split>.tokens` (what meshtrain prepare writes without --tokenizer) gives that
// file; any other folder gives all *.tokens files in it, recursively, sorted by path. Nothing found is a
// MeshError naming the path.
std::vector<std::string> resolve_token_shards(const std::string& path, const std::string& split);

// Shards for a pattern: one holding '*', '?' or '[' is a glob(3) whose matches (files or folders) each give
// their shards (resolve_token_shards), in sorted match order; any other pattern is resolve_token_shards'.
// A glob matching nothing is a MeshError naming the pattern.
std::vector<std::string> resolve_token_pattern(const std::string& pattern, const std::string& split);

}  // namespace meshtrain
