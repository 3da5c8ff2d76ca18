// meshtrain prepare on a small user corpus: outputs exist and reload (shards decode back to the documents),
// a second run with the same arguments is skipped, a changed corpus or argument rebuilds, bad flags fail.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "meshtrain/cli/commands.h"
#include "meshtrain/cli/prepare.h"
#include "meshtrain/core/error.h"
#include "meshtrain/data/prepare.h"
#include "meshtrain/data/shards.h"
#include "meshtrain/data/token_windows.h"
#include "meshtrain/data/tokenizer/tokenizer.h"

namespace meshtrain {
namespace {

namespace fs = std::filesystem;

class PrepareTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = fs::temp_directory_path() /
           ("meshtrain_prepare_" + std::to_string(::getpid()) + "_" + std::string(info->name()));
    fs::remove_all(dir_);
    fs::create_directories(dir_ / "corpus");
    const std::vector<std::string> lines = {
        "The quick brown fox jumps over the lazy dog.",
        "In the beginning was the word, and the word was with the fox.",
        "A journey of a thousand miles begins with a single step.",
        "To be, or not to be: that is the question.",
        "All that glitters is not gold; caf\xC3\xA9 au lait \xE2\x82\xAC 5.",
    };
    for (int file = 0; file < 8; ++file) {
      std::string text;
      for (int repeat = 0; repeat < 6; ++repeat) text += lines[(file + repeat) % lines.size()] + "\n";
      write_corpus_file("doc" + std::to_string(file) + ".txt", text);
    }
  }
  void TearDown() override { fs::remove_all(dir_); }

  void write_corpus_file(const std::string& name, const std::string& text) const {
    std::ofstream(dir_ / "corpus" / name, std::ios::binary) << text;
  }
  std::vector<std::string> flags(int vocab = 300) const {
    return {"--out",
            (dir_ / "out").string(),
            "--vocab-size",
            std::to_string(vocab),
            "--corpus=" + (dir_ / "corpus").string(),
            "--validation-fraction",
            "0.25"};
  }
  fs::path dir_;
};

TEST_F(PrepareTest, WritesReloadableOutputsAndSkipsSecondRun) {
  std::ostringstream first;
  ASSERT_EQ(run_prepare(flags(), first), 0);
  const fs::path out = dir_ / "out";
  for (const char* name : {"tokenizer.json", "train.tokens", "validation.tokens", "prepare.json"}) {
    EXPECT_TRUE(fs::is_regular_file(out / name)) << name;
  }
  EXPECT_NE(first.str().find("wrote"), std::string::npos) << first.str();
  EXPECT_NE(first.str().find("unigram cross-entropy"), std::string::npos) << first.str();

  const nlohmann::json summary = nlohmann::json::parse(std::ifstream(out / "prepare.json"));
  EXPECT_EQ(summary["vocab_size"], 300);
  EXPECT_EQ(summary["train"]["documents"], 6);
  EXPECT_EQ(summary["validation"]["documents"], 2);
  const double entropy = summary["validation_unigram_cross_entropy_nats"].get<double>();
  EXPECT_GT(entropy, 1.0);
  EXPECT_LT(entropy, std::log(300.0));

  const Tokenizer tokenizer = Tokenizer::load((out / "tokenizer.json").string());
  ASSERT_TRUE(tokenizer.eos_id().has_value());
  EXPECT_EQ(summary["eos_id"], *tokenizer.eos_id());
  EXPECT_EQ(tokenizer.vocab_size(), 300);
  // The validation shard decodes back to its documents (doc2 and doc6: floor((k + 0.5) * 8 / 2)), each
  // followed by EOS.
  const TokenShard validation = TokenShard::open((out / "validation.tokens").string());
  std::vector<int32_t> ids(validation.size());
  validation.read(0, ids.size(), ids.data());
  std::string expected;
  for (const char* name : {"doc2.txt", "doc6.txt"}) {
    std::ifstream in(dir_ / "corpus" / name, std::ios::binary);
    expected += std::string(std::istreambuf_iterator<char>(in), {}) + "<|endoftext|>";
  }
  EXPECT_EQ(tokenizer.decode(ids), expected);
  EXPECT_EQ(ids.back(), *tokenizer.eos_id());
  // The shards feed the loader with the tokenizer's vocabulary.
  LoaderOptions options;
  options.sequence_length = 16;
  options.per_device_batch_size = 2;
  options.eos_id = *tokenizer.eos_id();
  options.vocab_size = tokenizer.vocab_size();
  EXPECT_EQ(TokenWindows::open(resolve_token_shards(out.string(), "train"), options)->token_count(),
            summary["train"]["tokens"].get<uint64_t>());

  const auto modified = fs::last_write_time(out / "train.tokens");
  const PrepareResult again =
      prepare_dataset(PrepareOptions{(dir_ / "out").string(), 300, (dir_ / "corpus").string(), 0.25});
  EXPECT_TRUE(again.skipped);
  std::ostringstream second;
  ASSERT_EQ(run_prepare(flags(), second), 0);
  EXPECT_NE(second.str().find("up to date"), std::string::npos) << second.str();
  EXPECT_EQ(fs::last_write_time(out / "train.tokens"), modified);

  // A different vocabulary size rebuilds.
  std::ostringstream third;
  run_prepare(flags(280), third);
  EXPECT_NE(third.str().find("wrote"), std::string::npos) << third.str();
  EXPECT_EQ(Tokenizer::load((out / "tokenizer.json").string()).vocab_size(), 280);
  // So does an edited corpus file, and a damaged output.
  write_corpus_file("doc3.txt", "Entirely new text for the third document.\n");
  EXPECT_FALSE(prepare_dataset(PrepareOptions{(dir_ / "out").string(), 280, (dir_ / "corpus").string(), 0.25})
                   .skipped);
  {
    std::fstream damage(out / "train.tokens", std::ios::in | std::ios::out | std::ios::binary);
    damage.seekp(40);
    damage.put('\x7f');
  }
  EXPECT_FALSE(prepare_dataset(PrepareOptions{(dir_ / "out").string(), 280, (dir_ / "corpus").string(), 0.25})
                   .skipped);
  EXPECT_NO_THROW(TokenShard::open((out / "train.tokens").string()));
}

