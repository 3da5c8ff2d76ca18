// Reading tokenizer files: Hugging Face tokenizer.json (byte-level BPE) and GPT-2's encoder.json + vocab.bpe.
// Every problem with a file is a MeshError that names it.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <deque>
#include <filesystem>
#include <functional>
#include <nlohmann/json.hpp>
#include <system_error>
#include <utility>

#include "meshtrain/core/durable_file.h"
#include "meshtrain/core/error.h"
#include "meshtrain/data/records/json_string.h"
#include "meshtrain/data/tokenizer/tokenizer.h"
#include "meshtrain/data/tokenizer/tokenizer_impl.h"

namespace meshtrain {
namespace tokenizer_detail {
namespace {

using json = nlohmann::json;
// A token read from a file: the file's own bytes where it has no escapes, else decoded text its reader keeps.
using VocabEntry = std::pair<std::string_view, int64_t>;
using MergeEntry = std::pair<std::string_view, std::string_view>;

constexpr const char* kPathExpected =
    "a tokenizer.json, or a folder holding tokenizer.json or encoder.json + vocab.bpe";
constexpr const char* kHint =
    "use a byte-level BPE tokenizer (as GPT-2, Llama 3 and Qwen2/3 have), or train one with `meshtrain "
    "prepare`";

std::string json_text(const json& value) {
  std::string text = value.dump(-1, ' ', false, json::error_handler_t::replace);
  return text.size() > 80 ? text.substr(0, 77) + "..." : text;
}

// A file's bytes, mapped read-only where it can be: page-cache pages, neither copied nor zeroed (reading
// Qwen3's 11 MB tokenizer.json into a string was an eighth of its load). What a mapping cannot take (an empty
// file, a pipe, an unreadable path) is read as before, with read_file_text's errors. The mapping lives only
// while the file is loaded; tokenizer files are replaced by renaming (write_file_atomically), not rewritten
// in place under a reader.
class FileText {
 public:
  explicit FileText(const std::string& path) {
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    struct stat info {};
    if (fd >= 0 && ::fstat(fd, &info) == 0 && S_ISREG(info.st_mode) && info.st_size > 0) {
      const auto size = static_cast<size_t>(info.st_size);
      void* mapped = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE | MAP_POPULATE, fd, 0);
      if (mapped != MAP_FAILED) {
        mapped_ = mapped;
        text_ = std::string_view(static_cast<const char*>(mapped), size);
      }
    }
    if (fd >= 0) ::close(fd);
    if (mapped_ == nullptr) {
      copy_ = read_file_text(path, "tokenizer file");
      text_ = copy_;
    }
  }
  ~FileText() {
    if (mapped_ != nullptr) ::munmap(mapped_, text_.size());
  }
  FileText(const FileText&) = delete;
  FileText& operator=(const FileText&) = delete;

  std::string_view text() const { return text_; }

 private:
  void* mapped_ = nullptr;
  std::string copy_;
  std::string_view text_;
};

// ---- one-pass reader -------------------------------------------------------------------------------------

// A nlohmann SAX handler that reads the vocabulary and the merges, most of a tokenizer.json, straight into
// flat vectors, and builds an ordinary DOM of the rest. A full DOM of Qwen3's 151k vocabulary entries and
// merges costs most of the load time in allocations and frees. It reads whole files where the fast scanner
// below gives up (and so gives every error), and otherwise the rest of the file with the two sections cut
// out.
class TokenizerFileReader {
 public:
  // `whole_document_is_vocab`: GPT-2's encoder.json, which is nothing but the vocabulary object.
  explicit TokenizerFileReader(bool whole_document_is_vocab)
      : whole_document_is_vocab_(whole_document_is_vocab) {}

  json rest;  // everything but model.vocab and model.merges
  std::vector<VocabEntry> vocab;
  std::vector<MergeEntry> merges;
  std::deque<std::string> decoded;  // the tokens' text that is not the file's own (a deque never moves it)
  bool has_vocab = false;
  bool has_merges = false;
  // The first problem found; parsing stops there.
  std::string error_where;  // "model.vocab", "model.merges[3]", or "" for the document
  std::string error_expected;
  std::string error_found;

  bool whole_document_is_vocab() const { return whole_document_is_vocab_; }

