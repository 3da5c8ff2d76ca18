// Each layer's config keys as a small typed struct, filled once from the config by model_options(), the one
// place that reads the config's model keys for the layers: a layer reads its own options (ModelSpec::
// options), never the Config. Keys in brackets. The MLP and the embedding read no key (their shapes are the
// spec's dims, their kind the family's row), so they have no struct here.
#pragma once

#include <cstdint>
#include <vector>

#include "meshtrain/config/config.h"
#include "meshtrain/kernels/arguments.h"

namespace meshtrain {

struct NormOptions {
  double epsilon = 1e-6;  // [normalization_layer_epsilon]
};

// Dot-product attention (global GQA and MLA's core).
struct AttentionOptions {
  double rope_max_timescale = 10000.0;  // [rope_max_timescale]: RoPE's theta
  int threads = 1;  // [num_threads], else OpenMP's count: the attention backward's per-thread scratch
};

// Multi-head latent attention's widths (model/layers/mla.h); RoPE and threads are AttentionOptions'.
struct MlaOptions {
  int64_t q_lora_rank = 0;       // r_q [q_lora_rank]; 0: a direct query projection
  int64_t kv_lora_rank = 0;      // r_kv [kv_lora_rank]
  int64_t qk_nope_head_dim = 0;  // nope [qk_nope_head_dim]
  int64_t qk_rope_head_dim = 0;  // rope [qk_rope_head_dim]
  int64_t v_head_dim = 0;        // v_dim [v_head_dim]
};

// Context parallelism (model/parallel/context_attention.h, halo_exchange.h).
struct ContextOptions {
  ContextParallelStrategy strategy = ContextParallelStrategy::all_gather;  // [context_parallel_strategy]
  // [remat_policy=full]: the attention forward is recomputed, so the gathered keys and values are kept.
  bool attention_recomputed = false;
  ContextReorder reorder = ContextReorder::none;  // [context_parallel_reorder / _load_balance] in effect
  int64_t sequence_length = 0;                    // [max_target_length]: the whole row, for messages
};

// The mixture-of-experts layers (model/layers/moe.h).
struct MoeOptions {
  int64_t experts = 0;         // E [num_experts]
  int64_t expert_width = 0;    // F_e [base_moe_mlp_dim]
  int64_t shared_experts = 0;  // [shared_experts]: a dense SwiGLU of shared_experts x F_e added; 0 none
  kernels::MoeRouting routing;
  bool selection_bias = false;  // [routed_bias]: DeepSeek-V3's bias added to the scores that choose experts
  // [capacity_factor] <= 0: dropless; else each expert keeps its first ceil(factor N k / E) assignments in
  // token order and drops the rest (their weight contributes nothing).
  double capacity_factor = 0.0;
  double balance_loss_weight = 0.0;  // [load_balance_loss_weight]; 0 none
  int64_t first_layer = 0;           // [first_num_dense_layers]
  // Whether decoder layer `layer` (0-based) is a MoE block: experts, and past the dense layers.
  bool at(int64_t layer) const { return experts > 0 && layer >= first_layer; }
};

// Engram (model/layers/engram.h).
struct EngramOptions {
  std::vector<int64_t> layers;                    // [engram_layers]: global layer indices, in order
  int64_t num_heads = 0;                          // H_e [engram_num_heads]: hash heads per order
  int64_t max_ngram_size = 0;                     // n [engram_max_ngram_size]; also the conv's dilation
  int64_t head_dim = 0;                           // Dh [engram_head_dim]
  int64_t kernel_size = 0;                        // K [engram_kernel_size]: conv taps
  std::vector<std::vector<int64_t>> table_sizes;  // [layers][H_e (n - 1)] (engram_layer_table_sizes)
  bool at(int64_t layer) const;                   // whether decoder layer `layer` has an Engram block
};

// mHC hyper-connections (model/layers/mhc.h); the stream count G is the spec's dims.
struct MhcOptions {
  int64_t sinkhorn_iterations = 0;  // [sinkhorn_iterations]
};

// The loss at the end of the model (model/layers/embedding.h).
struct LossOptions {
  double z_loss_multiplier = 0.0;  // m [z_loss_multiplier]: adds m logsumexp(logits)^2 per counted token
};

struct ModelOptions {
  AttentionType attention_type = AttentionType::global;  // [attention_type]
  bool tied_embeddings = false;                          // [logits_via_embedding]
  NormOptions norm;
  AttentionOptions attention;
  MlaOptions mla;
  ContextOptions context;
  MoeOptions moe;
  EngramOptions engram;
  MhcOptions mhc;
  LossOptions loss;
};

// The layers' options from a validated config.
ModelOptions model_options(const Config& config);

// Whether decoder layer `layer` of the config's model is a MoE block (MoeOptions::at, for the readers of a
// config that build no spec: layer segments).
bool moe_layer(const Config& config, int64_t layer);

// The table sizes of every Engram layer [layers][H_e (n - 1)] (order 2 first) from the config's bases (the
// config's checks keep each layer's rows within int32 ids).
std::vector<std::vector<int64_t>> engram_layer_table_sizes(const Config& config);

}  // namespace meshtrain
