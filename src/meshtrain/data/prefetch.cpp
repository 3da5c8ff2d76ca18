// BatchPrefetcher: one worker thread a step (std::async), joined before the loader is touched again.
#include "meshtrain/data/prefetch.h"

#include <chrono>

#include "meshtrain/core/crc32c.h"
#include "meshtrain/core/error.h"

namespace meshtrain {

uint32_t batch_crc32c(const Batch& batch) {
  const uint32_t tokens = crc32c(batch.tokens.data(), batch.tokens.size() * sizeof(int32_t));
  return crc32c(batch.targets.data(), batch.targets.size() * sizeof(int32_t), tokens);
}

BatchPrefetcher::BatchPrefetcher(BatchLoader loader, Options options)
    : loader_(std::move(loader)), options_(std::move(options)) {
  MT_CHECK(options_.shape_for_rank != nullptr && options_.micro_batches >= 1, "prefetch options");
  start(false);
}

BatchPrefetcher::~BatchPrefetcher() {
  if (pending_.valid()) pending_.wait();
}

PreparedStep BatchPrefetcher::prepare_current() const {
  PreparedStep prepared;
  prepared.step = loader_.step();
  prepared.micro_batches.reserve(static_cast<size_t>(options_.micro_batches));
  for (int micro = 0; micro < options_.micro_batches; ++micro)
    prepared.micro_batches.push_back(options_.shape_for_rank(loader_.micro_batch(options_.data_rank, micro)));
  if (options_.checksum) prepared.batch_crc32c = batch_crc32c(loader_.global_batch());
  prepared.cursor = loader_.cursor();
  prepared.data_metrics = loader_.rows().metrics();
  return prepared;
}

void BatchPrefetcher::start(bool advance_first) {
  pending_ = std::async(std::launch::async, [this, advance_first] {
    if (advance_first) loader_.advance();
    return prepare_current();
  });
}

PreparedStep BatchPrefetcher::join() {
  if (joined_) {
    PreparedStep prepared = std::move(*joined_);
    joined_.reset();
    return prepared;
  }
  return pending_.get();
}

PreparedStep BatchPrefetcher::take() {
  const auto start_wait = std::chrono::steady_clock::now();
  PreparedStep prepared = join();
  last_wait_seconds_ = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_wait).count();
  start(true);
  return prepared;
}

const nlohmann::json& BatchPrefetcher::next_cursor() {
  if (!joined_) joined_ = pending_.get();
  return joined_->cursor;
}

}  // namespace meshtrain
