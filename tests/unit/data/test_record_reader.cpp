// data/records: the record reader's documents from text and JSON Lines files (plain, .gz and .zst alike, at
// any chunk size, lines split across chunks), its bad inputs (each a MeshError naming file, line and what
// was found), a source's files by path, folder and glob, and the sources' fingerprint.
#include <gtest/gtest.h>

#include <filesystem>
#include <nlohmann/json.hpp>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "error_text.h"
#include "meshtrain/core/error.h"
#include "meshtrain/data/records/fingerprint.h"
#include "meshtrain/data/records/record_reader.h"
#include "meshtrain/data/records/source_files.h"
#include "record_files.h"

namespace meshtrain {
namespace {

using testing::error_of;

class RecordReaderTest : public testing::RecordFilesTest {
 protected:
  static std::vector<Record> read_all(const std::vector<std::string>& files, RecordOptions options = {}) {
    RecordReader reader(files, std::move(options));
    std::vector<Record> records;
    Record record;
    while (reader.next(record)) records.push_back(record);
    return records;
  }
  static std::vector<std::string> texts(const std::vector<Record>& records) {
    std::vector<std::string> result;
    for (const Record& record : records) result.push_back(record.text);
    return result;
  }
  // The MeshError reading `file` gives, checking that it names `where`.
  static std::string error_reading(const std::string& file, const std::string& where,
                                   RecordOptions options = {}) {
    try {
      read_all({file}, std::move(options));
    } catch (const MeshError& error) {
      EXPECT_EQ(error.context().where, where) << error.what();
      return error.what();
    }
    ADD_FAILURE() << "no error reading " << file;
    return "";
  }
  static void expect_holds(const std::string& message, const std::string& needle) {
    EXPECT_NE(message.find(needle), std::string::npos) << "'" << needle << "' not in: " << message;
  }
  // `bytes` written as `name` fail at `line`, the message holding `needle`; returns the message.
  std::string expect_line_error(const std::string& name, const std::string& bytes, int line,
                                const std::string& needle) const {
    const std::string file = write(name, bytes);
    const std::string message = error_reading(file, file + ":" + std::to_string(line));
    expect_holds(message, needle);
    return message;
  }
};

// Documents with escapes, non-ASCII text, other columns around the text, a blank line and CRLF endings.
const char* const kJsonLines =
    "{\"id\": 1, \"text\": \"In the beginning\"}\n"
    "{\"text\": \"caf\\u00e9 \xe6\x97\xa5\xe6\x9c\xac \\\"quoted\\\"\\nsecond line\", \"meta\": {\"a\": [1, "
    "2]}}\r\n"
    "\n"
    "   \t\n"
    "{\"meta\": null, \"text\": \"\"}\n"
    "{\"text\": \"no newline at the end\"}";
const std::vector<std::string> kDocuments = {"In the beginning",
                                             "caf\xc3\xa9 \xe6\x97\xa5\xe6\x9c\xac \"quoted\"\nsecond line",
                                             "", "no newline at the end"};

TEST_F(RecordReaderTest, JsonLinesGiveTheTextColumnLineByLine) {
  const std::string file = write("docs.jsonl", kJsonLines);
  const std::vector<Record> records = read_all({file});
  EXPECT_EQ(texts(records), kDocuments);
  ASSERT_EQ(records.size(), 4u);
  EXPECT_EQ(records[0].line, 1u);
  EXPECT_EQ(records[1].line, 2u);
  EXPECT_EQ(records[2].line, 5u);  // blank lines 3 and 4 are counted, not read
  EXPECT_EQ(records[3].line, 6u);
  for (const Record& record : records) EXPECT_EQ(record.file, 0u);
}

TEST_F(RecordReaderTest, PlainGzipAndZstdGiveTheSameDocumentsAtAnyChunkSize) {
  MESHTRAIN_NEEDS_TOOL("gzip");
  MESHTRAIN_NEEDS_TOOL("zstd");
  const std::string plain = write("docs.jsonl", kJsonLines);
  const std::string gzip = compress("gzip -n", plain, "docs.jsonl.gz");
  const std::string zstd = compress("zstd -q", plain, "docs.jsonl.zst");
  for (const size_t chunk : {size_t{1}, size_t{3}, size_t{16}, kDefaultChunkBytes}) {
    RecordOptions options;
    options.chunk_bytes = chunk;
    for (const std::string& file : {plain, gzip, zstd}) {
      const std::vector<Record> records = read_all({file}, options);
      EXPECT_EQ(texts(records), kDocuments) << file << " in chunks of " << chunk;
      ASSERT_EQ(records.size(), 4u);
      EXPECT_EQ(records[3].line, 6u);
    }
  }
}

TEST_F(RecordReaderTest, AFileLargerThanAChunkStreamsEveryLineWhole) {
  MESHTRAIN_NEEDS_TOOL("zstd");
  // 3 MiB and more over lines of many lengths, so that lines straddle the 1 MiB chunks (and the 4093-byte
  // ones, a prime, at every offset).
  std::string bytes;
  std::vector<std::string> expected;
  for (int i = 0; bytes.size() < 3 * kDefaultChunkBytes + 1000; ++i) {
    expected.push_back("document " + std::to_string(i) + " " +
                       std::string(static_cast<size_t>(i * 37 % 3001), 'x'));
    bytes += "{\"text\": \"" + expected.back() + "\"}\n";
  }
  const std::string plain = write("large.jsonl", bytes);
  const std::string zstd = compress("zstd -q", plain, "large.jsonl.zst");
  for (const size_t chunk : {size_t{4093}, kDefaultChunkBytes}) {
    RecordOptions options;
    options.chunk_bytes = chunk;
    EXPECT_EQ(texts(read_all({plain}, options)), expected) << chunk;
    EXPECT_EQ(texts(read_all({zstd}, options)), expected) << chunk;
  }
}

TEST_F(RecordReaderTest, TextFilesAreOneDocumentEachInTheGivenOrder) {
  const std::string a = write("a.txt", "all of file a\nits second line\n");
  const std::string b = write("b.jsonl", "{\"text\": \"b1\"}\n{\"text\": \"b2\"}\n");
  const std::string c = write("c.txt", "file c");
  const std::vector<Record> records = read_all({a, b, c});
  EXPECT_EQ(texts(records),
            (std::vector<std::string>{"all of file a\nits second line\n", "b1", "b2", "file c"}));
  EXPECT_EQ(records[0].file, 0u);
  EXPECT_EQ(records[0].line, 0u);
  EXPECT_EQ(records[2].file, 1u);
  EXPECT_EQ(records[2].line, 2u);
  EXPECT_EQ(records[3].file, 2u);
  // The text files' rules are corpus.h's: an empty or binary .txt is refused.
  expect_holds(error_reading(write("empty.txt", ""), path("empty.txt")), "an empty file");
  expect_holds(error_reading(write("binary.txt", std::string("ab\0cd", 5)), path("binary.txt")),
               "a NUL byte");
}

TEST_F(RecordReaderTest, AnotherColumnIsRead) {
  RecordOptions options;
  options.column = "content";
  const std::string file = write("docs.jsonl", "{\"text\": 1, \"content\": \"the body\"}\n");
  EXPECT_EQ(texts(read_all({file}, options)), std::vector<std::string>{"the body"});
  expect_holds(error_reading(file, file + ":1"), "a string column 'text'");
}

TEST_F(RecordReaderTest, ARepeatedColumnKeepsItsLastValueAsAParsedObjectDoes) {
  const std::string file = write("repeated.jsonl",
                                 "{\"text\": \"first\", \"text\": \"last\"}\n"
                                 "{\"text\": 1, \"text\": \"only the last counts\"}\n"
                                 "{\"text\": {\"nested\": {\"text\": \"not this\"}}, \"text\": \"this\"}\n");
  EXPECT_EQ(texts(read_all({file})), (std::vector<std::string>{"last", "only the last counts", "this"}));
  const std::string last_not_string = write("last.jsonl", "{\"text\": \"first\", \"text\": [1]}\n");
  expect_holds(error_reading(last_not_string, last_not_string + ":1"), "found a array: [1]");
}

// decode()'s fast column scanner against nlohmann's parser, the independent reference: on every line, the
// same text, or an error where the parser refuses the line (or it has no string column).
void expect_decoded_as_parsed(const RecordReader& reader, const std::string& line) {
  std::optional<std::string> parsed;
  try {
    const nlohmann::json object = nlohmann::json::parse(line);
    if (object.is_object() && object.contains("text") && object["text"].is_string()) parsed = object["text"];
  } catch (const nlohmann::json::exception&) {
  }
  Record record;
  record.text = line;
  record.undecoded = true;
  record.line = 1;
  std::optional<std::string> decoded;
  try {
    reader.decode(record);
    decoded = record.text;
  } catch (const MeshError&) {
  }
  EXPECT_EQ(decoded, parsed) << line;
}

TEST_F(RecordReaderTest, TheColumnIsTakenAsAJsonParserReadsItOnEveryLine) {
  const RecordReader reader({write("any.jsonl", "{}\n")}, RecordOptions{});
  const std::vector<std::string> lines = {
      R"({"text": "plain"})",
      R"( {"id":1,"text":"a\"b\\c\/d\b\f\n\r\t"} )",
      R"({"text": "\u00e9\u4e2d\ud83d\ude80"})",
      R"({"text": "\ud83d"})",
      R"({"text": "\ude80"})",
      R"({"text": "\ud83d\u0041"})",
      R"({"text": "\u0000"})",
      R"({"text": "\x"})",
      R"({"text": "\u12G4"})",
      "{\"text\": \"tab\there\"}",
      R"({"meta": {"a": [1, -2.5, 0, true, false, null, {"b": []}]}, "text": "t"})",
      R"({"n": 1e400, "text": "t"})",
      R"({"n": 1E2, "text": "t"})",
      R"({"n": 01, "text": "t"})",
      R"({"n": -, "text": "t"})",
      R"({"n": 1., "text": "t"})",
      R"({"n": .5, "text": "t"})",
      R"({"n": -0.0, "text": "t"})",
      R"({"text": "t",})",
      R"({"text": "t"} x)",
      R"({"text": "t"}})",
      R"({"text" "t"})",
      R"({text: "t"})",
      R"({"text": 't'})",
      R"([{"text": "t"}])",
      R"({"text": "t", "text": 2})",
      R"({"text": 2, "text": "t"})",
      R"({"te\u0078t": "escaped key"})",
      R"({"text": tru})",
      R"({"a": nul, "text": "t"})",
      R"({"a": [1,], "text": "t"})",
      R"({"a": [,1], "text": "t"})",
      R"({"a": {"b" 1}, "text": "t"})",
      "\xEF\xBB\xBF{\"text\": \"after a BOM\"}",
      "{\"text\": \"t\"}\r",
      R"({"text": "unterminated)",
      R"({"text": "t")",
      R"({})",
      std::string(200, '[') + std::string(200, ']'),
      R"({"a": )" + std::string(100, '[') + std::string(100, ']') + R"(, "text": "deep"})",
      R"({"n": )" + std::string(400, '7') + R"(, "text": "long number"})"};
  for (const std::string& line : lines) expect_decoded_as_parsed(reader, line);
  // Random edits of valid lines with JSON's own characters: many malformed, some still valid.
  const std::string alphabet = "{}[]\",:\\/ 0123456789.-+eEtfnulrasbu\t";
  std::mt19937 random(38);
  for (int trial = 0; trial < 20000; ++trial) {
    std::string line = lines[trial % 3];
    for (int edit = 0, edits = 1 + static_cast<int>(random() % 3); edit < edits; ++edit) {
      const size_t at = random() % (line.size() + 1);
      const char c = alphabet[random() % alphabet.size()];
      switch (random() % 3) {
        case 0:
          line.insert(line.begin() + static_cast<std::ptrdiff_t>(at), c);
          break;
        case 1:
          if (at < line.size()) line.erase(at, 1);
          break;
        default:
          if (at < line.size()) line[at] = c;
      }
    }
    expect_decoded_as_parsed(reader, line);
  }
}

