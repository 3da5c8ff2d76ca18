// Tokenizer encode (data/tokenizer/tokenizer.h) of arbitrary bytes with the real Qwen3 and GPT-2 tokenizers,
// checking the round trips the tokenizers promise: GPT-2 gives back every byte string, Qwen3 (which
// normalises to NFC) every string of bytes below 0xCC (characters below U+0300, which NFC leaves alone).
#include <algorithm>
#include <cstdint>
#include <string_view>

#include "shared_tokenizers.h"

// Loads the tokenizers before fuzzing starts, so their time is not counted against the first input's timeout.
extern "C" int LLVMFuzzerInitialize(int*, char***) {
  meshtrain::fuzz::shared_tokenizers();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const meshtrain::fuzz::SharedTokenizers& tokenizers = meshtrain::fuzz::shared_tokenizers();
  if (!tokenizers.gpt2) return 0;
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  if (tokenizers.gpt2->decode(tokenizers.gpt2->encode(text)) != text) __builtin_trap();
  const std::string qwen3_text = tokenizers.qwen3->decode(tokenizers.qwen3->encode(text));
  const bool below_0xcc =
      std::all_of(text.begin(), text.end(), [](char c) { return static_cast<uint8_t>(c) < 0xCC; });
  if (below_0xcc && qwen3_text != text) __builtin_trap();  // a broken round trip is a finding too
  return 0;
}
