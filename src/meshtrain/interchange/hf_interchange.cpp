// Hugging Face import and export (hf_interchange.h): config.json through interchange/hf_config, tensor names
// and layouts through interchange/hf_names, weights through io/safetensors_folder, checkpoints through
// checkpoint/checkpoint. A model is described by its one-device spec (global shapes, nothing allocated).
#include "meshtrain/interchange/hf_interchange.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <sstream>

#include "meshtrain/checkpoint/checkpoint.h"
#include "meshtrain/checkpoint/checkpoint_layout.h"
#include "meshtrain/checkpoint/sharded_checkpoint.h"
#include "meshtrain/core/durable_file.h"
#include "meshtrain/core/error.h"
#include "meshtrain/core/stop_signals.h"
#include "meshtrain/data/tokenizer/tokenizer.h"
#include "meshtrain/interchange/hf_config.h"
#include "meshtrain/interchange/hf_names.h"
#include "meshtrain/io/safetensors.h"
#include "meshtrain/io/safetensors_folder.h"
#include "meshtrain/mesh/mesh.h"
#include "meshtrain/model/spec.h"

namespace meshtrain {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
using ordered_json = nlohmann::ordered_json;

int64_t product(const std::vector<int64_t>& dims) {
  int64_t count = 1;
  for (int64_t size : dims) count *= size;
  return count;
}

// The one-device spec of a config: every parameter at its global shape, no arena, each layer's own tensors
// (Hugging Face names layers one by one; a stacked checkpoint is read through its CheckpointLayout).
ModelSpec global_spec(Config config) {
  for (MeshAxis axis : kMeshAxes) config.mesh[axis] = 1;
  config.scan_layers = false;
  return build_model_spec(config);
}

// The entries of the mapping grouped by file tensor, in first-appearance order, and how many entries
// share each engine parameter (the routed experts' slices; one otherwise): an entry's span in the engine
// parameter is its share of the parameter's elements.
struct FileTensorPlan {
  std::string hf_name;
  std::vector<int64_t> shape;
  std::vector<const HfTensorMapping*> entries;
};

std::vector<FileTensorPlan> file_tensor_plans(const std::vector<HfTensorMapping>& mapping) {
  std::vector<FileTensorPlan> plans;
  std::map<std::string, size_t> index;
  for (const HfTensorMapping& entry : mapping) {
    const auto [it, added] = index.emplace(entry.hf_name, plans.size());
    if (added) plans.push_back({entry.hf_name, file_shape(entry), {}});
    plans[it->second].entries.push_back(&entry);
  }
  return plans;
}

std::map<BufferId, int64_t> entries_per_parameter(const std::vector<HfTensorMapping>& mapping) {
  std::map<BufferId, int64_t> count;
  for (const HfTensorMapping& entry : mapping) ++count[entry.parameter];
  return count;
}

// Elements of the engine parameter an entry covers: [engine_offset, engine_offset + span). The embedding's
// and unembedding's span is the whole (padded) parameter, so its padding rows are written too (as zeros).
int64_t entry_span(const ModelSpec& spec, const HfTensorMapping& entry,
                   const std::map<BufferId, int64_t>& shares) {
  return spec.buffer(entry.parameter).shape.elements() / shares.at(entry.parameter);
}

// A path given with a trailing slash names the same directory: "out/" -> "out" (the temporary sibling
// "<out>.tmp-<pid>" must not fall inside it).
std::string directory_path(const std::string& path) {
  fs::path normal = fs::path(path).lexically_normal();
  if (!normal.has_filename() && normal.has_parent_path()) normal = normal.parent_path();
  return normal.string();
}

// Hugging Face tensors that are not weights: GPT-2's causal-mask buffers (older transformers saved them),
// rotary inverse frequencies (older Llama-style checkpoints).
bool is_ignored_buffer(const std::string& name) {
  return name.ends_with(".attn.bias") || name.ends_with(".attn.masked_bias") ||
         name.ends_with("rotary_emb.inv_freq");
}

// The folder's name for a mapped tensor: GPT-2 checkpoints saved from GPT2Model (openai-community/gpt2)
// lack GPT2LMHeadModel's "transformer." prefix.
std::string folder_name(const SafetensorsFolder& folder, const std::string& hf_name) {
  if (folder.find(hf_name).entry != nullptr) return hf_name;
  const std::string prefix = "transformer.";
  if (hf_name.starts_with(prefix) && folder.find(hf_name.substr(prefix.size())).entry != nullptr)
    return hf_name.substr(prefix.size());
  return hf_name;
}

const std::set<std::string> kConvertibleDtypes = {"F32", "BF16", "F16", "F64"};

// The imported folder's config.json, kept in the checkpoint: export-hf takes its context length.
constexpr const char* kImportedConfigFile = "hf_config.json";

// A config value as YAML: numbers, booleans and lists as they are, anything else quoted (a path may hold
// ": " or " #").
std::string yaml_value(const std::string& value) {
  if (value == "true" || value == "false" || value.starts_with("[")) return value;
  char* end = nullptr;
  std::strtod(value.c_str(), &end);
  if (!value.empty() && end == value.c_str() + value.size()) return value;
  return json(value).dump();
}

// config.yaml beside an imported checkpoint's weights: the model's keys (and every key=value of the import)
// as a config to train on, with what continued pre-training wants in place of the preset's from-scratch
// run keys unless the import set them, then the preset's other run settings. It is complete in itself: its
// model_name (config.json's model_type) names the model, not a preset (config/config.h, load_config).
std::string training_config_yaml(const Config& config, const std::vector<std::string>& overrides,
                                 const std::string& preset, const fs::path& source,
                                 const fs::path& checkpoint, bool has_tokenizer,
                                 std::optional<int64_t> context) {
  std::string yaml = "# The model meshtrain import-hf read from the Hugging Face folder " + source.string() +
                     ". Continue pre-training with\n"
                     "#   meshtrain train " +
                     (checkpoint / "config.yaml").string() + " load_parameters_path=" + checkpoint.string() +
                     " dataset_path=YOUR_TEXT run_dir=YOUR_RUN\n"
                     "# and hand the result back with meshtrain export-hf YOUR_RUN --out FOLDER.\n";
  yaml += "model_name: " + yaml_value(config.model_name) + "\n";
  std::set<std::string> written;
  const auto write = [&](const std::string& key, const std::string& value, const std::string& comment) {
    if (!written.insert(key).second) return;
    yaml += key + ": " + yaml_value(value) + (comment.empty() ? "" : "  # " + comment) + "\n";
  };
  for (const std::string& text : overrides) {
    const std::string key = text.substr(0, text.find('='));
    if (key == "tokenizer_path") continue;  // the checkpoint's own copy, below
    const auto value = std::find_if(config.resolved.begin(), config.resolved.end(),
                                    [&](const auto& entry) { return entry.first == key; });
    // Empty values (empty lists) are base.yaml's defaults already.
    if (value != config.resolved.end() && !value->second.empty()) write(key, value->second, "");
  }
  if (has_tokenizer) write("tokenizer_path", (checkpoint / "tokenizer.json").string(), "");
  write("learning_rate", "3.0e-5", "continued pre-training: far below a from-scratch rate");
  if (context && config.decoder_block != DecoderBlock::gpt2) {
    write("max_target_length", std::to_string(std::min<int64_t>(*context, 2048)),
          "the model's context is " + std::to_string(*context));
  }
  write("dataset_type", "text", "dataset_path: text files (empty: the King James Bible)");
  write("dataset_path", "", "");
  write("eval_dataset_path", "", "");
  const Config defaults = load_config("", {});  // base.yaml alone: what a key left out of the file takes
  bool first = true;
  for (size_t i = 0; i < config.resolved.size(); ++i) {
    const auto& [key, value] = config.resolved[i];
    if (key == "model_name" || written.contains(key) || value == defaults.resolved[i].second) continue;
    if (first) yaml += "# Run settings of the " + preset + " preset (yours to change):\n";
    first = false;
    write(key, value, "");
  }
  return yaml;
}

// Between tensors: a SIGINT / SIGTERM ends the conversion as an error, so the temporary output is removed.
void stop_if_signalled(const std::string& out) {
  if (const int signal_number = stop_signal_received()) {
    fail(out, "the conversion to finish", "stopped by signal " + std::to_string(signal_number),
         "run the command again; nothing was written at " + out);
  }
}

std::string tensor_where(const SafetensorsFolder& folder, const std::string& name) {
  const SafetensorsLocation found = folder.find(name);
  const std::string file = found.file != nullptr ? found.file->path() : folder.directory();
  return file + ": tensor '" + name + "'";
}

}  // namespace

