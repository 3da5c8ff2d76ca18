// data/records/parquet_text: every document of files pyarrow wrote
// (tests/reference/parquet/write_fixtures.py, in the venv of scripts/setup.sh parquet) against the same
// documents as JSON Lines; and the bad files. A build without Parquet checks the error that says how to get
// it instead.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "error_text.h"
#include "meshtrain/data/records/parquet_text.h"

namespace meshtrain {
namespace {

namespace fs = std::filesystem;
using testing::error_of;

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

// The fixture files, written once for the suite; empty (with the reason in `skip_reason`) where they cannot
// be.
class ParquetText : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    if (!parquet_supported()) {
      skip_reason = "this build does not read Parquet (scripts/setup.sh parquet, then reconfigure)";
      return;
    }
    const std::string python = MESHTRAIN_TEST_PYTHON;
    if (std::system(("'" + python + "' -c 'import pyarrow' >/dev/null 2>&1").c_str()) != 0) {
      skip_reason = python + " cannot import pyarrow (scripts/setup.sh parquet installs it)";
      return;
    }
    folder = (fs::temp_directory_path() / ("meshtrain_parquet_" + std::to_string(getpid()))).string();
    fs::remove_all(folder);
    fs::create_directories(folder);
    const std::string script =
        std::string(MESHTRAIN_SOURCE_DIR) + "/tests/reference/parquet/write_fixtures.py";
    const std::string command = "'" + python + "' '" + script + "' '" + folder + "'";
    ASSERT_EQ(std::system(command.c_str()), 0) << command;
  }
  static void TearDownTestSuite() {
    if (!folder.empty()) fs::remove_all(folder);
  }
  void SetUp() override {
    if (!skip_reason.empty()) GTEST_SKIP() << skip_reason;
  }

  static std::string file(const std::string& name) { return folder + "/" + name; }

  static std::vector<std::string> expected_documents() {
    std::vector<std::string> documents;
    std::ifstream in(file("documents.jsonl"));
    for (std::string line; std::getline(in, line);) documents.push_back(nlohmann::json::parse(line)["text"]);
    return documents;
  }

  static std::vector<std::string> read_all(ParquetTextReader& reader) {
    std::vector<std::string> documents;
    while (const std::optional<std::string_view> text = reader.next()) documents.emplace_back(*text);
    return documents;
  }

  static inline std::string folder;
  static inline std::string skip_reason;
};

TEST_F(ParquetText, ReadsEveryDocumentInOrderAcrossRowGroupsAndPages) {
  const std::vector<std::string> expected = expected_documents();
  ASSERT_EQ(expected.size(), 2500u);
  for (const char* name : {"documents.parquet", "large.parquet"}) {  // zstd + dictionary; snappy + plain
    ParquetTextReader reader(file(name), "text");
    EXPECT_EQ(reader.documents(), 2500) << name;
    const std::vector<std::string> documents = read_all(reader);
    ASSERT_EQ(documents.size(), expected.size()) << name;
    for (size_t i = 0; i < expected.size(); ++i) ASSERT_EQ(documents[i], expected[i]) << name << " row " << i;
    EXPECT_FALSE(reader.next().has_value()) << name << ": the end stays the end";
  }
  ParquetTextReader empty(file("empty.parquet"), "text");
  EXPECT_EQ(empty.documents(), 0);
  EXPECT_FALSE(empty.next().has_value());
}

TEST_F(ParquetText, ColumnsThatHoldNoTextAreRefusedNamingWhatTheyHold) {
  const std::string missing = error_of([] { ParquetTextReader(file("documents.parquet"), "content"); });
  EXPECT_TRUE(contains(missing, file("documents.parquet"))) << missing;
  EXPECT_TRUE(contains(missing, "column 'content'")) << missing;
  EXPECT_TRUE(contains(missing, "columns id (INT64), text (String)")) << missing;
  EXPECT_TRUE(contains(missing, "train_data_columns")) << missing;

  const std::string binary = error_of([] { ParquetTextReader(file("binary.parquet"), "text"); });
  EXPECT_TRUE(contains(binary, "a string column")) << binary;
  EXPECT_TRUE(contains(binary, "text (BYTE_ARRAY)")) << binary;
  const std::string integers = error_of([] { ParquetTextReader(file("integers.parquet"), "text"); });
  EXPECT_TRUE(contains(integers, "text (INT64)")) << integers;
  const std::string list = error_of([] { ParquetTextReader(file("list.parquet"), "text"); });
  EXPECT_TRUE(contains(list, "text.list.element (String)")) << list;  // a list's leaf is not a column of text
}

TEST_F(ParquetText, DamagedFilesAndNullDocumentsAreErrorsNamingFileAndRow) {
  const std::string truncated = error_of([] { ParquetTextReader(file("truncated.parquet"), "text"); });
  EXPECT_TRUE(contains(truncated, file("truncated.parquet"))) << truncated;
  EXPECT_TRUE(contains(truncated, "a readable Parquet file")) << truncated;
  EXPECT_TRUE(contains(truncated, "download or write it again")) << truncated;

  for (const char* name : {"README.md"}) {  // not Parquet at all
    const std::string path = std::string(MESHTRAIN_SOURCE_DIR) + "/" + name;
    const std::string error = error_of([&] { ParquetTextReader(path, "text"); });
    EXPECT_TRUE(contains(error, "a readable Parquet file")) << error;
  }

  ParquetTextReader damaged(file("damaged_page.parquet"), "text");  // the footer is whole: it opens
  const std::string page = error_of([&] { read_all(damaged); });
  EXPECT_TRUE(contains(page, file("damaged_page.parquet") + ": column 'text' after row 1000")) << page;
  EXPECT_TRUE(contains(page, "CRC")) << page;

  ParquetTextReader with_null(file("null.parquet"), "text");
  const std::string null = error_of([&] { read_all(with_null); });
  EXPECT_TRUE(contains(null, file("null.parquet") + ": column 'text', row 1234")) << null;
  EXPECT_TRUE(contains(null, "found null")) << null;
}

TEST(ParquetTextUnsupported, TheErrorNamesTheFileAndHowToEnableParquetOrConvert) {
  if (parquet_supported()) GTEST_SKIP() << "this build reads Parquet: its files are tested by ParquetText";
  const std::string error = error_of([] { ParquetTextReader("/data/fineweb/000.parquet", "text"); });
  EXPECT_TRUE(contains(error, "/data/fineweb/000.parquet")) << error;
  EXPECT_TRUE(contains(error, "scripts/setup.sh parquet")) << error;
  EXPECT_TRUE(contains(error, "JSON Lines")) << error;
}

}  // namespace
}  // namespace meshtrain