  bool null() { return scalar(json(nullptr), "null"); }
  bool boolean(bool value) { return scalar(json(value), value ? "true" : "false"); }
  bool number_integer(int64_t value) {
    if (mode_ == Mode::kVocab) return vocab_id(value, std::to_string(value));
    return scalar(json(value), std::to_string(value));
  }
  bool number_unsigned(uint64_t value) {
    if (mode_ == Mode::kVocab) {
      return vocab_id(value > static_cast<uint64_t>(kMaxTokenId) ? -1 : static_cast<int64_t>(value),
                      std::to_string(value));
    }
    return scalar(json(value), std::to_string(value));
  }
  bool number_float(double value, const std::string& text) { return scalar(json(value), text); }
  bool binary(json::binary_t&) { return problem("", "JSON", "binary data"); }
  bool string(std::string& value) {
    switch (mode_) {
      case Mode::kMerges: {
        const size_t space = value.find(' ');
        // "a b": exactly one space, which byte-level tokens never contain.
        if (space == std::string::npos || space == 0 || space + 1 == value.size() ||
            value.find(' ', space + 1) != std::string::npos) {
          return problem(merge_where(), "a merge \"a b\" (two tokens, one space)", "\"" + value + "\"");
        }
        const std::string_view kept = decoded.emplace_back(std::move(value));
        merges.emplace_back(kept.substr(0, space), kept.substr(space + 1));
        return true;
      }
      case Mode::kMergePair:
        if (pair_.size() == 2) {
          return problem(merge_where(), "a merge [\"a\", \"b\"]", "more than two strings");
        }
        pair_.push_back(std::move(value));
        return true;
      default:
        return scalar(json(std::move(value)), "a string");
    }
  }
  // A vocabulary that is not an object or merges that are not an array go into the DOM like anything else,
  // so the loader can first report what matters more (such as another model type with another layout).
  bool start_object(size_t) {
    if (mode_ == Mode::kDom) {
      if ((whole_document_is_vocab_ && stack_.empty()) || capture_next_ == Mode::kVocab) {
        return enter(Mode::kVocab);
      }
      capture_next_ = Mode::kDom;
      return open(json::object());
    }
    return nested_container("an object");
  }
  bool start_array(size_t) {
    if (mode_ == Mode::kDom) {
      if (capture_next_ == Mode::kMerges) return enter(Mode::kMerges);
      capture_next_ = Mode::kDom;
      return open(json::array());
    }
    if (mode_ == Mode::kMerges) {
      mode_ = Mode::kMergePair;
      pair_.clear();
      return true;
    }
    return nested_container("an array");
  }
  bool key(std::string& name) {
    if (mode_ == Mode::kVocab) {
      key_ = std::move(name);
      return true;
    }
    // model.vocab and model.merges are captured, not put into the DOM.
    if (stack_.size() == 2 && keys_[1] == "model" && stack_[0]->is_object() &&
        (name == "vocab" || name == "merges")) {
      capture_next_ = name == "vocab" ? Mode::kVocab : Mode::kMerges;
    }
    key_ = std::move(name);
    return true;
  }
  bool end_object() {
    if (mode_ == Mode::kVocab) {
      mode_ = Mode::kDom;
      has_vocab = true;
      return true;
    }
    stack_.pop_back();
    keys_.pop_back();
    return true;
  }
  bool end_array() {
    if (mode_ == Mode::kMergePair) {
      if (pair_.size() != 2) {
        return problem(merge_where(), "a merge [\"a\", \"b\"]", "fewer than two strings");
      }
      merges.emplace_back(decoded.emplace_back(std::move(pair_[0])),
                          decoded.emplace_back(std::move(pair_[1])));
      mode_ = Mode::kMerges;
      return true;
    }
    if (mode_ == Mode::kMerges) {
      mode_ = Mode::kDom;
      has_merges = true;
      return true;
    }
    stack_.pop_back();
    keys_.pop_back();
    return true;
  }
  bool parse_error(size_t, const std::string&, const json::exception& error) {
    return problem("", "a JSON document", std::string("invalid JSON: ") + error.what());
  }

 private:
  enum class Mode { kDom, kVocab, kMerges, kMergePair };

  bool problem(const std::string& where, const std::string& expected, const std::string& found) {
    if (error_expected.empty()) {
      error_where = where;
      error_expected = expected;
      error_found = found;
    }
    return false;
  }
  std::string merge_where() const { return "model.merges[" + std::to_string(merges.size()) + "]"; }

