// Raw text corpora for `meshtrain prepare`: the default King James Bible (Debian's bible-kjv) split by
// chapter, or the user's own text files. Only reading and splitting happen here; tokenizing is prepare's.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace meshtrain {

struct Document {
  std::string name;  // "Ge 1" for a KJV chapter, the file path for a user file
  std::string text;
};

struct Corpus {
  std::string source;  // "kjv" for the default corpus, else the user's path as given
  std::vector<Document> train;
  std::vector<Document> validation;
};

// Who reads a corpus, so that its hints name the caller's own settings: `meshtrain prepare`'s flags, or the
// config keys of a train run with dataset_type=text (which holds out a fixed 5% for validation).
struct CorpusSettingNames {
  std::string path;               // the setting naming the corpus: "--corpus" / "dataset_path"
  std::string give_path;          // how to give one: "pass --corpus PATH" / "set dataset_path=PATH"
  std::string too_few_documents;  // the fix when a single document cannot be split for validation
};
inline const CorpusSettingNames kPrepareCorpusSettings{"--corpus", "pass --corpus PATH",
                                                       "add files, or pass --validation-fraction 0"};
inline const CorpusSettingNames kTrainCorpusSettings{
    "dataset_path", "set dataset_path=PATH",
    "point dataset_path at a folder of at least 2 text files (dataset_type=text holds out 5% of them, at "
    "least one, for evaluation)"};

// The KJV has 1189 chapters; every chapter whose 0-based index in canonical order (Genesis 1 = 0,
// Revelation 22 = 1188) is 19 modulo 20 goes to validation: 59 chapters (~5%), spread evenly over the Bible.
inline constexpr int kKjvValidationPeriod = 20;
inline constexpr int kKjvValidationResidue = 19;

// True when the `bible` program (package bible-kjv) can be run.
bool kjv_available();
// Runs `bible -f gen1:1-rev22:21` and parses it (parse_bible_output). Without the program, or when it fails:
// a MeshError naming the packages to install (and how to give other text instead).
Corpus load_kjv_corpus(const CorpusSettingNames& settings = kPrepareCorpusSettings);
// One document per chapter from `bible -f` output (one verse per line: "Ge1:1 In the beginning ...").
// The verse reference is stripped; a chapter's verses are joined with '\n' (one verse per line, no
// trailing newline). Lines that do not start with a reference are a MeshError naming `where`.
std::vector<Document> parse_bible_output(std::string_view output, const std::string& where = "bible output");

// A file (one document) or a folder of text files, recursively, in sorted path order; names starting with
// '.' (hidden files and folders) are skipped. Each file is one document. Missing paths, empty files or
// folders, unreadable files and binary files (a NUL byte or invalid UTF-8 in the first 64 KiB) are MeshErrors
// naming the file.
std::vector<Document> load_text_documents(const std::string& path,
                                          const CorpusSettingNames& settings = kPrepareCorpusSettings);

// Deterministic split of user documents: count = round(n * fraction) documents, at least 1 when
// fraction > 0, at most n - 1, go to validation, evenly spaced over the sorted order (document
// floor((k + 0.5) * n / count) for k < count). fraction must lie in [0, 1); fraction > 0 with a single
// document is a MeshError.
Corpus split_documents(const std::string& source, std::vector<Document> documents, double validation_fraction,
                       const CorpusSettingNames& settings = kPrepareCorpusSettings);

// Empty path: the KJV with its fixed split (validation_fraction is ignored); otherwise
// load_text_documents + split_documents. `settings` names the caller's settings in hints.
Corpus load_corpus(const std::string& path, double validation_fraction,
                   const CorpusSettingNames& settings = kPrepareCorpusSettings);

}  // namespace meshtrain
