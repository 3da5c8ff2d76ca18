// Saving, finding and loading checkpoints: the commit protocol, retention and crash-debris cleanup, and the
// verification (marker, format version, checksums, tensor names and shapes) done before a load touches the
// engine.
#include "meshtrain/checkpoint/checkpoint.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <map>
#include <numeric>
#include <optional>
#include <set>
#include <sstream>
#include <system_error>
#include <utility>
#include <vector>

#include "meshtrain/checkpoint/checkpoint_layout.h"
#include "meshtrain/checkpoint/sharded_checkpoint.h"
#include "meshtrain/core/crc32c.h"
#include "meshtrain/core/durable_file.h"
#include "meshtrain/core/error.h"
#include "meshtrain/core/json_number.h"
#include "meshtrain/io/safetensors.h"
#include "meshtrain/optim/optimizer.h"

namespace meshtrain {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
using ordered_json = nlohmann::ordered_json;

// No release numbering exists yet; bump this with the project version once there is one.
constexpr const char* kMeshtrainVersion = "0.1.0-dev";
constexpr const char* kModelFile = "model.safetensors";
constexpr const char* kOptimizerFile = "optimizer.safetensors";
constexpr const char* kEngramFile = "engram.safetensors";
constexpr const char* kMetadataFile = "metadata.json";
constexpr const char* kMarkerFile = "COMMITTED";
constexpr const char* kMarkerTemp = "COMMITTED.tmp";
constexpr const char* kTempTag = ".tmp-";
constexpr const char* kDeletingTag = ".deleting-";

// Crash-consistency tests need the process to die at exact points of a save, which no signal sent from
// outside can hit reliably. MESHTRAIN_CHECKPOINT_FAULT=<phase>[:<rank>[:<step>]] makes the saving process
// SIGKILL itself there (no handlers, no cleanup: what a power cut or OOM kill leaves): every rank, or only
// world rank <rank>, at every save or only at the save of <step>. Phases, in save order (the last three on
// the lead, rank 0):
//   shard_half_written    the rank's shard file written, then truncated to half its bytes; no index.json
//   metadata_written      every file and metadata.json written in step_X.tmp-<pid>/; no marker
//   before_commit         COMMITTED.tmp written and fsynced, not yet renamed to COMMITTED
//   after_commit          step_X/ published (renamed, fsynced); old checkpoints and debris not yet pruned
// `half_written`: a file to truncate to half its bytes first (what a kill in the middle of writing leaves).
void fault_point(const char* phase, int rank, int64_t step, const std::filesystem::path& half_written = {}) {
  const char* requested = std::getenv("MESHTRAIN_CHECKPOINT_FAULT");
  if (requested == nullptr) return;
  std::istringstream fields(requested);
  std::string name, at_rank, at_step;
  std::getline(fields, name, ':');
  std::getline(fields, at_rank, ':');
  std::getline(fields, at_step, ':');
  if (name != phase || (!at_rank.empty() && std::stoi(at_rank) != rank) ||
      (!at_step.empty() && std::stoll(at_step) != step)) {
    return;
  }
  if (!half_written.empty()) {
    std::error_code error;
    std::filesystem::resize_file(half_written, std::filesystem::file_size(half_written, error) / 2, error);
  }
  std::raise(SIGKILL);
}

std::string os_error(int err) {
  return std::system_category().message(err);
}

std::string step_directory_name(int64_t step) {
  char name[32];
  std::snprintf(name, sizeof(name), "step_%08lld", static_cast<long long>(step));
  return name;
}

// The step of a directory named exactly step_<digits>; nullopt for anything else (temp dirs included).
std::optional<int64_t> parse_step_name(const std::string& name) {
  const std::string prefix = "step_";
  if (name.size() <= prefix.size() || name.compare(0, prefix.size(), prefix) != 0) return std::nullopt;
  if (name.size() - prefix.size() > 18) return std::nullopt;  // keeps the value inside int64
  int64_t step = 0;
  for (size_t i = prefix.size(); i < name.size(); ++i) {
    if (name[i] < '0' || name[i] > '9') return std::nullopt;
    step = step * 10 + (name[i] - '0');
  }
  return step;
}

bool has_marker(const fs::path& directory) {
  std::error_code error;
  return fs::is_regular_file(directory / kMarkerFile, error);
}

// Removes a directory tree so that no half-deleted checkpoint can ever look complete: it is first renamed
// to a name latest_checkpoint never accepts, then deleted.
void remove_directory(const fs::path& directory) {
  fs::path doomed = directory;
  const std::string name = directory.filename().string();
  if (name.find(kTempTag) == std::string::npos && name.find(kDeletingTag) == std::string::npos) {
    doomed = directory.parent_path() / (name + kDeletingTag + std::to_string(::getpid()));
    if (::rename(directory.c_str(), doomed.c_str()) != 0) {
      fail(directory.string(), "a checkpoint directory that can be removed",
           "rename failed: " + os_error(errno), "check the permissions of the checkpoints directory");
    }
  }
  std::error_code error;
  fs::remove_all(doomed, error);
  if (error) {
    fail(doomed.string(), "a directory that can be removed", error.message(),
         "check the permissions of the checkpoints directory, then delete it by hand");
  }
}

struct CommittedCheckpoint {
  int64_t step;
  fs::path path;
};

std::vector<CommittedCheckpoint> committed_checkpoints(const fs::path& checkpoints_dir) {
  std::vector<CommittedCheckpoint> found;
  std::error_code error;
  if (!fs::exists(checkpoints_dir, error)) return found;
  fs::directory_iterator it(checkpoints_dir, error);
  if (error) fail(checkpoints_dir.string(), "a readable checkpoints directory", error.message());
  for (const fs::directory_entry& entry : it) {
    const std::optional<int64_t> step = parse_step_name(entry.path().filename().string());
    if (step && entry.is_directory(error) && has_marker(entry.path())) found.push_back({*step, entry.path()});
  }
  std::sort(found.begin(), found.end(),
            [](const CommittedCheckpoint& a, const CommittedCheckpoint& b) { return a.step < b.step; });
  return found;
}

// Deletes debris of crashed or failed saves (step_*.tmp-*, step_*.deleting-*, step_N/ without a marker),
// then the oldest committed checkpoints beyond keep_last. Never touches `keep` (the one just written).
void prune(const fs::path& checkpoints_dir, int64_t keep_last, const fs::path& keep) {
  std::vector<fs::path> debris;
  std::error_code error;
  fs::directory_iterator it(checkpoints_dir, error);
  if (error) fail(checkpoints_dir.string(), "a readable checkpoints directory", error.message());
  for (const fs::directory_entry& entry : it) {
    const std::string name = entry.path().filename().string();
    if (name.compare(0, 5, "step_") != 0 || !entry.is_directory(error) || entry.path() == keep) continue;
    const bool in_progress_or_deleting =
        name.find(kTempTag) != std::string::npos || name.find(kDeletingTag) != std::string::npos;
    if (in_progress_or_deleting || (parse_step_name(name) && !has_marker(entry.path()))) {
      debris.push_back(entry.path());
    }
  }
  for (const fs::path& path : debris) remove_directory(path);

  if (keep_last <= 0) return;
  std::vector<CommittedCheckpoint> committed = committed_checkpoints(checkpoints_dir);
  const size_t keep_count = static_cast<size_t>(keep_last);
  if (committed.size() <= keep_count) return;
  for (size_t i = 0; i + keep_count < committed.size(); ++i) {
    if (committed[i].path != keep) remove_directory(committed[i].path);
  }
}

// Files of the tokenizer to copy: a tokenizer.json file as given, or from a folder either tokenizer.json or
// encoder.json + vocab.bpe (the forms Tokenizer::load reads), so the checkpoint directory is itself a
// tokenizer path. Returns (source, name in the checkpoint).
std::vector<std::pair<fs::path, std::string>> tokenizer_files(const std::string& tokenizer_path) {
  std::error_code error;
  const fs::path source(tokenizer_path);
  // Tokenizer::source_path() names encoder.json for GPT-2 style tokenizers; vocab.bpe lies beside it.
  if (fs::is_regular_file(source, error) && source.filename() == "encoder.json" &&
      fs::is_regular_file(source.parent_path() / "vocab.bpe", error)) {
    return {{source, "encoder.json"}, {source.parent_path() / "vocab.bpe", "vocab.bpe"}};
  }
  if (fs::is_regular_file(source, error)) return {{source, "tokenizer.json"}};
  if (fs::is_directory(source, error)) {
    if (fs::is_regular_file(source / "tokenizer.json", error))
      return {{source / "tokenizer.json", "tokenizer.json"}};
    if (fs::is_regular_file(source / "encoder.json", error) &&
        fs::is_regular_file(source / "vocab.bpe", error)) {
      return {{source / "encoder.json", "encoder.json"}, {source / "vocab.bpe", "vocab.bpe"}};
    }
  }
  fail(tokenizer_path,
       "a tokenizer.json file, or a folder holding tokenizer.json or encoder.json + vocab.bpe",
       fs::exists(source, error) ? "neither" : "no such file or folder", "check config key 'tokenizer_path'");
}

// Writes every file of the checkpoint into `directory` and commits it there (marker last).
// The tensors a checkpoint holds per parameter by name prefix, in file order: "" its value (in
// model.safetensors), then its optimizer moments ("adam_m/", "adam_v/": optim/optimizer.h).
// Under opt_type=muon a parameter holds AdamW's two moments or Muon's one ("muon_mu/"), never all three.
std::vector<std::string> tensor_prefixes(const Config& config) {
  std::vector<std::string> prefixes = {""};
  for (const std::string& moment : optimizer_moment_names(config)) prefixes.push_back(moment + "/");
  return prefixes;
}

// Whether parameter `parameter` of a run of `config` holds a tensor under `prefix` (of tensor_prefixes()).
bool holds_prefix(const Config& config, const ParameterDecl& parameter, const std::string& prefix) {
  const std::vector<std::string> moments = parameter_moment_names(config, parameter);
  return prefix.empty() ||
         std::find(moments.begin(), moments.end(), prefix.substr(0, prefix.size() - 1)) != moments.end();
}

// The tensor under `prefix` (of tensor_prefixes()) of parameter `p`: its value or a moment, by spec id;
// kNoBuffer where its optimizer keeps no such moment.
BufferId tensor_of(const Engine& engine, size_t p, const std::string& prefix) {
  if (prefix.empty()) return engine.parameters().decl(p).value;
  const ParameterState& state = engine.plan().optimizer.state(p);
  const auto found =
      std::find(state.moment_names.begin(), state.moment_names.end(), prefix.substr(0, prefix.size() - 1));
  return found == state.moment_names.end()
             ? kNoBuffer
             : state.moments.at(static_cast<size_t>(found - state.moment_names.begin()));
}

// One per-layer tensor (or a whole other parameter) as the engine holds it: `offset` elements into the
// global tensor of its parameter's value or moment.
struct TensorPiece {
  std::string canonical;      // with the moment's prefix
  std::vector<int64_t> dims;  // global
  int64_t offset = 0;
};

// The pieces of a parameter checkpoint-named `name` whose value has global dims `dims`.
std::vector<TensorPiece> pieces_of(const ParameterDecl& parameter, const std::string& name,
                                   const std::vector<int64_t>& dims, const std::string& prefix) {
  if (!parameter.stacked()) return {{prefix + name, dims, 0}};
  // A stacked parameter [layers, rest...]: layer i is the i-th block of rest's size.
  const std::vector<int64_t> rest(dims.begin() + 1, dims.end());
  int64_t block = 1;
  for (int64_t size : rest) block *= size;
  std::vector<TensorPiece> pieces;
  for (size_t i = 0; i < parameter.members.size(); ++i)
    pieces.push_back({prefix + parameter.members[i].canonical_name, rest, static_cast<int64_t>(i) * block});
  return pieces;
}

std::vector<TensorPiece> pieces_of(const Engine& engine, size_t p, const std::string& prefix) {
  const ParameterDecl& parameter = engine.parameters().decl(p);
  return pieces_of(parameter, engine.parameters().name(p), engine.global_shape(parameter.value), prefix);
}

// Every tensor a checkpoint of the run's model holds under `prefixes` (of tensor_prefixes()), where
// `layout` keeps it: name -> global dims. Taken from the whole model (Engine::whole_model): a pipeline
// stage's engine holds its chunk, a checkpoint every stage's, and every rank checks a checkpoint alike.
std::map<std::string, std::vector<int64_t>> checkpoint_tensors(const Engine& engine,
                                                               const CheckpointLayout& layout,
                                                               const std::vector<std::string>& prefixes) {
  const ModelSpec& whole = engine.whole_model();
  std::map<std::string, std::vector<int64_t>> tensors;
  for (const std::string& prefix : prefixes) {
    for (const ParameterDecl& parameter : whole.parameters) {
      if (!holds_prefix(whole.config, parameter, prefix)) continue;
      const BufferDecl& value = whole.buffer(parameter.value);
      for (const TensorPiece& piece :
           pieces_of(parameter, value.name, global_dims(engine.plan(), value.shape), prefix)) {
        const CheckpointTensorPlace place = layout.place(piece.canonical, piece.dims);
        tensors[place.name] = place.dims;
      }
    }
  }
  return tensors;
}

// The layout this engine saves in: its own scan_layers and param_scan_axis.
CheckpointLayout own_layout(const Engine& engine) {
  const Config& config = engine.spec().config;
  return CheckpointLayout(config, config.scan_layers, config.param_scan_axis);
}

// engram.safetensors (see checkpoint.h): int32 and int64 tensors, written and read whole.
void write_engram_hashing(const std::string& path, const EngramHashing& hashing,
                          const std::map<std::string, std::string>& metadata) {
  const int32_t pad_id = hashing.pad_id;
  std::vector<SafetensorsTensor> tensors = {{"compress",
                                             "I32",
                                             {static_cast<int64_t>(hashing.compressed.compress.size())},
                                             hashing.compressed.compress.data()},
                                            {"pad_id", "I32", {1}, &pad_id}};
  std::vector<std::vector<int64_t>> table_sizes;  // flattened [N - 1, H], alive until written
  for (size_t layer = 0; layer < hashing.layers.size(); ++layer) {
    std::vector<int64_t>& flat = table_sizes.emplace_back();
    for (const std::vector<int64_t>& order : hashing.table_sizes[layer])
      flat.insert(flat.end(), order.begin(), order.end());
  }
  for (size_t layer = 0; layer < hashing.layers.size(); ++layer) {
    const std::string prefix = "layers_" + std::to_string(hashing.layers[layer]) + "/";
    const std::vector<int64_t>& multipliers = hashing.multipliers[layer];
    tensors.push_back(
        {prefix + "multipliers", "I64", {static_cast<int64_t>(multipliers.size())}, multipliers.data()});
    tensors.push_back({prefix + "table_sizes",
                       "I64",
                       {static_cast<int64_t>(hashing.table_sizes[layer].size()),
                        static_cast<int64_t>(hashing.table_sizes[layer].front().size())},
                       table_sizes[layer].data()});
  }
  write_safetensors(path, tensors, metadata);
}

// A whole integer tensor of engram.safetensors: its dtype and shape checked against what the run expects.
template <typename Value>
std::vector<Value> read_engram_tensor(const SafetensorsFile& file, const std::string& name, const char* dtype,
                                      const std::vector<int64_t>& shape, const std::string& fix) {
  const SafetensorsEntry* entry = file.find(name);
  if (entry == nullptr) fail(file.path() + ": tensor '" + name + "'", "present", "missing", fix);
  if (entry->dtype != dtype || entry->shape != shape) {
    fail(file.path() + ": tensor '" + name + "'", std::string(dtype) + " " + dims_text(shape),
         entry->dtype + " " + dims_text(entry->shape), fix);
  }
  std::vector<Value> values(static_cast<size_t>(
      std::accumulate(entry->shape.begin(), entry->shape.end(), int64_t{1}, std::multiplies<>())));
  std::memcpy(values.data(), file.data(*entry), values.size() * sizeof(Value));
  return values;
}

// Checks the checkpoint's Engram hashing against the run's and returns it (the run then hashes with its
// multipliers and pad id).
EngramHashing read_engram_hashing(const fs::path& path, const EngramHashing& run) {
  const SafetensorsFile file = SafetensorsFile::open(path.string());
  const std::string tokenizer_fix =
      "use the tokenizer the checkpoint was trained with (a copy is in the checkpoint directory)";
  EngramHashing saved = run;
  const auto vocabulary = static_cast<int64_t>(run.compressed.compress.size());
  const std::vector<int32_t> compress =
      read_engram_tensor<int32_t>(file, "compress", "I32", {vocabulary}, tokenizer_fix);
  for (size_t id = 0; id < compress.size(); ++id) {
    if (compress[id] != run.compressed.compress[id]) {
      fail(path.string() + ": tensor 'compress'",
           "the compressed vocabulary of this run's tokenizer (" + std::to_string(run.compressed.size) +
               " compressed ids; token " + std::to_string(id) + " -> " +
               std::to_string(run.compressed.compress[id]) + ")",
           "token " + std::to_string(id) + " -> " + std::to_string(compress[id]), tokenizer_fix);
    }
  }
  saved.pad_id = read_engram_tensor<int32_t>(file, "pad_id", "I32", {1}, tokenizer_fix).front();
  for (size_t layer = 0; layer < run.layers.size(); ++layer) {
    const std::string prefix = "layers_" + std::to_string(run.layers[layer]) + "/";
    const std::string config_fix =
        "load it with the Engram keys it was saved with (its metadata.json 'config')";
    const auto orders = static_cast<int64_t>(run.table_sizes[layer].size());
    const auto heads = static_cast<int64_t>(run.table_sizes[layer].front().size());
    saved.multipliers[layer] =
        read_engram_tensor<int64_t>(file, prefix + "multipliers", "I64",
                                    {static_cast<int64_t>(run.multipliers[layer].size())}, config_fix);
    const std::vector<int64_t> sizes =
        read_engram_tensor<int64_t>(file, prefix + "table_sizes", "I64", {orders, heads}, config_fix);
    for (int64_t order = 0; order < orders; ++order)
      for (int64_t head = 0; head < heads; ++head) {
        const int64_t expected = run.table_sizes[layer][order][head];
        if (sizes[order * heads + head] != expected) {
          fail(path.string() + ": tensor '" + prefix + "table_sizes'",
               "the tables of this config (order " + std::to_string(order + 2) + ", head " +
                   std::to_string(head) + ": " + std::to_string(expected) + " rows)",
               std::to_string(sizes[order * heads + head]) + " rows", config_fix);
        }
      }
  }
  return saved;
}

void finish_checkpoint_files(const fs::path& directory, const Config& config, const CheckpointModel& model,
                             const CheckpointState& state, const CheckpointOptions& options,
                             std::vector<std::string> files, const ordered_json& extra);

// The lead rank, once every rank's shard is on disk: the index, Engram's tables, metadata and the marker.
void finish_sharded_checkpoint(const fs::path& directory, const Engine& engine, int world_size,
                               const CheckpointState& state, const CheckpointOptions& options) {
  write_shard_index(directory, world_size);
  std::vector<std::string> files = {kShardIndexFile};
  if (options.engram_hashing != nullptr) {
    write_engram_hashing((directory / kEngramFile).string(), *options.engram_hashing,
                         {{"format", "pt"}, {"step", std::to_string(state.step)}});
    files.push_back(kEngramFile);
  }
  const ModelSpec& spec = engine.spec();
  // Which ranks saved it, so a restart on another mesh can say what changed.
  const ordered_json saved_by = {
      {"saved_by", {{"world_size", world_size}, {"mesh", engine.plan().mesh.to_string()}}}};
  finish_checkpoint_files(directory, spec.config, {spec.dims.V_padded, engine.global_parameter_count()},
                          state, options, std::move(files), saved_by);
}

// After each phase of a save every rank learns whether any rank failed; if one did, every rank throws (the
// failing ranks their own error, the others one naming the lowest failing rank), after the lead removed the
// temporary directory, so a failed save leaves nothing and never looks complete.
void agree_on_save_phase(Communicator* world, std::exception_ptr error, bool lead, const fs::path& temp,
                         int64_t step, const std::string& phase) {
  int64_t failed_rank = error ? 0 : -1;
  if (world != nullptr && world->size() > 1) {
    // max of (size - rank) over the failing ranks: the lowest failing rank; 0: none failed.
    std::vector<int64_t> flag = {error ? world->size() - world->rank() : 0};
    world->all_reduce(comm_buffer(flag), ReduceOp::max, "checkpoint/" + phase);
    failed_rank = flag.front() == 0 ? -1 : world->size() - flag.front();
  }
  if (failed_rank < 0) return;
  std::error_code ignored;
  if (lead) fs::remove_all(temp, ignored);
  const std::string not_saved = "; checkpoint step " + std::to_string(step) +
                                " was not saved (its partial directory was removed; earlier checkpoints "
                                "are intact)";
  if (!error) {
    fail(temp.string(), "every rank to write its part of the checkpoint",
         "rank " + std::to_string(failed_rank) + " failed (" + phase + "; that rank prints why)" + not_saved,
         "see rank " + std::to_string(failed_rank) + "'s message");
  }
  try {
    std::rethrow_exception(error);
  } catch (const MeshError& mesh_error) {
    const ErrorContext& c = mesh_error.context();
    fail(c.where, c.expected, c.found + not_saved, c.hint);
  } catch (const std::exception& other) {
    fail(temp.string(), "to write the checkpoint", other.what() + not_saved);
  }
}

void finish_checkpoint_files(const fs::path& directory, const Config& config, const CheckpointModel& model,
                             const CheckpointState& state, const CheckpointOptions& options,
                             std::vector<std::string> files, const ordered_json& extra) {
  std::vector<std::string> tokenizer_names;
  if (!options.tokenizer_path.empty()) {
    for (const auto& [source, name] : tokenizer_files(options.tokenizer_path)) {
      write_file_atomically((directory / name).string(), read_file_text(source.string(), "tokenizer file"));
      files.push_back(name);
      tokenizer_names.push_back(name);
    }
  }

  ordered_json metadata = ordered_json::object();
  metadata["format_version"] = kCheckpointFormatVersion;
  metadata["meshtrain_version"] = kMeshtrainVersion;
  metadata["step"] = state.step;
  metadata["model"] = {{"decoder_block", decoder_block_name(config.decoder_block)},
                       {"vocab_size", config.vocab_size},
                       {"padded_vocab_size", model.padded_vocab_size},
                       {"parameter_count", model.parameter_count}};
  // The layout the tensors were saved in: loading into the other layout converts (a later issue).
  metadata["scan_layers"] = config.scan_layers;
  metadata["param_scan_axis"] = config.param_scan_axis;
  metadata["mesh"] = ordered_json::object();
  for (MeshAxis axis : kMeshAxes) metadata["mesh"][mesh_axis_name(axis)] = config.mesh[axis];
  ordered_json resolved = ordered_json::object();
  for (const auto& [key, value] : config.resolved) resolved[key] = value;
  metadata["config"] = std::move(resolved);
  metadata["rng"] = state.rng;
  metadata["data_cursor"] = state.data_cursor;
  if (!state.train_state.is_null()) metadata["train_state"] = state.train_state;
  metadata["tokenizer"] = {{"identity", options.tokenizer_identity}, {"files", tokenizer_names}};
  for (const auto& [key, value] : extra.items()) metadata[key] = value;
  ordered_json sums = ordered_json::object();
  for (const std::string& name : files) {
    const FileChecksum sum = checksum_file((directory / name).string(), "a readable checkpoint file");
    sums[name] = {{"bytes", sum.bytes}, {"crc32c", sum.crc32c}};
  }
  metadata["files"] = std::move(sums);
  const std::string metadata_text = metadata.dump(2) + "\n";
  write_file_atomically((directory / kMetadataFile).string(), metadata_text);
  fault_point("metadata_written", 0, state.step);

  // The marker pins metadata.json (which the per-file checksums do not cover) and the step.
  const json marker = {{"step", state.step},
                       {"metadata_bytes", metadata_text.size()},
                       {"metadata_crc32c", crc32c(metadata_text.data(), metadata_text.size())}};
  write_file_atomically((directory / kMarkerTemp).string(), marker.dump() + "\n");
  fault_point("before_commit", 0, state.step);
  if (::rename((directory / kMarkerTemp).c_str(), (directory / kMarkerFile).c_str()) != 0) {
    fail((directory / kMarkerFile).string(), "the commit marker renamed into place",
         "rename failed: " + os_error(errno));
  }
  fsync_directory(directory);
}

// Moves the finished temp directory to its final name. A checkpoint of the same step already there (a run
// resumed from an earlier step, or re-saving the final step) is swapped out atomically, then deleted.
void publish(const fs::path& temp, const fs::path& final_path) {
  if (::rename(temp.c_str(), final_path.c_str()) == 0) return;
  const int err = errno;
  if (err != ENOTEMPTY && err != EEXIST) {
    fail(final_path.string(), "the finished checkpoint renamed into place",
         "rename failed: " + os_error(err));
  }
  if (::renameat2(AT_FDCWD, temp.c_str(), AT_FDCWD, final_path.c_str(), RENAME_EXCHANGE) == 0) {
    remove_directory(temp);  // now holds the replaced checkpoint
    return;
  }
  // Filesystems without RENAME_EXCHANGE: move the old one aside first. A crash between the two renames
  // leaves no step_X/ (earlier checkpoints still load; the next save removes both leftovers).
  const fs::path aside = final_path.string() + kDeletingTag + std::to_string(::getpid());
  if (::rename(final_path.c_str(), aside.c_str()) != 0 || ::rename(temp.c_str(), final_path.c_str()) != 0) {
    fail(final_path.string(), "the finished checkpoint renamed into place (replacing one of the same step)",
         "rename failed: " + os_error(errno));
  }
  remove_directory(aside);
}

// ---- loading ----

struct LoadContext {
  fs::path directory;
  json metadata;
  fs::path metadata_path;
};

void verify_file(const LoadContext& context, const std::string& name) {
  const fs::path path = context.directory / name;
  const json& files = context.metadata.at("files");
  if (!files.contains(name)) {
    fail(context.metadata_path.string(), "a 'files' entry for " + name, "none",
         "the checkpoint is incomplete or not written by meshtrain; use another checkpoint");
  }
  const std::string entry_where = context.metadata_path.string() + ": files: " + name;
  const uint64_t expected_bytes =
      json_unsigned(files.at(name).at("bytes"), std::numeric_limits<uint64_t>::max(), entry_where, "bytes");
  const auto expected_crc = static_cast<uint32_t>(json_unsigned(
      files.at(name).at("crc32c"), std::numeric_limits<uint32_t>::max(), entry_where, "crc32c"));
  std::error_code error;
  if (!fs::is_regular_file(path, error)) {
    fail(path.string(), "the checkpoint file listed in metadata.json", "no such file",
         "the checkpoint was damaged after it was written; use an earlier checkpoint");
  }
  const FileChecksum sum = checksum_file(path.string(), "a readable checkpoint file");
  if (sum.bytes != expected_bytes) {
    fail(path.string(), std::to_string(expected_bytes) + " bytes (recorded in metadata.json)",
         std::to_string(sum.bytes) + " bytes: the file is " +
             (sum.bytes < expected_bytes ? "truncated" : "longer"),
         "the checkpoint was damaged after it was written; use an earlier checkpoint");
  }
  if (sum.crc32c != expected_crc) {
    fail(path.string(), "CRC-32C " + std::to_string(expected_crc) + " (recorded in metadata.json)",
         "CRC-32C " + std::to_string(sum.crc32c) + ": the file is corrupted",
         "the checkpoint was damaged after it was written; use an earlier checkpoint");
  }
}

// Model-shape keys whose saved value differs from this run's: the likely reason tensors do not match.
std::string config_difference(const json& saved_config, const Config& config) {
  static const std::set<std::string> kShapeKeys = {"decoder_block",
                                                   "base_emb_dim",
                                                   "base_num_query_heads",
                                                   "base_num_kv_heads",
                                                   "head_dim",
                                                   "base_mlp_dim",
                                                   "vocab_size",
                                                   "base_num_decoder_layers",
                                                   "max_position_embeddings",
                                                   "scan_layers",
                                                   "param_scan_axis",
                                                   "attention_type",
                                                   "q_lora_rank",
                                                   "kv_lora_rank",
                                                   "qk_nope_head_dim",
                                                   "qk_rope_head_dim",
                                                   "v_head_dim",
                                                   "num_experts",
                                                   "base_moe_mlp_dim",
                                                   "first_num_dense_layers",
                                                   "shared_experts",
                                                   "routed_bias"};
  std::string text;
  for (const auto& [key, value] : config.resolved) {
    if (!kShapeKeys.count(key) || !saved_config.contains(key) || !saved_config.at(key).is_string()) continue;
    const std::string saved = saved_config.at(key).get<std::string>();
    if (saved != value)
      text += (text.empty() ? "" : ", ") + key + " " + saved + " in the checkpoint, " + value + " here";
  }
  return text;
}

// Checks that `file` holds exactly the tensors of the run's model (name -> shape, in the checkpoint's
// layout).
void verify_tensors(const SafetensorsFile& file, const std::map<std::string, std::vector<int64_t>>& expected,
                    const std::string& hint) {
  std::set<std::string> names;
  for (const auto& [name, dims] : expected) {
    names.insert(name);
    const SafetensorsEntry* entry = file.find(name);
    if (entry == nullptr) {
      fail(tensor_where(file.path(), name), "the tensor (this run's model has it)",
           "missing from the checkpoint", hint);
    }
    if (entry->shape != dims) {
      fail(tensor_where(file.path(), name), "shape " + dims_text(dims) + " (as this run's config builds it)",
           "shape " + dims_text(entry->shape), hint);
    }
  }
  for (const SafetensorsEntry& entry : file.entries()) {
    if (!names.count(entry.name)) {
      fail(tensor_where(file.path(), entry.name), "only tensors of this run's model", "an extra tensor",
           hint);
    }
  }
}

LoadContext read_metadata(const fs::path& directory) {
  const std::string hint_other = "use an earlier checkpoint (latest_checkpoint skips incomplete ones)";
  std::error_code error;
  if (!fs::is_directory(directory, error)) {
    fail(directory.string(), "a checkpoint directory (<run_dir>/checkpoints/step_XXXXXXXX)",
         "no such directory", "check load_parameters_path / load_full_state_path");
  }
  const fs::path marker_path = directory / kMarkerFile;
  if (!fs::is_regular_file(marker_path, error)) {
    fail(marker_path.string(), "the commit marker a complete save writes last",
         "no marker: the save was interrupted, or this is not a meshtrain checkpoint", hint_other);
  }
  LoadContext context{directory, json(), directory / kMetadataFile};
  json marker;
  try {
    marker = json::parse(read_file_text(marker_path.string(), "commit marker"));
    const uint64_t bytes = json_unsigned(marker.at("metadata_bytes"), std::numeric_limits<uint64_t>::max(),
                                         marker_path.string(), "metadata_bytes", hint_other);
    const auto crc = static_cast<uint32_t>(
        json_unsigned(marker.at("metadata_crc32c"), std::numeric_limits<uint32_t>::max(),
                      marker_path.string(), "metadata_crc32c", hint_other));
    std::error_code exists_error;
    if (!fs::is_regular_file(context.metadata_path, exists_error)) {
      fail(context.metadata_path.string(), "the checkpoint's metadata file", "no such file",
           "the checkpoint was damaged after it was written; " + hint_other);
    }
    const std::string text = read_file_text(context.metadata_path.string(), "checkpoint metadata file");
    if (text.size() != bytes || crc32c(text.data(), text.size()) != crc) {
      fail(context.metadata_path.string(),
           std::to_string(bytes) + " bytes with CRC-32C " + std::to_string(crc) + " (recorded in COMMITTED)",
           std::to_string(text.size()) + " bytes with CRC-32C " +
               std::to_string(crc32c(text.data(), text.size())),
           "the checkpoint was damaged after it was written; " + hint_other);
    }
    context.metadata = json::parse(text);
  } catch (const json::exception& e) {
    fail(marker.is_null() ? marker_path.string() : context.metadata_path.string(),
         "valid JSON written by meshtrain", e.what(), hint_other);
  }
  return context;
}

int64_t element_count(std::vector<int64_t>::const_iterator begin, std::vector<int64_t>::const_iterator end) {
  return std::accumulate(begin, end, int64_t{1}, std::multiplies<>());
}

// `values` with `value` inserted at `axis`.
std::vector<int64_t> inserted(std::vector<int64_t> values, int64_t axis, int64_t value) {
  values.insert(values.begin() + axis, value);
  return values;
}

// The chunks this rank saves (format 3): for every parameter value and moment it holds the saving replica
// of, its box in the run's own layout (a stacked parameter as one stacked tensor, the layer axis at
// param_scan_axis).
std::vector<ShardChunk> rank_chunks(const Engine& engine) {
  const CheckpointLayout layout = own_layout(engine);
  const ParameterStore& store = engine.parameters();
  std::vector<ShardChunk> chunks;
  for (const std::string& prefix : tensor_prefixes(engine.spec().config)) {
    for (size_t p = 0; p < store.size(); ++p) {
      const ParameterDecl& parameter = store.decl(p);
      const BufferId id = tensor_of(engine, p, prefix);
      if (id == kNoBuffer) continue;
      const Engine::LocalShard shard = engine.local_shard(id);
      if (!shard.saving_replica) continue;
      const TensorPiece first = pieces_of(engine, p, prefix).front();
      const CheckpointTensorPlace place = layout.place(first.canonical, first.dims);
      ShardChunk chunk{place.name, place.dims, shard.offsets, shard.dims, shard.data};
      if (parameter.stacked()) {
        MT_CHECK(place.name == prefix + store.name(p),
                 "stacked tensor " + prefix + store.name(p) + " placed as " + place.name);
        // This rank's [layers, rest...] as the box [rest before the axis, layers, rest from the axis on];
        // its layers start at its first member's place in the group (0 but on a later pipeline stage).
        const std::vector<int64_t> rest_start(shard.offsets.begin() + 1, shard.offsets.end());
        const std::vector<int64_t> rest_dims(shard.dims.begin() + 1, shard.dims.end());
        chunk.start = inserted(rest_start, place.axis, place.index + shard.offsets.front());
        chunk.dims = inserted(rest_dims, place.axis, shard.dims.front());
        chunk.layers = shard.dims.front();
        chunk.outer = element_count(rest_dims.begin(), rest_dims.begin() + place.axis);
        chunk.inner = element_count(rest_dims.begin() + place.axis, rest_dims.end());
      } else {
        MT_CHECK(place.index < 0, "a per-layer parameter placed in a stack: " + place.name);
        chunk.inner = element_count(shard.dims.begin(), shard.dims.end());
      }
      chunks.push_back(std::move(chunk));
    }
  }
  return chunks;
}

// Format 3: every rank reads the boxes of its own shards from the chunks that overlap them, through the
// layout the checkpoint was saved in. The tensor set and shapes are checked before the engine changes; a
// chunk whose CRC-32C fails is found while reading, and the load then stops with the engine partly
// overwritten (callers stop).
void load_sharded(const LoadContext& context, Engine& engine, bool parameters_only,
                  const std::string& layout_hint) {
  const ShardedCheckpoint checkpoint(context.directory);
  const std::string index_path = (context.directory / kShardIndexFile).string();
  const CheckpointLayout saved =
      CheckpointLayout::saved(context.metadata, engine.spec().config, context.metadata_path.string());
  const ParameterStore& store = engine.parameters();
  struct BoxRead {
    std::string tensor;
    std::vector<int64_t> start, dims;
    float* data = nullptr;
  };
  std::vector<BoxRead> reads;
  const std::vector<std::string> prefixes = tensor_prefixes(engine.spec().config);
  // Every tensor of this model, moments included, and those the load needs (parameters_only: the values).
  const std::map<std::string, std::vector<int64_t>> model_tensors =
      checkpoint_tensors(engine, saved, prefixes);
  const std::map<std::string, std::vector<int64_t>> expected =
      parameters_only ? checkpoint_tensors(engine, saved, {prefixes.front()}) : model_tensors;
  for (size_t tensor = 0; tensor < prefixes.size(); ++tensor) {
    const std::string& prefix = prefixes[tensor];
    if (tensor > 0 && parameters_only) continue;
    for (size_t p = 0; p < store.size(); ++p) {
      MT_CHECK(store.value(p).dtype == DType::f32, "checkpoint loading reads float32 buffers");
      const BufferId id = tensor_of(engine, p, prefix);
      if (id == kNoBuffer) continue;
      const std::vector<TensorPiece> pieces = pieces_of(engine, p, prefix);
      const Engine::LocalShard shard = engine.local_shard(id);
      // The box of one per-layer piece (or the whole tensor) in the checkpoint's coordinates.
      const auto read = [&](const TensorPiece& piece, std::vector<int64_t> start, std::vector<int64_t> dims,
                            float* data) {
        const CheckpointTensorPlace place = saved.place(piece.canonical, piece.dims);
        MT_CHECK(expected.count(place.name) && expected.at(place.name) == place.dims,
                 "the engine's tensor " + place.name + " as the whole model declares it");
        if (place.index >= 0) {  // one layer of a stacked tensor: a box one deep on its layer axis
          start = inserted(std::move(start), place.axis, place.index);
          dims = inserted(std::move(dims), place.axis, 1);
        }
        reads.push_back({place.name, std::move(start), std::move(dims), data});
      };
      if (!store.decl(p).stacked()) {
        read(pieces.front(), shard.offsets, shard.dims, shard.data);
        continue;
      }
      // A stacked parameter [layers, rest...] (the layer axis may be split): each local layer on its own.
      const std::vector<int64_t> rest_start(shard.offsets.begin() + 1, shard.offsets.end());
      const std::vector<int64_t> rest_dims(shard.dims.begin() + 1, shard.dims.end());
      const int64_t layer_elements = element_count(rest_dims.begin(), rest_dims.end());
      for (int64_t layer = 0; layer < shard.dims.front(); ++layer) {
        read(pieces[static_cast<size_t>(shard.offsets.front() + layer)], rest_start, rest_dims,
             shard.data + layer * layer_elements);
      }
    }
  }
  for (const auto& [name, dims] : expected) {
    const auto found = checkpoint.tensors().find(name);
    if (found == checkpoint.tensors().end()) {
      fail(tensor_where(index_path, name), "the tensor (this run's model has it)",
           "missing from the checkpoint", layout_hint);
    }
    if (found->second != dims) {
      fail(tensor_where(index_path, name), "shape " + dims_text(dims) + " (as this run's config builds it)",
           "shape " + dims_text(found->second), layout_hint);
    }
  }
  const std::vector<std::string> moments = every_moment_name();
  for (const auto& entry : checkpoint.tensors()) {
    // (entry, not a structured binding: clang before 16 cannot capture a binding in the lambda below.)
    const std::string& name = entry.first;
    // A parameters-only load passes over the moments, whichever optimizer's they are.
    if (parameters_only && std::any_of(moments.begin(), moments.end(), [&](const std::string& moment) {
          return name.starts_with(moment + "/");
        }))
      continue;
    if (!model_tensors.count(name))
      fail(tensor_where(index_path, name), "only tensors of this run's model", "an extra tensor",
           layout_hint);
  }
  // The boxes of one tensor together (a stacked tensor's layers are consecutive): each chunk is read once.
  for (size_t first = 0; first < reads.size();) {
    std::vector<ShardedCheckpoint::Box> boxes;
    size_t next = first;
    for (; next < reads.size() && reads[next].tensor == reads[first].tensor; ++next)
      boxes.push_back({reads[next].start, reads[next].dims, reads[next].data});
    checkpoint.read_boxes(reads[first].tensor, boxes);
    first = next;
  }
}

}  // namespace

