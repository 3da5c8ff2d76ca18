// data/prepare_records: raw files (a .jsonl.zst made by the zstd tool, a .jsonl.gz made by gzip) prepared
// into shards whose tokens equal encoding the documents directly; the same bytes on 1 or 2 threads and on 1
// or 2 ranks; the validation rule; the index's skip and rebuild; a prepare stopped by a bad file leaving no
// index; the Parquet path's error in a build without it.
#include <gtest/gtest.h>

#include <barrier>
#include <fstream>
#include <nlohmann/json.hpp>
#include <thread>

#include "error_text.h"
#include "meshtrain/core/durable_file.h"
#include "meshtrain/data/prepare_records.h"
#include "meshtrain/data/records/parquet_text.h"
#include "meshtrain/data/records/record_reader.h"
#include "meshtrain/data/shards.h"
#include "meshtrain/data/token_windows.h"
#include "meshtrain/data/tokenizer/tokenizer.h"
#include "record_files.h"

namespace meshtrain {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
using testing::error_of;

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

std::vector<int32_t> shard_tokens(const std::string& path) {
  const TokenShard shard = TokenShard::open(path);
  std::vector<int32_t> tokens(shard.size());
  shard.read(0, tokens.size(), tokens.data());
  return tokens;
}

class PrepareRecords : public testing::RecordFilesTest {
 protected:
  void SetUp() override {
    RecordFilesTest::SetUp();
    // Documents of many lengths, multi-byte UTF-8 among them.
    for (int file = 0; file < 2; ++file) {
      std::vector<std::string>& documents = documents_[static_cast<size_t>(file)];
      for (int i = 0; i < 97 + 40 * file; ++i) {
        std::string text = "doc " + std::to_string(i) + " of file " + std::to_string(file) + ":";
        for (int word = 0; word < (i * 7) % 23; ++word) text += word % 5 == 0 ? " caf\u00e9" : " the word";
        documents.push_back(text);
      }
    }
    std::vector<std::string_view> texts;
    for (const auto& documents : documents_) texts.insert(texts.end(), documents.begin(), documents.end());
    save_trained_tokenizer(train_bpe_tokenizer(texts, 300, {"<|endoftext|>"}), path("tokenizer.json"));
    save_trained_tokenizer(train_bpe_tokenizer(texts, 300, {}), path("no_eos.json"));
    write_source("a.jsonl", documents_[0]);
    write_source("b.jsonl", documents_[1]);
  }

  // `name` as JSON Lines ({"id": .., "text": ..} per line), compressed by `tool` when given.
  void write_source(const std::string& name, const std::vector<std::string>& documents) {
    std::string lines;
    for (size_t i = 0; i < documents.size(); ++i)
      lines += json{{"id", i}, {"text", documents[i]}}.dump() + "\n";
    write("plain/" + name, lines);
  }

  // The two sources as sources/a.jsonl.zst and sources/b.jsonl.gz, by the real tools.
  std::string compressed_sources() {
    fs::create_directories(path("sources"));
    compress("zstd -q", path("plain/a.jsonl"), "sources/a.jsonl.zst");
    compress("gzip -n", path("plain/b.jsonl"), "sources/b.jsonl.gz");
    return path("sources");
  }

  PrepareRecordsOptions options(const std::string& source, const std::string& out) const {
    PrepareRecordsOptions options;
    options.source = source;
    options.tokenizer_path = path("tokenizer.json");
    options.out_dir = path(out);
    options.validation_fraction = 0.1;
    options.shard_tokens = 200;  // several parts per file
    return options;
  }

