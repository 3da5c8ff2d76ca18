// Hugging Face interchange (shared/specs/layers-and-checkpoints.md, "Hugging Face interchange"): a Hugging
// Face model folder (config.json, model.safetensors or shards with model.safetensors.index.json, the
// tokenizer) to a meshtrain checkpoint of parameters, and a meshtrain checkpoint back to such a folder.
// Both stream one tensor at a time, so a model larger than memory converts; both write under a temporary
// name and rename at the end, so nothing half-written is left looking complete.
#pragma once

#include <cstdint>
#include <ostream>
#include <string>
#include <vector>

#include "meshtrain/config/config.h"

namespace meshtrain {

struct HfImportOptions {
  std::string hf_directory;  // the Hugging Face folder
  std::string out;           // the checkpoint directory to create (must not exist)
  // A preset name or YAML the mapped config.json keys are laid over ("" : the family's preset), then
  // `overrides` (key=value) over those.
  std::string config;
  std::vector<std::string> overrides;
};

struct HfImportSummary {
  Config config;             // what the checkpoint's metadata.json holds
  int64_t file_tensors = 0;  // Hugging Face tensors read
  int64_t parameters = 0;    // engine parameter elements written
};

// Reads config.json into a meshtrain config, checks every tensor against it (names, shapes, dtypes; extra
// tensors are errors naming them, Hugging Face's non-trained buffers aside), and writes <out>/ with
// model.safetensors (float32, the engine's names and global shapes), the tokenizer when the folder has one,
// metadata.json (parameters only, step 0) and the commit marker. `log` gets one line per phase.
HfImportSummary import_hugging_face(const HfImportOptions& options, std::ostream& log);

struct HfExportOptions {
  std::string checkpoint;         // a checkpoint directory, or a run_dir / checkpoints directory (its newest)
  std::string out;                // the folder to create (must not exist)
  std::string dtype = "float32";  // float32, bfloat16 or float16 on disk
  uint64_t max_shard_bytes = 5000000000;  // larger weights go into shards with an index
};

// Writes <out>/ as transformers' save_pretrained would: config.json, generation_config.json, the weights
// (model.safetensors, or model-0000i-of-0000n.safetensors and model.safetensors.index.json), and the
// checkpoint's tokenizer with a tokenizer_config.json. The checkpoint's files are verified first.
void export_hugging_face(const HfExportOptions& options, std::ostream& log);

}  // namespace meshtrain