std::string save_checkpoint(const std::string& checkpoints_dir, const Engine& engine,
                            const CheckpointState& state, const CheckpointOptions& options) {
  if (state.step < 0) fail("checkpoint step", "a step >= 0", std::to_string(state.step));
  if (options.keep_last < 0) {
    fail("config key 'max_num_checkpoints_to_keep'", "0 (keep all) or a positive count",
         std::to_string(options.keep_last));
  }
  MT_CHECK(!engine.spec().decoding(), "a decode engine holds no optimizer state to save");
  engine.persistent_to_host();  // a device arena's state, read through local_shard
  struct ReleaseHostCopy {      // ... and freed when the save ends, however it ends
    const Engine& engine;
    ~ReleaseHostCopy() { engine.release_host_copy(); }
  } release_host_copy{engine};
  Communicator* world = engine.world();
  const int world_size = world != nullptr ? world->size() : 1;
  const int rank = world != nullptr ? world->rank() : 0;
  const bool lead = engine.lead();
  // The lead's pid names the temporary directory, and every rank learns it.
  std::vector<int64_t> lead_pid = {lead ? static_cast<int64_t>(::getpid()) : 0};
  if (world_size > 1) world->all_reduce(comm_buffer(lead_pid), ReduceOp::max, "checkpoint/directory");
  const fs::path root(checkpoints_dir);
  const fs::path final_path = root / step_directory_name(state.step);
  const fs::path temp = final_path.string() + kTempTag + std::to_string(lead_pid.front());

  // 1. The lead makes the directory.
  std::exception_ptr error;
  if (lead) {
    try {
      std::error_code create_error;
      fs::create_directories(root, create_error);
      if (create_error)
        fail(checkpoints_dir, "a checkpoints directory that can be created", create_error.message());
      fs::remove_all(temp, create_error);  // a leftover of an earlier failed save by a process with our pid
      if (!fs::create_directory(temp, create_error) || create_error ||
          !fs::create_directory(temp / fs::path(rank_shard_file(0)).parent_path(), create_error)) {
        fail(temp.string(), "a new directory for the checkpoint",
             create_error ? create_error.message() : "it already exists",
             "check the permissions and free space of the checkpoints directory");
      }
    } catch (const std::exception&) {
      error = std::current_exception();
    }
  }
  agree_on_save_phase(world, error, lead, temp, state.step, "creating the directory");

  // 2. Every rank writes the elements it saves, all at once.
  try {
    write_rank_shard(temp, rank, rank_chunks(engine));
    fault_point("shard_half_written", rank, state.step, temp / rank_shard_file(rank));
  } catch (const std::exception&) {
    error = std::current_exception();
  }
  agree_on_save_phase(world, error, lead, temp, state.step, "writing its shard");

  // 3. The lead indexes the shards, writes metadata and the marker, and publishes the directory; every rank
  // learns whether that worked (without it, a lead that failed here would leave the others waiting for it in
  // the run's next collective until collective_timeout_s).
  if (lead) {
    try {
      finish_sharded_checkpoint(temp, engine, world_size, state, options);
      publish(temp, final_path);
    } catch (const std::exception&) {
      error = std::current_exception();
    }
  }
  agree_on_save_phase(world, error, lead, temp, state.step, "committing");
  if (!lead) return "";
  fsync_directory(
      root);  // makes the rename durable; if this fails, step_X/ exists but may not survive a crash
  fault_point("after_commit", 0, state.step);
  try {
    prune(root, options.keep_last, final_path);
  } catch (const MeshError& e) {
    const ErrorContext& c = e.context();
    fail(c.where, c.expected,
         c.found + "; removing old checkpoints failed, but checkpoint step " + std::to_string(state.step) +
             " itself was saved at " + final_path.string(),
         c.hint);
  }
  return final_path.string();
}

