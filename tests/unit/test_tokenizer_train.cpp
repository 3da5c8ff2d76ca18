// Tests for the BPE trainer and tokenizer.json writer: exact vocabulary size, deterministic output, round
// trips through the saved file, special tokens, tie-breaking, and errors for impossible requests.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "meshtrain/core/error.h"
#include "meshtrain/data/tokenizer/tokenizer.h"

namespace meshtrain {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

bool contains(const std::string& text, const std::string& needle) {
  return text.find(needle) != std::string::npos;
}

std::string read_file(const std::string& path) {
  std::ifstream file(path, std::ios::binary);
  std::stringstream contents;
  contents << file.rdbuf();
  return contents.str();
}

class TempDir {
 public:
  TempDir() {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    path_ = fs::temp_directory_path() /
            ("meshtrain_tokenizer_train_" + std::to_string(::getpid()) + "_" + info->name());
    fs::remove_all(path_);
    fs::create_directories(path_);
  }
  ~TempDir() { fs::remove_all(path_); }
  std::string path(const std::string& name) const { return (path_ / name).string(); }

 private:
  fs::path path_;
};

// A few kilobytes of English-like text with repeated words, so merges have something to find.
std::string training_text() {
  const std::vector<std::string> words = {"the",   "quick", "brown", "fox",    "jumps", "over",   "lazy",
                                          "dog",   "and",   "then",  "runs",   "into",  "forest", "where",
                                          "trees", "grow",  "tall",  "beside", "river", "banks"};
  std::mt19937 rng(3);
  std::string text;
  for (int sentence = 0; sentence < 300; ++sentence) {
    const int length = 4 + static_cast<int>(rng() % 8);
    for (int w = 0; w < length; ++w) {
      std::string word = words[rng() % words.size()];
      if (w == 0) word[0] = static_cast<char>(word[0] - 'a' + 'A');
      text += word + (w + 1 == length ? ". " : " ");
    }
    if (sentence % 7 == 6) text += "\n";
  }
  return text;
}

TEST(TokenizerTrain, SavesLoadsAndRoundTrips) {
  TempDir dir;
  const std::string text = training_text();
  const Tokenizer trained = train_bpe_tokenizer({text}, 320, {"<|endoftext|>", "<|pad|>"});
  EXPECT_EQ(trained.vocab_size(), 320);
  EXPECT_EQ(trained.eos_id(), 318);
  EXPECT_TRUE(trained.source_path().empty());

  const std::string path = dir.path("tokenizer.json");
  save_trained_tokenizer(trained, path);
  const Tokenizer loaded = Tokenizer::load(path);
  EXPECT_EQ(loaded.vocab_size(), 320);
  EXPECT_EQ(loaded.eos_id(), 318);
  EXPECT_EQ(loaded.identity(), trained.identity());
  EXPECT_EQ(loaded.source_path(), path);

  // Unseen text, Unicode and bytes that are not UTF-8 all round-trip: the tokenizer is byte-level.
  const std::vector<std::string> unseen = {
      "The lazy river jumps over the tall fox.", "Unseen words: zebra, quartz, 12345!",
      "na\xc3\xafve caf\xc3\xa9 \xe6\x97\xa5\xe6\x9c\xac \xf0\x9f\x99\x82",
      std::string("\x00\xff\xfe bytes", 9), ""};
  for (const std::string& sample : unseen) {
    EXPECT_EQ(trained.encode(sample), loaded.encode(sample)) << sample;
    EXPECT_EQ(loaded.decode(loaded.encode(sample)), sample);
  }
  // Training text compresses: common words became single tokens.
  EXPECT_LT(loaded.encode(text).size(), text.size() / 3);
  // Special tokens are recognised as single ids.
  const std::vector<int32_t> ids = loaded.encode("the dog<|endoftext|><|pad|>fox");
  ASSERT_GE(ids.size(), 4u);
  EXPECT_NE(std::find(ids.begin(), ids.end(), 318), ids.end());
  EXPECT_NE(std::find(ids.begin(), ids.end(), 319), ids.end());
  EXPECT_EQ(loaded.decode(ids), "the dog<|endoftext|><|pad|>fox");
}

TEST(TokenizerTrain, WritesTheHuggingFaceLayout) {
  TempDir dir;
  const std::string path = dir.path("tokenizer.json");
  save_trained_tokenizer(train_bpe_tokenizer({training_text()}, 300, {"<|endoftext|>"}), path);
  const json file = json::parse(read_file(path));
  EXPECT_EQ(file["model"]["type"], "BPE");
  EXPECT_EQ(file["model"]["byte_fallback"], false);
  EXPECT_EQ(file["model"]["vocab"].size(), 299u);
  EXPECT_EQ(file["model"]["vocab"]["\xc4\xa0"], 32);  // "Ġ" is the space byte
  ASSERT_GT(file["model"]["merges"].size(), 0u);
  EXPECT_TRUE(file["model"]["merges"][0].is_array());
  EXPECT_EQ(file["model"]["merges"][0].size(), 2u);
  EXPECT_EQ(file["pre_tokenizer"]["type"], "ByteLevel");
  EXPECT_EQ(file["pre_tokenizer"]["add_prefix_space"], false);
  EXPECT_EQ(file["pre_tokenizer"]["use_regex"], true);
  EXPECT_EQ(file["pre_tokenizer"]["trim_offsets"], true);
  EXPECT_EQ(file["decoder"]["type"], "ByteLevel");
  EXPECT_TRUE(file["normalizer"].is_null());
  EXPECT_TRUE(file["post_processor"].is_null());
  ASSERT_EQ(file["added_tokens"].size(), 1u);
  EXPECT_EQ(file["added_tokens"][0]["id"], 299);
  EXPECT_EQ(file["added_tokens"][0]["content"], "<|endoftext|>");
  EXPECT_EQ(file["added_tokens"][0]["special"], true);
  // Nothing left behind by the atomic write.
  EXPECT_EQ(std::distance(fs::directory_iterator(dir.path("")), fs::directory_iterator()), 1);
}

TEST(TokenizerTrain, IsDeterministic) {
  TempDir dir;
  const std::string text = training_text();
  save_trained_tokenizer(train_bpe_tokenizer({text}, 360, {"<|endoftext|>"}), dir.path("a.json"));
  // The same text in two pieces, cut where a pre-token starts, counts the same pre-tokens.
  const std::string_view view(text);
  const size_t cut = text.find(" the", text.size() / 2);
  ASSERT_NE(cut, std::string::npos);
  save_trained_tokenizer(train_bpe_tokenizer({view.substr(0, cut), view.substr(cut)}, 360, {"<|endoftext|>"}),
                         dir.path("b.json"));
  EXPECT_EQ(read_file(dir.path("a.json")), read_file(dir.path("b.json")));
}

TEST(TokenizerTrain, TiesGoToTheSmallestByteStrings) {
  TempDir dir;
  // Every pair occurs once: "a b" first, then "ab c" ("ab" < "c"), then "abc d".
  save_trained_tokenizer(train_bpe_tokenizer({"abcd"}, 259, {}), dir.path("tokenizer.json"));
  const json merges = json::parse(read_file(dir.path("tokenizer.json")))["model"]["merges"];
  EXPECT_EQ(merges, json::parse(R"([["a","b"],["ab","c"],["abc","d"]])"));
  // Higher counts win over smaller byte strings.
  // Higher counts win over smaller byte strings: (" ", "x") and ("x", "y") occur twice, ("a", "b") once.
  save_trained_tokenizer(train_bpe_tokenizer({"ab xy xy"}, 258, {}), dir.path("counts.json"));
  EXPECT_EQ(json::parse(read_file(dir.path("counts.json")))["model"]["merges"],
            json::parse(R"([["\u0120","x"],["\u0120x","y"]])"));
}

TEST(TokenizerTrain, SpecialTokensInTheTextAreNotLearned) {
  const Tokenizer trained =
      train_bpe_tokenizer({"<|endoftext|>aaaa<|endoftext|>aaaa<|endoftext|>"}, 259, {"<|endoftext|>"});
  // Only "aa" and "aaaa" are learned: the markers' pieces never reach the pair counts.
  EXPECT_EQ(trained.encode("aaaa<|endoftext|>"), (std::vector<int32_t>{257, 258}));
  EXPECT_EQ(trained.encode("<|"), (std::vector<int32_t>{'<', '|'}));
}

TEST(TokenizerTrain, Errors) {
  TempDir dir;
  const std::string text = training_text();
  try {
    train_bpe_tokenizer({text}, 100000, {});
    ADD_FAILURE() << "the text cannot fill 100000 tokens";
  } catch (const MeshError& error) {
    EXPECT_TRUE(contains(error.what(), "vocab_size")) << error.what();
    EXPECT_TRUE(contains(error.what(), "100000")) << error.what();
  }
  EXPECT_THROW(train_bpe_tokenizer({text}, 256, {"<|endoftext|>"}), MeshError);
  EXPECT_THROW(train_bpe_tokenizer({text}, 300, {"<s>", "<s>"}), MeshError);
  EXPECT_THROW(train_bpe_tokenizer({text}, 300, {""}), MeshError);
  EXPECT_THROW(train_bpe_tokenizer({text}, 300, {"\xff"}), MeshError);
  const Tokenizer trained = train_bpe_tokenizer({text}, 300, {});
  const std::string missing = dir.path("no_such_folder") + "/tokenizer.json";
  try {
    save_trained_tokenizer(trained, missing);
    ADD_FAILURE() << "the folder does not exist";
  } catch (const MeshError& error) {
    EXPECT_TRUE(contains(error.what(), missing)) << error.what();
  }
}

}  // namespace
}  // namespace meshtrain
