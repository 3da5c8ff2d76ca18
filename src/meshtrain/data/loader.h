// The training / eval data stream: token shards (or synthetic tokens) cut into fixed windows, shuffled per
// epoch with Philox, grouped into global batches and split into per-(data rank, micro-batch) slices.
//
// Windows. A window is S + 1 consecutive tokens; inputs are window[0, S), targets window[1, S + 1).
//  - packing = true: the shards are one concatenated stream (documents each followed by EOS) cut into
//    windows at stride S (neighbours share one token), so W = (N - 1) / S windows; a trailing remainder
//    is dropped. Inside a window the segment id starts at 0 and goes up by one after every EOS input,
//    positions restart at 0 after every EOS (and at the window start, even in mid-document), and the
//    target whose input is EOS (the first token of the next document) is masked out.
//  - packing = false: every document (its tokens and its EOS) gets its own windows at stride S, so no
//    window crosses a document boundary. A short last window is padded with EOS inputs and targets,
//    loss_mask 0, segment id 1 (real tokens are segment 0, so no real token attends padding) and
//    positions continuing from the real ones. Documents of a lone EOS give no window.
//  Positions are thus always < S.
// Order. shuffle = true: epoch e visits all W windows in a Fisher-Yates permutation drawn with Philox from
// (data_shuffle_seed, e); shuffle = false (eval): stream order. The stream of windows runs on across epochs;
// global batch k takes the next G = B x R x GA windows (B per-device rows, R data ranks, GA micro-batches).
// Split. Global row g = (micro_index * R + data_rank) * B + i, so micro_batch(r, m) holds rows
// [(m * R + r) * B, +B). The global batch is the same G windows whatever (B, R, GA) give the same G, and
// with R = 1 the GA micro-batches concatenated are exactly the rows of one GA = 1 batch of GA x B rows.
// Synthetic. Token (step, global row g, column c) = Philox uint32_at(key(seed, step), g * (S + 1) + c) mod
// vocab_size for c in [0, S]: inputs columns [0, S), targets [1, S + 1); one segment, positions 0..S-1,
// mask 1. It does not depend on B, R or GA, so every mesh sees the same batch.
// Cursor. JSON {kind, step, windows_consumed, seed, sequence_length, packing, shuffle, token_count,
// shard checksums, ...}: restore() continues with identical batches, and rejects a cursor from another
// dataset, seed, sequence length or packing mode.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "meshtrain/data/batch.h"
#include "meshtrain/data/shards.h"

namespace meshtrain {

struct LoaderOptions {
  int64_t sequence_length = 0;              // S (max_target_length)
  int64_t per_device_batch_size = 1;        // B: rows of one micro_batch()
  int64_t data_ranks = 1;                   // R: ranks that receive different rows
  int64_t gradient_accumulation_steps = 1;  // GA
  uint64_t seed = 0;                        // data_shuffle_seed
  bool packing = true;
  bool shuffle = true;  // false for eval: windows in stream order
  int32_t eos_id = -1;  // required for shards; unused by synthetic
  int64_t vocab_size = 0;
};

class BatchLoader {
 public:
  // The shards, concatenated in the given order. Every id must be < vocab_size (else a MeshError naming
  // the shard and the id); the stream must hold at least one window.
  static BatchLoader from_shards(const std::vector<std::string>& shard_paths, const LoaderOptions& options);
  static BatchLoader synthetic(const LoaderOptions& options);

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
  int64_t sequence_length() const { return sequence_length_; }
  uint64_t windows_per_epoch() const;  // 0 for synthetic (unbounded)
  uint64_t token_count() const { return token_count_; }

 private:
  BatchLoader() = default;
  void fill_row(int64_t global_row, int64_t out_row, Batch& batch) const;
  void read_tokens(uint64_t start, size_t count, int32_t* out) const;
  void select_windows();  // fills step_windows_ for the current step
  const std::vector<uint64_t>& permutation(uint64_t epoch);

  struct Span {
    uint64_t start = 0;   // first token in the stream
    uint32_t length = 0;  // tokens in the window, at most S + 1
  };

  bool synthetic_ = false;
  int64_t sequence_length_ = 0, rows_per_micro_ = 1, ranks_ = 1, micro_batches_ = 1;
  uint64_t seed_ = 0;
  bool packing_ = true, shuffle_ = true;
  int32_t eos_id_ = -1;
  int64_t vocab_size_ = 0;

  std::vector<TokenShard> shards_;
  std::vector<uint64_t> shard_offsets_;  // [shards + 1] first stream token of each shard, then the total
  uint64_t token_count_ = 0;
  uint64_t packed_windows_ = 0;  // packing: W
  std::vector<Span> spans_;      // packing = false: [W] the per-document windows

  int64_t step_ = 0;
  uint64_t windows_consumed_ = 0;             // windows taken by the steps before this one
  std::vector<uint64_t> step_windows_;        // [G] window ids of the current global batch
  uint64_t cached_epoch_ = ~uint64_t{0};      // the epoch whose permutation is cached
  std::vector<uint64_t> cached_permutation_;  // [W]
};

// Shards for a dataset path: a .tokens file as is; a folder holding `<split>.tokens` (what meshtrain prepare
// writes; split is "train" or "validation") gives that file; any other folder gives all *.tokens files in
// it, recursively, sorted by path. Nothing found is a MeshError naming the path.
std::vector<std::string> resolve_token_shards(const std::string& path, const std::string& split);

}  // namespace meshtrain
