// Byte-level BPE tokenizers: encoding (added tokens, NFC, regex pre-tokenisation, rank-based BPE with a
// per-thread cache), decoding, identity. Loading is in tokenizer_load.cpp, training in tokenizer_train.cpp.
#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
// ICU for NFC: it is the best-kept implementation of Unicode normalisation (tracks each Unicode release,
// ships with every distribution), so we do not carry normalisation tables of our own.
#include <unicode/uchar.h>
#include <unicode/unorm2.h>
#include <unicode/ustring.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <limits>
#include <queue>
#include <utility>

#include "meshtrain/core/error.h"
#include "meshtrain/data/tokenizer/tokenizer.h"
#include "meshtrain/data/tokenizer/tokenizer_impl.h"

namespace meshtrain {

namespace tokenizer_detail {

const char* const kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

namespace {

std::string utf8_encode(uint32_t code_point) {
  std::string out;
  if (code_point < 0x80) {
    out += static_cast<char>(code_point);
  } else if (code_point < 0x800) {
    out += static_cast<char>(0xC0 | (code_point >> 6));
    out += static_cast<char>(0x80 | (code_point & 0x3F));
  } else if (code_point < 0x10000) {
    out += static_cast<char>(0xE0 | (code_point >> 12));
    out += static_cast<char>(0x80 | ((code_point >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (code_point & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (code_point >> 18));
    out += static_cast<char>(0x80 | ((code_point >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((code_point >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (code_point & 0x3F));
  }
  return out;
}

// The code point of the valid UTF-8 character of `length` bytes at `text`.
uint32_t utf8_decode(const char* text, size_t length) {
  const auto byte = [&](size_t i) { return static_cast<uint32_t>(static_cast<unsigned char>(text[i])); };
  switch (length) {
    case 1:
      return byte(0);
    case 2:
      return ((byte(0) & 0x1F) << 6) | (byte(1) & 0x3F);
    case 3:
      return ((byte(0) & 0x0F) << 12) | ((byte(1) & 0x3F) << 6) | (byte(2) & 0x3F);
    default:
      return ((byte(0) & 0x07) << 18) | ((byte(1) & 0x3F) << 12) | ((byte(2) & 0x3F) << 6) | (byte(3) & 0x3F);
  }
}

// The byte-level alphabet's inverse: code point -> byte, -1 outside the alphabet (which ends at U+0143).
const std::array<int16_t, 324>& unicode_to_byte_table() {
  static const std::array<int16_t, 324> table = [] {
    std::array<int16_t, 324> inverse;
    inverse.fill(-1);
    int next = 256;
    for (int byte = 0; byte < 256; ++byte) {
      const bool printable = (byte >= 33 && byte <= 126) || (byte >= 161 && byte <= 172) || byte >= 174;
      inverse[printable ? byte : next++] = static_cast<int16_t>(byte);
    }
    return inverse;
  }();
  return table;
}

bool is_white_space(uint32_t code_point) {
  return u_isUWhiteSpace(static_cast<UChar32>(code_point)) != 0;
}

// Hugging Face's word characters for single_word added tokens: alphanumeric or '_'.
bool is_word_character(uint32_t code_point) {
  if (code_point == '_') return true;
  const auto c = static_cast<UChar32>(code_point);
  if (u_hasBinaryProperty(c, UCHAR_ALPHABETIC)) return true;
  const int8_t type = u_charType(c);
  return type == U_DECIMAL_DIGIT_NUMBER || type == U_LETTER_NUMBER || type == U_OTHER_NUMBER;
}

// The character that ends just before `end` (`begin` bounds the search); false when there is none or it is
// not valid UTF-8.
bool previous_code_point(std::string_view text, size_t begin, size_t end, uint32_t& code_point,
                         size_t& length) {
  if (end <= begin) return false;
  size_t start = end - 1;
  while (start > begin && end - start < 4 && (static_cast<unsigned char>(text[start]) & 0xC0) == 0x80) {
    --start;
  }
  length = utf8_char_length(text.substr(start, end - start));
  if (length != end - start) return false;
  code_point = utf8_decode(text.data() + start, length);
  return true;
}

bool next_code_point(std::string_view text, size_t at, uint32_t& code_point, size_t& length) {
  if (at >= text.size()) return false;
  length = utf8_char_length(text.substr(at));
  if (length == 0) return false;
  code_point = utf8_decode(text.data() + at, length);
  return true;
}

// ---- NFC -------------------------------------------------------------------------------------------------

std::string icu_failure(const char* step, UErrorCode status) {
  return std::string(step) + " failed: " + u_errorName(status);
}

// NFC of valid UTF-8 via ICU (which works on UTF-16).
void nfc_valid_run(std::string_view run, std::string& out, const std::string& where) {
  UErrorCode status = U_ZERO_ERROR;
  const UNormalizer2* nfc = unorm2_getNFCInstance(&status);
  if (U_FAILURE(status)) fail(where, "ICU's NFC data", icu_failure("unorm2_getNFCInstance", status));
  // One UTF-16 unit per UTF-8 byte is always enough.
  std::vector<UChar> utf16(run.size() + 1);
  int32_t utf16_length = 0;
  u_strFromUTF8(utf16.data(), static_cast<int32_t>(utf16.size()), &utf16_length, run.data(),
                static_cast<int32_t>(run.size()), &status);
  if (U_FAILURE(status)) fail(where, "UTF-8 text", icu_failure("u_strFromUTF8", status));
  if (unorm2_spanQuickCheckYes(nfc, utf16.data(), utf16_length, &status) == utf16_length &&
      U_SUCCESS(status)) {
    out.append(run);
    return;
  }
  status = U_ZERO_ERROR;
  std::vector<UChar> normalized(static_cast<size_t>(utf16_length) * 2 + 16);
  int32_t normalized_length = unorm2_normalize(nfc, utf16.data(), utf16_length, normalized.data(),
                                               static_cast<int32_t>(normalized.size()), &status);
  if (status == U_BUFFER_OVERFLOW_ERROR) {
    status = U_ZERO_ERROR;
    normalized.resize(static_cast<size_t>(normalized_length) + 1);
    normalized_length = unorm2_normalize(nfc, utf16.data(), utf16_length, normalized.data(),
                                         static_cast<int32_t>(normalized.size()), &status);
  }
  if (U_FAILURE(status)) fail(where, "text ICU can normalise", icu_failure("unorm2_normalize", status));
  const size_t old_size = out.size();
  // At most 3 UTF-8 bytes per UTF-16 unit.
  out.resize(old_size + static_cast<size_t>(normalized_length) * 3 + 1);
  int32_t utf8_length = 0;
  u_strToUTF8(out.data() + old_size, static_cast<int32_t>(out.size() - old_size), &utf8_length,
              normalized.data(), normalized_length, &status);
  if (U_FAILURE(status)) fail(where, "text ICU can convert to UTF-8", icu_failure("u_strToUTF8", status));
  out.resize(old_size + static_cast<size_t>(utf8_length));
}

// NFC of `text`; false (and `out` untouched) when the text is already NFC by a cheap test. Bytes that are
// not valid UTF-8 are kept as they are, so encoding arbitrary bytes still round-trips.
bool nfc_normalize(std::string_view text, std::string& out, const std::string& where) {
  // Characters below U+0300 (UTF-8 bytes below 0xCC) are NFC and never compose with one another, so text
  // made only of them (all ASCII, Latin-1, ...) is already normalised.
  if (std::all_of(text.begin(), text.end(), [](char c) { return static_cast<unsigned char>(c) < 0xCC; })) {
    return false;
  }
  out.clear();
  out.reserve(text.size() + 16);
  size_t run_start = 0;
  size_t at = 0;
  while (at < text.size()) {
    const size_t length = utf8_char_length(text.substr(at));
    if (length > 0) {
      at += length;
      continue;
    }
    if (at > run_start) nfc_valid_run(text.substr(run_start, at - run_start), out, where);
    out += text[at];
    run_start = ++at;
  }
  if (at > run_start) nfc_valid_run(text.substr(run_start, at - run_start), out, where);
  return true;
}

// ---- per-thread BPE cache --------------------------------------------------------------------------------

// Pre-token bytes -> ids for one tokenizer, kept per thread (so const encode() needs no lock; see
// thread_cache). Bounded: when full it is emptied and refills with what the text uses now.
class BpeCache {
 public:
  static constexpr size_t kSlots = size_t{1} << 17;
  static constexpr size_t kMaxEntries = kSlots / 2;
  static constexpr size_t kMaxKeyBytes = size_t{8} << 20;
  static constexpr size_t kMaxPieceBytes = 256;  // longer pieces are rare; caching them would only churn

  uint64_t owner() const { return owner_; }
  void use_for(uint64_t owner) {
    if (owner_ != owner) {
      clear();
      owner_ = owner;
    }
  }
  static uint64_t hash(std::string_view piece) {
    uint64_t h = 0xcbf29ce484222325ull;
    for (const char c : piece) h = (h ^ static_cast<unsigned char>(c)) * 0x100000001b3ull;
    return h | 1;  // 0 marks an empty slot
  }
  // Appends the cached ids of `piece` to `out`; false when not cached.
  bool append(std::string_view piece, uint64_t h, std::vector<int32_t>& out) const {
    if (slots_.empty()) return false;
    for (size_t slot = h & (kSlots - 1);; slot = (slot + 1) & (kSlots - 1)) {
      const Slot& entry = slots_[slot];
      if (entry.hash == 0) return false;
      if (entry.hash == h && entry.key_length == piece.size() &&
          std::memcmp(keys_.data() + entry.key_offset, piece.data(), piece.size()) == 0) {
        out.insert(out.end(), ids_.begin() + entry.ids_offset,
                   ids_.begin() + entry.ids_offset + entry.ids_length);
        return true;
      }
    }
  }
  void insert(std::string_view piece, uint64_t h, const int32_t* ids, size_t count) {
    if (piece.size() > kMaxPieceBytes) return;
    if (slots_.empty()) slots_.assign(kSlots, Slot{});
    if (entries_ >= kMaxEntries || keys_.size() + piece.size() > kMaxKeyBytes) clear_entries();
    size_t slot = h & (kSlots - 1);
    while (slots_[slot].hash != 0) slot = (slot + 1) & (kSlots - 1);
    slots_[slot] = Slot{h, static_cast<uint32_t>(keys_.size()), static_cast<uint32_t>(piece.size()),
                        static_cast<uint32_t>(ids_.size()), static_cast<uint32_t>(count)};
    keys_.append(piece);
    ids_.insert(ids_.end(), ids, ids + count);
    ++entries_;
  }

 private:
  struct Slot {
    uint64_t hash = 0;
    uint32_t key_offset = 0;
    uint32_t key_length = 0;
    uint32_t ids_offset = 0;
    uint32_t ids_length = 0;
  };
  void clear_entries() {
    std::fill(slots_.begin(), slots_.end(), Slot{});
    keys_.clear();
    ids_.clear();
    entries_ = 0;
  }
  void clear() {
    slots_.clear();
    slots_.shrink_to_fit();
    keys_.clear();
    ids_.clear();
    entries_ = 0;
  }
  uint64_t owner_ = 0;
  std::vector<Slot> slots_;
  std::string keys_;
  std::vector<int32_t> ids_;
  size_t entries_ = 0;
};

std::atomic<uint64_t> next_cache_owner{1};

// This thread's cache for the tokenizer `owner`. Two per thread, least recently used replaced, so a thread
// that alternates between two tokenizers keeps both warm.
BpeCache& thread_cache(uint64_t owner) {
  thread_local std::array<BpeCache, 2> caches;
  thread_local size_t last = 0;
  if (caches[last].owner() != owner) {
    last = 1 - last;
    caches[last].use_for(owner);
  }
  return caches[last];
}

// ---- BPE merging -----------------------------------------------------------------------------------------

constexpr int32_t kNoRank = std::numeric_limits<int32_t>::max();

// Short pieces (nearly all): repeatedly merge the lowest-rank adjacent pair, leftmost first. Quadratic in
// the piece length but with tiny constants and no allocation.
void merge_short(const BpeModel& model, std::string_view piece, std::vector<int32_t>& out) {
  constexpr size_t kCapacity = 64;
  int32_t symbols[kCapacity];
  int32_t ranks[kCapacity];    // ranks[i]: rank of the pair (symbols[i], symbols[i + 1])
  int32_t mergeds[kCapacity];  // the id that pair merges into
  size_t count = piece.size();
  for (size_t i = 0; i < count; ++i) symbols[i] = model.byte_ids[static_cast<unsigned char>(piece[i])];
  const auto rank_pair = [&](size_t i) {
    const PairMap::Value* value = model.pair_map.find(symbols[i], symbols[i + 1]);
    ranks[i] = value ? value->rank : kNoRank;
    mergeds[i] = value ? value->merged : -1;
  };
  for (size_t i = 0; i + 1 < count; ++i) rank_pair(i);
  while (count > 1) {
    size_t best = 0;
    for (size_t i = 1; i + 1 < count; ++i) {
      if (ranks[i] < ranks[best]) best = i;
    }
    if (ranks[best] == kNoRank) break;
    symbols[best] = mergeds[best];
    const size_t tail = count - best - 2;
    std::memmove(symbols + best + 1, symbols + best + 2, tail * sizeof(int32_t));
    std::memmove(ranks + best + 1, ranks + best + 2, tail * sizeof(int32_t));
    std::memmove(mergeds + best + 1, mergeds + best + 2, tail * sizeof(int32_t));
    --count;
    if (best > 0) rank_pair(best - 1);
    if (best + 1 < count) rank_pair(best);
  }
  out.insert(out.end(), symbols, symbols + count);
}

// Long pieces: the same merge order (lowest rank, then leftmost) with a heap over a linked list, so a
// megabyte of digits or of unbroken CJK text stays O(n log n).
void merge_long(const BpeModel& model, std::string_view piece, std::vector<int32_t>& out) {
  const size_t count = piece.size();
  std::vector<int32_t> symbols(count);
  std::vector<int64_t> previous(count);
  std::vector<int64_t> next(count);
  for (size_t i = 0; i < count; ++i) {
    symbols[i] = model.byte_ids[static_cast<unsigned char>(piece[i])];
    previous[i] = static_cast<int64_t>(i) - 1;
    next[i] = i + 1 < count ? static_cast<int64_t>(i + 1) : -1;
  }
  struct Candidate {
    int32_t rank;
    int64_t left;  // position of the left symbol
    int32_t left_id;
    int32_t right_id;
    bool operator>(const Candidate& other) const {
      return rank != other.rank ? rank > other.rank : left > other.left;
    }
  };
  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<>> queue;
  const auto push_pair = [&](int64_t left) {
    if (left < 0 || next[left] < 0) return;
    const int32_t left_id = symbols[left];
    const int32_t right_id = symbols[next[left]];
    if (const PairMap::Value* value = model.pair_map.find(left_id, right_id)) {
      queue.push(Candidate{value->rank, left, left_id, right_id});
    }
  };
  for (size_t i = 0; i + 1 < count; ++i) push_pair(static_cast<int64_t>(i));
  while (!queue.empty()) {
    const Candidate top = queue.top();
    queue.pop();
    const int64_t left = top.left;
    const int64_t right = next[left];
    // Stale: one side was merged away or changed since this candidate was pushed.
    if (symbols[left] != top.left_id || right < 0 || symbols[right] != top.right_id) continue;
    symbols[left] = model.pair_map.find(top.left_id, top.right_id)->merged;
    symbols[right] = -1;
    next[left] = next[right];
    if (next[right] >= 0) previous[next[right]] = left;
    push_pair(previous[left]);
    push_pair(left);
  }
  for (int64_t i = 0; i >= 0; i = next[i]) out.push_back(symbols[i]);
}

void merge_piece(const BpeModel& model, std::string_view piece, std::vector<int32_t>& out) {
  if (model.ignore_merges) {
    const auto found = std::lower_bound(
        model.whole_token_ids.begin(), model.whole_token_ids.end(), piece,
        [](const std::pair<std::string, int32_t>& entry, std::string_view key) { return entry.first < key; });
    if (found != model.whole_token_ids.end() && found->first == piece) {
      out.push_back(found->second);
      return;
    }
  }
  if (piece.size() <= 64) {
    merge_short(model, piece, out);
  } else {
    merge_long(model, piece, out);
  }
}

void encode_piece(const BpeModel& model, BpeCache& cache, std::string_view piece, std::vector<int32_t>& out) {
  if (piece.size() == 1) {
    out.push_back(model.byte_ids[static_cast<unsigned char>(piece[0])]);
    return;
  }
  const uint64_t h = BpeCache::hash(piece);
  if (cache.append(piece, h, out)) return;
  const size_t before = out.size();
  merge_piece(model, piece, out);
  cache.insert(piece, h, out.data() + before, out.size() - before);
}

// One stretch of text between added tokens: normalise, pre-tokenise, merge.
void encode_segment(const BpeModel& model, std::string_view segment, std::vector<int32_t>& out) {
  if (segment.empty()) return;
  std::string normalized;
  if (model.nfc && nfc_normalize(segment, normalized, model.source_path)) segment = normalized;
  if (model.add_prefix_space && segment.front() != ' ') {
    normalized = " " + std::string(segment);
    segment = normalized;
  }
  BpeCache& cache = thread_cache(model.cache_owner);
  if (model.regexes.empty()) {
    encode_piece(model, cache, segment, out);
    return;
  }
  std::vector<std::string_view> pieces;
  model.regexes.front().split(segment, pieces);
  for (size_t step = 1; step < model.regexes.size(); ++step) {
    std::vector<std::string_view> finer;
    for (const std::string_view piece : pieces) model.regexes[step].split(piece, finer);
    pieces.swap(finer);
  }
  for (const std::string_view piece : pieces) encode_piece(model, cache, piece, out);
}

}  // namespace

// ---- shared helpers --------------------------------------------------------------------------------------

std::string where_of(const BpeModel& model) {
  return model.source_path.empty() ? std::string("trained tokenizer") : model.source_path;
}

std::string shown(std::string_view text) {
  constexpr size_t kLimit = 60;
  if (text.size() <= kLimit) return "'" + std::string(text) + "'";
  size_t cut = kLimit;
  while (cut > 0 && (static_cast<unsigned char>(text[cut]) & 0xC0) == 0x80) --cut;  // whole characters only
  return "'" + std::string(text.substr(0, cut)) + "...'";
}

const std::array<std::string, 256>& byte_to_unicode() {
  static const std::array<std::string, 256> table = [] {
    std::array<std::string, 256> strings;
    const auto& inverse = unicode_to_byte_table();
    for (uint32_t code_point = 0; code_point < inverse.size(); ++code_point) {
      if (inverse[code_point] >= 0) strings[inverse[code_point]] = utf8_encode(code_point);
    }
    return strings;
  }();
  return table;
}

bool unicode_to_bytes(std::string_view token, std::string& bytes) {
  const auto& inverse = unicode_to_byte_table();
  bytes.clear();
  for (size_t at = 0; at < token.size();) {
    const size_t length = utf8_char_length(token.substr(at));
    if (length == 0) return false;
    const uint32_t code_point = utf8_decode(token.data() + at, length);
    if (code_point >= inverse.size() || inverse[code_point] < 0) return false;
    bytes += static_cast<char>(inverse[code_point]);
    at += length;
  }
  return true;
}

std::string bytes_to_unicode(std::string_view bytes) {
  const auto& table = byte_to_unicode();
  std::string out;
  out.reserve(bytes.size() * 2);
  for (const char c : bytes) out += table[static_cast<unsigned char>(c)];
  return out;
}

size_t utf8_char_length(std::string_view text) {
  if (text.empty()) return 0;
  const auto byte = [&](size_t i) { return static_cast<unsigned char>(text[i]); };
  const unsigned char lead = byte(0);
  if (lead < 0x80) return 1;
  const auto continuation = [&](size_t i, unsigned char low = 0x80, unsigned char high = 0xBF) {
    return i < text.size() && byte(i) >= low && byte(i) <= high;
  };
  if (lead >= 0xC2 && lead <= 0xDF) return continuation(1) ? 2 : 0;
  if (lead >= 0xE0 && lead <= 0xEF) {
    const unsigned char low = lead == 0xE0 ? 0xA0 : 0x80;   // no overlong forms
    const unsigned char high = lead == 0xED ? 0x9F : 0xBF;  // no surrogates
    return continuation(1, low, high) && continuation(2) ? 3 : 0;
  }
  if (lead >= 0xF0 && lead <= 0xF4) {
    const unsigned char low = lead == 0xF0 ? 0x90 : 0x80;
    const unsigned char high = lead == 0xF4 ? 0x8F : 0xBF;  // nothing past U+10FFFF
    return continuation(1, low, high) && continuation(2) && continuation(3) ? 4 : 0;
  }
  return 0;
}

bool is_valid_utf8(std::string_view text) {
  for (size_t at = 0; at < text.size();) {
    if (static_cast<unsigned char>(text[at]) < 0x80) {  // most of the text, skipped without a call
      ++at;
      continue;
    }
    const size_t length = utf8_char_length(text.substr(at));
    if (length == 0) return false;
    at += length;
  }
  return true;
}

// ---- PreTokenizerRegex -----------------------------------------------------------------------------------

namespace {

pcre2_code* as_code(void* code) {
  return static_cast<pcre2_code*>(code);
}

// One match-data block per thread: the compiled pattern is shared, match data must not be. One ovector
// pair is enough because only the whole match is used (pcre2 then returns 0 for patterns with groups).
pcre2_match_data* thread_match_data() {
  struct Holder {
    pcre2_match_data* data = pcre2_match_data_create(1, nullptr);
    ~Holder() { pcre2_match_data_free(data); }
  };
  thread_local Holder holder;
  return holder.data;
}

// `\s` and `\S` spelled as the Unicode White_Space property. Hugging Face's regex engine (Oniguruma) and
// Unicode define \s that way; PCRE2's \s (with UCP) also matches U+180E MONGOLIAN VOWEL SEPARATOR, which
// stopped being a space in Unicode 6.3, and would split such text differently.
std::string with_unicode_white_space(const std::string& pattern) {
  std::string out;
  out.reserve(pattern.size() + 32);
  bool quoted = false;  // inside \Q...\E, where backslashes are literal
  for (size_t i = 0; i < pattern.size(); ++i) {
    if (pattern[i] != '\\' || i + 1 == pattern.size()) {
      out += pattern[i];
      continue;
    }
    const char next = pattern[++i];
    if (quoted) {
      quoted = next != 'E';
      out += '\\';
      out += next;
    } else if (next == 's' || next == 'S') {
      out += next == 's' ? "\\p{White_Space}" : "\\P{White_Space}";
    } else {
      quoted = next == 'Q';
      out += '\\';
      out += next;
    }
  }
  return out;
}

}  // namespace

PreTokenizerRegex::PreTokenizerRegex(const std::string& pattern, bool literal, const std::string& where)
    : pattern_(pattern), literal_(literal), where_(where) {
  // MATCH_INVALID_UTF: text that is not valid UTF-8 is matched (invalid bytes end up in the pieces between
  // matches) instead of rejected, so any bytes can be encoded; it also drops the per-call UTF check, which
  // would otherwise rescan the rest of the text at every match.
  uint32_t options = PCRE2_UTF | PCRE2_MATCH_INVALID_UTF;
  options |= literal ? PCRE2_LITERAL : PCRE2_UCP;  // UCP: \s, \p{L} ... by Unicode properties
  const std::string compiled = literal ? pattern : with_unicode_white_space(pattern);
  int error_code = 0;
  PCRE2_SIZE error_offset = 0;
  pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(compiled.data()), compiled.size(), options,
                                   &error_code, &error_offset, nullptr);
  if (code == nullptr) {
    PCRE2_UCHAR message[256];
    pcre2_get_error_message(error_code, message, sizeof(message));
    fail(where, "a pre_tokenizer regex that PCRE2 compiles",
         shown(pattern) + ": " + reinterpret_cast<const char*>(message) + " (at offset " +
             std::to_string(error_offset) + " of " + shown(compiled) + ")");
  }
  code_ = code;
  jit_ = pcre2_jit_compile(code, PCRE2_JIT_COMPLETE) == 0;
}

PreTokenizerRegex::PreTokenizerRegex(PreTokenizerRegex&& other) noexcept
    : pattern_(std::move(other.pattern_)),
      literal_(other.literal_),
      where_(std::move(other.where_)),
      code_(std::exchange(other.code_, nullptr)),
      jit_(other.jit_) {}

PreTokenizerRegex& PreTokenizerRegex::operator=(PreTokenizerRegex&& other) noexcept {
  if (this != &other) {
    pcre2_code_free(as_code(code_));
    pattern_ = std::move(other.pattern_);
    literal_ = other.literal_;
    where_ = std::move(other.where_);
    code_ = std::exchange(other.code_, nullptr);
    jit_ = other.jit_;
  }
  return *this;
}

PreTokenizerRegex::~PreTokenizerRegex() {
  pcre2_code_free(as_code(code_));
}

void PreTokenizerRegex::split(std::string_view text, std::vector<std::string_view>& pieces) const {
  pcre2_match_data* match_data = thread_match_data();
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  const PCRE2_SIZE* ovector = pcre2_get_ovector_pointer(match_data);
  size_t piece_start = 0;  // where the text not yet emitted begins
  size_t search = 0;
  uint32_t options = 0;
  while (search <= text.size()) {
    const int rc =
        jit_ ? pcre2_jit_match(as_code(code_), subject, text.size(), search, options, match_data, nullptr)
             : pcre2_match(as_code(code_), subject, text.size(), search, options, match_data, nullptr);
    if (rc == PCRE2_ERROR_NOMATCH) break;
    if (rc < 0) {
      PCRE2_UCHAR message[256];
      pcre2_get_error_message(rc, message, sizeof(message));
      fail(where_, "text the pre_tokenizer regex can match", reinterpret_cast<const char*>(message));
    }
    const size_t start = ovector[0];
    const size_t end = ovector[1];
    if (start > piece_start) pieces.push_back(text.substr(piece_start, start - piece_start));
    if (end > start) pieces.push_back(text.substr(start, end - start));
    piece_start = std::max(piece_start, end);
    search = end;
    // After an empty match, look for the next match that is not empty at the same place.
    options = end == start ? PCRE2_NOTEMPTY_ATSTART : 0;
  }
  if (piece_start < text.size()) pieces.push_back(text.substr(piece_start));
}

// ---- PairMap ---------------------------------------------------------------------------------------------

void PairMap::reset(size_t expected_entries) {
  size_t capacity = 16;
  while (capacity < expected_entries * 2) capacity *= 2;
  keys_.assign(capacity, kEmpty);
  values_.assign(capacity, Value{0, 0});
  mask_ = capacity - 1;
  shift_ = 64 - std::countr_zero(capacity);
}

void PairMap::insert(int32_t left, int32_t right, Value value) {
  const uint64_t key = pack(left, right);
  size_t slot = hash(key);
  while (keys_[slot] != kEmpty && keys_[slot] != key) slot = (slot + 1) & mask_;
  keys_[slot] = key;
  values_[slot] = value;
}

// ---- BpeModel --------------------------------------------------------------------------------------------

void BpeModel::finalize() {
  const std::string where = where_of(*this);
  byte_ids.fill(-1);
  for (size_t id = 0; id < token_bytes.size(); ++id) {
    if (token_present[id] && !token_verbatim[id] && token_bytes[id].size() == 1) {
      byte_ids[static_cast<unsigned char>(token_bytes[id][0])] = static_cast<int32_t>(id);
    }
  }
  for (int byte = 0; byte < 256; ++byte) {
    if (byte_ids[byte] < 0) {
      char hex[8];
      std::snprintf(hex, sizeof(hex), "0x%02X", byte);
      fail(where, "a token for each of the 256 bytes (a byte-level BPE vocabulary)",
           std::string("no token for byte ") + hex + " (written " + shown(byte_to_unicode()[byte]) + ")");
    }
  }
  pair_map.reset(merges.size());
  for (size_t rank = 0; rank < merges.size(); ++rank) {
    // A pair listed twice keeps its later rank, as Hugging Face's and GPT-2's loaders do.
    pair_map.insert(merges[rank].left, merges[rank].right,
                    PairMap::Value{static_cast<int32_t>(rank), merges[rank].merged});
  }

  vocab_size = static_cast<int64_t>(token_bytes.size());
  for (const AddedToken& token : added_tokens) {
    vocab_size = std::max<int64_t>(vocab_size, int64_t{token.id} + 1);
  }
  decode_table.assign(static_cast<size_t>(vocab_size), std::string());
  decode_present.assign(static_cast<size_t>(vocab_size), 0);
  for (size_t id = 0; id < token_bytes.size(); ++id) {
    decode_table[id] = token_bytes[id];
    decode_present[id] = token_present[id];
  }
  added_by_first_byte.assign(256, {});
  added_first_byte.fill(0);
  for (size_t i = 0; i < added_tokens.size(); ++i) {
    const AddedToken& token = added_tokens[i];
    decode_table[token.id] = token.content;
    decode_present[token.id] = 1;
    const auto first = static_cast<unsigned char>(token.content[0]);
    added_by_first_byte[first].push_back(static_cast<int32_t>(i));
    added_first_byte[first] = 1;
  }
  for (auto& candidates : added_by_first_byte) {
    std::stable_sort(candidates.begin(), candidates.end(), [&](int32_t a, int32_t b) {
      return added_tokens[a].content.size() > added_tokens[b].content.size();
    });
  }
  whole_token_ids.clear();
  if (ignore_merges) {
    for (size_t id = 0; id < token_bytes.size(); ++id) {
      if (token_present[id] && !token_verbatim[id]) whole_token_ids.emplace_back(token_bytes[id], id);
    }
    std::sort(whole_token_ids.begin(), whole_token_ids.end());
  }
  eos_id = -1;
  for (const AddedToken& token : added_tokens) {
    if (token.content == "<|endoftext|>") eos_id = token.id;
  }
  for (size_t id = 0; eos_id < 0 && id < token_bytes.size(); ++id) {
    if (token_present[id] && token_bytes[id] == "<|endoftext|>") eos_id = static_cast<int32_t>(id);
  }
  cache_owner = next_cache_owner.fetch_add(1);
}

namespace {

// Appends the ids of `text` to `out`.
void encode_text(const BpeModel& model, std::string_view text, std::vector<int32_t>& out) {
  size_t segment_start = 0;
  size_t at = 0;
  // Added tokens first, on the raw text, leftmost then longest (Hugging Face's order).
  while (!model.added_tokens.empty() && at < text.size()) {
    const auto first = static_cast<unsigned char>(text[at]);
    if (!model.added_first_byte[first]) {
      ++at;
      continue;
    }
    const AddedToken* match = nullptr;
    for (const int32_t index : model.added_by_first_byte[first]) {
      const AddedToken& token = model.added_tokens[index];
      if (text.compare(at, token.content.size(), token.content) == 0) {
        match = &token;
        break;
      }
    }
    if (match == nullptr) {
      ++at;
      continue;
    }
    size_t start = at;
    size_t end = at + match->content.size();
    uint32_t code_point = 0;
    size_t length = 0;
    if (match->single_word) {
      const bool word_before =
          previous_code_point(text, 0, start, code_point, length) && is_word_character(code_point);
      const bool word_after = next_code_point(text, end, code_point, length) && is_word_character(code_point);
      if (word_before || word_after) {
        at = end;  // Hugging Face skips the whole rejected match
        continue;
      }
    }
    if (match->lstrip) {
      while (previous_code_point(text, segment_start, start, code_point, length) &&
             is_white_space(code_point)) {
        start -= length;
      }
    }
    if (match->rstrip) {
      while (next_code_point(text, end, code_point, length) && is_white_space(code_point)) end += length;
    }
    encode_segment(model, text.substr(segment_start, start - segment_start), out);
    out.push_back(match->id);
    segment_start = at = end;
  }
  encode_segment(model, text.substr(segment_start), out);
}

uint64_t fnv1a(uint64_t hash, std::string_view bytes) {
  for (const char c : bytes) hash = (hash ^ static_cast<unsigned char>(c)) * 0x100000001b3ull;
  return hash;
}

uint64_t fnv1a_number(uint64_t hash, int64_t value) {
  char bytes[8];
  std::memcpy(bytes, &value, sizeof(bytes));
  return fnv1a(hash, std::string_view(bytes, sizeof(bytes)));
}

}  // namespace
}  // namespace tokenizer_detail

// ---- Tokenizer -------------------------------------------------------------------------------------------

using tokenizer_detail::BpeModel;

Tokenizer::Tokenizer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Tokenizer::Tokenizer(Tokenizer&&) noexcept = default;
Tokenizer& Tokenizer::operator=(Tokenizer&&) noexcept = default;
Tokenizer::~Tokenizer() = default;

std::vector<int32_t> Tokenizer::encode(std::string_view text) const {
  std::vector<int32_t> out;
  out.reserve(text.size() / 3 + 8);
  tokenizer_detail::encode_text(impl_->model, text, out);
  return out;
}

void Tokenizer::encode_append(std::string_view text, std::vector<int32_t>& out) const {
  tokenizer_detail::encode_text(impl_->model, text, out);
}

std::string Tokenizer::decode(const std::vector<int32_t>& ids) const {
  const BpeModel& model = impl_->model;
  std::string out;
  out.reserve(ids.size() * 4);
  for (size_t i = 0; i < ids.size(); ++i) {
    const int32_t id = ids[i];
    if (id < 0 || id >= model.vocab_size || !model.decode_present[id]) {
      fail(tokenizer_detail::where_of(model),
           "token ids the tokenizer defines (0 to " + std::to_string(model.vocab_size - 1) + ")",
           "id " + std::to_string(id) + " at position " + std::to_string(i));
    }
    out += model.decode_table[id];
  }
  return out;
}

std::string Tokenizer::token_string(int32_t id) const {
  const BpeModel& model = impl_->model;
  for (const tokenizer_detail::AddedToken& added : model.added_tokens) {
    if (added.id == id) return added.content;
  }
  const auto index = static_cast<size_t>(id);
  if (id < 0 || index >= model.token_bytes.size() || !model.token_present[index]) {
    fail(tokenizer_detail::where_of(model),
         "token ids the tokenizer defines (0 to " + std::to_string(model.vocab_size - 1) + ")",
         "id " + std::to_string(id));
  }
  return model.token_verbatim[index] ? model.token_bytes[index]
                                     : tokenizer_detail::bytes_to_unicode(model.token_bytes[index]);
}

int64_t Tokenizer::vocab_size() const {
  return impl_->model.vocab_size;
}

std::optional<int32_t> Tokenizer::eos_id() const {
  if (impl_->model.eos_id < 0) return std::nullopt;
  return impl_->model.eos_id;
}

const std::string& Tokenizer::source_path() const {
  return impl_->model.source_path;
}

namespace {

// FNV-1a 64 over what fixes the meaning of every id (vocabulary, merges, added tokens), each field length-
// prefixed so different contents cannot run together into the same byte stream. 16 lowercase hex digits.
std::string identity_of(const BpeModel& model) {
  using tokenizer_detail::fnv1a;
  using tokenizer_detail::fnv1a_number;
  uint64_t hash = fnv1a(0xcbf29ce484222325ull, "meshtrain-bpe-v1");
  hash = fnv1a_number(hash, static_cast<int64_t>(model.token_bytes.size()));
  for (size_t id = 0; id < model.token_bytes.size(); ++id) {
    if (!model.token_present[id]) continue;
    hash = fnv1a_number(hash, static_cast<int64_t>(id));
    hash = fnv1a_number(hash, model.token_verbatim[id]);
    hash = fnv1a_number(hash, static_cast<int64_t>(model.token_bytes[id].size()));
    hash = fnv1a(hash, model.token_bytes[id]);
  }
  hash = fnv1a_number(hash, static_cast<int64_t>(model.merges.size()));
  for (const auto& merge : model.merges) {
    hash = fnv1a_number(hash, merge.left);
    hash = fnv1a_number(hash, merge.right);
  }
  hash = fnv1a_number(hash, static_cast<int64_t>(model.added_tokens.size()));
  for (const auto& token : model.added_tokens) {
    hash = fnv1a_number(hash, token.id);
    hash = fnv1a_number(hash, token.special);
    hash = fnv1a_number(hash, static_cast<int64_t>(token.content.size()));
    hash = fnv1a(hash, token.content);
  }
  char text[17];
  std::snprintf(text, sizeof(text), "%016llx", static_cast<unsigned long long>(hash));
  return text;
}

}  // namespace

std::string Tokenizer::identity() const {
  std::call_once(impl_->identity_once, [this] { impl_->identity = identity_of(impl_->model); });
  return impl_->identity;
}

}  // namespace meshtrain