TEST_F(RecordReaderTest, MalformedLinesNameTheFileAndLine) {
  const std::string message =
      expect_line_error("bad.jsonl", "{\"text\": \"fine\"}\n\n{\"text\": \"unterminated}\n", 3,
                        "expected one JSON object per line (JSON Lines), found malformed JSON");
  expect_holds(message, "fix or remove line 3 of " + path("bad.jsonl"));
  expect_line_error("huge.jsonl", "{\"text\": \"fine\", \"score\": 1e999}\n", 1,
                    "found malformed JSON: [json.exception.out_of_range.406]");
  expect_line_error("array.jsonl", "[\"text\", \"a list\"]\n", 1,
                    "found a JSON array: [\"text\",\"a list\"]");
}

TEST_F(RecordReaderTest, AMissingOrNonStringColumnSaysWhatWasFound) {
  const std::string message = expect_line_error(
      "missing.jsonl", "{\"text\": \"ok\"}\n{\"body\": \"x\", \"id\": 7}\n", 2,
      "expected a string column 'text', found no such column; the line's columns: 'body', 'id'");
  expect_holds(message, "train_data_columns=COLUMN");
  expect_line_error("number.jsonl", "{\"text\": 42}\n", 1, "found a number: 42");
  expect_line_error("null.jsonl", "{\"text\": null}\n", 1, "found a null: null");
  expect_line_error("object.jsonl", "{\"text\": {\"en\": \"hello\"}}\n", 1,
                    "found a object: {\"en\":\"hello\"}");
}

