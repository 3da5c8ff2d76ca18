// BatchPrefetcher: the batches, checksums and cursors it hands out are the loader's, step by step, whatever
// the worker thread does meanwhile; an error on the worker reaches take().
#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <string>
#include <vector>

#include "meshtrain/core/crc32c.h"
#include "meshtrain/core/error.h"
#include "meshtrain/data/loader.h"
#include "meshtrain/data/prefetch.h"
#include "meshtrain/data/shards.h"
#include "meshtrain/data/token_windows.h"

namespace meshtrain {
namespace {

namespace fs = std::filesystem;

class PrefetchTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("meshtrain_prefetch_" + std::to_string(::getpid()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    // 300 documents of 1..23 tokens (ids 1..99), each followed by EOS (0).
    std::vector<int32_t> tokens;
    for (int document = 0; document < 300; ++document) {
      for (int i = 0; i <= document % 23; ++i) tokens.push_back(1 + (document * 7 + i * 13) % 99);
      tokens.push_back(0);
    }
    shard_ = (dir_ / "train.tokens").string();
    write_token_shard(shard_, std::span<const int32_t>(tokens));
    options_.sequence_length = 8;
    options_.per_device_batch_size = 2;
    options_.data_ranks = 2;
    options_.gradient_accumulation_steps = 3;
    options_.seed = 11;
    options_.eos_id = 0;
    options_.vocab_size = 100;
  }
  void TearDown() override { fs::remove_all(dir_); }

  BatchLoader loader() const { return BatchLoader(TokenWindows::open({shard_}, options_), options_); }

  fs::path dir_;
  std::string shard_;
  LoaderOptions options_;
};

// What a rank's shaping does to its rows in this test: something visible (the run's adds Engram hash ids
// and cuts the context shard).
Batch marked(Batch rows) {
  rows.positions.assign(rows.positions.size(), -7);
  return rows;
}

bool same_rows(const Batch& a, const Batch& b) {
  return a.tokens == b.tokens && a.targets == b.targets && a.segment_ids == b.segment_ids &&
         a.loss_mask == b.loss_mask;
}

TEST_F(PrefetchTest, HandsOutTheLoadersBatchesChecksumsAndCursorsStepByStep) {
  BatchLoader reference = loader();
  for (int step = 0; step < 4; ++step) reference.advance();
  BatchLoader resumed = loader();
  resumed.restore(reference.cursor());  // a prefetcher starts wherever its loader was restored to
  BatchPrefetcher prefetcher(
      std::move(resumed), {.data_rank = 1, .micro_batches = 3, .shape_for_rank = marked, .checksum = true});
  EXPECT_EQ(prefetcher.next_cursor(), reference.cursor()) << "before any take: the restored position";
  for (int step = 4; step < 12; ++step) {
    const PreparedStep prepared = prefetcher.take();
    EXPECT_EQ(prepared.step, step);
    ASSERT_EQ(prepared.micro_batches.size(), 3u);
    for (int micro = 0; micro < 3; ++micro) {
      const Batch& batch = prepared.micro_batches[static_cast<size_t>(micro)];
      EXPECT_TRUE(same_rows(batch, reference.micro_batch(1, micro))) << "step " << step << " micro " << micro;
      EXPECT_EQ(batch.positions, std::vector<int32_t>(batch.positions.size(), -7)) << "shaped for the rank";
    }
    EXPECT_EQ(prepared.batch_crc32c, batch_crc32c(reference.global_batch()));
    EXPECT_EQ(prepared.cursor, reference.cursor());
    EXPECT_GE(prefetcher.last_wait_seconds(), 0.0);
    reference.advance();
    // What a checkpoint saved after this step records: the position of the step take() gives next.
    if (step % 3 == 0) {
      EXPECT_EQ(prefetcher.next_cursor(), reference.cursor());
    }
  }
}

TEST_F(PrefetchTest, ChecksumIsOfTheInputIdsThenTheTargets) {
  BatchLoader reference = loader();
  const Batch global = reference.global_batch();
  ASSERT_EQ(global.tokens.size(), static_cast<size_t>(2 * 2 * 3 * 8));
  std::vector<int32_t> both = global.tokens;
  both.insert(both.end(), global.targets.begin(), global.targets.end());
  EXPECT_EQ(batch_crc32c(global), crc32c(both.data(), both.size() * sizeof(int32_t)));
  Batch other = global;
  other.targets[5] ^= 1;
  EXPECT_NE(batch_crc32c(other), batch_crc32c(global));
  BatchPrefetcher without(loader(), {.data_rank = 0, .micro_batches = 3, .shape_for_rank = marked});
  EXPECT_EQ(without.take().batch_crc32c, std::nullopt) << "only the lead rank checksums";
}

TEST_F(PrefetchTest, AnErrorOnTheWorkerIsThrownByTake) {
  std::atomic<int> calls = 0;
  const auto failing_on_the_second_step = [&calls](Batch rows) {
    if (++calls > 3) fail("shard.tokens", "a readable shard", "a read error");
    return rows;
  };
  BatchPrefetcher prefetcher(
      loader(), {.data_rank = 0, .micro_batches = 3, .shape_for_rank = failing_on_the_second_step});
  EXPECT_EQ(prefetcher.take().step, 0);
  EXPECT_THROW(prefetcher.take(), MeshError);
}

}  // namespace
}  // namespace meshtrain
