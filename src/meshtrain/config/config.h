// The run configuration: configs/base.yaml, then a model preset or a user YAML, then key=value overrides.
// One typed struct; every key, its type and default live in one table (config.cpp) that mirrors
// shared/specs/config-keys.md. Unknown keys name the closest valid key; wrong types name the expected one.
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "meshtrain/core/dtype.h"
#include "meshtrain/mesh/context_reorder.h"
#include "meshtrain/mesh/mesh.h"

namespace meshtrain {

// The enum-like keys, parsed once when the config is loaded (an unknown value is an error naming the key,
// the valid values and the closest one). Each enum has its config texts, indexed by value (k...Names, as in
// shared/specs/config-keys.md), and its values in that order (for code that enumerates them).
enum class DecoderBlock { qwen3, gpt2, deepseek };  // the model family (model/families.h)
inline constexpr std::array kDecoderBlockNames = {"qwen3", "gpt2", "deepseek"};
inline constexpr std::array kDecoderBlocks = {DecoderBlock::qwen3, DecoderBlock::gpt2,
                                              DecoderBlock::deepseek};

// The self-attention of each layer (MaxText's AttentionType names): `global` is causal attention over the
// whole sequence with query / key / value projections (GQA); `mla` is DeepSeek-V2/V3 multi-head latent
// attention (model/layers/mla.h), low-rank query and key / value projections with a decoupled RoPE part.
enum class AttentionType { global, mla };
inline constexpr std::array kAttentionTypeNames = {"global", "mla"};
inline constexpr std::array kAttentionTypes = {AttentionType::global, AttentionType::mla};

// How a MoE router turns expert logits into scores (DeepSeek-V2: softmax; DeepSeek-V3: sigmoid).
enum class RoutedScoreFunc { softmax, sigmoid };
inline constexpr std::array kRoutedScoreFuncNames = {"softmax", "sigmoid"};
inline constexpr std::array kRoutedScoreFuncs = {RoutedScoreFunc::softmax, RoutedScoreFunc::sigmoid};

// What the backward pass recomputes instead of keeping (plan/remat.cpp).
enum class RematPolicy { none, minimal, full };
inline constexpr std::array kRematPolicyNames = {"none", "minimal", "full"};
inline constexpr std::array kRematPolicies = {RematPolicy::none, RematPolicy::minimal, RematPolicy::full};

// Where training tokens come from: text files tokenized at start, prepared .tokens shards, or a function of
// (seed, step, row).
enum class DatasetType { text, tokens, synthetic };
inline constexpr std::array kDatasetTypeNames = {"text", "tokens", "synthetic"};
inline constexpr std::array kDatasetTypes = {DatasetType::text, DatasetType::tokens, DatasetType::synthetic};

// How attention sees keys and values of the whole sequence under mesh.context > 1
// (shared/specs/context-parallel.md): all_gather gathers K / V over the context axis; ring passes K / V
// blocks around the context ranks, each pass overlapping one block's attention
// (model/parallel/context_attention.h).
enum class ContextParallelStrategy { all_gather, ring };
inline constexpr std::array kContextParallelStrategyNames = {"all_gather", "ring"};
inline constexpr std::array kContextParallelStrategies = {ContextParallelStrategy::all_gather,
                                                          ContextParallelStrategy::ring};

// The pipeline schedule under mesh.stage > 1 (shared/specs/pipeline.md; plan/pipeline_schedule.h builds
// each): torchtitan's schedule names in lower case (ScheduleGPipe, Schedule1F1B, ScheduleInterleaved1F1B;
// zero_bubble is ZB-H1).
enum class PipelineScheduleKind { gpipe, one_f_one_b, interleaved_one_f_one_b, zero_bubble };
inline constexpr std::array kPipelineScheduleNames = {"gpipe", "1f1b", "interleaved_1f1b", "zero_bubble"};
inline constexpr std::array kPipelineScheduleKinds = {
    PipelineScheduleKind::gpipe, PipelineScheduleKind::one_f_one_b,
    PipelineScheduleKind::interleaved_one_f_one_b, PipelineScheduleKind::zero_bubble};

// The learning-rate schedule's shape (train/schedule.h): MaxText's lr_schedule_type names (cosine, wsd:
// warmup-stable-decay) and constant (warmup, then the peak). WSD's decay follows wsd_decay_style: MaxText's
// linear and cosine, and 1-sqrt (Hägele et al. 2024; torchtitan's decay_type `sqrt`).
enum class LrScheduleType { cosine, wsd, constant };
inline constexpr std::array kLrScheduleTypeNames = {"cosine", "wsd", "constant"};
inline constexpr std::array kLrScheduleTypes = {LrScheduleType::cosine, LrScheduleType::wsd,
                                                LrScheduleType::constant};
enum class WsdDecayStyle { linear, cosine, one_minus_sqrt };
inline constexpr std::array kWsdDecayStyleNames = {"linear", "cosine", "1-sqrt"};
inline constexpr std::array kWsdDecayStyles = {WsdDecayStyle::linear, WsdDecayStyle::cosine,
                                               WsdDecayStyle::one_minus_sqrt};

// opt_type (MaxText's key): AdamW for every parameter, or Muon for the hidden weight matrices and AdamW for
// the rest (optim/groups.h says which is which).
enum class OptimizerType { adamw, muon };
inline constexpr std::array kOptimizerTypeNames = {"adamw", "muon"};
inline constexpr std::array kOptimizerTypes = {OptimizerType::adamw, OptimizerType::muon};

static_assert(kOptimizerTypes.size() == kOptimizerTypeNames.size() &&
                  kDecoderBlocks.size() == kDecoderBlockNames.size() &&
                  kAttentionTypes.size() == kAttentionTypeNames.size() &&
                  kRoutedScoreFuncs.size() == kRoutedScoreFuncNames.size() &&
                  kContextParallelStrategies.size() == kContextParallelStrategyNames.size() &&
                  kRematPolicies.size() == kRematPolicyNames.size() &&
                  kDatasetTypes.size() == kDatasetTypeNames.size() &&
                  kPipelineScheduleKinds.size() == kPipelineScheduleNames.size() &&
                  kLrScheduleTypes.size() == kLrScheduleTypeNames.size() &&
                  kWsdDecayStyles.size() == kWsdDecayStyleNames.size(),
              "one name per enum value");

inline const char* optimizer_type_name(OptimizerType type) {
  return kOptimizerTypeNames[static_cast<size_t>(type)];
}
inline const char* decoder_block_name(DecoderBlock block) {
  return kDecoderBlockNames[static_cast<size_t>(block)];
}
inline const char* attention_type_name(AttentionType type) {
  return kAttentionTypeNames[static_cast<size_t>(type)];
}
inline const char* routed_score_func_name(RoutedScoreFunc func) {
  return kRoutedScoreFuncNames[static_cast<size_t>(func)];
}
inline const char* remat_policy_name(RematPolicy policy) {
  return kRematPolicyNames[static_cast<size_t>(policy)];
}
inline const char* dataset_type_name(DatasetType type) {
  return kDatasetTypeNames[static_cast<size_t>(type)];
}
inline const char* pipeline_schedule_name(PipelineScheduleKind kind) {
  return kPipelineScheduleNames[static_cast<size_t>(kind)];
}
inline const char* lr_schedule_type_name(LrScheduleType type) {
  return kLrScheduleTypeNames[static_cast<size_t>(type)];
}
inline const char* wsd_decay_style_name(WsdDecayStyle style) {
  return kWsdDecayStyleNames[static_cast<size_t>(style)];
}

// The values the key context_parallel_reorder takes, by name (ContextReorder and its names are in
// mesh/context_reorder.h). `none` is not one of them: context_parallel_load_balance=false asks for it.
inline constexpr std::array kContextParallelReorders = {ContextReorder::dual_chunk_swap,
                                                        ContextReorder::striped};

struct Config {
  // Model shape
  std::string model_name;
  DecoderBlock decoder_block = DecoderBlock::qwen3;
  int64_t base_emb_dim = 0, base_num_query_heads = 0, base_num_kv_heads = 0, head_dim = 0;
  int64_t base_mlp_dim = 0, base_num_decoder_layers = 0;
  int64_t vocab_size = 0;
  int64_t max_position_embeddings = 0;  // learned position table rows (gpt2); 0 for RoPE models
  bool logits_via_embedding = true;
  double normalization_layer_epsilon = 1e-6;
  double rope_max_timescale = 1e6;
  // The special token ids of a Hugging Face model's config.json, recorded by import-hf and written back by
  // export-hf as they were: an integer id, "null" (the file said null), "absent" (the file did not have the
  // key, so transformers applies its class default), or "" (not imported: export-hf writes the tokenizer's
  // end-of-text id for bos and eos, and no pad). The engine itself never reads them.
  std::string hf_bos_token_id, hf_eos_token_id, hf_pad_token_id;
  // Attention (MaxText's keys and defaults). The mla keys are read only under attention_type=mla:
  // q_lora_rank 0 projects queries directly (no compression); the query / key head width is
  // qk_nope_head_dim + qk_rope_head_dim, the value head width v_head_dim.
  AttentionType attention_type = AttentionType::global;
  int64_t q_lora_rank = 0, kv_lora_rank = 512;
  int64_t qk_nope_head_dim = 128, qk_rope_head_dim = 64, v_head_dim = 128;
  // Mixture of experts (MaxText's keys; parsed and validated here, built by the MoE layer). num_experts 0:
  // every layer dense. The first first_num_dense_layers layers stay dense; each MoE layer routes a token to
  // num_experts_per_tok of num_experts routed experts (each of width base_moe_mlp_dim) plus shared_experts
  // always-on ones. Group-limited routing: experts in n_routing_groups groups (1: no limit), a token's
  // experts chosen within its topk_routing_group best groups. capacity_factor <= 0: dropless.
  int64_t num_experts = 0, num_experts_per_tok = 1, base_moe_mlp_dim = 0;
  int64_t first_num_dense_layers = 0, shared_experts = 0;
  RoutedScoreFunc routed_score_func = RoutedScoreFunc::softmax;
  bool routed_bias = false;  // DeepSeek-V3's auxiliary-loss-free balancing bias on the routing scores
  double routed_bias_update_rate = 0.0;
  double routed_scaling_factor = 1.0;
  bool norm_topk_prob = false;
  int64_t n_routing_groups = 1, topk_routing_group = 1;
  double capacity_factor = 0.0;
  double load_balance_loss_weight = 0.0;
  // PaLM's z-loss (MaxText's key): z_loss_multiplier x logsumexp(logits)^2 added per counted token; 0: off.
  double z_loss_multiplier = 0.0;
  // Engram n-gram memory (shared/specs/engram.md; decoder_block=deepseek) on the layers engram_layers names
  // (empty: off): orders 2..engram_max_ngram_size hashed by engram_num_heads heads each into tables of at
  // least engram_vocab_bases[order - 2] rows of engram_head_dim; a ShortConv of engram_kernel_size taps.
  // The tables are their own optimizer group: learning rate x engram_learning_rate_multiplier and weight
  // decay engram_weight_decay (the paper: 5x, none).
  std::vector<int64_t> engram_layers;
  int64_t engram_max_ngram_size = 3, engram_num_heads = 8, engram_head_dim = 1280;
  std::vector<int64_t> engram_vocab_bases;
  int64_t engram_kernel_size = 4, engram_seed = 0;
  double engram_learning_rate_multiplier = 5.0, engram_weight_decay = 0.0;
  // mHC (shared/specs/mhc.md): mhc_expansion_rate residual streams (1: a plain residual), each sublayer's
  // mixing matrix normalised by sinkhorn_iterations Sinkhorn iterations.
  int64_t mhc_expansion_rate = 1, sinkhorn_iterations = 20;
  int64_t max_target_length = 0;
  DType dtype = DType::f32;
  DType weight_dtype = DType::f32;
  DType grad_dtype = DType::f32;  // gradient accumulators
  DType mu_dtype = DType::f32;    // both Adam moments (and the master copy when weights are not float32)
  RematPolicy remat_policy = RematPolicy::none;
  bool scan_layers = false;
  int64_t param_scan_axis = 1;
  // Batch, mesh, parallelism
  int64_t per_device_batch_size = 1;
  int64_t gradient_accumulation_steps = 1;
  MeshShape mesh;
  // Pipeline stages (mesh.stage > 1; shared/specs/pipeline.md): the schedule, V = num_pipeline_repeats
  // chunks a stage rank (MaxText's name; V > 1 for interleaved_1f1b only), and an explicit split of the
  // layers over the mesh.stage x V chunks, one layer count a chunk (empty: the default placement,
  // model/pipeline_placement.h).
  PipelineScheduleKind pipeline_schedule = PipelineScheduleKind::one_f_one_b;
  int64_t num_pipeline_repeats = 1;
  std::vector<int64_t> pipeline_layers_per_chunk;
  bool shard_optimizer_over_data = false;
  // How each row is laid over mesh.context (data/context_reorder.h); effective_context_reorder() combines
  // the two keys. context_parallel_reorder is one of kContextParallelReorders.
  bool context_parallel_load_balance = true;
  ContextReorder context_parallel_reorder = ContextReorder::dual_chunk_swap;
  ContextParallelStrategy context_parallel_strategy = ContextParallelStrategy::all_gather;
  std::string topology = "cpu";
  std::string topologies_path;  // a user YAML adding to configs/topologies.yaml
  // Sharding rules: logical axis -> mesh axes, tried in order (configs/base.yaml lists the axes).
  std::map<std::string, std::vector<std::string>> logical_axis_rules;
  std::vector<std::string> kernels;
  std::string plan_out, plan_in;
  int64_t num_threads = 0;  // 0: cores / processes on this host
  double collective_timeout_s = 300.0;
  // NVIDIA topologies: true lets several processes share a GPU, their collectives staged through host memory
  // over MPI (comm/staged_communicator.h); false: at most one process per GPU, collectives over NCCL.
  bool share_gpus = false;
  // > 0: after this many minutes (from set-up) every rank stops at the next step boundary, saves and exits
  // with train/preemption.h's requeue status (Megatron's --exit-duration-in-mins); 0: no limit.
  double exit_duration_in_mins = 0.0;
  // Optimisation
  int64_t steps = 0;
  double learning_rate = 3e-4;
  // The schedule (train/schedule.h has its closed forms): its length in steps (-1: `steps`), the warmup's
  // share of it, its shape, and the final rate as a fraction of the peak. cosine_learning_rate_final_fraction
  // is the older name of learning_rate_final_fraction: load_config copies the one given into the other (both
  // given with different values is an error), so both always hold the value in force.
  int64_t learning_rate_schedule_steps = -1;
  double warmup_steps_fraction = 0.1;
  LrScheduleType lr_schedule_type = LrScheduleType::cosine;
  double learning_rate_final_fraction = 0.1;
  double cosine_learning_rate_final_fraction = 0.1;
  double wsd_decay_steps_fraction = 0.1;  // wsd: the decay's share of the schedule
  WsdDecayStyle wsd_decay_style = WsdDecayStyle::linear;
  double adam_b1 = 0.9, adam_b2 = 0.95, adam_eps = 1e-8, adam_weight_decay = 0.1;
  // The weight-decay mask's patterns (optim/groups.h): ECMAScript regular expressions searched in each
  // tensor's canonical per-layer name. adamw_mask (MaxText's key and meaning): a match is never decayed;
  // adamw_mask_include: a match is decayed whatever its role (adamw_mask wins where both match).
  std::vector<std::string> adamw_mask, adamw_mask_include;
  // Muon (opt_type=muon; MaxText's keys and defaults, optax.contrib.muon's update): the momentum's decay,
  // the decoupled weight decay of the matrices it steps, and the update's scale: unset (MaxText's None,
  // `null` in YAML) sqrt(max(1, fan_out / fan_in)), else muon_consistent_rms x sqrt(max(fan_in, fan_out)).
  OptimizerType opt_type = OptimizerType::adamw;
  double muon_beta = 0.95, muon_weight_decay = 0.0;
  std::optional<double> muon_consistent_rms;
  double gradient_clipping_threshold = 1.0;
  int64_t init_weights_seed = 0;
  bool skip_nonfinite_steps = false;
  // Spike skipping (train/spike_skip.h, MaxText's keys): a step whose loss is above the mean of the last
  // skip_step_interval losses by more than skip_step_scaling_factor standard deviations is skipped;
  // skip_step_max_consecutive such skips in a row (0: no limit) stop the run.
  bool skip_step_on_spikes = false;
  int64_t skip_step_interval = 128;
  double skip_step_scaling_factor = 6.0;
  int64_t skip_step_max_consecutive = 10;
  // Data, runs, checkpoints
  DatasetType dataset_type = DatasetType::text;
  std::string dataset_path, eval_dataset_path, tokenizer_path;
  std::string train_data_columns = "text";  // the JSON Lines column a record's text is in (MaxText's key)
  bool packing = true;
  bool enable_data_shuffling = true;  // false: training rows in stream order, the same every epoch
  int64_t data_shuffle_seed = 0;
  int64_t eval_interval = 0, eval_steps = 0;
  std::string run_dir;
  bool enable_checkpointing = true;
  int64_t checkpoint_period = 0, max_num_checkpoints_to_keep = 0;
  std::string load_parameters_path, load_full_state_path;
  bool allow_tokenizer_change = false;  // start from a checkpoint of another tokenizer (check_run_tokenizer)
  bool allow_data_change = false;       // resume a data cursor of other sources or weights (mixture_rows.h)
  std::string profiler;
  std::vector<int64_t> profiler_steps;