TEST_F(RecordReaderTest, InvalidUtf8NamesTheByteOffset) {
  // Line 2 starts at byte 14; its invalid byte (Latin-1 e-acute, a lead byte without continuation) is its
  // 14th.
  const std::string file = write("latin1.jsonl", "{\"text\": \"a\"}\n{\"text\": \"caf\xe9\"}\n");
  const std::string message = error_reading(file, file + ":2");
  expect_holds(message, "invalid UTF-8 at byte offset 27 of the (decompressed) file, byte 13 of the line");
  expect_holds(message, "iconv -t UTF-8");
}

TEST_F(RecordReaderTest, AFileWithoutDocumentsIsRefused) {
  const std::string empty = write("empty.jsonl", "");
  expect_holds(error_reading(empty, empty),
               "expected at least one document (a JSON object per line), found an empty file");
  const std::string blank = write("blank.jsonl", "\n  \n\r\n");
  expect_holds(error_reading(blank, blank), "found 3 blank lines");
}

TEST_F(RecordReaderTest, ADamagedCompressedFileFailsThroughTheReader) {
  MESHTRAIN_NEEDS_TOOL("gzip");
  const std::string plain = write("docs.jsonl", kJsonLines);
  const std::string gzip = compress("gzip -n", plain, "docs.jsonl.gz");
  std::filesystem::resize_file(gzip, std::filesystem::file_size(gzip) - 4);  // the trailer's size field cut
  expect_holds(error_reading(gzip, gzip), "the file ends inside it at byte offset");
}