  std::string vocab_where() const {
    return whole_document_is_vocab_ ? std::string() : std::string("model.vocab");
  }
  bool vocab_id(int64_t id, const std::string& text) {
    if (id < 0 || id > kMaxTokenId) {
      return problem(vocab_where(), "token ids from 0 to " + std::to_string(kMaxTokenId),
                     shown(key_) + ": " + text);
    }
    vocab.emplace_back(decoded.emplace_back(std::move(key_)), id);
    return true;
  }
  bool scalar(json value, const std::string& text) {
    if (mode_ == Mode::kVocab) return problem(vocab_where(), "integer token ids", shown(key_) + ": " + text);
    if (mode_ != Mode::kDom) return problem(merge_where(), "a merge \"a b\" or [\"a\", \"b\"]", text);
    capture_next_ = Mode::kDom;
    if (stack_.empty()) {
      rest = std::move(value);
    } else if (stack_.back()->is_array()) {
      stack_.back()->push_back(std::move(value));
    } else {
      (*stack_.back())[key_] = std::move(value);
    }
    return true;
  }
  bool open(json container) {
    json* slot = nullptr;
    std::string name;
    if (stack_.empty()) {
      rest = std::move(container);
      slot = &rest;
    } else if (stack_.back()->is_array()) {
      // The parent cannot grow (and move this element) before this container is closed.
      stack_.back()->push_back(std::move(container));
      slot = &stack_.back()->back();
    } else {
      slot = &((*stack_.back())[key_] = std::move(container));
      name = key_;
    }
    stack_.push_back(slot);
    keys_.push_back(std::move(name));
    return true;
  }
  bool enter(Mode mode) {
    mode_ = mode;
    capture_next_ = Mode::kDom;
    return true;
  }
  bool nested_container(const char* what) {
    if (mode_ == Mode::kVocab) return problem(vocab_where(), "integer token ids", shown(key_) + ": " + what);
    return problem(merge_where(), "a merge \"a b\" or [\"a\", \"b\"]", what);
  }

  bool whole_document_is_vocab_;
  Mode mode_ = Mode::kDom;
  Mode capture_next_ = Mode::kDom;  // the value after the key "vocab" or "merges" of "model"
  std::vector<json*> stack_;        // open containers of the DOM
  std::vector<std::string> keys_;   // the key each open container sits under ("" in arrays)
  std::string key_;                 // the last key read
  std::vector<std::string> pair_;
};

// ---- fast path -------------------------------------------------------------------------------------------

// Reads model.vocab and model.merges of a tokenizer.json (or the whole of GPT-2's encoder.json) in one pass
// over their bytes, several times faster than the SAX parse, whose lexer copies every byte one at a time. It
// answers only the plain case: the root object holds one "model" object which holds one "vocab" object of
// "token": id (ids without sign, fraction or exponent, up to kMaxTokenId) and one "merges" array of "a b"
// strings or ["a", "b"] pairs, every token valid UTF-8. For anything else (an error above all) it gives up
// and the full parse decides, so it never accepts a file the parser refuses nor reads one differently. The
// rest of the document is only walked here (strings skipped whole, so the two sections are found where the
// parser finds them); the parser reads it with the two sections cut out.
class SectionScanner : JsonCursor {
 public:
  // Decoded tokens (those with escapes) are kept in `decoded`.
  SectionScanner(std::string_view text, std::deque<std::string>& decoded)
      : JsonCursor(text.data(), text.data() + text.size()), decoded_(decoded) {}

  // GPT-2's encoder.json: the vocabulary and nothing else.
  bool whole_document_vocab(std::vector<VocabEntry>& vocab) {
    skip_space();
    if (!vocab_object(vocab)) return false;
    skip_space();
    return at_ == end_;
  }

  // tokenizer.json: model.vocab and model.merges, with where they lie in the text.
  struct Sections {
    std::vector<VocabEntry> vocab;
    std::vector<MergeEntry> merges;
    std::string_view vocab_text;   // the object, braces included
    std::string_view merges_text;  // the array, brackets included
  };
  bool tokenizer_document(Sections& sections) {
    skip_space();
    if (!next_is('{')) return false;
    bool has_model = false;
    const bool ok = members([&](std::string_view key) {
      if (key != "model") return value(1);
      if (has_model || !next_is('{')) return false;
      has_model = true;
      return members([&](std::string_view model_key) {
        const char* start = at_;
        if (model_key == "vocab") {
          if (!sections.vocab_text.empty() || !vocab_object(sections.vocab)) return false;
          sections.vocab_text = std::string_view(start, at_ - start);
          return true;
        }
        if (model_key == "merges") {
          if (!sections.merges_text.empty() || !merges_array(sections.merges)) return false;
          sections.merges_text = std::string_view(start, at_ - start);
          return true;
        }
        return value(2);
      });
    });
    skip_space();
    return ok && at_ == end_ && !sections.vocab_text.empty() && !sections.merges_text.empty();
  }

 private:
  static constexpr int kMaxDepth = 64;

  // A JSON string holding valid UTF-8 (escapes decode to valid UTF-8, so the decoded text is checked).
  bool token(std::string_view& out) {
    if (at_ == end_ || *at_ != '"') return false;
    const char* plain_end = plain_run_end(at_ + 1, end_);
    if (plain_end != end_ && *plain_end == '"') {
      out = std::string_view(at_ + 1, plain_end - at_ - 1);
      at_ = plain_end + 1;
    } else {
      std::string text;
      if (!scan_json_string(at_, end_, &text)) return false;
      out = decoded_.emplace_back(std::move(text));
    }
    return is_valid_utf8(out);
  }

