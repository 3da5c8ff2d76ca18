// `meshtrain generate --checkpoint DIR (--prompt TEXT | --prompt-ids IDS) [--max-new-tokens N --temperature T
// --top-k K --top-p P --seed S --output text|ids|logits]`: samples a continuation of a prompt from a trained
// checkpoint, on the CPU, with a KV cache. --output ids writes one JSON line {"prompt": [ids], "generated":
// [ids]} instead of the text (the flags and their help: commands.cpp).
#pragma once

#include <ostream>
#include <string>
#include <vector>

namespace meshtrain {

// DIR is a checkpoint directory (step_<N>/), or a checkpoints directory or run_dir, where the newest
// committed checkpoint is used. The model is rebuilt from the checkpoint's own resolved config and its
// tokenizer copy, when it has one. Writes the prompt, then the generated text as each token is decoded, then
// a newline; generation stops at the tokenizer's EOS or after N new tokens. The same flags (and --seed) give
// the same text. Defaults: N = 100, T = 0.8 (0: greedy), K = 0 (off), P = 1.0 (off), S = 0.
// IDS: "5,17,3" or "@FILE" (a JSON array of ids, as `meshtrain tokenize` writes); a checkpoint without a
// tokenizer copy takes --prompt-ids only and writes ids (or logits), with no EOS to stop at.
// Bad flags, a missing checkpoint, --prompt or text output without a tokenizer, ids outside the model's
// vocab_size and an empty prompt are MeshErrors with a hint. Returns 0.
int run_generate(const std::vector<std::string>& arguments, std::ostream& out);

}  // namespace meshtrain