class SourceFilesTest : public RecordReaderTest {};

TEST_F(SourceFilesTest, FormatsFollowTheName) {
  EXPECT_EQ(record_format_of("a.txt"), RecordFormat::text);
  EXPECT_EQ(record_format_of("a.jsonl"), RecordFormat::json_lines);
  EXPECT_EQ(record_format_of("a.jsonl.gz"), RecordFormat::json_lines);
  EXPECT_EQ(record_format_of("a.jsonl.zst"), RecordFormat::json_lines);
  EXPECT_FALSE(record_format_of("a.json"));
  EXPECT_FALSE(record_format_of("a.txt.gz"));
  EXPECT_EQ(record_format_of("a.parquet"), RecordFormat::parquet);
  EXPECT_FALSE(record_format_of("a.parquet.gz"));
}

TEST_F(SourceFilesTest, AFolderGivesItsFilesRecursivelyInPathOrder) {
  write("data/b.jsonl", "{}");
  write("data/a/z.jsonl.zst", "");
  write("data/a/y.txt", "y");
  write("data/.hidden.jsonl", "{}");
  write("data/.cache/x.jsonl", "{}");
  const std::string folder = path("data");
  EXPECT_EQ(resolve_source_files(folder, "dataset_path"),
            (std::vector<std::string>{folder + "/a/y.txt", folder + "/a/z.jsonl.zst", folder + "/b.jsonl"}));
  EXPECT_EQ(resolve_source_files(folder + "/b.jsonl", "dataset_path"),
            std::vector<std::string>{folder + "/b.jsonl"});
}