  // After the '{': each member's key to `member`, which reads its value; up to the closing '}'.
  template <typename ReadMember>
  bool members(const ReadMember& member) {
    skip_space();
    if (next_is('}')) return true;
    std::string_view key;
    do {
      skip_space();
      if (!token(key)) return false;
      skip_space();
      if (!next_is(':')) return false;
      skip_space();
      if (!member(key)) return false;
      skip_space();
    } while (next_is(','));
    return next_is('}');
  }
  // Any other value, skipped: strings whole, containers by their brackets, scalars up to the next delimiter
  // (the parser checks them when it reads the rest).
  bool value(int depth) {
    if (at_ == end_ || depth > kMaxDepth) return false;
    if (*at_ == '"') return scan_json_string(at_, end_, nullptr);
    if (next_is('{')) return members([&](std::string_view) { return value(depth + 1); });
    if (next_is('[')) {
      skip_space();
      if (next_is(']')) return true;
      do {
        skip_space();
        if (!value(depth + 1)) return false;
        skip_space();
      } while (next_is(','));
      return next_is(']');
    }
    const char* start = at_;
    while (at_ != end_ && std::string_view(",}] \t\n\r\"{[:").find(*at_) == std::string_view::npos) ++at_;
    return at_ != start;
  }

  bool vocab_object(std::vector<VocabEntry>& vocab) {
    vocab.reserve(static_cast<size_t>(end_ - at_) / 16);  // as read_document does
    if (!next_is('{')) return false;
    return members([&](std::string_view key) {
      int64_t id = 0;
      if (at_ == end_ || *at_ < '0' || *at_ > '9') return false;
      if (*at_ == '0') {
        ++at_;
      } else {
        while (at_ != end_ && *at_ >= '0' && *at_ <= '9') {
          id = id * 10 + (*at_++ - '0');
          if (id > kMaxTokenId) return false;
        }
      }
      vocab.emplace_back(key, id);
      return true;
    });
  }

  bool merges_array(std::vector<MergeEntry>& merges) {
    merges.reserve(static_cast<size_t>(end_ - at_) / 16);
    if (!next_is('[')) return false;
    skip_space();
    if (next_is(']')) return true;
    do {
      skip_space();
      if (next_is('[')) {
        std::string_view left, right;
        skip_space();
        if (!token(left)) return false;
        skip_space();
        if (!next_is(',')) return false;
        skip_space();
        if (!token(right)) return false;
        skip_space();
        if (!next_is(']')) return false;
        merges.emplace_back(left, right);
      } else {
        std::string_view both;
        if (!token(both)) return false;
        const size_t space = both.find(' ');
        // The checks of TokenizerFileReader::string, whose message the full parse then gives.
        if (space == std::string::npos || space == 0 || space + 1 == both.size() ||
            both.find(' ', space + 1) != std::string::npos) {
          return false;
        }
        merges.emplace_back(both.substr(0, space), both.substr(space + 1));
      }
      skip_space();
    } while (next_is(','));
    return next_is(']');
  }

