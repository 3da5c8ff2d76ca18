#include "meshtrain/data/tokenizer/compressed_tokenizer.h"

#include <unicode/uchar.h>
#include <unicode/unorm2.h>
#include <unicode/ustring.h>
#include <unicode/utf16.h>

#include <unordered_map>

#include "meshtrain/core/error.h"
#include "meshtrain/data/tokenizer/tokenizer_impl.h"

namespace meshtrain {
namespace {

std::u16string to_utf16(std::string_view text) {
  UErrorCode status = U_ZERO_ERROR;
  std::u16string out(text.size() + 1, u'\0');  // one UTF-16 unit per UTF-8 byte is always enough
  int32_t length = 0;
  u_strFromUTF8(out.data(), static_cast<int32_t>(out.size()), &length, text.data(),
                static_cast<int32_t>(text.size()), &status);
  MT_CHECK(U_SUCCESS(status), std::string("u_strFromUTF8: ") + u_errorName(status));
  out.resize(static_cast<size_t>(length));
  return out;
}

std::string to_utf8(const std::u16string& text) {
  UErrorCode status = U_ZERO_ERROR;
  std::string out(text.size() * 3 + 1, '\0');  // at most 3 UTF-8 bytes per UTF-16 unit
  int32_t length = 0;
  u_strToUTF8(out.data(), static_cast<int32_t>(out.size()), &length, text.data(),
              static_cast<int32_t>(text.size()), &status);
  MT_CHECK(U_SUCCESS(status), std::string("u_strToUTF8: ") + u_errorName(status));
  out.resize(static_cast<size_t>(length));
  return out;
}

std::u16string normalized(const UNormalizer2* normalizer, const std::u16string& text) {
  UErrorCode status = U_ZERO_ERROR;
  std::u16string out(text.size() * 4 + 16, u'\0');
  int32_t length = unorm2_normalize(normalizer, text.data(), static_cast<int32_t>(text.size()), out.data(),
                                    static_cast<int32_t>(out.size()), &status);
  if (status == U_BUFFER_OVERFLOW_ERROR) {
    status = U_ZERO_ERROR;
    out.assign(static_cast<size_t>(length) + 1, u'\0');
    length = unorm2_normalize(normalizer, text.data(), static_cast<int32_t>(text.size()), out.data(),
                              static_cast<int32_t>(out.size()), &status);
  }
  MT_CHECK(U_SUCCESS(status), std::string("unorm2_normalize: ") + u_errorName(status));
  out.resize(static_cast<size_t>(length));
  return out;
}

// The code points of UTF-16 text.
std::vector<UChar32> code_points(const std::u16string& text) {
  std::vector<UChar32> points;
  for (int32_t i = 0; i < static_cast<int32_t>(text.size());) {
    UChar32 c = 0;
    U16_NEXT(text.data(), i, static_cast<int32_t>(text.size()), c);
    points.push_back(c);
  }
  return points;
}

void append(std::u16string& out, UChar32 c) {
  UChar units[2];
  int32_t length = 0;
  UBool error = false;
  U16_APPEND(units, length, 2, c, error);
  MT_CHECK(!error, "a code point fits two UTF-16 units");
  out.append(units, static_cast<size_t>(length));
}

}  // namespace

std::string engram_normalize(std::string_view text) {
  UErrorCode status = U_ZERO_ERROR;
  const UNormalizer2* nfkc = unorm2_getNFKCInstance(&status);
  const UNormalizer2* nfd = unorm2_getNFDInstance(&status);
  MT_CHECK(U_SUCCESS(status), std::string("ICU normalizer data: ") + u_errorName(status));
  const std::u16string decomposed = normalized(nfd, normalized(nfkc, to_utf16(text)));
  // Strip nonspacing marks, lowercase each code point alone, collapse runs of [ \t\r\n].
  std::u16string lowered;
  bool in_space_run = false;
  for (UChar32 c : code_points(decomposed)) {
    if (u_charType(c) == U_NON_SPACING_MARK) continue;
    std::u16string one;
    append(one, c);
    std::u16string lower(8, u'\0');
    status = U_ZERO_ERROR;
    const int32_t length = u_strToLower(lower.data(), static_cast<int32_t>(lower.size()), one.data(),
                                        static_cast<int32_t>(one.size()), "", &status);
    MT_CHECK(U_SUCCESS(status), std::string("u_strToLower: ") + u_errorName(status));
    lower.resize(static_cast<size_t>(length));
    for (UChar32 l : code_points(lower)) {
      const bool space = l == ' ' || l == '\t' || l == '\r' || l == '\n';
      if (space && in_space_run) continue;
      in_space_run = space;
      append(lowered, space ? UChar32{' '} : l);
    }
  }
  if (lowered == u" ") return " ";
  std::vector<UChar32> points = code_points(lowered);
  size_t begin = 0, end = points.size();
  while (begin < end && u_hasBinaryProperty(points[begin], UCHAR_WHITE_SPACE)) ++begin;
  while (end > begin && u_hasBinaryProperty(points[end - 1], UCHAR_WHITE_SPACE)) --end;
  std::u16string trimmed;
  for (size_t i = begin; i < end; ++i) append(trimmed, points[i]);
  return to_utf8(trimmed);
}

CompressedVocabulary compress_vocabulary(const Tokenizer& tokenizer) {
  CompressedVocabulary vocabulary;
  std::unordered_map<std::string, int32_t> ids_by_key;
  const int64_t V = tokenizer.vocab_size();
  vocabulary.compress.reserve(static_cast<size_t>(V));
  for (int64_t id = 0; id < V; ++id) {
    const auto token = static_cast<int32_t>(id);
    const std::string text = tokenizer.decode({token});
    // Hugging Face decodes lossily: a token that is part of a UTF-8 character shows U+FFFD.
    const bool partial =
        !tokenizer_detail::is_valid_utf8(text) || text.find("\xEF\xBF\xBD") != std::string::npos;
    std::string key;
    if (partial) {
      key = tokenizer.token_string(token);
    } else {
      key = engram_normalize(text);
      if (key.empty()) key = text;
    }
    const auto [entry, added] = ids_by_key.emplace(std::move(key), static_cast<int32_t>(ids_by_key.size()));
    vocabulary.compress.push_back(entry->second);
  }
  vocabulary.size = static_cast<int64_t>(ids_by_key.size());
  return vocabulary;
}

}  // namespace meshtrain