std::optional<std::string> latest_checkpoint(const std::string& checkpoints_dir) {
  const std::vector<CommittedCheckpoint> committed = committed_checkpoints(checkpoints_dir);
  if (committed.empty()) return std::nullopt;
  return committed.back().path.string();
}

namespace {

CheckpointState load_into_host_state(const std::string& checkpoint_dir, Engine& engine, bool parameters_only,
                                     const std::string& expected_tokenizer_identity,
                                     EngramHashing* engram_hashing) {
  const LoadContext context = read_metadata(fs::path(checkpoint_dir));
  const std::string metadata_where = context.metadata_path.string();
  const ModelSpec& spec = engine.spec();
  CheckpointState state;
  std::string saved_identity, layout_hint;
  bool sharded = false;  // format 3's index.json and per-rank shards, else model/optimizer.safetensors
  try {
    const json& m = context.metadata;
    const int64_t version =
        json_integer(m.at("format_version"), std::numeric_limits<int64_t>::min(),
                     std::numeric_limits<int64_t>::max(), metadata_where, "format_version");
    if (version > kCheckpointFormatVersion) {
      fail(metadata_where, "checkpoint format version <= " + std::to_string(kCheckpointFormatVersion),
           "format version " + std::to_string(version) + " (written by a newer meshtrain)",
           "load it with the meshtrain version that wrote it (" + m.value("meshtrain_version", "unknown") +
               ")");
    }
    if (version < 1) fail(metadata_where, "checkpoint format version >= 1", std::to_string(version));

    const int64_t saved_vocab =
        json_integer(m.at("model").at("vocab_size"), 0, std::numeric_limits<int64_t>::max(),
                     metadata_where + ": model", "vocab_size");
    if (saved_vocab != spec.config.vocab_size) {
      fail(metadata_where + ": vocab_size",
           std::to_string(spec.config.vocab_size) + " (this run's vocab_size)", std::to_string(saved_vocab),
           "the checkpoint was trained with a different tokenizer vocabulary; set vocab_size=" +
               std::to_string(saved_vocab) + " and use that tokenizer, or start from another checkpoint");
    }
    saved_identity = m.at("tokenizer").at("identity").get<std::string>();
    if (!saved_identity.empty() && !expected_tokenizer_identity.empty() &&
        saved_identity != expected_tokenizer_identity) {
      fail(metadata_where + ": tokenizer identity",
           "'" + expected_tokenizer_identity + "' (this run's tokenizer)", "'" + saved_identity + "'",
           "use the tokenizer the checkpoint was trained with (a copy is in the checkpoint directory)");
    }

    const std::string difference = config_difference(m.at("config"), spec.config);
    layout_hint =
        difference.empty()
            ? "the checkpoint was saved from a different model; load it with the config it was saved "
              "with (its metadata.json 'config')"
            : "the checkpoint was saved from a different model (" + difference +
                  "); load it with the config it was saved with (its metadata.json 'config')";

    if (!parameters_only && m.value("parameters_only", false)) {
      fail(
          metadata_where, "a full training state (parameters and Adam moments)",
          "parameters only (" + m.value("/source/kind"_json_pointer, std::string("no optimizer state")) + ")",
          "start from it with load_parameters_path=" + checkpoint_dir + " (a fresh optimizer and step 0)");
    }
    if (!parameters_only) {
      // The moments are the optimizer's: a state of the other one is refused (a checkpoint from before
      // opt_type existed is AdamW's).
      const json& saved_config = m.at("config");
      const std::string saved_optimizer =
          saved_config.contains("opt_type") && saved_config.at("opt_type").is_string()
              ? saved_config.at("opt_type").get<std::string>()
              : optimizer_type_name(OptimizerType::adamw);
      const std::string run_optimizer = optimizer_type_name(spec.config.opt_type);
      if (saved_optimizer != run_optimizer) {
        fail(metadata_where + ": config opt_type", run_optimizer + " (this run's opt_type)", saved_optimizer,
             "resume with opt_type=" + saved_optimizer + ", or start from its parameters with a fresh " +
                 run_optimizer + " state: load_parameters_path=" + checkpoint_dir);
      }
    }
    const json& files = m.at("files");
    sharded = files.contains(kShardIndexFile);
    for (const auto& [name, entry] : files.items()) {
      if (parameters_only && name == kOptimizerFile) continue;  // not read: not worth checksumming
      verify_file(context, name);
    }
    // Files the load reads must be listed (verify_file reports the missing entry).
    if (!sharded && !files.contains(kModelFile)) verify_file(context, kModelFile);
    if (!sharded && !parameters_only && !files.contains(kOptimizerFile)) verify_file(context, kOptimizerFile);

    if (!parameters_only) {
      state.step = json_integer(m.at("step"), 0, std::numeric_limits<int64_t>::max(), metadata_where, "step");
      state.data_cursor = m.at("data_cursor");
      state.rng = m.at("rng");
      state.train_state = m.value("train_state", json());  // older checkpoints hold none
    }
  } catch (const json::exception& e) {
    fail(metadata_where, "a metadata.json written by meshtrain (format version 1 to 3)", e.what(),
         "the checkpoint is damaged or not a meshtrain checkpoint; use another checkpoint");
  }

  std::optional<EngramHashing> saved_hashing;
  if (engram_hashing != nullptr) {
    verify_file(context, kEngramFile);  // lists the missing entry when the checkpoint has no Engram
    saved_hashing = read_engram_hashing(context.directory / kEngramFile, *engram_hashing);
  }
  // Everything is verified before the first byte of the engine changes: a failed load leaves it as it was.
  MT_CHECK(parameters_only || !spec.decoding(), "a decode engine holds no optimizer state to load");
  if (sharded) {
    load_sharded(context, engine, parameters_only, layout_hint);
    if (saved_hashing) *engram_hashing = std::move(*saved_hashing);
    return state;
  }
  const ParameterStore& store = engine.parameters();
  // Every tensor of the model, where the checkpoint's layout (stacked or per layer) keeps it.
  const CheckpointLayout saved = CheckpointLayout::saved(context.metadata, spec.config, metadata_where);
  const std::vector<std::string> prefixes = tensor_prefixes(spec.config);
  const size_t tensors = parameters_only ? 1 : prefixes.size();
  const std::map<std::string, std::vector<int64_t>> model_tensors =
      checkpoint_tensors(engine, saved, {prefixes.front()});
  const std::map<std::string, std::vector<int64_t>> moment_tensors =
      parameters_only ? std::map<std::string, std::vector<int64_t>>{}
                      : checkpoint_tensors(engine, saved, {prefixes.begin() + 1, prefixes.end()});
  if (saved.stacked() != spec.config.scan_layers) {
    layout_hint += std::string("; the checkpoint is stored ") + (saved.stacked() ? "stacked" : "per layer") +
                   " and converted to this run's layout";
  }
  const SafetensorsFile model = SafetensorsFile::open((context.directory / kModelFile).string());
  verify_tensors(model, model_tensors, layout_hint);
  std::optional<SafetensorsFile> optimizer;
  if (!parameters_only) {
    optimizer.emplace(SafetensorsFile::open((context.directory / kOptimizerFile).string()));
    verify_tensors(*optimizer, moment_tensors, layout_hint);
  }
  // Whole tensors are assembled (a stacked one from its layers) and each rank keeps its shard: a checkpoint
  // loads on any mesh and into either layout.
  for (size_t tensor = 0; tensor < tensors; ++tensor) {
    const std::string& prefix = prefixes[tensor];
    for (size_t p = 0; p < store.size(); ++p) {
      MT_CHECK(store.value(p).dtype == DType::f32, "checkpoint loading reads float32 buffers");
      const BufferId id = tensor_of(engine, p, prefix);
      if (id == kNoBuffer) continue;
      int64_t count = 1;
      for (int64_t size : engine.global_shape(id)) count *= size;
      std::vector<float> global(static_cast<size_t>(count));
      for (const TensorPiece& piece : pieces_of(engine, p, prefix)) {
        CheckpointLayout::read(tensor == 0 ? model : *optimizer, saved.place(piece.canonical, piece.dims),
                               global.data() + piece.offset);
      }
      engine.scatter_global(id, global.data());
    }
  }
  if (saved_hashing) *engram_hashing = std::move(*saved_hashing);
  return state;
}

}  // namespace

