// Checkpoints (shared/specs/layers-and-checkpoints.md, "Checkpoints"): one directory per step holding the
// parameters and Adam moments with GLOBAL logical shapes, a copy of the tokenizer, a metadata.json, and a
// commit marker written last, so an interrupted save never looks complete.
//
// Layout of <checkpoints_dir>:
//   step_00000042/                 a committed checkpoint (the only kind latest_checkpoint returns)
//     shards/rank_00000.bin ...    format 3 (what train saves): each rank's chunks of the parameters and
//     index.json                   moments ("adam_m/<name>", "adam_v/<name>"), and the index from every
//                                  tensor (per layer, by canonical name) to its chunks
//                                  (checkpoint/sharded_checkpoint.h)
//     model.safetensors            formats 1 and 2, and import-hf's parameter checkpoints: parameters named
//     as
//                                  the engine names them (per layer, or stacked per scan group with the layer
//                                  axis at param_scan_axis; checkpoint/checkpoint_layout.h); loading converts
//     optimizer.safetensors        formats 1 and 2: "adam_m/<name>", "adam_v/<name>"
//     tokenizer.json               copy of the run's tokenizer (or encoder.json + vocab.bpe), if any
//     engram.safetensors           models with Engram: the compressed vocabulary ("compress" [V], "pad_id"),
//                                  and per Engram layer its hash multipliers and table sizes
//                                  ("layers_<i>/multipliers" [N], "layers_<i>/table_sizes" [N - 1, H])
//     metadata.json                format version, step, resolved config, layout, mesh, rng, data cursor,
//                                  tokenizer identity, {file: {bytes, crc32c}} (index.json, not the shards:
//                                  each chunk has its own CRC-32C), meshtrain version
//     COMMITTED                    the commit marker: step and the size and CRC-32C of metadata.json
//   step_00000043.tmp-<pid>/       a save in progress (or debris of a crashed one): never loaded
//
// Commit protocol: the lead rank makes step_X.tmp-<pid>/ (its pid); every rank writes and fsyncs its shard
// there, and the ranks agree that all of them did (a failure on any rank removes the directory on every
// rank's behalf and fails the save everywhere); then the lead writes index.json and metadata.json, writes
// COMMITTED.tmp, fsyncs and renames it to COMMITTED, fsyncs the directory, renames it to step_X/ and fsyncs
// checkpoints_dir. That rename is the commit point: a checkpoint is complete iff its directory is named
// exactly step_<8+ digits> AND it holds COMMITTED. One job writes to a checkpoints_dir; its ranks must see
// one filesystem there (one host, or a shared filesystem across hosts).
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "meshtrain/data/engram_hash.h"
#include "meshtrain/runtime/engine.h"