HfImportSummary import_hugging_face(const HfImportOptions& options, std::ostream& log) {
  const StopSignals stop_signals;
  const fs::path directory(options.hf_directory);
  std::error_code error;
  if (!fs::is_directory(directory, error)) {
    fail(options.hf_directory, "a Hugging Face model folder (config.json and safetensors weights)",
         fs::exists(directory, error) ? "not a directory" : "no such directory");
  }
  const fs::path config_path = directory / "config.json";
  if (!fs::is_regular_file(config_path, error)) {
    fail(config_path.string(), "a Hugging Face config.json", "no such file",
         "a Hugging Face model folder holds config.json beside its weights");
  }
  const HfModelConfig mapped = read_hf_config(config_path.string());

  // One layer of overrides: the mapped keys, the folder's tokenizer, then the user's, a later value of a key
  // replacing an earlier one (load_config refuses a key given twice in one layer).
  std::vector<std::string> overrides;
  const auto set_override = [&](const std::string& text) {
    const std::string key = text.substr(0, text.find('='));
    std::erase_if(overrides, [&](const std::string& o) { return o.substr(0, o.find('=')) == key; });
    overrides.push_back(text);
  };
  for (const std::string& text : mapped.overrides) set_override(text);
  // The tokenizer is the model's: the folder's, or none (never the preset's).
  const bool has_tokenizer = fs::is_regular_file(directory / "tokenizer.json", error);
  set_override("tokenizer_path=" + (has_tokenizer ? (directory / "tokenizer.json").string() : ""));
  for (const std::string& text : options.overrides) set_override(text);
  Config config = load_config(options.config.empty() ? mapped.preset : options.config, overrides);
  // The model's name is its config.json model_type, not the preset's (which gave only the run settings),
  // unless the import named it.
  const bool named = std::any_of(options.overrides.begin(), options.overrides.end(),
                                 [](const std::string& text) { return text.starts_with("model_name="); });
  if (!named) config.set("model_name", mapped.model_type);
  // What Hugging Face has no form for (Engram, mHC, ...) is refused by the config mapping, naming the key.
  (void)hf_config_from_meshtrain(config, "float32");
  const ModelSpec spec = global_spec(config);
  const std::vector<HfTensorMapping> mapping = hf_mapping(spec);
  const std::string out = directory_path(options.out);
  if (fs::exists(out, error)) {
    fail(out, "a new checkpoint directory", "it already exists",
         "choose another --out, or remove the existing directory first");
  }

  std::optional<Tokenizer> tokenizer;
  if (has_tokenizer) {
    tokenizer = Tokenizer::load((directory / "tokenizer.json").string());
    if (tokenizer->vocab_size() > config.vocab_size) {
      fail((directory / "tokenizer.json").string(),
           "at most vocab_size " + std::to_string(config.vocab_size) + " ids (config.json)",
           std::to_string(tokenizer->vocab_size()) + " ids",
           "the tokenizer does not belong to this model: use the model's own tokenizer.json");
    }
  }

  log << "import-hf: " << options.hf_directory << " (" << mapped.model_type << ", "
      << (mapped.weight_dtype.empty() ? "dtype not stated" : mapped.weight_dtype) << ") -> " << options.out
      << "\n";
  const SafetensorsFolder folder = SafetensorsFolder::open(options.hf_directory);

  // Everything is checked before the first byte is written.
  const std::vector<FileTensorPlan> plans = file_tensor_plans(mapping);
  std::set<std::string> consumed;
  for (const FileTensorPlan& plan : plans) {
    const std::string name = folder_name(folder, plan.hf_name);
    const SafetensorsLocation found = folder.find(name);
    if (found.entry == nullptr) {
      fail(folder.directory() + ": tensor '" + plan.hf_name + "'",
           "the tensor (config.json's " + mapped.model_type + " model has it)", "missing from the weights",
           plan.hf_name == "lm_head.weight"
               ? "an untied model needs lm_head.weight; if the model shares it with the embedding, its "
                 "config.json should say tie_word_embeddings: true"
               : "the weights do not belong to this config.json (check num_hidden_layers and the layer "
                 "kinds)");
    }
    if (found.entry->shape != plan.shape) {
      fail(found.file->path() + ": tensor '" + name + "'",
           "shape " + dims_text(plan.shape) + " (as config.json builds it)",
           "shape " + dims_text(found.entry->shape),
           "the weights do not match config.json: check its sizes (hidden_size, intermediate_size, heads, "
           "vocab_size)");
    }
    if (!kConvertibleDtypes.contains(found.entry->dtype)) {
      fail(found.file->path() + ": tensor '" + name + "'", "dtype F32, BF16, F16 or F64",
           "dtype " + found.entry->dtype,
           found.entry->dtype.starts_with("F8")
               ? "a quantized (FP8) checkpoint: dequantize it to bfloat16 first"
               : "convert the checkpoint to float32 or bfloat16 first");
    }
    consumed.insert(name);
  }
  const bool tied = config.logits_via_embedding;
  std::optional<std::string> tied_head;
  // DeepSeek-V3's multi-token-prediction modules are layers num_hidden_layers.. (transformers' causal LM
  // does not load them either).
  const int64_t first_extra_layer = config.base_num_decoder_layers;
  const int64_t prediction_layers = mapped.prediction_layers;
  const auto prediction_module = [&](const std::string& name) {
    for (int64_t k = first_extra_layer; k < first_extra_layer + prediction_layers; ++k) {
      if (name.starts_with("model.layers." + std::to_string(k) + ".")) return true;
    }
    return false;
  };
  for (const std::string& name : folder.tensor_names()) {
    if (consumed.contains(name) || is_ignored_buffer(name) || prediction_module(name)) continue;
    if (tied && name == "lm_head.weight") {
      tied_head = name;  // some savers write the tied head too: it must equal the embedding
      continue;
    }
    fail(tensor_where(folder, name), "only tensors of config.json's " + mapped.model_type + " model",
         "an extra tensor",
         "the weights do not belong to this config.json (more layers, biases or experts than it says?)");
  }
  if (tied_head) {
    const std::string embedding = folder_name(
        folder, mapped.model_type == "gpt2" ? "transformer.wte.weight" : "model.embed_tokens.weight");
    const SafetensorsLocation head = folder.find(*tied_head), table = folder.find(embedding);
    if (table.entry == nullptr || head.entry->shape != table.entry->shape) {
      fail(tensor_where(folder, *tied_head), "the shape of " + embedding + " (tie_word_embeddings: true)",
           "shape " + dims_text(head.entry->shape), "set tie_word_embeddings: false in config.json");
    }
    // Compared a bounded piece at a time (the table is the largest tensor of most models).
    const int64_t count = product(head.entry->shape), piece = std::min<int64_t>(count, int64_t{1} << 20);
    std::vector<float> a(static_cast<size_t>(piece)), b(a.size());
    bool equal = true;
    for (int64_t start = 0; start < count && equal; start += piece) {
      const int64_t span = std::min(piece, count - start);
      head.file->read_f32_blocks(*tied_head, head.entry->shape, start, 1, span, span, a.data());
      table.file->read_f32_blocks(embedding, table.entry->shape, start, 1, span, span, b.data());
      equal = std::equal(a.begin(), a.begin() + span, b.begin());
    }
    if (!equal) {
      fail(tensor_where(folder, *tied_head),
           "equal to " + embedding + " (config.json: tie_word_embeddings true)", "different values",
           "set tie_word_embeddings: false in config.json: the model has its own head");
    }
  }

  ParameterCheckpointWriter checkpoint(out);
  std::vector<SafetensorsTensorSpec> tensors;
  for (const ParameterDecl& parameter : spec.parameters) {
    const BufferDecl& buffer = spec.buffer(parameter.value);
    tensors.push_back({buffer.name, "F32", buffer.shape.dims});
  }
  SafetensorsWriter weights(checkpoint.model_path(), tensors, {{"format", "pt"}, {"source", "hugging_face"}});
  const std::map<BufferId, int64_t> shares = entries_per_parameter(mapping);
  HfImportSummary summary;
  std::vector<float> file_values, engine_values;
  for (const FileTensorPlan& plan : plans) {
    stop_if_signalled(out);
    const std::string name = folder_name(folder, plan.hf_name);
    const SafetensorsLocation found = folder.find(name);
    file_values.assign(static_cast<size_t>(product(plan.shape)), 0.0f);
    found.file->read_f32(name, plan.shape, file_values.data());
    for (const HfTensorMapping* entry : plan.entries) {
      const int64_t span = entry_span(spec, *entry, shares);
      engine_values.assign(static_cast<size_t>(span), 0.0f);
      hf_block_to_engine(*entry, file_values.data(), engine_values.data(), entry->engine_offset, span);
      weights.write_f32(spec.buffer(entry->parameter).name, entry->engine_offset, 1, span, span,
                        engine_values.data());
      summary.parameters += span;
    }
    ++summary.file_tensors;
  }
  weights.commit();
  CheckpointOptions checkpoint_options;
  if (tokenizer) {
    checkpoint_options.tokenizer_path = (directory / "tokenizer.json").string();
    checkpoint_options.tokenizer_identity = tokenizer->identity();
  }
  const ordered_json source = {{"kind", "imported from Hugging Face"},
                               {"directory", fs::absolute(directory).lexically_normal().string()},
                               {"model_type", mapped.model_type},
                               {"dtype", mapped.weight_dtype}};
  const fs::path final_path = fs::absolute(out).lexically_normal();
  // The weights are written per layer, as Hugging Face names them (a run with scan_layers=true converts).
  Config per_layer = config;
  per_layer.set("scan_layers", "false");
  checkpoint.commit(
      per_layer, {spec.dims.V, spec.parameter_count()}, checkpoint_options, source,
      {{kImportedConfigFile, read_file_text(config_path.string(), "config.json")},
       {"config.yaml",
        training_config_yaml(config, overrides, options.config.empty() ? mapped.preset : options.config,
                             fs::absolute(directory).lexically_normal(), final_path, has_tokenizer,
                             mapped.max_position_embeddings)}});
  log << "import-hf: " << summary.file_tensors << " tensors, " << spec.parameter_count() << " parameters"
      << (tokenizer ? ", tokenizer.json" : ", no tokenizer.json (generate needs one)") << "\n";
  summary.config = config;
  return summary;
}

