// UTF-8 checks and one text file as one document (text_files.h): the rules `meshtrain prepare --corpus`,
// dataset_type=text and the record reader's text files share.
#include "meshtrain/data/records/text_files.h"

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "meshtrain/core/durable_file.h"
#include "meshtrain/core/error.h"

namespace meshtrain {
namespace {

constexpr size_t kSniffBytes = 64 * 1024;

// Rejects files that are not text: a NUL byte or invalid UTF-8 in the first 64 KiB.
void check_text(const std::string& path, const std::string& text, const std::string& path_setting) {
  const std::string_view sniff(text.data(), std::min(text.size(), kSniffBytes));
  const bool is_prefix = sniff.size() < text.size();
  const std::string hint =
      "remove the file or point " + path_setting + " at a folder holding only UTF-8 text files";
  for (size_t i = 0; i < sniff.size();) {
    if (sniff[i] == '\0') {
      fail(path, "a UTF-8 text file", "a NUL byte at offset " + std::to_string(i) + " (a binary file)", hint);
    }
    const int length = utf8_sequence(sniff, i);
    if (length < 0 && is_prefix) break;  // a character cut by the 64 KiB sniff limit
    if (length <= 0) {
      fail(path, "a UTF-8 text file",
           "invalid UTF-8 at byte offset " + std::to_string(i) + " (binary or another encoding)",
           hint + " (convert other encodings with iconv -t UTF-8)");
    }
    i += static_cast<size_t>(length);
  }
}

}  // namespace

int utf8_sequence(std::string_view bytes, size_t i) {
  const auto byte = [&](size_t k) { return static_cast<unsigned char>(bytes[k]); };
  const unsigned char lead = byte(i);
  if (lead < 0x80) return 1;
  int length;
  uint32_t minimum, code;
  if ((lead & 0xE0) == 0xC0) {
    length = 2, minimum = 0x80, code = lead & 0x1Fu;
  } else if ((lead & 0xF0) == 0xE0) {
    length = 3, minimum = 0x800, code = lead & 0x0Fu;
  } else if ((lead & 0xF8) == 0xF0) {
    length = 4, minimum = 0x10000, code = lead & 0x07u;
  } else {
    return 0;
  }
  for (int k = 1; k < length; ++k) {
    if (i + k >= bytes.size()) return -1;
    const unsigned char next = byte(i + k);
    if ((next & 0xC0) != 0x80) return 0;
    code = (code << 6) | (next & 0x3Fu);
  }
  if (code < minimum || code > 0x10FFFF || (code >= 0xD800 && code <= 0xDFFF)) return 0;
  return length;
}

size_t invalid_utf8_offset(std::string_view text) {
  for (size_t i = 0; i < text.size();) {
    // ASCII, most of most corpora: 32 bytes at a time while no byte has its high bit set, then 8.
    if (i + 4 * sizeof(uint64_t) <= text.size()) {
      uint64_t words[4];
      std::memcpy(words, text.data() + i, sizeof words);
      if (((words[0] | words[1] | words[2] | words[3]) & 0x8080808080808080u) == 0) {
        i += sizeof words;
        continue;
      }
    }
    if (i + sizeof(uint64_t) <= text.size()) {
      uint64_t word;
      std::memcpy(&word, text.data() + i, sizeof word);
      if ((word & 0x8080808080808080u) == 0) {
        i += sizeof word;
        continue;
      }
    }
    if (static_cast<unsigned char>(text[i]) < 0x80) {
      ++i;
      continue;
    }
    const int length = utf8_sequence(text, i);
    if (length <= 0) return i;
    i += static_cast<size_t>(length);
  }
  return std::string_view::npos;
}

std::string read_text_document(const std::string& path, const std::string& path_setting) {
  const std::string text = read_file_text(path, "text file", "check the file's permissions and the disk");
  if (text.empty()) fail(path, "a non-empty text file", "an empty file", "remove it or give it some text");
  check_text(path, text, path_setting);
  return text;
}

}  // namespace meshtrain
