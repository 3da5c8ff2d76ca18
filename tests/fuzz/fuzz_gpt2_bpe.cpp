// GPT-2's original tokenizer files (data/tokenizer/tokenizer.h) on arbitrary bytes: the input is
// encoder.json, then after fuzz::kFileSeparator vocab.bpe; a tokenizer that loads then encodes and decodes a
// short text.
#include <cstdint>
#include <string_view>
#include <vector>

#include "fuzz_files.h"
#include "meshtrain/core/error.h"
#include "meshtrain/data/tokenizer/tokenizer.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace meshtrain;
  const std::vector<std::string_view> files = fuzz::split_files(data, size, 2);
  fuzz::write_scratch_file("gpt2/encoder.json", files[0]);
  fuzz::write_scratch_file("gpt2/vocab.bpe", files[1]);
  try {
    const Tokenizer tokenizer = Tokenizer::load((fuzz::scratch_directory() / "gpt2").string());
    const std::string_view text = "Hello world, caf\xc3\xa9 \xf0\x9f\x99\x82 \xc3\x28 <|endoftext|>  \n\t42";
    tokenizer.decode(tokenizer.encode(text));
    tokenizer.identity();
  } catch (const MeshError&) {
    // A rejected pair of files is the expected outcome for most inputs.
  }
  return 0;
}