std::string check_run_tokenizer(const std::string& checkpoint_dir, const RunTokenizer& run) {
  const LoadContext context = read_metadata(fs::path(checkpoint_dir));
  const std::string metadata_where = context.metadata_path.string();
  std::string saved_identity, saved_copy = "no copy in the checkpoint";
  try {
    const json& tokenizer = context.metadata.at("tokenizer");
    saved_identity = tokenizer.at("identity").get<std::string>();
    const json& files = tokenizer.at("files");
    // GPT-2's pair is loaded through the directory; a tokenizer.json by its own path.
    if (files.size() == 1) saved_copy = (context.directory / files[0].get<std::string>()).string();
    if (files.size() > 1) saved_copy = checkpoint_dir;
  } catch (const json::exception& e) {
    fail(metadata_where, "a metadata.json written by meshtrain (format version 1 to 3)", e.what(),
         "the checkpoint is damaged or not a meshtrain checkpoint; use another checkpoint");
  }
  if (saved_identity == run.identity) return "";
  const std::string run_side =
      run.identity.empty() ? "no tokenizer (dataset_type=synthetic reads none, whatever tokenizer_path says)"
                           : "tokenizer_path=" + run.path + " (identity " + run.identity + ")";
  if (saved_identity.empty()) {
    return "note: " + checkpoint_dir +
           " records no tokenizer (an import of a model without tokenizer.json, or a run on synthetic data): "
           "nothing to compare this run's " +
           run_side + " with; the run's checkpoints record it";
  }
  const std::string saved_side = "identity " + saved_identity + " (its copy: " + saved_copy + ")";
  if (!run.allow_change) {
    const std::string fix =
        run.identity.empty()
            ? "train on data made with it (dataset_type=text or tokens, tokenizer_path=" + saved_copy +
                  "), or set allow_tokenizer_change=true if synthetic ids are meant (the run's checkpoints "
                  "then record no tokenizer)"
            : "train with tokenizer_path=" + saved_copy +
                  " (and data made with it), or set allow_tokenizer_change=true if the change is meant (the "
                  "run's checkpoints then record the new tokenizer)";
    fail(metadata_where + ": tokenizer", "the tokenizer the checkpoint was trained with, " + saved_side,
         run_side, fix);
  }
  return "warning: allow_tokenizer_change=true: " + checkpoint_dir + " was trained with the tokenizer of " +
         saved_side + ", this run feeds " + run_side +
         "; the ids the model learned now stand for other text, and this run's checkpoints record " +
         (run.identity.empty() ? std::string("no tokenizer") : "its tokenizer");
}

