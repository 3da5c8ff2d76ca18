// Tests for the byte-level BPE tokenizers: the golden id lists of Qwen3 and GPT-2, round trips of arbitrary
// bytes, NFC, both merge formats, added tokens, one MeshError naming the file per malformed input, and the
// loader's fast path reading what it takes as the full parse does.
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "meshtrain/core/error.h"
#include "meshtrain/data/tokenizer/tokenizer.h"
#include "meshtrain/data/tokenizer/tokenizer_impl.h"
#include "shared_assets.h"

namespace meshtrain {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

bool contains(const std::string& text, const std::string& needle) {
  return text.find(needle) != std::string::npos;
}

bool have_assets() {
  return fs::exists(testing::tokenizer_assets_dir() + "/golden.json");
}

#define SKIP_WITHOUT_ASSETS()                                                         \
  if (!have_assets())                                                                 \
  GTEST_SKIP() << "tokenizer assets not found at " << testing::tokenizer_assets_dir() \
               << " (set MESHTRAIN_SHARED_DIR to the shared folder)"

// Parsed once per test binary: the Qwen3 tokenizer.json is 11 MB.
const Tokenizer& qwen3() {
  static const Tokenizer tokenizer = [] {
    const auto start = std::chrono::steady_clock::now();
    Tokenizer loaded = Tokenizer::load(testing::tokenizer_assets_dir() + "/qwen3/tokenizer.json");
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    std::printf("[ info ] Qwen3 tokenizer.json loaded in %.3f s\n", seconds);
    return loaded;
  }();
  return tokenizer;
}

const Tokenizer& gpt2() {
  static const Tokenizer tokenizer = Tokenizer::load(testing::tokenizer_assets_dir() + "/gpt2");
  return tokenizer;
}

json golden() {
  std::ifstream file(testing::tokenizer_assets_dir() + "/golden.json");
  return json::parse(file);
}

std::vector<int32_t> ids_of(const json& list) {
  return list.get<std::vector<int32_t>>();
}

// A folder of its own per test, removed afterwards.
class TempDir {
 public:
  TempDir() {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    path_ = fs::temp_directory_path() / ("meshtrain_tokenizer_" + std::to_string(::getpid()) + "_" +
                                         info->test_suite_name() + "_" + info->name());
    fs::remove_all(path_);
    fs::create_directories(path_);
  }
  ~TempDir() { fs::remove_all(path_); }
  std::string file(const std::string& name, const std::string& contents) const {
    const fs::path path = path_ / name;
    std::ofstream(path, std::ios::binary) << contents;
    return path.string();
  }
  std::string path() const { return path_.string(); }

