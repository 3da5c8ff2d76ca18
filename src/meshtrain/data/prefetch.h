// The next step's batches, prepared on a background thread while the current step trains: this rank's
// micro-batches (cut by the loader, then shaped for this rank by the caller: Engram hashes, the context cut)
// and, when asked, the CRC-32C of the whole global batch.
#pragma once

#include <cstdint>
#include <functional>
#include <future>
#include <nlohmann/json.hpp>
#include <optional>
#include <vector>

#include "meshtrain/data/batch.h"
#include "meshtrain/data/loader.h"

namespace meshtrain {

// One step's data, ready to train.
struct PreparedStep {
  int64_t step = 0;                      // the loader's step (0-based) the batches are of
  std::vector<Batch> micro_batches;      // this rank's, in micro-batch order
  std::optional<uint32_t> batch_crc32c;  // of the global batch, when the prefetcher checksums
  nlohmann::json cursor;                 // the loader's cursor at this step: a run saved here trains it next
  nlohmann::json data_metrics;           // the rows' metrics through this step's batch (RowSource::metrics)
};

// The CRC-32C of a batch's input ids ([rows, S] int32, little-endian), then of its targets: two runs read
// the same token ids iff their global batches' checksums agree (up to CRC collisions).
uint32_t batch_crc32c(const Batch& batch);

class BatchPrefetcher {
 public:
  struct Options {
    int data_rank = 0;
    int micro_batches = 1;
    std::function<Batch(Batch rows)> shape_for_rank;  // from the loader's [B, S] slice to this rank's part
    bool checksum = false;                            // compute batch_crc32c (the lead rank's metrics)
  };

  // Owns the loader from here on: only the worker thread advances or reads it, and the caller sees only
  // what take() and next_cursor() hand back after joining it. Starts preparing the loader's current step.
  BatchPrefetcher(BatchLoader loader, Options options);
  ~BatchPrefetcher();  // waits for the worker
  BatchPrefetcher(const BatchPrefetcher&) = delete;
  BatchPrefetcher& operator=(const BatchPrefetcher&) = delete;

  // The next step's data: waits for the worker only if it is not done (the seconds waited are
  // last_wait_seconds()), then sets it preparing the step after (a skipped step consumes its batch too). An
  // error of the worker (a damaged shard) is thrown here.
  PreparedStep take();
  double last_wait_seconds() const { return last_wait_seconds_; }
  // The cursor of the step take() hands out next (waits for the worker): what a checkpoint saves.
  const nlohmann::json& next_cursor();

 private:
  PreparedStep prepare_current() const;  // on the worker thread
  void start(bool advance_first);
  PreparedStep join();

  BatchLoader loader_;
  Options options_;
  std::future<PreparedStep> pending_;
  std::optional<PreparedStep> joined_;  // the worker's result, joined by next_cursor() and not yet taken
  double last_wait_seconds_ = 0.0;
};

}  // namespace meshtrain
