// The data-source seam (data/source.h): token shards, text files and synthetic tokens opened through
// DataSource give the rows the loader gave before the interface existed (digests and cursors recorded from
// BatchLoader::from_shards / BatchLoader::synthetic at 475ff00), and a cursor saved and restored continues
// with the same rows.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "meshtrain/core/crc32c.h"
#include "meshtrain/core/error.h"
#include "meshtrain/core/rng.h"
#include "meshtrain/data/corpus.h"
#include "meshtrain/data/loader.h"
#include "meshtrain/data/prepare.h"
#include "meshtrain/data/shards.h"
#include "meshtrain/data/sources.h"

namespace meshtrain {
namespace {

namespace fs = std::filesystem;

class DataSourceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = fs::temp_directory_path() /
           ("meshtrain_sources_" + std::to_string(::getpid()) + "_" + std::string(info->name()));
    fs::remove_all(dir_);
    fs::create_directories(dir_ / "shards");
  }
  void TearDown() override { fs::remove_all(dir_); }

  // 200 documents of 1..40 tokens (ids 1..99), each followed by EOS 0.
  std::string corpus_shard(const std::string& name, uint64_t seed) const {
    std::vector<int32_t> tokens;
    const PhiloxKey key = philox_key(seed, "test-corpus");
    uint64_t draw = 0;
    for (int document = 0; document < 200; ++document) {
      const uint32_t length = 1 + uint32_at(key, draw++) % 40;
      for (uint32_t i = 0; i < length; ++i)
        tokens.push_back(static_cast<int32_t>(1 + uint32_at(key, draw++) % 99));
      tokens.push_back(0);
    }
    const std::string file = (dir_ / "shards" / name).string();
    write_token_shard(file, std::span<const int32_t>(tokens));
    return file;
  }

  fs::path dir_;
};

LoaderOptions options(bool packing, bool shuffle, int64_t micro) {
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
  LoaderOptions o = options(true, true, 2);
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
  corpus_shard("a.tokens", 7);
  corpus_shard("b.tokens", 8);
  const std::string validation = (dir_ / "shards" / "a.tokens").string();
  const TokenShardsSource source((dir_ / "shards").string(), validation);
  EXPECT_TRUE(source.needs_tokenizer());
  EXPECT_FALSE(source.needs_preparing());
  const struct {
    const char* name;
    Split split;
    LoaderOptions options;
    int steps;
    uint32_t digest;
  } cases[] = {
      {"packed, shuffled", Split::train, options(true, true, 2), 80, 3572985362u},
      {"unpacked, shuffled", Split::train, options(false, true, 2), 80, 2514179718u},
      {"packed, in order", Split::train, options(true, false, 1), 40, 3861545297u},
      {"unpacked, in order, validation", Split::validation, options(false, false, 2), 80, 1341492299u},
  };
  for (const auto& c : cases) {
    BatchLoader loader = open_loader(source, c.split, c.options);
    EXPECT_EQ(digest(loader, c.options, c.steps), c.digest) << c.name;
  }
  BatchLoader loader = open_loader(source, Split::train, options(true, true, 2));
  for (int step = 0; step < 5; ++step) loader.advance();
  EXPECT_EQ(
      loader.cursor().dump(),
      R"({"format":"meshtrain-data-cursor","kind":"tokens","packing":true,"seed":3,"sequence_length":16,)"
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
            R"({"format":"meshtrain-data-cursor","kind":"synthetic","seed":5,"sequence_length":32,"step":5,)"
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
  LoaderOptions o = options(true, true, 2);
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
  const TokenShardsSource shards((dir_ / "shards").string(), (dir_ / "shards").string());
  const SyntheticSource synthetic;
  for (const auto& [source, o] :
       {std::pair<const DataSource*, LoaderOptions>{&shards, options(true, true, 2)},
        {&shards, options(false, true, 2)},
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
