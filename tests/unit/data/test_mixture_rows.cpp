// A mixture's rows (MixtureRows through MixtureDataSource and BatchLoader): each source's share of the rows,
// the order's determinism, each source's own reshuffled epochs, cursors (identical batches on resume, a
// changed source refused or, with allow_data_change, continued), the errors that name the entry, and a
// training run on a two-source mixture whose metrics report each source's rows.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "error_text.h"
#include "meshtrain/config/config.h"
#include "meshtrain/core/rng.h"
#include "meshtrain/data/corpus.h"
#include "meshtrain/data/loader.h"
#include "meshtrain/data/mixture.h"
#include "meshtrain/data/mixture_rows.h"
#include "meshtrain/data/prepare.h"
#include "meshtrain/data/shards.h"
#include "meshtrain/data/sources.h"
#include "meshtrain/data/token_windows.h"
#include "meshtrain/train/trainer.h"

namespace meshtrain {
namespace {

namespace fs = std::filesystem;
using testing::error_of;

constexpr int32_t kEos = 0;
constexpr int64_t kSequence = 8;

class MixtureRowsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = fs::temp_directory_path() /
           ("meshtrain_mixture_rows_" + std::to_string(::getpid()) + "_" + std::string(info->name()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  // A shard of `documents` documents of 1..20 tokens whose ids all lie in [first_id, first_id + 10): the
  // rows of each source can be told apart by their ids.
  std::string shard(const std::string& name, int32_t first_id, int documents, uint64_t seed = 3) const {
    std::vector<int32_t> tokens;
    const PhiloxKey key = philox_key(seed, "mixture-rows-test/" + name);
    uint64_t draw = 0;
    for (int document = 0; document < documents; ++document) {
      const uint32_t length = 1 + uint32_at(key, draw++) % 20;
      for (uint32_t i = 0; i < length; ++i)
        tokens.push_back(first_id + static_cast<int32_t>(uint32_at(key, draw++) % 10));
      tokens.push_back(kEos);
    }
    const std::string file = (dir_ / name).string();
    write_token_shard(file, std::span<const int32_t>(tokens));
    return file;
  }

  fs::path dir_;
};

LoaderOptions mixture_options(int64_t rows, uint64_t seed = 5, bool shuffle = true) {
  LoaderOptions o;
  o.sequence_length = kSequence;
  o.per_device_batch_size = rows;
  o.seed = seed;
  o.shuffle = shuffle;
  o.eos_id = kEos;
  o.vocab_size = 100;
  return o;
}

// The source a row came from: its first input's id / 10 (EOS, id 0, never starts a packed row by chance
// often enough to matter: the ids' decade is checked on the first non-EOS input).
size_t source_of_row(const Batch& batch, size_t row) {
  for (size_t c = 0; c < static_cast<size_t>(kSequence); ++c) {
    const int32_t id = batch.tokens[row * kSequence + c];
    if (id != kEos) return static_cast<size_t>(id / 10 - 1);
  }
  return ~size_t{0};
}

std::vector<int32_t> tokens_of(BatchLoader& loader, int steps) {
  std::vector<int32_t> tokens;
  for (int step = 0; step < steps; ++step, loader.advance()) {
    const Batch batch = loader.global_batch();
    tokens.insert(tokens.end(), batch.tokens.begin(), batch.tokens.end());
    tokens.insert(tokens.end(), batch.targets.begin(), batch.targets.end());
  }
  return tokens;
}

// Each source's count after n rows stays within one row of share x n, at every n up to 10,000, and each
// row holds its source's tokens.
TEST_F(MixtureRowsTest, EachSourceKeepsWithinOneRowOfItsShare) {
  const std::string a = shard("a.tokens", 10, 60), b = shard("b.tokens", 20, 45),
                    c = shard("c.tokens", 30, 80);
  for (const std::string& path :
       {a + ",0.7;" + b + ",0.3", a + ",5;" + b + ",3;" + c + ",2", a + ",1;" + b + ",1;" + c + ",1"}) {
    const std::vector<MixtureSource> entries = parse_dataset_path(path);
    std::vector<std::vector<std::string>> shards;
    for (const MixtureSource& entry : entries) shards.push_back({entry.path});
    const std::unique_ptr<MixtureRows> rows = MixtureRows::open(entries, shards, mixture_options(1));
    Batch batch;
    for (auto* field : {&batch.tokens, &batch.targets, &batch.positions, &batch.segment_ids})
      field->resize(kSequence);
    batch.loss_mask.resize(kSequence);
    double worst = 0;
    for (uint64_t n = 0; n <= 10000; ++n) {
      rows->select(0, n, 1);
      const std::vector<uint64_t> counts = rows->source_rows();
      for (size_t i = 0; i < entries.size(); ++i)
        worst = std::max(
            worst, std::abs(static_cast<double>(counts[i]) - entries[i].share * static_cast<double>(n)));
      rows->fill_row(0, 0, batch);
      const size_t source = source_of_row(batch, 0);
      rows->select(0, n + 1, 0);
      ASSERT_EQ(rows->source_rows()[source], counts[source] + 1) << path << " row " << n;
    }
    EXPECT_LE(worst, 1.0) << path;
  }
}

// Source i's rows, in the mixture, are the rows of its own windows shuffled with mixture_source_seed(seed,
// i), epoch after epoch: each source starts its own new shuffle when it runs out.
TEST_F(MixtureRowsTest, EachSourceReadsItsOwnReshuffledEpochs) {
  const std::string a = shard("a.tokens", 10, 12), b = shard("b.tokens", 20, 40);
  const std::vector<MixtureSource> entries = parse_dataset_path(a + ",1;" + b + ",1");
  const LoaderOptions o = mixture_options(1);
  BatchLoader mixture(MixtureRows::open(entries, {{a}, {b}}, o), o);
  std::vector<BatchLoader> alone;
  for (size_t i = 0; i < 2; ++i) {
    LoaderOptions own = o;
    own.seed = mixture_source_seed(o.seed, i);
    alone.emplace_back(TokenWindows::open({entries[i].path}, own), own);
  }
  const uint64_t small_epoch = alone[0].rows().rows_per_epoch();
  ASSERT_LT(small_epoch * 3, 400u);                            // source 0 runs out several times in 400 rows
  std::vector<std::vector<std::vector<int32_t>>> epochs_of_a;  // [epoch][row] source 0's rows
  for (int n = 0; n < 400; ++n, mixture.advance()) {
    const Batch row = mixture.global_batch();
    const size_t source = source_of_row(row, 0);
    ASSERT_LT(source, 2u);
    const Batch expected = alone[source].global_batch();
    alone[source].advance();
    EXPECT_EQ(row.tokens, expected.tokens) << "row " << n;
    EXPECT_EQ(row.loss_mask, expected.loss_mask) << "row " << n;
    if (source == 0) {
      if (epochs_of_a.empty() || epochs_of_a.back().size() == small_epoch) epochs_of_a.emplace_back();
      epochs_of_a.back().push_back(row.tokens);
    }
  }
  ASSERT_GE(epochs_of_a.size(), 3u);
  EXPECT_NE(epochs_of_a[0], epochs_of_a[1]);  // a new shuffle each epoch
  EXPECT_NE(epochs_of_a[1], epochs_of_a[2]);
  for (auto& epoch : epochs_of_a) std::sort(epoch.begin(), epoch.end());
  EXPECT_EQ(epochs_of_a[0], epochs_of_a[1]);  // the same windows, once each
  EXPECT_EQ(epochs_of_a[1], epochs_of_a[2]);
}

TEST_F(MixtureRowsTest, TheSameSeedGivesTheSameRowsAnotherSeedOthers) {
  const std::string a = shard("a.tokens", 10, 50), b = shard("b.tokens", 20, 50);
  const std::string path = a + ",0.6;" + b + ",0.4";
  const auto tokens_for = [&](uint64_t seed, bool shuffle) {
    const auto source = make_token_shards_source(path, "");
    const LoaderOptions o = mixture_options(4, seed, shuffle);
    BatchLoader loader(source->open(Split::train, o), o);
    return tokens_of(loader, 30);
  };
  EXPECT_EQ(tokens_for(5, true), tokens_for(5, true));
  EXPECT_NE(tokens_for(5, true), tokens_for(6, true));
  // Unshuffled, the seed picks nothing: every source in stream order.
  EXPECT_EQ(tokens_for(5, false), tokens_for(6, false));
}

// A cursor saved at step k and restored in a fresh loader continues with the same batches.
TEST_F(MixtureRowsTest, RestoredCursorGivesIdenticalBatches) {
  const std::string a = shard("a.tokens", 10, 30), b = shard("b.tokens", 20, 50),
                    c = shard("c.tokens", 30, 20);
  const auto source = make_token_shards_source(a + ",3;" + b + ",2;" + c + ",1", "");
  const LoaderOptions o = mixture_options(4);
  BatchLoader original(source->open(Split::train, o), o);
  for (int step = 0; step < 23; ++step) original.advance();
  const nlohmann::json cursor = original.cursor();
  EXPECT_EQ(cursor.at("sources").size(), 3u);
  EXPECT_EQ(cursor.at("rows_consumed"), 23 * 4);
  BatchLoader resumed(source->open(Split::train, o), o);
  resumed.restore(cursor, "test cursor");
  EXPECT_EQ(resumed.step(), 23);
  EXPECT_EQ(tokens_of(resumed, 40), tokens_of(original, 40));
}

// Another weight or other shards are refused naming the entry, the field and both values; with
// allow_data_change the run continues, each source that stayed at the rows it had read.
TEST_F(MixtureRowsTest, AChangedSourceIsRefusedUnlessAllowed) {
  const std::string a = shard("a.tokens", 10, 30), b = shard("b.tokens", 20, 50);
  const LoaderOptions o = mixture_options(4);
  BatchLoader original(make_token_shards_source(a + ",3;" + b + ",1", "")->open(Split::train, o), o);
  for (int step = 0; step < 10; ++step) original.advance();
  const nlohmann::json cursor = original.cursor();
  // The metrics count through the selected batch (the 11th, whose step reports them): 44 rows at 3:1.
  const nlohmann::json saved_metrics = original.rows().metrics();
  EXPECT_EQ(saved_metrics["sources"]["source0"]["rows"], 33);
  EXPECT_EQ(saved_metrics["sources"]["source1"]["rows"], 11);

  const auto restore_error = [&](const std::string& path, const LoaderOptions& options) {
    BatchLoader loader(make_token_shards_source(path, "")->open(Split::train, options), options);
    return error_of([&] { loader.restore(cursor, "ckpt"); });
  };
  const std::string weight = restore_error(a + ",1;" + b + ",1", o);
  EXPECT_NE(weight.find("entry 1 of 2"), std::string::npos) << weight;
  EXPECT_NE(weight.find("share = 0.5"), std::string::npos) << weight;
  EXPECT_NE(weight.find("0.75"), std::string::npos) << weight;
  EXPECT_NE(weight.find("allow_data_change"), std::string::npos) << weight;

  const std::string other = shard("other.tokens", 20, 51);
  const std::string shards = restore_error(a + ",3;" + other + ",1", o);
  EXPECT_NE(shards.find("entry 2 of 2"), std::string::npos) << shards;
  EXPECT_NE(shards.find("path"), std::string::npos) << shards;

  const std::string fewer = restore_error(a, o);
  EXPECT_NE(fewer.find("a mixture of 2 sources"), std::string::npos) << fewer;
  const std::string more = restore_error(a + ",1;" + b + ",1;" + other + ",1", o);
  EXPECT_NE(more.find("mixture of 3 sources"), std::string::npos) << more;

  LoaderOptions allowed = o;
  allowed.allow_data_change = true;
  for (const std::string& path : {a + ",1;" + other + ",1", a + ",1;" + b + ",1;" + other + ",1", a}) {
    EXPECT_EQ(restore_error(path, allowed), "") << path;
  }
  // The rule: source a (same path) continues at its 30 rows; a new source starts at 0; the position
  // carries on; the new weights hold from there.
  BatchLoader changed(make_token_shards_source(a + ",1;" + other + ",1", "")->open(Split::train, allowed),
                      allowed);
  changed.restore(cursor, "ckpt");
  EXPECT_EQ(changed.cursor().at("rows_consumed"), 40);
  for (int step = 0; step < 5; ++step) changed.advance();
  // Through the selected (6th) batch: 24 rows at 1:1 after source a's 30.
  const nlohmann::json after = changed.rows().metrics();
  EXPECT_EQ(after["sources"]["source0"]["rows"], 30 + 12);
  EXPECT_EQ(after["sources"]["source1"]["rows"], 12);
  // A resume of the changed run's own cursor, without allow_data_change, continues exactly.
  const nlohmann::json changed_cursor = changed.cursor();
  BatchLoader again(make_token_shards_source(a + ",1;" + other + ",1", "")->open(Split::train, o), o);
  again.restore(changed_cursor, "ckpt");
  EXPECT_EQ(tokens_of(again, 12), tokens_of(changed, 12));
}

// A single source's cursor is refused by a mixture and a mixture's by a single source, unless allowed.
TEST_F(MixtureRowsTest, OneSourceAndAMixtureDoNotResumeEachOther) {
  const std::string a = shard("a.tokens", 10, 30), b = shard("b.tokens", 20, 50);
  const LoaderOptions o = mixture_options(2);
  BatchLoader single(make_token_shards_source(a, "")->open(Split::train, o), o);
  BatchLoader mixture(make_token_shards_source(a + ",1;" + b + ",1", "")->open(Split::train, o), o);
  for (int step = 0; step < 3; ++step) single.advance(), mixture.advance();
  const nlohmann::json single_cursor = single.cursor(), mixture_cursor = mixture.cursor();
  EXPECT_FALSE(single_cursor.contains("sources"));  // a single source's cursor is as it always was
  const std::string one = error_of([&] {
    BatchLoader loader(make_token_shards_source(a + ",1;" + b + ",1", "")->open(Split::train, o), o);
    loader.restore(single_cursor, "ckpt");
  });
  EXPECT_NE(one.find("one source"), std::string::npos) << one;
  const std::string many = error_of([&] {
    BatchLoader loader(make_token_shards_source(a, "")->open(Split::train, o), o);
    loader.restore(mixture_cursor, "ckpt");
  });
  EXPECT_NE(many.find("a mixture of 2 sources"), std::string::npos) << many;
  LoaderOptions allowed = o;
  allowed.allow_data_change = true;
  BatchLoader to_single(make_token_shards_source(a, "")->open(Split::train, allowed), allowed);
  to_single.restore(mixture_cursor, "ckpt");
  EXPECT_EQ(to_single.cursor().at("windows_consumed"), 6);
  BatchLoader to_mixture(make_token_shards_source(a + ",1;" + b + ",1", "")->open(Split::train, allowed),
                         allowed);
  to_mixture.restore(single_cursor, "ckpt");
  EXPECT_EQ(to_mixture.cursor().at("rows_consumed"), 6);
}

// One source whose shards changed: refused naming the field and allow_data_change; allowed, the run goes on
// at the saved position of the new stream.
TEST_F(MixtureRowsTest, ASingleSourceWithOtherShardsContinuesOnlyWhenAllowed) {
  const std::string a = shard("a.tokens", 10, 30), b = shard("b.tokens", 20, 50);
  const LoaderOptions o = mixture_options(2);
  BatchLoader original(make_token_shards_source(a, "")->open(Split::train, o), o);
  for (int step = 0; step < 4; ++step) original.advance();
  const nlohmann::json cursor = original.cursor();
  const std::string refused = error_of([&] {
    BatchLoader loader(make_token_shards_source(b, "")->open(Split::train, o), o);
    loader.restore(cursor, "ckpt");
  });
  EXPECT_NE(refused.find("token_count"), std::string::npos) << refused;
  EXPECT_NE(refused.find("allow_data_change=true"), std::string::npos) << refused;
  LoaderOptions allowed = o;
  allowed.allow_data_change = true;
  BatchLoader changed(make_token_shards_source(b, "")->open(Split::train, allowed), allowed);
  changed.restore(cursor, "ckpt");
  EXPECT_EQ(changed.step(), 4);
  EXPECT_EQ(changed.cursor().at("windows_consumed"), 8);
}

// Errors before training: a glob matching nothing and an entry without a window name dataset_path and the
// entry; the validation split mixes each source's own, or comes from eval_dataset_path.
TEST_F(MixtureRowsTest, EntriesAreCheckedAndTheValidationSplitMixesTheSources) {
  const std::string a = shard("a.tokens", 10, 30), b = shard("b.tokens", 20, 50);
  const std::string glob =
      error_of([&] { make_token_shards_source(a + ",1;" + (dir_ / "none*.tokens").string() + ",1", ""); });
  EXPECT_NE(glob.find("config key 'dataset_path', entry 2 of 2"), std::string::npos) << glob;
  EXPECT_NE(glob.find("no match"), std::string::npos) << glob;
  const std::string tiny = shard("tiny.tokens", 30, 0);
  const std::string empty = error_of(
      [&] { make_token_shards_source(a + ",1;" + tiny + ",1", "")->open(Split::train, mixture_options(2)); });
  EXPECT_NE(empty.find("entry 2 of 2 ('" + tiny + "')"), std::string::npos) << empty;
  // A glob of shards is one source.
  const auto globbed = make_token_shards_source((dir_ / "[ab].tokens").string() + ",1;" + b + ",1", "");
  LoaderOptions eval = mixture_options(2, 5, false);
  BatchLoader validation(globbed->open(Split::validation, eval), eval);
  EXPECT_EQ(validation.cursor().at("sources").size(), 2u);
  const auto with_eval = make_token_shards_source(a + ",1;" + b + ",1", b);
  BatchLoader from_eval(with_eval->open(Split::validation, eval), eval);
  EXPECT_FALSE(from_eval.cursor().contains("sources"));
  BatchLoader only_b(make_token_shards_source(b, "")->open(Split::validation, eval), eval);
  EXPECT_EQ(tokens_of(from_eval, 3), tokens_of(only_b, 3));
}

// train_data_columns reaches the text source's record options.
TEST_F(MixtureRowsTest, TrainDataColumnsReachesTheTextSource) {
  RecordOptions records;
  records.column = "content";
  const auto single = make_text_files_source("corpus", (dir_ / "work").string(), records);
  EXPECT_EQ(dynamic_cast<const TextFilesSource&>(*single).records().column, "content");
  const auto defaults = load_config("qwen3-tiny", {});
  EXPECT_EQ(defaults.train_data_columns, "text");
  EXPECT_FALSE(defaults.allow_data_change);
}

// A training run on a two-source mixture (weights 3 and 1): its metrics report each source's rows, row
// tokens and epochs, in metrics.jsonl and TensorBoard.
TEST_F(MixtureRowsTest, TrainingOnAMixtureReportsEachSourcesRows) {
  for (const char* corpus : {"web", "code"}) {
    fs::create_directories(dir_ / corpus);
    for (int file = 0; file < 10; ++file) {
      std::string text;
      for (int line = 0; line < 10; ++line)
        text += std::string(corpus) + " line " + std::to_string(line * 7 + file) + " of file " +
                std::to_string(file) + ".\n";
      std::ofstream(dir_ / corpus / ("doc" + std::to_string(file) + ".txt"), std::ios::binary) << text;
    }
  }
  const PrepareResult web =
      prepare_dataset(PrepareOptions{(dir_ / "web_tokens").string(), 300, (dir_ / "web").string(), 0.1});
  const Tokenizer tokenizer = Tokenizer::load(web.tokenizer_path);
  fs::create_directories(dir_ / "code_tokens");
  tokenize_corpus(load_corpus((dir_ / "code").string(), 0.1), tokenizer, *tokenizer.eos_id(),
                  (dir_ / "code_tokens").string());
  const std::string run_dir = (dir_ / "run").string();
  const std::vector<std::string> overrides = {
      "base_emb_dim=32",
      "base_num_query_heads=4",
      "base_num_kv_heads=2",
      "head_dim=8",
      "base_mlp_dim=48",
      "base_num_decoder_layers=2",
      "vocab_size=" + std::to_string(tokenizer.vocab_size()),
      "max_target_length=16",
      "per_device_batch_size=4",
      "steps=6",
      "dataset_type=tokens",
      "dataset_path=" + (dir_ / "web_tokens").string() + ",3;" + (dir_ / "code_tokens").string() + ",1",
      "tokenizer_path=" + web.tokenizer_path,
      "eval_dataset_path=",
      "eval_interval=3",
      "eval_steps=1",
      "checkpoint_period=0",
      "run_dir=" + run_dir};
  std::FILE* quiet = std::fopen("/dev/null", "w");
  run_training(load_config("qwen3-tiny", overrides), quiet);
  std::fclose(quiet);
  std::ifstream in(run_dir + "/metrics.jsonl");
  int steps = 0;
  for (std::string line; std::getline(in, line);) {
    const nlohmann::json record = nlohmann::json::parse(line);
    if (!record.contains("loss")) continue;
    ++steps;
    const int64_t rows = record.at("step").get<int64_t>() * 4;
    const nlohmann::json& sources = record.at("data").at("sources");
    EXPECT_EQ(sources.at("source0").at("rows"), rows * 3 / 4) << line;
    EXPECT_EQ(sources.at("source1").at("rows"), rows / 4) << line;
    EXPECT_EQ(sources.at("source1").at("tokens"), rows / 4 * 16) << line;
    EXPECT_EQ(sources.at("source0").at("path"), (dir_ / "web_tokens").string());
    EXPECT_GT(sources.at("source1").at("epochs").get<double>(), 0.0);
  }
  EXPECT_EQ(steps, 6);
  std::string events;
  for (const auto& entry : fs::directory_iterator(run_dir)) {
    if (entry.path().filename().string().starts_with("events.out.tfevents")) {
      std::ifstream file(entry.path(), std::ios::binary);
      events.assign(std::istreambuf_iterator<char>(file), std::istreambuf_iterator<char>());
    }
  }
  EXPECT_NE(events.find("data/sources/source1/rows"), std::string::npos);
}

}  // namespace
}  // namespace meshtrain