// A device arena's state is read into its host copy and moved to the device once the load succeeded.
CheckpointState load_checkpoint(const std::string& checkpoint_dir, Engine& engine, bool parameters_only,
                                const std::string& expected_tokenizer_identity,
                                EngramHashing* engram_hashing) {
  engine.persistent_to_host();
  CheckpointState state = load_into_host_state(checkpoint_dir, engine, parameters_only,
                                               expected_tokenizer_identity, engram_hashing);
  engine.persistent_to_device();
  return state;
}

ParameterCheckpointWriter::ParameterCheckpointWriter(const std::string& path)
    : final_(path), temp_(path + kTempTag + std::to_string(::getpid())) {
  std::error_code error;
  if (fs::exists(final_, error)) {
    fail(path, "a new checkpoint directory", "it already exists",
         "choose another --out, or remove the existing directory first");
  }
  if (!final_.parent_path().empty()) fs::create_directories(final_.parent_path(), error);
  fs::remove_all(temp_, error);  // a leftover of an earlier failed write by a process with our pid
  if (!fs::create_directory(temp_, error) || error) {
    fail(temp_.string(), "a new directory for the checkpoint", error ? error.message() : "it already exists",
         "check the permissions and free space of " + final_.parent_path().string());
  }
}

ParameterCheckpointWriter::~ParameterCheckpointWriter() {
  if (committed_) return;
  std::error_code ignored;
  fs::remove_all(temp_, ignored);
}