  // Resolved key -> value text, in table order: printed at start, stored in checkpoints.
  std::vector<std::pair<std::string, std::string>> resolved;
  // Keys the preset, the YAML file or an override set (the others keep base.yaml's default): a run adopts
  // a checkpoint's scan_layers only when the user left it unset.
  std::set<std::string> given;
  // Sets `key` to `value` after loading (as an override would), in the fields and in `resolved`.
  void set(const std::string& key, const std::string& value);
};

// The reorder the input pipeline applies before cutting rows over mesh.context: context_parallel_reorder,
// or none when context_parallel_load_balance is false.
inline ContextReorder effective_context_reorder(const Config& config) {
  return config.context_parallel_load_balance ? config.context_parallel_reorder : ContextReorder::none;
}

// The attention and mixture-of-experts keys' rules (before anything is allocated; every error names the
// key, the values and the fix): the MLA widths, routing top-k within the experts of the kept groups, groups
// dividing the experts, and `expert_degree` (mesh.expert; <= 0 skips it: not yet resolved) dividing the
// experts. load_config calls it with the requested mesh.expert, plan_training with the resolved one.
void validate_attention_and_moe_keys(const Config& config, int64_t expert_degree);
// The Engram and mHC keys' rules (before anything is allocated): layer indices inside the model and not
// repeated, an n-gram size of at least 2, one vocabulary base per hashed order, table rows within int32,
// positive widths, mhc_expansion_rate >= 1, and both built by decoder_block=deepseek only.
void validate_engram_and_mhc_keys(const Config& config);
// Whether global layer `layer` has an Engram block.
bool engram_layer(const Config& config, int64_t layer);

// Loads base.yaml, the preset or YAML named by `config_argument`, then `overrides` ("key=value").
// `config_dir` holds base.yaml and models/; empty means config_directory().
Config load_config(const std::string& config_argument, const std::vector<std::string>& overrides,
                   const std::string& config_dir = "");

// Where base.yaml and models/ live: $MESHTRAIN_CONFIG_DIR, else the source tree's configs/.
std::string config_directory();
// Preset names found in configs/models/.
std::vector<std::string> preset_names(const std::string& config_dir = "");
// All valid keys (for help text and suggestions).
std::vector<std::string> config_key_names();
// The keys a plan depends on, in table order (plan files record them and their hash).
std::vector<std::string> plan_key_names();
// The keys a plan depends on only under mesh.stage > 1 (the schedule and the placement), in table order: a
// plan identity lists them after plan_key_names() when the mesh has stages (plan/identity.cpp).
std::vector<std::string> pipeline_plan_key_names();

}  // namespace meshtrain