  std::deque<std::string>& decoded_;
};

// The fast path of read_document: true with `reader` filled as the full parse would fill it.
bool scan_document(std::string_view text, TokenizerFileReader& reader) {
  SectionScanner scanner(text, reader.decoded);
  if (reader.whole_document_is_vocab()) {
    if (!scanner.whole_document_vocab(reader.vocab)) return false;
    reader.has_vocab = true;
    return true;
  }
  SectionScanner::Sections sections;
  if (!scanner.tokenizer_document(sections)) return false;
  // The rest, with the sections emptied: the reader captures the empty ones where it would capture the full.
  std::string_view first = sections.vocab_text, second = sections.merges_text;
  if (first.data() > second.data()) std::swap(first, second);
  const auto offset = [&](std::string_view part) { return static_cast<size_t>(part.data() - text.data()); };
  std::string rest;
  rest.reserve(text.size() - first.size() - second.size() + 4);
  rest.append(text.substr(0, offset(first)));
  rest.append(first.front() == '{' ? "{}" : "[]");
  rest.append(text.substr(offset(first) + first.size(), offset(second) - offset(first) - first.size()));
  rest.append(second.front() == '{' ? "{}" : "[]");
  rest.append(text.substr(offset(second) + second.size()));
  if (!json::sax_parse(rest, &reader) || !reader.has_vocab || !reader.has_merges || !reader.vocab.empty() ||
      !reader.merges.empty()) {
    return false;
  }
  reader.vocab = std::move(sections.vocab);
  reader.merges = std::move(sections.merges);
  return true;
}

// Parses `text`, failing with a MeshError that names `path` (and where in the file) on any problem.
void read_document(const std::string& path, std::string_view text, TokenizerFileReader& reader,
                   const std::string& expected_document, JsonParse parse) {
  if (parse == JsonParse::kFastWhereItCan && scan_document(text, reader)) return;
  reader = TokenizerFileReader(reader.whole_document_is_vocab());
  // Room for more entries than a real file holds (Qwen3's: 36 bytes of text an entry): address space only,
  // faulted in as filled, where growing by doubling copies the entries and faults fresh pages each time.
  reader.vocab.reserve(text.size() / 16);
  reader.merges.reserve(text.size() / 16);
  const bool ok = json::sax_parse(text.begin(), text.end(), &reader);
  if (ok) return;
  const std::string where = reader.error_where.empty() ? path : path + ": " + reader.error_where;
  if (reader.error_expected == "a JSON document") fail(where, expected_document, reader.error_found);
  fail(where, reader.error_expected, reader.error_found);
}

// ---- vocabulary and merges -------------------------------------------------------------------------------

// Token string -> vocabulary entry, open addressing over the entries' own strings (the merges look up three
// strings each, 450k lookups for Qwen3).
class TokenIndex {
 public:
  explicit TokenIndex(const std::vector<VocabEntry>& entries) : entries_(entries) {
    size_t capacity = 16;
    while (capacity < entries.size() * 2) capacity *= 2;
    slots_.assign(capacity, Slot{});
    mask_ = capacity - 1;
  }
  // False when the string is already there (the entry is then not added).
  bool insert(size_t entry) {
    const std::string_view token = entries_[entry].first;
    const uint64_t h = hash(token);
    for (size_t slot = h & mask_;; slot = (slot + 1) & mask_) {
      if (slots_[slot].entry_plus_one == 0) {
        slots_[slot] = Slot{static_cast<uint32_t>(h >> 32), static_cast<uint32_t>(entry + 1)};
        return true;
      }
      if (slots_[slot].hash_high == static_cast<uint32_t>(h >> 32) &&
          entries_[slots_[slot].entry_plus_one - 1].first == token) {
        return false;
      }
    }
  }
  // The id of `token`, or -1.
  int64_t find(std::string_view token) const {
    const uint64_t h = hash(token);
    for (size_t slot = h & mask_;; slot = (slot + 1) & mask_) {
      const Slot& s = slots_[slot];
      if (s.entry_plus_one == 0) return -1;
      if (s.hash_high == static_cast<uint32_t>(h >> 32) && entries_[s.entry_plus_one - 1].first == token) {
        return entries_[s.entry_plus_one - 1].second;
      }
    }
  }

