// The real tokenizers of ../shared/assets/tokenizers (Qwen3's tokenizer.json, GPT-2's encoder.json +
// vocab.bpe), loaded once per process; null where this checkout has no ../shared (the targets then skip).
#pragma once

#include <cstdio>
#include <filesystem>
#include <memory>

#include "fuzz_files.h"
#include "meshtrain/data/tokenizer/tokenizer.h"

namespace meshtrain::fuzz {

struct SharedTokenizers {
  std::unique_ptr<Tokenizer> qwen3, gpt2;
};

inline const SharedTokenizers& shared_tokenizers() {
  static const SharedTokenizers tokenizers = [] {
    SharedTokenizers loaded;
    const std::filesystem::path assets = shared_directory() / "assets" / "tokenizers";
    if (!std::filesystem::is_directory(assets)) {
      std::fprintf(stderr, "SKIP: no tokenizers in %s (every input is ignored)\n", assets.c_str());
      return loaded;
    }
    loaded.qwen3 =
        std::make_unique<Tokenizer>(Tokenizer::load((assets / "qwen3" / "tokenizer.json").string()));
    loaded.gpt2 = std::make_unique<Tokenizer>(Tokenizer::load((assets / "gpt2").string()));
    return loaded;
  }();
  return tokenizers;
}

}  // namespace meshtrain::fuzz
