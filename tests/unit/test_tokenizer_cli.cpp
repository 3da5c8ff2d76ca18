// Tests for `meshtrain tokenize`: encode and decode through run_tokenize with string streams, exact bytes
// both ways, and MeshErrors for bad arguments and bad input.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <sstream>
#include <string>
#include <vector>

#include "meshtrain/cli/tokenize.h"
#include "meshtrain/core/error.h"
#include "shared_assets.h"

namespace meshtrain {
namespace {

bool contains(const std::string& text, const std::string& needle) {
  return text.find(needle) != std::string::npos;
}

std::string gpt2_dir() {
  return testing::tokenizer_assets_dir() + "/gpt2";
}

#define SKIP_WITHOUT_ASSETS()               \
  if (!std::filesystem::exists(gpt2_dir())) \
  GTEST_SKIP() << "GPT-2 tokenizer not found at " << gpt2_dir() << " (set MESHTRAIN_SHARED_DIR)"

std::string run(const std::vector<std::string>& arguments, const std::string& input) {
  std::istringstream in(input);
  std::ostringstream out;
  EXPECT_EQ(run_tokenize(arguments, in, out), 0);
  return out.str();
}

std::string error_of(const std::vector<std::string>& arguments, const std::string& input) {
  std::istringstream in(input);
  std::ostringstream out;
  try {
    run_tokenize(arguments, in, out);
  } catch (const MeshError& error) {
    return error.what();
  }
  ADD_FAILURE() << "expected a MeshError";
  return "";
}

TEST(TokenizeCli, EncodesToAJsonArray) {
  SKIP_WITHOUT_ASSETS();
  EXPECT_EQ(run({"--tokenizer", gpt2_dir()}, "Hello world"), "[15496,995]\n");
  EXPECT_EQ(run({"--tokenizer=" + gpt2_dir()}, ""), "[]\n");
  // Nothing stripped: the trailing newline is a token of its own.
  EXPECT_EQ(run({"--tokenizer", gpt2_dir()}, "Hello world\n"), "[15496,995,198]\n");
}

TEST(TokenizeCli, DecodesExactBytes) {
  SKIP_WITHOUT_ASSETS();
  EXPECT_EQ(run({"--tokenizer", gpt2_dir(), "--decode"}, " [15496, 995,\n198 ]\n"), "Hello world\n");
  EXPECT_EQ(run({"--decode", "--tokenizer", gpt2_dir()}, "[]"), "");
}

TEST(TokenizeCli, RoundTripsArbitraryBytes) {
  SKIP_WITHOUT_ASSETS();
  static const char kText[] = "line one\r\n\ttabs\0nul \xff\xfe not utf-8 \xe6\x97\xa5\xe6\x9c\xac  \n\n";
  const std::string text(kText, sizeof(kText) - 1);  // the NUL inside included
  const std::string ids = run({"--tokenizer", gpt2_dir()}, text);
  EXPECT_EQ(ids.front(), '[');
  EXPECT_EQ(run({"--tokenizer", gpt2_dir(), "--decode"}, ids), text);
}

TEST(TokenizeCli, BadArgumentsAndInput) {
  SKIP_WITHOUT_ASSETS();
  EXPECT_TRUE(contains(error_of({}, "x"), "--tokenizer"));
  EXPECT_TRUE(contains(error_of({"--decode"}, "[1]"), "--tokenizer"));
  EXPECT_TRUE(contains(error_of({"--tokenizer"}, "x"), "--tokenizer"));
  EXPECT_TRUE(contains(error_of({"--tokenizer", gpt2_dir(), "--verbose"}, "x"), "--verbose"));
  EXPECT_TRUE(contains(error_of({"--tokenizer", "/no/such/tokenizer"}, "x"), "/no/such/tokenizer"));
  const std::vector<std::string> decode = {"--tokenizer", gpt2_dir(), "--decode"};
  EXPECT_TRUE(contains(error_of(decode, "[1, 2"), "invalid JSON"));
  EXPECT_TRUE(contains(error_of(decode, "Hello"), "invalid JSON"));
  EXPECT_TRUE(contains(error_of(decode, "{\"ids\": [1]}"), "JSON array"));
  EXPECT_TRUE(contains(error_of(decode, "[1, \"2\"]"), "position 1"));
  EXPECT_TRUE(contains(error_of(decode, "[1, 2.5]"), "2.5"));
  EXPECT_TRUE(contains(error_of(decode, "[-1]"), "-1"));
  const std::string unknown = error_of(decode, "[15496, 50257]");
  EXPECT_TRUE(contains(unknown, "id 50257 at position 1")) << unknown;
  EXPECT_TRUE(contains(unknown, "encoder.json")) << unknown;
}

}  // namespace
}  // namespace meshtrain