namespace {

// The tokenizer files of a checkpoint as a Hugging Face folder holds them, with the tokenizer_config.json
// AutoTokenizer reads.
void write_tokenizer_files(const fs::path& checkpoint, const fs::path& out, const ordered_json& hf_config) {
  std::error_code error;
  const auto copy = [&](const char* from, const char* to) {
    write_file_atomically((out / to).string(),
                          read_file_text((checkpoint / from).string(), "tokenizer file"));
  };
  std::string tokenizer_class;
  if (fs::is_regular_file(checkpoint / "tokenizer.json", error)) {
    copy("tokenizer.json", "tokenizer.json");
    tokenizer_class = "PreTrainedTokenizerFast";
  } else if (fs::is_regular_file(checkpoint / "encoder.json", error)) {
    copy("encoder.json", "vocab.json");  // GPT-2's original files under the names transformers reads
    copy("vocab.bpe", "merges.txt");
    tokenizer_class = "GPT2Tokenizer";
  } else {
    return;  // a run on synthetic tokens: no tokenizer to hand on
  }
  const Tokenizer tokenizer = Tokenizer::load(checkpoint.string());
  // GPT-2 names its context n_positions.
  const int64_t context =
      hf_config.value("max_position_embeddings", hf_config.value("n_positions", int64_t{2048}));
  ordered_json tokenizer_config = {{"tokenizer_class", tokenizer_class},
                                   {"model_max_length", context},
                                   {"clean_up_tokenization_spaces", false}};
  // The special tokens config.json names (an imported model's own), else <|endoftext|>.
  const auto token_of = [&](const char* key) -> std::optional<std::string> {
    if (hf_config.contains(key) && hf_config[key].is_number_integer()) {
      const int64_t id = hf_config[key].get<int64_t>();
      if (id >= 0 && id < tokenizer.vocab_size()) return tokenizer.token_string(static_cast<int32_t>(id));
    }
    if (const std::optional<int32_t> eos = tokenizer.eos_id()) return tokenizer.token_string(*eos);
    return std::nullopt;
  };
  if (const std::optional<std::string> eos = token_of("eos_token_id")) tokenizer_config["eos_token"] = *eos;
  if (const std::optional<std::string> bos = token_of("bos_token_id")) tokenizer_config["bos_token"] = *bos;
  write_file_atomically((out / "tokenizer_config.json").string(), tokenizer_config.dump(2) + "\n");
}

std::string safetensors_dtype(const std::string& dtype) {
  if (dtype == "float32") return "F32";
  if (dtype == "bfloat16") return "BF16";
  if (dtype == "float16") return "F16";
  fail("--dtype", "float32, bfloat16 or float16", "'" + dtype + "'", "e.g. --dtype bfloat16");
}

}  // namespace

