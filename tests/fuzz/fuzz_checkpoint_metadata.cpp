// A checkpoint's metadata.json (checkpoint/checkpoint.h) on arbitrary bytes, in a checkpoint directory whose
// commit marker matches it (so every input gets past the marker to the metadata's own checks) and which holds
// the index and shard of the seed's checkpoint (fixtures/tiny_step1/, so an input listing them with their
// sizes and checksums, as the seed does, gets past the file checks to the load): loaded into a tiny Qwen3
// engine (full state, then parameters only), as a resume or load_parameters_path reads it, and its config
// rebuilt, as export-hf does.
#include <cstdint>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

#include "fuzz_files.h"
#include "meshtrain/checkpoint/checkpoint.h"
#include "meshtrain/config/config.h"
#include "meshtrain/core/crc32c.h"
#include "meshtrain/core/error.h"
#include "meshtrain/runtime/engine.h"

namespace {

// The model of the seed corpus's checkpoints (tests/fuzz/README.md, "Seeds").
meshtrain::Engine& tiny_engine() {
  static meshtrain::Engine engine(meshtrain::load_config(
      "qwen3-tiny",
      {"base_emb_dim=4", "base_num_query_heads=2", "base_num_kv_heads=1", "head_dim=2", "base_mlp_dim=4",
       "base_num_decoder_layers=1", "vocab_size=8", "max_target_length=4", "per_device_batch_size=1"}));
  return engine;
}

constexpr const char* kCheckpoint = "step_00000001";

}  // namespace

// Makes the engine and copies the checkpoint's other files before fuzzing starts, so their time is not
// counted against the first input's timeout.
extern "C" int LLVMFuzzerInitialize(int*, char***) {
  tiny_engine();
  std::filesystem::copy(MESHTRAIN_FUZZ_FIXTURES "/tiny_step1",
                        meshtrain::fuzz::scratch_directory() / kCheckpoint,
                        std::filesystem::copy_options::recursive);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace meshtrain;
  const std::string_view metadata(reinterpret_cast<const char*>(data), size);
  fuzz::write_scratch_file(std::string(kCheckpoint) + "/metadata.json", metadata);
  const nlohmann::json marker = {
      {"step", 1}, {"metadata_bytes", size}, {"metadata_crc32c", crc32c(metadata.data(), metadata.size())}};
  fuzz::write_scratch_file(std::string(kCheckpoint) + "/COMMITTED", marker.dump() + "\n");
  const std::string checkpoint = (fuzz::scratch_directory() / kCheckpoint).string();
  for (const bool parameters_only : {false, true}) {
    try {
      load_checkpoint(checkpoint, tiny_engine(), parameters_only);
    } catch (const MeshError&) {
      // A rejected metadata.json (or a file it lists that is absent or differs) is the expected outcome.
    }
  }
  try {
    checkpoint_config(checkpoint, {});
  } catch (const MeshError&) {
    // Likewise.
  }
  return 0;
}
