// Token shards (data/shards.h) on arbitrary bytes: the header, size and checksum are validated, then every
// token is read as the loader reads them.
#include <cstdint>
#include <vector>

#include "fuzz_files.h"
#include "meshtrain/core/error.h"
#include "meshtrain/data/shards.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace meshtrain;
  const std::string path =
      fuzz::write_scratch_file("train.tokens", {reinterpret_cast<const char*>(data), size});
  try {
    const TokenShard shard = TokenShard::open(path);
    std::vector<int32_t> tokens(shard.size());
    shard.read(0, tokens.size(), tokens.data());
    for (uint64_t i = 0; i < shard.size(); ++i) {
      if (shard[i] != tokens[i] || shard[i] > shard.max_token()) __builtin_trap();
    }
  } catch (const MeshError&) {
    // A rejected file is the expected outcome for most inputs.
  }
  return 0;
}