 private:
  struct Slot {
    uint32_t hash_high = 0;
    uint32_t entry_plus_one = 0;  // 0: empty
  };
  static uint64_t hash(std::string_view text) {
    uint64_t h = 0xcbf29ce484222325ull;
    for (const char c : text) h = (h ^ static_cast<unsigned char>(c)) * 0x100000001b3ull;
    return h ^ (h >> 29);
  }
  const std::vector<VocabEntry>& entries_;
  std::vector<Slot> slots_;
  size_t mask_ = 0;
};

// Fills the model vocabulary (ids already checked to lie in [0, kMaxTokenId]) and indexes it for the merges.
void read_vocab(const std::vector<VocabEntry>& vocab, const std::string& where, BpeModel& model,
                TokenIndex& index) {
  int64_t largest = -1;
  for (const auto& entry : vocab) largest = std::max(largest, entry.second);
  const auto size = static_cast<size_t>(largest + 1);
  model.token_bytes.assign(size, std::string());
  model.token_present.assign(size, 0);
  model.token_verbatim.assign(size, 0);
  std::vector<uint32_t> owner(size, 0);
  for (size_t i = 0; i < vocab.size(); ++i) {
    const auto& [token, id] = vocab[i];
    if (!index.insert(i)) fail(where, "each token once in the vocabulary", shown(token) + " twice");
    if (model.token_present[id]) {
      fail(
          where, "one token per id in the vocabulary",
          "id " + std::to_string(id) + " for both " + shown(vocab[owner[id]].first) + " and " + shown(token));
    }
    model.token_present[id] = 1;
    owner[id] = static_cast<uint32_t>(i);
    if (!unicode_to_bytes(token, model.token_bytes[id])) {
      model.token_bytes[id] = token;
      model.token_verbatim[id] = 1;
    }
  }
}

void read_merges(const std::vector<MergeEntry>& merges, const TokenIndex& index,
                 const std::function<std::string(size_t)>& where_of_merge, BpeModel& model) {
  model.merges.reserve(merges.size());
  std::string both;
  for (size_t i = 0; i < merges.size(); ++i) {
    const auto& [left, right] = merges[i];
    const int64_t left_id = index.find(left);
    const int64_t right_id = index.find(right);
    if (left_id < 0 || right_id < 0) {
      fail(where_of_merge(i), "a merge of two tokens of the vocabulary",
           shown(left_id < 0 ? left : right) + ", which is not in the vocabulary");
    }
    both.assign(left);
    both.append(right);
    const int64_t merged = index.find(both);
    if (merged < 0) {
      fail(where_of_merge(i), "a merge whose result is in the vocabulary",
           shown(left) + " + " + shown(right) + " = " + shown(both) + ", which is not in the vocabulary");
    }
    model.merges.push_back(
        Merge{static_cast<int32_t>(left_id), static_cast<int32_t>(right_id), static_cast<int32_t>(merged)});
  }
}

// ---- the rest of tokenizer.json --------------------------------------------------------------------------

std::string type_of(const json& node) {
  if (node.is_object()) {
    const auto type = node.find("type");
    if (type != node.end() && type->is_string()) return type->get<std::string>();
  }
  return node.is_object() ? std::string("an object without a \"type\"") : std::string(node.type_name());
}

bool read_bool(const json& node, const char* key, bool fallback, const std::string& where) {
  const auto found = node.find(key);
  if (found == node.end() || found->is_null()) return fallback;
  if (!found->is_boolean()) fail(where, std::string("\"") + key + "\" true or false", json_text(*found));
  return found->get<bool>();
}

json member(const json& node, const char* key) {
  const auto found = node.find(key);
  return found == node.end() ? json() : *found;
}

void read_normalizer(const json& node, const std::string& where, BpeModel& model) {
  if (node.is_null()) return;
  const std::string type = type_of(node);
  if (type == "NFC") {
    model.nfc = true;
    return;
  }
  if (type == "Sequence" && node.contains("normalizers") && node["normalizers"].is_array()) {
    for (const json& inner : node["normalizers"]) read_normalizer(inner, where, model);
    return;
  }
  fail(where, "normalizer null, NFC, or a Sequence of NFC", "normalizer " + type, kHint);
}

void read_pre_tokenizer(const json& node, const std::string& where, BpeModel& model, bool& byte_level) {
  if (node.is_null()) return;
  const std::string type = type_of(node);
  const std::string expected =
      "pre_tokenizer ByteLevel, or a Sequence of Splits (regex, behavior Isolated) ending in ByteLevel";
  if (type == "Sequence") {
    const auto inner = node.find("pretokenizers");
    if (inner == node.end() || !inner->is_array()) {
      fail(where, expected, "a Sequence without \"pretokenizers\"");
    }
    for (const json& child : *inner) read_pre_tokenizer(child, where, model, byte_level);
    return;
  }
  // ByteLevel rewrites the text into its alphabet, so a step after it would see other characters than our
  // pre-tokeniser (which works on the raw bytes) shows it.
  if (byte_level) fail(where, expected, "pre_tokenizer " + type + " after ByteLevel");
  if (type == "ByteLevel") {
    byte_level = true;
    // Hugging Face's default when the key is absent is true.
    if (read_bool(node, "add_prefix_space", true, where)) {
      // Hugging Face adds the space to every piece earlier steps made; we support it on whole text segments
      // only, i.e. when ByteLevel is the only step.
      if (!model.regexes.empty()) {
        fail(where, "ByteLevel(add_prefix_space=true) only as the sole pre_tokenizer", "it after a Split",
             "set add_prefix_space to false");
      }
      model.add_prefix_space = true;
    }
    if (read_bool(node, "use_regex", true, where)) model.regexes.emplace_back(kGpt2Pattern, false, where);
    return;
  }
  if (type == "Split") {
    const auto pattern = node.find("pattern");
    if (pattern == node.end() || !pattern->is_object()) {
      fail(where, "a Split with a \"pattern\"", json_text(node));
    }
    const bool has_regex = pattern->contains("Regex") && (*pattern)["Regex"].is_string();
    const bool has_string = pattern->contains("String") && (*pattern)["String"].is_string();
    if (!has_regex && !has_string) {
      fail(where, "a Split pattern {\"Regex\": ...} or {\"String\": ...}", json_text(*pattern));
    }
    const json behavior = member(node, "behavior");
    if (!behavior.is_null() && behavior != "Isolated") {
      fail(where, "a Split with behavior Isolated", "behavior " + json_text(behavior));
    }
    if (read_bool(node, "invert", false, where)) fail(where, "a Split with invert false", "invert true");
    model.regexes.emplace_back((*pattern)[has_regex ? "Regex" : "String"].get<std::string>(), !has_regex,
                               where);
    return;
  }
  fail(where, expected, "pre_tokenizer " + type, kHint);
}

void check_decoder(const json& node, const std::string& where) {
  if (node.is_null()) return;
  const std::string type = type_of(node);
  if (type == "ByteLevel") return;
  if (type == "Sequence" && node.contains("decoders") && node["decoders"].is_array()) {
    for (const json& inner : node["decoders"]) check_decoder(inner, where);
    return;
  }
  fail(where, "decoder ByteLevel (a byte-level BPE tokenizer)", "decoder " + type, kHint);
}

void read_added_tokens(const json& node, const std::string& where, BpeModel& model) {
  if (node.is_null()) return;
  if (!node.is_array()) fail(where, "\"added_tokens\" as an array", json_text(node));
  for (size_t i = 0; i < node.size(); ++i) {
    const json& entry = node[i];
    const std::string entry_where = where + ": added_tokens[" + std::to_string(i) + "]";
    if (!entry.is_object() || !entry.contains("id") || !entry.contains("content") ||
        !entry["content"].is_string()) {
      fail(entry_where, "an object with \"id\" and \"content\"", json_text(entry));
    }
    const json& id = entry["id"];
    if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() > kMaxTokenId) {
      fail(entry_where, "an id from 0 to " + std::to_string(kMaxTokenId), json_text(id));
    }
    AddedToken token;
    token.id = static_cast<int32_t>(id.get<int64_t>());
    token.content = entry["content"].get<std::string>();
    if (token.content.empty()) fail(entry_where, "a non-empty \"content\"", "\"\"");
    token.special = read_bool(entry, "special", false, entry_where);
    token.lstrip = read_bool(entry, "lstrip", false, entry_where);
    token.rstrip = read_bool(entry, "rstrip", false, entry_where);
    token.single_word = read_bool(entry, "single_word", false, entry_where);
    token.normalized = read_bool(entry, "normalized", false, entry_where);
    model.added_tokens.push_back(std::move(token));
  }
}

}  // namespace