TEST_F(SourceFilesTest, AGlobGivesItsMatchesInPathOrder) {
  for (const char* name : {"shard_10.jsonl.zst", "shard_02.jsonl.zst", "Shard_03.jsonl.zst", "other.jsonl"}) {
    write(std::string("data/") + name, "");
  }
  write("data/more/shard_01.jsonl.zst", "");
  const std::string folder = path("data");
  // Bytewise order ('S' before 's'), whatever the locale's collation.
  EXPECT_EQ(resolve_source_files(folder + "/*hard_*.jsonl.zst", "dataset_path"),
            (std::vector<std::string>{folder + "/Shard_03.jsonl.zst", folder + "/shard_02.jsonl.zst",
                                      folder + "/shard_10.jsonl.zst"}));
  // A folder the glob matches gives its files.
  EXPECT_EQ(resolve_source_files(folder + "/m*", "dataset_path"),
            std::vector<std::string>{folder + "/more/shard_01.jsonl.zst"});
}

TEST_F(SourceFilesTest, WhatNamesNoDataFileIsRefused) {
  write("data/a.jsonl", "{}");
  write("data/notes.md", "notes");
  const std::string folder = path("data");
  std::string message = error_of([&] { resolve_source_files(folder + "/*.jsonl.zst", "dataset_path"); });
  expect_holds(message, folder + "/*.jsonl.zst: expected a glob matching at least one file, found no match");
  message = error_of([&] { resolve_source_files(folder, "dataset_path"); });
  expect_holds(message, folder + "/notes.md: expected a data file named .txt");
  expect_holds(message, ".jsonl.zst");
  expect_holds(message, "(in " + folder + ")");
  message = error_of([&] { resolve_source_files(path("missing.jsonl"), "dataset_path"); });
  expect_holds(message, "nothing at that path");
  std::filesystem::create_directories(path("empty/.hidden"));
  message = error_of([&] { resolve_source_files(path("empty"), "dataset_path"); });
  expect_holds(message, "expected a folder holding at least one data file, found no files");
  message = error_of([&] { RecordReader({path("data/notes.md")}, {}); });
  expect_holds(message, "notes.md: expected a data file named");
}

class FingerprintTest : public RecordReaderTest {};

TEST_F(FingerprintTest, ChangesWithTheFilesSizeHeadAndTail) {
  const std::string small = write("small.jsonl", "{\"text\": \"one\"}\n");
  std::string large_bytes(300 * 1024, 'a');
  const std::string large = write("large.jsonl", large_bytes);
  const std::vector<FileFingerprint> saved = fingerprint_files({small, large});
  ASSERT_EQ(saved.size(), 2u);
  EXPECT_EQ(saved[0].bytes, 16u);
  EXPECT_EQ(saved[1].bytes, 300u * 1024);
  EXPECT_EQ(fingerprint_files({small, large}), saved);  // the same files, the same fingerprint
  EXPECT_EQ(fingerprint_change(saved, saved), "");
  EXPECT_EQ(fingerprint_from_json(fingerprint_json(saved), "test"), saved);

  write("small.jsonl", "{\"text\": \"two\"}\n");  // same size, other bytes
  EXPECT_EQ(fingerprint_change(saved, fingerprint_files({small, large})),
            small + " changed content (same size, its first or last 64 KiB differ)");
  write("small.jsonl", "{\"text\": \"one\"}\n{\"text\": \"more\"}\n");
  expect_holds(fingerprint_change(saved, fingerprint_files({small, large})),
               small + " changed size: 16 bytes, now");
  write("small.jsonl", "{\"text\": \"one\"}\n");
  for (const size_t at : {size_t{10}, large_bytes.size() - 10}) {  // in the head, in the tail
    large_bytes[at] = 'b';
    write("large.jsonl", large_bytes);
    expect_holds(fingerprint_change(saved, fingerprint_files({small, large})), large + " changed content");
    large_bytes[at] = 'a';
  }
  write("large.jsonl", large_bytes);
  EXPECT_EQ(fingerprint_files({small, large}), saved);

  const std::string added = write("added.jsonl", "{}");
  expect_holds(fingerprint_change(saved, fingerprint_files({small, large, added})),
               "1 file(s) added, the first " + added);
  expect_holds(fingerprint_change(saved, fingerprint_files({small})),
               "1 file(s) removed, the first " + large);
  expect_holds(fingerprint_change(saved, fingerprint_files({added, large})), "file 1 was " + small);
  expect_holds(error_of([&] {
                 fingerprint_from_json({{"files", {{{"path", "a"}}}}}, "cursor");
               }),
               "cursor: expected");
}

}  // namespace
}  // namespace meshtrain
