// The distributed checkpoint's index.json (checkpoint/sharded_checkpoint.h) on arbitrary bytes, optionally
// followed (after fuzz::kFileSeparator) by the bytes of shards/rank_00000.safetensors: the index is checked,
// then every tensor it lists is read whole from its chunks, as a one-process load reads it.
#include <cstdint>
#include <vector>

#include "fuzz_files.h"
#include "meshtrain/checkpoint/sharded_checkpoint.h"
#include "meshtrain/core/error.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace meshtrain;
  const std::vector<std::string_view> files = fuzz::split_files(data, size, 2);
  fuzz::write_scratch_file(kShardIndexFile, files[0]);
  fuzz::write_scratch_file(rank_shard_file(0), files[1]);
  try {
    const ShardedCheckpoint checkpoint(fuzz::scratch_directory());
    for (const auto& [name, dims] : checkpoint.tensors()) {
      // A checked index's chunks cover each tensor exactly and lie inside files of the listed sizes, but
      // those sizes are the index's word: only tensors the input's bytes could hold are read.
      int64_t elements = 1;
      bool small = true;
      for (int64_t dim : dims) small = small && !__builtin_mul_overflow(elements, dim, &elements);
      if (!small || elements > static_cast<int64_t>(size)) continue;
      std::vector<float> values(static_cast<size_t>(elements));
      checkpoint.read_box(name, std::vector<int64_t>(dims.size(), 0), dims, values.data());
    }
  } catch (const MeshError&) {
    // A rejected index or shard is the expected outcome for most inputs.
  }
  return 0;
}
