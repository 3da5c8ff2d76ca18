// BatchLoader: determinism, resume from a cursor, the (rank, micro-batch) split invariant, packing and
// padding semantics on hand-made streams, exact unshuffled batches, synthetic data, and vocabulary / cursor
// validation; the data sources (token shards, text files, synthetic) through their interface.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "error_text.h"
#include "meshtrain/core/crc32c.h"
#include "meshtrain/core/error.h"
#include "meshtrain/core/rng.h"
#include "meshtrain/data/corpus.h"
#include "meshtrain/data/loader.h"
#include "meshtrain/data/prepare.h"
#include "meshtrain/data/shards.h"
#include "meshtrain/data/sources.h"
#include "meshtrain/data/token_windows.h"

namespace meshtrain {
namespace {

namespace fs = std::filesystem;

constexpr int32_t kEos = 0;

class LoaderTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = fs::temp_directory_path() /
           ("meshtrain_loader_" + std::to_string(::getpid()) + "_" + std::string(info->name()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::string shard(const std::string& name, const std::vector<int32_t>& tokens) const {
    const std::string file = (dir_ / name).string();
    write_token_shard(file, std::span<const int32_t>(tokens));
    return file;
  }

  // ~200 documents of 1..40 tokens (ids 1..99), each followed by EOS.
  std::string corpus_shard(const std::string& name = "corpus.tokens", uint64_t seed = 7) const {
    std::vector<int32_t> tokens;
    const PhiloxKey key = philox_key(seed, "test-corpus");
    uint64_t draw = 0;
    for (int document = 0; document < 200; ++document) {
      const uint32_t length = 1 + uint32_at(key, draw++) % 40;
      for (uint32_t i = 0; i < length; ++i)
        tokens.push_back(static_cast<int32_t>(1 + uint32_at(key, draw++) % 99));
      tokens.push_back(kEos);
    }
    return shard(name, tokens);
  }

  fs::path dir_;
};

LoaderOptions options(int64_t sequence, int64_t rows, int64_t ranks = 1, int64_t micro = 1,
                      uint64_t seed = 1) {
  LoaderOptions o;
  o.sequence_length = sequence;
  o.per_device_batch_size = rows;
  o.data_ranks = ranks;
  o.gradient_accumulation_steps = micro;
  o.seed = seed;
  o.eos_id = kEos;
  o.vocab_size = 100;
  return o;
}

BatchLoader shard_loader(const std::vector<std::string>& shards, const LoaderOptions& o) {
  return BatchLoader(TokenWindows::open(shards, o), o);
}

BatchLoader synthetic_loader(const LoaderOptions& o) {
  return BatchLoader(open_synthetic_rows(o), o);
}

// One row (all five fields) of a batch, for comparing rows across layouts.
struct Row {
  std::vector<int32_t> tokens, targets, positions, segments;
  std::vector<uint8_t> mask;
  bool operator==(const Row&) const = default;
  bool operator<(const Row& other) const {
    return tokens < other.tokens || (tokens == other.tokens && targets < other.targets);
  }
};

std::vector<Row> rows_of(const Batch& batch, int64_t sequence) {
  std::vector<Row> rows;
  const auto s = static_cast<size_t>(sequence);
  for (size_t start = 0; start < batch.tokens.size(); start += s) {
    const auto slice = [&](const auto& v) { return std::vector(v.begin() + start, v.begin() + start + s); };
    rows.push_back(Row{slice(batch.tokens), slice(batch.targets), slice(batch.positions),
                       slice(batch.segment_ids), slice(batch.loss_mask)});
  }
  return rows;
}

bool same(const Batch& a, const Batch& b) {
  return a.tokens == b.tokens && a.targets == b.targets && a.positions == b.positions &&
         a.segment_ids == b.segment_ids && a.loss_mask == b.loss_mask;
}

TEST_F(LoaderTest, SameSeedSameBatchesDifferentSeedDifferent) {
  const std::string file = corpus_shard();
  for (bool packing : {true, false}) {
    LoaderOptions o = options(16, 4);
    o.packing = packing;
    BatchLoader a = shard_loader({file}, o), b = shard_loader({file}, o);
    o.seed = 2;
    BatchLoader c = shard_loader({file}, o);
    int differing = 0;
    for (int step = 0; step < 20; ++step) {  // crosses epochs
      EXPECT_TRUE(same(a.global_batch(), b.global_batch())) << "step " << step;
      differing += same(a.global_batch(), c.global_batch()) ? 0 : 1;
      a.advance(), b.advance(), c.advance();
    }
    EXPECT_GT(differing, 15);
  }
}

TEST_F(LoaderTest, EachEpochVisitsEveryWindowOnce) {
  const std::string file = corpus_shard();
  LoaderOptions o = options(16, 1);
  o.shuffle = false;
  BatchLoader ordered = shard_loader({file}, o);
  const uint64_t windows = ordered.rows().rows_per_epoch();
  ASSERT_GT(windows, 50u);
  std::vector<Row> in_order;
  for (uint64_t i = 0; i < windows; ++i, ordered.advance())
    in_order.push_back(rows_of(ordered.global_batch(), 16)[0]);
  EXPECT_TRUE(same(ordered.global_batch(), [&] {  // wraps around to window 0
    BatchLoader fresh = shard_loader({file}, o);
    return fresh.global_batch();
  }()));
  o.shuffle = true;
  BatchLoader shuffled = shard_loader({file}, o);
  for (int epoch = 0; epoch < 2; ++epoch) {
    std::vector<Row> seen;
    for (uint64_t i = 0; i < windows; ++i, shuffled.advance())
      seen.push_back(rows_of(shuffled.global_batch(), 16)[0]);
    EXPECT_NE(seen, in_order);
    std::sort(seen.begin(), seen.end());
    std::vector<Row> sorted = in_order;
    std::sort(sorted.begin(), sorted.end());
    EXPECT_EQ(seen, sorted) << "epoch " << epoch;
  }
}

TEST_F(LoaderTest, ResumeFromCursorGivesIdenticalBatches) {
  const std::string file = corpus_shard();
  for (bool packing : {true, false}) {
    LoaderOptions o = options(12, 3, 2, 2);
    o.packing = packing;
    BatchLoader original = shard_loader({file}, o);
    for (int step = 0; step < 37; ++step) original.advance();
    const std::string saved = original.cursor().dump();
    BatchLoader resumed = shard_loader({file}, o);
    resumed.restore(nlohmann::json::parse(saved));
    EXPECT_EQ(resumed.step(), 37);
    for (int step = 0; step < 10; ++step) {
      for (int rank = 0; rank < 2; ++rank) {
        for (int micro = 0; micro < 2; ++micro) {
          EXPECT_TRUE(same(original.micro_batch(rank, micro), resumed.micro_batch(rank, micro)));
        }
      }
      original.advance(), resumed.advance();
    }
  }
}

TEST_F(LoaderTest, SplitInvariant) {
  const std::string file = corpus_shard();
  const int64_t b = 2, sequence = 10;
  BatchLoader one = shard_loader({file}, options(sequence, 4 * b));            // R 1, GA 1, 4b rows
  BatchLoader accumulated = shard_loader({file}, options(sequence, b, 1, 4));  // R 1, GA 4
  BatchLoader mixed = shard_loader({file}, options(sequence, b, 2, 2));        // R 2, GA 2
  BatchLoader wide = shard_loader({file}, options(sequence, 1, 4, 2));         // R 4, GA 2, B 1
  for (int step = 0; step < 30; ++step) {
    const std::vector<Row> reference = rows_of(one.micro_batch(0, 0), sequence);
    ASSERT_EQ(reference.size(), 8u);
    std::vector<Row> concatenated;
    for (int micro = 0; micro < 4; ++micro) {
      for (const Row& row : rows_of(accumulated.micro_batch(0, micro), sequence)) concatenated.push_back(row);
    }
    EXPECT_EQ(concatenated, reference) << "step " << step;  // same rows, same order
    for (BatchLoader* loader : {&mixed, &wide}) {
      std::vector<Row> all;
      const int ranks = loader == &mixed ? 2 : 4;
      for (int micro = 0; micro < 2; ++micro) {
        for (int rank = 0; rank < ranks; ++rank) {
          for (const Row& row : rows_of(loader->micro_batch(rank, micro), sequence)) all.push_back(row);
        }
      }
      EXPECT_EQ(all, reference);  // the documented layout: (micro * R + rank) * B + i
      EXPECT_EQ(rows_of(loader->global_batch(), sequence), reference);
    }
    one.advance(), accumulated.advance(), mixed.advance(), wide.advance();
  }
}

TEST_F(LoaderTest, PackingSemantics) {
  // Documents [5 6 7], [8 9], [10 11 12 13], [14 15 16 17 18 19 20 21], each followed by EOS (0).
  const std::string file =
      shard("packed.tokens", {5, 6, 7, 0, 8, 9, 0, 10, 11, 12, 13, 0, 14, 15, 16, 17, 18, 19, 20, 21, 0});
  LoaderOptions o = options(6, 1);
  o.shuffle = false;
  BatchLoader loader = shard_loader({file}, o);
  EXPECT_EQ(loader.rows().rows_per_epoch(), 3u);  // (21 - 1) / 6
  Batch batch = loader.global_batch();            // window tokens [0, 7): 5 6 7 0 8 9 0
  EXPECT_EQ(batch.tokens, (std::vector<int32_t>{5, 6, 7, 0, 8, 9}));
  EXPECT_EQ(batch.targets, (std::vector<int32_t>{6, 7, 0, 8, 9, 0}));
  EXPECT_EQ(batch.segment_ids, (std::vector<int32_t>{0, 0, 0, 0, 1, 1}));
  EXPECT_EQ(batch.positions, (std::vector<int32_t>{0, 1, 2, 3, 0, 1}));
  EXPECT_EQ(batch.loss_mask, (std::vector<uint8_t>{1, 1, 1, 0, 1, 1}));
  loader.advance();
  batch = loader.global_batch();  // window tokens [6, 13): 0 10 11 12 13 0 14 — starts on an EOS
  EXPECT_EQ(batch.tokens, (std::vector<int32_t>{0, 10, 11, 12, 13, 0}));
  EXPECT_EQ(batch.targets, (std::vector<int32_t>{10, 11, 12, 13, 0, 14}));
  EXPECT_EQ(batch.segment_ids, (std::vector<int32_t>{0, 1, 1, 1, 1, 1}));
  EXPECT_EQ(batch.positions, (std::vector<int32_t>{0, 0, 1, 2, 3, 4}));
  EXPECT_EQ(batch.loss_mask, (std::vector<uint8_t>{0, 1, 1, 1, 1, 0}));
  loader.advance();
  batch = loader.global_batch();  // window tokens [12, 19): mid-document, positions from 0
  EXPECT_EQ(batch.tokens, (std::vector<int32_t>{14, 15, 16, 17, 18, 19}));
  EXPECT_EQ(batch.positions, (std::vector<int32_t>{0, 1, 2, 3, 4, 5}));
  EXPECT_EQ(batch.segment_ids, (std::vector<int32_t>(6, 0)));
  EXPECT_EQ(batch.loss_mask, (std::vector<uint8_t>(6, 1)));
}

TEST_F(LoaderTest, NoPackingPadsEachDocument) {
  // [5 6 7] EOS, [30..39] EOS, lone EOS (an empty document: no window), [40] EOS.
  std::vector<int32_t> tokens = {5, 6, 7, 0};
  for (int32_t t = 30; t < 40; ++t) tokens.push_back(t);
  tokens.push_back(0);
  tokens.push_back(0);
  tokens.push_back(40);
  tokens.push_back(0);
  LoaderOptions o = options(4, 1);
  o.packing = false;
  o.shuffle = false;
  BatchLoader loader = shard_loader({shard("docs.tokens", tokens)}, o);
  EXPECT_EQ(loader.rows().rows_per_epoch(), 1u + 3u + 1u);
  Batch batch = loader.global_batch();
  EXPECT_EQ(batch.tokens, (std::vector<int32_t>{5, 6, 7, 0}));
  EXPECT_EQ(batch.targets, (std::vector<int32_t>{6, 7, 0, 0}));
  EXPECT_EQ(batch.loss_mask, (std::vector<uint8_t>{1, 1, 1, 0}));
  EXPECT_EQ(batch.segment_ids, (std::vector<int32_t>{0, 0, 0, 1}));
  EXPECT_EQ(batch.positions, (std::vector<int32_t>{0, 1, 2, 3}));
  loader.advance();
  batch = loader.global_batch();
  EXPECT_EQ(batch.tokens, (std::vector<int32_t>{30, 31, 32, 33}));
  EXPECT_EQ(batch.targets, (std::vector<int32_t>{31, 32, 33, 34}));
  EXPECT_EQ(batch.loss_mask, (std::vector<uint8_t>(4, 1)));
  loader.advance();
  batch = loader.global_batch();
  EXPECT_EQ(batch.tokens, (std::vector<int32_t>{34, 35, 36, 37}));
  loader.advance();
  batch = loader.global_batch();  // 38 39 EOS: two pairs then padding
  EXPECT_EQ(batch.tokens, (std::vector<int32_t>{38, 39, 0, 0}));
  EXPECT_EQ(batch.targets, (std::vector<int32_t>{39, 0, 0, 0}));
  EXPECT_EQ(batch.loss_mask, (std::vector<uint8_t>{1, 1, 0, 0}));
  EXPECT_EQ(batch.segment_ids, (std::vector<int32_t>{0, 0, 1, 1}));
  EXPECT_EQ(batch.positions, (std::vector<int32_t>{0, 1, 2, 3}));
  loader.advance();
  batch = loader.global_batch();  // [40] EOS
  EXPECT_EQ(batch.tokens, (std::vector<int32_t>{40, 0, 0, 0}));
  EXPECT_EQ(batch.targets, (std::vector<int32_t>{0, 0, 0, 0}));
  EXPECT_EQ(batch.loss_mask, (std::vector<uint8_t>{1, 0, 0, 0}));
}

TEST_F(LoaderTest, ShardsConcatenate) {
  std::vector<int32_t> all;
  for (int32_t t = 1; t <= 50; ++t) all.push_back(t % 7 == 0 ? kEos : t);
  const std::string whole = shard("whole.tokens", all);
  const std::string first = shard("a.tokens", std::vector<int32_t>(all.begin(), all.begin() + 13));
  const std::string second = shard("b.tokens", std::vector<int32_t>(all.begin() + 13, all.begin() + 30));
  const std::string third = shard("c.tokens", std::vector<int32_t>(all.begin() + 30, all.end()));
  for (bool packing : {true, false}) {
    LoaderOptions o = options(5, 3);
    o.packing = packing;
    BatchLoader single = shard_loader({whole}, o);
    BatchLoader split = shard_loader({first, second, third}, o);
    EXPECT_EQ(TokenWindows::open({first, second, third}, o)->token_count(), 50u);
    for (int step = 0; step < 12; ++step, single.advance(), split.advance()) {
      EXPECT_TRUE(same(single.global_batch(), split.global_batch()));
    }
  }
  EXPECT_EQ(resolve_token_shards(dir_.string(), "train"),
            (std::vector<std::string>{first, second, third, whole}));
  EXPECT_EQ(resolve_token_shards(whole, "train"), std::vector<std::string>{whole});
  const std::string train = shard("train.tokens", all);
  EXPECT_EQ(resolve_token_shards(dir_.string(), "train"), std::vector<std::string>{train});
  EXPECT_THROW(resolve_token_shards((dir_ / "missing").string(), "train"), MeshError);
  // The hint names the key of the split: eval_dataset_path for validation.
  const std::string missing =
      testing::error_of([&] { resolve_token_shards((dir_ / "missing").string(), "validation"); });
  EXPECT_NE(missing.find("set eval_dataset_path=DIR"), std::string::npos) << missing;
}

TEST_F(LoaderTest, SyntheticIsReproducibleAndSplitIndependent) {
  LoaderOptions o = options(32, 8);
  o.vocab_size = 1000;
  o.seed = 5;
  BatchLoader a = synthetic_loader(o), b = synthetic_loader(o);
  LoaderOptions split = o;
  split.per_device_batch_size = 2;
  split.data_ranks = 2;
  split.gradient_accumulation_steps = 2;
  BatchLoader c = synthetic_loader(split);
  for (int step = 0; step < 5; ++step) {
    const Batch batch = a.global_batch();
    EXPECT_TRUE(same(batch, b.global_batch()));
    std::vector<Row> pieces;
    for (int micro = 0; micro < 2; ++micro) {
      for (int rank = 0; rank < 2; ++rank) {
        for (const Row& row : rows_of(c.micro_batch(rank, micro), 32)) pieces.push_back(row);
      }
    }
    EXPECT_EQ(pieces, rows_of(batch, 32));
    for (size_t i = 0; i < batch.tokens.size(); ++i) {
      ASSERT_GE(batch.tokens[i], 0);
      ASSERT_LT(batch.tokens[i], 1000);
      if (i % 32 != 31) {
        ASSERT_EQ(batch.targets[i], batch.tokens[i + 1]);  // targets are the next column
      }
      ASSERT_EQ(batch.positions[i], static_cast<int32_t>(i % 32));
      ASSERT_EQ(batch.segment_ids[i], 0);
      ASSERT_EQ(batch.loss_mask[i], 1);
    }
    Batch next_step = batch;
    a.advance(), b.advance(), c.advance();
    EXPECT_NE(a.global_batch().tokens, next_step.tokens);
  }
  // Resume.
  BatchLoader resumed = synthetic_loader(o);
  resumed.restore(a.cursor());
  EXPECT_TRUE(same(resumed.global_batch(), a.global_batch()));
  // Different seed, different tokens.
  o.seed = 6;
  EXPECT_NE(synthetic_loader(o).global_batch().tokens, synthetic_loader(split).global_batch().tokens);
}

TEST_F(LoaderTest, OutOfVocabularyIdNamesShardAndId) {
  const std::string file = shard("big.tokens", {1, 2, 3, 150, 4, 0});
  try {
    shard_loader({file}, options(2, 1));  // vocab_size 100
    FAIL();
  } catch (const MeshError& error) {
    const std::string message = error.what();
    EXPECT_EQ(error.context().where, file);
    EXPECT_NE(message.find("id 150 at token 3"), std::string::npos) << message;
    EXPECT_NE(message.find("vocab_size"), std::string::npos) << message;
  }
}

TEST_F(LoaderTest, BadSettingsAreErrors) {
  const std::string file = shard("tiny.tokens", {1, 2, 3, 0});
  EXPECT_THROW(shard_loader({file}, options(8, 1)), MeshError);  // 4 tokens < S + 1
  LoaderOptions o = options(2, 1);
  o.eos_id = -1;
  EXPECT_THROW(shard_loader({file}, o), MeshError);
  o = options(0, 1);
  EXPECT_THROW(synthetic_loader(o), MeshError);
  o = options(2, 0);
  EXPECT_THROW(synthetic_loader(o), MeshError);
}

TEST_F(LoaderTest, CursorFromAnotherDatasetIsRejected) {
  const std::string file = corpus_shard();
  const std::string other = corpus_shard("other.tokens", 8);
  std::vector<int32_t> changed_tokens(2000, 3);
  const std::string changed = shard("changed.tokens", changed_tokens);
  BatchLoader loader = shard_loader({file}, options(8, 2));
  loader.advance();
  const nlohmann::json cursor = loader.cursor();
  BatchLoader different = shard_loader({changed}, options(8, 2));
  try {
    different.restore(cursor, "ckpt/state.json");
    FAIL();
  } catch (const MeshError& error) {
    EXPECT_EQ(error.context().where, "ckpt/state.json");
    EXPECT_NE(std::string(error.what()).find("token_count"), std::string::npos) << error.what();
  }
  BatchLoader reseeded = shard_loader({file}, options(8, 2, 1, 1, 99));
  EXPECT_THROW(reseeded.restore(cursor), MeshError);
  LoaderOptions unpacked = options(8, 2);
  unpacked.packing = false;
  BatchLoader unpacked_loader = shard_loader({file}, unpacked);
  EXPECT_THROW(unpacked_loader.restore(cursor), MeshError);
  // Same token count, different content: the shard checksums catch it.
  BatchLoader same_size = shard_loader({other}, options(8, 2));
  nlohmann::json forged = cursor;
  forged["token_count"] = TokenWindows::open({other}, options(8, 2))->token_count();
  EXPECT_THROW(same_size.restore(forged), MeshError);
  BatchLoader synthetic = synthetic_loader(options(8, 2));
  EXPECT_THROW(synthetic.restore(cursor), MeshError);
  EXPECT_THROW(loader.restore(nlohmann::json{{"step", 3}}), MeshError);
  nlohmann::json broken = cursor;
  broken.erase("windows_consumed");
  EXPECT_THROW(loader.restore(broken), MeshError);
  // The rows consumed are a global position: a cursor of another global batch (2 rows here) is refused,
  // naming both sizes.
  BatchLoader bigger = shard_loader({file}, options(8, 4));
  const std::string refused = testing::error_of([&] { bigger.restore(cursor, "ckpt/metadata.json"); });
  for (const char* needle : {"ckpt/metadata.json", "a global batch of 4 rows (this run's)",
                             "2 rows (when the cursor was saved)", "gradient_accumulation_steps"})
    EXPECT_NE(refused.find(needle), std::string::npos) << needle << " in " << refused;
  nlohmann::json broken_size = cursor;
  broken_size["global_batch_rows"] = 0;
  EXPECT_THROW(loader.restore(broken_size), MeshError);
  // A cursor saved before the global batch was recorded resumes with another one: the window stream
  // continues where it was.
  nlohmann::json older = cursor;
  older.erase("global_batch_rows");
  EXPECT_EQ(cursor_global_batch_rows(older, "older"), std::nullopt);
  EXPECT_EQ(cursor_global_batch_rows(cursor, "cursor"), 2);
  bigger.restore(older);
  BatchLoader reference = shard_loader({file}, options(8, 2));
  reference.advance();
  EXPECT_EQ(rows_of(reference.global_batch(), 8), [&] {
    std::vector<Row> rows = rows_of(bigger.global_batch(), 8);
    rows.resize(2);
    return rows;
  }());
}

TEST_F(LoaderTest, EvalLoaderRestarts) {
  const std::string file = corpus_shard();
  LoaderOptions o = options(16, 2, 1, 2);
  o.shuffle = false;
  BatchLoader eval = shard_loader({file}, o);
  std::vector<Batch> first;
  for (int step = 0; step < 3; ++step, eval.advance()) first.push_back(eval.micro_batch(0, 1));
  eval.reset();
  EXPECT_EQ(eval.step(), 0);
  for (int step = 0; step < 3; ++step, eval.advance()) EXPECT_TRUE(same(first[step], eval.micro_batch(0, 1)));
  // Stream order: row 0 of step 0 is window 0, the stream's first 17 tokens.
  eval.reset();
  const TokenShard tokens = TokenShard::open(file);
  const Batch batch = eval.micro_batch(0, 0);
  for (int c = 0; c < 16; ++c) EXPECT_EQ(batch.tokens[c], tokens[c]);
}

// enable_data_shuffling=false with packing=false: a shard of B documents of exactly S tokens (each followed
// by its EOS) is exactly one [B, S + 1] batch, those rows in that order, every epoch; the train split of a
// TokenShardsSource opened as a run opens it (train/run.cpp loader_options).
class ExactBatchTest : public LoaderTest {
 protected:
  static constexpr int64_t kRows = 4, kSequence = 8;
  // Document i: ids 1 + i * S .. (i + 1) * S, then EOS.
  static std::vector<std::vector<int32_t>> documents(int64_t count) {
    std::vector<std::vector<int32_t>> all(static_cast<size_t>(count));
    for (int64_t i = 0; i < count; ++i) {
      for (int64_t c = 0; c < kSequence; ++c) all[i].push_back(static_cast<int32_t>(1 + i * kSequence + c));
    }
    return all;
  }
  std::string exact_shard(int64_t count) const {
    const std::string file = (dir_ / "exact.tokens").string();
    write_token_shard(file, documents(count), kEos);
    return file;
  }
  static LoaderOptions exact_options(int64_t rows, int64_t ranks, bool shuffle) {
    LoaderOptions o = options(kSequence, rows, ranks);
    o.packing = false;
    o.shuffle = shuffle;
    o.vocab_size = 1000;  // documents(16)'s ids reach 128
    return o;
  }
  BatchLoader train_loader(const std::string& file, const LoaderOptions& o) const {
    return BatchLoader(TokenShardsSource(file, "").open(Split::train, o), o);
  }
};

TEST_F(ExactBatchTest, UnshuffledUnpackedDocumentsOfSTokensAreTheBatchRows) {
  const std::string file = exact_shard(kRows);
  const LoaderOptions o = exact_options(kRows, 1, false);
  BatchLoader loader = train_loader(file, o);
  EXPECT_EQ(loader.rows().rows_per_epoch(), static_cast<uint64_t>(kRows));
  const std::vector<std::vector<int32_t>> rows = documents(kRows);
  for (int epoch = 0; epoch < 3; ++epoch, loader.advance()) {  // one batch is one epoch: each repeats
    const std::vector<Row> batch = rows_of(loader.global_batch(), kSequence);
    ASSERT_EQ(batch.size(), static_cast<size_t>(kRows));
    size_t counted = 0;
    for (size_t i = 0; i < batch.size(); ++i) {
      std::vector<int32_t> targets(rows[i].begin() + 1, rows[i].end());
      targets.push_back(kEos);  // each row's last target
      EXPECT_EQ(batch[i].tokens, rows[i]) << "epoch " << epoch << " row " << i;
      EXPECT_EQ(batch[i].targets, targets) << "epoch " << epoch << " row " << i;
      EXPECT_EQ(batch[i].mask, std::vector<uint8_t>(kSequence, 1));
      EXPECT_EQ(batch[i].segments, std::vector<int32_t>(kSequence, 0));
      for (int64_t c = 0; c < kSequence; ++c) EXPECT_EQ(batch[i].positions[c], c);
      counted += static_cast<size_t>(std::count(batch[i].mask.begin(), batch[i].mask.end(), 1));
    }
    EXPECT_EQ(counted, static_cast<size_t>(kRows * kSequence));  // the run's valid_tokens
  }
}

TEST_F(ExactBatchTest, ADocumentOfSPlusOneTokensIsAFullRowAndAOneTargetTail) {
  std::vector<std::vector<int32_t>> long_document = documents(1);
  long_document[0].push_back(99);
  BatchLoader loader = train_loader(
      [&] {
        const std::string file = (dir_ / "long.tokens").string();
        write_token_shard(file, long_document, kEos);
        return file;
      }(),
      exact_options(2, 1, false));
  const std::vector<Row> batch = rows_of(loader.global_batch(), kSequence);
  EXPECT_EQ(batch[0].tokens, documents(1)[0]);
  EXPECT_EQ(batch[0].targets.back(), 99);
  EXPECT_EQ(batch[0].mask, std::vector<uint8_t>(kSequence, 1));
  EXPECT_EQ(batch[1].tokens[0], 99);
  EXPECT_EQ(batch[1].targets[0], kEos);
  EXPECT_EQ(std::count(batch[1].mask.begin(), batch[1].mask.end(), 1), 1);
}

// Shuffled, every epoch is another permutation of the same rows; unshuffled, every epoch is stream order.
TEST_F(ExactBatchTest, ShufflingOnReordersEachEpochOffRepeatsIt) {
  const int64_t count = 16;  // one batch is one epoch
  const std::string file = exact_shard(count);
  BatchLoader in_order = train_loader(file, exact_options(count, 1, false));
  BatchLoader shuffled = train_loader(file, exact_options(count, 1, true));
  const std::vector<Row> stream = rows_of(in_order.global_batch(), kSequence);
  std::vector<std::vector<Row>> shuffled_epochs;
  for (int epoch = 0; epoch < 3; ++epoch, in_order.advance(), shuffled.advance()) {
    EXPECT_EQ(rows_of(in_order.global_batch(), kSequence), stream) << "epoch " << epoch;
    shuffled_epochs.push_back(rows_of(shuffled.global_batch(), kSequence));
    EXPECT_NE(shuffled_epochs.back(), stream) << "epoch " << epoch;
    std::vector<Row> sorted = shuffled_epochs.back();
    std::sort(sorted.begin(), sorted.end());
    EXPECT_EQ(sorted, stream);  // the stream's rows are already in sorted order
  }
  EXPECT_NE(shuffled_epochs[0], shuffled_epochs[1]);
  EXPECT_NE(shuffled_epochs[1], shuffled_epochs[2]);
}

// Rows are taken by global row index, so 2 data ranks with shuffling off feed the global batch of 1 rank:
// rank r's micro-batch is rows [r B, (r + 1) B) of it, for every step.
TEST_F(ExactBatchTest, TwoDataRanksUnshuffledFeedTheOneRankBatch) {
  const std::string file = exact_shard(6);  // 6 windows: steps of 4 rows cross epochs
  BatchLoader one = train_loader(file, exact_options(kRows, 1, false));
  BatchLoader two = train_loader(file, exact_options(kRows / 2, 2, false));
  for (int step = 0; step < 5; ++step, one.advance(), two.advance()) {
    std::vector<Row> both = rows_of(two.micro_batch(0, 0), kSequence);
    for (const Row& row : rows_of(two.micro_batch(1, 0), kSequence)) both.push_back(row);
    EXPECT_EQ(both, rows_of(one.global_batch(), kSequence)) << "step " << step;
  }
}

TEST_F(ExactBatchTest, ResumingWithTheOtherOrderNamesTheKeyAndBothValues) {
  const std::string file = exact_shard(kRows);
  for (bool saved : {true, false}) {
    BatchLoader original = train_loader(file, exact_options(1, 1, saved));
    original.advance();
    BatchLoader other = train_loader(file, exact_options(1, 1, !saved));
    const std::string mine = saved ? "false" : "true", theirs = saved ? "true" : "false";
    try {
      other.restore(original.cursor(), "ckpt/metadata.json");
      FAIL() << "restored a cursor of the other order";
    } catch (const MeshError& error) {
      EXPECT_EQ(error.context().where, "ckpt/metadata.json");
      EXPECT_EQ(error.context().expected, "enable_data_shuffling=" + mine + " (this run)");
      EXPECT_EQ(error.context().found,
                "enable_data_shuffling=" + theirs + " (when the checkpoint was saved)");
      EXPECT_NE(error.context().hint.find("resume with enable_data_shuffling=" + theirs), std::string::npos);
    }
    BatchLoader resumed = train_loader(file, exact_options(1, 1, saved));
    resumed.restore(original.cursor());
    EXPECT_TRUE(same(original.global_batch(), resumed.global_batch()));
  }
}

// The data-source seam (data/source.h): token shards, text files and synthetic tokens opened through
// DataSource give the rows the loader gave before the interface existed (digests and cursors recorded from
// BatchLoader::from_shards / BatchLoader::synthetic at 475ff00), and a cursor saved and restored continues
// with the same rows.
class DataSourceTest : public LoaderTest {};

LoaderOptions seam_options(bool packing, bool shuffle, int64_t micro) {
  LoaderOptions o;
  o.sequence_length = 16;
  o.per_device_batch_size = 2;
  o.data_ranks = 2;
  o.gradient_accumulation_steps = micro;
  o.seed = 3;
  o.packing = packing;
  o.shuffle = shuffle;
  o.eos_id = 0;
  o.vocab_size = 100;
  return o;
}

LoaderOptions synthetic_options() {
  LoaderOptions o = seam_options(true, true, 2);
  o.sequence_length = 32;
  o.vocab_size = 1000;
  o.seed = 5;
  return o;
}

BatchLoader open_loader(const DataSource& source, Split split, const LoaderOptions& o) {
  return BatchLoader(source.open(split, o), o);
}

// CRC-32C of every micro-batch of `steps` steps, in (step, micro-batch, rank) order; the loader advances.
uint32_t digest(BatchLoader& loader, const LoaderOptions& o, int steps) {
  uint32_t crc = 0;
  for (int step = 0; step < steps; ++step, loader.advance()) {
    for (int micro = 0; micro < o.gradient_accumulation_steps; ++micro) {
      for (int rank = 0; rank < o.data_ranks; ++rank) {
        const Batch b = loader.micro_batch(rank, micro);
        crc = crc32c(b.tokens.data(), b.tokens.size() * 4, crc);
        crc = crc32c(b.targets.data(), b.targets.size() * 4, crc);
        crc = crc32c(b.positions.data(), b.positions.size() * 4, crc);
        crc = crc32c(b.segment_ids.data(), b.segment_ids.size() * 4, crc);
        crc = crc32c(b.loss_mask.data(), b.loss_mask.size(), crc);
      }
    }
  }
  return crc;
}

// Token shards: a folder of two shards (train, in path order) and one file (validation); 80 steps of 8 rows
// cross the first epoch of 534 windows.
TEST_F(DataSourceTest, TokenShardsGiveTheLoadersRows) {
  corpus_shard("b.tokens", 8);
  const std::string validation = corpus_shard("a.tokens", 7);
  const TokenShardsSource source(dir_.string(), validation);
  EXPECT_TRUE(source.needs_tokenizer());
  EXPECT_FALSE(source.needs_preparing());
  const struct {
    const char* name;
    Split split;
    LoaderOptions options;
    int steps;
    uint32_t digest;
  } cases[] = {
      {"packed, shuffled", Split::train, seam_options(true, true, 2), 80, 3572985362u},
      {"unpacked, shuffled", Split::train, seam_options(false, true, 2), 80, 2514179718u},
      {"packed, in order", Split::train, seam_options(true, false, 1), 40, 3861545297u},
      {"unpacked, in order, validation", Split::validation, seam_options(false, false, 2), 80, 1341492299u},
  };
  for (const auto& c : cases) {
    BatchLoader loader = open_loader(source, c.split, c.options);
    EXPECT_EQ(digest(loader, c.options, c.steps), c.digest) << c.name;
  }
  BatchLoader loader = open_loader(source, Split::train, seam_options(true, true, 2));
  for (int step = 0; step < 5; ++step) loader.advance();
  EXPECT_EQ(
      loader.cursor().dump(),
      R"({"format":"meshtrain-data-cursor","global_batch_rows":8,"kind":"tokens","packing":true,"seed":3,)"
      R"("sequence_length":16,)"
      R"("shard_checksums":[2775799226,2037166903],"shuffle":true,"step":5,"token_count":8546,"version":1,)"
      R"("windows_consumed":40,"windows_per_epoch":534})");
  EXPECT_THROW(TokenShardsSource((dir_ / "missing").string(), validation), MeshError);
}

TEST_F(DataSourceTest, SyntheticGivesTheLoadersRows) {
  const SyntheticSource source;
  EXPECT_FALSE(source.needs_tokenizer());
  const LoaderOptions o = synthetic_options();
  BatchLoader loader = open_loader(source, Split::train, o);
  EXPECT_EQ(digest(loader, o, 10), 3904003980u);
  loader.reset();
  for (int step = 0; step < 5; ++step) loader.advance();
  EXPECT_EQ(loader.cursor().dump(),
            R"({"format":"meshtrain-data-cursor","global_batch_rows":8,"kind":"synthetic","seed":5,)"
            R"("sequence_length":32,"step":5,)"
            R"("version":1,"vocab_size":1000})");
  // The validation split: held-out rows from seed + 0x5EED.
  LoaderOptions held_out = o;
  held_out.seed += 0x5EED;
  BatchLoader validation = open_loader(source, Split::validation, o);
  BatchLoader expected(open_synthetic_rows(held_out), held_out);
  EXPECT_EQ(digest(validation, o, 3), digest(expected, o, 3));
  EXPECT_NE(open_loader(source, Split::train, o).global_batch().tokens,
            open_loader(source, Split::validation, o).global_batch().tokens);
}

// Text files: prepare() tokenizes the corpus with the run's tokenizer into the work folder; the rows are
// those of the corpus split 95 / 5 and tokenized by tokenize_corpus, as the run did before the interface.
TEST_F(DataSourceTest, TextFilesAreTokenizedIntoTheShardsRows) {
  fs::create_directories(dir_ / "corpus");
  for (int file = 0; file < 20; ++file) {
    std::string text;
    for (int line = 0; line < 12; ++line)
      text += "Line " + std::to_string(line * 7 + file) + " of document " + std::to_string(file) + ".\n";
    std::ofstream(dir_ / "corpus" / ("doc" + std::to_string(file) + ".txt"), std::ios::binary) << text;
  }
  const PrepareResult prepared =
      prepare_dataset(PrepareOptions{(dir_ / "prepared").string(), 300, (dir_ / "corpus").string(), 0.05});
  const Tokenizer tokenizer = Tokenizer::load(prepared.tokenizer_path);

  TextFilesSource source((dir_ / "corpus").string(), (dir_ / "work").string());
  EXPECT_TRUE(source.needs_preparing());
  EXPECT_TRUE(source.needs_tokenizer());
  source.prepare(&tokenizer);
  fs::create_directories(dir_ / "expected");
  tokenize_corpus(load_corpus((dir_ / "corpus").string(), 0.05), tokenizer, *tokenizer.eos_id(),
                  (dir_ / "expected").string());
  const TokenShardsSource expected((dir_ / "expected" / "train.tokens").string(),
                                   (dir_ / "expected" / "validation.tokens").string());
  LoaderOptions o = seam_options(true, true, 2);
  o.vocab_size = tokenizer.vocab_size();
  o.eos_id = *tokenizer.eos_id();
  for (Split split : {Split::train, Split::validation}) {
    BatchLoader text = open_loader(source, split, o), shards = open_loader(expected, split, o);
    EXPECT_EQ(digest(text, o, 6), digest(shards, o, 6)) << split_name(split);
  }
  // The cursor names the shards' contents, so the text source's cursor resumes the shards' rows.
  EXPECT_EQ(open_loader(source, Split::train, o).cursor(), open_loader(expected, Split::train, o).cursor());
}

// Every source: a cursor saved at step k and restored in a fresh loader continues with the same rows.
TEST_F(DataSourceTest, RestoredCursorContinuesWithTheSameRows) {
  corpus_shard("a.tokens", 7);
  const TokenShardsSource shards(dir_.string(), dir_.string());
  const SyntheticSource synthetic;
  for (const auto& [source, o] :
       {std::pair<const DataSource*, LoaderOptions>{&shards, seam_options(true, true, 2)},
        {&shards, seam_options(false, true, 2)},
        {&synthetic, synthetic_options()}}) {
    BatchLoader original = open_loader(*source, Split::train, o);
    for (int step = 0; step < 37; ++step) original.advance();
    BatchLoader resumed = open_loader(*source, Split::train, o);
    resumed.restore(original.cursor(), "test cursor");
    EXPECT_EQ(resumed.step(), 37);
    EXPECT_EQ(digest(resumed, o, 50), digest(original, o, 50)) << original.rows().kind();
  }
}

}  // namespace
}  // namespace meshtrain
