// Internals of the byte-level BPE tokenizer shared by tokenizer.cpp (loading, encoding, decoding) and
// tokenizer_train.cpp (training, saving). Not part of the public interface: include tokenizer.h instead.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "meshtrain/data/tokenizer/tokenizer.h"

namespace meshtrain::tokenizer_detail {

// GPT-2's byte-to-unicode alphabet: every byte is written in vocab files as one printable code point, so a
// byte-level token is a UTF-8 string of those code points.
const std::array<std::string, 256>& byte_to_unicode();
// The bytes a byte-level token string stands for; false when it holds a code point outside the alphabet.
bool unicode_to_bytes(std::string_view token, std::string& bytes);
std::string bytes_to_unicode(std::string_view bytes);

// Ids beyond this are a corrupt file, not a vocabulary (the largest real ones have about 260k tokens); the
// cap keeps a bad id from sizing tables in the gigabytes.
constexpr int64_t kMaxTokenId = (int64_t{1} << 24) - 1;

// `text` quoted and cut short for an error message.
std::string shown(std::string_view text);

// The length of the valid UTF-8 character at the start of `text`, or 0 when it is not one (overlong forms,
// surrogates and code points past U+10FFFF are invalid, as PCRE2 and ICU see them).
size_t utf8_char_length(std::string_view text);
bool is_valid_utf8(std::string_view text);

// A compiled PCRE2 pattern (UTF, Unicode properties, JIT when available) that splits text the way Hugging
// Face's Split(behavior="Isolated") does: every match is a piece, and so is every stretch between matches.
class PreTokenizerRegex {
 public:
  // `where` names the file the pattern came from, for the MeshError a bad pattern gets.
  PreTokenizerRegex(const std::string& pattern, bool literal, const std::string& where);
  PreTokenizerRegex(PreTokenizerRegex&&) noexcept;
  PreTokenizerRegex& operator=(PreTokenizerRegex&&) noexcept;
  ~PreTokenizerRegex();

  const std::string& pattern() const { return pattern_; }
  bool literal() const { return literal_; }
  // Appends the pieces of `text` (views into it, never empty) to `pieces`.
  void split(std::string_view text, std::vector<std::string_view>& pieces) const;

 private:
  std::string pattern_;
  bool literal_ = false;
  std::string where_;
  void* code_ = nullptr;  // pcre2_code_8*, kept opaque so this header does not pull in pcre2.h
  bool jit_ = false;
};

// The pattern ByteLevel(use_regex=true) implies (GPT-2's).
extern const char* const kGpt2Pattern;

// Open-addressing map from a token pair (left id, right id) to the merge's rank and the merged id: the
// hottest lookup of encoding, so it avoids std::unordered_map's node chasing.
class PairMap {
 public:
  struct Value {
    int32_t rank;
    int32_t merged;
  };
  void reset(size_t expected_entries);
  void insert(int32_t left, int32_t right, Value value);  // a later insert of the same pair wins
  const Value* find(int32_t left, int32_t right) const {
    if (keys_.empty()) return nullptr;
    const uint64_t key = pack(left, right);
    for (size_t slot = hash(key);; slot = (slot + 1) & mask_) {
      if (keys_[slot] == key) return &values_[slot];
      if (keys_[slot] == kEmpty) return nullptr;
    }
  }

 private:
  static constexpr uint64_t kEmpty = ~uint64_t{0};  // ids are non-negative int32, so no key is all ones
  static uint64_t pack(int32_t left, int32_t right) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(left)) << 32) | static_cast<uint32_t>(right);
  }
  size_t hash(uint64_t key) const { return static_cast<size_t>((key * 0x9E3779B97F4A7C15ull) >> shift_); }
  std::vector<uint64_t> keys_;
  std::vector<Value> values_;
  size_t mask_ = 0;
  int shift_ = 64;
};

struct AddedToken {
  int32_t id = 0;
  std::string content;
  bool special = true;
  bool lstrip = false;
  bool rstrip = false;
  bool single_word = false;
  bool normalized = false;  // kept for saving; matching always happens on the raw text (see encode)
};

struct Merge {
  int32_t left;
  int32_t right;
  int32_t merged;
};

// Everything a byte-level BPE tokenizer is. Loaders and the trainer fill the first block, then call
// finalize() which builds the lookup structures of the second.
struct BpeModel {
  std::string source_path;  // the file read, or "" for a tokenizer trained in memory
  // Model vocabulary: id -> the bytes the token stands for. `token_present` marks ids that exist;
  // `token_verbatim` marks tokens whose string held code points outside the byte-level alphabet: they
  // decode to their UTF-8 text and BPE can never produce them.
  std::vector<std::string> token_bytes;
  std::vector<uint8_t> token_present;
  std::vector<uint8_t> token_verbatim;
  std::vector<Merge> merges;  // rank order
  std::vector<AddedToken> added_tokens;
  bool nfc = false;
  bool ignore_merges = false;     // a pre-token that is a whole vocabulary token is emitted as that token
  bool add_prefix_space = false;  // ByteLevel(add_prefix_space=true): " " before each text segment
  std::vector<PreTokenizerRegex> regexes;  // applied in turn; none: each text segment is one pre-token

  // Built by finalize().
  std::array<int32_t, 256> byte_ids{};
  PairMap pair_map;
  std::vector<std::string> decode_table;  // id -> bytes, added tokens included
  std::vector<uint8_t> decode_present;
  std::vector<std::vector<int32_t>> added_by_first_byte;  // indices into added_tokens, longest first
  std::array<uint8_t, 256> added_first_byte{};
  std::vector<std::pair<std::string, int32_t>> whole_token_ids;  // sorted, only when ignore_merges
  int64_t vocab_size = 0;
  int32_t eos_id = -1;
  uint64_t cache_owner = 0;  // distinguishes tokenizers in the per-thread BPE cache

  // Builds the lookup structures; fails (MeshError naming `source_path`) when a byte has no token.
  void finalize();
};

// Where errors about `model` point: its file, or "trained tokenizer".
std::string where_of(const BpeModel& model);

// How a loader reads its JSON: a fast scanner for the vocabulary and merges where it can, the full parse
// deciding anything else (the same model and the same errors either way); or the full parse alone, which the
// tests compare the fast path with.
enum class JsonParse { kFastWhereItCan, kFullParseOnly };

// Loaders (tokenizer_load.cpp): a Hugging Face tokenizer.json; GPT-2's encoder.json + vocab.bpe.
BpeModel load_hugging_face(const std::string& path, JsonParse parse = JsonParse::kFastWhereItCan);
BpeModel load_gpt2(const std::string& encoder_path, const std::string& merges_path,
                   JsonParse parse = JsonParse::kFastWhereItCan);
// Whether the fast scanner reads `text` (a tokenizer.json, or GPT-2's encoder.json when
// `whole_document_is_vocab`) without leaving it to the full parse: for the tests, which check that it reads
// what it takes as the full parse does.
bool fast_scanner_reads(std::string_view text, bool whole_document_is_vocab);

}  // namespace meshtrain::tokenizer_detail

namespace meshtrain {

struct Tokenizer::Impl {
  tokenizer_detail::BpeModel model;  // not changed once a Tokenizer holds it
  // identity(), hashed over the whole vocabulary on its first call (Qwen3's: ~8 ms) and kept: a run asks for
  // it from several places.
  std::once_flag identity_once;
  std::string identity;
};

}  // namespace meshtrain