std::string ParameterCheckpointWriter::model_path() const {
  return (temp_ / kModelFile).string();
}

void ParameterCheckpointWriter::commit(const Config& config, const CheckpointModel& model,
                                       const CheckpointOptions& options, const nlohmann::ordered_json& source,
                                       const std::vector<std::pair<std::string, std::string>>& extra_files) {
  std::vector<std::string> files = {kModelFile};
  for (const auto& [name, content] : extra_files) {
    write_file_atomically((temp_ / name).string(), content);
    files.push_back(name);
  }
  ordered_json extra = {{"parameters_only", true}, {"source", source}};
  finish_checkpoint_files(temp_, config, model, CheckpointState{}, options, std::move(files), extra);
  if (::rename(temp_.c_str(), final_.c_str()) != 0) {
    fail(final_.string(), "the finished checkpoint renamed into place", "rename failed: " + os_error(errno),
         "check that nothing else created " + final_.string() + " meanwhile");
  }
  fsync_directory(final_.parent_path().empty() ? "." : final_.parent_path().string());
  committed_ = true;
}

std::string run_start_checkpoint(const Config& config) {
  if (const std::optional<std::string> latest = latest_checkpoint(config.run_dir + "/checkpoints"))
    return *latest;
  if (!config.load_full_state_path.empty()) return config.load_full_state_path;
  return config.load_parameters_path;
}