// The tokenizing half of the pipeline alone, as dataset_type=text runs it with a run's tokenizer.
TEST_F(PrepareTest, TokenizeCorpusWritesBothSplitsWithEos) {
  std::ostringstream made;
  ASSERT_EQ(run_prepare(flags(), made), 0);
  const Tokenizer tokenizer = Tokenizer::load((dir_ / "out" / "tokenizer.json").string());
  const int32_t eos = *tokenizer.eos_id();
  Corpus corpus;
  corpus.train = {{"a", "In the beginning"}, {"b", "and the earth"}};
  corpus.validation = {{"c", "was without form"}};
  const fs::path shards = dir_ / "shards";
  fs::create_directories(shards);
  const TokenizedCorpus tokens = tokenize_corpus(corpus, tokenizer, eos, shards.string());
  EXPECT_EQ(tokens.train_path, (shards / "train.tokens").string());
  ASSERT_EQ(tokens.train.size(), 2u);
  EXPECT_EQ(tokens.train[1], tokenizer.encode("and the earth"));
  const TokenShard validation = TokenShard::open(tokens.validation_path);
  std::vector<int32_t> ids(validation.size());
  validation.read(0, ids.size(), ids.data());
  EXPECT_EQ(tokenizer.decode(ids), "was without form<|endoftext|>");
  EXPECT_EQ(tokens.train_shard.token_count, tokens.train[0].size() + tokens.train[1].size() + 2);
}

TEST_F(PrepareTest, BadFlagsAreErrors) {
  std::ostringstream out;
  EXPECT_THROW(run_prepare({"--bogus", "1"}, out), MeshError);
  EXPECT_THROW(run_prepare({"--out"}, out), MeshError);
  EXPECT_THROW(run_prepare({"--vocab-size", "12x"}, out), MeshError);
  EXPECT_THROW(run_prepare({"--vocab-size", "100", "--corpus", (dir_ / "corpus").string()}, out), MeshError);
  EXPECT_THROW(run_prepare({"--corpus", (dir_ / "missing").string(), "--out", (dir_ / "o").string()}, out),
               MeshError);
  EXPECT_THROW(run_prepare({"--corpus", (dir_ / "corpus").string(), "--validation-fraction", "1.5", "--out",
                            (dir_ / "o").string()},
                           out),
               MeshError);
  // --help is the command line's (run_command_line), with the usage and flags from the command table.
  std::istringstream in;
  std::ostringstream err;
  EXPECT_EQ(run_command_line({"prepare", "--help"}, in, out, err), 0);
  EXPECT_NE(out.str().find("usage: meshtrain prepare"), std::string::npos);
  EXPECT_NE(out.str().find("--validation-fraction F"), std::string::npos);
}

}  // namespace
}  // namespace meshtrain