void export_hugging_face(const HfExportOptions& options, std::ostream& log) {
  const StopSignals stop_signals;
  const std::string file_dtype = safetensors_dtype(options.dtype);
  const std::string checkpoint_dir = resolve_checkpoint_directory(options.checkpoint, "export-hf");
  const std::string out_text = directory_path(options.out);
  const fs::path out(out_text);
  std::error_code error;
  if (fs::exists(out, error)) {
    fail(out_text, "a new folder for the Hugging Face model", "it already exists",
         "choose another --out, or remove the existing folder first");
  }
  // Every file the export reads is checked against metadata.json first.
  // A distributed checkpoint (format 3: index.json and per-rank shards) or one model.safetensors.
  const bool sharded = fs::exists(fs::path(checkpoint_dir) / kShardIndexFile, error);
  std::vector<std::string> read_files = {sharded ? kShardIndexFile : "model.safetensors"};
  for (const char* name : {kImportedConfigFile, "tokenizer.json", "encoder.json", "vocab.bpe"}) {
    if (fs::exists(fs::path(checkpoint_dir) / name, error)) read_files.push_back(name);
  }
  const json metadata = verify_checkpoint_files(checkpoint_dir, read_files);
  std::map<std::string, std::string> one_device;
  for (MeshAxis axis : kMeshAxes) one_device[std::string("mesh.") + mesh_axis_name(axis)] = "1";
  const Config config = checkpoint_config(checkpoint_dir, one_device);
  const ModelSpec spec = global_spec(config);
  HfSpecialTokens special;
  std::optional<int64_t> original_context;
  std::error_code tokenizer_error;
  const fs::path imported_config = fs::path(checkpoint_dir) / kImportedConfigFile;
  if (fs::is_regular_file(imported_config, tokenizer_error)) {
    // A model imported from Hugging Face keeps its own context length (its special token ids travel in the
    // config, hf_*_token_id, so that training keeps them too).
    json original;
    try {
      original = json::parse(read_file_text(imported_config.string(), "copy of the imported config.json"));
    } catch (const json::exception& e) {
      fail(imported_config.string(), "the config.json import-hf copied (valid JSON)", e.what(),
           "the checkpoint is damaged; import the model again");
    }
    if (original.contains("max_position_embeddings") &&
        original["max_position_embeddings"].is_number_integer())
      original_context = original["max_position_embeddings"].get<int64_t>();
  }
  if (fs::is_regular_file(fs::path(checkpoint_dir) / "tokenizer.json", tokenizer_error) ||
      fs::is_regular_file(fs::path(checkpoint_dir) / "encoder.json", tokenizer_error)) {
    if (const std::optional<int32_t> eos = Tokenizer::load(checkpoint_dir).eos_id()) {
      // GPT-2 and the trained tokenizers use <|endoftext|> for both (an import's own ids take precedence).
      special.bos_token_id = *eos;
      special.eos_token_id = *eos;
    }
  }
  special.max_position_embeddings = original_context;
  // First: it refuses what Hugging Face has no form for (Engram, mHC, ...), naming the key.
  const ordered_json hf_config = hf_config_from_meshtrain(config, options.dtype, special);
  const std::vector<HfTensorMapping> mapping = hf_mapping(spec);

  // Stacked (scan_layers) or per layer, as the checkpoint was saved; one file, or per-rank shards (format 3).
  const CheckpointLayout layout =
      CheckpointLayout::saved(metadata, config, (fs::path(checkpoint_dir) / "metadata.json").string());
  const fs::path model_path = fs::path(checkpoint_dir) / (sharded ? kShardIndexFile : "model.safetensors");
  std::optional<SafetensorsFile> model;
  std::optional<ShardedCheckpoint> shards;
  if (sharded) {
    shards.emplace(fs::path(checkpoint_dir));
  } else {
    model.emplace(SafetensorsFile::open(model_path.string()));
  }
  for (const ParameterDecl& parameter : spec.parameters) {
    const BufferDecl& buffer = spec.buffer(parameter.value);
    const CheckpointTensorPlace place = layout.place(buffer.name, buffer.shape.dims);
    std::optional<std::vector<int64_t>> found;
    if (sharded) {
      if (const auto entry = shards->tensors().find(place.name); entry != shards->tensors().end())
        found = entry->second;
    } else if (const SafetensorsEntry* entry = model->find(place.name)) {
      found = entry->shape;
    }
    if (!found || *found != place.dims) {
      fail(model_path.string() + ": tensor '" + place.name + "'",
           "shape " + dims_text(place.dims) + " (as the checkpoint's config builds it)",
           !found ? "missing" : "shape " + dims_text(*found),
           "the checkpoint is damaged or was written by another meshtrain version");
    }
  }
  // `span` elements of a parameter from `offset` on; a layer of a stacked tensor, and any tensor of a
  // sharded checkpoint, is read whole once.
  std::string layer_name;
  std::vector<float> layer_values;
  const auto read_span = [&](const BufferDecl& buffer, int64_t offset, int64_t span, float* destination) {
    const CheckpointTensorPlace place = layout.place(buffer.name, buffer.shape.dims);
    if (!sharded && place.index < 0) {
      model->read_f32_blocks(place.name, place.dims, offset, 1, span, span, destination);
      return;
    }
    if (layer_name != buffer.name) {
      layer_values.resize(static_cast<size_t>(buffer.shape.elements()));
      if (!sharded) {
        CheckpointLayout::read(*model, place, layer_values.data());
      } else {  // the layer's box: the whole tensor, or one deep on a stacked tensor's layer axis
        std::vector<int64_t> start(place.dims.size(), 0), dims = place.dims;
        if (place.index >= 0) {
          start[static_cast<size_t>(place.axis)] = place.index;
          dims[static_cast<size_t>(place.axis)] = 1;
        }
        shards->read_box(place.name, start, dims, layer_values.data());
      }
      layer_name = buffer.name;
    }
    std::copy_n(layer_values.begin() + offset, span, destination);
  };

  const fs::path temp = out_text + ".tmp-" + std::to_string(::getpid());
  fs::remove_all(temp, error);
  if (!out.parent_path().empty()) fs::create_directories(out.parent_path(), error);
  if (!fs::create_directory(temp, error) || error) {
    fail(temp.string(), "a new folder for the export", error ? error.message() : "it already exists",
         "check the permissions and free space of the output's parent folder");
  }
  // Removes the temporary folder unless the export completed.
  struct RemoveUnlessDone {
    fs::path path;
    bool done = false;
    ~RemoveUnlessDone() {
      std::error_code ignored;
      if (!done) fs::remove_all(path, ignored);
    }
  } cleanup{temp};

  log << "export-hf: " << checkpoint_dir << " -> " << out_text << " (" << options.dtype << ")\n";
  const std::vector<FileTensorPlan> plans = file_tensor_plans(mapping);
  std::vector<SafetensorsTensorSpec> tensors;
  for (const FileTensorPlan& plan : plans) tensors.push_back({plan.hf_name, file_dtype, plan.shape});
  SafetensorsFolderWriter weights(temp.string(), tensors, {{"format", "pt"}}, options.max_shard_bytes);
  const std::map<BufferId, int64_t> shares = entries_per_parameter(mapping);
  std::vector<float> file_values, engine_values;
  for (const FileTensorPlan& plan : plans) {
    stop_if_signalled(out_text);
    file_values.assign(static_cast<size_t>(product(plan.shape)), 0.0f);
    for (const HfTensorMapping* entry : plan.entries) {
      const BufferDecl& buffer = spec.buffer(entry->parameter);
      const int64_t span = entry_span(spec, *entry, shares);
      engine_values.resize(static_cast<size_t>(span));
      read_span(buffer, entry->engine_offset, span, engine_values.data());
      hf_block_to_file(*entry, engine_values.data(), entry->engine_offset, span, file_values.data());
    }
    const int64_t count = product(plan.shape);
    weights.write_f32(plan.hf_name, 0, 1, count, count, file_values.data());
  }
  weights.commit();
  write_file_atomically((temp / "config.json").string(), hf_config.dump(2) + "\n");
  ordered_json generation = {{"_from_model_config", true}};
  // Only ids: a null is GenerationConfig's default already, which save_pretrained leaves out.
  for (const char* key : {"bos_token_id", "eos_token_id", "pad_token_id"}) {
    if (hf_config.contains(key) && hf_config[key].is_number_integer()) generation[key] = hf_config[key];
  }
  write_file_atomically((temp / "generation_config.json").string(), generation.dump(2) + "\n");
  write_tokenizer_files(checkpoint_dir, temp, hf_config);
  fsync_directory(temp.string());
  if (::rename(temp.c_str(), out.c_str()) != 0) {
    fail(out_text, "the finished export renamed into place",
         std::string("rename failed: ") + std::strerror(errno),
         "check that nothing else created " + out_text + " meanwhile");
  }
  cleanup.done = true;
  fsync_directory(out.parent_path().empty() ? "." : out.parent_path().string());
  log << "export-hf: " << plans.size() << " tensors, " << spec.parameter_count() << " parameters"
      << (metadata.contains("step") ? ", step " + metadata["step"].dump() : "") << "\n";
}

}  // namespace meshtrain