  std::vector<std::vector<std::string>> documents_ = std::vector<std::vector<std::string>>(2);
};

TEST(PrepareValidationRule, OneDocumentInEveryOneOverFSpreadEvenly) {
  std::vector<uint64_t> chosen;
  for (uint64_t j = 0; j < 60; ++j) {
    if (is_validation_document(j, 0.05)) chosen.push_back(j);
  }
  EXPECT_EQ(chosen, (std::vector<uint64_t>{19, 39, 59}));
  int count = 0, halves = 0;
  for (uint64_t j = 0; j < 1000; ++j) {
    EXPECT_FALSE(is_validation_document(j, 0.0));
    count += is_validation_document(j, 0.013);
    halves += is_validation_document(j, 0.5);
  }
  EXPECT_EQ(count, 13);  // floor(1000 x 0.013)
  EXPECT_EQ(halves, 500);
  EXPECT_TRUE(is_validation_document(1, 0.5));
  EXPECT_FALSE(is_validation_document(0, 0.5));
}

TEST(PrepareFileAssignment, GreedyBySizeLargestFirstEachRankInInputOrder) {
  // 100 -> rank 0, 70 -> rank 1, 40 -> rank 1 (70 < 100), 30 -> rank 0 (100 < 110), 30 (tie 130 vs 110) -> 1.
  const std::vector<std::vector<size_t>> ranks = assign_files_to_ranks({30, 100, 40, 70, 30}, 2);
  EXPECT_EQ(ranks, (std::vector<std::vector<size_t>>{{0, 1}, {2, 3, 4}}));
  EXPECT_EQ(assign_files_to_ranks({5, 5, 5}, 1), (std::vector<std::vector<size_t>>{{0, 1, 2}}));
  EXPECT_EQ(assign_files_to_ranks({5}, 3), (std::vector<std::vector<size_t>>{{0}, {}, {}}));
}

TEST_F(PrepareRecords, CompressedSourcesReadBackAsTheirDocumentsEncodedEachFollowedByEos) {
  MESHTRAIN_NEEDS_TOOL("gzip");
  MESHTRAIN_NEEDS_TOOL("zstd");
  PrepareRecordsOptions prepare = options(compressed_sources(), "out");
  std::vector<PrepareProgress> seen;
  prepare.progress = [&](const PrepareProgress& progress) { seen.push_back(progress); };
  const PrepareRecordsResult result = prepare_records(prepare);
  EXPECT_FALSE(result.skipped);
  ASSERT_TRUE(fs::is_regular_file(result.index_path));

  const Tokenizer tokenizer = Tokenizer::load(path("tokenizer.json"));
  const int32_t eos = *tokenizer.eos_id();
  EXPECT_EQ(result.index["tokenizer"]["eos_id"], eos);
  uint64_t documents = 0;
  for (const char* split : {"train", "validation"}) {
    // Each file's parts, concatenated, against its documents of the split encoded directly.
    for (size_t file = 0; file < 2; ++file) {
      std::vector<int32_t> expected, read;
      for (size_t j = 0; j < documents_[file].size(); ++j) {
        if (is_validation_document(j, 0.1) != (std::string(split) == "validation")) continue;
        const std::vector<int32_t> ids = tokenizer.encode(documents_[file][j]);
        expected.insert(expected.end(), ids.begin(), ids.end());
        expected.push_back(eos);
      }
      int parts = 0;
      for (const json& shard : result.index[split]["shards"]) {
        if (shard["file"] != file) continue;
        const std::vector<int32_t> tokens = shard_tokens(path("out/" + shard["path"].get<std::string>()));
        EXPECT_EQ(tokens.size(), shard["tokens"].get<size_t>());
        EXPECT_EQ(tokens.back(), eos) << "a part ends with a whole document";
        read.insert(read.end(), tokens.begin(), tokens.end());
        ++parts;
      }
      EXPECT_EQ(read, expected) << split << " of file " << file;
      if (std::string(split) == "train") {
        EXPECT_GT(parts, 1) << "200-token parts";
      }
    }
    documents += result.index[split]["documents"].get<uint64_t>();
  }
  EXPECT_EQ(documents, documents_[0].size() + documents_[1].size());
  EXPECT_EQ(result.index["validation"]["documents"], 9 + 13);  // floor(97 x 0.1) + floor(137 x 0.1)

  // The shards train reads: the index's, in order.
  const std::vector<std::string> train = resolve_token_shards(path("out"), "train");
  ASSERT_EQ(train.size(), result.index["train"]["shards"].size());
  EXPECT_EQ(train.front(), path("out/train/00000-000.tokens"));
  EXPECT_EQ(fs::path(train.back()).filename().string().substr(0, 6), "00001-");

  ASSERT_FALSE(seen.empty());
  EXPECT_EQ(seen.back().bytes_read, seen.back().bytes_total);
  EXPECT_EQ(seen.back().bytes_total,
            fs::file_size(path("sources/a.jsonl.zst")) + fs::file_size(path("sources/b.jsonl.gz")));
  EXPECT_EQ(seen.back().documents, documents);
  EXPECT_EQ(seen.back().tokens, result.index["train"]["tokens"].get<uint64_t>() +
                                    result.index["validation"]["tokens"].get<uint64_t>());
}

// Every file of both outputs, byte for byte, but the index's seconds and ranks.
void expect_same_outputs(const std::string& a, const std::string& b) {
  for (const char* folder : {"train", "validation", "files"}) {
    std::vector<std::string> names;
    for (const auto& entry : fs::directory_iterator(a + "/" + folder))
      names.push_back(entry.path().filename());
    ASSERT_FALSE(names.empty());
    for (const std::string& name : names) {
      const std::string left = a + "/" + folder + "/" + name, right = b + "/" + folder + "/" + name;
      EXPECT_EQ(read_file_text(left, "output"), read_file_text(right, "output")) << name;
    }
    EXPECT_EQ(names.size(), static_cast<size_t>(std::distance(fs::directory_iterator(b + "/" + folder),
                                                              fs::directory_iterator())));
  }
  json left = json::parse(read_file_text(a + "/index.json", "index"));
  json right = json::parse(read_file_text(b + "/index.json", "index"));
  for (json* index : {&left, &right}) {
    index->erase("seconds");
    index->erase("setup_seconds");
    index->erase("ranks");
  }
  EXPECT_EQ(left, right);
}

TEST_F(PrepareRecords, TheOutputIsTheSameOnOneOrTwoThreadsAndOneOrTwoRanks) {
  PrepareRecordsOptions one = options(path("plain"), "one");
  one.threads = 1;
  prepare_records(one);
  PrepareRecordsOptions two = options(path("plain"), "two");
  two.threads = 2;
  prepare_records(two);
  expect_same_outputs(path("one"), path("two"));

  // Two ranks as two threads of this process, meeting at a barrier as mpirun's ranks do.
  std::barrier meeting(2);
  std::vector<PrepareRecordsResult> results(2);
  std::vector<std::thread> ranks;
  for (int rank = 0; rank < 2; ++rank) {
    ranks.emplace_back([&, rank] {
      PrepareRecordsOptions shared = options(path("plain"), "ranks");
      shared.threads = 1;
      shared.rank = rank;
      shared.world_size = 2;
      shared.wait_for_all_ranks = [&] { meeting.arrive_and_wait(); };
      results[static_cast<size_t>(rank)] = prepare_records(shared);
    });
  }
  for (std::thread& rank : ranks) rank.join();
  EXPECT_EQ(results[0].index["ranks"], 2);
  EXPECT_TRUE(results[1].index.is_null()) << "only rank 0 writes the index";
  expect_same_outputs(path("one"), path("ranks"));
}

TEST_F(PrepareRecords, ASecondRunSkipsTheWorkUnlessArgumentsSourcesOrOutputsChanged) {
  const PrepareRecordsOptions prepare = options(path("plain"), "out");
  EXPECT_FALSE(prepare_records(prepare).skipped);
  EXPECT_TRUE(prepare_records(prepare).skipped);

  PrepareRecordsOptions other_fraction = prepare;
  other_fraction.validation_fraction = 0.2;
  EXPECT_FALSE(prepare_records(other_fraction).skipped);
  EXPECT_TRUE(prepare_records(other_fraction).skipped);

  // A damaged shard: rebuilt.
  const std::string shard = path("out/train/00001-000.tokens");
  {
    std::fstream file(shard, std::ios::in | std::ios::out | std::ios::binary);
    file.seekp(40);
    file.put('\x7f');
  }
  EXPECT_FALSE(prepare_records(other_fraction).skipped);
  EXPECT_NO_THROW(TokenShard::open(shard));

  // A source file that changed: rebuilt, and a stale part of the old layout removed.
  write_source("a.jsonl", {"only one document now"});
  EXPECT_TRUE(fs::is_regular_file(path("out/train/00000-001.tokens")));
  EXPECT_FALSE(prepare_records(other_fraction).skipped);
  EXPECT_FALSE(fs::exists(path("out/train/00000-001.tokens")));
  EXPECT_TRUE(prepare_records(other_fraction).skipped);
}

TEST_F(PrepareRecords, APrepareStoppedByABadFileLeavesNoIndexAndTrainRefusesTheFolder) {
  const PrepareRecordsOptions prepare = options(path("plain"), "out");
  prepare_records(prepare);
  write("plain/c.jsonl", "{\"text\": \"fine\"}\n{\"text\": \"fine\"}\n{\"text\": broken}\n");
  const std::string error = error_of([&] { prepare_records(prepare); });
  EXPECT_TRUE(contains(error, path("plain/c.jsonl") + ":3")) << error;
  EXPECT_TRUE(contains(error, "malformed JSON")) << error;
  EXPECT_FALSE(fs::exists(path("out/index.json")));
  EXPECT_TRUE(fs::exists(path("out/train/00000-000.tokens"))) << "a whole part of a file done before";
  // The bad file's parts were being streamed to disk: nothing of them is left, under any name.
  for (const char* split : {"train", "validation"}) {
    for (const fs::directory_entry& entry : fs::directory_iterator(path("out") + "/" + split)) {
      EXPECT_FALSE(contains(entry.path().filename().string(), "00002-")) << entry.path();
    }
  }
  const std::string refused = error_of([&] { resolve_token_shards(path("out"), "train"); });
  EXPECT_TRUE(contains(refused, "prepare stopped early")) << refused;

  // What a killed run leaves (a part under its temporary name) is removed by the next run.
  write("out/train/00002-000.tokens.tmp.99999", std::string(32, '\0'));
  fs::remove(path("plain/c.jsonl"));
  prepare_records(prepare);
  EXPECT_FALSE(fs::exists(path("out/train/00002-000.tokens.tmp.99999")));
  fs::remove(path("out/validation/00000-000.tokens"));
  const std::string missing = error_of([&] { resolve_token_shards(path("out"), "validation"); });
  EXPECT_TRUE(contains(missing, path("out/index.json"))) << missing;
  EXPECT_TRUE(contains(missing, "validation/00000-000.tokens")) << missing;
}

// Threads take documents as they come, yet the error is always the first bad document in reading order: in
// c.jsonl, line 3 (one claim) before line 3000 (a later claim, likely on another thread), before d.jsonl's
// line 1 (a later batch).
TEST_F(PrepareRecords, TheErrorIsTheFirstBadDocumentInReadingOrderWhateverTheThreads) {
  std::string lines = "{\"text\": \"fine\"}\n{\"text\": \"fine\"}\n{\"text\": broken}\n";
  for (int i = 4; i < 3000; ++i)
    lines += json{{"text", "line " + std::to_string(i) + std::string(80, 'x')}}.dump() + "\n";
  lines += "{\"text\": 1}\n";
  write("plain/c.jsonl", lines);
  write("plain/d.jsonl", "[]\n");
  for (const int threads : {1, 2, 4, 4, 4}) {
    PrepareRecordsOptions prepare = options(path("plain"), "out");
    prepare.threads = threads;
    const std::string error = error_of([&] { prepare_records(prepare); });
    EXPECT_TRUE(contains(error, path("plain/c.jsonl") + ":3:")) << threads << " threads: " << error;
    EXPECT_TRUE(contains(error, "malformed JSON")) << error;
    EXPECT_FALSE(fs::exists(path("out/index.json")));
  }
}

TEST_F(PrepareRecords, BadColumnsTokenizersAndSourcesAreErrorsNamingThem) {
  PrepareRecordsOptions column = options(path("plain"), "out");
  column.column = "content";
  const std::string no_column = error_of([&] { prepare_records(column); });
  EXPECT_TRUE(contains(no_column, path("plain/a.jsonl") + ":1")) << no_column;
  EXPECT_TRUE(contains(no_column, "'id', 'text'")) << no_column;
  EXPECT_TRUE(contains(no_column, "--column=COLUMN")) << no_column;

  PrepareRecordsOptions no_eos = options(path("plain"), "out");
  no_eos.tokenizer_path = path("no_eos.json");
  const std::string eos = error_of([&] { prepare_records(no_eos); });
  EXPECT_TRUE(contains(eos, path("no_eos.json"))) << eos;
  EXPECT_TRUE(contains(eos, "<|endoftext|>")) << eos;

  const std::string glob = error_of([&] { prepare_records(options(path("plain/*.parquet"), "out")); });
  EXPECT_TRUE(contains(glob, "no match")) << glob;
  EXPECT_FALSE(fs::exists(path("out/index.json")));
}

TEST_F(PrepareRecords, AParquetFileIsReadThroughParquetOrRefusedNeverSkipped) {
  EXPECT_EQ(record_format_of("shard.parquet"), RecordFormat::parquet);
  const std::string file = write("bad.parquet", "not parquet at all");
  RecordReader reader({file}, RecordOptions{});
  Record record;
  const std::string error = error_of([&] { reader.next(record); });
  EXPECT_TRUE(contains(error, file)) << error;
  EXPECT_TRUE(contains(error, parquet_supported() ? "a readable Parquet file" : "scripts/setup.sh parquet"))
      << error;
}

TEST_F(PrepareRecords, AParquetFileGivesTheSameShardsAsItsDocumentsInJsonLines) {
  if (!parquet_supported()) GTEST_SKIP() << "this build does not read Parquet (scripts/setup.sh parquet)";
  const std::string python = MESHTRAIN_TEST_PYTHON;
  if (std::system(("'" + python + "' -c 'import pyarrow' >/dev/null 2>&1").c_str()) != 0) {
    GTEST_SKIP() << python << " cannot import pyarrow (scripts/setup.sh parquet installs it)";
  }
  fs::create_directories(path("fixtures"));
  const std::string script = std::string(MESHTRAIN_SOURCE_DIR) + "/tests/reference/parquet/write_fixtures.py";
  ASSERT_EQ(std::system(("'" + python + "' '" + script + "' '" + path("fixtures") + "'").c_str()), 0);
  fs::create_directories(path("parquet"));
  fs::create_directories(path("jsonl"));
  fs::copy_file(path("fixtures/documents.parquet"), path("parquet/documents.parquet"));
  fs::copy_file(path("fixtures/documents.jsonl"), path("jsonl/documents.jsonl"));
  PrepareRecordsOptions parquet = options(path("parquet"), "from_parquet");
  parquet.shard_tokens = kPrepareShardTokens;
  PrepareRecordsOptions jsonl = options(path("jsonl"), "from_jsonl");
  jsonl.shard_tokens = kPrepareShardTokens;
  const json from_parquet = prepare_records(parquet).index;
  const json from_jsonl = prepare_records(jsonl).index;
  EXPECT_EQ(from_parquet["train"], from_jsonl["train"]);
  EXPECT_EQ(from_parquet["validation"], from_jsonl["validation"]);
  EXPECT_EQ(
      from_parquet["train"]["documents"].get<int>() + from_parquet["validation"]["documents"].get<int>(),
      2500);
}

}  // namespace
}  // namespace meshtrain
