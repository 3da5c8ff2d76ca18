// Reads the KJV (through Debian's `bible` program) or the user's text files into documents and splits
// them into train and validation deterministically (no randomness at all: the split is by position).
#include "meshtrain/data/corpus.h"

#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <system_error>

#include "meshtrain/core/error.h"
#include "meshtrain/data/records/source_files.h"
#include "meshtrain/data/records/text_files.h"

namespace meshtrain {
namespace {

namespace fs = std::filesystem;

constexpr const char* kInstallHint = "install the KJV with: apt-get install bible-kjv bible-kjv-text";

bool is_digit(char c) {
  return c >= '0' && c <= '9';
}
bool is_letter(char c) {
  return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z');
}

struct VerseReference {
  std::string_view book;     // "Ge", "1Sm", "SSol"
  std::string_view chapter;  // "1"
};

// Parses "Ge1:1" / "1Sm3:10" at the start of `line`; returns the length of the reference or 0.
size_t parse_reference(std::string_view line, VerseReference& reference) {
  size_t i = 0;
  if (i < line.size() && is_digit(line[i])) ++i;  // "1Sm", "2Chr", "3Jn"
  const size_t letters = i;
  while (i < line.size() && is_letter(line[i])) ++i;
  if (i == letters) return 0;
  reference.book = line.substr(0, i);
  const size_t chapter_start = i;
  while (i < line.size() && is_digit(line[i])) ++i;
  if (i == chapter_start || i >= line.size() || line[i] != ':') return 0;
  reference.chapter = line.substr(chapter_start, i - chapter_start);
  const size_t verse_start = ++i;
  while (i < line.size() && is_digit(line[i])) ++i;
  if (i == verse_start) return 0;
  return i;
}

}  // namespace

bool kjv_available() {
  const char* search_path = std::getenv("PATH");
  std::string_view rest = search_path != nullptr ? search_path : "/usr/bin:/bin";
  while (true) {
    const size_t colon = rest.find(':');
    std::string folder(rest.substr(0, colon));
    if (folder.empty()) folder = ".";
    if (::access((folder + "/bible").c_str(), X_OK) == 0) return true;
    if (colon == std::string_view::npos) return false;
    rest.remove_prefix(colon + 1);
  }
}

std::vector<Document> parse_bible_output(std::string_view output, const std::string& where) {
  std::vector<Document> chapters;
  std::string current_book, current_chapter;
  size_t line_number = 0;
  while (!output.empty()) {
    const size_t end = output.find('\n');
    std::string_view line = output.substr(0, end);
    output.remove_prefix(end == std::string_view::npos ? output.size() : end + 1);
    ++line_number;
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (line.empty()) continue;
    VerseReference reference;
    const size_t length = parse_reference(line, reference);
    if (length == 0 || length >= line.size() || line[length] != ' ') {
      fail(where + ":" + std::to_string(line_number), "a verse line like \"Ge1:1 In the beginning ...\"",
           "\"" + std::string(line.substr(0, 60)) + "\"",
           "the bible-kjv output format changed; reinstall bible-kjv bible-kjv-text");
    }
    std::string_view verse = line.substr(length + 1);
    while (!verse.empty() && verse.front() == ' ') verse.remove_prefix(1);
    if (reference.book != current_book || reference.chapter != current_chapter) {
      current_book = reference.book;
      current_chapter = reference.chapter;
      chapters.push_back(Document{current_book + " " + current_chapter, std::string(verse)});
    } else {
      chapters.back().text += '\n';
      chapters.back().text += verse;
    }
  }
  return chapters;
}

Corpus load_kjv_corpus(const CorpusSettingNames& settings) {
  if (!kjv_available()) {
    fail("the default corpus (the King James Bible)", "the program 'bible' on PATH", "no 'bible' program",
         std::string(kInstallHint) + ", or " + settings.give_path + " with your own text");
  }
  // Fixed arguments, no user input: nothing to quote. -f: one verse per line, never wrapped.
  FILE* pipe = ::popen("bible -f gen1:1-rev22:21 2>&1", "r");
  if (pipe == nullptr) {
    fail("bible -f gen1:1-rev22:21", "the program to start", std::system_category().message(errno),
         kInstallHint);
  }
  std::string output;
  char buffer[1 << 16];
  size_t got;
  while ((got = std::fread(buffer, 1, sizeof buffer, pipe)) > 0) output.append(buffer, got);
  const int status = ::pclose(pipe);
  if (status != 0) {
    fail("bible -f gen1:1-rev22:21", "exit status 0",
         "status " + std::to_string(WIFEXITED(status) ? WEXITSTATUS(status) : status) + ": " +
             output.substr(0, 200),
         kInstallHint);
  }
  std::vector<Document> chapters = parse_bible_output(output, "bible -f gen1:1-rev22:21");
  if (chapters.size() != 1189) {
    fail("bible -f gen1:1-rev22:21", "the 1189 chapters of the KJV",
         std::to_string(chapters.size()) + " chapters", kInstallHint);
  }
  Corpus corpus;
  corpus.source = "kjv";
  for (size_t index = 0; index < chapters.size(); ++index) {
    const bool validation = index % kKjvValidationPeriod == kKjvValidationResidue;
    (validation ? corpus.validation : corpus.train).push_back(std::move(chapters[index]));
  }
  return corpus;
}

std::vector<Document> load_text_documents(const std::string& path, const CorpusSettingNames& settings) {
  std::error_code error;
  const fs::file_status status = fs::status(path, error);
  if (error || !fs::exists(status)) {
    fail(path, "an existing text file or folder of text files",
         error ? error.message() : std::string("nothing at that path"), "check " + settings.path);
  }
  std::vector<std::string> files;
  if (fs::is_directory(status)) {
    files = files_under(path);
    if (files.empty()) {
      fail(path, "a folder holding at least one text file", "no files (hidden ones are skipped)",
           "put .txt files in it or point " + settings.path + " elsewhere");
    }
  } else {
    files.push_back(path);
  }
  std::vector<Document> documents;
  documents.reserve(files.size());
  for (const std::string& file : files)
    documents.push_back(Document{file, read_text_document(file, settings.path)});
  return documents;
}

Corpus split_documents(const std::string& source, std::vector<Document> documents, double validation_fraction,
                       const CorpusSettingNames& settings) {
  if (!(validation_fraction >= 0.0 && validation_fraction < 1.0)) {
    fail("--validation-fraction", "a fraction in [0, 1)", to_text(validation_fraction), "e.g. 0.05");
  }
  const size_t n = documents.size();
  size_t count = 0;
  if (validation_fraction > 0.0) {
    if (n < 2) {
      fail(source, "at least 2 documents (files) to hold out a validation split", std::to_string(n),
           settings.too_few_documents);
    }
    count = static_cast<size_t>(std::llround(static_cast<double>(n) * validation_fraction));
    count = std::clamp<size_t>(count, 1, n - 1);
  }
  std::vector<bool> is_validation(n, false);
  for (size_t k = 0; k < count; ++k) {
    is_validation[static_cast<size_t>((static_cast<double>(k) + 0.5) * static_cast<double>(n) /
                                      static_cast<double>(count))] = true;
  }
  Corpus corpus;
  corpus.source = source;
  for (size_t i = 0; i < n; ++i) {
    (is_validation[i] ? corpus.validation : corpus.train).push_back(std::move(documents[i]));
  }
  return corpus;
}

Corpus load_corpus(const std::string& path, double validation_fraction, const CorpusSettingNames& settings) {
  if (path.empty()) return load_kjv_corpus(settings);
  return split_documents(path, load_text_documents(path, settings), validation_fraction, settings);
}

}  // namespace meshtrain