bool fast_scanner_reads(std::string_view text, bool whole_document_is_vocab) {
  TokenizerFileReader reader(whole_document_is_vocab);
  return scan_document(text, reader);
}

BpeModel load_hugging_face(const std::string& path, JsonParse parse) {
  const FileText file(path);
  TokenizerFileReader reader(false);
  read_document(path, file.text(), reader, "a JSON document (a Hugging Face tokenizer.json)", parse);
  const json& root = reader.rest;
  if (!root.is_object() || !root.contains("model") || !root["model"].is_object()) {
    fail(path, "a Hugging Face tokenizer.json (a JSON object with a \"model\" object)",
         root.is_object() ? std::string("no \"model\" object") : std::string("JSON ") + root.type_name());
  }
  const json& model_node = root["model"];
  std::string type;
  if (model_node.contains("type")) {
    type = type_of(model_node);
  } else {
    type = reader.has_merges ? "BPE" : "a model without \"type\"";  // files from before "type" was written
  }
  if (type != "BPE") fail(path, "model type BPE (byte-level)", "model type " + type, kHint);
  if (read_bool(model_node, "byte_fallback", false, path)) {
    fail(path, "a byte-level BPE (byte_fallback false)", "byte_fallback true (a SentencePiece-style BPE)",
         kHint);
  }
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    const json value = member(model_node, key);
    if (!value.is_null() && !(value.is_string() && value.get<std::string>().empty())) {
      fail(path, std::string("a byte-level BPE (no ") + key + ")", json_text(value), kHint);
    }
  }
  const json dropout = member(model_node, "dropout");
  if (!dropout.is_null() && !(dropout.is_number() && dropout.get<double>() == 0)) {
    fail(path, "BPE dropout null (encoding must be deterministic)", "dropout " + json_text(dropout));
  }

  BpeModel model;
  model.source_path = path;
  model.ignore_merges = read_bool(model_node, "ignore_merges", false, path);
  bool byte_level = false;
  read_normalizer(member(root, "normalizer"), path, model);
  read_pre_tokenizer(member(root, "pre_tokenizer"), path, model, byte_level);
  if (!byte_level) {
    fail(path, "a byte-level BPE (a ByteLevel pre_tokenizer)",
         "pre_tokenizer " +
             (member(root, "pre_tokenizer").is_null() ? std::string("null") : type_of(root["pre_tokenizer"])),
         kHint);
  }
  check_decoder(member(root, "decoder"), path);
  if (!reader.has_vocab) {
    fail(path + ": model.vocab", "an object {\"token\": id, ...}",
         model_node.contains("vocab") ? json_text(model_node["vocab"]) : std::string("none"));
  }
  if (!reader.has_merges) {
    fail(path + ": model.merges", "an array of merges",
         model_node.contains("merges") ? json_text(model_node["merges"]) : std::string("none"));
  }
  TokenIndex index(reader.vocab);
  read_vocab(reader.vocab, path + ": model.vocab", model, index);
  read_merges(
      reader.merges, index, [&](size_t i) { return path + ": model.merges[" + std::to_string(i) + "]"; },
      model);
  read_added_tokens(member(root, "added_tokens"), path, model);
  model.finalize();
  return model;
}

