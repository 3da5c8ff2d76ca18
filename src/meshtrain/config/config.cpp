// GCC 12 at -O1 (the sanitizer build) reports std::regex's internals as maybe-uninitialized (a false
// positive, GCC bug 105562); warnings are errors, so that one warning is off in this file.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include "meshtrain/config/config.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <limits>
#include <nlohmann/json.hpp>
#include <regex>
#include <set>
#include <system_error>

#include "meshtrain/core/engram_tables.h"
#include "meshtrain/core/error.h"

namespace meshtrain {
namespace {

namespace fs = std::filesystem;

// One value as written by the user, with where it came from (for errors).
struct RawValue {
  std::vector<std::string> items;  // one item for scalars; comma-split or YAML sequence for lists
  std::string text;                // as written
  std::string source;              // "configs/base.yaml:12" or "command line"
};
using RawConfig = std::map<std::string, RawValue>;

int64_t parse_int(const std::string& key, const RawValue& raw) {
  const std::string& text = raw.text;
  int64_t value = 0;
  const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (error != std::errc() || end != text.data() + text.size()) {
    fail("config key '" + key + "' (" + raw.source + ")", "an integer", "'" + text + "'");
  }
  return value;
}

double parse_float(const std::string& key, const RawValue& raw) {
  const std::string& text = raw.text;
  char* end = nullptr;
  const double value = std::strtod(text.c_str(), &end);
  if (text.empty() || end != text.c_str() + text.size()) {
    fail("config key '" + key + "' (" + raw.source + ")", "a number", "'" + text + "'");
  }
  return value;
}

bool parse_bool(const std::string& key, const RawValue& raw) {
  const std::string& text = raw.text;
  if (text == "true" || text == "True" || text == "1") return true;
  if (text == "false" || text == "False" || text == "0") return false;
  fail("config key '" + key + "' (" + raw.source + ")", "true or false", "'" + text + "'");
}

// "a, b or c".
std::string alternatives(const std::vector<std::string>& names) {
  std::string text;
  for (size_t i = 0; i < names.size(); ++i) {
    text += (i == 0 ? "" : i + 1 == names.size() ? " or " : ", ") + names[i];
  }
  return text;
}

// The index of the value's text in `names`; any other text is an error naming the key, the names and the
// closest one.
size_t parse_choice(const std::string& key, const RawValue& raw, const std::vector<std::string>& names) {
  const auto found = std::find(names.begin(), names.end(), raw.text);
  if (found == names.end()) {
    fail("config key '" + key + "' (" + raw.source + ")", alternatives(names), "'" + raw.text + "'",
         "did you mean '" + closest_name(raw.text, names) + "'?");
  }
  return static_cast<size_t>(found - names.begin());
}

template <typename Enum>
Enum parse_enum(const std::string& key, const RawValue& raw, const std::vector<std::string>& names) {
  return static_cast<Enum>(parse_choice(key, raw, names));
}

struct KeyEntry {
  std::string name;
  std::function<void(Config&, const std::string& key, const RawValue&)> assign;
  bool affects_plan = false;            // recorded in the plan identity (plan_key_names)
  bool affects_pipelined_plan = false;  // recorded there under mesh.stage > 1 only (pipeline_plan_key_names)
  bool takes_records = false;           // a YAML list of mappings arrives as JSON text (records_key)
};

// A key the plan depends on: train and compile with the same such keys (and mesh, topology, threads) give
// identical plans whatever else the run config says.
KeyEntry plan_key(KeyEntry key) {
  key.affects_plan = true;
  return key;
}

// A key a plan depends on only when the mesh has pipeline stages: one-stage plans (and their identities)
// stay as they were before the pipeline keys existed.
KeyEntry pipeline_plan_key(KeyEntry key) {
  key.affects_pipelined_plan = true;
  return key;
}

// A key whose own parser reads a list of mappings (dataset_path's mixture, data/mixture.h): such a YAML list
// arrives as JSON text, every value a string; a list of plain values stays "a,b" as for any key.
KeyEntry records_key(KeyEntry key) {
  key.takes_records = true;
  return key;
}

KeyEntry entry(const std::string& name, int64_t Config::*member) {
  return {name,
          [member](Config& c, const std::string& k, const RawValue& r) { c.*member = parse_int(k, r); }};
}
KeyEntry entry(const std::string& name, double Config::*member) {
  return {name,
          [member](Config& c, const std::string& k, const RawValue& r) { c.*member = parse_float(k, r); }};
}
KeyEntry entry(const std::string& name, bool Config::*member) {
  return {name,
          [member](Config& c, const std::string& k, const RawValue& r) { c.*member = parse_bool(k, r); }};
}
KeyEntry entry(const std::string& name, std::string Config::*member) {
  return {name, [member](Config& c, const std::string&, const RawValue& r) { c.*member = r.text; }};
}
KeyEntry entry(const std::string& name, DType Config::*member) {
  return {name, [member](Config& c, const std::string& k, const RawValue& r) {
            c.*member = dtype_from_config(k, r.text);
          }};
}
// An enum-like key: its text must be one of `names` (indexed by the enum's value).
template <typename Enum, size_t Count>
KeyEntry entry(const std::string& name, Enum Config::*member, const std::array<const char*, Count>& names) {
  return {name, [member, &names](Config& c, const std::string& k, const RawValue& r) {
            c.*member = parse_enum<Enum>(k, r, std::vector<std::string>(names.begin(), names.end()));
          }};
}
// context_parallel_reorder takes only the balanced reorders (kContextParallelReorders): the plain split
// is context_parallel_load_balance=false, and asking for it here says so.
KeyEntry context_parallel_reorder_entry() {
  return {"context_parallel_reorder", [](Config& c, const std::string& k, const RawValue& r) {
            std::vector<std::string> names;
            for (ContextReorder reorder : kContextParallelReorders)
              names.push_back(context_reorder_name(reorder));
            if (r.text == context_reorder_name(ContextReorder::none)) {
              fail("config key '" + k + "' (" + r.source + ")", alternatives(names), "'" + r.text + "'",
                   "for a plain split of each row set context_parallel_load_balance=false instead");
            }
            c.context_parallel_reorder = kContextParallelReorders[parse_choice(k, r, names)];
          }};
}
KeyEntry context_parallel_strategy_entry() {
  return {"context_parallel_strategy", [](Config& c, const std::string& k, const RawValue& r) {
            const std::vector<std::string> names(kContextParallelStrategyNames.begin(),
                                                 kContextParallelStrategyNames.end());
            c.context_parallel_strategy = kContextParallelStrategies[parse_choice(k, r, names)];
          }};
}
// muon_consistent_rms: a positive number, or unset (MaxText's None): null (YAML's bare null arrives as "")
// or None.
KeyEntry muon_consistent_rms_entry() {
  return {"muon_consistent_rms", [](Config& c, const std::string& k, const RawValue& r) {
            if (r.text.empty() || r.text == "null" || r.text == "None") {
              c.muon_consistent_rms.reset();
              return;
            }
            c.muon_consistent_rms = parse_float(k, r);
            if (!(*c.muon_consistent_rms > 0.0)) {
              fail("config key '" + k + "' (" + r.source + ")", "a positive number, or null (unset)",
                   "'" + r.text + "'",
                   "MaxText recommends 0.2 to match AdamW's update RMS; null scales by shape");
            }
          }};
}
KeyEntry entry(const std::string& name, std::vector<std::string> Config::*member) {
  return {name, [member](Config& c, const std::string&, const RawValue& r) { c.*member = r.items; }};
}
KeyEntry entry(const std::string& name, std::vector<int64_t> Config::*member) {
  return {name, [member](Config& c, const std::string& k, const RawValue& r) {
            (c.*member).clear();
            for (const std::string& item : r.items)
              (c.*member).push_back(parse_int(k, RawValue{{item}, item, r.source}));
          }};
}
KeyEntry rule_entry(const std::string& logical_axis) {
  return {"logical_axis_rules." + logical_axis,
          [logical_axis](Config& c, const std::string&, const RawValue& r) {
            c.logical_axis_rules[logical_axis] = r.items;
          }};
}
// The keys mesh.<axis>, one per mesh axis in rank order (mesh/mesh.h), stand in the table as one placeholder
// that with_mesh_entries expands, so a new mesh axis needs no edit here.
const char* const kMeshEntriesPlaceholder = "mesh.<axis>";
KeyEntry mesh_entries_here() {
  return {kMeshEntriesPlaceholder, nullptr};
}
std::vector<KeyEntry> with_mesh_entries(std::vector<KeyEntry> table) {
  const auto placeholder = std::find_if(
      table.begin(), table.end(), [](const KeyEntry& key) { return key.name == kMeshEntriesPlaceholder; });
  std::vector<KeyEntry> mesh;
  for (MeshAxis axis : kMeshAxes) {
    mesh.push_back(
        {std::string("mesh.") + mesh_axis_name(axis),
         [axis](Config& c, const std::string& k, const RawValue& r) { c.mesh[axis] = parse_int(k, r); }});
  }
  table.insert(table.erase(placeholder), mesh.begin(), mesh.end());
  return table;
}

// The contract of shared/specs/config-keys.md, in its order. Every key here must have a default in base.yaml.
const std::vector<KeyEntry>& key_table() {
  static const std::vector<KeyEntry> table = with_mesh_entries({
      entry("model_name", &Config::model_name),
      plan_key(entry("decoder_block", &Config::decoder_block, kDecoderBlockNames)),
      plan_key(entry("base_emb_dim", &Config::base_emb_dim)),
      plan_key(entry("base_num_query_heads", &Config::base_num_query_heads)),
      plan_key(entry("base_num_kv_heads", &Config::base_num_kv_heads)),
      plan_key(entry("head_dim", &Config::head_dim)),
      plan_key(entry("base_mlp_dim", &Config::base_mlp_dim)),
      plan_key(entry("base_num_decoder_layers", &Config::base_num_decoder_layers)),
      plan_key(entry("vocab_size", &Config::vocab_size)),
      plan_key(entry("max_position_embeddings", &Config::max_position_embeddings)),
      plan_key(entry("logits_via_embedding", &Config::logits_via_embedding)),
      entry("normalization_layer_epsilon", &Config::normalization_layer_epsilon),
      entry("rope_max_timescale", &Config::rope_max_timescale),
      entry("hf_bos_token_id", &Config::hf_bos_token_id),
      entry("hf_eos_token_id", &Config::hf_eos_token_id),
      entry("hf_pad_token_id", &Config::hf_pad_token_id),
      plan_key(entry("attention_type", &Config::attention_type, kAttentionTypeNames)),
      plan_key(entry("q_lora_rank", &Config::q_lora_rank)),
      plan_key(entry("kv_lora_rank", &Config::kv_lora_rank)),
      plan_key(entry("qk_nope_head_dim", &Config::qk_nope_head_dim)),
      plan_key(entry("qk_rope_head_dim", &Config::qk_rope_head_dim)),
      plan_key(entry("v_head_dim", &Config::v_head_dim)),
      plan_key(entry("num_experts", &Config::num_experts)),
      plan_key(entry("num_experts_per_tok", &Config::num_experts_per_tok)),
      plan_key(entry("base_moe_mlp_dim", &Config::base_moe_mlp_dim)),
      plan_key(entry("first_num_dense_layers", &Config::first_num_dense_layers)),
      plan_key(entry("shared_experts", &Config::shared_experts)),
      entry("routed_score_func", &Config::routed_score_func, kRoutedScoreFuncNames),
      plan_key(entry("routed_bias", &Config::routed_bias)),
      entry("routed_bias_update_rate", &Config::routed_bias_update_rate),
      entry("routed_scaling_factor", &Config::routed_scaling_factor),
      entry("norm_topk_prob", &Config::norm_topk_prob),
      plan_key(entry("n_routing_groups", &Config::n_routing_groups)),
      plan_key(entry("topk_routing_group", &Config::topk_routing_group)),
      plan_key(entry("capacity_factor", &Config::capacity_factor)),
      entry("load_balance_loss_weight", &Config::load_balance_loss_weight),
      entry("z_loss_multiplier", &Config::z_loss_multiplier),
      plan_key(entry("engram_layers", &Config::engram_layers)),
      plan_key(entry("engram_max_ngram_size", &Config::engram_max_ngram_size)),
      plan_key(entry("engram_num_heads", &Config::engram_num_heads)),
      plan_key(entry("engram_head_dim", &Config::engram_head_dim)),
      plan_key(entry("engram_vocab_bases", &Config::engram_vocab_bases)),
      plan_key(entry("engram_kernel_size", &Config::engram_kernel_size)),
      entry("engram_seed", &Config::engram_seed),
      entry("engram_learning_rate_multiplier", &Config::engram_learning_rate_multiplier),
      entry("engram_weight_decay", &Config::engram_weight_decay),
      plan_key(entry("mhc_expansion_rate", &Config::mhc_expansion_rate)),
      plan_key(entry("sinkhorn_iterations", &Config::sinkhorn_iterations)),
      plan_key(entry("max_target_length", &Config::max_target_length)),
      plan_key(entry("dtype", &Config::dtype)),
      plan_key(entry("weight_dtype", &Config::weight_dtype)),
      plan_key(entry("grad_dtype", &Config::grad_dtype)),
      plan_key(entry("mu_dtype", &Config::mu_dtype)),
      plan_key(entry("remat_policy", &Config::remat_policy, kRematPolicyNames)),
      plan_key(entry("scan_layers", &Config::scan_layers)),
      entry("param_scan_axis", &Config::param_scan_axis),
      plan_key(entry("per_device_batch_size", &Config::per_device_batch_size)),
      plan_key(entry("gradient_accumulation_steps", &Config::gradient_accumulation_steps)),
      mesh_entries_here(),
      pipeline_plan_key(entry("pipeline_schedule", &Config::pipeline_schedule, kPipelineScheduleNames)),
      pipeline_plan_key(entry("num_pipeline_repeats", &Config::num_pipeline_repeats)),
      pipeline_plan_key(entry("pipeline_layers_per_chunk", &Config::pipeline_layers_per_chunk)),
      plan_key(entry("shard_optimizer_over_data", &Config::shard_optimizer_over_data)),
      plan_key(entry("context_parallel_load_balance", &Config::context_parallel_load_balance)),
      plan_key(context_parallel_reorder_entry()),
      plan_key(context_parallel_strategy_entry()),
      entry("topology", &Config::topology),
      entry("topologies_path", &Config::topologies_path),
      plan_key(rule_entry("batch")),
      plan_key(rule_entry("length")),
      plan_key(rule_entry("embed")),
      plan_key(rule_entry("heads")),
      plan_key(rule_entry("kv_heads")),
      plan_key(rule_entry("head_dim")),
      plan_key(rule_entry("mlp")),
      plan_key(rule_entry("vocab")),
      plan_key(rule_entry("positions")),
      plan_key(rule_entry("experts")),
      plan_key(rule_entry("engram_rows")),
      entry("kernels", &Config::kernels),
      entry("plan_out", &Config::plan_out),
      entry("plan_in", &Config::plan_in),
      entry("num_threads", &Config::num_threads),
      entry("collective_timeout_s", &Config::collective_timeout_s),
      entry("share_gpus", &Config::share_gpus),
      entry("exit_duration_in_mins", &Config::exit_duration_in_mins),
      entry("steps", &Config::steps),
      entry("learning_rate", &Config::learning_rate),
      entry("learning_rate_schedule_steps", &Config::learning_rate_schedule_steps),
      entry("warmup_steps_fraction", &Config::warmup_steps_fraction),
      entry("lr_schedule_type", &Config::lr_schedule_type, kLrScheduleTypeNames),
      entry("learning_rate_final_fraction", &Config::learning_rate_final_fraction),
      entry("cosine_learning_rate_final_fraction", &Config::cosine_learning_rate_final_fraction),
      entry("wsd_decay_steps_fraction", &Config::wsd_decay_steps_fraction),
      entry("wsd_decay_style", &Config::wsd_decay_style, kWsdDecayStyleNames),
      entry("adam_b1", &Config::adam_b1),
      entry("adam_b2", &Config::adam_b2),
      entry("adam_eps", &Config::adam_eps),
      entry("adam_weight_decay", &Config::adam_weight_decay),
      entry("adamw_mask", &Config::adamw_mask),
      entry("adamw_mask_include", &Config::adamw_mask_include),
      entry("opt_type", &Config::opt_type, kOptimizerTypeNames),  // in a plan's identity when not adamw
      entry("muon_beta", &Config::muon_beta),
      entry("muon_weight_decay", &Config::muon_weight_decay),
      muon_consistent_rms_entry(),
      entry("gradient_clipping_threshold", &Config::gradient_clipping_threshold),
      entry("init_weights_seed", &Config::init_weights_seed),
      entry("skip_nonfinite_steps", &Config::skip_nonfinite_steps),
      entry("skip_step_on_spikes", &Config::skip_step_on_spikes),
      entry("skip_step_interval", &Config::skip_step_interval),
      entry("skip_step_scaling_factor", &Config::skip_step_scaling_factor),
      entry("skip_step_max_consecutive", &Config::skip_step_max_consecutive),
      entry("dataset_type", &Config::dataset_type, kDatasetTypeNames),
      records_key(entry("dataset_path", &Config::dataset_path)),
      entry("eval_dataset_path", &Config::eval_dataset_path),
      entry("tokenizer_path", &Config::tokenizer_path),
      entry("train_data_columns", &Config::train_data_columns),
      entry("packing", &Config::packing),
      entry("enable_data_shuffling", &Config::enable_data_shuffling),
      entry("data_shuffle_seed", &Config::data_shuffle_seed),
      entry("eval_interval", &Config::eval_interval),
      entry("eval_steps", &Config::eval_steps),
      entry("run_dir", &Config::run_dir),
      entry("enable_checkpointing", &Config::enable_checkpointing),
      entry("checkpoint_period", &Config::checkpoint_period),
      entry("max_num_checkpoints_to_keep", &Config::max_num_checkpoints_to_keep),
      entry("load_parameters_path", &Config::load_parameters_path),
      entry("load_full_state_path", &Config::load_full_state_path),
      entry("allow_tokenizer_change", &Config::allow_tokenizer_change),
      entry("allow_data_change", &Config::allow_data_change),
      entry("profiler", &Config::profiler),
      entry("profiler_steps", &Config::profiler_steps),
  });
  return table;
}

const KeyEntry* find_key(const std::string& name) {
  for (const KeyEntry& key : key_table()) {
    if (key.name == name) return &key;
  }
  return nullptr;
}

void reject_unknown_key(const std::string& key, const std::string& source) {
  if (find_key(key)) return;
  fail("config key '" + key + "' (" + source + ")", "a known key", "an unknown key",
       "did you mean '" + closest_name(key, config_key_names()) + "'?");
}

// "a,b", "[a, b]" (YAML's flow form, as the presets write lists) or "[]".
std::vector<std::string> split_list(const std::string& written) {
  std::string text = written;
  if (text.size() >= 2 && text.front() == '[' && text.back() == ']') text = text.substr(1, text.size() - 2);
  std::erase(text, ' ');
  std::vector<std::string> items;
  size_t start = 0;
  while (start <= text.size()) {
    const size_t comma = text.find(',', start);
    const std::string item =
        text.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    if (!item.empty()) items.push_back(item);
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return items;
}

bool holds_mapping(const YAML::Node& sequence) {
  return std::any_of(sequence.begin(), sequence.end(), [](const YAML::Node& item) { return item.IsMap(); });
}

// A records_key's YAML list as JSON: a mapping of plain values becomes an object of strings, a plain item a
// string (the key's parser names what it expected there).
std::string records_json(const YAML::Node& sequence, const std::string& key, const std::string& source) {
  const std::string where = "config key '" + key + "' at " + source;
  nlohmann::json list = nlohmann::json::array();
  for (const auto& item : sequence) {
    if (item.IsScalar()) {
      list.push_back(item.as<std::string>());
      continue;
    }
    if (!item.IsMap()) fail(where, "a list of mappings ({path: a, weight: 0.7})", "an empty or nested item");
    nlohmann::json record = nlohmann::json::object();
    for (const auto& field : item) {
      if (!field.first.IsScalar() || !(field.second.IsScalar() || field.second.IsNull())) {
        fail(where, "mappings of plain values ({path: a, weight: 0.7})",
             "a nested sequence or mapping in one");
      }
      record[field.first.as<std::string>()] = field.second.IsNull() ? "" : field.second.as<std::string>();
    }
    list.push_back(record);
  }
  return list.dump();
}

// Flattens nested maps ("mesh: {data: 2}" -> "mesh.data"); a key twice in one file with different
// values is an error, with both lines named.
void flatten_yaml(const YAML::Node& node, const std::string& prefix, const std::string& path,
                  RawConfig& out) {
  for (const auto& item : node) {
    const std::string source = path + ":" + std::to_string(item.first.Mark().line + 1);
    if (!item.first.IsScalar())
      fail("a config key at " + source, "a plain name", "a YAML sequence or mapping");
    const std::string key = prefix + item.first.as<std::string>();
    const YAML::Node& value = item.second;
    if (value.IsMap()) {
      flatten_yaml(value, key + ".", path, out);
      continue;
    }
    RawValue raw{{}, "", source};
    const KeyEntry* known = find_key(key);
    if (value.IsSequence() && known && known->takes_records && holds_mapping(value)) {
      raw.text = records_json(value, key, source);
      raw.items = {raw.text};
    } else if (value.IsSequence()) {
      for (const auto& element : value) {
        if (!element.IsScalar()) {
          fail("config key '" + key + "' at " + source, "a list of plain values ([a, b])",
               "a nested sequence or mapping in the list");
        }
        raw.items.push_back(element.as<std::string>());
      }
      for (size_t i = 0; i < raw.items.size(); ++i) raw.text += (i ? "," : "") + raw.items[i];
    } else if (value.IsScalar()) {
      raw.text = value.as<std::string>();
      raw.items = split_list(raw.text);
    }
    reject_unknown_key(key, source);
    const auto existing = out.find(key);
    if (existing != out.end() && existing->second.text != raw.text) {
      fail("config key '" + key + "' in " + path, "each key once per file",
           "'" + existing->second.text + "' at " + existing->second.source + " and '" + raw.text + "' at " +
               source,
           "keep one of the two lines");
    }
    out[key] = raw;
  }
}

RawConfig read_yaml_layer(const std::string& path) {
  // The error_code form: a path the OS refuses (a name too long, a folder without permission) is the user's
  // to fix, not a std::filesystem exception.
  std::error_code path_error;
  if (!fs::is_regular_file(path, path_error)) {
    const bool refused = path_error && path_error != std::errc::no_such_file_or_directory;
    fail(path, "a readable YAML config file", refused ? path_error.message() : "no such file");
  }
  YAML::Node root;
  try {
    root = YAML::LoadFile(path);
  } catch (const YAML::Exception& error) {
    fail(path, "valid YAML", error.what());
  }
  RawConfig layer;
  if (root.IsNull()) return layer;
  if (!root.IsMap()) fail(path, "a YAML mapping of config keys", "a YAML scalar or sequence");
  flatten_yaml(root, "", path, layer);
  return layer;
}

RawConfig read_override_layer(const std::vector<std::string>& overrides) {
  RawConfig layer;
  for (const std::string& override_text : overrides) {
    const size_t equals = override_text.find('=');
    if (equals == std::string::npos || equals == 0) {
      fail("command line argument '" + override_text + "'", "key=value", "no '='");
    }
    const std::string key = override_text.substr(0, equals);
    const std::string text = override_text.substr(equals + 1);
    reject_unknown_key(key, "command line");
    const auto existing = layer.find(key);
    if (existing != layer.end() && existing->second.text != text) {
      fail("config key '" + key + "' on the command line", "each key once",
           "'" + existing->second.text + "' and '" + text + "'", "keep one of the two");
    }
    layer[key] = RawValue{split_list(text), text, "command line"};
  }
  return layer;
}

bool is_yaml_path(const std::string& argument) {
  return argument.find('/') != std::string::npos || argument.ends_with(".yaml") || argument.ends_with(".yml");
}

std::string preset_file(const std::string& dir, const std::string& name) {
  return dir + "/models/" + name + ".yaml";
}

std::string preset_path(const std::string& dir, const std::string& name, const std::string& what) {
  const std::string path = preset_file(dir, name);
  std::error_code error;  // a name the OS refuses (longer than a file name can be) is no preset either
  if (!fs::is_regular_file(path, error)) {
    const std::vector<std::string> presets = preset_names(dir);
    std::string listing;
    for (const std::string& preset : presets) listing += (listing.empty() ? "" : ", ") + preset;
    fail(what + " '" + name + "'", "a preset name (" + listing + ") or a YAML path",
         error && error != std::errc::no_such_file_or_directory
             ? "no preset of that name (" + error.message() + ")"
             : "no preset of that name",
         "did you mean '" + closest_name(name, presets) + "'?");
  }
  return path;
}

std::string model_name_in(const RawConfig& layer) {
  const auto found = layer.find("model_name");
  return found == layer.end() ? "" : found->second.text;
}

std::string text_of(int64_t value) {
  return std::to_string(value);
}

}  // namespace

void validate_attention_and_moe_keys(const Config& c, int64_t expert_degree) {
  const std::string mla_hint =
      "DeepSeek-V3 uses q_lora_rank=1536 kv_lora_rank=512 qk_nope_head_dim=128 "
      "qk_rope_head_dim=64 v_head_dim=128";
  if (c.attention_type == AttentionType::mla) {
    if (c.decoder_block != DecoderBlock::deepseek) {
      fail("config key 'attention_type'",
           std::string("global for decoder_block=") + decoder_block_name(c.decoder_block), "mla",
           "multi-head latent attention is built by decoder_block=deepseek; set that, or "
           "attention_type=global");
    }
    if (c.q_lora_rank < 0) {
      fail("config key 'q_lora_rank'", "0 (no query compression) or a positive rank", text_of(c.q_lora_rank),
           mla_hint);
    }
    for (const auto& [key, value] : {std::pair<const char*, int64_t>{"kv_lora_rank", c.kv_lora_rank},
                                     {"qk_nope_head_dim", c.qk_nope_head_dim},
                                     {"qk_rope_head_dim", c.qk_rope_head_dim},
                                     {"v_head_dim", c.v_head_dim}}) {
      if (value <= 0) {
        fail(std::string("config key '") + key + "'", "a positive integer under attention_type=mla",
             text_of(value), mla_hint);
      }
    }
    if (c.qk_rope_head_dim % 2 != 0) {
      fail("config key 'qk_rope_head_dim'", "an even number (RoPE rotates pairs of dimensions)",
           text_of(c.qk_rope_head_dim), "e.g. 64");
    }
    // The attention kernel takes one head width for q, k and v: v is zero-padded to the query / key width.
    if (c.v_head_dim > c.qk_nope_head_dim + c.qk_rope_head_dim) {
      fail("config key 'v_head_dim'",
           "at most qk_nope_head_dim + qk_rope_head_dim (" + text_of(c.qk_nope_head_dim) + " + " +
               text_of(c.qk_rope_head_dim) + "): the attention core pads v to the query / key head width",
           text_of(c.v_head_dim), "lower v_head_dim or widen qk_nope_head_dim");
    }
  }

  if (c.num_experts < 0) {
    fail("config key 'num_experts'", "0 (dense) or the number of routed experts", text_of(c.num_experts));
  }
  if (c.num_experts == 0) {
    if (expert_degree > 1) {
      fail("config key 'mesh.expert'", "1 for a dense model (num_experts=0)", text_of(expert_degree),
           "set num_experts, or mesh.expert=1");
    }
    return;
  }
  if (c.decoder_block == DecoderBlock::gpt2) {
    fail("config key 'num_experts'",
         std::string("0 for decoder_block=") + decoder_block_name(c.decoder_block), text_of(c.num_experts),
         "mixture-of-experts layers are built by decoder_block=deepseek or qwen3");
  }
  const std::string experts = "num_experts (" + text_of(c.num_experts) + ")";
  if (c.num_experts_per_tok < 1 || c.num_experts_per_tok > c.num_experts) {
    fail("config key 'num_experts_per_tok'", "between 1 and " + experts, text_of(c.num_experts_per_tok),
         "route each token to at most every expert");
  }
  if (c.base_moe_mlp_dim <= 0) {
    fail("config key 'base_moe_mlp_dim'", "a positive integer (each expert's MLP width) when num_experts > 0",
         text_of(c.base_moe_mlp_dim), "e.g. 2048 for DeepSeek-V3");
  }
  if (c.shared_experts < 0) {
    fail("config key 'shared_experts'", "0 or more", text_of(c.shared_experts));
  }
  if (c.first_num_dense_layers < 0 || c.first_num_dense_layers > c.base_num_decoder_layers) {
    fail("config key 'first_num_dense_layers'",
         "between 0 and base_num_decoder_layers (" + text_of(c.base_num_decoder_layers) + ")",
         text_of(c.first_num_dense_layers));
  }
  if (c.n_routing_groups < 1 || c.num_experts % c.n_routing_groups != 0) {
    fail("config key 'n_routing_groups'", "a divisor of " + experts + " (1: no group limit)",
         text_of(c.n_routing_groups), "each group holds num_experts / n_routing_groups experts");
  }
  if (c.topk_routing_group < 1 || c.topk_routing_group > c.n_routing_groups) {
    fail("config key 'topk_routing_group'",
         "between 1 and n_routing_groups (" + text_of(c.n_routing_groups) + ")",
         text_of(c.topk_routing_group));
  }
  const int64_t kept_experts = c.topk_routing_group * (c.num_experts / c.n_routing_groups);
  if (c.num_experts_per_tok > kept_experts) {
    fail("config key 'num_experts_per_tok'",
         "at most the experts of the kept groups: topk_routing_group x num_experts / n_routing_groups = " +
             text_of(c.topk_routing_group) + " x " + text_of(c.num_experts) + " / " +
             text_of(c.n_routing_groups) + " = " + text_of(kept_experts),
         text_of(c.num_experts_per_tok), "raise topk_routing_group or lower num_experts_per_tok");
  }
  if (expert_degree > 0 && c.num_experts % expert_degree != 0) {
    fail("config key 'mesh.expert'", "a divisor of " + experts + " (each expert rank holds a whole share)",
         text_of(expert_degree), "use an expert degree dividing num_experts");
  }
}

bool engram_layer(const Config& c, int64_t layer) {
  return std::find(c.engram_layers.begin(), c.engram_layers.end(), layer) != c.engram_layers.end();
}

void validate_engram_and_mhc_keys(const Config& c) {
  if (c.mhc_expansion_rate < 1) {
    fail("config key 'mhc_expansion_rate'", "1 (a plain residual) or more residual streams",
         text_of(c.mhc_expansion_rate), "DeepSeek's mHC uses 4");
  }
  if (c.mhc_expansion_rate > 1) {
    if (c.decoder_block != DecoderBlock::deepseek) {
      fail("config key 'mhc_expansion_rate'",
           std::string("1 for decoder_block=") + decoder_block_name(c.decoder_block),
           text_of(c.mhc_expansion_rate), "mHC hyper-connections are built by decoder_block=deepseek");
    }
    if (c.sinkhorn_iterations < 1) {
      fail("config key 'sinkhorn_iterations'", "a positive number of Sinkhorn iterations",
           text_of(c.sinkhorn_iterations), "mHC uses 20");
    }
  }
  if (c.engram_layers.empty()) return;
  if (c.decoder_block != DecoderBlock::deepseek) {
    fail("config key 'engram_layers'",
         std::string("[] for decoder_block=") + decoder_block_name(c.decoder_block),
         "a list of " + text_of(static_cast<int64_t>(c.engram_layers.size())) + " layers",
         "Engram blocks are built by decoder_block=deepseek");
  }
  for (size_t i = 0; i < c.engram_layers.size(); ++i) {
    const int64_t layer = c.engram_layers[i];
    if (layer < 0 || layer >= c.base_num_decoder_layers) {
      fail("config key 'engram_layers'",
           "layer indices in [0, base_num_decoder_layers) = [0, " + text_of(c.base_num_decoder_layers) + ")",
           text_of(layer), "name layers of this model (0-based)");
    }
    if (std::find(c.engram_layers.begin(), c.engram_layers.begin() + static_cast<std::ptrdiff_t>(i), layer) !=
        c.engram_layers.begin() + static_cast<std::ptrdiff_t>(i)) {
      fail("config key 'engram_layers'", "each layer at most once", "layer " + text_of(layer) + " twice",
           "remove the repeated index");
    }
  }
  if (c.engram_max_ngram_size < 2) {
    fail("config key 'engram_max_ngram_size'", "at least 2 (orders 2..N are hashed; there are no unigrams)",
         text_of(c.engram_max_ngram_size), "the paper and the reference use 3");
  }
  for (const auto& [key, value] : {std::pair<const char*, int64_t>{"engram_num_heads", c.engram_num_heads},
                                   {"engram_head_dim", c.engram_head_dim},
                                   {"engram_kernel_size", c.engram_kernel_size}}) {
    if (value <= 0) {
      fail(std::string("config key '") + key + "'", "a positive integer when engram_layers is set",
           text_of(value));
    }
  }
  const auto orders = static_cast<size_t>(c.engram_max_ngram_size - 1);
  if (c.engram_vocab_bases.size() != orders) {
    fail("config key 'engram_vocab_bases'",
         text_of(static_cast<int64_t>(orders)) + " entries, one per hashed order 2..engram_max_ngram_size (" +
             text_of(c.engram_max_ngram_size) + ")",
         text_of(static_cast<int64_t>(c.engram_vocab_bases.size())) + " entries",
         "e.g. engram_vocab_bases=[226240, 226240] for engram_max_ngram_size=3");
  }
  for (size_t order = 0; order < orders; ++order) {
    // Each head takes a distinct prime table size above its base: a base below 2 leaves no room for a
    // table that hashes anything apart.
    if (c.engram_vocab_bases[order] < 2) {
      fail("config key 'engram_vocab_bases'",
           "at least 2 rows for each head's table of order " + text_of(static_cast<int64_t>(order + 2)),
           text_of(c.engram_vocab_bases[order]),
           "use bases of the order of the compressed vocabulary or more");
    }
  }
  // Row ids (hash + head offset) are int32 in the lookup: each layer's tables together fit.
  const auto sizes = engram_table_sizes(static_cast<int64_t>(c.engram_layers.size()), c.engram_max_ngram_size,
                                        c.engram_num_heads, c.engram_vocab_bases);
  for (size_t layer = 0; layer < sizes.size(); ++layer) {
    int64_t rows = 0;
    for (const std::vector<int64_t>& order : sizes[layer])
      for (int64_t size : order) rows += size;
    if (rows > std::numeric_limits<int32_t>::max()) {
      fail("config key 'engram_vocab_bases'",
           "tables whose rows fit int32 ids: layer " + text_of(c.engram_layers[layer]) +
               "'s heads hold at most 2147483647 rows together",
           text_of(rows) + " rows", "use smaller bases, fewer heads or a smaller engram_max_ngram_size");
    }
  }
  if (c.engram_learning_rate_multiplier < 0.0 || c.engram_weight_decay < 0.0) {
    fail("config keys 'engram_learning_rate_multiplier' / 'engram_weight_decay'", "0 or more",
         std::to_string(c.engram_learning_rate_multiplier) + " / " + std::to_string(c.engram_weight_decay));
  }
}

void Config::set(const std::string& key, const std::string& value) {
  for (const KeyEntry& entry : key_table()) {
    if (entry.name != key) continue;
    entry.assign(*this, key, RawValue{split_list(value), value, "checkpoint"});
    for (auto& [name, text] : resolved) {
      if (name == key) text = value;
    }
    return;
  }
  MT_CHECK(false, "no config key " + key);
}

std::string config_directory() {
  if (const char* from_environment = std::getenv("MESHTRAIN_CONFIG_DIR")) return from_environment;
  return std::string(MESHTRAIN_SOURCE_DIR) + "/configs";
}

std::vector<std::string> preset_names(const std::string& config_dir) {
  const std::string dir = (config_dir.empty() ? config_directory() : config_dir) + "/models";
  std::vector<std::string> names;
  if (fs::is_directory(dir)) {
    for (const auto& file : fs::directory_iterator(dir)) {
      if (file.path().extension() == ".yaml") names.push_back(file.path().stem().string());
    }
  }
  std::sort(names.begin(), names.end());
  return names;
}

std::vector<std::string> config_key_names() {
  std::vector<std::string> names;
  for (const KeyEntry& key : key_table()) names.push_back(key.name);
  return names;
}

std::vector<std::string> plan_key_names() {
  std::vector<std::string> names;
  for (const KeyEntry& key : key_table()) {
    if (key.affects_plan) names.push_back(key.name);
  }
  return names;
}

std::vector<std::string> pipeline_plan_key_names() {
  std::vector<std::string> names;
  for (const KeyEntry& key : key_table()) {
    if (key.affects_pipelined_plan) names.push_back(key.name);
  }
  return names;
}

namespace {

// hf_*_token_id: an id of the vocabulary, null, absent or "" (config.h says what each means to export-hf).
void validate_hf_token_id_keys(const Config& c) {
  for (const auto& [key, value] :
       {std::pair<const char*, const std::string&>{"hf_bos_token_id", c.hf_bos_token_id},
        {"hf_eos_token_id", c.hf_eos_token_id},
        {"hf_pad_token_id", c.hf_pad_token_id}}) {
    if (value.empty() || value == "null" || value == "absent") continue;
    int64_t id = -1;
    const auto [end, error] = std::from_chars(value.data(), value.data() + value.size(), id);
    if (error != std::errc() || end != value.data() + value.size() || id < 0 ||
        (c.vocab_size > 0 && id >= c.vocab_size)) {
      fail(std::string("config key '") + key + "'",
           "a token id in [0, vocab_size = " + text_of(c.vocab_size) + "), null, absent or \"\"",
           "'" + value + "'", "import-hf records what the model's config.json says; leave the key to it");
    }
  }
}

// The schedule and spike keys (before anything is allocated). The final fraction has two names: today's
// learning_rate_final_fraction (MaxText's) and the older cosine_learning_rate_final_fraction (the key
// contract's, held by committed checkpoints' configs); the one given sets both, both given must agree.
void resolve_schedule_keys(Config& c) {
  const bool new_name = c.given.contains("learning_rate_final_fraction");
  const bool old_name = c.given.contains("cosine_learning_rate_final_fraction");
  if (new_name && old_name && c.learning_rate_final_fraction != c.cosine_learning_rate_final_fraction) {
    fail("config keys 'learning_rate_final_fraction' / 'cosine_learning_rate_final_fraction'",
         "one value (the second is the first's older name)",
         to_text(c.learning_rate_final_fraction) + " / " + to_text(c.cosine_learning_rate_final_fraction),
         "set learning_rate_final_fraction only");
  }
  const std::string in_force =
      old_name && !new_name ? "cosine_learning_rate_final_fraction" : "learning_rate_final_fraction";
  const auto written = std::find_if(c.resolved.begin(), c.resolved.end(),
                                    [&](const auto& key_text) { return key_text.first == in_force; });
  const std::string text = written->second;  // a copy: set() rewrites the entries
  c.set("learning_rate_final_fraction", text);
  c.set("cosine_learning_rate_final_fraction", text);
  if (c.learning_rate_schedule_steps == 0 || c.learning_rate_schedule_steps < -1) {
    fail("config key 'learning_rate_schedule_steps'", "-1 (the run's steps) or a positive number of steps",
         text_of(c.learning_rate_schedule_steps),
         "set it to the length the schedule should have, e.g. the planned total steps of a run done in legs");
  }
  for (const auto& [key, value] :
       {std::pair<std::string, double>{"warmup_steps_fraction", c.warmup_steps_fraction},
        {in_force, c.learning_rate_final_fraction},  // the name the user gave
        {"wsd_decay_steps_fraction", c.wsd_decay_steps_fraction}}) {
    if (!(value >= 0.0 && value <= 1.0)) {
      fail("config key '" + key + "'", "a fraction in [0, 1]", to_text(value), "e.g. 0.1 (the default)");
    }
  }
  if (c.lr_schedule_type == LrScheduleType::wsd &&
      c.warmup_steps_fraction + c.wsd_decay_steps_fraction > 1.0) {
    fail("config keys 'warmup_steps_fraction' + 'wsd_decay_steps_fraction' (lr_schedule_type=wsd)",
         "at most 1 (warmup and decay share the schedule; the stable phase is the rest)",
         to_text(c.warmup_steps_fraction) + " + " + to_text(c.wsd_decay_steps_fraction),
         "lower one of the two");
  }
  // MaxText's statistic needs two losses for a standard deviation.
  if (c.skip_step_interval < 2) {
    fail("config key 'skip_step_interval'", "at least 2 recent losses (their mean and standard deviation)",
         text_of(c.skip_step_interval), "MaxText's default is 128");
  }
  if (!(c.skip_step_scaling_factor > 0.0)) {
    fail("config key 'skip_step_scaling_factor'", "a positive number of standard deviations",
         to_text(c.skip_step_scaling_factor), "MaxText's default is 6.0");
  }
  if (c.skip_step_max_consecutive < 0) {
    fail("config key 'skip_step_max_consecutive'", "0 (no limit) or a positive number of skips in a row",
         text_of(c.skip_step_max_consecutive), "e.g. 10 (the default)");
  }
}

// adamw_mask, adamw_mask_include: each item a valid regular expression (whether it matches a tensor is the
// optimizer's check, optim/groups.h, once the model's names are known).
void validate_decay_pattern_keys(const Config& c) {
  for (const auto& [key, patterns] :
       {std::pair<const char*, const std::vector<std::string>&>{"adamw_mask", c.adamw_mask},
        {"adamw_mask_include", c.adamw_mask_include}}) {
    for (const std::string& pattern : patterns) {
      // std::regex compiles and matches by recursion: a bound on the length bounds its stack (a name
      // pattern needs far fewer characters than this).
      constexpr size_t kLongestPattern = 256;
      if (pattern.size() > kLongestPattern) {
        fail(std::string("config key '") + key + "'",
             "patterns of at most " + std::to_string(kLongestPattern) + " characters",
             "one of " + std::to_string(pattern.size()), "match a shorter part of the tensor names");
      }
      try {
        std::regex compiled(pattern);
      } catch (const std::regex_error& error) {
        fail(std::string("config key '") + key + "'",
             "ECMAScript regular expressions searched in canonical parameter names",
             "'" + pattern + "' (" + error.what() + ")",
             "e.g. " + std::string(key) + "=[norm, bias] (a list item holds no comma on the command line)");
      }
    }
  }
}

}  // namespace

Config load_config(const std::string& config_argument, const std::vector<std::string>& overrides,
                   const std::string& config_dir) {
  const std::string dir = config_dir.empty() ? config_directory() : config_dir;
  const RawConfig command_line = read_override_layer(overrides);
  RawConfig user_file;
  std::string model_name = model_name_in(command_line);
  if (is_yaml_path(config_argument)) {
    user_file = read_yaml_layer(config_argument);
    // A file that sets decoder_block describes its own model (import-hf's config.yaml): its model_name is
    // that model's name, and selects a preset only when one of that name exists.
    const std::string file_model = model_name_in(user_file);
    std::error_code error;
    const bool own_model =
        user_file.contains("decoder_block") && !fs::is_regular_file(preset_file(dir, file_model), error);
    if (model_name.empty() && !own_model) model_name = file_model;
  } else if (model_name.empty()) {
    model_name = config_argument;
  }

  std::vector<RawConfig> layers = {read_yaml_layer(dir + "/base.yaml")};
  if (!model_name.empty()) {
    layers.push_back(read_yaml_layer(preset_path(dir, model_name, "config")));
    layers.back()["model_name"] = RawValue{{model_name}, model_name, "preset"};
  }
  layers.push_back(user_file);
  layers.push_back(command_line);

  RawConfig merged;
  Config config;
  for (size_t i = 0; i < layers.size(); ++i) {
    for (const auto& [key, value] : layers[i]) {
      merged[key] = value;
      if (i > 0) config.given.insert(key);
    }
  }
  for (const KeyEntry& key : key_table()) {
    const auto found = merged.find(key.name);
    if (found == merged.end()) {
      fail(dir + "/base.yaml", "a default for every config key", "no default for '" + key.name + "'",
           "add '" + key.name + ":' to base.yaml");
    }
    key.assign(config, key.name, found->second);
    config.resolved.emplace_back(key.name, found->second.text);
  }
  validate_attention_and_moe_keys(config, config.mesh[MeshAxis::expert]);
  validate_engram_and_mhc_keys(config);
  validate_hf_token_id_keys(config);
  resolve_schedule_keys(config);
  validate_decay_pattern_keys(config);
  if (!(config.muon_beta >= 0.0 && config.muon_beta < 1.0)) {
    fail("config key 'muon_beta'", "a momentum decay in [0, 1)", to_text(config.muon_beta),
         "MaxText's default is 0.95");
  }
  if (!(config.muon_weight_decay >= 0.0)) {
    fail("config key 'muon_weight_decay'", "0 or more", to_text(config.muon_weight_decay),
         "MaxText's default is 0 (no decay)");
  }
  if (!(config.exit_duration_in_mins >= 0.0)) {
    fail("config key 'exit_duration_in_mins'", "0 (no limit) or a positive number of minutes",
         to_text(config.exit_duration_in_mins),
         "set it to the job's time limit less the time one step and a checkpoint take, e.g. 230 for 4 hours");
  }
  if (!(config.z_loss_multiplier >= 0.0 && std::isfinite(config.z_loss_multiplier))) {
    fail("config key 'z_loss_multiplier'", "0 (no z-loss) or a positive finite multiplier",
         to_text(config.z_loss_multiplier), "set z_loss_multiplier=0 to turn it off, or e.g. 1e-4 (PaLM's)");
  }
  if (config.param_scan_axis < 0) {
    fail("config key 'param_scan_axis'", "0 or more (where a stacked tensor's layer axis goes)",
         std::to_string(config.param_scan_axis),
         "use 0 for the layer axis first, or 1 (the default) for after the first dim");
  }
  return config;
}

}  // namespace meshtrain
