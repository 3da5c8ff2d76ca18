// `meshtrain generate --checkpoint DIR --prompt TEXT [--max-new-tokens N --temperature T --top-k K --top-p P
// --seed S --output text|ids]`: samples a continuation of a prompt from a trained checkpoint, on the CPU,
// with a KV cache. --output ids writes one JSON line {"prompt": [ids], "generated": [ids]} instead of the
// text.
#pragma once

#include <ostream>
#include <string>
#include <vector>

namespace meshtrain {

// DIR is a checkpoint directory (step_<N>/), or a checkpoints directory or run_dir, where the newest
// committed checkpoint is used. The model is rebuilt from the checkpoint's own resolved config and its
// tokenizer copy. Writes the prompt, then the generated text as each token is decoded, then a newline;
// generation stops at the tokenizer's EOS or after N new tokens. The same flags (and --seed) give the same
// text. Defaults: N = 100, T = 0.8 (0: greedy), K = 0 (off), P = 1.0 (off), S = 0.
// Bad flags, a missing checkpoint or tokenizer, and an empty prompt are MeshErrors with a hint. Returns 0.
int run_generate(const std::vector<std::string>& arguments, std::ostream& out);

}  // namespace meshtrain
