// JSON strings scanned 16 bytes at a time (json_string.h).
#include "meshtrain/data/records/json_string.h"

#include <emmintrin.h>

#include <cstdint>

namespace meshtrain {
namespace {

bool hex4(const char*& at, const char* end, uint32_t& code) {
  if (end - at < 4) return false;
  for (int i = 0; i < 4; ++i) {
    const char c = *at++;
    const int digit = c >= '0' && c <= '9'   ? c - '0'
                      : c >= 'a' && c <= 'f' ? c - 'a' + 10
                      : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                             : -1;
    if (digit < 0) return false;
    code = code * 16 + static_cast<uint32_t>(digit);
  }
  return true;
}

void append_utf8(uint32_t code, std::string& out) {
  if (code < 0x80) {
    out.push_back(static_cast<char>(code));
  } else if (code < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (code >> 6)));
    out.push_back(static_cast<char>(0x80 | (code & 0x3F)));
  } else if (code < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (code >> 12)));
    out.push_back(static_cast<char>(0x80 | ((code >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (code & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (code >> 18)));
    out.push_back(static_cast<char>(0x80 | ((code >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((code >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (code & 0x3F)));
  }
}

}  // namespace

const char* plain_run_end(const char* at, const char* end) {
  const __m128i quote = _mm_set1_epi8('"'), backslash = _mm_set1_epi8('\\'),
                last_control = _mm_set1_epi8(0x1F);
  while (end - at >= 16) {
    const __m128i bytes = _mm_loadu_si128(reinterpret_cast<const __m128i*>(at));
    const __m128i control = _mm_cmpeq_epi8(_mm_min_epu8(bytes, last_control), bytes);  // bytes <= 0x1F
    const __m128i special =
        _mm_or_si128(_mm_or_si128(_mm_cmpeq_epi8(bytes, quote), _mm_cmpeq_epi8(bytes, backslash)), control);
    const auto mask = static_cast<unsigned>(_mm_movemask_epi8(special));
    if (mask != 0) return at + __builtin_ctz(mask);
    at += 16;
  }
  while (at != end && *at != '"' && *at != '\\' && static_cast<unsigned char>(*at) >= 0x20) ++at;
  return at;
}

bool scan_json_string(const char*& at, const char* end, std::string* out) {
  ++at;
  while (true) {
    const char* run = at;
    at = plain_run_end(at, end);
    if (out != nullptr) out->append(run, at);
    if (at == end || static_cast<unsigned char>(*at) < 0x20) return false;
    if (*at++ == '"') return true;
    if (at == end) return false;
    const char escape = *at++;
    char plain = 0;
    switch (escape) {
      case '"':
        plain = '"';
        break;
      case '\\':
        plain = '\\';
        break;
      case '/':
        plain = '/';
        break;
      case 'b':
        plain = '\b';
        break;
      case 'f':
        plain = '\f';
        break;
      case 'n':
        plain = '\n';
        break;
      case 'r':
        plain = '\r';
        break;
      case 't':
        plain = '\t';
        break;
      case 'u': {
        uint32_t code = 0;
        if (!hex4(at, end, code)) return false;
        if (code >= 0xDC00 && code <= 0xDFFF) return false;  // a low surrogate first
        if (code >= 0xD800 && code <= 0xDBFF) {
          uint32_t low = 0;
          if (end - at < 2 || at[0] != '\\' || at[1] != 'u') return false;
          at += 2;
          if (!hex4(at, end, low) || low < 0xDC00 || low > 0xDFFF) return false;
          code = 0x10000 + ((code - 0xD800) << 10) + (low - 0xDC00);
        }
        if (out != nullptr) append_utf8(code, *out);
        continue;
      }
      default:
        return false;
    }
    if (out != nullptr) out->push_back(plain);
  }
}

}  // namespace meshtrain
