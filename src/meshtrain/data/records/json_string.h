// JSON strings scanned 16 bytes at a time: the fast paths of the JSON Lines reader and the tokenizer loader,
// which give up (and leave the decision to nlohmann's parser) wherever these return false.
#pragma once

#include <string>

namespace meshtrain {

// The first byte from `at` that ends a JSON string's plain run ('"', '\\' or a control character, below
// 0x20), 16 bytes at a time (SSE2, in every x86-64): a document's text is mostly plain runs.
const char* plain_run_end(const char* at, const char* end);

// At a '"': moves `at` past the string's closing quote, unescaped into `out` (skipped when null). False, with
// `at` anywhere, for a control character, an unknown escape, a lone surrogate or a string cut short. UTF-8 is
// not checked.
bool scan_json_string(const char*& at, const char* end, std::string* out);

// A scanner's position in JSON text, with the steps every scanner takes.
class JsonCursor {
 protected:
  JsonCursor(const char* at, const char* end) : at_(at), end_(end) {}

  bool next_is(char expected) {
    if (at_ == end_ || *at_ != expected) return false;
    ++at_;
    return true;
  }
  void skip_space() {
    while (at_ != end_ && (*at_ == ' ' || *at_ == '\t' || *at_ == '\n' || *at_ == '\r')) ++at_;
  }

  const char* at_;
  const char* end_;
};

}  // namespace meshtrain
