// The tokenizer.json loader (data/tokenizer/tokenizer.h) on arbitrary bytes; a tokenizer that loads then
// encodes and decodes a short text mixing ASCII, accents, an emoji, invalid UTF-8 and an added token's text.
#include <cstdint>
#include <string_view>

#include "fuzz_files.h"
#include "meshtrain/core/error.h"
#include "meshtrain/data/tokenizer/tokenizer.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace meshtrain;
  const std::string path =
      fuzz::write_scratch_file("tokenizer.json", {reinterpret_cast<const char*>(data), size});
  try {
    const Tokenizer tokenizer = Tokenizer::load(path);
    const std::string_view text =
        "Hello world, caf\xc3\xa9 e\xcc\x81 \xf0\x9f\x99\x82 \xc3\x28 <|endoftext|>  \n\t42";
    tokenizer.decode(tokenizer.encode(text));
    tokenizer.identity();
    if (tokenizer.eos_id()) tokenizer.token_string(*tokenizer.eos_id());
  } catch (const MeshError&) {
    // A rejected file is the expected outcome for most inputs.
  }
  return 0;
}