namespace {

// metadata.json as saved, unverified (the load verifies it); null when it cannot be read or parsed.
json unverified_metadata(const std::string& checkpoint_dir) {
  std::ifstream file(fs::path(checkpoint_dir) / kMetadataFile);
  if (!file) return nullptr;
  try {
    return json::parse(file);
  } catch (const json::exception&) {
    return nullptr;
  }
}

}  // namespace

std::string adopt_checkpoint_layout(Config& config) {
  const std::string checkpoint = run_start_checkpoint(config);
  if (checkpoint.empty() || config.given.contains("scan_layers")) return "";
  const json metadata = unverified_metadata(checkpoint);
  if (!metadata.is_object() || !metadata.contains("scan_layers") || !metadata["scan_layers"].is_boolean())
    return "";
  const bool stacked = metadata["scan_layers"].get<bool>();
  std::string line;
  if (stacked != config.scan_layers) {
    config.set("scan_layers", stacked ? "true" : "false");
    line = std::string("scan_layers=") + (stacked ? "true" : "false");
  }
  // A negative axis is not adopted: the load reports it.
  if (stacked && !config.given.contains("param_scan_axis") && metadata.contains("param_scan_axis") &&
      metadata["param_scan_axis"].is_number_unsigned() &&
      metadata["param_scan_axis"].get<uint64_t>() <=
          static_cast<uint64_t>(std::numeric_limits<int64_t>::max()) &&
      metadata["param_scan_axis"].get<int64_t>() != config.param_scan_axis) {
    config.set("param_scan_axis", std::to_string(metadata["param_scan_axis"].get<int64_t>()));
    line +=
        (line.empty() ? "" : " ") + std::string("param_scan_axis=") + std::to_string(config.param_scan_axis);
  }
  return line.empty() ? "" : line + " (unset here) adopted from " + checkpoint;
}

