// data/tokenizer/compressed_tokenizer: the normaliser on hand cases, and the compressed vocabularies of the
// real Qwen3 and GPT-2 tokenizers (../shared/assets) against Hugging Face `tokenizers` building them as
// DeepSeek's Engram reference does (tests/reference/engram_golden/make_compressed.py): Vc, an FNV-1a 64 of
// the whole map and the compressed id of sampled and Unicode-normalised ids.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "meshtrain/data/tokenizer/compressed_tokenizer.h"
#include "shared_assets.h"

namespace meshtrain {
namespace {

namespace fs = std::filesystem;

TEST(EngramNormalize, FollowsTheReferencesNormalizerSequence) {
  EXPECT_EQ(engram_normalize(" The"), "the");
  EXPECT_EQ(engram_normalize("  \t\n "), " ");  // a run of spaces is one space, kept
  EXPECT_EQ(engram_normalize("A \t B"), "a b");
  EXPECT_EQ(engram_normalize("Café"), "cafe");        // NFD, then the accent (Mn) stripped
  EXPECT_EQ(engram_normalize("ﬁ"), "fi");             // NFKC ligature
  EXPECT_EQ(engram_normalize("ＡＢＣ"), "abc");       // NFKC full width
  EXPECT_EQ(engram_normalize("ΟΔΟΣ"), "οδοσ");        // per code point: no final-sigma context
  EXPECT_EQ(engram_normalize("\u00a0x\u3000"), "x");  // NBSP and ideographic space are NFKC spaces
  EXPECT_EQ(engram_normalize("\u0301"), "");          // a lone combining mark normalises to nothing
  EXPECT_EQ(engram_normalize("x\u000c"), "x");        // form feed: Unicode white space, trimmed
}

TEST(CompressedTokenizer, RealTokenizersMatchHuggingFaceTokenizers) {
  const std::string golden_path =
      std::string(MESHTRAIN_SOURCE_DIR) + "/tests/reference/engram_golden/compressed.json";
  if (!fs::exists(testing::tokenizer_assets_dir() + "/qwen3/tokenizer.json"))
    GTEST_SKIP() << "tokenizer assets not found at " << testing::tokenizer_assets_dir()
                 << " (set MESHTRAIN_SHARED_DIR to the shared folder)";
  std::ifstream file(golden_path);
  const nlohmann::json golden = nlohmann::json::parse(file);
  for (const char* name : {"qwen3", "gpt2"}) {
    SCOPED_TRACE(name);
    const Tokenizer tokenizer = Tokenizer::load(testing::tokenizer_assets_dir() + "/" + name +
                                                (std::string(name) == "qwen3" ? "/tokenizer.json" : ""));
    const CompressedVocabulary vocabulary = compress_vocabulary(tokenizer);
    const nlohmann::json& expected = golden["tokenizers"][name];
    ASSERT_EQ(static_cast<int64_t>(vocabulary.compress.size()), expected["vocab_size"].get<int64_t>());
    EXPECT_EQ(vocabulary.size, expected["compressed_size"].get<int64_t>());
    int64_t mismatches = 0;
    for (const nlohmann::json& sample : expected["samples"]) {
      const auto id = sample[0].get<int32_t>();
      if (vocabulary(id) != sample[1].get<int32_t>() && ++mismatches <= 10) {
        ADD_FAILURE() << "id " << id << " (" << tokenizer.token_string(id) << "): compressed "
                      << vocabulary(id) << ", expected " << sample[1].get<int32_t>();
      }
    }
    EXPECT_EQ(mismatches, 0);
    uint64_t digest = 0xcbf29ce484222325ull;
    for (int32_t compressed : vocabulary.compress) {
      const auto bits = static_cast<uint32_t>(compressed);
      for (int shift = 0; shift < 32; shift += 8)
        digest = (digest ^ ((bits >> shift) & 0xFF)) * 0x100000001b3ull;
    }
    char hex[17];
    std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(digest));
    EXPECT_EQ(std::string(hex), expected["fnv1a64_int32_le"].get<std::string>());
    EXPECT_EQ(vocabulary(-1), -1) << "padding passes through";
  }
}

}  // namespace
}  // namespace meshtrain
