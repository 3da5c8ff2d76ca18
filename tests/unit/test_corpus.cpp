// Corpora: the KJV parses into 1189 chapters with a fixed, disjoint split; user text files load in sorted
// order and bad ones (missing, empty, binary) are MeshErrors naming the file.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <set>
#include <string>
#include <vector>

#include "meshtrain/core/error.h"
#include "meshtrain/data/corpus.h"

namespace meshtrain {
namespace {

namespace fs = std::filesystem;

class CorpusTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = fs::temp_directory_path() /
           ("meshtrain_corpus_" + std::to_string(::getpid()) + "_" + std::string(info->name()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::string write(const std::string& name, const std::string& bytes) const {
    const fs::path file = dir_ / name;
    fs::create_directories(file.parent_path());
    std::ofstream out(file, std::ios::binary);
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    return file.string();
  }

  // Expects loading `path` to fail with a MeshError whose `where` is `file` and whose text holds `needle`.
  static void expect_error(const std::string& path, const std::string& file, const std::string& needle) {
    try {
      load_text_documents(path);
      FAIL() << "expected an error for " << path;
    } catch (const MeshError& error) {
      EXPECT_EQ(error.context().where, file) << error.what();
      EXPECT_NE(std::string(error.what()).find(needle), std::string::npos) << error.what();
    }
  }

  fs::path dir_;
};

TEST(Corpus, ParsesBibleOutput) {
  const std::string output =
      "Ge1:1 In the beginning God created the heaven and the earth.\n"
      "Ge1:2 And the earth was without form.\n"
      "Ge2:1 Thus the heavens and the earth were finished.\n"
      "1Sm1:1 Now there was a certain man.\n"
      "SSol1:1 The song of songs, which is Solomon's.\n";
  const std::vector<Document> chapters = parse_bible_output(output);
  ASSERT_EQ(chapters.size(), 4u);
  EXPECT_EQ(chapters[0].name, "Ge 1");
  EXPECT_EQ(chapters[0].text,
            "In the beginning God created the heaven and the earth.\nAnd the earth was without form.");
  EXPECT_EQ(chapters[1].name, "Ge 2");
  EXPECT_EQ(chapters[2].name, "1Sm 1");
  EXPECT_EQ(chapters[2].text, "Now there was a certain man.");
  EXPECT_EQ(chapters[3].name, "SSol 1");
  EXPECT_THROW(parse_bible_output("not a verse line\n"), MeshError);
}

TEST(Corpus, KjvLoadsWithFixedSplit) {
  if (!kjv_available())
    GTEST_SKIP() << "the 'bible' program is absent (apt-get install bible-kjv bible-kjv-text)";
  const Corpus corpus = load_kjv_corpus();
  EXPECT_EQ(corpus.source, "kjv");
  EXPECT_EQ(corpus.train.size() + corpus.validation.size(), 1189u);
  EXPECT_EQ(corpus.validation.size(), 59u);
  size_t bytes = 0;
  std::set<std::string> names;
  for (const auto* split : {&corpus.train, &corpus.validation}) {
    for (const Document& document : *split) {
      bytes += document.text.size();
      EXPECT_TRUE(names.insert(document.name).second) << "duplicate " << document.name;
      EXPECT_EQ(document.text.find("Ge1:1"), std::string::npos);
      EXPECT_FALSE(document.text.empty());
    }
  }
  EXPECT_GT(bytes, 4'000'000u);  // ~4.2 MB of verse text
  EXPECT_LT(bytes, 4'500'000u);
  EXPECT_EQ(corpus.train.front().name, "Ge 1");
  EXPECT_EQ(corpus.train.front().text.substr(0, 16), "In the beginning");
  EXPECT_EQ(corpus.train.back().name, "Rev 22");
  EXPECT_EQ(corpus.validation.front().name, "Ge 20");  // chapter index 19
  // No verse line keeps its reference.
  for (const Document& document : corpus.train) {
    ASSERT_EQ(document.text.find(":1 "), std::string::npos) << document.name;
  }
  // Deterministic: a second load gives the same split.
  const Corpus again = load_kjv_corpus();
  ASSERT_EQ(again.validation.size(), corpus.validation.size());
  for (size_t i = 0; i < again.validation.size(); ++i) {
    EXPECT_EQ(again.validation[i].name, corpus.validation[i].name);
    EXPECT_EQ(again.validation[i].text, corpus.validation[i].text);
  }
}

TEST_F(CorpusTest, FolderLoadsSortedAndSkipsHidden) {
  write("b.txt", "second");
  write("a.txt", "first");
  write("sub/c.md", "third\xC3\xA9");  // é: valid UTF-8
  write(".hidden", "skip me");
  write(".git/objects/x", std::string("\0\1", 2));  // binary, but hidden
  const std::vector<Document> documents = load_text_documents(dir_.string());
  ASSERT_EQ(documents.size(), 3u);
  EXPECT_EQ(documents[0].text, "first");
  EXPECT_EQ(documents[1].text, "second");
  EXPECT_EQ(documents[2].text, "third\xC3\xA9");
  EXPECT_EQ(documents[2].name, (dir_ / "sub/c.md").string());
}

TEST_F(CorpusTest, SingleFileIsOneDocument) {
  const std::string file = write("one.txt", "para one\n\npara two\n");
  const std::vector<Document> documents = load_text_documents(file);
  ASSERT_EQ(documents.size(), 1u);
  EXPECT_EQ(documents[0].text, "para one\n\npara two\n");
}

TEST_F(CorpusTest, MissingPath) {
  const std::string missing = (dir_ / "nope").string();
  expect_error(missing, missing, "No such file");
}

TEST_F(CorpusTest, EmptyFile) {
  const std::string file = write("empty.txt", "");
  expect_error(file, file, "empty file");
  write("good.txt", "fine");
  expect_error(dir_.string(), file, "empty file");  // inside a folder: the error names the file
}

TEST_F(CorpusTest, EmptyFolder) {
  fs::create_directories(dir_ / "nothing");
  write("nothing/.hidden", "x");
  expect_error((dir_ / "nothing").string(), (dir_ / "nothing").string(), "no files");
}

TEST_F(CorpusTest, BinaryFiles) {
  const std::string nul = write("nul.bin", std::string("text\0more", 9));
  expect_error(nul, nul, "NUL byte at offset 4");
  const std::string latin1 = write("latin1.txt", "caf\xE9 au lait");
  expect_error(latin1, latin1, "invalid UTF-8 at byte offset 3");
  const std::string overlong = write("overlong.txt", "\xC0\xAF");
  expect_error(overlong, overlong, "invalid UTF-8");
  const std::string surrogate = write("surrogate.txt", "\xED\xA0\x80");
  expect_error(surrogate, surrogate, "invalid UTF-8");
  const std::string cut = write("cut.txt", "ok \xE2\x82");  // truncated at the end of the whole file
  expect_error(cut, cut, "invalid UTF-8");
}

TEST_F(CorpusTest, OnlyTheFirst64KiBIsSniffed) {
  // A multi-byte character straddling the 64 KiB limit is fine; bad bytes after the limit are not looked at.
  std::string text(65535, 'a');
  text += "\xE2\x82\xAC";  // euro sign, starts at byte 65535
  text += std::string("\xFF", 1);
  const std::string file = write("long.txt", text);
  EXPECT_EQ(load_text_documents(file).size(), 1u);
}

TEST_F(CorpusTest, UnreadableFile) {
  if (::geteuid() == 0) GTEST_SKIP() << "root reads any file";
  const std::string file = write("secret.txt", "hidden text");
  fs::permissions(file, fs::perms::none);
  expect_error(file, file, "Permission denied");
}

TEST(Corpus, SplitIsDeterministicAndDisjoint) {
  std::vector<Document> documents;
  for (int i = 0; i < 40; ++i)
    documents.push_back(Document{"d" + std::to_string(i), "text " + std::to_string(i)});
  const Corpus a = split_documents("x", documents, 0.1);
  const Corpus b = split_documents("x", documents, 0.1);
  ASSERT_EQ(a.validation.size(), 4u);
  EXPECT_EQ(a.train.size(), 36u);
  std::set<std::string> seen;
  for (const Document& d : a.validation) seen.insert(d.name);
  for (const Document& d : a.train) EXPECT_FALSE(seen.count(d.name)) << d.name;
  for (size_t i = 0; i < a.validation.size(); ++i) EXPECT_EQ(a.validation[i].name, b.validation[i].name);
  EXPECT_EQ(a.validation[0].name, "d5");  // floor(0.5 * 40 / 4)
  // Small corpora still get one validation document; zero fraction gives none.
  EXPECT_EQ(split_documents("x", {documents[0], documents[1]}, 0.05).validation.size(), 1u);
  EXPECT_EQ(split_documents("x", documents, 0.0).validation.size(), 0u);
  EXPECT_THROW(split_documents("x", {documents[0]}, 0.1), MeshError);
  EXPECT_THROW(split_documents("x", documents, 1.0), MeshError);
  EXPECT_THROW(split_documents("x", documents, -0.1), MeshError);
}

// Hints name the caller's own settings: prepare's flags, or a train run's config keys (issue 37: a train run
// on one text file was told to pass --validation-fraction, a prepare flag, and to check --corpus).
TEST_F(CorpusTest, HintsNameTheCallersSettings) {
  const std::string file = write("one.txt", "in the beginning");
  const auto hint_of = [](const std::function<void()>& action) {
    try {
      action();
    } catch (const MeshError& error) {
      return error.context().hint;
    }
    ADD_FAILURE() << "expected a MeshError";
    return std::string();
  };
  const std::string prepare = hint_of([&] { load_corpus(file, 0.05); });
  EXPECT_NE(prepare.find("--validation-fraction 0"), std::string::npos) << prepare;
  const std::string train = hint_of([&] { load_corpus(file, 0.05, kTrainCorpusSettings); });
  EXPECT_NE(train.find("point dataset_path at a folder of at least 2 text files"), std::string::npos)
      << train;
  EXPECT_EQ(train.find("--"), std::string::npos) << train;
  const std::string missing = (dir_ / "missing").string();
  EXPECT_EQ(hint_of([&] { load_corpus(missing, 0.05); }), "check --corpus");
  EXPECT_EQ(hint_of([&] { load_corpus(missing, 0.05, kTrainCorpusSettings); }), "check dataset_path");
  const std::string binary = write("binary.txt", std::string("a\0b", 3));
  EXPECT_NE(hint_of([&] { load_text_documents(binary, kTrainCorpusSettings); }).find("point dataset_path at"),
            std::string::npos);
}

}  // namespace
}  // namespace meshtrain