namespace meshtrain {

// 3: distributed (index.json + per-rank shards; a metadata.json without index.json holds model.safetensors,
// as import-hf writes); 2: the stacked layout (scan_layers); 1: per layer. All three keep loading.
inline constexpr int64_t kCheckpointFormatVersion = 3;

struct CheckpointState {
  int64_t step = 0;            // optimizer steps completed
  nlohmann::json data_cursor;  // the data loader's position (opaque)
  nlohmann::json rng;          // seeds / RNG state (opaque)
  nlohmann::json train_state;  // the run's own state beyond the step (opaque; null: none, not written)
};

struct CheckpointOptions {
  std::string tokenizer_path;      // copied into the checkpoint (empty: none, e.g. synthetic data)
  std::string tokenizer_identity;  // stored in metadata ("": none); check_run_tokenizer compares it
  int64_t keep_last = 0;           // max_num_checkpoints_to_keep (0: keep all)
  const EngramHashing* engram_hashing = nullptr;  // models with Engram: what hashes their batches
};

// Every rank calls it: each writes the elements it holds the saving replica of (nothing is gathered), and
// the lead rank commits <checkpoints_dir>/step_<%08d step>/ by the protocol above (replacing an existing
// checkpoint of the same step atomically), then deletes the oldest committed checkpoints beyond keep_last
// and removes debris of earlier crashed saves. A failed save (full disk, ...) on any rank throws MeshError
// on every rank (naming the file on the rank that failed), removes the partial directory and leaves earlier
// checkpoints untouched. Returns the path of the new checkpoint ("" on the other ranks).
std::string save_checkpoint(const std::string& checkpoints_dir, const Engine& engine,
                            const CheckpointState& state, const CheckpointOptions& options);

// The committed checkpoint with the highest step, or nullopt (in-progress / incomplete ones are ignored).
std::optional<std::string> latest_checkpoint(const std::string& checkpoints_dir);

// Loads into the engine after verifying first: the commit marker, metadata format version, per-file sizes
// and CRC-32C, that the checkpoint's tensors are exactly the model's with the same shapes (on a pipeline
// stage every stage's, Engine::whole_model, so every rank refuses another model's checkpoint alike),
// vocab_size, and tokenizer identity when both sides know one (a run checks more first: check_run_tokenizer);
// a failure there leaves the engine untouched.
// Format 3: each rank reads only the chunks that overlap its own shards, checking each chunk's CRC-32C as
// it reads (a corrupted chunk stops the load with the engine partly overwritten). parameters_only
// (load_parameters_path): parameters only, moments untouched, and a fresh state (step 0, empty cursor and
// rng) is returned. Every failure is a MeshError naming the checkpoint file (and tensor), expected vs found,
// and a fix. Models with Engram (`engram_hashing` set): the checkpoint's compressed vocabulary must equal the
// run's (built from its tokenizer), and its table sizes the config's; the run then hashes with the
// checkpoint's multipliers and pad id, whatever its own engram_seed would draw.
CheckpointState load_checkpoint(const std::string& checkpoint_dir, Engine& engine, bool parameters_only,
                                const std::string& expected_tokenizer_identity = "",
                                EngramHashing* engram_hashing = nullptr);

// The tokenizer a run feeds its model through, as check_run_tokenizer compares it with a checkpoint's.
struct RunTokenizer {
  std::string identity;       // Tokenizer::identity(); "": the run reads none (dataset_type=synthetic)
  std::string path;           // tokenizer_path, for the messages
  bool allow_change = false;  // allow_tokenizer_change: a different tokenizer is meant
};

// A run starting from a checkpoint (its run_dir's, load_full_state_path, load_parameters_path) checks the
// tokenizer the checkpoint records against its own before anything loads. The same (or neither has one):
// returns "". The checkpoint records one and the run has another or none: a MeshError naming both (the
// checkpoint's identity and its copy, the run's tokenizer_path and identity), unless run.allow_change,
// which returns a warning naming both. The checkpoint records none (an import of a model without
// tokenizer.json, a synthetic run's checkpoint) and the run has one: nothing to compare, returns a note.
std::string check_run_tokenizer(const std::string& checkpoint_dir, const RunTokenizer& run);

// What metadata.json says of the model, for a writer that has a spec but no engine.
struct CheckpointModel {
  int64_t padded_vocab_size = 0;
  int64_t parameter_count = 0;
};

// A checkpoint written without an engine (import-hf): parameters only (no optimizer state), step 0. The
// caller writes model.safetensors at model_path() (the engine's names, global shapes, float32); commit()
// copies the tokenizer, writes metadata.json ("parameters_only": true, and `source` saying where the
// weights came from) and the marker, all inside <path>.tmp-<pid>/, then renames that to `path`, which
// must not exist. Destroyed without commit, it removes the temporary directory: nothing half-written is
// left looking complete.
class ParameterCheckpointWriter {
 public:
  explicit ParameterCheckpointWriter(const std::string& path);
  ~ParameterCheckpointWriter();
  ParameterCheckpointWriter(const ParameterCheckpointWriter&) = delete;
  ParameterCheckpointWriter& operator=(const ParameterCheckpointWriter&) = delete;

  std::string model_path() const;
  // `extra_files`: (name, content) written beside the weights and checksummed like them.
  void commit(const Config& config, const CheckpointModel& model, const CheckpointOptions& options,
              const nlohmann::ordered_json& source,
              const std::vector<std::pair<std::string, std::string>>& extra_files = {});

 private:
  std::filesystem::path final_, temp_;
  bool committed_ = false;
};

// The config a checkpoint was saved with: its metadata.json's resolved keys as overrides of base.yaml (not
// of the preset, so a checkpoint stays loadable when presets change), with `replaced` keys set instead.
Config checkpoint_config(const std::string& checkpoint_dir,
                         const std::map<std::string, std::string>& replaced);

// The checkpoint a run starts from, as the run picks it: the newest committed one in
// <run_dir>/checkpoints, else load_full_state_path, else load_parameters_path; "" for none.
std::string run_start_checkpoint(const Config& config);
// scan_layers and param_scan_axis that the user left unset (Config::given) take the values the checkpoint
// the run starts from was saved with, so a stacked checkpoint resumes stacked. Returns a line saying what
// was adopted ("" when nothing was). An unreadable checkpoint adopts nothing: its load reports it.
std::string adopt_checkpoint_layout(Config& config);

// The data cursor a checkpoint's metadata.json records (formats 1 to 3 keep it there), read without its
// tensors so a run can size itself before loading; null when there is none or the file cannot be read (its
// load reports that).
nlohmann::json saved_data_cursor(const std::string& checkpoint_dir);
// {"world_size": N, "mesh": "data=2 fsdp=2 ..."} of the ranks that saved a sharded checkpoint (null for
// checkpoints older than the field, or single files).
nlohmann::json saved_by_ranks(const std::string& checkpoint_dir);

// The checkpoint a path names: a directory holding metadata.json as given, else the newest committed
// checkpoint in it or in its checkpoints/ (a run_dir). `flag` names the argument in errors.
std::string resolve_checkpoint_directory(const std::string& path, const std::string& flag);

// Verifies a committed checkpoint without an engine (export-hf): the marker, metadata.json against it, and
// the size and CRC-32C of each of `files`. Returns metadata.json.
nlohmann::json verify_checkpoint_files(const std::string& checkpoint_dir,
                                       const std::vector<std::string>& files);

}  // namespace meshtrain
