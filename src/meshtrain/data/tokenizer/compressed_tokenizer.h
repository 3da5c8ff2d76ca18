// Engram's compressed tokenizer (shared/specs/engram.md section 1): a many-to-one map of a tokenizer's ids
// onto the ids of their normalised texts, so n-gram hashes see "The", " the" and "THE" as one token. Built
// the way DeepSeek's Engram reference builds it with Hugging Face `tokenizers`: each id decoded alone
// (special tokens kept); a text that is not whole UTF-8 (or holds U+FFFD) keys by the raw token string, any
// other by engram_normalize(text), or by the text itself when that normalises to empty; new ids in
// first-seen order over ids 0..V-1.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "meshtrain/data/tokenizer/tokenizer.h"

namespace meshtrain {

struct CompressedVocabulary {
  std::vector<int32_t> compress;  // [V]: token id -> compressed id in [0, size)
  int64_t size = 0;               // Vc

  // Negative ids (padding) pass through unchanged.
  int32_t operator()(int32_t id) const { return id < 0 ? id : compress.at(static_cast<size_t>(id)); }
};

CompressedVocabulary compress_vocabulary(const Tokenizer& tokenizer);

// The key text of a token, as Hugging Face's normalizers.Sequence in the reference: NFKC, NFD, strip
// nonspacing marks (general category Mn, as StripAccents), lowercase each code point (full mappings, no
// context, as Rust's char::to_lowercase), each run of [ \t\r\n] to one space, then trim Unicode white space
// at both ends unless the whole text is one space. `text` is valid UTF-8.
std::string engram_normalize(std::string_view text);

}  // namespace meshtrain