json saved_data_cursor(const std::string& checkpoint_dir) {
  const json metadata = unverified_metadata(checkpoint_dir);
  return metadata.is_object() && metadata.contains("data_cursor") ? metadata["data_cursor"] : json();
}

json saved_by_ranks(const std::string& checkpoint_dir) {
  const json metadata = unverified_metadata(checkpoint_dir);
  return metadata.is_object() && metadata.contains("saved_by") ? metadata["saved_by"] : json();
}

Config checkpoint_config(const std::string& checkpoint_dir,
                         const std::map<std::string, std::string>& replaced) {
  const fs::path metadata_path = fs::path(checkpoint_dir) / kMetadataFile;
  json metadata;
  try {
    metadata = json::parse(read_file_text(metadata_path.string(), "checkpoint metadata file"));
  } catch (const json::exception& e) {
    fail(metadata_path.string(), "valid JSON", e.what(), "the checkpoint is damaged; use another one");
  }
  if (!metadata.is_object() || !metadata.contains("config") || !metadata["config"].is_object()) {
    fail(metadata_path.string(), "a \"config\" object of key -> value text", "none",
         "the checkpoint is damaged or not a meshtrain checkpoint");
  }
  std::vector<std::string> overrides;
  std::string model_name;
  for (const auto& [key, value] : metadata["config"].items()) {
    const std::string value_text = value.is_string() ? value.get<std::string>() : value.dump();
    if (key == "model_name") {
      model_name = value_text;  // set below: as an override it would make load_config read the preset
      continue;
    }
    // Empty values (empty lists such as profiler_steps) keep base.yaml's default; none shapes the model.
    if (value_text.empty() || replaced.contains(key)) continue;
    overrides.push_back(key + "=" + value_text);
  }
  for (const auto& [key, value] : replaced) overrides.push_back(key + "=" + value);
  Config config = load_config("", overrides);
  config.model_name = model_name;
  return config;
}

std::string resolve_checkpoint_directory(const std::string& path, const std::string& flag) {
  std::error_code error;
  if (!fs::is_directory(path, error)) {
    fail(flag + " " + path, "a checkpoint directory, or a run_dir / checkpoints directory",
         fs::exists(path, error) ? "not a directory" : "no such directory");
  }
  if (fs::is_regular_file(fs::path(path) / kMetadataFile, error)) return path;
  for (const fs::path& candidate : {fs::path(path), fs::path(path) / "checkpoints"}) {
    if (!fs::is_directory(candidate, error)) continue;
    if (const std::optional<std::string> latest = latest_checkpoint(candidate.string())) return *latest;
  }
  fail(flag + " " + path, "a committed checkpoint (step_<N>/ holding COMMITTED) in it or in its checkpoints/",
       "none",
       "train with checkpointing on (checkpoint_period > 0), or pass a step_<N> directory; incomplete saves "
       "(step_<N>.tmp-*) are never used");
}

nlohmann::json verify_checkpoint_files(const std::string& checkpoint_dir,
                                       const std::vector<std::string>& names) {
  const LoadContext context = read_metadata(fs::path(checkpoint_dir));
  try {
    for (const std::string& name : names) verify_file(context, name);
  } catch (const json::exception& e) {
    fail(context.metadata_path.string(), "a metadata.json written by meshtrain", e.what(),
         "the checkpoint is damaged or not a meshtrain checkpoint; use another checkpoint");
  }
  return context.metadata;
}

}  // namespace meshtrain
