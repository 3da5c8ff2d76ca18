#include "meshtrain/model/options.h"

#include <omp.h>

#include <algorithm>

#include "meshtrain/core/engram_tables.h"

namespace meshtrain {

bool EngramOptions::at(int64_t layer) const {
  return std::find(layers.begin(), layers.end(), layer) != layers.end();
}

bool moe_layer(const Config& config, int64_t layer) {
  return config.num_experts > 0 && layer >= config.first_num_dense_layers;
}

std::vector<std::vector<int64_t>> engram_layer_table_sizes(const Config& c) {
  const auto per_order =
      engram_table_sizes(static_cast<int64_t>(c.engram_layers.size()), c.engram_max_ngram_size,
                         c.engram_num_heads, c.engram_vocab_bases);
  std::vector<std::vector<int64_t>> sizes;
  for (size_t layer = 0; layer < per_order.size(); ++layer) {
    std::vector<int64_t> flat;
    for (const std::vector<int64_t>& order : per_order[layer])
      flat.insert(flat.end(), order.begin(), order.end());
    sizes.push_back(std::move(flat));
  }
  return sizes;
}

ModelOptions model_options(const Config& c) {
  ModelOptions options;
  options.attention_type = c.attention_type;
  options.tied_embeddings = c.logits_via_embedding;
  options.norm.epsilon = c.normalization_layer_epsilon;
  options.attention.rope_max_timescale = c.rope_max_timescale;
  options.attention.threads = c.num_threads > 0 ? static_cast<int>(c.num_threads) : omp_get_max_threads();
  options.mla = {c.q_lora_rank, c.kv_lora_rank, c.qk_nope_head_dim, c.qk_rope_head_dim, c.v_head_dim};
  options.context.strategy = c.context_parallel_strategy;
  options.context.attention_recomputed = c.remat_policy == RematPolicy::full;
  options.context.reorder = effective_context_reorder(c);
  options.context.sequence_length = c.max_target_length;

  MoeOptions& moe = options.moe;
  moe.selection_bias = c.routed_bias;
  moe.experts = c.num_experts;
  moe.expert_width = c.base_moe_mlp_dim;
  moe.shared_experts = c.shared_experts;
  moe.routing.score_function = c.routed_score_func == RoutedScoreFunc::sigmoid
                                   ? kernels::RouterScore::sigmoid
                                   : kernels::RouterScore::softmax;
  moe.routing.top_k = c.num_experts_per_tok;
  moe.routing.groups = c.n_routing_groups;
  moe.routing.groups_kept = c.topk_routing_group;
  moe.routing.normalize_top_k = c.norm_topk_prob;
  moe.routing.scaling = static_cast<float>(c.routed_scaling_factor);
  moe.capacity_factor = c.capacity_factor;
  moe.balance_loss_weight = c.load_balance_loss_weight;
  moe.first_layer = c.first_num_dense_layers;

  EngramOptions& engram = options.engram;
  engram.layers = c.engram_layers;
  engram.num_heads = c.engram_num_heads;
  engram.max_ngram_size = c.engram_max_ngram_size;
  engram.head_dim = c.engram_head_dim;
  engram.kernel_size = c.engram_kernel_size;
  // The bases are checked (one per order) only for a model with Engram layers.
  if (!c.engram_layers.empty()) engram.table_sizes = engram_layer_table_sizes(c);
  options.mhc.sinkhorn_iterations = c.sinkhorn_iterations;
  options.loss.z_loss_multiplier = c.z_loss_multiplier;
  return options;
}

}  // namespace meshtrain