 private:
  fs::path path_;
};

// GPT-2's byte-to-unicode alphabet, written out independently of the implementation.
std::string byte_level(const std::string& bytes) {
  std::string out;
  for (const char c : bytes) {
    const int byte = static_cast<unsigned char>(c);
    int code_point = byte;
    if (!((byte >= 33 && byte <= 126) || (byte >= 161 && byte <= 172) || byte >= 174)) {
      int n = 0;
      for (int b = 0; b < byte; ++b) {
        if (!((b >= 33 && b <= 126) || (b >= 161 && b <= 172) || b >= 174)) ++n;
      }
      code_point = 256 + n;
    }
    if (code_point < 0x80) {
      out += static_cast<char>(code_point);
    } else {
      out += static_cast<char>(0xC0 | (code_point >> 6));
      out += static_cast<char>(0x80 | (code_point & 0x3F));
    }
  }
  return out;
}

// A tiny byte-level BPE: ids 0-255 are the bytes, then one token per merge (given as byte strings).
struct TinyBpe {
  std::vector<std::pair<std::string, std::string>> merges;
  std::vector<std::pair<std::string, int>> added;  // content, id
  bool pair_format = false;
  json pre_tokenizer = {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", true}};
  json normalizer = nullptr;
  bool ignore_merges = false;
  std::vector<std::string> extra_vocab;  // more tokens after the merged ones

  json to_json() const {
    json vocab = json::object();
    int next = 0;
    for (int byte = 0; byte < 256; ++byte) {
      vocab[byte_level(std::string(1, static_cast<char>(byte)))] = next++;
    }
    json merge_list = json::array();
    for (const auto& [left, right] : merges) {
      if (!vocab.contains(byte_level(left + right))) vocab[byte_level(left + right)] = next++;
      if (pair_format) {
        merge_list.push_back(json::array({byte_level(left), byte_level(right)}));
      } else {
        merge_list.push_back(byte_level(left) + " " + byte_level(right));
      }
    }
    for (const auto& token : extra_vocab) vocab[byte_level(token)] = next++;
    json added_tokens = json::array();
    for (const auto& [content, id] : added) {
      added_tokens.push_back({{"id", id},
                              {"content", content},
                              {"single_word", false},
                              {"lstrip", false},
                              {"rstrip", false},
                              {"normalized", false},
                              {"special", true}});
    }
    return {{"version", "1.0"},
            {"added_tokens", added_tokens},
            {"normalizer", normalizer},
            {"pre_tokenizer", pre_tokenizer},
            {"post_processor", nullptr},
            {"decoder", {{"type", "ByteLevel"}}},
            {"model",
             {{"type", "BPE"},
              {"dropout", nullptr},
              {"unk_token", nullptr},
              {"byte_fallback", false},
              {"ignore_merges", ignore_merges},
              {"vocab", vocab},
              {"merges", merge_list}}}};
  }
};

// Plain rank-based BPE, the textbook way, as the reference the tokenizer's merging must agree with.
std::vector<int32_t> reference_bpe(
    const std::string& piece, const std::map<std::pair<int32_t, int32_t>, std::pair<int, int32_t>>& ranks) {
  std::vector<int32_t> symbols;
  for (const char c : piece) symbols.push_back(static_cast<unsigned char>(c));
  while (symbols.size() > 1) {
    size_t best = symbols.size();
    int best_rank = 0;
    for (size_t i = 0; i + 1 < symbols.size(); ++i) {
      const auto found = ranks.find({symbols[i], symbols[i + 1]});
      if (found != ranks.end() && (best == symbols.size() || found->second.first < best_rank)) {
        best = i;
        best_rank = found->second.first;
      }
    }
    if (best == symbols.size()) break;
    symbols[best] = ranks.at({symbols[best], symbols[best + 1]}).second;
    symbols.erase(symbols.begin() + static_cast<std::ptrdiff_t>(best) + 1);
  }
  return symbols;
}

void expect_load_error(const std::string& path, const std::string& needle) {
  try {
    Tokenizer::load(path);
    ADD_FAILURE() << "loading " << path << " should fail";
  } catch (const MeshError& error) {
    EXPECT_TRUE(contains(error.what(), path)) << error.what();
    EXPECT_TRUE(contains(error.what(), needle)) << error.what();
  }
}

// ---- golden id lists -------------------------------------------------------------------------------------

TEST(TokenizerGolden, Qwen3ReproducesEveryIdListAndDecodesBack) {
  SKIP_WITHOUT_ASSETS();
  const json cases = golden();
  ASSERT_GT(cases.size(), 10u);
  for (const json& entry : cases) {
    const std::string text = entry["text"];
    const std::vector<int32_t> expected = ids_of(entry["qwen3"]);
    EXPECT_EQ(qwen3().encode(text), expected) << "text: " << text;
    EXPECT_EQ(qwen3().decode(expected), text);
  }
}

TEST(TokenizerGolden, Gpt2ReproducesEveryIdListAndDecodesBack) {
  SKIP_WITHOUT_ASSETS();
  for (const json& entry : golden()) {
    const std::string text = entry["text"];
    const std::vector<int32_t> expected = ids_of(entry["gpt2"]);
    EXPECT_EQ(gpt2().encode(text), expected) << "text: " << text;
    EXPECT_EQ(gpt2().decode(expected), text);
  }
}

TEST(TokenizerGolden, Qwen3Properties) {
  SKIP_WITHOUT_ASSETS();
  EXPECT_EQ(qwen3().vocab_size(), 151669);
  EXPECT_EQ(qwen3().eos_id(), 151643);
  EXPECT_TRUE(qwen3().source_path().ends_with("qwen3/tokenizer.json"));
  EXPECT_EQ(qwen3().identity().size(), 16u);
  EXPECT_EQ(qwen3().identity(), qwen3().identity());
  EXPECT_NE(qwen3().identity(), gpt2().identity());
  EXPECT_EQ(qwen3().encode("<|im_start|>"), std::vector<int32_t>{151644});
  EXPECT_EQ(qwen3().decode({151644, 151645}), "<|im_start|><|im_end|>");
}

TEST(TokenizerGolden, Gpt2Properties) {
  SKIP_WITHOUT_ASSETS();
  EXPECT_EQ(gpt2().vocab_size(), 50257);
  EXPECT_EQ(gpt2().eos_id(), 50256);
  EXPECT_TRUE(gpt2().source_path().ends_with("encoder.json"));
  // No special-token handling: the marker is text.
  EXPECT_GT(gpt2().encode("<|endoftext|>").size(), 1u);
  EXPECT_EQ(gpt2().decode({50256}), "<|endoftext|>");
  // Naming either GPT-2 file loads the pair.
  const Tokenizer via_file = Tokenizer::load(testing::tokenizer_assets_dir() + "/gpt2/vocab.bpe");
  EXPECT_EQ(via_file.identity(), gpt2().identity());
  EXPECT_EQ(via_file.encode("Hello world"), (std::vector<int32_t>{15496, 995}));
}

TEST(TokenizerGolden, ArbitraryBytesRoundTrip) {
  SKIP_WITHOUT_ASSETS();
  std::mt19937 rng(7);
  std::vector<std::string> texts = {std::string("\0\x01\xff\xfe", 4),
                                    "\xc3\x28 invalid \xe2\x82",
                                    "\xf0\x9f\x99",
                                    "tail \xed\xa0\x80 surrogate",
                                    std::string(3000, ' ') + "x",
                                    std::string(5000, '7'),
                                    "\r\n\r\n\t\t  \n"};
  // Qwen3 normalises to NFC, so only NFC text comes back byte for byte: random bytes below 0xCC only
  // spell characters below U+0300, which NFC leaves alone (invalid sequences are kept as they are).
  std::vector<std::string> below_0xcc = texts;
  for (int n = 0; n < 50; ++n) {
    std::string text(rng() % 200, '\0');
    for (char& c : text) c = static_cast<char>(rng() % 256);
    texts.push_back(text);
    for (char& c : text) c = static_cast<char>(static_cast<unsigned char>(c) % 0xCC);
    below_0xcc.push_back(text);
  }
  for (const std::string& text : texts) EXPECT_EQ(gpt2().decode(gpt2().encode(text)), text);
  for (const std::string& text : below_0xcc) EXPECT_EQ(qwen3().decode(qwen3().encode(text)), text);
}

TEST(TokenizerGolden, Qwen3NormalisesToNfc) {
  SKIP_WITHOUT_ASSETS();
  const std::string composed = "caf\xc3\xa9 \xe1\x84\x80\xe1\x85\xa1";  // café + Hangul jamo (composes to 가)
  const std::string decomposed = "cafe\xcc\x81 \xe1\x84\x80\xe1\x85\xa1";
  EXPECT_EQ(qwen3().encode(decomposed), qwen3().encode(composed));
  EXPECT_EQ(qwen3().decode(qwen3().encode(decomposed)), "caf\xc3\xa9 \xea\xb0\x80");
  // GPT-2 has no normaliser: the combining accent stays.
  EXPECT_EQ(gpt2().decode(gpt2().encode(decomposed)), decomposed);
}

TEST(TokenizerGolden, LongPiecesAndLongRuns) {
  SKIP_WITHOUT_ASSETS();
  // One pre-token of 100k digits (GPT-2's \p{N}+), 256 KiB of spaces, unbroken CJK text.
  const std::string digits(100000, '3');
  const std::string spaces(1 << 18, ' ');
  std::string cjk;
  for (int i = 0; i < 2000; ++i) cjk += "\xe4\xb8\xad\xe6\x96\x87";  // 中文
  for (const std::string* text : std::vector<const std::string*>{&digits, &spaces, &cjk}) {
    EXPECT_EQ(gpt2().decode(gpt2().encode(*text)), *text);
    EXPECT_EQ(qwen3().decode(qwen3().encode(*text)), *text);
  }
}

TEST(TokenizerGolden, ConcurrentEncodingAgrees) {
  SKIP_WITHOUT_ASSETS();
  // encode() is const and keeps its caches per thread: threads sharing one tokenizer get the same ids.
  const json cases = golden();
  std::vector<std::string> texts;
  for (const json& entry : cases) texts.push_back(entry["text"]);
  std::vector<std::vector<int32_t>> expected;
  for (const std::string& text : texts) expected.push_back(qwen3().encode(text));
  std::vector<int> mismatches(4, 0);
  std::vector<std::thread> threads;
  for (size_t t = 0; t < mismatches.size(); ++t) {
    threads.emplace_back([&, t] {
      for (int round = 0; round < 20; ++round) {
        for (size_t i = 0; i < texts.size(); ++i) {
          const size_t k = (i + t * 7 + static_cast<size_t>(round)) % texts.size();
          if (qwen3().encode(texts[k]) != expected[k]) ++mismatches[t];
        }
      }
    });
  }
  for (auto& thread : threads) thread.join();
  for (const int count : mismatches) EXPECT_EQ(count, 0);
}

// ---- tiny tokenizers -------------------------------------------------------------------------------------

TEST(TokenizerFormat, BothMergeFormatsEncodeAlike) {
  TempDir dir;
  TinyBpe tiny;
  tiny.merges = {{"a", "b"}, {"ab", "c"}, {" ", "ab"}, {"c", "c"}, {"cc", "c"}};
  const Tokenizer strings = Tokenizer::load(dir.file("strings.json", tiny.to_json().dump()));
  tiny.pair_format = true;
  const Tokenizer pairs = Tokenizer::load(dir.file("pairs.json", tiny.to_json().dump()));
  for (const std::string text : {"abc ab abcc cccc", "", "x", "ab ab ab", "abcabcab"}) {
    EXPECT_EQ(strings.encode(text), pairs.encode(text)) << text;
    EXPECT_EQ(pairs.decode(pairs.encode(text)), text);
  }
  // 256=ab, 257=abc, 258=" ab", 259=cc, 260=ccc
  EXPECT_EQ(pairs.encode("abc ab cccc"), (std::vector<int32_t>{257, 258, ' ', 259, 259}));
  EXPECT_EQ(pairs.encode("ccc"), (std::vector<int32_t>{260}));
  EXPECT_EQ(strings.identity(), pairs.identity());
  EXPECT_EQ(pairs.vocab_size(), 261);
  EXPECT_FALSE(pairs.eos_id().has_value());
}

TEST(TokenizerFormat, MergingAgreesWithReferenceOnShortAndLongPieces) {
  TempDir dir;
  TinyBpe tiny;
  tiny.merges = {{"a", "b"},   {"b", "a"}, {"ab", "a"},  {"a", "a"},  {"ba", "b"},    {"aa", "b"},
                 {"ab", "ab"}, {"b", "b"}, {"aba", "b"}, {"bb", "a"}, {"abab", "ab"}, {"aa", "aa"}};
  tiny.pre_tokenizer = {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", false}};
  const Tokenizer tokenizer = Tokenizer::load(dir.file("tokenizer.json", tiny.to_json().dump()));
  // Rebuild ids the way TinyBpe assigns them.
  std::map<std::string, int32_t> ids;
  for (int byte = 0; byte < 256; ++byte) ids[std::string(1, static_cast<char>(byte))] = byte;
  std::map<std::pair<int32_t, int32_t>, std::pair<int, int32_t>> ranks;
  for (size_t rank = 0; rank < tiny.merges.size(); ++rank) {
    const auto& [left, right] = tiny.merges[rank];
    if (!ids.count(left + right)) ids[left + right] = static_cast<int32_t>(ids.size());
    ranks[{ids[left], ids[right]}] = {static_cast<int>(rank), ids[left + right]};
  }
  std::mt19937 rng(11);
  for (int n = 0; n < 400; ++n) {
    // Lengths on both sides of the short/long switch (64 bytes), and far beyond it.
    const size_t length = n < 380 ? rng() % 130 : 500 + rng() % 1500;
    std::string text(length, 'a');
    for (char& c : text) c = rng() % 3 == 0 ? 'b' : 'a';
    EXPECT_EQ(tokenizer.encode(text), reference_bpe(text, ranks)) << text;
  }
}

TEST(TokenizerFormat, AddedTokensLongestFirstAndVerbatim) {
  TempDir dir;
  TinyBpe tiny;
  tiny.merges = {{"<", "a"}};
  tiny.added = {{"<a>", 300}, {"<a><b>", 301}, {"\xc3\xa9!", 302}};
  tiny.pre_tokenizer = {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", false}};
  const Tokenizer tokenizer = Tokenizer::load(dir.file("tokenizer.json", tiny.to_json().dump()));
  EXPECT_EQ(tokenizer.vocab_size(), 303);
  EXPECT_EQ(tokenizer.encode("<a><b><a>x<a"), (std::vector<int32_t>{301, 300, 'x', 256}));
  EXPECT_EQ(tokenizer.encode("\xc3\xa9!\xc3\xa9"), (std::vector<int32_t>{302, 0xc3, 0xa9}));
  EXPECT_EQ(tokenizer.decode({301, 302, 'x'}), "<a><b>\xc3\xa9!x");
  try {
    (void)tokenizer.decode({1, 299});  // between the last merge token and the first added token
    ADD_FAILURE() << "id 299 does not exist";
  } catch (const MeshError& error) {
    EXPECT_TRUE(contains(error.what(), "id 299 at position 1")) << error.what();
  }
  EXPECT_THROW((void)tokenizer.decode({-1}), MeshError);
  EXPECT_THROW((void)tokenizer.decode({303}), MeshError);
}

TEST(TokenizerFormat, SplitSequenceNfcAndIgnoreMerges) {
  TempDir dir;
  TinyBpe tiny;
  tiny.merges = {{"a", "b"}};
  tiny.extra_vocab = {"abc"};  // no merge reaches it
  // Digits one by one, then letters, as a Split + ByteLevel(use_regex=false) sequence.
  tiny.pre_tokenizer = {
      {"type", "Sequence"},
      {"pretokenizers",
       json::array({{{"type", "Split"},
                     {"pattern", {{"Regex", "\\p{N}|\\p{L}+"}}},
                     {"behavior", "Isolated"},
                     {"invert", false}},
                    {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", false}}})}};
  tiny.normalizer = {{"type", "Sequence"}, {"normalizers", json::array({{{"type", "NFC"}}})}};
  const Tokenizer plain = Tokenizer::load(dir.file("plain.json", tiny.to_json().dump()));
  EXPECT_EQ(plain.encode("abc12"), (std::vector<int32_t>{256, 'c', '1', '2'}));
  EXPECT_EQ(plain.encode("e\xcc\x81"), (std::vector<int32_t>{0xc3, 0xa9}));  // NFC: é
  tiny.ignore_merges = true;
  const Tokenizer whole = Tokenizer::load(dir.file("whole.json", tiny.to_json().dump()));
  EXPECT_EQ(whole.encode("abc12"), (std::vector<int32_t>{257, '1', '2'}));
  EXPECT_NE(whole.identity().size(), 0u);
}

TEST(TokenizerFormat, AddPrefixSpace) {
  TempDir dir;
  TinyBpe tiny;
  tiny.merges = {{" ", "a"}};
  tiny.added = {{"<s>", 300}};
  tiny.pre_tokenizer = {{"type", "ByteLevel"}, {"add_prefix_space", true}, {"use_regex", true}};
  const Tokenizer tokenizer = Tokenizer::load(dir.file("tokenizer.json", tiny.to_json().dump()));
  // Each stretch of text between added tokens gets a leading space unless it has one.
  EXPECT_EQ(tokenizer.encode("a a"), (std::vector<int32_t>{256, 256}));
  EXPECT_EQ(tokenizer.encode(" a<s>a"), (std::vector<int32_t>{256, 300, 256}));
  EXPECT_EQ(tokenizer.encode("<s>"), (std::vector<int32_t>{300}));
}

// ---- malformed input -------------------------------------------------------------------------------------

// A checkpoint refuses a run of another tokenizer by this identity (check_run_tokenizer): two tokenizers of
// the same vocabulary must differ in it when only their merges (the order that decides how text is cut) or
// their added tokens (content, or whether one is special) differ.
TEST(TokenizerFormat, IdentityCoversMergesAndAddedTokens) {
  TempDir dir;
  TinyBpe tiny;
  tiny.merges = {{"a", "b"}, {"b", "c"}};
  tiny.added = {{"<|endoftext|>", 258}};
  const json base = tiny.to_json();
  const std::string identity = Tokenizer::load(dir.file("base.json", base.dump())).identity();
  EXPECT_EQ(Tokenizer::load(dir.file("again.json", base.dump())).identity(), identity);

  json swapped =
      base;  // the same vocabulary, the merges in the other order: "abc" is cut "ab c", then "a bc"
  std::swap(swapped["model"]["merges"][0], swapped["model"]["merges"][1]);
  const Tokenizer reordered = Tokenizer::load(dir.file("swapped.json", swapped.dump()));
  EXPECT_EQ(reordered.vocab_size(), 259);
  EXPECT_NE(reordered.encode("abc"), Tokenizer::load(dir.file("base2.json", base.dump())).encode("abc"));
  EXPECT_NE(reordered.identity(), identity);

  json fewer = base;  // the same vocabulary, one merge less
  fewer["model"]["merges"].erase(1);
  EXPECT_NE(Tokenizer::load(dir.file("fewer.json", fewer.dump())).identity(), identity);

  json renamed = base;
  renamed["added_tokens"][0]["content"] = "<|end|>";
  EXPECT_NE(Tokenizer::load(dir.file("renamed.json", renamed.dump())).identity(), identity);
  json not_special = base;
  not_special["added_tokens"][0]["special"] = false;
  EXPECT_NE(Tokenizer::load(dir.file("not_special.json", not_special.dump())).identity(), identity);
}

TEST(TokenizerErrors, MissingPathAndEmptyFolder) {
  TempDir dir;
  expect_load_error(dir.path() + "/nothing_here.json", "nothing at that path");
  expect_load_error(dir.path(), "neither tokenizer.json nor encoder.json + vocab.bpe");
  dir.file("encoder.json", "{}");
  expect_load_error(dir.path(), "only encoder.json");
}

TEST(TokenizerErrors, NotJson) {
  TempDir dir;
  expect_load_error(dir.file("tokenizer.json", "{\"model\": [1, 2"), "invalid JSON");
  expect_load_error(dir.file("array.json", "[1, 2]"), "\"model\"");
}

TEST(TokenizerErrors, UnsupportedModelTypes) {
  TempDir dir;
  expect_load_error(dir.file("wordpiece.json", R"({"model":{"type":"WordPiece","vocab":{}}})"), "WordPiece");
  expect_load_error(dir.file("unigram.json", R"({"model":{"type":"Unigram","vocab":[]}})"), "Unigram");
  TinyBpe tiny;
  json sentencepiece = tiny.to_json();
  sentencepiece["pre_tokenizer"] = {{"type", "Metaspace"}, {"replacement", "\u2581"}};
  expect_load_error(dir.file("metaspace.json", sentencepiece.dump()), "Metaspace");
  json no_pre = tiny.to_json();
  no_pre["pre_tokenizer"] = nullptr;
  expect_load_error(dir.file("no_pre.json", no_pre.dump()), "ByteLevel");
  json fallback = tiny.to_json();
  fallback["model"]["byte_fallback"] = true;
  expect_load_error(dir.file("fallback.json", fallback.dump()), "byte_fallback");
  json lowercase = tiny.to_json();
  lowercase["normalizer"] = {{"type", "Lowercase"}};
  expect_load_error(dir.file("lowercase.json", lowercase.dump()), "Lowercase");
  json after = tiny.to_json();
  after["pre_tokenizer"] = {
      {"type", "Sequence"},
      {"pretokenizers",
       json::array({{{"type", "ByteLevel"}, {"add_prefix_space", false}},
                    {{"type", "Split"}, {"pattern", {{"Regex", "a"}}}, {"behavior", "Isolated"}}})}};
  expect_load_error(dir.file("after.json", after.dump()), "after ByteLevel");
  json bad_regex = tiny.to_json();
  bad_regex["pre_tokenizer"] = {
      {"type", "Sequence"},
      {"pretokenizers",
       json::array({{{"type", "Split"}, {"pattern", {{"Regex", "(unclosed"}}}, {"behavior", "Isolated"}},
                    {{"type", "ByteLevel"}, {"use_regex", false}}})}};
  expect_load_error(dir.file("bad_regex.json", bad_regex.dump()), "(unclosed");
}

TEST(TokenizerErrors, BadVocabularyAndMerges) {
  TempDir dir;
  TinyBpe tiny;
  tiny.merges = {{"a", "b"}};
  json unknown = tiny.to_json();
  unknown["model"]["merges"].push_back("x " + byte_level("nope"));
  expect_load_error(dir.file("unknown.json", unknown.dump()), "nope");
  json unknown_pair = tiny.to_json();
  unknown_pair["model"]["merges"].push_back(json::array({"b", "a"}));  // "ba" is not in the vocabulary
  expect_load_error(dir.file("unknown_pair.json", unknown_pair.dump()), "'ba'");
  json malformed = tiny.to_json();
  malformed["model"]["merges"].push_back("a b c");
  expect_load_error(dir.file("malformed.json", malformed.dump()), "model.merges[1]");
  json duplicate = tiny.to_json();
  duplicate["model"]["vocab"]["zz"] = 0;
  expect_load_error(dir.file("duplicate.json", duplicate.dump()), "id 0");
  json negative = tiny.to_json();
  negative["model"]["vocab"]["zz"] = -3;
  expect_load_error(dir.file("negative.json", negative.dump()), "-3");
  json missing_byte = tiny.to_json();
  missing_byte["model"]["vocab"].erase(byte_level("\n"));
  expect_load_error(dir.file("missing_byte.json", missing_byte.dump()), "byte 0x0A");
  json bad_added = tiny.to_json();
  bad_added["added_tokens"] = json::array({{{"id", "x"}, {"content", "<s>"}}});
  expect_load_error(dir.file("bad_added.json", bad_added.dump()), "added_tokens[0]");
}

TEST(TokenizerErrors, BadGpt2Files) {
  TempDir dir;
  TinyBpe tiny;
  tiny.merges = {{"a", "b"}};
  dir.file("encoder.json", tiny.to_json()["model"]["vocab"].dump());
  const std::string merges = dir.file("vocab.bpe", "#version: 0.2\na b\nq " + byte_level("zz") + "\n");
  expect_load_error(dir.path(), merges + ":3");
  dir.file("encoder.json", "not json");
  expect_load_error(dir.path(), "encoder.json");
}

// ---- the loader's fast path ------------------------------------------------------------------------------

// What a load gives: the model's loaded fields, or the error's message.
std::string load_outcome(const std::function<tokenizer_detail::BpeModel()>& load) {
  try {
    const tokenizer_detail::BpeModel model = load();
    std::string digest = "model:";
    for (size_t id = 0; id < model.token_bytes.size(); ++id) {
      digest += std::to_string(id) + "=" + model.token_bytes[id] + "/" +
                std::to_string(model.token_present[id]) + std::to_string(model.token_verbatim[id]) + ";";
    }
    for (const auto& merge : model.merges) {
      digest += std::to_string(merge.left) + "+" + std::to_string(merge.right) + "=" +
                std::to_string(merge.merged) + ";";
    }
    for (const auto& token : model.added_tokens)
      digest += token.content + "@" + std::to_string(token.id) + ";";
    digest += std::to_string(model.regexes.size()) + std::to_string(model.nfc) +
              std::to_string(model.add_prefix_space) + std::to_string(model.ignore_merges);
    return digest;
  } catch (const MeshError& error) {
    return std::string("error:") + error.what();
  }
}

// A tokenizer.json text read through the fast path and through the full parse alone: the same model or the
// same error. Returns whether the fast scanner took it.
bool expect_fast_path_reads_as_full_parse(const TempDir& dir, const std::string& text) {
  const std::string path = dir.file("tokenizer.json", text);
  const std::string fast = load_outcome([&] {
    return tokenizer_detail::load_hugging_face(path, tokenizer_detail::JsonParse::kFastWhereItCan);
  });
  const std::string full = load_outcome(
      [&] { return tokenizer_detail::load_hugging_face(path, tokenizer_detail::JsonParse::kFullParseOnly); });
  EXPECT_EQ(fast, full) << text.substr(0, 300);
  return tokenizer_detail::fast_scanner_reads(text, false);
}

// A TinyBpe's tokenizer.json with model.vocab (or model.merges) written as `raw`.
std::string with_raw(json document, const std::string& key, const std::string& raw) {
  document["model"][key] = "RAW";
  std::string text = document.dump();
  text.replace(text.find("\"RAW\""), 5, raw);
  return text;
}

TEST(TokenizerFastPath, EscapesBothMergeFormsAndLayoutsReadAsTheFullParseReadsThem) {
  TempDir dir;
  TinyBpe tiny;
  tiny.merges = {{"a", "b"}, {"ab", "c"}, {" ", "ab"}, {"\"", "\\"}, {"\xC3", "\xA9"}};
  tiny.added = {{"<|endoftext|>", 300}};
  std::set<std::string> models;
  for (const bool pairs : {false, true}) {
    tiny.pair_format = pairs;
    json document = tiny.to_json();
    document["model"]["vocab"]["\xF0\x9F\x98\x80"] =
        299;  // outside the byte-level alphabet: a surrogate pair
    // As written (keys "\"" and "\\" escaped, "Ġ" raw), every non-ASCII character as \uXXXX (so "\u0120"),
    // indented, and with the sections' keys themselves escaped.
    std::string escaped_keys = document.dump();
    for (const char* key : {"\"vocab\"", "\"merges\"", "\"model\""}) {
      std::string escaped = key;
      escaped.replace(
          2, 1,
          "\\u00" + std::to_string(static_cast<int>(escaped[2]) / 16) + "0123456789abcdef"[escaped[2] % 16]);
      escaped_keys.replace(escaped_keys.find(key), std::string(key).size(), escaped);
    }
    for (const std::string& text :
         {document.dump(), document.dump(-1, ' ', true), document.dump(2, '\t', true), escaped_keys}) {
      EXPECT_TRUE(expect_fast_path_reads_as_full_parse(dir, text)) << text.substr(0, 300);
      models.insert(
          load_outcome([&] { return tokenizer_detail::load_hugging_face(dir.file("t.json", text)); }));
    }
  }
  ASSERT_EQ(models.size(), 1u);
  EXPECT_EQ(models.begin()->rfind("model:", 0), 0u) << *models.begin();

  // GPT-2's encoder.json: the whole document is the vocabulary.
  const json vocab = tiny.to_json()["model"]["vocab"];
  for (const std::string& text : {vocab.dump(), " \n" + vocab.dump(-1, ' ', true) + "\r\n"}) {
    EXPECT_TRUE(tokenizer_detail::fast_scanner_reads(text, true));
    const std::string encoder = dir.file("encoder.json", text);
    const std::string merges = dir.file("vocab.bpe", "#version: 0.2\na b\n");
    EXPECT_EQ(load_outcome([&] { return tokenizer_detail::load_gpt2(encoder, merges); }), load_outcome([&] {
                return tokenizer_detail::load_gpt2(encoder, merges,
                                                   tokenizer_detail::JsonParse::kFullParseOnly);
              }));
  }
}

TEST(TokenizerFastPath, LeavesAnythingUnusualToTheFullParseWithItsErrors) {
  TempDir dir;
  TinyBpe tiny;
  tiny.merges = {{"a", "b"}};
  const json document = tiny.to_json();
  std::string vocab = document["model"]["vocab"].dump();
  vocab.pop_back();  // the closing brace: entries are added after the real ones
  const std::string merges = document["model"]["merges"].dump();
  const std::string text = document.dump();
  const std::vector<std::string> unusual = {
      with_raw(document, "vocab", vocab + ", \"zz\": 1.0}"),
      with_raw(document, "vocab", vocab + ", \"zz\": 1e2}"),
      with_raw(document, "vocab", vocab + ", \"zz\": 01}"),
      with_raw(document, "vocab", vocab + ", \"zz\": -0}"),
      with_raw(document, "vocab", vocab + ", \"zz\": 16777216}"),  // past the largest token id
      with_raw(document, "vocab", vocab + ", \"zz\": 99999999999999999999999}"),
      with_raw(document, "vocab", vocab + ", \"zz\": \"5\"}"),
      with_raw(document, "vocab", vocab + ", \"zz\": null}"),
      with_raw(document, "vocab", vocab + ", \"\\ud800\": 300}"),  // a lone surrogate
      with_raw(document, "vocab", vocab + ", \"\\x\": 300}"),      // an unknown escape
      with_raw(document, "vocab", vocab + ", \"\xC3\": 300}"),     // invalid UTF-8
      with_raw(document, "vocab", vocab + ", \"\t\": 300}"),       // a raw control character
      with_raw(document, "vocab", vocab + ",}"),
      with_raw(document, "vocab", vocab + "} }"),
      with_raw(document, "vocab", "[]"),
      with_raw(document, "merges", "[\"a  b\"]"),
      with_raw(document, "merges", "[\" ab\"]"),
      with_raw(document, "merges", "[[\"a\"]]"),
      with_raw(document, "merges", "[[\"a\", \"b\", \"c\"]]"),
      with_raw(document, "merges", "[[\"a\", 2]]"),
      with_raw(document, "merges", "[\"a b\",]"),
      with_raw(document, "merges", "{}"),
      with_raw(document, "merges", merges + ", \"merges\": " + merges),  // two merges lists
      "\xEF\xBB\xBF" + text,                                             // a byte order mark
      text + " x",
      text.substr(0, text.size() - 1),
      "{\"model\": 1, " + text.substr(1),  // two models
      "",                                  // an empty file, which is read rather than mapped
  };
  for (const std::string& unusual_text : unusual) {
    EXPECT_FALSE(expect_fast_path_reads_as_full_parse(dir, unusual_text)) << unusual_text.substr(0, 300);
  }
  // Errors outside the two sections come from the parse of the rest, or, when that fails, the full parse.
  for (const std::string& outside :
       {"{\"added_tokens\": [1,], " + text.substr(1), "{\"added_tokens\": tru, " + text.substr(1),
        "{\"added_tokens\": 5, " + text.substr(1)}) {
    expect_fast_path_reads_as_full_parse(dir, outside);
  }
  for (const std::string& encoder :
       {"\xEF\xBB\xBF" + document["model"]["vocab"].dump(), std::string("{\"a\": 1} 2"), std::string("[]"),
        std::string("{\"a\": 1.5}")}) {
    EXPECT_FALSE(tokenizer_detail::fast_scanner_reads(encoder, true)) << encoder;
  }
}

}  // namespace
}  // namespace meshtrain