// GPT-2's original files: encoder.json ({token: id}) and vocab.bpe ("#version" line, then "a b" merges).
// No added tokens: "<|endoftext|>" in text is encoded like any other text, as GPT-2's encoder does.
BpeModel load_gpt2(const std::string& encoder_path, const std::string& merges_path, JsonParse parse) {
  const FileText encoder_file(encoder_path);
  TokenizerFileReader reader(true);
  const std::string expected = "a JSON object {\"token\": id, ...} (GPT-2's encoder.json)";
  read_document(encoder_path, encoder_file.text(), reader, expected, parse);
  if (!reader.has_vocab) fail(encoder_path, expected, "JSON " + std::string(reader.rest.type_name()));
  BpeModel model;
  model.source_path = encoder_path;
  TokenIndex index(reader.vocab);
  read_vocab(reader.vocab, encoder_path, model, index);

  const FileText merges_file(merges_path);
  const std::string_view merges_text = merges_file.text();
  std::vector<MergeEntry> merges;
  std::vector<size_t> line_numbers;
  size_t line_number = 0;
  for (size_t start = 0; start < merges_text.size();) {
    size_t end = merges_text.find('\n', start);
    if (end == std::string::npos) end = merges_text.size();
    std::string_view line(merges_text.data() + start, end - start);
    start = end + 1;
    ++line_number;
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (line.empty() || (line_number == 1 && line.starts_with("#version"))) continue;
    const size_t space = line.find(' ');
    if (space == std::string_view::npos || space == 0 || space + 1 == line.size() ||
        line.find(' ', space + 1) != std::string_view::npos) {
      fail(merges_path + ":" + std::to_string(line_number), "a merge line \"a b\"", shown(line));
    }
    merges.emplace_back(line.substr(0, space), line.substr(space + 1));
    line_numbers.push_back(line_number);
  }
  read_merges(
      merges, index, [&](size_t i) { return merges_path + ":" + std::to_string(line_numbers[i]); }, model);
  model.regexes.emplace_back(kGpt2Pattern, false, encoder_path);
  model.finalize();
  return model;
}

}  // namespace tokenizer_detail

Tokenizer Tokenizer::load(const std::string& path) {
  namespace fs = std::filesystem;
  using tokenizer_detail::kPathExpected;
  std::error_code error;
  const fs::file_status status = fs::status(path, error);
  if (error || !fs::exists(status)) fail(path, kPathExpected, "nothing at that path");
  auto impl = std::make_unique<Impl>();
  if (fs::is_directory(status)) {
    const fs::path folder(path);
    const bool has_json = fs::exists(folder / "tokenizer.json", error);
    const bool has_encoder = fs::exists(folder / "encoder.json", error);
    const bool has_merges = fs::exists(folder / "vocab.bpe", error);
    if (has_json) {
      impl->model = tokenizer_detail::load_hugging_face((folder / "tokenizer.json").string());
    } else if (has_encoder && has_merges) {
      impl->model =
          tokenizer_detail::load_gpt2((folder / "encoder.json").string(), (folder / "vocab.bpe").string());
    } else if (has_encoder || has_merges) {
      fail(path, "encoder.json and vocab.bpe side by side (GPT-2's tokenizer files)",
           std::string("only ") + (has_encoder ? "encoder.json" : "vocab.bpe"));
    } else {
      fail(path, kPathExpected, "a folder with neither tokenizer.json nor encoder.json + vocab.bpe");
    }
    return Tokenizer(std::move(impl));
  }
  const fs::path file(path);
  const std::string name = file.filename().string();
  if (name == "encoder.json" || name == "vocab.bpe") {
    // Either of GPT-2's two files stands for the pair.
    const fs::path encoder = file.parent_path() / "encoder.json";
    const fs::path merges = file.parent_path() / "vocab.bpe";
    if (!fs::exists(encoder, error) || !fs::exists(merges, error)) {
      fail(path, "encoder.json and vocab.bpe side by side (GPT-2's tokenizer files)",
           "no " + (name == "encoder.json" ? merges : encoder).string());
    }
    impl->model = tokenizer_detail::load_gpt2(encoder.string(), merges.string());
  } else {
    impl->model = tokenizer_detail::load_hugging_face(path);
  }
  return Tokenizer(std::move(impl));
}

}  // namespace meshtrain
