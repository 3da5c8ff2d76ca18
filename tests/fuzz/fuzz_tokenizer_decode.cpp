// Tokenizer decode (data/tokenizer/tokenizer.h) of arbitrary ids with the real Qwen3 and GPT-2 tokenizers:
// the input is a list of little-endian int32 ids, decoded as they are (mostly undefined ids: a MeshError) and
// folded into [0, vocab_size + 1] (mostly defined ones). Each id's token_string is asked for too, and
// whatever GPT-2 decodes must come back from its encode.
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "meshtrain/core/error.h"
#include "shared_tokenizers.h"

namespace {

void decode_all(const meshtrain::Tokenizer& tokenizer, const std::vector<int32_t>& ids,
                bool check_round_trip) {
  for (const int32_t id : ids) {
    try {
      tokenizer.token_string(id);
    } catch (const meshtrain::MeshError&) {
      // An id the tokenizer does not define.
    }
  }
  try {
    const std::string text = tokenizer.decode(ids);
    if (check_round_trip && tokenizer.decode(tokenizer.encode(text)) != text) __builtin_trap();
  } catch (const meshtrain::MeshError&) {
    // Some id the tokenizer does not define.
  }
}

}  // namespace

// Loads the tokenizers before fuzzing starts, so their time is not counted against the first input's timeout.
extern "C" int LLVMFuzzerInitialize(int*, char***) {
  meshtrain::fuzz::shared_tokenizers();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const meshtrain::fuzz::SharedTokenizers& tokenizers = meshtrain::fuzz::shared_tokenizers();
  if (!tokenizers.gpt2) return 0;
  std::vector<int32_t> ids(size / sizeof(int32_t));
  if (!ids.empty()) std::memcpy(ids.data(), data, ids.size() * sizeof(int32_t));
  for (const meshtrain::Tokenizer* tokenizer : {tokenizers.gpt2.get(), tokenizers.qwen3.get()}) {
    const bool gpt2 = tokenizer == tokenizers.gpt2.get();
    decode_all(*tokenizer, ids, gpt2);
    std::vector<int32_t> folded = ids;
    const auto range = static_cast<uint32_t>(tokenizer->vocab_size() + 2);
    for (int32_t& id : folded) id = static_cast<int32_t>(static_cast<uint32_t>(id) % range);
    decode_all(*tokenizer, folded, gpt2);
  }
  return 0;
}
